//! MCP tool calls as session messages.
//!
//! An IDE agent connected over MCP is a session without a child process: its
//! blocking tools (`check_clearance`, `transmit`, `standby`) become pending
//! requests or waits answered through oneshot channels, and its non-blocking
//! ones (`ping`, `broadcast`) feed the same transcript, stall clock and
//! operator events as an ACP agent. ACP agents that use the server as their
//! MCP server (the ACP-MCP bridge) send the same calls to their own session.

use std::time::Instant;

use serde_json::json;
use tokio::sync::oneshot;

use super::{Phase, SessionState, StopCause};
use crate::model::{
    Decision, MessageKind, OptionKind, PermissionOption, RequestKind, RequestStatus, Role, Steering,
};
use crate::ports::{NoticeLevel, OperatorEvent};
use crate::protocol::jsonrpc::RpcId;

/// How a blocking MCP request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpAnswer {
    /// The operator decided.
    Decided(Decision),
    /// It was cancelled or expired without a decision.
    Closed(RequestStatus),
}

/// A tool call (or transport event) from an MCP client.
#[derive(Debug)]
pub enum McpCall {
    /// `check_clearance`: ask to apply a change.
    Clearance {
        /// Title.
        title: String,
        /// Description.
        description: String,
        /// Unified diff or whole-file content.
        diff: Option<String>,
        /// Every file the change writes, relative to the workspace
        /// (`file_path`, or each `+++` path of a diff over several files):
        /// rules and the operator judge all of them, not only `file_path`.
        paths: Vec<String>,
        /// low / medium / high.
        risk_level: String,
        /// The global request id once stored, or why it was not opened.
        opened: oneshot::Sender<Result<String, String>>,
        /// The outcome.
        reply: oneshot::Sender<McpAnswer>,
    },
    /// `transmit`: forward a continuation prompt.
    Transmit {
        /// Prompt text.
        text: String,
        /// Prompt type.
        kind: String,
        /// The global request id once stored, or why it was not opened.
        opened: oneshot::Sender<Result<String, String>>,
        /// The outcome (option id continue / refine / stop, reason = instruction).
        reply: oneshot::Sender<McpAnswer>,
    },
    /// `standby`: wait for an operator instruction (None when it stopped waiting).
    Standby {
        /// What the agent says while it waits.
        message: Option<String>,
        /// The instruction.
        reply: oneshot::Sender<Option<String>>,
    },
    /// `ping`: liveness; returns queued steering (now delivered).
    Ping {
        /// Status line.
        status: Option<String>,
        /// Progress items as (label, status).
        progress: Vec<(String, String)>,
        /// Steering handed over.
        reply: oneshot::Sender<Vec<Steering>>,
    },
    /// `broadcast`: a status line for the thread.
    Broadcast {
        /// The message.
        message: String,
        /// info / warning / error.
        level: NoticeLevel,
    },
    /// The client cancelled a blocking call or it timed out.
    Abandon {
        /// Global request id.
        request_id: String,
        /// `cancelled` (client) or `expired` (timeout).
        status: RequestStatus,
    },
    /// The client stopped waiting in `standby`.
    StandbyAbandoned,
    /// The MCP connection is gone (MCP sessions end; bridged ACP sessions ignore it).
    Disconnected,
}

fn option(id: &str, name: &str, kind: OptionKind) -> PermissionOption {
    PermissionOption {
        id: id.into(),
        name: name.into(),
        kind,
    }
}

impl SessionState {
    pub(super) async fn on_mcp(&mut self, call: McpCall) {
        if matches!(self.phase, Phase::Stopping | Phase::Ended) {
            // Dropping the senders tells the caller the session is gone.
            return;
        }
        let now = Instant::now();
        self.last_inbound = now;
        self.last_any = now;
        self.stall = Default::default();
        match call {
            McpCall::Clearance {
                title,
                description,
                diff,
                paths,
                risk_level,
                opened,
                reply,
            } => {
                let title = if description.is_empty() {
                    format!("{title} ({risk_level} risk)")
                } else {
                    format!("{title} ({risk_level} risk): {description}")
                };
                let options = vec![
                    option("approve", "Approve", OptionKind::AllowOnce),
                    option("reject", "Reject", OptionKind::RejectOnce),
                ];
                let kind = RequestKind::Permission;
                self.open_mcp_request(kind, title, diff, paths, options, opened, reply)
                    .await;
            }
            McpCall::Transmit {
                text,
                kind,
                opened,
                reply,
            } => {
                let options = vec![
                    option("continue", "Continue", OptionKind::AllowOnce),
                    option("refine", "Refine", OptionKind::AllowOnce),
                    option("stop", "Stop", OptionKind::RejectOnce),
                ];
                let title = format!("[{kind}] {text}");
                let kind = RequestKind::ForwardedPrompt;
                self.open_mcp_request(kind, title, None, vec![], options, opened, reply)
                    .await;
            }
            McpCall::Standby { message, reply } => self.on_standby(message, reply).await,
            McpCall::StandbyAbandoned => {
                // Nobody waits for an instruction any more (the client
                // timed out, cancelled or hung up).
                if self.standby.take().is_some() {
                    self.show_activity("idle", None);
                }
            }
            McpCall::Ping {
                status,
                progress,
                reply,
            } => self.on_ping(status, progress, reply).await,
            McpCall::Broadcast { message, level } => {
                if !self.agent_may_write(message.len()).await {
                    return;
                }
                self.note(Role::Agent, MessageKind::Text, &message);
                self.emit(OperatorEvent::Notice {
                    session_id: self.id().clone(),
                    level,
                    text: message,
                });
            }
            McpCall::Abandon { request_id, status } => self.on_abandon(&request_id, status).await,
            McpCall::Disconnected => {
                if self.record.protocol == crate::model::Protocol::Mcp {
                    self.begin_stop(StopCause::Disconnected).await;
                }
            }
        }
    }

