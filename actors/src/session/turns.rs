//! Prompt turns and steering.
//!
//! One turn runs at a time. Steering that arrives during a turn is stored
//! first and queued, then delivered in order as the next prompts once the
//! running turn ends; "interrupt and steer" cancels the turn first. A nudge
//! prompts an idle agent, or cancels a hung turn and re-prompts after it.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use super::{Caller, Outgoing, Phase, SessionError, SessionState, SteerOutcome, Turn};
use crate::model::{MessageKind, Protocol, Role, SessionStatus, Steering};
use crate::ports::{NoticeLevel, OperatorEvent};
use crate::protocol::acp::{self, methods};
use crate::protocol::jsonrpc::{RpcError, codes};

impl SessionState {
    /// Restores undelivered steering from storage (restart recovery).
    pub(super) async fn load_queued_steering(&mut self) {
        match self.store.undelivered_steering(self.id()).await {
            Ok(rows) => self.queue.extend(rows),
            Err(e) => tracing::error!(session = %self.record.id, "loading queued steering: {e}"),
        }
        // Request ids stay unique across restarts of the session.
        match self.store.request_ids(self.id()).await {
            Ok(ids) => {
                let highest = ids
                    .iter()
                    .filter_map(|id| id.strip_prefix("req-")?.parse::<u64>().ok())
                    .max()
                    .unwrap_or(0);
                self.next_request = highest.saturating_add(1);
            }
            Err(e) => tracing::error!(session = %self.record.id, "loading request ids: {e}"),
        }
    }

    /// Starts a turn with `text` (ACP) or sends it (dialect). False when
    /// the agent's stdin is already gone (nothing was sent or recorded).
    pub(super) async fn send_prompt(&mut self, text: String, role: Role) -> bool {
        self.prompt_agent(text, role, None).await
    }

    /// [`Self::send_prompt`], with the write confirmed under `token`.
    async fn prompt_agent(&mut self, text: String, role: Role, token: Option<u64>) -> bool {
        // From here on, what the agent streams is this turn's.
        self.replay_tail_until = None;
        let sent = match self.record.protocol {
            Protocol::Acp => {
                let Some(sid) = self.acp_session.clone() else {
                    tracing::error!(session = %self.record.id, "prompt before the agent session exists");
                    return false;
                };
                let params = acp::prompt_params(&sid, &text);
                match self.request_tracked(methods::SESSION_PROMPT, params, Outgoing::Prompt, token)
                {
                    Some(rpc_id) => {
                        // A new turn gets a fresh text allowance.
                        self.text.turn_bytes = 0;
                        self.text.tool_bytes = 0;
                        self.text.truncated = false;
                        self.turn = Some(Turn {
                            rpc_id,
                            prompt: text.clone(),
                            agent_since: Instant::now(),
                            timeout_noted: false,
                            cancelled_at: None,
                            superseded: false,
                            tools: Vec::new(),
                        });
                        self.record_turn(true);
                        true
                    }
                    None => false,
                }
            }
            _ => {
                let bytes = self.dialect.prompt_send(&text);
                self.dialect_prompt = Some(text.clone());
                self.write_to_agent(bytes, token)
            }
        };
        if !sent {
            return false;
        }
        // An operator's prompt renews the budget; the server's own (a
        // nudge, a re-prompt after a cancel) does not: an agent that went
        // quiet after each flood got a new budget from every nudge.
        if role == Role::User {
            self.budget.renew();
        }
        // Steering is written to the transcript once its write is confirmed
        // ([`Self::on_written`]): a write that fails is given again to the
        // restarted agent, and was shown twice.
        if token.is_none() {
            self.note(role, MessageKind::Text, &text);
        }
        // Tool call ids are per turn: a new turn's `t1` is a new entry.
        self.tools.clear();
        self.last_any = Instant::now();
        self.show_activity("working", None);
        true
    }

