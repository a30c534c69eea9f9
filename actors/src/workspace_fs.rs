//! File access for agents, beneath the workspace and away from the server's
//! own files.
//!
//! ACP agents read and write through the client (`fs/read_text_file`,
//! `fs/write_text_file`) and MCP clients apply diffs; every one of those
//! paths is hostile input. Three rules hold here:
//!
//! 1. **Beneath a directory handle.** Paths are resolved through a
//!    [`cap_std::fs::Dir`] opened on the workspace when the session starts
//!    (cap-std uses `openat2(RESOLVE_BENEATH)` where the kernel has it): `..`
//!    above the root, absolute symlinks, symlinks leading out and magic links
//!    fail in the kernel's own path walk, so there is no window between a
//!    check and the use. A write is re-resolved when it happens (after the
//!    approval), goes to a temporary file in the target's parent directory
//!    handle and is renamed over the target, so a path swapped for a symlink
//!    meanwhile can never redirect it. Writing through a symlink is refused.
//! 2. **Only regular files, bounded.** Files are opened non-blocking and
//!    checked with `fstat` on the open descriptor: FIFOs, sockets, devices and
//!    directories are refused at once. Reads stop as soon as `line`/`limit`
//!    are satisfied and never return more than `limits.max_read_bytes`.
//! 3. **The server's files are never the agent's.** [`ServerFiles`] (the
//!    database and its `-wal`/`-shm`, the data directory, the API token, the
//!    config file, the log file) are refused by path and by inode, wherever
//!    the operator put them.
//!
//! Everything here blocks; callers run it through [`on_blocking_pool`]
//! (the blocking pool, with [`FS_TIMEOUT`]).

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use cap_fs_ext::OpenOptionsSyncExt;
use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};

pub use crate::fsjail::normalize;
pub use pool::{FS_TIMEOUT, OPS_SERVER_WIDE, approved_on_blocking_pool, on_blocking_pool};
pub use server_files::{Checker, ServerFiles};

/// Why a file operation was refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    /// The request itself is malformed.
    #[error("invalid path {path:?}: {why}")]
    Invalid {
        /// What the agent sent.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The path resolves outside the workspace.
    #[error("path {path} is outside the workspace {root}; agents may only use files inside it")]
    Outside {
        /// What the agent sent.
        path: String,
        /// The workspace.
        root: String,
    },
    /// The path is one of the server's own files.
    #[error(
        "path {path} is one of agent-intercom's own files (database, data directory, API token, config or log); agents may never read or write it"
    )]
    ServerFile {
        /// What the agent sent.
        path: String,
    },
    /// Not a regular file (FIFO, socket, device, directory).
    #[error("{path} is a {what}, not a regular file; only regular files can be read or written")]
    NotRegular {
        /// What the agent sent.
        path: String,
        /// What it is.
        what: &'static str,
    },
    /// The path leads elsewhere than when its write was approved.
    #[error(
        "{path} now leads to {now}, not to {then} as when its write was approved (a link changed); the write was not done, ask again"
    )]
    Moved {
        /// What the agent sent.
        path: String,
        /// Where it led when approved (workspace-relative).
        then: String,
        /// Where it leads now.
        now: String,
    },
    /// A symlink where a file is written (dangling, escaping or not).
    #[error(
        "{path} is a symbolic link; write to the file itself (links are never written through)"
    )]
    Symlink {
        /// What the agent sent.
        path: String,
    },
    /// The result would be larger than allowed.
    #[error(
        "reading {path} would return more than {max} bytes (limits.max_read_bytes); read a range with `line` and `limit`"
    )]
    TooLarge {
        /// What the agent sent.
        path: String,
        /// The cap.
        max: usize,
    },
    /// The requested line lies too far into the file to scan for.
    #[error(
        "line {line} of {path} is not within its first {scanned} bytes; read a file this large from a tool that can seek"
    )]
    LineTooFar {
        /// What the agent sent.
        path: String,
        /// The line asked for.
        line: u32,
        /// How far the scan went.
        scanned: u64,
    },
    /// The file does not exist.
    #[error("{path} does not exist")]
    NotFound {
        /// What the agent sent.
        path: String,
    },
    /// Any other I/O failure.
    #[error("cannot {action} {path}: {reason}")]
    Io {
        /// read / write / open the workspace.
        action: &'static str,
        /// What the agent sent.
        path: String,
        /// The OS error.
        reason: String,
    },
    /// The operation did not finish in time (a hung filesystem).
    #[error("{action} {path} did not finish within {secs} s")]
    TimedOut {
        /// read / write.
        action: &'static str,
        /// What the agent sent.
        path: String,
        /// The timeout.
        secs: u64,
    },
    /// Too many file operations are running (the session's, or the
    /// server's): refused at once rather than queued.
    #[error("{action} {path} refused: {why}; wait for the answers to the ones running")]
    Busy {
        /// read / write.
        action: &'static str,
        /// What the agent sent.
        path: String,
        /// Whose limit, and how many run.
        why: String,
    },
}

