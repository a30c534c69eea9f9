//! Turning a [`RawConfig`] into a [`Config`]: path resolution and every
//! cross-field rule. The first problem found is returned; the order is fixed
//! (server, paths, slack, agents, default agent, workspaces, discovery, rules,
//! limits, stall, supervision; file order within each) so the same file
//! always yields the same error. Discovery (when enabled) walks
//! `workspace_root` here, so it runs again on every load.

use super::paths::{canonicalish, join_normalized};
use super::{
    AgentProfile, ApprovalMode, Config, ConfigError, DatabaseSection, DiscoverySection,
    MAX_DISCOVERED, MAX_DISCOVERY_DEPTH, RawConfig, RawDiscovery, RawSlack, RawWorkspace,
    ServerSection, SlackSection, WorkspaceEntry, discover,
};
use intercom_actors::model::Protocol;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

type Result<T> = std::result::Result<T, ConfigError>;

/// Slack secrets the server holds; never passed through to agent processes.
const SERVER_SECRETS: [&str; 2] = ["SLACK_BOT_TOKEN", "SLACK_APP_TOKEN"];

/// Minimum for `limits.max_line_bytes`.
const MIN_LINE_BYTES: usize = 1024;

pub(super) fn build(raw: RawConfig, base: &Path) -> Result<Config> {
    let server = server(&raw.server.bind)?;
    let workspace_root = workspace_root(raw.workspace_root.as_deref(), base)?;
    let database = database(&raw.database.path, base)?;
    let slack = slack(raw.slack)?;
    let agents = agents(raw.agents, base)?;
    let default_agent = default_agent(raw.default_agent, &agents)?;
    let (workspaces, workspace_modes) = workspaces(raw.workspaces, base, &workspace_root, &agents)?;
    let discovery = discovery_section(&raw.discovery)?;
    let discovered = if discovery.enabled {
        discovered(&workspace_root, discovery.depth, &workspaces)
    } else {
        Vec::new()
    };
    let workspace_ids: Vec<&str> = workspaces
        .iter()
        .chain(&discovered)
        .map(|w| w.id.as_str())
        .collect();
    let rules = super::rules::rules(raw.rules, &workspace_ids, &agents)?;
    if raw.mcp.approval_timeout_secs == 0 {
        return Err(ConfigError::Invalid {
            key: "mcp.approval_timeout_secs".into(),
            reason: "must be at least 1 second".into(),
        });
    }
    if raw.mcp.transmit_timeout_secs == 0 {
        return Err(ConfigError::Invalid {
            key: "mcp.transmit_timeout_secs".into(),
            reason: "must be at least 1 second".into(),
        });
    }
    for (ws, var) in &raw.mcp.workspace_token_env {
        if !workspace_ids.contains(&ws.as_str()) {
            return Err(ConfigError::invalid(
                format!("mcp.workspace_token_env.{ws}"),
                "names no configured or discovered workspace",
            ));
        }
        if var.trim().is_empty() {
            return Err(ConfigError::invalid(
                format!("mcp.workspace_token_env.{ws}"),
                "must name an environment variable",
            ));
        }
    }
    secrets_stay_with_the_server(&agents, &raw.mcp.workspace_token_env)?;
    limits(&raw.limits)?;
    stall(&raw.stall)?;
    supervision(&raw.supervision)?;
    durations(&raw.limits, &raw.stall, &raw.supervision, &raw.mcp)?;
    Ok(Config {
        workspace_root,
        server,
        database,
        slack,
        mcp: raw.mcp,
        agents,
        workspaces,
        workspace_modes,
        discovery,
        discovered,
        rules,
        limits: raw.limits,
        stall: raw.stall,
        supervision: raw.supervision,
        default_agent,
        source: None,
        successor: None,
    })
}

/// The operator's API token and the MCP workspace tokens are the server's
/// secrets as much as Slack's: an agent holding one could approve its own
/// requests. A probe's profile passed both through `env`, and `check-config`
/// took it.
fn secrets_stay_with_the_server(
    agents: &[AgentProfile],
    mcp_tokens: &BTreeMap<String, String>,
) -> Result<()> {
    for (i, agent) in agents.iter().enumerate() {
        for (k, name) in agent.env.iter().enumerate() {
            let what = if name == crate::http::auth::TOKEN_ENV {
                "the operator's API token"
            } else if mcp_tokens.values().any(|v| v.trim() == name) {
                "an MCP workspace token (mcp.workspace_token_env)"
            } else {
                continue;
            };
            return Err(ConfigError::invalid(
                format!("agent[{i}].env[{k}]"),
                format!(
                    "{name} holds {what}; an agent holding it could approve its own requests, so it is never passed to agents: remove it from `env`"
                ),
            ));
        }
    }
    Ok(())
}

