//! Where git looks for code to run, as the workspace's git configuration
//! says: `core.hooksPath`, and the files its `[include]`s read.
//!
//! Why this exists: `auto-edits` asks before an edit to a file that runs
//! code when git or an editor next touches the workspace (`.git/`,
//! `.githooks/`, `.husky/`, ...; [`super::RUNS_CODE`]). A repository can move
//! its hooks anywhere with `core.hooksPath` (`tools/hooks`, say), and can
//! `[include]` a config file that lies in the working tree. An agent that
//! wrote `tools/hooks/pre-commit`, or `core.fsmonitor` into an included
//! file, had its command run at the operator's next commit or `git status`.
//! So an edit under the configured hooks directory, or to an included
//! config file inside the workspace, is asked for too.
//!
//! This reads the operator's global config (`~/.gitconfig`,
//! `$XDG_CONFIG_HOME/git/config`) and the repository's (found by walking up
//! from the workspace, through a `.git` file to a worktree's directories),
//! following `[include]` and `[includeIf]` paths (every condition taken as
//! true: asking once too often is the safe side). It is a small reader of
//! git's format, not git: what it cannot read it skips, bounded in files and
//! bytes.

use std::path::{Path, PathBuf};

/// The most config files one look reads (includes included).
const MAX_FILES: usize = 32;
/// The most bytes read of one config file.
const MAX_BYTES: u64 = 1 << 20;

/// Workspace-relative paths (against the canonical `root`) under which an
/// edit can change what git runs: the configured hooks directories and the
/// included config files that lie inside the workspace.
pub fn protected(root: &Path) -> Vec<PathBuf> {
    let Ok(root) = root.canonicalize() else {
        return Vec::new();
    };
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut reader = Reader {
        home: home.clone(),
        read: 0,
        found: Found::default(),
    };
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".config")));
    if let Some(h) = &home {
        reader.read_file(&h.join(".gitconfig"), 0);
    }
    if let Some(x) = &xdg {
        reader.read_file(&x.join("git/config"), 0);
    }
    let top = repository(&root);
    if let Some(repo) = &top {
        for config in &repo.configs {
            reader.read_file(config, 0);
        }
    }
    let work_tree = top.as_ref().map_or(root.as_path(), |r| r.top.as_path());
    let hooks = reader.found.hooks.iter().map(|h| work_tree.join(h));
    // A git directory that lies in the workspace under another name than
    // `.git` (`git init --separate-git-dir=gd`): all of it, as `.git/`.
    let git_dirs = top.iter().flat_map(|r| r.dirs.iter().cloned());
    let candidates: Vec<PathBuf> = hooks
        .chain(reader.found.includes.iter().cloned())
        .chain(git_dirs)
        .map(|p| crate::fsjail::normalize(&p))
        .collect();
    inside(&root, &candidates)
}

/// Each of `paths` (absolute) that lies in canonical `root`, made
/// `root`-relative, as written and where it leads (a hooks directory
/// reached through a link is protected under both names: a write judged
/// where it lands must still be seen to land there). The root is resolved
/// once for all of them.
pub(super) fn inside(root: &Path, paths: &[PathBuf]) -> Vec<PathBuf> {
    let asked: Vec<&Path> = paths
        .iter()
        .map(|p| p.strip_prefix(root).unwrap_or(p))
        .collect();
    let landed = crate::fsjail::landings(root, asked.iter().copied());
    let mut out = Vec::new();
    for (path, real) in paths.iter().zip(landed) {
        let written = path.strip_prefix(root).ok();
        let lands = real.as_deref().and_then(|r| r.strip_prefix(root).ok());
        for rel in written.into_iter().chain(lands) {
            if !out.iter().any(|p| p == rel) {
                out.push(rel.to_path_buf());
            }
        }
    }
    out
}

/// True when workspace-relative `path` is or lies under one of `protected`
/// (ASCII case folded, as [`super::RUNS_CODE`] is matched).
pub fn covers(protected: &[PathBuf], path: &str) -> bool {
    let lower = |p: &Path| PathBuf::from(p.to_string_lossy().to_ascii_lowercase());
    let path = lower(Path::new(path));
    protected.iter().any(|p| path.starts_with(lower(p)))
}

/// The repository holding a directory: where its working tree starts, its
/// git directories and its config files.
struct Repository {
    top: PathBuf,
    /// The git directory, and the common one of a worktree.
    dirs: Vec<PathBuf>,
    /// Its `config`, and a worktree's `config.worktree`.
    configs: Vec<PathBuf>,
}

