//! Getting a session going: `initialize`, `authenticate` when needed,
//! `session/new` or `session/load`/`session/resume`, then the first prompt.
//!
//! The handshake is a small state machine driven by responses arriving as
//! messages, so the actor stays responsive (a stop during startup works) and
//! the startup deadline is just another message.

use std::sync::Arc;

use serde_json::{Value, json};

use super::turns::CutTurn;
use super::{Outgoing, Phase, SessionState, StartError, StartMode};
use crate::model::{Role, SessionStatus};
use crate::ports::{NoticeLevel, OperatorEvent};
use crate::protocol::acp::{self, AgentInfo, methods};
use crate::protocol::jsonrpc::{RpcError, RpcId, RpcMessage, codes};

impl SessionState {
    /// Sends one of our requests and remembers what it was for.
    pub(super) fn request(&mut self, method: &str, params: Value, purpose: Outgoing) -> i64 {
        let id = self.next_rpc_id;
        self.request_tracked(method, params, purpose, None);
        id
    }

    /// Sends one of our requests; with a token its write is confirmed by
    /// [`crate::child::ChildEvent::Written`]. `None` when it could not be sent.
    pub(super) fn request_tracked(
        &mut self,
        method: &str,
        params: Value,
        purpose: Outgoing,
        token: Option<u64>,
    ) -> Option<i64> {
        let id = self.next_rpc_id;
        self.next_rpc_id += 1;
        let msg = RpcMessage::Request {
            id: RpcId::Num(id),
            method: method.to_owned(),
            params,
        };
        if !self.write_to_agent(msg.to_bytes(), token) {
            return None;
        }
        self.outgoing.insert(id, purpose);
        Some(id)
    }

    /// Sends a notification.
    pub(super) fn notify(&mut self, method: &str, params: Value) {
        let msg = RpcMessage::Notification {
            method: method.to_owned(),
            params,
        };
        self.send_bytes(msg.to_bytes());
    }

    /// Answers a request from the agent.
    pub(super) fn respond(&mut self, id: RpcId, outcome: Result<Value, RpcError>) {
        let msg = RpcMessage::Response {
            id: Some(id),
            outcome,
        };
        self.send_bytes(msg.to_bytes());
    }

    pub(super) async fn begin_handshake(&mut self) {
        if self.record.protocol == crate::model::Protocol::Mcp {
            self.on_ready(false).await;
        } else if self.is_acp() {
            self.phase = Phase::Initializing;
            self.request(
                methods::INITIALIZE,
                acp::initialize_params(),
                Outgoing::Initialize,
            );
        } else {
            // The intercom dialect has no handshake.
            self.on_ready(false).await;
        }
    }

    /// A response to one of the handshake requests.
    pub(super) async fn on_handshake_response(
        &mut self,
        purpose: Outgoing,
        outcome: Result<Value, RpcError>,
    ) {
        if matches!(self.phase, Phase::Stopping | Phase::Ended) {
            // Stopped during its start: the handshake goes no further. A
            // step would overwrite the stop, and an agent exiting on its
            // closed stdin would then read as a failed start (its row erased).
            return;
        }
        match (purpose, outcome) {
            (Outgoing::Initialize, Ok(result)) => self.on_initialized(&result).await,
            (Outgoing::Initialize, Err(e)) => {
                self.fail_handshake(methods::INITIALIZE, e.to_string())
                    .await
            }
            (Outgoing::Authenticate, Ok(_)) => self.open_session(),
            (Outgoing::Authenticate, Err(e)) => {
                let method = self.profile.auth_method.clone().unwrap_or_default();
                self.fail_handshake(methods::AUTHENTICATE, format!("method {method:?}: {e}"))
                    .await
            }
            (Outgoing::NewSession, Ok(result)) => self.on_session_created(&result).await,
            (Outgoing::NewSession, Err(e)) => {
                if self.needs_auth(&e) {
                    self.authenticate_or_fail(e.message.clone()).await;
                } else {
                    self.fail_handshake(methods::SESSION_NEW, e.to_string())
                        .await;
                }
            }
            (Outgoing::LoadSession { method }, Ok(result)) => {
                self.on_session_loaded(method, &result).await
            }
            (Outgoing::LoadSession { method }, Err(e)) => self.on_load_refused(method, e).await,
            (Outgoing::Prompt, _) | (Outgoing::SetOption(_), _) => {}
        }
    }

    /// `initialize` answered: what the agent can do, then its session.
    async fn on_initialized(&mut self, result: &Value) {
        match AgentInfo::from_initialize(result) {
            Ok(info) => {
                tracing::info!(session = %self.record.id, agent = ?info.name.as_deref().map(|n| crate::text::shorten(n, 200)), load = info.load_session, "agent initialized");
                self.agent = info;
                self.open_session();
                if let Some(err) = self.pending_failure.take() {
                    self.fail_start(err).await;
                }
            }
            Err(e) => self.fail_handshake(methods::INITIALIZE, e).await,
        }
    }

