//! Replies to `/intercom` commands: help, the session list, a session's
//! status and the rules in force. Pure functions, like the rest of
//! `render`: text escaped for mrkdwn and cut to Slack's limits.

use super::*;

/// The `/intercom help` text.
pub fn help() -> MessageBody {
    MessageBody::text(
        "*`/intercom` commands*\n\
         • `start [workspace] [--agent A] [--mode M] <prompt>`: start a session (operators only); the workspace defaults to this channel's\n\
         • `sessions [--all]`: live sessions (`--all`: also ended ones)\n\
         • `status [id]`: what a session is doing\n\
         • `steer [id] <text>`: give the agent an instruction (queued while it works)\n\
         • `nudge [id]`: nudge a stalled agent\n\
         • `restart [id]`: kill the agent and respawn it in the same thread (resumed where the agent supports it)\n\
         • `stop [id]`: stop a session\n\
         • `pause [id]`: cancel the running turn and hold replies until `resume [id]`\n\
         • `mode <ask|auto-edits|auto> [id]`: how much the session may do without asking (`mode` alone shows it)\n\
         • `agent-mode [<mode> | model <model> | <option> <value>] [id]`: the agent's own modes and models, e.g. Claude Code's `plan` or `acceptEdits` (alone: what it offers)\n\
         • `rules`: the approval rules in force; `rule rm <id>`: remove one (operators only)\n\
         • `cleanup`: mark sessions that are stored as live but have no agent running as interrupted (operators only)\n\
         `start` also takes `--mode <ask|auto-edits|auto>`. \
         Without an id, commands act on the most recently active session in this channel. \
         In a session's thread, a reply steers the agent (and revives a session that ended by idle timeout), and `reject: <why>` rejects the waiting request (when only one waits).",
    )
}

/// One line per session for `/intercom sessions`.
/// `/intercom sessions`; `paused` are live sessions an operator paused
/// (shown *paused*, not by their stored status).
pub fn session_list(
    sessions: &[SessionRecord],
    all: bool,
    paused: &std::collections::HashSet<SessionId>,
) -> MessageBody {
    if sessions.is_empty() {
        let what = if all {
            "No sessions yet."
        } else {
            "No live sessions."
        };
        return MessageBody::text(format!("{what} Start one with `/intercom start <prompt>`."));
    }
    let mut lines = vec![if all {
        "*Sessions* (newest first)".to_owned()
    } else {
        "*Live sessions*".to_owned()
    }];
    for s in sessions.iter().take(25) {
        let (emoji, status) = if s.status.is_live() && paused.contains(&s.id) {
            (":double_vertical_bar:", "paused")
        } else {
            (status_emoji(s.status, s.status.as_str()), s.status.as_str())
        };
        lines.push(format!(
            "• `{}` {} *{}* · {} · {} · owner {}",
            s.id,
            emoji,
            status,
            escape(&s.workspace),
            escape(&truncate(&s.title, 60)),
            who(&s.owner)
        ));
    }
    MessageBody::text(truncate(&lines.join("\n"), MESSAGE_LIMIT))
}

/// `/intercom status` for one session (`live`: the actor's view, when it runs).
pub fn session_status(s: &SessionRecord, live: Option<&SessionSnapshot>) -> MessageBody {
    let pending = live.map_or(0, |l| l.pending.len());
    let queued = live.map_or(0, |l| l.queued.len());
    let activity = if !s.status.is_live() {
        s.status.as_str().to_owned()
    } else if live.is_some_and(|l| l.paused) {
        "paused".to_owned()
    } else if pending > 0 {
        format!("waiting for {pending} decision(s)")
    } else if live.is_some_and(|l| l.turn_running) {
        "working".to_owned()
    } else {
        "idle".to_owned()
    };
    let mut text = format!(
        "`{}` *{}*: {}\nworkspace `{}` · agent `{}` · owner {} · restarts {}",
        s.id,
        escape(&truncate(&s.title, 80)),
        activity,
        escape(&s.workspace),
        escape(&s.agent),
        who(&s.owner),
        s.restart_count
    );
    if let Some(l) = live {
        text.push_str(&format!(" · mode `{}`", l.mode.as_str()));
    }
    if queued > 0 {
        let why = if live.is_some_and(|l| l.paused) {
            "held until `/intercom resume`"
        } else {
            "queued"
        };
        text.push_str(&format!("\n{queued} steering message(s) {why}"));
    }
    if let Some(reason) = &s.status_reason {
        text.push_str(&format!("\n_{}_", escape(&truncate(reason, 300))));
    }
    MessageBody::text(text)
}

