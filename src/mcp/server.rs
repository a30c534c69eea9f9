//! The MCP handler: one per MCP session, bound lazily to one core session.
//!
//! [`IntercomMcp`] is what rmcp runs for an MCP session. Its first tool call
//! attaches a core session (`SupervisorMsg::Attach`) for the workspace named
//! in the connection's query string; every later call goes to that session's
//! actor as an [`McpCall`]. Bridged connections (`?session_id=<token>`,
//! checked in `mod.rs`) act for the ACP session instead and never create
//! one. When rmcp drops the handler — the MCP session was deleted, expired or
//! the server is shutting down — the core session is told `Disconnected`.
//!
//! Blocking tools wait for their answer, their timeout, or the client's
//! cancellation (`notifications/cancelled` cancels the request's token;
//! dropping the future does the same through a guard): a cancelled call
//! closes its pending request as `cancelled`, a timed-out one as `expired`.
//!
//! `check_clearance` records a hash of each target file when it asks; it is
//! kept in memory only, so after a server restart `check_diff` cannot prove
//! the file is unchanged and refuses unless `force` is given.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Query;
use axum::http::request::Parts;
use intercom_actors::model::{
    AuditEntry, MessageKind, PendingRequest, RequestKind, RequestStatus, SessionId, now_ms,
};
use intercom_actors::ports::{Clearance, NoticeLevel};
use intercom_actors::registry::RegistryMsg;
use intercom_actors::session::{Caller, McpAnswer, McpCall, SessionMsg};
use intercom_actors::supervisor::{AttachRequest, SupervisorMsg, directory};
use intercom_actors::workspace_fs::{FsError, WorkspaceFs, on_blocking_pool};
use ractor::ActorRef;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::patch::{self, Change, FilePatch};
use super::tools::{self, Args};
use super::{ACTOR_TIMEOUT, ActorCallError, BridgedSession, McpDeps, ask};

/// Owner of sessions attached over MCP (the local operator's id).
const OWNER: &str = "local";
/// Attaching may wait for the session actor to start.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);

/// A target file's content hash at clearance time (`None`: did not exist).
type Recorded = Vec<(String, Option<[u8; 32]>)>;

/// State shared by every MCP connection: only the dependencies. What a
/// session asked and applied lives in SQLite (clearances) and in its
/// session actor (last progress), never in a map here.
pub(crate) struct Shared {
    pub(crate) deps: McpDeps,
}

impl Shared {
    pub(crate) fn new(deps: McpDeps) -> Self {
        Shared { deps }
    }

    /// The workspace at `root` as a directory handle, guarded like ACP agents'.
    fn workspace(&self, root: &Path) -> Result<Arc<WorkspaceFs>, Fail> {
        WorkspaceFs::open(root, self.deps.server_files.clone())
            .map(Arc::new)
            .map_err(|e| Fail::refused("no_workspace", e.to_string()))
    }
}

/// Where a connection's session belongs.
#[derive(Debug, Clone, Default)]
struct Place {
    /// Workspace id, or empty (local only).
    workspace: String,
    /// The workspace directory, when there is one.
    cwd: Option<PathBuf>,
    /// Slack channel, when there is one.
    channel: Option<String>,
}

/// The core session a connection created.
struct Own {
    id: SessionId,
    actor: ActorRef<SessionMsg>,
    place: Place,
}

/// One MCP session's binding; tells the core session when it goes away.
struct Connection {
    bound: tokio::sync::Mutex<Option<Own>>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(own) = self.bound.get_mut().take() {
            tracing::info!(session = %own.id, "MCP session closed");
            let _ = own
                .actor
                .send_message(SessionMsg::Mcp(McpCall::Disconnected));
        }
    }
}

/// The rmcp handler for one MCP session.
pub(crate) struct IntercomMcp {
    shared: Arc<Shared>,
    conn: Arc<Connection>,
}

/// The session a call acts on.
struct Target {
    id: SessionId,
    actor: ActorRef<SessionMsg>,
    /// Its workspace id (empty: local only).
    workspace: String,
    /// The workspace directory (None: the session has no workspace).
    cwd: Option<PathBuf>,
}

/// How a tool call failed.
enum Fail {
    /// Bad arguments: an MCP invalid-params error.
    Params(String),
    /// The tool ran and refused: a tool error result the agent can read.
    Refused {
        /// Stable machine-readable code.
        code: &'static str,
        /// What happened and what to do.
        message: String,
    },
    /// The client cancelled the call (the answer is not delivered).
    Cancelled,
}

impl Fail {
    fn refused(code: &'static str, message: impl Into<String>) -> Self {
        Fail::Refused {
            code,
            message: message.into(),
        }
    }

    fn ended() -> Self {
        Fail::refused(
            "session_ended",
            "the session has ended; reconnect to start a new one",
        )
    }
}

impl From<ActorCallError> for Fail {
    fn from(e: ActorCallError) -> Self {
        Fail::refused("internal", e.to_string())
    }
}

type ToolResult = Result<Value, Fail>;

/// How a blocking wait ended.
enum Waited<T> {
    Answer(T),
    /// The sender was dropped without an answer.
    Closed,
    TimedOut,
    Cancelled,
}

