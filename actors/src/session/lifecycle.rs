//! Clocks and endings: the periodic tick (idle timeout, stall detection,
//! prompt timeout, text flushing), the startup deadline, graceful stop with
//! escalation to SIGTERM and SIGKILL, and what happens when the agent exits.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{
    Caller, Phase, SessionError, SessionExit, SessionState, StartError, StopCause, TERM_TO_KILL,
};
use crate::child::SIGTERM;
use crate::model::{MessageKind, Protocol, Role, SessionStatus};
use crate::ports::{NoticeLevel, OperatorEvent};
use crate::supervisor::SupervisorMsg;

/// How much of the agent's stderr a startup timeout shows.
const STARTUP_STDERR_BYTES: usize = 1024;

/// How often streaming agent text is persisted mid-turn.
const TEXT_FLUSH: Duration = Duration::from_secs(1);

/// A stdout that closed without the process exiting is a broken pipe after this.
const CLOSED_STDOUT_GRACE: Duration = Duration::from_secs(2);

/// Who asks for a restart the server makes on its own (an agent that
/// ignored a cancel).
const SERVER_RESTART: &str = "system";

impl SessionState {
    pub(super) async fn on_tick(&mut self) {
        let now = Instant::now();
        // Streaming text is persisted at most once a second (and always
        // before a request or at turn end): the writer path stays free for
        // decisions when many agents stream at once.
        if self.text.dirty && now.duration_since(self.text.flushed_at) >= TEXT_FLUSH {
            self.flush_text(false).await;
        }
        if !self.unstored_text.is_empty() {
            self.retry_unstored_text().await;
        }
        if !self.unmarked.is_empty() {
            self.retry_delivery_marks().await;
        }
        if !self.dirty_tools.is_empty() || self.pending_plan.is_some() || self.usage_unsent {
            self.flush_coalesced().await;
        }
        if let Some(at) = self.stream_closed_at
            && !self.exited
            && now.duration_since(at) >= CLOSED_STDOUT_GRACE
        {
            tracing::warn!(session = %self.record.id, "agent closed stdout but kept running; killing it");
            self.stream_closed_at = None;
            self.kill_for("it closed its stdout but kept running".to_owned());
        }
        if self.phase != Phase::Ready {
            return;
        }
        let limits = &self.settings.limits;
        // Waiting for the operator is not idleness: a request left for the
        // night must still be there in the morning (a probe's session was
        // ended "completed" and its request cancelled). A decision starts
        // the clock again.
        if limits.idle_timeout_secs > 0
            && self.pending.is_empty()
            && now.duration_since(self.last_any) >= limits.idle_timeout()
        {
            tracing::info!(session = %self.record.id, "idle timeout");
            self.begin_stop(StopCause::IdleTimeout).await;
            return;
        }
        self.check_prompt_timeout(now).await;
        self.check_cancel_ignored(now).await;
        self.check_stall(now).await;
    }

    /// An agent that does not end its turn within the shutdown grace of
    /// being interrupted to steer (or paused, or nudged) is restarted: a probe's agent ignored
    /// `session/cancel` and kept chatting, so an interrupt did nothing, the
    /// steering it was for waited for ever, and the stall detector (which
    /// watches silence) never fired.
    async fn check_cancel_ignored(&mut self, now: Instant) {
        let grace = self.settings.limits.shutdown_grace();
        let ignored = self
            .turn
            .as_ref()
            .and_then(|t| t.cancelled_at)
            .is_some_and(|at| now.duration_since(at) >= grace);
        if !ignored || self.restart_by.is_some() {
            return;
        }
        let text = if self.paused {
            format!(
                "The agent did not end its turn within {} s of the pause (limits.shutdown_grace_secs); restarting it. The session stays paused.",
                grace.as_secs()
            )
        } else {
            format!(
                "The agent did not end its turn within {} s of being cancelled (limits.shutdown_grace_secs); restarting it, so that what waits for it goes out.",
                grace.as_secs()
            )
        };
        tracing::warn!(session = %self.record.id, "{text}");
        self.emit_notice(NoticeLevel::Warning, &text).await;
        self.audit(
            "system",
            "session.restart_requested",
            json!({"why": "cancel ignored"}),
        )
        .await;
        self.restart_by = Some(SERVER_RESTART.to_owned());
        self.kill_for("it ignored session/cancel".to_owned());
    }

