//! The JSON shapes of the HTTP API, shared by the server and `ctl`.
//!
//! These are the public wire format documented in `docs/api.md`; every
//! timestamp is an integer of Unix milliseconds. The server builds them from
//! the core's records; `ctl` deserialises them to render tables.

use intercom_actors::model::{
    Decision, PendingRequest, PermissionOption, Protocol, RequestKind, RequestStatus,
    SessionRecord, SessionStatus, TranscriptEntry,
};
use serde::{Deserialize, Serialize};

use crate::app::SessionDetail;

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `ok`.
    pub status: String,
    /// Live sessions.
    pub sessions: usize,
    /// `disabled`, `connected`, `reconnecting`, or `token_refused` (Socket
    /// Mode is up but Slack refuses the bot token for every post).
    pub slack: String,
    /// `ok`; `stale` when the last config edit was invalid (or applied in
    /// part); `held` while a saved edit waits for the file to settle before
    /// it is applied (it would loosen what the config allows).
    #[serde(default = "config_ok")]
    pub config: String,
    /// Why the config is stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_error: Option<String>,
    /// What a held edit changes, the reason it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_held: Option<String>,
    /// Why nothing can be stored (the database file was deleted or
    /// replaced under the running server); `status` is then `unavailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_error: Option<String>,
    /// Messages for the Slack gateway lost since the server started (its
    /// mailbox was gone; each is also logged). 0 without Slack.
    #[serde(default)]
    pub slack_dropped: u64,
    /// Messages Slack refused for good since the server started (a deleted
    /// channel, a revoked token, a message too long; each is logged and
    /// kept in the outbox marked failed). 0 without Slack.
    #[serde(default)]
    pub slack_refused: u64,
    /// Settings the config file changed that the running server applies
    /// only after a restart (`[server] bind`, `[database] path`, `[limits]`,
    /// ...); absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restart_needed: Vec<String>,
    /// How many warnings the config in force has (a missing agent binary or
    /// workspace directory: valid, but a start there fails); 0 when none.
    #[serde(default)]
    pub config_warnings: usize,
    /// Those warnings, to a caller with the API token (they name paths).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_warning_texts: Vec<String>,
}

fn config_ok() -> String {
    "ok".to_owned()
}

/// A session, as listed and returned by start/cancel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionView {
    /// `s-` and 16 hex digits.
    pub id: String,
    /// Workspace id, or the directory for `path` sessions.
    pub workspace: String,
    /// Agent profile id.
    pub agent: String,
    /// starting, active, stalled, completed, cancelled, crashed, error, interrupted.
    pub status: SessionStatus,
    /// Why it is in that status.
    pub status_reason: Option<String>,
    /// First 80 characters of the first prompt.
    pub title: String,
    /// Who started it (`local` for the API).
    pub owner: String,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub updated_at: i64,
    /// Unix ms of the last agent activity.
    pub last_activity_at: i64,
    /// Crash restarts so far.
    pub restart_count: u32,
    /// Directory the agent runs in.
    pub cwd: String,
    /// Wire protocol.
    pub protocol: Protocol,
    /// Slack channel, if any.
    pub channel_id: Option<String>,
    /// Slack thread root, if posted.
    pub thread_ts: Option<String>,
    /// Ended without anyone stopping it (idle timeout, server shutdown,
    /// crash, error, interruption): `POST /api/sessions/{id}/revive` may
    /// bring it back. The config as it is now may still refuse (its
    /// workspace, directory or agent gone, or its agent's protocol changed):
    /// the revive answers 409 saying why.
    #[serde(default)]
    pub revivable: bool,
}

impl From<SessionRecord> for SessionView {
    fn from(r: SessionRecord) -> Self {
        let revivable = r.revivable();
        SessionView {
            revivable,
            id: r.id.0,
            workspace: r.workspace,
            agent: r.agent,
            status: r.status,
            status_reason: r.status_reason,
            title: r.title,
            owner: r.owner,
            created_at: r.created_at,
            updated_at: r.updated_at,
            last_activity_at: r.last_activity_at,
            restart_count: r.restart_count,
            cwd: r.cwd,
            protocol: r.protocol,
            channel_id: r.channel_id,
            thread_ts: r.thread_ts,
        }
    }
}

/// What the running actor reports about a live session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveView {
    /// Whether a prompt turn is running.
    pub turn_running: bool,
    /// Paused by an operator: prompts and steering are held until resume.
    #[serde(default)]
    pub paused: bool,
    /// Steering messages waiting for the turn to end.
    pub queued_prompts: usize,
    /// The agent's process id (its process group id too).
    pub agent_pid: Option<i32>,
    /// The agent's name, from its `initialize` answer.
    pub agent_name: Option<String>,
    /// Context use and cost, as last reported by the agent (`usage_update`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageView>,
    /// The modes, models and config options the agent offers (switch them
    /// with `POST /api/sessions/{id}/agent-mode`).
    #[serde(default)]
    pub agent_options: intercom_actors::protocol::agent_options::AgentOptions,
}

