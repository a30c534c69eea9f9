//! Load and latency benchmark: N concurrent scripted agents against the real
//! session core and SQLite store, each streaming chunks and making M
//! permission requests that an automatic operator answers as soon as it sees
//! them.
//!
//! `cargo bench --bench load -- [--sessions 10,100,500] [--requests 10]`
//!
//! Reports per N: approval round trip p50/p99/max as the agent measures it
//! (request written -> answer read), the operator's own delay (event seen ->
//! decision sent) so it can be subtracted, permission requests per second,
//! server CPU and peak RSS, memory per idle session, and session start time
//! (spawn -> handshake done -> first prompt sent). Figures go to stdout.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use agent_intercom::storage::SqliteStore;
use intercom_actors::model::{SessionId, SessionStatus};
use intercom_actors::ports::{OperatorEvent, OperatorSink, SessionStore};
use intercom_actors::session::{Caller, Choice, SessionMsg, SessionSettings};
use intercom_actors::settings::{AgentProfile, Limits, StallPolicy, SupervisionPolicy};
use intercom_actors::supervisor::{SessionSupervisor, StartRequest, SupervisorArgs, SupervisorMsg};
use ractor::{Actor, ActorRef};
use serde_json::json;

/// What the automatic operator observed.
#[derive(Default)]
struct Observed {
    sup: OnceLock<ActorRef<SupervisorMsg>>,
    delays: Mutex<Vec<Duration>>,
    idle: Mutex<HashSet<SessionId>>,
    decided: std::sync::atomic::AtomicUsize,
}

/// Answers every permission request the moment it is announced.
struct AutoOperator(Arc<Observed>);

impl OperatorSink for AutoOperator {
    fn emit(&self, event: OperatorEvent) {
        match event {
            OperatorEvent::RequestOpened { request } => {
                let Some(sup) = self.0.sup.get().cloned() else {
                    return;
                };
                let seen = Instant::now();
                let me = self.0.clone();
                tokio::spawn(async move {
                    let Ok(Some(actor)) = ractor::call!(sup, |reply| SupervisorMsg::Lookup {
                        id: request.session_id.clone(),
                        reply
                    }) else {
                        return;
                    };
                    let _ = actor.send_message(SessionMsg::Decide {
                        request_id: request.request_id.clone(),
                        choice: Choice::Approve,
                        reason: None,
                        caller: Caller::local(),
                        reply: ractor::concurrency::oneshot().0.into(),
                    });
                    if let Ok(mut d) = me.delays.lock() {
                        d.push(seen.elapsed());
                    }
                    me.decided
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                });
            }
            OperatorEvent::StatusChanged {
                session_id,
                activity,
                ..
            } if activity == "idle" => {
                if let Ok(mut idle) = self.0.idle.lock() {
                    idle.insert(session_id);
                }
            }
            _ => {}
        }
    }
}

fn agent_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let bin = dir.join("scripted-agent");
    if !bin.exists() {
        let profile = if dir.ends_with("release") {
            vec!["--release"]
        } else {
            vec![]
        };
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", "scripted-agent"])
            .args(profile)
            .status()
            .expect("cargo build");
        assert!(status.success());
    }
    bin
}

fn proc_stat() -> (f64, u64) {
    let ticks = 100.0; // sysconf(_SC_CLK_TCK) on Linux
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let cpu = fields
        .get(11)
        .and_then(|u| u.parse::<f64>().ok())
        .unwrap_or(0.0)
        + fields
            .get(12)
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (cpu / ticks, kb("VmRSS:"))
}

fn peak_rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct Figures {
    n: usize,
    requests: usize,
    rtt_us: Vec<u64>,
    op_us: Vec<u64>,
    rps: f64,
    cpu_pct: f64,
    peak_rss_mb: f64,
    idle_kib_per_session: f64,
    start_ms: Vec<u64>,
    errors: usize,
}

