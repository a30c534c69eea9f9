//! Operator decisions on pending requests.
//!
//! The order is the contract: check who is asking, check the option, commit
//! the decision to storage, and only then answer the agent. A decision that
//! cannot be stored is refused and the agent is not answered, so what the
//! agent did is always what the record says.

use std::sync::Arc;

use serde_json::json;

use super::toolcalls::Cover;
use super::{Caller, Choice, Pending, SessionError, SessionState};
use crate::model::{
    AuditEntry, Decided, Decision, MessageKind, OptionKind, PendingRequest, PermissionOption,
    RequestKind, RequestStatus, Role, now_ms,
};
use crate::ports::{NoticeLevel, OperatorEvent};
use crate::protocol::acp;
use crate::protocol::jsonrpc::{RpcError, RpcId, codes};

/// A decision recorded and answered, and whether the answer itself told
/// the agent the decision's reason (an ACP permission answer does not).
pub(super) struct Resolved {
    pub(super) decided: Decided,
    pub(super) reason_told: bool,
}

impl SessionState {
    pub(super) fn find_pending(&self, request_id: &str) -> Option<u64> {
        self.pending
            .iter()
            .find(|(_, p)| p.record.request_id == request_id || p.record.id == request_id)
            .map(|(n, _)| *n)
    }

    pub(super) async fn decide(
        &mut self,
        request_id: &str,
        choice: Choice,
        reason: Option<String>,
        caller: &Caller,
    ) -> Result<Decided, SessionError> {
        self.authorize(caller, "decide").await?;
        let Some(n) = self.find_pending(request_id) else {
            let prefix = format!("{}:", self.id());
            let global = if request_id.starts_with(&prefix) {
                request_id.to_owned()
            } else {
                PendingRequest::global_id(self.id(), request_id)
            };
            return match self.store.get_request(&global).await {
                Ok(Some((req, _))) => Err(SessionError::AlreadyResolved {
                    id: req.id,
                    status: req.status.as_str().to_owned(),
                }),
                _ => Err(SessionError::NotFound(request_id.to_owned())),
            };
        };
        let Resolved {
            decided,
            reason_told,
        } = self.resolve(n, &choice, reason, &caller.id).await?;
        // A person acted: the agent is being watched, so what it may write
        // starts again (an IDE agent's turns are its requests).
        self.budget.renew();
        self.pass_on_reason(&decided, reason_told, caller).await;
        Ok(decided)
    }

    /// A person's reason for a rejection reaches the agent and the
    /// transcript. ACP's answer to a permission request carries only the
    /// option chosen, so the reason goes as steering (after the turn, or at
    /// once when idle); the dialect and a refused write carry it in the
    /// answer itself. It was kept in the approval record alone: "Reject with
    /// feedback" asked for words the agent never heard.
    async fn pass_on_reason(&mut self, d: &Decided, reason_told: bool, caller: &Caller) {
        let Some(reason) = d
            .decision
            .reason
            .as_deref()
            .filter(|r| !r.trim().is_empty())
        else {
            return;
        };
        let verdict = if d.decision.approved {
            "Approved"
        } else {
            "Rejected"
        };
        let title = crate::text::one_line(&d.request.title, 200);
        self.emit_notice(
            NoticeLevel::Info,
            &format!("{verdict} by {}: {title} — {reason}", d.decision.decided_by),
        )
        .await;
        if reason_told || d.decision.approved {
            return;
        }
        // Not the agent's own title: text injected into it would come back
        // to the model in the operator's words.
        let text = format!(
            "The operator rejected your permission request ({}) and says: {reason}",
            d.request.request_id
        );
        if let Err(e) = self.steer(text, false, caller).await {
            tracing::warn!(session = %self.id(), "the rejection's reason was not queued for the agent: {e}");
        }
    }

