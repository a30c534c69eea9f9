//! The single-instance guard for a database file.
//!
//! Why this exists: SQLite would happily let two agent-intercom processes open
//! the same file, and both would then answer the same agents' requests. Before
//! touching the database we take an exclusive, non-blocking advisory lock on a
//! sibling `<db>.lock` file and keep it for as long as the store lives; the
//! kernel drops it when the process exits, however it exits.

use std::fs::File;
use std::path::{Path, PathBuf};

/// Why the lock could not be taken.
#[derive(Debug)]
pub(crate) enum LockFailure {
    /// Another open file description (another process, or another store in
    /// this process) already holds it.
    Held,
    /// The lock file could not be opened or locked for another reason.
    Io(std::io::Error),
}

/// An exclusive advisory lock, released when dropped.
#[derive(Debug)]
pub(crate) struct InstanceLock {
    /// Keeps the locked descriptor open; closing it releases the lock.
    _file: File,
    /// Where the lock file is, for diagnostics.
    path: PathBuf,
}

impl InstanceLock {
    /// The path of the lock file that guards `db_path`.
    pub(crate) fn path_for(db_path: &Path) -> PathBuf {
        let mut name = db_path.as_os_str().to_owned();
        name.push(".lock");
        PathBuf::from(name)
    }

    /// Opens (creating if needed) and exclusively locks `path`.
    pub(crate) fn acquire(path: &Path) -> Result<InstanceLock, LockFailure> {
        let mut opts = std::fs::OpenOptions::new();
        opts.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let file = opts.open(path).map_err(LockFailure::Io)?;
        lock_exclusive(&file)?;
        Ok(InstanceLock {
            _file: file,
            path: path.to_owned(),
        })
    }

    /// [`InstanceLock::acquire`], trying again for up to `patience` while
    /// another holds it. A server killed with SIGKILL holds its lock until
    /// the kernel has taken the process down: a restart right after the
    /// kill (by hand, or a service manager's) found it still held and
    /// exited saying another instance ran.
    pub(crate) async fn acquire_within(
        path: &Path,
        patience: std::time::Duration,
    ) -> Result<InstanceLock, LockFailure> {
        let until = tokio::time::Instant::now() + patience;
        loop {
            match Self::acquire(path) {
                Err(LockFailure::Held) if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                other => return other,
            }
        }
    }

    /// Where the lock file is.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(unix)]
fn lock_exclusive(file: &File) -> Result<(), LockFailure> {
    use std::os::unix::io::AsRawFd;
    loop {
        // SAFETY: `flock` only reads the descriptor, which `file` keeps open
        // for the duration of the call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(code) if code == libc::EINTR => continue,
            Some(code) if code == libc::EWOULDBLOCK || code == libc::EAGAIN => {
                return Err(LockFailure::Held);
            }
            _ => return Err(LockFailure::Io(err)),
        }
    }
}

#[cfg(not(unix))]
fn lock_exclusive(_file: &File) -> Result<(), LockFailure> {
    // No advisory locking off unix; SQLite's own locking still prevents
    // corruption, only the friendly "another instance" check is missing.
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_same_file_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db.lock");
        let first = InstanceLock::acquire(&path).expect("first lock");
        assert!(matches!(
            InstanceLock::acquire(&path),
            Err(LockFailure::Held)
        ));
        drop(first);
        InstanceLock::acquire(&path).expect("lock after release");
    }

    /// A lock let go of while a second waits is taken; one held throughout
    /// is refused once the patience is spent.
    #[tokio::test]
    async fn a_lock_released_while_waiting_is_taken() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db.lock");
        let first = InstanceLock::acquire(&path).expect("first lock");
        let refused =
            InstanceLock::acquire_within(&path, std::time::Duration::from_millis(250)).await;
        assert!(matches!(refused, Err(LockFailure::Held)));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let holder = tokio::spawn(async move {
            let _ = rx.await;
            drop(first);
        });
        let waiting = tokio::spawn({
            let path = path.clone();
            async move { InstanceLock::acquire_within(&path, std::time::Duration::from_secs(30)).await }
        });
        let _ = tx.send(());
        holder.await.expect("holder");
        waiting.await.expect("join").expect("taken once released");
    }

    #[test]
    fn lock_path_is_a_sibling() {
        assert_eq!(
            InstanceLock::path_for(Path::new("/a/b/intercom.db")),
            PathBuf::from("/a/b/intercom.db.lock")
        );
    }
}
