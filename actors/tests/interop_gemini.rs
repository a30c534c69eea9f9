//! The real Gemini CLI (`@google/gemini-cli`, pinned in
//! `tests/interop/package.json`, `gemini --acp`) running whole turns offline
//! against the fake Gemini API in `interop_support/fake_gemini.rs`: a fresh
//! HOME, `GOOGLE_GEMINI_BASE_URL` on loopback (which selects Gemini's
//! `gateway` auth), a fake `GEMINI_API_KEY`, `GEMINI_CLI_NO_RELAUNCH=true`.
//!
//! The model answers "update hello.txt" with a `write_file` function call, so
//! Gemini reads the file through `fs/read_text_file`, announces the tool call
//! with its diff, asks `session/request_permission`, and after Allow writes
//! through `fs/write_text_file`. These tests hold the server to one approval
//! per change, carrying the diff and the workspace-relative file; reject,
//! cancel, a second turn, `auto-edits` and a crash mid-turn (the restart
//! resumes Gemini's session or, when its `session/load` does not find it,
//! runs fresh and says so; either way the interrupted write is finished)
//! are covered too.
//!
//! Gemini 0.61.0 cannot create a *new* file through an ACP client: its
//! existence check only recognises a missing file by an `Error` carrying
//! "ENOENT" (`err instanceof Error`, then `err.code === "ENOENT"`), and its
//! ACP SDK rejects with the plain JSON-RPC error object, so every error answer
//! (ours is -32002 "ENOENT: no such file or directory, open '…'") fails the
//! check and the tool fails before asking. The last test pins
//! that down, so an upgrade that fixes it shows up here.
//!
//! Ignored by a plain `cargo test`; `tests/interop/run.sh` runs them.

mod interop_support;
mod support;

use std::path::Path;
use std::sync::Arc;

use intercom_actors::model::{PendingRequest, RequestKind, RequestStatus, SessionId};
use intercom_actors::ports::SessionStore;
use intercom_actors::rules::ApprovalMode;
use intercom_actors::session::Choice;
use interop_support::fake_gemini::{self, FakeGemini, Reply};
use interop_support::turns::{knobs, pid, steer, stop, until_content, until_turn_ended};
use interop_support::{bin, fresh_home, profile, set_env};
use serde_json::json;
use support::{Harness, Knobs, decide, request_opened, until_group_gone};