pub(super) fn server(bind: &str) -> Result<ServerSection> {
    let bind: SocketAddr = bind.trim().parse().map_err(|e| {
        ConfigError::invalid(
            "server.bind",
            format!("{bind:?} is not a socket address like \"127.0.0.1:3000\" ({e})"),
        )
    })?;
    Ok(ServerSection { bind })
}

fn workspace_root(root: Option<&Path>, base: &Path) -> Result<PathBuf> {
    let Some(root) = root else {
        return Ok(base.to_path_buf());
    };
    if root.as_os_str().is_empty() {
        return Err(ConfigError::invalid(
            "workspace_root",
            "must not be empty (omit it to use the config file's directory)",
        ));
    }
    let resolved = canonicalish(&join_normalized(base, root));
    if resolved.exists() && !resolved.is_dir() {
        return Err(ConfigError::invalid(
            "workspace_root",
            format!("{} is not a directory", resolved.display()),
        ));
    }
    if !resolved.exists() {
        tracing::warn!(path = %resolved.display(), "workspace_root does not exist (yet)");
    }
    Ok(resolved)
}

pub(super) fn database(path: &Path, base: &Path) -> Result<DatabaseSection> {
    if path.as_os_str().is_empty() {
        return Err(ConfigError::invalid("database.path", "must not be empty"));
    }
    let resolved = canonicalish(&join_normalized(base, path));
    if resolved.is_dir() {
        return Err(ConfigError::invalid(
            "database.path",
            format!(
                "{} is a directory; name the database file",
                resolved.display()
            ),
        ));
    }
    Ok(DatabaseSection { path: resolved })
}

fn slack(raw: RawSlack) -> Result<SlackSection> {
    for (key, var) in [
        (
            "slack.bot_token",
            raw.bot_token.is_some().then_some("SLACK_BOT_TOKEN"),
        ),
        (
            "slack.app_token",
            raw.app_token.is_some().then_some("SLACK_APP_TOKEN"),
        ),
    ] {
        if let Some(var) = var {
            return Err(ConfigError::invalid(
                key,
                format!(
                    "Slack tokens are never read from the config file; remove it and set the {var} environment variable"
                ),
            ));
        }
    }
    let api_url = match raw.api_url {
        None => None,
        Some(url) => {
            let url = url.trim().to_owned();
            if !(url.starts_with("https://") || url.starts_with("http://"))
                || url.len() <= "https://".len()
            {
                return Err(ConfigError::invalid(
                    "slack.api_url",
                    format!("{url:?} is not an http(s) URL like \"https://slack.com/api/\""),
                ));
            }
            Some(if url.ends_with('/') {
                url
            } else {
                format!("{url}/")
            })
        }
    };
    for (i, op) in raw.operators.iter().enumerate() {
        if op.trim().is_empty() {
            return Err(ConfigError::invalid(
                format!("slack.operators[{i}]"),
                "must be a Slack user id like \"U0123ABCD\", not empty",
            ));
        }
        if op.trim() != op {
            return Err(ConfigError::invalid(
                format!("slack.operators[{i}]"),
                format!("{op:?} has surrounding whitespace"),
            ));
        }
    }
    Ok(SlackSection {
        api_url,
        operators: raw.operators,
    })
}