    /// `session/new` answered: the agent's session id, stored, and the
    /// session is ready.
    async fn on_session_created(&mut self, result: &Value) {
        match acp::session_id_from_new(result) {
            Ok(sid) => {
                self.learn_agent_options(result);
                self.acp_session = Some(sid.clone());
                // Queued: it shares the commit `on_ready` waits for
                // (its status), so a start makes one commit, not two.
                let (store, id) = (Arc::clone(&self.store), self.id().clone());
                self.ledger.queue(async move {
                    if let Err(e) = store.set_acp_session_id(&id, &sid).await {
                        tracing::error!(session = %id, "storing acp session id: {e}");
                    }
                });
                self.on_ready(false).await;
            }
            Err(e) => self.fail_handshake(methods::SESSION_NEW, e).await,
        }
    }

    /// `session/load` (or `session/resume`) answered: its replay is over,
    /// and the session is ready again.
    async fn on_session_loaded(&mut self, method: &'static str, result: &Value) {
        self.replaying = false;
        self.replay_tail_until = (method == methods::SESSION_LOAD)
            .then(|| std::time::Instant::now() + super::REPLAY_TAIL);
        self.learn_agent_options(result);
        tracing::info!(session = %self.record.id, replayed = self.replayed, "agent session resumed");
        self.on_ready(true).await;
    }

    /// The agent could not load its session: a login it asks for, or a
    /// fresh session in its place (said in the transcript).
    async fn on_load_refused(&mut self, method: &'static str, e: RpcError) {
        self.replaying = false;
        if self.needs_auth(&e) {
            self.authenticate_or_fail(e.message.clone()).await;
            return;
        }
        let text =
            format!("could not resume the agent's session ({method}: {e}); starting a fresh one");
        self.emit_notice(NoticeLevel::Warning, &text).await;
        self.acp_session = None;
        let cwd = std::path::PathBuf::from(&self.record.cwd);
        let params = acp::new_session_params(&cwd, self.bridge());
        self.request(methods::SESSION_NEW, params, Outgoing::NewSession);
    }

    /// ACP reserves -32000 for "authentication required"; agents word it
    /// differently ("Gemini API key is missing or not configured.").
    fn needs_auth(&self, e: &RpcError) -> bool {
        e.code == codes::AUTH_REQUIRED
            || e.message
                .to_ascii_lowercase()
                .contains("authentication required")
    }

    async fn authenticate_or_fail(&mut self, detail: String) {
        match (&self.profile.auth_method, self.auth_tried) {
            (Some(method), false) => {
                self.auth_tried = true;
                self.phase = Phase::Authenticating;
                let params = acp::authenticate_params(method);
                self.request(methods::AUTHENTICATE, params, Outgoing::Authenticate);
            }
            _ => {
                let err = StartError::AuthRequired {
                    agent: self.profile.id.clone(),
                    methods: self.agent.describe_auth_methods(),
                    detail,
                };
                self.fail_start(err).await;
            }
        }
    }

    /// `session/load` (or `session/resume`) when resuming and supported, else `session/new`.
    fn open_session(&mut self) {
        self.phase = Phase::Opening;
        let cwd = std::path::PathBuf::from(&self.record.cwd);
        let resume = match &self.start {
            StartMode::Restart {
                resume: Some(id), ..
            } => Some(id.clone()),
            _ => None,
        };
        if let Some(id) = resume {
            let method = if self.agent.load_session {
                Some(methods::SESSION_LOAD)
            } else if self.agent.resume_session {
                Some(methods::SESSION_RESUME)
            } else {
                None
            };
            if let Some(method) = method {
                self.acp_session = Some(id.clone());
                self.replaying = method == methods::SESSION_LOAD;
                let params = acp::load_session_params(&id, &cwd, self.bridge());
                self.request(method, params, Outgoing::LoadSession { method });
                return;
            }
        }
        if let StartMode::Restart {
            require_resume: true,
            ..
        } = self.start
        {
            self.pending_failure = Some(StartError::Handshake {
                agent: self.profile.id.clone(),
                method: methods::SESSION_LOAD.to_owned(),
                error: "the agent cannot resume sessions (no loadSession capability)".to_owned(),
            });
            return;
        }
        let params = acp::new_session_params(&cwd, self.bridge());
        self.request(methods::SESSION_NEW, params, Outgoing::NewSession);
    }

    /// The bridge MCP servers, only for agents that speak HTTP MCP.
    fn bridge(&self) -> &[acp::McpHttpServer] {
        if self.agent.mcp_http {
            &self.mcp_servers
        } else {
            &[]
        }
    }

    async fn fail_handshake(&mut self, method: &str, error: String) {
        let err = StartError::Handshake {
            agent: self.profile.id.clone(),
            method: method.to_owned(),
            error,
        };
        self.fail_start(err).await;
    }

