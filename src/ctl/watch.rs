//! `ctl watch [id]` and `ctl log --follow`: the event stream in a terminal.
//!
//! Why this exists: polling the transcript re-downloads it whole; the event
//! stream (`GET /api/events`) says what changed as it happens. The reader
//! here follows it, reconnects with `Last-Event-ID` when the connection
//! drops (a server restart), so nothing is missed, and renders each event
//! as one line.
//!
//! Every field of an event may come from the agent: [`event_line`] shows
//! each through [`render::bounded`] (one line, at most
//! [`render::FIELD_MAX`] characters, control characters spelled out), lists
//! through the same at [`LIST_MAX`], and only the agent's and the steering
//! text span lines, through [`render::printable`] and indented.

use std::io::BufRead;
use std::time::Duration;

use serde_json::Value;

use super::client::{Client, CtlError};
use super::render;

/// How long to wait before reconnecting after the stream dropped.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);

/// Longest a list in an event line (plan steps, a request's options) gets.
const LIST_MAX: usize = 1000;

/// How far continuation lines of a multi-line text are indented (then
/// marked, [`render::continuation`]).
const INDENT: usize = 10;

/// One Server-Sent Events message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseMessage {
    /// The `id:` field, when it is a number.
    pub id: Option<i64>,
    /// The `data:` lines joined with newlines (empty for a position marker).
    pub data: String,
}

