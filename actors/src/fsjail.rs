//! Classifies paths named in requests as inside or outside a workspace.
//!
//! Rules and modes need to know whether the paths a permission request names
//! lie inside the workspace (and which workspace-relative path they are).
//! This is a classification for decisions, not an access check: actual file
//! access goes through [`crate::workspace_fs`], which resolves beneath a
//! directory handle and cannot be raced. Relative paths join the workspace
//! and each component is resolved as the kernel would: symlinks followed
//! (dangling ones too), `..` taken after them, and a file that does not
//! exist yet checked through its nearest existing ancestor.

use std::path::{Component, Path, PathBuf};

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path resolves outside the workspace.
    #[error("path {path} is outside the workspace {root}")]
    Outside {
        /// What the agent asked for.
        path: String,
        /// The workspace.
        root: String,
    },
    /// The path cannot be resolved to one file.
    #[error("path {path:?} cannot be resolved: {why}")]
    Unresolvable {
        /// What the agent asked for.
        path: String,
        /// Why not.
        why: String,
    },
    /// The workspace itself cannot be resolved.
    #[error("workspace {root} is not accessible: {reason}")]
    Workspace {
        /// The workspace.
        root: String,
        /// The I/O error.
        reason: String,
    },
}

/// Lexically removes `.` and resolves `..` (without touching the disk).
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// How many symlinks one resolution follows before giving up (the
/// kernel's own limit).
const MAX_SYMLINK_HOPS: usize = 40;

/// A path resolved the way the kernel would open it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The real path: symlinks followed, `..` taken after them.
    pub real: PathBuf,
    /// Whether it lies inside the workspace.
    pub inside: bool,
}

/// Resolves `requested` against workspace `root` the way the kernel would:
/// component by component, following every symlink (a dangling one too:
/// writing through it creates its target) and taking `..` after the
/// symlinks before it, so `link/../x` is beside the link's target, not in
/// the workspace. Past the first component that does not exist, the rest
/// is a new file and is taken as written. A path the agent's shell would
/// expand (`~`, `$HOME`), a URI (`file:///etc/passwd`) or an empty one
/// cannot be resolved. A file with more than one hard link does not count
/// as inside: its other names may lie outside.
pub fn resolve(root: &Path, requested: &Path) -> Result<Resolved, PathError> {
    let root_real = root.canonicalize().map_err(|e| PathError::Workspace {
        root: root.display().to_string(),
        reason: e.to_string(),
    })?;
    resolve_from(&root_real, requested)
}

/// Where each of `paths` lands inside workspace `root` ([`resolve`], the
/// root resolved once); `None` for one that cannot be resolved or lands
/// outside.
pub fn landings<'a>(
    root: &Path,
    paths: impl IntoIterator<Item = &'a Path>,
) -> Vec<Option<PathBuf>> {
    let root_real = root.canonicalize().ok();
    paths
        .into_iter()
        .map(|p| {
            let real = root_real.as_deref()?;
            resolve_from(real, p)
                .ok()
                .filter(|r| r.inside)
                .map(|r| r.real)
        })
        .collect()
}