impl FsError {
    /// True when the agent asked for something it must never have (worth an
    /// audit entry and an operator notice, not just an error to the agent).
    pub fn is_containment(&self) -> bool {
        matches!(
            self,
            FsError::Outside { .. }
                | FsError::ServerFile { .. }
                | FsError::Symlink { .. }
                | FsError::Moved { .. }
        )
    }
}

/// A workspace opened as a directory handle.
#[derive(Debug)]
pub struct WorkspaceFs {
    root: PathBuf,
    given: PathBuf,
    dir: Dir,
    guard: ServerFiles,
}

impl WorkspaceFs {
    /// Opens `root` (the session's working directory) as a handle.
    pub fn open(root: &Path, guard: ServerFiles) -> Result<Self, FsError> {
        let io = |e: std::io::Error| FsError::Io {
            action: "open the workspace",
            path: root.display().to_string(),
            reason: e.to_string(),
        };
        let real = root.canonicalize().map_err(io)?;
        let dir = Dir::open_ambient_dir(&real, ambient_authority()).map_err(io)?;
        Ok(WorkspaceFs {
            root: real,
            given: root.to_path_buf(),
            dir,
            guard,
        })
    }

    /// The workspace's canonical path.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The workspace-relative form of `requested` (absolute paths must lie
    /// inside the workspace; `..` may not climb above it).
    pub fn relative(&self, requested: &str) -> Result<PathBuf, FsError> {
        let invalid = |why| FsError::Invalid {
            path: requested.to_owned(),
            why,
        };
        if requested.is_empty() {
            return Err(invalid("the path is empty"));
        }
        if requested.contains('\0') {
            return Err(invalid("the path contains a NUL byte"));
        }
        // A line break or another control character in a file name is
        // legal but never meant, and in a diff's `+++ b/<path>` header it
        // forges more headers: a probe's `x.sh\n--- a/CHANGELOG.md\n...`
        // showed a change to CHANGELOG.md while writing a new file.
        if requested.chars().any(crate::text::breaks_a_line) {
            return Err(invalid(
                "the path contains a control character (a line break, a tab, an escape); name the file without one",
            ));
        }
        // `file/` or `file/.` names a directory (POSIX: ENOTDIR on a file);
        // normalizing would drop the ending and read or write `file`.
        if requested.ends_with('/') || requested.ends_with("/.") {
            return Err(invalid(
                "the path ends with '/' so it names a directory; only files are read or written",
            ));
        }
        let path = Path::new(requested);
        let rel = if path.is_absolute() {
            let lexical = normalize(path);
            lexical
                .strip_prefix(&self.root)
                .or_else(|_| lexical.strip_prefix(normalize(&self.given)))
                .map(Path::to_path_buf)
                .map_err(|_| self.outside(requested))?
        } else {
            path.to_path_buf()
        };
        // Read as text, `link/..` is where the link is; the kernel (and the
        // rules, which judge where a path lands) take it beside the link's
        // target. Refused, so that a path means one place: a probe's
        // `docs-link/../.git/hooks/x` was judged in docs/ and written in
        // .git/hooks.
        if self.dotdot_after_link(path) {
            return Err(invalid(
                "'..' follows a symbolic link, so the path means one place read as text and another to the kernel; name the file without '..'",
            ));
        }
        let mut depth = 0usize;
        for c in rel.components() {
            match c {
                Component::ParentDir if depth == 0 => return Err(self.outside(requested)),
                Component::ParentDir => depth -= 1,
                Component::Normal(_) => depth += 1,
                _ => {}
            }
        }
        let rel = normalize(&rel);
        if rel.as_os_str().is_empty() {
            return Err(invalid("the path names the workspace directory itself"));
        }
        Ok(rel)
    }

