//! Load and latency benchmark: N concurrent scripted agents against the real
//! server (session core, SQLite store, and for `api` / `slack` the HTTP API or
//! the Slack edge against the loopback emulator), each streaming chunks and
//! making M permission requests that an automatic operator answers as soon
//! as it learns of them.
//!
//! ```text
//! cargo bench --bench load -- [--operator core|api|slack|bare|all] [--sessions 10,100,500]
//!                             [--requests 10] [--pace-ms 200] [--ramp-ms 0]
//!                             [--wait-quiet-secs 0] [--dir DIR] [--dump DIR]
//!                             [--burst K] [--pace-factor F]
//!                             [--concurrent-starts K]
//! ```
//!
//! `--pace-ms`: agent think time before each request (0 = back to back).
//! `--ramp-ms`: spread the session starts evenly over this long (0 = all at
//! once, so agents with the same pace fire in lockstep). `--wait-quiet-secs`:
//! before each run, wait up to this long for the rest of the machine to be
//! idle. `--dir`: where databases, scenarios and rtt logs go. `--dump`: copy
//! each run's rtt log (completion order) there.
//!
//! Operators (`--operator`, a comma list or `all`; default `core`):
//!
//! * `core`: the operator is an `OperatorSink` in the supervisor's fan-out;
//!   on `RequestOpened` it looks the session actor up in the named registry
//!   (`supervisor::directory`, as the API, Slack and MCP edges do) and sends
//!   `SessionMsg::Decide` directly. Operator delay = event seen -> `Decide`
//!   sent.
//! * `api`: the real `App` and HTTP router served on 127.0.0.1:0; sessions
//!   start with `POST /api/sessions`; the operator subscribes to the app's
//!   local event feed and answers with `POST /api/approvals/{id}`
//!   `{"decision":"approve"}` over loopback HTTP (hyper). Operator delay =
//!   event seen -> HTTP response received (so it contains the server's own
//!   decide path: see BENCHMARKS.md).
//! * `slack`: the Slack emulator (`tests/emulator`) and `spawn_slack` pointed
//!   at it through a recording loopback proxy in this file (the emulator has
//!   no notification hook; polling its call log clones the whole log under
//!   its lock). The operator sees each `chat.postMessage` with decision
//!   buttons the moment the emulator answers it and injects the `allow-once`
//!   click (`block_actions`) through the emulator's Socket Mode. Operator
//!   delay = message seen -> click injected. Sessions start with
//!   `SupervisorMsg::Start` in channel C1 (not a slash command). The gateway
//!   is not paced here (the plain emulator has no rate limits).
//! * `slack-limits` (not in `all`): Slack's published rate limits enforced
//!   by the emulator and paced by the gateway, sped up `--pace-factor`
//!   times (default 1: real); see `load_parts/paced.rs`.
//! * `bare` (not in `all`): no server, the machine's ceiling. The same
//!   agents and scenario, answered by a task per agent that parses each line
//!   and answers permission requests at once (`load_parts/bare.rs`).
//!
//! `--burst K` (core, bare): once the load runs, K more sessions start at once;
//! the decision p99 during that burst is printed beside the steady p99 just
//! before it (`load_parts/burst.rs`). `--concurrent-starts K` (core):
//! `limits.max_concurrent_starts` for the run (default: the server's, one
//! per core, 2 to 4).
//!
//! The headline is the round trip as the scripted agent measures it
//! (request written -> answer read, the scenario's `rtt_log`), also without
//! the first N completions (about each session's first request, which
//! overlaps the start burst). Per run it also reports the notification delay
//! (`RequestOpened` emitted -> operator learnt of it), the operator's delay,
//! permission requests per second (first Start call -> last session idle),
//! CPU (this process, of which the bench-side threads, and the whole
//! machine), peak RSS (`VmHWM`, reset per run), memory per idle session
//! ((RSS with every session idle - RSS before the first start) / N),
//! in api mode the server's own time per decision (`POST /api/approvals`,
//! router in -> response out, beside the operator's delay it is part of) and
//! session start time (Start call or `POST /api/sessions` -> answer, which
//! comes after the handshake and the first prompt). The bench process is the
//! server (in-process); the emulator, proxy, HTTP client and operator run on
//! a separate runtime whose threads are named `bench-side` so their CPU can
//! be told apart. Rows are printed as a Markdown table, notes below it (load
//! average, CPU seconds per thread group, RSS before/after, problems).
//!
//! The floor: just before each run, in the same process, the bench measures
//! a pipe round trip to a trivial child (`cat`) and one store commit (a
//! one-row update through `SqliteStore` with nothing else in flight), p50 and
//! p99; floor = pipe + commit at that percentile, the least a durable
//! approval can cost here. Every rtt figure is also printed as a multiple of
//! the floor, so runs on a noisy machine and on other machines compare. Also
//! per run: store commits and writes per approval (everything the server
//! committed from the first start to the last idle session, divided by the
//! round trips), which shows how well the writer batches.
//! BENCHMARKS.md has the figures and how to read them.

