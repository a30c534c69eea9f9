//! The server's own files, and where the configuration exposes them.
//!
//! Agents work inside workspaces; the database, the data directory (with the
//! API token), the config file and the output files (stdout and stderr when
//! redirected: the log, the token printed at start) must never be reachable by
//! them. [`Config::server_files`] lists them for the session's file guard
//! (`intercom_actors::workspace_fs`), which refuses them wherever they are;
//! [`Config::exposure_warnings`] tells the operator (at `check-config` and
//! `serve`) when the layout puts any of them inside a workspace anyway, so
//! the defence does not rest on one check.

use std::path::{Path, PathBuf};

use intercom_actors::workspace_fs::ServerFiles;

use super::Config;

/// SQLite's companions to a database file.
const DB_SUFFIXES: &[&str] = &["", "-wal", "-shm", "-journal"];

impl Config {
    /// The data directory: the database's directory (the API token lives there).
    pub fn data_dir(&self) -> PathBuf {
        self.database
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// Every file and directory of the server's that agents must never touch.
    pub fn server_files(&self) -> ServerFiles {
        let db = self.database.path.display().to_string();
        let mut files: Vec<PathBuf> = DB_SUFFIXES
            .iter()
            .map(|s| PathBuf::from(format!("{db}{s}")))
            .collect();
        files.extend(self.source.clone());
        files.extend(self.successor.clone());
        let outputs = output_files();
        files.extend(outputs.iter().map(|o| o.path.clone()));
        ServerFiles::new(files, [self.data_dir()]).holding(outputs.iter().map(|o| o.inode))
    }

    /// Warnings about server files that lie inside a workspace.
    pub fn exposure_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let data = canonical(&self.data_dir());
        let config = self.source.as_deref().map(canonical);
        let outputs = output_files();
        for ws in self.workspaces.iter().chain(self.discovered.iter()) {
            let root = canonical(&ws.path);
            if data.starts_with(&root) {
                out.push(format!(
                    "the data directory {} (database and API token) lies inside workspace `{}` ({}); agent file access refuses it, but move [database] path outside every workspace",
                    data.display(),
                    ws.id,
                    root.display()
                ));
            }
            if let Some(cfg) = &config
                && cfg.starts_with(&root)
            {
                out.push(format!(
                    "the config file {} lies inside workspace `{}` ({}); agent file access refuses it, but keep the config outside every workspace",
                    cfg.display(),
                    ws.id,
                    root.display()
                ));
            }
            for file in &outputs {
                if canonical(&file.path).starts_with(&root) {
                    out.push(format!(
                        "the server's output goes to {} inside workspace `{}` ({}); it holds the API token and the console login code printed at start: agent file access refuses it, but send stdout and stderr outside every workspace",
                        file.path.display(),
                        ws.id,
                        root.display()
                    ));
                }
            }
        }
        out
    }
}

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

/// A file the server's stdout or stderr is redirected to.
struct Output {
    /// Its path now (a log rotation may rename it later).
    path: PathBuf,
    /// Its `(device, inode)`: protected whatever it is renamed to.
    inode: (u64, u64),
}

/// The files stdout and stderr are redirected to, when they are regular
/// files: the log, and what `serve` prints once on stdout (the API token and
/// the console's login code). An agent that could read either could act as
/// the operator.
fn output_files() -> Vec<Output> {
    use std::os::unix::fs::MetadataExt;
    [1, 2]
        .into_iter()
        .filter_map(|fd| {
            let link = format!("/proc/self/fd/{fd}");
            // The link's target is the file, whatever its name is now.
            let meta = std::fs::metadata(&link).ok().filter(|m| m.is_file())?;
            Some(Output {
                path: std::fs::read_link(&link).ok()?,
                inode: (meta.dev(), meta.ino()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_or_config_inside_a_workspace_is_warned_about() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(dir.path().join("ws")).expect("ws");
        let config_path = dir.path().join("config.toml");
        let text = r#"
[database]
path = "data/x.db"
[[workspace]]
id = "all"
path = "."
[[workspace]]
id = "sub"
path = "ws"
"#;
        std::fs::write(&config_path, text).expect("write");
        let cfg = Config::load(&config_path).expect("load");
        let warnings = cfg.exposure_warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("data directory") && warnings[0].contains("`all`"));
        assert!(warnings[1].contains("config file") && warnings[1].contains("`all`"));

        let files = cfg.server_files();
        for p in [
            "data/x.db",
            "data/x.db-wal",
            "data/api-token",
            "config.toml",
        ] {
            assert!(files.covers(&dir.path().join(p)), "{p} is not guarded");
        }
        assert!(!files.covers(&dir.path().join("ws/src.rs")));
        // Started on the example, the file a reload waits for is guarded
        // before it exists: an agent must not write the next config.
        let next = dir.path().join("next.toml");
        assert!(!files.covers(&next));
        let waiting = Config {
            successor: Some(next.clone()),
            ..cfg
        };
        assert!(waiting.server_files().covers(&next));
    }

    #[test]
    fn a_layout_with_data_outside_workspaces_is_quiet() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(dir.path().join("ws")).expect("ws");
        let config_path = dir.path().join("config.toml");
        std::fs::write(
            &config_path,
            "[database]\npath = \"data/x.db\"\n[[workspace]]\nid = \"sub\"\npath = \"ws\"\n",
        )
        .expect("write");
        let cfg = Config::load(&config_path).expect("load");
        assert!(cfg.exposure_warnings().is_empty());
    }
}