    pub(super) async fn on_prompt_response(
        &mut self,
        rpc_id: i64,
        outcome: Result<Value, RpcError>,
    ) {
        if self.turn.as_ref().is_none_or(|t| t.rpc_id != rpc_id) {
            tracing::warn!(session = %self.record.id, rpc_id, "prompt response for a turn that is not running");
        }
        self.close_turn(&outcome).await;
        self.tell_turn_outcome(outcome).await;
        // Whatever the agent did not answer before its turn ended is moot.
        if !self.pending.is_empty() {
            self.cancel_pending("turn ended").await;
        }
        if self.phase == Phase::Ready {
            self.after_turn().await;
        }
    }

    /// The turn's bookkeeping once it ended: its unfinished tool calls (if
    /// it was cancelled), its record, its grants, its buffered text.
    async fn close_turn(&mut self, outcome: &Result<Value, RpcError>) {
        // A cancelled turn's calls the agent left unfinished, announced
        // after the cancel too, are cancelled with it (a probe's call
        // started after the cancel stayed `in_progress` for good).
        let cancelled = self.turn.as_ref().is_some_and(|t| t.cancelled_at.is_some())
            || matches!(outcome, Ok(r) if acp::stop_reason(r) == "cancelled");
        if cancelled {
            self.cancel_turn_tools();
        }
        self.turn = None;
        // A turn cut by the session's stop (a server shutdown, say) stays
        // stored as running: a revive continues it (the operator's prompt,
        // sent just before a SIGTERM, was never finished).
        if !(cancelled && self.stopping.is_some()) {
            self.record_turn(false);
        }
        // An approval covers writes of its own turn only.
        self.toolcalls.clear_grants();
        self.flush_text(true).await;
        self.flush_coalesced().await;
    }

    /// Logs how the turn ended, and tells the operator when it was not
    /// the agent's normal end (a stop reason, a failed prompt, a login the
    /// agent needs).
    async fn tell_turn_outcome(&mut self, outcome: Result<Value, RpcError>) {
        match outcome {
            Ok(result) => {
                // The agent's words, in a log line and a system notice: on
                // one line, escaped and bounded (a probe's `stopReason`
                // carried whole forged log lines).
                let reason = crate::text::one_line(&acp::stop_reason(&result), 200);
                tracing::info!(session = %self.record.id, stop_reason = %reason, "turn ended");
                if reason != "end_turn" && reason != "cancelled" {
                    self.emit_notice(
                        NoticeLevel::Warning,
                        &format!("The agent stopped its turn: {reason}."),
                    )
                    .await;
                }
            }
            Err(e) => {
                let text = self.prompt_failure(&e);
                tracing::warn!(session = %self.record.id, "{text}");
                self.emit_notice(NoticeLevel::Error, &text).await;
            }
        }
    }

    /// What to tell of a prompt the agent answered with an error: how to
    /// give it the login it asks for, or its error, on one bounded line.
    fn prompt_failure(&self, e: &RpcError) -> String {
        let message = crate::text::one_line(&e.message, 1000);
        if e.code == codes::AUTH_REQUIRED
            || message
                .to_ascii_lowercase()
                .contains("authentication required")
        {
            format!(
                "agent `{}` requires authentication: {message}. It offers: {}. Set `auth_method` in its [[agent]] profile and pass the credentials through `env`.",
                self.profile.id,
                self.agent.describe_auth_methods()
            )
        } else {
            format!(
                "agent `{}` failed the prompt: {}",
                self.profile.id,
                crate::text::one_line(&e.to_string(), 1000)
            )
        }
    }

    /// A ready session's next step after a turn: stay paused, continue a
    /// cut turn, deliver queued steering, or go idle.
    async fn after_turn(&mut self) {
        if self.paused {
            self.show_activity("paused", None);
        } else if let Some(text) = self.reprompt_after_cancel.take() {
            self.send_prompt(text, Role::System).await;
        } else if !self.queue.is_empty() {
            self.deliver_queued().await;
        } else {
            self.show_activity("idle", None);
        }
    }