/// [`resolve`] under a workspace root already resolved.
fn resolve_from(root_real: &Path, requested: &Path) -> Result<Resolved, PathError> {
    let unresolvable = |why: &str| PathError::Unresolvable {
        path: requested.display().to_string(),
        why: why.to_owned(),
    };
    let text = requested.to_string_lossy();
    if text.is_empty() {
        return Err(unresolvable("it is empty"));
    }
    if text.starts_with('~') || text.contains('$') {
        return Err(unresolvable("a shell would expand it (`~` or `$`)"));
    }
    if text
        .split('/')
        .next()
        .is_some_and(|first| first.ends_with(':'))
        && text.contains("://")
    {
        return Err(unresolvable("it is a URI, not a path"));
    }
    let mut real = if requested.is_absolute() {
        PathBuf::from("/")
    } else {
        root_real.to_path_buf()
    };
    let mut todo: std::collections::VecDeque<PathBuf> = parts(requested).collect();
    let (mut hops, mut missing) = (0, false);
    while let Some(part) = todo.pop_front() {
        if part.as_os_str() == ".." {
            real.pop();
            continue;
        }
        let next = real.join(&part);
        if missing {
            real = next;
            continue;
        }
        match std::fs::symlink_metadata(&next) {
            Ok(meta) if meta.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_SYMLINK_HOPS {
                    return Err(unresolvable("too many symlinks"));
                }
                let target = std::fs::read_link(&next)
                    .map_err(|e| unresolvable(&format!("its link cannot be read: {e}")))?;
                if target.is_absolute() {
                    real = PathBuf::from("/");
                }
                for p in parts(&target).collect::<Vec<_>>().into_iter().rev() {
                    todo.push_front(p);
                }
            }
            Ok(_) => real = next,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                missing = true;
                real = next;
            }
            Err(e) => return Err(unresolvable(&e.to_string())),
        }
    }
    // A file with other hard links is also wherever those are: changing it
    // inside changes them too, and they may lie outside.
    let shared = std::fs::symlink_metadata(&real)
        .is_ok_and(|m| m.is_file() && std::os::unix::fs::MetadataExt::nlink(&m) > 1);
    let inside = real.starts_with(root_real) && !shared;
    Ok(Resolved { real, inside })
}

/// The components of `path` that name something (`..` kept, `.` and the
/// root dropped).
fn parts(path: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    path.components().filter_map(|c| match c {
        Component::Normal(name) => Some(PathBuf::from(name)),
        Component::ParentDir => Some(PathBuf::from("..")),
        _ => None,
    })
}

/// Resolves `requested` against `root` ([`resolve`]) and proves it stays
/// inside.
pub fn resolve_inside(root: &Path, requested: &Path) -> Result<PathBuf, PathError> {
    let resolved = resolve(root, requested)?;
    if resolved.inside {
        Ok(resolved.real)
    } else {
        Err(PathError::Outside {
            path: requested.display().to_string(),
            root: root.display().to_string(),
        })
    }
}

/// What the paths of one request come to, for rules and modes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Judged {
    /// Each path relative to the workspace when it resolves inside, else
    /// as the agent wrote it.
    pub relative: Vec<String>,
    /// Whether every path resolved inside the workspace.
    pub inside: bool,
    /// Whether a path, as written or where it leads, is one of the server's
    /// own files (`is_server_file`).
    pub server_file: bool,
}

