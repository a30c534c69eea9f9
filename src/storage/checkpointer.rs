//! The WAL checkpointer: copies committed pages from the write-ahead log
//! into the database file on a thread and connection of its own.
//!
//! Why this exists: SQLite checkpoints by itself inside the `COMMIT` that
//! takes the WAL past 1,000 pages, on the connection that committed. Here
//! that is the one writer, so every few hundred commits one commit also
//! copied the whole WAL into the database file and synced it, and every
//! write queued behind it waited: a single session saw every sixtieth
//! approval take 4 to 6 ms instead of 0.7 (the load bench, issue 13). The
//! writer's connection therefore never checkpoints: its WAL hook
//! ([`wal_size`]) replaces SQLite's automatic checkpoint and only notes how
//! many pages the WAL holds. Past [`THRESHOLD`] pages (SQLite's own default)
//! the writer nudges this thread, which runs a `PASSIVE` checkpoint (it
//! copies what it can without waiting for anyone, and never blocks the
//! writer, which keeps appending to the WAL meanwhile), at most once per
//! [`INTERVAL`]. Once a checkpoint has copied everything, the writer's next
//! transaction starts the WAL over from its beginning, so the file stays
//! about as small as SQLite alone keeps it.
//!
//! Except under writes without pause (an agent flooding updates): each
//! checkpoint copies what was committed when it began, the writer appends
//! meanwhile, the checkpoint never copies *everything*, and the WAL never
//! starts over (it grew to 9.5 GB in 90 s and kept that size). So past
//! [`HARD_LIMIT`] pages the writer checkpoints on its own connection, right
//! after its commit: nothing is appended meanwhile, so that checkpoint
//! copies everything (only what the thread had not copied yet, plus a
//! sync), and the writer's next transaction starts the WAL over, the file
//! cut back to [`WAL_SIZE_LIMIT`] (`journal_size_limit`). A blocking
//! `TRUNCATE` checkpoint from the thread was tried first: it held the
//! writer while readers finished, and the load bench's N = 500 p99 went
//! from 7 ms to 64.
//!
//! A failed checkpoint is logged and tried again after the next commit:
//! nothing is lost by it (the pages are in the WAL, which readers read and
//! which SQLite checkpoints when the last connection closes). Should the
//! thread be gone, the writer checkpoints on its own connection again, as
//! SQLite would have: slower commits, but the WAL never grows without bound.

use std::cell::Cell;
use std::ffi::c_int;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;
use rusqlite::hooks::Wal;

/// Checkpoint once the WAL holds this many pages (SQLite's default for its
/// automatic checkpoint).
const THRESHOLD: c_int = 1000;

/// At most one checkpoint this often: commits in between share it.
const INTERVAL: Duration = Duration::from_millis(200);

/// Past this many pages (about 64 MiB at 4 KiB pages) the writer
/// checkpoints itself so the WAL can start over (see the module doc).
const HARD_LIMIT: c_int = 16_384;

/// The WAL file's size once it starts over (`journal_size_limit`, bytes).
pub(crate) const WAL_SIZE_LIMIT: i64 = 64 << 20;

thread_local! {
    /// Pages in the WAL after the last commit on this thread's connection
    /// (set by [`wal_size`]; only the writer's thread registers it).
    static WAL_PAGES: Cell<c_int> = const { Cell::new(0) };
}

/// The writer connection's WAL hook: runs on the writer's thread inside each
/// `COMMIT` and notes the WAL's size, read back by
/// [`Checkpointer::committed`] on the same thread. Registering it replaces
/// SQLite's automatic checkpoint (which is itself a WAL hook).
pub(crate) fn wal_size(_: &Wal, pages: c_int) -> rusqlite::Result<()> {
    WAL_PAGES.with(|p| p.set(pages));
    Ok(())
}

/// What the writer and the checkpointer thread tell each other.
///
/// Why not a channel: a commit past the threshold happens thousands of times
/// a second under load, and a channel the thread waits on during its pause
/// woke it (a context switch) for every one of them, only to note "again".
/// Here the writer wakes the thread only when it sleeps waiting for work;
/// during a pause a commit just sets a flag the thread reads afterwards.
#[derive(Debug, Default)]
struct Signal {
    flags: Mutex<Flags>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct Flags {
    /// Something committed past the threshold since the last checkpoint began.
    committed: bool,
    /// The thread sleeps until the next such commit (not in a pause).
    waiting: bool,
    /// The writer is gone: stop.
    stopped: bool,
}

impl Signal {
    fn flags(&self) -> MutexGuard<'_, Flags> {
        // Nothing is left half-changed by a panic while holding it.
        self.flags.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A commit left the WAL past the threshold; true when that woke the
    /// thread (at most once per wait).
    fn nudge(&self) -> bool {
        let mut flags = self.flags();
        flags.committed = true;
        let wake = std::mem::take(&mut flags.waiting);
        if wake {
            self.wake.notify_one();
        }
        wake
    }