    /// Tells the operator which queued steering never reached the agent
    /// because the session ended: stored, it would look the same as
    /// steering still waiting. A `revivable` session gets it on its revive.
    pub(super) async fn tell_undelivered(&self, revivable: bool) {
        let texts: Vec<&str> = self.queue.iter().map(|s| s.text.as_str()).collect();
        if let Some(text) = undelivered_notice(&texts, revivable) {
            self.emit_notice(NoticeLevel::Warning, &text).await;
        }
    }

    /// Stores whether a turn runs (in the next commit, not awaited): after
    /// a server crash, recovery asks a cut turn to continue.
    fn record_turn(&self, running: bool) {
        let (store, id) = (Arc::clone(&self.store), self.id().clone());
        self.ledger.queue(async move {
            if let Err(e) = store.set_turn_running(&id, running).await {
                tracing::warn!(session = %id, "cannot record whether a turn runs: {e}");
            }
        });
    }

    /// Delivers what waits in the queue as far as the agent can take it: ACP
    /// the next prompt (the rest follow turn by turn), the dialect (which has
    /// no turns) everything, in order. MCP clients collect it themselves.
    pub(super) async fn deliver_queued(&mut self) {
        match self.record.protocol {
            Protocol::Acp => {
                if let Some(steering) = self.queue.pop_front() {
                    self.deliver(steering).await;
                }
            }
            Protocol::Intercom => {
                while let Some(steering) = self.queue.pop_front() {
                    if !self.deliver(steering).await {
                        break;
                    }
                }
            }
            Protocol::Mcp => {}
        }
    }

    /// Writes one steering message to the agent. It is marked delivered
    /// only once the write is confirmed ([`Self::on_written`]); when it
    /// cannot be sent it goes back to the head of the queue (and stays
    /// undelivered in storage, for the restarted agent) and this is false.
    async fn deliver(&mut self, steering: Steering) -> bool {
        let token = self.next_write_token;
        self.next_write_token += 1;
        if self
            .prompt_agent(steering.text.clone(), Role::User, Some(token))
            .await
        {
            self.in_flight.insert(token, steering);
            true
        } else {
            tracing::warn!(session = %self.record.id, steering = steering.id, "steering not delivered: the agent's stdin is gone; kept for the restarted agent");
            self.queue.push_front(steering);
            false
        }
    }

    /// Marks steering delivered; a mark the store refuses (a full disk) is
    /// kept and retried every tick ([`Self::retry_delivery_marks`]).
    pub(super) async fn mark_delivered(&mut self, steering_id: i64) {
        if let Err(e) = self.store.mark_steering_delivered(steering_id).await {
            tracing::warn!(session = %self.record.id, "marking steering delivered: {e}; kept for a retry");
            self.unmarked.push(steering_id);
        }
    }

    /// The agent's stdin took a steering message: now it is delivered.
    pub(super) async fn on_written(&mut self, token: u64) {
        let Some(steering) = self.in_flight.remove(&token) else {
            return;
        };
        self.note(Role::User, MessageKind::Text, &steering.text);
        self.mark_delivered(steering.id).await;
        self.emit(OperatorEvent::SteeringDelivered {
            session_id: self.id().clone(),
            steering_id: steering.id,
        });
    }

    fn can_take_prompt_now(&self) -> bool {
        !self.paused
            && self.phase == Phase::Ready
            && self.turn.is_none()
            && self.queue.is_empty()
            && self.reprompt_after_cancel.is_none()
    }

