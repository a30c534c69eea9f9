//! The SessionSupervisor: creates, indexes and restarts sessions.
//!
//! It is linked to every SessionActor, but overrides ractor's default of
//! dying with a failed child: a crashed agent (or a panicked actor) is
//! restarted by policy — a budget of restarts within a window, exponential
//! backoff — and resumed with `session/load` where the agent supports it.
//! When the budget is spent the session is marked `crashed` with the stderr
//! tail. It also holds the routing index (session id and Slack thread ->
//! actor), enforces `max_sessions`, recovers live sessions after a server
//! restart, and runs the graceful shutdown.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde_json::json;
use tokio::sync::oneshot;

use crate::model::{
    AuditEntry, Protocol, RequestStatus, SessionId, SessionRecord, SessionStatus, now_ms,
};
use crate::ports::{NoticeLevel, OperatorEvent, OperatorSink, SessionStore};
use crate::protocol::acp::McpHttpServer;
use crate::session::{
    Caller, SessionActor, SessionArgs, SessionError, SessionExit, SessionMsg, SessionSettings,
    StartError, StartMode, SteerOutcome, StopCause, TERM_TO_KILL,
};
use crate::settings::{AgentProfile, SupervisionPolicy};

mod admission;
pub mod directory;
mod operator;
pub mod threads;
pub use operator::{NoAnswer, OPERATOR_CALL, steer_session};

/// MCP sessions (IDE clients, no process) live at once. They do not count
/// toward `limits.max_sessions`; this only bounds what clients that never
/// close their MCP session can pile up.
pub const MAX_MCP_SESSIONS: usize = 256;

/// What a new session needs, already resolved by the workspace registry.
#[derive(Debug, Clone)]
pub struct StartRequest {
    /// Workspace id (or the path for ad-hoc sessions).
    pub workspace: String,
    /// Directory the agent runs in.
    pub cwd: std::path::PathBuf,
    /// Slack channel, when the workspace has one.
    pub channel_id: Option<String>,
    /// Agent profile.
    pub profile: AgentProfile,
    /// First prompt.
    pub prompt: String,
    /// Who starts it.
    pub owner: String,
    /// Approval mode to start in (the workspace's or the caller's); `None` = ask.
    pub mode: Option<crate::rules::ApprovalMode>,
}

/// An MCP client attaching as a session of its own.
#[derive(Debug, Clone)]
pub struct AttachRequest {
    /// Workspace id, or empty for a local-only session.
    pub workspace: String,
    /// Directory the IDE works in.
    pub cwd: std::path::PathBuf,
    /// Slack channel, when the workspace has one.
    pub channel_id: Option<String>,
    /// Client name (for the title).
    pub title: String,
    /// Who it belongs to.
    pub owner: String,
}

/// Why a session could not be started.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SupervisorError {
    /// `max_sessions` reached.
    #[error("{max} sessions are already live (limits.max_sessions); stop one or try again later")]
    LimitReached {
        /// The limit.
        max: usize,
    },
    /// The prompt was empty.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The agent did not start; no session record was kept.
    #[error("{0}")]
    StartFailed(StartError),
    /// Storage refused.
    #[error("storage: {0}")]
    Storage(String),
    /// The server is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The session cannot be revived (explicitly stopped, crashed, unknown, live).
    #[error("{0}")]
    NotRevivable(String),
    /// The caller may not act on the session.
    #[error("{user} may not act on session {session}: only its owner ({owner}) and operators may")]
    Unauthorized {
        /// Who.
        user: String,
        /// Which.
        session: SessionId,
        /// Owner.
        owner: String,
    },
}

