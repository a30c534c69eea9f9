//! How fast writes reach the writer: what decides whether the commit window
//! applies.
//!
//! Why this exists: the commit window (`writer.rs`) makes commits under load
//! wait a little so the writes that arrive meanwhile share them (issue 13:
//! at most one commit per approval with 500 agents). Below that load it only
//! costs time. One agent's writes arrive in a row (its text, its tool call,
//! then the request it waits on), so "writes arrived during the last commit"
//! was true for a single session too, and the request waited out the window
//! behind its own chatter. Measured on the 2-core machine (BENCHMARKS.md,
//! session 8): with no window, 100 agents' round trips were faster (p50 about
//! 0.35 ms against 0.4 to 0.6, p99 1.7 to 1.8 ms against 2.1 to 2.5) for a
//! few more commits, while 500 agents made 1.7 to 2.1 commits per approval
//! and used more CPU. So the window applies only when writes arrive faster
//! than [`UNDER_LOAD`] a second, measured over [`BUCKET`], which lies
//! between what 100 agents write (about 3,000 a second) and what 500 write
//! (about 12,000).

use std::time::{Duration, Instant};

/// Writes a second from which the writer counts as under load.
pub(super) const UNDER_LOAD: f64 = 6_000.0;

/// How long each measurement lasts: longer than an agent's think time in
/// the benchmark (200 ms), so agents that fire in step do not read as load.
pub(super) const BUCKET: Duration = Duration::from_millis(250);

/// The rate writes committed at over the last whole [`BUCKET`].
#[derive(Debug)]
pub(super) struct WriteRate {
    bucket_start: Instant,
    writes: u64,
    per_sec: f64,
}

impl WriteRate {
    /// No writes yet: not under load.
    pub(super) fn new(now: Instant) -> WriteRate {
        WriteRate {
            bucket_start: now,
            writes: 0,
            per_sec: 0.0,
        }
    }

    /// `writes` committed at `now`; closes the bucket once it is whole.
    pub(super) fn committed(&mut self, now: Instant, writes: u64) {
        self.writes += writes;
        let elapsed = now.saturating_duration_since(self.bucket_start);
        if elapsed >= BUCKET {
            self.per_sec = self.writes as f64 / elapsed.as_secs_f64();
            self.writes = 0;
            self.bucket_start = now;
        }
    }

    /// Whether the last whole bucket saw at least [`UNDER_LOAD`] writes a second.
    pub(super) fn under_load(&self) -> bool {
        self.per_sec >= UNDER_LOAD
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` writes spread over one bucket starting at `from`, one commit per
    /// `per_commit` writes; the time after the bucket.
    fn fill(rate: &mut WriteRate, from: Instant, n: u64, per_commit: u64) -> Instant {
        let commits = (n / per_commit) as u32;
        for i in 1..=commits {
            rate.committed(from + BUCKET * i / commits, per_commit);
        }
        from + BUCKET
    }

    #[test]
    fn a_fresh_writer_is_not_under_load() {
        assert!(!WriteRate::new(Instant::now()).under_load());
    }

    #[test]
    fn load_is_read_from_whole_buckets_and_ends_with_them() {
        let t0 = Instant::now();
        let mut rate = WriteRate::new(t0);
        // 12,000 writes a second (500 agents), six writes a commit.
        let per_bucket = (12_000.0 * BUCKET.as_secs_f64()) as u64;
        let mut t = fill(&mut rate, t0, per_bucket, 6);
        assert!(rate.under_load(), "{rate:?}");
        // 3,000 a second (100 agents), two a commit: no longer under load
        // once that bucket is whole.
        let per_bucket = (3_000.0 * BUCKET.as_secs_f64()) as u64;
        t = fill(&mut rate, t, per_bucket, 2);
        assert!(!rate.under_load(), "{rate:?}");
        // A burst inside a bucket counts only when the bucket closes.
        rate.committed(t + Duration::from_millis(1), 5_000);
        assert!(!rate.under_load(), "{rate:?}");
        rate.committed(t + BUCKET, 1);
        assert!(rate.under_load(), "{rate:?}");
    }

    #[test]
    fn an_idle_stretch_reads_as_no_load() {
        let t0 = Instant::now();
        let mut rate = WriteRate::new(t0);
        let per_bucket = (12_000.0 * BUCKET.as_secs_f64()) as u64;
        let t = fill(&mut rate, t0, per_bucket, 6);
        assert!(rate.under_load());
        // Ten idle seconds, then one commit: the bucket it closes is idle.
        rate.committed(t + Duration::from_secs(10), 3);
        assert!(!rate.under_load(), "{rate:?}");
    }
}
