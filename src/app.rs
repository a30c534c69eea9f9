//! The running server's wiring: one [`App`] per process.
//!
//! It owns the opened store, the Root actor (which supervises the
//! WorkspaceRegistry, the SessionSupervisor and, with Slack, the
//! SlackGateway: [`crate::root`]) and a local event feed, and offers the operations every entry point
//! needs (the HTTP API now, Slack and MCP later): start a session, look one
//! up, steer, decide on an approval by its global id, cancel, list. Each
//! operation returns an [`AppError`] whose [`AppError::code`] is the stable
//! machine-readable code the HTTP API sends.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use intercom_actors::model::{PendingRequest, SessionId, SessionRecord};
use intercom_actors::ports::{FanOut, OperatorEvent, OperatorSink, SessionStore};
use intercom_actors::registry::{RegistryMsg, Target};
use intercom_actors::session::{Caller, SessionMsg, SessionSettings, SessionSnapshot};
use intercom_actors::supervisor::{
    OPERATOR_CALL, StartRequest, SupervisorArgs, SupervisorMsg, directory, steer_session,
};
use intercom_actors::transcript::{TranscriptPage, TranscriptSlice};
use ractor::{Actor, ActorRef};
use tokio::sync::{broadcast, watch};

use crate::config::Config;
use crate::root::{Current, RestartBudget, Root, RootArgs, RootMsg, TreeFailure};
use crate::storage::SqliteStore;
use intercom_actors::rules::{ApprovalMode, Rule, SharedRules};
use std::collections::BTreeMap;

mod approvals;
mod config_choice;
mod config_rules;
use config_rules::Fixed;
mod in_force;
use in_force::{ConfigInForce, InForce};
mod control;
mod errors;

pub use config_choice::{ConfigChoice, DEFAULT_CONFIG, EXAMPLE_CONFIG, choose_config};
pub use errors::{AppError, AppStartError};

/// Owner recorded for sessions started through the local API.
pub const LOCAL_OWNER: &str = "local";

/// How many operator events the local feed buffers per subscriber.
const EVENT_BUFFER: usize = 1024;

/// How long a cancel waits for the session to end before answering anyway.
const CANCEL_MARGIN: Duration = Duration::from_secs(1);

/// How long the agent may take to answer a mode / model / option switch.
const AGENT_OPTION_TIMEOUT_MS: u64 = 15_000;

/// How long a snapshot of a live session may take.
const SNAPSHOT_TIMEOUT_MS: u64 = 2000;

/// Every call to an actor is timed: a stuck actor is an error the caller
/// can report, never a request that hangs. This is the default bound,
/// generous because a decision waits for its commit (a storage outage
/// that just ended, a loaded machine).
const CALL_TIMEOUT_MS: u64 = 30_000;

/// `/healthz` answers 503 within a second when the supervisor is stuck.
const HEALTH_TIMEOUT_MS: u64 = 800;

/// Recovery respawns every stored live session (not waiting for their
/// handshakes), one after the other.
const RECOVER_TIMEOUT_MS: u64 = 300_000;

/// A start or revive answers after the agent's handshake: the startup
/// timeout plus this margin.
const START_MARGIN_MS: u64 = 10_000;

/// The local operator feed: every [`OperatorEvent`] on a broadcast channel
/// (for `cancel` waiting on the end of a session, and future streaming).
#[derive(Debug)]
pub struct LocalEvents {
    tx: broadcast::Sender<OperatorEvent>,
}

impl LocalEvents {
    /// A feed with no subscribers yet.
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(EVENT_BUFFER);
        LocalEvents { tx }
    }

    /// A receiver for events emitted from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<OperatorEvent> {
        self.tx.subscribe()
    }
}

impl Default for LocalEvents {
    fn default() -> Self {
        Self::new()
    }
}

impl OperatorSink for LocalEvents {
    fn emit(&self, event: OperatorEvent) {
        tracing::debug!(session = %event.session_id(), event = ?event.kind(), "operator event");
        // No subscriber is fine: the store has everything.
        let _ = self.tx.send(event);
    }
}

