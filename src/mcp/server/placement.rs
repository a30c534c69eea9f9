//! Where an MCP connection's calls land: the core session it is bound to.
//!
//! A bridged connection (an ACP agent's own MCP client) acts for that agent's
//! session and may name no other ([`Reach::OwnSession`], see `confine.rs`).
//! Any other connection attaches a session of its own on its first
//! tool call, in the workspace its query string names (`workspace_id`, or a
//! directory under the workspace root), and keeps it until the MCP session
//! goes away, when the core session is told `Disconnected`.

use super::*;

/// Where a connection's session belongs.
#[derive(Debug, Clone, Default)]
pub(super) struct Place {
    /// Workspace id, or empty (local only).
    workspace: String,
    /// The workspace directory, when there is one.
    cwd: Option<PathBuf>,
    /// Slack channel, when there is one.
    channel: Option<String>,
}

/// The core session a connection created.
pub(super) struct Own {
    id: SessionId,
    actor: ActorRef<SessionMsg>,
    place: Place,
}

/// One MCP session's binding; tells the core session when it goes away.
pub(super) struct Connection {
    pub(super) bound: tokio::sync::Mutex<Option<Own>>,
    /// Tool calls running on this MCP session ([`super::MAX_CALLS_IN_FLIGHT`]).
    pub(super) in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(own) = self.bound.get_mut().take() {
            tracing::info!(session = %own.id, "MCP session closed");
            let _ = own
                .actor
                .send_message(SessionMsg::Mcp(McpCall::Disconnected));
        }
    }
}

/// The connection's query string; a workspace-scoped token pins the workspace.
pub(super) fn query_of(parts: Option<&Parts>) -> HashMap<String, String> {
    let mut query: HashMap<String, String> = parts
        .and_then(|p| Query::<HashMap<String, String>>::try_from_uri(&p.uri).ok())
        .map(|Query(q)| q)
        .unwrap_or_default();
    if let Some(crate::mcp::auth::ScopedWorkspace(ws)) =
        parts.and_then(|p| p.extensions.get::<crate::mcp::auth::ScopedWorkspace>())
    {
        query.remove("channel_id");
        query.insert("workspace_id".into(), ws.clone());
    }
    query
}

pub(super) fn parts_of(ctx: &RequestContext<RoleServer>) -> Option<&Parts> {
    ctx.extensions.get::<Parts>()
}

/// The title of a session: the client's name and version.
pub(super) fn client_title(ctx: &RequestContext<RoleServer>) -> String {
    match ctx.peer.peer_info() {
        Some(info) => {
            let c = &info.client_info;
            format!("{} {} (MCP)", c.name, c.version)
        }
        None => "MCP client".into(),
    }
}

impl IntercomMcp {
    pub(super) async fn lookup(
        &self,
        id: &SessionId,
    ) -> Result<Option<ActorRef<SessionMsg>>, Fail> {
        // The named registry, not the supervisor's mailbox (no waiting
        // behind session starts).
        Ok(directory::find(&self.deps().supervisor, id))
    }

    /// Where a new session belongs, from the connection's query string.
    pub(super) async fn place(&self, query: &HashMap<String, String>) -> Place {
        let pick = |k: &str| query.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let (workspace, channel) = (pick("workspace_id"), pick("channel_id"));
        warn_deprecated(workspace, channel);
        // The map, not RegistryMsg::Resolve: resolving also picks an agent
        // profile, which an MCP session does not have (a config without
        // agents must still serve MCP clients).
        match self.shared.workspace_map().await {
            Ok(map) => place_in(&map, workspace, channel),
            Err(e) => {
                tracing::error!("cannot read the workspace map: {e}; the session is local only");
                Place::default()
            }
        }
    }

