//! Loading, resolving and validating `config.toml`.
//!
//! The file format is a public interface; `config.toml.example` in the
//! repository root documents every key. The shapes of the `[[agent]]`,
//! `[[workspace]]`, `[limits]`, `[stall]` and `[supervision]` sections are the
//! core's own types from [`intercom_actors::settings`]; this module adds the
//! server-level sections, resolves every relative path against the config
//! file's directory and validates cross-field rules, naming the exact key of
//! anything it rejects.
//!
//! Slack tokens are never read from the file; they come from the
//! `SLACK_BOT_TOKEN` / `SLACK_APP_TOKEN` environment variables.
//!
//! Besides the configured `[[workspace]]` entries, git repositories under
//! `workspace_root` can be discovered (`[discovery]`, `discover.rs`) on every
//! load; `[[rule]]` entries become the core's approval
//! [`Rule`](intercom_actors::rules::Rule)s (`rules.rs`). [`watch`] reloads the
//! whole file when it changes; [`Config::workspace_map`] is what the
//! WorkspaceRegistry serves.

mod agent_check;
mod confirm;
mod discover;
mod exposure;
mod paths;
mod raw;
mod rules;
mod validate;
pub mod watch;

use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

pub use confirm::CONFIRM_QUIET;
pub use intercom_actors::rules::{ApprovalMode, Rule};
pub use intercom_actors::settings::{
    AgentProfile, Limits, StallPolicy, SupervisionPolicy, WorkspaceEntry,
};
pub use rules::RULE_KINDS;
pub use watch::{Next, WatchError, WatchHandle, watch};

pub(crate) use raw::{RawConfig, RawDiscovery, RawSlack, RawWorkspace};

use intercom_actors::registry::WorkspaceMap;
use intercom_actors::rules::RuleAction;

/// `server.bind` when the file does not set it.
pub const DEFAULT_BIND: &str = "127.0.0.1:3000";
/// `database.path` when the file does not set it (relative to the config file's directory).
pub const DEFAULT_DATABASE_PATH: &str = "data/agent-intercom.db";
/// `discovery.depth` when the file does not set it.
pub const DEFAULT_DISCOVERY_DEPTH: usize = 2;
/// Largest accepted `discovery.depth`.
pub const MAX_DISCOVERY_DEPTH: usize = 8;
/// Discovery stops after this many repositories (with a warning).
pub const MAX_DISCOVERED: usize = 500;

/// A loaded, resolved and validated configuration.
///
/// Every path is absolute. `workspace_root` and workspace paths are canonical
/// as far as they exist (symlinks and `..` resolved). Agent commands that
/// contain a path separator but are relative (`./target/debug/x`) have been
/// made absolute against the config file's directory; bare names (`npx`) are
/// left for a `PATH` lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Agents may only run in directories under this one.
    pub workspace_root: PathBuf,
    /// `[server]`.
    pub server: ServerSection,
    /// `[database]`.
    pub database: DatabaseSection,
    /// `[slack]`.
    pub slack: SlackSection,
    /// `[mcp]`.
    pub mcp: McpSection,
    /// `[[agent]]` profiles, in file order.
    pub agents: Vec<AgentProfile>,
    /// `[[workspace]]` entries, in file order, paths absolute.
    pub workspaces: Vec<WorkspaceEntry>,
    /// `[[workspace]] approval_mode` of every configured workspace (`ask`
    /// when the entry does not set it). Discovered workspaces are not here:
    /// use [`Config::approval_mode_for`], which defaults to `ask`.
    pub workspace_modes: BTreeMap<String, ApprovalMode>,
    /// `[discovery]`.
    pub discovery: DiscoverySection,
    /// Git repositories found under `workspace_root` at load time (empty when
    /// discovery is off), sorted by id; none shares an id or a path with a
    /// configured workspace.
    pub discovered: Vec<WorkspaceEntry>,
    /// `[[rule]]` entries as approval rules, in file order (scope global or
    /// workspace, ids `cfg-<index>` unless set).
    pub rules: Vec<Rule>,
    /// `[limits]`.
    pub limits: Limits,
    /// `[stall]`.
    pub stall: StallPolicy,
    /// `[supervision]`.
    pub supervision: SupervisionPolicy,
    /// The effective default agent id: the top-level `default_agent`, else the
    /// first `[[agent]]`; `None` only when no agents are configured.
    pub default_agent: Option<String>,
    /// The file this was loaded from (absolute), if any.
    pub source: Option<PathBuf>,
    /// The file a reload reads instead of `source`: `config.toml` beside
    /// the shipped example a server started on for want of it, so that
    /// creating it takes effect like saving it (a probe's new deny rule
    /// was never read). Guarded from agents like `source`.
    pub successor: Option<PathBuf>,
}

