//! Killing an agent and everything it started, including what left its group.
//!
//! Why this exists: agents run in a process group of their own and are
//! stopped by signalling the group. A hostile (or merely careless) agent can
//! move a child into a group or session of its own (`setsid`, `setpgid`); a
//! group kill does not reach it, and it would outlive its session holding
//! the agent's pipes or doing work nobody supervises. So before the group is
//! SIGKILLed, the agent's descendants are found by their parent links in
//! `/proc` (while they are still linked to the agent: once it dies they are
//! re-parented and cannot be told apart), stopped with SIGSTOP so they
//! cannot fork out of the walk, and killed with the group.
//!
//! A graceful stop closes the agent's stdin first, and an agent that exits
//! then re-parents its children before any kill: so the stop takes a
//! [`snapshot`] of the descendants first and kills what is left of it once
//! the agent exited ([`kill_listed`]).
//!
//! Limit (docs/security.md): a descendant that was already re-parented
//! before the kill or the stop's snapshot (double fork, its parent exited)
//! is not found; agents run as the operator's user, and a sandbox is the
//! answer for that.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::child::{signal_group, start_time};

/// How many times the walk is repeated to catch children forked while it ran
/// (each round stops what it found, so a round with nothing new ends it).
const ROUNDS: usize = 4;

/// SIGKILLs process group `pid` and every descendant of process `pid`,
/// wherever its group. `started` is the process's start time when it was
/// spawned ([`start_time`]): the descendants are walked only while `pid` is
/// still that process, never a recycled pid's tree. Does nothing for
/// `pid <= 0`.
pub fn kill_tree(pid: i32, started: Option<u64>) {
    if pid <= 0 {
        return;
    }
    let strays = if still_the_same(pid, started) {
        stop_descendants(pid)
    } else {
        HashSet::new()
    };
    signal_group(pid, libc::SIGKILL);
    for stray in strays {
        signal(stray, libc::SIGKILL);
    }
}

/// Stops the group and every descendant of `root` (SIGSTOP), walking again
/// until a walk finds nothing new; returns the descendants.
fn stop_descendants(root: i32) -> HashSet<i32> {
    let mut found = HashSet::new();
    signal_group(root, libc::SIGSTOP);
    for _ in 0..ROUNDS {
        let fresh: Vec<i32> = descendants(root)
            .into_iter()
            .filter(|p| !found.contains(p))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for &p in &fresh {
            signal(p, libc::SIGSTOP);
        }
        found.extend(fresh);
    }
    found
}

/// True while `pid` is still the process that started at `started`
/// ([`start_time`]), never a recycled pid.
fn still_the_same(pid: i32, started: Option<u64>) -> bool {
    started.is_some() && start_time(pid) == started
}

/// Every descendant of `root` now, with its start time, so it can be
/// recognised later (after `root` exited and it was re-parented); empty
/// when `root` is no longer the process that started at `started`.
pub fn snapshot(root: i32, started: Option<u64>) -> Vec<(i32, u64)> {
    if !still_the_same(root, started) {
        return Vec::new();
    }
    descendants(root)
        .into_iter()
        .filter_map(|p| Some((p, start_time(p)?)))
        .collect()
}

/// SIGKILLs each process of a [`snapshot`] that is still the same process
/// (same start time: never a recycled pid).
pub fn kill_listed(procs: &[(i32, u64)]) {
    for &(pid, started) in procs {
        if still_the_same(pid, Some(started)) {
            signal(pid, libc::SIGKILL);
        }
    }
}

/// Every process below `root` in the parent tree (not `root` itself), from
/// a scan of `/proc` that began after this call ([`Scans`]).
pub fn descendants(root: i32) -> Vec<i32> {
    let children = SCANS.fresh();
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for &kid in children.get(&p).into_iter().flatten() {
            if !out.contains(&kid) {
                out.push(kid);
                stack.push(kid);
            }
        }
    }
    out
}

/// Each process's children, as one scan of `/proc` saw them.
type Children = HashMap<i32, Vec<i32>>;

/// The scans of `/proc` every walk shares.
static SCANS: Scans = Scans::new(scan);

