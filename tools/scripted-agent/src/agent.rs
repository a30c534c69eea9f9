//! Shared agent state and the inbound message pump.
//!
//! This file exists because both dialects need the same machinery: an output
//! writer, our own request-id counter, session bookkeeping, and a way to wait
//! (for a response, a cancel, or a deadline) while still reacting to whatever
//! else the server sends in the meantime.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::scenario::{Protocol, Scenario};
use crate::wire::{Inbound, Writer};
use crate::{acp, intercom};

/// How long we keep waiting for an outstanding response after a cancel.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// What the agent is doing right now (affects how waits behave).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Running `on_start`: nothing has been read yet.
    Start,
    /// Waiting for the next request.
    Idle,
    /// Running a prompt turn.
    Turn,
    /// Replaying history for `session/load`.
    Load,
}

/// Result of [`Agent::wait`].
#[derive(Debug)]
pub enum Wake {
    /// The awaited response arrived.
    Response(Value),
    /// A cancel for the running turn arrived.
    Cancelled,
    /// The deadline passed.
    TimedOut,
}

/// Per-session data remembered from `session/new` / `session/load`.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub cwd: PathBuf,
    pub mcp_servers: Value,
}

/// A classified incoming message.
pub enum Kind {
    Response(Value),
    Request(Value, String),
    Notification(String),
    Invalid,
}

pub struct Agent {
    pub scenario: Scenario,
    pub protocol: Protocol,
    pub out: Writer,
    inbox: Receiver<Inbound>,
    next_request_id: u64,
    pub phase: Phase,
    pub session_id: String,
    pub sessions: HashMap<String, SessionInfo>,
    pub session_counter: u64,
    pub turn_counter: usize,
    pub cancelled: bool,
    pub authenticated: bool,
    pub last_permission_allowed: bool,
    /// Intercom prompts/nudges that arrived while a turn was running, and
    /// ACP prompts that arrived while `after_load` replayed.
    pub pending: VecDeque<Value>,
    /// `exit_after_turn`: exit with this code once the turn was answered.
    pub exit_after_turn: Option<i32>,
}

impl Agent {
    pub fn new(
        scenario: Scenario,
        protocol: Protocol,
        out: Writer,
        inbox: Receiver<Inbound>,
    ) -> Self {
        Self {
            scenario,
            protocol,
            out,
            inbox,
            next_request_id: 0,
            phase: Phase::Start,
            session_id: String::new(),
            sessions: HashMap::new(),
            session_counter: 0,
            turn_counter: 0,
            cancelled: false,
            authenticated: false,
            last_permission_allowed: false,
            pending: VecDeque::new(),
            exit_after_turn: None,
        }
    }

    /// Allocates the id for a request we send (0, 1, 2, ...).
    pub fn next_id(&mut self) -> u64 {
        let id = self.next_request_id;
        self.next_request_id += 1;
        id
    }

    /// The current session's info, if it is known.
    pub fn session(&self) -> Option<&SessionInfo> {
        self.sessions.get(&self.session_id)
    }

    /// Blocks for the next inbound item; `None` once `deadline` has passed.
    pub fn next_inbound(&self, deadline: Option<Instant>) -> Option<Inbound> {
        let Some(deadline) = deadline else {
            return Some(self.inbox.recv().unwrap_or(Inbound::Eof));
        };
        let left = deadline.saturating_duration_since(Instant::now());
        match self.inbox.recv_timeout(left) {
            Ok(item) => Some(item),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Inbound::Eof),
        }
    }

    /// Waits until the response with id `awaited` arrives, a cancel arrives,
    /// or `deadline` passes, handling everything else that comes in meanwhile.
    pub fn wait(&mut self, awaited: Option<&Value>, deadline: Option<Instant>) -> Wake {
        loop {
            match self.next_inbound(deadline) {
                None => return Wake::TimedOut,
                Some(Inbound::Eof) => exit_on_eof(),
                Some(Inbound::Malformed(e)) => note(&format!("malformed input ignored: {e}")),
                Some(Inbound::Message(msg)) => {
                    if let Some(wake) = self.dispatch_busy(msg, awaited) {
                        return wake;
                    }
                }
            }
        }
    }

    /// Drains whatever is already queued; reports a cancel if one arrived.
    pub fn poll(&mut self) -> bool {
        matches!(self.wait(None, Some(Instant::now())), Wake::Cancelled)
    }

    /// Waits for the response to our request `id`. After a cancel we keep
    /// waiting only for a grace period; `None` means we gave up.
    pub fn await_response(&mut self, id: &Value) -> Option<Value> {
        let mut deadline = self.cancelled.then(|| Instant::now() + CANCEL_GRACE);
        loop {
            match self.wait(Some(id), deadline) {
                Wake::Response(msg) => return Some(msg),
                Wake::Cancelled => {
                    deadline.get_or_insert_with(|| Instant::now() + CANCEL_GRACE);
                }
                Wake::TimedOut => {
                    note(&format!(
                        "gave up waiting for the response to request {id} after cancel"
                    ));
                    return None;
                }
            }
        }
    }

    /// Handles a message that arrived while the agent is busy.
    fn dispatch_busy(&mut self, msg: Value, awaited: Option<&Value>) -> Option<Wake> {
        match self.classify(&msg) {
            Kind::Response(id) if awaited == Some(&id) => Some(Wake::Response(msg)),
            Kind::Response(id) => {
                note(&format!("ignoring response with unexpected id {id}: {msg}"));
                None
            }
            Kind::Invalid => {
                note(&format!(
                    "ignoring message that is neither request nor response: {msg}"
                ));
                None
            }
            _ => match self.protocol {
                Protocol::Acp => acp::handle_busy(self, msg),
                Protocol::Intercom => intercom::handle_busy(self, msg),
            },
        }
    }

    /// Sorts a message into response / request / notification.
    pub fn classify(&self, msg: &Value) -> Kind {
        match self.protocol {
            Protocol::Acp => acp::classify(msg),
            Protocol::Intercom => intercom::classify(msg),
        }
    }

    /// Sends one message in the current framing.
    pub fn send(&mut self, msg: &Value) {
        self.out.send(msg);
    }
}

/// A diagnostic line on stderr.
pub fn note(text: &str) {
    eprintln!("scripted-agent: {text}");
}

/// stdin is closed: the server is gone, so stop cleanly.
pub fn exit_on_eof() -> ! {
    note("stdin closed, exiting");
    std::process::exit(0)
}

/// Parks the process forever, draining stdin so the server never blocks.
pub fn hang(agent: &Agent) -> ! {
    note("hanging forever");
    while agent.inbox.recv().is_ok() {}
    loop {
        std::thread::park();
    }
}
