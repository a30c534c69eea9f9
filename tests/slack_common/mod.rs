//! Harness for the Slack end-to-end tests: the emulator, the core actors
//! (supervisor, registry) on a temp-file SQLite store, and `spawn_slack`
//! pointed at the emulator, with the scripted agent as the coding agent.
//! Approval rules work as in the server: config rules plus rules stored in
//! SQLite, one shared rule set the sessions read, `RulesChanged` on change
//! ([`HarnessRules`], the App's `RulesAdmin` minus the config file).
//!
//! Everything waits with deadlines ([`WAIT`]); nothing sleeps and hopes.

#![allow(dead_code)]

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use agent_intercom::storage::SqliteStore;
use intercom_actors::gateway::RetryPolicy;
use intercom_actors::gateway::pacing::PacingPolicy;
use intercom_actors::model::{Framing, Protocol, SessionId, SessionRecord};
use intercom_actors::ports::{NoticeLevel, OperatorEvent, OperatorSink, SessionStore};
use intercom_actors::registry::{RegistryMsg, WorkspaceMap, WorkspaceRegistry};
use intercom_actors::rules::{ApprovalMode, Rule, SharedRules};
use intercom_actors::session::SessionSettings;
use intercom_actors::settings::{
    AgentProfile, Limits, StallPolicy, SupervisionPolicy, WorkspaceEntry,
};
use intercom_actors::slack_port::Outbox;
use intercom_actors::supervisor::{SessionSupervisor, SupervisorArgs, SupervisorMsg};
use ractor::{Actor, ActorRef};
use serde_json::Value;

use crate::emulator::limits::RateLimits;
use crate::emulator::{Emulator, Msg};
use crate::slack::{
    self, ConnectionState, RulesAdmin, SlackHandle, SlackOptions, SlackTokens, SlackTuning,
};

/// Deadline for anything a test waits on.
pub const WAIT: Duration = Duration::from_secs(20);
/// The operator who starts sessions (and owns them).
pub const OWNER: &str = "UOWNER";
/// A user who is neither owner nor operator.
pub const STRANGER: &str = "USTRANGER";
/// The workspace's channel.
pub const CHANNEL: &str = "C1";

// One harness per test crate may include this alongside another.
#[allow(clippy::duplicate_mod)]
#[path = "../shared/scripted_agent.rs"]
mod scripted_agent;
pub use scripted_agent::agent_bin;

/// How much faster than Slack's published limits the tests' gateway paces
/// itself (and a rate-limited emulator enforces them).
pub const PACE_FACTOR: u32 = 10;

/// Fast timings for tests; pacing at Slack's limits sped up [`PACE_FACTOR`] times.
pub fn tuning() -> SlackTuning {
    SlackTuning {
        retry: RetryPolicy {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(400),
        },
        reconnect_initial: Duration::from_millis(100),
        reconnect_max: Duration::from_millis(400),
        ping_interval: Duration::from_secs(5),
        hello_timeout: Duration::from_secs(5),
        pacing: PacingPolicy::slack().faster(PACE_FACTOR),
    }
}

/// What a test changes about the server it runs against.
#[derive(Debug, Clone, Default)]
pub struct RigOptions {
    /// `limits.idle_timeout_secs`; 0 keeps the default.
    pub idle_timeout_secs: u64,
    /// Rules "from the config file".
    pub config_rules: Vec<Rule>,
    /// Seconds before a crash restart (0: at once).
    pub backoff_secs: u64,
    /// `limits.max_sessions`; 0 keeps the default.
    pub max_sessions: usize,
    /// The emulator enforces these rate limits (`None`: unlimited).
    pub emulator_limits: Option<RateLimits>,
}

/// The server's rule management for the harness: what `App` does for
/// `RulesAdmin`, over the same SQLite store and a shared rule set.
pub struct HarnessRules {
    store: Arc<SqliteStore>,
    config: Vec<Rule>,
    shared: SharedRules,
    sup: RwLock<Option<ActorRef<SupervisorMsg>>>,
    /// The operator fan-out (here: the Slack event channel), as `App` has.
    sink: RwLock<Option<Arc<dyn OperatorSink>>>,
    /// What was told through [`RulesAdmin::tell`].
    told: RwLock<Vec<String>>,
}

impl HarnessRules {
    /// The notices told to every operator side so far.
    pub fn told(&self) -> Vec<String> {
        self.told.read().expect("lock").clone()
    }
}

