//! The SessionActor: one per session, owner of everything about it.
//!
//! The child process, the JSON-RPC id counter, outstanding requests in both
//! directions, the owner, the turn, the steering queue and the stall and idle
//! clocks are fields of [`SessionState`], changed only by [`SessionMsg`]s.
//! The file is split by concern: [`handshake`] (initialize, auth, new/load),
//! [`inbound`] (what the agent sends), [`requests`] (operator decisions),
//! [`turns`] (prompts and steering), [`lifecycle`] (timers, stop, crash),
//! [`calls`] (the calls front ends make into a session), [`state`] (building
//! the state and the helpers every handler shares).

mod agent_settings;
mod budget;
pub mod calls;
mod dialect;
mod errors;
mod files;
mod flood;
mod handshake;
mod inbound;
mod ledger;
mod lifecycle;
mod mcp;
mod noise;
mod requests;
mod rules;
mod state;
mod toolcalls;
pub(crate) mod turns;
mod updates;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;
use tokio::sync::oneshot;

use crate::child::{AgentChild, ChildEvent, ChildSpec, SpawnError};
use crate::model::{
    AuditEntry, Decided, PendingRequest, Protocol, SessionId, SessionRecord, SessionStatus,
    Steering,
};
use crate::ports::{OperatorEvent, OperatorSink, SessionStore};
use crate::protocol::acp::{AgentInfo, McpHttpServer};
use crate::protocol::intercom::DialectWriter;
use crate::protocol::jsonrpc::RpcId;
use crate::rules::ApprovalMode;
use crate::settings::{AgentProfile, Limits, StallPolicy};
use crate::supervisor::SupervisorMsg;

pub use budget::TurnBudget;
pub use errors::{SessionError, StartError};
pub use toolcalls::COMMAND_TITLE_MARK;
pub(crate) use turns::undelivered_notice;

/// How often the actor checks its clocks (stall, idle, prompt timeout).
pub const TICK: Duration = Duration::from_millis(250);
/// Between SIGTERM and SIGKILL when stopping an agent.
pub const TERM_TO_KILL: Duration = Duration::from_secs(2);
/// Agent activity bumps `last_activity_at` at most this often (operator
/// actions always do).
const TOUCH_EVERY: Duration = Duration::from_secs(5);

/// Who is acting on a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// User id (Slack id, `local`, `rule:<id>`, `system`).
    pub id: String,
    /// Configured operators may act on any session.
    pub operator: bool,
}

impl Caller {
    /// The local operator (the token-authenticated API, the server itself).
    pub fn local() -> Self {
        Caller {
            id: "local".into(),
            operator: true,
        }
    }
}

/// What the operator chose on a pending request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// A specific option id.
    Option(String),
    /// The first allow option.
    Approve,
    /// The first reject option.
    Reject,
}

/// How a session should start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartMode {
    /// A new session with its first prompt, stored as the session's first
    /// steering with its row: a start cut by a crash or a shutdown still
    /// has it to deliver when the session is revived.
    Fresh {
        /// The first prompt.
        first: crate::model::Steering,
    },
    /// An MCP client attached: no child process, no first prompt.
    Attached,
    /// A restart after a crash, an operator's restart, a server restart,
    /// or a revive after idle timeout.
    Restart {
        /// The agent's session id to resume, when there is one.
        resume: Option<String>,
        /// Prompt to re-send when the agent must start fresh (the interrupted turn's).
        reprompt: Option<String>,
        /// Whether a turn was running when the agent went away.
        was_mid_turn: bool,
        /// Fail instead of starting fresh when the agent cannot resume
        /// (server restart recovery: better `interrupted` than amnesiac).
        require_resume: bool,
        /// An operator brought back a session that ended by idle timeout
        /// (said so to the operator; the supervisor audits the revive).
        revived: bool,
        /// What the agent wrote since the last prompt, carried over a
        /// restart nobody asked for (`None`: a new budget).
        budget: Option<TurnBudget>,
    },
}

