//! The WorkspaceRegistry: workspace id -> directory, channel and agent.
//!
//! It owns the workspace map and answers resolve requests. A `Reload`
//! replaces the whole map at once (the edge validates a new config before
//! sending it), so a session never sees half of an edit. Resolution and the
//! path rules (`workspace_root` containment after resolving `..` and
//! symlinks) live here so every entry point — API, Slack, MCP — agrees.

use std::path::{Path, PathBuf};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::fsjail;
use crate::settings::{AgentProfile, WorkspaceEntry};

/// The routing data the registry serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkspaceMap {
    /// Agents may only run under this directory.
    pub workspace_root: PathBuf,
    /// Configured workspaces.
    pub workspaces: Vec<WorkspaceEntry>,
    /// Agent profiles.
    pub agents: Vec<AgentProfile>,
    /// Agent for path sessions and workspaces without one.
    pub default_agent: Option<String>,
}

/// A resolved start target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Workspace id (or the directory, for path sessions).
    pub workspace: String,
    /// Canonical directory.
    pub cwd: PathBuf,
    /// Slack channel, if any.
    pub channel_id: Option<String>,
    /// Agent profile.
    pub profile: AgentProfile,
}

/// What to resolve.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// A workspace id.
    pub workspace: Option<String>,
    /// Or a directory under `workspace_root`.
    pub path: Option<PathBuf>,
    /// Agent override.
    pub agent: Option<String>,
}

/// A start in workspace `entry`, running in `cwd`.
fn in_workspace(entry: &WorkspaceEntry, cwd: PathBuf, profile: AgentProfile) -> Resolved {
    Resolved {
        workspace: entry.id.clone(),
        cwd,
        channel_id: Some(entry.channel_id.clone()).filter(|c| !c.is_empty()),
        profile,
    }
}

/// Why resolution failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// Neither workspace nor path given.
    #[error("name a workspace or a path")]
    NoTarget,
    /// No such workspace.
    #[error("unknown workspace {0:?}; configured: {1}")]
    UnknownWorkspace(String, String),
    /// No such agent profile.
    #[error("unknown agent {0:?}; configured: {1}")]
    UnknownAgent(String, String),
    /// No agent named and no default.
    #[error("no agent given and no default_agent configured")]
    NoAgent,
    /// The path does not exist.
    #[error("path {0} does not exist or is not a directory")]
    PathNotFound(String),
    /// A configured workspace's directory does not exist.
    #[error(
        "workspace `{workspace}`: its directory {path} does not exist or is not a directory; create it, or fix the workspace's `path` in the config file"
    )]
    WorkspaceDirMissing {
        /// The workspace id.
        workspace: String,
        /// Its configured path.
        path: String,
    },
    /// The path lies inside a configured workspace (below its top).
    #[error(
        "path {path} lies inside workspace `{workspace}`; start the session in workspace `{workspace}`, or give a directory no workspace holds (a workspace's rules name paths from its top)"
    )]
    InsideWorkspace {
        /// Given, resolved.
        path: String,
        /// The workspace holding it.
        workspace: String,
    },
    /// The path is outside `workspace_root`.
    #[error("path {path} is outside workspace_root {root}")]
    OutsideRoot {
        /// Given.
        path: String,
        /// Root.
        root: String,
    },
}

