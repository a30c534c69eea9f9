//! Why a session could not start ([`StartError`]) and why an operator's
//! action on it was refused ([`SessionError`]); each message says what to
//! do next.

use crate::model::{SessionId, SessionStatus};
use crate::ports::StoreError;

/// Why starting failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StartError {
    /// Could not spawn.
    #[error("{0}")]
    Spawn(String),
    /// The handshake did not finish in time.
    #[error(
        "agent `{agent}` did not finish the ACP handshake within {secs} s (limits.startup_timeout_secs): no answer to {step}{stdout}{}",
        stderr_suffix(.stderr)
    )]
    Timeout {
        /// Profile.
        agent: String,
        /// Seconds.
        secs: u64,
        /// The handshake request left unanswered (`initialize`, ...).
        step: &'static str,
        /// The last of what the agent wrote to stderr (why it is stuck).
        stderr: String,
        /// What it wrote to stdout that was not JSON-RPC, when anything
        /// ([`unreadable_stdout`]).
        stdout: String,
    },
    /// The agent exited during startup.
    #[error("agent `{agent}` exited during startup ({exit}){}", stderr_suffix(.stderr))]
    Exited {
        /// Profile.
        agent: String,
        /// Exit description.
        exit: String,
        /// stderr tail.
        stderr: String,
    },
    /// The agent requires authentication and none is configured (or it failed).
    #[error(
        "agent `{agent}` requires authentication ({detail}); it offers: {methods}. Set `auth_method` in its [[agent]] profile and pass the credentials through `env`"
    )]
    AuthRequired {
        /// Profile.
        agent: String,
        /// Offered methods.
        methods: String,
        /// What the agent said.
        detail: String,
    },
    /// A handshake call failed.
    #[error("agent `{agent}` failed {method}: {error}")]
    Handshake {
        /// Profile.
        agent: String,
        /// Method.
        method: String,
        /// Error.
        error: String,
    },
    /// Storage failed: what was asked was not done.
    #[error("nothing was done: {0}{advice}", advice = crate::ports::storage_advice(.0))]
    Storage(String),
}

/// "; it wrote 3 lines to stdout that are not JSON-RPC (the first: ...)":
/// an agent CLI started without its ACP flag prints its usage or a prompt
/// there, and the timeout alone did not say so.
pub(super) fn unreadable_stdout((count, first): &(u64, Option<String>)) -> String {
    match (count, first) {
        (0, _) | (_, None) => String::new(),
        (n, Some(first)) => format!(
            "; it wrote {n} line{} to stdout that {} not JSON-RPC (the first: «{first}»): is it started in its ACP mode (its `args`, e.g. `--acp`)?",
            if *n == 1 { "" } else { "s" },
            if *n == 1 { "is" } else { "are" }
        ),
    }
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        "; it wrote nothing to stderr".to_owned()
    } else {
        format!("; stderr: {stderr}")
    }
}

/// Why an operator action was refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SessionError {
    /// Not the owner and not an operator.
    #[error("{user} may not act on session {session}: only its owner ({owner}) and operators may")]
    Unauthorized {
        /// Who tried.
        user: String,
        /// Which session.
        session: SessionId,
        /// Its owner.
        owner: String,
    },
    /// No such pending request.
    #[error("no pending request {0} in this session")]
    NotFound(String),
    /// The option is not one the agent offered.
    #[error("option {option:?} is not offered; choose one of: {valid}")]
    InvalidOption {
        /// Given.
        option: String,
        /// Offered.
        valid: String,
    },
    /// Already decided / cancelled / expired.
    #[error("request {id} is already {status}")]
    AlreadyResolved {
        /// Global id.
        id: String,
        /// Its status.
        status: String,
    },
    /// The session no longer runs an agent (or is ending: its status is
    /// still a live one while it stops).
    #[error("{}", not_live(*.0))]
    NotLive(SessionStatus),
    /// Storage refused the write; nothing was sent to the agent.
    #[error("could not record it, so nothing was sent to the agent: {0}")]
    Storage(String),
    /// The agent does not offer that mode, model or option value.
    #[error("{0}")]
    NotOffered(String),
    /// The agent answered the switch with an error.
    #[error("{0}")]
    AgentRefused(String),
    /// The session is paused: nothing reaches the agent until it is resumed.
    #[error("session is paused; resume it first (then {0})")]
    Paused(&'static str),
}

impl From<StoreError> for SessionError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::AlreadyResolved { id, status } => {
                SessionError::AlreadyResolved { id, status }
            }
            other => SessionError::Storage(other.to_string()),
        }
    }
}

/// What to do about a session that cannot take an operator's action now.
fn not_live(status: SessionStatus) -> String {
    if status.is_live() {
        format!("session is stopping (it was {status}); start a new one once it has ended")
    } else {
        format!("session is {status}; start a new one")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_that_wrote_nothing_is_not_shown_with_an_empty_stderr() {
        let silent = StartError::Exited {
            agent: "a".into(),
            exit: "exit code 3".into(),
            stderr: String::new(),
        };
        assert_eq!(
            silent.to_string(),
            "agent `a` exited during startup (exit code 3); it wrote nothing to stderr"
        );
        let loud = StartError::Exited {
            agent: "a".into(),
            exit: "exit code 3".into(),
            stderr: "no API key".into(),
        };
        assert!(loud.to_string().ends_with("; stderr: no API key"), "{loud}");
    }
}
