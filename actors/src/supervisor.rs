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

use crate::model::{
    AuditEntry, Protocol, RequestStatus, Role, SessionId, SessionRecord, SessionStatus,
};
use crate::ports::{NoticeLevel, OperatorEvent, OperatorSink, SessionStore};
use crate::session::{
    Caller, SessionError, SessionExit, SessionMsg, SessionSettings, StartError, SteerOutcome,
    StopCause, TERM_TO_KILL,
};
use crate::settings::{AgentProfile, SupervisionPolicy};

mod admission;
pub mod directory;
mod operator;
mod recovery;
mod restarts;
mod starting;
pub mod threads;
pub use operator::{NoAnswer, OPERATOR_CALL, steer_session};
use restarts::RestartPlan;

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
    /// [`MAX_MCP_SESSIONS`] MCP client sessions are open.
    #[error(
        "{max} MCP client sessions are already open (the server's bound for MCP clients, apart from limits.max_sessions); close one (DELETE /mcp) or wait for idle ones to expire"
    )]
    McpLimitReached {
        /// The limit.
        max: usize,
    },
    /// The prompt was empty.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The agent did not start; no session record was kept.
    #[error("{0}")]
    StartFailed(StartError),
    /// The agent did not start, but steering sent during the start was
    /// stored with the session, so the session is kept (`error`) for it.
    #[error(
        "{error}; session {session} is kept (status error) with the steering sent while it started: revive it once the agent can start"
    )]
    StartFailedKept {
        /// The session kept.
        session: SessionId,
        /// Why the agent did not start.
        error: StartError,
    },
    /// Storage refused: what was asked was not done. The text is the
    /// store's own ("storage failed during <op>: ...").
    #[error("nothing was done: {0}{advice}", advice = crate::ports::storage_advice(.0))]
    Storage(String),
    /// The server is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The session was stopped before its agent was ready (its row is kept,
    /// `cancelled`): not the agent's failure.
    #[error("the session was stopped before its agent was ready")]
    StoppedBeforeReady,
    /// The session cannot be revived (explicitly stopped, unknown, live).
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
    /// The config was reloaded with these agent profiles: a live session
    /// whose profile changed is restarted with the new one next time (a
    /// crash, an operator's restart), as a recovery or a revive would be.
    AgentsChanged(Vec<AgentProfile>),
    /// Live sessions (including ones waiting to restart).
    LiveCount(RpcReplyPort<usize>),
    /// After a server restart: resume or interrupt sessions stored as live.
    Recover {
        /// The current config's workspaces and agent profiles: what a
        /// session may resume in.
        map: crate::registry::WorkspaceMap,
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
    /// Still in the start of a revive: how it had ended, which a failed
    /// start restores (so it can be revived again once the cause is fixed).
    reviving: Option<PriorEnd>,
}

/// How a revived session had ended: what it goes back to when the revive's
/// start fails.
#[derive(Debug, Clone)]
struct PriorEnd {
    status: SessionStatus,
    reason: String,
}

impl PriorEnd {
    fn of(record: &SessionRecord) -> PriorEnd {
        PriorEnd {
            status: record.status,
            reason: record.status_reason.clone().unwrap_or_default(),
        }
    }

    /// "ended by idle timeout" / "crashed": for the notice of a failed
    /// revive.
    fn describe(&self) -> String {
        if self.status == SessionStatus::Completed && self.reason == crate::model::IDLE_TIMEOUT {
            return "ended by idle timeout".into();
        }
        format!("{}", self.status)
    }
}

impl Entry {
    /// A session whose actor was just spawned for its first start.
    fn first_start(actor: ActorRef<SessionMsg>, profile: AgentProfile) -> Entry {
        Entry {
            first_start: true,
            ..Entry::revived(actor, profile, 0)
        }
    }

    /// A session that had run before (revived), now with a new actor.
    fn revived(actor: ActorRef<SessionMsg>, profile: AgentProfile, total_restarts: u32) -> Entry {
        Entry {
            actor: Some(actor),
            profile,
            restarts: Vec::new(),
            total_restarts,
            plan: None,
            recovering: false,
            first_start: false,
            reviving: None,
        }
    }