async fn wait_for<T>(
    rx: &mut oneshot::Receiver<T>,
    timeout: Duration,
    ct: &CancellationToken,
) -> Waited<T> {
    tokio::select! {
        biased;
        r = &mut *rx => match r {
            Ok(v) => Waited::Answer(v),
            Err(_) => Waited::Closed,
        },
        _ = ct.cancelled() => Waited::Cancelled,
        _ = tokio::time::sleep(timeout) => Waited::TimedOut,
    }
}

/// Closes an MCP request as cancelled when the call is dropped before it
/// finished (client cancellation, disconnect); disarmed on a normal end.
struct RequestGuard {
    actor: ActorRef<SessionMsg>,
    /// Still waiting for the request to be stored.
    opened: Option<oneshot::Receiver<Option<String>>>,
    request_id: Option<String>,
}

impl RequestGuard {
    fn new(actor: ActorRef<SessionMsg>, opened: oneshot::Receiver<Option<String>>) -> Self {
        RequestGuard {
            actor,
            opened: Some(opened),
            request_id: None,
        }
    }

    /// Waits for the stored request's global id.
    async fn opened(&mut self) -> Result<String, Fail> {
        let Some(rx) = self.opened.as_mut() else {
            return Err(Fail::refused("internal", "request already opened"));
        };
        let r = tokio::time::timeout(ACTOR_TIMEOUT, rx).await;
        self.opened = None;
        match r {
            Ok(Ok(Some(id))) => {
                self.request_id = Some(id.clone());
                Ok(id)
            }
            Ok(Ok(None)) => Err(Fail::refused(
                "storage",
                "the request could not be stored, so the operator was not asked; try again",
            )),
            Ok(Err(_)) => Err(Fail::ended()),
            Err(_) => Err(Fail::refused(
                "internal",
                "the session did not open the request in time",
            )),
        }
    }

    fn disarm(&mut self) {
        self.request_id = None;
    }

    /// Closes the request now with `status`.
    fn close(&mut self, status: RequestStatus) {
        if let Some(request_id) = self.request_id.take() {
            let _ = self
                .actor
                .send_message(SessionMsg::Mcp(McpCall::Abandon { request_id, status }));
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if let Some(rx) = self.opened.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            // Dropped before the id arrived: close it once it does.
            let actor = self.actor.clone();
            rt.spawn(async move {
                if let Ok(Some(request_id)) = rx.await {
                    let _ = actor.send_message(SessionMsg::Mcp(McpCall::Abandon {
                        request_id,
                        status: RequestStatus::Cancelled,
                    }));
                }
            });
        }
        self.close(RequestStatus::Cancelled);
    }
}

/// Tells the session the client stopped waiting in `standby`, unless disarmed.
struct StandbyGuard {
    actor: ActorRef<SessionMsg>,
    armed: bool,
}

impl StandbyGuard {
    fn disarm(&mut self) {
        self.armed = false;
    }

    fn abandon(&mut self) {
        if std::mem::take(&mut self.armed) {
            let _ = self
                .actor
                .send_message(SessionMsg::Mcp(McpCall::StandbyAbandoned));
        }
    }
}

impl Drop for StandbyGuard {
    fn drop(&mut self) {
        self.abandon();
    }
}

fn send(actor: &ActorRef<SessionMsg>, call: McpCall) -> Result<(), Fail> {
    actor
        .send_message(SessionMsg::Mcp(call))
        .map_err(|_| Fail::ended())
}

fn storage(e: impl std::fmt::Display) -> Fail {
    Fail::refused("storage", format!("storage failed: {e}"))
}

/// The connection's query string; a workspace-scoped token pins the workspace.
fn query_of(parts: Option<&Parts>) -> HashMap<String, String> {
    let mut query: HashMap<String, String> = parts
        .and_then(|p| Query::<HashMap<String, String>>::try_from_uri(&p.uri).ok())
        .map(|Query(q)| q)
        .unwrap_or_default();
    if let Some(super::auth::ScopedWorkspace(ws)) =
        parts.and_then(|p| p.extensions.get::<super::auth::ScopedWorkspace>())
    {
        query.remove("channel_id");
        query.insert("workspace_id".into(), ws.clone());
    }
    query
}

fn parts_of(ctx: &RequestContext<RoleServer>) -> Option<&Parts> {
    ctx.extensions.get::<Parts>()
}

/// The title of a session: the client's name and version.
fn client_title(ctx: &RequestContext<RoleServer>) -> String {
    match ctx.peer.peer_info() {
        Some(info) => {
            let c = &info.client_info;
            format!("{} {} (MCP)", c.name, c.version)
        }
        None => "MCP client".into(),
    }
}

/// The files a change writes, relative to the workspace: `file_path` for
/// whole content and single-file diffs, the `+++` paths for several files.
fn targets<'a>(change: &'a Change, file_path: &str) -> Vec<(String, Option<&'a FilePatch>)> {
    match change {
        Change::Whole(_) => vec![(file_path.to_owned(), None)],
        Change::Diff(files) if files.len() == 1 => vec![(file_path.to_owned(), files.first())],
        Change::Diff(files) => files
            .iter()
            .map(|f| (f.path.clone().unwrap_or_else(|| file_path.into()), Some(f)))
            .collect(),
    }
}

/// Largest file a diff is applied to.
const MAX_APPLY_BYTES: usize = 64 * 1024 * 1024;