fn agents(mut agents: Vec<AgentProfile>, base: &Path) -> Result<Vec<AgentProfile>> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, agent) in agents.iter_mut().enumerate() {
        let key = |field: &str| format!("agent[{i}].{field}");
        check_id(&agent.id, &key("id"))?;
        if let Some(first) = seen.insert(agent.id.clone(), i) {
            return Err(ConfigError::invalid(
                key("id"),
                format!(
                    "duplicate agent id {:?} (also used by agent[{first}])",
                    agent.id
                ),
            ));
        }
        if agent.command.trim().is_empty() {
            return Err(ConfigError::invalid(key("command"), "must not be empty"));
        }
        if agent.protocol == Protocol::Mcp {
            return Err(ConfigError::invalid(
                key("protocol"),
                "\"mcp\" is for IDE agents that connect to the server; an [[agent]] profile starts a process and must use \"acp\" or \"intercom\"",
            ));
        }
        for (k, name) in agent.env.iter().enumerate() {
            if !is_env_var_name(name) {
                return Err(ConfigError::invalid(
                    format!("agent[{i}].env[{k}]"),
                    format!(
                        "{name:?} is not an environment variable name (letters, digits and _, not starting with a digit)"
                    ),
                ));
            }
            if SERVER_SECRETS.contains(&name.as_str()) {
                return Err(ConfigError::invalid(
                    format!("agent[{i}].env[{k}]"),
                    format!("{name} is the server's Slack secret and is never passed to agents"),
                ));
            }
        }
        if agent
            .auth_method
            .as_deref()
            .is_some_and(|m| m.trim().is_empty())
        {
            return Err(ConfigError::invalid(
                key("auth_method"),
                "must not be empty (omit it to let the agent choose)",
            ));
        }
        agent.command = resolve_command(&agent.command, base);
    }
    Ok(agents)
}

/// A command with a path separator that is relative (`./bin/agent`) is made
/// absolute against the config file's directory, so it does not depend on the
/// server's or the session's working directory. Bare names stay for `PATH`.
fn resolve_command(command: &str, base: &Path) -> String {
    let has_separator = command.contains('/') || (cfg!(windows) && command.contains('\\'));
    let path = Path::new(command);
    if !has_separator || path.is_absolute() {
        return command.to_owned();
    }
    // One that does not exist is warned of once, with its profile's name
    // (`agent_check`), by every load.
    join_normalized(base, path)
        .to_str()
        .map_or_else(|| command.to_owned(), str::to_owned)
}

fn default_agent(explicit: Option<String>, agents: &[AgentProfile]) -> Result<Option<String>> {
    match explicit {
        None => Ok(agents.first().map(|a| a.id.clone())),
        Some(id) => {
            if agents.iter().any(|a| a.id == id) {
                Ok(Some(id))
            } else {
                Err(ConfigError::invalid(
                    "default_agent",
                    unknown_agent(&id, agents),
                ))
            }
        }
    }
}

type Workspaces = (Vec<WorkspaceEntry>, BTreeMap<String, ApprovalMode>);

fn workspaces(
    raw: Vec<RawWorkspace>,
    base: &Path,
    root: &Path,
    agents: &[AgentProfile],
) -> Result<Workspaces> {
    let mut ids: HashMap<String, usize> = HashMap::new();
    let mut channels: HashMap<String, usize> = HashMap::new();
    let mut modes = BTreeMap::new();
    let mut workspaces = Vec::with_capacity(raw.len());
    for (i, raw) in raw.into_iter().enumerate() {
        let key = |field: &str| format!("workspace[{i}].{field}");
        let mut ws = WorkspaceEntry {
            id: raw.id,
            path: raw.path,
            channel_id: raw.channel_id,
            label: raw.label,
            default_agent: raw.default_agent,
        };
        check_id(&ws.id, &key("id"))?;
        if let Some(first) = ids.insert(ws.id.clone(), i) {
            return Err(ConfigError::invalid(
                key("id"),
                format!(
                    "duplicate workspace id {:?} (also used by workspace[{first}])",
                    ws.id
                ),
            ));
        }
        check_channel(&ws.channel_id, i, &mut channels, &key("channel_id"))?;
        if ws.path.as_os_str().is_empty() {
            return Err(ConfigError::invalid(key("path"), "must not be empty"));
        }
        let resolved = canonicalish(&join_normalized(base, &ws.path));
        if !resolved.starts_with(root) {
            return Err(ConfigError::invalid(
                key("path"),
                format!(
                    "{} resolves to {}, which is outside workspace_root {}; move the workspace under it, or set workspace_root to a directory holding every workspace",
                    ws.path.display(),
                    resolved.display(),
                    root.display()
                ),
            ));
        }
        if resolved.exists() && !resolved.is_dir() {
            return Err(ConfigError::invalid(
                key("path"),
                format!("{} is not a directory", resolved.display()),
            ));
        }
        // A directory that does not exist yet is a warning
        // (`Config::warnings`): it may be created later.
        ws.path = resolved;
        if let Some(agent) = &ws.default_agent
            && !agents.iter().any(|a| &a.id == agent)
        {
            return Err(ConfigError::invalid(
                key("default_agent"),
                unknown_agent(agent, agents),
            ));
        }
        modes.insert(
            ws.id.clone(),
            approval_mode(raw.approval_mode.as_deref(), &key("approval_mode"))?,
        );
        workspaces.push(ws);
    }
    Ok((workspaces, modes))
}

