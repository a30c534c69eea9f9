//! The ports: what the core needs from the outside world, as traits.
//!
//! The actors never name SQLite or Slack. They persist through [`SessionStore`]
//! and tell the operator side what happened through [`OperatorSink`]. The edges
//! (`src/storage`, the Slack gateway, the HTTP API) implement these; tests use
//! the in-memory versions in [`crate::memory`].

use crate::model::{
    AuditEntry, Decision, MessageKind, PendingRequest, RequestStatus, Role, SessionId,
    SessionRecord, SessionStatus, Steering, TranscriptEntry,
};
use crate::rules::ApprovalMode;
use crate::transcript::{TranscriptPage, TranscriptSlice};
use async_trait::async_trait;
use serde::Serialize;

tokio::task_local! {
    /// Set while a store write runs as chatter (see [`chatter`]).
    static CHATTER: bool;
}

/// Runs the store writes of `work` as *chatter*: writes nobody waits on
/// soon (transcript text, tool call lines, activity touches). A store may
/// hold such a write back for a moment so that it shares the transaction
/// of the next write somebody does wait for, instead of making a commit of
/// its own; it still commits in order with the caller's other writes, and
/// its future still ends only once it committed.
pub fn chatter<F: std::future::Future>(work: F) -> impl std::future::Future<Output = F::Output> {
    CHATTER.scope(true, work)
}

/// Runs the store writes of `work` as awaited ones even inside
/// [`chatter`]: for a write that something queued after it waits on.
pub fn awaited<F: std::future::Future>(work: F) -> impl std::future::Future<Output = F::Output> {
    CHATTER.scope(false, work)
}

/// True while the current task runs a write inside [`chatter`].
pub fn is_chatter() -> bool {
    CHATTER.try_with(|c| *c).unwrap_or(false)
}

/// A storage failure, with the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The row that the operation needs does not exist.
    #[error("{what} not found")]
    NotFound {
        /// What was looked up, e.g. `session s-1234`.
        what: String,
    },
    /// The request was already decided, cancelled or expired.
    #[error("request {id} is already {status}")]
    AlreadyResolved {
        /// Global request id.
        id: String,
        /// Its current status.
        status: String,
    },
    /// The database refused or failed; the message says which operation.
    #[error("storage failed during {op}: {message}")]
    Backend {
        /// The operation, e.g. `insert session`.
        op: &'static str,
        /// The driver's message.
        message: String,
    },
}

/// What to add after a storage failure's message: nothing when it carries
/// its own advice (a database file replaced under the server says to
/// restart it, and "retry" after it contradicted that), else to check the
/// database and retry.
pub fn storage_advice(message: &str) -> &'static str {
    if message.contains("restart the server") {
        ""
    } else {
        "; check the database (disk space, permissions) and retry"
    }
}

/// What `check_clearance` recorded about a change's target files, so the
/// approved change can be applied (once, and only while the files are as
/// they were) even after a server restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clearance {
    /// Global request id (`<session>:req-N`).
    pub request_id: String,
    /// The session that asked for it.
    pub session_id: SessionId,
    /// Each target file (workspace-relative) and its SHA-256 when clearance
    /// was asked (`None`: it did not exist).
    pub files: Vec<(String, Option<[u8; 32]>)>,
    /// When the change was applied (Unix ms), if it was.
    pub applied_at: Option<i64>,
}