/// Result of a steering request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SteerOutcome {
    /// True when it waits behind a running turn (or a pause).
    pub queued: bool,
    /// True when the session is paused: it waits for a resume, not for a
    /// turn to end.
    pub paused: bool,
    /// The stored steering row.
    pub steering_id: i64,
}

/// A point-in-time view of a session, for the API.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSnapshot {
    /// Status.
    pub status: SessionStatus,
    /// Whether a turn is running.
    pub turn_running: bool,
    /// Pending requests.
    pub pending: Vec<PendingRequest>,
    /// Steering waiting for the turn to end.
    pub queued: Vec<Steering>,
    /// The agent's capabilities, once known.
    pub agent: AgentInfo,
    /// The agent's process id.
    pub pid: Option<i32>,
    /// Approval mode.
    pub mode: ApprovalMode,
    /// Paused by an operator (steering is held).
    pub paused: bool,
    /// The agent's last reported context use and cost.
    pub usage: Option<crate::protocol::acp::Usage>,
    /// The modes, models and options the agent offers.
    pub agent_options: crate::protocol::agent_options::AgentOptions,
    /// The last progress an MCP client reported with `ping`
    /// (`status_message`, `progress_snapshot`, `at`).
    pub last_progress: Option<serde_json::Value>,
}

/// Final outcome a session reports to its supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionExit {
    /// Ended on purpose (stop, idle timeout, shutdown); no restart.
    Finished(SessionStatus),
    /// The agent died unexpectedly; the supervisor decides on a restart.
    Crashed {
        /// Exit description and stderr tail.
        reason: String,
        /// The agent's session id, for `session/load`.
        acp_session: Option<String>,
        /// The prompt of the turn that was running.
        interrupted_prompt: Option<String>,
        /// Whether a turn was running.
        mid_turn: bool,
        /// What the agent wrote since the last prompt: the restart keeps it.
        budget: TurnBudget,
    },
    /// An operator asked for a restart and the agent was killed for it:
    /// respawned at once (no backoff, outside the crash budget), resumed
    /// like after a crash.
    RestartRequested {
        /// Who asked.
        by: String,
        /// The agent's session id, for `session/load`.
        acp_session: Option<String>,
        /// The prompt of the turn that was running.
        interrupted_prompt: Option<String>,
        /// Whether a turn was running.
        mid_turn: bool,
        /// What the agent wrote since the last prompt, when the server
        /// asked for the restart itself (an ignored cancel): nobody acted,
        /// so the restarted agent does not get a new budget.
        budget: Option<TurnBudget>,
    },
    /// Never got going.
    StartFailed(StartError),
}

/// Why a session is being stopped on purpose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopCause {
    /// An operator asked.
    Operator,
    /// Nothing happened for `idle_timeout`.
    IdleTimeout,
    /// The server is shutting down.
    Shutdown,
    /// The MCP client went away.
    Disconnected,
    /// The agent finished its work and exited 0 (no turn running, nothing
    /// pending, nothing queued for it).
    AgentFinished,
}

impl StopCause {
    fn final_status(&self) -> (SessionStatus, &'static str) {
        match self {
            StopCause::Operator => (SessionStatus::Cancelled, "stopped by operator"),
            StopCause::IdleTimeout => (SessionStatus::Completed, crate::model::IDLE_TIMEOUT),
            StopCause::Shutdown => (SessionStatus::Cancelled, crate::model::SERVER_SHUTDOWN),
            StopCause::Disconnected => (SessionStatus::Completed, "client_disconnected"),
            StopCause::AgentFinished => (SessionStatus::Completed, "agent_finished"),
        }
    }
}

pub use mcp::{McpAnswer, McpCall};

