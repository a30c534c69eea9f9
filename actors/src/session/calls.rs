//! Calls into a session actor from outside it (the HTTP API and Slack), each
//! built once so every front end asks the session the same way.

use ractor::{ActorRef, RactorErr};

use super::{Caller, Choice, SessionError, SessionMsg, StopCause};
use crate::model::Decided;
use crate::rules::ApprovalMode;

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
/// recorded decision and the request it closed (or the session's refusal).
pub async fn decide(
    actor: &ActorRef<SessionMsg>,
    answer: Answer,
    timeout_ms: u64,
) -> Result<Result<Decided, SessionError>, RactorErr<SessionMsg>> {
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

/// What a front end's call into a session answers: the session's own
/// outcome, or why it did not answer.
pub type Outcome = Result<Result<(), SessionError>, RactorErr<SessionMsg>>;

/// Asks `actor` to pause (`true`: hold steering, no nudges) or resume.
pub async fn pause(
    actor: &ActorRef<SessionMsg>,
    pause: bool,
    caller: Caller,
    timeout_ms: u64,
) -> Outcome {
    if pause {
        ractor::call_t!(
            actor,
            |reply| SessionMsg::Pause { caller, reply },
            timeout_ms
        )
    } else {
        ractor::call_t!(
            actor,
            |reply| SessionMsg::Resume { caller, reply },
            timeout_ms
        )
    }
}

/// Asks `actor` to stop because the operator `caller` said so.
pub async fn stop(actor: &ActorRef<SessionMsg>, caller: Caller, timeout_ms: u64) -> Outcome {
    ractor::call_t!(
        actor,
        |reply| SessionMsg::Stop {
            cause: StopCause::Operator,
            caller,
            reply: Some(reply)
        },
        timeout_ms
    )
}

/// Asks `actor` to switch its approval mode (persisted by the session).
pub async fn set_mode(
    actor: &ActorRef<SessionMsg>,
    mode: ApprovalMode,
    caller: Caller,
    timeout_ms: u64,
) -> Outcome {
    ractor::call_t!(
        actor,
        |reply| SessionMsg::SetMode {
            mode,
            caller,
            reply
        },
        timeout_ms
    )
}
