//! The server's own files (database, data directory, API token, config,
//! log), refused to every agent by path and by inode wherever the operator
//! put them.

use super::*;

/// The server's own files and directories, refused to every agent.
#[derive(Debug, Clone, Default)]
pub struct ServerFiles {
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
    /// Files protected by inode whatever their path becomes: the server's
    /// own output, which a log rotation renames while the server still
    /// writes to it (and which holds the token printed at start).
    held: Vec<(u64, u64)>,
}

impl ServerFiles {
    /// Files (compared by path and by inode) and directories (everything
    /// beneath them). Paths are made absolute and canonical where they exist.
    pub fn new(
        files: impl IntoIterator<Item = PathBuf>,
        dirs: impl IntoIterator<Item = PathBuf>,
    ) -> Self {
        ServerFiles {
            files: files
                .into_iter()
                .map(|p| canonical_or_lexical(&p))
                .collect(),
            dirs: dirs.into_iter().map(|p| canonical_or_lexical(&p)).collect(),
            held: Vec::new(),
        }
    }

    /// Also protects the files with these `(device, inode)` pairs, whatever
    /// path they have now or get later.
    pub fn holding(mut self, inodes: impl IntoIterator<Item = (u64, u64)>) -> Self {
        self.held.extend(inodes);
        self
    }

    /// True when nothing is protected (tests, embedders).
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.dirs.is_empty() && self.held.is_empty()
    }

    /// The protected paths, for messages and checks elsewhere.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files
            .iter()
            .chain(self.dirs.iter())
            .map(PathBuf::as_path)
    }

    /// True when the absolute, resolved `path` is (or is beneath) a server
    /// file, or is the same file as one (a hard link, or a server file
    /// whose path is now a symlink to it: the check follows the inode).
    pub fn covers(&self, path: &Path) -> bool {
        self.checker().covers(path)
    }

    /// A checker for many paths at once: the protected files' inodes are
    /// read once, not once per path (a request may name many paths).
    pub fn checker(&self) -> Checker<'_> {
        Checker {
            files: self,
            inodes: std::cell::OnceCell::new(),
        }
    }

    /// True when `meta` is the same inode as a protected file (hard links).
    pub(super) fn same_inode(&self, meta: &std::fs::Metadata) -> bool {
        self.inodes().contains(&(meta.dev(), meta.ino()))
    }

    /// The protected files' inodes, and those of the regular files directly
    /// in a protected directory (the data directory's API token: a hard
    /// link to it inside a workspace must not read it either).
    fn inodes(&self) -> HashSet<(u64, u64)> {
        let in_dirs = self
            .dirs
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flat_map(|entries| entries.flatten().map(|e| e.path()));
        self.files
            .iter()
            .cloned()
            .chain(in_dirs)
            .filter_map(|f| std::fs::metadata(f).ok())
            .filter(std::fs::Metadata::is_file)
            .map(|m| (m.dev(), m.ino()))
            .chain(self.held.iter().copied())
            .collect()
    }
}

/// [`ServerFiles::covers`] for several paths, reading the protected
/// files' inodes once.
#[derive(Debug)]
pub struct Checker<'a> {
    files: &'a ServerFiles,
    inodes: std::cell::OnceCell<HashSet<(u64, u64)>>,
}

impl Checker<'_> {
    /// True when the absolute, resolved `path` is (or is beneath) a server
    /// file, or is the same file as one.
    pub fn covers(&self, path: &Path) -> bool {
        let f = self.files;
        let path = canonical_or_lexical(path);
        if f.files.contains(&path) || f.dirs.iter().any(|d| path.starts_with(d)) {
            return true;
        }
        if f.is_empty() {
            return false;
        }
        std::fs::metadata(&path).is_ok_and(|m| {
            m.is_file()
                && self
                    .inodes
                    .get_or_init(|| f.inodes())
                    .contains(&(m.dev(), m.ino()))
        })
    }

    /// True when `command` names a server file: its text holds one of their
    /// paths (as a whole name), or a path it names ([`command_words`]: from
    /// `cwd` and every directory it `cd`s to, `~`/`$HOME`/`$PWD` expanded,
    /// `@file` and `--opt=file` taken apart) leads to one, or a glob in it
    /// matches one. A best effort, not a sandbox: a command can build a
    /// path it never spells out (`da""ta`, base64), or read a directory
    /// above the server's (`find ..`), and `auto` mode runs what it is
    /// given. What it catches is the plain case: in `auto`, `cat
    /// /srv/intercom/data/api-token` was allowed and the token reached the
    /// model.
    pub fn named_in_command(&self, command: &str, cwd: &Path) -> bool {
        if self.files.is_empty() {
            return false;
        }
        if self.files.paths().any(|p| holds_path(command, p)) {
            return true;
        }
        let home = std::env::var_os("HOME").map(PathBuf::from);
        command_words::named_paths(command, cwd, home.as_deref())
            .into_iter()
            .any(|named| match named {
                command_words::Named::Path(path) => self.covers(&path),
                command_words::Named::Glob(glob) => self.matches_glob(&glob),
            })
    }

    /// True when `glob` matches a protected path, or a directory holding
    /// one (`../d*/api-token`, `../d*`).
    fn matches_glob(&self, glob: &str) -> bool {
        let Ok(matcher) = globset::GlobBuilder::new(glob)
            .literal_separator(true)
            .build()
            .map(|g| g.compile_matcher())
        else {
            return false;
        };
        self.files
            .paths()
            .any(|p| p.ancestors().any(|a| matcher.is_match(a)))
    }
}

/// True when `command` holds `path` as a whole name: followed by nothing, a
/// separator or a character no file name part has (`…/data` is not held by
/// `…/database_backup`).
fn holds_path(command: &str, path: &Path) -> bool {
    let path = path.to_string_lossy();
    command.match_indices(path.as_ref()).any(|(at, found)| {
        command[at + found.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || "._-~+".contains(c)))
    })
}

/// Canonical when it exists; else its canonical parent joined with the name;
/// else lexically normalised.
fn canonical_or_lexical(path: &Path) -> PathBuf {
    if let Ok(real) = path.canonicalize() {
        return real;
    }
    if let (Some(parent), Some(name)) = (path.parent(), path.file_name())
        && let Ok(real) = parent.canonicalize()
    {
        return real.join(name);
    }
    normalize(path)
}