async fn run(n: usize, m: usize, pace_ms: u64, dir: &Path) -> Figures {
    let store = Arc::new(
        SqliteStore::open(&dir.join(format!("load-{n}.db")))
            .await
            .expect("store"),
    );
    let operator = Arc::new(Observed::default());
    let settings = Arc::new(SessionSettings {
        limits: Limits {
            max_sessions: n + 1,
            startup_timeout_secs: 120,
            idle_timeout_secs: 3600,
            ..Limits::default()
        },
        stall: StallPolicy {
            inactivity_secs: 0,
            ..StallPolicy::default()
        },
        operators: HashSet::new(),
        ..Default::default()
    });
    let args = SupervisorArgs {
        policy: SupervisionPolicy::default(),
        settings,
        store: store.clone(),
        sink: Arc::new(AutoOperator(operator.clone())),
        bridge_url: None,
    };
    let (sup, _) = Actor::spawn(None, SessionSupervisor, args)
        .await
        .expect("supervisor");
    let _ = operator.sup.set(sup.clone());

    let rtt_log = dir.join(format!("rtt-{n}.log"));
    let _ = std::fs::remove_file(&rtt_log);
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
    let scenario = json!({"rtt_log": rtt_log, "turns": [turn]});
    let scenario_path = dir.join(format!("scenario-{n}.json"));
    std::fs::write(&scenario_path, scenario.to_string()).expect("scenario");
    let workspace = dir.join("ws");
    std::fs::create_dir_all(&workspace).expect("ws");
    let profile = AgentProfile {
        id: "scripted".into(),
        command: agent_bin().display().to_string(),
        args: vec!["--scenario".into(), scenario_path.display().to_string()],
        env: vec![],
        protocol: Default::default(),
        framing: Default::default(),
        auth_method: None,
    };

    let (cpu0, rss0) = proc_stat();
    let t0 = Instant::now();
    let mut starts = Vec::new();
    for i in 0..n {
        let sup = sup.clone();
        let req = StartRequest {
            workspace: "ws".into(),
            cwd: workspace.clone(),
            channel_id: None,
            profile: profile.clone(),
            prompt: format!("load session {i}"),
            owner: "bench".into(),
            mode: None,
        };
        starts.push(tokio::spawn(async move {
            let t = Instant::now();
            let r = ractor::call!(sup, |reply| SupervisorMsg::Start { req, reply });
            (t.elapsed(), matches!(r, Ok(Ok(_))))
        }));
    }
    let mut start_ms = Vec::new();
    let mut errors = 0;
    for s in starts {
        match s.await {
            Ok((d, true)) => start_ms.push(d.as_millis() as u64),
            _ => errors += 1,
        }
    }
    let want = (n - errors) * m;
    let deadline = Instant::now() + Duration::from_secs(600);
    while operator.decided.load(std::sync::atomic::Ordering::Relaxed) < want
        || operator.idle.lock().map(|i| i.len()).unwrap_or(0) < n - errors
    {
        if Instant::now() > deadline {
            eprintln!("timed out waiting for the load to finish");
            errors += 1;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = t0.elapsed();
    let (cpu1, _) = proc_stat();
    // Let the last flushes land, then measure idle memory.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, rss_idle) = proc_stat();
    let mut rtt_us: Vec<u64> = std::fs::read_to_string(&rtt_log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    rtt_us.sort_unstable();
    let mut op_us: Vec<u64> = operator
        .delays
        .lock()
        .map(|d| d.iter().map(|x| x.as_micros() as u64).collect())
        .unwrap_or_default();
    op_us.sort_unstable();
    start_ms.sort_unstable();
    let live = store
        .list_sessions(true)
        .await
        .map(|l| {
            l.iter()
                .filter(|s| s.status == SessionStatus::Active)
                .count()
        })
        .unwrap_or(0);
    if live != n - errors {
        errors += n - errors - live.min(n - errors);
    }
    ractor::call!(sup, SupervisorMsg::Shutdown).ok();
    Figures {
        n,
        requests: rtt_us.len(),
        rps: rtt_us.len() as f64 / elapsed.as_secs_f64(),
        rtt_us,
        op_us,
        cpu_pct: 100.0 * (cpu1 - cpu0) / elapsed.as_secs_f64(),
        peak_rss_mb: peak_rss_kb() as f64 / 1024.0,
        idle_kib_per_session: rss_idle.saturating_sub(rss0) as f64 / n as f64,
        start_ms,
        errors,
    }
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let sessions: Vec<usize> = arg("--sessions")
        .unwrap_or_else(|| "10,100".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let m: usize = arg("--requests").and_then(|s| s.parse().ok()).unwrap_or(10);
    // Think time between an agent's requests; 0 = all agents fire in lockstep.
    let pace_ms: u64 = arg("--pace-ms").and_then(|s| s.parse().ok()).unwrap_or(200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tmp");
    println!(
        "load benchmark: {m} permission requests per session, automatic operator, SQLite store"
    );
    println!(
        "machine: {} cores",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!(
        "{:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>7} {:>9} {:>10} {:>9} {:>9} {:>6}",
        "N",
        "requests",
        "rtt p50",
        "rtt p99",
        "rtt max",
        "op p50",
        "op p99",
        "req/s",
        "cpu %",
        "peak MiB",
        "KiB/idle",
        "start p50",
        "start p99",
        "errors"
    );
    for n in sessions {
        let f = rt.block_on(run(n, m, pace_ms, dir.path()));
        println!(
            "{:>5} {:>8} {:>7}us {:>7}us {:>7}us {:>7}us {:>7}us {:>8.0} {:>7.0} {:>9.1} {:>10.0} {:>7}ms {:>7}ms {:>6}",
            f.n,
            f.requests,
            pct(&f.rtt_us, 0.5),
            pct(&f.rtt_us, 0.99),
            f.rtt_us.last().copied().unwrap_or(0),
            pct(&f.op_us, 0.5),
            pct(&f.op_us, 0.99),
            f.rps,
            f.cpu_pct,
            f.peak_rss_mb,
            f.idle_kib_per_session,
            pct(&f.start_ms, 0.5),
            pct(&f.start_ms, 0.99),
            f.errors
        );
    }
}