    fn stop(&self) {
        self.flags().stopped = true;
        self.wake.notify_one();
    }

    /// Sleeps until a nudge (true: checkpoint now) or a stop (false).
    fn until_nudged(&self) -> bool {
        let mut flags = self.flags();
        while !flags.committed && !flags.stopped {
            flags.waiting = true;
            flags = self
                .wake
                .wait(flags)
                .unwrap_or_else(PoisonError::into_inner);
        }
        flags.waiting = false;
        flags.committed = false;
        !flags.stopped
    }

    /// Sleeps for `pause` unless stopped meanwhile (false then). Nudges
    /// during it do not wake the thread.
    fn pause(&self, pause: Duration) -> bool {
        let flags = self.flags();
        let (flags, _) = self
            .wake
            .wait_timeout_while(flags, pause, |f| !f.stopped)
            .unwrap_or_else(PoisonError::into_inner);
        !flags.stopped
    }
}

/// The writer's handle: nudge after a commit; dropped, it stops the thread
/// and waits for it (its connection closed).
#[derive(Debug)]
pub(crate) struct Checkpointer {
    signal: Arc<Signal>,
    thread: Option<JoinHandle<()>>,
    /// The thread is gone and that was logged (once).
    said_gone: bool,
}

impl Checkpointer {
    /// Opens the checkpointer's own connection to `path` and starts its
    /// thread.
    pub(crate) fn start(path: &Path, busy_timeout: Duration) -> std::io::Result<Checkpointer> {
        let conn = Connection::open(path).map_err(std::io::Error::other)?;
        conn.busy_timeout(busy_timeout)
            .map_err(std::io::Error::other)?;
        let signal = Arc::new(Signal::default());
        let theirs = signal.clone();
        let thread = std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || run(&conn, &theirs))?;
        Ok(Checkpointer {
            signal,
            thread: Some(thread),
            said_gone: false,
        })
    }

    /// Something committed on `writer` (on this thread; its WAL hook is
    /// [`wal_size`]): checkpoint soon if the WAL is past [`THRESHOLD`].
    /// Never blocks, unless the thread is gone: then `writer` checkpoints
    /// here and now.
    pub(crate) fn committed(&mut self, writer: &Connection) {
        self.committed_within(writer, HARD_LIMIT);
    }

    /// [`Checkpointer::committed`] with the hard limit given (tests).
    fn committed_within(&mut self, writer: &Connection, hard_limit: c_int) {
        let pages = WAL_PAGES.with(Cell::get);
        if pages < THRESHOLD {
            return;
        }
        if pages >= hard_limit {
            tracing::debug!(pages, "WAL past its hard limit: the writer checkpoints");
            checkpoint(writer);
            return;
        }
        if self.thread.as_ref().is_some_and(|t| !t.is_finished()) {
            self.signal.nudge();
            return;
        }
        if !self.said_gone {
            self.said_gone = true;
            tracing::error!(
                "the WAL checkpointer thread has stopped; the writer checkpoints by itself from now on"
            );
        }
        checkpoint(writer);
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.signal.stop();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the WAL checkpointer panicked");
        }
    }
}

/// Waits for a commit past the threshold, checkpoints, pauses (commits
/// meanwhile make the next wait return at once); until the writer is gone.
fn run(conn: &Connection, signal: &Signal) {
    while signal.until_nudged() {
        checkpoint(conn);
        if !signal.pause(INTERVAL) {
            return;
        }
    }
}

/// One `PASSIVE` checkpoint; a failure is logged (the next one retries).
fn checkpoint(conn: &Connection) {
    let outcome = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
    });
    match outcome {
        Ok((log, copied)) => tracing::trace!(log, copied, "WAL checkpoint"),
        Err(e) => tracing::warn!("WAL checkpoint failed (retried after the next commit): {e}"),
    }
}

#[cfg(test)]
mod tests {
    use intercom_actors::model::{MessageKind, Role, SessionId};
    use intercom_actors::ports::{SessionStore, StoreError};

    use std::time::Instant;

    use super::*;
    use crate::storage::tests::file_store;

    /// The writer's own setting, read on the writer's connection.
    fn autocheckpoint(_: &(), conn: &Connection) -> Result<i64, StoreError> {
        conn.query_row("PRAGMA wal_autocheckpoint", [], |row| row.get(0))
            .map_err(|e| StoreError::Backend {
                op: "read pragma",
                message: e.to_string(),
            })
    }