    /// The session this call acts on: the bridged ACP session, or this
    /// connection's own one (attached on first use, again if it ended).
    pub(super) async fn target(&self, ctx: &RequestContext<RoleServer>) -> Result<Target, Fail> {
        let parts = parts_of(ctx);
        if let Some(BridgedSession(id)) = parts.and_then(|p| p.extensions.get::<BridgedSession>()) {
            let actor = self.lookup(id).await?.ok_or_else(|| {
                Fail::refused(
                    "session_ended",
                    format!("session {id} behind this bridge token has ended"),
                )
            })?;
            let record = self.deps().store.get_session(id).await.map_err(storage)?;
            let (workspace, cwd) = record
                .map(|r| (r.workspace, PathBuf::from(r.cwd)))
                .unwrap_or_default();
            return Ok(Target {
                id: id.clone(),
                actor,
                workspace,
                cwd: Some(cwd).filter(|p| !p.as_os_str().is_empty()),
                reach: Reach::OwnSession,
            });
        }
        // Held across the attach on purpose: two first calls of one MCP
        // session must attach one core session, not two; the calls of that
        // MCP session wait for it (bounded by `ATTACH_TIMEOUT`), no other
        // client's do.
        let mut bound = self.conn.bound.lock().await;
        if let Some(own) = bound.as_ref() {
            if let Some(actor) = self.lookup(&own.id).await? {
                return Ok(Target {
                    id: own.id.clone(),
                    actor,
                    workspace: own.place.workspace.clone(),
                    cwd: own.place.cwd.clone(),
                    reach: Reach::Workspace,
                });
            }
            tracing::info!(session = %own.id, "this MCP client's session has ended; attaching a new one");
        }
        let place = match bound.as_ref() {
            Some(own) => own.place.clone(),
            None => self.place(&query_of(parts)).await,
        };
        ensure_scoped(parts, &place)?;
        let req = AttachRequest {
            workspace: place.workspace.clone(),
            cwd: place.cwd.clone().unwrap_or_default(),
            channel_id: place.channel.clone(),
            title: client_title(ctx),
            owner: credential_owner(parts),
        };
        let record = ask(
            &self.deps().supervisor,
            "supervisor (attach)",
            ATTACH_TIMEOUT,
            |reply| SupervisorMsg::Attach { req, reply },
        )
        .await?
        .map_err(|e| Fail::refused("attach_failed", format!("could not create a session: {e}")))?;
        let actor = self.lookup(&record.id).await?.ok_or_else(Fail::ended)?;
        tracing::info!(session = %record.id, workspace = %place.workspace, "MCP client attached");
        *bound = Some(Own {
            id: record.id.clone(),
            actor: actor.clone(),
            place: place.clone(),
        });
        Ok(Target {
            id: record.id,
            actor,
            workspace: place.workspace,
            cwd: place.cwd,
            reach: Reach::Workspace,
        })
    }
}

/// A workspace-token connection gets a session in its workspace or none.
/// `auth.rs` refuses the token once its workspace is gone, but a reload can
/// land between that check and this one: never fall back to a session
/// without a workspace for it.
fn ensure_scoped(parts: Option<&Parts>, place: &Place) -> Result<(), Fail> {
    let Some(crate::mcp::auth::ScopedWorkspace(ws)) =
        parts.and_then(|p| p.extensions.get::<crate::mcp::auth::ScopedWorkspace>())
    else {
        return Ok(());
    };
    if place.workspace == *ws {
        return Ok(());
    }
    Err(Fail::refused(
        "no_workspace",
        crate::mcp::auth::WorkspaceGone(ws.clone()).to_string(),
    ))
}

/// Says so when a client still uses the deprecated `?channel_id=`.
fn warn_deprecated(workspace: Option<&str>, channel: Option<&str>) {
    match (workspace, channel) {
        (Some(ws), Some(ch)) => tracing::warn!(
            workspace = ws,
            channel = ch,
            "MCP client gave both workspace_id and the deprecated channel_id; workspace_id wins"
        ),
        (None, Some(ch)) => tracing::warn!(
            channel = ch,
            "MCP client connected with the deprecated ?channel_id=; use ?workspace_id=<id>"
        ),
        _ => {}
    }
}

/// Where a connection naming `workspace` (or, deprecated, `channel`)
/// belongs in `map`: a known workspace with its directory (when it can be
/// used) and channel; an unknown workspace or none is local only.
fn place_in(
    map: &intercom_actors::registry::WorkspaceMap,
    workspace: Option<&str>,
    channel: Option<&str>,
) -> Place {
    let entry = match (workspace, channel) {
        (Some(ws), _) => map.workspaces.iter().find(|w| w.id == ws),
        (None, Some(ch)) => map.by_channel(ch),
        (None, None) => None,
    };
    if let Some(e) = entry {
        let cwd = match map.contain(&e.path) {
            Ok(p) => Some(p),
            Err(err) => {
                tracing::warn!(workspace = %e.id, "workspace directory {} cannot be used: {err}; files cannot be applied", e.path.display());
                None
            }
        };
        return Place {
            workspace: e.id.clone(),
            cwd,
            channel: Some(e.channel_id.clone()).filter(|c| !c.is_empty()),
        };
    }
    match (workspace, channel) {
        (Some(ws), _) => {
            tracing::warn!(
                workspace = ws,
                "MCP client named an unknown workspace; the session is local only (no channel, no workspace)"
            );
            Place::default()
        }
        (None, Some(ch)) => {
            tracing::warn!(
                channel = ch,
                "channel_id maps to no configured workspace; the session posts there but has no workspace"
            );
            Place {
                channel: Some(ch.to_owned()),
                ..Place::default()
            }
        }
        (None, None) => {
            tracing::info!(
                "MCP client connected without ?workspace_id=; the session is local only"
            );
            Place::default()
        }
    }
}

