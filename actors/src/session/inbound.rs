//! What the agent sends: frames become requests, responses and
//! notifications; permission requests become pending requests; `fs/*` calls
//! are served inside the workspace; dialect messages map onto the same
//! pending-request machinery as ACP. `session/update`s go on to
//! `updates.rs`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use super::toolcalls::{self, ToolCalls};
use super::{Outgoing, Pending, Phase, SessionState};
use crate::child::ChildEvent;
use crate::model::{
    MessageKind, PendingRequest, PermissionOption, RequestKind, RequestStatus, Role, SessionStatus,
    now_ms,
};
use crate::ports::{NoticeLevel, OperatorEvent};
use crate::protocol::acp::{self, methods};
use crate::protocol::framing::Frame;
use crate::protocol::jsonrpc::{ParseError, RpcError, RpcId, RpcMessage, codes, truncate_for_log};

/// How much of a malformed line goes into the log.
const LOG_RAW_BYTES: usize = 512;

/// The most bytes of titles and diffs a session's waiting requests hold.
const MAX_PENDING_BYTES: usize = 8 << 20;

/// A request about to be shown to the operator ([`SessionState::open_request`]).
pub(super) struct Opening {
    /// The id the agent (or an MCP client's call) gave it.
    pub wire: RpcId,
    /// An MCP client's call (`session/mcp.rs`): answered through the tool
    /// call, never on the agent's stdin. A flag, not read from the id: a
    /// stdio agent's ids starting `mcp-` were taken for an MCP client's,
    /// which skipped the reused-id check and left refusals unanswered.
    pub from_mcp: bool,
    /// What it is.
    pub kind: RequestKind,
    /// The ACP tool kind it is judged and shown as (`edit`, `execute`, ...),
    /// kept with it: "Remember" makes its rule for this kind.
    pub tool_kind: Option<String>,
    /// One line for the operator.
    pub title: String,
    /// The command it runs, for an execute call.
    pub command: Option<String>,
    /// The change, when it changes files.
    pub diff: Option<String>,
    /// Files it names.
    pub paths: Vec<String>,
    /// Files it named past those kept ([`toolcalls::MAX_FILES`]).
    pub unlisted: usize,
    /// The buttons.
    pub options: Vec<PermissionOption>,
    /// For `fs/write_text_file`: the path and content to write once allowed.
    pub write: Option<super::files::AskedWrite>,
}

/// What a paused session answers the agent for anything it asks.
pub(super) const PAUSED_REFUSAL: &str =
    "the session is paused by its operator; no request is taken until it is resumed";

/// What the operator is told (once) when a paused agent asks anyway.
pub(super) const PAUSED_NOTE: &str =
    "The agent asked for something while the session was paused; it was refused.";

