//! The real Claude Code (claude-code-acp 0.16.2, pinned in
//! `tests/interop/package.json`) running whole turns offline against the fake
//! Anthropic API in `interop_support/fake_anthropic.rs`: a fresh HOME,
//! `ANTHROPIC_BASE_URL` on loopback, `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`.
//!
//! The model answers "create hello.txt" with a `mcp__acp__Write` tool use, so
//! Claude Code announces a `tool_call` with the diff, asks
//! `session/request_permission` naming only the tool call, and after Allow
//! writes through `fs/write_text_file`. These tests hold the server to one
//! approval per change, carrying the diff and the workspace-relative file;
//! reject, cancel, a second turn, a crash with `session/load`, a revive
//! after a shutdown with `session/load`, and `auto-edits` are covered too.
//!
//! Ignored by a plain `cargo test`; `tests/interop/run.sh` runs them.

mod interop_support;
mod support;

use std::path::Path;
use std::sync::Arc;

use intercom_actors::model::{
    PendingRequest, RequestKind, RequestStatus, SessionId, SessionStatus,
};
use intercom_actors::ports::SessionStore;
use intercom_actors::rules::ApprovalMode;
use intercom_actors::session::{Caller, Choice, StopCause};
use intercom_actors::supervisor::SupervisorMsg;
use interop_support::fake_anthropic::{self, FakeAnthropic, Reply};
use interop_support::turns::{knobs, pid, steer, stop, stop_by, until_file, until_turn_ended};
use interop_support::{bin, fresh_home, profile, set_env};
use serde_json::json;
use support::{Harness, Knobs, decide, request_opened, until_group_gone};