/// A workspace's Slack channel: no surrounding blanks, and one workspace a
/// channel (`seen`: channel -> the workspace index that has it).
fn check_channel(
    channel: &str,
    index: usize,
    seen: &mut HashMap<String, usize>,
    key: &str,
) -> Result<()> {
    if channel.is_empty() {
        return Ok(());
    }
    if channel.trim() != channel {
        return Err(ConfigError::invalid(
            key,
            format!("{channel:?} has surrounding whitespace"),
        ));
    }
    if let Some(first) = seen.insert(channel.to_owned(), index) {
        return Err(ConfigError::invalid(
            key,
            format!(
                "duplicate channel id {channel:?} (also used by workspace[{first}]); a channel belongs to one workspace"
            ),
        ));
    }
    Ok(())
}

/// A workspace's `approval_mode` (`ask` when not given).
fn approval_mode(text: Option<&str>, key: &str) -> Result<ApprovalMode> {
    let Some(text) = text else {
        return Ok(ApprovalMode::default());
    };
    ApprovalMode::parse(text).ok_or_else(|| {
        ConfigError::invalid(
            key,
            format!("{text:?} is not an approval mode; use \"ask\", \"auto-edits\" or \"auto\""),
        )
    })
}

fn discovery_section(d: &RawDiscovery) -> Result<DiscoverySection> {
    if !(1..=MAX_DISCOVERY_DEPTH).contains(&d.depth) {
        return Err(ConfigError::invalid(
            "discovery.depth",
            format!(
                "must be between 1 (direct children of workspace_root) and {MAX_DISCOVERY_DEPTH}, got {}",
                d.depth
            ),
        ));
    }
    Ok(DiscoverySection {
        enabled: d.enabled,
        depth: d.depth,
    })
}

/// Repositories under `root` as workspaces, minus those a configured entry
/// already covers: configured entries win. A repository covers or is
/// covered when it has the same id, or when its directory is, holds or lies
/// inside a configured workspace's: a repository below a workspace was a
/// workspace of its own without the enclosing one's rules (a probe's `cat`
/// deny rule did not hold in `team/api`), and one above it reached the
/// workspace's files the same way.
fn discovered(root: &Path, depth: usize, configured: &[WorkspaceEntry]) -> Vec<WorkspaceEntry> {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let dirs: Vec<PathBuf> = configured.iter().map(|w| real(&w.path)).collect();
    discover::discover(root, depth, MAX_DISCOVERED)
        .into_iter()
        .filter(|found| {
            let path = real(&found.path);
            let overlaps = dirs
                .iter()
                .any(|d| path.starts_with(d) || d.starts_with(&path));
            if overlaps {
                tracing::debug!(repository = %found.id, "discovery leaves out a repository that overlaps a configured workspace");
            }
            !overlaps && !configured.iter().any(|w| w.id == found.id)
        })
        .map(|found| WorkspaceEntry {
            id: found.id,
            path: found.path,
            channel_id: String::new(),
            label: None,
            default_agent: None,
        })
        .collect()
}

/// The longest any `*_secs` setting may be: a year. Past it a time limit
/// means nothing, and a clock plus it can overflow (a probe's
/// `shutdown_grace_secs = 18446744073709551615` passed `check-config` and
/// then made `serve` panic at start).
const MAX_SECS: u64 = 365 * 24 * 60 * 60;

fn durations(
    l: &super::Limits,
    s: &super::StallPolicy,
    v: &super::SupervisionPolicy,
    m: &super::McpSection,
) -> Result<()> {
    for (key, value) in [
        ("limits.startup_timeout_secs", l.startup_timeout_secs),
        ("limits.prompt_timeout_secs", l.prompt_timeout_secs),
        ("limits.idle_timeout_secs", l.idle_timeout_secs),
        ("limits.shutdown_grace_secs", l.shutdown_grace_secs),
        ("stall.inactivity_secs", s.inactivity_secs),
        ("stall.escalation_secs", s.escalation_secs),
        ("supervision.restart_window_secs", v.restart_window_secs),
        ("supervision.backoff_initial_secs", v.backoff_initial_secs),
        ("supervision.backoff_max_secs", v.backoff_max_secs),
        ("mcp.approval_timeout_secs", m.approval_timeout_secs),
        ("mcp.transmit_timeout_secs", m.transmit_timeout_secs),
    ] {
        if value > MAX_SECS {
            return Err(ConfigError::invalid(
                key,
                format!("must be at most {MAX_SECS} (a year; got {value})"),
            ));
        }
    }
    Ok(())
}