impl SessionState {
    pub(super) async fn on_child_event(&mut self, ev: ChildEvent) {
        match ev {
            ChildEvent::Frame(frame, _credit) => {
                // Holding the credit while the ledger drains slows the
                // agent's pipe down: queued writes stay bounded.
                self.ledger.make_room().await;
                self.count_frame();
                self.on_activity().await;
                match frame {
                    Frame::Message(body) => self.on_frame(&body).await,
                    Frame::Oversized { len, head } => {
                        let text = format!(
                            "agent `{}` sent a {len}-byte message, over max_line_bytes ({}); it was skipped",
                            self.profile.id, self.settings.limits.max_line_bytes
                        );
                        self.warn_agent(|| text.clone());
                        // Charged like the agent's own entries: 3,000 such
                        // lines kept 3,000 notes past the turn's budget. Not
                        // for history a resumed agent replays: its note is
                        // in the transcript already, once.
                        if !self.hearing_history() && self.agent_may_write(text.len()).await {
                            self.note(Role::System, MessageKind::Error, &text);
                        }
                        self.note_oversized_tool(&head);
                        // Answered on the request's id when its start
                        // names one: the agent may be waiting on it.
                        let id = crate::protocol::jsonrpc::request_id_in_head(&head);
                        self.answer_unreadable(id, RpcError::new(
                            codes::INVALID_REQUEST,
                            format!(
                                "a {len}-byte line is over the server's limit of {} bytes (limits.max_line_bytes); it was not read",
                                self.settings.limits.max_line_bytes
                            ),
                        ));
                        self.fail_start_if_handshaking(len).await;
                    }
                }
            }
            ChildEvent::StdoutClosed => {
                tracing::info!(session = %self.record.id, "agent closed stdout");
                self.stream_closed_at = Some(Instant::now());
            }
            ChildEvent::ReadFailed(e) => {
                tracing::warn!(session = %self.record.id, "reading from agent failed: {e}");
                self.stream_closed_at = Some(Instant::now());
                // Said now: an agent that already exited is reported only as
                // an exit, and the reason was lost.
                let text = format!("The agent's output could not be read: {e}.");
                self.emit_notice(NoticeLevel::Warning, &text).await;
                self.kill_for(format!("reading its output failed: {e}"));
            }
            ChildEvent::WriteFailed(e) => {
                tracing::warn!(session = %self.record.id, "broken pipe to agent: {e}");
                self.kill_for(format!("writing to its stdin failed: {e}"));
            }
            ChildEvent::Written(token) => self.on_written(token).await,
            ChildEvent::Exited { code, signal } => self.on_exit(code, signal).await,
        }
    }

    async fn on_frame(&mut self, body: &[u8]) {
        if self.is_acp()
            && let Some((_, update)) = crate::protocol::acp::parse_update_frame(body)
        {
            self.apply_update(update, &Value::Null).await;
            return;
        }
        let msg = match RpcMessage::parse(body) {
            Ok(m) => m,
            Err(ParseError::Batch { len, requests }) => {
                // Answer what waits for an answer, so the agent is not left
                // waiting for replies that never come.
                self.warn_agent(|| {
                    format!("agent sent a JSON-RPC batch of {len} messages; batches are not supported, each request in it was answered with an error")
                });
                for id in requests {
                    self.respond(
                        id,
                        Err(RpcError::new(
                            codes::INVALID_REQUEST,
                            "JSON-RPC batches are not supported; send one message per line",
                        )),
                    );
                }
                return;
            }
            Err(e) => {
                self.warn_agent(|| {
                    let raw = truncate_for_log(body, LOG_RAW_BYTES);
                    format!("skipping malformed line from agent: {e}; raw={raw}")
                });
                let (count, first) = &mut self.unreadable_lines;
                *count += 1;
                first.get_or_insert_with(|| {
                    crate::text::one_line(
                        &String::from_utf8_lossy(&body[..body.len().min(400)]),
                        120,
                    )
                });
                if let Some(error) = e.answer() {
                    self.answer_unreadable(e.answer_id(), error);
                }
                return;
            }
        };
        if self.is_acp() {
            self.on_acp_message(msg).await;
        } else {
            self.on_dialect_message(msg).await;
        }
    }

    /// Answers a line that could not be read as a request with `error`, on
    /// its id when that could be read, else a null id (JSON-RPC 2.0), so an
    /// agent that sent a request is not left waiting. Not while the agent
    /// floods: answers to an agent that sends faster than it reads would
    /// pile up in its pipe.
    fn answer_unreadable(&mut self, id: Option<RpcId>, error: RpcError) {
        if self.flooded() {
            return;
        }
        // Never on the id of a request still waiting for the operator: the
        // agent would take the error for that request's answer.
        let id = id.filter(|id| !self.pending.values().any(|p| &p.wire == id));
        let msg = RpcMessage::Response {
            id,
            outcome: Err(error),
        };
        self.send_bytes(msg.to_bytes());
    }