/// A rule's scope in words.
pub fn describe_scope(scope: &Scope) -> String {
    match scope {
        Scope::Global => "every session".to_owned(),
        Scope::Workspace(w) => format!("workspace `{}`", escape(w)),
        Scope::Session(s) => format!("session `{s}`"),
    }
}

/// What a rule's conditions match, in words (mrkdwn, escaped).
pub fn describe_match(m: &RuleMatch) -> String {
    let code = |s: &str| format!("`{}`", escape(s));
    let mut parts = Vec::new();
    if let Some(k) = &m.kind {
        parts.push(format!("kind {}", code(k)));
    }
    if !m.paths.is_empty() {
        let paths: Vec<String> = m.paths.iter().take(5).map(|p| code(p)).collect();
        let more = if m.paths.len() > 5 {
            format!(" and {} more", m.paths.len() - 5)
        } else {
            String::new()
        };
        parts.push(format!("files {}{more}", paths.join(", ")));
    }
    if let Some(p) = &m.command_prefix {
        parts.push(format!("commands starting with {}", code(p)));
    }
    if let Some(r) = &m.command_regex {
        parts.push(format!("commands matching {}", code(r)));
    }
    if let Some(a) = &m.agent {
        parts.push(format!("agent {}", code(a)));
    }
    if parts.is_empty() {
        "every request".to_owned()
    } else {
        parts.join(", ")
    }
}

/// One sentence for a rule: "allow kind `edit` in session `s-1`".
pub fn rule_summary(rule: &Rule) -> String {
    format!(
        "{} {} in {}",
        rule.action.as_str(),
        describe_match(&rule.matcher),
        describe_scope(&rule.scope)
    )
}

/// `/intercom rules`: id, scope, match, action, source.
pub fn rule_list(rules: &[(Rule, String)]) -> MessageBody {
    if rules.is_empty() {
        return MessageBody::text(
            "No approval rules: every request is asked (or decided by the session's mode). Choose an \"always\" option on a request to create one.",
        );
    }
    let header = "*Approval rules* (a matching deny wins; otherwise the most specific scope: session, then workspace, then every session)";
    // Deny and ask rules first: what stops an agent must never be the part
    // a long list leaves out (it was cut at 3,000 characters mid-line).
    let mut ordered: Vec<&(Rule, String)> = rules.iter().collect();
    ordered.sort_by_key(|(rule, _)| match rule.action {
        RuleAction::Deny => 0,
        RuleAction::Ask => 1,
        RuleAction::Allow => 2,
    });
    let lines: Vec<String> = ordered
        .iter()
        .map(|(rule, source)| {
            let source = if source == CONFIG_SOURCE {
                "config file".to_owned()
            } else {
                format!("by {}", who(source))
            };
            let line = format!(
                "• `{}` · {} · {} · *{}* · {}",
                escape(&rule.id),
                describe_scope(&rule.scope),
                describe_match(&rule.matcher),
                rule.action.as_str(),
                source
            );
            truncate(&line, RULE_LINE_LIMIT)
        })
        .collect();
    let body = shown::lines_within(
        &lines,
        MESSAGE_LIMIT - header.len() - 1,
        "rules (`GET /api/rules` and the web console list them all)",
    );
    MessageBody::text(format!("{header}\n{body}"))
}

/// Longest line of one rule in `/intercom rules` (a long regex is cut).
const RULE_LINE_LIMIT: usize = 500;
