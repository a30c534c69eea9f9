//! The one writer path: every write to the database is queued to one thread
//! that commits whatever is waiting as one transaction (group commit).
//!
//! Why this exists: a durable SQLite commit (WAL, `synchronous = NORMAL`)
//! costs a fraction of a millisecond, and an approval used to make about five
//! of them, one per write. Under load the commits, not the work, were the
//! ceiling. Now writes that arrive while a commit is in flight wait for the
//! next one and share it: a busy server makes far fewer commits than writes.
//!
//! Why a thread of its own with a plain `rusqlite` connection, not a pooled
//! sqlx connection: sqlx runs each statement on the connection's worker
//! thread, so every statement (and `BEGIN`, `COMMIT`, each savepoint) was a
//! hop there and back, about 0.1 ms apiece on a busy 2-core machine, and the
//! writer, being one, serialised those hops: at 500 agents it was the
//! ceiling at about 8,000 writes a second. Here a whole batch runs on the
//! writer's own thread with cached prepared statements: one wake-up to take
//! the batch, one answer per caller. Reads stay on the sqlx pool.
//!
//! Guarantees:
//! - a caller is answered only after the transaction holding its write
//!   committed (or with the error that stopped it), so an acknowledged write
//!   survives a crash exactly as before;
//! - a failing write is rolled back alone and answered with its error, its
//!   neighbours still commit (the batch runs again with one savepoint per
//!   write once any write failed);
//! - should a failing write take the whole transaction down with it (SQLite
//!   does that for some errors, e.g. a full disk), the others are run again
//!   in a fresh transaction, so they are not lost either;
//! - a write that panics fails alone, like a write that returned an error;
//! - writes from one caller commit in the order they were queued.
//!
//! When it commits: a write somebody waits for (the request an agent
//! waits on, the decision) is committed at once, with whatever else is
//! waiting. *Chatter* (writes queued inside [`intercom_actors::ports::chatter`]:
//! transcript text, tool call lines, touches) is held back, for at most
//! [`CHATTER_HOLD`] from when the writer took it off the queue, so that it
//! rides in the next such commit: an agent's text and tool call followed
//! within that time by its request no longer make commits of their own,
//! nor make the request wait behind them. Under load (several awaited
//! writes per commit) the commit window below applies.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use intercom_actors::ports::StoreError;
use rusqlite::Connection;
use tokio::sync::oneshot;

use super::checkpointer::{self, Checkpointer};
use super::file_identity::DbFile;
use transaction::commit_batch;

mod transaction;

#[cfg(test)]
mod tests;

/// How many writes may wait for the writer before callers wait to queue.
const QUEUE: usize = 4096;

/// The most writes one transaction takes (keeps a transaction short).
const MAX_BATCH: usize = 512;

/// Prepared statements the writer keeps (every write statement the store
/// has, with room to spare).
const STATEMENT_CACHE: usize = 128;

/// The commit window: while several callers wait on writes at once (the
/// last commit, or the one about to start, holds at least
/// [`WINDOW_SIBLINGS`] awaited writes), the next commit starts no sooner
/// than this after the previous one began, so the writes that arrive
/// meanwhile share it. A caller alone never waits. Under load this bounds
/// commits to about 1,700 a second, each one
/// writing every page it changed into the WAL once for all the writes it
/// holds, instead of once per write; the cost is at most this much latency
/// per write, and only when the writer is busy anyway.
///
/// Why 600 µs (measured before chatter was held back, when any waiting
/// write switched the window on; with chatter held, 600 µs gave 0.74–0.79
/// commits per approval at 500 agents and 400 µs 0.89–1.02, BENCHMARKS.md
/// session 9): at 500 agents the server decides about 2,000 approvals a
/// second, each about 5.5 writes, so one commit per approval (issue 13's
/// bound) means about 5.5 writes per commit, which take about 500 µs to
/// arrive. Measured there once checkpoints left the writer (each commit got
/// cheaper, so more of them fit; BENCHMARKS.md, three runs each): 400 µs
/// gave 1.07 to 1.14 commits per approval; 600 µs 0.97 (0.93 to 1.02) with
/// rtt p99 8.4 ms; 700 µs 0.82 (0.81 to 0.85) but rtt p99 18 ms and p50
/// 2.4 ms instead of 1.9.
const COMMIT_WINDOW: Duration = Duration::from_micros(600);