/// Reads the next message; `None` at the end of the stream. Comments
/// (keep-alives) and unknown fields are skipped.
pub fn next_message(reader: &mut impl BufRead) -> std::io::Result<Option<SseMessage>> {
    let mut message = SseMessage::default();
    let mut seen_field = false;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let text = line.trim_end_matches(['\n', '\r']);
        if text.is_empty() {
            if seen_field {
                return Ok(Some(message));
            }
            continue;
        }
        if text.starts_with(':') {
            continue;
        }
        let (field, value) = text.split_once(':').unwrap_or((text, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        seen_field = true;
        match field {
            "id" => message.id = value.parse().ok(),
            "data" => {
                if !message.data.is_empty() {
                    message.data.push('\n');
                }
                message.data.push_str(value);
            }
            _ => {}
        }
    }
}

/// Follows the event stream (one session's with `session`), calling
/// `on_open` after the first connection is up and `on_event` for each
/// event until either returns `false`. Reconnects with the last id seen.
pub fn follow(
    client: &Client,
    session: Option<&str>,
    mut on_open: impl FnMut() -> Result<bool, CtlError>,
    mut on_event: impl FnMut(&Value) -> bool,
) -> Result<(), CtlError> {
    let path = match session {
        Some(s) => format!("/api/events?session={}", super::client::segment(s)),
        None => "/api/events".to_owned(),
    };
    let mut last: Option<i64> = None;
    let mut opened = false;
    loop {
        let mut reader = match client.stream(&path, last) {
            Ok(r) => r,
            Err(CtlError::Unreachable { .. } | CtlError::NoAnswer { .. }) if opened => {
                std::thread::sleep(RECONNECT_EVERY);
                continue;
            }
            Err(e) => return Err(e),
        };
        if !opened {
            opened = true;
            if !on_open()? {
                return Ok(());
            }
        }
        while let Ok(Some(message)) = next_message(&mut reader) {
            if message.id.is_some() {
                last = message.id;
            }
            if message.data.is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(&message.data).unwrap_or(Value::Null);
            if !on_event(&value) {
                return Ok(());
            }
        }
        eprintln!("-- event stream interrupted; reconnecting");
        std::thread::sleep(RECONNECT_EVERY);
    }
}

/// One line (or a few) for an event; `with_session` prefixes the session id.
pub fn event_line(e: &Value, with_session: bool) -> String {
    let s = |k: &str| field(&e[k]);
    let kind = e["event"].as_str().unwrap_or_default();
    let what = match kind {
        "session_started" => format!(
            "started   {} ({}, {})",
            field(&e["session"]["title"]),
            field(&e["session"]["workspace"]),
            field(&e["session"]["agent"])
        ),
        "status_changed" => format!("status    {} · {}{}", s("status"), s("activity"), reason(e)),
        "agent_text" => format!("agent     {}", indent(&e["text"])),
        "agent_thought" => format!("thought   {}", indent(&e["text"])),
        "usage" => {
            let n = |k: &str| {
                e["usage"][k]
                    .as_u64()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            };
            format!("usage     {}/{} tokens", n("used"), n("size"))
        }
        "tool_call" => format!("tool      [{}] {}", s("status"), s("title")),
        "plan" => format!("plan      {}", plan(e)),
        "request_opened" => {
            let r = &e["request"];
            format!(
                "NEEDS INPUT {} {}  [{}]",
                field(&r["id"]),
                field(&r["title"]),
                options(r)
            )
        }
        "request_closed" => format!(
            "closed    {} {} {} {}",
            s("id"),
            s("status"),
            field(&e["decision"]["option_id"]),
            field(&e["decision"]["decided_by"])
        ),
        "steering_queued" => format!("steering  queued: {}", indent(&e["steering"]["text"])),
        "steering_delivered" => format!(
            "steering  delivered (#{})",
            render::bounded(&e["steering_id"].to_string(), render::FIELD_MAX)
        ),
        "notice" => format!("{:<9} {}", s("level"), s("text")),
        "session_ended" => format!("ended     {}{}", s("status"), reason(e)),
        "events_lost" => format!(
            "LOST      events {}–{} were pruned before this stream read them; `ctl sessions` and `ctl pending` show where things stand",
            render::bounded(&e["first_lost"].to_string(), 20),
            render::bounded(&e["last_lost"].to_string(), 20)
        ),
        _ => format!(
            "{:<9} {}",
            render::bounded(kind, render::FIELD_MAX),
            render::bounded(&e.to_string(), render::FIELD_MAX)
        ),
    };
    let time = render::utc(e["emitted_at"].as_i64().unwrap_or_default());
    let clock = time.get(11..19).unwrap_or(&time);
    if with_session {
        format!("{clock} {} {what}\n", s("session_id"))
    } else {
        format!("{clock} {what}\n")
    }
}

/// A string field of an event on one line, bounded (empty when absent).
fn field(v: &Value) -> String {
    render::bounded(v.as_str().unwrap_or_default(), render::FIELD_MAX)
}

/// ` (reason)` when the event has one.
fn reason(e: &Value) -> String {
    e["reason"]
        .as_str()
        .map(|r| format!(" ({})", render::bounded(r, render::FIELD_MAX)))
        .unwrap_or_default()
}

/// Text meant to span lines (the agent's, a steering message), its
/// continuation lines indented under the first.
fn indent(text: &Value) -> String {
    let text = text.as_str().unwrap_or_default().trim_end();
    let gutter = format!("\n{}", render::continuation(INDENT));
    render::printable(text).replace('\n', &gutter)
}

/// A request's option ids, `, `-separated, on one line.
fn options(request: &Value) -> String {
    let ids: Vec<&str> = request["options"]
        .as_array()
        .map(|o| o.iter().filter_map(|x| x["id"].as_str()).collect())
        .unwrap_or_default();
    render::bounded(&ids.join(", "), LIST_MAX)
}

/// The plan's steps on one line: `[x]` completed, `[>]` in progress,
/// `[ ]` pending (`ctl log` spells the status out; `watch` showed the step
/// in progress as pending).
fn plan(e: &Value) -> String {
    let entries = e["entries"].as_array().map_or(&[][..], Vec::as_slice);
    let steps: Vec<String> = entries
        .iter()
        .map(|pair| {
            let content = pair[0].as_str().unwrap_or_default();
            let mark = match pair[1].as_str() {
                Some("completed") => "x",
                Some("in_progress") => ">",
                _ => " ",
            };
            format!("[{mark}] {content}")
        })
        .collect();
    render::bounded(&steps.join("  "), LIST_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::render::tests::{
        HOSTILE, SHOWN, assert_inert, assert_no_forged_line, assert_shown_on_one_line,
    };
    use serde_json::json;

    /// Every one-line event, each string field [`HOSTILE`].
    fn hostile_events() -> Vec<Value> {
        let h = HOSTILE;
        let common = |mut e: Value| {
            e["emitted_at"] = json!(0);
            e["session_id"] = json!(h);
            e
        };
        [
            json!({"event": "session_started",
                   "session": {"title": h, "workspace": h, "agent": h}}),
            json!({"event": "status_changed", "status": h, "activity": h, "reason": h}),
            json!({"event": "tool_call", "status": h, "title": h}),
            json!({"event": "plan", "entries": [[h, "completed"], [h, h]]}),
            json!({"event": "request_opened",
                   "request": {"id": h, "title": h, "options": [{"id": h}, {"id": h}]}}),
            json!({"event": "request_closed", "id": h, "status": h,
                   "decision": {"option_id": h, "decided_by": h}}),
            json!({"event": "steering_delivered", "steering_id": h}),
            json!({"event": "notice", "level": h, "text": h}),
            json!({"event": "session_ended", "status": h, "reason": h}),
            json!({"event": h, "text": h}),
        ]
        .into_iter()
        .map(common)
        .collect()
    }

    #[test]
    fn event_fields_are_escaped_and_stay_on_their_line() {
        for e in hostile_events() {
            for with_session in [true, false] {
                let line = event_line(&e, with_session);
                assert_inert(&line);
                assert_no_forged_line(&line);
                assert_eq!(line.matches('\n').count(), 1, "{line}");
                assert!(line.ends_with('\n'), "{line}");
                if e["event"] == "steering_delivered" {
                    // The id is shown as JSON: its C0 controls as JSON escapes.
                    assert!(line.contains("\\u{9b}31m\\u{202e}gpj.exe"), "{line}");
                } else {
                    assert_shown_on_one_line(&line);
                }
            }
        }
    }

    #[test]
    fn agent_and_steering_text_keep_their_lines_indented_and_escaped() {
        let events = [
            json!({"event": "agent_text", "emitted_at": 0, "text": HOSTILE}),
            json!({"event": "steering_queued", "emitted_at": 0, "steering": {"text": HOSTILE}}),
        ];
        for e in events {
            let out = event_line(&e, false);
            assert_inert(&out);
            assert_no_forged_line(&out);
            assert!(out.contains(SHOWN), "{out}");
            assert!(out.ends_with("gpj.exe\n        | FORGED line\n"), "{out}");
        }
        let thought = json!({"event": "agent_thought", "emitted_at": 0, "text": "hmm"});
        assert!(event_line(&thought, false).contains("thought   hmm"));
        let usage =
            json!({"event": "usage", "emitted_at": 0, "usage": {"used": 53000, "size": 200000}});
        assert!(event_line(&usage, false).contains("usage     53000/200000 tokens"));
        let plain = json!({"event": "agent_text", "emitted_at": 0, "text": "one\ntwo\n"});
        assert_eq!(
            event_line(&plain, false),
            "00:00:00 agent     one\n        | two\n"
        );
    }

    #[test]
    fn a_huge_title_is_clipped() {
        let huge = "T".repeat(500_000);
        let cut = format!(
            "{}…({} more bytes)",
            "T".repeat(render::FIELD_MAX),
            500_000 - render::FIELD_MAX
        );
        let tool =
            json!({"event": "tool_call", "emitted_at": 0, "status": "pending", "title": huge});
        assert_eq!(
            event_line(&tool, false),
            format!("00:00:00 tool      [pending] {cut}\n")
        );
        let request = json!({"event": "request_opened", "emitted_at": 0,
            "request": {"id": "s-1:req-1", "title": huge, "options": [{"id": "allow"}]}});
        assert_eq!(
            event_line(&request, false),
            format!("00:00:00 NEEDS INPUT s-1:req-1 {cut}  [allow]\n")
        );
        let plan = json!({"event": "plan", "emitted_at": 0, "entries": [[huge, "pending"]]});
        assert!(
            event_line(&plan, false).len() < 2 * LIST_MAX,
            "plan not bounded"
        );
    }

    #[test]
    fn messages_are_split_on_blank_lines_and_comments_skipped() {
        let text = ": keep-alive\n\nid: 3\n\nid: 4\ndata: {\"a\":1}\n\ndata: x\ndata: y\n\n";
        let mut reader = std::io::Cursor::new(text.as_bytes());
        let m = |id: Option<i64>, data: &str| SseMessage {
            id,
            data: data.into(),
        };
        let mut got = Vec::new();
        while let Some(message) = next_message(&mut reader).expect("read") {
            got.push(message);
        }
        assert_eq!(
            got,
            vec![m(Some(3), ""), m(Some(4), "{\"a\":1}"), m(None, "x\ny")]
        );
    }

    #[test]
    fn events_render_as_lines() {
        let e = serde_json::json!({
            "event": "request_opened", "emitted_at": 0, "session_id": "s-1",
            "request": {"id": "s-1:req-1", "title": "Write a.txt",
                        "options": [{"id": "allow"}, {"id": "reject"}]}
        });
        let line = event_line(&e, true);
        assert!(
            line.contains("s-1 NEEDS INPUT s-1:req-1 Write a.txt  [allow, reject]"),
            "{line}"
        );
        let plan = serde_json::json!({"event": "plan", "emitted_at": 0,
            "entries": [["read", "completed"], ["edit", "in_progress"], ["write", "pending"]]});
        assert!(event_line(&plan, false).contains("[x] read  [>] edit  [ ] write"));
        let lost = serde_json::json!({"event": "events_lost", "first_lost": 3, "last_lost": 9});
        assert!(event_line(&lost, false).contains("LOST      events 3–9 were pruned"));
    }
}
