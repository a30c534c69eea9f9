//! Is the database file the server opened still the one at its path?
//!
//! Why this exists: SQLite keeps writing to a file that was deleted or
//! replaced under it. A probe deleted the data directory of a running
//! server: approvals were answered 200 and steering 202, `/healthz` said
//! `ok`, and after a restart every session, decision and transcript was
//! gone (the lock file went too, so a second server started on the same
//! path meanwhile). Now the writer checks, before each commit, that the path
//! still names the file it opened (same device and inode), and refuses
//! every write once it does not, saying what happened and what to do;
//! `/healthz` says so too. One `stat` per commit.

use std::path::{Path, PathBuf};

/// The device and inode of the database file as opened.
#[derive(Debug, Clone)]
pub(crate) struct DbFile {
    path: PathBuf,
    id: Option<(u64, u64)>,
}

impl DbFile {
    /// Notes which file `path` names now (call once it is open).
    pub(crate) fn opened(path: &Path) -> DbFile {
        DbFile {
            path: path.to_owned(),
            id: identity(path),
        }
    }

    /// `Err` with what to do when `path` no longer names the opened file.
    pub(crate) fn check(&self) -> Result<(), String> {
        let Some(opened) = self.id else {
            return Ok(()); // not a file we could identify: nothing to compare
        };
        match identity(&self.path) {
            Some(now) if now == opened => Ok(()),
            Some(_) => Err(format!(
                "the database file {} was replaced by another file while the server ran; nothing \
                 more is stored so that nothing is written where it would be lost: stop the \
                 server, put the right file back or move the new one away, and start it again",
                self.path.display()
            )),
            None => Err(format!(
                "the database file {} was deleted while the server ran; nothing more is stored \
                 (it would be lost at the next restart): restart the server, which creates the \
                 database again (the sessions, decisions and transcripts stored so far are gone \
                 with the file unless it is restored from a backup)",
                self.path.display()
            )),
        }
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
}
