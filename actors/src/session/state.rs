//! The session's state: how it is built from the actor's arguments, and the
//! small things every handler does with it (tell the operator, audit,
//! change the status, check who may act, write to the agent).
//!
//! The fields live on [`SessionState`] in the parent module; this file keeps
//! the helpers apart from the actor's message handling so `mod.rs` reads as
//! the actor: its messages, its state, and what each message does.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use ractor::ActorRef;

use super::*;

impl SessionState {
    pub(super) fn new(myself: ActorRef<SessionMsg>, args: SessionArgs) -> Self {
        let now = Instant::now();
        let carried = match &args.start {
            StartMode::Restart {
                budget: Some(carried),
                ..
            } => *carried,
            _ => Default::default(),
        };
        let workspace = crate::workspace_fs::WorkspaceFs::open(
            std::path::Path::new(&args.record.cwd),
            args.settings.server_files.clone(),
        )
        .map(Arc::new);
        SessionState {
            myself,
            status: args.record.status,
            record: args.record,
            profile: args.profile,
            settings: args.settings,
            store: args.store,
            ledger: ledger::Ledger::start(args.sink),
            supervisor: args.supervisor,
            start: args.start,
            mcp_servers: args.mcp_servers,
            ready: args.ready,
            workspace,
            child: None,
            exited: false,
            phase: Phase::Initializing,
            mode: ApprovalMode::Ask,
            paused: false,
            agent: AgentInfo::default(),
            acp_session: None,
            auth_tried: false,
            pending_failure: None,
            replaying: false,
            replay_tail_until: None,
            oversized_tools: std::collections::VecDeque::new(),
            replayed: 0,
            unreadable_lines: (0, None),
            dialect: DialectWriter::default(),
            next_rpc_id: 0,
            outgoing: HashMap::new(),
            pending: BTreeMap::new(),
            next_request: 1,
            turn: None,
            dialect_prompt: None,
            reprompt_after_cancel: None,
            resume_turn: None,
            last_shown: Default::default(),
            queue: VecDeque::new(),
            in_flight: BTreeMap::new(),
            next_write_token: 0,
            stop_snapshot: Vec::new(),
            kill_reason: None,
            restart_by: None,
            mcp_waiters: HashMap::new(),
            standby: None,
            text: TextBuffer::default(),
            thought: String::new(),
            usage: None,
            agent_options: Default::default(),
            last_progress: None,
            setting_waiters: HashMap::new(),
            unstored_text: Vec::new(),
            unmarked: Vec::new(),
            tools: HashMap::new(),
            entries_written: std::sync::atomic::AtomicU64::new(0),
            budget: carried,
            toolcalls: toolcalls::ToolCalls::default(),
            plan_message: ledger::RowId::None,
            rate: flood::FloodMeter::new(now),
            noise: noise::NoiseLog::new(now),
            refusals: noise::NoiseLog::new(now),
            auto_notices: noise::NoiseLog::new(now),
            fs_slots: std::sync::Arc::new(tokio::sync::Semaphore::new(super::files::OPS_IN_FLIGHT)),
            dirty_tools: HashSet::new(),
            pending_plan: None,
            usage_unsent: false,
            last_inbound: now,
            last_any: now,
            touched_at: None,
            stall: Stall::default(),
            stopping: None,
            stream_closed_at: None,
            over_request_cap_noted: false,
        }
    }

    pub(super) fn id(&self) -> &SessionId {
        &self.record.id
    }

    pub(super) fn is_acp(&self) -> bool {
        self.record.protocol == Protocol::Acp
    }

    /// Tells the operator, once every write queued before is done.
    pub(super) fn emit(&self, event: OperatorEvent) {
        self.ledger.emit(event);
    }

    /// An audit entry about this session.
    pub(super) fn audit_entry(&self, actor: &str, action: &str, detail: Value) -> AuditEntry {
        AuditEntry {
            session_id: Some(self.record.id.clone()),
            actor: actor.to_owned(),
            action: action.to_owned(),
            detail,
        }
    }

    pub(super) async fn audit(&self, actor: &str, action: &str, detail: Value) {
        let entry = self.audit_entry(actor, action, detail);
        let store = Arc::clone(&self.store);
        if let Err(e) = self
            .ledger
            .wait(async move { store.audit(&entry).await })
            .await
        {
            tracing::error!(session = %self.record.id, "audit write failed: {e}");
        }
    }

    /// Queues an audit entry: stored in order with the session's other
    /// writes, before anything the actor waits for next.
    pub(super) fn audit_queued(&self, actor: &str, action: &str, detail: Value) {
        let entry = self.audit_entry(actor, action, detail);
        let store = Arc::clone(&self.store);
        self.ledger.queue(async move {
            if let Err(e) = store.audit(&entry).await {
                tracing::error!(session = ?entry.session_id, "audit write failed: {e}");
            }
        });
    }

