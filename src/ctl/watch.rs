//! `ctl watch [id]` and `ctl log --follow`: the event stream in a terminal.
//!
//! Why this exists: polling the transcript re-downloads it whole; the event
//! stream (`GET /api/events`) says what changed as it happens. The reader
//! here follows it, reconnects with `Last-Event-ID` when the connection
//! drops (a server restart), so nothing is missed, and renders each event
//! as one line.

use std::io::BufRead;
use std::time::Duration;

use serde_json::Value;

use super::client::{Client, CtlError};
use super::render;

/// How long to wait before reconnecting after the stream dropped.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);

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
            Err(CtlError::Unreachable { .. }) if opened => {
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
    let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
    let kind = s("event");
    let what = match kind.as_str() {
        "session_started" => format!(
            "started   {} ({}, {})",
            e["session"]["title"].as_str().unwrap_or_default(),
            e["session"]["workspace"].as_str().unwrap_or_default(),
            e["session"]["agent"].as_str().unwrap_or_default()
        ),
        "status_changed" => format!("status    {} · {}{}", s("status"), s("activity"), reason(e)),
        "agent_text" => format!("agent     {}", indent(&s("text"))),
        "tool_call" => format!("tool      [{}] {}", s("status"), s("title")),
        "plan" => format!("plan      {}", plan(e)),
        "request_opened" => {
            let r = &e["request"];
            let options: Vec<&str> = r["options"]
                .as_array()
                .map(|o| o.iter().filter_map(|x| x["id"].as_str()).collect())
                .unwrap_or_default();
            format!(
                "NEEDS INPUT {} {}  [{}]",
                r["id"].as_str().unwrap_or_default(),
                r["title"].as_str().unwrap_or_default(),
                options.join(", ")
            )
        }
        "request_closed" => {
            let by = e["decision"]["decided_by"].as_str().unwrap_or_default();
            let option = e["decision"]["option_id"].as_str().unwrap_or_default();
            format!("closed    {} {} {option} {by}", s("id"), s("status"))
        }
        "steering_queued" => format!(
            "steering  queued: {}",
            e["steering"]["text"].as_str().unwrap_or_default()
        ),
        "steering_delivered" => format!("steering  delivered (#{})", e["steering_id"]),
        "notice" => format!("{:<9} {}", s("level"), s("text")),
        "session_ended" => format!("ended     {}{}", s("status"), reason(e)),
        _ => format!("{kind:<9} {e}"),
    };
    let time = render::utc(e["emitted_at"].as_i64().unwrap_or_default());
    let clock = time.get(11..19).unwrap_or(&time);
    if with_session {
        format!("{clock} {} {what}\n", s("session_id"))
    } else {
        format!("{clock} {what}\n")
    }
}

fn reason(e: &Value) -> String {
    e["reason"]
        .as_str()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default()
}

fn indent(text: &str) -> String {
    text.trim_end().replace('\n', "\n          ")
}

fn plan(e: &Value) -> String {
    let entries = e["entries"].as_array().cloned().unwrap_or_default();
    entries
        .iter()
        .map(|pair| {
            let content = pair[0].as_str().unwrap_or_default();
            let mark = if pair[1] == "completed" { "x" } else { " " };
            format!("[{mark}] {content}")
        })
        .collect::<Vec<_>>()
        .join("  ")
}

#[cfg(test)]
mod tests {
    use super::*;

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
            "entries": [["read", "completed"], ["write", "pending"]]});
        assert!(event_line(&plan, false).contains("[x] read  [ ] write"));
    }
}
