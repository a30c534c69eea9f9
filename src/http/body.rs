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
//!
//! Every request body, on every route (the API, `/mcp`, the console's login
//! form), must also arrive within [`BODY_DEADLINE`] of its request
//! ([`body_deadline`]). The listener never sheds a connection whose request
//! head is complete (it may be waiting for its answer), so without the
//! deadline a client sending its body a byte at a time would hold its
//! connection for as long as it liked.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};

use super::error::ApiError;

/// The most a request body may hold (axum's `DefaultBodyLimit`, which the
/// JSON extractor applies too).
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// How long a request's body may take to arrive, counted from when its
/// handling began (loopback delivers megabytes in milliseconds).
pub const BODY_DEADLINE: Duration = Duration::from_secs(30);

/// How long the console's login form may take to arrive. It is the one
/// body anyone may send without a token (a token and a key, which a browser
/// sends at once): a probe held 8,400 connections with `POST /login` heads
/// and no body, 30 s each, and `/healthz` took seconds to answer.
pub const LOGIN_BODY_DEADLINE: Duration = Duration::from_secs(5);

/// Middleware: the request's body fails to read once [`BODY_DEADLINE`] has
/// passed ([`LOGIN_BODY_DEADLINE`] for the login form; the handler answers
/// with its usual "cannot read the body").
pub async fn body_deadline(request: Request, next: Next) -> Response {
    use http_body::Body as _;
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let after = deadline_for(request.uri().path());
    let (parts, body) = request.into_parts();
    let body = deadlined(body, after);
    next.run(Request::from_parts(parts, body)).await
}

/// How long a body sent to `path` may take.
fn deadline_for(path: &str) -> Duration {
    if path == "/login" {
        LOGIN_BODY_DEADLINE
    } else {
        BODY_DEADLINE
    }
}

/// Whether reading a body failed because it did not arrive in time.
pub fn too_slow(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(s) = source {
        if s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// What a client whose body did not arrive in time is told (408).
pub fn too_slow_message() -> String {
    format!(
        "the request body did not arrive within {} s; send the whole body at once",
        BODY_DEADLINE.as_secs()
    )
}

/// `body`, failing to read once `after` has passed before it ended.
fn deadlined(body: Body, after: Duration) -> Body {
    Body::new(Deadlined {
        inner: body,
        after,
        deadline: Box::pin(tokio::time::sleep(after)),
    })
}

/// A body that errs once its deadline passes before it ended.
struct Deadlined {
    inner: Body,
    after: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for Deadlined {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the request body did not arrive within {} ms",
                    self.after.as_millis()
                ),
            ))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Buffers the body (up to [`MAX_BODY_BYTES`]), then runs the handler on it.
pub async fn read_whole_body(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(e) if too_slow(&e) => ApiError::BodyTooSlow(too_slow_message()).into_response(),
        Err(e) => ApiError::bad_request(format!(
            "cannot read the request body ({e}); send at most {MAX_BODY_BYTES} bytes of JSON"
        ))
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn trickled() -> Body {
        let first =
            futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from_static(b"{\"a")) });
        Body::from_stream(first.chain(futures::stream::pending()))
    }

    /// A body that never ends is cut at its deadline, saying so: the
    /// handler answers, and the connection is free again.
    #[tokio::test]
    async fn a_body_that_never_ends_fails_at_its_deadline() {
        let body = deadlined(trickled(), Duration::from_millis(50));
        let err = axum::body::to_bytes(body, 1 << 20).await.expect_err("cut");
        assert!(err.to_string().contains("did not arrive within"), "{err}");
        assert!(too_slow(&err), "{err:?}");
    }

    /// The one body sent without a token has the short deadline.
    #[test]
    fn the_login_form_has_the_short_deadline() {
        assert_eq!(deadline_for("/login"), LOGIN_BODY_DEADLINE);
        assert!(LOGIN_BODY_DEADLINE < BODY_DEADLINE);
        for path in ["/api/sessions", "/mcp", "/logout", "/login/x"] {
            assert_eq!(deadline_for(path), BODY_DEADLINE, "{path}");
        }
    }

    #[tokio::test]
    async fn a_body_that_arrives_is_read_whole() {
        let body = deadlined(Body::from("hello"), Duration::from_millis(50));
        let bytes = axum::body::to_bytes(body, 64).await.expect("read");
        assert_eq!(&bytes[..], b"hello");
        let too_big = axum::body::to_bytes(Body::from("hello"), 2)
            .await
            .expect_err("limit");
        assert!(!too_slow(&too_big), "a size error is not a slow body");
    }
}