const OLD: &str = "old line\n";
const CONTENT: &str = "hello from gemini\n";
const SECOND: &str = "second turn\n";
const ENV: &[&str] = &[
    "GOOGLE_GEMINI_BASE_URL",
    "GEMINI_API_KEY",
    "GEMINI_CLI_NO_RELAUNCH",
];

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One harness with the fake model: writes `hello.txt` when asked (the
/// content [`SECOND`] once the user has mentioned "second", `new.txt` when
/// the prompt mentions "new"), and says "done" once told how the write went.
async fn setup(knobs: Knobs) -> (Harness, FakeGemini) {
    let h = Harness::new(knobs).await;
    fresh_home(h.dir.path());
    std::fs::write(h.workspace.join("hello.txt"), OLD).expect("seed hello.txt");
    let file = h.workspace.join("hello.txt").display().to_string();
    let new = h.workspace.join("new.txt").display().to_string();
    let script: fake_gemini::Script = Arc::new(move |req| {
        let write = |path: &str, content: &str| {
            Reply::call(
                "I'll write it.",
                "write_file",
                json!({"file_path": path, "content": content}),
            )
        };
        if fake_gemini::answers_a_tool(req) {
            Reply::text("done")
        } else if fake_gemini::conversation_mentions(req, "second") {
            write(&file, SECOND)
        } else if fake_gemini::prompt_mentions(req, "new") {
            write(&new, CONTENT)
        } else {
            write(&file, CONTENT)
        }
    });
    let fake = FakeGemini::start(script).await;
    set_env(&[
        ("GOOGLE_GEMINI_BASE_URL", fake.url.as_str()),
        ("GEMINI_API_KEY", "fake-offline-key"),
        ("GEMINI_CLI_NO_RELAUNCH", "true"),
    ]);
    (h, fake)
}

async fn start(h: &Harness, prompt: &str, mode: Option<ApprovalMode>) -> SessionId {
    let args = ["--acp", "--model", "gemini-2.5-flash"];
    let p = profile("gemini", bin("gemini"), &args, ENV);
    let mut req = h.request(p, prompt);
    req.mode = mode;
    h.start_req(req).await.expect("gemini starts").id
}

/// The write permission as the operator sees it: one approval, the diff,
/// the workspace-relative file.
fn assert_shows_the_write(req: &PendingRequest, workspace: &Path) {
    assert_eq!(req.kind, RequestKind::Permission, "{req:?}");
    assert_eq!(req.paths, vec!["hello.txt".to_owned()], "{req:?}");
    let diff = req.diff.as_deref().expect("the diff is shown");
    assert!(
        diff.contains("+++ b/hello.txt")
            && diff.contains("-old line")
            && diff.contains("+hello from gemini"),
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
    let id = start(&h, "update hello.txt", None).await;
    let req = request_opened(&h, 1).await;
    assert_shows_the_write(&req, &h.workspace);
    decide(&h, &id, &req.request_id, Choice::Approve).await;
    until_content(&h.workspace.join("hello.txt"), CONTENT).await;
    h.until_transcript(&id, "done").await;
    let all = h.store.list_requests(Some(&id), false).await.expect("list");
    assert_eq!(all.len(), 1, "one approval for one write: {all:?}");
    assert!(
        h.store
            .audit_entries()
            .iter()
            .any(|a| a.action == "fs.write_covered" && a.detail["path"] == "hello.txt"),
        "the write is recorded as covered by the approval"
    );
    let entries = h.transcript(&id).await;
    assert!(
        entries.iter().any(|m| {
            m.kind == intercom_actors::model::MessageKind::Thought
                && m.content.contains("I should call it")
        }),
        "the model's thought reached the operator: {entries:?}"
    );
    // A second prompt runs a second turn, with its own single approval.
    steer(&h, &id, "now the second version").await;
    let second = request_opened(&h, 2).await;
    assert_eq!(second.paths, vec!["hello.txt".to_owned()]);
    assert!(
        second
            .diff
            .as_deref()
            .is_some_and(|d| d.contains("+second turn")),
        "{second:?}"
    );
    decide(&h, &id, &second.request_id, Choice::Approve).await;
    until_content(&h.workspace.join("hello.txt"), SECOND).await;
    let all = h.store.list_requests(Some(&id), false).await.expect("list");
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(
        fake.turns()
            .iter()
            .any(|t| fake_gemini::prompt_mentions(t, "second")),
        "the second prompt never reached the model"
    );
    stop(&h, &id).await;
}

#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn a_rejected_write_leaves_the_file_and_the_turn_ends() {
    let _serial = SERIAL.lock().await;
    let (h, _fake) = setup(knobs()).await;
    let id = start(&h, "update hello.txt", None).await;
    let req = request_opened(&h, 1).await;
    assert_shows_the_write(&req, &h.workspace);
    decide(&h, &id, &req.request_id, Choice::Reject).await;
    until_turn_ended(&h, &id).await;
    assert_eq!(
        std::fs::read_to_string(h.workspace.join("hello.txt")).expect("read"),
        OLD
    );
    let all = h.store.list_requests(Some(&id), false).await.expect("list");
    assert_eq!(all.len(), 1, "{all:?}");
    stop(&h, &id).await;
}

#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn cancel_mid_turn_answers_the_permission_and_ends_the_group() {
    let _serial = SERIAL.lock().await;
    let (h, _fake) = setup(knobs()).await;
    let id = start(&h, "update hello.txt", None).await;
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
    assert_eq!(
        std::fs::read_to_string(h.workspace.join("hello.txt")).expect("read"),
        OLD
    );
}

