//! Approval rules and per-session approval modes over HTTP:
//! `GET/POST /api/rules`, `DELETE /api/rules/{id}`,
//! `POST /api/approvals/{id}/remember` (an "always" decision kept as a rule,
//! as Slack's "Remember" buttons do), `POST /api/sessions/{id}/mode`.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use intercom_actors::model::SessionId;
use intercom_actors::protocol::agent_options::AgentSetting;
use intercom_actors::rules::{ApprovalMode, Rule, RuleAction, RuleMatch, Scope};
use intercom_actors::session::Caller;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiJson, ApiPath};
use crate::app::{App, LOCAL_OWNER};
use crate::slack::rules::{RememberScope, remember_decision};

/// A rule as listed: the rule plus where it came from.
#[derive(Debug, Serialize)]
pub struct RuleView {
    /// The rule (`id`, `scope`, `match`, `action`).
    #[serde(flatten)]
    pub rule: Rule,
    /// `config`, or who created it.
    pub source: String,
}

/// `POST /api/rules` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleBody {
    /// `global`, `workspace` or `session`.
    scope: String,
    /// Workspace or session id for those scopes.
    #[serde(default)]
    scope_id: Option<String>,
    /// Conditions.
    #[serde(default, rename = "match")]
    matcher: RuleMatch,
    /// `allow`, `ask` or `deny`.
    action: RuleAction,
}

/// Parses an approval mode name into a 400 when unknown.
pub fn parse_mode(name: &str) -> Result<ApprovalMode, ApiError> {
    ApprovalMode::parse(name).ok_or_else(|| {
        ApiError::bad_request(format!(
            "unknown mode {name:?}; use ask, auto-edits or auto"
        ))
    })
}

/// `GET /api/rules`.
pub async fn list(State(app): State<App>) -> Result<Json<Vec<RuleView>>, ApiError> {
    let rules = app.rules().await?;
    Ok(Json(
        rules
            .into_iter()
            .map(|(rule, source)| RuleView { rule, source })
            .collect(),
    ))
}

/// `POST /api/rules` -> 201 with the stored rule.
pub async fn create(
    State(app): State<App>,
    ApiJson(body): ApiJson<RuleBody>,
) -> Result<(StatusCode, Json<Rule>), ApiError> {
    let scope = match (body.scope.as_str(), body.scope_id) {
        ("global", None) => Scope::Global,
        ("workspace", Some(id)) => Scope::Workspace(id),
        ("session", Some(id)) => Scope::Session(SessionId(id)),
        ("global", Some(_)) => {
            return Err(ApiError::bad_request("a global rule takes no \"scope_id\""));
        }
        ("workspace" | "session", None) => {
            return Err(ApiError::bad_request(
                "workspace and session rules need a \"scope_id\" (the workspace or session id)",
            ));
        }
        (other, _) => {
            return Err(ApiError::bad_request(format!(
                "unknown scope {other:?}; use global, workspace or session"
            )));
        }
    };
    app.check_rule_scope(&scope).await?;
    app.check_rule_agent(body.matcher.agent.as_deref()).await?;
    let rule = Rule {
        id: String::new(),
        scope,
        matcher: body.matcher,
        action: body.action,
    };
    // Posting the same rule twice (a retried call) keeps one, as
    // `/remember` does: 200 with the rule already stored.
    let stored = app.rules().await?;
    if let Some((same, _)) = stored.into_iter().find(|(r, source)| {
        source != "config"
            && r.scope == rule.scope
            && r.matcher == rule.matcher
            && r.action == rule.action
    }) {
        return Ok((StatusCode::OK, Json(same)));
    }
    let rule = app.add_rule(rule, LOCAL_OWNER).await?;
    Ok((StatusCode::CREATED, Json(rule)))
}

/// `DELETE /api/rules/{id}` -> 204.
pub async fn delete(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    app.delete_rule(&id, LOCAL_OWNER).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/approvals/{id}/remember` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RememberBody {
    /// `session` (only the request's session) or `workspace` (every
    /// session of its workspace).
    scope: String,
}

/// `POST /api/approvals/{id}/remember` -> 201 `{"rule": ..., "created":
/// true}`, or 200 with `"created": false` when the same rule is already in
/// force. Only a decided request whose option was an "always" one can be
/// remembered (400 otherwise); the rule matches what the request was about
/// (docs/rules.md).
pub async fn remember(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<RememberBody>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let scope = match body.scope.as_str() {
        "session" => RememberScope::Session,
        "workspace" => RememberScope::Workspace,
        other => {
            return Err(ApiError::bad_request(format!(
                "unknown scope {other:?}; use session or workspace"
            )));
        }
    };
    let (request, _) = app.approval(&id).await?;
    let store = app.store_port();
    let remembered = remember_decision(store.as_ref(), &app, &id, scope, LOCAL_OWNER)
        .await
        .map_err(ApiError::bad_request)?;
    let status = if remembered.existed {
        StatusCode::OK
    } else {
        let text = crate::slack::rules::remembered_notice(&remembered.rule, LOCAL_OWNER);
        app.notice(&request.session_id, text);
        StatusCode::CREATED
    };
    let answer = serde_json::json!({"rule": remembered.rule, "created": !remembered.existed});
    Ok((status, Json(answer)))
}

/// `POST /api/sessions/{id}/agent-mode` body: exactly one of `mode`,
/// `model`, or `option` with `value`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentOptionBody {
    mode: Option<String>,
    model: Option<String>,
    option: Option<String>,
    value: Option<String>,
}

impl AgentOptionBody {
    fn setting(self) -> Result<AgentSetting, ApiError> {
        match (self.mode, self.model, self.option, self.value) {
            (Some(m), None, None, None) => Ok(AgentSetting::Mode(m)),
            (None, Some(m), None, None) => Ok(AgentSetting::Model(m)),
            (None, None, Some(id), Some(value)) => Ok(AgentSetting::Config { id, value }),
            _ => Err(ApiError::bad_request(
                "give exactly one of {\"mode\": ...}, {\"model\": ...} or {\"option\": ..., \"value\": ...}",
            )),
        }
    }
}

/// `POST /api/sessions/{id}/agent-mode` -> 200 with what the agent now
/// offers and uses (`session/set_mode`, `session/set_model`,
/// `session/set_config_option`, sent only for offered values).
pub async fn set_agent_option(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<AgentOptionBody>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let setting = body.setting()?;
    let options = app
        .set_agent_option(&SessionId(id), setting, Caller::local())
        .await?;
    Ok(Json(serde_json::json!({"agent_options": options})))
}

/// `POST /api/sessions/{id}/mode` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModeBody {
    mode: String,
}

/// `POST /api/sessions/{id}/mode` -> 200 `{"mode": ...}`.
pub async fn set_mode(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ModeBody>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let mode = parse_mode(&body.mode)?;
    app.set_mode(&SessionId(id), mode, Caller::local()).await?;
    Ok(Json(serde_json::json!({"mode": mode.as_str()})))
}