#[path = "load_parts/bare.rs"]
mod bare;
#[path = "load_parts/burst.rs"]
mod burst;
#[path = "../tests/emulator/mod.rs"]
mod emulator;
#[path = "load_parts/paced.rs"]
mod paced;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use agent_intercom::app::{App, AppOptions};
use agent_intercom::config::Config;
use agent_intercom::http::auth::ApiToken;
use agent_intercom::http::{router, serve_on};
use agent_intercom::slack::{
    self, ConnectionState, SlackHandle, SlackOptions, SlackTokens, SlackTuning,
};
use agent_intercom::storage::SqliteStore;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use intercom_actors::gateway::pacing::PacingPolicy;
use intercom_actors::model::{Framing, Protocol, SessionId, SessionStatus};
use intercom_actors::ports::{FanOut, OperatorEvent, OperatorSink, SessionStore};
use intercom_actors::registry::{RegistryMsg, WorkspaceMap, WorkspaceRegistry};
use intercom_actors::session::{Caller, Choice, SessionMsg, SessionSettings};
use intercom_actors::settings::{
    AgentProfile, Limits, StallPolicy, SupervisionPolicy, WorkspaceEntry,
};
use intercom_actors::supervisor::{
    SessionSupervisor, StartRequest, SupervisorArgs, SupervisorMsg, directory,
};
use ractor::{Actor, ActorRef};
use serde_json::{Value, json};
use tokio::runtime::Handle;
use tokio::sync::{broadcast, mpsc};

/// API token of the in-process HTTP server.
const TOKEN: &str = "bench-token-0123456789abcdef";
/// Slack user who owns the sessions and clicks the buttons (an operator).
const OWNER: &str = "UOWNER";
/// The workspace's Slack channel.
const CHANNEL: &str = "C1";
/// Round trips through `cat` for the floor.
const FLOOR_PIPE_ROUNDS: usize = 2000;
/// Single commits through the store for the floor.
const FLOOR_COMMITS: usize = 500;
/// Name of the threads that are not the server (emulator, proxy, operator, client).
const BENCH_THREAD: &str = "bench-side";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Core,
    Api,
    Slack,
    /// No server: the machine's ceiling (`load_parts/bare.rs`).
    Bare,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Core => "core",
            Mode::Api => "api",
            Mode::Slack => "slack",
            Mode::Bare => "bare",
        }
    }
}

type HttpClient = Client<HttpConnector, Body>;

fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(300))
        .build_http()
}

/// What the automatic operator and the tracker observed during one run.
#[derive(Default)]
struct Observed {
    /// Core mode: the supervisor to look sessions up in.
    sup: OnceLock<ActorRef<SupervisorMsg>>,
    /// Operator delay per answered request.
    delays: Mutex<Vec<Duration>>,
    /// Api mode: how long the server took per `POST /api/approvals/{id}`
    /// (request handed to the router -> response built), so the operator's
    /// delay splits into the server's part and the rest (client, loopback,
    /// waiting for a core).
    served: Mutex<Vec<Duration>>,
    /// Sessions whose turn ended (activity `idle`).
    idle: Mutex<HashSet<SessionId>>,
    /// When the last session went idle.
    last_idle: Mutex<Option<Instant>>,
    /// Decisions the operator sent.
    decided: AtomicUsize,
    /// Operator failures (HTTP status not 200, no actor, no button).
    op_errors: AtomicUsize,
    /// First operator failure, for the report.
    first_error: Mutex<Option<String>>,
    /// Local feed events lost to lag (api mode).
    lagged: AtomicU64,
    /// Requests answered by the sweep after lag (api mode).
    swept: AtomicUsize,
    /// Requests already being answered (api mode: event and sweep race).
    handled: Mutex<HashSet<String>>,
    /// When the core emitted `RequestOpened`, by global request id.
    opened: Mutex<HashMap<String, Instant>>,
    /// When the operator learnt of each request, by global request id.
    seen: Mutex<HashMap<String, Instant>>,
}

