//! Human-readable output for `ctl`: aligned tables and transcript lines.
//!
//! Times are shown in UTC (`2025-01-31 12:00:00`) or relative (`3m ago`);
//! the API itself carries Unix milliseconds.
//!
//! Everything the server sends may come from the agent, which is not
//! trusted: every string from it is shown through [`printable`] (text meant
//! to span lines), [`one_line`], [`clip`] or [`bounded`] (a field that must
//! stay on its line). They spell out terminal control characters and
//! invisible formatting (`\x1b`, `\u{202e}`) instead of emitting them, so
//! an escape sequence, a carriage return or a bidi override is seen by the
//! operator and acted on by no terminal.

use std::borrow::Cow;
use std::fmt::Write as _;

use intercom_actors::model::now_ms;
use serde_json::Value;

use crate::http::views::{ApprovalView, MessageView, SessionDetailView, SessionView};
use crate::http::workspaces::{AgentView, WorkspaceView};

/// Widest a free-text cell gets in a table.
const CELL_MAX: usize = 60;

/// Widest any table cell gets, whatever it holds (ids, names, option
/// lists): the backstop behind the tighter [`CELL_MAX`] for free text.
const CELL_LIMIT: usize = 200;

/// Longest a one-line field from the server gets outside a table (`show`,
/// `watch`, transcript titles), before `…(N more bytes)`.
pub const FIELD_MAX: usize = 300;

/// How a string from the server is laid out on the terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Text meant to span lines (a message, a diff): newlines and tabs stay.
    Lines,
    /// A field that must stay on its line (a title, an id, a name):
    /// newlines are spelled out, tabs become spaces.
    OneLine,
}

/// What stands in for `c` on the terminal, or `None` when `c` is shown as
/// itself. C0 controls (escape sequences, BEL, backspace, CR, NUL), DEL and
/// C1 controls (the 8-bit CSI `U+009B`) are spelled out as `\x1b` or
/// `\u{9b}`, and so is invisible formatting that can disguise text
/// ([`intercom_actors::text::disguises`]).
fn stand_in(c: char, layout: Layout) -> Option<Cow<'static, str>> {
    match c {
        '\n' | '\t' if layout == Layout::Lines => None,
        '\n' => Some(Cow::Borrowed("\\n")),
        '\t' => Some(Cow::Borrowed(" ")),
        '\r' => Some(Cow::Borrowed("\\r")),
        '\0'..='\x1f' | '\x7f' => Some(Cow::Owned(format!("\\x{:02x}", u32::from(c)))),
        '\u{80}'..='\u{9f}' => Some(Cow::Owned(format!("\\u{{{:x}}}", u32::from(c)))),
        c if intercom_actors::text::disguises(c) => {
            Some(Cow::Owned(format!("\\u{{{:x}}}", u32::from(c))))
        }
        _ => None,
    }
}

/// `text` with every character [`stand_in`] replaces replaced, stopping
/// before the first character that would take the result past `max`
/// characters (a stand-in is never cut); also how many bytes of `text` were
/// left out.
fn neutralize(text: &str, layout: Layout, max: usize) -> (String, usize) {
    let mut out = String::with_capacity(text.len().min(max));
    let mut shown = 0;
    for (at, c) in text.char_indices() {
        let shown_as = stand_in(c, layout);
        let width = shown_as.as_deref().map_or(1, |s| s.chars().count());
        if shown + width > max {
            return (out, text.len() - at);
        }
        match shown_as {
            Some(s) => out.push_str(&s),
            None => out.push(c),
        }
        shown += width;
    }
    (out, 0)
}

/// Server text meant to span lines (a message, a diff) as it may reach the
/// terminal: newlines and tabs kept, control characters and disguising
/// formatting spelled out (an escape sequence in a diff must not reach the
/// operator's terminal).
pub fn printable(text: &str) -> String {
    neutralize(text, Layout::Lines, usize::MAX).0
}

/// A server field on one line, whole: like [`printable`], and newlines and
/// carriage returns spelled out too (`\n`, `\r`), so it cannot forge a line.
pub fn one_line(text: &str) -> String {
    neutralize(text, Layout::OneLine, usize::MAX).0
}

/// A server field on one line ([`one_line`]), at most `max` characters,
/// then `…(N more bytes)` when it was longer.
pub fn bounded(text: &str, max: usize) -> String {
    let (mut out, rest) = neutralize(text, Layout::OneLine, max);
    if rest > 0 {
        let _ = write!(out, "…({rest} more bytes)");
    }
    out
}