/// Messages a SessionActor handles.
pub enum SessionMsg {
    /// A tool call from an MCP client bound to this session.
    Mcp(McpCall),
    /// Something from the agent process.
    Child(ChildEvent),
    /// The clock ticked.
    Tick,
    /// Marking a delivered steering message delivered failed: keep it for
    /// the retry, or a revive would deliver it again.
    DeliveryNotMarked {
        /// The steering message.
        steering_id: i64,
    },
    /// A queued write of the agent's text failed: keep it for the retry.
    TextNotStored {
        /// The entry it was to extend, if any.
        message_id: Option<i64>,
        /// The whole text block.
        text: String,
    },
    /// One of the agent's file reads finished (it ran off the actor, so a
    /// slow file never holds decisions, steering or a stop).
    FileRead {
        /// The agent's request.
        id: crate::protocol::jsonrpc::RpcId,
        /// The path the agent named.
        path: String,
        /// The content, or why not.
        result: Result<String, crate::workspace_fs::FsError>,
    },
    /// The startup deadline passed.
    StartupDeadline,
    /// Escalate a stop: 0 = SIGTERM, 1 = SIGKILL.
    KillDue(u8),
    /// The operator decides on a pending request.
    Decide {
        /// Session-scoped request id (`req-1`).
        request_id: String,
        /// What was chosen.
        choice: Choice,
        /// Reason / feedback / refine instruction.
        reason: Option<String>,
        /// Who.
        caller: Caller,
        /// The recorded decision, with the request it closed.
        reply: RpcReplyPort<Result<Decided, SessionError>>,
    },
    /// The operator steers the agent.
    Steer {
        /// The instruction.
        text: String,
        /// Cancel the running turn first.
        interrupt: bool,
        /// Who.
        caller: Caller,
        /// Whether it was queued.
        reply: RpcReplyPort<Result<SteerOutcome, SessionError>>,
    },
    /// Pause: cancel the running turn and hold steering until resumed.
    Pause {
        /// Who.
        caller: Caller,
        /// Done.
        reply: RpcReplyPort<Result<(), SessionError>>,
    },
    /// Resume a paused session: deliver held steering or continue.
    Resume {
        /// Who.
        caller: Caller,
        /// Done.
        reply: RpcReplyPort<Result<(), SessionError>>,
    },
    /// Nudge the agent now.
    Nudge {
        /// Who.
        caller: Caller,
        /// Done.
        reply: RpcReplyPort<Result<(), SessionError>>,
    },
    /// Stop the session gracefully.
    Stop {
        /// Why.
        cause: StopCause,
        /// Who.
        caller: Caller,
        /// Answered when the stop has begun (not when the agent is gone).
        reply: Option<RpcReplyPort<Result<(), SessionError>>>,
    },
    /// Kill the agent's process group and have the supervisor respawn it
    /// in the same session (resumed like after a crash).
    Restart {
        /// Who.
        caller: Caller,
        /// Answered once the agent was told to go.
        reply: RpcReplyPort<Result<(), SessionError>>,
    },
    /// Tests: panic inside the actor (to prove the agent goes with it).
    #[cfg(feature = "test-hooks")]
    PanicForTest,
    /// Current state.
    Snapshot(RpcReplyPort<SessionSnapshot>),
    /// Change the approval mode (persisted; re-applied after restarts).
    SetMode {
        /// The new mode.
        mode: ApprovalMode,
        /// Who.
        caller: Caller,
        /// Done.
        reply: RpcReplyPort<Result<(), SessionError>>,
    },
    /// The rule set changed: re-evaluate pending requests.
    RulesChanged,
    /// Switch the agent's own mode, model or config option.
    SetAgentOption {
        /// What to switch.
        setting: crate::protocol::agent_options::AgentSetting,
        /// Who.
        caller: Caller,
        /// Answered once the agent answered.
        reply: RpcReplyPort<Result<(), SessionError>>,
    },
}

/// Shared, read-only settings for sessions.
#[derive(Debug, Clone, Default)]
pub struct SessionSettings {
    /// Limits.
    pub limits: Limits,
    /// Stall policy.
    pub stall: StallPolicy,
    /// User ids that may act on any session.
    pub operators: HashSet<String>,
    /// Approval rules (config + operator rules), shared and hot-swapped.
    pub rules: crate::rules::SharedRules,
    /// The server's own files: refused to agents, never decided automatically.
    pub server_files: crate::workspace_fs::ServerFiles,
}