/// SHA-256 of a workspace file's content (`None`: it does not exist yet).
fn snapshot(ws: &WorkspaceFs, rel: &str) -> Result<Option<[u8; 32]>, FsError> {
    use sha2::{Digest, Sha256};
    Ok(ws
        .current(rel, MAX_APPLY_BYTES)?
        .map(|content| Sha256::digest(content.as_bytes()).into()))
}

/// A refused path as the tool's error: the agent's argument, or I/O.
fn fs_fail(e: &FsError, which: &str) -> Fail {
    match e {
        FsError::Io { .. } | FsError::TimedOut { .. } => Fail::refused("io", e.to_string()),
        _ => Fail::Params(format!("argument `{which}`: {e}")),
    }
}

fn already_applied(raw: &str) -> Fail {
    Fail::refused(
        "already_applied",
        format!("request {raw} was already applied; pass force: true to apply it again"),
    )
}

/// Refuses when a target file is not as it was when clearance was asked.
async fn unchanged_since_clearance(
    ws: &Arc<WorkspaceFs>,
    files: &[(String, Option<&FilePatch>)],
    recorded: &Recorded,
) -> Result<(), Fail> {
    for (rel, _) in files {
        let r = rel.clone();
        let now = on_blocking_pool(ws.clone(), "read", rel, move |ws| snapshot(ws, &r))
            .await
            .map_err(|e| Fail::refused("io", format!("cannot read {rel}: {e}")))?;
        let then = recorded.iter().find(|(r, _)| r == rel).map(|(_, h)| *h);
        if then != Some(now) {
            tracing::info!(file = %rel, then = %then.as_ref().map(hex).unwrap_or_default(), now = %hex(&now), "refusing check_diff: file changed");
            return Err(Fail::refused(
                "file_changed",
                format!(
                    "{rel} changed since the change was approved; ask for clearance again, or pass force: true to apply anyway"
                ),
            ));
        }
    }
    Ok(())
}

/// Writes every file in order; on failure, the error and whether nothing
/// was written.
async fn write_all(
    ws: &Arc<WorkspaceFs>,
    outputs: Vec<(String, String)>,
) -> Result<Vec<String>, (Fail, bool)> {
    let mut written: Vec<String> = Vec::new();
    for (rel, content) in outputs {
        let r = rel.clone();
        let result =
            on_blocking_pool(ws.clone(), "write", &rel, move |ws| ws.write(&r, &content)).await;
        if let Err(e) = result {
            let done = if written.is_empty() {
                String::from("nothing was written")
            } else {
                format!("already written: {}", written.join(", "))
            };
            let fail = Fail::refused("write_failed", format!("cannot write {rel}: {e} ({done})"));
            return Err((fail, written.is_empty()));
        }
        written.push(rel);
    }
    Ok(written)
}

fn hex(h: &Option<[u8; 32]>) -> String {
    match h {
        Some(bytes) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
        None => "absent".into(),
    }
}

fn pending_json(p: &PendingRequest) -> Value {
    json!({
        "request_id": p.id,
        "kind": p.kind.as_str(),
        "title": p.title,
        "file_path": p.paths.first(),
        "status": p.status.as_str(),
        "created_at": p.created_at,
    })
}

