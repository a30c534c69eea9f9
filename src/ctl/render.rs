//! Human-readable output for `ctl`: aligned tables and transcript lines.
//!
//! Times are shown in UTC (`2025-01-31 12:00:00`) or relative (`3m ago`);
//! the API itself carries Unix milliseconds.

use intercom_actors::model::now_ms;
use serde_json::Value;

use crate::http::views::{ApprovalView, MessageView, SessionDetailView, SessionView};

/// Widest a free-text cell gets in a table.
const CELL_MAX: usize = 60;

/// Left-aligned columns separated by two spaces; no trailing blanks.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
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

/// One line, at most `max` characters (with `…` when cut).
pub fn clip(text: &str, max: usize) -> String {
    let flat = text.replace(['\n', '\r', '\t'], " ");
    if flat.chars().count() <= max {
        return flat;
    }
    let mut cut: String = flat.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `12s ago`, `3m ago`, `5h ago`, `2d ago`.
pub fn ago(ms: i64, now: i64) -> String {
    let secs = (now - ms).max(0) / 1000;
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
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.status.to_string(),
                clip(&s.workspace, 30),
                s.agent.clone(),
                s.owner.clone(),
                ago(s.updated_at, now),
                clip(&s.title, CELL_MAX),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "STATUS",
            "WORKSPACE",
            "AGENT",
            "OWNER",
            "UPDATED",
            "TITLE",
        ],
        &rows,
    )
}

/// `ctl start` / `ctl cancel`: one line about a session.
pub fn session_line(s: &SessionView) -> String {
    let reason = s
        .status_reason
        .as_deref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    format!(
        "{}  {}{reason}  workspace {}  agent {}\n",
        s.id, s.status, s.workspace, s.agent
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
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out: String = fields
        .iter()
        .map(|(k, v)| format!("{k:<width$}  {v}\n"))
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
        let id = answer["id"].as_str().unwrap_or("?");
        return format!("{id}  stopping (the agent is being terminated)\n");
    }
    match serde_json::from_value::<SessionView>(answer.clone()) {
        Ok(session) => session_line(&session),
        Err(_) => format!("{answer}\n"),
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
                format!("{mark}{}", printable(&c.id))
            })
            .collect();
        format!("{label:<8} {}\n", items.join("  "))
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
            let options: Vec<&str> = a.options.iter().map(|o| o.id.as_str()).collect();
            vec![
                a.id.clone(),
                a.status.as_str().to_owned(),
                a.kind.as_str().to_owned(),
                ago(a.created_at, now),
                clip(&a.title, 40),
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
    if a.paths.is_empty() && diff.is_none() {
        return String::new();
    }
    let mut out = format!("\n{}", a.id);
    if !a.paths.is_empty() {
        out.push_str(&format!(" — {}", printable(&a.paths.join(", "))));
    }
    out.push('\n');
    if let Some(diff) = diff {
        out.push_str(&printable(diff));
        if !diff.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Agent-supplied text without terminal control characters (an escape
/// sequence in a diff must not reach the operator's terminal).
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '\u{fffd}'
            } else {
                c
            }
        })
        .collect()
}

/// `ctl approve` / `ctl reject`.
pub fn decided(a: &ApprovalView) -> String {
    match &a.decision {
        Some(d) => {
            let verdict = if d.approved { "approved" } else { "rejected" };
            let reason = d
                .reason
                .as_deref()
                .map(|r| format!(" — {r}"))
                .unwrap_or_default();
            format!(
                "{}: {verdict} ({}) by {}{reason}\n",
                a.id, d.option_id, d.decided_by
            )
        }
        None => format!("{}: {}\n", a.id, a.status.as_str()),
    }
}

/// One transcript entry as printed by `ctl log`.
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
    let prefix = format!("{time} {:<6} ", m.role);
    let indent = " ".repeat(prefix.chars().count());
    let indented = body.replace('\n', &format!("\n{indent}"));
    format!("{prefix}{indented}\n")
}

fn tool_line(content: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(content) else {
        return format!("tool {content}");
    };
    let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    format!("tool {} [{}]", field("title"), field("status"))
}

fn plan_lines(content: &str) -> String {
    let Ok(Value::Array(entries)) = serde_json::from_str::<Value>(content) else {
        return format!("plan {content}");
    };
    let lines: Vec<String> = entries
        .iter()
        .map(|e| {
            let status = e.get("status").and_then(Value::as_str).unwrap_or("?");
            let text = e.get("content").and_then(Value::as_str).unwrap_or("");
            format!("  [{status}] {text}")
        })
        .collect();
    format!("plan\n{}", lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_names_the_approval_mode() {
        let d: SessionDetailView = serde_json::from_value(serde_json::json!({
            "id": "s-1", "workspace": "demo", "agent": "scripted", "status": "active",
            "status_reason": null, "title": "t", "owner": "local", "created_at": 0,
            "updated_at": 0, "last_activity_at": 0, "restart_count": 0, "cwd": "/w",
            "protocol": "acp", "channel_id": null, "thread_ts": null,
            "approval_mode": "auto-edits", "pending": [], "live": null
        }))
        .expect("detail");
        assert!(
            session_detail(&d).contains("mode       auto-edits\n"),
            "{}",
            session_detail(&d)
        );
    }

    #[test]
    fn tables_align_columns() {
        let t = table(
            &["A", "BB"],
            &[vec!["xxx".into(), "y".into()], vec!["z".into(), "".into()]],
        );
        assert_eq!(t, "A    BB\nxxx  y\nz\n");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_735_689_599_000), "2024-12-31 23:59:59");
    }

    #[test]
    fn relative_times() {
        assert_eq!(ago(0, 59_000), "59s ago");
        assert_eq!(ago(0, 120_000), "2m ago");
        assert_eq!(ago(0, 7_200_000), "2h ago");
        assert_eq!(ago(10, 0), "0s ago");
    }

    #[test]
    fn clipping() {
        assert_eq!(clip("a\nb", 10), "a b");
        assert_eq!(clip("abcdef", 4), "abc…");
    }

    #[test]
    fn pending_approvals_show_their_files_and_diff_without_escapes() {
        let a = ApprovalView {
            id: "s-1:req-1".into(),
            session_id: "s-1".into(),
            request_id: "req-1".into(),
            title: "Write hello.txt".into(),
            kind: intercom_actors::model::RequestKind::Permission,
            diff: Some("--- /dev/null\n+++ b/hello.txt\n+hi \u{1b}[2J\n".into()),
            paths: vec!["hello.txt".into()],
            options: vec![],
            status: intercom_actors::model::RequestStatus::Pending,
            created_at: 0,
            decision: None,
        };
        let out = approvals(&[a]);
        assert!(
            out.contains("s-1:req-1 — hello.txt\n--- /dev/null\n+++ b/hello.txt\n"),
            "{out}"
        );
        assert!(!out.contains('\u{1b}'), "{out}");
    }

    #[test]
    fn tool_and_plan_entries_are_summarised() {
        let tool = MessageView {
            id: 1,
            role: "system".into(),
            kind: "tool".into(),
            content: r#"{"id":"t1","title":"Write x","status":"completed"}"#.into(),
            created_at: 0,
        };
        assert!(message(&tool).contains("tool Write x [completed]"));
        let plan = MessageView {
            kind: "plan".into(),
            content: r#"[{"content":"a","status":"pending"}]"#.into(),
            ..tool
        };
        assert!(message(&plan).contains("[pending] a"));
    }
}
