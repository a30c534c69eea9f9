//! The `slack-limits` operator: busy sessions in one channel against the
//! Slack emulator enforcing Slack's published rate limits
//! (`tests/emulator/limits.rs`), the gateway pacing itself to the same
//! published rates (`PacingPolicy::slack()`), both sped up `--pace-factor`
//! times (1 = Slack's real rates).
//!
//! Each session: agent text, a plan, a tool call, `--pace-ms` of thinking,
//! more text, one permission request, the tool call's completion and closing
//! text. Sessions start spread over `--ramp-ms` in channel C1. The operator
//! polls the emulator every 10 ms and clicks "allow once" on every request
//! message it finds. Reported: request (`RequestOpened` emitted) -> its
//! buttons seen in the channel, p50/p95/max; the gateway's chatter backlog
//! (sampled every 250 ms: the largest, and what was left when the last
//! session went idle) and how long it took to drain after that; 429s per
//! method; Web API calls on each request's message and status-line updates.

use super::*;
use intercom_actors::gateway::{GatewayMsg, QueueDepth};

use crate::emulator::limits::RateLimits;

/// What one paced run measured.
pub struct PacedFigures {
    n: usize,
    factor: u32,
    pace_ms: u64,
    ramp_ms: u64,
    /// Request -> buttons seen, ms, sorted.
    buttons_ms: Vec<u64>,
    requests: usize,
    max_chatter: usize,
    chatter_at_idle: usize,
    drain_ms: u64,
    limited: u64,
    limited_by_method: String,
    calls_per_request_msg: f64,
    root_updates: usize,
    write_calls: usize,
    wall_s: f64,
    notes: Vec<String>,
}

fn scenario(rtt_log: &Path, pace_ms: u64) -> Value {
    let mut turn = vec![
        json!({"chunk": "reading the code to see what has to change. "}),
        json!({"plan": [
            {"content": "read", "priority": "medium", "status": "completed"},
            {"content": "edit", "priority": "medium", "status": "in_progress"}
        ]}),
        json!({"tool_call": {"id": "t1", "title": "Edit notes.txt", "kind": "edit", "status": "pending"}}),
    ];
    if pace_ms > 0 {
        turn.push(json!({"sleep_ms": pace_ms}));
    }
    turn.extend([
        json!({"chunk": "about to edit notes.txt. "}),
        json!({"permission": {"tool_call_id": "t1", "title": "Edit notes.txt", "kind": "edit"}}),
        json!({"tool_update": {"id": "t1", "status": "completed"}}),
        json!({"chunk": "done."}),
    ]);
    json!({"rtt_log": rtt_log, "turns": [turn]})
}

