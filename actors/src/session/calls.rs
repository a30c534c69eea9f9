//! Calls into a session actor from outside it (the HTTP API and Slack), each
//! built once so every front end asks the session the same way.

use ractor::{ActorRef, RactorErr};

use super::{Caller, Choice, SessionError, SessionMsg};
use crate::model::Decision;

/// What an operator decided on one pending request.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Session-scoped request id (`req-1`).
    pub request_id: String,
    /// What was chosen.
    pub choice: Choice,
    /// Reason / feedback / refine instruction.
    pub reason: Option<String>,
    /// Who.
    pub caller: Caller,
}

/// Asks `actor` to record `answer`, waiting at most `timeout_ms` for the
/// recorded decision (or the session's refusal).
pub async fn decide(
    actor: &ActorRef<SessionMsg>,
    answer: Answer,
    timeout_ms: u64,
) -> Result<Result<Decision, SessionError>, RactorErr<SessionMsg>> {
    let Answer {
        request_id,
        choice,
        reason,
        caller,
    } = answer;
    ractor::call_t!(
        actor,
        |reply| SessionMsg::Decide {
            request_id,
            choice,
            reason,
            caller,
            reply
        },
        timeout_ms
    )
}
