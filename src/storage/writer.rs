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
        let checkpointer = Checkpointer::start(path, busy_timeout)?;
        let (jobs, queue) = flume::bounded(QUEUE);
        let (stop_signal, stopped) = oneshot::channel();
        let counters = Arc::new(Counters::default());
        let thread = Thread {
            path: path.to_owned(),
            busy_timeout,
            conn: Some(conn),
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
        let mut batch = Batch::default();
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
            batch = Batch::default();
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
                None => queue.recv().map_err(|_| ()),
                Some(at) => match queue.recv_deadline(at) {
                    Ok(job) => Ok(job),
                    Err(flume::RecvTimeoutError::Timeout) => return true,
                    Err(flume::RecvTimeoutError::Disconnected) => Err(()),
                },
            };
            match next {
                Ok(job) => batch.push(job),
                Err(()) => return false,
            }
        }
    }

    /// Commits `jobs`, counts the commit and answers every caller.
    fn commit_and_answer(&mut self, jobs: &mut Vec<Box<dyn Job>>) {
        let outcome = self.commit(jobs);
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
            Err(e) => tracing::error!(writes = jobs.len(), "storage commit failed: {e}"),
        }
        let commit = outcome.as_ref().map(|_| ()).map_err(String::as_str);
        for job in jobs.drain(..) {
            job.answer(commit);
        }
    }

    /// Commits `batch` on the connection (reopening it if the last one had
    /// to go); `Ok(writes committed)`.
    fn commit(&mut self, batch: &mut [Box<dyn Job>]) -> Result<u64, String> {
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

/// How one attempt at committing a batch ended.
enum Attempt {
    /// Committed; how many writes succeeded.
    Committed(u64),
    /// A write failed (fast path) or took the transaction down with it
    /// (careful path); run the batch again, carefully.
    Lost,
    /// The transaction could not be opened or committed.
    Failed(String),
}

/// How the writes of one attempt are isolated from each other.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Isolation {
    /// No savepoints: the first failing write ends the attempt. Almost every
    /// batch commits this way.
    Optimistic,
    /// Each write in its own savepoint, so a failing one is undone alone.
    Savepoints,
}

/// Commits `batch` as one transaction; `Ok(writes committed)`.
///
/// First optimistically, with no savepoints. If a write fails, that attempt
/// is rolled back whole and the batch runs again with each write in its own
/// savepoint (and, should a failing write take that transaction down too,
/// again without the writes that failed), so a failing write still fails
/// alone and its neighbours commit.
fn commit_batch(conn: &Connection, batch: &mut [Box<dyn Job>]) -> Result<u64, String> {
    let mut failed = vec![false; batch.len()];
    match attempt(conn, batch, &mut failed, Isolation::Optimistic) {
        Attempt::Committed(n) => return Ok(n),
        Attempt::Lost => {}
        Attempt::Failed(message) => return Err(message),
    }
    failed.fill(false);
    loop {
        match attempt(conn, batch, &mut failed, Isolation::Savepoints) {
            Attempt::Committed(n) => return Ok(n),
            Attempt::Lost => {
                tracing::warn!("a failing write aborted its transaction; retrying the others")
            }
            Attempt::Failed(message) => return Err(message),
        }
    }
}

/// One transaction over the writes of `batch` not yet marked failed.
///
/// Plain `BEGIN` / `COMMIT` / `ROLLBACK` (deferred: this is the only writer,
/// so nothing can take the write lock between `BEGIN` and the first write,
/// and a write refused by a read-only database fails as that write, with
/// its own operation's name): a transaction that did
/// not commit is rolled back explicitly (SQLite may or may not have rolled
/// it back by itself after an I/O error such as a full disk); if the
/// connection still is in a transaction after that, the caller drops it
/// and opens a fresh one, so a half-failed transaction never lingers.
fn attempt(
    conn: &Connection,
    batch: &mut [Box<dyn Job>],
    failed: &mut [bool],
    isolation: Isolation,
) -> Attempt {
    let outcome = match conn.execute_batch("BEGIN") {
        Ok(()) => match run_writes(conn, batch, failed, isolation) {
            Ok(committed) => match conn.execute_batch("COMMIT") {
                Ok(()) => Attempt::Committed(committed),
                Err(e) => Attempt::Failed(format!("cannot commit: {e}")),
            },
            Err(other) => other,
        },
        Err(e) => Attempt::Failed(format!("cannot begin: {e}")),
    };
    if !matches!(outcome, Attempt::Committed(_))
        && !conn.is_autocommit()
        && let Err(e) = conn.execute_batch("ROLLBACK")
    {
        tracing::warn!("cannot roll back a failed transaction: {e}");
    }
    outcome
}