/// A session with what is waiting on it, for `GET /api/sessions/{id}`.
#[derive(Debug, Clone)]
pub struct SessionDetail {
    /// The stored record.
    pub record: SessionRecord,
    /// Its pending requests (from the store).
    pub pending: Vec<PendingRequest>,
    /// The actor's view, when an agent is attached.
    pub live: Option<SessionSnapshot>,
    /// The approval mode: the live actor's, else the stored one.
    pub mode: ApprovalMode,
}

/// Whether Slack is connected, for `/healthz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlackState {
    /// No tokens: local operator mode.
    Disabled,
    /// Socket Mode is connected.
    Connected,
    /// Socket Mode is reconnecting.
    Reconnecting,
}

impl SlackState {
    /// The `/healthz` word.
    pub fn as_str(self) -> &'static str {
        match self {
            SlackState::Disabled => "disabled",
            SlackState::Connected => "connected",
            SlackState::Reconnecting => "reconnecting",
        }
    }
}

impl SlackState {
    fn to_u8(self) -> u8 {
        match self {
            SlackState::Disabled => 0,
            SlackState::Connected => 1,
            SlackState::Reconnecting => 2,
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => SlackState::Connected,
            2 => SlackState::Reconnecting,
            _ => SlackState::Disabled,
        }
    }
}

/// What other edges plug into the application at start.
#[derive(Default)]
pub struct AppOptions {
    /// Sinks that receive every operator event besides the local feed
    /// (the Slack gateway).
    pub extra_sinks: Vec<Arc<dyn OperatorSink>>,
    /// This server's MCP endpoint, handed to ACP agents that support HTTP MCP.
    pub bridge_url: Option<String>,
}

struct Inner {
    store: Arc<SqliteStore>,
    /// Every operator side (console/API stream, journal, Slack): what the
    /// sessions' actors report to, for the few events the App itself raises.
    sink: Arc<dyn OperatorSink>,
    supervisor: ActorRef<SupervisorMsg>,
    /// The workspace registry's current incarnation (Root restarts it).
    registry: Current<RegistryMsg>,
    /// The top of the actor tree.
    root: ActorRef<RootMsg>,
    /// Set by Root when the server must stop (a child it does not restart).
    failure: watch::Receiver<Option<TreeFailure>>,
    events: Arc<LocalEvents>,
    /// Every operator event, stored with an id (`GET /api/events`).
    journal: Arc<crate::journal::EventJournal>,
    slack: AtomicU8,
    /// Set once when a graceful shutdown begins (for `/healthz`): a latch,
    /// never cleared.
    stopping: AtomicBool,
    /// Config rules + operator rules, as sessions see them.
    rules: SharedRules,
    /// One rules refresh at a time (see `App::refresh_rules`): a critical
    /// section, not shared state; the rules themselves are `rules`.
    rules_refresh: tokio::sync::Mutex<()>,
    /// What the App reads of the config in force (its rules and modes,
    /// warnings, a broken or held edit): one snapshot, replaced whole.
    in_force: ConfigInForce,
    /// What a reload cannot change (the database, the listening address),
    /// as the server started with it.
    fixed: Fixed,
    /// How long `cancel` waits for a session to end: the shutdown grace,
    /// SIGTERM -> SIGKILL, and a second for the exit to be recorded.
    cancel_wait: Duration,
    /// How long a start or revive may wait for the agent's handshake.
    start_wait_ms: u64,
    /// How long the supervisor's graceful shutdown may take.
    shutdown_wait_ms: u64,
}

/// What `cancel` found when it stopped waiting.
#[derive(Debug, Clone)]
pub struct CancelOutcome {
    /// The session as stored.
    pub record: SessionRecord,
    /// True when the agent was still being terminated (answered `202`
    /// `"stopping"`, never a stale `active`).
    pub stopping: bool,
}