    /// Adds a transcript entry (queued: nothing waits for it).
    pub(super) fn note(
        &self,
        role: crate::model::Role,
        kind: crate::model::MessageKind,
        text: &str,
    ) {
        // The operator's own prompt does not end the agent's text block:
        // its entry is written once its delivery is confirmed, which can
        // come after the agent began answering it, and split that answer
        // in two (two Slack messages under load).
        if role != crate::model::Role::User {
            self.entries_written
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let (store, id, text) = (Arc::clone(&self.store), self.id().clone(), text.to_owned());
        self.ledger.queue(async move {
            if let Err(e) = store.append_message(&id, role, kind, &text).await {
                tracing::error!(session = %id, "transcript write failed: {e}");
            }
        });
    }

    pub(super) async fn set_status(
        &mut self,
        status: SessionStatus,
        activity: &str,
        reason: Option<&str>,
    ) {
        self.status = status;
        let (store, id, why) = (
            Arc::clone(&self.store),
            self.id().clone(),
            reason.map(str::to_owned),
        );
        let written = self
            .ledger
            .wait(async move { store.set_status(&id, status, why.as_deref()).await })
            .await;
        if let Err(e) = written {
            tracing::error!(session = %self.record.id, "status write failed: {e}");
        }
        self.show_activity(activity, reason);
    }

    /// Bumps `last_activity_at` (Slack's "most recent session" and cleanup
    /// rely on it): always for operator actions, at most every
    /// [`TOUCH_EVERY`] for agent traffic.
    pub(super) fn touch_if(&mut self, happened: bool, operator: bool) {
        let now = Instant::now();
        let recent = self
            .touched_at
            .is_some_and(|t| now.duration_since(t) < TOUCH_EVERY);
        if !happened || (recent && !operator) {
            return;
        }
        self.touched_at = Some(now);
        let (store, id) = (Arc::clone(&self.store), self.id().clone());
        self.ledger.queue(async move {
            if let Err(e) = store.touch(&id).await {
                tracing::warn!(session = %id, "cannot record activity: {e}");
            }
        });
    }

    /// Tells the operator what the session is doing now (status unchanged).
    pub(super) fn show_activity(&self, activity: &str, reason: Option<&str>) {
        // The same status twice in a row says nothing new: a probe's event
        // stream showed "active · working" twice at each start.
        let shown = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (self.status.as_str(), activity, reason).hash(&mut h);
            h.finish()
        };
        if self
            .last_shown
            .swap(shown, std::sync::atomic::Ordering::Relaxed)
            == shown
        {
            return;
        }
        self.emit(OperatorEvent::StatusChanged {
            session_id: self.id().clone(),
            status: self.status,
            activity: activity.to_owned(),
            reason: reason.map(str::to_owned),
        });
    }

    pub(super) async fn authorize(
        &self,
        caller: &Caller,
        action: &str,
    ) -> Result<(), SessionError> {
        if caller.operator
            || caller.id == self.record.owner
            || self.settings.operators.contains(&caller.id)
        {
            return Ok(());
        }
        self.audit(
            &caller.id,
            "action.denied",
            serde_json::json!({"action": action, "owner": self.record.owner}),
        )
        .await;
        Err(SessionError::Unauthorized {
            user: caller.id.clone(),
            session: self.id().clone(),
            owner: self.record.owner.clone(),
        })
    }

    pub(super) fn snapshot(&self) -> SessionSnapshot {
        SessionSnapshot {
            status: self.status,
            turn_running: self.turn.is_some(),
            pending: self.pending.values().map(|p| p.record.clone()).collect(),
            queued: self.queue.iter().cloned().collect(),
            agent: self.agent.clone(),
            pid: self.child.as_ref().map(AgentChild::pid),
            mode: self.mode,
            paused: self.paused,
            usage: self.usage.clone(),
            agent_options: self.agent_options.clone(),
            last_progress: self.last_progress.clone(),
        }
    }

    /// Logs a warning about what the agent sent (`what` is built only when
    /// it is logged, and logged [`noise::log_safe`]: it may quote the
    /// agent), unless its agent made too many of them lately: see [`noise`].
    pub(super) fn warn_agent(&mut self, what: impl FnOnce() -> String) {
        let left_out = match self.noise.admit(Instant::now()) {
            noise::Verdict::Suppress => return,
            noise::Verdict::Log { left_out } => left_out,
        };
        let what = what();
        let what = noise::log_safe(&what);
        if left_out == 0 {
            tracing::warn!(session = %self.record.id, "{what}");
        } else {
            tracing::warn!(
                session = %self.record.id,
                left_out,
                "{what} ({left_out} more warnings about this agent's output were left out)"
            );
        }
    }

    /// Sends raw bytes to the agent; a failure is handled like a broken pipe.
    pub(super) fn send_bytes(&mut self, bytes: bytes::Bytes) -> bool {
        self.write_to_agent(bytes, None)
    }

    /// Sends raw bytes; with a token, [`ChildEvent::Written`] confirms them.
    /// False when the writer is already gone (nothing was sent).
    pub(super) fn write_to_agent(&mut self, bytes: bytes::Bytes, token: Option<u64>) -> bool {
        let result = match (&self.child, token) {
            (Some(child), Some(token)) => child.send_tracked(bytes, token),
            (Some(child), None) => child.send(bytes),
            // An MCP client is the agent: there is never a process to write
            // to (a stop's cancel has nobody to reach), nothing to warn of.
            (None, _) if self.record.protocol == crate::model::Protocol::Mcp => return false,
            (None, _) => {
                tracing::warn!(session = %self.record.id, "write to agent failed: no agent process");
                return false;
            }
        };
        match result {
            Ok(()) => true,
            Err(e @ crate::child::SendRefused::NotReading { .. }) => {
                // Its answers would pile up in the server for ever: end it
                // like a broken pipe (supervision restarts it by policy).
                tracing::warn!(session = %self.record.id, "{e}");
                self.kill_for(e.to_string());
                false
            }
            Err(e) => {
                tracing::warn!(session = %self.record.id, "write to agent failed: {e}");
                false
            }
        }
    }
}