/// Runs each write not marked failed (in its own savepoint when
/// `isolation` says so); the count that succeeded, or how the transaction
/// ended early.
fn run_writes(
    conn: &Connection,
    batch: &mut [Box<dyn Job>],
    failed: &mut [bool],
    isolation: Isolation,
) -> Result<u64, Attempt> {
    let mut committed = 0;
    for (job, failed) in batch.iter_mut().zip(failed.iter_mut()) {
        if *failed {
            continue;
        }
        if isolation == Isolation::Optimistic {
            if !job.run(conn) {
                return Err(Attempt::Lost);
            }
            committed += 1;
            continue;
        }
        if let Err(e) = conn.execute_batch("SAVEPOINT w") {
            return Err(Attempt::Failed(format!("cannot open savepoint: {e}")));
        }
        if job.run(conn) {
            committed += 1;
            if let Err(e) = conn.execute_batch("RELEASE w") {
                return Err(Attempt::Failed(format!("cannot release savepoint: {e}")));
            }
            continue;
        }
        *failed = true;
        // Undo the failing write alone; if SQLite already rolled the whole
        // transaction back, the savepoint is gone: start over without it.
        if conn.is_autocommit() || conn.execute_batch("ROLLBACK TO w").is_err() {
            return Err(Attempt::Lost);
        }
        if let Err(e) = conn.execute_batch("RELEASE w") {
            return Err(Attempt::Failed(format!("cannot release savepoint: {e}")));
        }
    }
    Ok(committed)
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc as std_mpsc;

    use intercom_actors::model::{AuditEntry, MessageKind, Role, SessionId};
    use intercom_actors::ports::SessionStore;
    use sqlx::Connection as _;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
    use tokio::task::JoinHandle;

    use super::*;
    use crate::storage::SqliteStore;
    use crate::storage::tests::file_store;

    /// Polls `cond` until it holds; panics after a generous deadline.
    async fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::task::yield_now().await;
        }
    }

    /// A connection of its own: it sees only committed rows.
    async fn outsider(path: &Path) -> SqliteConnection {
        SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(path))
            .await
            .expect("outsider connection")
    }

    async fn visible_messages(conn: &mut SqliteConnection) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM messages")
            .fetch_one(conn)
            .await
            .expect("count")
    }

    /// The two signals of a plug write: it started; it may finish.
    type Plug = (std_mpsc::SyncSender<()>, std_mpsc::Receiver<()>);

    /// A write that holds the writer's transaction open until released.
    fn plug_write(plug: &Plug, _: &Connection) -> Result<(), StoreError> {
        let _ = plug.0.send(());
        let _ = plug.1.recv();
        Ok(())
    }

    /// Parks the writer inside a plug write, so everything written next
    /// waits in the queue. Returns the release signal and the plug's task.
    async fn park_writer(
        store: &Arc<SqliteStore>,
    ) -> (std_mpsc::SyncSender<()>, JoinHandle<Result<(), StoreError>>) {
        let (started_tx, started) = std_mpsc::sync_channel(1);
        let (release, release_rx) = std_mpsc::sync_channel(1);
        let s = Arc::clone(store);
        let task = tokio::spawn(async move { s.write((started_tx, release_rx), plug_write).await });
        tokio::task::spawn_blocking(move || started.recv())
            .await
            .expect("join")
            .expect("the plug write started");
        (release, task)
    }

    #[tokio::test]
    async fn callers_are_answered_only_after_their_transaction_committed() {
        let (_dir, path, store) = file_store().await;
        let mut outside = outsider(&path).await;
        let (release, plug) = park_writer(&store).await;
        let commits_before = store.commit_count();

        const N: usize = 50;
        let writes: Vec<_> = (0..N)
            .map(|i| {
                let s = Arc::clone(&store);
                tokio::spawn(async move {
                    s.append_message(
                        &SessionId::from("s-1"),
                        Role::Agent,
                        MessageKind::Text,
                        &format!("m{i}"),
                    )
                    .await
                })
            })
            .collect();
        until("all writes to queue", || store.writer.queued() == N).await;

        // The writer is busy with the plug's transaction: nobody is answered
        // and nothing is visible from outside.
        assert!(!plug.is_finished());
        assert!(writes.iter().all(|w| !w.is_finished()));
        assert_eq!(visible_messages(&mut outside).await, 0);

        release.send(()).expect("release");
        plug.await.expect("join").expect("plug");
        for w in writes {
            let id = w.await.expect("join").expect("append");
            // Answered, so committed: an outside connection sees the row.
            let found: Option<i64> = sqlx::query_scalar("SELECT id FROM messages WHERE id = ?")
                .bind(id)
                .fetch_optional(&mut outside)
                .await
                .expect("read");
            assert_eq!(found, Some(id));
        }
        // The plug's transaction, then one for all fifty waiting writes.
        assert_eq!(store.commit_count() - commits_before, 2);
        assert_eq!(visible_messages(&mut outside).await, N as i64);
    }

    #[tokio::test]
    async fn a_failing_write_does_not_fail_its_neighbours() {
        let (_dir, path, store) = file_store().await;
        let (release, plug) = park_writer(&store).await;
        let commits_before = store.commit_count();

        let append = |session: &'static str| {
            let s = Arc::clone(&store);
            tokio::spawn(async move {
                s.append_message(
                    &SessionId::from(session),
                    Role::Agent,
                    MessageKind::Text,
                    session,
                )
                .await
            })
        };
        let first = append("s-1");
        let hostile = append("no-such-session");
        let s = Arc::clone(&store);
        let audit = tokio::spawn(async move {
            s.audit(&AuditEntry {
                session_id: Some(SessionId::from("s-1")),
                actor: "op".into(),
                action: "decide".into(),
                detail: serde_json::json!({}),
            })
            .await
        });
        let last = append("s-1");
        until("all writes to queue", || store.writer.queued() == 4).await;
        release.send(()).expect("release");
        plug.await.expect("join").expect("plug");

        let first = first.await.expect("join").expect("first commits");
        let err = hostile.await.expect("join").expect_err("no session");
        assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
        audit.await.expect("join").expect("audit commits");
        let last = last.await.expect("join").expect("last commits");
        assert_eq!(store.commit_count() - commits_before, 2);

        let mut outside = outsider(&path).await;
        let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM messages ORDER BY id")
            .fetch_all(&mut outside)
            .await
            .expect("read");
        assert_eq!(ids, vec![first, last]);
        let audits: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit")
            .fetch_one(&mut outside)
            .await
            .expect("read");
        assert_eq!(audits, 1);
    }

    /// A write that takes the whole transaction down with it (as SQLite
    /// does on some errors, e.g. a full disk).
    fn aborting_write(_: &(), conn: &Connection) -> Result<(), StoreError> {
        conn.execute_batch("ROLLBACK")
            .map_err(crate::storage::write_error("abort"))?;
        Err(StoreError::Backend {
            op: "abort",
            message: "transaction rolled back".into(),
        })
    }

    /// Queues "before", the write `f` and "after" behind a parked writer,
    /// so the three run in one batch; checks that both neighbours committed
    /// and the store still writes, and returns `f`'s error.
    async fn fails_alone(f: WriteFn<(), ()>) -> StoreError {
        let (_dir, path, store) = file_store().await;
        let (release, plug) = park_writer(&store).await;
        let append = |text: &'static str| {
            let s = Arc::clone(&store);
            tokio::spawn(async move {
                s.append_message(
                    &SessionId::from("s-1"),
                    Role::Agent,
                    MessageKind::Text,
                    text,
                )
                .await
            })
        };
        let before = append("before");
        let s = Arc::clone(&store);
        let failing = tokio::spawn(async move { s.write((), f).await });
        let after = append("after");
        until("all writes to queue", || store.writer.queued() == 3).await;
        release.send(()).expect("release");
        plug.await.expect("join").expect("plug");

        before.await.expect("join").expect("before commits");
        let err = failing.await.expect("join").expect_err("the write fails");
        after.await.expect("join").expect("after commits");

        let mut outside = outsider(&path).await;
        let texts: Vec<String> = sqlx::query_scalar("SELECT content FROM messages ORDER BY id")
            .fetch_all(&mut outside)
            .await
            .expect("read");
        assert_eq!(texts, vec!["before", "after"]);
        store
            .touch(&SessionId::from("s-1"))
            .await
            .expect("the store still writes afterwards");
        err
    }

    #[tokio::test]
    async fn a_write_that_loses_the_transaction_does_not_lose_the_others() {
        let err = fails_alone(aborting_write).await;
        assert!(
            matches!(err, StoreError::Backend { op: "abort", .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn closing_answers_the_queued_writes() {
        let (_dir, path, store) = file_store().await;
        let s = Arc::clone(&store);
        let write = tokio::spawn(async move {
            s.append_message(&SessionId::from("s-1"), Role::Agent, MessageKind::Text, "x")
                .await
        });
        until("the write to be answered", || write.is_finished()).await;
        write.await.expect("join").expect("append");
        let store = Arc::into_inner(store).expect("sole owner");
        store.close().await;
        let mut outside = outsider(&path).await;
        assert_eq!(visible_messages(&mut outside).await, 1);
    }

    /// A write that panics.
    fn panicking_write(_: &(), _: &Connection) -> Result<(), StoreError> {
        panic!("a bug in one write")
    }

    #[tokio::test]
    async fn a_write_that_panics_fails_alone_and_the_writer_goes_on() {
        let err = fails_alone(panicking_write).await;
        assert!(err.to_string().contains("panicked"), "{err}");
    }

    // ---- chatter ----------------------------------------------------------

    fn sql(e: rusqlite::Error) -> StoreError {
        StoreError::Backend {
            op: "test",
            message: e.to_string(),
        }
    }

    fn create_table(_: &(), conn: &Connection) -> Result<(), StoreError> {
        conn.execute_batch("CREATE TABLE t (x TEXT)").map_err(sql)
    }

    fn insert(x: &&'static str, conn: &Connection) -> Result<(), StoreError> {
        conn.execute("INSERT INTO t (x) VALUES (?1)", [*x])
            .map(drop)
            .map_err(sql)
    }

    /// Rows of `t` an outside connection sees (committed ones only).
    fn visible(path: &Path) -> Vec<String> {
        let conn = Connection::open(path).expect("outside connection");
        let mut stmt = conn
            .prepare("SELECT x FROM t ORDER BY rowid")
            .expect("prepare");
        stmt.query_map([], |r| r.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    }

    /// A bare writer on a fresh database holding chatter back for `hold`,
    /// with table `t` created.
    async fn bare_writer(hold: Duration) -> (tempfile::TempDir, PathBuf, Arc<Writer>) {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("w.sqlite");
        let writer = Writer::start_holding(&path, Duration::from_secs(5), hold).expect("writer");
        writer.write((), create_table).await.expect("create");
        (dir, path, Arc::new(writer))
    }

    #[tokio::test]
    async fn chatter_waits_for_the_next_awaited_write_and_shares_its_commit() {
        let hour = Duration::from_secs(3600);
        let (_dir, path, writer) = bare_writer(hour).await;
        // Park the writer so the chatter is surely queued first.
        let (started_tx, started) = std_mpsc::sync_channel(1);
        let (release, release_rx) = std_mpsc::sync_channel(1);
        let w = Arc::clone(&writer);
        let plug = tokio::spawn(async move { w.write((started_tx, release_rx), plug_write).await });
        tokio::task::spawn_blocking(move || started.recv())
            .await
            .expect("join")
            .expect("the plug write started");
        let before = writer.commits();
        let w = Arc::clone(&writer);
        let text = tokio::spawn(intercom_actors::ports::chatter(async move {
            w.write("text", insert).await
        }));
        until("the chatter to queue", || writer.queued() == 1).await;
        release.send(()).expect("release");
        plug.await.expect("join").expect("plug");

        // Only chatter is waiting now: nothing is committed for it.
        assert!(visible(&path).is_empty());
        assert!(!text.is_finished());

        // The request the agent waits on: committed at once, the chatter
        // with it, in the order they were queued.
        writer.write("request", insert).await.expect("request");
        text.await.expect("join").expect("chatter");
        assert_eq!(writer.commits() - before, 2, "the plug's commit, then one");
        assert_eq!(visible(&path), ["text", "request"]);
    }

    #[tokio::test]
    async fn chatter_alone_is_committed_once_it_waited_its_hold() {
        let (_dir, path, writer) = bare_writer(Duration::from_millis(20)).await;
        let w = Arc::clone(&writer);
        intercom_actors::ports::chatter(async move { w.write("text", insert).await })
            .await
            .expect("chatter commits without any awaited write");
        assert_eq!(visible(&path), ["text"]);
    }

    #[tokio::test]
    async fn closing_commits_held_chatter() {
        let hour = Duration::from_secs(3600);
        let (_dir, path, writer) = bare_writer(hour).await;
        let writer = Arc::try_unwrap(writer).expect("no other handle");
        let (reply, answer) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(TypedJob {
            data: "text",
            f: insert,
            chatter: true,
            result: None,
            reply,
        });
        writer.jobs.send(job).expect("queue");
        writer.close().await;
        answer.await.expect("answered").expect("committed");
        assert_eq!(visible(&path), ["text"]);
    }
}
