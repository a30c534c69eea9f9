//! Calls that are not durable: ephemeral answers (handed to their users'
//! turns, `ephemeral.rs`) and modals.
//!
//! Why this exists: an ephemeral answer to a click and a modal opened with a
//! trigger id are worthless a few seconds later, so they skip the outbox and
//! the lanes. They still draw from their rate-limit bucket (waiting for a
//! token rather than drawing a `429`), wait out a pause a `429` imposed, and
//! retry a few times.

use std::sync::Arc;
use std::time::{Duration, Instant};

use governor::DefaultDirectRateLimiter;
use ractor::RpcReplyPort;
use serde_json::Value;

use super::ephemeral::Ephemeral;
use super::pacing::{Bucket, Method};
use super::{GatewayState, IMMEDIATE_ATTEMPTS};
use crate::slack_port::SlackApiError;

/// When a non-durable call may go: a pause to wait out, a bucket to draw from.
pub(super) struct Gate {
    pub pause: Option<Instant>,
    pub limiter: Option<Arc<DefaultDirectRateLimiter>>,
}

impl GatewayState {
    fn gate(&mut self, method: Method, channel: &str) -> Gate {
        let bucket = Bucket::of(method, channel);
        Gate {
            pause: self.pacer.paused_until(&bucket, Instant::now()),
            limiter: self.pacer.limiter(&bucket),
        }
    }

    /// Sends an ephemeral message to `user` (not durable), in that user's
    /// turn (`ephemeral.rs`).
    pub(super) fn send_ephemeral(&mut self, answer: Ephemeral) {
        self.ephemeral.send(answer);
    }

    /// Opens a modal (not durable: trigger ids expire in seconds).
    pub(super) fn open_view(
        &mut self,
        trigger_id: String,
        view: Value,
        reply: Option<RpcReplyPort<Result<(), SlackApiError>>>,
    ) {
        let api = self.args.api.clone();
        let gate = self.gate(Method::ViewsOpen, "");
        tokio::spawn(async move {
            let r = immediate(gate, || api.open_view(&trigger_id, &view)).await;
            if let Err(e) = &r {
                tracing::warn!("modal not opened: {e}");
            }
            if let Some(reply) = reply {
                let _ = reply.send(r);
            }
        });
    }
}

/// Runs a non-durable call: waits out a pause and for a token, retries a few times.
pub(super) async fn immediate<F, Fut>(gate: Gate, mut call: F) -> Result<(), SlackApiError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), SlackApiError>>,
{
    if let Some(until) = gate.pause {
        tokio::time::sleep_until(until.into()).await;
    }
    let mut attempt = 0;
    loop {
        attempt += 1;
        if let Some(limiter) = &gate.limiter {
            limiter.until_ready().await;
        }
        match call().await {
            Ok(()) => return Ok(()),
            Err(SlackApiError::RateLimited { retry_after }) if attempt < IMMEDIATE_ATTEMPTS => {
                tokio::time::sleep(retry_after).await;
            }
            Err(SlackApiError::Transient(_)) if attempt < IMMEDIATE_ATTEMPTS => {
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
            Err(e) => return Err(e),
        }
    }
}