    async fn on_acp_message(&mut self, msg: RpcMessage) {
        match msg {
            RpcMessage::Response { id, outcome } => {
                let purpose = match &id {
                    Some(RpcId::Num(n)) => self.outgoing.remove(n),
                    _ => None,
                };
                match purpose {
                    Some(Outgoing::Prompt) => {
                        let rpc = match id {
                            Some(RpcId::Num(n)) => n,
                            _ => -1,
                        };
                        self.on_prompt_response(rpc, outcome).await;
                    }
                    Some(Outgoing::SetOption(setting)) => {
                        let rpc = match id {
                            Some(RpcId::Num(n)) => n,
                            _ => -1,
                        };
                        self.on_setting_response(rpc, setting, outcome).await;
                    }
                    Some(p) => self.on_handshake_response(p, outcome).await,
                    None => self.warn_agent(|| {
                        format!("response to an unknown request id {id:?}; ignored")
                    }),
                }
            }
            RpcMessage::Request { id, method, params } => {
                self.on_agent_request(id, &method, params).await
            }
            RpcMessage::Notification { method, params } => {
                if method == methods::SESSION_UPDATE {
                    self.on_update(&params).await;
                } else if method == methods::CANCEL_REQUEST {
                    self.agent_withdrew(&params).await;
                } else {
                    tracing::debug!(session = %self.record.id, method = %crate::text::one_line(&method, 100), "ignoring unknown notification");
                }
            }
        }
    }

    async fn on_agent_request(&mut self, id: RpcId, method: &str, params: Value) {
        // An agent that asks is working, not replaying history.
        self.replay_tail_until = None;
        match method {
            methods::REQUEST_PERMISSION => match acp::parse_permission(&params) {
                Ok(ask) => self.permission_requested(id, ask).await,
                Err(e) => self.respond(id, Err(RpcError::new(codes::INVALID_PARAMS, e))),
            },
            methods::FS_READ => self.fs_read_requested(id, &params).await,
            methods::FS_WRITE => self.fs_write_requested(id, &params).await,
            other => {
                tracing::debug!(session = %self.record.id, method = other, "agent called an unknown method");
                self.respond(
                    id,
                    Err(RpcError::new(
                        codes::METHOD_NOT_FOUND,
                        format!("method not found: {other}"),
                    )),
                );
            }
        }
    }

    /// A file the agent named, read beneath the workspace handle for a diff
    /// in context (refused like a read: outside, server files, symlinks out).
    pub(super) fn preview(&self, path: &Path) -> Option<String> {
        let ws = self.workspace.as_ref().ok()?;
        let named = path.display().to_string();
        ws.current(&named, toolcalls::MAX_PREVIEW_BYTES)
            .ok()
            .flatten()
    }

    /// A permission request, merged with the tool call it references: the
    /// operator, the rules and the mode see everything the agent announced.
    async fn permission_requested(&mut self, id: RpcId, ask: acp::PermissionAsk) {
        self.flush_text(true).await;
        let root = PathBuf::from(&self.record.cwd);
        let tool_id = ask.tool.id.clone();
        let merged = self.toolcalls.update(&ask.tool).clone();
        self.forget_tool_lines();
        let shown = toolcalls::show_blocking(&root, &merged, &|p| self.preview(p));
        let title = shown
            .title
            .clone()
            .unwrap_or_else(|| format!("{} {}", shown.kind.as_deref().unwrap_or("tool"), tool_id));
        let title = toolcalls::title_with_command(title, shown.command.as_deref());
        let diff = (!shown.diffs.is_empty()).then(|| shown.diffs.join("\n"));
        // Its announcement (with the diff) could not be read: said, so the
        // operator does not approve a change they were never shown.
        let title = if diff.is_none() && self.oversized_tools.contains(&tool_id) {
            format!(
                "{title} (its change is not shown: the agent's announcement of it was over limits.max_line_bytes)"
            )
        } else {
            title
        };
        let mut options = ask.options;
        let cancel_option = super::requests::add_reject_if_missing(&mut options);
        let opened = self
            .open_request(Opening {
                wire: id,
                from_mcp: false,
                kind: RequestKind::Permission,
                tool_kind: shown.kind.clone(),
                title,
                command: shown.command.clone(),
                diff,
                paths: shown.paths,
                unlisted: shown.unlisted,
                options,
                write: None,
            })
            .await;
        if let Ok(n) = opened {
            if let Some(p) = self.pending.get_mut(&n) {
                p.announced = Some(ToolCalls::announced(&root, &tool_id, &merged));
                p.cancel_option = cancel_option;
            }
            self.apply_rules(n, shown.kind, shown.command).await;
        }
    }