/// `[server]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSection {
    /// Address the operator HTTP API listens on.
    pub bind: SocketAddr,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 3000)),
        }
    }
}

/// `[database]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseSection {
    /// SQLite file (absolute).
    pub path: PathBuf,
}

/// `[discovery]`: git repositories under `workspace_root` as workspaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoverySection {
    /// Whether discovery runs (on every load). Default: off.
    pub enabled: bool,
    /// How many directory levels below `workspace_root` are searched
    /// (1 = its direct children). Default: [`DEFAULT_DISCOVERY_DEPTH`].
    pub depth: usize,
}

impl Default for DiscoverySection {
    fn default() -> Self {
        DiscoverySection {
            enabled: false,
            depth: DEFAULT_DISCOVERY_DEPTH,
        }
    }
}

/// `[mcp]`: the MCP endpoint IDE agents connect to (`/mcp`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpSection {
    /// How long `check_clearance` blocks before answering `timeout`.
    pub approval_timeout_secs: u64,
    /// How long `transmit` blocks before auto-continuing.
    pub transmit_timeout_secs: u64,
    /// Host names (`name` or `name:port`) accepted besides loopback.
    pub allowed_hosts: Vec<String>,
    /// Workspace id -> name of the environment variable holding that
    /// workspace's MCP token (for clients that should not get the operator
    /// API token; they are confined to the workspace).
    pub workspace_token_env: BTreeMap<String, String>,
}

impl Default for McpSection {
    fn default() -> Self {
        McpSection {
            approval_timeout_secs: 300,
            transmit_timeout_secs: 300,
            allowed_hosts: Vec::new(),
            workspace_token_env: BTreeMap::new(),
        }
    }
}

/// `[slack]`. Tokens are not here: they come from the environment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlackSection {
    /// Override of the Slack Web API base URL (e.g. an emulator); always ends in `/`.
    pub api_url: Option<String>,
    /// Slack user ids allowed to act on any session.
    pub operators: Vec<String>,
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error(
        "cannot read config file {}: {source}; {}",
        path.display(),
        io_hint(path, source)
    )]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A reload found the file empty (only blanks and comments): a save in
    /// progress, or a file emptied by mistake. Loaded, it would drop every
    /// workspace and rule, so the running configuration is kept.
    #[error(
        "config file {} is empty (being saved, or emptied); keeping the previous configuration, which an empty file would replace with no workspaces and no rules",
        path.display()
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A reload would remove every agent, workspace or rule at once: a
    /// file caught being written (cut after its first lines) looks like
    /// that, and loaded it would drop the deny rules with the rest.
    #[error(
        "config file {} now declares no {what} while the running configuration has {had}; keeping the previous configuration (a file caught being written?). To run without any, restart the server",
        path.display()
    )]
    Emptied {
        /// The file.
        path: PathBuf,
        /// What it lost (`[[agent]]`, workspaces).
        what: &'static str,
        /// How many the running configuration has.
        had: usize,
    },
    /// A reload declares no `[[rule]]` while the running configuration has
    /// deny or ask rules. The rest of the file is applied and the running
    /// allow rules are dropped (the operator may have deleted the last one:
    /// it must stop allowing), but those deny and ask rules are kept: a
    /// file cut while being written loses its rules, and would then allow
    /// what they forbade. The server reports itself stale until the file
    /// declares a rule again or it restarts.
    #[error(
        "config file {} declares no [[rule]]: its other changes are applied and the previous allow rules dropped, but the previous {kept} deny/ask rule(s) are kept (a file cut while being written looks like this, and would drop them). To run without them, restart the server, or keep one rule that matches nothing (a deny rule for a command that does not exist)",
        path.display()
    )]
    RulesKept {
        /// The file.
        path: PathBuf,
        /// How many deny and ask rules were kept.
        kept: usize,
    },
    /// The file is not valid TOML or does not match the schema (unknown key,
    /// wrong type). `message` is toml's, with line, column and the offending key.
    #[error("{}", ParseDisplay { path: path.as_deref(), message })]
    Parse {
        /// The file, when parsing one (None for [`Config::from_toml_str`]).
        path: Option<PathBuf>,
        /// toml's message.
        message: String,
    },
    /// A value is well-formed but not acceptable.
    #[error("config error at `{key}`: {reason}")]
    Invalid {
        /// The key path, e.g. `workspace[1].id`.
        key: String,
        /// Why.
        reason: String,
    },
    /// A valid config the running server could not apply (it is
    /// stopping): the previous one stays in force.
    #[error("{0}")]
    NotApplied(String),
}

