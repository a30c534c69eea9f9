//! What this process, its threads and the machine used, read from `/proc`:
//! CPU seconds, context switches, time runnable but waiting for a core,
//! RSS, load, and the wait for a quiet machine before a run.
//!
//! Why a module of its own: these readings are the bench's instruments, not
//! its scenario; `load.rs` says what runs, this says how it is measured.

use super::*;

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// utime + stime in seconds from a `/proc/.../stat` line.
pub fn stat_cpu(stat: &str) -> f64 {
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let f = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (f(11) + f(12)) / ticks()
}

pub fn status_kb(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// CPU seconds: (whole process, bench-side threads, machine busy).
#[derive(Clone, Copy)]
pub struct Cpu {
    pub process: f64,
    pub bench: f64,
    pub machine: f64,
}

/// What one group of threads (same name but for a trailing number) used.
#[derive(Debug, Default, Clone, Copy)]
pub struct ThreadUse {
    /// CPU seconds.
    cpu: f64,
    /// Context switches, voluntary (it waited) and not (it was preempted).
    switches: u64,
    /// Seconds it was ready to run but waited for a CPU (`schedstat`).
    runnable: f64,
}

/// What each live thread group (thread name without its number) has used
/// so far.
pub fn cpu_by_thread() -> HashMap<String, ThreadUse> {
    let mut out: HashMap<String, ThreadUse> = HashMap::new();
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let group = comm
                .trim_end()
                .trim_end_matches(|c: char| c.is_ascii_digit() || c == '-')
                .to_owned();
            let cpu = stat_cpu(&std::fs::read_to_string(t.path().join("stat")).unwrap_or_default());
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            let switches: u64 = status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum();
            let runnable = std::fs::read_to_string(t.path().join("schedstat"))
                .ok()
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
                .map_or(0.0, |ns| ns / 1e9);
            let used = out.entry(group).or_default();
            used.cpu += cpu;
            used.switches += switches;
            used.runnable += runnable;
        }
    }
    out
}

pub fn cpu_now() -> Cpu {
    let process = stat_cpu(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default());
    let bench = cpu_by_thread()
        .get(BENCH_THREAD)
        .map_or(0.0, |used| used.cpu);
    let machine = std::fs::read_to_string("/proc/stat")
        .unwrap_or_default()
        .lines()
        .next()
        .map(|l| {
            let v: Vec<f64> = l
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq steal
            let total: f64 = v.iter().take(8).sum();
            let idle = v.get(3).copied().unwrap_or(0.0) + v.get(4).copied().unwrap_or(0.0);
            (total - idle) / ticks()
        })
        .unwrap_or(0.0);
    Cpu {
        process,
        bench,
        machine,
    }
}

pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// Waits (up to `limit`) until the rest of the machine is quiet: less than
/// 0.15 of a core busy over 2 s. Returns the busy cores last seen.
pub fn wait_quiet(limit: Duration) -> f64 {
    let deadline = Instant::now() + limit;
    loop {
        let a = cpu_now();
        std::thread::sleep(Duration::from_secs(2));
        let b = cpu_now();
        let others = ((b.machine - a.machine) - (b.process - a.process)) / 2.0;
        if others < 0.15 || Instant::now() > deadline {
            return others;
        }
    }
}

/// The notes on what each thread group used between `before` and `after`:
/// CPU seconds over `wall` (and the process's `process_cpu`), and per
/// approval (of `approvals` round trips) context switches and time runnable
/// but waiting for a core.
pub fn thread_notes(
    before: &HashMap<String, ThreadUse>,
    after: &HashMap<String, ThreadUse>,
    wall: f64,
    process_cpu: f64,
    approvals: usize,
) -> Vec<String> {
    let mut groups: Vec<(String, ThreadUse)> = after
        .iter()
        .map(|(g, u)| {
            let was = before.get(g).copied().unwrap_or_default();
            let used = ThreadUse {
                cpu: u.cpu - was.cpu,
                switches: u.switches.saturating_sub(was.switches),
                runnable: u.runnable - was.runnable,
            };
            (g.clone(), used)
        })
        .filter(|(_, u)| u.cpu >= 0.005)
        .collect();
    groups.sort_by(|a, b| b.1.cpu.total_cmp(&a.1.cpu));
    let listed = |f: &dyn Fn(&ThreadUse) -> String| {
        groups
            .iter()
            .map(|(g, u)| format!("{g} {}", f(u)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut notes = vec![format!(
        "CPU seconds by thread over {wall:.2} s: {} (process total {process_cpu:.2})",
        listed(&|u| format!("{:.2}", u.cpu)),
    )];
    // Every hand-off between threads that finds the other one asleep costs
    // a switch (a wake-up): fewer is less CPU and less latency. Time spent
    // runnable but waiting for a core is what the machine adds.
    if approvals > 0 {
        let n = approvals as f64;
        notes.push(format!(
            "per approval by thread (threads that ended during the run not counted): context switches {}; µs runnable but waiting for a core {}",
            listed(&|u| format!("{:.1}", u.switches as f64 / n)),
            listed(&|u| format!("{:.0}", u.runnable * 1e6 / n)),
        ));
    }
    notes
}