    /// Whether a `..` in `path` (as the agent wrote it, relative to the
    /// workspace or absolute) comes right after a symbolic link.
    fn dotdot_after_link(&self, path: &Path) -> bool {
        if !path.components().any(|c| c == Component::ParentDir) {
            return false;
        }
        let absolute = path.is_absolute();
        let is_link = |walked: &Path| {
            if absolute {
                std::fs::symlink_metadata(walked).is_ok_and(|m| m.file_type().is_symlink())
            } else {
                self.dir
                    .symlink_metadata(walked)
                    .is_ok_and(|m| m.file_type().is_symlink())
            }
        };
        let mut walked = PathBuf::new();
        for c in path.components() {
            match c {
                Component::ParentDir => {
                    if is_link(&walked) {
                        return true;
                    }
                    walked.pop();
                }
                Component::CurDir => {}
                other => walked.push(other),
            }
        }
        false
    }

    fn outside(&self, requested: &str) -> FsError {
        FsError::Outside {
            path: requested.to_owned(),
            root: self.root.display().to_string(),
        }
    }

    /// Maps an error from a beneath-resolution to what the agent should hear.
    fn resolve_error(&self, requested: &str, action: &'static str, e: std::io::Error) -> FsError {
        match e.kind() {
            std::io::ErrorKind::NotFound => FsError::NotFound {
                path: requested.to_owned(),
            },
            // cap-std reports an escape (`..` above the root, an absolute or
            // escaping symlink, a magic link) as PermissionDenied "outside".
            std::io::ErrorKind::PermissionDenied if e.to_string().contains("outside") => {
                self.outside(requested)
            }
            _ => FsError::Io {
                action,
                path: requested.to_owned(),
                reason: e.to_string(),
            },
        }
    }

    /// Refuses a resolved workspace-relative path that is a server file.
    fn check_not_server_file(&self, requested: &str, resolved_rel: &Path) -> Result<(), FsError> {
        if self.guard.covers(&self.root.join(resolved_rel)) {
            return Err(FsError::ServerFile {
                path: requested.to_owned(),
            });
        }
        Ok(())
    }

