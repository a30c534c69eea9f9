//! Messages for the Slack gateway that could not be handed to it.
//!
//! The gateway is the only writer to Slack; when its mailbox is gone (it
//! stopped or failed) a send fails. That must never be silent: every such
//! loss is logged with what was lost and counted (the running total is in
//! the log line, in [`dropped_total`] and in `/healthz` as `slack_dropped`). What the operator sees in Slack
//! is also in SQLite (transcript, requests, audit), so nothing is lost from
//! the record, only from the Slack view.

use std::sync::atomic::{AtomicU64, Ordering};

use intercom_actors::gateway::GatewayMsg;

use crate::root::Current;

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// How many messages for the gateway were lost since the server started.
pub fn dropped_total() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Records one lost message: `what` names it.
pub fn note(what: &str, error: &dyn std::fmt::Display) {
    let total = DROPPED.fetch_add(1, Ordering::Relaxed) + 1;
    tracing::error!(
        dropped_total = total,
        "{what} could not be handed to the Slack gateway ({error}); it is in the store but not shown in Slack"
    );
}

/// Sends `msg` to the gateway's current incarnation; a failure is logged
/// and counted.
pub fn send(gateway: &Current<GatewayMsg>, msg: GatewayMsg, what: &str) {
    if let Err(e) = gateway.get().send_message(msg) {
        note(what, &e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_message_is_counted() {
        let before = dropped_total();
        note("a test message", &"gateway gone");
        assert!(dropped_total() > before);
    }
}
