//! Running file operations off the async workers, bounded in time and in
//! number.
//!
//! Everything in [`super`] blocks, so callers run it on tokio's blocking
//! pool with [`FS_TIMEOUT`]. A timeout answers the caller, but a blocking
//! thread cannot be cancelled: a probe's agents read line 10,000,000 of a
//! 64 GiB sparse file over and over, each read was answered "timed out"
//! after 10 s and kept scanning, the session's limit on reads in flight
//! was freed by the answer, and the abandoned scans filled the pool's 512
//! threads. Other sessions' approved writes then timed out too, and Stop
//! no longer stopped. So:
//!
//! - an operation knows its deadline (a thread-local set for the blocking
//!   thread running it) and a long one stops itself there
//!   ([`past_deadline`], checked by the reads' scans);
//! - whatever limits a caller (the session's reads in flight) is held by
//!   the operation itself, on the blocking thread, until it really ends;
//! - the server runs at most [`OPS_SERVER_WIDE`] of the agents' own at
//!   once, well under the pool's size: past that one is refused at once,
//!   never queued behind the ones running. A write an operator approved is
//!   not held to that cap ([`approved_on_blocking_pool`]).

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::{FsError, WorkspaceFs};

/// Longest a single file operation may take before the caller gets an error.
pub const FS_TIMEOUT: Duration = Duration::from_secs(10);

/// File operations the whole server runs at once (tokio's blocking pool has
/// 512 threads, which the store's reads and process walks use too).
pub const OPS_SERVER_WIDE: usize = 128;

static SERVER_SLOTS: Semaphore = Semaphore::const_new(OPS_SERVER_WIDE);

thread_local! {
    /// When the operation running on this blocking thread is due.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// True once the operation running on this thread is past its deadline
/// (its caller has been answered): it should stop where it is.
pub(super) fn past_deadline() -> bool {
    DEADLINE.with(|d| d.get().is_some_and(|due| Instant::now() >= due))
}

/// Sets this thread's deadline (`None`: none); [`on_blocking_pool`] does it
/// for the operations it runs.
pub(super) fn set_deadline(due: Option<Instant>) {
    DEADLINE.with(|d| d.set(due));
}

/// Runs `op` against the workspace on the blocking pool, with [`FS_TIMEOUT`]:
/// a hung filesystem costs the caller a few seconds, never an async worker.
/// Refused at once when the server already runs [`OPS_SERVER_WIDE`].
pub async fn on_blocking_pool<T, F>(
    ws: Arc<WorkspaceFs>,
    action: &'static str,
    path: &str,
    op: F,
) -> Result<T, FsError>
where
    T: Send + 'static,
    F: FnOnce(&WorkspaceFs) -> Result<T, FsError> + Send + 'static,
{
    let Ok(slot) = SERVER_SLOTS.try_acquire() else {
        return Err(FsError::Busy {
            action,
            path: path.to_owned(),
            why: format!("the server already runs {OPS_SERVER_WIDE} file operations"),
        });
    };
    within(FS_TIMEOUT, ws, action, path, move |ws| {
        let _slot = slot;
        op(ws)
    })
    .await
}

/// [`on_blocking_pool`] for a write an operator approved: not refused for
/// the server-wide cap, which agents' own reads can fill (a probe's 17
/// hostile sessions had another session's approved writes refused). Such
/// writes are as many as the operator's decisions, and each session's
/// permits still bound them.
pub async fn approved_on_blocking_pool<T, F>(
    ws: Arc<WorkspaceFs>,
    path: &str,
    op: F,
) -> Result<T, FsError>
where
    T: Send + 'static,
    F: FnOnce(&WorkspaceFs) -> Result<T, FsError> + Send + 'static,
{
    within(FS_TIMEOUT, ws, "write", path, op).await
}

/// Runs `op` on the blocking pool with `timeout`; whatever `op` holds (a
/// permit) it holds until it really ends, not until its answer.
async fn within<T, F>(
    timeout: Duration,
    ws: Arc<WorkspaceFs>,
    action: &'static str,
    path: &str,
    op: F,
) -> Result<T, FsError>
where
    T: Send + 'static,
    F: FnOnce(&WorkspaceFs) -> Result<T, FsError> + Send + 'static,
{
    let due = Instant::now() + timeout;
    let task = tokio::task::spawn_blocking(move || {
        set_deadline(Some(due));
        let result = op(&ws);
        set_deadline(None);
        result
    });
    match tokio::time::timeout(timeout, task).await {
        Ok(Ok(result)) => result,
        Ok(Err(join)) => Err(FsError::Io {
            action,
            path: path.to_owned(),
            reason: format!("the file task failed: {join}"),
        }),
        Err(_) => Err(FsError::TimedOut {
            action,
            path: path.to_owned(),
            secs: timeout.as_secs(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With the server-wide cap taken (by hostile sessions' reads, say), a
    /// read is refused at once and an approved write still runs.
    #[tokio::test]
    async fn a_full_server_refuses_reads_but_not_approved_writes() {
        let dir = tempfile::tempdir().expect("tmp");
        let ws = Arc::new(
            WorkspaceFs::open(dir.path(), super::super::ServerFiles::default()).expect("open"),
        );
        let all = u32::try_from(OPS_SERVER_WIDE).expect("fits");
        let taken = SERVER_SLOTS.try_acquire_many(all).expect("every slot");
        let read = on_blocking_pool(ws.clone(), "read", "a.txt", |_| Ok(())).await;
        match read {
            Err(e @ FsError::Busy { .. }) => {
                assert!(
                    e.to_string().contains("already runs 128 file operations"),
                    "{e}"
                );
            }
            other => panic!("{other:?}"),
        }
        let write = approved_on_blocking_pool(ws, "a.txt", |ws| {
            let named = ws.relative("a.txt")?;
            ws.write_at("a.txt", "approved", &named)
        })
        .await;
        drop(taken);
        assert!(write.is_ok(), "{write:?}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a.txt")).expect("written"),
            "approved"
        );
    }

    /// An operation past its timeout answers its caller and still holds
    /// what limits it (here one permit) until it really ends, so a caller
    /// cannot start more than its limit however often they time out.
    #[tokio::test]
    async fn an_operation_past_its_timeout_holds_its_permit_until_it_ends() {
        let dir = tempfile::tempdir().expect("tmp");
        let ws = Arc::new(
            WorkspaceFs::open(dir.path(), super::super::ServerFiles::default()).expect("open"),
        );
        let limit = Arc::new(Semaphore::new(1));
        let permit = limit.clone().try_acquire_owned().expect("the one permit");
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (ended, has_ended) = std::sync::mpsc::channel::<()>();
        // Blocked until released: it is past any timeout when answered.
        let short = Duration::from_millis(50);
        let answer = within(short, ws, "read", "slow.txt", move |_| {
            {
                let _permit = permit;
                let _ = released.recv();
            }
            let _ = ended.send(());
            Ok(())
        })
        .await;
        assert!(
            matches!(answer, Err(FsError::TimedOut { .. })),
            "{answer:?}"
        );
        assert_eq!(limit.available_permits(), 0, "held while it runs");
        release.send(()).expect("release");
        has_ended
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the operation ends");
        assert_eq!(limit.available_permits(), 1, "given back when it ends");
    }
}