/// The most of a command `ctl pending` prints (the agent decides its
/// length: a probe's was 131,079 combining marks on one line).
const COMMAND_SHOWN: usize = 4_000;

/// A command whole up to [`COMMAND_SHOWN`] characters; past that its start
/// and its end, with what lies between counted (as the console does).
fn command_shown(command: &str, id: &str) -> String {
    match cut_middle(command, COMMAND_SHOWN * 3 / 4, COMMAND_SHOWN / 4) {
        None => command.to_owned(),
        Some((head, left_out, tail)) => format!(
            "{head}\n… {left_out} characters not shown here; GET /api/approvals/{id} has the whole command …\n{tail}"
        ),
    }
}

/// `text` on one line, escaped, at most about `max` characters: when longer,
/// its first and last parts with what was left out counted between them.
pub fn head_and_tail(text: &str, max: usize) -> String {
    let (head_len, tail_len) = (max / 3, max - max / 3);
    match cut_middle(text, head_len, tail_len) {
        None => bounded(text, max),
        Some((head, left_out, tail)) => format!(
            "{}…({left_out} characters)…{}",
            // Cut by characters above; escapes may lengthen what is shown.
            bounded(&head, 16 * head_len),
            bounded(&tail, 16 * tail_len)
        ),
    }
}

/// `text`'s first `head` and last `tail` characters and how many lie
/// between, or `None` when it is no longer than both together.
fn cut_middle(text: &str, head: usize, tail: usize) -> Option<(String, usize, String)> {
    let count = text.chars().count();
    if count <= head + tail {
        return None;
    }
    Some((
        text.chars().take(head).collect(),
        count - head - tail,
        text.chars().skip(count - tail).collect(),
    ))
}

/// The server's JSON with every character [`printable`] would spell out
/// written as a JSON escape (`\u009b`, `\u202e`) instead: the same JSON
/// value (serde already escapes C0 controls; C1, DEL and bidi controls it
/// writes raw), inert on a terminal.
pub fn json_safe(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        if stand_in(c, Layout::Lines).is_none() {
            out.push(c);
            continue;
        }
        let mut units = [0u16; 2];
        for unit in c.encode_utf16(&mut units) {
            let _ = write!(out, "\\u{unit:04x}");
        }
    }
    out
}

/// Left-aligned columns separated by two spaces; no trailing blanks. Every
/// cell is shown through [`clip`] (one line, at most [`CELL_LIMIT`]
/// characters), so a cell from the server cannot break the table.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| clip(cell, CELL_LIMIT)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &cells {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&cells) {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                let pad = widths.get(i).copied().unwrap_or(0);
                format!("{cell:<pad$}")
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// One line ([`one_line`]), at most `max` characters (with `…` when cut).
pub fn clip(text: &str, max: usize) -> String {
    let (whole, rest) = neutralize(text, Layout::OneLine, max);
    if rest == 0 {
        return whole;
    }
    let (mut cut, _) = neutralize(text, Layout::OneLine, max.saturating_sub(1));
    cut.push('…');
    cut
}

/// `12s ago`, `3m ago`, `5h ago`, `2d ago`.
pub fn ago(ms: i64, now: i64) -> String {
    let secs = now.saturating_sub(ms).max(0) / 1000;
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        3600..86400 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86400),
    }
}

/// `YYYY-MM-DD HH:MM:SS` in UTC.
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil conversion (proleptic Gregorian).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `ctl sessions`.
pub fn sessions(list: &[SessionView]) -> String {
    if list.is_empty() {
        return "no sessions\n".to_owned();
    }
    let now = now_ms();
    // An ended session's reason tells a stop from a shutdown a revive can
    // undo; the column is there only when some listed session ended.
    let ended = list.iter().any(|s| !s.status.is_live());
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            let mut row = vec![
                s.id.clone(),
                s.status.to_string(),
                clip(&s.workspace, 30),
                s.agent.clone(),
                s.owner.clone(),
                ago(s.updated_at, now),
            ];
            if ended {
                let reason = match (&s.status_reason, s.revivable) {
                    _ if s.status.is_live() => String::new(),
                    (Some(r), true) => format!("{} (revivable)", clip(r, 40)),
                    (Some(r), false) => clip(r, 40),
                    (None, true) => "(revivable)".into(),
                    (None, false) => "-".into(),
                };
                row.push(reason);
            }
            row.push(clip(&s.title, CELL_MAX));
            row
        })
        .collect();
    let mut heads = vec!["ID", "STATUS", "WORKSPACE", "AGENT", "OWNER", "UPDATED"];
    if ended {
        heads.push("REASON");
    }
    heads.push("TITLE");
    table(&heads, &rows)
}

