//! The config file as written, before resolution and validation
//! (`validate.rs` turns it into a [`Config`](super::Config)). Unknown keys are
//! refused; values whose errors name a key are kept as text here.

use std::path::PathBuf;

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::rules;
use super::{
    AgentProfile, DEFAULT_BIND, DEFAULT_DATABASE_PATH, DEFAULT_DISCOVERY_DEPTH, Limits, McpSection,
    StallPolicy, SupervisionPolicy,
};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub(crate) workspace_root: Option<PathBuf>,
    #[serde(default)]
    pub(crate) server: RawServer,
    #[serde(default)]
    pub(crate) database: RawDatabase,
    #[serde(default)]
    pub(crate) slack: RawSlack,
    #[serde(default)]
    pub(crate) mcp: McpSection,
    #[serde(default, rename = "agent")]
    pub(crate) agents: Vec<AgentProfile>,
    #[serde(default, rename = "workspace")]
    pub(crate) workspaces: Vec<RawWorkspace>,
    #[serde(default)]
    pub(crate) discovery: RawDiscovery,
    #[serde(default, rename = "rule")]
    pub(crate) rules: Vec<rules::RawRule>,
    #[serde(default)]
    pub(crate) limits: Limits,
    #[serde(default)]
    pub(crate) stall: StallPolicy,
    #[serde(default)]
    pub(crate) supervision: SupervisionPolicy,
    #[serde(default)]
    pub(crate) default_agent: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawServer {
    /// Kept as text so a bad value is reported against `server.bind`.
    pub(crate) bind: String,
}

impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            bind: DEFAULT_BIND.to_owned(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawDatabase {
    pub(crate) path: PathBuf,
}

impl Default for RawDatabase {
    fn default() -> Self {
        RawDatabase {
            path: PathBuf::from(DEFAULT_DATABASE_PATH),
        }
    }
}

/// `[[workspace]]` as written: the core's [`WorkspaceEntry`] plus the
/// server-level `approval_mode` (the core type stays unchanged).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWorkspace {
    pub(crate) id: String,
    pub(crate) path: PathBuf,
    #[serde(default)]
    pub(crate) channel_id: String,
    #[serde(default)]
    pub(crate) label: Option<String>,
    #[serde(default)]
    pub(crate) default_agent: Option<String>,
    /// Kept as text so a bad value is reported against `workspace[i].approval_mode`.
    #[serde(default)]
    pub(crate) approval_mode: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawDiscovery {
    pub(crate) enabled: bool,
    pub(crate) depth: usize,
}

impl Default for RawDiscovery {
    fn default() -> Self {
        RawDiscovery {
            enabled: false,
            depth: DEFAULT_DISCOVERY_DEPTH,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawSlack {
    pub(crate) api_url: Option<String>,
    pub(crate) operators: Vec<String>,
    /// Accepted only to reject it with a pointed message.
    pub(crate) bot_token: Option<IgnoredAny>,
    /// Accepted only to reject it with a pointed message.
    pub(crate) app_token: Option<IgnoredAny>,
}