/// The running application; cheap to clone (shared).
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

/// What `config` warns about (a missing agent binary or workspace
/// directory), each logged: at the start and at every reload.
fn logged_warnings(config: &Config) -> Vec<String> {
    let warnings = config.warnings();
    for w in &warnings {
        tracing::warn!("{w}");
    }
    warnings
}

fn session_settings(config: &Config, rules: SharedRules) -> SessionSettings {
    SessionSettings {
        rules,
        limits: config.limits.clone(),
        stall: config.stall.clone(),
        operators: config
            .slack
            .operators
            .iter()
            .cloned()
            .collect::<HashSet<_>>(),
        server_files: config.server_files(),
    }
}

impl App {
    /// Spawns Root (and under it the registry and the supervisor) over an opened store, with
    /// what `options` plugs in. Does not recover sessions: call
    /// [`App::recover`] once the server can take requests.
    pub async fn start(
        config: &Config,
        store: SqliteStore,
        options: AppOptions,
    ) -> Result<App, AppStartError> {
        let operator_rules = store.list_rules().await.map_err(|e| AppStartError::Spawn {
            actor: "rule loader",
            message: e.to_string(),
        })?;
        let rules = SharedRules::new(config.rules.iter().cloned().chain(operator_rules).collect());
        let store = Arc::new(store);
        let events = Arc::new(LocalEvents::new());
        let journal = crate::journal::EventJournal::start(store.clone());
        let mut sinks: Vec<Arc<dyn OperatorSink>> = vec![events.clone(), journal.clone()];
        sinks.extend(options.extra_sinks);
        let sink: Arc<dyn OperatorSink> = Arc::new(FanOut(sinks));
        let supervisor = SupervisorArgs {
            policy: config.supervision.clone(),
            settings: Arc::new(session_settings(config, rules.clone())),
            store: store.clone(),
            sink: sink.clone(),
            bridge_url: options.bridge_url,
        };
        let root_args = RootArgs {
            map: config.workspace_map(),
            supervisor,
            budget: RestartBudget::default(),
        };
        let (root, _) =
            Actor::spawn(None, Root, root_args)
                .await
                .map_err(|e| AppStartError::Spawn {
                    actor: "root",
                    message: e.to_string(),
                })?;
        let children = ractor::call_t!(root, RootMsg::Children, CALL_TIMEOUT_MS).map_err(|e| {
            AppStartError::Spawn {
                actor: "root",
                message: e.to_string(),
            }
        })?;
        let inner = Inner {
            store,
            sink,
            supervisor: children.supervisor,
            registry: children.registry,
            root,
            failure: children.failure,
            events,
            journal,
            slack: AtomicU8::new(SlackState::Disabled.to_u8()),
            stopping: AtomicBool::new(false),
            rules,
            rules_refresh: tokio::sync::Mutex::new(()),
            in_force: ConfigInForce::new(InForce {
                rules: config.rules.clone(),
                modes: config.workspace_modes.clone(),
                warnings: logged_warnings(config),
                ..InForce::default()
            }),
            fixed: Fixed::of(config),
            cancel_wait: config.limits.shutdown_grace()
                + intercom_actors::session::TERM_TO_KILL
                + CANCEL_MARGIN,
            start_wait_ms: config
                .limits
                .startup_timeout_secs
                .saturating_mul(1000)
                .saturating_add(START_MARGIN_MS),
            shutdown_wait_ms: (config.limits.shutdown_grace()
                + intercom_actors::session::TERM_TO_KILL)
                .as_millis()
                .try_into()
                .unwrap_or(u64::MAX)
                .saturating_add(START_MARGIN_MS),
        };
        Ok(App {
            inner: Arc::new(inner),
        })
    }

    /// The workspaces and agent profiles in force (as the registry holds
    /// them since the last reload).
    pub async fn workspace_map(&self) -> Result<intercom_actors::registry::WorkspaceMap, AppError> {
        ractor::call!(self.registry().get(), RegistryMsg::Get)
            .map_err(|e| AppError::actor("workspace registry", e))
    }