/// `ctl workspaces`.
pub fn workspaces(list: &[WorkspaceView]) -> String {
    if list.is_empty() {
        return "no workspaces (declare one with [[workspace]] in the config, or turn on [discovery])\n".to_owned();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|w| {
            vec![
                w.id.clone(),
                w.approval_mode.clone(),
                w.agent.clone().unwrap_or_else(|| "-".into()),
                w.channel_id.clone().unwrap_or_else(|| "-".into()),
                w.path.clone(),
            ]
        })
        .collect();
    table(&["ID", "MODE", "AGENT", "CHANNEL", "PATH"], &rows)
}

/// `ctl agents`.
pub fn agents(list: &[AgentView]) -> String {
    if list.is_empty() {
        return "no agent profiles (declare one with [[agent]] in the config)\n".to_owned();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|a| {
            let id = if a.default {
                format!("{} (default)", a.id)
            } else {
                a.id.clone()
            };
            vec![id, a.protocol.clone(), a.command.clone()]
        })
        .collect();
    table(&["ID", "PROTOCOL", "COMMAND"], &rows)
}

/// `ctl start` / `ctl cancel`: one line about a session.
pub fn session_line(s: &SessionView) -> String {
    let field = |text: &str| bounded(text, FIELD_MAX);
    let reason = s
        .status_reason
        .as_deref()
        .map(|r| format!(" ({})", field(r)))
        .unwrap_or_default();
    format!(
        "{}  {}{reason}  workspace {}  agent {}\n",
        field(&s.id),
        s.status,
        field(&s.workspace),
        field(&s.agent)
    )
}

/// `ctl show`.
pub fn session_detail(d: &SessionDetailView) -> String {
    let s = &d.session;
    let mut fields = vec![
        ("id", s.id.clone()),
        ("status", s.status.to_string()),
        (
            "reason",
            s.status_reason.clone().unwrap_or_else(|| "-".into()),
        ),
        ("title", s.title.clone()),
        ("workspace", s.workspace.clone()),
        ("cwd", s.cwd.clone()),
        ("agent", format!("{} ({})", s.agent, s.protocol.as_str())),
        ("owner", s.owner.clone()),
        ("created", utc(s.created_at)),
        ("updated", utc(s.updated_at)),
        ("restarts", s.restart_count.to_string()),
        ("mode", d.approval_mode.clone()),
    ];
    if let Some(live) = &d.live {
        let pid = live.agent_pid.map_or_else(|| "-".into(), |p| p.to_string());
        let turn = if live.turn_running { "running" } else { "idle" };
        fields.push(("agent pid", pid));
        fields.push(("turn", turn.into()));
        if live.paused {
            let held = format!("yes: steering is held until `ctl resume {}`", s.id);
            fields.push(("paused", held));
        }
        fields.push(("queued", live.queued_prompts.to_string()));
        if let Some(u) = &live.usage {
            let mut usage = format!("{}/{} tokens", u.used, u.size);
            if let Some(cost) = u.cost {
                usage.push_str(&format!(
                    ", {cost:.2} {}",
                    u.currency.as_deref().unwrap_or("")
                ));
            }
            fields.push(("usage", usage.trim_end().to_owned()));
        }
    }
    if s.revivable {
        fields.push(("revive", format!("possible: ctl revive {}", s.id)));
    }
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out: String = fields
        .iter()
        .map(|(k, v)| {
            // A reason ends with what matters ("gave up after 3 restarts")
            // after an agent's stderr: its head and its tail are shown.
            let shown = if *k == "reason" {
                head_and_tail(v, FIELD_MAX)
            } else {
                bounded(v, FIELD_MAX)
            };
            format!("{k:<width$}  {shown}\n")
        })
        .collect();
    if !d.pending.is_empty() {
        out.push_str("\npending approvals:\n");
        out.push_str(&approvals(&d.pending));
    }
    out
}