/// The owner an attached session is stored with: the credential that opened
/// it. The operator's token is `local`, as before; a workspace's MCP token
/// is `mcp-token:<workspace>`, so a client on that token cannot name the
/// operator's own MCP sessions (`confine::may_name`).
fn credential_owner(parts: Option<&axum::http::request::Parts>) -> String {
    match parts.and_then(|p| p.extensions.get::<crate::mcp::auth::ScopedWorkspace>()) {
        Some(crate::mcp::auth::ScopedWorkspace(ws)) => format!("mcp-token:{ws}"),
        None => OWNER.into(),
    }
}

#[cfg(test)]
mod tests {
    use intercom_actors::registry::WorkspaceMap;
    use intercom_actors::settings::WorkspaceEntry;

    use super::*;

    /// A root with `inside/` (workspace `ws`, channel C1) and a workspace
    /// `gone` whose directory does not exist.
    fn map(root: &Path) -> WorkspaceMap {
        std::fs::create_dir_all(root.join("inside")).expect("inside");
        let entry = |id: &str, dir: &str, channel: &str| WorkspaceEntry {
            id: id.into(),
            path: root.join(dir),
            channel_id: channel.into(),
            label: None,
            default_agent: None,
        };
        WorkspaceMap {
            workspace_root: root.to_path_buf(),
            workspaces: vec![entry("ws", "inside", "C1"), entry("gone", "missing", "")],
            agents: Vec::new(),
            default_agent: None,
        }
    }

    #[test]
    fn a_known_workspace_gives_its_directory_and_channel() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        let p = place_in(&map(&root), Some("ws"), None);
        assert_eq!(p.workspace, "ws");
        assert_eq!(p.cwd, Some(root.join("inside")));
        assert_eq!(p.channel.as_deref(), Some("C1"));
        // workspace_id wins over the deprecated channel_id.
        let p = place_in(&map(&root), Some("ws"), Some("C-other"));
        assert_eq!(
            (p.workspace.as_str(), p.channel.as_deref()),
            ("ws", Some("C1"))
        );
    }

    #[test]
    fn an_unknown_or_unusable_workspace_gives_no_directory() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        // Unknown: local only, even with a channel named beside it.
        let p = place_in(&map(&root), Some("nope"), Some("C1"));
        assert_eq!(
            (p.workspace.as_str(), &p.cwd, &p.channel),
            ("", &None, &None)
        );
        // Configured but its directory is missing: no files can be applied.
        let p = place_in(&map(&root), Some("gone"), None);
        assert_eq!((p.workspace.as_str(), &p.cwd), ("gone", &None));
        // Nothing named: local only.
        let p = place_in(&map(&root), None, None);
        assert_eq!(
            (p.workspace.as_str(), &p.cwd, &p.channel),
            ("", &None, &None)
        );
    }

    #[test]
    fn a_workspace_token_never_gets_a_session_without_its_workspace() {
        let (mut parts, ()) = axum::http::Request::new(()).into_parts();
        let local = Place::default();
        let ws = Place {
            workspace: "ws".into(),
            ..Place::default()
        };
        // Other callers may be local only.
        assert!(ensure_scoped(Some(&parts), &local).is_ok());
        assert!(ensure_scoped(None, &local).is_ok());
        parts
            .extensions
            .insert(crate::mcp::auth::ScopedWorkspace("ws".into()));
        assert!(ensure_scoped(Some(&parts), &ws).is_ok());
        match ensure_scoped(Some(&parts), &local) {
            Err(Fail::Refused { code, message }) => {
                assert_eq!(code, "no_workspace");
                assert!(message.contains("no longer configured"), "{message}");
            }
            _ => panic!("a vanished workspace must be refused"),
        }
    }

    #[test]
    fn the_deprecated_channel_finds_its_workspace() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        let p = place_in(&map(&root), None, Some("C1"));
        assert_eq!(
            (p.workspace.as_str(), p.cwd),
            ("ws", Some(root.join("inside")))
        );
        // A channel bound to no workspace is used as given (the seed's
        // backward compatibility), with no workspace and no directory.
        let p = place_in(&map(&root), None, Some("C-unbound"));
        assert_eq!((p.workspace.as_str(), &p.cwd), ("", &None));
        assert_eq!(p.channel.as_deref(), Some("C-unbound"));
    }
}