    /// Remembers the tool call an over-long `session/update` announced,
    /// when its start names one.
    fn note_oversized_tool(&mut self, head: &[u8]) {
        use crate::protocol::jsonrpc::{string_member_in_head, top_level_string_in_head};
        if !self.is_acp()
            || top_level_string_in_head(head, "method").as_deref() != Some(methods::SESSION_UPDATE)
        {
            return;
        }
        if let Some(tool) = string_member_in_head(head, "toolCallId") {
            if self.oversized_tools.len() >= super::OVERSIZED_TOOLS_KEPT {
                self.oversized_tools.pop_front();
            }
            self.oversized_tools.push_back(tool);
        }
    }

    /// A request reusing the id of one still waiting: refused, but not
    /// answered. An answer on that id would reach the agent as the answer
    /// to the first request (it can only match answers by id), so only the
    /// operator is told; the agent gets one answer, the operator's.
    fn refusal_without_answer(&self, o: &Opening) -> Option<(String, String)> {
        let reused = self
            .pending
            .values()
            .any(|p| p.wire == o.wire && !self.mcp_waiters.contains_key(&p.number));
        (!o.from_mcp && reused).then(|| {
            (
                format!(
                    "request id {} is already waiting for an answer",
                    serde_json::to_string(&o.wire).unwrap_or_default()
                ),
                "The agent reused the id of a request still waiting for an answer; the second request was not taken (its answer could not be told from the first's).".to_owned(),
            )
        })
    }

    /// Why a new request cannot be taken (the reason told to the agent, on
    /// the request's own id, and the notice shown to the operator), or
    /// `None` when it can.
    fn refusal_with_answer(&self, o: &Opening) -> Option<(String, String)> {
        if matches!(self.phase, Phase::Stopping | Phase::Ended) {
            // Nobody will decide it: the session's requests were closed when
            // it began to stop, and a request shown now would stay pending
            // for ever.
            return Some((
                "the session is stopping; no new request is taken".to_owned(),
                "The agent asked for something while the session was stopping; it was refused."
                    .to_owned(),
            ));
        }
        if self.paused && !o.from_mcp {
            // A pause cancelled the turn: an agent still asking ignored that
            // (it is restarted after the grace, `check_cancel_ignored`).
            return Some((PAUSED_REFUSAL.to_owned(), PAUSED_NOTE.to_owned()));
        }
        let cap = self.settings.limits.max_pending_requests;
        if self.pending.len() >= cap {
            return Some((
                format!(
                    "{cap} requests are already waiting for the operator (limits.max_pending_requests); wait for them to be answered"
                ),
                format!(
                    "The agent asked for more than {cap} things at once; the extra requests were refused."
                ),
            ));
        }
        let named = o.paths.len() + o.unlisted;
        if named > crate::rules::MAX_REQUEST_PATHS {
            return Some((
                format!(
                    "the request names {named} paths; at most {} are accepted",
                    crate::rules::MAX_REQUEST_PATHS
                ),
                "The agent asked about more paths at once than are accepted; the request was refused.".to_owned(),
            ));
        }
        // What waiting requests hold (titles and diffs) is bounded too: the
        // agent sets their size, and each is held until decided.
        let size = o.title.len() + held_text(o.command.as_ref()) + held_text(o.diff.as_ref());
        let held: usize = self
            .pending
            .values()
            .map(|p| {
                p.record.title.len()
                    + held_text(p.record.command.as_ref())
                    + held_text(p.record.diff.as_ref())
            })
            .sum();
        if !self.pending.is_empty() && held + size > MAX_PENDING_BYTES {
            return Some((
                format!(
                    "the requests waiting for the operator already hold {held} bytes of titles and diffs (at most {MAX_PENDING_BYTES}); wait for them to be answered"
                ),
                "The agent's waiting requests reached their size bound; the extra requests were refused.".to_owned(),
            ));
        }
        None
    }

