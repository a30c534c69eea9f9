//! Path resolution for configuration values.
//!
//! Every relative path in `config.toml` is resolved against the config file's
//! directory. Paths are then made canonical as far as they exist: the longest
//! existing ancestor is canonicalised (following symlinks and `..`) and the
//! non-existent rest is appended after lexical normalisation. Containment
//! checks compare these canonical forms, so neither `..` nor a symlink can
//! smuggle a path out of `workspace_root`.

use std::path::{Component, Path, PathBuf};

/// `path` made absolute against `base` (when relative) and lexically normalised.
/// Does not touch the file system.
pub(crate) fn join_normalized(base: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        normalize_lexically(path)
    } else {
        normalize_lexically(&base.join(path))
    }
}

/// Removes `.` and resolves `..` textually. `/..` stays `/`; a leading `..` of a
/// relative path is kept.
pub(crate) fn normalize_lexically(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Prefix(_) | Component::RootDir => out.push(component.as_os_str()),
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir | Component::Prefix(_)) => {}
                Some(Component::ParentDir | Component::CurDir) | None => out.push(".."),
            },
            Component::Normal(name) => out.push(name),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// `path` made absolute against the process's current directory when relative
/// (no file-system access beyond reading the current directory).
pub(crate) fn absolutize(path: &Path) -> PathBuf {
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    match std::path::absolute(path) {
        Ok(abs) => abs,
        Err(_) => path.to_path_buf(),
    }
}

/// The canonical form of an absolute `path`, as far as it exists.
///
/// If the whole path exists this is `fs::canonicalize`. Otherwise the longest
/// existing ancestor is canonicalised and the remaining components are appended
/// after lexical normalisation.
pub(crate) fn canonicalish(path: &Path) -> PathBuf {
    if let Ok(canonical) = std::fs::canonicalize(path) {
        return canonical;
    }
    let components: Vec<Component<'_>> = path.components().collect();
    for n in (1..components.len()).rev() {
        let prefix: PathBuf = components[..n].iter().collect();
        if let Ok(canonical) = std::fs::canonicalize(&prefix) {
            let rest = &components[n..];
            let candidate = normalize_lexically(&canonical.join(rest.iter().collect::<PathBuf>()));
            // A `..` in the non-existent rest was resolved textually; the
            // result may now name an existing symlink, so resolve once more
            // (the candidate has no `..`, so this recursion ends).
            if rest.iter().any(|c| matches!(c, Component::ParentDir)) {
                return canonicalish(&candidate);
            }
            return candidate;
        }
    }
    normalize_lexically(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_normalisation() {
        let cases = [
            ("/a/b/../c", "/a/c"),
            ("/a/./b/", "/a/b"),
            ("/..", "/"),
            ("/a/../..", "/"),
            ("a/../..", ".."),
            ("../x", "../x"),
            ("", "."),
        ];
        for (input, want) in cases {
            assert_eq!(
                normalize_lexically(Path::new(input)),
                PathBuf::from(want),
                "{input}"
            );
        }
    }

    #[test]
    fn join_keeps_absolute_paths() {
        assert_eq!(
            join_normalized(Path::new("/base"), Path::new("/x/./y")),
            PathBuf::from("/x/y")
        );
        assert_eq!(
            join_normalized(Path::new("/base/dir"), Path::new("../data/db")),
            PathBuf::from("/base/data/db")
        );
    }

    #[test]
    fn canonicalish_handles_missing_tails() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        assert_eq!(
            canonicalish(&root.join("sub/../sub/new/x")),
            root.join("sub/new/x")
        );
        assert_eq!(canonicalish(&root.join("missing/../sub")), root.join("sub"));
    }

    #[cfg(unix)]
    #[test]
    fn canonicalish_follows_symlinks_in_existing_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let out = std::fs::canonicalize(outside.path()).unwrap();
        std::os::unix::fs::symlink(&out, root.join("link")).unwrap();
        assert_eq!(
            canonicalish(&root.join("link/not/yet")),
            out.join("not/yet")
        );
        // `..` after a missing component, then through the symlink.
        assert_eq!(canonicalish(&root.join("missing/../link/z")), out.join("z"));
    }
}
