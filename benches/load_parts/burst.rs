//! The start-burst measurement (`--burst K`, core operator): while the N
//! loaded sessions' decisions flow, K more sessions start at once; the
//! decision round trips that completed during the burst are compared with
//! those of a steady window just before it.
//!
//! Why: deciding must not wait behind session starts (issue 13's target: a
//! burst of 500 starts raises the decision p99 by at most 2x). The round
//! trips come from the scripted agents' `rtt_log`, which is in completion
//! order, so a window is the lines appended between two moments. The burst
//! sessions run a one-chunk scenario without requests (and no `rtt_log`).

use super::*;

/// How long the steady window before the burst lasts.
const STEADY: Duration = Duration::from_secs(3);

/// Round trips (µs, sorted) before and during the burst.
pub struct BurstFigures {
    pub steady: Vec<u64>,
    pub during: Vec<u64>,
    pub started: usize,
    pub took_ms: u64,
}

impl BurstFigures {
    /// The note printed below the table.
    pub fn note(&self) -> String {
        let (s99, d99) = (pct(&self.steady, 0.99), pct(&self.during, 0.99));
        format!(
            "start burst: {} sessions started in {} ms while decisions flowed; decision rtt p50/p99 steady {}/{} µs ({} round trips in {} s before), during the burst {}/{} µs ({} round trips); p99 during / steady = {:.2}",
            self.started,
            self.took_ms,
            pct(&self.steady, 0.5),
            s99,
            self.steady.len(),
            STEADY.as_secs(),
            pct(&self.during, 0.5),
            d99,
            self.during.len(),
            d99 as f64 / s99.max(1) as f64
        )
    }
}

/// Measures a steady window, then starts `count` quiet sessions at once and
/// measures the round trips completed until the last start was answered.
pub async fn burst(rig: &Rig, env: &Env, rtt_log: &Path, count: usize) -> BurstFigures {
    let scenario_path = env.dir.join("burst-scenario.json");
    let scenario = json!({"turns": [[{"chunk": "started."}]]});
    std::fs::write(&scenario_path, scenario.to_string()).expect("burst scenario");
    let profile = AgentProfile {
        id: "quiet".into(),
        args: vec!["--scenario".into(), scenario_path.display().to_string()],
        ..env.profile.clone()
    };
    let c0 = read_rtts(rtt_log).len();
    tokio::time::sleep(STEADY).await;
    let c1 = read_rtts(rtt_log).len();
    let t = Instant::now();
    let start = rig.starter(env, profile);
    let mut starts = Vec::new();
    for i in 0..count {
        let started = start(env.n + i);
        starts.push(tokio::spawn(async move { started.await.is_ok() }));
    }
    let mut started = 0;
    for s in starts {
        if s.await.unwrap_or(false) {
            started += 1;
        }
    }
    let took_ms = t.elapsed().as_millis() as u64;
    let all = read_rtts(rtt_log);
    let mut steady: Vec<u64> = all[c0.min(all.len())..c1.min(all.len())].to_vec();
    let mut during: Vec<u64> = all[c1.min(all.len())..].to_vec();
    steady.sort_unstable();
    during.sort_unstable();
    BurstFigures {
        steady,
        during,
        started,
        took_ms,
    }
}
