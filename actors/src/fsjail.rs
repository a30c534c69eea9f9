//! Classifies paths named in requests as inside or outside a workspace.
//!
//! Rules and modes need to know whether the paths a permission request names
//! lie inside the workspace (and which workspace-relative path they are).
//! This is a classification for decisions, not an access check: actual file
//! access goes through [`crate::workspace_fs`], which resolves beneath a
//! directory handle and cannot be raced. Relative paths join the workspace,
//! `..` is resolved, symlinks are followed, and a file that does not exist
//! yet is checked through its nearest existing ancestor.

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

/// Resolves `requested` against `root` and proves it stays inside.
pub fn resolve_inside(root: &Path, requested: &Path) -> Result<PathBuf, PathError> {
    let root_real = root.canonicalize().map_err(|e| PathError::Workspace {
        root: root.display().to_string(),
        reason: e.to_string(),
    })?;
    let outside = || PathError::Outside {
        path: requested.display().to_string(),
        root: root_real.display().to_string(),
    };
    let joined = if requested.is_absolute() {
        requested.to_path_buf()
    } else {
        root_real.join(requested)
    };
    let lexical = normalize(&joined);
    // Follow symlinks through the deepest existing ancestor.
    let mut existing = lexical.as_path();
    let mut rest = Vec::new();
    let real = loop {
        match existing.canonicalize() {
            Ok(real) => break real,
            Err(_) => {
                let Some(name) = existing.file_name() else {
                    return Err(outside());
                };
                rest.push(name.to_owned());
                existing = existing.parent().ok_or_else(outside)?;
            }
        }
    };
    let mut resolved = real;
    for part in rest.iter().rev() {
        resolved.push(part);
    }
    if resolved.starts_with(&root_real) {
        Ok(resolved)
    } else {
        Err(outside())
    }
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
}