    pub(super) async fn steer(
        &mut self,
        text: String,
        interrupt: bool,
        caller: &Caller,
    ) -> Result<SteerOutcome, SessionError> {
        self.authorize(caller, "steer").await?;
        self.check_live()?;
        let steering = self
            .store
            .enqueue_steering(self.id(), &text, &caller.id)
            .await?;
        self.audit(
            &caller.id,
            "session.steered",
            json!({"steering": steering.id, "interrupt": interrupt}),
        )
        .await;
        self.last_any = Instant::now();
        let steering_id = steering.id;
        let outcome = |queued, paused| SteerOutcome {
            queued,
            paused,
            steering_id,
        };
        if self.record.protocol == Protocol::Mcp || self.standby.is_some() {
            if self.steer_mcp(steering.clone()).await {
                return Ok(outcome(false, false));
            }
            if self.record.protocol == Protocol::Mcp {
                self.queue_steering(steering);
                return Ok(outcome(true, false));
            }
        }
        if self.can_take_prompt_now() {
            // Not sent (stdin gone): it waits at the head of the queue.
            let sent = self.deliver(steering.clone()).await;
            if !sent {
                self.announce_queued(steering);
            }
            return Ok(outcome(!sent, false));
        }
        self.queue_steering(steering);
        if interrupt && self.turn.is_some() {
            // Steering waits for this turn to end: an agent that ignores
            // the cancel is restarted.
            self.cancel_turn_watched("interrupted to steer").await;
            if let Some(turn) = &mut self.turn {
                turn.superseded = true;
            }
        }
        Ok(outcome(true, self.paused))
    }

    /// Refuses work for a session that is stopping or has ended, with the
    /// status it ends (or ended) in.
    fn check_live(&self) -> Result<(), SessionError> {
        if matches!(self.phase, Phase::Stopping | Phase::Ended) || !self.status.is_live() {
            return Err(SessionError::NotLive(self.ending_status()));
        }
        Ok(())
    }

    /// The status a session that is stopping ends in; else its status now.
    pub(super) fn ending_status(&self) -> SessionStatus {
        self.stopping
            .as_ref()
            .map(|c| c.final_status().0)
            .unwrap_or(self.status)
    }

    /// Puts steering at the end of the queue and tells the operator.
    fn queue_steering(&mut self, steering: Steering) {
        self.queue.push_back(steering.clone());
        self.announce_queued(steering);
    }

    /// Tells the operator that `steering` waits in the queue.
    fn announce_queued(&self, steering: Steering) {
        self.emit(OperatorEvent::SteeringQueued {
            session_id: self.id().clone(),
            steering,
        });
    }

    /// [`Self::cancel_turn`], watched: an agent that has not ended the turn
    /// within the shutdown grace is restarted
    /// ([`Self::check_cancel_ignored`]). An interrupt, a nudge and a pause
    /// cancel this way; a stop has a grace of its own.
    async fn cancel_turn_watched(&mut self, why: &str) {
        self.cancel_turn(why).await;
        if let Some(turn) = &mut self.turn {
            turn.cancelled_at.get_or_insert_with(Instant::now);
        }
    }

    /// Cancels the running turn (ACP `session/cancel`), answering every
    /// pending request as cancelled.
    pub(super) async fn cancel_turn(&mut self, why: &str) {
        if self.is_acp() {
            if let Some(sid) = self.acp_session.clone()
                && self.turn.is_some()
            {
                self.notify(methods::SESSION_CANCEL, acp::cancel_params(&sid));
                self.cancel_turn_tools();
            }
        } else {
            let bytes = self.dialect.interrupt(why);
            self.send_bytes(bytes);
        }
        self.cancel_pending(why).await;
    }

    /// An operator's nudge: refused while paused (a nudge is a prompt, and
    /// a paused session sends the agent nothing until resumed).
    pub(super) async fn operator_nudge(&mut self, caller: &Caller) -> Result<(), SessionError> {
        self.authorize(caller, "nudge").await?;
        if self.paused {
            return Err(SessionError::Paused("nudge it"));
        }
        self.nudge(&caller.id).await;
        Ok(())
    }

