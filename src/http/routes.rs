//! The handlers behind each route: parse, call the [`App`], shape the answer.
//!
//! The table of routes is in `docs/api.md`; the router is in `mod.rs`.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use intercom_actors::model::{RequestStatus, SessionId};
use intercom_actors::registry::Target;
use intercom_actors::session::{Caller, Choice};
use serde::Deserialize;
use serde_json::Value;

use super::auth::{self, ApiToken};
use super::error::{ApiError, ApiJson, ApiPath, ApiQuery, NoBody};
use super::paging;
use super::views::{
    ApprovalView, ErrorBody, Health, PromptAccepted, SessionDetailView, SessionView,
};
use crate::app::{App, AppError, LOCAL_OWNER};

type ApiResult<T> = Result<T, ApiError>;

/// What `/healthz` says of a stale config to a caller without the token.
pub const CONFIG_ERROR_HIDDEN: &str = "the config file did not load, or only in part; the reason quotes the file, \
so it is shown only with the API token (Authorization: Bearer <token>); or run \
`agent-intercom check-config`, or read the server log";

/// `config_held` without the API token: what is held names rules and
/// workspaces.
pub const CONFIG_HELD_HIDDEN: &str = "a saved config edit waits until the file has stopped changing before it \
is applied; what it changes is shown only with the API token, or in the server log";

/// What `/healthz` says of a storage failure to a caller without the token.
pub const STORAGE_ERROR_HIDDEN: &str = "nothing can be stored now (the database file is gone or \
writes fail); the reason is shown only with the API token (Authorization: Bearer <token>), and \
in the server log";

/// `GET /healthz`: open, so it says how the server is, not what its
/// config file holds. A parse error quotes the offending line (a token
/// pasted into the file, say) and names the file: only a caller with the
/// API token gets it.
pub async fn healthz(app: App, token: Arc<ApiToken>, headers: HeaderMap) -> Response {
    let slack = match app.slack().as_str() {
        // Connected on the app token, but every post refused.
        "connected" if crate::slack::dropped::bot_token_refused() => "token_refused".to_owned(),
        state => state.to_owned(),
    };
    let trusted = auth::carries(&headers, &token);
    let reveal = |reason: Option<String>, hidden: &str| {
        reason.map(|r| if trusted { r } else { hidden.to_owned() })
    };
    let config_error = reveal(app.config_error(), CONFIG_ERROR_HIDDEN);
    let warnings = app.config_warnings();
    let config_held = reveal(app.config_held_for(), CONFIG_HELD_HIDDEN);
    let config = match (&config_error, &config_held) {
        (Some(_), _) => "stale",
        (None, Some(_)) => "held",
        (None, None) => "ok",
    };
    // The reason names the database's path: with the token only, as the
    // config's.
    let storage_error = reveal(app.store().storage_problem(), STORAGE_ERROR_HIDDEN);
    let (status, code, sessions) = match app.live_count().await {
        // Sessions are being stopped: send no new work here.
        _ if app.stopping() => ("shutting_down", StatusCode::SERVICE_UNAVAILABLE, 0),
        Ok(sessions) if storage_error.is_none() => ("ok", StatusCode::OK, sessions),
        Ok(sessions) => ("unavailable", StatusCode::SERVICE_UNAVAILABLE, sessions),
        Err(e) => {
            tracing::warn!("health check failed: {e}");
            ("unavailable", StatusCode::SERVICE_UNAVAILABLE, 0)
        }
    };
    let body = Health {
        status: status.into(),
        sessions,
        slack,
        config: config.into(),
        config_error,
        config_held,
        storage_error,
        slack_dropped: crate::slack::dropped::dropped_total(),
        slack_refused: crate::slack::dropped::refused_total(),
        restart_needed: app
            .restart_needed()
            .into_iter()
            .map(str::to_owned)
            .collect(),
        config_warnings: warnings.len(),
        config_warning_texts: if trusted { warnings } else { Vec::new() },
    };
    (code, Json(body)).into_response()
}

/// `POST /api/sessions` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartBody {
    workspace: Option<String>,
    path: Option<PathBuf>,
    prompt: String,
    agent: Option<String>,
    /// `ask`, `auto-edits` or `auto`; default: the workspace's mode.
    mode: Option<String>,
}

/// `POST /api/sessions`.
pub async fn create_session(
    State(app): State<App>,
    ApiJson(body): ApiJson<StartBody>,
) -> ApiResult<(StatusCode, Json<SessionView>)> {
    if body.workspace.is_some() && body.path.is_some() {
        return Err(ApiError::bad_request(
            "give either \"workspace\" or \"path\", not both",
        ));
    }
    let target = Target {
        workspace: body.workspace,
        path: body.path,
        agent: body.agent,
    };
    let mode = match body.mode.as_deref() {
        None => None,
        Some(m) => Some(super::rules::parse_mode(m)?),
    };
    let record = app
        .start_session_in_mode(target, &body.prompt, LOCAL_OWNER, mode)
        .await?;
    Ok((StatusCode::CREATED, Json(record.into())))
}

/// `GET /api/sessions` query (an unknown parameter is a 400, as on the
/// other lists: a typo must not read as "the filter found nothing new").
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    all: bool,
}

