//! What the whole-turn interop tests (Claude Code, Gemini CLI) do to a
//! running session: steer a second prompt, stop, wait for a file or the end
//! of a turn (waiting for an approval and deciding it are in `support`).

use std::path::Path;

use intercom_actors::model::SessionId;
use intercom_actors::session::{Caller, SessionMsg, StopCause};

use intercom_actors::settings::Limits;

use crate::support::{self, Harness, Knobs, until_group_gone};

/// The harness knobs for a whole turn of a real agent: its start (node,
/// a fresh HOME) may take long; a stop need not wait.
pub fn knobs() -> Knobs {
    Knobs {
        limits: Limits {
            startup_timeout_secs: 90,
            shutdown_grace_secs: 1,
            ..Knobs::default().limits
        },
        ..Knobs::default()
    }
}

/// The agent's process id (its process group leader).
pub async fn pid(h: &Harness, id: &SessionId) -> i32 {
    let actor = h.actor(id).await;
    let snap = ractor::call!(actor, SessionMsg::Snapshot).expect("snapshot");
    snap.pid.expect("agent pid")
}

/// Stops the session as the operator and waits for its process group to go.
pub async fn stop(h: &Harness, id: &SessionId) {
    stop_by(h, id, StopCause::Operator).await;
}

/// Stops the session for `cause` and waits for its process group to go.
pub async fn stop_by(h: &Harness, id: &SessionId, cause: StopCause) {
    let pid = pid(h, id).await;
    let actor = h.actor(id).await;
    ractor::call!(actor, |reply| SessionMsg::Stop {
        cause,
        caller: Caller::local(),
        reply: Some(reply)
    })
    .expect("stop")
    .expect("ok");
    until_group_gone(pid).await;
}

/// Sends operator text (a new prompt when no turn runs).
pub async fn steer(h: &Harness, id: &SessionId, text: &str) {
    let actor = h.actor(id).await;
    ractor::call!(actor, |reply| SessionMsg::Steer {
        text: text.into(),
        interrupt: false,
        caller: Caller::local(),
        reply
    })
    .expect("steer")
    .expect("steered");
}

/// Waits for a file to exist and returns its content.
pub async fn until_file(path: &Path) -> String {
    let deadline = tokio::time::Instant::now() + support::WAIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits until the session's turn is over.
pub async fn until_turn_ended(h: &Harness, id: &SessionId) {
    let actor = h.actor(id).await;
    let deadline = tokio::time::Instant::now() + support::WAIT;
    while ractor::call!(actor, SessionMsg::Snapshot)
        .expect("snapshot")
        .turn_running
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the turn never ended"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits until a file holds exactly `want` (it may exist with other content
/// before).
pub async fn until_content(path: &Path, want: &str) {
    let deadline = tokio::time::Instant::now() + support::WAIT;
    loop {
        let now = std::fs::read_to_string(path).ok();
        if now.as_deref() == Some(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} holds {now:?}, not {want:?}",
            path.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