impl HarnessRules {
    async fn refresh(&self) -> Result<(), String> {
        let stored = self.store.list_rules().await.map_err(|e| e.to_string())?;
        self.shared
            .set(self.config.iter().cloned().chain(stored).collect());
        if let Some(sup) = self.sup.read().expect("lock").as_ref() {
            let _ = sup.send_message(SupervisorMsg::RulesChanged);
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl RulesAdmin for HarnessRules {
    async fn rules(&self) -> Result<Vec<(Rule, String)>, String> {
        let stored = self
            .store
            .list_stored_rules()
            .await
            .map_err(|e| e.to_string())?;
        Ok(self
            .config
            .iter()
            .map(|r| (r.clone(), slack::rules::CONFIG_SOURCE.to_owned()))
            .chain(stored.into_iter().map(|s| (s.rule, s.created_by)))
            .collect())
    }

    async fn add_rule(&self, mut rule: Rule, created_by: &str) -> Result<Rule, String> {
        if rule.id.is_empty() {
            rule.id = agent_intercom::storage::rules::new_rule_id();
        }
        rule.validate().map_err(|e| e.to_string())?;
        self.store
            .insert_rule(&rule, created_by)
            .await
            .map_err(|e| e.to_string())?;
        self.refresh().await?;
        Ok(rule)
    }

    async fn delete_rule(&self, id: &str, _by: &str) -> Result<(), String> {
        match self.store.delete_rule(id).await {
            Ok(true) => self.refresh().await,
            Ok(false) => Err(format!("no rule {id}")),
            Err(e) => Err(e.to_string()),
        }
    }

    fn workspace_mode(&self, _workspace: &str) -> Option<ApprovalMode> {
        None
    }

    fn tell(&self, session: &SessionId, text: &str) -> bool {
        let Some(sink) = self.sink.read().expect("lock").clone() else {
            return false;
        };
        self.told.write().expect("lock").push(text.to_owned());
        sink.emit(OperatorEvent::Notice {
            session_id: session.clone(),
            level: NoticeLevel::Info,
            text: text.to_owned(),
        });
        true
    }
}

/// Everything one test runs against.
pub struct Rig {
    pub emu: Emulator,
    pub store: Arc<SqliteStore>,
    pub sup: ActorRef<SupervisorMsg>,
    pub registry: ActorRef<RegistryMsg>,
    pub slack: Option<SlackHandle>,
    pub profiles: Vec<AgentProfile>,
    pub rules: Arc<HarnessRules>,
    pub options: RigOptions,
    pub dir: tempfile::TempDir,
}

impl Rig {
    /// Starts everything; `agents` are (profile id, scenario) pairs.
    pub async fn start(agents: &[(&str, Value)]) -> Rig {
        Rig::start_with(agents, RigOptions::default()).await
    }

    /// [`Rig::start`] with `options`.
    pub async fn start_with(agents: &[(&str, Value)], options: RigOptions) -> Rig {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canon");
        let ws = root.join("ws");
        std::fs::create_dir_all(&ws).expect("mkdir ws");
        let profiles: Vec<AgentProfile> = agents
            .iter()
            .map(|(id, scenario)| {
                let path = root.join(format!("{id}.json"));
                std::fs::write(&path, scenario.to_string()).expect("write scenario");
                AgentProfile {
                    id: (*id).to_owned(),
                    command: agent_bin().display().to_string(),
                    args: vec!["--scenario".into(), path.display().to_string()],
                    env: vec![],
                    protocol: Protocol::Acp,
                    framing: Framing::Ndjson,
                    auth_method: None,
                }
            })
            .collect();
        let map = WorkspaceMap {
            workspace_root: root.clone(),
            workspaces: vec![WorkspaceEntry {
                id: "ws".into(),
                path: ws,
                channel_id: CHANNEL.into(),
                label: None,
                default_agent: None,
            }],
            agents: profiles.clone(),
            default_agent: profiles.first().map(|p| p.id.clone()),
        };
        let (registry, _) = Actor::spawn(None, WorkspaceRegistry, map)
            .await
            .expect("registry");
        let store = Arc::new(
            SqliteStore::open(&root.join("intercom.db"))
                .await
                .expect("open store"),
        );
        let emu = match options.emulator_limits.clone() {
            Some(limits) => Emulator::start_with_limits(limits).await,
            None => Emulator::start().await,
        };
        let rules = Arc::new(HarnessRules {
            store: store.clone(),
            config: options.config_rules.clone(),
            shared: SharedRules::default(),
            sup: RwLock::new(None),
            sink: RwLock::new(None),
            told: RwLock::new(Vec::new()),
        });
        rules.refresh().await.expect("load rules");
        let (sup, events) = spawn_supervisor(store.clone(), &options, &rules).await;
        let mut rig = Rig {
            emu,
            store,
            sup,
            registry,
            slack: None,
            profiles,
            rules,
            options,
            dir,
        };
        rig.spawn_slack(events).await;
        rig
    }

    /// A fresh supervisor on the same store (a server restart); returns the
    /// events for the next [`Rig::spawn_slack`].
    pub async fn restart_core(&mut self) -> slack::SlackEvents {
        let (sup, events) = spawn_supervisor(self.store.clone(), &self.options, &self.rules).await;
        self.sup = sup;
        events
    }
}

/// A supervisor whose operator events go to a fresh Slack event channel.
async fn spawn_supervisor(
    store: Arc<SqliteStore>,
    options: &RigOptions,
    rules: &HarnessRules,
) -> (ActorRef<SupervisorMsg>, slack::SlackEvents) {
    let (sink, events) = slack::event_channel();
    let sink_for_rules = Arc::clone(&sink);
    let mut limits = Limits {
        startup_timeout_secs: 20,
        shutdown_grace_secs: 1,
        ..Limits::default()
    };
    if options.max_sessions > 0 {
        limits.max_sessions = options.max_sessions;
    }
    if options.idle_timeout_secs > 0 {
        limits.idle_timeout_secs = options.idle_timeout_secs;
    }
    let settings = Arc::new(SessionSettings {
        server_files: Default::default(),
        limits,
        stall: StallPolicy {
            inactivity_secs: 0,
            ..StallPolicy::default()
        },
        operators: HashSet::new(),
        rules: rules.shared.clone(),
    });
    let args = SupervisorArgs {
        policy: SupervisionPolicy {
            backoff_initial_secs: options.backoff_secs,
            backoff_max_secs: options.backoff_secs,
            ..SupervisionPolicy::default()
        },
        settings,
        store,
        sink,
        bridge_url: None,
    };
    let (sup, _) = Actor::spawn(None, SessionSupervisor, args)
        .await
        .expect("supervisor");
    *rules.sup.write().expect("lock") = Some(sup.clone());
    *rules.sink.write().expect("lock") = Some(sink_for_rules);
    (sup, events)
}

impl Rig {
    /// Starts the Slack side against the emulator and waits for `hello`.
    pub async fn spawn_slack(&mut self, events: slack::SlackEvents) {
        let store: Arc<dyn SessionStore> = self.store.clone();
        let outbox: Arc<dyn Outbox> = self.store.clone();
        let opts = SlackOptions {
            tokens: SlackTokens {
                bot: "xoxb-test".into(),
                app: "xapp-test".into(),
            },
            api_url: Some(self.emu.api_url.clone()),
            operators: vec![OWNER.to_owned()],
            supervisor: self.sup.clone(),
            registry: self.registry.clone().into(),
            root: None,
            store,
            outbox,
            tuning: tuning(),
        };
        let rules: Arc<dyn RulesAdmin> = self.rules.clone();
        let handle = slack::spawn_slack_with_rules(opts, rules, events)
            .await
            .expect("spawn_slack");
        let mut status = handle.status();
        let reached =
            tokio::time::timeout(WAIT, status.wait_for(|s| s == ConnectionState::Connected))
                .await
                .expect("Socket Mode connects");
        assert_eq!(reached, ConnectionState::Connected);
        self.slack = Some(handle);
    }

    /// The Slack handle.
    pub fn slack(&self) -> &SlackHandle {
        self.slack.as_ref().expect("slack running")
    }

    /// Waits until the connection state is `want`.
    pub async fn until_state(&self, want: ConnectionState) {
        let mut status = self.slack().status();
        tokio::time::timeout(WAIT, status.wait_for(|s| s == want))
            .await
            .unwrap_or_else(|_| panic!("never became {want:?}"));
    }

    /// `/intercom start --agent <agent> <prompt>` by the owner; returns the
    /// session and its thread root ts.
    pub async fn start_session(&self, agent: &str, prompt: &str) -> (SessionId, String) {
        let before = self.emu.ephemerals().len();
        let env = self
            .emu
            .slash(OWNER, CHANNEL, &format!("start --agent {agent} {prompt}"));
        let text = self
            .emu
            .until("the start confirmation", WAIT, |e| {
                e.ephemerals()
                    .into_iter()
                    .skip(before)
                    .find(|m| {
                        m.user == OWNER
                            && (m.text.contains("Started") || m.text.contains(":warning:"))
                    })
                    .map(|m| m.text)
            })
            .await;
        assert!(self.emu.acked(&env), "slash command envelope acked");
        assert!(text.contains("Started"), "start failed: {text}");
        let id = text
            .split('`')
            .nth(1)
            .map(SessionId::from)
            .expect("session id in the confirmation");
        let root = self.root_ts(&id).await;
        (id, root)
    }

    /// Waits for a session's thread root and returns its ts.
    pub async fn root_ts(&self, id: &SessionId) -> String {
        self.until_record(id, "with a thread", |r| r.thread_ts.is_some())
            .await
            .thread_ts
            .expect("thread ts")
    }

    /// Waits until the stored session satisfies `pred`.
    pub async fn until_record(
        &self,
        id: &SessionId,
        what: &str,
        pred: impl Fn(&SessionRecord) -> bool,
    ) -> SessionRecord {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(r) = self.store.get_session(id).await.expect("get")
                && pred(&r)
            {
                return r;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "session never {what}: {:?}",
                self.store.get_session(id).await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The transcript as text.
    pub async fn transcript(&self, id: &SessionId) -> String {
        self.store
            .transcript(id)
            .await
            .expect("transcript")
            .into_iter()
            .map(|m| format!("[{}] {}", m.role.as_str(), m.content))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until the transcript contains `needle`.
    pub async fn until_transcript(&self, id: &SessionId, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let text = self.transcript(id).await;
            if text.contains(needle) {
                return text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "transcript never contained {needle:?}:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for a thread message satisfying `pred`.
    pub async fn until_in_thread(
        &self,
        root: &str,
        what: &str,
        pred: impl Fn(&Msg) -> bool,
    ) -> Msg {
        self.emu
            .until(what, WAIT, |e| {
                e.thread(CHANNEL, root).into_iter().find(|m| pred(m))
            })
            .await
    }

    /// Waits until the emulator's message `ts` satisfies `pred`.
    pub async fn until_message(&self, ts: &str, what: &str, pred: impl Fn(&Msg) -> bool) -> Msg {
        self.emu
            .until(what, WAIT, |e| e.message(CHANNEL, ts).filter(|m| pred(m)))
            .await
    }

    /// Waits for an ephemeral to `user` containing `needle`.
    pub async fn until_ephemeral(&self, user: &str, needle: &str) -> String {
        self.emu
            .until(
                &format!("an ephemeral to {user} with {needle:?}"),
                WAIT,
                |e| {
                    e.ephemerals()
                        .into_iter()
                        .find(|m| m.user == user && m.text.contains(needle))
                        .map(|m| m.text)
                },
            )
            .await
    }

    /// Waits until the gateway has delivered everything.
    pub async fn until_drained(&self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if self.slack().backlog().await == 0 {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "gateway never drained"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Agent text as the agent wrote it (escaped): the server posts it as a
/// quote, every line starting with `> `.
pub fn unquoted(text: &str) -> String {
    text.lines()
        .map(|l| {
            l.strip_prefix("> ")
                .or_else(|| l.strip_prefix('>'))
                .unwrap_or(l)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A scenario whose first turn asks permission to write notes.txt.
pub fn permission_scenario() -> Value {
    serde_json::json!({"turns": [[
        {"tool_call": {"id": "t1", "title": "Write notes.txt", "kind": "edit", "status": "pending"}},
        {"permission": {"tool_call_id": "t1", "title": "Write notes.txt", "kind": "edit", "locations": ["notes.txt"]}},
        {"tool_update": {"id": "t1", "status": "completed"}},
        {"chunk": " Done."}
    ], []]})
}

impl Rig {
    /// The actor's view of a live session (`None` when it has no actor).
    pub async fn snapshot(
        &self,
        id: &SessionId,
    ) -> Option<intercom_actors::session::SessionSnapshot> {
        let actor = ractor::call!(self.sup, |reply| SupervisorMsg::Lookup {
            id: id.clone(),
            reply
        })
        .expect("lookup")?;
        ractor::call!(actor, intercom_actors::session::SessionMsg::Snapshot).ok()
    }

    /// Waits until the session's actor satisfies `pred`.
    pub async fn until_snapshot(
        &self,
        id: &SessionId,
        what: &str,
        pred: impl Fn(&intercom_actors::session::SessionSnapshot) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if self.snapshot(id).await.is_some_and(|s| pred(&s)) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "session never {what}: {:?}",
                self.snapshot(id).await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the supervisor has no actor for the session any more.
    pub async fn until_gone(&self, id: &SessionId) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let live = ractor::call!(self.sup, |reply| SupervisorMsg::Lookup {
                id: id.clone(),
                reply
            })
            .expect("lookup");
            if live.is_none() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "session {id} never went away"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for a thread message with decision buttons that is none of
    /// `except` (by ts).
    pub async fn until_request(&self, root: &str, except: &[&str]) -> Msg {
        self.until_in_thread(root, "another request with buttons", |m| {
            m.button("allow-once").is_some() && !except.contains(&m.ts.as_str())
        })
        .await
    }
}

impl Rig {
    /// Every rule in force with its source.
    pub async fn rules_now(&self) -> Vec<(Rule, String)> {
        self.rules.rules().await.expect("rules")
    }
}