impl WorkspaceMap {
    /// The agent profile and workspace a stored session would come back
    /// with now (a revive), or why it cannot: its workspace was removed
    /// from the config (or its directory no longer lies in it or under the
    /// workspace root), its agent profile is gone or speaks another protocol
    /// now, or it was an MCP client's (nothing to start). A revive must follow
    /// the operator's current config, not the one the session started with.
    pub fn revivable(&self, rec: &crate::model::SessionRecord) -> Result<AgentProfile, String> {
        if rec.protocol == crate::model::Protocol::Mcp {
            // Its "agent" is no profile: it was an IDE connected over MCP.
            return Err(
                "it was an MCP client's, and is not revived: its client (the IDE) reconnects on its own, as a new session"
                    .into(),
            );
        }
        let cwd = Path::new(&rec.cwd);
        // A path session stores its directory as its workspace.
        if rec.workspace.is_empty() || rec.workspace == rec.cwd {
            if !cwd.starts_with(&self.workspace_root) {
                return Err(format!(
                    "its directory {} is no longer under the workspace root {}",
                    rec.cwd,
                    self.workspace_root.display()
                ));
            }
            if let Err(e) = self.contain(cwd) {
                return Err(format!("its directory {} cannot be used: {e}", rec.cwd));
            }
        } else {
            let Some(ws) = self.workspaces.iter().find(|w| w.id == rec.workspace) else {
                return Err(format!(
                    "its workspace `{}` is no longer configured",
                    rec.workspace
                ));
            };
            if !cwd.starts_with(&ws.path) {
                return Err(format!(
                    "its directory {} is no longer in workspace `{}` ({})",
                    rec.cwd,
                    ws.id,
                    ws.path.display()
                ));
            }
            if !cwd.is_dir() {
                return Err(format!("its directory {} no longer exists", rec.cwd));
            }
        }
        // The directory it ran in (stored resolved), not wherever that name
        // leads now: a probe replaced a workspace's directory with a link to
        // another workspace, and the revived session wrote there, in its own
        // approval mode, while the operator was shown the old directory.
        match cwd.canonicalize() {
            Ok(real) if real == cwd => {}
            Ok(real) => {
                return Err(format!(
                    "its directory {} now leads to {}; a session comes back only in the directory it ran in (start a new one there)",
                    rec.cwd,
                    real.display()
                ));
            }
            Err(e) => return Err(format!("its directory {} cannot be used: {e}", rec.cwd)),
        }
        let profile = self
            .agents
            .iter()
            .find(|p| p.id == rec.agent)
            .cloned()
            .ok_or_else(|| format!("its agent `{}` is no longer configured", rec.agent))?;
        // Its agent's session (and what the transcript says of it) was
        // spoken in one protocol: another cannot resume it.
        if profile.protocol != rec.protocol {
            return Err(format!(
                "its agent `{}` now speaks {}, not {} as when the session ran; start a new session",
                rec.agent,
                profile.protocol.as_str(),
                rec.protocol.as_str()
            ));
        }
        Ok(profile)
    }

    fn agent_ids(&self) -> String {
        let ids: Vec<&str> = self.agents.iter().map(|a| a.id.as_str()).collect();
        if ids.is_empty() {
            "none".into()
        } else {
            ids.join(", ")
        }
    }

    fn pick_agent(&self, wanted: Option<&str>) -> Result<AgentProfile, ResolveError> {
        let id = wanted
            .or(self.default_agent.as_deref())
            .or(self.agents.first().map(|a| a.id.as_str()))
            .ok_or(ResolveError::NoAgent)?;
        self.agents
            .iter()
            .find(|a| a.id == id)
            .cloned()
            .ok_or_else(|| ResolveError::UnknownAgent(id.to_owned(), self.agent_ids()))
    }

    /// The workspace a Slack channel maps to.
    pub fn by_channel(&self, channel: &str) -> Option<&WorkspaceEntry> {
        self.workspaces
            .iter()
            .find(|w| !w.channel_id.is_empty() && w.channel_id == channel)
    }

    /// Resolves a start target.
    pub fn resolve(&self, target: &Target) -> Result<Resolved, ResolveError> {
        if let Some(ws) = &target.workspace {
            let entry = self
                .workspaces
                .iter()
                .find(|w| &w.id == ws)
                .ok_or_else(|| {
                    let ids: Vec<&str> = self.workspaces.iter().map(|w| w.id.as_str()).collect();
                    ResolveError::UnknownWorkspace(
                        ws.clone(),
                        if ids.is_empty() {
                            "none".into()
                        } else {
                            ids.join(", ")
                        },
                    )
                })?;
            let profile = self.workspace_agent(entry, target)?;
            // Checked again at every start: a workspace directory swapped
            // for a symlink leading out of workspace_root since the config
            // was loaded (or the repository was discovered) is refused.
            let cwd = self.contain(&entry.path).map_err(|e| match e {
                ResolveError::PathNotFound(path) => ResolveError::WorkspaceDirMissing {
                    workspace: entry.id.clone(),
                    path,
                },
                other => other,
            })?;
            return Ok(in_workspace(entry, cwd, profile));
        }
        let path = target.path.as_ref().ok_or(ResolveError::NoTarget)?;
        let cwd = self.contain(path)?;
        // A configured workspace's directory is that workspace: its rules,
        // mode and channel hold there (a path session used to escape its
        // deny rules). A directory inside one is refused: the workspace's
        // rules name paths from its top, and a session below it would be
        // judged by paths from its own directory.
        if let Some((entry, top)) = self.workspace_containing(&cwd) {
            if cwd != top {
                return Err(ResolveError::InsideWorkspace {
                    path: cwd.display().to_string(),
                    workspace: entry.id.clone(),
                });
            }
            let profile = self.workspace_agent(entry, target)?;
            return Ok(in_workspace(entry, cwd, profile));
        }
        let profile = self.pick_agent(target.agent.as_deref())?;
        Ok(Resolved {
            workspace: cwd.display().to_string(),
            cwd,
            channel_id: None,
            profile,
        })
    }