    /// Nudges a stalled agent, in the name of `by` (`system` for the
    /// stall detector).
    pub(super) async fn nudge(&mut self, by: &str) {
        let text = self.settings.stall.nudge_text.clone();
        self.audit(
            by,
            "session.nudged",
            json!({"nudges": self.budget.nudges()}),
        )
        .await;
        let cuts_turn = self.record.protocol == Protocol::Acp && self.turn.is_some();
        // Say that a nudge during a turn cancels it: a quiet but working
        // turn is cut, and the transcript should tell why it ended.
        let notice = if cuts_turn {
            "Nudging the agent: its running turn is cancelled and it is prompted again."
        } else {
            "Nudging the agent."
        };
        tracing::warn!(session = %self.record.id, by = %crate::text::log_safe(by), "{notice}");
        self.emit_notice(NoticeLevel::Warning, notice).await;
        match self.record.protocol {
            Protocol::Acp if cuts_turn => {
                // A hung turn: cancel it and prompt again once it ends.
                self.reprompt_after_cancel = Some(text);
                // A probe's hung agent ignored the cancel, and was nudged
                // (and told "prompted again") with nothing changing.
                self.cancel_turn_watched("nudge").await;
            }
            Protocol::Acp => {
                if self.phase == Phase::Ready {
                    self.send_prompt(text, Role::System).await;
                }
            }
            _ => {
                let bytes = self.dialect.nudge(&text);
                self.send_bytes(bytes);
            }
        }
    }
}

impl SessionState {
    /// Pauses: the running turn is cancelled (pending requests answered
    /// cancelled), steering is held and stall detection rests until resumed.
    pub(super) async fn pause(&mut self, caller: &Caller) -> Result<(), SessionError> {
        self.authorize(caller, "pause").await?;
        // Also while its agent starts: the first prompt (or what a restart
        // would continue) then waits for the resume. An operator holding a
        // misbehaving agent must not have to wait until it is back.
        if matches!(self.phase, Phase::Stopping | Phase::Ended) {
            return Err(SessionError::NotLive(self.status));
        }
        if self.paused {
            return Ok(());
        }
        self.store_pause(true).await?;
        // What the agent said before the pause stays above its note.
        self.flush_text(true).await;
        let waiting = self.waiting_titles();
        self.paused = true;
        self.resume_turn = self
            .turn
            .as_ref()
            .map(|t| CutTurn::Continue(Some(t.prompt.clone())));
        // What was approved in the cut turn is not carried out while
        // paused: a write it covered is asked for again (and refused
        // while paused).
        self.toolcalls.clear_grants();
        if self.turn.is_some() {
            // An agent that keeps working anyway is restarted.
            self.cancel_turn_watched("paused by operator").await;
        }
        self.audit(&caller.id, "session.paused", json!({})).await;
        self.emit_notice(NoticeLevel::Info, &format!("Paused by {}.", caller.id))
            .await;
        if !waiting.is_empty() {
            // Said: a card that vanished on Pause read as decided.
            let text = format!(
                "The pause cancelled what was waiting for a decision: {}. The agent can ask again once the session is resumed.",
                waiting.join(", ")
            );
            self.emit_notice(NoticeLevel::Info, &text).await;
        }
        self.show_activity("paused", None);
        Ok(())
    }

    /// The requests waiting for a decision, as `req-1 (title)`, at most
    /// ten of them.
    fn waiting_titles(&self) -> Vec<String> {
        let mut titles: Vec<String> = self
            .pending
            .values()
            .take(10)
            .map(|p| super::requests::request_label(&p.record))
            .collect();
        if self.pending.len() > 10 {
            titles.push(format!("and {} more", self.pending.len() - 10));
        }
        titles
    }

    /// Stores whether the session is paused, so that a restart keeps it;
    /// nothing changes when it cannot be stored.
    async fn store_pause(&mut self, paused: bool) -> Result<(), SessionError> {
        let (store, id) = (Arc::clone(&self.store), self.id().clone());
        self.ledger
            .wait(async move { store.set_paused(&id, paused).await })
            .await
            .map_err(SessionError::from)
    }

