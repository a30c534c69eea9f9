//! Waiting for the operator without leaking requests: a blocking tool's
//! wait ends with the answer, its timeout or the client's cancellation, and
//! the guards close what a dropped call leaves open (a pending request as
//! `cancelled`, a `standby` as abandoned).

use std::time::Duration;

use intercom_actors::model::RequestStatus;
use intercom_actors::session::{McpCall, SessionMsg};
use ractor::ActorRef;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::super::ACTOR_TIMEOUT;
use super::Fail;

/// How a blocking wait ended.
pub(super) enum Waited<T> {
    /// The answer.
    Answer(T),
    /// The sender was dropped without an answer.
    Closed,
    /// The timeout passed first.
    TimedOut,
    /// The client cancelled the call.
    Cancelled,
}

pub(super) async fn wait_for<T>(
    rx: &mut oneshot::Receiver<T>,
    timeout: Duration,
    ct: &CancellationToken,
) -> Waited<T> {
    tokio::select! {
        biased;
        r = &mut *rx => match r {
            Ok(v) => Waited::Answer(v),
            Err(_) => Waited::Closed,
        },
        _ = ct.cancelled() => Waited::Cancelled,
        _ = tokio::time::sleep(timeout) => Waited::TimedOut,
    }
}

/// Closes an MCP request as cancelled when the call is dropped before it
/// finished (client cancellation, disconnect); disarmed on a normal end.
pub(super) struct RequestGuard {
    actor: ActorRef<SessionMsg>,
    /// Still waiting for the request to be stored.
    opened: Option<oneshot::Receiver<Result<String, String>>>,
    request_id: Option<String>,
}

impl RequestGuard {
    pub(super) fn new(
        actor: ActorRef<SessionMsg>,
        opened: oneshot::Receiver<Result<String, String>>,
    ) -> Self {
        RequestGuard {
            actor,
            opened: Some(opened),
            request_id: None,
        }
    }

    /// Waits for the stored request's global id.
    pub(super) async fn opened(&mut self) -> Result<String, Fail> {
        let Some(rx) = self.opened.as_mut() else {
            return Err(Fail::refused("internal", "request already opened"));
        };
        let r = tokio::time::timeout(ACTOR_TIMEOUT, rx).await;
        self.opened = None;
        match r {
            Ok(Ok(Ok(id))) => {
                self.request_id = Some(id.clone());
                Ok(id)
            }
            Ok(Ok(Err(why))) => Err(Fail::refused(
                "not_opened",
                format!("the operator was not asked: {why}"),
            )),
            Ok(Err(_)) => Err(Fail::ended()),
            Err(_) => Err(Fail::refused(
                "internal",
                "the session did not open the request in time",
            )),
        }
    }

    pub(super) fn disarm(&mut self) {
        self.request_id = None;
    }

    /// Closes the request now with `status`.
    pub(super) fn close(&mut self, status: RequestStatus) {
        if let Some(request_id) = self.request_id.take() {
            let _ = self
                .actor
                .send_message(SessionMsg::Mcp(McpCall::Abandon { request_id, status }));
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if let Some(rx) = self.opened.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            // Dropped before the id arrived: close it once it does.
            let actor = self.actor.clone();
            rt.spawn(async move {
                if let Ok(Ok(request_id)) = rx.await {
                    let _ = actor.send_message(SessionMsg::Mcp(McpCall::Abandon {
                        request_id,
                        status: RequestStatus::Cancelled,
                    }));
                }
            });
        }
        self.close(RequestStatus::Cancelled);
    }
}

/// Tells the session the client stopped waiting in `standby`, unless disarmed.
pub(super) struct StandbyGuard {
    pub(super) actor: ActorRef<SessionMsg>,
    pub(super) armed: bool,
}

impl StandbyGuard {
    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }

    pub(super) fn abandon(&mut self) {
        if std::mem::take(&mut self.armed) {
            let _ = self
                .actor
                .send_message(SessionMsg::Mcp(McpCall::StandbyAbandoned));
        }
    }
}

impl Drop for StandbyGuard {
    fn drop(&mut self) {
        self.abandon();
    }
}

pub(super) fn send(actor: &ActorRef<SessionMsg>, call: McpCall) -> Result<(), Fail> {
    actor
        .send_message(SessionMsg::Mcp(call))
        .map_err(|_| Fail::ended())
}