    /// A session stored as live by the previous server, to be restarted
    /// with `plan` (its actor comes with the restart).
    fn recovering(profile: AgentProfile, total_restarts: u32, plan: RestartPlan) -> Entry {
        Entry {
            actor: None,
            profile,
            restarts: Vec::new(),
            total_restarts,
            plan: Some(plan),
            recovering: true,
            first_start: false,
            reviving: None,
        }
    }
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

/// Whether ending a session says which queued steering it never delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Undelivered {
    Tell,
    Untold,
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
            SupervisorMsg::AgentsChanged(profiles) => state.agents_changed(&profiles),
            SupervisorMsg::LiveCount(reply) => {
                let _ = reply.send(state.sessions.len());
            }
            SupervisorMsg::Recover { map, reply } => {
                let counts = state.recover(map).await;
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
                    tracing::warn!(
                        left = state.sessions.len(),
                        "shutdown deadline passed; the sessions left are recorded as cancelled"
                    );
                    // Stored live, a session the stop could not finish (an
                    // agent that ignores SIGTERM, a descendant holding its
                    // pipes) came back at the next start: the one the
                    // operator most wanted gone.
                    let left: Vec<SessionId> = state.sessions.keys().cloned().collect();
                    for id in left {
                        state
                            .end_session(
                                &id,
                                SessionStatus::Cancelled,
                                crate::model::SERVER_SHUTDOWN,
                            )
                            .await;
                    }
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
                    // Lost with the actor: a new one (a bug, not a flood).
                    budget: Default::default(),
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

    /// [`Self::notice`], also kept in the session's transcript (what a
    /// reader of the session later needs to know).
    async fn notice_kept(&self, id: &SessionId, level: NoticeLevel, text: String) {
        keep_notice(&*self.args.store, &*self.args.sink, id, level, text).await;
    }

    /// Expires the session's open requests (nobody can answer them any
    /// more); returns their session-scoped ids (`req-1`, ...).
    async fn expire_open_requests(&self, id: &SessionId) -> Vec<String> {
        let store = &self.args.store;
        let Ok(open) = store.list_requests(Some(id), true).await else {
            return Vec::new();
        };
        let expired = open.iter().map(|r| r.request_id.clone()).collect();
        for r in open {
            let _ = store.close_request(&r.id, RequestStatus::Expired).await;
            self.args.sink.emit(OperatorEvent::RequestClosed {
                session_id: id.clone(),
                id: r.id,
                status: RequestStatus::Expired,
                decision: None,
            });
        }
        expired
    }

    /// Marks a session ended for good and forgets it; says which queued
    /// steering it never delivered.
    async fn end_session(&mut self, id: &SessionId, status: SessionStatus, reason: &str) {
        self.end_session_with(id, status, reason, Undelivered::Tell)
            .await;
    }

    /// Says which queued steering an ended session never delivered.
    async fn tell_undelivered(&self, id: &SessionId, revivable: bool) {
        match self.args.store.undelivered_steering(id).await {
            Ok(queued) => {
                let texts: Vec<&str> = queued.iter().map(|s| s.text.as_str()).collect();
                if let Some(text) = crate::session::turns::undelivered_notice(&texts, revivable) {
                    self.notice_kept(id, NoticeLevel::Warning, text).await;
                }
            }
            Err(e) => tracing::warn!(session = %id, "cannot read queued steering: {e}"),
        }
    }

    /// [`Self::end_session`], telling the undelivered steering or not (a
    /// failed revive puts a session back as it had ended, which told it).
    async fn end_session_with(
        &mut self,
        id: &SessionId,
        status: SessionStatus,
        reason: &str,
        undelivered: Undelivered,
    ) {
        self.sessions.remove(id);
        self.bridge_tokens.retain(|_, s| s != id);
        let store = self.args.store.clone();
        if let Err(e) = store.set_status(id, status, Some(reason)).await {
            tracing::error!(session = %id, "status write failed: {e}");
        }
        self.expire_open_requests(id).await;
        if undelivered == Undelivered::Tell {
            self.tell_undelivered(id, crate::model::revivable_end(status, Some(reason)))
                .await;
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

    async fn stop(
        &mut self,
        id: SessionId,
        caller: Caller,
        reply: RpcReplyPort<Result<bool, crate::session::SessionError>>,
    ) {
        let entry = self.sessions.get(&id);
        if let Some(actor) = entry.and_then(|e| e.actor.clone()) {
            // The actor checks the caller and answers.
            let _ = actor.send_message(SessionMsg::Stop {
                cause: StopCause::Operator,
                caller,
                reply: None,
            });
            let _ = reply.send(Ok(true));
            return;
        }
        let record = self.args.store.get_session(&id).await.ok().flatten();
        // Not ours and not live: nothing to stop. Stored live but unknown
        // here, it has no agent and never will (a start whose storage failed
        // half-way, on a full disk): a probe's stop answered "stopping" for
        // ever. It is ended like one waiting for a restart.
        if entry.is_none() && !record.as_ref().is_some_and(|r| r.status.is_live()) {
            let _ = reply.send(Ok(false));
            return;
        }
        // No actor to ask, so check the owner here.
        let owner = record.map(|r| r.owner).unwrap_or_default();
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
                    self.end_session(&id, SessionStatus::Cancelled, crate::model::SERVER_SHUTDOWN)
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

/// A notice told to the operator and kept in the session's transcript, for
/// whoever holds the store and the sink (the supervisor, or a start's task).
pub async fn keep_notice(
    store: &dyn SessionStore,
    sink: &dyn OperatorSink,
    id: &SessionId,
    level: NoticeLevel,
    text: String,
) {
    let kind = level.message_kind();
    if let Err(e) = store.append_message(id, Role::System, kind, &text).await {
        tracing::warn!(session = %id, "keeping a notice in the transcript: {e}");
    }
    sink.emit(OperatorEvent::Notice {
        session_id: id.clone(),
        level,
        text,
    });
}