    /// The agent a start in workspace `entry` runs: the one asked for, else
    /// the workspace's default, else the server's.
    fn workspace_agent(
        &self,
        entry: &WorkspaceEntry,
        target: &Target,
    ) -> Result<AgentProfile, ResolveError> {
        self.pick_agent(target.agent.as_deref().or(entry.default_agent.as_deref()))
    }

    /// The configured workspace whose directory holds `dir` (the deepest,
    /// when workspaces nest; the first declared, when two share it: the
    /// config warns of that), with that directory resolved.
    fn workspace_containing(&self, dir: &Path) -> Option<(&WorkspaceEntry, PathBuf)> {
        self.workspaces
            .iter()
            // `max_by_key` keeps the last of equals: reversed, the first.
            .rev()
            .filter_map(|w| self.contain(&w.path).ok().map(|p| (w, p)))
            .filter(|(_, p)| dir.starts_with(p))
            .max_by_key(|(_, p)| p.components().count())
    }

    /// Resolves `path` (relative to the root) and proves it is an existing
    /// directory under `workspace_root`.
    pub fn contain(&self, path: &Path) -> Result<PathBuf, ResolveError> {
        let joined = if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.workspace_root.join(path)
        };
        let real = joined
            .canonicalize()
            .map_err(|_| ResolveError::PathNotFound(path.display().to_string()))?;
        if !real.is_dir() {
            return Err(ResolveError::PathNotFound(path.display().to_string()));
        }
        let inside = fsjail::resolve_inside(&self.workspace_root, &real).is_ok();
        if !inside {
            return Err(ResolveError::OutsideRoot {
                path: path.display().to_string(),
                root: self.workspace_root.display().to_string(),
            });
        }
        Ok(real)
    }
}

/// Messages the registry handles.
pub enum RegistryMsg {
    /// Resolve a start target.
    Resolve(Target, RpcReplyPort<Result<Resolved, ResolveError>>),
    /// Replace the whole map (already validated).
    Reload(Box<WorkspaceMap>),
    /// The current map.
    Get(RpcReplyPort<WorkspaceMap>),
    /// Panics inside the handler (supervision tests only).
    #[cfg(feature = "test-hooks")]
    PanicForTest,
}

/// The WorkspaceRegistry handler.
pub struct WorkspaceRegistry;

impl Actor for WorkspaceRegistry {
    type Msg = RegistryMsg;
    type State = WorkspaceMap;
    type Arguments = WorkspaceMap;

    async fn pre_start(
        &self,
        _myself: ActorRef<RegistryMsg>,
        map: WorkspaceMap,
    ) -> Result<WorkspaceMap, ActorProcessingErr> {
        Ok(map)
    }

