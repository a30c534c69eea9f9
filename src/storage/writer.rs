//! The one writer path: every write to the database is queued to one task
//! that commits whatever is waiting as one transaction (group commit).
//!
//! Why this exists: a durable SQLite commit (WAL, `synchronous = NORMAL`)
//! costs a fraction of a millisecond, and an approval used to make about five
//! of them, one per write. Under load the commits, not the work, were the
//! ceiling. Now writes that arrive while a commit is in flight wait for the
//! next one and share it: a busy server makes far fewer commits than writes.
//!
//! Guarantees:
//! - a caller is answered only after the transaction holding its write
//!   committed (or with the error that stopped it), so an acknowledged write
//!   survives a crash exactly as before;
//! - each write runs inside its own `SAVEPOINT`: a failing write is rolled
//!   back alone and answered with its error, its neighbours still commit;
//! - should a failing write take the whole transaction down with it (SQLite
//!   does that for some errors, e.g. a full disk), the others are run again
//!   in a fresh transaction, so they are not lost either;
//! - writes from one caller commit in the order they were queued.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;
use intercom_actors::ports::StoreError;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio::task::JoinHandle;

/// How many writes may wait for the writer before callers wait to queue.
const QUEUE: usize = 4096;

/// The most writes one transaction takes (keeps a transaction short).
const MAX_BATCH: usize = 512;

/// The future one write returns: its result, computed on the writer's
/// connection inside the open transaction.
pub(crate) type WriteFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// One write: plain function of its (owned) data and the connection. A plain
/// `fn` (not a closure) so it can run again if its transaction is lost.
pub(crate) type WriteFn<D, T> = for<'a> fn(&'a D, &'a mut SqliteConnection) -> WriteFuture<'a, T>;

/// Counters of the writer, readable at any time.
#[derive(Debug, Default)]
struct Counters {
    /// Transactions committed.
    commits: AtomicU64,
    /// Writes that committed.
    writes: AtomicU64,
}

/// The handle to the writer task, owned by the store.
#[derive(Debug)]
pub(crate) struct Writer {
    /// Where writes are queued.
    jobs: mpsc::Sender<Box<dyn Job>>,
    /// The task (awaited on close so the last writes are answered).
    task: JoinHandle<()>,
    /// Commits and writes so far.
    counters: Arc<Counters>,
}

impl Writer {
    /// Starts the writer task on `pool`. It holds `gate` while a transaction
    /// is open, so writes that take the gate themselves (migrations) never
    /// run beside it.
    pub(crate) fn start(pool: SqlitePool, gate: Arc<Mutex<()>>) -> Writer {
        let (jobs, queue) = mpsc::channel(QUEUE);
        let counters = Arc::new(Counters::default());
        let task = tokio::spawn(run(pool, gate, queue, Arc::clone(&counters)));
        Writer {
            jobs,
            task,
            counters,
        }
    }

    /// Queues one write and waits until the transaction holding it
    /// committed; returns what the write returned.
    pub(crate) async fn write<D, T>(&self, data: D, f: WriteFn<D, T>) -> Result<T, StoreError>
    where
        D: Send + Sync + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(TypedJob {
            data,
            f,
            result: None,
            reply,
        });
        self.jobs.send(job).await.map_err(|_| writer_stopped())?;
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
        self.jobs.max_capacity() - self.jobs.capacity()
    }

    /// Stops taking writes, answers the queued ones and waits for the task.
    pub(crate) async fn close(self) {
        drop(self.jobs);
        if let Err(e) = self.task.await {
            tracing::error!("storage writer task failed: {e}");
        }
    }
}

/// The error callers get when the writer task is gone.
fn writer_stopped() -> StoreError {
    StoreError::Backend {
        op: "write",
        message: "the storage writer has stopped".into(),
    }
}

/// A queued write with its reply, type-erased for the queue.
trait Job: Send {
    /// Runs the write on `conn`; true when it succeeded (its result is kept
    /// until [`Job::answer`]).
    fn run<'a>(&'a mut self, conn: &'a mut SqliteConnection) -> BoxFuture<'a, bool>;
    /// Answers the caller: the write's own error if it failed, else the
    /// commit's outcome.
    fn answer(self: Box<Self>, commit: Result<(), &str>);
}