/// Everything a SessionActor starts from.
pub struct SessionArgs {
    /// The stored record (already persisted by the supervisor).
    pub record: SessionRecord,
    /// The agent profile.
    pub profile: AgentProfile,
    /// Settings.
    pub settings: Arc<SessionSettings>,
    /// Storage.
    pub store: Arc<dyn SessionStore>,
    /// Operator events.
    pub sink: Arc<dyn OperatorSink>,
    /// How to start.
    pub start: StartMode,
    /// MCP servers to hand the agent (the ACP-MCP bridge).
    pub mcp_servers: Vec<McpHttpServer>,
    /// Told once the handshake finished or failed.
    pub ready: Option<oneshot::Sender<Result<(), StartError>>>,
    /// Told how the session ended.
    pub supervisor: Option<ActorRef<SupervisorMsg>>,
}

/// How long after a `session/load` answer updates streamed outside a turn
/// are taken for replayed history (Gemini CLI replays at once).
const REPLAY_TAIL: std::time::Duration = std::time::Duration::from_secs(3);

/// How many oversized tool call announcements a session remembers.
const OVERSIZED_TOOLS_KEPT: usize = 64;

/// Where the handshake is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Initializing,
    Authenticating,
    Opening,
    Ready,
    Stopping,
    Ended,
}

/// What one of our outgoing requests was for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outgoing {
    Initialize,
    Authenticate,
    NewSession,
    LoadSession { method: &'static str },
    Prompt,
    SetOption(crate::protocol::agent_options::AgentSetting),
}

/// A request from the agent waiting for the operator.
#[derive(Debug, Clone)]
struct Pending {
    /// Session-scoped number (`req-N`).
    number: u64,
    record: PendingRequest,
    /// The JSON-RPC id to answer (ACP) or dialect id.
    wire: RpcId,
    /// For gated writes: what the agent asked to write, and where.
    write: Option<files::AskedWrite>,
    /// Rule facts (ACP tool kind, command) when approval rules govern it.
    governed: Option<(Option<String>, Option<String>)>,
    /// For permissions: the edits the tool call announced when we asked.
    announced: Option<toolcalls::Announced>,
    /// The option the server added because the agent offered no way to
    /// say no ([`requests::add_reject_if_missing`]): choosing it answers
    /// the agent `cancelled`.
    cancel_option: Option<String>,
}

/// A running prompt turn.
#[derive(Debug, Clone)]
struct Turn {
    rpc_id: i64,
    prompt: String,
    /// Since when the agent has had the turn to itself: its start, or the
    /// last moment it waited for the operator (the prompt timeout counts
    /// only the agent's own time).
    agent_since: Instant,
    timeout_noted: bool,
    /// When a watched cancel was sent (an interrupt, a nudge, a pause), if
    /// one was: the agent has the shutdown grace to end the turn.
    cancelled_at: Option<Instant>,
    /// The operator gave this turn up for their steering (an interrupt): a
    /// fresh agent after a crash is not given it again.
    superseded: bool,
    /// The tool calls this turn announced (their first transcript line was
    /// written during it), at most [`updates::TURN_TOOLS`]: a cancel marks
    /// the unfinished ones cancelled.
    tools: Vec<String>,
}

/// Agent text being aggregated for the current turn.
#[derive(Debug)]
struct TextBuffer {
    text: String,
    message_id: Option<i64>,
    /// Bytes of `text` already in the stored entry (flushes append the rest).
    stored: usize,
    /// Agent text received this turn (against `limits.max_turn_text_bytes`).
    turn_bytes: usize,
    /// Tool call lines written to the transcript this turn (against
    /// `inbound::TOOL_BYTES_PER_TURN`).
    tool_bytes: usize,
    /// The cap was hit this turn: further text is dropped.
    truncated: bool,
    dirty: bool,
    flushed_at: Instant,
    /// [`SessionState::entries_written`] when this block began: a notice
    /// written since ends the block, so the agent's later text is not
    /// appended above it.
    began_at_entry: u64,
}

impl Default for TextBuffer {
    fn default() -> Self {
        TextBuffer {
            text: String::new(),
            message_id: None,
            stored: 0,
            turn_bytes: 0,
            tool_bytes: 0,
            truncated: false,
            dirty: false,
            began_at_entry: 0,
            flushed_at: Instant::now(),
        }
    }
}