/// Scans of `/proc`, shared by the walks that wait for the same one.
///
/// Why this exists: Linux has no cheap "children of" query here (the
/// `/proc/<pid>/task/<tid>/children` files need `CONFIG_PROC_CHILDREN`),
/// so a walk reads the parent of every process on the machine. When many
/// sessions stop at once (shutdown, a workspace removed from the config),
/// each stop walked, every walk read all of `/proc`, and the work grew with
/// sessions × processes (500 sessions: about 500 × 1,000 files read). Now
/// a walk asks for a scan that *begins after it asked* (so any child forked
/// before the ask is in it), and every walk that asks while one scan runs
/// shares the next one.
///
/// A mutex and a condvar rather than an actor: callers are synchronous
/// (a stop in `Drop` must not return before the kill) and the state is a
/// counter and the last result.
struct Scans {
    state: Mutex<ScanState>,
    finished: Condvar,
    /// What a scan reads (`scan`; tests give one they can hold).
    scan: fn() -> Children,
}

struct ScanState {
    /// Scans begun so far (the running one included).
    begun: u64,
    /// The number of the last scan that finished.
    done: u64,
    /// A scan is running (its number is `begun`).
    running: bool,
    /// What the last finished scan saw.
    latest: Option<Arc<Children>>,
    /// Callers waiting for a running scan to finish.
    waiting: usize,
}

impl Scans {
    const fn new(scan: fn() -> Children) -> Scans {
        Scans {
            state: Mutex::new(ScanState {
                begun: 0,
                done: 0,
                running: false,
                latest: None,
                waiting: 0,
            }),
            finished: Condvar::new(),
            scan,
        }
    }

    fn state(&self) -> MutexGuard<'_, ScanState> {
        // Nothing is left half-changed by a panic while holding it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The result of a scan that began after this call: runs one unless
    /// another caller already does.
    fn fresh(&self) -> Arc<Children> {
        let mut state = self.state();
        let wanted = state.begun + 1;
        loop {
            if state.done >= wanted
                && let Some(latest) = &state.latest
            {
                return Arc::clone(latest);
            }
            if state.running {
                state.waiting += 1;
                state = self
                    .finished
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                state.waiting -= 1;
                continue;
            }
            state.running = true;
            state.begun += 1;
            let number = state.begun;
            drop(state);
            // Should a scan ever panic, `running` must not stay set (every
            // later walk would wait for good): its walkers get no children.
            let children = Arc::new(std::panic::catch_unwind(self.scan).unwrap_or_default());
            state = self.state();
            state.running = false;
            state.done = number;
            state.latest = Some(children);
            self.finished.notify_all();
        }
    }

    /// Scans begun so far (tests).
    #[cfg(test)]
    fn begun(&self) -> u64 {
        self.state().begun
    }

    /// Callers waiting for the running scan (tests).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.state().waiting
    }
}

/// Reads the parent of every process in `/proc`.
fn scan() -> Children {
    let mut children: Children = HashMap::new();
    each_stat(|pid, fields| {
        // Field 4: the parent.
        if let Some(ppid) = fields
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
        {
            children.entry(ppid).or_default().push(pid);
        }
    });
    children
}

/// Those of the process groups `pgids` that still have a member that is
/// not a zombie (`/proc/<pid>/stat`: state, field 3; group, field 5).
pub fn groups_with_running_members(pgids: &[i32]) -> Vec<i32> {
    let mut running = HashSet::new();
    each_stat(|_, fields| {
        let mut fields = fields.split_whitespace();
        let state = fields.next();
        let group = fields.nth(1).and_then(|g| g.parse::<i32>().ok());
        if let Some(g) = group.filter(|g| pgids.contains(g))
            && !matches!(state, Some("Z" | "X"))
        {
            running.insert(g);
        }
    });
    pgids
        .iter()
        .copied()
        .filter(|g| running.contains(g))
        .collect()
}

/// Calls `f` with each process's pid and the fields of its
/// `/proc/<pid>/stat` after the command name (which may hold spaces and
/// ')'), from field 3 on; a process gone by the time it is read is left out.
fn each_stat(mut f: impl FnMut(i32, &str)) {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((_, fields)) = stat.rsplit_once(')') {
            f(pid, fields);
        }
    }
}

