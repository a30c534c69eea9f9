//! Errors as JSON, and extractors whose rejections are JSON too.
//!
//! Every failed `/api` call answers `{"error": "...", "code": "..."}` with a
//! stable code (see [`crate::app::AppError::code`]); axum's own plain-text
//! rejections (bad JSON, bad query string) are mapped to `bad_request`.

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::views::ErrorBody;
use crate::app::AppError;

/// Seconds a client should wait after `limit_reached`.
pub const RETRY_AFTER_SECS: u32 = 60;

/// A failed API call.
#[derive(Debug)]
pub enum ApiError {
    /// An application error.
    App(AppError),
    /// No or a wrong bearer token.
    Unauthorized(String),
    /// The request's body did not arrive in time (`body::BODY_DEADLINE`).
    BodyTooSlow(String),
}

impl From<AppError> for ApiError {
    fn from(e: AppError) -> Self {
        ApiError::App(e)
    }
}

impl ApiError {
    /// A `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::App(AppError::BadRequest(message.into()))
    }

    fn status(&self) -> StatusCode {
        let e = match self {
            ApiError::App(e) => e,
            ApiError::Unauthorized(_) => return StatusCode::UNAUTHORIZED,
            ApiError::BodyTooSlow(_) => return StatusCode::REQUEST_TIMEOUT,
        };
        match e {
            AppError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AppError::NotFound(_) => StatusCode::NOT_FOUND,
            AppError::Forbidden(_) => StatusCode::FORBIDDEN,
            AppError::LimitReached(_) => StatusCode::TOO_MANY_REQUESTS,
            AppError::AgentStartFailed(_) => StatusCode::BAD_GATEWAY,
            AppError::Conflict { .. } => StatusCode::CONFLICT,
            AppError::Storage(_) | AppError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn body(&self) -> ErrorBody {
        match self {
            ApiError::Unauthorized(message) => ErrorBody {
                error: message.clone(),
                code: "unauthorized".into(),
                status: None,
            },
            ApiError::BodyTooSlow(message) => ErrorBody {
                error: message.clone(),
                code: "request_timeout".into(),
                status: None,
            },
            ApiError::App(e) => ErrorBody {
                error: e.to_string(),
                code: e.code().into(),
                status: match e {
                    AppError::Conflict { status, .. } => *status,
                    _ => None,
                },
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            // An error can quote what an agent sent (a start failure quotes
            // its stderr): escaped, it cannot forge log lines.
            tracing::warn!(
                code = self.body().code,
                "API error: {}",
                intercom_actors::text::log_safe(&self.body().error)
            );
        }
        let mut response = (status, Json(self.body())).into_response();
        let headers = response.headers_mut();
        match &self {
            ApiError::Unauthorized(_) => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::App(AppError::LimitReached(_)) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            }
            ApiError::App(_) | ApiError::BodyTooSlow(_) => {}
        }
        response
    }
}

/// A JSON body whose rejection is a JSON `bad_request`.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let value = match Json::<serde_json::Value>::from_request(req, state).await {
            Ok(Json(value)) => value,
            Err(rejection) => return Err(json_rejection(&rejection)),
        };
        // Every body is an object with named fields: serde would also take
        // a list of the fields' values in order (`["text", false]`), and its
        // errors would name the server's own types.
        if !value.is_object() {
            return Err(ApiError::bad_request(
                "the body must be a JSON object with named fields; see docs/api.md",
            ));
        }
        serde_json::from_value(value)
            .map(ApiJson)
            .map_err(|e| ApiError::bad_request(format!("bad JSON body: {e}")))
    }
}

/// The body of a route that takes none (stop, restart, revive, pause,
/// resume, nudge): nothing, or `{}` (what clients that always send JSON
/// send). Anything else is refused: a probe's `{"dry_run": true}` on a stop
/// was ignored, and the session stopped.
#[derive(Debug)]
pub struct NoBody;

impl<S: Send + Sync> FromRequest<S> for NoBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
        let text = std::str::from_utf8(&bytes).unwrap_or("?").trim();
        if text.is_empty() {
            return Ok(NoBody);
        }
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(o)) if o.is_empty() => Ok(NoBody),
            Ok(serde_json::Value::Null) => Ok(NoBody),
            Ok(serde_json::Value::Object(o)) => {
                let names: Vec<&str> = o.keys().map(String::as_str).take(5).collect();
                Err(ApiError::bad_request(format!(
                    "this route takes no body, so nothing in it is done: unknown field(s) {}; send none, or {{}} (see docs/api.md)",
                    names
                        .iter()
                        .map(|n| format!("{:?}", intercom_actors::text::one_line(n, 64)))
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
            _ => Err(ApiError::bad_request(
                "this route takes no body; send none, or {} (see docs/api.md)",
            )),
        }
    }
}

fn json_rejection(rejection: &JsonRejection) -> ApiError {
    let detail = rejection.body_text();
    let message = match rejection {
        JsonRejection::MissingJsonContentType(_) => {
            "send the body as JSON with Content-Type: application/json".to_owned()
        }
        _ => format!("bad JSON body: {detail}"),
    };
    ApiError::bad_request(message)
}

/// A query string whose rejection is a JSON `bad_request`.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => Err(query_rejection(&rejection)),
        }
    }
}

fn query_rejection(rejection: &QueryRejection) -> ApiError {
    ApiError::bad_request(format!("bad query string: {}", rejection.body_text()))
}

/// Path parameters whose rejection (an id that is not UTF-8, say) is a
/// JSON `bad_request` like every other error of the API.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(ApiPath(value)),
            Err(rejection) => Err(ApiError::bad_request(format!(
                "bad path: {}",
                rejection.body_text()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_error_kind() {
        let cases = [
            (AppError::BadRequest("x".into()), 400),
            (AppError::NotFound("x".into()), 404),
            (AppError::Forbidden("x".into()), 403),
            (AppError::LimitReached("x".into()), 429),
            (AppError::AgentStartFailed("x".into()), 502),
            (
                AppError::Conflict {
                    message: "x".into(),
                    status: None,
                },
                409,
            ),
            (AppError::Storage("x".into()), 503),
        ];
        for (err, want) in cases {
            assert_eq!(ApiError::App(err).status().as_u16(), want);
        }
        assert_eq!(ApiError::Unauthorized("x".into()).status().as_u16(), 401);
    }

    #[test]
    fn limit_reached_carries_retry_after() {
        let response = ApiError::App(AppError::LimitReached("full".into())).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            response
                .headers()
                .get(header::RETRY_AFTER)
                .map(|v| v.as_bytes()),
            Some(&b"60"[..])
        );
    }
}