const CONTENT: &str = "hello from claude\n";
const SECOND: &str = "second file\n";
const ENV: &[&str] = &[
    "IS_SANDBOX",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_API_KEY",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
];

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One harness with the fake model: writes `hello.txt` when asked (and
/// `second.txt` when the prompt mentions "second"), and says "done" once
/// told how the write went.
async fn setup(knobs: Knobs) -> (Harness, FakeAnthropic) {
    let h = Harness::new(knobs).await;
    fresh_home(h.dir.path());
    let file = h.workspace.join("hello.txt").display().to_string();
    let second = h.workspace.join("second.txt").display().to_string();
    let script: fake_anthropic::Script = Arc::new(move |req| {
        if fake_anthropic::answers_a_tool(req) {
            Reply::text("done")
        } else if fake_anthropic::prompt_mentions(req, "second") {
            Reply::tool(
                "And the second one.",
                "mcp__acp__Write",
                json!({"file_path": second, "content": SECOND}),
            )
        } else {
            Reply::tool(
                "I'll create it.",
                "mcp__acp__Write",
                json!({"file_path": file, "content": CONTENT}),
            )
        }
    });
    let fake = FakeAnthropic::start(script).await;
    set_env(&[
        ("ANTHROPIC_BASE_URL", fake.url.as_str()),
        ("ANTHROPIC_API_KEY", "sk-ant-fake-offline"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ]);
    (h, fake)
}

async fn start(h: &Harness, mode: Option<ApprovalMode>) -> SessionId {
    let p = profile("claude", bin("claude-code-acp"), &[], ENV);
    let mut req = h.request(p, "create hello.txt");
    req.mode = mode;
    h.start_req(req).await.expect("claude-code-acp starts").id
}

/// The write permission as the operator sees it: one approval, the diff,
/// the workspace-relative file.
fn assert_shows_the_write(req: &PendingRequest, workspace: &Path) {
    assert_eq!(req.kind, RequestKind::Permission, "{req:?}");
    assert_eq!(req.paths, vec!["hello.txt".to_owned()], "{req:?}");
    assert_eq!(req.title, "Write hello.txt", "{req:?}");
    let diff = req.diff.as_deref().expect("the diff is shown");
    assert!(
        diff.contains("+++ b/hello.txt") && diff.contains("+hello from claude"),
        "{diff}"
    );
    let abs = workspace.display().to_string();
    assert!(!diff.contains(&abs) && !req.title.contains(&abs), "{req:?}");
}

#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn one_approval_with_the_diff_writes_the_models_exact_content() {
    let _serial = SERIAL.lock().await;
    let (h, fake) = setup(knobs()).await;
    let id = start(&h, None).await;
    let req = request_opened(&h, 1).await;
    assert_shows_the_write(&req, &h.workspace);
    decide(&h, &id, &req.request_id, Choice::Approve).await;
    assert_eq!(until_file(&h.workspace.join("hello.txt")).await, CONTENT);
    h.until_transcript(&id, "done").await;
    let all = h.store.list_requests(Some(&id), false).await.expect("list");
    assert_eq!(all.len(), 1, "one approval for one write: {all:?}");
    // The model's thinking reached the operator, whole, before its text.
    let entries = h.transcript(&id).await;
    let thought = entries
        .iter()
        .position(|m| m.kind == intercom_actors::model::MessageKind::Thought)
        .unwrap_or_else(|| panic!("no thought stored: {entries:?}"));
    assert!(
        entries[thought].content.contains("I should call it"),
        "{entries:?}"
    );
    assert!(
        h.store
            .audit_entries()
            .iter()
            .any(|a| a.action == "fs.write_covered" && a.detail["path"] == "hello.txt"),
        "the write is recorded as covered by the approval"
    );
    // A second prompt runs a second turn, with its own single approval.
    steer(&h, &id, "now the second file").await;
    let second = request_opened(&h, 2).await;
    assert_eq!(second.paths, vec!["second.txt".to_owned()]);
    decide(&h, &id, &second.request_id, Choice::Approve).await;
    assert_eq!(until_file(&h.workspace.join("second.txt")).await, SECOND);
    let all = h.store.list_requests(Some(&id), false).await.expect("list");
    assert_eq!(all.len(), 2, "{all:?}");
    // Both prompts reached the model (the second turn's own model call).
    assert!(
        fake.messages()
            .iter()
            .any(|m| fake_anthropic::prompt_mentions(m, "second")),
        "the second prompt never reached the model"
    );
    stop(&h, &id).await;
}

#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn a_rejected_write_leaves_no_file_and_the_turn_ends() {
    let _serial = SERIAL.lock().await;
    let (h, fake) = setup(knobs()).await;
    let id = start(&h, None).await;
    let req = request_opened(&h, 1).await;
    assert_shows_the_write(&req, &h.workspace);
    decide(&h, &id, &req.request_id, Choice::Reject).await;
    // Claude Code ends the turn on a rejection (the model is not called again).
    until_turn_ended(&h, &id).await;
    assert!(!h.workspace.join("hello.txt").exists());
    let all = h.store.list_requests(Some(&id), false).await.expect("list");
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(fake.messages().len(), 1, "{:?}", fake.requests());
    stop(&h, &id).await;
}

#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn cancel_mid_turn_answers_the_permission_and_ends_the_group() {
    let _serial = SERIAL.lock().await;
    let (h, _fake) = setup(knobs()).await;
    let id = start(&h, None).await;
    let req = request_opened(&h, 1).await;
    let group = pid(&h, &id).await;
    stop(&h, &id).await;
    until_group_gone(group).await;
    let (stored, _) = h
        .store
        .get_request(&req.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(stored.status, RequestStatus::Cancelled);
    assert!(!h.workspace.join("hello.txt").exists());
}

#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn auto_edits_answers_the_edit_permission_itself() {
    let _serial = SERIAL.lock().await;
    let (h, _fake) = setup(knobs()).await;
    let id = start(&h, Some(ApprovalMode::AutoEdits)).await;
    assert_eq!(until_file(&h.workspace.join("hello.txt")).await, CONTENT);
    h.until_transcript(&id, "done").await;
    let all = h.store.list_requests(Some(&id), false).await.expect("list");
    assert_eq!(all.len(), 1, "{all:?}");
    let (_, decision) = h
        .store
        .get_request(&all[0].id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(decision.expect("decided").decided_by, "mode:auto-edits");
    stop(&h, &id).await;
}