impl ConfigError {
    /// The offending key path for [`ConfigError::Invalid`].
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }

    pub(crate) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

struct ParseDisplay<'a> {
    path: Option<&'a Path>,
    message: &'a str,
}

impl fmt::Display for ParseDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path {
            Some(path) => write!(
                f,
                "cannot parse config file {}: {}",
                path.display(),
                self.message
            ),
            None => write!(f, "cannot parse config: {}", self.message),
        }
    }
}

/// The largest config file read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads the config file: a regular file of at most [`MAX_CONFIG_BYTES`].
/// Opened non-blocking, so a FIFO swapped in for it cannot hang the reload
/// thread, and read with a bound, so `/dev/zero` or a huge file cannot
/// exhaust memory.
fn read_text(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other(
            "not a regular file (a FIFO, a device or a directory); point --config at a regular file",
        ));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(std::io::Error::other(format!(
            "{} bytes, over the {MAX_CONFIG_BYTES}-byte limit for a config file",
            meta.len()
        )));
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(std::io::Error::other(format!(
            "over the {MAX_CONFIG_BYTES}-byte limit for a config file"
        )));
    }
    Ok(text)
}

impl Config {
    /// This config as a reload over `running` applies it. Refused when it
    /// would leave no agent or no workspace where `running` has some
    /// ([`ConfigError::Emptied`]). Declaring no rule where `running` has
    /// deny or ask rules keeps those, and says so
    /// ([`ConfigError::RulesKept`]: applied, but stale); dropping only
    /// allow rules is an ordinary edit.
    pub fn reload_over(
        mut self,
        running: &Config,
    ) -> Result<(Config, Option<ConfigError>), ConfigError> {
        let path = self.source.clone().unwrap_or_default();
        for ((what, now), (_, had)) in self.counts().into_iter().zip(running.counts()) {
            if now == 0 && had > 0 {
                return Err(ConfigError::Emptied { path, what, had });
            }
        }
        if !self.rules.is_empty() {
            return Ok((self, None));
        }
        let guarding: Vec<Rule> = running
            .rules
            .iter()
            .filter(|r| r.action != RuleAction::Allow)
            .cloned()
            .collect();
        if guarding.is_empty() {
            return Ok((self, None));
        }
        let kept = guarding.len();
        self.rules = guarding;
        Ok((self, Some(ConfigError::RulesKept { path, kept })))
    }

    /// The workspace and agent ids `old` has and this config no longer
    /// does (what a reload removes; live sessions using them are told).
    pub fn removed_from(&self, old: &Config) -> (Vec<String>, Vec<String>) {
        let workspaces = old
            .workspaces
            .iter()
            .chain(&old.discovered)
            .filter(|w| self.workspace(&w.id).is_none())
            .map(|w| w.id.clone())
            .collect();
        let agents = old
            .agents
            .iter()
            .filter(|a| self.agent(&a.id).is_none())
            .map(|a| a.id.clone())
            .collect();
        (workspaces, agents)
    }

    /// What this config has none of, among what a reload may not empty
    /// ([`Config::reload_over`]: agents, workspaces).
    pub fn declares_none(&self) -> Vec<&'static str> {
        self.counts()
            .into_iter()
            .filter(|(_, n)| *n == 0)
            .map(|(what, _)| what)
            .collect()
    }

    /// How many agents and workspaces (declared and discovered).
    fn counts(&self) -> [(&'static str, usize); 2] {
        [
            ("[[agent]]", self.agents.len()),
            ("workspaces", self.workspaces.len() + self.discovered.len()),
        ]
    }
}