    async fn check_prompt_timeout(&mut self, now: Instant) {
        let timeout = self.settings.limits.prompt_timeout();
        let Some(turn) = &mut self.turn else { return };
        if !self.pending.is_empty() {
            // Waiting for the operator is not the agent being slow.
            turn.agent_since = now;
            return;
        }
        if turn.timeout_noted || now.duration_since(turn.agent_since) < timeout {
            return;
        }
        turn.timeout_noted = true;
        let text = format!(
            "The agent has not answered the prompt within {} s of its own time (limits.prompt_timeout_secs; time waiting for the operator does not count); the session stays active.",
            timeout.as_secs()
        );
        tracing::warn!(session = %self.record.id, "{text}");
        self.emit_notice(NoticeLevel::Warning, &text).await;
    }

    async fn check_stall(&mut self, now: Instant) {
        let policy = self.settings.stall.clone();
        if policy.inactivity_secs == 0 {
            return;
        }
        // An ACP agent between turns is waiting for a human, not stalled.
        let watching = self.record.protocol == Protocol::Intercom || self.turn.is_some();
        if !watching || !self.pending.is_empty() || self.paused {
            return;
        }
        let quiet = now.duration_since(self.last_inbound);
        let escalation = Duration::from_secs(policy.escalation_secs);
        let Some(alerted) = self.stall.alerted_at else {
            if quiet >= Duration::from_secs(policy.inactivity_secs) {
                self.stall.alerted_at = Some(now);
                let text = format!("No activity from the agent for {} s.", quiet.as_secs());
                // Also in the log: an operator without Slack watching the
                // journal would otherwise see nothing of a stall.
                tracing::warn!(session = %self.record.id, "{text}");
                self.emit_notice(NoticeLevel::Warning, &text).await;
            }
            return;
        };
        let since = now.duration_since(self.stall.last_nudge.unwrap_or(alerted));
        if since < escalation {
            return;
        }
        // Counted since the last prompt, across the restarts the server
        // makes on its own (see `TurnBudget`).
        if self.budget.nudges() < policy.max_nudges {
            self.budget.count_nudge();
            self.stall.last_nudge = Some(now);
            self.nudge("system").await;
        } else if self.status != SessionStatus::Stalled {
            let reason = format!("no activity after {} nudges", policy.max_nudges);
            tracing::error!(session = %self.record.id, "the agent is stalled: {reason}; nudge, restart or stop it");
            self.set_status(SessionStatus::Stalled, "stalled", Some(&reason))
                .await;
            self.emit_notice(
                NoticeLevel::Error,
                &format!("The agent is stalled: {reason}. Nudge, restart or stop it."),
            )
            .await;
            self.audit(
                "system",
                "session.stalled",
                json!({"nudges": policy.max_nudges}),
            )
            .await;
        }
    }

    pub(super) async fn on_startup_deadline(&mut self) {
        if matches!(
            self.phase,
            Phase::Initializing | Phase::Authenticating | Phase::Opening
        ) {
            let step = match self.phase {
                Phase::Initializing => "`initialize`",
                Phase::Authenticating => "`authenticate`",
                _ => "`session/new` (or `session/load`)",
            };
            let err = StartError::Timeout {
                agent: self.profile.id.clone(),
                secs: self.settings.limits.startup_timeout_secs,
                step,
                stderr: self
                    .child
                    .as_ref()
                    .map(|c| c.stderr.text(STARTUP_STDERR_BYTES))
                    .unwrap_or_default(),
                stdout: super::errors::unreadable_stdout(&self.unreadable_lines),
            };
            self.fail_start(err).await;
        }
    }

    pub(super) async fn request_stop(
        &mut self,
        cause: StopCause,
        caller: &Caller,
    ) -> Result<(), SessionError> {
        self.authorize(caller, "stop").await?;
        self.audit(
            &caller.id,
            "session.stop_requested",
            json!({"cause": format!("{cause:?}")}),
        )
        .await;
        if matches!(self.phase, Phase::Stopping | Phase::Ended) {
            return Ok(()); // idempotent
        }
        self.begin_stop(cause).await;
        Ok(())
    }