impl IntercomMcp {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        IntercomMcp {
            shared,
            conn: Arc::new(Connection {
                bound: tokio::sync::Mutex::new(None),
            }),
        }
    }

    fn deps(&self) -> &McpDeps {
        &self.shared.deps
    }

    async fn lookup(&self, id: &SessionId) -> Result<Option<ActorRef<SessionMsg>>, Fail> {
        // The named registry, not the supervisor's mailbox (no waiting
        // behind session starts).
        Ok(directory::find(&self.deps().supervisor, id))
    }

    /// Where a new session belongs, from the connection's query string.
    async fn place(&self, query: &HashMap<String, String>) -> Place {
        let pick = |k: &str| query.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let workspace = pick("workspace_id");
        let channel = pick("channel_id");
        match (workspace, channel) {
            (Some(ws), Some(ch)) => tracing::warn!(
                workspace = ws,
                channel = ch,
                "MCP client gave both workspace_id and the deprecated channel_id; workspace_id wins"
            ),
            (None, Some(ch)) => tracing::warn!(
                channel = ch,
                "MCP client connected with the deprecated ?channel_id=; use ?workspace_id=<id>"
            ),
            _ => {}
        }
        // The map, not RegistryMsg::Resolve: resolving also picks an agent
        // profile, which an MCP session does not have (a config without
        // agents must still serve MCP clients).
        let map = match ask(
            &self.deps().registry.get(),
            "workspace registry",
            ACTOR_TIMEOUT,
            RegistryMsg::Get,
        )
        .await
        {
            Ok(map) => map,
            Err(e) => {
                tracing::error!("cannot read the workspace map: {e}; the session is local only");
                return Place::default();
            }
        };
        let entry = match (workspace, channel) {
            (Some(ws), _) => map.workspaces.iter().find(|w| w.id == ws),
            (None, Some(ch)) => map.by_channel(ch),
            (None, None) => None,
        };
        match entry {
            Some(e) => {
                let cwd = match map.contain(&e.path) {
                    Ok(p) => Some(p),
                    Err(err) => {
                        tracing::warn!(workspace = %e.id, "workspace directory {} cannot be used: {err}; files cannot be applied", e.path.display());
                        None
                    }
                };
                Place {
                    workspace: e.id.clone(),
                    cwd,
                    channel: Some(e.channel_id.clone()).filter(|c| !c.is_empty()),
                }
            }
            None => match (workspace, channel) {
                (Some(ws), _) => {
                    tracing::warn!(
                        workspace = ws,
                        "MCP client named an unknown workspace; the session is local only (no channel, no workspace)"
                    );
                    Place::default()
                }
                (None, Some(ch)) => {
                    tracing::warn!(
                        channel = ch,
                        "channel_id maps to no configured workspace; the session posts there but has no workspace"
                    );
                    Place {
                        channel: Some(ch.to_owned()),
                        ..Place::default()
                    }
                }
                (None, None) => {
                    tracing::info!(
                        "MCP client connected without ?workspace_id=; the session is local only"
                    );
                    Place::default()
                }
            },
        }
    }

    /// The session this call acts on: the bridged ACP session, or this
    /// connection's own one (attached on first use, again if it ended).
    async fn target(&self, ctx: &RequestContext<RoleServer>) -> Result<Target, Fail> {
        let parts = parts_of(ctx);
        if let Some(BridgedSession(id)) = parts.and_then(|p| p.extensions.get::<BridgedSession>()) {
            let actor = self.lookup(id).await?.ok_or_else(|| {
                Fail::refused(
                    "session_ended",
                    format!("session {id} behind this bridge token has ended"),
                )
            })?;
            let record = self.deps().store.get_session(id).await.map_err(storage)?;
            let (workspace, cwd) = record
                .map(|r| (r.workspace, PathBuf::from(r.cwd)))
                .unwrap_or_default();
            return Ok(Target {
                id: id.clone(),
                actor,
                workspace,
                cwd: Some(cwd).filter(|p| !p.as_os_str().is_empty()),
            });
        }
        let mut bound = self.conn.bound.lock().await;
        if let Some(own) = bound.as_ref() {
            if let Some(actor) = self.lookup(&own.id).await? {
                return Ok(Target {
                    id: own.id.clone(),
                    actor,
                    workspace: own.place.workspace.clone(),
                    cwd: own.place.cwd.clone(),
                });
            }
            tracing::info!(session = %own.id, "this MCP client's session has ended; attaching a new one");
        }
        let place = match bound.as_ref() {
            Some(own) => own.place.clone(),
            None => self.place(&query_of(parts)).await,
        };
        let req = AttachRequest {
            workspace: place.workspace.clone(),
            cwd: place.cwd.clone().unwrap_or_default(),
            channel_id: place.channel.clone(),
            title: client_title(ctx),
            owner: OWNER.into(),
        };
        let record = ask(
            &self.deps().supervisor,
            "supervisor (attach)",
            ATTACH_TIMEOUT,
            |reply| SupervisorMsg::Attach { req, reply },
        )
        .await?
        .map_err(|e| Fail::refused("attach_failed", format!("could not create a session: {e}")))?;
        let actor = self.lookup(&record.id).await?.ok_or_else(Fail::ended)?;
        tracing::info!(session = %record.id, workspace = %place.workspace, "MCP client attached");
        *bound = Some(Own {
            id: record.id.clone(),
            actor: actor.clone(),
            place: place.clone(),
        });
        Ok(Target {
            id: record.id,
            actor,
            workspace: place.workspace,
            cwd: place.cwd,
        })
    }

    async fn check_clearance(&self, args: Args, ctx: &RequestContext<RoleServer>) -> ToolResult {
        let t = self.target(ctx).await?;
        let title = args.str_or("title", "").trim().to_owned();
        let diff = args.str_or("diff", "").to_owned();
        let file_path = args.str_or("file_path", "").trim().to_owned();
        let change = Change::parse(&diff).map_err(|e| {
            Fail::Params(format!(
                "argument `diff` looks like a unified diff but is not a valid one: {e}"
            ))
        })?;
        // Prove the targets are writable inside the workspace (not a server
        // file, not through a symlink) and record their content.
        let mut recorded: Recorded = Vec::new();
        if let Some(root) = &t.cwd {
            let ws = self.shared.workspace(root)?;
            for (rel, _) in targets(&change, &file_path) {
                let which = if rel == file_path {
                    "file_path"
                } else {
                    "diff"
                };
                let r = rel.clone();
                // `snapshot` reads through `current`, which refuses
                // whatever a write to the target would refuse.
                let hash = on_blocking_pool(ws.clone(), "read", &rel, move |ws| snapshot(ws, &r))
                    .await
                    .map_err(|e| fs_fail(&e, which))?;
                recorded.push((rel, hash));
            }
        }
        let (opened_tx, opened_rx) = oneshot::channel();
        let (tx, mut rx) = oneshot::channel();
        send(
            &t.actor,
            McpCall::Clearance {
                title,
                description: args.str_or("description", "").trim().to_owned(),
                diff: Some(diff),
                file_path,
                risk_level: args.str_or("risk_level", "low").to_owned(),
                opened: opened_tx,
                reply: tx,
            },
        )?;
        let mut guard = RequestGuard::new(t.actor.clone(), opened_rx);
        let request_id = guard.opened().await?;
        if t.cwd.is_some() {
            let clearance = Clearance {
                request_id: request_id.clone(),
                session_id: t.id.clone(),
                files: recorded,
                applied_at: None,
            };
            // Unrecorded, the approval could never be applied without
            // `force`: refuse now (the guard cancels the request).
            self.deps()
                .store
                .record_clearance(&clearance)
                .await
                .map_err(storage)?;
        }
        let timeout = self.deps().approval_timeout;
        let answer = match wait_for(&mut rx, timeout, &ctx.ct).await {
            Waited::Answer(a) => Some(a),
            Waited::Closed => None,
            Waited::TimedOut => {
                guard.close(RequestStatus::Expired);
                // A decision may have won the race with the expiry.
                match tokio::time::timeout(ACTOR_TIMEOUT, &mut rx).await {
                    Ok(Ok(a @ McpAnswer::Decided(_))) => Some(a),
                    _ => Some(McpAnswer::Closed(RequestStatus::Expired)),
                }
            }
            Waited::Cancelled => {
                return Err(Fail::Cancelled); // the guard closes it as cancelled
            }
        };
        guard.disarm();
        let mut out = json!({"request_id": request_id});
        match answer {
            Some(McpAnswer::Decided(d)) => {
                out["status"] = json!(if d.approved { "approved" } else { "rejected" });
                if let Some(reason) = d.reason {
                    out["reason"] = json!(reason);
                }
            }
            Some(McpAnswer::Closed(RequestStatus::Expired)) => {
                out["status"] = json!("timeout");
                out["reason"] = json!(format!(
                    "no decision within {} s; the request expired",
                    timeout.as_secs()
                ));
            }
            Some(McpAnswer::Closed(status)) => {
                out["status"] = json!("rejected");
                out["reason"] = json!(format!(
                    "the request was {status} before the operator decided",
                    status = status.as_str()
                ));
            }
            None => {
                return Err(Fail::refused(
                    "session_ended",
                    "the session ended before the operator decided",
                ));
            }
        }
        Ok(out)
    }

    async fn check_diff(&self, args: Args, ctx: &RequestContext<RoleServer>) -> ToolResult {
        let t = self.target(ctx).await?;
        let raw = args.str_or("request_id", "").trim().to_owned();
        let force = args.flag("force");
        let global = if raw.contains(':') {
            raw.clone()
        } else {
            PendingRequest::global_id(&t.id, &raw)
        };
        let store = &self.deps().store;
        let (req, decision) = store
            .get_request(&global)
            .await
            .map_err(storage)?
            .ok_or_else(|| {
                Fail::Params(format!(
                    "argument `request_id`: there is no request {raw}; pass the request_id check_clearance returned"
                ))
            })?;
        if req.session_id != t.id {
            // A client that reconnected (new session) may apply what its
            // earlier session got approved, in the same workspace only.
            let owner = store
                .get_session(&req.session_id)
                .await
                .map_err(storage)?
                .map(|r| r.workspace)
                .unwrap_or_default();
            if owner.is_empty() || owner != t.workspace {
                return Err(Fail::Params(format!(
                    "argument `request_id`: request {raw} belongs to a session of another workspace"
                )));
            }
        }
        if req.kind != RequestKind::Permission {
            return Err(Fail::Params(format!(
                "argument `request_id`: {raw} is not a check_clearance request"
            )));
        }
        match (req.status, &decision) {
            (RequestStatus::Decided, Some(d)) if d.approved => {}
            (RequestStatus::Decided, Some(d)) => {
                let why = d
                    .reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default();
                return Err(Fail::refused(
                    "not_approved",
                    format!("request {raw} was rejected{why}; nothing to apply"),
                ));
            }
            (RequestStatus::Pending, _) => {
                return Err(Fail::refused(
                    "not_decided",
                    format!("request {raw} is still waiting for the operator"),
                ));
            }
            (status, _) => {
                return Err(Fail::refused(
                    "not_approved",
                    format!("request {raw} is {}; nothing to apply", status.as_str()),
                ));
            }
        }
        let Some(root) = t.cwd.clone() else {
            return Err(Fail::refused(
                "no_workspace",
                "this session has no workspace (connect with /mcp?workspace_id=<id>), so the change cannot be applied here",
            ));
        };
        let (Some(text), Some(file_path)) = (req.diff.as_deref(), req.paths.first()) else {
            return Err(Fail::refused(
                "no_change",
                format!("request {raw} carries no change to apply"),
            ));
        };
        let clearance = store.clearance(&global).await.map_err(storage)?;
        if !force && clearance.as_ref().is_some_and(|c| c.applied_at.is_some()) {
            return Err(already_applied(&raw));
        }
        let change = Change::parse(text).map_err(|e| {
            Fail::refused(
                "bad_diff",
                format!("the approved diff cannot be parsed: {e}"),
            )
        })?;
        let ws = self.shared.workspace(&root)?;
        let files = targets(&change, file_path);
        for (rel, _) in &files {
            let r = rel.clone();
            on_blocking_pool(ws.clone(), "write", rel, move |ws| ws.check_write(&r))
                .await
                .map_err(|e| Fail::refused("outside_workspace", e.to_string()))?;
        }
        if !force {
            let Some(clearance) = clearance.filter(|c| c.session_id == req.session_id) else {
                return Err(Fail::refused(
                    "unverifiable",
                    format!(
                        "there is no record of {file_path}'s content when the change was approved; check the file and call again with force: true"
                    ),
                ));
            };
            unchanged_since_clearance(&ws, &files, &clearance.files).await?;
        }
        // Compute every new content before writing anything.
        let mut outputs = Vec::with_capacity(files.len());
        for (rel, fp) in files {
            let content = match (&change, fp) {
                (Change::Whole(content), _) => content.clone(),
                (Change::Diff(_), Some(fp)) => {
                    let r = rel.clone();
                    let current = on_blocking_pool(ws.clone(), "read", &rel, move |ws| {
                        ws.current(&r, MAX_APPLY_BYTES)
                    })
                    .await
                    .map_err(|e| Fail::refused("diff_does_not_apply", e.to_string()))?;
                    let original = match current {
                        Some(s) if fp.creates => {
                            return Err(Fail::refused(
                                "diff_does_not_apply",
                                format!(
                                    "the diff creates {rel}, but it exists ({} bytes)",
                                    s.len()
                                ),
                            ));
                        }
                        Some(s) => s,
                        None if fp.creates => String::new(),
                        None => {
                            return Err(Fail::refused(
                                "diff_does_not_apply",
                                format!("cannot read {rel}: it does not exist"),
                            ));
                        }
                    };
                    patch::apply(&original, &fp.hunks)
                        .map_err(|e| Fail::refused("diff_does_not_apply", format!("{rel}: {e}")))?
                }
                (Change::Diff(_), None) => {
                    return Err(Fail::refused("bad_diff", format!("no hunks for {rel}")));
                }
            };
            outputs.push((rel, content));
        }
        // Claimed before writing: of two concurrent applies, one writes.
        let claimed = store
            .claim_clearance(&global, &req.session_id, now_ms())
            .await
            .map_err(storage)?;
        if !claimed && !force {
            return Err(already_applied(&raw));
        }
        let written = match write_all(&ws, outputs).await {
            Ok(written) => written,
            Err((fail, nothing_written)) => {
                if claimed
                    && nothing_written
                    && let Err(e) = store.release_clearance(&global).await
                {
                    tracing::error!(request = %global, "cannot release the apply claim: {e}");
                }
                return Err(fail);
            }
        };
        let entry = AuditEntry {
            session_id: Some(t.id.clone()),
            actor: "agent".into(),
            action: "change.applied".into(),
            detail: json!({"request": global, "files": written, "forced": force}),
        };
        if let Err(e) = store.audit(&entry).await {
            tracing::error!(session = %t.id, "audit write failed: {e}");
        }
        Ok(json!({"request_id": global, "files_written": written}))
    }

    async fn transmit(&self, args: Args, ctx: &RequestContext<RoleServer>) -> ToolResult {
        let t = self.target(ctx).await?;
        let (opened_tx, opened_rx) = oneshot::channel();
        let (tx, mut rx) = oneshot::channel();
        send(
            &t.actor,
            McpCall::Transmit {
                text: args.str_or("prompt_text", "").trim().to_owned(),
                kind: args.str_or("prompt_type", "continuation").trim().to_owned(),
                opened: opened_tx,
                reply: tx,
            },
        )?;
        let mut guard = RequestGuard::new(t.actor.clone(), opened_rx);
        let request_id = guard.opened().await?;
        let timeout = self.deps().transmit_timeout;
        let answer = match wait_for(&mut rx, timeout, &ctx.ct).await {
            Waited::Answer(a) => Some(a),
            Waited::Closed => None,
            Waited::TimedOut => {
                guard.close(RequestStatus::Expired);
                match tokio::time::timeout(ACTOR_TIMEOUT, &mut rx).await {
                    Ok(Ok(a @ McpAnswer::Decided(_))) => Some(a),
                    _ => Some(McpAnswer::Closed(RequestStatus::Expired)),
                }
            }
            Waited::Cancelled => return Err(Fail::Cancelled),
        };
        guard.disarm();
        match answer {
            Some(McpAnswer::Decided(d)) => {
                let mut out = json!({"decision": d.option_id, "request_id": request_id});
                if let Some(instruction) = d.reason.filter(|r| !r.is_empty()) {
                    out["instruction"] = json!(instruction);
                }
                Ok(out)
            }
            Some(McpAnswer::Closed(RequestStatus::Expired)) => Ok(json!({
                "decision": "continue",
                "auto": true,
                "reason": format!("no operator answer within {} s", timeout.as_secs()),
                "request_id": request_id,
            })),
            Some(McpAnswer::Closed(status)) => Ok(json!({
                "decision": "stop",
                "reason": format!("the prompt was {} before the operator answered", status.as_str()),
                "request_id": request_id,
            })),
            None => Err(Fail::refused(
                "session_ended",
                "the session ended before the operator answered",
            )),
        }
    }

    async fn standby(&self, args: Args, ctx: &RequestContext<RoleServer>) -> ToolResult {
        let t = self.target(ctx).await?;
        let timeout = args
            .u64("timeout_seconds")
            .map(Duration::from_secs)
            .unwrap_or(self.deps().approval_timeout);
        let (tx, mut rx) = oneshot::channel();
        send(
            &t.actor,
            McpCall::Standby {
                message: args.str("message").map(str::to_owned),
                reply: tx,
            },
        )?;
        let mut guard = StandbyGuard {
            actor: t.actor.clone(),
            armed: true,
        };
        let resumed = |text: String| json!({"status": "resumed", "instruction": text});
        let timed_out = json!({"status": "timeout"});
        match wait_for(&mut rx, timeout, &ctx.ct).await {
            Waited::Answer(Some(text)) => {
                guard.disarm();
                Ok(resumed(text))
            }
            Waited::Answer(None) => {
                guard.disarm();
                Ok(timed_out)
            }
            Waited::Closed => {
                guard.disarm();
                // Another standby took over, or the session ended.
                match self.lookup(&t.id).await? {
                    Some(_) => Ok(
                        json!({"status": "timeout", "reason": "a newer standby call is waiting"}),
                    ),
                    None => Err(Fail::ended()),
                }
            }
            Waited::TimedOut => {
                guard.abandon();
                // An instruction may have been handed over just before.
                match tokio::time::timeout(ACTOR_TIMEOUT, &mut rx).await {
                    Ok(Ok(Some(text))) => Ok(resumed(text)),
                    _ => Ok(timed_out),
                }
            }
            Waited::Cancelled => {
                guard.abandon();
                if let Ok(Ok(Some(text))) = tokio::time::timeout(ACTOR_TIMEOUT, &mut rx).await {
                    // Handed over as the client left: queue it again.
                    let actor = t.actor.clone();
                    let _ = ask(
                        &actor,
                        "session (re-queue steering)",
                        ACTOR_TIMEOUT,
                        |reply| SessionMsg::Steer {
                            text,
                            interrupt: false,
                            caller: Caller::local(),
                            reply,
                        },
                    )
                    .await;
                }
                Err(Fail::Cancelled)
            }
        }
    }

    async fn ping(&self, args: Args, ctx: &RequestContext<RoleServer>) -> ToolResult {
        let t = self.target(ctx).await?;
        let status = args.str("status_message").map(str::to_owned);
        let progress = args.progress("progress_snapshot");
        let (tx, rx) = oneshot::channel();
        send(
            &t.actor,
            McpCall::Ping {
                status,
                progress,
                reply: tx,
            },
        )?;
        let steering = match tokio::time::timeout(ACTOR_TIMEOUT, rx).await {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => return Err(Fail::ended()),
            Err(_) => return Err(Fail::refused("internal", "the session did not answer")),
        };
        let texts: Vec<String> = steering.into_iter().map(|s| s.text).collect();
        Ok(json!({"queued_steering": texts}))
    }

    async fn broadcast(&self, args: Args, ctx: &RequestContext<RoleServer>) -> ToolResult {
        let t = self.target(ctx).await?;
        let level = match args.str_or("level", "info") {
            "warning" => NoticeLevel::Warning,
            "error" => NoticeLevel::Error,
            _ => NoticeLevel::Info,
        };
        send(
            &t.actor,
            McpCall::Broadcast {
                message: args.str_or("message", "").trim().to_owned(),
                level,
            },
        )?;
        Ok(json!({"posted": true}))
    }

    /// Asks the approval policy (rules + the session's mode) without asking
    /// the operator.
    async fn auto_check(&self, args: Args, ctx: &RequestContext<RoleServer>) -> ToolResult {
        let t = self.target(ctx).await?;
        let snap = ask(
            &t.actor,
            "session (snapshot)",
            ACTOR_TIMEOUT,
            SessionMsg::Snapshot,
        )
        .await?;
        let facts = auto_check_facts(&args, &t, &self.deps().server_files);
        let verdict =
            intercom_actors::rules::evaluate(&self.deps().rules.current(), snap.mode, &facts);
        let matched = verdict.rule.clone().or_else(|| {
            (verdict.action != intercom_actors::rules::RuleAction::Ask)
                .then(|| format!("mode:{}", snap.mode.as_str()))
        });
        Ok(json!({
            "auto_approved": verdict.action == intercom_actors::rules::RuleAction::Allow,
            "denied": verdict.action == intercom_actors::rules::RuleAction::Deny,
            "matched_rule": matched,
            "reason": verdict.why,
        }))
    }

    async fn reboot(&self, args: Args, ctx: &RequestContext<RoleServer>) -> ToolResult {
        let t = self.target(ctx).await?;
        let store = &self.deps().store;
        let id = match args.str("session_id") {
            Some(s) => SessionId::from(s.trim()),
            None => t.id.clone(),
        };
        let record = store
            .get_session(&id)
            .await
            .map_err(storage)?
            .ok_or_else(|| {
                Fail::Params(format!("argument `session_id`: there is no session {id}"))
            })?;
        if id != t.id && record.workspace != t.workspace {
            return Err(Fail::Params(format!(
                "argument `session_id`: session {id} belongs to another workspace than this connection's"
            )));
        }
        let (pending, queued, reported) = match self.lookup(&id).await? {
            Some(actor) => {
                let snap = ask(
                    &actor,
                    "session (snapshot)",
                    ACTOR_TIMEOUT,
                    SessionMsg::Snapshot,
                )
                .await?;
                (snap.pending, snap.queued, snap.last_progress)
            }
            None => (
                store
                    .list_requests(Some(&id), true)
                    .await
                    .map_err(storage)?,
                store.undelivered_steering(&id).await.map_err(storage)?,
                None,
            ),
        };
        // The live session's last ping; otherwise (ACP sessions, ended
        // ones) the last plan in the transcript.
        let mut last_progress = reported;
        if last_progress.is_none() {
            let transcript = store.transcript(&id).await.map_err(storage)?;
            last_progress = transcript
                .iter()
                .rev()
                .find(|m| m.kind == MessageKind::Plan)
                .map(|m| {
                    let plan = serde_json::from_str::<Value>(&m.content)
                        .unwrap_or_else(|_| Value::String(m.content.clone()));
                    json!({"plan": plan, "at": m.created_at})
                });
        }
        Ok(json!({
            "session_id": id,
            "status": record.status.as_str(),
            "pending": pending.iter().map(pending_json).collect::<Vec<_>>(),
            "queued_steering": queued.into_iter().map(|s| s.text).collect::<Vec<_>>(),
            "last_progress": last_progress.unwrap_or(Value::Null),
        }))
    }
}