/// How many awaited writes in one commit mean "several callers at once"
/// (PostgreSQL's `commit_siblings`, in spirit): one agent alone has one
/// awaited write at a time, its chatter does not count.
const WINDOW_SIBLINGS: usize = 2;

/// The longest chatter waits for a write somebody waits for before it is
/// committed on its own: short enough that what the operator is shown
/// after it (events leave a session only once its earlier writes
/// committed) is not held up noticeably.
const CHATTER_HOLD: Duration = Duration::from_millis(2);

/// One write: plain function of its (owned) data and the writer's
/// connection, run inside the open transaction. A plain `fn` (not a
/// closure) so it can run again if its transaction is lost.
pub(crate) type WriteFn<D, T> = fn(&D, &Connection) -> Result<T, StoreError>;

/// Counters of the writer, readable at any time.
#[derive(Debug, Default)]
struct Counters {
    /// Transactions committed.
    commits: AtomicU64,
    /// Writes that committed.
    writes: AtomicU64,
    /// Why the last commit failed, while the writer cannot commit (a full
    /// disk, say); `None` once a commit succeeds again. Written when a
    /// commit fails and when the first one after succeeds (not on every
    /// success); read by `/healthz`.
    failing: std::sync::Mutex<Option<String>>,
}

impl Counters {
    fn set_failing(&self, why: Option<String>) {
        *self
            .failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = why;
    }
}

/// The handle to the writer thread, owned by the store.
#[derive(Debug)]
pub(crate) struct Writer {
    /// Where writes are queued (flume: callers send from async code, the
    /// thread waits with a deadline while it holds chatter back).
    jobs: flume::Sender<Box<dyn Job>>,
    /// Closed (the sender dropped) when the thread has answered every write
    /// and closed its connection.
    stopped: oneshot::Receiver<()>,
    /// Commits and writes so far.
    counters: Arc<Counters>,
    /// The database files as opened (the thread checks them before each
    /// commit; `/healthz` asks here).
    file: DbFile,
}

impl Writer {
    /// Opens the writer's connection to the database at `path` (already
    /// created and migrated) and starts its thread.
    pub(crate) fn start(path: &Path, busy_timeout: Duration) -> std::io::Result<Writer> {
        Writer::start_holding(path, busy_timeout, CHATTER_HOLD)
    }

    /// [`Writer::start`], holding chatter back for at most `hold`.
    pub(crate) fn start_holding(
        path: &Path,
        busy_timeout: Duration,
        hold: Duration,
    ) -> std::io::Result<Writer> {
        let conn = open_connection(path, busy_timeout).map_err(std::io::Error::other)?;
        let file = DbFile::opened(path);
        let checkpointer = Checkpointer::start(path, busy_timeout)?;
        let (jobs, queue) = flume::bounded(QUEUE);
        let (stop_signal, stopped) = oneshot::channel();
        let counters = Arc::new(Counters::default());
        let thread = Thread {
            path: path.to_owned(),
            busy_timeout,
            conn: Some(conn),
            file: file.clone(),
            file_lost: false,
            failing: false,
            counters: Arc::clone(&counters),
            checkpointer,
            hold,
            _stop_signal: stop_signal,
        };
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || thread.run(queue))?;
        Ok(Writer {
            jobs,
            stopped,
            counters,
            file,
        })
    }

    /// Queues one write and waits until the transaction holding it
    /// committed; returns what the write returned.
    pub(crate) async fn write<D, T>(&self, data: D, f: WriteFn<D, T>) -> Result<T, StoreError>
    where
        D: Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(TypedJob {
            data,
            f,
            chatter: intercom_actors::ports::is_chatter(),
            result: None,
            reply,
        });
        self.jobs
            .send_async(job as Box<dyn Job>)
            .await
            .map_err(|_| writer_stopped())?;
        answer.await.map_err(|_| writer_stopped())?
    }

    /// Transactions committed so far.
    pub(crate) fn commits(&self) -> u64 {
        self.counters.commits.load(Ordering::Relaxed)
    }

    /// Writes committed so far.
    pub(crate) fn writes(&self) -> u64 {
        self.counters.writes.load(Ordering::Relaxed)
    }

    /// Why nothing can be stored now: a database file deleted or replaced
    /// under the server, or the reason the last commit failed.
    pub(crate) fn problem(&self) -> Option<String> {
        self.file.check().err().or_else(|| {
            self.failing()
                .map(|why| format!("the last write to the database failed: {why}"))
        })
    }

    /// Why the last commit failed, while commits fail.
    fn failing(&self) -> Option<String> {
        self.counters
            .failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How many writes are queued and not yet taken by the writer.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.jobs.len()
    }

    /// Stops taking writes, answers the queued ones and waits until the
    /// thread closed its connection.
    pub(crate) async fn close(self) {
        drop(self.jobs);
        // Err is the expected outcome: the thread drops the sender as it ends.
        let _ = self.stopped.await;
    }
}