#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn auto_edits_answers_the_edit_permission_itself() {
    let _serial = SERIAL.lock().await;
    let (h, _fake) = setup(knobs()).await;
    let id = start(&h, "update hello.txt", Some(ApprovalMode::AutoEdits)).await;
    until_content(&h.workspace.join("hello.txt"), CONTENT).await;
    h.until_transcript(&id, "done").await;
    let all = h.store.list_requests(Some(&id), false).await.expect("list");
    assert!(
        all.iter().all(|r| r.status != RequestStatus::Pending),
        "{all:?}"
    );
    stop(&h, &id).await;
}

/// Gemini 0.61.0's own limit (see the file comment): a new file fails in its
/// existence check before any approval is asked. If this starts failing, an
/// upgrade fixed it: turn it into a creation test.
#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn a_new_file_fails_inside_gemini_before_any_approval() {
    let _serial = SERIAL.lock().await;
    let (h, fake) = setup(knobs()).await;
    let id = start(&h, "create new.txt", None).await;
    h.until_transcript(&id, "done").await;
    let told = fake
        .turns()
        .iter()
        .filter(|t| fake_gemini::answers_a_tool(t))
        .map(fake_gemini::tool_result_text)
        .collect::<Vec<_>>()
        .join("\n");
    // Our answer reached it worded as ENOENT, but as a plain object with no
    // `code`, which its check requires.
    assert!(
        told.contains("Error checking existing file: ENOENT: no such file or directory"),
        "{told}"
    );
    assert!(!h.workspace.join("new.txt").exists());
    let all = h.store.list_requests(Some(&id), false).await.expect("list");
    assert!(all.is_empty(), "no approval was asked: {all:?}");
    stop(&h, &id).await;
}

/// Gemini 0.61.0 offers `loadSession`. After a SIGKILL mid-turn its
/// `session/load` mostly answers "No previous sessions found for this
/// project." (the restart then starts a fresh agent session, says so, and
/// runs the interrupted prompt again), but sometimes finds the chat and
/// resumes it (seen in CI; then the server re-prompts with its "continue"
/// text). Which one happens is decided inside Gemini, so the test takes
/// either, checks the operator was told which, and holds both to the same
/// end: one more approval carrying the second version's diff, the file
/// written, the restart counted.
#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn a_crash_mid_turn_restarts_and_finishes_the_write() {
    let _serial = SERIAL.lock().await;
    let (h, _fake) = setup(knobs()).await;
    let id = start(&h, "update hello.txt", None).await;
    let first = request_opened(&h, 1).await;
    decide(&h, &id, &first.request_id, Choice::Approve).await;
    h.until_transcript(&id, "done").await;
    steer(&h, &id, "now the second version").await;
    request_opened(&h, 2).await;
    let group = pid(&h, &id).await;
    // SAFETY: signals the agent's own process group, which this test started.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    until_group_gone(group).await;
    let text = h.until_transcript(&id, "the agent's session").await;
    let fresh = "No previous sessions found for this project.\"}); starting a fresh one";
    assert!(
        text.contains(fresh) || text.contains("Agent restarted: resumed the agent's session."),
        "{text}"
    );
    let again = request_opened(&h, 3).await;
    assert_eq!(again.paths, vec!["hello.txt".to_owned()]);
    let diff = again.diff.as_deref().expect("the diff is shown");
    assert!(diff.contains("+second turn"), "{diff}");
    decide(&h, &id, &again.request_id, Choice::Approve).await;
    until_content(&h.workspace.join("hello.txt"), SECOND).await;
    h.until_record(&id, "active after the restart", |r| r.restart_count == 1)
        .await;
    stop(&h, &id).await;
}