    /// Graceful stop: cancel, answer pending, close stdin, then escalate.
    pub(super) async fn begin_stop(&mut self, cause: StopCause) {
        if matches!(self.phase, Phase::Stopping | Phase::Ended) {
            return;
        }
        let was_ready = self.phase == Phase::Ready;
        self.phase = Phase::Stopping;
        self.stopping = Some(cause);
        // What was approved is not carried out once the operator stopped
        // the session (writes are refused while stopping, covered or not).
        self.toolcalls.clear_grants();
        if was_ready && (self.turn.is_some() || !self.is_acp()) {
            self.cancel_turn("session stopping").await;
        }
        self.cancel_pending("session stopping").await;
        self.flush_text(true).await;
        if let Some(child) = &self.child {
            // An agent that exits on end of input re-parents its children:
            // note them now, to kill what is left once it exited.
            self.stop_snapshot = child.descendants().await;
            child.close_stdin();
        }
        if self.exited {
            self.finish_stopped().await;
            return;
        }
        let grace = self.settings.limits.shutdown_grace();
        self.myself
            .send_after(grace, || super::SessionMsg::KillDue(0));
    }

    pub(super) fn on_kill_due(&mut self, stage: u8) {
        if self.exited {
            return;
        }
        let Some(child) = &self.child else { return };
        if stage == 0 {
            tracing::info!(session = %self.record.id, "agent still running after the grace period; SIGTERM");
            child.signal_group(SIGTERM);
            self.myself
                .send_after(TERM_TO_KILL, || super::SessionMsg::KillDue(1));
        } else {
            tracing::warn!(session = %self.record.id, "agent ignored SIGTERM; SIGKILL");
            child.kill();
        }
    }

    /// An operator asked for a restart: kill the group; the exit that
    /// follows goes to the supervisor as [`SessionExit::RestartRequested`].
    pub(super) async fn restart_requested(&mut self, caller: &Caller) -> Result<(), SessionError> {
        self.authorize(caller, "restart").await?;
        if self.phase != Phase::Ready {
            return Err(SessionError::NotLive(self.ending_status()));
        }
        if self.restart_by.is_some() {
            return Ok(()); // already on its way
        }
        self.audit(&caller.id, "session.restart_requested", json!({}))
            .await;
        self.emit_notice(
            NoticeLevel::Warning,
            &format!("Restarting the agent (asked by {}).", caller.id),
        )
        .await;
        self.restart_by = Some(caller.id.clone());
        self.kill_for(format!("{} asked for a restart", caller.id));
        Ok(())
    }

    /// Kills the agent for a reason of ours; the crash report names it.
    pub(super) fn kill_for(&mut self, why: String) {
        if self.kill_reason.is_none() {
            self.kill_reason = Some(why);
        }
        self.kill_group_now();
    }

    pub(super) fn kill_group_now(&mut self) {
        if let Some(child) = &self.child {
            child.kill();
        }
    }

    fn exit_text(code: Option<i32>, signal: Option<i32>) -> String {
        match (code, signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("signal {s}"),
            _ => "unknown exit".to_owned(),
        }
    }

    pub(super) async fn on_exit(&mut self, code: Option<i32>, signal: Option<i32>) {
        self.exited = true;
        // Stragglers in the group (grandchildren) go with the leader, and
        // so do the descendants noted when a stop began, wherever they are.
        self.kill_group_now();
        crate::process_tree::kill_listed(&std::mem::take(&mut self.stop_snapshot));
        let mut exit = Self::exit_text(code, signal);
        if let (Some(why), Some(_)) = (&self.kill_reason, signal) {
            // Our kill, not an exit the agent chose before it landed.
            exit = format!("{exit}: agent-intercom killed it because {why}");
        }
        let stderr = self
            .child
            .as_ref()
            .map(|c| c.stderr.text(2048))
            .unwrap_or_default();
        match self.phase {
            Phase::Stopping => self.finish_stopped().await,
            Phase::Ended => {}
            Phase::Ready if code == Some(0) && self.finished_cleanly() => {
                self.finish_clean_exit().await
            }
            Phase::Ready => self.on_crash(exit, stderr).await,
            _ => {
                let err = StartError::Exited {
                    agent: self.profile.id.clone(),
                    exit,
                    stderr,
                };
                self.fail_start(err).await;
            }
        }
    }

    /// Exit 0 means "done" only when nothing is left half-way: no turn
    /// running, no request waiting for the operator, no steering queued or
    /// still being written, and we did not kill it ourselves.
    fn finished_cleanly(&self) -> bool {
        self.turn.is_none()
            && self.pending.is_empty()
            && self.queue.is_empty()
            && self.in_flight.is_empty()
            && self.reprompt_after_cancel.is_none()
            && self.kill_reason.is_none()
    }

    /// The agent finished its work and exited 0: the session is completed.
    async fn finish_clean_exit(&mut self) {
        tracing::info!(session = %self.record.id, "agent finished and exited 0");
        self.flush_text(true).await;
        self.emit_notice(
            NoticeLevel::Info,
            "The agent finished and exited (exit code 0); the session is completed.",
        )
        .await;
        self.audit(
            "system",
            "session.agent_exited",
            json!({"exit": "exit code 0"}),
        )
        .await;
        self.stopping = Some(StopCause::AgentFinished);
        self.finish_stopped().await;
    }

