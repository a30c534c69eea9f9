//! Operator actions the supervisor answers itself: steering and restarts.
//!
//! They go through the supervisor because it alone knows whether a session
//! has an actor right now. With one, the request is handed to the actor (its
//! answer goes straight back to the caller). Without one, the session is
//! between crash restarts: steering is stored for the restarted agent (the
//! new actor loads undelivered steering in `pre_start`, which runs inside
//! this actor's `restart`, so nothing stored here can miss it), and a
//! restart happens now instead of after the backoff.

use std::time::Duration;

use ractor::{ActorRef, MessagingErr, RactorErr, RpcReplyPort};
use serde_json::json;

use super::restarts::RestartPlan;
use super::{SupervisorMsg, SupervisorState};
use crate::model::{SessionId, SessionStatus};
use crate::ports::{NoticeLevel, OperatorEvent};
use crate::session::{Caller, SessionError, SessionMsg, SteerOutcome};

/// How long an operator's call through the supervisor may take.
pub const OPERATOR_CALL: Duration = Duration::from_secs(10);

/// Why an operator's call got no answer.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("the session supervisor did not answer: {0}")]
pub struct NoAnswer(pub String);

/// Steers a session through the supervisor. When the session's actor ended
/// after taking the message but before handling it (its mailbox is dropped),
/// the call is made once more: the supervisor then stores the instruction
/// for the restarted agent, so an instruction is never silently dropped.
pub async fn steer_session(
    sup: &ActorRef<SupervisorMsg>,
    id: &SessionId,
    text: &str,
    interrupt: bool,
    caller: &Caller,
) -> Result<Result<SteerOutcome, SessionError>, NoAnswer> {
    // Fast path: the running actor, found in the named registry, so a
    // steer never waits behind session starts in the supervisor's mailbox.
    // If it is gone (or going), the supervisor decides (stores it for the
    // restart, or says the session ended).
    if let Some(actor) = super::directory::find(sup, id) {
        let direct = ractor::call_t!(
            actor,
            |reply| SessionMsg::Steer {
                text: text.to_owned(),
                interrupt,
                caller: caller.clone(),
                reply,
            },
            OPERATOR_CALL.as_millis() as u64
        );
        match direct {
            Ok(r) => return Ok(r),
            Err(RactorErr::Messaging(_)) => {}
            Err(e) => return Err(NoAnswer(e.to_string())),
        }
    }
    let mut retried = false;
    loop {
        let outcome = ractor::call_t!(
            sup,
            |reply| SupervisorMsg::Steer {
                id: id.clone(),
                text: text.to_owned(),
                interrupt,
                caller: caller.clone(),
                reply,
            },
            OPERATOR_CALL.as_millis() as u64
        );
        match outcome {
            Ok(r) => return Ok(r),
            Err(RactorErr::Messaging(MessagingErr::ChannelClosed)) if !retried => retried = true,
            Err(e) => return Err(NoAnswer(e.to_string())),
        }
    }
}

impl SupervisorState {
    /// `SupervisorMsg::Steer`.
    pub(super) async fn steer(
        &mut self,
        id: SessionId,
        text: String,
        interrupt: bool,
        caller: Caller,
        reply: RpcReplyPort<Result<SteerOutcome, SessionError>>,
    ) {
        let Some(entry) = self.sessions.get(&id) else {
            let status = self.stored_status(&id).await;
            let _ = reply.send(Err(SessionError::NotLive(status)));
            return;
        };
        let (text, caller, reply) = match entry.actor.clone() {
            None => (text, caller, reply),
            Some(actor) => match actor.send_message(SessionMsg::Steer {
                text,
                interrupt,
                caller,
                reply,
            }) {
                Ok(()) => return,
                // The actor just ended; its exit report is on its way and
                // a restart follows (or the session ends, and says so).
                Err(MessagingErr::SendErr(SessionMsg::Steer {
                    text,
                    caller,
                    reply,
                    ..
                })) => (text, caller, reply),
                Err(_) => return,
            },
        };
        let r = self.queue_for_restart(&id, &text, &caller).await;
        let _ = reply.send(r);
    }