impl Observed {
    fn error(&self, what: String) {
        self.op_errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut first) = self.first_error.lock()
            && first.is_none()
        {
            *first = Some(what);
        }
    }

    fn delay(&self, d: Duration) {
        if let Ok(mut v) = self.delays.lock() {
            v.push(d);
        }
        self.decided.fetch_add(1, Ordering::Relaxed);
    }

    fn saw(&self, id: &str, at: Instant) {
        if let Ok(mut s) = self.seen.lock() {
            s.insert(id.to_owned(), at);
        }
    }

    /// Notification delays: `RequestOpened` emitted -> operator learnt of it.
    fn notify_us(&self) -> Vec<u64> {
        let (Ok(opened), Ok(seen)) = (self.opened.lock(), self.seen.lock()) else {
            return Vec::new();
        };
        let mut v: Vec<u64> = seen
            .iter()
            .filter_map(|(id, s)| {
                opened
                    .get(id)
                    .map(|o| s.saturating_duration_since(*o).as_micros() as u64)
            })
            .collect();
        v.sort_unstable();
        v
    }

    fn idle_count(&self) -> usize {
        self.idle.lock().map(|i| i.len()).unwrap_or(0)
    }
}

/// Tracks idle sessions in every mode; in core mode also answers requests.
struct BenchSink {
    obs: Arc<Observed>,
    answer: bool,
}

impl OperatorSink for BenchSink {
    fn emit(&self, event: OperatorEvent) {
        match event {
            OperatorEvent::RequestOpened { request } => {
                let seen = Instant::now();
                if let Ok(mut o) = self.obs.opened.lock() {
                    o.insert(request.id.clone(), seen);
                }
                if !self.answer {
                    return;
                }
                self.obs.saw(&request.id, seen);
                let Some(sup) = self.obs.sup.get().cloned() else {
                    return;
                };
                let me = self.obs.clone();
                tokio::spawn(async move {
                    let Some(actor) = directory::find(&sup, &request.session_id) else {
                        me.error(format!("no actor for {}", request.id));
                        return;
                    };
                    let _ = actor.send_message(SessionMsg::Decide {
                        request_id: request.request_id.clone(),
                        choice: Choice::Approve,
                        reason: None,
                        caller: Caller::local(),
                        reply: ractor::concurrency::oneshot().0.into(),
                    });
                    me.delay(seen.elapsed());
                });
            }
            OperatorEvent::StatusChanged {
                session_id,
                activity,
                ..
            } if activity == "idle" => {
                if let Ok(mut idle) = self.obs.idle.lock() {
                    idle.insert(session_id);
                }
                if let Ok(mut t) = self.obs.last_idle.lock() {
                    *t = Some(Instant::now());
                }
            }
            _ => {}
        }
    }
}

// One harness per test crate may include this alongside another.
#[allow(clippy::duplicate_mod)]
#[path = "../tests/shared/scripted_agent.rs"]
mod scripted_agent;
use scripted_agent::agent_bin;

#[path = "load_parts/api.rs"]
mod api;
#[path = "load_parts/floor.rs"]
mod floor;
#[path = "load_parts/procstat.rs"]
mod procstat;
#[path = "load_parts/report.rs"]
mod report;
#[path = "load_parts/slack.rs"]
mod slack_rig;
use api::{call, rig_api, sorted_us};
use floor::{Floor, measure_commit, measure_pipe};
use procstat::{cpu_by_thread, cpu_now, loadavg, status_kb, wait_quiet};
use slack_rig::{SlackEdge, rig_slack, slack_edge};

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn read_rtts(path: &Path) -> Vec<u64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

struct Figures {
    mode: Mode,
    n: usize,
    pace_ms: u64,
    ramp_ms: u64,
    rtt_us: Vec<u64>,
    rtt_later: Vec<u64>,
    op_us: Vec<u64>,
    notify_us: Vec<u64>,
    rps: f64,
    cpu_pct: f64,
    bench_cpu_pct: f64,
    machine_pct: f64,
    peak_rss_mb: f64,
    idle_kib_per_session: f64,
    start_ms: Vec<u64>,
    errors: usize,
    /// Store commits and writes during the run.
    commits: u64,
    writes: u64,
    notes: Vec<String>,
    /// 1-minute load average before the run and at its end.
    load: (f64, f64),
}

// ---- the servers under test -----------------------------------------------

/// One running server, whichever edge the operator uses.
#[allow(clippy::large_enum_variant)] // one per run
enum Rig {
    Core {
        sup: ActorRef<SupervisorMsg>,
        store: Arc<SqliteStore>,
    },
    Api {
        app: App,
        base: String,
        client: HttpClient,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        served: tokio::task::JoinHandle<std::io::Result<()>>,
        bench_tasks: Vec<tokio::task::JoinHandle<()>>,
    },
    Slack {
        sup: ActorRef<SupervisorMsg>,
        registry: ActorRef<RegistryMsg>,
        store: Arc<SqliteStore>,
        handle: Option<SlackHandle>,
        emu: emulator::Emulator,
        bench_tasks: Vec<tokio::task::JoinHandle<()>>,
    },
    Bare {
        agents: Arc<bare::BareAgents>,
        obs: Arc<Observed>,
    },
}

