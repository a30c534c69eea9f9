//! How a session comes to life: a start asked by an operator (admitted
//! under `limits.max_concurrent_starts`, refused at once when it cannot
//! succeed), an MCP client attaching, and the spawn of the session actor
//! they share. The handshake is awaited off the supervisor's mailbox, so a
//! slow agent never holds up other sessions' starts.

use std::sync::Arc;

use ractor::{Actor, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use super::recovery::placeholder_profile;
use super::{
    AttachRequest, Entry, MAX_MCP_SESSIONS, StartRequest, SupervisorError, SupervisorMsg,
    SupervisorState, admission, directory,
};
use crate::model::{Protocol, SessionId, SessionRecord, SessionStatus, now_ms};
use crate::ports::{OperatorEvent, OperatorSink, SessionStore};
use crate::protocol::acp::McpHttpServer;
use crate::session::{SessionActor, SessionArgs, SessionMsg, StartError, StartMode};
use crate::settings::AgentProfile;

impl SupervisorState {
    pub(super) async fn spawn_session(
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
    pub(super) fn bridge_for(&mut self, id: &SessionId, protocol: Protocol) -> Vec<McpHttpServer> {
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

    pub(super) async fn attach(
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
            let _ = reply.send(Err(SupervisorError::McpLimitReached {
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
        let profile = placeholder_profile(&record);
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
                let entry = Entry::first_start(actor, profile);
                self.sessions.insert(record.id.clone(), entry);
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
    pub(super) async fn request_start(
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
    pub(super) async fn start_finished(&mut self) {
        let limit = self.args.settings.limits.max_concurrent_starts;
        if let Some(next) = self.admission.finished(limit) {
            self.run_admitted(next).await;
        }
    }

    /// Runs an admitted start; one that ended at once frees its slot.
    pub(super) async fn run_admitted(&mut self, admitted: admission::WaitingStart) {
        if !self.start(admitted.req, admitted.reply).await {
            let _ = self.myself.send_message(SupervisorMsg::StartFinished);
        }
    }

    /// Runs an admitted start; false when it ended here (refused or failed
    /// to spawn), true when its handshake is awaited aside (that task
    /// reports `StartFinished`).
    pub(super) async fn start(
        &mut self,
        req: StartRequest,
        reply: RpcReplyPort<Result<SessionRecord, SupervisorError>>,
    ) -> bool {
        let (record, first) = match self.create_record(&req).await {
            Ok(created) => created,
            Err(e) => {
                let _ = reply.send(Err(e));
                return false;
            }
        };
        self.args.sink.emit(OperatorEvent::SessionStarted {
            session: record.clone(),
        });
        let (tx, rx) = oneshot::channel();
        let start = StartMode::Fresh { first };
        let id = record.id.clone();
        let spawned = self
            .spawn_session(record.clone(), req.profile.clone(), start, Some(tx))
            .await;
        let actor = match spawned {
            Ok(actor) => actor,
            Err(err) => {
                let failed =
                    Err(first_start_failed(&*self.args.store, &*self.args.sink, &id, err).await);
                let _ = reply.send(failed);
                return false;
            }
        };
        self.sessions
            .insert(id, Entry::first_start(actor, req.profile));
        // Wait for the handshake off the supervisor's mailbox.
        let (store, sink, me) = (
            self.args.store.clone(),
            self.args.sink.clone(),
            self.myself.clone(),
        );
        tokio::spawn(async move {
            let outcome = first_handshake(&*store, &*sink, record, rx).await;
            let _ = reply.send(outcome);
            let _ = me.send_message(SupervisorMsg::StartFinished);
        });
        true
    }

    /// Checks a start can go ahead and stores its session row (with the
    /// approval mode asked for); the row and the first prompt, stored as its first steering.
    async fn create_record(
        &self,
        req: &StartRequest,
    ) -> Result<(SessionRecord, crate::model::Steering), SupervisorError> {
        if self.shutdown.is_some() {
            return Err(SupervisorError::ShuttingDown);
        }
        let prompt = req.prompt.trim().to_owned();
        if crate::model::is_blank_prompt(&prompt) {
            return Err(SupervisorError::EmptyPrompt);
        }
        let max = self.args.settings.limits.max_sessions;
        if self.agent_sessions() >= max {
            tracing::warn!(max, "session limit reached");
            return Err(SupervisorError::LimitReached { max });
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
        let store = &self.args.store;
        let storage = |e: crate::ports::StoreError| SupervisorError::Storage(e.to_string());
        store.create_session(&record).await.map_err(storage)?;
        // The approval mode asked for, and the first prompt kept as the
        // session's first steering: a start cut by a crash or a shutdown
        // delivered it nowhere, and the revived session had nothing to do
        // (only an 80-character title held it). Either failing, no row.
        let rest = async {
            if let Some(mode) = req.mode {
                store.set_approval_mode(&record.id, mode).await?;
            }
            store
                .enqueue_steering(&record.id, &prompt, &req.owner)
                .await
        };
        match rest.await {
            Ok(first) => Ok((record, first)),
            Err(e) => {
                let _ = store.delete_session(&record.id).await;
                Err(storage(e))
            }
        }
    }
}

/// A first start that failed leaves no session row, unless steering sent
/// while it started waits in it: that was answered "queued" to someone
/// other than the starter (a probe's was erased with the row), so the row
/// stays, ended in error and revivable, and says what was not delivered.
/// Either way the operator is told the session ended in error.
async fn first_start_failed(
    store: &dyn SessionStore,
    sink: &dyn OperatorSink,
    id: &SessionId,
    err: StartError,
) -> SupervisorError {
    let reason = err.to_string();
    let waiting = store.undelivered_steering(id).await.unwrap_or_default();
    // The first prompt is the first row; the starter is told (the error).
    let others: Vec<&str> = waiting.iter().skip(1).map(|s| s.text.as_str()).collect();
    let kept = !others.is_empty()
        && store
            .set_status(id, SessionStatus::Error, Some(&reason))
            .await
            .is_ok();
    if !kept {
        let _ = store.delete_session(id).await;
    }
    sink.emit(OperatorEvent::SessionEnded {
        session_id: id.clone(),
        status: SessionStatus::Error,
        reason: Some(reason),
    });
    if !kept {
        return SupervisorError::StartFailed(err);
    }
    if let Some(text) = crate::session::undelivered_notice(&others, true) {
        let level = crate::ports::NoticeLevel::Warning;
        super::keep_notice(store, sink, id, level, text).await;
    }
    SupervisorError::StartFailedKept {
        session: id.clone(),
        error: err,
    }
}

/// The answer to a start once its first handshake finished: the stored
/// record, or why it failed (the row removed, except that a session stopped
/// before it was ready keeps its `cancelled` row).
async fn first_handshake(
    store: &dyn SessionStore,
    sink: &dyn OperatorSink,
    record: SessionRecord,
    ready: oneshot::Receiver<Result<(), StartError>>,
) -> Result<SessionRecord, SupervisorError> {
    let id = record.id.clone();
    match ready.await {
        Ok(Ok(())) => Ok(stored(store, record).await),
        Ok(Err(err)) => Err(first_start_failed(store, sink, &id, err).await),
        Err(_) => {
            let stored = store.get_session(&id).await.ok().flatten();
            let ended = stored.as_ref().is_some_and(|r| !r.status.is_live());
            if !ended {
                let _ = store.delete_session(&id).await;
            }
            // A shutdown cut the handshake: say so (503), not that the
            // agent failed to start.
            if stored
                .is_some_and(|r| r.status_reason.as_deref() == Some(crate::model::SERVER_SHUTDOWN))
            {
                return Err(SupervisorError::ShuttingDown);
            }
            Err(SupervisorError::StoppedBeforeReady)
        }
    }
}

/// The session's row as stored now (the handshake filled it in), or
/// `record` when it cannot be read.
async fn stored(store: &dyn SessionStore, record: SessionRecord) -> SessionRecord {
    match store.get_session(&record.id).await {
        Ok(Some(rec)) => rec,
        _ => record,
    }
}

/// A new session's row: `starting`, titled by the first 80 characters of
/// `title`; an empty channel id means none.
pub(super) fn new_record(
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
pub(super) fn answer_when_ready(
    store: Arc<dyn SessionStore>,
    record: SessionRecord,
    ready: oneshot::Receiver<Result<(), StartError>>,
    reply: RpcReplyPort<Result<SessionRecord, SupervisorError>>,
) {
    tokio::spawn(async move {
        let _ = reply.send(when_ready(&*store, record, ready).await);
    });
}

/// The stored record once the handshake finished, or why it did not.
pub(super) async fn when_ready(
    store: &dyn SessionStore,
    record: SessionRecord,
    ready: oneshot::Receiver<Result<(), StartError>>,
) -> Result<SessionRecord, SupervisorError> {
    match ready.await {
        Ok(Ok(())) => Ok(stored(store, record).await),
        Ok(Err(e)) => Err(SupervisorError::StartFailed(e)),
        Err(_) => {
            // A shutdown cut the handshake: say so (503), as for a start.
            let stored = store.get_session(&record.id).await.ok().flatten();
            if stored
                .is_some_and(|r| r.status_reason.as_deref() == Some(crate::model::SERVER_SHUTDOWN))
            {
                return Err(SupervisorError::ShuttingDown);
            }
            Err(SupervisorError::StoppedBeforeReady)
        }
    }
}
