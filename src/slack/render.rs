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
use intercom_actors::text::command;

use super::rules::{CONFIG_SOURCE, RememberScope};
use serde_json::{Value, json};

mod replies;
mod shown;
pub use replies::{
    describe_match, describe_scope, help, rule_list, rule_summary, session_list, session_status,
};
pub use shown::{code_span, one_line};

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
        shown::one_line(&r.title, TITLE_LIMIT)
    );
    let mut blocks = vec![section(&text)];
    if let Some(command) = r.command.as_deref() {
        let marked = command::marked(command);
        if shows_apart(&r.title, command, &marked) {
            blocks.push(command_block(&marked));
        }
    }
    if !r.paths.is_empty() {
        let line = shown::files_line(&r.paths, PATH_LIMIT, 10, SECTION_LIMIT);
        blocks.push(section(&line));
    }
    blocks
}

/// The most of a command a request's message shows, in characters before
/// escaping (a section holds [`SECTION_LIMIT`]).
const COMMAND_LIMIT: usize = 2400;

/// Whether a request's command needs a block of its own: its title is cut
/// where shown, the command has something [`command::marked`] writes out
/// (padding, backtick runs, invisible characters), or it has more than one
/// line ([`command::has_line_break`]). Otherwise the title already shows
/// all of it.
fn shows_apart(title: &str, command: &str, marked: &str) -> bool {
    truncate(title, TITLE_LIMIT) != title || marked != command || command::has_line_break(command)
}

/// The command a request runs ([`command::marked`] already), in a code
/// block: whole when it fits, else its start and its end with how much is
/// not shown between them (a command padded past the cut cannot hide its
/// end).
fn command_block(marked: &str) -> Value {
    let mut max = COMMAND_LIMIT;
    loop {
        let shown = command::cut(marked, max);
        let mut text = format!("*Runs:*\n```\n{}\n```", escape(&shown.start));
        if shown.left_out > 0 {
            text.push_str(&format!(
                "\n_… {} characters not shown here; `ctl pending`, the web console and the API show the whole command …_\n```\n{}\n```",
                shown.left_out,
                escape(&shown.end)
            ));
        }
        // Escaping can grow the text (`&` takes five characters): shrink
        // the part shown until all of it fits, end included.
        if text.encode_utf16().count() <= SECTION_LIMIT || max < 60 {
            return section(&text);
        }
        max = max * 2 / 3;
    }
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
    // Errors may quote what a user sent (a forged 200,000-character option
    // id came back whole, and Slack refuses a message that long).
    MessageBody::text(format!(":warning: {}", truncate(text, PROBLEM_LIMIT)))
}

/// The longest error answer, in characters.
const PROBLEM_LIMIT: usize = 1000;

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
            status.push_str(&format!(" · _{}_", one_line(reason, 300)));
        }
        if let Some(usage) = line.usage.as_deref() {
            status.push_str(&format!(" · :bar_chart: {}", escape(usage)));
        }
        let blocks = vec![
            section(&format!(":robot_face: *{}*", one_line(&s.title, 200))),
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
            text: format!("{}: {}", one_line(&s.title, 80), word),
            blocks,
        }
    }

    fn request(&self, r: &PendingRequest) -> (MessageBody, Option<Snippet>) {
        let mut blocks = request_head(r);
        let mut snippet = None;
        if let Some(diff) = r.diff.as_deref().filter(|d| !d.trim().is_empty()) {
            // Inline only when all of it fits once escaped (`<` takes four
            // characters): a cut diff would hide its end, with no snippet.
            let inline = shown::code_block(diff);
            if diff.len() <= INLINE_DIFF_LIMIT && truncate(&inline, SECTION_LIMIT) == inline {
                blocks.push(section(&inline));
            } else {
                blocks.push(context(&format!(
                    ":page_facing_up: The diff ({} lines) is attached above as a snippet.",
                    diff.lines().count()
                )));
                snippet = Some(Snippet {
                    filename: format!("{}.diff", r.request_id),
                    title: format!("Diff: {}", shown::plain_line(&r.title, 100)),
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
                format!("The agent asks: {}", one_line(&r.title, 200))
            }
            _ => format!("Decision needed: {}", one_line(&r.title, 200)),
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
            text: format!("{}: {}", one_line(&r.title, 200), status.as_str()),
            blocks,
        }
    }

    /// Agent text is quoted, every line of it: the agent escapes nothing
    /// of ours (its `>` is an entity), so no line it writes can pass for
    /// one of the server's own (a probe's chunk repeated a rule notice word
    /// for word).
    fn agent_text(&self, text: &str) -> Vec<MessageBody> {
        split_escaped(&shown::undisguised(text.trim_end()), MESSAGE_LIMIT)
            .into_iter()
            .filter(|p| !p.trim().is_empty())
            .map(|p| MessageBody::text(shown::quoted(&p)))
            .collect()
    }

    fn thinking(&self, text: &str) -> MessageBody {
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        let line = format!(
            ":thought_balloon: _thinking_ · {} _({} chars; whole in the API)_",
            one_line(first.trim(), 150),
            text.chars().count()
        );
        MessageBody {
            // The notification text too: Slack's mobile notifications show
            // only it, and a thought's `<!channel>` pinged from there.
            text: format!("thinking: {}", one_line(first.trim(), 150)),
            blocks: vec![context(&line)],
        }
    }

    fn tool_call(&self, title: &str, status: &str) -> MessageBody {
        let emoji = match status {
            "completed" => ":white_check_mark:",
            "failed" => ":x:",
            "cancelled" => ":heavy_minus_sign:",
            "in_progress" => ":arrows_counterclockwise:",
            _ => ":white_circle:",
        };
        let title = if title.is_empty() { "tool call" } else { title };
        let line = format!(
            "{emoji} :wrench: {} · _{}_",
            shown::one_line(title, 200),
            shown::one_line(status, 40)
        );
        MessageBody {
            text: format!("{} ({})", one_line(title, 200), one_line(status, 40)),
            blocks: vec![context(&line)],
        }
    }

    fn plan(&self, entries: &[(String, String)]) -> MessageBody {
        let mut lines = Vec::with_capacity(entries.len());
        for (content, status) in entries {
            let mark = match status.as_str() {
                "completed" => ":ballot_box_with_check:",
                "in_progress" => ":arrow_forward:",
                _ => ":white_large_square:",
            };
            let text = shown::one_line(content, 200);
            if status == "completed" {
                lines.push(format!("{mark} ~{text}~"));
            } else {
                lines.push(format!("{mark} {text}"));
            }
        }
        let done = entries.iter().filter(|(_, s)| s == "completed").count();
        MessageBody {
            text: format!("Plan: {done}/{} done", entries.len()),
            blocks: vec![section(&format!(
                "*Plan*\n{}",
                shown::lines_within(&lines, SECTION_LIMIT - 10, "steps")
            ))],
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
            blocks.push(section(&format!("stderr:\n{}", shown::code_block(&tail))));
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
mod tests;