/// Everything the core persists. Implementations must be safe to call from
/// many actors at once; a write returns only once it is durable.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Inserts a new session row.
    async fn create_session(&self, rec: &SessionRecord) -> Result<(), StoreError>;
    /// Deletes a session that never started (startup failure: no row left behind).
    async fn delete_session(&self, id: &SessionId) -> Result<(), StoreError>;
    /// Reads one session.
    async fn get_session(&self, id: &SessionId) -> Result<Option<SessionRecord>, StoreError>;
    /// Lists sessions, newest first; `live_only` keeps starting/active/stalled.
    async fn list_sessions(&self, live_only: bool) -> Result<Vec<SessionRecord>, StoreError>;
    /// The session whose Slack thread is `thread_ts` in `channel`, if any
    /// (one lookup, not a scan of every session ever kept).
    async fn session_by_thread(
        &self,
        channel: &str,
        thread_ts: &str,
    ) -> Result<Option<SessionRecord>, StoreError> {
        Ok(self.list_sessions(false).await?.into_iter().find(|s| {
            s.channel_id.as_deref() == Some(channel) && s.thread_ts.as_deref() == Some(thread_ts)
        }))
    }
    /// Sets status and reason, and bumps `updated_at`.
    async fn set_status(
        &self,
        id: &SessionId,
        status: SessionStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError>;
    /// Records the agent's own session id.
    async fn set_acp_session_id(&self, id: &SessionId, acp_id: &str) -> Result<(), StoreError>;
    /// Records the Slack thread root; a second call with a different ts is ignored.
    async fn set_thread(&self, id: &SessionId, channel: &str, ts: &str) -> Result<(), StoreError>;
    /// Records the restart count.
    async fn set_restart_count(&self, id: &SessionId, count: u32) -> Result<(), StoreError>;
    /// Bumps `last_activity_at` to now.
    async fn touch(&self, id: &SessionId) -> Result<(), StoreError>;

    /// Appends a transcript entry; returns its id.
    async fn append_message(
        &self,
        id: &SessionId,
        role: Role,
        kind: MessageKind,
        content: &str,
    ) -> Result<i64, StoreError>;
    /// Replaces the content of an entry (aggregated agent text, tool call status, plan).
    async fn update_message(&self, message_id: i64, content: &str) -> Result<(), StoreError>;
    /// Appends to the content of an entry (streamed agent text: only the new
    /// part crosses to storage on every flush).
    async fn append_to_message(&self, message_id: i64, tail: &str) -> Result<(), StoreError>;
    /// A bounded page of a session's transcript, oldest first
    /// ([`crate::transcript`]: never the whole of a huge one).
    async fn transcript_page(
        &self,
        id: &SessionId,
        page: TranscriptPage,
    ) -> Result<TranscriptSlice, StoreError>;
    /// The newest entries of a session's transcript, oldest first, within
    /// [`TranscriptPage::LATEST`]'s bounds.
    async fn transcript(&self, id: &SessionId) -> Result<Vec<TranscriptEntry>, StoreError> {
        Ok(self
            .transcript_page(id, TranscriptPage::LATEST)
            .await?
            .entries)
    }

    /// Stores a new pending request.
    async fn insert_request(&self, req: &PendingRequest) -> Result<(), StoreError>;
    /// Records a decision on a pending request, atomically: fails with
    /// [`StoreError::AlreadyResolved`] unless it is still pending.
    async fn decide_request(&self, id: &str, decision: &Decision) -> Result<(), StoreError>;
    /// Records a decision (as [`SessionStore::decide_request`]) and its
    /// audit entry as one write: both are stored, or neither. The default
    /// makes two writes.
    async fn decide_request_audited(
        &self,
        id: &str,
        decision: &Decision,
        entry: &AuditEntry,
    ) -> Result<(), StoreError> {
        self.decide_request(id, decision).await?;
        self.audit(entry).await
    }
    /// Marks a pending request cancelled or expired (no-op when already resolved).
    async fn close_request(&self, id: &str, status: RequestStatus) -> Result<(), StoreError>;
    /// One request with its decision, if any.
    async fn get_request(
        &self,
        id: &str,
    ) -> Result<Option<(PendingRequest, Option<Decision>)>, StoreError>;
    /// Requests, newest first; optionally only one session's and/or only pending.
    async fn list_requests(
        &self,
        session: Option<&SessionId>,
        pending_only: bool,
    ) -> Result<Vec<PendingRequest>, StoreError>;
    /// The ids (`req-N`) of every request a session made, without their
    /// content (a session's requests may hold gigabytes of diffs).
    async fn request_ids(&self, session: &SessionId) -> Result<Vec<String>, StoreError> {
        Ok(self
            .list_requests(Some(session), false)
            .await?
            .into_iter()
            .map(|r| r.request_id)
            .collect())
    }

    /// Records whether an operator paused the session (kept across agent
    /// and server restarts until someone resumes it).
    async fn set_paused(&self, id: &SessionId, paused: bool) -> Result<(), StoreError>;
    /// Whether the session is paused.
    async fn is_paused(&self, id: &SessionId) -> Result<bool, StoreError>;

    /// Records whether the agent is in a turn (a prompt sent, its answer
    /// not yet in), so recovery can tell a turn the server's death cut.
    async fn set_turn_running(&self, id: &SessionId, running: bool) -> Result<(), StoreError>;
    /// Whether the agent was in a turn when this was last recorded.
    async fn turn_was_running(&self, id: &SessionId) -> Result<bool, StoreError>;

    /// Queues a steering message; returns it with its id.
    async fn enqueue_steering(
        &self,
        id: &SessionId,
        text: &str,
        author: &str,
    ) -> Result<Steering, StoreError>;
    /// Steering not yet delivered, oldest first.
    async fn undelivered_steering(&self, id: &SessionId) -> Result<Vec<Steering>, StoreError>;
    /// Marks one steering message delivered.
    async fn mark_steering_delivered(&self, steering_id: i64) -> Result<(), StoreError>;

    /// Appends to the audit log.
    async fn audit(&self, entry: &AuditEntry) -> Result<(), StoreError>;

    /// Records the target files of a `check_clearance` request (replacing
    /// an earlier record of the same request; `applied_at` is kept).
    async fn record_clearance(&self, clearance: &Clearance) -> Result<(), StoreError>;
    /// The clearance recorded for a request, if any.
    async fn clearance(&self, request_id: &str) -> Result<Option<Clearance>, StoreError>;
    /// Marks a request's change applied at `at` unless it already is;
    /// true when this call marked it (at most one caller wins a race).
    /// Creates the record when there is none (an apply with `force`).
    async fn claim_clearance(
        &self,
        request_id: &str,
        session_id: &SessionId,
        at: i64,
    ) -> Result<bool, StoreError>;
    /// Undoes [`SessionStore::claim_clearance`] after the write failed.
    async fn release_clearance(&self, request_id: &str) -> Result<(), StoreError>;

    /// Records the session's agent process (pid = process group, start
    /// time) or clears it; used to kill orphans after a server crash.
    async fn set_agent_process(
        &self,
        _id: &SessionId,
        _process: Option<(i32, u64)>,
    ) -> Result<(), StoreError> {
        Ok(())
    }
    /// The recorded agent process, if any.
    async fn agent_process(&self, _id: &SessionId) -> Result<Option<(i32, u64)>, StoreError> {
        Ok(None)
    }

    /// The session's approval mode (`ask` when never set).
    async fn approval_mode(&self, _id: &SessionId) -> Result<ApprovalMode, StoreError> {
        Ok(ApprovalMode::Ask)
    }
    /// Sets the session's approval mode (it survives restarts).
    async fn set_approval_mode(
        &self,
        _id: &SessionId,
        _mode: ApprovalMode,
    ) -> Result<(), StoreError> {
        Err(StoreError::Backend {
            op: "set approval mode",
            message: "not supported by this store".into(),
        })
    }
}