/// Messages the supervisor handles.
pub enum SupervisorMsg {
    /// Start a new session; answered once the handshake finished or failed.
    Start {
        /// What to start.
        req: StartRequest,
        /// The stored record.
        reply: RpcReplyPort<Result<SessionRecord, SupervisorError>>,
    },
    /// Attach an MCP client as a new session (no child process).
    Attach {
        /// What to attach.
        req: AttachRequest,
        /// The stored record.
        reply: RpcReplyPort<Result<SessionRecord, SupervisorError>>,
    },
    /// The session a bridge token (`Authorization: Bearer ...` on `/mcp`) belongs to.
    ResolveBridgeToken {
        /// The token.
        token: String,
        /// Its session, when live.
        reply: RpcReplyPort<Option<SessionId>>,
    },
    /// A session actor reports how it ended.
    SessionExited {
        /// Which.
        id: SessionId,
        /// How.
        exit: SessionExit,
    },
    /// A restart's backoff elapsed.
    RestartDue(SessionId),
    /// A start that was admitted finished (ready or failed): admit the next.
    StartFinished,
    /// Steer a session: handed to its actor, or, while the session waits
    /// for a restart, stored for the restarted agent (answered `queued`).
    Steer {
        /// Which.
        id: SessionId,
        /// The instruction.
        text: String,
        /// Cancel the running turn first.
        interrupt: bool,
        /// Who.
        caller: Caller,
        /// Whether it was queued.
        reply: RpcReplyPort<Result<SteerOutcome, SessionError>>,
    },
    /// Restart a session's agent now (an operator asked): kill its process
    /// group and respawn it in the same session, or, while it waits for a
    /// crash restart, restart it without waiting for the backoff.
    Restart {
        /// Which.
        id: SessionId,
        /// Who.
        caller: Caller,
        /// Answered once the restart is under way.
        reply: RpcReplyPort<Result<(), SessionError>>,
    },
    /// The actor of a live session.
    Lookup {
        /// Which.
        id: SessionId,
        /// The actor, when live.
        reply: RpcReplyPort<Option<ActorRef<SessionMsg>>>,
    },
    /// Stop a session, also while it waits for a crash restart.
    Stop {
        /// Which.
        id: SessionId,
        /// Who.
        caller: Caller,
        /// Ok once stopping began; `false` when it was not live.
        reply: RpcReplyPort<Result<bool, crate::session::SessionError>>,
    },
    /// Bring back a session that ended by idle timeout (not by an explicit
    /// stop): respawn its agent and resume with `session/load` where
    /// supported; answered once the handshake finished.
    Revive {
        /// Which.
        id: SessionId,
        /// Its agent profile (from the current config).
        profile: AgentProfile,
        /// Who.
        caller: Caller,
        /// The revived record.
        reply: RpcReplyPort<Result<SessionRecord, SupervisorError>>,
    },
    /// The rule set changed: every live session re-evaluates its pending requests.
    RulesChanged,
    /// Live sessions (including ones waiting to restart).
    LiveCount(RpcReplyPort<usize>),
    /// After a server restart: resume or interrupt sessions stored as live.
    Recover {
        /// Agent profiles by id.
        profiles: Vec<AgentProfile>,
        /// (resumed, interrupted).
        reply: RpcReplyPort<(usize, usize)>,
    },
    /// Stop everything gracefully; answered when all agents are gone.
    Shutdown(RpcReplyPort<()>),
    /// The shutdown deadline passed.
    ShutdownDeadline,
    /// Tests: keep the supervisor busy (stuck) for this long.
    #[cfg(feature = "test-hooks")]
    StallForTest(Duration),
    /// Tests: panic inside the handler (Root's policy for a failed supervisor).
    #[cfg(feature = "test-hooks")]
    PanicForTest,
}

/// Supervisor configuration.
pub struct SupervisorArgs {
    /// Restart policy.
    pub policy: SupervisionPolicy,
    /// Settings shared by every session.
    pub settings: Arc<SessionSettings>,
    /// Storage.
    pub store: Arc<dyn SessionStore>,
    /// Operator events.
    pub sink: Arc<dyn OperatorSink>,
    /// Base URL of this server's MCP endpoint (`http://host:port/mcp`); when
    /// set, ACP agents that support HTTP MCP get it with a per-session token.
    pub bridge_url: Option<String>,
}

/// What a restart needs to know.
#[derive(Debug, Clone)]
struct RestartPlan {
    resume: Option<String>,
    reprompt: Option<String>,
    mid_turn: bool,
    require_resume: bool,
}

impl RestartPlan {
    /// How to bring back an agent that went away (crash or operator restart):
    /// resume its ACP session when it had one, else re-send the cut turn.
    fn after_exit(acp_session: Option<String>, prompt: Option<String>, mid_turn: bool) -> Self {
        RestartPlan {
            resume: acp_session,
            reprompt: prompt,
            mid_turn,
            require_resume: false,
        }
    }
}

struct Entry {
    actor: Option<ActorRef<SessionMsg>>,
    profile: AgentProfile,
    restarts: Vec<Instant>,
    total_restarts: u32,
    plan: Option<RestartPlan>,
    /// Recovering after a server restart: a failure means `interrupted`.
    recovering: bool,
    /// Still in its first start (failure deletes the row).
    first_start: bool,
}

/// Supervisor state.
pub struct SupervisorState {
    myself: ActorRef<SupervisorMsg>,
    args: SupervisorArgs,
    sessions: HashMap<SessionId, Entry>,
    bridge_tokens: HashMap<String, SessionId>,
    shutdown: Option<RpcReplyPort<()>>,
    /// Starts in flight and the ones waiting for their turn.
    admission: admission::Admission,
}

/// The SessionSupervisor handler.
pub struct SessionSupervisor;

