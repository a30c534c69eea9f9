//! What a session can be started in and with: `GET /api/workspaces` and
//! `GET /api/agents`.
//!
//! Why this exists: a start names a workspace id (or a directory) and may
//! name an agent profile, and a newcomer had no way to learn them but the
//! error for a wrong one ("unknown workspace; configured: ..."); with
//! discovery on, the ids are made up from the repositories found. These
//! list what is in force now, after the last reload.

use axum::Json;
use axum::extract::State;
use intercom_actors::rules::ApprovalMode;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use crate::app::App;

/// One workspace a session can start in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceView {
    /// The id a start names (`"workspace"`).
    pub id: String,
    /// Its directory.
    pub path: String,
    /// Its label, when the config gives one.
    pub label: Option<String>,
    /// The agent profile a start that names none runs (`null` when no
    /// agent is configured).
    pub agent: Option<String>,
    /// `ask`, `auto-edits` or `auto`: what a new session there starts in.
    pub approval_mode: String,
    /// Its Slack channel, when it has one.
    pub channel_id: Option<String>,
}

/// One agent profile a start can name (`"agent"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentView {
    /// The profile's id.
    pub id: String,
    /// The command it runs.
    pub command: String,
    /// `acp` or `intercom`.
    pub protocol: String,
    /// True for the profile path sessions (and workspaces without their
    /// own) run.
    pub default: bool,
}

/// `GET /api/workspaces`: in the config's order, discovered repositories
/// after the configured workspaces.
pub async fn list_workspaces(State(app): State<App>) -> Result<Json<Vec<WorkspaceView>>, ApiError> {
    let map = app.workspace_map().await?;
    let views = map
        .workspaces
        .iter()
        .map(|w| WorkspaceView {
            id: w.id.clone(),
            path: w.path.display().to_string(),
            label: w.label.clone(),
            agent: w.default_agent.clone().or(map.default_agent.clone()),
            approval_mode: app
                .workspace_mode(&w.id)
                .unwrap_or(ApprovalMode::Ask)
                .as_str()
                .to_owned(),
            channel_id: Some(w.channel_id.clone()).filter(|c| !c.is_empty()),
        })
        .collect();
    Ok(Json(views))
}

/// `GET /api/agents`: in the config's order.
pub async fn list_agents(State(app): State<App>) -> Result<Json<Vec<AgentView>>, ApiError> {
    let map = app.workspace_map().await?;
    let views = map
        .agents
        .iter()
        .map(|a| AgentView {
            id: a.id.clone(),
            command: a.command.clone(),
            protocol: a.protocol.as_str().to_owned(),
            default: map.default_agent.as_deref() == Some(a.id.as_str()),
        })
        .collect();
    Ok(Json(views))
}