    /// After a server restart: resumes or interrupts the sessions stored as
    /// live. Returns (resumed, interrupted).
    pub async fn recover(&self) -> Result<(usize, usize), AppError> {
        let map = self.workspace_map().await?;
        ractor::call_t!(
            self.inner.supervisor,
            |reply| SupervisorMsg::Recover { map, reply },
            RECOVER_TIMEOUT_MS
        )
        .map_err(|e| AppError::actor("recovery", e))
    }

    /// The local event feed.
    pub fn subscribe(&self) -> broadcast::Receiver<OperatorEvent> {
        self.inner.events.subscribe()
    }

    /// The stored event journal behind `GET /api/events`.
    pub fn journal(&self) -> &Arc<crate::journal::EventJournal> {
        &self.inner.journal
    }

    /// A page of the audit log, newest first (optionally one session's).
    pub async fn audit_page(
        &self,
        session: Option<&SessionId>,
        bounds: crate::storage::pages::Bounds,
    ) -> Result<crate::storage::pages::Page<(i64, intercom_actors::model::AuditEntry)>, AppError>
    {
        Ok(self.inner.store.audit_page(session, bounds).await?)
    }

    /// Nudges a live session's agent now.
    pub async fn nudge(&self, id: &SessionId, caller: Caller) -> Result<(), AppError> {
        let record = self.session(id).await?;
        let Some(actor) = self.actor(id).await? else {
            return Err(AppError::ended(&record));
        };
        ractor::call_t!(
            actor,
            |reply| SessionMsg::Nudge { caller, reply },
            CALL_TIMEOUT_MS
        )
        .map_err(|e| AppError::actor("session", e))??;
        Ok(())
    }

    /// Slack's state for `/healthz`.
    pub fn slack(&self) -> SlackState {
        SlackState::from_u8(self.inner.slack.load(Ordering::Relaxed))
    }

    /// Records Slack's connection state (the Slack gateway calls this).
    pub fn set_slack(&self, state: SlackState) {
        self.inner.slack.store(state.to_u8(), Ordering::Relaxed);
    }

    /// The session supervisor, for edges that need more than the helpers.
    pub fn supervisor(&self) -> &ActorRef<SupervisorMsg> {
        &self.inner.supervisor
    }

    /// The workspace registry, following Root's restarts.
    pub fn registry(&self) -> &Current<RegistryMsg> {
        &self.inner.registry
    }

    /// The top of the actor tree (Slack starts its gateway under it).
    pub fn root(&self) -> &ActorRef<RootMsg> {
        &self.inner.root
    }

    /// The failure that stops the server, if one happened.
    pub fn failure(&self) -> Option<TreeFailure> {
        self.inner.failure.borrow().clone()
    }

    /// Resolves once the actor tree failed in a way Root does not restart
    /// (`serve` then shuts down and exits non-zero).
    pub async fn failed(&self) -> TreeFailure {
        let mut failure = self.inner.failure.clone();
        match failure.wait_for(Option::is_some).await {
            Ok(f) => f.clone().unwrap_or_else(root_gone),
            Err(_) => root_gone(),
        }
    }

    /// The store (read access for edges that need more than the helpers).
    pub fn store(&self) -> &SqliteStore {
        &self.inner.store
    }

    /// The shared approval rule set (config + operator rules).
    pub fn shared_rules(&self) -> SharedRules {
        self.inner.rules.clone()
    }

    /// The store as the Slack outbox port.
    pub fn outbox_port(&self) -> Arc<dyn intercom_actors::slack_port::Outbox> {
        self.inner.store.clone()
    }

    /// The store as the core's port (for edges that take one).
    pub fn store_port(&self) -> Arc<dyn SessionStore> {
        self.inner.store.clone()
    }