/// A write with its data, result and reply channel.
struct TypedJob<D, T> {
    data: D,
    f: WriteFn<D, T>,
    result: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<D: Send + Sync, T: Send> Job for TypedJob<D, T> {
    fn run<'a>(&'a mut self, conn: &'a mut SqliteConnection) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let result = (self.f)(&self.data, conn).await;
            let ok = result.is_ok();
            self.result = Some(result);
            ok
        })
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

/// The writer task: takes every queued write, commits them together,
/// answers, repeats until the store is closed.
async fn run(
    pool: SqlitePool,
    gate: Arc<Mutex<()>>,
    mut queue: mpsc::Receiver<Box<dyn Job>>,
    counters: Arc<Counters>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let outcome = {
            let _gate = gate.lock().await;
            commit_batch(&pool, &mut batch).await
        };
        match &outcome {
            Ok(committed) => {
                counters.commits.fetch_add(1, Ordering::Relaxed);
                counters.writes.fetch_add(*committed, Ordering::Relaxed);
            }
            Err(e) => tracing::error!(writes = batch.len(), "storage commit failed: {e}"),
        }
        let commit = outcome.as_ref().map(|_| ()).map_err(String::as_str);
        for job in batch.drain(..) {
            job.answer(commit);
        }
    }
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
    /// batch commits this way, and it costs two driver round trips per
    /// write less (each is a hop to the connection's worker thread).
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
async fn commit_batch(pool: &SqlitePool, batch: &mut [Box<dyn Job>]) -> Result<u64, String> {
    let mut failed = vec![false; batch.len()];
    match attempt(pool, batch, &mut failed, Isolation::Optimistic).await {
        Attempt::Committed(n) => return Ok(n),
        Attempt::Lost => {}
        Attempt::Failed(message) => return Err(message),
    }
    failed.fill(false);
    loop {
        match attempt(pool, batch, &mut failed, Isolation::Savepoints).await {
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
/// The transaction is plain `BEGIN` / `COMMIT` / `ROLLBACK` on one pooled
/// connection, not the driver's transaction guard: with the guard, an I/O
/// error at `COMMIT` (a full disk) left the pool in a state where, after
/// the disk came back, writes failed with "database is locked" and readers
/// saw a stale snapshot (SQLite may or may not roll back by itself after an
/// I/O error; the guard's lazy rollback-on-drop does not account for that).
/// Here a transaction that did not commit is rolled back explicitly, and a
/// connection that cannot prove it is out of it is closed, never handed
/// back to the pool.
async fn attempt(
    pool: &SqlitePool,
    batch: &mut [Box<dyn Job>],
    failed: &mut [bool],
    isolation: Isolation,
) -> Attempt {
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(e) => return Attempt::Failed(format!("cannot begin: {e}")),
    };
    let outcome = match exec(&mut conn, "BEGIN").await {
        Ok(()) => match run_writes(&mut conn, batch, failed, isolation).await {
            Ok(committed) => match exec(&mut conn, "COMMIT").await {
                Ok(()) => Attempt::Committed(committed),
                Err(e) => Attempt::Failed(format!("cannot commit: {e}")),
            },
            Err(other) => other,
        },
        Err(e) => Attempt::Failed(format!("cannot begin: {e}")),
    };
    if !matches!(outcome, Attempt::Committed(_)) && !rolled_back(&mut conn).await {
        conn.close_on_drop();
    }
    outcome
}
/// Ends a transaction that did not commit; false when the connection may
/// still hold it (then it must not be reused).
async fn rolled_back(conn: &mut SqliteConnection) -> bool {
    match exec(conn, "ROLLBACK").await {
        Ok(()) => true,
        // SQLite rolled back on its own (it does for some I/O errors).
        Err(e) if e.to_string().contains("no transaction is active") => true,
        Err(e) => {
            tracing::warn!("cannot roll back a failed transaction, closing its connection: {e}");
            false
        }
    }
}

/// Runs each write not marked failed (in its own savepoint when
/// `isolation` says so); the count that succeeded, or how the transaction
/// ended early.
async fn run_writes(
    conn: &mut SqliteConnection,
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
            if !job.run(conn).await {
                return Err(Attempt::Lost);
            }
            committed += 1;
            continue;
        }
        if let Err(e) = exec(conn, "SAVEPOINT w").await {
            return Err(Attempt::Failed(format!("cannot open savepoint: {e}")));
        }
        if job.run(conn).await {
            committed += 1;
            if let Err(e) = exec(conn, "RELEASE w").await {
                return Err(Attempt::Failed(format!("cannot release savepoint: {e}")));
            }
            continue;
        }
        *failed = true;
        // Undo the failing write alone; if SQLite already rolled the whole
        // transaction back, the savepoint is gone: start over without it.
        if exec(conn, "ROLLBACK TO w").await.is_err() {
            return Err(Attempt::Lost);
        }
        if let Err(e) = exec(conn, "RELEASE w").await {
            return Err(Attempt::Failed(format!("cannot release savepoint: {e}")));
        }
    }
    Ok(committed)
}