struct Env {
    n: usize,
    dir: PathBuf,
    workspace: PathBuf,
    profile: AgentProfile,
    settings: Arc<SessionSettings>,
}

impl Env {
    /// Creates `dir` with the workspace `ws`, writes the scripted agent's
    /// scenario (`scenario` is given the canonical `dir`, for its logs) and
    /// the session settings for up to `max_sessions` at once.
    fn prepare(
        n: usize,
        dir: &Path,
        max_sessions: usize,
        scenario: impl FnOnce(&Path) -> Value,
    ) -> Env {
        let workspace = dir.join("ws");
        std::fs::create_dir_all(&workspace).expect("ws");
        let dir = dir.canonicalize().expect("canon");
        let workspace = workspace.canonicalize().expect("canon");
        let scenario_path = dir.join("scenario.json");
        std::fs::write(&scenario_path, scenario(&dir).to_string()).expect("scenario");
        let profile = AgentProfile {
            id: "scripted".into(),
            command: agent_bin().display().to_string(),
            args: vec!["--scenario".into(), scenario_path.display().to_string()],
            env: vec![],
            protocol: Protocol::Acp,
            framing: Framing::Ndjson,
            auth_method: None,
        };
        let settings = Arc::new(SessionSettings {
            server_files: Default::default(),
            limits: limits(max_sessions),
            stall: StallPolicy {
                inactivity_secs: 0,
                ..StallPolicy::default()
            },
            operators: [OWNER.to_owned()].into_iter().collect(),
            ..Default::default()
        });
        Env {
            n,
            dir,
            workspace,
            profile,
            settings,
        }
    }
}

fn limits(n: usize) -> Limits {
    Limits {
        max_sessions: n + 1,
        startup_timeout_secs: 120,
        idle_timeout_secs: 3600,
        max_concurrent_starts: arg("--concurrent-starts")
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(intercom_actors::settings::default_concurrent_starts),
        ..Limits::default()
    }
}

async fn supervisor(
    env: &Env,
    store: Arc<SqliteStore>,
    sink: Arc<dyn OperatorSink>,
) -> ActorRef<SupervisorMsg> {
    let args = SupervisorArgs {
        policy: SupervisionPolicy::default(),
        settings: env.settings.clone(),
        store,
        sink,
        bridge_url: None,
    };
    let (sup, _) = Actor::spawn(None, SessionSupervisor, args)
        .await
        .expect("supervisor");
    sup
}

async fn rig_core(env: &Env, obs: &Arc<Observed>) -> Rig {
    let store = Arc::new(
        SqliteStore::open(&env.dir.join("core.db"))
            .await
            .expect("store"),
    );
    let sink = Arc::new(BenchSink {
        obs: obs.clone(),
        answer: true,
    });
    let sup = supervisor(env, store.clone(), sink).await;
    let _ = obs.sup.set(sup.clone());
    Rig::Core { sup, store }
}

/// Starts session `i`; says whether it started.
type Starter =
    Arc<dyn Fn(usize) -> futures::future::BoxFuture<'static, Result<(), String>> + Send + Sync>;

impl Rig {
    /// A closure that starts session `i` running `profile` (api: the
    /// workspace's configured agent) and says whether it started.
    fn starter(&self, env: &Env, profile: AgentProfile) -> Starter {
        match self {
            Rig::Bare { agents, obs } => {
                let (agents, obs, cwd) = (agents.clone(), obs.clone(), env.workspace.clone());
                Arc::new(move |i| {
                    let how = (profile.clone(), cwd.clone());
                    Box::pin(bare::start(agents.clone(), obs.clone(), how, i))
                })
            }
            Rig::Core { sup, .. } | Rig::Slack { sup, .. } => {
                let sup = sup.clone();
                let slack = matches!(self, Rig::Slack { .. });
                let cwd = env.workspace.clone();
                Arc::new(move |i| {
                    let sup = sup.clone();
                    let req = StartRequest {
                        workspace: "ws".into(),
                        cwd: cwd.clone(),
                        channel_id: slack.then(|| CHANNEL.to_owned()),
                        profile: profile.clone(),
                        prompt: format!("load session {i}"),
                        owner: if slack { OWNER } else { "bench" }.into(),
                        mode: None,
                    };
                    Box::pin(async move {
                        match ractor::call!(sup, |reply| SupervisorMsg::Start { req, reply }) {
                            Ok(Ok(_)) => Ok(()),
                            Ok(Err(e)) => Err(e.to_string()),
                            Err(e) => Err(e.to_string()),
                        }
                    })
                })
            }
            Rig::Api { client, base, .. } => {
                let (client, base) = (client.clone(), base.clone());
                let _ = profile;
                Arc::new(move |i| {
                    let (client, base) = (client.clone(), base.clone());
                    Box::pin(async move {
                        let body =
                            json!({"workspace": "ws", "prompt": format!("load session {i}")});
                        match call(&client, "POST", &base, "/api/sessions", Some(body)).await {
                            Ok((201, _)) => Ok(()),
                            Ok((s, b)) => Err(format!("{s} {b}")),
                            Err(e) => Err(e),
                        }
                    })
                })
            }
        }
    }