/// What to do about a config file that cannot be read, by why.
fn io_hint(path: &Path, e: &std::io::Error) -> String {
    // A link whose file is gone (a symlinked config mid-swap, say): the
    // file to look for is the link's target, not the link.
    if e.kind() == std::io::ErrorKind::NotFound
        && let Ok(target) = std::fs::read_link(path)
    {
        return format!(
            "it is a symbolic link to {}, which does not exist: restore that file or point the link at one",
            target.display()
        );
    }
    match e.kind() {
        std::io::ErrorKind::NotFound => {
            "create one (config.toml.example in the repository has every setting, commented), or name another with --config"
        }
        std::io::ErrorKind::PermissionDenied => {
            "make it readable by the user the server runs as (and its directory searchable)"
        }
        _ => "check that the path names a readable file",
    }
    .to_owned()
}

impl Config {
    /// Reads, parses, resolves and validates the file at `path`. Relative
    /// paths inside it resolve against the file's directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = read_text(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::load_text(path, &text)
    }

    /// [`Config::load`] for a hot reload: an empty file (only blanks and
    /// comments) is refused ([`ConfigError::Empty`]), since it would remove
    /// every workspace and rule while the server runs.
    pub fn reload(path: &Path) -> Result<Config, ConfigError> {
        let text = read_text(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        // A byte order mark alone is empty too (a probe's BOM-only file
        // loaded as a config with nothing in it).
        let blank = text
            .trim_start_matches('\u{feff}')
            .lines()
            .map(str::trim)
            .all(|l| l.is_empty() || l.starts_with('#'));
        if blank {
            return Err(ConfigError::Empty {
                path: path.to_path_buf(),
            });
        }
        Self::load_text(path, &text)
    }

    fn load_text(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let source = paths::absolutize(path);
        Self::parse(text, &dir_of(&source), Some(&source))
    }

    /// Whether the file at `path` sets `[server] bind` (else the default
    /// address is used), read as for [`Config::bind_and_database`].
    pub fn sets_bind(path: &Path) -> bool {
        read_text(path)
            .ok()
            .and_then(|text| toml::from_str::<toml::Table>(&text).ok())
            .is_some_and(|table| table.get("server").and_then(|s| s.get("bind")).is_some())
    }

    /// `[server] bind` and `[database] path` of a config file that does not
    /// load (a rule with a bad regex, an unknown key), resolved as a load
    /// would resolve them, each defaulted when absent or unreadable; `None`
    /// when the file cannot be read or is not TOML at all. For `ctl`: a bad
    /// edit must not lock the operator out while the server runs on.
    pub fn bind_and_database(path: &Path) -> Option<(SocketAddr, PathBuf)> {
        let table: toml::Table = toml::from_str(&read_text(path).ok()?).ok()?;
        let base = paths::canonicalish(&dir_of(&paths::absolutize(path)));
        let defaults = Config::default_for_dir(&base);
        let text_at = |section: &str, key: &str| {
            table
                .get(section)
                .and_then(|s| s.get(key))
                .and_then(toml::Value::as_str)
                .map(str::to_owned)
        };
        let bind = text_at("server", "bind")
            .and_then(|b| validate::server(&b).ok())
            .map_or(defaults.server.bind, |s| s.bind);
        let database = text_at("database", "path")
            .and_then(|p| validate::database(Path::new(&p), &base).ok())
            .map_or(defaults.database.path, |d| d.path);
        Some((bind, database))
    }

    /// Parses, resolves and validates `text` as if it were a config file in
    /// `base_dir`. The result has `source: None`.
    pub fn from_toml_str(text: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        Self::parse(text, base_dir, None)
    }

    fn parse(text: &str, base_dir: &Path, source: Option<&Path>) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: source.map(Path::to_path_buf),
            message: parse_message(&e),
        })?;
        let base = paths::canonicalish(&paths::absolutize(base_dir));
        let mut config = validate::build(raw, &base)?;
        config.source = source.map(Path::to_path_buf);
        Ok(config)
    }

    /// A valid configuration for `dir` with every default and no agents or
    /// workspaces: `workspace_root` is `dir`, the database is
    /// `dir/data/agent-intercom.db`.
    pub fn default_for_dir(dir: &Path) -> Config {
        let base = paths::canonicalish(&paths::absolutize(dir));
        Config {
            database: DatabaseSection {
                path: paths::join_normalized(&base, Path::new(DEFAULT_DATABASE_PATH)),
            },
            workspace_root: base,
            server: ServerSection::default(),
            slack: SlackSection::default(),
            mcp: McpSection::default(),
            agents: Vec::new(),
            workspaces: Vec::new(),
            workspace_modes: BTreeMap::new(),
            discovery: DiscoverySection::default(),
            discovered: Vec::new(),
            rules: Vec::new(),
            limits: Limits::default(),
            stall: StallPolicy::default(),
            supervision: SupervisionPolicy::default(),
            default_agent: None,
            source: None,
            successor: None,
        }
    }

    /// The agent profile with this id.
    pub fn agent(&self, id: &str) -> Option<&AgentProfile> {
        self.agents.iter().find(|a| a.id == id)
    }

    /// The workspace with this id: a configured one, else a discovered one.
    pub fn workspace(&self, id: &str) -> Option<&WorkspaceEntry> {
        self.workspaces
            .iter()
            .chain(&self.discovered)
            .find(|w| w.id == id)
    }

    /// The approval mode sessions in workspace `id` start with: the
    /// workspace's `approval_mode`, `ask` for discovered or unknown ids.
    pub fn approval_mode_for(&self, id: &str) -> ApprovalMode {
        self.workspace_modes.get(id).copied().unwrap_or_default()
    }

    /// The routing data for the WorkspaceRegistry: configured workspaces (in
    /// file order) followed by discovered repositories.
    pub fn workspace_map(&self) -> WorkspaceMap {
        WorkspaceMap {
            workspace_root: self.workspace_root.clone(),
            workspaces: self
                .workspaces
                .iter()
                .chain(&self.discovered)
                .cloned()
                .collect(),
            agents: self.agents.clone(),
            default_agent: self.default_agent.clone(),
        }
    }

    /// The workspace bound to this (non-empty) Slack channel.
    pub fn workspace_by_channel(&self, channel_id: &str) -> Option<&WorkspaceEntry> {
        if channel_id.is_empty() {
            return None;
        }
        self.workspaces.iter().find(|w| w.channel_id == channel_id)
    }

    /// The agent a start request that names none should use: the workspace's
    /// `default_agent`, else the top-level default (itself defaulting to the
    /// first `[[agent]]`).
    pub fn default_agent_for(&self, ws: Option<&WorkspaceEntry>) -> Option<&AgentProfile> {
        let id = ws
            .and_then(|w| w.default_agent.as_deref())
            .or(self.default_agent.as_deref())?;
        self.agent(id)
    }

    /// Whether `path` (relative paths resolve against `workspace_root`) lies
    /// inside `workspace_root` (or is it), after canonicalising both: `..` and
    /// symlinks are resolved for the parts that exist.
    pub fn is_under_root(&self, path: &Path) -> bool {
        let root = paths::canonicalish(&self.workspace_root);
        let candidate = paths::canonicalish(&paths::join_normalized(&self.workspace_root, path));
        candidate.starts_with(&root)
    }

    /// `path` resolved against `workspace_root` and canonicalised as far as it
    /// exists (for a `path` session before checking [`Config::is_under_root`]).
    pub fn resolve_under_root(&self, path: &Path) -> PathBuf {
        paths::canonicalish(&paths::join_normalized(&self.workspace_root, path))
    }

    /// A one-paragraph human summary, as printed by `check-config`.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "config OK: {}, {}, database {}, bind {}",
            plural(self.agents.len(), "agent"),
            plural(self.workspaces.len(), "workspace"),
            self.database.path.display(),
            self.server.bind,
        );
        s.push_str(&format!(
            "; workspace root {}",
            self.workspace_root.display()
        ));
        match &self.default_agent {
            Some(id) => s.push_str(&format!("; default agent \"{id}\"")),
            None => s.push_str("; no agents, so only IDE (MCP) sessions are possible"),
        }
        let channels = self
            .workspaces
            .iter()
            .filter(|w| !w.channel_id.is_empty())
            .count();
        s.push_str(&format!(
            "; {} bound to Slack channels, {}",
            plural(channels, "workspace"),
            plural(self.slack.operators.len(), "Slack operator"),
        ));
        if let Some(url) = &self.slack.api_url {
            s.push_str(&format!(", Slack API {url}"));
        }
        if self.discovery.enabled {
            let n = self.discovered.len();
            s.push_str(&format!(
                "; discovery (depth {}) found {n} git {}",
                self.discovery.depth,
                if n == 1 { "repository" } else { "repositories" },
            ));
        }
        s.push_str(&format!("; {}", plural(self.rules.len(), "approval rule")));
        if let Some(src) = &self.source {
            s.push_str(&format!(" (from {})", src.display()));
        }
        s
    }
}

fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// toml's message, plus a hint for the classic mistake of putting a top-level
/// key after a `[table]` header.
fn parse_message(e: &toml::de::Error) -> String {
    let mut message = e.to_string().trim_end().to_owned();
    const TOP_LEVEL: [&str; 2] = [
        "unknown field `default_agent`",
        "unknown field `workspace_root`",
    ];
    if TOP_LEVEL.iter().any(|needle| message.contains(needle)) {
        message.push_str(
            "\nhint: top-level keys (workspace_root, default_agent) must come before the first [section] header",
        );
    }
    message
}

/// Loads and validates the file at `path` and returns the summary printed by
/// the `check-config` subcommand.
pub fn check_config(path: &Path) -> Result<String, ConfigError> {
    Config::load(path).map(|c| {
        let mut out = c.summary();
        // `serve` starts on an empty file (every default), but a running
        // server refuses to reload one: say so, or the two would disagree.
        if matches!(Config::reload(path), Err(ConfigError::Empty { .. })) {
            out.push_str(
                "\nwarning: the file is empty: `serve` starts on it with every default (no \
                 workspaces, no rules), but a running server refuses to reload an emptied file \
                 and keeps its previous configuration",
            );
        } else {
            let none = c.declares_none();
            if !none.is_empty() {
                out.push_str(&format!(
                    "\nnote: the file declares no {}: `serve` starts on it, but a running server \
                     that has some refuses to reload it (a file cut while being written looks \
                     like that) and keeps its previous configuration; restart the server to run \
                     without them",
                    none.join(" and no ")
                ));
            }
            if c.rules.is_empty() {
                out.push_str(
                    "\nnote: the file declares no [[rule]]: `serve` starts on it; a running server \
                     that has rules reloads it and drops its allow rules, but keeps its deny and \
                     ask rules (a file cut while being written looks like that) and reports \
                     itself stale; restart the server to drop those too",
                );
            }
        }
        for w in c.warnings() {
            out.push_str(&format!("\nwarning: {w}"));
        }
        out
    })
}