/// Runs one statement with no result on `conn`.
async fn exec(conn: &mut SqliteConnection, sql: &'static str) -> Result<(), sqlx::Error> {
    sqlx::query(sql).execute(conn).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use intercom_actors::model::{AuditEntry, MessageKind, Role, SessionId};
    use intercom_actors::ports::SessionStore;
    use sqlx::Connection;
    use sqlx::sqlite::SqliteConnectOptions;

    use super::*;
    use crate::storage::SqliteStore;
    use crate::storage::tests::rec;

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
    type Plug = (Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>);

    /// A write that holds the writer's transaction open until released.
    fn plug_write<'a>(plug: &'a Plug, _: &'a mut SqliteConnection) -> WriteFuture<'a, ()> {
        Box::pin(async move {
            plug.0.notify_one();
            plug.1.notified().await;
            Ok(())
        })
    }

    /// Parks the writer inside a plug write, so everything written next
    /// waits in the queue. Returns the release signal and the plug's task.
    async fn park_writer(
        store: &Arc<SqliteStore>,
    ) -> (Arc<tokio::sync::Notify>, JoinHandle<Result<(), StoreError>>) {
        let plug: Plug = Default::default();
        let (started, release) = (Arc::clone(&plug.0), Arc::clone(&plug.1));
        let s = Arc::clone(store);
        let task = tokio::spawn(async move { s.write(plug, plug_write).await });
        started.notified().await;
        (release, task)
    }

    async fn file_store() -> (tempfile::TempDir, std::path::PathBuf, Arc<SqliteStore>) {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("db.sqlite");
        let store = SqliteStore::open(&path).await.expect("open");
        store.create_session(&rec("s-1")).await.expect("create");
        (dir, path, Arc::new(store))
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

        release.notify_one();
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
        release.notify_one();
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
    fn aborting_write<'a>(_: &'a (), conn: &'a mut SqliteConnection) -> WriteFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query("ROLLBACK")
                .execute(conn)
                .await
                .map_err(crate::storage::backend("abort"))?;
            Err(StoreError::Backend {
                op: "abort",
                message: "transaction rolled back".into(),
            })
        })
    }

    #[tokio::test]
    async fn a_write_that_loses_the_transaction_does_not_lose_the_others() {
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
        let aborting = tokio::spawn(async move { s.write((), aborting_write).await });
        let after = append("after");
        until("all writes to queue", || store.writer.queued() == 3).await;
        release.notify_one();
        plug.await.expect("join").expect("plug");

        before.await.expect("join").expect("before commits");
        let err = aborting.await.expect("join").expect_err("aborted");
        assert!(
            matches!(err, StoreError::Backend { op: "abort", .. }),
            "{err}"
        );
        after.await.expect("join").expect("after commits");

        let mut outside = outsider(&path).await;
        let texts: Vec<String> = sqlx::query_scalar("SELECT content FROM messages ORDER BY id")
            .fetch_all(&mut outside)
            .await
            .expect("read");
        assert_eq!(texts, vec!["before", "after"]);
        // The store still works afterwards.
        store.touch(&SessionId::from("s-1")).await.expect("touch");
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
}
