//! The MCP handler: one per MCP session, bound lazily to one core session.
//!
//! [`IntercomMcp`] is what rmcp runs for an MCP session. Its first tool call
//! attaches a core session (`SupervisorMsg::Attach`) for the workspace named
//! in the connection's query string; every later call goes to that session's
//! actor as an [`McpCall`]. Bridged connections (an ACP session's bridge
//! token, checked in `auth.rs`) act for that ACP session instead, never
//! create one, and may name no other session or another session's request
//! (`confine.rs`). When rmcp drops the handler — the MCP session was
//! deleted, expired or the server is shutting down — the core session is
//! told `Disconnected`.
//!
//! Blocking tools wait for their answer, their timeout, or the client's
//! cancellation (`notifications/cancelled` cancels the request's token;
//! dropping the future does the same through a guard): a cancelled call
//! closes its pending request as `cancelled`, a timed-out one as `expired`.
//!
//! `check_clearance` records a hash of each target file when it asks, with
//! the request in SQLite; `check_diff` (in `apply.rs`) applies an approved
//! change only while those files are unchanged, unless `force` is given.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Query;
use axum::http::request::Parts;
use intercom_actors::model::{MessageKind, PendingRequest, RequestStatus, SessionId};
use intercom_actors::ports::{Clearance, NoticeLevel};
use intercom_actors::registry::RegistryMsg;
use intercom_actors::rules::MAX_REQUEST_PATHS;
use intercom_actors::session::{Caller, McpAnswer, McpCall, SessionMsg};
use intercom_actors::supervisor::{AttachRequest, SupervisorMsg, directory};
use intercom_actors::text::shorten;
use intercom_actors::transcript::TranscriptPage;
use intercom_actors::workspace_fs::WorkspaceFs;
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

use super::patch::{self, Change};

mod apply;
mod clearance;
mod confine;
mod facts;
mod placement;
mod waits;

use super::tools::{self, Args};
use super::{ACTOR_TIMEOUT, ActorCallError, BridgedSession, McpDeps, ask};
use apply::{record_targets, whole_as_diff};
use clearance::{clearance_answer, clearance_change, clearance_outcome, clearance_paths};
use confine::Reach;
use facts::auto_check_facts;
use placement::Connection;

/// The longest text argument shown to the operator (a `broadcast`, a
/// `ping` status, a `standby` message, a clearance's title and
/// description), in bytes: each is kept in the transcript or the request,
/// where 4 MB messages had no bound.
const TEXT_MAX: usize = 64 * 1024;
use waits::{RequestGuard, StandbyGuard, Waited, send, wait_for};

/// Owner of sessions attached over MCP (the local operator's id).
const OWNER: &str = "local";
/// Attaching may wait for the session actor to start.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);

/// State shared by every MCP connection: the dependencies and which
/// credential opened each MCP session (checked by `auth.rs`). What a
/// session asked and applied lives in SQLite (clearances) and in its
/// session actor (last progress), never in a map here.
pub(crate) struct Shared {
    pub(crate) deps: McpDeps,
    pub(crate) owners: Arc<super::session_owners::SessionOwners>,
    /// rmcp's session manager, to close a credential's idle session at its
    /// cap (set once the service is built).
    pub(crate) sessions: std::sync::OnceLock<Arc<super::Sessions>>,
}

impl Shared {
    pub(crate) fn new(deps: McpDeps) -> Self {
        Shared {
            deps,
            owners: Arc::default(),
            sessions: std::sync::OnceLock::new(),
        }
    }

    /// The live workspace map (it changes with config reloads).
    pub(crate) async fn workspace_map(
        &self,
    ) -> Result<intercom_actors::registry::WorkspaceMap, super::ActorCallError> {
        let registry = self.deps.registry.get();
        super::ask(
            &registry,
            "workspace registry",
            super::ACTOR_TIMEOUT,
            RegistryMsg::Get,
        )
        .await
    }

    /// The workspace at `root` as a directory handle, guarded like ACP agents'.
    fn workspace(&self, root: &Path) -> Result<Arc<WorkspaceFs>, Fail> {
        WorkspaceFs::open(root, self.deps.server_files.clone())
            .map(Arc::new)
            .map_err(|e| Fail::refused("no_workspace", e.to_string()))
    }
}

/// The rmcp handler for one MCP session.
/// The most tool calls one MCP session may have running at once. Blocking
/// calls (`standby`, `check_clearance`) each hold a connection for up to an
/// hour: a probe held 19,950 on one session and ran the server out of file
/// descriptors.
pub(crate) const MAX_CALLS_IN_FLIGHT: usize = 16;