    async fn handle(
        &self,
        _myself: ActorRef<RegistryMsg>,
        msg: RegistryMsg,
        map: &mut WorkspaceMap,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RegistryMsg::Resolve(target, reply) => {
                let _ = reply.send(map.resolve(&target));
            }
            RegistryMsg::Reload(new) => {
                tracing::info!(
                    workspaces = new.workspaces.len(),
                    agents = new.agents.len(),
                    "workspace map reloaded"
                );
                *map = *new;
            }
            RegistryMsg::Get(reply) => {
                let _ = reply.send(map.clone());
            }
            #[cfg(feature = "test-hooks")]
            RegistryMsg::PanicForTest => {
                panic!("workspace registry panicked on request (test hook)")
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(id: &str) -> AgentProfile {
        AgentProfile {
            id: id.into(),
            command: "x".into(),
            args: vec![],
            env: vec![],
            protocol: Default::default(),
            framing: Default::default(),
            auth_method: None,
        }
    }

    fn map(root: &Path) -> WorkspaceMap {
        std::fs::create_dir_all(root.join("api")).expect("mkdir");
        WorkspaceMap {
            workspace_root: root.to_path_buf(),
            workspaces: vec![WorkspaceEntry {
                id: "api".into(),
                path: root.join("api"),
                channel_id: "C1".into(),
                label: None,
                default_agent: Some("b".into()),
            }],
            agents: vec![profile("a"), profile("b")],
            default_agent: Some("a".into()),
        }
    }

    fn stored(workspace: &str, cwd: &Path, agent: &str) -> crate::model::SessionRecord {
        crate::model::SessionRecord {
            workspace: workspace.into(),
            cwd: cwd.display().to_string(),
            status: crate::model::SessionStatus::Completed,
            status_reason: Some("idle_timeout".into()),
            ..crate::model::SessionRecord::sample(agent)
        }
    }

    #[test]
    fn a_revive_follows_the_current_config() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        let mut m = map(&root);
        let rec = stored("api", &root.join("api"), "b");
        assert_eq!(m.revivable(&rec).expect("revivable").id, "b");
        // Its agent profile gone.
        let gone_agent = stored("api", &root.join("api"), "zz");
        assert!(
            m.revivable(&gone_agent)
                .expect_err("no agent")
                .contains("agent `zz`")
        );
        // A path session (its directory is its workspace) comes back while
        // its directory is usable, and not once it is gone.
        std::fs::create_dir_all(root.join("pdir")).expect("mkdir");
        let pdir = root.join("pdir").display().to_string();
        let path_session = stored(&pdir, &root.join("pdir"), "a");
        assert_eq!(m.revivable(&path_session).expect("path session").id, "a");
        std::fs::remove_dir(root.join("pdir")).expect("rmdir");
        assert!(
            m.revivable(&path_session)
                .expect_err("gone")
                .contains("cannot be used")
        );
        // A workspace's directory deleted on disk.
        std::fs::remove_dir(root.join("api")).expect("rmdir");
        assert!(
            m.revivable(&rec)
                .expect_err("deleted")
                .contains("no longer exists")
        );
        std::fs::create_dir_all(root.join("api")).expect("mkdir");
        // A workspace's directory replaced by a link to another directory
        // (another workspace): not revived there.
        std::fs::create_dir_all(root.join("other")).expect("mkdir");
        std::fs::rename(root.join("api"), root.join("api.old")).expect("mv");
        std::os::unix::fs::symlink(root.join("other"), root.join("api")).expect("link");
        let why = m.revivable(&rec).expect_err("swapped");
        assert!(why.contains("now leads to"), "{why}");
        std::fs::remove_file(root.join("api")).expect("unlink");
        std::fs::rename(root.join("api.old"), root.join("api")).expect("mv back");
        assert_eq!(m.revivable(&rec).expect("revivable again").id, "b");
        // A path session outside the root.
        let outside = stored("", Path::new("/elsewhere"), "a");
        assert!(
            m.revivable(&outside)
                .expect_err("outside")
                .contains("workspace root")
        );
        // Its workspace moved elsewhere, then removed.
        m.workspaces[0].path = root.join("moved");
        assert!(
            m.revivable(&rec)
                .expect_err("moved")
                .contains("no longer in workspace")
        );
        m.workspaces.clear();
        assert!(
            m.revivable(&rec)
                .expect_err("removed")
                .contains("no longer configured")
        );
    }

    #[test]
    fn a_session_does_not_come_back_in_another_protocol() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        let mut m = map(&root);
        let rec = stored("api", &root.join("api"), "b");
        m.agents[1].protocol = crate::model::Protocol::Intercom;
        let why = m.revivable(&rec).expect_err("protocol changed");
        assert!(why.contains("now speaks intercom, not acp"), "{why}");
        // An MCP client's session: its client reconnects instead.
        let mcp = crate::model::SessionRecord {
            protocol: crate::model::Protocol::Mcp,
            ..stored("api", &root.join("api"), "mcp")
        };
        let why = m.revivable(&mcp).expect_err("mcp");
        assert!(why.contains("reconnects on its own"), "{why}");
    }

    #[test]
    fn a_workspace_swapped_for_a_symlink_out_of_the_root_is_refused_at_start() {
        let dir = tempfile::tempdir().expect("tmp");
        let outside = tempfile::tempdir().expect("tmp2");
        let root = dir.path().canonicalize().expect("canon");
        let m = map(&root);
        let target = Target {
            workspace: Some("api".into()),
            ..Default::default()
        };
        assert!(m.resolve(&target).is_ok());
        std::fs::remove_dir(root.join("api")).expect("rmdir");
        std::os::unix::fs::symlink(outside.path(), root.join("api")).expect("swap");
        assert!(matches!(
            m.resolve(&target),
            Err(ResolveError::OutsideRoot { .. })
        ));
    }

