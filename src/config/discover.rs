//! Discovery of git repositories under `workspace_root` (`[discovery]`).
//!
//! Why this exists: operators with many checkouts should not have to list
//! each one as a `[[workspace]]`. A directory is a repository when it holds a
//! `.git` directory or file (worktrees and submodules use a file). The search
//! is breadth-first, so shallower repositories are found first, and bounded:
//! at most `depth` levels below the root and a maximum number of results
//! ([`MAX_DISCOVERED`](super::MAX_DISCOVERED) for config loads).
//! Hidden directories, `node_modules` and `target` are skipped, symlinks are
//! never followed (nothing found can lie outside the root), and the search
//! does not descend into a repository it found (its subdirectories, including
//! submodules, belong to it). Unreadable directories are skipped.
//!
//! A discovered repository's id is its path relative to the root with `/`
//! separators (`team/api`); it has no Slack channel and uses the default
//! agent. Directory names that are not UTF-8 are skipped.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

/// Directory names never searched (besides hidden ones).
const SKIPPED: [&str; 2] = ["node_modules", "target"];

/// One repository found under the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// Path relative to the root, `/`-separated.
    pub(crate) id: String,
    /// Absolute path (the root joined with `id`).
    pub(crate) path: PathBuf,
}

/// Git repositories under `root`, at most `depth` levels down and at most
/// `max` of them, sorted by id. The root itself is never a result.
pub(crate) fn discover(root: &Path, depth: usize, max: usize) -> Vec<Found> {
    let mut found = Vec::new();
    // (directory, its id, its level below the root)
    let mut queue: VecDeque<(PathBuf, String, usize)> = VecDeque::new();
    queue.push_back((root.to_path_buf(), String::new(), 0));
    'search: while let Some((dir, id, level)) = queue.pop_front() {
        if level >= depth {
            continue;
        }
        let mut children = match subdirectories(&dir) {
            Ok(children) => children,
            Err(e) => {
                tracing::debug!(dir = %dir.display(), "discovery skips an unreadable directory: {e}");
                continue;
            }
        };
        children.sort();
        for name in children {
            let path = dir.join(&name);
            let child_id = if id.is_empty() {
                name
            } else {
                format!("{id}/{name}")
            };
            if is_repository(&path) {
                if found.len() >= max {
                    tracing::warn!(
                        root = %root.display(),
                        max,
                        "discovery stopped after {max} repositories; lower discovery.depth or list workspaces explicitly"
                    );
                    break 'search;
                }
                found.push(Found { id: child_id, path });
            } else {
                queue.push_back((path, child_id, level + 1));
            }
        }
    }
    found.sort_by(|a, b| a.id.cmp(&b.id));
    found
}

/// Names of the searchable subdirectories of `dir` (no symlinks, no hidden
/// or skipped names, UTF-8 only).
fn subdirectories(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let Ok(entry) = entry else { continue };
        // `file_type` does not follow symlinks: a symlinked directory is not a dir here.
        let Ok(file_type) = entry.file_type() else {
            continue;
        };
        if !file_type.is_dir() {
            continue;
        }
        let Ok(name) = entry.file_name().into_string() else {
            tracing::debug!(path = %entry.path().display(), "discovery skips a non-UTF-8 name");
            continue;
        };
        if name.starts_with('.') || SKIPPED.contains(&name.as_str()) {
            continue;
        }
        out.push(name);
    }
    Ok(out)
}

/// Whether `dir` holds a `.git` directory or file (not a symlink).
fn is_repository(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join(".git"))
        .is_ok_and(|m| m.file_type().is_dir() || m.file_type().is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MAX_DISCOVERED;
    use std::fs;

    fn repo(root: &Path, rel: &str) {
        fs::create_dir_all(root.join(rel).join(".git")).expect("mkdir");
    }

    fn ids(found: &[Found]) -> Vec<&str> {
        found.iter().map(|f| f.id.as_str()).collect()
    }

    #[test]
    fn finds_repositories_breadth_first_within_depth() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        repo(&root, "api");
        repo(&root, "team/web");
        repo(&root, "team/deep/tool");
        fs::create_dir_all(root.join("team/empty")).expect("mkdir");
        // A worktree / submodule style `.git` file counts too.
        fs::create_dir_all(root.join("wt")).expect("mkdir");
        fs::write(root.join("wt/.git"), "gitdir: /elsewhere\n").expect("write");

        let found = discover(&root, 2, MAX_DISCOVERED);
        assert_eq!(ids(&found), ["api", "team/web", "wt"]);
        assert_eq!(found[1].path, root.join("team/web"));
        assert_eq!(ids(&discover(&root, 1, MAX_DISCOVERED)), ["api", "wt"]);
        assert_eq!(
            ids(&discover(&root, 3, MAX_DISCOVERED)),
            ["api", "team/deep/tool", "team/web", "wt"]
        );
    }

    #[test]
    fn skips_hidden_vendored_build_and_nested_directories() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        repo(&root, ".hidden/r");
        repo(&root, "node_modules/pkg");
        repo(&root, "target/r");
        // Inside a repository: its submodules are not separate workspaces.
        repo(&root, "outer");
        repo(&root, "outer/sub");
        // The root itself is never a result.
        fs::create_dir_all(root.join(".git")).expect("mkdir");
        assert_eq!(ids(&discover(&root, 4, MAX_DISCOVERED)), ["outer"]);
    }

    #[cfg(unix)]
    #[test]
    fn does_not_follow_symlinks() {
        let dir = tempfile::tempdir().expect("tmp");
        let outside = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        repo(outside.path(), "escaped");
        std::os::unix::fs::symlink(outside.path(), root.join("link")).expect("symlink");
        std::os::unix::fs::symlink(outside.path().join("escaped"), root.join("repo-link"))
            .expect("symlink");
        assert!(discover(&root, 3, MAX_DISCOVERED).is_empty());
    }

    #[test]
    fn stops_at_the_maximum() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        for i in 0..5 {
            repo(&root, &format!("r{i}"));
        }
        assert_eq!(ids(&discover(&root, 2, 3)), ["r0", "r1", "r2"]);
    }

    #[test]
    fn a_missing_root_finds_nothing() {
        assert!(discover(Path::new("/nonexistent/agent-intercom-root"), 2, 10).is_empty());
    }
}