    /// Resumes: held steering is delivered in order; otherwise a turn cut by
    /// the pause is continued with the nudge text.
    pub(super) async fn resume(&mut self, caller: &Caller) -> Result<(), SessionError> {
        self.authorize(caller, "resume").await?;
        if !self.paused {
            return Ok(());
        }
        self.store_pause(false).await?;
        self.paused = false;
        self.stall = Default::default();
        self.last_inbound = Instant::now();
        self.audit(&caller.id, "session.resumed", json!({})).await;
        self.emit_notice(NoticeLevel::Info, &format!("Resumed by {}.", caller.id))
            .await;
        if self.phase != Phase::Ready {
            // Still starting: the end of the handshake delivers what waits.
            return Ok(());
        }
        let cut = self.resume_turn.take();
        if self.turn.is_some() {
            // The cancelled turn has not ended yet; its end delivers what waits.
            match cut {
                Some(CutTurn::Redo(prompt)) => self.reprompt_after_cancel = Some(prompt),
                Some(CutTurn::Continue(_)) if self.queue.is_empty() => {
                    self.reprompt_after_cancel = Some(self.settings.stall.nudge_text.clone());
                }
                _ => {}
            }
            return Ok(());
        }
        if cut.is_none() && self.queue.is_empty() {
            self.show_activity("idle", None);
        } else {
            self.go_on(cut).await;
        }
        Ok(())
    }

    /// Goes on after a restart, or a resume, with what waits: a turn the
    /// agent lost (a fresh session after a crash) is given again first and
    /// the queued steering follows it, as the next prompts; otherwise queued
    /// steering goes first, and without any a cut turn is continued. A probe
    /// queued steering during a crash restart: the fresh agent was given
    /// only that, never the task it had lost.
    pub(super) async fn go_on(&mut self, cut: Option<CutTurn>) {
        match cut {
            // The dialect has no turns: its last prompt may be steering
            // still queued (written when its pipe broke). What waits goes
            // first there, as before.
            Some(CutTurn::Redo(_)) if !self.is_acp() && !self.queue.is_empty() => {
                self.deliver_queued().await;
            }
            Some(CutTurn::Redo(prompt)) => {
                if !self.queue.is_empty() {
                    let n = self.queue.len();
                    let text = format!(
                        "The agent lost the cut turn: its prompt is given again first; {n} queued instruction(s) follow it."
                    );
                    self.emit_notice(NoticeLevel::Info, &text).await;
                }
                self.send_prompt(prompt, Role::System).await;
            }
            _ if !self.queue.is_empty() => self.deliver_queued().await,
            Some(CutTurn::Continue(_)) => {
                let text = self.settings.stall.nudge_text.clone();
                self.send_prompt(text, Role::System).await;
            }
            None => {}
        }
    }
}

/// What becomes of a turn a crash or a pause cut short.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CutTurn {
    /// The agent kept its context (a pause, a resumed session): it is
    /// told to continue, after any queued steering. The cut turn's prompt,
    /// when known, is kept for an agent that crashes before the resume and
    /// comes back fresh ([`CutTurn::owed`]).
    Continue(Option<String>),
    /// The agent lost it (a fresh session after a crash): this prompt, the
    /// cut turn's, is given again before any queued steering.
    Redo(String),
}

impl CutTurn {
    /// The cut turn's prompt, still owed to the agent.
    pub(super) fn owed(&self) -> Option<&str> {
        match self {
            CutTurn::Continue(prompt) => prompt.as_deref(),
            CutTurn::Redo(prompt) => Some(prompt),
        }
    }
}

/// The notice for steering a session ended before delivering (at most five
/// quoted, each cut to 80 characters), or `None` when there is none. A
/// `revivable` session delivers it when it is revived.
pub(crate) fn undelivered_notice(texts: &[&str], revivable: bool) -> Option<String> {
    if texts.is_empty() {
        return None;
    }
    let quoted: Vec<String> = texts
        .iter()
        .take(5)
        .map(|t| {
            let cut: String = t.chars().take(80).collect();
            let more = if t.chars().count() > 80 { "…" } else { "" };
            format!("«{cut}{more}»")
        })
        .collect();
    let rest = match texts.len().saturating_sub(5) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let then = if revivable {
        "revive the session to have them delivered (POST /api/sessions/{id}/revive, `ctl revive`, or a reply in its Slack thread), or start a new session to give them again"
    } else {
        "start a new session to give them again"
    };
    Some(format!(
        "Not delivered: the session ended before the agent got {} queued instruction(s): {}{rest}. They stay stored (GET /api/sessions/{{id}}/steering); {then}.",
        texts.len(),
        quoted.join(", ")
    ))
}