/// `ctl cancel`: the ended session, or that its agent is still being
/// terminated (`"status": "stopping"`).
pub fn cancelled(answer: &serde_json::Value) -> String {
    if answer["status"] == "stopping" {
        let id = bounded(answer["id"].as_str().unwrap_or("?"), FIELD_MAX);
        return format!("{id}  stopping (the agent is being terminated)\n");
    }
    match serde_json::from_value::<SessionView>(answer.clone()) {
        Ok(session) => session_line(&session),
        Err(_) => format!("{}\n", bounded(&answer.to_string(), FIELD_MAX)),
    }
}

/// `ctl agent-mode`: what the agent offers, the current choice marked `*`.
pub fn agent_options(o: &intercom_actors::protocol::agent_options::AgentOptions) -> String {
    use intercom_actors::protocol::agent_options::Offered;
    if o.is_empty() {
        return "the agent offers no modes, models or options\n".to_owned();
    }
    let line = |label: &str, list: &[Offered], current: Option<&str>| {
        let items: Vec<String> = list
            .iter()
            .map(|c| {
                let mark = if Some(c.id.as_str()) == current {
                    "*"
                } else {
                    ""
                };
                format!("{mark}{}", bounded(&c.id, FIELD_MAX))
            })
            .collect();
        format!("{:<8} {}\n", bounded(label, FIELD_MAX), items.join("  "))
    };
    let mut out = String::new();
    if !o.modes.is_empty() {
        out.push_str(&line("modes", &o.modes, o.current_mode.as_deref()));
    }
    if !o.models.is_empty() {
        out.push_str(&line("models", &o.models, o.current_model.as_deref()));
    }
    for c in &o.config {
        out.push_str(&line(&c.id, &c.values, c.current.as_deref()));
    }
    out
}

/// `ctl pending`.
pub fn approvals(list: &[ApprovalView]) -> String {
    if list.is_empty() {
        return "no pending approvals\n".to_owned();
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|a| {
            // Each id with what choosing it does: the agent names its
            // options, so an id alone ("reject") could be an allow.
            let options: Vec<String> = a
                .options
                .iter()
                .map(|o| format!("{} ({})", o.id, o.kind.verb().to_lowercase()))
                .collect();
            vec![
                a.id.clone(),
                a.status.as_str().to_owned(),
                a.kind.as_str().to_owned(),
                ago(a.created_at, now),
                clip(&a.title, TITLE_COLUMN),
                options.join(","),
            ]
        })
        .collect();
    let mut out = table(
        &["ID", "STATUS", "KIND", "ASKED", "TITLE", "OPTIONS"],
        &rows,
    );
    for a in list {
        out.push_str(&approval_detail(a));
    }
    out
}

/// The files and the diff of one approval, below the table: what the
/// operator is deciding on.
fn approval_detail(a: &ApprovalView) -> String {
    let diff = a.diff.as_deref().filter(|d| !d.trim().is_empty());
    // A title the table cut is printed whole here: its end may be what
    // matters ("… (its change is not shown: …)").
    let cut = clip(&a.title, TITLE_COLUMN) != clip(&a.title, FIELD_MAX);
    if a.paths.is_empty() && diff.is_none() && a.command.is_none() && !cut {
        return String::new();
    }
    let mut out = format!("\n{}", bounded(&a.id, FIELD_MAX));
    if !a.paths.is_empty() {
        out.push_str(&format!(" — {}", one_line(&a.paths.join(", "))));
    }
    out.push('\n');
    if cut {
        out.push_str(&format!("title: {}\n", clip(&a.title, FIELD_MAX)));
    }
    if let Some(command) = &a.command {
        // Whole (the table's title column is cut at 40), padding counted,
        // its further lines indented under the first.
        let marked = intercom_actors::text::command::marked(command);
        out.push_str(&format!(
            "runs: {}\n",
            printable(&command_shown(&marked, &a.id)).replace('\n', "\n      ")
        ));
    }
    if diff.is_none() && a.diff.is_some() {
        // A diff that changes nothing: said, not a blank under the files.
        out.push_str("(the diff is empty: it changes nothing in these files)\n");
    }
    if let Some(diff) = diff {
        let (shown, left) = diff_start(diff);
        out.push_str(&printable(shown));
        if !shown.ends_with('\n') {
            out.push('\n');
        }
        if left > 0 {
            out.push_str(&format!(
                "… {left} more lines of this diff not shown; the whole diff: `ctl pending --json` or GET /api/approvals/{}\n",
                bounded(&a.id, FIELD_MAX)
            ));
        }
    }
    out
}

