//! The floor: what one durable approval cannot go below on this machine,
//! measured in the same run as the load (a pipe round trip to `cat` and one
//! commit through the real store, nothing else in flight), so every round
//! trip can be read as a multiple of it.

use super::*;

/// The floor: what one durable approval cannot go below on this machine,
/// measured in the same run as the load. A pipe round trip to a trivial
/// child (`cat`: one line out, the same line back) and one store commit
/// (a one-row update through `SqliteStore`, nothing else in flight).
pub(super) struct Floor {
    pub(super) pipe_us: Vec<u64>,
    pub(super) commit_us: Vec<u64>,
}

impl Floor {
    /// The floor at percentile `p`: pipe round trip + one commit.
    pub(super) fn at(&self, p: f64) -> u64 {
        pct(&self.pipe_us, p) + pct(&self.commit_us, p)
    }

    /// `us` as a multiple of the floor at percentile `p`.
    pub(super) fn times(&self, us: u64, p: f64) -> String {
        format!("{:.1}", us as f64 / self.at(p).max(1) as f64)
    }
}

/// Round trips of one short line through `cat` over pipes.
pub(super) fn measure_pipe(rounds: usize) -> Vec<u64> {
    use std::io::{BufRead, BufReader, Write};
    let mut child = std::process::Command::new("cat")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn cat");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let mut out = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let t = Instant::now();
        writeln!(stdin, "{{\"jsonrpc\":\"2.0\",\"id\":{i}}}").expect("write");
        stdin.flush().expect("flush");
        line.clear();
        stdout.read_line(&mut line).expect("read");
        out.push(t.elapsed().as_micros() as u64);
    }
    drop(stdin);
    let _ = child.wait();
    out.sort_unstable();
    out
}

/// One commit at a time (nothing to batch with) through the real store on
/// a file in `dir`.
pub(super) async fn measure_commit(dir: &Path, rounds: usize) -> Vec<u64> {
    let store = SqliteStore::open(&dir.join("floor.db"))
        .await
        .expect("floor store");
    let id = SessionId::from("floor");
    store
        .create_session(&intercom_actors::model::SessionRecord {
            id: id.clone(),
            workspace: "ws".into(),
            cwd: dir.display().to_string(),
            agent: "none".into(),
            protocol: Protocol::Acp,
            status: SessionStatus::Active,
            status_reason: None,
            title: "floor".into(),
            owner: OWNER.into(),
            acp_session_id: None,
            channel_id: None,
            thread_ts: None,
            restart_count: 0,
            created_at: 0,
            updated_at: 0,
            last_activity_at: 0,
        })
        .await
        .expect("floor session");
    let mut out = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        store.touch(&id).await.expect("touch");
        out.push(t.elapsed().as_micros() as u64);
    }
    store.close().await;
    out.sort_unstable();
    out
}