    /// Stores steering for the agent a restart will bring back.
    async fn queue_for_restart(
        &mut self,
        id: &SessionId,
        text: &str,
        caller: &Caller,
    ) -> Result<SteerOutcome, SessionError> {
        self.may_act(id, caller, "steer").await?;
        let store = self.args.store.clone();
        let steering = store.enqueue_steering(id, text, &caller.id).await?;
        self.audit(
            id,
            "session.steered",
            json!({"steering": steering.id, "by": caller.id, "while": "restarting"}),
        )
        .await;
        let steering_id = steering.id;
        self.args.sink.emit(OperatorEvent::SteeringQueued {
            session_id: id.clone(),
            steering,
        });
        // A pause outlives the restart: say so, as the session would.
        let paused = store.is_paused(id).await.unwrap_or(false);
        Ok(SteerOutcome {
            queued: true,
            paused,
            steering_id,
        })
    }

    /// `SupervisorMsg::Restart`.
    pub(super) async fn restart_now(
        &mut self,
        id: SessionId,
        caller: Caller,
        reply: RpcReplyPort<Result<(), SessionError>>,
    ) {
        let Some(entry) = self.sessions.get(&id) else {
            let status = self.stored_status(&id).await;
            let _ = reply.send(Err(SessionError::NotLive(status)));
            return;
        };
        if let Some(actor) = entry.actor.clone() {
            if let Err(MessagingErr::SendErr(SessionMsg::Restart { reply, .. })) =
                actor.send_message(SessionMsg::Restart { caller, reply })
            {
                // Ended between messages: its exit report decides what follows.
                let _ = reply.send(Err(SessionError::NotLive(SessionStatus::Starting)));
            }
            return;
        }
        if let Err(e) = self.may_act(&id, &caller, "restart").await {
            let _ = reply.send(Err(e));
            return;
        }
        self.audit(&id, "session.restart_requested", json!({"by": caller.id}))
            .await;
        self.notice(
            &id,
            NoticeLevel::Warning,
            format!(
                "Restarting the agent now (asked by {}) instead of after the backoff.",
                caller.id
            ),
        );
        let _ = reply.send(Ok(()));
        self.restart(id).await;
    }

    /// The agent was killed for an operator's restart: respawn it at once,
    /// resumed like after a crash; it does not spend the crash budget.
    pub(super) async fn restart_on_request(
        &mut self,
        id: SessionId,
        by: String,
        plan: RestartPlan,
    ) {
        if self.shutdown.is_some() {
            self.end_session(&id, SessionStatus::Cancelled, crate::model::SERVER_SHUTDOWN)
                .await;
            return;
        }
        let Some(entry) = self.sessions.get_mut(&id) else {
            return;
        };
        entry.plan = Some(plan);
        entry.total_restarts += 1;
        let total = entry.total_restarts;
        let why = format!("restarting at the request of {by}");
        self.mark_restarting(&id, total, "restarting", why).await;
        self.audit(
            &id,
            "session.restart_scheduled",
            json!({"by": by, "delay_secs": 0}),
        )
        .await;
        self.restart(id).await;
    }

    /// Owner or operator, like the session actor checks (audited otherwise).
    async fn may_act(
        &self,
        id: &SessionId,
        caller: &Caller,
        action: &str,
    ) -> Result<(), SessionError> {
        let owner = self
            .args
            .store
            .get_session(id)
            .await
            .ok()
            .flatten()
            .map(|r| r.owner)
            .unwrap_or_default();
        if caller.operator
            || caller.id == owner
            || self.args.settings.operators.contains(&caller.id)
        {
            return Ok(());
        }
        let entry = crate::model::AuditEntry {
            session_id: Some(id.clone()),
            actor: caller.id.clone(),
            action: "action.denied".into(),
            detail: json!({"action": action, "owner": owner}),
        };
        if let Err(e) = self.args.store.audit(&entry).await {
            tracing::error!(session = %id, "audit write failed: {e}");
        }
        Err(SessionError::Unauthorized {
            user: caller.id.clone(),
            session: id.clone(),
            owner,
        })
    }

    /// The stored status of a session without an entry (ended, or unknown).
    async fn stored_status(&self, id: &SessionId) -> SessionStatus {
        match self.args.store.get_session(id).await {
            Ok(Some(r)) => r.status,
            _ => SessionStatus::Error,
        }
    }
}
