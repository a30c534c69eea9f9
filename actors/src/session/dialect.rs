//! The older "intercom" dialect, as a session takes it in: a clearance
//! request becomes a permission request with Approve / Reject, a forwarded
//! prompt one with Continue / Refine / Stop, a status line agent text and a
//! heartbeat's progress the plan. The dialect's wire types are in
//! [`crate::protocol::intercom`]; the requests it opens are judged and
//! answered like ACP's ([`super::inbound`]).

use super::SessionState;
use super::inbound::Opening;
use crate::model::{MessageKind, OptionKind, PermissionOption, RequestKind, Role};
use crate::ports::OperatorEvent;
use crate::protocol::intercom::{ClearanceRequest, DialectError, DialectIn};
use crate::protocol::jsonrpc::{RpcId, RpcMessage};

impl SessionState {
    /// One message of the dialect; one it cannot read is refused on its id
    /// when it has one.
    pub(super) async fn on_dialect_message(&mut self, msg: RpcMessage) {
        match DialectIn::from_message(&msg) {
            Ok(DialectIn::Clearance { id, req }) => self.on_clearance(id, req).await,
            Ok(DialectIn::PromptForward { id, text, kind }) => {
                self.on_prompt_forward(id, text, kind).await;
            }
            Ok(DialectIn::Status { message }) => self.on_status(message).await,
            Ok(DialectIn::Heartbeat { progress }) => {
                if !progress.is_empty() {
                    self.on_plan(progress).await;
                }
            }
            Err(e) => {
                self.warn_agent(|| format!("skipping intercom message: {e}"));
                self.answer_malformed(&msg, &e).await;
            }
        }
    }

    /// `clearance/request`: the agent asks to change files.
    async fn on_clearance(&mut self, id: RpcId, req: ClearanceRequest) {
        let title = format!(
            "{} ({} risk): {}",
            req.title, req.risk_level, req.description
        );
        let paths = req.paths();
        let opened = self
            .open_request(Opening {
                wire: id,
                from_mcp: false,
                command: None,
                kind: RequestKind::Permission,
                tool_kind: Some("edit".into()),
                title,
                diff: req.diff,
                paths,
                unlisted: 0,
                options: options(&[
                    ("approve", "Approve", OptionKind::AllowOnce),
                    ("reject", "Reject", OptionKind::RejectOnce),
                ]),
                write: None,
            })
            .await;
        if let Ok(n) = opened {
            self.apply_rules(n, Some("edit".into()), None).await;
        }
    }

    /// `prompt/forward`: the agent asks whether to go on.
    async fn on_prompt_forward(&mut self, id: RpcId, text: String, kind: String) {
        // A refusal was already answered to the agent.
        let _ = self
            .open_request(Opening {
                wire: id,
                from_mcp: false,
                command: None,
                kind: RequestKind::ForwardedPrompt,
                tool_kind: None,
                title: format!("[{kind}] {text}"),
                diff: None,
                paths: vec![],
                unlisted: 0,
                options: options(&[
                    ("continue", "Continue", OptionKind::AllowOnce),
                    ("refine", "Refine", OptionKind::AllowOnce),
                    ("stop", "Stop", OptionKind::RejectOnce),
                ]),
                write: None,
            })
            .await;
    }

    /// `status/update`: a line of agent text, within its write budget.
    async fn on_status(&mut self, message: String) {
        if !self.agent_may_write(message.len()).await {
            return;
        }
        self.note(Role::Agent, MessageKind::Text, &message);
        self.emit(OperatorEvent::AgentText {
            session_id: self.id().clone(),
            text: message,
        });
    }

    /// A clearance or a forwarded prompt the dialect could not read, but
    /// with an id to answer: refused, with the reason, so the agent does not
    /// wait for ever (it was only logged), and the operator is told once.
    async fn answer_malformed(&mut self, msg: &RpcMessage, e: &DialectError) {
        let RpcMessage::Request { id, method, .. } = msg else {
            return;
        };
        let kind = match method.as_str() {
            "clearance/request" => RequestKind::Permission,
            "prompt/forward" => RequestKind::ForwardedPrompt,
            _ => return,
        };
        let why = format!("{e}; nothing was asked: send it again with every field");
        let note = format!(
            "The agent sent a {method} the server could not read ({e}); it was refused and told why."
        );
        self.refuse_request(id.clone(), false, kind, &why, note)
            .await;
    }
}

/// The options the server offers for a dialect request (the dialect has
/// none of its own).
fn options(list: &[(&str, &str, OptionKind)]) -> Vec<PermissionOption> {
    list.iter()
        .map(|&(id, name, kind)| PermissionOption {
            id: id.into(),
            name: name.into(),
            kind,
        })
        .collect()
}