    /// The agent died mid-session (or was killed for an operator's
    /// restart): report it for a restart.
    async fn on_crash(&mut self, exit: String, stderr: String) {
        // The intercom dialect has no turns: its agent works until it is
        // stopped, so a crash cuts its work, and the fresh agent is given
        // its last prompt again.
        let dialect = self.record.protocol == crate::model::Protocol::Intercom;
        // A turn a pause cut is still owed: the restarted agent (a fresh
        // one most of all) is given it on resume. A probe paused, killed
        // the agent, resumed, and the fresh agent was given nothing.
        let owed = self
            .resume_turn
            .as_ref()
            .and_then(|c| c.owed().map(str::to_owned));
        let mid_turn =
            self.turn.is_some() || (dialect && self.dialect_prompt.is_some()) || owed.is_some();
        // What the dead agent left unfinished will not finish.
        self.cancel_turn_tools();
        let interrupted_prompt = match self.turn.take() {
            // Given up for the steering that interrupted it: not owed.
            Some(t) if t.superseded => None,
            Some(t) => Some(t.prompt),
            None if dialect => self.dialect_prompt.clone(),
            None => owed,
        };
        self.cancel_pending("agent exited").await;
        self.flush_text(true).await;
        if let Some(by) = self.restart_by.take() {
            self.phase = Phase::Ended;
            // The server's own restart (a cancel the agent ignored, after a
            // nudge say) is nobody acting: the budget goes on.
            let budget = (by == SERVER_RESTART).then_some(self.budget);
            self.report(SessionExit::RestartRequested {
                by,
                acp_session: self.acp_session.clone(),
                interrupted_prompt,
                mid_turn,
                budget,
            });
            self.myself.stop(Some("restart requested".into()));
            return;
        }
        let reason = if stderr.is_empty() {
            format!("agent exited unexpectedly ({exit})")
        } else {
            format!("agent exited unexpectedly ({exit}); stderr: {stderr}")
        };
        tracing::warn!(session = %self.record.id, "{}", crate::text::log_safe(&reason));
        self.note(Role::System, MessageKind::Error, &reason);
        self.audit("system", "session.agent_exited", json!({"exit": exit}))
            .await;
        self.phase = Phase::Ended;
        self.report(SessionExit::Crashed {
            reason,
            acp_session: self.acp_session.clone(),
            interrupted_prompt,
            mid_turn,
            budget: self.budget,
        });
        self.myself.stop(Some("agent exited".into()));
    }

    async fn finish_stopped(&mut self) {
        self.flush_text(true).await;
        let cause = self.stopping.clone().unwrap_or(StopCause::Operator);
        let (status, reason) = cause.final_status();
        self.tell_undelivered(crate::model::revivable_end(status, Some(reason)))
            .await;
        self.phase = Phase::Ended;
        self.set_status(status, status.as_str(), Some(reason)).await;
        self.audit(
            "system",
            "session.ended",
            json!({"status": status.as_str(), "reason": reason}),
        )
        .await;
        self.emit(OperatorEvent::SessionEnded {
            session_id: self.id().clone(),
            status,
            reason: Some(reason.to_owned()),
        });
        self.report(SessionExit::Finished(status));
        self.myself.stop(Some(reason.to_owned()));
    }

    /// The session never got going: tell the waiter and the supervisor, stop.
    pub(super) async fn fail_start(&mut self, err: StartError) {
        if self.phase == Phase::Ended {
            return;
        }
        tracing::error!(session = %self.record.id, "start failed: {}", crate::text::log_safe(&err.to_string()));
        self.phase = Phase::Ended;
        self.kill_group_now();
        let first_start = self.ready.is_some();
        if let Some(ready) = self.ready.take() {
            let _ = ready.send(Err(err.clone()));
        }
        if !first_start {
            // A restart that failed: the operator learns it in the thread.
            self.emit_notice(NoticeLevel::Error, &err.to_string()).await;
        }
        self.report(SessionExit::StartFailed(err));
        self.myself.stop(Some("start failed".into()));
    }

    fn report(&self, exit: SessionExit) {
        if let Some(sup) = &self.supervisor {
            let _ = sup.send_message(SupervisorMsg::SessionExited {
                id: self.record.id.clone(),
                exit,
            });
        }
    }
}
