//! One transaction over a batch of writes: optimistic first, then one
//! savepoint per write once any write failed, so a failing write fails
//! alone and its neighbours still commit (the guarantees `writer.rs` lists).
//!
//! Why apart from the writer: the writer decides *when* to commit and
//! whom to answer; this is *how* a batch becomes one transaction, SQLite's
//! failure modes included.

use rusqlite::Connection;

use super::Job;

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
pub(super) fn commit_batch(conn: &Connection, batch: &mut [Box<dyn Job>]) -> Result<u64, String> {
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