    /// Records and answers a decision on pending request `n` (no auth check).
    pub(super) async fn resolve(
        &mut self,
        n: u64,
        choice: &Choice,
        reason: Option<String>,
        decided_by: &str,
    ) -> Result<Resolved, SessionError> {
        // Looked at in place: a request can carry a whole file's content,
        // and it stays in `pending` until its decision is committed.
        let Some(pending) = self.pending.get(&n) else {
            return Err(SessionError::NotFound(format!("req-{n}")));
        };
        let option = pick_option(pending, choice)?;
        let decision = Decision {
            option_id: option.id.clone(),
            approved: option.kind.is_allow(),
            reason,
            decided_by: decided_by.to_owned(),
            decided_at: now_ms(),
        };
        // Commit first; only a recorded decision reaches the agent.
        // The audit entry is part of the same write: stored with the
        // decision, before the agent hears of it, in one commit.
        let id = pending.record.id.clone();
        let entry = AuditEntry {
            session_id: Some(self.record.id.clone()),
            actor: decided_by.to_owned(),
            action: "request.decided".to_owned(),
            detail: json!({"request": id, "option": decision.option_id, "approved": decision.approved, "reason": decision.reason}),
        };
        let (store, decided) = (Arc::clone(&self.store), decision.clone());
        self.ledger
            .wait(async move { store.decide_request_audited(&id, &decided, &entry).await })
            .await?;
        // The actor handles one message at a time: nothing took it meanwhile.
        let Some(pending) = self.pending.remove(&n) else {
            return Err(SessionError::NotFound(format!("req-{n}")));
        };
        // A decided request (by a person, a rule or a mode) does not count
        // against the turn's requests: only ones left undecided pile up,
        // and a long autonomous turn in mode `auto` asks many.
        self.budget.refund_request();
        if decision.approved
            && let Some(announced) = pending.announced.clone()
        {
            self.toolcalls.grant(&pending.record.id, announced);
        }
        let reason_told = self.answer(&pending, &decision).await;
        self.emit(OperatorEvent::RequestClosed {
            session_id: self.id().clone(),
            id: pending.record.id.clone(),
            status: RequestStatus::Decided,
            decision: Some(decision.clone()),
        });
        self.last_any = std::time::Instant::now();
        if self.pending.is_empty() {
            self.show_activity("working", None);
        }
        let request = PendingRequest {
            status: RequestStatus::Decided,
            ..pending.record
        };
        Ok(Resolved {
            decided: Decided { request, decision },
            reason_told,
        })
    }

    /// Writes the decision to the agent in its protocol. False when the
    /// answer cannot carry the decision's reason (ACP's permission answer
    /// holds only the option chosen).
    async fn answer(&mut self, pending: &Pending, decision: &Decision) -> bool {
        if let Some(waiter) = self.mcp_waiters.remove(&pending.number) {
            let _ = waiter.send(super::McpAnswer::Decided(decision.clone()));
            return true;
        }
        let wire = pending.wire.clone();
        match (self.is_acp(), pending.record.kind) {
            (true, RequestKind::FileWrite) => {
                let result = if decision.approved {
                    match &pending.write {
                        Some(w) => self.perform_write(&w.path, &w.content, &w.shown).await,
                        None => Err(RpcError::new(codes::INTERNAL_ERROR, "nothing to write")),
                    }
                } else {
                    let why = decision.reason.as_deref().unwrap_or("no reason given");
                    Err(RpcError::new(
                        codes::AUTH_REQUIRED + 1,
                        format!("write rejected by the operator: {why}"),
                    ))
                };
                self.respond(wire, result);
            }
            (true, _) if pending.cancel_option.as_ref() == Some(&decision.option_id) => {
                self.respond(wire, Ok(acp::permission_cancelled()));
                return false;
            }
            (true, _) => {
                self.respond(wire, Ok(acp::permission_selected(&decision.option_id)));
                return false;
            }
            (false, RequestKind::ForwardedPrompt) => {
                let bytes = self.dialect.prompt_response(
                    &wire,
                    &decision.option_id,
                    decision.reason.as_deref(),
                );
                self.send_bytes(bytes);
            }
            (false, _) => {
                let bytes = self.dialect.clearance_response(
                    &wire,
                    decision.approved,
                    decision.reason.as_deref(),
                );
                self.send_bytes(bytes);
            }
        }
        true
    }