/// Characters of a title in the `ctl pending` table (the whole title
/// follows below it).
const TITLE_COLUMN: usize = 40;

/// Lines of one approval's diff `ctl pending` prints at most (an MCP client
/// sent three 3.5 MB diffs, and the list was 7 MB of them).
const DIFF_LINES: usize = 400;
/// Bytes of one approval's diff `ctl pending` prints at most.
const DIFF_BYTES: usize = 64 * 1024;

/// The start of `diff` that `ctl pending` prints (whole lines, within
/// [`DIFF_LINES`] and [`DIFF_BYTES`]), and how many lines it leaves out.
fn diff_start(diff: &str) -> (&str, usize) {
    let mut end = 0;
    for (n, line) in diff.split_inclusive('\n').enumerate() {
        if n == DIFF_LINES || end + line.len() > DIFF_BYTES {
            let left = diff[end..].split_inclusive('\n').count();
            // A first line past the byte bound is cut on a character.
            if end == 0 {
                let mut cut = DIFF_BYTES.min(line.len());
                while !line.is_char_boundary(cut) {
                    cut -= 1;
                }
                return (&line[..cut], left);
            }
            return (&diff[..end], left);
        }
        end += line.len();
    }
    (diff, 0)
}

/// `ctl approve` / `ctl reject`.
pub fn decided(a: &ApprovalView) -> String {
    let field = |text: &str| bounded(text, FIELD_MAX);
    match &a.decision {
        Some(d) => {
            let verdict = if d.approved { "approved" } else { "rejected" };
            let reason = d
                .reason
                .as_deref()
                .map(|r| format!(" — {}", field(r)))
                .unwrap_or_default();
            format!(
                "{}: {verdict} ({}) by {}{reason}\n",
                field(&a.id),
                field(&d.option_id),
                field(&d.decided_by)
            )
        }
        None => format!("{}: {}\n", field(&a.id), a.status.as_str()),
    }
}

/// One transcript entry as printed by `ctl log`. The body is shown through
/// [`printable`] (its lines indented under the first); tool calls and plans
/// keep each title or entry on its line ([`bounded`]).
pub fn message(m: &MessageView) -> String {
    let at = utc(m.created_at);
    let time = at.get(11..).unwrap_or(&at);
    let body = match m.kind.as_str() {
        "tool" => tool_line(&m.content),
        "plan" => plan_lines(&m.content),
        "error" => format!("ERROR {}", m.content),
        "thought" => format!("(thinking) {}", m.content),
        _ => m.content.clone(),
    };
    let body = printable(&body);
    let prefix = format!("{time} {:<6} ", bounded(&m.role, FIELD_MAX));
    let gutter = continuation(prefix.chars().count());
    let indented = body.replace('\n', &format!("\n{gutter}"));
    format!("{prefix}{indented}\n")
}

/// What a continuation line of a multi-line text starts with, under a first
/// line's `width`-column prefix: blanks, then `| `. Indentation alone let an
/// agent's text hold a line that read as an entry of its own
/// (`14:00:00 user   approve all`).
pub fn continuation(width: usize) -> String {
    format!("{}| ", " ".repeat(width.saturating_sub(2)))
}

/// A tool-call entry (`{"title", "status", ...}`) as one line.
fn tool_line(content: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(content) else {
        return format!("tool {}", bounded(content, FIELD_MAX));
    };
    let field = |k: &str| bounded(v.get(k).and_then(Value::as_str).unwrap_or(""), FIELD_MAX);
    format!("tool {} [{}]", field("title"), field("status"))
}

/// A plan entry (`[{"content", "status"}, ...]`): `plan`, then one line
/// per step.
fn plan_lines(content: &str) -> String {
    let Ok(Value::Array(entries)) = serde_json::from_str::<Value>(content) else {
        return format!("plan {}", bounded(content, FIELD_MAX));
    };
    let lines: Vec<String> = entries
        .iter()
        .map(|e| {
            let field = |k: &str, absent: &str| {
                bounded(
                    e.get(k).and_then(Value::as_str).unwrap_or(absent),
                    FIELD_MAX,
                )
            };
            format!("  [{}] {}", field("status", "?"), field("content", ""))
        })
        .collect();
    format!("plan\n{}", lines.join("\n"))
}

#[cfg(test)]
pub(super) mod tests;