/// Something the operator should see, emitted by session actors.
///
/// The Slack gateway turns these into thread messages; the local API only
/// needs the store. Every variant names its session.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum OperatorEvent {
    /// A session was created and its agent is being started.
    SessionStarted {
        /// The session.
        session: SessionRecord,
    },
    /// Status changed (for the thread root's status line).
    StatusChanged {
        /// The session.
        session_id: SessionId,
        /// New status.
        status: SessionStatus,
        /// A short human word for the status line: working, needs input, idle, ...
        activity: String,
        /// Why, when known.
        reason: Option<String>,
    },
    /// The agent finished a turn's worth of text (aggregated).
    AgentText {
        /// The session.
        session_id: SessionId,
        /// The text.
        text: String,
    },
    /// The agent's reasoning since its last text (aggregated).
    AgentThought {
        /// The session.
        session_id: SessionId,
        /// The whole thought.
        text: String,
    },
    /// The agent reported its context window use and cost.
    Usage {
        /// The session.
        session_id: SessionId,
        /// What it reported.
        usage: crate::protocol::acp::Usage,
    },
    /// A tool call started or changed.
    ToolCall {
        /// The session.
        session_id: SessionId,
        /// The agent's tool call id.
        tool_call_id: String,
        /// Title.
        title: String,
        /// pending / in_progress / completed / failed.
        status: String,
    },
    /// The plan, replaced as a whole.
    Plan {
        /// The session.
        session_id: SessionId,
        /// Entries as (content, status).
        entries: Vec<(String, String)>,
    },
    /// The agent asks for a decision.
    RequestOpened {
        /// The request.
        request: PendingRequest,
    },
    /// A request was decided, cancelled or expired.
    RequestClosed {
        /// The session.
        session_id: SessionId,
        /// Global request id.
        id: String,
        /// Final status.
        status: RequestStatus,
        /// The decision, when decided.
        decision: Option<Decision>,
    },
    /// A steering message was queued behind a running turn.
    SteeringQueued {
        /// The session.
        session_id: SessionId,
        /// The steering row.
        steering: Steering,
    },
    /// A steering message reached the agent.
    SteeringDelivered {
        /// The session.
        session_id: SessionId,
        /// The steering row id.
        steering_id: i64,
    },
    /// A notice for the thread: stall, nudge, restart, timeout, auth trouble.
    Notice {
        /// The session.
        session_id: SessionId,
        /// info / warning / error.
        level: NoticeLevel,
        /// The message.
        text: String,
    },
    /// The session ended; no further events follow for it.
    SessionEnded {
        /// The session.
        session_id: SessionId,
        /// Final status.
        status: SessionStatus,
        /// Why.
        reason: Option<String>,
    },
}