    /// Performs a write an earlier decision already covers (one human
    /// decision per change) and records which decision covered it. The path
    /// is resolved beneath the workspace again, exactly like an approved write.
    pub(super) async fn write_covered(
        &mut self,
        wire: RpcId,
        path: String,
        content: String,
        rel: &str,
        cover: Cover,
    ) {
        let result = self.perform_write(&path, &content, rel).await;
        let ok = result.is_ok();
        self.respond(wire, result);
        self.audit(
            "system",
            "fs.write_covered",
            json!({"path": rel, "bytes": content.len(), "covered_by": cover.request,
                   "tool_call_id": cover.tool_call_id, "written": ok}),
        )
        .await;
        let text = if ok {
            format!("Wrote {rel}, as approved in {}.", cover.request)
        } else {
            format!("Writing {rel} (approved in {}) failed.", cover.request)
        };
        self.note(Role::System, MessageKind::Text, &text);
        self.last_any = std::time::Instant::now();
    }
}

impl SessionState {
    /// Answers every pending request as cancelled (ACP requires it when a
    /// turn is cancelled) and records that.
    pub(super) async fn cancel_pending(&mut self, why: &str) {
        let all: Vec<Pending> = std::mem::take(&mut self.pending).into_values().collect();
        for pending in all {
            self.answer_cancelled(&pending);
            self.close_request(&pending, RequestStatus::Cancelled, why)
                .await;
        }
    }

    /// `$/cancel_request`: the agent withdraws a request it made. One
    /// still waiting is closed as cancelled, so the operator is no longer
    /// asked about something the agent gave up on, and answered -32800, as
    /// ACP asks of a peer that honours the notification. Without this, the
    /// operator's later answer reached the agent as the answer to a new
    /// request it made with the same id. Anything else is ignored.
    pub(super) async fn agent_withdrew(&mut self, params: &serde_json::Value) {
        let Some(wire) = params
            .get("requestId")
            .and_then(|v| serde_json::from_value::<RpcId>(v.clone()).ok())
        else {
            self.warn_agent(|| "skipping $/cancel_request without a requestId".to_owned());
            return;
        };
        let Some(number) = self
            .pending
            .values()
            .find(|p| p.wire == wire && !self.mcp_waiters.contains_key(&p.number))
            .map(|p| p.number)
        else {
            return;
        };
        if !self.budget.take_withdrawal() {
            self.warn_agent(|| {
                format!(
                    "ignored $/cancel_request: the agent withdrew {} requests since the last prompt; the request waits for the operator",
                    super::budget::WITHDRAWALS_PER_TURN
                )
            });
            return;
        }
        let Some(pending) = self.pending.remove(&number) else {
            return;
        };
        self.respond(
            wire,
            Err(RpcError::new(
                codes::REQUEST_CANCELLED,
                "request cancelled: the agent withdrew it",
            )),
        );
        self.close_request(&pending, RequestStatus::Cancelled, "withdrawn by the agent")
            .await;
        // Said in the transcript: a card that vanished read as decided.
        let text = format!(
            "The agent withdrew its request {}; nothing was decided.",
            request_label(&pending.record)
        );
        self.emit_notice(NoticeLevel::Info, &text).await;
        if self.pending.is_empty() {
            self.show_activity("working", None);
        }
    }