    /// Handshake finished: the session is live.
    pub(super) async fn on_ready(&mut self, resumed: bool) {
        self.phase = Phase::Ready;
        // A new session's audit entry is queued ahead of its status, so both
        // (and what the handshake queued) share the commit the status waits
        // for, and the entry is stored before the start is answered.
        let audit = match &self.start {
            StartMode::Attached => Some(("session.attached", json!({"protocol": "mcp"}))),
            StartMode::Fresh { .. } => Some(("session.started", json!({"agent": self.profile.id}))),
            StartMode::Restart { .. } => None,
        };
        if let Some((action, detail)) = audit {
            self.audit_queued(&self.record.owner, action, detail);
        }
        self.set_status(SessionStatus::Active, "working", None)
            .await;
        if let Some(ready) = self.ready.take() {
            let _ = ready.send(Ok(()));
        }
        match self.start.clone() {
            StartMode::Attached => {}
            StartMode::Fresh { first } => self.after_fresh_start(first).await,
            StartMode::Restart {
                reprompt,
                was_mid_turn,
                revived,
                ..
            } => {
                self.after_restart(resumed, was_mid_turn, reprompt, revived)
                    .await;
            }
        }
    }

    /// A new session is ready: its first prompt is sent, or waits for the
    /// resume when it was paused during the start.
    async fn after_fresh_start(&mut self, first: crate::model::Steering) {
        if self.paused {
            // Paused during the start: the first prompt waits in the
            // queue (stored, undelivered) for the resume.
            if !self.queue.iter().any(|s| s.id == first.id) {
                self.queue.push_front(first);
            }
            self.emit_notice(
                NoticeLevel::Info,
                "Still paused: the first prompt waits until the session is resumed.",
            )
            .await;
            self.show_activity("paused", None);
            return;
        }
        // Sent as the first prompt (noted in the transcript before
        // the agent can answer it), then marked delivered; not sent
        // (stdin already gone) it stays queued for the restart.
        self.queue.retain(|s| s.id != first.id);
        if self.send_prompt(first.text, Role::User).await {
            self.first_prompt_sent(first.id);
        }
    }

    /// A restarted (or revived) agent is ready: the operator is told how it
    /// came back, and a cut turn is continued or given again (on resume
    /// when paused).
    async fn after_restart(
        &mut self,
        resumed: bool,
        was_mid_turn: bool,
        reprompt: Option<String>,
        revived: bool,
    ) {
        let how = if resumed {
            "resumed the agent's session"
        } else if self.is_acp() {
            "the agent cannot resume, so it started a fresh session"
        } else if revived {
            "started the agent again"
        } else {
            "restarted the agent"
        };
        if revived {
            // The supervisor audits the revive in the reviver's name.
            self.emit_notice(NoticeLevel::Info, &format!("Session revived: {how}."))
                .await;
        } else {
            self.emit_notice(NoticeLevel::Info, &format!("Agent restarted: {how}."))
                .await;
            self.audit("system", "session.restarted", json!({"resumed": resumed}))
                .await;
        }
        // A fresh agent lost the cut turn: it is given again. One
        // that resumed its session is told to continue it.
        let cut = match (was_mid_turn, resumed, reprompt) {
            (false, ..) => None,
            (true, true, prompt) => Some(CutTurn::Continue(prompt)),
            (true, false, prompt) => prompt.map(CutTurn::Redo),
        };
        if self.paused {
            // Still paused: what waits is delivered on resume, and a
            // cut turn is continued (or given again) then.
            self.resume_turn = cut;
            self.emit_notice(
                NoticeLevel::Info,
                "Still paused: steering waits until the session is resumed.",
            )
            .await;
            self.show_activity("paused", None);
        } else {
            self.go_on(cut).await;
        }
        if !self.paused && self.turn.is_none() {
            // Nothing to continue: it waits for the operator, and
            // says so (it read "working" for ever after a restart).
            self.show_activity("idle", None);
        }
    }

    /// The first prompt, stored as the session's first steering, reached
    /// the agent: its row is marked delivered (a queued write: the next
    /// commit takes it) and watchers are told, as for any steering.
    fn first_prompt_sent(&self, steering_id: i64) {
        let (store, id) = (Arc::clone(&self.store), self.id().clone());
        let me = self.myself.clone();
        self.ledger.queue(async move {
            if let Err(e) = store.mark_steering_delivered(steering_id).await {
                tracing::warn!(session = %id, "marking the first prompt delivered: {e}; kept for a retry");
                let _ = me.send_message(super::SessionMsg::DeliveryNotMarked { steering_id });
            }
        });
        self.emit(OperatorEvent::SteeringDelivered {
            session_id: self.id().clone(),
            steering_id,
        });
    }

    /// Records a notice in the transcript and tells the operator.
    pub(super) async fn emit_notice(&self, level: NoticeLevel, text: &str) {
        self.note(Role::System, level.message_kind(), text);
        self.emit(OperatorEvent::Notice {
            session_id: self.id().clone(),
            level,
            text: text.to_owned(),
        });
    }
}