    /// Stores a new pending request and shows it to the operator.
    pub(super) async fn open_request(&mut self, o: Opening) -> Result<u64, String> {
        if let Some((why, note)) = self.refusal_without_answer(&o) {
            self.warn_agent(|| format!("refused a new request: {why}"));
            self.tell_refusal_once(&note).await;
            return Err(why);
        }
        if let Some((why, note)) = self.refusal_with_answer(&o) {
            self.refuse_request(o.wire, o.from_mcp, o.kind, &why, note)
                .await;
            return Err(why);
        }
        if !self.budget.take_request() {
            let why = format!(
                "the agent opened {} requests since the operator last acted; no new request is taken until the next prompt or decision",
                super::budget::REQUESTS_PER_TURN
            );
            self.refuse_request(o.wire, o.from_mcp, o.kind, &why, why.clone())
                .await;
            return Err(why);
        }
        let n = self.next_request;
        self.next_request += 1;
        let request_id = format!("req-{n}");
        let record = PendingRequest {
            id: PendingRequest::global_id(self.id(), &request_id),
            session_id: self.id().clone(),
            request_id,
            kind: o.kind,
            tool_kind: o.tool_kind,
            title: o.title,
            command: o.command,
            diff: o.diff,
            paths: o.paths,
            options: o.options,
            status: RequestStatus::Pending,
            wire_id: serde_json::to_string(&o.wire).ok(),
            created_at: now_ms(),
        };
        let (store, stored) = (Arc::clone(&self.store), record.clone());
        let inserted = self
            .ledger
            .wait(async move { store.insert_request(&stored).await })
            .await;
        if let Err(e) = inserted {
            // Without a record the operator could not answer it durably.
            tracing::error!(session = %self.record.id, "cannot store request: {e}");
            let why = format!("agent-intercom could not record the request: {e}");
            if self.is_acp() && !o.from_mcp {
                self.respond(
                    o.wire,
                    Err(RpcError::new(codes::INTERNAL_ERROR, why.clone())),
                );
            }
            return Err(why);
        }
        self.pending.insert(
            n,
            Pending {
                number: n,
                record: record.clone(),
                wire: o.wire,
                write: o.write,
                governed: None,
                announced: None,
                cancel_option: None,
            },
        );
        self.emit(OperatorEvent::RequestOpened { request: record });
        self.show_activity("needs input", None);
        Ok(n)
    }

    /// Answers a request past `limits.max_pending_requests` with an error.
    pub(super) async fn refuse_request(
        &mut self,
        wire: RpcId,
        from_mcp: bool,
        kind: RequestKind,
        why: &str,
        note: String,
    ) {
        let why = why.to_owned();
        self.warn_agent(|| format!("refused a new request: {why}"));
        // An MCP client's request is answered through its tool call, never
        // on the agent's stdin (the agent did not ask).
        let protocol = if from_mcp {
            crate::model::Protocol::Mcp
        } else {
            self.record.protocol
        };
        match protocol {
            crate::model::Protocol::Acp => {
                let answer = self.acp_refusal(kind, why.clone());
                self.respond(wire, answer);
            }
            crate::model::Protocol::Intercom => {
                let bytes = if kind == RequestKind::ForwardedPrompt {
                    self.dialect.prompt_response(&wire, "stop", Some(&why))
                } else {
                    self.dialect.clearance_response(&wire, false, Some(&why))
                };
                self.send_bytes(bytes);
            }
            crate::model::Protocol::Mcp => {}
        }
        self.tell_refusal_once(&note).await;
    }