#[derive(Debug, Default)]
struct Stall {
    alerted_at: Option<Instant>,
    last_nudge: Option<Instant>,
}

/// The actor's state: everything about one session.
pub struct SessionState {
    myself: ActorRef<SessionMsg>,
    record: SessionRecord,
    profile: AgentProfile,
    settings: Arc<SessionSettings>,
    store: Arc<dyn SessionStore>,
    /// The way out for chatter writes and every operator event, in order.
    ledger: ledger::Ledger,
    supervisor: Option<ActorRef<SupervisorMsg>>,
    start: StartMode,
    mcp_servers: Vec<McpHttpServer>,
    ready: Option<oneshot::Sender<Result<(), StartError>>>,

    /// The workspace as a directory handle (or why it could not be opened).
    workspace: Result<Arc<crate::workspace_fs::WorkspaceFs>, crate::workspace_fs::FsError>,
    child: Option<AgentChild>,
    exited: bool,
    phase: Phase,
    status: SessionStatus,
    mode: ApprovalMode,
    paused: bool,
    agent: AgentInfo,
    acp_session: Option<String>,
    auth_tried: bool,
    pending_failure: Option<StartError>,
    replaying: bool,
    /// After a `session/load` answer, until the next prompt, the agent's
    /// first request or [`REPLAY_TAIL`] has passed: what the agent streams
    /// while no turn runs is history it replays late (Gemini CLI sends it
    /// after its answer), never new work.
    replay_tail_until: Option<std::time::Instant>,
    /// Tool calls whose announcement was over `max_line_bytes` (newest
    /// last, at most [`OVERSIZED_TOOLS_KEPT`]): a permission for one says
    /// its change could not be shown, instead of showing no diff silently.
    oversized_tools: std::collections::VecDeque<String>,
    replayed: usize,
    /// Lines on stdout that were not JSON-RPC, and the start of the first
    /// (bounded): a start that times out names them (a CLI started without
    /// its ACP flag prints its usage there).
    unreadable_lines: (u64, Option<String>),
    dialect: DialectWriter,