impl ServerHandler for IntercomMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "agent-intercom",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
            .with_instructions(
                "agent-intercom puts a human operator in the loop. Call check_clearance before changing a file and check_diff to apply an approved change; transmit to ask whether to continue; standby to wait for instructions; ping regularly with progress (it returns queued operator instructions); broadcast for status lines.",
            )
    }

    /// Only the versions with an `initialize` handshake: each MCP session
    /// is one core session, and 2026-07-28 clients have no sessions. Clients
    /// that probe with `server/discover` fall back to `initialize`.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(
            &ProtocolVersion::LATEST_WITH_INITIALIZE,
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::definitions()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools::definitions().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let Some(spec) = tools::spec(&name) else {
            let known: Vec<&str> = tools::SPECS.iter().map(|s| s.name).collect();
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool `{name}`; this server has: {}",
                    known.join(", ")
                ),
                None,
            ));
        };
        let args = tools::validate(spec, request.arguments)
            .map_err(|message| ErrorData::invalid_params(message, None))?;
        let ctx = &context;
        let result = match spec.name {
            "check_clearance" => self.check_clearance(args, ctx).await,
            "check_diff" => self.check_diff(args, ctx).await,
            "auto_check" => self.auto_check(args, ctx).await,
            "transmit" => self.transmit(args, ctx).await,
            "standby" => self.standby(args, ctx).await,
            "ping" => self.ping(args, ctx).await,
            "broadcast" => self.broadcast(args, ctx).await,
            _ => self.reboot(args, ctx).await,
        };
        match result {
            Ok(value) => Ok(CallToolResult::structured(value).into()),
            Err(Fail::Params(message)) => Err(ErrorData::invalid_params(message, None)),
            Err(Fail::Refused { code, message }) => {
                tracing::info!(tool = %name, code, "{message}");
                let value = json!({"error": message, "code": code});
                let mut result = CallToolResult::error(vec![ContentBlock::text(value.to_string())]);
                result.structured_content = Some(value);
                Ok(result.into())
            }
            Err(Fail::Cancelled) => Err(ErrorData::internal_error(
                format!("{name} was cancelled by the client"),
                None,
            )),
        }
    }
}