impl Actor for SessionSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        // Slack thread lookups are answered beside the supervisor, not by it.
        threads::spawn(&myself).await?;
        Ok(SupervisorState {
            myself,
            args,
            sessions: HashMap::new(),
            bridge_tokens: HashMap::new(),
            shutdown: None,
            admission: admission::Admission::default(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Start { req, reply } => state.request_start(req, reply).await,
            SupervisorMsg::StartFinished => state.start_finished().await,
            SupervisorMsg::Attach { req, reply } => state.attach(req, reply).await,
            SupervisorMsg::ResolveBridgeToken { token, reply } => {
                let id = state
                    .bridge_tokens
                    .get(&token)
                    .filter(|id| state.sessions.contains_key(*id))
                    .cloned();
                let _ = reply.send(id);
            }
            SupervisorMsg::SessionExited { id, exit } => state.on_exit(id, exit).await,
            SupervisorMsg::RestartDue(id) => state.restart(id).await,
            SupervisorMsg::Steer {
                id,
                text,
                interrupt,
                caller,
                reply,
            } => state.steer(id, text, interrupt, caller, reply).await,
            SupervisorMsg::Restart { id, caller, reply } => {
                state.restart_now(id, caller, reply).await
            }
            SupervisorMsg::Lookup { id, reply } => {
                let actor = state.sessions.get(&id).and_then(|e| e.actor.clone());
                let _ = reply.send(actor);
            }
            SupervisorMsg::Stop { id, caller, reply } => state.stop(id, caller, reply).await,
            SupervisorMsg::Revive {
                id,
                profile,
                caller,
                reply,
            } => state.revive(id, profile, caller, reply).await,
            SupervisorMsg::RulesChanged => {
                for entry in state.sessions.values() {
                    if let Some(actor) = &entry.actor {
                        let _ = actor.send_message(SessionMsg::RulesChanged);
                    }
                }
            }
            SupervisorMsg::LiveCount(reply) => {
                let _ = reply.send(state.sessions.len());
            }
            SupervisorMsg::Recover { profiles, reply } => {
                let counts = state.recover(profiles).await;
                let _ = reply.send(counts);
            }
            SupervisorMsg::Shutdown(reply) => state.begin_shutdown(reply).await,
            #[cfg(feature = "test-hooks")]
            SupervisorMsg::StallForTest(d) => tokio::time::sleep(d).await,
            #[cfg(feature = "test-hooks")]
            SupervisorMsg::PanicForTest => {
                panic!("session supervisor panicked on request (test hook)")
            }
            SupervisorMsg::ShutdownDeadline => {
                if let Some(reply) = state.shutdown.take() {
                    tracing::warn!(left = state.sessions.len(), "shutdown deadline passed");
                    let _ = reply.send(());
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        // Overrides ractor's default (stop the supervisor when a child fails).
        if let SupervisionEvent::ActorFailed(cell, err) = event
            && let Some(id) = state.session_of(&cell)
        {
            {
                tracing::error!(session = %id, "session actor failed: {err}");
                let exit = SessionExit::Crashed {
                    reason: format!("session actor failed: {err}"),
                    acp_session: None,
                    interrupted_prompt: None,
                    mid_turn: false,
                };
                state.on_exit(id, exit).await;
            }
        }
        Ok(())
    }
}

impl SupervisorState {
    /// Live sessions that run an agent (what `limits.max_sessions` bounds).
    fn agent_sessions(&self) -> usize {
        self.sessions
            .values()
            .filter(|e| e.profile.protocol != Protocol::Mcp)
            .count()
    }

    fn session_of(&self, cell: &ActorCell) -> Option<SessionId> {
        self.sessions
            .iter()
            .find(|(_, e)| {
                e.actor
                    .as_ref()
                    .is_some_and(|a| a.get_id() == cell.get_id())
            })
            .map(|(id, _)| id.clone())
    }

    async fn audit(&self, id: &SessionId, action: &str, detail: serde_json::Value) {
        let entry = AuditEntry {
            session_id: Some(id.clone()),
            actor: "system".into(),
            action: action.into(),
            detail,
        };
        if let Err(e) = self.args.store.audit(&entry).await {
            tracing::error!(session = %id, "audit write failed: {e}");
        }
    }

    fn notice(&self, id: &SessionId, level: NoticeLevel, text: String) {
        self.args.sink.emit(OperatorEvent::Notice {
            session_id: id.clone(),
            level,
            text,
        });
    }

    async fn spawn_session(
        &mut self,
        record: SessionRecord,
        profile: AgentProfile,
        start: StartMode,
        ready: Option<oneshot::Sender<Result<(), StartError>>>,
    ) -> Result<ActorRef<SessionMsg>, StartError> {
        let mcp_servers = self.bridge_for(&record.id, profile.protocol);
        let args = SessionArgs {
            record,
            profile,
            settings: self.args.settings.clone(),
            store: self.args.store.clone(),
            sink: self.args.sink.clone(),
            start,
            mcp_servers,
            ready,
            supervisor: Some(self.myself.clone()),
        };
        // Named, so lookups find the actor without this mailbox (directory.rs).
        let name = directory::actor_name(&self.myself, &args.record.id);
        directory::wait_previous_gone(&self.myself, &args.record.id).await;
        match Actor::spawn_linked(Some(name), SessionActor, args, self.myself.get_cell()).await {
            Ok((actor, _)) => Ok(actor),
            Err(e) => Err(match e {
                ractor::SpawnErr::StartupFailed(inner) => {
                    match inner.downcast_ref::<StartError>() {
                        Some(se) => se.clone(),
                        None => StartError::Spawn(inner.to_string()),
                    }
                }
                other => StartError::Spawn(other.to_string()),
            }),
        }
    }

    /// The MCP server handed to an ACP agent: this server, with a token
    /// bound to the session (stable across restarts of the session).
    fn bridge_for(&mut self, id: &SessionId, protocol: Protocol) -> Vec<McpHttpServer> {
        let (Some(base), Protocol::Acp) = (&self.args.bridge_url, protocol) else {
            return Vec::new();
        };
        let token = match self.bridge_tokens.iter().find(|(_, s)| *s == id) {
            Some((t, _)) => t.clone(),
            None => {
                let t = crate::ids::random_token();
                self.bridge_tokens.insert(t.clone(), id.clone());
                t
            }
        };
        vec![McpHttpServer {
            name: "agent-intercom".into(),
            url: base.clone(),
            headers: vec![("Authorization".into(), format!("Bearer {token}"))],
        }]
    }

    async fn attach(
        &mut self,
        req: AttachRequest,
        reply: RpcReplyPort<Result<SessionRecord, SupervisorError>>,
    ) {
        if self.shutdown.is_some() {
            let _ = reply.send(Err(SupervisorError::ShuttingDown));
            return;
        }
        // An MCP session runs no process: it takes no agent slot, only one
        // of a fixed number of client slots.
        let clients = self.sessions.len() - self.agent_sessions();
        if clients >= MAX_MCP_SESSIONS {
            let _ = reply.send(Err(SupervisorError::LimitReached {
                max: MAX_MCP_SESSIONS,
            }));
            return;
        }
        let record = new_record(
            req.workspace,
            &req.cwd,
            "mcp",
            Protocol::Mcp,
            &req.title,
            req.owner,
            req.channel_id,
        );

        if let Err(e) = self.args.store.create_session(&record).await {
            let _ = reply.send(Err(SupervisorError::Storage(e.to_string())));
            return;
        }
        self.args.sink.emit(OperatorEvent::SessionStarted {
            session: record.clone(),
        });
        let profile = placeholder_entry(&record).profile;
        let (tx, rx) = oneshot::channel();
        match self
            .spawn_session(
                record.clone(),
                profile.clone(),
                StartMode::Attached,
                Some(tx),
            )
            .await
        {
            Ok(actor) => {
                self.sessions.insert(
                    record.id.clone(),
                    Entry {
                        actor: Some(actor),
                        profile,
                        restarts: Vec::new(),
                        total_restarts: 0,
                        plan: None,
                        recovering: false,
                        first_start: true,
                    },
                );
                answer_when_ready(self.args.store.clone(), record, rx, reply);
            }
            Err(err) => {
                let _ = self.args.store.delete_session(&record.id).await;
                let _ = reply.send(Err(SupervisorError::StartFailed(err)));
            }
        }
    }

    /// A start as asked: refused at once when it cannot succeed, run now
    /// when fewer than `limits.max_concurrent_starts` are starting, queued
    /// otherwise ([`admission`]).
    async fn request_start(
        &mut self,
        req: StartRequest,
        reply: RpcReplyPort<Result<SessionRecord, SupervisorError>>,
    ) {
        if self.shutdown.is_some() {
            let _ = reply.send(Err(SupervisorError::ShuttingDown));
            return;
        }
        let max = self.args.settings.limits.max_sessions;
        if self.agent_sessions() + self.admission.waiting() >= max {
            tracing::warn!(max, "session limit reached");
            let _ = reply.send(Err(SupervisorError::LimitReached { max }));
            return;
        }
        let limit = self.args.settings.limits.max_concurrent_starts;
        let start = admission::WaitingStart { req, reply };
        if let Some(now) = self.admission.admit(start, limit) {
            self.run_admitted(now).await;
        }
    }

    /// An admitted start finished: the next waiting one runs.
    async fn start_finished(&mut self) {
        let limit = self.args.settings.limits.max_concurrent_starts;
        if let Some(next) = self.admission.finished(limit) {
            self.run_admitted(next).await;
        }
    }

    /// Runs an admitted start; one that ended at once frees its slot.
    async fn run_admitted(&mut self, admitted: admission::WaitingStart) {
        if !self.start(admitted.req, admitted.reply).await {
            let _ = self.myself.send_message(SupervisorMsg::StartFinished);
        }
    }

    /// Runs an admitted start; false when it ended here (refused or failed
    /// to spawn), true when its handshake is awaited aside (that task
    /// reports `StartFinished`).
    async fn start(
        &mut self,
        req: StartRequest,
        reply: RpcReplyPort<Result<SessionRecord, SupervisorError>>,
    ) -> bool {
        if self.shutdown.is_some() {
            let _ = reply.send(Err(SupervisorError::ShuttingDown));
            return false;
        }
        let prompt = req.prompt.trim().to_owned();
        if crate::model::is_blank_prompt(&prompt) {
            let _ = reply.send(Err(SupervisorError::EmptyPrompt));
            return false;
        }
        let max = self.args.settings.limits.max_sessions;
        if self.agent_sessions() >= max {
            tracing::warn!(max, "session limit reached");
            let _ = reply.send(Err(SupervisorError::LimitReached { max }));
            return false;
        }
        let record = new_record(
            req.workspace.clone(),
            &req.cwd,
            &req.profile.id,
            req.profile.protocol,
            &prompt,
            req.owner.clone(),
            req.channel_id.clone(),
        );

        if let Err(e) = self.args.store.create_session(&record).await {
            let _ = reply.send(Err(SupervisorError::Storage(e.to_string())));
            return false;
        }
        if let Some(mode) = req.mode
            && let Err(e) = self.args.store.set_approval_mode(&record.id, mode).await
        {
            let _ = self.args.store.delete_session(&record.id).await;
            let _ = reply.send(Err(SupervisorError::Storage(e.to_string())));
            return false;
        }
        self.args.sink.emit(OperatorEvent::SessionStarted {
            session: record.clone(),
        });
        let (tx, rx) = oneshot::channel();
        let start = StartMode::Fresh { prompt };
        let id = record.id.clone();
        let spawned = self
            .spawn_session(record.clone(), req.profile.clone(), start, Some(tx))
            .await;
        let store = self.args.store.clone();
        let actor = match spawned {
            Ok(actor) => actor,
            Err(err) => {
                let _ = store.delete_session(&id).await;
                self.args.sink.emit(OperatorEvent::SessionEnded {
                    session_id: id.clone(),
                    status: SessionStatus::Error,
                    reason: Some(err.to_string()),
                });
                let _ = reply.send(Err(SupervisorError::StartFailed(err)));
                return false;
            }
        };
        self.sessions.insert(
            id.clone(),
            Entry {
                actor: Some(actor),
                profile: req.profile,
                restarts: Vec::new(),
                total_restarts: 0,
                plan: None,
                recovering: false,
                first_start: true,
            },
        );
        // Wait for the handshake off the supervisor's mailbox.
        let sink = self.args.sink.clone();
        let me = self.myself.clone();
        tokio::spawn(async move {
            let outcome = match rx.await {
                Ok(Ok(())) => match store.get_session(&id).await {
                    Ok(Some(rec)) => Ok(rec),
                    _ => Ok(record),
                },
                Ok(Err(err)) => {
                    let _ = store.delete_session(&id).await;
                    sink.emit(OperatorEvent::SessionEnded {
                        session_id: id.clone(),
                        status: SessionStatus::Error,
                        reason: Some(err.to_string()),
                    });
                    Err(SupervisorError::StartFailed(err))
                }
                Err(_) => {
                    // Stopped before it was ready: a stop leaves its record
                    // (`cancelled`); anything else leaves none.
                    let ended =
                        matches!(store.get_session(&id).await, Ok(Some(r)) if !r.status.is_live());
                    if !ended {
                        let _ = store.delete_session(&id).await;
                    }
                    Err(SupervisorError::StartFailed(StartError::Spawn(
                        "the session stopped before its agent was ready".into(),
                    )))
                }
            };
            let _ = reply.send(outcome);
            let _ = me.send_message(SupervisorMsg::StartFinished);
        });
        true
    }

    async fn on_exit(&mut self, id: SessionId, exit: SessionExit) {
        let Some(entry) = self.sessions.get_mut(&id) else {
            return;
        };
        if entry.profile.protocol == Protocol::Mcp {
            // MCP clients are not restarted: they reconnect on their own.
            self.sessions.remove(&id);
            self.bridge_tokens.retain(|_, s| s != &id);
            self.check_shutdown_done();
            return;
        }
        entry.actor = None;
        match exit {
            SessionExit::Finished(_) => {
                self.sessions.remove(&id);
                self.bridge_tokens.retain(|_, s| s != &id);
            }
            SessionExit::StartFailed(err) if entry.first_start => {
                tracing::info!(session = %id, "first start failed: {err}");
                self.sessions.remove(&id);
            }
            SessionExit::StartFailed(err) if entry.recovering => {
                let reason = format!("could not resume after a server restart: {err}");
                self.end_session(&id, SessionStatus::Interrupted, &reason)
                    .await;
            }
            SessionExit::StartFailed(err) => {
                let plan = entry
                    .plan
                    .clone()
                    .unwrap_or(RestartPlan::after_exit(None, None, false));
                self.maybe_restart(id, err.to_string(), plan).await;
            }
            SessionExit::RestartRequested {
                by,
                acp_session,
                interrupted_prompt,
                mid_turn,
            } => {
                entry.first_start = false;
                let plan = RestartPlan::after_exit(acp_session, interrupted_prompt, mid_turn);
                self.restart_on_request(id, by, plan).await;
            }
            SessionExit::Crashed {
                reason,
                acp_session,
                interrupted_prompt,
                mid_turn,
            } => {
                entry.first_start = false;
                let plan = RestartPlan::after_exit(acp_session, interrupted_prompt, mid_turn);
                self.maybe_restart(id, reason, plan).await;
            }
        }
        self.check_shutdown_done();
    }

    async fn maybe_restart(&mut self, id: SessionId, reason: String, plan: RestartPlan) {
        if self.shutdown.is_some() {
            self.end_session(&id, SessionStatus::Cancelled, "server_shutdown")
                .await;
            return;
        }
        let policy = self.args.policy.clone();
        let window = Duration::from_secs(policy.restart_window_secs);
        let Some(entry) = self.sessions.get_mut(&id) else {
            return;
        };
        let now = Instant::now();
        entry.restarts.retain(|t| now.duration_since(*t) < window);
        if entry.restarts.len() as u32 >= policy.max_restarts {
            let text = format!(
                "{reason}. Restart budget spent ({} restarts within {} s); the session is marked crashed.",
                policy.max_restarts, policy.restart_window_secs
            );
            self.notice(&id, NoticeLevel::Error, text);
            self.end_session(&id, SessionStatus::Crashed, &reason).await;
            return;
        }
        entry.restarts.push(now);
        entry.total_restarts += 1;
        entry.plan = Some(plan);
        let attempt = entry.restarts.len() as u32;
        let total = entry.total_restarts;
        let delay = policy.backoff(attempt);
        let store = self.args.store.clone();
        let _ = store.set_restart_count(&id, total).await;
        let why = format!(
            "restarting after a crash (attempt {attempt} of {})",
            policy.max_restarts
        );
        let _ = store
            .set_status(&id, SessionStatus::Starting, Some(&why))
            .await;
        self.args.sink.emit(OperatorEvent::StatusChanged {
            session_id: id.clone(),
            status: SessionStatus::Starting,
            activity: "crashed, restarting".into(),
            reason: Some(why.clone()),
        });
        self.notice(
            &id,
            NoticeLevel::Warning,
            format!(
                "{reason}. Restarting in {} s (attempt {attempt} of {}).",
                delay.as_secs(),
                policy.max_restarts
            ),
        );
        self.audit(
            &id,
            "session.restart_scheduled",
            json!({"attempt": attempt, "delay_secs": delay.as_secs()}),
        )
        .await;
        let id2 = id.clone();
        self.myself
            .send_after(delay, move || SupervisorMsg::RestartDue(id2.clone()));
    }

    async fn restart(&mut self, id: SessionId) {
        if self.shutdown.is_some() {
            self.end_session(&id, SessionStatus::Cancelled, "server_shutdown")
                .await;
            self.check_shutdown_done();
            return;
        }
        let Some(entry) = self.sessions.get(&id) else {
            return;
        };
        if entry.actor.is_some() {
            // Already restarted (an operator's restart beat the backoff).
            return;
        }
        let profile = entry.profile.clone();
        let plan = entry.plan.clone().unwrap_or(RestartPlan {
            resume: None,
            reprompt: None,
            mid_turn: false,
            require_resume: false,
        });
        let record = match self.args.store.get_session(&id).await {
            Ok(Some(r)) if r.status.is_live() => r,
            _ => {
                self.sessions.remove(&id);
                return;
            }
        };
        let start = StartMode::Restart {
            resume: plan.resume.clone(),
            reprompt: plan.reprompt.clone(),
            was_mid_turn: plan.mid_turn,
            require_resume: plan.require_resume,
        };
        match self.spawn_session(record, profile, start, None).await {
            Ok(actor) => {
                if let Some(e) = self.sessions.get_mut(&id) {
                    e.actor = Some(actor);
                }
            }
            Err(err) => {
                let recovering = self.sessions.get(&id).is_some_and(|e| e.recovering);
                if recovering {
                    let reason = format!("could not resume after a server restart: {err}");
                    self.end_session(&id, SessionStatus::Interrupted, &reason)
                        .await;
                } else {
                    self.maybe_restart(id, err.to_string(), plan).await;
                }
            }
        }
    }

    /// Marks a session ended for good and forgets it.
    async fn end_session(&mut self, id: &SessionId, status: SessionStatus, reason: &str) {
        self.sessions.remove(id);
        self.bridge_tokens.retain(|_, s| s != id);
        let store = self.args.store.clone();
        if let Err(e) = store.set_status(id, status, Some(reason)).await {
            tracing::error!(session = %id, "status write failed: {e}");
        }
        if let Ok(reqs) = store.list_requests(Some(id), true).await {
            for r in reqs {
                let _ = store.close_request(&r.id, RequestStatus::Expired).await;
                self.args.sink.emit(OperatorEvent::RequestClosed {
                    session_id: id.clone(),
                    id: r.id,
                    status: RequestStatus::Expired,
                    decision: None,
                });
            }
        }
        self.audit(
            id,
            "session.ended",
            json!({"status": status.as_str(), "reason": reason}),
        )
        .await;
        self.args.sink.emit(OperatorEvent::StatusChanged {
            session_id: id.clone(),
            status,
            activity: status.as_str().into(),
            reason: Some(reason.to_owned()),
        });
        self.args.sink.emit(OperatorEvent::SessionEnded {
            session_id: id.clone(),
            status,
            reason: Some(reason.to_owned()),
        });
    }

    async fn recover(&mut self, profiles: Vec<AgentProfile>) -> (usize, usize) {
        let store = self.args.store.clone();
        let live = match store.list_sessions(true).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("recovery could not list sessions: {e}");
                return (0, 0);
            }
        };
        let (mut resumed, mut interrupted) = (0, 0);
        for rec in live {
            let id = rec.id.clone();
            // The old server died with its agents still running (SIGKILL):
            // their process groups are orphans now. End them before anything
            // is respawned.
            if let Ok(Some((pid, start))) = store.agent_process(&id).await {
                if crate::child::kill_orphan_group(pid, start) {
                    tracing::warn!(session = %id, pid, "killed the agent process group left by the previous server");
                    let deadline = Instant::now() + Duration::from_secs(2);
                    while crate::child::group_alive(pid) && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                let _ = store.set_agent_process(&id, None).await;
            }
            // The agent process died with the old server: its open requests
            // cannot be answered any more. Say so explicitly.
            if let Ok(reqs) = store.list_requests(Some(&id), true).await {
                for r in reqs {
                    let _ = store.close_request(&r.id, RequestStatus::Expired).await;
                    self.args.sink.emit(OperatorEvent::RequestClosed {
                        session_id: id.clone(),
                        id: r.id,
                        status: RequestStatus::Expired,
                        decision: None,
                    });
                }
            }
            let profile = profiles.iter().find(|p| p.id == rec.agent).cloned();
            let resumable = match rec.protocol {
                Protocol::Acp => rec.acp_session_id.is_some(),
                Protocol::Intercom => true,
                Protocol::Mcp => false,
            };
            let (Some(profile), true) = (profile, resumable) else {
                let reason = "server restarted; the session could not be resumed";
                self.sessions.insert(id.clone(), placeholder_entry(&rec));
                self.end_session(&id, SessionStatus::Interrupted, reason)
                    .await;
                interrupted += 1;
                continue;
            };
            let plan = RestartPlan {
                resume: rec.acp_session_id.clone(),
                reprompt: None,
                mid_turn: false,
                require_resume: rec.protocol == Protocol::Acp,
            };
            self.sessions.insert(
                id.clone(),
                Entry {
                    actor: None,
                    profile,
                    restarts: Vec::new(),
                    total_restarts: rec.restart_count,
                    plan: Some(plan),
                    recovering: true,
                    first_start: false,
                },
            );
            if let (Some(ch), Some(ts)) = (&rec.channel_id, &rec.thread_ts) {
                threads::posted(&self.myself, &id, ch, ts);
            }
            self.notice(
                &id,
                NoticeLevel::Info,
                "The server restarted; resuming this session.".into(),
            );
            self.restart(id.clone()).await;
            if self.sessions.get(&id).is_some_and(|e| e.actor.is_some()) {
                resumed += 1;
            } else {
                interrupted += 1;
            }
        }
        (resumed, interrupted)
    }

    async fn stop(
        &mut self,
        id: SessionId,
        caller: Caller,
        reply: RpcReplyPort<Result<bool, crate::session::SessionError>>,
    ) {
        let Some(entry) = self.sessions.get(&id) else {
            let _ = reply.send(Ok(false));
            return;
        };
        if let Some(actor) = entry.actor.clone() {
            // The actor checks the caller and answers.
            let _ = actor.send_message(SessionMsg::Stop {
                cause: StopCause::Operator,
                caller,
                reply: None,
            });
            let _ = reply.send(Ok(true));
            return;
        }
        // Waiting for a restart: no actor to ask, so check the owner here.
        let owner = self
            .args
            .store
            .get_session(&id)
            .await
            .ok()
            .flatten()
            .map(|r| r.owner)
            .unwrap_or_default();
        let allowed = caller.operator
            || caller.id == owner
            || self.args.settings.operators.contains(&caller.id);
        if !allowed {
            let _ = reply.send(Err(crate::session::SessionError::Unauthorized {
                user: caller.id,
                session: id,
                owner,
            }));
            return;
        }
        self.end_session(&id, SessionStatus::Cancelled, "stopped by operator")
            .await;
        let _ = reply.send(Ok(true));
    }

    async fn revive(
        &mut self,
        id: SessionId,
        profile: AgentProfile,
        caller: Caller,
        reply: RpcReplyPort<Result<SessionRecord, SupervisorError>>,
    ) {
        let refuse = |why: String| Err(SupervisorError::NotRevivable(why));
        if self.shutdown.is_some() {
            let _ = reply.send(Err(SupervisorError::ShuttingDown));
            return;
        }
        if self.sessions.contains_key(&id) {
            let _ = reply.send(refuse(format!("session {id} is still live")));
            return;
        }
        let record = match self.args.store.get_session(&id).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                let _ = reply.send(refuse(format!("no session {id}")));
                return;
            }
            Err(e) => {
                let _ = reply.send(Err(SupervisorError::Storage(e.to_string())));
                return;
            }
        };
        let idle_ended = record.status == SessionStatus::Completed
            && record.status_reason.as_deref() == Some("idle_timeout");
        if !idle_ended {
            let _ = reply.send(refuse(format!(
                "session {id} is {} ({}); only sessions ended by idle timeout come back — start a new one",
                record.status,
                record.status_reason.as_deref().unwrap_or("no reason")
            )));
            return;
        }
        let allowed = caller.operator
            || caller.id == record.owner
            || self.args.settings.operators.contains(&caller.id);
        if !allowed {
            let _ = reply.send(Err(SupervisorError::Unauthorized {
                user: caller.id,
                session: id,
                owner: record.owner,
            }));
            return;
        }
        let max = self.args.settings.limits.max_sessions;
        if self.agent_sessions() >= max {
            let _ = reply.send(Err(SupervisorError::LimitReached { max }));
            return;
        }
        let store = self.args.store.clone();
        let _ = store
            .set_status(&id, SessionStatus::Starting, Some("revived"))
            .await;
        self.audit(&id, "session.revived", json!({"by": caller.id}))
            .await;
        let start = StartMode::Restart {
            resume: record.acp_session_id.clone(),
            reprompt: None,
            was_mid_turn: false,
            require_resume: false,
        };
        let (tx, rx) = oneshot::channel();
        let mut fresh = record.clone();
        fresh.status = SessionStatus::Starting;
        match self
            .spawn_session(fresh, profile.clone(), start, Some(tx))
            .await
        {
            Ok(actor) => {
                self.sessions.insert(
                    id.clone(),
                    Entry {
                        actor: Some(actor),
                        profile,
                        restarts: Vec::new(),
                        total_restarts: record.restart_count,
                        plan: None,
                        recovering: false,
                        first_start: false,
                    },
                );
                if let (Some(ch), Some(ts)) = (&record.channel_id, &record.thread_ts) {
                    threads::posted(&self.myself, &id, ch, ts);
                }
                answer_when_ready(store, record, rx, reply);
            }
            Err(err) => {
                let _ = store
                    .set_status(&id, SessionStatus::Completed, Some("idle_timeout"))
                    .await;
                let _ = reply.send(Err(SupervisorError::StartFailed(err)));
            }
        }
    }

    async fn begin_shutdown(&mut self, reply: RpcReplyPort<()>) {
        self.shutdown = Some(reply);
        for waiting in self.admission.drain() {
            let _ = waiting.reply.send(Err(SupervisorError::ShuttingDown));
        }
        let ids: Vec<SessionId> = self.sessions.keys().cloned().collect();
        for id in ids {
            let actor = self.sessions.get(&id).and_then(|e| e.actor.clone());
            match actor {
                Some(a) => {
                    let _ = a.send_message(SessionMsg::Stop {
                        cause: StopCause::Shutdown,
                        caller: Caller::local(),
                        reply: None,
                    });
                }
                None => {
                    self.end_session(&id, SessionStatus::Cancelled, "server_shutdown")
                        .await;
                }
            }
        }
        let grace =
            self.args.settings.limits.shutdown_grace() + TERM_TO_KILL + Duration::from_secs(1);
        self.myself
            .send_after(grace, || SupervisorMsg::ShutdownDeadline);
        self.check_shutdown_done();
    }

    fn check_shutdown_done(&mut self) {
        if self.sessions.is_empty()
            && let Some(reply) = self.shutdown.take()
        {
            let _ = reply.send(());
        }
    }
}