    /// Whether a graceful shutdown has begun.
    pub fn stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::Relaxed)
    }

    /// Live sessions, including ones waiting to restart.
    pub async fn live_count(&self) -> Result<usize, AppError> {
        ractor::call_t!(
            self.inner.supervisor,
            SupervisorMsg::LiveCount,
            HEALTH_TIMEOUT_MS
        )
        .map_err(|e| AppError::actor("supervisor", e))
    }

    /// Resolves `target` and starts a session; answers once the agent's
    /// handshake finished (or failed, leaving no session behind).
    pub async fn start_session(
        &self,
        target: Target,
        prompt: &str,
        owner: &str,
    ) -> Result<SessionRecord, AppError> {
        self.start_session_in_mode(target, prompt, owner, None)
            .await
    }

    /// [`App::start_session`] with an approval mode; `None` takes the
    /// workspace's configured mode.
    pub async fn start_session_in_mode(
        &self,
        target: Target,
        prompt: &str,
        owner: &str,
        mode: Option<ApprovalMode>,
    ) -> Result<SessionRecord, AppError> {
        if intercom_actors::model::is_blank_prompt(prompt) {
            return Err(AppError::BadRequest("the prompt is empty".into()));
        }
        let resolved = ractor::call_t!(
            self.inner.registry.get(),
            RegistryMsg::Resolve,
            CALL_TIMEOUT_MS,
            target
        )
        .map_err(|e| AppError::actor("workspace registry", e))??;
        let workspace_id = resolved.workspace.clone();
        let req = StartRequest {
            workspace: resolved.workspace,
            cwd: resolved.cwd,
            channel_id: resolved.channel_id,
            profile: resolved.profile,
            prompt: prompt.to_owned(),
            owner: owner.to_owned(),
            mode: mode.or_else(|| self.workspace_mode(&workspace_id)),
        };
        let record = ractor::call_t!(
            self.inner.supervisor,
            |reply| SupervisorMsg::Start { req, reply },
            self.inner.start_wait_ms
        )
        .map_err(|e| AppError::actor("supervisor", e))??;
        tracing::info!(session = %record.id, workspace = %record.workspace, agent = %record.agent, owner, "session started");
        Ok(record)
    }

    /// One stored session.
    pub async fn session(&self, id: &SessionId) -> Result<SessionRecord, AppError> {
        self.inner
            .store
            .get_session(id)
            .await?
            .ok_or_else(|| AppError::NotFound(format!("no session {id}")))
    }

    /// Sessions, newest first: live ones, or all with `all`.
    pub async fn list_sessions(&self, all: bool) -> Result<Vec<SessionRecord>, AppError> {
        Ok(self.inner.store.list_sessions(!all).await?)
    }

    /// A session with its pending requests and, when live, the actor's view.
    pub async fn session_detail(&self, id: &SessionId) -> Result<SessionDetail, AppError> {
        // Live state first, then the record: the record is never older than
        // the snapshot it is shown with.
        let live = match self.actor(id).await? {
            Some(actor) => ractor::call_t!(actor, SessionMsg::Snapshot, SNAPSHOT_TIMEOUT_MS).ok(),
            None => None,
        };
        let record = self.session(id).await?;
        let pending = self.inner.store.list_requests(Some(id), true).await?;
        let mode = match &live {
            Some(snapshot) => snapshot.mode,
            None => {
                ApprovalMode::parse(&self.inner.store.approval_mode(id).await?).unwrap_or_default()
            }
        };
        Ok(SessionDetail {
            record,
            pending,
            live,
            mode,
        })
    }

    /// A page of a session's transcript, oldest first
    /// ([`intercom_actors::transcript`]).
    pub async fn transcript_page(
        &self,
        id: &SessionId,
        page: TranscriptPage,
    ) -> Result<TranscriptSlice, AppError> {
        self.session(id).await?;
        Ok(self.inner.store.transcript_page(id, page).await?)
    }

    /// The running actor of a session, from the named registry (never
    /// waits behind starts in the supervisor's mailbox).
    async fn actor(&self, id: &SessionId) -> Result<Option<ActorRef<SessionMsg>>, AppError> {
        Ok(directory::find(&self.inner.supervisor, id))
    }

    /// Tells every operator side something about a session (a notice in
    /// its Slack thread, the console and the event stream).
    pub fn notice(&self, session: &SessionId, text: String) {
        self.inner.sink.emit(OperatorEvent::Notice {
            session_id: session.clone(),
            level: intercom_actors::ports::NoticeLevel::Info,
            text,
        });
    }

    async fn audit(&self, actor: &str, action: &str, detail: serde_json::Value) {
        let entry = intercom_actors::model::AuditEntry {
            session_id: None,
            actor: actor.to_owned(),
            action: action.to_owned(),
            detail,
        };
        if let Err(e) = self.inner.store.audit(&entry).await {
            tracing::error!("audit write failed: {e}");
        }
    }

    /// Graceful shutdown: cancels every session (the supervisor waits its
    /// grace period, then kills), then stops the actors.
    pub async fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::Relaxed);
        if let Err(e) = ractor::call_t!(self.inner.root, RootMsg::ShuttingDown, CALL_TIMEOUT_MS) {
            tracing::debug!("root gone before shutdown: {e}");
        }
        if let Err(e) = ractor::call_t!(
            self.inner.supervisor,
            SupervisorMsg::Shutdown,
            self.inner.shutdown_wait_ms
        ) {
            tracing::warn!("supervisor shutdown call failed: {e}");
        }
        self.inner.supervisor.stop_and_wait(None, None).await.ok();
        self.inner
            .registry
            .get()
            .stop_and_wait(None, None)
            .await
            .ok();
        // Open event streams would keep a graceful HTTP shutdown waiting.
        self.inner.journal.end_streams();
    }

    /// Closes the store when this is the last reference (after
    /// [`App::shutdown`]); otherwise the store closes when the last user drops it.
    pub async fn close(self) {
        self.inner.root.stop_and_wait(None, None).await.ok();
        self.inner.journal.close().await;
        let Ok(inner) = Arc::try_unwrap(self.inner) else {
            tracing::debug!("app still shared; the store closes when dropped");
            return;
        };
        match Arc::try_unwrap(inner.store) {
            Ok(store) => store.close().await,
            Err(_) => tracing::debug!("store still shared; it closes when dropped"),
        }
    }
}

