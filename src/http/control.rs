//! Session controls and the audit log over HTTP:
//! `POST /api/sessions/{id}/pause|resume|nudge` and `GET /api/audit`.
//!
//! Why this exists: the web console offers every control Slack has, and it
//! acts only through the API, so these are API routes like the others (the
//! same token, the same [`App`] operations, the same errors).

use axum::Json;
use axum::extract::State;
use intercom_actors::model::SessionId;
use intercom_actors::session::Caller;
use serde::{Deserialize, Serialize};

use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ApiPath, ApiQuery, NoBody};
use super::paging;
use crate::app::App;
use crate::ctl::client::segment;

/// The answer of a control: what was done to which session.
#[derive(Debug, Serialize, Deserialize)]
pub struct ControlDone {
    /// The session.
    pub session_id: String,
    /// `paused`, `resumed` or `nudged`.
    pub done: String,
}

fn done(id: String, what: &str) -> Json<ControlDone> {
    Json(ControlDone {
        session_id: id,
        done: what.to_owned(),
    })
}

/// `POST /api/sessions/{id}/pause`.
pub async fn pause(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
    _: NoBody,
) -> Result<Json<ControlDone>, ApiError> {
    app.pause(&SessionId(id.clone()), true, Caller::local())
        .await?;
    Ok(done(id, "paused"))
}

/// `POST /api/sessions/{id}/resume`.
pub async fn resume(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
    _: NoBody,
) -> Result<Json<ControlDone>, ApiError> {
    app.pause(&SessionId(id.clone()), false, Caller::local())
        .await?;
    Ok(done(id, "resumed"))
}

/// `POST /api/sessions/{id}/nudge`.
pub async fn nudge(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
    _: NoBody,
) -> Result<Json<ControlDone>, ApiError> {
    app.nudge(&SessionId(id.clone()), Caller::local()).await?;
    Ok(done(id, "nudged"))
}

/// `GET /api/audit` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    session: Option<String>,
    before: Option<i64>,
    limit: Option<usize>,
}

/// One audit entry.
#[derive(Debug, Serialize, Deserialize)]
pub struct AuditView {
    /// Unix ms.
    pub at: i64,
    /// The session concerned, if any.
    pub session_id: Option<String>,
    /// Who (`local`, a Slack user id, `rule:<id>`, `mode:<mode>`, `system`).
    pub actor: String,
    /// What, e.g. `permission.decided`.
    pub action: String,
    /// Details.
    pub detail: serde_json::Value,
}

/// `GET /api/audit[?session=ID][&before=K][&limit=N]`: a page, newest
/// first, with a `Link` to the older page ([`paging`]).
pub async fn audit(
    State(app): State<App>,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<Response, ApiError> {
    let session = query.session.filter(|s| !s.is_empty()).map(SessionId);
    let bounds = paging::bounds(query.before, query.limit)?;
    let page = app.audit_page(session.as_ref(), bounds).await?;
    if let Some(id) = &session
        && page.items.is_empty()
        && bounds.before.is_none()
    {
        // No entries at all: a typo'd id must not read as a quiet session
        // (404, as `GET /api/events?session=` says). Entries of a session
        // whose record is gone are still listed.
        app.session(id).await?;
    }
    let views: Vec<AuditView> = page
        .items
        .into_iter()
        .map(|(at, e)| AuditView {
            at,
            session_id: e.session_id.map(|s| s.0),
            actor: e.actor,
            action: e.action,
            detail: e.detail,
        })
        .collect();
    let mut response = Json(views).into_response();
    let kept = session
        .map(|s| format!("session={}", segment(&s.0)))
        .unwrap_or_default();
    paging::link_older(&mut response, "/api/audit", &kept, page.next, bounds.limit);
    Ok(response)
}