    next_rpc_id: i64,
    outgoing: HashMap<i64, Outgoing>,
    pending: BTreeMap<u64, Pending>,
    next_request: u64,
    turn: Option<Turn>,
    /// The intercom dialect has no turns: the last prompt it was given, to
    /// give again to a fresh agent after a crash.
    dialect_prompt: Option<String>,
    reprompt_after_cancel: Option<String>,
    /// A turn cut short by a pause, or by a crash while paused: what the
    /// resume does about it ([`turns::CutTurn`]).
    resume_turn: Option<turns::CutTurn>,
    /// A hash of the status, activity and reason last shown to the
    /// operator: the same twice in a row is not shown again.
    last_shown: std::sync::atomic::AtomicU64,
    queue: VecDeque<Steering>,
    /// Steering written to the agent's stdin but not yet confirmed written,
    /// by write token: it becomes delivered on [`ChildEvent::Written`] and
    /// stays undelivered (in storage) when the write fails.
    in_flight: BTreeMap<u64, Steering>,
    next_write_token: u64,
    /// The agent's descendants (pid, start time) when a graceful stop
    /// began, killed once the agent exited ([`crate::process_tree`]).
    stop_snapshot: Vec<(i32, u64)>,
    /// Why agent-intercom killed the agent, told with the exit that follows.
    kill_reason: Option<String>,
    /// Who asked for the restart the agent is being killed for.
    restart_by: Option<String>,
    mcp_waiters: HashMap<u64, oneshot::Sender<McpAnswer>>,
    standby: Option<oneshot::Sender<Option<String>>>,
    text: TextBuffer,
    /// The agent's reasoning since its last text, stored and shown whole
    /// when its text (or a request, or the turn's end) follows.
    thought: String,
    /// The agent's last `usage_update`.
    usage: Option<crate::protocol::acp::Usage>,
    /// What the agent offers to switch (modes, models, options).
    agent_options: crate::protocol::agent_options::AgentOptions,
    /// The last progress an MCP client reported with `ping`.
    last_progress: Option<serde_json::Value>,
    /// Operators waiting for the agent to answer a switch, by request id.
    setting_waiters: HashMap<i64, RpcReplyPort<Result<(), SessionError>>>,
    /// Agent text whose transcript write failed, retried every tick.
    unstored_text: Vec<(Option<i64>, String)>,
    /// Steering delivered whose delivered mark did not store (a full disk):
    /// retried every tick.
    unmarked: Vec<i64>,
    /// Tool call lines: their transcript row and what they show.
    tools: HashMap<String, (ledger::RowId, Value)>,
    /// Notes other than the operator's prompts written to the transcript
    /// ([`SessionState::note`]), counted to keep the transcript in the
    /// order things happened.
    entries_written: std::sync::atomic::AtomicU64,
    /// What the agent made the session write since the last prompt.
    budget: budget::TurnBudget,
    /// Merged tool-call state and allowed edits (one decision per change).
    toolcalls: toolcalls::ToolCalls,
    plan_message: ledger::RowId,
    /// Inbound frames in the current one-second window (flood detection).
    rate: flood::FloodMeter,
    /// Warnings about what the agent sent wrong, rate-limited.
    noise: noise::NoiseLog,
    /// The rate limit of refused file calls shown to the operator (audit
    /// row and notice): the agent decides how many it makes.
    refusals: noise::NoiseLog,
    /// The rate limit of notices about automatic decisions.
    auto_notices: noise::NoiseLog,
    /// One permit per file operation of this session running on the
    /// blocking pool (`files::OPS_IN_FLIGHT`), held by the operation until
    /// it really ends, past its timeout too.
    fs_slots: std::sync::Arc<tokio::sync::Semaphore>,
    /// Tool calls changed while flooded, persisted on the next tick.
    dirty_tools: HashSet<String>,
    /// The latest plan while flooded, persisted on the next tick.
    pending_plan: Option<Vec<(String, String)>>,
    /// The agent's latest usage is not shown yet (coalesced while flooded).
    usage_unsent: bool,

    last_inbound: Instant,
    last_any: Instant,
    /// When `last_activity_at` was last written.
    touched_at: Option<Instant>,
    stall: Stall,
    stopping: Option<StopCause>,
    stream_closed_at: Option<Instant>,
    /// The operator was told once that requests past the cap are refused.
    over_request_cap_noted: bool,
}

/// The SessionActor handler (stateless; see [`SessionState`]).
pub struct SessionActor;