fn signal(pid: i32, sig: i32) {
    if pid > 0 {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    /// Dead or a zombie nobody reaped yet (a container's init may not reap).
    fn gone(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state == "Z" || state == "X"),
        }
    }

    /// A leader in its own group that starts a `sleep` in a session (and so
    /// a group) of its own; returns the leader and the sleep's pid once the
    /// walk can see it.
    fn leader_with_a_stray() -> (std::process::Child, i32) {
        let mut leader = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 300 & echo $!; wait"])
            .process_group(0)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn sh");
        let mut line = String::new();
        std::io::BufReader::new(leader.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read pid");
        let stray: i32 = line.trim().parse().expect("pid");
        // `$!` is printed at the fork, before `setsid` ran: wait until the
        // stray leads a session of its own (and is still the leader's child).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(own_session(stray) && descendants(leader.id() as i32).contains(&stray)) {
            assert!(Instant::now() < deadline, "the stray never left the group");
            std::thread::sleep(Duration::from_millis(5));
        }
        (leader, stray)
    }

    /// Whether `pid` leads its own session (`/proc/<pid>/stat` field 6).
    fn own_session(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let rest = stat.rsplit_once(')')?.1.to_owned();
                rest.split_whitespace().nth(3)?.parse::<i32>().ok()
            })
            == Some(pid)
    }

    fn wait_gone(pid: i32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !gone(pid) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    #[test]
    fn a_descendant_that_left_the_group_is_killed_with_it() {
        let (mut leader, stray) = leader_with_a_stray();
        let pid = leader.id() as i32;
        kill_tree(pid, start_time(pid));
        let _ = leader.wait();
        assert!(wait_gone(stray), "pid {stray} outlived the kill");
    }

    #[test]
    fn the_tree_of_a_recycled_pid_is_not_walked() {
        // A start time that is not the process's: the pid is taken to belong
        // to someone else now, so only the group is signalled.
        let (mut leader, stray) = leader_with_a_stray();
        let pid = leader.id() as i32;
        kill_tree(pid, start_time(pid).map(|t| t + 1));
        let _ = leader.wait();
        let survived = !gone(stray);
        signal(stray, libc::SIGKILL);
        assert!(survived, "a recycled pid's descendants were killed");
    }

    #[test]
    fn a_walk_sees_a_child_forked_just_before_it_asked() {
        for _ in 0..20 {
            let mut kid = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("spawn sleep");
            let me = std::process::id() as i32;
            let seen = descendants(me).contains(&(kid.id() as i32));
            let _ = kid.kill();
            let _ = kid.wait();
            assert!(seen, "a child forked before the walk was missed");
        }
    }

    #[test]
    fn walks_that_ask_while_a_scan_runs_share_the_next() {
        // The first scan is held until every other walk waits for it.
        static GATE: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());
        fn held_scan() -> Children {
            let (open, opened) = &GATE;
            let mut open = open.lock().unwrap_or_else(PoisonError::into_inner);
            while !*open {
                open = opened.wait(open).unwrap_or_else(PoisonError::into_inner);
            }
            scan()
        }
        static LOCAL: Scans = Scans::new(held_scan);
        let mut kid = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let (me, pid) = (std::process::id() as i32, kid.id() as i32);
        let walk = move || {
            LOCAL
                .fresh()
                .get(&me)
                .is_some_and(|kids| kids.contains(&pid))
        };
        let first = std::thread::spawn(walk);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while LOCAL.begun() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the first scan never began"
            );
            std::thread::yield_now();
        }
        let others: Vec<_> = (0..31).map(|_| std::thread::spawn(walk)).collect();
        while LOCAL.waiting() < 31 {
            assert!(
                std::time::Instant::now() < deadline,
                "the walks never waited"
            );
            std::thread::yield_now();
        }
        *GATE.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
        GATE.1.notify_all();
        let found: Vec<bool> = std::iter::once(first)
            .chain(others)
            .map(|w| w.join().expect("walker"))
            .collect();
        let _ = kid.kill();
        let _ = kid.wait();
        assert!(found.iter().all(|f| *f), "every walk finds the child");
        // The first walk's scan, then one the 31 that asked during it share.
        assert_eq!(LOCAL.begun(), 2, "scans for 32 walks");
    }

    #[test]
    fn a_group_of_zombies_counts_as_gone() {
        // A leader in a group of its own, killed and not reaped: a zombie.
        let mut leader = std::process::Command::new("sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .expect("spawn sleep");
        let pgid = leader.id() as i32;
        assert_eq!(groups_with_running_members(&[pgid]), vec![pgid]);
        signal(pgid, libc::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !gone(pgid) {
            assert!(Instant::now() < deadline, "never died");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Dead but not reaped yet: its group has nothing running.
        assert!(groups_with_running_members(&[pgid]).is_empty());
        let _ = leader.wait();
    }

    #[test]
    fn nothing_happens_for_a_missing_process() {
        kill_tree(0, None);
        kill_tree(-1, Some(1));
        assert!(descendants(i32::MAX).is_empty());
    }
}