    /// Reads `requested` (lines `line`.. for `limit` lines when given),
    /// returning at most `max_bytes`.
    pub fn read(
        &self,
        requested: &str,
        line: Option<u32>,
        limit: Option<u32>,
        max_bytes: usize,
    ) -> Result<String, FsError> {
        let bytes = self.read_bytes(requested, line, limit, max_bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// [`Self::read`], as the bytes the file holds.
    fn read_bytes(
        &self,
        requested: &str,
        line: Option<u32>,
        limit: Option<u32>,
        max_bytes: usize,
    ) -> Result<Vec<u8>, FsError> {
        let rel = self.relative(requested)?;
        let real = self
            .dir
            .canonicalize(&rel)
            .map_err(|e| self.resolve_error(requested, "read", e))?;
        self.check_not_server_file(requested, &real)?;
        // Sockets cannot even be opened (ENXIO): say what they are first.
        // The descriptor is checked again below, which is what counts.
        let pre = self
            .dir
            .metadata(&real)
            .map_err(|e| self.resolve_error(requested, "read", e))?;
        if !pre.is_file() {
            let what = if pre.is_dir() {
                "directory"
            } else {
                "special file (FIFO, socket or device)"
            };
            return Err(FsError::NotRegular {
                path: requested.to_owned(),
                what,
            });
        }
        let mut opts = OpenOptions::new();
        opts.read(true).nonblock(true);
        let file = self
            .dir
            .open_with(&real, &opts)
            .map_err(|e| self.resolve_error(requested, "read", e))?
            .into_std();
        let meta = file.metadata().map_err(|e| FsError::Io {
            action: "read",
            path: requested.to_owned(),
            reason: e.to_string(),
        })?;
        regular_only(requested, &meta)?;
        if self.guard.same_inode(&meta) {
            return Err(FsError::ServerFile {
                path: requested.to_owned(),
            });
        }
        read_range(file, line, limit, max_bytes).map_err(|e| match e {
            RangeError::TooLarge => FsError::TooLarge {
                path: requested.to_owned(),
                max: max_bytes,
            },
            RangeError::LineTooFar => FsError::LineTooFar {
                path: requested.to_owned(),
                line: line.unwrap_or(1),
                scanned: SKIP_SCAN_BYTES,
            },
            RangeError::Io(e) => FsError::Io {
                action: "read",
                path: requested.to_owned(),
                reason: e.to_string(),
            },
            RangeError::TimedOut => FsError::TimedOut {
                action: "read",
                path: requested.to_owned(),
                secs: FS_TIMEOUT.as_secs(),
            },
        })
    }

    /// The current content of a write target (`None`: it does not exist yet),
    /// for the diff shown with the approval. Refuses what `write` would refuse.
    ///
    /// Only text: a file that is not UTF-8 is refused. Read lossily, its
    /// other bytes showed as U+FFFD, unchanged in a diff, and a change
    /// written from that text replaced them (a probe's Latin-1 line was
    /// rewritten while the operator saw it as context).
    pub fn current(&self, requested: &str, max_bytes: usize) -> Result<Option<String>, FsError> {
        let target = self.write_target(requested)?;
        if !target.exists {
            return Ok(None);
        }
        let bytes = self.read_bytes(requested, None, None, max_bytes)?;
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| FsError::Invalid {
                path: requested.to_owned(),
                why: "the file is not UTF-8 text, which is all a change here is shown and made as",
            })
    }

    /// What a write would replace, resolved once: the workspace-relative
    /// path and, for the diff shown with the approval, the current content
    /// (`None` for a new file, or one too large or unreadable to show).
    /// Refuses what `write` would refuse.
    pub fn write_preview(
        &self,
        requested: &str,
        max_bytes: usize,
    ) -> Result<(PathBuf, Option<String>), FsError> {
        let target = self.write_target(requested)?;
        let old = if target.exists {
            self.read(requested, None, None, max_bytes).ok()
        } else {
            None
        };
        Ok((target.parent.join(target.name), old))
    }

    /// The workspace-relative path a write would replace (resolved now).
    pub fn check_write(&self, requested: &str) -> Result<PathBuf, FsError> {
        self.write_target(requested).map(|t| t.parent.join(t.name))
    }

    /// Writes `content` to `requested`: re-resolved now, written to a
    /// temporary file beside the target through the parent's handle, then
    /// renamed over it.
    pub fn write(&self, requested: &str, content: &str) -> Result<(), FsError> {
        let target = self.write_target(requested)?;
        self.write_to(requested, target, content)
    }

    /// [`Self::write`], only if `requested` still lands on `expected` (the
    /// workspace-relative file the operator was shown and approved, from
    /// [`Self::write_preview`]). A probe's agent re-pointed a link after
    /// the approval of `notes/x` and the write went to `.git/hooks/x`.
    pub fn write_at(&self, requested: &str, content: &str, expected: &Path) -> Result<(), FsError> {
        let target = self.write_target(requested)?;
        let lands = target.parent.join(&target.name);
        if lands != expected {
            return Err(FsError::Moved {
                path: requested.to_owned(),
                then: expected.display().to_string(),
                now: lands.display().to_string(),
            });
        }
        self.write_to(requested, target, content)
    }

    fn write_to(&self, requested: &str, target: WriteTarget, content: &str) -> Result<(), FsError> {
        let io = |e: std::io::Error| FsError::Io {
            action: "write",
            path: requested.to_owned(),
            reason: e.to_string(),
        };
        let parent = if target.parent.as_os_str().is_empty() {
            self.dir.try_clone().map_err(io)?
        } else {
            self.dir
                .create_dir_all(&target.parent)
                .map_err(|e| self.resolve_error(requested, "write", e))?;
            self.dir
                .open_dir(&target.parent)
                .map_err(|e| self.resolve_error(requested, "write", e))?
        };
        let tmp = format!(
            ".{}.intercom-{:016x}.tmp",
            target.name.to_string_lossy(),
            crate::ids::random_u64()
        );
        let mut opts = OpenOptions::new();
        opts.write(true).create_new(true);
        let result = (|| {
            let mut file = parent.open_with(&tmp, &opts)?;
            file.write_all(content.as_bytes())?;
            if let Some(mode) = target.mode {
                let perms = cap_std::fs::Permissions::from_std(
                    std::os::unix::fs::PermissionsExt::from_mode(mode),
                );
                file.set_permissions(perms)?;
            }
            file.sync_all()?;
            parent.rename(&tmp, &parent, &target.name)
        })();
        if let Err(e) = result {
            let _ = parent.remove_file(&tmp);
            return Err(io(e));
        }
        Ok(())
    }

    /// Resolves the parent beneath the root and checks the final name.
    fn write_target(&self, requested: &str) -> Result<WriteTarget, FsError> {
        let rel = self.relative(requested)?;
        let name = rel
            .file_name()
            .map(|n| n.to_os_string())
            .ok_or_else(|| FsError::Invalid {
                path: requested.to_owned(),
                why: "the path has no file name",
            })?;
        let parent_rel = rel.parent().unwrap_or(Path::new(""));
        // The deepest existing ancestor must resolve beneath the root; the
        // missing rest is created beneath it at write time.
        let parent_real = self.resolve_existing_prefix(requested, parent_rel)?;
        let target_rel = parent_real.join(&name);
        self.check_not_server_file(requested, &target_rel)?;
        let (exists, mode) = match self.dir.symlink_metadata(&target_rel) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(FsError::Symlink {
                    path: requested.to_owned(),
                });
            }
            Ok(meta) if meta.is_file() => {
                let std_meta = self
                    .dir
                    .open(&target_rel)
                    .and_then(|f| f.into_std().metadata())
                    .map_err(|e| self.resolve_error(requested, "write", e))?;
                regular_only(requested, &std_meta)?;
                if self.guard.same_inode(&std_meta) {
                    return Err(FsError::ServerFile {
                        path: requested.to_owned(),
                    });
                }
                (true, Some(std_meta.mode() & 0o7777))
            }
            Ok(meta) => {
                return Err(FsError::NotRegular {
                    path: requested.to_owned(),
                    what: if meta.is_dir() {
                        "directory"
                    } else {
                        "special file"
                    },
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (false, None),
            Err(e) => return Err(self.resolve_error(requested, "write", e)),
        };
        Ok(WriteTarget {
            parent: parent_real,
            name,
            exists,
            mode,
        })
    }

    /// Canonicalises the longest existing prefix of `rel` beneath the root
    /// and appends the rest lexically (it will be created as directories).
    fn resolve_existing_prefix(&self, requested: &str, rel: &Path) -> Result<PathBuf, FsError> {
        let mut existing = rel.to_path_buf();
        let mut rest = Vec::new();
        loop {
            if existing.as_os_str().is_empty() {
                break;
            }
            match self.dir.canonicalize(&existing) {
                Ok(real) => {
                    existing = real;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // A dangling symlink in the chain is refused, not created through.
                    if let Ok(meta) = self.dir.symlink_metadata(&existing)
                        && meta.file_type().is_symlink()
                    {
                        return Err(FsError::Symlink {
                            path: requested.to_owned(),
                        });
                    }
                    if let Some(name) = existing.file_name() {
                        rest.push(name.to_os_string());
                    }
                    existing = existing.parent().map(Path::to_path_buf).unwrap_or_default();
                }
                Err(e) => return Err(self.resolve_error(requested, "write", e)),
            }
        }
        if !existing.as_os_str().is_empty() {
            let meta = self
                .dir
                .metadata(&existing)
                .map_err(|e| self.resolve_error(requested, "write", e))?;
            if !meta.is_dir() {
                return Err(FsError::NotRegular {
                    path: requested.to_owned(),
                    what: "file where a directory is needed",
                });
            }
        }
        for part in rest.into_iter().rev() {
            existing.push(part);
        }
        if self.guard.covers(&self.root.join(&existing)) {
            return Err(FsError::ServerFile {
                path: requested.to_owned(),
            });
        }
        Ok(existing)
    }
}

/// What a write resolved to.
struct WriteTarget {
    parent: PathBuf,
    name: std::ffi::OsString,
    exists: bool,
    mode: Option<u32>,
}

fn regular_only(requested: &str, meta: &std::fs::Metadata) -> Result<(), FsError> {
    use std::os::unix::fs::FileTypeExt;
    let ft = meta.file_type();
    if ft.is_file() {
        return Ok(());
    }
    let what = if ft.is_dir() {
        "directory"
    } else if ft.is_fifo() {
        "FIFO (named pipe)"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_char_device() || ft.is_block_device() {
        "device"
    } else {
        "special file"
    };
    Err(FsError::NotRegular {
        path: requested.to_owned(),
        what,
    })
}

enum RangeError {
    TooLarge,
    /// `line` was not reached within [`SKIP_SCAN_BYTES`].
    LineTooFar,
    /// The operation's deadline passed (its caller was answered already).
    TimedOut,
    Io(std::io::Error),
}

/// The most a read scans to reach its first `line`. Without a bound, a
/// hostile agent's sparse file of a terabyte of zeros (`truncate -s 1T`)
/// kept a blocking thread scanning long after the read's timeout answered,
/// one more per read. 256 MiB scan in well under a second from the page
/// cache.
const SKIP_SCAN_BYTES: u64 = 256 << 20;

/// Reads lines `line`.. (1-based) for `limit` lines, or the whole file, and
/// never buffers more than `max_bytes` of output; skipped lines are scanned
/// (at most [`SKIP_SCAN_BYTES`] of them), not kept, and reading stops once
/// `limit` lines are in.
fn read_range(
    file: impl Read,
    line: Option<u32>,
    limit: Option<u32>,
    max_bytes: usize,
) -> Result<Vec<u8>, RangeError> {
    read_range_within(file, line, limit, max_bytes, SKIP_SCAN_BYTES)
}

/// [`read_range`] scanning at most `scan` bytes to reach `line`.
fn read_range_within(
    file: impl Read,
    line: Option<u32>,
    limit: Option<u32>,
    max_bytes: usize,
    scan: u64,
) -> Result<Vec<u8>, RangeError> {
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let mut skip = line.unwrap_or(1).saturating_sub(1);
    let mut scanned: u64 = 0;
    while skip > 0 {
        if scanned >= scan {
            return Err(RangeError::LineTooFar);
        }
        if pool::past_deadline() {
            return Err(RangeError::TimedOut);
        }
        let buf = reader.fill_buf().map_err(RangeError::Io)?;
        if buf.is_empty() {
            return Ok(Vec::new());
        }
        let n = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => {
                skip -= 1;
                i + 1
            }
            None => buf.len(),
        };
        reader.consume(n);
        scanned += n as u64;
    }
    let mut left = limit.map_or(u64::MAX, u64::from);
    let mut out = Vec::new();
    while left > 0 {
        if pool::past_deadline() {
            return Err(RangeError::TimedOut);
        }
        let buf = reader.fill_buf().map_err(RangeError::Io)?;
        if buf.is_empty() {
            break;
        }
        let (take, ends_line) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if out.len() + take > max_bytes {
            return Err(RangeError::TooLarge);
        }
        out.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if ends_line {
            left -= 1;
        }
    }
    Ok(out)
}

mod command_words;
mod pool;
mod server_files;
#[cfg(test)]
mod tests;