    #[test]
    fn without_its_thread_the_writer_checkpoints_by_itself() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("db.sqlite");
        let conn = Connection::open(&path).expect("open");
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x)")
            .expect("setup");
        conn.wal_hook(Some(wal_size));
        // About 1,250 pages, past the threshold, only in the WAL so far.
        conn.execute_batch("INSERT INTO t VALUES (zeroblob(5000000))")
            .expect("insert");
        let before = std::fs::metadata(&path).expect("db file").len();
        let mut gone = Checkpointer {
            signal: Arc::default(),
            thread: None,
            said_gone: false,
        };
        gone.committed(&conn);
        assert!(gone.said_gone);
        assert!(
            std::fs::metadata(&path).expect("db file").len() > before + 4_000_000,
            "the writer did not checkpoint"
        );
    }

    #[test]
    fn past_the_hard_limit_the_writer_checkpoints_and_the_wal_starts_over() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("db.sqlite");
        let writer = Connection::open(&path).expect("open");
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA journal_size_limit = 65536; CREATE TABLE t (x)",
            )
            .expect("setup");
        writer.wal_hook(Some(wal_size));
        // About 1,250 pages, only in the WAL so far.
        writer
            .execute_batch("INSERT INTO t VALUES (zeroblob(5000000))")
            .expect("insert");
        let wal = dir.path().join("db.sqlite-wal");
        assert!(std::fs::metadata(&wal).expect("wal").len() > 4_000_000);
        // A running thread that never checkpoints: under the hard limit the
        // writer would only nudge it, and the WAL would not start over.
        let signal = Arc::new(Signal::default());
        let theirs = signal.clone();
        let idle = std::thread::spawn(move || while theirs.until_nudged() {});
        let mut checkpointer = Checkpointer {
            signal,
            thread: Some(idle),
            said_gone: false,
        };
        checkpointer.committed_within(&writer, 1_200);
        writer
            .execute_batch("INSERT INTO t VALUES (1)")
            .expect("the next transaction");
        let after = std::fs::metadata(&wal).expect("wal").len();
        assert!(
            after <= 65_536 + 8_192,
            "the WAL did not start over: {after} bytes"
        );
        let n: i64 = writer
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("read back");
        assert_eq!(n, 2);
    }

    #[test]
    fn a_nudge_wakes_the_thread_only_when_it_waits_for_work() {
        let signal = Signal::default();
        // In a pause (not waiting): commits only leave a note.
        assert!(!signal.nudge());
        assert!(!signal.nudge());
        // The note makes the next wait return at once, without sleeping.
        assert!(signal.until_nudged());
        // Waiting: the first commit wakes it, the ones after it do not.
        signal.flags().waiting = true;
        assert!(signal.nudge());
        assert!(!signal.nudge());
        assert!(signal.until_nudged());
        signal.stop();
        assert!(!signal.until_nudged());
        assert!(!signal.pause(Duration::from_secs(60)));
    }

    #[test]
    fn dropping_the_writers_handle_stops_the_thread_waiting_or_pausing() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("db.sqlite");
        Connection::open(&path)
            .expect("open")
            .execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x)")
            .expect("setup");
        for nudged in [false, true] {
            let handle = Checkpointer::start(&path, Duration::from_secs(1)).expect("start");
            if nudged {
                // It checkpoints, then pauses for INTERVAL.
                handle.signal.nudge();
            }
            let (done, dropped) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                drop(handle);
                let _ = done.send(());
            });
            dropped
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("the thread never stopped (nudged: {nudged})"));
        }
    }

    #[tokio::test]
    async fn commits_reach_the_database_file_without_the_writer_checkpointing() {
        let (_dir, path, store) = file_store().await;
        assert_eq!(
            store.write((), autocheckpoint).await.expect("pragma"),
            0,
            "the writer's commits must never checkpoint"
        );
        let before = std::fs::metadata(&path).expect("db file").len();
        // About 1,200 pages: past the threshold.
        let text = "x".repeat(100_000);
        for _ in 0..50 {
            store
                .append_message(
                    &SessionId::from("s-1"),
                    Role::Agent,
                    MessageKind::Text,
                    &text,
                )
                .await
                .expect("append");
        }
        // Those pages are only in the WAL until a checkpoint copies them into
        // the database file, and the writer does not: the checkpointer does.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::metadata(&path).expect("db file").len() <= before {
            assert!(Instant::now() < deadline, "nothing was checkpointed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
