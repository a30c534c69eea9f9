//! Is the database file the server opened still the one at its path?
//!
//! Why this exists: SQLite keeps writing to a file that was deleted or
//! replaced under it. A probe deleted the data directory of a running
//! server: approvals were answered 200 and steering 202, `/healthz` said
//! `ok`, and after a restart every session, decision and transcript was
//! gone (the lock file went too, so a second server started on the same
//! path meanwhile). Now the writer checks, before each commit, that the path
//! and its `-wal` still name the files it opened (same device and inode),
//! and refuses every write once they do not, saying what happened and what
//! to do; `/healthz` says so too. Two `stat`s per commit.

use std::path::{Path, PathBuf};

/// The device and inode of the database file as opened, and of its
/// write-ahead log: a fresh database holds everything in the log, so a
/// deleted `-wal` loses as much as a deleted database (a probe's did).
#[derive(Debug, Clone)]
pub(crate) struct DbFile {
    files: Vec<(PathBuf, Option<(u64, u64)>)>,
}

impl DbFile {
    /// Notes which files `path` and its `-wal` name now (call once the
    /// database is open in WAL mode).
    pub(crate) fn opened(path: &Path) -> DbFile {
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let files = [path.to_owned(), PathBuf::from(wal)]
            .into_iter()
            .map(|p| {
                let id = identity(&p);
                (p, id)
            })
            .collect();
        DbFile { files }
    }

    /// `Err` with what to do when a path no longer names the opened file.
    pub(crate) fn check(&self) -> Result<(), String> {
        self.files
            .iter()
            .try_for_each(|(path, id)| check_one(path, *id))
    }
}

fn check_one(path: &Path, opened: Option<(u64, u64)>) -> Result<(), String> {
    let Some(opened) = opened else {
        return Ok(()); // not a file we could identify: nothing to compare
    };
    match identity(path) {
        Some(now) if now == opened => Ok(()),
        Some(_) => Err(format!(
            "the database file {} was replaced by another file while the server ran; nothing \
                 more is stored so that nothing is written where it would be lost: stop the \
                 server, put the right file back or move the new one away, and start it again",
            path.display()
        )),
        None => Err(format!(
            "the database file {} was deleted while the server ran; nothing more is stored \
                 (it would be lost at the next restart): restart the server, which creates the \
                 database again (the sessions, decisions and transcripts stored so far are gone \
                 with the file unless it is restored from a backup)",
            path.display()
        )),
    }
}

#[cfg(unix)]
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(_path: &Path) -> Option<(u64, u64)> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_or_replaced_file_is_named() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("x.db");
        std::fs::write(&path, "a").expect("write");
        let file = DbFile::opened(&path);
        assert_eq!(file.check(), Ok(()));
        std::fs::write(&path, "b").expect("rewrite in place");
        assert_eq!(file.check(), Ok(()), "the same file, written");
        let other = dir.path().join("y.db");
        std::fs::write(&other, "c").expect("write");
        std::fs::rename(&other, &path).expect("replace");
        assert!(file.check().expect_err("replaced").contains("replaced"));
        std::fs::remove_file(&path).expect("delete");
        assert!(file.check().expect_err("deleted").contains("deleted"));
    }

    /// A fresh database holds everything in its log: a probe deleted the
    /// `-wal` and lost every session while `/healthz` said ok.
    #[test]
    fn a_deleted_log_is_named() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("x.db");
        std::fs::write(&path, "a").expect("write");
        std::fs::write(dir.path().join("x.db-wal"), "w").expect("write");
        let file = DbFile::opened(&path);
        assert_eq!(file.check(), Ok(()));
        std::fs::remove_file(dir.path().join("x.db-wal")).expect("delete");
        assert!(file.check().expect_err("deleted").contains("x.db-wal"));
    }
}
