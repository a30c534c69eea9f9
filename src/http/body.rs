//! Reads an authenticated request's whole body before its handler runs.
//!
//! Why this exists: hyper keeps a connection alive for the next request only
//! once this request's body was read. A handler that answers without reading
//! it (a route that takes no body, like `restart`, or an error found before
//! the body is looked at) made hyper close the connection whenever the body
//! arrived after the headers, and a client that sent its next request on the
//! kept-alive connection saw it fail ("peer disconnected"; a flaky
//! `tests/api.rs` run). The API's bodies are small JSON; the limit is the
//! JSON extractor's own, so nothing that was accepted before is refused now.
//! Runs after the token check: an unauthenticated body is never read.

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// The most a request body may hold (axum's `DefaultBodyLimit`, which the
/// JSON extractor applies too).
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Buffers the body (up to [`MAX_BODY_BYTES`]), then runs the handler on it.
pub async fn read_whole_body(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(e) => ApiError::bad_request(format!(
            "cannot read the request body ({e}); send at most {MAX_BODY_BYTES} bytes of JSON"
        ))
        .into_response(),
    }
}