fn limits(l: &super::Limits) -> Result<()> {
    if l.max_sessions == 0 {
        return Err(ConfigError::invalid(
            "limits.max_sessions",
            "must be at least 1",
        ));
    }
    if l.startup_timeout_secs == 0 {
        return Err(ConfigError::invalid(
            "limits.startup_timeout_secs",
            "must be at least 1 (every agent start would time out)",
        ));
    }
    if l.max_line_bytes < MIN_LINE_BYTES {
        return Err(ConfigError::invalid(
            "limits.max_line_bytes",
            format!(
                "must be at least {MIN_LINE_BYTES} (got {})",
                l.max_line_bytes
            ),
        ));
    }
    for (key, value) in [
        ("limits.max_read_bytes", l.max_read_bytes),
        ("limits.max_turn_text_bytes", l.max_turn_text_bytes),
    ] {
        if value < MIN_LINE_BYTES {
            return Err(ConfigError::invalid(
                key,
                format!("must be at least {MIN_LINE_BYTES} (got {value})"),
            ));
        }
    }
    if l.max_pending_requests == 0 {
        return Err(ConfigError::invalid(
            "limits.max_pending_requests",
            "must be at least 1 (the agent could never ask anything)",
        ));
    }
    if l.max_concurrent_starts == 0 {
        return Err(ConfigError::invalid(
            "limits.max_concurrent_starts",
            "must be at least 1 (no session could ever start)",
        ));
    }
    Ok(())
}

fn stall(s: &super::StallPolicy) -> Result<()> {
    if s.inactivity_secs > 0 && s.escalation_secs == 0 {
        return Err(ConfigError::invalid(
            "stall.escalation_secs",
            "must be at least 1 while stall detection is on (stall.inactivity_secs > 0)",
        ));
    }
    if s.inactivity_secs > 0 && s.max_nudges > 0 && s.nudge_text.trim().is_empty() {
        return Err(ConfigError::invalid(
            "stall.nudge_text",
            "must not be empty while nudges are enabled (stall.max_nudges > 0)",
        ));
    }
    Ok(())
}

fn supervision(s: &super::SupervisionPolicy) -> Result<()> {
    if s.backoff_max_secs < s.backoff_initial_secs {
        return Err(ConfigError::invalid(
            "supervision.backoff_max_secs",
            format!(
                "must be at least supervision.backoff_initial_secs ({}), got {}",
                s.backoff_initial_secs, s.backoff_max_secs
            ),
        ));
    }
    Ok(())
}

fn check_id(id: &str, key: &str) -> Result<()> {
    if id.trim().is_empty() {
        return Err(ConfigError::invalid(key, "must not be empty"));
    }
    if id.trim() != id {
        return Err(ConfigError::invalid(
            key,
            format!("{id:?} has surrounding whitespace"),
        ));
    }
    Ok(())
}

pub(super) fn unknown_agent(id: &str, agents: &[AgentProfile]) -> String {
    if agents.is_empty() {
        format!("unknown agent {id:?} (no [[agent]] profiles are defined)")
    } else {
        let known: Vec<&str> = agents.iter().map(|a| a.id.as_str()).collect();
        format!("unknown agent {id:?} (known: {})", known.join(", "))
    }
}

fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_var_names() {
        for ok in ["A", "_X", "ANTHROPIC_API_KEY", "a1_b2"] {
            assert!(is_env_var_name(ok), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A B", "A=B", "Ä"] {
            assert!(!is_env_var_name(bad), "{bad}");
        }
    }

    #[test]
    fn commands_with_separators_resolve_against_the_config_dir() {
        let base = Path::new("/cfg/dir");
        assert_eq!(resolve_command("npx", base), "npx");
        assert_eq!(resolve_command("/usr/bin/x", base), "/usr/bin/x");
        assert_eq!(
            resolve_command("./target/debug/scripted-agent", base),
            "/cfg/dir/target/debug/scripted-agent"
        );
        assert_eq!(resolve_command("../bin/a", base), "/cfg/bin/a");
    }
}