impl Actor for SessionActor {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SessionMsg>,
        args: SessionArgs,
    ) -> Result<SessionState, ActorProcessingErr> {
        let mut state = SessionState::new(myself.clone(), args);
        state.load_queued_steering().await;
        // An operator's pause outlives agent and server restarts.
        state.paused = state
            .store
            .is_paused(&state.record.id)
            .await
            .unwrap_or_else(|e| {
                tracing::error!(session = %state.record.id, "reading the pause: {e}");
                false
            });
        state.mode = state
            .store
            .approval_mode(&state.record.id)
            .await
            .unwrap_or_default();
        myself.send_interval(TICK, || SessionMsg::Tick);
        if state.record.protocol == Protocol::Mcp {
            // An MCP client is the agent: nothing to spawn.
            state.exited = true;
            return Ok(state);
        }
        let spec = ChildSpec {
            profile: state.profile.id.clone(),
            command: state.profile.command.clone(),
            args: state.profile.args.clone(),
            cwd: PathBuf::from(&state.record.cwd),
            env_passthrough: state.profile.env.clone(),
            framing: state.profile.framing,
            max_frame: state.settings.limits.max_line_bytes,
            max_backlog: crate::child::stdin_backlog_for(state.settings.limits.max_read_bytes),
        };
        let me = myself.clone();
        match AgentChild::spawn(&spec, move |ev| {
            let _ = me.send_message(SessionMsg::Child(ev));
        }) {
            Ok(child) => {
                let pid = child.pid();
                if let Some(start) = crate::child::start_time(pid) {
                    // Queued: only a later server start reads it (to stop an
                    // agent a crashed server left behind).
                    let (store, id) = (Arc::clone(&state.store), state.record.id.clone());
                    state.ledger.queue(async move {
                        if let Err(e) = store.set_agent_process(&id, Some((pid, start))).await {
                            tracing::warn!(session = %id, "cannot record the agent's pid: {e}");
                        }
                    });
                }
                state.child = Some(child);
            }
            Err(e) => {
                let err = StartError::Spawn(e.to_string());
                if let SpawnError::NotFound { .. } = e {
                    tracing::error!(session = %state.record.id, "{err}");
                }
                // The supervisor learns this from the failed spawn itself;
                // a report as well would schedule a second restart.
                state.supervisor = None;
                state.fail_start(err.clone()).await;
                return Err(Box::new(err));
            }
        }
        myself.send_after(state.settings.limits.startup_timeout(), || {
            SessionMsg::StartupDeadline
        });
        Ok(state)
    }

    async fn post_start(
        &self,
        _myself: ActorRef<SessionMsg>,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        state.begin_handshake().await;
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<SessionMsg>,
        msg: SessionMsg,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SessionMsg::Child(ev) => state.on_child_event(ev).await,
            SessionMsg::Mcp(call) => state.on_mcp(call).await,
            SessionMsg::Tick => state.on_tick().await,
            SessionMsg::TextNotStored { message_id, text } => {
                state.unstored_text.push((message_id, text));
            }
            SessionMsg::DeliveryNotMarked { steering_id } => state.unmarked.push(steering_id),
            SessionMsg::FileRead { id, path, result } => {
                state.fs_read_done(id, path, result).await;
            }
            SessionMsg::StartupDeadline => state.on_startup_deadline().await,
            SessionMsg::KillDue(stage) => state.on_kill_due(stage),
            SessionMsg::Decide {
                request_id,
                choice,
                reason,
                caller,
                reply,
            } => {
                let r = state.decide(&request_id, choice, reason, &caller).await;
                state.touch_if(r.is_ok(), true);
                let _ = reply.send(r);
            }
            SessionMsg::Steer {
                text,
                interrupt,
                caller,
                reply,
            } => {
                let r = state.steer(text, interrupt, &caller).await;
                state.touch_if(r.is_ok(), true);
                let _ = reply.send(r);
            }
            SessionMsg::Pause { caller, reply } => {
                let r = state.pause(&caller).await;
                state.touch_if(r.is_ok(), true);
                let _ = reply.send(r);
            }
            SessionMsg::Resume { caller, reply } => {
                let r = state.resume(&caller).await;
                state.touch_if(r.is_ok(), true);
                let _ = reply.send(r);
            }
            SessionMsg::Nudge { caller, reply } => {
                let r = state.operator_nudge(&caller).await;
                let _ = reply.send(r);
            }
            SessionMsg::Stop {
                cause,
                caller,
                reply,
            } => {
                let r = state.request_stop(cause, &caller).await;
                if let Some(reply) = reply {
                    let _ = reply.send(r);
                }
            }
            SessionMsg::Restart { caller, reply } => {
                let r = state.restart_requested(&caller).await;
                let _ = reply.send(r);
            }
            #[cfg(feature = "test-hooks")]
            SessionMsg::PanicForTest => panic!("session actor panicked on request (test hook)"),
            SessionMsg::Snapshot(reply) => {
                let _ = reply.send(state.snapshot());
            }
            SessionMsg::SetMode {
                mode,
                caller,
                reply,
            } => {
                let r = state.set_mode(mode, &caller).await;
                state.touch_if(r.is_ok(), true);
                let _ = reply.send(r);
            }
            SessionMsg::RulesChanged => state.reapply_rules().await,
            SessionMsg::SetAgentOption {
                setting,
                caller,
                reply,
            } => state.set_agent_option(setting, &caller, reply).await,
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<SessionMsg>,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        // Never leave a process group behind, whatever path got us here.
        if let Some(child) = &state.child {
            child.kill();
        }
        // Whoever learns that the session stopped can read all it wrote.
        state.ledger.settle().await;
        Ok(())
    }
}