/// Resolves each of `paths` against workspace `root` ([`resolve`]) and
/// checks both what it says and where it leads with `is_server_file`: a
/// link may lead outside to one of the server's files.
pub fn judge_paths(
    root: &Path,
    paths: &[String],
    is_server_file: impl Fn(&Path) -> bool,
) -> Judged {
    let lexically_server_file = |p: &String| is_server_file(&normalize(&root.join(p)));
    // Resolved once for every path. A root that cannot be resolved leaves
    // every path unresolved, hence outside.
    let Ok(root_real) = root.canonicalize() else {
        return Judged {
            relative: paths.to_vec(),
            inside: paths.is_empty(),
            server_file: paths.iter().any(lexically_server_file),
        };
    };
    let mut judged = Judged {
        inside: true,
        ..Judged::default()
    };
    for p in paths {
        judged.server_file |= lexically_server_file(p);
        match resolve_from(&root_real, Path::new(p)) {
            Ok(r) if r.inside => {
                judged.server_file |= is_server_file(&r.real);
                judged.relative.push(
                    r.real
                        .strip_prefix(&root_real)
                        .map(|r| r.display().to_string())
                        .unwrap_or_else(|_| p.clone()),
                );
            }
            resolved => {
                if let Ok(r) = resolved {
                    judged.server_file |= is_server_file(&r.real);
                }
                judged.inside = false;
                judged.relative.push(p.clone());
            }
        }
    }
    judged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_and_absolute_paths_inside_are_accepted() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        std::fs::create_dir(root.join("src")).expect("mkdir");
        assert_eq!(
            resolve_inside(&root, Path::new("src/new.rs")),
            Ok(root.join("src/new.rs"))
        );
        assert_eq!(
            resolve_inside(&root, &root.join("a/b/c.txt")),
            Ok(root.join("a/b/c.txt"))
        );
        assert_eq!(
            resolve_inside(&root, Path::new("src/../x")),
            Ok(root.join("x"))
        );
    }

    #[test]
    fn escapes_are_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let outside = tempfile::tempdir().expect("tmp2");
        let root = dir.path().canonicalize().expect("canon");
        std::os::unix::fs::symlink(outside.path(), root.join("link")).expect("symlink");
        for bad in [
            "../etc/passwd",
            "/etc/passwd",
            "link/secret.txt",
            "src/../../x",
        ] {
            assert!(
                matches!(
                    resolve_inside(&root, Path::new(bad)),
                    Err(PathError::Outside { .. })
                ),
                "{bad} was accepted"
            );
        }
    }

    #[test]
    fn links_resolve_as_the_kernel_resolves_them() {
        let dir = tempfile::tempdir().expect("tmp");
        let outside = tempfile::tempdir().expect("tmp2");
        let root = dir.path().canonicalize().expect("canon");
        let out = outside.path().canonicalize().expect("canon2");
        std::fs::create_dir(out.join("sub")).expect("mkdir");
        // `L/..` is the parent of L's target, outside; a dangling link
        // creates its target when written through.
        std::os::unix::fs::symlink(out.join("sub"), root.join("L")).expect("symlink");
        std::os::unix::fs::symlink(out.join("created.txt"), root.join("dangling"))
            .expect("symlink");
        std::os::unix::fs::symlink("../escape", root.join("rel")).expect("symlink");
        std::os::unix::fs::symlink("loop", root.join("loop")).expect("symlink");
        for bad in ["L/../target.txt", "dangling", "rel", "rel/deeper/x"] {
            let r = resolve(&root, Path::new(bad)).expect(bad);
            assert!(!r.inside, "{bad} resolved inside: {}", r.real.display());
            assert!(resolve_inside(&root, Path::new(bad)).is_err(), "{bad}");
        }
        assert_eq!(
            resolve(&root, Path::new("L/../target.txt"))
                .expect("L")
                .real,
            out.join("target.txt")
        );
        assert_eq!(
            resolve(&root, Path::new("dangling"))
                .expect("dangling")
                .real,
            out.join("created.txt")
        );
        for unresolvable in [
            "",
            "~/.bashrc",
            "~",
            "$HOME/.bashrc",
            "loop",
            "file:///etc/passwd",
        ] {
            assert!(
                matches!(
                    resolve(&root, Path::new(unresolvable)),
                    Err(PathError::Unresolvable { .. })
                ),
                "{unresolvable:?} was resolved"
            );
        }
        // A hard link may lead anywhere: a file with two names is not
        // inside, whatever the name used.
        std::fs::write(out.join("victim.txt"), "x").expect("victim");
        std::fs::hard_link(out.join("victim.txt"), root.join("hard.txt")).expect("hard link");
        assert!(!resolve(&root, Path::new("hard.txt")).expect("hard").inside);
        std::fs::write(root.join("single.txt"), "x").expect("single");
        assert!(
            resolve(&root, Path::new("single.txt"))
                .expect("single")
                .inside
        );
        // A link that stays inside is fine, and a new file under a missing
        // directory is checked through what exists.
        std::fs::create_dir(root.join("src")).expect("mkdir");
        std::os::unix::fs::symlink("src", root.join("s")).expect("symlink");
        assert_eq!(
            resolve_inside(&root, Path::new("s/new.rs")),
            Ok(root.join("src/new.rs"))
        );
        assert_eq!(
            resolve_inside(&root, Path::new("new/dir/../f.rs")),
            Ok(root.join("new/f.rs"))
        );
    }
}