/// What `auto_check` knows about the action, as rule facts. `kind` accepts
/// ACP tool kinds and the older names (`terminal_command` = execute,
/// `file_operation` = edit); `context` may carry `path`/`file_path`/`paths`
/// and `command`.
fn auto_check_facts(
    args: &Args,
    t: &Target,
    server_files: &intercom_actors::workspace_fs::ServerFiles,
) -> intercom_actors::rules::RequestFacts {
    let tool = args.str_or("tool_name", "").trim().to_owned();
    let kind = match args.str("kind").map(str::trim) {
        Some("terminal_command" | "command" | "shell") => Some("execute".to_owned()),
        Some("file_operation" | "file_write" | "write") => Some("edit".to_owned()),
        Some(k) if !k.is_empty() => Some(k.to_owned()),
        _ => None,
    };
    let context = args
        .value("context")
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    let mut paths: Vec<String> = ["path", "file_path"]
        .iter()
        .filter_map(|k| {
            context
                .get(*k)
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    if let Some(list) = context.get("paths").and_then(serde_json::Value::as_array) {
        paths.extend(
            list.iter()
                .filter_map(serde_json::Value::as_str)
                .map(str::to_owned),
        );
    }
    let command = context
        .get("command")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .or_else(|| (kind.as_deref() == Some("execute")).then(|| tool.clone()));
    let mut server_file = false;
    let (relative, inside) = match &t.cwd {
        Some(cwd) => {
            let root = cwd.canonicalize().unwrap_or_else(|_| cwd.clone());
            let mut inside = true;
            let rel = paths
                .iter()
                .map(|p| {
                    match intercom_actors::fsjail::resolve_inside(cwd, std::path::Path::new(p)) {
                        Ok(real) => {
                            server_file |= server_files.covers(&real);
                            real.strip_prefix(&root)
                                .map(|r| r.display().to_string())
                                .unwrap_or_else(|_| p.clone())
                        }
                        Err(_) => {
                            inside = false;
                            p.clone()
                        }
                    }
                })
                .collect();
            (rel, inside)
        }
        None => (paths.clone(), false),
    };
    intercom_actors::rules::RequestFacts {
        kind,
        paths: relative,
        paths_inside: inside,
        server_file,
        command,
        agent: "mcp".to_owned(),
        workspace: t.workspace.clone(),
        session: t.id.clone(),
    }
}
