//! Noticing that an MCP client hung up on a tool call.
//!
//! rmcp's streamable HTTP transport answers a `tools/call` on the POST's own
//! SSE stream and does not tell the call when that stream is dropped
//! because the client went away. A call that waits for a human
//! (`check_clearance`, `transmit`, `standby`) then kept waiting: its request
//! stayed pending for an operator whose answer nobody would receive, and
//! `standby` took steering that never reached anyone. This middleware gives
//! each request a token that is cancelled when its response body is dropped
//! before it ended; the waiting tools treat it as the call being cancelled
//! (the request is closed `cancelled`, steering stays queued).

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Body as _, Frame, SizeHint};
use rmcp::RoleServer;
use rmcp::service::RequestContext;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Cancelled when the client hung up before its answer was complete.
#[derive(Debug, Clone)]
pub(crate) struct HungUp(CancellationToken);

/// Middleware: gives the request a [`HungUp`] and watches its response body.
pub(crate) async fn watch(mut req: Request, next: Next) -> Response {
    let gone = CancellationToken::new();
    req.extensions_mut().insert(HungUp(gone.clone()));
    let (parts, body) = next.run(req).await.into_parts();
    Response::from_parts(
        parts,
        Body::new(Watched {
            inner: body,
            gone: Some(gone),
        }),
    )
}

/// A response body that cancels its token when dropped before its end.
struct Watched {
    inner: Body,
    /// Taken once the body ended: dropping it then means nothing.
    gone: Option<CancellationToken>,
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.gone = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(gone) = self.gone.take()
            && !self.inner.is_end_stream()
        {
            gone.cancel();
        }
    }
}

/// A token cancelled when the call is cancelled (`notifications/cancelled`)
/// or its client hung up, for as long as the returned guard lives.
pub(crate) fn cancelled_or_hung_up(
    ctx: &RequestContext<RoleServer>,
) -> (CancellationToken, DropGuard) {
    let token = ctx.ct.child_token();
    let hung_up = ctx
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<HungUp>())
        .cloned();
    if let Some(HungUp(gone)) = hung_up {
        let t = token.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = gone.cancelled() => t.cancel(),
                () = t.cancelled() => {}
            }
        });
    }
    let guard = token.clone().drop_guard();
    (token, guard)
}
