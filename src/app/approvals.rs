//! Approvals as the operator sees them: one by its global id, a list, and
//! the decision on one (routed straight to the session that asked, never
//! through the supervisor's mailbox).

use intercom_actors::model::{Decided, Decision, PendingRequest, RequestStatus};
use intercom_actors::session::Choice;
use intercom_actors::session::calls::{self, Answer};

use crate::storage::pages::{Bounds, Page};

use super::*;
use intercom_actors::text::log_safe;

impl App {
    /// One approval request with its decision, by global id.
    pub async fn approval(
        &self,
        global_id: &str,
    ) -> Result<(PendingRequest, Option<Decision>), AppError> {
        self.inner
            .store
            .get_request(global_id)
            .await?
            .ok_or_else(|| no_request(global_id))
    }

    /// A page of approval requests, newest first, optionally only those in
    /// `status`.
    pub async fn approvals(
        &self,
        status: Option<RequestStatus>,
        bounds: Bounds,
    ) -> Result<Page<PendingRequest>, AppError> {
        Ok(self.inner.store.requests_page(status, bounds).await?)
    }

    /// Decides on a pending request by its global id (`<session_id>:req-N`).
    /// Returns the request (now decided) and the recorded decision.
    pub async fn decide(
        &self,
        global_id: &str,
        choice: Choice,
        reason: Option<String>,
        caller: Caller,
    ) -> Result<(PendingRequest, Decision), AppError> {
        let (session, request_id) =
            split_request_id(global_id).ok_or_else(|| no_request(global_id))?;
        // The live session knows its pending requests and answers with the
        // request it closed (or why not): no read of the row on this path.
        // Only without a running agent is the row read, to say why.
        let Some(actor) = self.actor(&session).await? else {
            let (req, _) = self.approval(global_id).await?;
            return Err(AppError::Conflict {
                message: match req.status {
                    RequestStatus::Pending => format!(
                        "session {session} has no running agent to answer request {global_id}"
                    ),
                    status => super::errors::already(global_id, status.as_str()),
                },
                status: None,
            });
        };
        let answer = Answer {
            request_id: request_id.to_owned(),
            choice,
            reason,
            caller,
        };
        let Decided { request, decision } = calls::decide(&actor, answer, CALL_TIMEOUT_MS)
            .await
            .map_err(|e| AppError::actor("session", e))??;
        // The option id is the agent's: escaped, it cannot forge log lines.
        tracing::info!(
            request = %log_safe(global_id),
            option = %log_safe(&decision.option_id),
            approved = decision.approved,
            by = %log_safe(&decision.decided_by),
            "request decided"
        );
        Ok((request, decision))
    }
}

/// No such approval; an id without its session says what an id looks like
/// (`ctl approve req-1` answered only "no approval request req-1").
fn no_request(global_id: &str) -> AppError {
    let hint = if global_id.contains(':') {
        ""
    } else {
        ": approval ids are <session-id>:req-N, as `ctl pending` and GET /api/approvals list them"
    };
    AppError::NotFound(format!("no approval request {global_id}{hint}"))
}