    /// The store's (commits, writes) so far.
    fn store_counts(&self) -> (u64, u64) {
        let store: &SqliteStore = match self {
            Rig::Core { store, .. } | Rig::Slack { store, .. } => store,
            Rig::Api { app, .. } => app.store(),
            Rig::Bare { .. } => return (0, 0),
        };
        (store.commit_count(), store.write_count())
    }

    async fn live_count(&self) -> usize {
        let list = match self {
            Rig::Core { store, .. } | Rig::Slack { store, .. } => store.list_sessions(true).await,
            Rig::Api { app, .. } => app.store().list_sessions(true).await,
            Rig::Bare { agents, .. } => return agents.live(),
        };
        list.map(|l| {
            l.iter()
                .filter(|s| s.status == SessionStatus::Active)
                .count()
        })
        .unwrap_or(0)
    }

    /// Slack: waits until the gateway delivered everything; returns the backlog left.
    async fn drain(&self) -> usize {
        let Rig::Slack {
            handle: Some(h), ..
        } = self
        else {
            return 0;
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let left = h.backlog().await;
            if left == 0 || Instant::now() > deadline {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Problems the server reported back to the operator (Slack ephemerals).
    /// Slack: successful Web API calls by method.
    fn slack_calls(&self) -> Option<String> {
        let Rig::Slack { emu, .. } = self else {
            return None;
        };
        let mut by: Vec<(String, usize)> = Vec::new();
        for c in emu.calls() {
            match by.iter_mut().find(|(m, _)| *m == c.method) {
                Some((_, k)) => *k += 1,
                None => by.push((c.method.clone(), 1)),
            }
        }
        by.sort_by_key(|b| std::cmp::Reverse(b.1));
        Some(
            by.iter()
                .map(|(m, k)| format!("{m} {k}"))
                .collect::<Vec<_>>()
                .join(", "),
        )
    }

    fn operator_visible_errors(&self) -> (usize, Option<String>) {
        match self {
            Rig::Slack { emu, .. } => {
                let e = emu.ephemerals();
                (e.len(), e.first().map(|m| m.text.clone()))
            }
            _ => (0, None),
        }
    }

    async fn shutdown(self) {
        match self {
            Rig::Bare { agents, .. } => agents.stop().await,
            Rig::Core { sup, store } => {
                ractor::call!(sup, SupervisorMsg::Shutdown).ok();
                sup.stop_and_wait(None, None).await.ok();
                if let Ok(store) = Arc::try_unwrap(store) {
                    store.close().await;
                }
            }
            Rig::Api {
                app,
                mut stop,
                served,
                bench_tasks,
                ..
            } => {
                for t in bench_tasks {
                    t.abort();
                }
                if let Some(s) = stop.take() {
                    let _ = s.send(());
                }
                let _ = served.await;
                app.shutdown().await;
                app.close().await;
            }
            Rig::Slack {
                sup,
                registry,
                store,
                mut handle,
                bench_tasks,
                ..
            } => {
                ractor::call!(sup, SupervisorMsg::Shutdown).ok();
                sup.stop_and_wait(None, None).await.ok();
                if let Some(h) = handle.take() {
                    h.shutdown().await;
                }
                registry.stop_and_wait(None, None).await.ok();
                for t in bench_tasks {
                    t.abort();
                }
                if let Ok(store) = Arc::try_unwrap(store) {
                    store.close().await;
                }
            }
        }
    }
}

// ---- one run --------------------------------------------------------------

/// The scripted agent's scenario: `m` requests, each after `pace_ms` of
/// think time, five text chunks and a tool call.
fn scenario(dir: &Path, m: usize, pace_ms: u64) -> Value {
    let mut turn = Vec::new();
    for i in 0..m {
        if pace_ms > 0 {
            turn.push(json!({"sleep_ms": pace_ms}));
        }
        for _ in 0..5 {
            turn.push(json!({"chunk": "streaming some agent text for the operator to read. "}));
        }
        turn.push(json!({"tool_call": {"id": format!("t{i}"), "title": "Edit file", "kind": "edit", "status": "pending"}}));
        turn.push(json!({"permission": {"tool_call_id": format!("t{i}"), "title": "Edit file", "kind": "edit"}}));
    }
    json!({"rtt_log": dir.join("rtt.log"), "turns": [turn]})
}

/// How the session starts went: each one's time, and the failures.
#[derive(Default)]
struct Starts {
    ms: Vec<u64>,
    errors: usize,
    notes: Vec<String>,
}

/// Starts `n` sessions spread evenly over `ramp_ms` (0: all at once) and
/// waits for every Start call's answer.
async fn start_sessions(
    rig: &Rig,
    env: &Env,
    (n, ramp_ms): (usize, u64),
    on_bench: Option<&Handle>,
) -> Starts {
    let start = rig.starter(env, env.profile.clone());
    let mut tasks = Vec::new();
    for i in 0..n {
        let fut = start(i);
        let offset = Duration::from_millis(ramp_ms * i as u64 / n.max(1) as u64);
        let task = async move {
            tokio::time::sleep(offset).await;
            let t = Instant::now();
            let r = fut.await;
            (t.elapsed(), r)
        };
        tasks.push(match on_bench {
            Some(bench) => bench.spawn(task),
            None => tokio::spawn(task),
        });
    }
    let mut out = Starts::default();
    for task in tasks {
        match task.await {
            Ok((d, Ok(()))) => out.ms.push(d.as_millis() as u64),
            Ok((_, Err(e))) => {
                if out.errors == 0 {
                    out.notes.push(format!("start failed: {e}"));
                }
                out.errors += 1;
            }
            Err(e) => {
                out.notes.push(format!("start task: {e}"));
                out.errors += 1;
            }
        }
    }
    out
}

/// Waits (up to 15 minutes) until `want` round trips are logged and
/// `started` sessions are idle; a note when they never were.
async fn wait_for_round_trips(
    rtt_log: &Path,
    obs: &Observed,
    want: usize,
    started: usize,
) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let logged = read_rtts(rtt_log).len();
        if logged >= want && obs.idle_count() >= started {
            return None;
        }
        if Instant::now() > deadline {
            return Some(format!(
                "timed out: {logged} of {want} round trips, {} of {started} idle",
                obs.idle_count()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the operator side saw go wrong (and the server's own time per
/// decision, in api mode): notes, and how many errors they count for.
fn operator_notes(obs: &Observed, op_us: &[u64], rig: &Rig) -> (Vec<String>, usize) {
    let (mut notes, mut errors) = (Vec::new(), 0);
    let served_us = sorted_us(&obs.served);
    if !served_us.is_empty() {
        notes.push(format!(
            "server-side handling of POST /api/approvals (router in -> response out): p50 {} µs, p99 {} µs, of the operator's delay p50 {} µs, p99 {} µs",
            pct(&served_us, 0.5),
            pct(&served_us, 0.99),
            pct(op_us, 0.5),
            pct(op_us, 0.99)
        ));
    }
    let op_errors = obs.op_errors.load(Ordering::Relaxed);
    if op_errors > 0 {
        errors += op_errors;
        let first = obs.first_error.lock().ok().and_then(|f| f.clone());
        notes.push(format!(
            "{op_errors} operator errors, first: {}",
            first.unwrap_or_default()
        ));
    }
    if let Some(calls) = rig.slack_calls() {
        notes.push(format!("Slack Web API calls: {calls}"));
    }
    let (visible, first) = rig.operator_visible_errors();
    if visible > 0 {
        errors += visible;
        notes.push(format!(
            "{visible} problem replies to the operator, first: {}",
            first.unwrap_or_default()
        ));
    }
    let lagged = obs.lagged.load(Ordering::Relaxed);
    if lagged > 0 {
        notes.push(format!(
            "local feed lagged by {lagged} events; {} requests answered by the sweep",
            obs.swept.load(Ordering::Relaxed)
        ));
    }
    (notes, errors)
}

async fn run(
    mode: Mode,
    n: usize,
    m: usize,
    (pace_ms, ramp_ms): (u64, u64),
    root: &Path,
    bench: &Handle,
) -> Figures {
    let tag = format!("{}-{n}-pace{pace_ms}-ramp{ramp_ms}", mode.name());
    // Core only: this many more sessions start at once once the load runs.
    let burst_count: usize = match mode {
        Mode::Core | Mode::Bare => arg("--burst").and_then(|s| s.parse().ok()).unwrap_or(0),
        _ => 0,
    };
    let env = Env::prepare(n, &root.join(&tag), n + burst_count, |dir| {
        scenario(dir, m, pace_ms)
    });
    let rtt_log = env.dir.join("rtt.log");
    let obs = Arc::new(Observed::default());
    let rig = match mode {
        Mode::Core => rig_core(&env, &obs).await,
        Mode::Api => rig_api(&env, &obs, bench).await,
        Mode::Slack => rig_slack(&env, &obs, bench).await,
        Mode::Bare => Rig::Bare {
            agents: Arc::default(),
            obs: obs.clone(),
        },
    };
    let load0 = loadavg();
    // Let the rig settle, then reset the peak RSS counter for this run.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss0 = status_kb("VmRSS:");
    let cpu0 = cpu_now();
    let threads0 = cpu_by_thread();
    let counts0 = rig.store_counts();
    let t0 = Instant::now();
    let on_bench = (mode == Mode::Api).then_some(bench);
    let Starts {
        ms: mut start_ms,
        mut errors,
        mut notes,
    } = start_sessions(&rig, &env, (n, ramp_ms), on_bench).await;
    let started = n - errors;
    notes.push(format!(
        "all Start calls answered after {} ms; {} round trips done by then",
        t0.elapsed().as_millis(),
        read_rtts(&rtt_log).len()
    ));
    let mut burst_started = 0;
    if burst_count > 0 {
        let b = burst::burst(&rig, &env, &rtt_log, burst_count).await;
        burst_started = b.started;
        notes.push(b.note());
    }
    let want = started * m;
    if let Some(timed_out) = wait_for_round_trips(&rtt_log, &obs, want, started).await {
        notes.push(timed_out);
        errors += 1;
    }
    let end = obs
        .last_idle
        .lock()
        .ok()
        .and_then(|t| *t)
        .unwrap_or_else(Instant::now);
    let elapsed = end
        .saturating_duration_since(t0)
        .max(Duration::from_millis(1));
    let cpu1 = cpu_now();
    let threads1 = cpu_by_thread();
    let counts1 = rig.store_counts();
    let wall = t0.elapsed().as_secs_f64();
    let backlog = rig.drain().await;
    if backlog > 0 {
        notes.push(format!("Slack backlog never drained: {backlog} left"));
        errors += 1;
    }
    // Let the last writes land, then measure idle memory.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_idle = status_kb("VmRSS:");
    let peak = status_kb("VmHWM:");
    notes.push(format!(
        "RSS {:.1} MiB before the sessions, {:.1} MiB with all {started} idle",
        rss0 as f64 / 1024.0,
        rss_idle as f64 / 1024.0
    ));
    if let Some(out) = arg("--dump") {
        let _ = std::fs::create_dir_all(&out);
        let _ = std::fs::copy(&rtt_log, Path::new(&out).join(format!("{tag}.rtt")));
    }
    let mut rtt_us = read_rtts(&rtt_log);
    // The second half of the completions: past the start burst and what
    // queued behind it (the log is in completion order).
    let mut rtt_later: Vec<u64> = rtt_us.iter().skip(rtt_us.len() / 2).copied().collect();
    rtt_later.sort_unstable();
    rtt_us.sort_unstable();
    notes.extend(procstat::thread_notes(
        &threads0,
        &threads1,
        wall,
        cpu1.process - cpu0.process,
        rtt_us.len(),
    ));
    errors += want.saturating_sub(rtt_us.len());
    let op_us = sorted_us(&obs.delays);
    start_ms.sort_unstable();
    let (more, op_errors) = operator_notes(&obs, &op_us, &rig);
    notes.extend(more);
    errors += op_errors;
    let live = rig.live_count().await;
    let started = started + burst_started;
    if live != started {
        notes.push(format!("{live} of {started} sessions active at the end"));
        errors += started.abs_diff(live);
    }
    let stopping = Instant::now();
    rig.shutdown().await;
    notes.push(format!(
        "shutdown (every session stopped, its agent and descendants killed): {} ms",
        stopping.elapsed().as_millis()
    ));
    Figures {
        mode,
        n,
        pace_ms,
        ramp_ms,
        rps: rtt_us.len() as f64 / elapsed.as_secs_f64(),
        rtt_us,
        rtt_later,
        op_us,
        notify_us: obs.notify_us(),
        cpu_pct: 100.0 * (cpu1.process - cpu0.process) / wall,
        bench_cpu_pct: 100.0 * (cpu1.bench - cpu0.bench) / wall,
        machine_pct: 100.0 * (cpu1.machine - cpu0.machine) / wall,
        peak_rss_mb: peak as f64 / 1024.0,
        idle_kib_per_session: rss_idle.saturating_sub(rss0) as f64 / n as f64,
        start_ms,
        errors,
        commits: counts1.0 - counts0.0,
        writes: counts1.1 - counts0.1,
        notes,
        load: (load0, loadavg()),
    }
}

// ---- main -----------------------------------------------------------------

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Raises the soft open-file limit to the hard one; returns (before, after).
fn raise_nofile() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write to / read from a valid rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return (0, 0);
        }
        let before = lim.rlim_cur;
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        }
        (before, lim.rlim_cur)
    }
}

/// The operators named by `--operator` (`slack-limits` runs apart).
fn parse_modes(spec: &str) -> Vec<Mode> {
    let mut modes = Vec::new();
    for s in spec.split(',') {
        match s.trim() {
            "core" => modes.push(Mode::Core),
            "api" => modes.push(Mode::Api),
            "slack" => modes.push(Mode::Slack),
            "bare" => modes.push(Mode::Bare),
            "slack-limits" => {}
            "all" => modes.extend([Mode::Core, Mode::Api, Mode::Slack]),
            other => {
                panic!("--operator: core, api, slack, slack-limits, bare or all, not {other:?}")
            }
        }
    }
    modes
}

fn main() {
    let spec = arg("--operator").unwrap_or_else(|| "core".into());
    let paced_run = spec.split(',').any(|s| s.trim() == "slack-limits");
    let modes = parse_modes(&spec);
    // slack-limits: Slack's rate limits sped up this many times (1: real).
    let pace_factor: u32 = arg("--pace-factor")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let sessions: Vec<usize> = arg("--sessions")
        .unwrap_or_else(|| "10,100".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let m: usize = arg("--requests").and_then(|s| s.parse().ok()).unwrap_or(10);
    // Think time before each request; 0 = every agent fires back to back.
    let pace_ms: u64 = arg("--pace-ms").and_then(|s| s.parse().ok()).unwrap_or(200);
    // Spread session starts evenly over this long, so agents with the same
    // pace do not fire in lockstep (0: all start at once).
    let ramp_ms: u64 = arg("--ramp-ms").and_then(|s| s.parse().ok()).unwrap_or(0);
    // Before each run, wait up to this long for the rest of the machine to be quiet.
    let quiet_secs: u64 = arg("--wait-quiet-secs")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (nofile_before, nofile) = raise_nofile();
    let server = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("server")
        .build()
        .expect("server runtime");
    let bench = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .thread_name(BENCH_THREAD)
        .thread_keep_alive(Duration::from_secs(3600))
        .build()
        .expect("bench runtime");
    // Where databases, scenarios and rtt logs go (default: a temp dir in TMPDIR).
    let dir = match arg("--dir") {
        Some(d) => {
            std::fs::create_dir_all(&d).expect("--dir");
            tempfile::tempdir_in(d).expect("tmp")
        }
        None => tempfile::tempdir().expect("tmp"),
    };
    println!(
        "load benchmark: {m} permission requests per session, pace {pace_ms} ms, SQLite store; \
         {} cores; RLIMIT_NOFILE {nofile_before} -> {nofile}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    if !modes.is_empty() {
        println!();
        println!("{}", report::header());
    }
    let mut notes = Vec::new();
    for mode in &modes {
        for &n in &sessions {
            let handle = bench.handle().clone();
            if quiet_secs > 0 {
                let others = wait_quiet(Duration::from_secs(quiet_secs));
                if others >= 0.15 {
                    notes.push(format!(
                        "{} N={n}: machine not quiet after {quiet_secs} s ({others:.2} cores busy elsewhere)",
                        mode.name()
                    ));
                }
            }
            let floor_dir = tempfile::tempdir_in(dir.path()).expect("floor dir");
            let floor = Floor {
                pipe_us: measure_pipe(FLOOR_PIPE_ROUNDS),
                commit_us: server.block_on(measure_commit(floor_dir.path(), FLOOR_COMMITS)),
            };
            let f = server.block_on(run(*mode, n, m, (pace_ms, ramp_ms), dir.path(), &handle));
            println!("{}", report::row(&f, &floor));
            notes.extend(report::notes(f, &floor));
        }
    }
    if paced_run {
        println!();
        println!("{}", paced::header());
        for &n in &sessions {
            let handle = bench.handle().clone();
            let f = server.block_on(paced::run_paced(
                n,
                (pace_ms, ramp_ms),
                pace_factor,
                dir.path(),
                &handle,
            ));
            let (row, more) = f.row();
            println!("{row}");
            notes.extend(more.into_iter().map(|x| format!("slack-limits N={n}: {x}")));
            notes.push(format!(
                "slack-limits N={n}: load average {:.2} after",
                loadavg()
            ));
        }
    }
    for note in notes {
        println!("note: {note}");
    }
}