/// `GET /api/sessions[?all=true]`.
pub async fn list_sessions(
    State(app): State<App>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> ApiResult<Json<Vec<SessionView>>> {
    let sessions = app.list_sessions(query.all).await?;
    Ok(Json(sessions.into_iter().map(SessionView::from).collect()))
}

/// `GET /api/sessions/{id}`.
pub async fn get_session(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<SessionDetailView>> {
    let detail = app.session_detail(&SessionId(id)).await?;
    Ok(Json(detail.into()))
}

/// `POST /api/sessions/{id}/prompt` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptBody {
    text: String,
    #[serde(default)]
    interrupt: bool,
}

/// `POST /api/sessions/{id}/prompt`.
pub async fn prompt(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<PromptBody>,
) -> ApiResult<(StatusCode, Json<PromptAccepted>)> {
    let outcome = app
        .steer(&SessionId(id), &body.text, body.interrupt, Caller::local())
        .await?;
    let answer = PromptAccepted {
        queued: outcome.queued,
        paused: outcome.paused,
    };
    Ok((StatusCode::ACCEPTED, Json(answer)))
}

/// `POST /api/sessions/{id}/restart`.
pub async fn restart(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
    _: NoBody,
) -> ApiResult<(StatusCode, Json<SessionView>)> {
    let record = app.restart(&SessionId(id), Caller::local()).await?;
    Ok((StatusCode::ACCEPTED, Json(record.into())))
}

/// `POST /api/sessions/{id}/revive`: `200` with the session once its agent
/// is back (a session that ended by idle timeout; `409` for any other).
pub async fn revive(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
    _: NoBody,
) -> ApiResult<Json<SessionView>> {
    let record = app.revive(&SessionId(id), Caller::local()).await?;
    Ok(Json(record.into()))
}

/// `POST /api/sessions/{id}/cancel`: `200` with the ended session, or `202`
/// with `"status": "stopping"` while the agent is still being terminated.
pub async fn cancel(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
    _: NoBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let outcome = app.cancel(&SessionId(id), Caller::local()).await?;
    let mut view = serde_json::to_value(SessionView::from(outcome.record))
        .map_err(|e| AppError::Internal(format!("cannot render the session: {e}")))?;
    if outcome.stopping {
        view["status"] = Value::from("stopping");
        return Ok((StatusCode::ACCEPTED, Json(view)));
    }
    Ok((StatusCode::OK, Json(view)))
}

/// `GET /api/approvals` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalQuery {
    status: Option<String>,
    before: Option<i64>,
    limit: Option<usize>,
    /// Without the diffs (a list that needs only who waits since when).
    #[serde(default)]
    brief: bool,
}

/// `GET /api/approvals[?status=pending|decided|cancelled|expired|all][&before=K][&limit=N][&brief=true]`:
/// a page, newest first, with a `Link` to the older page ([`paging`]).
pub async fn list_approvals(
    State(app): State<App>,
    ApiQuery(query): ApiQuery<ApprovalQuery>,
) -> ApiResult<Response> {
    let status = match query.status.as_deref() {
        None | Some("all") => None,
        Some(s) => Some(RequestStatus::parse(s).ok_or_else(|| {
            ApiError::bad_request(format!(
                "status must be pending, decided, cancelled, expired or all, not {s:?}"
            ))
        })?),
    };
    let bounds = paging::bounds(query.before, query.limit)?;
    let page = app.approvals(status, bounds).await?;
    let views: Vec<ApprovalView> = page
        .items
        .into_iter()
        .map(|mut r| {
            if query.brief {
                r.diff = None;
            }
            ApprovalView::new(r, None)
        })
        .collect();
    let mut response = Json(views).into_response();
    let mut kept: Vec<String> = status
        .map(|s| format!("status={}", s.as_str()))
        .into_iter()
        .collect();
    if query.brief {
        kept.push("brief=true".to_owned());
    }
    let kept = kept.join("&");
    paging::link_older(
        &mut response,
        "/api/approvals",
        &kept,
        page.next,
        bounds.limit,
    );
    Ok(response)
}

/// `GET /api/approvals/{id}`.
pub async fn get_approval(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<ApprovalView>> {
    let (request, decision) = app.approval(&id).await?;
    Ok(Json(ApprovalView::new(request, decision)))
}

/// `POST /api/approvals/{id}` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    option_id: Option<String>,
    decision: Option<String>,
    reason: Option<String>,
}

impl DecideBody {
    fn choice(&self) -> Result<Choice, ApiError> {
        match (&self.option_id, self.decision.as_deref()) {
            (Some(_), Some(_)) => Err(ApiError::bad_request(
                "give either \"option_id\" or \"decision\", not both",
            )),
            (Some(option), None) => Ok(Choice::Option(option.clone())),
            (None, Some("approve")) => Ok(Choice::Approve),
            (None, Some("reject")) => Ok(Choice::Reject),
            (None, Some(other)) => Err(ApiError::bad_request(format!(
                "decision must be \"approve\" or \"reject\", not {other:?}"
            ))),
            (None, None) => Err(ApiError::bad_request(
                "give \"option_id\" or \"decision\": \"approve\" | \"reject\"",
            )),
        }
    }
}

/// `POST /api/approvals/{id}`.
pub async fn decide(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<DecideBody>,
) -> ApiResult<Json<ApprovalView>> {
    let choice = body.choice()?;
    let reason = body.reason.filter(|r| !r.trim().is_empty());
    let (request, decision) = app.decide(&id, choice, reason, Caller::local()).await?;
    Ok(Json(ApprovalView::new(request, Some(decision))))
}

/// Any other path under `/api`.
pub async fn not_found() -> ApiError {
    ApiError::App(AppError::NotFound(
        "no such API route; see docs/api.md".into(),
    ))
}

/// A known path with the wrong method.
pub async fn method_not_allowed() -> Response {
    let body = ErrorBody {
        error: "method not allowed on this route; see docs/api.md".into(),
        code: "method_not_allowed".into(),
        status: None,
    };
    (StatusCode::METHOD_NOT_ALLOWED, Json(body)).into_response()
}