fn root_gone() -> TreeFailure {
    TreeFailure {
        actor: "root",
        reason: "the root actor stopped".into(),
    }
}

/// Splits a global request id at its last `:` into (session, request).
pub fn split_request_id(global: &str) -> Option<(SessionId, &str)> {
    let (session, request) = global.rsplit_once(':')?;
    if session.is_empty() || request.is_empty() {
        return None;
    }
    Some((SessionId(session.to_owned()), request))
}

#[cfg(test)]
mod tests {
    use super::*;
    use intercom_actors::model::SessionStatus;

    #[test]
    fn request_ids_split_at_the_last_colon() {
        let (s, r) = split_request_id("s-0123456789abcdef:req-3").expect("split");
        assert_eq!((s.0.as_str(), r), ("s-0123456789abcdef", "req-3"));
        let (s, r) = split_request_id("a:b:req-1").expect("split");
        assert_eq!((s.0.as_str(), r), ("a:b", "req-1"));
        assert!(split_request_id("nocolon").is_none());
        assert!(split_request_id(":req-1").is_none());
        assert!(split_request_id("s-1:").is_none());
    }

    #[tokio::test]
    async fn local_events_reach_subscribers() {
        let events = LocalEvents::new();
        let mut rx = events.subscribe();
        events.emit(OperatorEvent::SessionEnded {
            session_id: SessionId("s-1".into()),
            status: SessionStatus::Cancelled,
            reason: None,
        });
        let got = rx.recv().await.expect("event");
        assert_eq!(got.session_id().0, "s-1");
    }
}
