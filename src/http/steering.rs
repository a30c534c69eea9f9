//! A session's steering as stored: `GET /api/sessions/{id}/steering`.
//!
//! Why this exists: steering is stored before it is delivered, so what was
//! sent, what is still queued and what reached the agent is known to the
//! server, not only to the page that sent it. The web console lists it from
//! here (and keeps it current from the event stream).

use axum::Json;
use axum::extract::State;
use intercom_actors::model::SessionId;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiPath};
use crate::app::App;

/// How many of the latest steering messages are listed.
const LISTED: u32 = 200;

/// One steering message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SteeringView {
    /// Increasing id (the `steering_id` of `steering_delivered` events).
    pub id: i64,
    /// The text sent.
    pub text: String,
    /// Who sent it.
    pub author: String,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms it reached the agent; `null` while queued.
    pub delivered_at: Option<i64>,
}

/// `GET /api/sessions/{id}/steering`: the latest 200, oldest first.
pub async fn list(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Vec<SteeringView>>, ApiError> {
    let id = SessionId(id);
    app.session(&id).await?;
    let rows = app
        .store()
        .steering_history(&id, LISTED)
        .await
        .map_err(crate::app::AppError::from)?;
    Ok(Json(
        rows.into_iter()
            .map(|(s, delivered_at)| SteeringView {
                id: s.id,
                text: s.text,
                author: s.author,
                created_at: s.created_at,
                delivered_at,
            })
            .collect(),
    ))
}
