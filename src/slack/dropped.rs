//! Messages for the Slack gateway that could not be handed to it.
//!
//! The gateway is the only writer to Slack; when its mailbox is gone (it
//! stopped or failed) a send fails. That must never be silent: every such
//! loss is logged with what was lost and counted (the running total is in
//! the log line, in [`dropped_total`] and in `/healthz` as `slack_dropped`). What the operator sees in Slack
//! is also in SQLite (transcript, requests, audit), so nothing is lost from
//! the record, only from the Slack view.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use intercom_actors::gateway::GatewayMsg;

use crate::root::Current;

static DROPPED: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);
static TOKEN_REFUSED: AtomicBool = AtomicBool::new(false);

/// Slack's error codes that mean the bot token no longer works.
const TOKEN_CODES: [&str; 5] = [
    "invalid_auth",
    "not_authed",
    "token_revoked",
    "token_expired",
    "account_inactive",
];

/// How many messages Slack refused for good since the server started
/// (each is logged, and kept in the outbox marked failed).
pub fn refused_total() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// Whether Slack's last answer to a message was that the bot token does not
/// work (revoked, expired): every post fails then, while Socket Mode, on the
/// app token, may still connect.
pub fn bot_token_refused() -> bool {
    TOKEN_REFUSED.load(Ordering::Relaxed)
}

/// Records a message Slack refused for good with `code`.
pub fn note_refused(code: &str) {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    if TOKEN_CODES.contains(&code) {
        TOKEN_REFUSED.store(true, Ordering::Relaxed);
    }
}

/// Records a message Slack refuses until someone acts (kept, retried): a
/// refused token shows on `/healthz` as for a refusal for good.
pub fn note_blocked(code: &str) {
    if TOKEN_CODES.contains(&code) {
        TOKEN_REFUSED.store(true, Ordering::Relaxed);
    }
}

/// Records a message Slack took: the bot token works.
pub fn note_taken() {
    TOKEN_REFUSED.store(false, Ordering::Relaxed);
}

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
    fn refusals_are_counted_and_a_refused_token_shown_until_a_message_goes_out() {
        let before = refused_total();
        note_refused("channel_not_found");
        assert!(refused_total() > before);
        note_refused("token_revoked");
        assert!(bot_token_refused());
        note_taken();
        assert!(!bot_token_refused());
    }

    #[test]
    fn a_lost_message_is_counted() {
        let before = dropped_total();
        note("a test message", &"gateway gone");
        assert!(dropped_total() > before);
    }
}