/// Waits until one of Claude Code's session files under the fresh HOME
/// (`.claude/projects/<cwd>/<session>.jsonl`) holds `text` on a whole line.
async fn until_claude_stored(dir: &Path, text: &str) {
    let projects = dir.join("home/.claude/projects");
    let deadline = tokio::time::Instant::now() + support::WAIT;
    while !session_files(&projects).iter().any(|body| {
        body.split_inclusive('\n')
            .any(|line| line.ends_with('\n') && line.contains(text))
    }) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Claude Code session file under {} ever held {text:?}",
            projects.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A session whose first turn (the approved write of hello.txt) is done.
async fn first_turn_done(h: &Harness) -> SessionId {
    let id = start(h, None).await;
    let first = request_opened(h, 1).await;
    decide(h, &id, &first.request_id, Choice::Approve).await;
    h.until_transcript(&id, "done").await;
    id
}

/// The text of every `*.jsonl` one level under `projects`.
fn session_files(projects: &Path) -> Vec<String> {
    let dirs = std::fs::read_dir(projects).into_iter().flatten().flatten();
    dirs.flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .filter(|f| f.path().extension().is_some_and(|e| e == "jsonl"))
        .filter_map(|f| std::fs::read_to_string(f.path()).ok())
        .collect()
}

#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn a_crash_mid_turn_resumes_with_session_load() {
    let _serial = SERIAL.lock().await;
    let (h, _fake) = setup(knobs()).await;
    // Claude Code stores a session once a turn completed; load needs that.
    let id = first_turn_done(&h).await;
    steer(&h, &id, "now the second file").await;
    request_opened(&h, 2).await;
    // Claude Code writes its session file behind the turn; kill it only once
    // the file holds the second turn's write, or there is nothing to load.
    until_claude_stored(h.dir.path(), "second.txt").await;
    let group = pid(&h, &id).await;
    // SAFETY: signals the agent's own process group, which this test started.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    until_group_gone(group).await;
    h.until_transcript(&id, "resumed the agent's session").await;
    let text = h.transcript_text(&id).await;
    assert!(!text.contains("starting a fresh one"), "{text}");
    // The interrupted turn is continued, and asks again.
    let again = request_opened(&h, 3).await;
    decide(&h, &id, &again.request_id, Choice::Approve).await;
    h.until_record(&id, "active after the restart", |r| r.restart_count == 1)
        .await;
    stop(&h, &id).await;
}

/// A session a server shutdown stopped is revived by the operator: the real
/// Claude Code is started again, loads its own session (it remembers the
/// first turn), and takes the next instruction as before.
#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn a_session_a_shutdown_stopped_is_revived_with_session_load() {
    let _serial = SERIAL.lock().await;
    let (h, _fake) = setup(knobs()).await;
    let id = first_turn_done(&h).await;
    // Load needs the turn in Claude Code's own session file.
    until_claude_stored(h.dir.path(), "hello.txt").await;
    stop_by(&h, &id, StopCause::Shutdown).await;
    let ended = h
        .until_record(&id, "stopped by the shutdown", |r| {
            r.status == SessionStatus::Cancelled
        })
        .await;
    assert!(ended.revivable(), "{ended:?}");
    let p = profile("claude", bin("claude-code-acp"), &[], ENV);
    let revived = ractor::call!(h.sup, |reply| SupervisorMsg::Revive {
        id: id.clone(),
        profile: p,
        caller: Caller::local(),
        reply
    })
    .expect("revive call")
    .expect("revived");
    assert_eq!(revived.status, SessionStatus::Active);
    h.until_transcript(&id, "Session revived: resumed the agent's session")
        .await;
    steer(&h, &id, "now the second file").await;
    let second = request_opened(&h, 2).await;
    decide(&h, &id, &second.request_id, Choice::Approve).await;
    assert_eq!(until_file(&h.workspace.join("second.txt")).await, SECOND);
    stop(&h, &id).await;
}