/// The directory a config file's relative paths start from.
fn dir_of(source: &Path) -> PathBuf {
    source
        .parent()
        .map_or_else(|| PathBuf::from("/"), Path::to_path_buf)
}

impl Config {
    /// What would fail later although the file is valid (agent commands
    /// that cannot be found), one sentence each.
    /// Also: server files that lie inside a workspace.
    pub fn warnings(&self) -> Vec<String> {
        let mut all = agent_check::agent_command_warnings(&self.agents);
        all.extend(self.workspace_warnings());
        all.extend(self.exposure_warnings());
        all.extend(self.bind_warning());
        all.extend(self.database_dir_warning());
        all
    }

    /// A file where the database's directory (or one above it) should be:
    /// `serve` cannot create the directory and stops; `check-config` said
    /// "config OK".
    fn database_dir_warning(&self) -> Option<String> {
        let dir = self.database.path.parent()?;
        let blocker = dir.ancestors().find(|a| a.exists())?;
        (!blocker.is_dir()).then(|| format!(
            "[database] path {}: {} is a file where a directory should be; the server cannot start until it is moved away or [database] path points elsewhere",
            self.database.path.display(),
            blocker.display()
        ))
    }

    /// An API reachable from other machines: said by `check-config` too,
    /// not only in the log of a server already listening there.
    fn bind_warning(&self) -> Option<String> {
        (!self.server.bind.ip().is_loopback()).then(|| format!(
            "[server] bind {} is not a loopback address: the operator API, the console and /mcp are reachable from other machines over plain HTTP (the token travels unencrypted); bind 127.0.0.1 unless an authenticating TLS proxy is in front",
            self.server.bind
        ))
    }