    /// `standby`: the next queued instruction at once, else wait for one.
    async fn on_standby(
        &mut self,
        message: Option<String>,
        reply: oneshot::Sender<Option<String>>,
    ) {
        if let Some(m) = message.filter(|m| !m.is_empty()) {
            self.note(Role::Agent, MessageKind::Text, &m);
        }
        if let Some(next) = self.queue.pop_front() {
            self.hand_over(&next).await;
            let _ = reply.send(Some(next.text));
        } else {
            self.standby = Some(reply);
            self.show_activity("needs input", Some("waiting for an instruction"));
        }
    }

    /// `ping`: records the client's progress, shows it, and hands over every
    /// queued instruction.
    async fn on_ping(
        &mut self,
        status: Option<String>,
        progress: Vec<(String, String)>,
        reply: oneshot::Sender<Vec<Steering>>,
    ) {
        if status.is_some() || !progress.is_empty() {
            let items: Vec<serde_json::Value> = progress
                .iter()
                .map(|(label, status)| json!({"label": label, "status": status}))
                .collect();
            self.last_progress = Some(json!({
                "status_message": status,
                "progress_snapshot": items,
                "at": crate::model::now_ms(),
            }));
        }
        if let Some(s) = status.filter(|s| !s.is_empty())
            && self.agent_may_write(s.len()).await
        {
            self.note(Role::Agent, MessageKind::Text, &s);
        }
        if !progress.is_empty() && self.agent_may_write(progress_bytes(&progress)).await {
            self.emit(OperatorEvent::Plan {
                session_id: self.id().clone(),
                entries: progress,
            });
        }
        let mut handed = Vec::new();
        while let Some(s) = self.queue.pop_front() {
            self.hand_over(&s).await;
            handed.push(s);
        }
        if !handed.is_empty() {
            // Instructions handed over are the MCP client's next prompt.
            self.budget.renew();
        }
        let _ = reply.send(handed);
    }

    /// The client stopped waiting for a request (cancelled, timed out).
    async fn on_abandon(&mut self, request_id: &str, status: RequestStatus) {
        if let Some(n) = self.find_pending(request_id)
            && let Some(pending) = self.pending.remove(&n)
        {
            self.mcp_waiters.remove(&n);
            let why = if status == RequestStatus::Expired {
                "approval timed out"
            } else {
                "client cancelled the call"
            };
            self.close_request(&pending, status, why).await;
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn open_mcp_request(
        &mut self,
        kind: RequestKind,
        title: String,
        diff: Option<String>,
        paths: Vec<String>,
        options: Vec<PermissionOption>,
        opened: oneshot::Sender<Result<String, String>>,
        reply: oneshot::Sender<McpAnswer>,
    ) {
        let wire = RpcId::Str(format!("mcp-{}", self.next_request));
        match self
            .open_request(super::inbound::Opening {
                wire,
                from_mcp: true,
                command: None,
                kind,
                tool_kind: (kind == RequestKind::Permission).then(|| "edit".to_owned()),
                title,
                diff,
                paths,
                unlisted: 0,
                options,
                write: None,
            })
            .await
        {
            Ok(n) => {
                let global = self
                    .pending
                    .get(&n)
                    .map(|p| p.record.id.clone())
                    .ok_or_else(|| "the request closed as soon as it opened".to_owned());
                self.mcp_waiters.insert(n, reply);
                let _ = opened.send(global);
                if kind == RequestKind::Permission {
                    self.apply_rules(n, Some("edit".into()), None).await;
                }
            }
            Err(why) => {
                let _ = opened.send(Err(why));
            }
        }
    }

    /// Marks steering delivered to an MCP client (standby / ping).
    async fn hand_over(&mut self, steering: &Steering) {
        self.mark_delivered(steering.id).await;
        self.note(Role::User, MessageKind::Text, &steering.text);
        self.audit(
            "system",
            "steering.delivered",
            json!({"steering": steering.id, "via": "mcp"}),
        )
        .await;
        self.emit(OperatorEvent::SteeringDelivered {
            session_id: self.id().clone(),
            steering_id: steering.id,
        });
    }

    /// Steering for an MCP session: hand it to a waiting `standby` at once.
    pub(super) async fn steer_mcp(&mut self, steering: Steering) -> bool {
        let Some(waiter) = self.standby.take() else {
            return false;
        };
        self.hand_over(&steering).await;
        if waiter.send(Some(steering.text.clone())).is_err() {
            // The client gave up in the meantime; keep it for the next ping.
            self.queue.push_back(steering);
            return false;
        }
        true
    }
}

/// The bytes of a progress list, as the budget counts them.
fn progress_bytes(progress: &[(String, String)]) -> usize {
    progress.iter().map(|(l, s)| l.len() + s.len()).sum()
}