/// One running tool call of an MCP session; the slot frees when dropped.
struct InFlight(Arc<std::sync::atomic::AtomicUsize>);

impl InFlight {
    fn take(count: &Arc<std::sync::atomic::AtomicUsize>) -> Option<InFlight> {
        use std::sync::atomic::Ordering;
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_CALLS_IN_FLIGHT).then_some(n + 1)
            })
            .ok()
            .map(|_| InFlight(count.clone()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

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
    /// Which other sessions the caller may name (a bridge token: none).
    reach: Reach,
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

fn storage(e: impl std::fmt::Display) -> Fail {
    Fail::refused("storage", format!("storage failed: {e}"))
}

/// Bytes of a title or path `reboot` lists per request: it lists what the
/// client sent (64 KiB each), and a probe's client made its answer 1.95 MB
/// with 15 requests, then asked for it 160 times without reading: the
/// server held 530 MB of answers nobody read. Cut, each says its length.
const LISTED_TEXT_MAX: usize = 1024;

/// Bytes of `last_progress` (the client's own `ping`) `reboot` repeats;
/// past them it says how long it was instead.
const LISTED_PROGRESS_MAX: usize = 16 * 1024;

fn pending_json(p: &PendingRequest) -> Value {
    json!({
        "request_id": p.id,
        "kind": p.kind.as_str(),
        "title": shorten(&p.title, LISTED_TEXT_MAX),
        "file_path": p.paths.first().map(|f| shorten(f, LISTED_TEXT_MAX)),
        "status": p.status.as_str(),
        "created_at": p.created_at,
    })
}

/// `last_progress` as `reboot` repeats it: whole up to
/// [`LISTED_PROGRESS_MAX`] bytes of JSON, else how long it was.
fn bounded_progress(progress: Value) -> Value {
    let bytes = progress.to_string().len();
    if bytes <= LISTED_PROGRESS_MAX {
        return progress;
    }
    json!({"cut": format!("the last progress report is {bytes} bytes; reboot repeats at most {LISTED_PROGRESS_MAX}")})
}

impl IntercomMcp {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        IntercomMcp {
            shared,
            conn: Arc::new(Connection {
                bound: tokio::sync::Mutex::new(None),
                in_flight: Arc::default(),
            }),
        }
    }

    fn deps(&self) -> &McpDeps {
        &self.shared.deps
    }

    /// Writes an audit entry of what the caller (the agent side) did or was
    /// refused, on the session it acts on; a failed write is logged.
    async fn audit_agent(&self, t: &Target, action: &str, detail: serde_json::Value) {
        self.audit_on(&t.id, action, detail).await;
    }

    /// [`Self::audit_agent`] on session `id` (a change applied is the
    /// request's session's, whichever connection applied it).
    async fn audit_on(&self, id: &SessionId, action: &str, detail: serde_json::Value) {
        let entry = intercom_actors::model::AuditEntry {
            session_id: Some(id.clone()),
            actor: "agent".into(),
            action: action.into(),
            detail,
        };
        if let Err(e) = self.deps().store.audit(&entry).await {
            tracing::error!(session = %id, "audit write failed: {e}");
        }
    }

    async fn check_clearance(&self, args: Args, ctx: &RequestContext<RoleServer>) -> ToolResult {
        let t = self.target(ctx).await?;
        // Cancelled by the client, or by its hanging up (its answer could
        // not reach it any more).
        let (call_ended, _call) = super::hangup::cancelled_or_hung_up(ctx);
        let title = bounded(&args, "title")?.unwrap_or_default();
        let description = bounded(&args, "description")?.unwrap_or_default();
        let diff = args.str_or("diff", "").to_owned();
        let file_path = args.str_or("file_path", "").trim().to_owned();
        let change = clearance_change(&diff, &file_path)?;
        let paths = clearance_paths(&change, &file_path, t.cwd.as_deref())?;
        let (recorded, diff) = match &t.cwd {
            Some(root) => {
                let ws = self.shared.workspace(root)?;
                let recorded = record_targets(&ws, &change, &file_path).await?;
                let shown = match &change {
                    Change::Whole(new) => whole_as_diff(&ws, &file_path, new).await?,
                    Change::Diff(_) => None,
                };
                (recorded, shown.unwrap_or(diff))
            }
            None => (Vec::new(), diff),
        };
        let (opened_tx, opened_rx) = oneshot::channel();
        let (tx, mut rx) = oneshot::channel();
        send(
            &t.actor,
            McpCall::Clearance {
                title,
                description,
                diff: Some(diff),
                paths,
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
        let answer = clearance_answer(&mut rx, &mut guard, timeout, &call_ended).await?;
        guard.disarm();
        clearance_outcome(request_id, answer, timeout)
    }

    async fn transmit(&self, args: Args, ctx: &RequestContext<RoleServer>) -> ToolResult {
        let t = self.target(ctx).await?;
        // Cancelled by the client, or by its hanging up (its answer could
        // not reach it any more).
        let (call_ended, _call) = super::hangup::cancelled_or_hung_up(ctx);
        let (opened_tx, opened_rx) = oneshot::channel();
        let (tx, mut rx) = oneshot::channel();
        send(
            &t.actor,
            McpCall::Transmit {
                text: bounded(&args, "prompt_text")?.unwrap_or_default(),
                kind: args.str_or("prompt_type", "continuation").trim().to_owned(),
                opened: opened_tx,
                reply: tx,
            },
        )?;
        let mut guard = RequestGuard::new(t.actor.clone(), opened_rx);
        let request_id = guard.opened().await?;
        let timeout = self.deps().transmit_timeout;
        let answer = match wait_for(&mut rx, timeout, &call_ended).await {
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
        // Cancelled by the client, or by its hanging up (its answer could
        // not reach it any more).
        let (call_ended, _call) = super::hangup::cancelled_or_hung_up(ctx);
        let timeout = args
            .u64("timeout_seconds")
            .map(Duration::from_secs)
            .unwrap_or(self.deps().approval_timeout);
        let (tx, mut rx) = oneshot::channel();
        send(
            &t.actor,
            McpCall::Standby {
                message: bounded(&args, "message")?,
                reply: tx,
            },
        )?;
        let mut guard = StandbyGuard {
            actor: t.actor.clone(),
            armed: true,
        };
        let resumed = |text: String| json!({"status": "resumed", "instruction": text});
        let timed_out = json!({"status": "timeout"});
        match wait_for(&mut rx, timeout, &call_ended).await {
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
        let status = bounded(&args, "status_message")?;
        // Shown as a plan and kept in the event journal: bounded like the
        // other texts (a probe's 3.8 MB snapshots evicted every other
        // session's event history).
        let progress = args.progress("progress_snapshot");
        let progress_bytes: usize = progress.iter().map(|(l, s)| l.len() + s.len()).sum();
        if progress_bytes > TEXT_MAX {
            return Err(Fail::Params(format!(
                "argument `progress_snapshot` is {progress_bytes} bytes, at most {TEXT_MAX}: send a summary"
            )));
        }
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
        let message = bounded(&args, "message")?.unwrap_or_default();
        send(&t.actor, McpCall::Broadcast { message, level })?;
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
        let facts = auto_check_facts(&args, &t, &self.deps().server_files)?;
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
        // Before the lookup: a bridge token learns nothing of other sessions.
        self.ensure_reach(&t, "reboot", &id, None).await?;
        let record = store
            .get_session(&id)
            .await
            .map_err(storage)?
            .ok_or_else(|| {
                Fail::Params(format!("argument `session_id`: there is no session {id}"))
            })?;
        if id != t.id {
            let own = store.get_session(&t.id).await.map_err(storage)?;
            let why = match &own {
                Some(own) => confine::may_name(own, &record).err(),
                None => Some("cannot be reached from this connection"),
            };
            if let Some(why) = why {
                return Err(Fail::Params(format!(
                    "argument `session_id`: session {id} {why}"
                )));
            }
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
            let latest = TranscriptPage::latest_of(MessageKind::Plan);
            let plans = store.transcript_page(&id, latest).await.map_err(storage)?;
            last_progress = plans.entries.last().map(|m| {
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
            "last_progress": last_progress.map_or(Value::Null, bounded_progress),
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
        let Some(_slot) = InFlight::take(&self.conn.in_flight) else {
            return Err(ErrorData::invalid_request(
                format!(
                    "this MCP session already has {MAX_CALLS_IN_FLIGHT} tool calls in flight; wait for one to finish"
                ),
                None,
            ));
        };
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
                // The message quotes the agent's paths and hunk headers.
                tracing::info!(tool = %name, code, "{}", intercom_actors::text::one_line(&message, 500));
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

/// A text argument the operator is shown (a broadcast, a status line, a
/// standby message), trimmed, at most [`TEXT_MAX`] bytes. A probe stored
/// ten pings and standbys of 3.9 MB each in the transcript.
fn bounded(args: &Args, name: &str) -> Result<Option<String>, Fail> {
    let Some(text) = args.str(name).map(str::trim) else {
        return Ok(None);
    };
    if text.len() > TEXT_MAX {
        return Err(Fail::Params(format!(
            "argument `{name}` is {} bytes, at most {TEXT_MAX}: send a summary (the details belong in a file)",
            text.len()
        )));
    }
    Ok(Some(text.to_owned()))
}