    /// Workspaces whose directory does not exist (yet): sessions there fail
    /// to start until it is created or `path` is fixed. Workspaces sharing
    /// a directory: a session started by path there goes to the first (a
    /// block pasted with its id changed and its path forgotten would
    /// otherwise run that directory under the copy's approval mode).
    fn workspace_warnings(&self) -> Vec<String> {
        let missing = self.workspaces.iter().filter(|w| !w.path.is_dir()).map(|w| {
            format!(
                "workspace `{}`: directory {} does not exist; sessions there fail to start until it is created or its `path` is fixed",
                w.id,
                w.path.display()
            )
        });
        let shared = self.workspaces.iter().enumerate().filter_map(|(i, w)| {
            let first = self.workspaces[..i].iter().find(|o| o.path == w.path)?;
            Some(format!(
                "workspace `{}`: directory {} is also workspace `{}`'s; a session started by path there is in `{}` (with its rules and approval mode); give each workspace a directory of its own",
                w.id,
                w.path.display(),
                first.id,
                first.id
            ))
        });
        missing.chain(shared).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_where_the_database_directory_should_be_is_warned_of() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("data"), "a file").expect("file");
        let cfg = Config::from_toml_str("[database]\npath = \"data/x.db\"\n", dir.path())
            .expect("config");
        let warnings = cfg.warnings();
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("is a file where a directory should be")),
            "{warnings:?}"
        );
        std::fs::remove_file(dir.path().join("data")).expect("rm");
        assert!(cfg.database_dir_warning().is_none());
    }

    #[test]
    fn a_bind_other_machines_reach_is_warned_of() {
        let dir = tempfile::tempdir().expect("tmp");
        let wide = Config::from_toml_str("[server]\nbind = \"0.0.0.0:3000\"\n", dir.path())
            .expect("config");
        let warnings = wide.warnings();
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("bind 0.0.0.0:3000 is not a loopback address")),
            "{warnings:?}"
        );
        let local = Config::from_toml_str("[server]\nbind = \"127.0.0.1:3000\"\n", dir.path())
            .expect("config");
        assert!(local.bind_warning().is_none());
    }

    #[test]
    fn default_for_dir_is_what_an_empty_file_gives() {
        let dir = tempfile::tempdir().unwrap();
        let from_empty = Config::from_toml_str("", dir.path()).unwrap();
        assert_eq!(from_empty, Config::default_for_dir(dir.path()));
    }

    #[test]
    fn default_bind_constant_matches_default_section() {
        assert_eq!(
            DEFAULT_BIND.parse::<SocketAddr>().unwrap(),
            ServerSection::default().bind
        );
    }

    #[test]
    fn default_agent_for_prefers_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config::from_toml_str(
            r#"
            [[agent]]
            id = "a"
            command = "a"
            [[agent]]
            id = "b"
            command = "b"
            [[workspace]]
            id = "w1"
            path = "."
            default_agent = "b"
            [[workspace]]
            id = "w2"
            path = "."
            channel_id = "C1"
            "#,
            dir.path(),
        )
        .unwrap();
        assert_eq!(cfg.default_agent.as_deref(), Some("a"));
        assert_eq!(cfg.default_agent_for(cfg.workspace("w1")).unwrap().id, "b");
        assert_eq!(cfg.default_agent_for(cfg.workspace("w2")).unwrap().id, "a");
        assert_eq!(cfg.default_agent_for(None).unwrap().id, "a");
        assert_eq!(cfg.workspace_by_channel("C1").unwrap().id, "w2");
        assert!(cfg.workspace_by_channel("").is_none());
    }

    #[test]
    fn top_level_key_after_a_table_gets_a_hint() {
        let err = Config::from_toml_str("[supervision]\ndefault_agent = \"x\"\n", Path::new("/"))
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("must come before the first [section]"),
            "{err}"
        );
    }
}