/// The repository holding `dir`, if any.
fn repository(dir: &Path) -> Option<Repository> {
    let top = dir.ancestors().find(|d| d.join(".git").exists())?;
    let dot_git = top.join(".git");
    let git_dir = if dot_git.is_file() {
        let text = read_bounded(&dot_git)?;
        let target = text.trim().strip_prefix("gitdir:")?.trim();
        top.join(target)
    } else {
        dot_git
    };
    let common = read_bounded(&git_dir.join("commondir"))
        .map_or_else(|| git_dir.clone(), |c| git_dir.join(c.trim()));
    let mut configs = vec![common.join("config")];
    let mut dirs = vec![git_dir.clone()];
    if common != git_dir {
        configs.push(git_dir.join("config"));
        dirs.push(common);
    }
    configs.push(git_dir.join("config.worktree"));
    Some(Repository {
        top: top.to_path_buf(),
        dirs,
        configs,
    })
}

/// A regular file's text, at most [`MAX_BYTES`]; `None` for anything else.
/// Opened without blocking: an agent (a process on this machine) can put a
/// FIFO where a config file or `.git` is looked for, and a plain open of
/// it waits for a writer for ever, holding the session that asked.
fn read_bounded(path: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    // Bytes that are not UTF-8 (in a comment, or a file cut mid-character
    // at the bound) must not make the whole file unread: git reads on.
    let mut bytes = Vec::new();
    file.take(MAX_BYTES).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// What the config files said, as written (hooks paths unresolved).
#[derive(Debug, Default, PartialEq)]
struct Found {
    hooks: Vec<PathBuf>,
    includes: Vec<PathBuf>,
}

struct Reader {
    home: Option<PathBuf>,
    read: usize,
    found: Found,
}

impl Reader {
    fn read_file(&mut self, path: &Path, depth: usize) {
        if self.read >= MAX_FILES || depth > 10 {
            return;
        }
        let Some(text) = read_bounded(path) else {
            return;
        };
        self.read += 1;
        let base = path.parent().unwrap_or(Path::new("/"));
        for entry in entries(&text) {
            match entry {
                Entry::HooksPath(v) => {
                    let p = self.expand(&v).unwrap_or_else(|| PathBuf::from(v));
                    self.found.hooks.push(p);
                }
                Entry::Include(v) => {
                    let Some(p) = self.expand(&v).map(|p| base.join(p)) else {
                        continue;
                    };
                    self.found.includes.push(p.clone());
                    self.read_file(&p, depth + 1);
                }
            }
        }
    }

    /// `~/x` is under the home directory; other paths as written.
    fn expand(&self, value: &str) -> Option<PathBuf> {
        match value.strip_prefix("~/") {
            Some(rest) => self.home.as_ref().map(|h| h.join(rest)),
            None => Some(PathBuf::from(value)),
        }
    }
}

/// A setting this module cares about.
#[derive(Debug, PartialEq)]
enum Entry {
    HooksPath(String),
    Include(String),
}

/// The `core.hooksPath` and `include*.path` settings of a config text.
fn entries(text: &str) -> Vec<Entry> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in joined_lines(text) {
        let mut line = line.trim_start();
        if let Some(rest) = line.strip_prefix('[') {
            let Some(end) = rest.find(']') else {
                continue;
            };
            section = rest[..end].trim().to_ascii_lowercase();
            line = rest[end + 1..].trim_start();
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim().to_ascii_lowercase();
        let value = unquote(value);
        let name = section.split(['"', ' ', '\t']).next().unwrap_or("");
        let plain = !section.contains('"');
        match (name, key.as_str()) {
            ("core", "hookspath") if plain => out.push(Entry::HooksPath(value)),
            ("include" | "includeif", "path") => out.push(Entry::Include(value)),
            _ => {}
        }
    }
    out
}

/// The config's lines, a line ending in `\` joined with the next (git
/// reads `hooksPath = h\` then `k` as `hk`).
fn joined_lines(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut open = false;
    for line in text.lines() {
        let continued = open;
        let (body, more) = match line.strip_suffix('\\') {
            Some(body) if !body.ends_with('\\') => (body, true),
            _ => (line, false),
        };
        match out.last_mut() {
            Some(last) if continued => last.push_str(body),
            _ => out.push(body.to_owned()),
        }
        open = more;
    }
    out
}

/// A value as git reads it: quotes removed, `\"` `\\` `\t` `\n` unescaped,
/// a comment (`#`, `;` outside quotes) dropped, outer blanks trimmed.
fn unquote(raw: &str) -> String {
    let mut out = String::new();
    let (mut quoted, mut chars) = (false, raw.trim().chars());
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '#' | ';' if !quoted => break,
            '\\' => match chars.next() {
                Some('t') => out.push('\t'),
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => {}
            },
            c => out.push(c),
        }
    }
    out.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository at `<tmp>/repo` whose `.git/config` is `config`.
    fn repo_with_config(config: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("dir");
        let root = dir.path().join("repo");
        std::fs::create_dir_all(root.join(".git")).expect("git dir");
        std::fs::write(root.join(".git/config"), config).expect("config");
        (dir, root)
    }

    #[test]
    fn reads_hooks_paths_and_includes_as_git_writes_them() {
        let text = "[user]\n\tname = x\n[core]\n\tbare = false\n\thooksPath = \"tools/git hooks\" # ours\n\
                    [Core]\nHOOKSPATH=.hooks\n[core \"x\"]\n\thookspath = nope\n\
                    [include]\n\tpath = ../shared.gitconfig\n[includeIf \"gitdir:~/w/\"]\n\tpath = ~/w.gitconfig\n";
        assert_eq!(
            entries(text),
            vec![
                Entry::HooksPath("tools/git hooks".into()),
                Entry::HooksPath(".hooks".into()),
                Entry::Include("../shared.gitconfig".into()),
                Entry::Include("~/w.gitconfig".into()),
            ]
        );
        assert_eq!(unquote(r#" "a\"b" ; c"#), "a\"b");
        // A continued line, and bytes that are not UTF-8 in a comment.
        let text = "# caf\u{fffd}\n[core]\n\thooksPath = h\\\nk\n";
        assert_eq!(entries(text), vec![Entry::HooksPath("hk".into())]);
    }

    #[test]
    fn protects_the_configured_hooks_and_an_included_file_inside_the_workspace() {
        let (_dir, root) = repo_with_config(
            "[core]\n\thooksPath = tools/hooks\n[include]\n\tpath = ../team.gitconfig\n",
        );
        std::fs::write(
            root.join("team.gitconfig"),
            "[core]\n\thooksPath = ci/hooks\n",
        )
        .expect("included");
        let found = protected(&root);
        for p in ["tools/hooks", "team.gitconfig", "ci/hooks"] {
            assert!(found.contains(&PathBuf::from(p)), "{p} in {found:?}");
        }
        assert!(covers(&found, "tools/hooks/pre-commit"));
        assert!(covers(&found, "Tools/Hooks/pre-commit"));
        assert!(covers(&found, "team.gitconfig"));
        assert!(!covers(&found, "tools/hooksmith.rs"));
        assert!(!covers(&found, "src/main.rs"));
    }

    /// A hooks directory reached through a link is protected under both
    /// names, and so is a git directory not named `.git`.
    #[test]
    fn links_and_separate_git_directories_are_followed() {
        let dir = tempfile::tempdir().expect("dir");
        let root = dir.path().join("repo");
        std::fs::create_dir_all(root.join("gd/hooks")).expect("git dir");
        std::fs::create_dir_all(root.join("scripts/hooks")).expect("hooks");
        std::fs::create_dir_all(root.join("tools")).expect("tools");
        std::os::unix::fs::symlink("../scripts/hooks", root.join("tools/hooks")).expect("link");
        std::fs::write(root.join(".git"), "gitdir: gd\n").expect(".git file");
        std::fs::write(
            root.join("gd/config"),
            "[core]\n\thooksPath = tools/hooks\n",
        )
        .expect("config");
        let found = protected(&root);
        assert!(covers(&found, "tools/hooks/pre-commit"), "{found:?}");
        assert!(covers(&found, "scripts/hooks/pre-commit"), "{found:?}");
        assert!(covers(&found, "gd/hooks/pre-commit"), "{found:?}");
        assert!(!covers(&found, "scripts/build.sh"), "{found:?}");
    }

    /// A FIFO where a config file is looked for is skipped, not waited on.
    #[test]
    fn a_fifo_in_place_of_a_config_file_is_skipped() {
        let (_dir, root) = repo_with_config(
            "[include]\n\tpath = ../team.gitconfig\n[core]\n\thooksPath = hooks\n",
        );
        let fifo = std::ffi::CString::new(root.join("team.gitconfig").to_str().expect("utf-8"))
            .expect("c path");
        // SAFETY: mkfifo(3) on a NUL-terminated path this test owns.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let found = protected(&root);
        assert!(found.contains(&PathBuf::from("hooks")), "{found:?}");
        assert!(
            found.contains(&PathBuf::from("team.gitconfig")),
            "{found:?}"
        );
    }

    #[test]
    fn a_workspace_inside_a_worktree_reads_the_worktrees_repository() {
        let dir = tempfile::tempdir().expect("dir");
        let main_git = dir.path().join("main/.git");
        let wt_git = main_git.join("worktrees/wt");
        std::fs::create_dir_all(&wt_git).expect("worktree git dir");
        std::fs::write(main_git.join("config"), "[core]\n\thooksPath = hooks\n").expect("config");
        std::fs::write(wt_git.join("commondir"), "../..\n").expect("commondir");
        let tree = dir.path().join("wt");
        std::fs::create_dir_all(tree.join("sub")).expect("tree");
        std::fs::write(tree.join(".git"), format!("gitdir: {}\n", wt_git.display()))
            .expect(".git file");
        // The workspace is a subdirectory of the worktree: the hooks lie
        // outside it, so nothing inside is protected.
        assert!(protected(&tree.join("sub")).is_empty());
        assert_eq!(protected(&tree), vec![PathBuf::from("hooks")]);
    }
}