/// A new session's row: `starting`, titled by the first 80 characters of
/// `title`; an empty channel id means none.
fn new_record(
    workspace: String,
    cwd: &std::path::Path,
    agent: &str,
    protocol: Protocol,
    title: &str,
    owner: String,
    channel_id: Option<String>,
) -> SessionRecord {
    let now = now_ms();
    SessionRecord {
        id: SessionId::generate(),
        workspace,
        cwd: cwd.display().to_string(),
        agent: agent.to_owned(),
        protocol,
        status: SessionStatus::Starting,
        status_reason: None,
        title: title.chars().take(80).collect(),
        owner,
        acp_session_id: None,
        channel_id: channel_id.filter(|c| !c.is_empty()),
        thread_ts: None,
        restart_count: 0,
        created_at: now,
        updated_at: now,
        last_activity_at: now,
    }
}

/// Answers `reply` once the session's handshake finished (with the stored
/// record) or failed, off the supervisor's mailbox.
fn answer_when_ready(
    store: Arc<dyn SessionStore>,
    record: SessionRecord,
    ready: oneshot::Receiver<Result<(), StartError>>,
    reply: RpcReplyPort<Result<SessionRecord, SupervisorError>>,
) {
    tokio::spawn(async move {
        let outcome = match ready.await {
            Ok(Ok(())) => Ok(store
                .get_session(&record.id)
                .await
                .ok()
                .flatten()
                .unwrap_or(record)),
            Ok(Err(e)) => Err(SupervisorError::StartFailed(e)),
            Err(_) => Err(SupervisorError::StartFailed(StartError::Spawn(
                "the session stopped before its agent was ready".into(),
            ))),
        };
        let _ = reply.send(outcome);
    });
}

fn placeholder_entry(rec: &SessionRecord) -> Entry {
    Entry {
        actor: None,
        profile: AgentProfile {
            id: rec.agent.clone(),
            command: String::new(),
            args: vec![],
            env: vec![],
            protocol: rec.protocol,
            framing: Default::default(),
            auth_method: None,
        },
        restarts: Vec::new(),
        total_restarts: rec.restart_count,
        plan: None,
        recovering: true,
        first_start: false,
    }
}