    #[test]
    fn workspace_resolution_uses_its_default_agent_and_channel() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        let m = map(&root);
        let r = m
            .resolve(&Target {
                workspace: Some("api".into()),
                ..Default::default()
            })
            .expect("resolve");
        assert_eq!(
            (r.profile.id.as_str(), r.channel_id.as_deref()),
            ("b", Some("C1"))
        );
        let r = m
            .resolve(&Target {
                workspace: Some("api".into()),
                agent: Some("a".into()),
                ..Default::default()
            })
            .expect("resolve");
        assert_eq!(r.profile.id, "a");
        assert!(matches!(
            m.resolve(&Target {
                workspace: Some("nope".into()),
                ..Default::default()
            }),
            Err(ResolveError::UnknownWorkspace(..))
        ));
        assert!(matches!(
            m.resolve(&Target {
                workspace: Some("api".into()),
                agent: Some("zz".into()),
                ..Default::default()
            }),
            Err(ResolveError::UnknownAgent(..))
        ));
    }

    #[test]
    fn a_workspace_whose_directory_is_gone_is_named() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        let m = map(&root);
        std::fs::remove_dir(root.join("api")).expect("rmdir");
        let err = m
            .resolve(&Target {
                workspace: Some("api".into()),
                ..Default::default()
            })
            .expect_err("gone");
        assert!(
            matches!(&err, ResolveError::WorkspaceDirMissing { workspace, .. } if workspace == "api"),
            "{err:?}"
        );
        assert!(err.to_string().contains("workspace `api`"), "{err}");
    }

    #[test]
    fn path_sessions_stay_under_the_root() {
        let dir = tempfile::tempdir().expect("tmp");
        let outside = tempfile::tempdir().expect("tmp2");
        let root = dir.path().canonicalize().expect("canon");
        let m = map(&root);
        std::os::unix::fs::symlink(outside.path(), root.join("escape")).expect("symlink");
        std::fs::create_dir_all(root.join("other")).expect("other");
        let ok = m
            .resolve(&Target {
                path: Some("other".into()),
                ..Default::default()
            })
            .expect("resolve");
        assert_eq!(
            (ok.workspace, ok.cwd, ok.profile.id.as_str(), ok.channel_id),
            (
                root.join("other").display().to_string(),
                root.join("other"),
                "a",
                None
            )
        );
        for bad in ["escape", "api/../..", "/"] {
            assert!(
                matches!(
                    m.resolve(&Target {
                        path: Some(bad.into()),
                        ..Default::default()
                    }),
                    Err(ResolveError::OutsideRoot { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            m.resolve(&Target {
                path: Some("missing".into()),
                ..Default::default()
            }),
            Err(ResolveError::PathNotFound(_))
        ));
    }

    /// A workspace's directory is that workspace: its rules, mode, channel
    /// and agent hold there (a path session escaped the workspace's deny
    /// rules). Below its top a session would be judged by paths from its own
    /// directory, not the ones the workspace's rules name: refused.
    #[test]
    fn a_path_in_a_workspace_is_that_workspace_or_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        let m = map(&root);
        std::fs::create_dir_all(root.join("api/src")).expect("api/src");
        let r = m
            .resolve(&Target {
                path: Some("api".into()),
                ..Default::default()
            })
            .expect("api");
        assert_eq!(
            (
                r.workspace.as_str(),
                r.channel_id.as_deref(),
                r.profile.id.as_str()
            ),
            ("api", Some("C1"), "b")
        );
        assert_eq!(r.cwd, root.join("api"));
        let below = m.resolve(&Target {
            path: Some("api/src".into()),
            ..Default::default()
        });
        assert!(
            matches!(&below, Err(ResolveError::InsideWorkspace { workspace, .. }) if workspace == "api"),
            "{below:?}"
        );
    }

    /// Two workspaces on one directory (a block pasted with its id changed
    /// and its path forgotten): a path session there is in the first one.
    #[test]
    fn a_directory_two_workspaces_share_is_the_first_ones() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        let mut m = map(&root);
        m.workspaces.push(WorkspaceEntry {
            id: "api-copy".into(),
            path: root.join("api"),
            channel_id: String::new(),
            label: None,
            default_agent: None,
        });
        let r = m
            .resolve(&Target {
                path: Some("api".into()),
                ..Default::default()
            })
            .expect("api");
        assert_eq!(r.workspace, "api");
    }
}