/// Clicks "allow once" on every request message; records when each was seen.
async fn operator(emu: emulator::Emulator, obs: Arc<Observed>) {
    let mut clicked: HashSet<String> = HashSet::new();
    loop {
        for m in emu.messages_in(CHANNEL) {
            if clicked.contains(&m.ts) {
                continue;
            }
            let Some(allow) = m.button("allow-once") else {
                continue;
            };
            if let Some((global, _)) = allow["value"].as_str().and_then(|v| v.rsplit_once('|')) {
                obs.saw(global, Instant::now());
            }
            emu.click(OWNER, &m, &allow);
            clicked.insert(m.ts.clone());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

struct PacedRig {
    sup: ActorRef<SupervisorMsg>,
    registry: ActorRef<RegistryMsg>,
    store: Arc<SqliteStore>,
    handle: SlackHandle,
    emu: emulator::Emulator,
    operator: tokio::task::JoinHandle<()>,
}

async fn rig(env: &Env, obs: &Arc<Observed>, factor: u32, bench: &Handle) -> PacedRig {
    let limits = RateLimits::slack().faster(factor);
    let emu = bench
        .spawn(async move { emulator::Emulator::start_with_limits(limits).await })
        .await
        .expect("emulator");
    let pacing = PacingPolicy::slack().faster(factor);
    let SlackEdge {
        sup,
        registry,
        store,
        handle,
    } = slack_edge(env, obs, "paced.db", emu.api_url.clone(), pacing).await;
    let operator = bench.spawn(operator(emu.clone(), obs.clone()));
    PacedRig {
        sup,
        registry,
        store,
        handle,
        emu,
        operator,
    }
}

fn env(n: usize, pace_ms: u64, ramp_ms: u64, root: &Path) -> Env {
    let dir = root.join(format!("slack-limits-{n}-pace{pace_ms}-ramp{ramp_ms}"));
    Env::prepare(n, &dir, n, |dir| scenario(&dir.join("rtt.log"), pace_ms))
}

/// Starts `n` sessions spread over `ramp_ms`; returns how many failed.
async fn start_all(rig: &PacedRig, env: &Env, ramp_ms: u64) -> usize {
    let mut starts = Vec::new();
    for i in 0..env.n {
        let req = StartRequest {
            workspace: "ws".into(),
            cwd: env.workspace.clone(),
            channel_id: Some(CHANNEL.into()),
            profile: env.profile.clone(),
            prompt: format!("busy session {i}"),
            owner: OWNER.into(),
            mode: None,
        };
        let sup = rig.sup.clone();
        let offset = Duration::from_millis(ramp_ms * i as u64 / env.n.max(1) as u64);
        starts.push(tokio::spawn(async move {
            tokio::time::sleep(offset).await;
            matches!(
                ractor::call!(sup, |reply| SupervisorMsg::Start { req, reply }),
                Ok(Ok(_))
            )
        }));
    }
    let mut failed = 0;
    for s in starts {
        if !s.await.unwrap_or(false) {
            failed += 1;
        }
    }
    failed
}

/// Samples the gateway's queues until `stop` is set; returns the largest chatter backlog.
async fn sample_depth(gw: ActorRef<GatewayMsg>, stop: Arc<std::sync::atomic::AtomicBool>) -> usize {
    let mut max = 0;
    while !stop.load(Ordering::Relaxed) {
        if let Ok(d) = ractor::call!(gw, GatewayMsg::Depth) {
            max = max.max(d.chatter);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    max
}

/// One run of the `slack-limits` operator.
pub async fn run_paced(
    n: usize,
    (pace_ms, ramp_ms): (u64, u64),
    factor: u32,
    root: &Path,
    bench: &Handle,
) -> PacedFigures {
    let env = env(n, pace_ms, ramp_ms, root);
    let obs = Arc::new(Observed::default());
    let rig = rig(&env, &obs, factor, bench).await;
    let gw = rig.handle.gateway().get();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = tokio::spawn(sample_depth(gw.clone(), stop.clone()));
    let t0 = Instant::now();
    let mut notes = Vec::new();
    let failed = start_all(&rig, &env, ramp_ms).await;
    if failed > 0 {
        notes.push(format!("{failed} starts failed"));
    }
    let deadline = Instant::now() + Duration::from_secs(1800);
    while obs.idle_count() < n - failed && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let idle_at = Instant::now();
    let at_idle: QueueDepth = ractor::call!(gw, GatewayMsg::Depth).unwrap_or_default();
    while rig.handle.backlog().await > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drain_ms = idle_at.elapsed().as_millis() as u64;
    let wall_s = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let max_chatter = sampler.await.unwrap_or(0);
    let figures = tally(&rig, &obs, &env, (factor, pace_ms, ramp_ms), notes);
    finish(rig).await;
    PacedFigures {
        max_chatter: max_chatter.max(at_idle.chatter),
        chatter_at_idle: at_idle.chatter,
        drain_ms,
        wall_s,
        ..figures
    }
}

/// Counts what the emulator saw.
fn tally(
    rig: &PacedRig,
    obs: &Observed,
    env: &Env,
    (factor, pace_ms, ramp_ms): (u32, u64, u64),
    mut notes: Vec<String>,
) -> PacedFigures {
    let buttons_ms: Vec<u64> = obs.notify_us().iter().map(|us| us / 1000).collect();
    let messages = rig.emu.messages_in(CHANNEL);
    let asks: Vec<&emulator::Msg> = messages
        .iter()
        .filter(|m| m.all_text().contains("Allow once") && m.all_text().contains("<@UOWNER>"))
        .collect();
    let calls_on_asks: u32 = asks.iter().map(|m| 1 + m.updates).sum();
    let roots: HashSet<&str> = messages
        .iter()
        .filter(|m| m.thread_ts.is_none())
        .map(|m| m.ts.as_str())
        .collect();
    let root_updates = rig
        .emu
        .ok_calls("chat.update")
        .iter()
        .filter(|c| c.params["ts"].as_str().is_some_and(|t| roots.contains(t)))
        .count();
    let write_calls = rig
        .emu
        .calls()
        .iter()
        .filter(|c| c.status == 200 && emulator::WRITE_METHODS.contains(&c.method.as_str()))
        .count();
    let limited_by_method = emulator::WRITE_METHODS
        .iter()
        .map(|m| (m, rig.emu.counts(m).limited))
        .filter(|(_, l)| *l > 0)
        .map(|(m, l)| format!("{m} {l}"))
        .collect::<Vec<_>>()
        .join(", ");
    if asks.len() != env.n {
        notes.push(format!(
            "{} of {} requests shown decided",
            asks.len(),
            env.n
        ));
    }
    let mut buttons_ms = buttons_ms;
    buttons_ms.sort_unstable();
    PacedFigures {
        n: env.n,
        factor,
        pace_ms,
        ramp_ms,
        requests: buttons_ms.len(),
        buttons_ms,
        max_chatter: 0,
        chatter_at_idle: 0,
        drain_ms: 0,
        limited: rig.emu.limited_total(),
        limited_by_method,
        calls_per_request_msg: f64::from(calls_on_asks) / asks.len().max(1) as f64,
        root_updates,
        write_calls,
        wall_s: 0.0,
        notes,
    }
}

async fn finish(rig: PacedRig) {
    ractor::call!(rig.sup, SupervisorMsg::Shutdown).ok();
    rig.sup.stop_and_wait(None, None).await.ok();
    rig.handle.shutdown().await;
    rig.registry.stop_and_wait(None, None).await.ok();
    rig.operator.abort();
    if let Ok(store) = Arc::try_unwrap(rig.store) {
        store.close().await;
    }
}

/// The table header for paced runs.
pub fn header() -> &'static str {
    "| operator | N | pace factor | pace ms | ramp ms | requests | buttons p50 ms | buttons p95 ms | buttons max ms | chatter backlog max | chatter at last idle | drain after idle ms | 429s | calls per request message | root status updates | write calls | wall s |\n\
     |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
}

impl PacedFigures {
    /// One table row, and its notes.
    pub fn row(&self) -> (String, Vec<String>) {
        let row = format!(
            "| slack-limits | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {:.1} |",
            self.n,
            self.factor,
            self.pace_ms,
            self.ramp_ms,
            self.requests,
            pct(&self.buttons_ms, 0.5),
            pct(&self.buttons_ms, 0.95),
            self.buttons_ms.last().copied().unwrap_or(0),
            self.max_chatter,
            self.chatter_at_idle,
            self.drain_ms,
            self.limited,
            self.calls_per_request_msg,
            self.root_updates,
            self.write_calls,
            self.wall_s,
        );
        let mut notes = self.notes.clone();
        if !self.limited_by_method.is_empty() {
            notes.push(format!("429s by method: {}", self.limited_by_method));
        }
        (row, notes)
    }
}
