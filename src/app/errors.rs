//! What the server's operations answer when they fail: [`AppError`], whose
//! [`AppError::code`] is the stable machine-readable code the HTTP API sends,
//! built from the actors' own errors so each keeps its advice to the caller.

use intercom_actors::model::{SessionRecord, SessionStatus};
use intercom_actors::ports::StoreError;
use intercom_actors::registry::ResolveError;
use intercom_actors::session::SessionError;
use intercom_actors::supervisor::SupervisorError;

/// Why an operation was refused. The variant decides the HTTP status; the
/// message is shown to the operator as is.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AppError {
    /// The request itself is wrong (empty prompt, bad option, no target).
    #[error("{0}")]
    BadRequest(String),
    /// No such session, request, workspace, agent or path.
    #[error("{0}")]
    NotFound(String),
    /// Not allowed (a path outside `workspace_root`, not the owner).
    #[error("{0}")]
    Forbidden(String),
    /// `limits.max_sessions` reached.
    #[error("{0}")]
    LimitReached(String),
    /// The agent did not start; no session was kept.
    #[error("{0}")]
    AgentStartFailed(String),
    /// The target is not in a state that allows it (ended session, decided request).
    #[error("{message}")]
    Conflict {
        /// What is wrong.
        message: String,
        /// The session's current status, when that is the reason.
        status: Option<SessionStatus>,
    },
    /// Storage failed: nothing was acknowledged (the message says so, or
    /// what was done before it failed).
    #[error("{0}")]
    Storage(String),
    /// The server is shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// An actor did not answer (a bug or a crash).
    #[error("internal error: {0}")]
    Internal(String),
}

impl AppError {
    /// The stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            AppError::BadRequest(_) => "bad_request",
            AppError::NotFound(_) => "not_found",
            AppError::Forbidden(_) => "forbidden",
            AppError::LimitReached(_) => "limit_reached",
            AppError::AgentStartFailed(_) => "agent_start_failed",
            AppError::Conflict { .. } => "conflict",
            AppError::Storage(_) => "storage_error",
            AppError::Unavailable(_) => "unavailable",
            AppError::Internal(_) => "internal",
        }
    }

    pub(super) fn conflict_status(status: SessionStatus, message: String) -> Self {
        AppError::Conflict {
            message,
            status: Some(status),
        }
    }

    /// A session that has no agent any more: what to do instead (one that
    /// ended without being stopped can be revived).
    pub(super) fn ended(record: &SessionRecord) -> Self {
        let status = record.status;
        if status.is_live() {
            // No actor while its record says live: between a crash and the
            // restart (or a start queued behind others). It comes back.
            return Self::conflict_status(
                status,
                format!(
                    "session {} is {status}: its agent is being started or restarted; retry once it is ready (GET /api/sessions/{})",
                    record.id, record.id
                ),
            );
        }
        if record.revivable() {
            let id = &record.id;
            let how = if record.ended_by_idle_timeout() {
                "ended by idle timeout;".to_owned()
            } else if record.status_reason.as_deref()
                == Some(intercom_actors::model::SERVER_SHUTDOWN)
            {
                "was stopped by a server shutdown;".to_owned()
            } else {
                format!("is {status}; fix what ended it, then")
            };
            return Self::conflict_status(
                status,
                format!(
                    "session {how} revive it (POST /api/sessions/{id}/revive, `ctl revive {id}`) or start a new one"
                ),
            );
        }
        Self::conflict_status(status, format!("session is {status}; start a new one"))
    }

    pub(super) fn actor(what: &str, e: impl std::fmt::Display) -> Self {
        AppError::Internal(format!("{what}: {e}"))
    }
}

/// Why a request can no longer be decided, and what to look at instead.
pub(crate) fn already(id: &str, status: &str) -> String {
    let hint = match status {
        "expired" => {
            "; its answer can no longer reach anyone: the server restarted after it was asked, or an MCP client's wait for it ran out ([mcp] approval_timeout_secs, or transmit_timeout_secs for a question, which then went on by itself). An agent that still needs it asks again under a new id (GET /api/approvals?status=pending)"
        }
        "cancelled" => {
            "; its turn or session ended, or its agent withdrew it, before anyone decided"
        }
        _ => "",
    };
    format!("request {id} is already {status}{hint}")
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { what } => AppError::NotFound(format!("{what} not found")),
            StoreError::AlreadyResolved { id, status } => AppError::Conflict {
                message: already(&id, &status.to_string()),
                status: None,
            },
            other @ StoreError::Backend { .. } => {
                let message = other.to_string();
                let advice = intercom_actors::ports::storage_advice(&message);
                AppError::Storage(format!("nothing was done: {message}{advice}"))
            }
        }
    }
}

impl From<ResolveError> for AppError {
    fn from(e: ResolveError) -> Self {
        match e {
            ResolveError::NoTarget | ResolveError::InsideWorkspace { .. } => {
                AppError::BadRequest(e.to_string())
            }
            ResolveError::OutsideRoot { .. } => AppError::Forbidden(e.to_string()),
            ResolveError::UnknownWorkspace(..)
            | ResolveError::UnknownAgent(..)
            | ResolveError::NoAgent
            | ResolveError::PathNotFound(_)
            | ResolveError::WorkspaceDirMissing { .. } => AppError::NotFound(e.to_string()),
        }
    }
}

