//! Interop with real ACP agents from npm (installed by `tests/interop/install.sh`
//! at pinned versions): claude-code-acp and gemini-cli. Offline they answer the
//! handshake and then fail on authentication, which must reach the operator as
//! a clear message naming the agent and the auth methods it offers. Every
//! agent process group must be gone afterwards.
//!
//! Ignored by a plain `cargo test` (they need the npm install);
//! `tests/interop/run.sh`, which `.ci/run` calls, installs the agents and runs
//! them with `--ignored`, where a missing install is a failure.

mod interop_support;
mod support;

use intercom_actors::model::SessionStatus;
use intercom_actors::ports::{NoticeLevel, OperatorEvent, SessionStore};
use intercom_actors::session::{Caller, SessionMsg, StartError, StopCause};
use intercom_actors::settings::Limits;
use intercom_actors::supervisor::SupervisorError;
use interop_support::{bin, fresh_home, processes_with, profile};
use support::{Harness, Knobs, until_group_gone};

fn knobs() -> Knobs {
    Knobs {
        limits: Limits {
            startup_timeout_secs: 90,
            shutdown_grace_secs: 2,
            ..Knobs::default().limits
        },
        ..Knobs::default()
    }
}

/// Agents need a writable HOME of their own; as root claude-code-acp needs IS_SANDBOX=1.
fn isolate_home(h: &Harness) {
    fresh_home(h.dir.path());
}

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn claude_code_acp_handshakes_then_reports_authentication() {
    let _serial = SERIAL.lock().await;
    let h = Harness::new(knobs()).await;
    isolate_home(&h);
    let p = profile("claude", bin("claude-code-acp"), &[], &["IS_SANDBOX"]);
    let rec = h
        .start_req(h.request(p, "hello"))
        .await
        .expect("claude-code-acp creates a session offline");
    assert_eq!(rec.status, SessionStatus::Active);
    assert!(
        rec.acp_session_id.is_some()
            || h.store
                .get_session(&rec.id)
                .await
                .expect("get")
                .and_then(|r| r.acp_session_id)
                .is_some()
    );
    let actor = h.actor(&rec.id).await;
    let snap = ractor::call!(actor, SessionMsg::Snapshot).expect("snapshot");
    assert!(
        snap.agent.load_session,
        "claude-code-acp advertises loadSession"
    );
    assert!(
        snap.agent.describe_auth_methods().contains("claude-login"),
        "{:?}",
        snap.agent
    );
    let pid = snap.pid.expect("pid");
    let notice = h
        .until("auth failure", |e| {
            matches!(
                e,
                OperatorEvent::Notice {
                    level: NoticeLevel::Error,
                    ..
                }
            )
        })
        .await;
    let OperatorEvent::Notice { text, .. } = notice else {
        unreachable!()
    };
    assert!(
        text.contains("agent `claude` requires authentication"),
        "{text}"
    );
    assert!(
        text.contains("claude-login (Log in with Claude Code)"),
        "{text}"
    );
    // It ignores stdin EOF once a session exists: the stop must escalate.
    ractor::call!(actor, |reply| SessionMsg::Stop {
        cause: StopCause::Operator,
        caller: Caller::local(),
        reply: Some(reply)
    })
    .expect("stop")
    .expect("ok");
    h.until("ended", |e| matches!(e, OperatorEvent::SessionEnded { .. }))
        .await;
    until_group_gone(pid).await;
}

#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn gemini_cli_fails_session_new_with_a_named_auth_error() {
    let _serial = SERIAL.lock().await;
    let h = Harness::new(knobs()).await;
    isolate_home(&h);
    let p = profile("gemini", bin("gemini"), &["--acp"], &[]);
    let err = h
        .start_req(h.request(p, "hello"))
        .await
        .expect_err("no API key offline");
    let SupervisorError::StartFailed(StartError::AuthRequired {
        agent,
        methods,
        detail,
    }) = &err
    else {
        panic!("unexpected {err:?}");
    };
    assert_eq!(agent, "gemini");
    assert!(
        methods.contains("gemini-api-key") && methods.contains("oauth-personal"),
        "{methods}"
    );
    assert!(detail.contains("API key"), "{detail}");
    assert!(err.to_string().contains("Set `auth_method`"), "{err}");
    assert!(
        h.store.list_sessions(false).await.expect("list").is_empty(),
        "no session row left behind"
    );
    // The agent re-launches itself as a child: only a group kill reaches both.
    let deadline = tokio::time::Instant::now() + support::WAIT;
    loop {
        let left = processes_with(&["gemini", "--acp"]);
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gemini processes left: {left:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The interop install directory as it appears in agents' command lines.
fn install_dir() -> String {
    let dir = manifest_dir().join("../tests/interop");
    dir.canonicalize().unwrap_or(dir).display().to_string()
}

#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn copilot_cli_names_copilot_login_and_leaves_nothing_running() {
    let _serial = SERIAL.lock().await;
    let h = Harness::new(knobs()).await;
    isolate_home(&h);
    let p = profile("copilot", bin("copilot"), &["--acp"], &[]);
    let err = h
        .start_req(h.request(p, "hello"))
        .await
        .expect_err("no GitHub login offline");
    let SupervisorError::StartFailed(StartError::AuthRequired { agent, methods, .. }) = &err else {
        panic!("unexpected {err:?}");
    };
    assert_eq!(agent, "copilot");
    assert!(methods.contains("copilot-login"), "{methods}");
    assert!(err.to_string().contains("copilot-login"), "{err}");
    assert!(
        h.store.list_sessions(false).await.expect("list").is_empty(),
        "no session row left behind"
    );
    interop_support::until_no_process(&[&install_dir(), "copilot"], support::WAIT).await;
}

#[tokio::test]
#[ignore = "needs tests/interop/install.sh; run by tests/interop/run.sh"]
async fn cursor_agent_acp_without_cursor_agent_times_out_with_its_stderr() {
    let _serial = SERIAL.lock().await;
    let h = Harness::new(Knobs {
        limits: Limits {
            startup_timeout_secs: 4,
            shutdown_grace_secs: 1,
            ..Knobs::default().limits
        },
        ..Knobs::default()
    })
    .await;
    isolate_home(&h);
    let p = profile("cursor", bin("cursor-agent-acp"), &[], &[]);
    let err = h
        .start_req(h.request(p, "hello"))
        .await
        .expect_err("it never answers initialize without cursor-agent");
    let SupervisorError::StartFailed(StartError::Timeout { secs, stderr, .. }) = &err else {
        panic!("unexpected {err:?}");
    };
    assert_eq!(*secs, 4);
    assert!(
        stderr.contains("cursor-agent") && stderr.contains("ENOENT"),
        "the operator sees why: {stderr}"
    );
    assert!(!stderr.contains('\u{1b}'), "no terminal escapes: {stderr}");
    assert!(err.to_string().contains("stderr:"), "{err}");
    assert!(h.store.list_sessions(false).await.expect("list").is_empty());
    interop_support::until_no_process(&[&install_dir(), "cursor-agent-acp"], support::WAIT).await;
}

/// The package's directory: cargo's `CARGO_MANIFEST_DIR` when it runs this
/// test, else the one it was compiled in (a build cache shared between two
/// clones must not read the other clone's files).
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        Into::into,
    )
}