    /// How an ACP agent is told its valid request was not taken. While the
    /// turn is cancelled (paused, stopping), as ACP says a cancelled turn's
    /// requests end ([`super::requests::acp_cancelled`]). Otherwise a
    /// server refusal with the reason. (It was "invalid request", which
    /// SDKs read as their own bug.)
    fn acp_refusal(&self, kind: RequestKind, why: String) -> Result<serde_json::Value, RpcError> {
        if self.not_working_for_anyone().is_some() {
            super::requests::acp_cancelled(kind, why)
        } else {
            Err(RpcError::new(codes::REFUSED, why))
        }
    }

    /// Shows the operator why the agent's requests are refused, once per
    /// session: an agent that keeps asking cannot fill the transcript.
    pub(super) async fn tell_refusal_once(&mut self, note: &str) {
        if !self.over_request_cap_noted {
            self.over_request_cap_noted = true;
            self.emit_notice(NoticeLevel::Warning, note).await;
        }
    }

    /// Counts inbound frames; warns once per burst over the limit.
    fn count_frame(&mut self) {
        let limit = self.settings.limits.inbound_messages_per_sec;
        if let Some(rate) = self.rate.count(Instant::now(), limit) {
            tracing::warn!(
                session = %self.record.id,
                rate,
                limit,
                "agent sends about {rate} messages/s, over limits.inbound_messages_per_sec ({limit}): updates are coalesced until it slows down"
            );
        }
    }

    /// True while the agent sends more than `limits.inbound_messages_per_sec`:
    /// updates are then coalesced (persisted and shown once per tick), never
    /// dropped; requests and responses are always handled at once.
    pub(super) fn flooded(&self) -> bool {
        self.rate
            .flooded(self.settings.limits.inbound_messages_per_sec)
    }

    /// Any inbound line: resets the stall clock and revives a stalled session.
    async fn on_activity(&mut self) {
        let now = Instant::now();
        self.last_inbound = now;
        self.last_any = now;
        self.touch_if(true, false);
        let was_alerted = self.stall.alerted_at.is_some();
        self.stall = Default::default();
        if self.status == SessionStatus::Stalled && self.phase == Phase::Ready {
            self.set_status(SessionStatus::Active, "working", None)
                .await;
            self.emit_notice(NoticeLevel::Info, "The agent is active again.")
                .await;
        } else if was_alerted {
            tracing::info!(session = %self.record.id, "agent activity resumed after a stall alert");
        }
    }
}

impl SessionState {
    /// An oversized message while the agent owes the answer to
    /// `initialize` (or `authenticate`, or `session/new`) is that answer: the start fails now,
    /// saying so, instead of after the startup timeout with "it did not
    /// finish the handshake" (the size was only in the log).
    async fn fail_start_if_handshaking(&mut self, len: usize) {
        let method = match self.phase {
            Phase::Initializing => methods::INITIALIZE,
            Phase::Authenticating => methods::AUTHENTICATE,
            // No notification can come before `session/new`'s answer (it
            // names the session). While loading, oversized replayed
            // history is skipped as at any other time.
            Phase::Opening if self.outgoing.values().any(|o| *o == Outgoing::NewSession) => {
                methods::SESSION_NEW
            }
            _ => return,
        };
        if !self.is_acp() {
            return;
        }
        let error = format!(
            "its answer was a {len}-byte message, over limits.max_line_bytes ({}); raise that limit in [limits] if the agent needs it",
            self.settings.limits.max_line_bytes
        );
        self.fail_start(crate::session::StartError::Handshake {
            agent: self.profile.id.clone(),
            method: method.to_owned(),
            error,
        })
        .await;
    }
}

/// The bytes an optional text of a request holds.
fn held_text(text: Option<&String>) -> usize {
    text.map_or(0, String::len)
}