impl OperatorEvent {
    /// The event's name, as its serialized `event` field spells it (the
    /// journal stores it in its own column without parsing the JSON back).
    pub fn kind(&self) -> &'static str {
        match self {
            OperatorEvent::SessionStarted { .. } => "session_started",
            OperatorEvent::StatusChanged { .. } => "status_changed",
            OperatorEvent::AgentText { .. } => "agent_text",
            OperatorEvent::AgentThought { .. } => "agent_thought",
            OperatorEvent::Usage { .. } => "usage",
            OperatorEvent::ToolCall { .. } => "tool_call",
            OperatorEvent::Plan { .. } => "plan",
            OperatorEvent::RequestOpened { .. } => "request_opened",
            OperatorEvent::RequestClosed { .. } => "request_closed",
            OperatorEvent::SteeringQueued { .. } => "steering_queued",
            OperatorEvent::SteeringDelivered { .. } => "steering_delivered",
            OperatorEvent::Notice { .. } => "notice",
            OperatorEvent::SessionEnded { .. } => "session_ended",
        }
    }

    /// The session an event concerns.
    pub fn session_id(&self) -> &SessionId {
        match self {
            OperatorEvent::SessionStarted { session } => &session.id,
            OperatorEvent::RequestOpened { request } => &request.session_id,
            OperatorEvent::StatusChanged { session_id, .. }
            | OperatorEvent::AgentText { session_id, .. }
            | OperatorEvent::AgentThought { session_id, .. }
            | OperatorEvent::Usage { session_id, .. }
            | OperatorEvent::ToolCall { session_id, .. }
            | OperatorEvent::Plan { session_id, .. }
            | OperatorEvent::RequestClosed { session_id, .. }
            | OperatorEvent::SteeringQueued { session_id, .. }
            | OperatorEvent::SteeringDelivered { session_id, .. }
            | OperatorEvent::Notice { session_id, .. }
            | OperatorEvent::SessionEnded { session_id, .. } => session_id,
        }
    }
}

/// Severity of a [`OperatorEvent::Notice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeLevel {
    /// Informational.
    Info,
    /// Something needs attention soon.
    Warning,
    /// Something failed.
    Error,
}

impl NoticeLevel {
    /// How a notice of this level is kept in the transcript: an error as an
    /// error entry, the rest as text.
    pub fn message_kind(self) -> MessageKind {
        match self {
            NoticeLevel::Error => MessageKind::Error,
            NoticeLevel::Info | NoticeLevel::Warning => MessageKind::Text,
        }
    }
}

/// Where operator events go. Must not block: implementations queue.
pub trait OperatorSink: Send + Sync + 'static {
    /// Hands one event to the operator side.
    fn emit(&self, event: OperatorEvent);
}

/// Fans one event out to several sinks (local broadcast + Slack gateway).
pub struct FanOut(pub Vec<std::sync::Arc<dyn OperatorSink>>);

impl OperatorSink for FanOut {
    fn emit(&self, event: OperatorEvent) {
        // The last sink takes the event itself: one copy fewer per event.
        let Some((last, rest)) = self.0.split_last() else {
            return;
        };
        for sink in rest {
            sink.emit(event.clone());
        }
        last.emit(event);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::memory::RecordingSink;

    #[test]
    fn fan_out_gives_every_sink_the_event_in_order() {
        let sinks: Vec<Arc<RecordingSink>> =
            (0..3).map(|_| Arc::new(RecordingSink::new())).collect();
        let fan = FanOut(
            sinks
                .iter()
                .map(|s| s.clone() as Arc<dyn OperatorSink>)
                .collect(),
        );
        for text in ["first", "second"] {
            fan.emit(OperatorEvent::Notice {
                session_id: SessionId("s".into()),
                level: NoticeLevel::Info,
                text: text.into(),
            });
        }
        for sink in &sinks {
            let texts: Vec<String> = sink
                .events()
                .into_iter()
                .filter_map(|e| match e {
                    OperatorEvent::Notice { text, .. } => Some(text),
                    _ => None,
                })
                .collect();
            assert_eq!(texts, ["first", "second"]);
        }
        // No sinks: nothing to do, nothing to fail.
        FanOut(Vec::new()).emit(OperatorEvent::Notice {
            session_id: SessionId("s".into()),
            level: NoticeLevel::Info,
            text: "unheard".into(),
        });
    }
}