/// Opens a connection with the settings every write relies on (the
/// journal mode is the file's and already WAL; the rest is per connection).
/// It never checkpoints: its WAL hook only notes the WAL's size, and the
/// checkpointer thread checkpoints, off the writes' path.
fn open_connection(path: &Path, busy_timeout: Duration) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(busy_timeout)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;",
    )?;
    // When the WAL starts over, a file grown past this is cut back to it.
    conn.pragma_update(None, "journal_size_limit", checkpointer::WAL_SIZE_LIMIT)?;
    // Replaces SQLite's automatic checkpoint (also a WAL hook).
    conn.wal_hook(Some(checkpointer::wal_size));
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// The error callers get when the writer is gone.
fn writer_stopped() -> StoreError {
    StoreError::Backend {
        op: "write",
        message: "the storage writer has stopped".into(),
    }
}

/// A queued write with its reply, type-erased for the queue.
trait Job: Send {
    /// True for chatter (may wait for the next awaited write's commit).
    fn chatter(&self) -> bool;
    /// Runs the write on `conn`; true when it succeeded (its result is kept
    /// until [`Job::answer`]).
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answers the caller: the write's own error if it failed, else the
    /// commit's outcome.
    fn answer(self: Box<Self>, commit: Result<(), &str>);
}

/// A write with its data, result and reply channel.
struct TypedJob<D, T> {
    data: D,
    f: WriteFn<D, T>,
    chatter: bool,
    result: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<D: Send, T: Send> Job for TypedJob<D, T> {
    fn chatter(&self) -> bool {
        self.chatter
    }

    fn run(&mut self, conn: &Connection) -> bool {
        let result =
            catch_unwind(AssertUnwindSafe(|| (self.f)(&self.data, conn))).unwrap_or_else(|_| {
                Err(StoreError::Backend {
                    op: "write",
                    message: "the write panicked; nothing of it was stored".into(),
                })
            });
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn answer(self: Box<Self>, commit: Result<(), &str>) {
        let outcome = match (self.result, commit) {
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (_, Err(message)) => Err(StoreError::Backend {
                op: "commit writes",
                message: message.to_owned(),
            }),
            (None, Ok(())) => Err(StoreError::Backend {
                op: "write",
                message: "the write was never run".into(),
            }),
        };
        // The caller may have gone away; its write stands anyway.
        let _ = self.reply.send(outcome);
    }
}

/// The writer thread's state.
struct Thread {
    /// The database, to reopen a connection that had to be dropped.
    path: PathBuf,
    busy_timeout: Duration,
    /// The connection; None after one was dropped because it could not be
    /// proven out of a failed transaction (reopened for the next batch).
    conn: Option<Connection>,
    /// The database file as opened: no commit once its path names another
    /// file or none (see `file_identity`).
    file: DbFile,
    /// The file is gone (said in the log once).
    file_lost: bool,
    /// The last commit failed (its reason is in `counters.failing`).
    failing: bool,
    counters: Arc<Counters>,
    /// Copies the WAL into the database file, told of each commit
    /// (dropped, and so joined, before the stop signal).
    checkpointer: Checkpointer,
    /// The longest chatter is held back ([`CHATTER_HOLD`] but in tests).
    hold: Duration,
    /// Dropped when the thread ends, which is what `Writer::close` awaits.
    _stop_signal: oneshot::Sender<()>,
}

impl Thread {
    /// Gathers queued writes, commits them together, answers, repeats
    /// until the store is closed (then commits what is left and ends).
    fn run(mut self, queue: flume::Receiver<Box<dyn Job>>) {
        // One batch for the thread's life: its capacity is kept.
        let mut batch = Batch {
            jobs: Vec::with_capacity(MAX_BATCH),
            ..Batch::default()
        };
        let mut last = LastCommit::default();
        loop {
            let open = self.gather(&queue, &mut batch, &last);
            if batch.jobs.is_empty() {
                break;
            }
            last = LastCommit {
                began: Some(Instant::now()),
                awaited: batch.awaited,
            };
            self.commit_and_answer(&mut batch.jobs);
            batch.emptied();
            if !open {
                break;
            }
        }
    }

    /// Takes queued writes into `batch` until it is due (see
    /// [`Batch::due`]); false once the queue is closed and empty.
    fn gather(
        &self,
        queue: &flume::Receiver<Box<dyn Job>>,
        batch: &mut Batch,
        last: &LastCommit,
    ) -> bool {
        loop {
            while !batch.full() {
                match queue.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            let due = batch.due(last, self.hold);
            if batch.full() || due.is_some_and(|at| at <= Instant::now()) {
                return true;
            }
            let next = match due {
                None => queue.recv().ok(),
                Some(at) => match queue.recv_deadline(at) {
                    Ok(job) => Some(job),
                    Err(flume::RecvTimeoutError::Timeout) => return true,
                    Err(flume::RecvTimeoutError::Disconnected) => None,
                },
            };
            let Some(job) = next else { return false };
            batch.push(job);
        }
    }

    /// Commits `jobs`, counts the commit and answers every caller.
    fn commit_and_answer(&mut self, jobs: &mut Vec<Box<dyn Job>>) {
        let outcome = self.commit(jobs);
        match (&outcome, self.failing) {
            (Ok(_), true) => self.counters.set_failing(None),
            (Err(e), _) => self.counters.set_failing(Some(e.clone())),
            (Ok(_), false) => {}
        }
        self.failing = outcome.is_err();
        match &outcome {
            Ok(committed) => {
                if let Some(conn) = &self.conn {
                    self.checkpointer.committed(conn);
                }
                self.counters.commits.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .writes
                    .fetch_add(*committed, Ordering::Relaxed);
            }
            Err(e) if !self.file_lost => {
                tracing::error!(writes = jobs.len(), "storage commit failed: {e}");
            }
            Err(_) => {}
        }
        let commit = outcome.as_ref().map(|_| ()).map_err(String::as_str);
        for job in jobs.drain(..) {
            job.answer(commit);
        }
    }

    /// Commits `batch` on the connection (reopening it if the last one had
    /// to go); `Ok(writes committed)`.
    fn commit(&mut self, batch: &mut [Box<dyn Job>]) -> Result<u64, String> {
        if let Err(gone) = self.file.check() {
            if !self.file_lost {
                self.file_lost = true;
                tracing::error!("{gone}");
            }
            return Err(gone);
        }
        if std::mem::take(&mut self.file_lost) {
            tracing::warn!("the database file is back at its path; storing again");
        }
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => open_connection(&self.path, self.busy_timeout)
                .map_err(|e| format!("cannot reopen the database: {e}"))?,
        };
        let outcome = commit_batch(&conn, batch);
        if conn.is_autocommit() {
            self.conn = Some(conn);
        } else {
            tracing::warn!(
                "a failed transaction could not be rolled back; reopening the writer's connection"
            );
        }
        outcome
    }
}

/// The writes gathered for the next commit.
#[derive(Default)]
struct Batch {
    jobs: Vec<Box<dyn Job>>,
    /// How many of them somebody waits for (not chatter).
    awaited: usize,
    /// When the first of them arrived.
    since: Option<Instant>,
}

impl Batch {
    fn push(&mut self, job: Box<dyn Job>) {
        if !job.chatter() {
            self.awaited += 1;
        }
        self.since.get_or_insert_with(Instant::now);
        self.jobs.push(job);
    }

    fn full(&self) -> bool {
        self.jobs.len() >= MAX_BATCH
    }

    /// Ready for the next commit's writes, once this one's were answered.
    fn emptied(&mut self) {
        debug_assert!(self.jobs.is_empty(), "every write is answered first");
        self.awaited = 0;
        self.since = None;
    }

    /// When this batch should be committed (`None`: nothing to commit).
    /// Chatter alone: once it waited `hold`. With an awaited write: now,
    /// or, while several callers wait at once, [`COMMIT_WINDOW`] after the
    /// last commit began.
    fn due(&self, last: &LastCommit, hold: Duration) -> Option<Instant> {
        let since = self.since?;
        if self.awaited == 0 {
            return Some(since + hold);
        }
        let busy = self.awaited.max(last.awaited) >= WINDOW_SIBLINGS;
        match last.began {
            Some(began) if busy => Some(began + COMMIT_WINDOW),
            _ => Some(since),
        }
    }
}

/// What the writer remembers of its last commit.
#[derive(Default)]
struct LastCommit {
    /// When it began.
    began: Option<Instant>,
    /// How many awaited writes it held.
    awaited: usize,
}