    fn answer_cancelled(&mut self, pending: &Pending) {
        if let Some(waiter) = self.mcp_waiters.remove(&pending.number) {
            let _ = waiter.send(super::McpAnswer::Closed(RequestStatus::Cancelled));
            return;
        }
        if self.exited {
            return; // nobody left to answer
        }
        let wire = pending.wire.clone();
        match (self.is_acp(), pending.record.kind) {
            (true, kind) => self.respond(
                wire,
                acp_cancelled(kind, "write cancelled: the turn was cancelled"),
            ),
            (false, RequestKind::ForwardedPrompt) => {
                let bytes = self
                    .dialect
                    .prompt_response(&wire, "stop", Some("cancelled"));
                self.send_bytes(bytes);
            }
            (false, _) => {
                let bytes = self
                    .dialect
                    .clearance_response(&wire, false, Some("cancelled"));
                self.send_bytes(bytes);
            }
        }
    }

    pub(super) async fn close_request(
        &mut self,
        pending: &Pending,
        status: RequestStatus,
        why: &str,
    ) {
        let (store, id) = (Arc::clone(&self.store), pending.record.id.clone());
        let closed = self
            .ledger
            .wait(async move { store.close_request(&id, status).await })
            .await;
        if let Err(e) = closed {
            tracing::error!(session = %self.record.id, "closing request {}: {e}", pending.record.id);
        }
        self.audit(
            "system",
            "request.closed",
            json!({"request": pending.record.id, "status": status.as_str(), "why": why}),
        )
        .await;
        self.emit(OperatorEvent::RequestClosed {
            session_id: self.id().clone(),
            id: pending.record.id.clone(),
            status,
            decision: None,
        });
    }
}

/// How ACP ends a request of a cancelled turn: a write with "request
/// cancelled" (-32800) and `why`, a permission with the `cancelled`
/// outcome. One answer for a turn cut by a stop or a pause, and for a
/// request made after it.
pub(super) fn acp_cancelled(
    kind: RequestKind,
    why: impl Into<String>,
) -> Result<serde_json::Value, RpcError> {
    match kind {
        RequestKind::FileWrite => Err(RpcError::new(codes::REQUEST_CANCELLED, why)),
        _ => Ok(acp::permission_cancelled()),
    }
}

/// A request as the transcript names it: `req-1 (title)`.
pub(super) fn request_label(record: &PendingRequest) -> String {
    format!(
        "{} ({})",
        record.request_id,
        crate::text::one_line(&record.title, 80)
    )
}

/// The id of the option added when an agent offers no way to say no.
const SERVER_REJECT: &str = "intercom-reject";

/// Adds a `Reject` option when the agent offered only allow kinds, so the
/// operator (and a deny rule) can always say no; choosing it answers the
/// agent's request `cancelled`, the one outcome ACP has besides the options.
/// Returns its id, unique among the agent's.
pub(super) fn add_reject_if_missing(options: &mut Vec<PermissionOption>) -> Option<String> {
    if options.iter().any(|o| !o.kind.is_allow()) {
        return None;
    }
    let id = (0..)
        .map(|i| match i {
            0 => SERVER_REJECT.to_owned(),
            i => format!("{SERVER_REJECT}-{i}"),
        })
        .find(|id| options.iter().all(|o| &o.id != id))?;
    options.push(PermissionOption {
        id: id.clone(),
        name: "Reject".into(),
        kind: OptionKind::RejectOnce,
    });
    Some(id)
}

fn pick_option<'a>(
    pending: &'a Pending,
    choice: &Choice,
) -> Result<&'a PermissionOption, SessionError> {
    let options = &pending.record.options;
    let found = match choice {
        Choice::Option(id) => options.iter().find(|o| &o.id == id),
        Choice::Approve => options
            .iter()
            .find(|o| o.kind == OptionKind::AllowOnce)
            .or_else(|| options.iter().find(|o| o.kind.is_allow())),
        Choice::Reject => options
            .iter()
            .find(|o| o.kind == OptionKind::RejectOnce)
            .or_else(|| options.iter().find(|o| !o.kind.is_allow())),
    };
    found.ok_or_else(|| SessionError::InvalidOption {
        option: match choice {
            Choice::Option(id) => id.clone(),
            Choice::Approve => "approve".into(),
            Choice::Reject => "reject".into(),
        },
        valid: options
            .iter()
            .map(|o| o.id.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    })
}