/// Context use and cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageView {
    /// Tokens in context.
    pub used: u64,
    /// Context window size.
    pub size: u64,
    /// Cumulative cost, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// Its unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
}

/// `GET /api/sessions/{id}`: the session, its pending requests and, while
/// an agent is attached, the live view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionDetailView {
    /// The session.
    #[serde(flatten)]
    pub session: SessionView,
    /// The session's approval mode: `ask`, `auto-edits` or `auto` (set
    /// with `POST /api/sessions/{id}/mode`).
    #[serde(default = "ask")]
    pub approval_mode: String,
    /// Requests waiting for a decision.
    pub pending: Vec<ApprovalView>,
    /// Present while an agent process is attached.
    pub live: Option<LiveView>,
}

fn ask() -> String {
    "ask".to_owned()
}

impl From<SessionDetail> for SessionDetailView {
    fn from(d: SessionDetail) -> Self {
        SessionDetailView {
            session: d.record.into(),
            approval_mode: d.mode.as_str().to_owned(),
            pending: d
                .pending
                .into_iter()
                .map(|p| ApprovalView::new(p, None))
                .collect(),
            live: d.live.map(|s| LiveView {
                turn_running: s.turn_running,
                paused: s.paused,
                queued_prompts: s.queued.len(),
                agent_pid: s.pid,
                agent_name: s.agent.name,
                agent_options: s.agent_options,
                usage: s.usage.map(|u| UsageView {
                    used: u.used,
                    size: u.size,
                    cost: u.cost,
                    currency: u.currency,
                }),
            }),
        }
    }
}

/// One transcript entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageView {
    /// Increasing id (entries may be updated in place while they grow).
    pub id: i64,
    /// user, agent or system.
    pub role: String,
    /// text, plan, tool or error.
    pub kind: String,
    /// Text, or JSON for plan and tool entries.
    pub content: String,
    /// Unix ms.
    pub created_at: i64,
}

impl From<TranscriptEntry> for MessageView {
    fn from(e: TranscriptEntry) -> Self {
        MessageView {
            id: e.id,
            role: e.role.as_str().to_owned(),
            kind: e.kind.as_str().to_owned(),
            content: e.content,
            created_at: e.created_at,
        }
    }
}

/// An approval request (a permission, a gated file write, a forwarded prompt).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalView {
    /// Global id `<session_id>:<request_id>`; use it in `/api/approvals/{id}`.
    pub id: String,
    /// Owning session.
    pub session_id: String,
    /// Session-scoped id (`req-1`).
    pub request_id: String,
    /// One-line summary.
    pub title: String,
    /// The command an execute permission runs, whole (the title may be cut
    /// where it is shown; this is what the rules judged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// permission, file_write or forwarded_prompt.
    pub kind: RequestKind,
    /// Unified diff, for file writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
    /// Files concerned, when known.
    #[serde(default)]
    pub paths: Vec<String>,
    /// What the operator may choose.
    pub options: Vec<PermissionOption>,
    /// pending, decided, cancelled or expired.
    pub status: RequestStatus,
    /// Unix ms.
    pub created_at: i64,
    /// The decision, when decided (single-request answers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
}

impl ApprovalView {
    /// The view of a request and, when known, its decision.
    pub fn new(p: PendingRequest, decision: Option<Decision>) -> Self {
        ApprovalView {
            id: p.id,
            session_id: p.session_id.0,
            request_id: p.request_id,
            title: p.title,
            command: p.command,
            kind: p.kind,
            diff: p.diff,
            paths: p.paths,
            options: p.options,
            status: p.status,
            created_at: p.created_at,
            decision,
        }
    }
}

/// `POST /api/sessions/{id}/prompt` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptAccepted {
    /// True when it waits behind a running turn (or a pause).
    pub queued: bool,
    /// True when the session is paused: it is delivered after a resume.
    #[serde(default)]
    pub paused: bool,
}

/// The error body of every failed `/api` call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Human-readable message.
    pub error: String,
    /// Stable code: bad_request, unauthorized, not_found, forbidden,
    /// limit_reached, agent_start_failed, conflict, storage_error,
    /// unavailable, internal.
    pub code: String,
    /// The session's status, on conflicts about an ended session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SessionStatus>,
}
