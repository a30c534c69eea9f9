//! Control of one session on the operator's behalf: steer, restart, cancel,
//! revive, pause, and switch its approval mode or the agent's own options.
//! Each call goes to the live session's actor (found in the named
//! registry) or, between crash restarts, to the supervisor.

use intercom_actors::session::SteerOutcome;
use intercom_actors::session::calls;

use super::*;

/// How long a revive waits for the ended session's actor to be gone (it
/// records the end before it stops).
const REVIVE_SETTLE: Duration = Duration::from_secs(5);

impl App {
    /// Sends steering to a session: delivered now when the agent is idle,
    /// queued behind the running turn otherwise (`interrupt` cancels it);
    /// between crash restarts it is stored for the restarted agent (queued).
    pub async fn steer(
        &self,
        id: &SessionId,
        text: &str,
        interrupt: bool,
        caller: Caller,
    ) -> Result<SteerOutcome, AppError> {
        if intercom_actors::model::is_blank_prompt(text) {
            return Err(AppError::BadRequest("the prompt text is empty".into()));
        }
        let record = self.session(id).await?;
        if !record.status.is_live() {
            return Err(AppError::ended(&record));
        }
        let outcome = steer_session(&self.inner.supervisor, id, text, interrupt, &caller).await;
        match outcome {
            Ok(result) => Ok(result?),
            Err(e) => Err(AppError::actor("supervisor", e)),
        }
    }

    /// Restarts a session's agent (kill its process group, respawn it in
    /// the same session, resumed like after a crash).
    pub async fn restart(&self, id: &SessionId, caller: Caller) -> Result<SessionRecord, AppError> {
        let record = self.session(id).await?;
        if !record.status.is_live() {
            return Err(AppError::ended(&record));
        }
        ractor::call_t!(
            self.inner.supervisor,
            |reply| SupervisorMsg::Restart {
                id: id.clone(),
                caller,
                reply
            },
            OPERATOR_CALL.as_millis() as u64
        )
        .map_err(|e| AppError::actor("supervisor", e))??;
        // The restart was taken: the agent is being killed and respawned,
        // and the stored record catches up when the new agent starts.
        let mut record = self.session(id).await?;
        if record.status.is_live() {
            record.status = intercom_actors::model::SessionStatus::Starting;
        }
        Ok(record)
    }

    /// Stops a session (idempotent). Waits briefly for it to end and returns
    /// the record as it then is.
    pub async fn cancel(&self, id: &SessionId, caller: Caller) -> Result<CancelOutcome, AppError> {
        let record = self.session(id).await?;
        if !record.status.is_live() {
            return Ok(CancelOutcome {
                record,
                stopping: false,
            });
        }
        let mut events = self.subscribe();
        let Some(actor) = self.actor(id).await? else {
            // Between crash restarts: the supervisor ends it.
            let id2 = id.clone();
            ractor::call_t!(
                self.inner.supervisor,
                |reply| SupervisorMsg::Stop {
                    id: id2,
                    caller,
                    reply
                },
                CALL_TIMEOUT_MS
            )
            .map_err(|e| AppError::actor("supervisor", e))??;
            return self.cancel_outcome(id).await;
        };
        let stop = calls::stop(&actor, caller, CALL_TIMEOUT_MS).await;
        match stop {
            Ok(result) => result?,
            // The actor ended between the lookup and the call: already stopping.
            Err(e) => tracing::debug!(session = %id, "stop raced the session's end: {e}"),
        }
        wait_for_end(&mut events, id, self.inner.cancel_wait).await;
        self.cancel_outcome(id).await
    }

    async fn cancel_outcome(&self, id: &SessionId) -> Result<CancelOutcome, AppError> {
        let record = self.session(id).await?;
        Ok(CancelOutcome {
            stopping: record.status.is_live(),
            record,
        })
    }

    /// Brings back a session that ended by idle timeout (respawn + resume).
    pub async fn revive(&self, id: &SessionId, caller: Caller) -> Result<SessionRecord, AppError> {
        let record = self.session(id).await?;
        if !record.status.is_live() {
            // Its actor writes the end first and stops after: give it the
            // moment (bounded) instead of answering "still live".
            let deadline = tokio::time::Instant::now() + REVIVE_SETTLE;
            while self.actor(id).await?.is_some() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // The current config decides: its workspace and agent profile as
        // configured now, not as when the session started.
        let map = self.workspace_map().await?;
        let profile = map.revivable(&record).map_err(|why| AppError::Conflict {
            message: format!("session {id} cannot come back: {why}"),
            status: Some(record.status),
        })?;
        let id2 = id.clone();
        let revived = ractor::call_t!(
            self.inner.supervisor,
            |reply| SupervisorMsg::Revive {
                id: id2,
                profile,
                caller,
                reply
            },
            self.inner.start_wait_ms
        )
        .map_err(|e| AppError::actor("supervisor", e))?
        .map_err(|e| match e {
            intercom_actors::supervisor::SupervisorError::NotRevivable(why) => {
                AppError::conflict_status(record.status, why)
            }
            other => other.into(),
        })?;
        Ok(revived)
    }

    /// The running actor of a session; `NotFound` for an unknown session,
    /// why it cannot act (its status) when no agent runs.
    async fn live_actor(&self, id: &SessionId) -> Result<ActorRef<SessionMsg>, AppError> {
        let record = self.session(id).await?;
        self.actor(id)
            .await?
            .ok_or_else(|| AppError::ended(&record))
    }

    /// Pauses (`true`) or resumes (`false`) a live session.
    pub async fn pause(&self, id: &SessionId, pause: bool, caller: Caller) -> Result<(), AppError> {
        let actor = self.live_actor(id).await?;
        calls::pause(&actor, pause, caller, CALL_TIMEOUT_MS)
            .await
            .map_err(|e| AppError::actor("session", e))??;
        Ok(())
    }

    /// Switches the agent's own mode, model or config option; answers once
    /// the agent accepted (or refused) it.
    pub async fn set_agent_option(
        &self,
        id: &SessionId,
        setting: intercom_actors::protocol::agent_options::AgentSetting,
        caller: Caller,
    ) -> Result<intercom_actors::protocol::agent_options::AgentOptions, AppError> {
        let actor = self.live_actor(id).await?;
        ractor::call_t!(
            actor,
            |reply| SessionMsg::SetAgentOption {
                setting,
                caller,
                reply
            },
            AGENT_OPTION_TIMEOUT_MS
        )
        .map_err(|e| AppError::actor("session", e))??;
        let snapshot = ractor::call_t!(actor, SessionMsg::Snapshot, SNAPSHOT_TIMEOUT_MS)
            .map_err(|e| AppError::actor("session", e))?;
        Ok(snapshot.agent_options)
    }

    /// Sets a live session's approval mode (persisted).
    pub async fn set_mode(
        &self,
        id: &SessionId,
        mode: ApprovalMode,
        caller: Caller,
    ) -> Result<(), AppError> {
        let actor = self.live_actor(id).await?;
        calls::set_mode(&actor, mode, caller, CALL_TIMEOUT_MS)
            .await
            .map_err(|e| AppError::actor("session", e))??;
        Ok(())
    }
}

async fn wait_for_end(
    events: &mut broadcast::Receiver<OperatorEvent>,
    id: &SessionId,
    limit: Duration,
) {
    let ended = async {
        loop {
            match events.recv().await {
                Ok(OperatorEvent::SessionEnded { session_id, .. }) if &session_id == id => return,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    };
    let _ = tokio::time::timeout(limit, ended).await;
}