impl From<SupervisorError> for AppError {
    fn from(e: SupervisorError) -> Self {
        let message = e.to_string();
        match e {
            SupervisorError::LimitReached { .. } | SupervisorError::McpLimitReached { .. } => {
                AppError::LimitReached(message)
            }
            SupervisorError::EmptyPrompt => AppError::BadRequest(message),
            SupervisorError::StartFailed(_) | SupervisorError::StartFailedKept { .. } => {
                AppError::AgentStartFailed(message)
            }
            SupervisorError::Storage(_) => AppError::Storage(message),
            SupervisorError::ShuttingDown => AppError::Unavailable(message),
            SupervisorError::NotRevivable(_) | SupervisorError::StoppedBeforeReady => {
                AppError::Conflict {
                    message,
                    status: None,
                }
            }
            SupervisorError::Unauthorized { .. } => AppError::Forbidden(message),
        }
    }
}

impl From<SessionError> for AppError {
    fn from(e: SessionError) -> Self {
        let message = e.to_string();
        match e {
            SessionError::Unauthorized { .. } => AppError::Forbidden(message),
            SessionError::NotFound(_) => AppError::NotFound(message),
            SessionError::InvalidOption { .. } => AppError::BadRequest(message),
            SessionError::AlreadyResolved { id, status } => AppError::Conflict {
                message: already(&id, &status.to_string()),
                status: None,
            },
            SessionError::NotLive(status) => AppError::conflict_status(status, message),
            SessionError::Storage(_) => AppError::Storage(message),
            SessionError::NotOffered(_) => AppError::BadRequest(message),
            SessionError::AgentRefused(_) | SessionError::Paused(_) => AppError::Conflict {
                message,
                status: None,
            },
        }
    }
}

/// Why the application could not be started.
#[derive(Debug, thiserror::Error)]
pub enum AppStartError {
    /// An actor failed to spawn.
    #[error("cannot start the {actor} actor: {message}")]
    Spawn {
        /// Which actor.
        actor: &'static str,
        /// ractor's message.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A walk-through's deleted database answered "storage unavailable,
    /// nothing was done: storage failed, nothing was done: ... restart the
    /// server ...; check the database ... and retry".
    #[test]
    fn a_storage_failure_says_nothing_was_done_once_and_one_thing_to_do() {
        let gone = || {
            StoreError::Backend {
            op: "commit writes",
            message: "the database file was replaced (it would be lost at the next restart): restart the server".into(),
        }
        };
        for e in [
            AppError::from(SupervisorError::Storage(gone().to_string())),
            AppError::from(SessionError::Storage(gone().to_string())),
            AppError::from(gone()),
        ] {
            let text = e.to_string();
            assert_eq!(text.matches("nothing was").count(), 1, "{text}");
            assert_eq!(text.matches("storage failed").count(), 1, "{text}");
            assert!(text.contains("restart the server"), "{text}");
            assert!(!text.contains("retry"), "{text}");
            assert_eq!(e.code(), "storage_error");
        }
        let full = StoreError::Backend {
            op: "commit writes",
            message: "database or disk is full".into(),
        };
        let text = AppError::from(full).to_string();
        assert!(
            text.ends_with("check the database (disk space, permissions) and retry"),
            "{text}"
        );
    }

    #[test]
    fn errors_have_stable_codes() {
        let limit: AppError = SupervisorError::LimitReached { max: 1 }.into();
        assert_eq!(limit.code(), "limit_reached");
        let outside: AppError = ResolveError::OutsideRoot {
            path: "/".into(),
            root: "/r".into(),
        }
        .into();
        assert_eq!(outside.code(), "forbidden");
        let missing: AppError = ResolveError::PathNotFound("x".into()).into();
        assert_eq!(missing.code(), "not_found");
        let ended: AppError = SessionError::NotLive(SessionStatus::Completed).into();
        assert_eq!(
            ended,
            AppError::Conflict {
                message: "session is completed; start a new one".into(),
                status: Some(SessionStatus::Completed)
            }
        );
        // A live record with no actor: between a crash and its restart.
        let mut restarting = crate::storage::tests::rec("s-1");
        restarting.status = SessionStatus::Starting;
        let AppError::Conflict { message, status } = AppError::ended(&restarting) else {
            panic!("a conflict")
        };
        assert!(message.contains("retry once it is ready"), "{message}");
        assert_eq!(status, Some(SessionStatus::Starting));
        let stopping: AppError = SessionError::NotLive(SessionStatus::Active).into();
        assert!(stopping.to_string().contains("stopping"), "{stopping}");
        let storage: AppError = StoreError::Backend {
            op: "x",
            message: "disk full".into(),
        }
        .into();
        assert_eq!(storage.code(), "storage_error");
    }
}
