//! Test harness: a real SessionSupervisor with in-memory ports, driving the
//! repository's scripted agent as a real child process.
//!
//! Tests wait on events or stored state with generous deadlines (see
//! [`Harness::until`]); nothing sleeps and hopes.

#![allow(dead_code)]

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use intercom_actors::memory::{MemoryStore, RecordingSink};
use intercom_actors::model::{
    Decision, Framing, PendingRequest, Protocol, SessionId, SessionRecord, TranscriptEntry,
};
use intercom_actors::ports::{OperatorEvent, SessionStore};
use intercom_actors::session::{Caller, Choice, SessionError, SessionMsg, SessionSettings};
use intercom_actors::settings::{AgentProfile, Limits, StallPolicy, SupervisionPolicy};
use intercom_actors::supervisor::{
    SessionSupervisor, StartRequest, SupervisorArgs, SupervisorError, SupervisorMsg,
};
use ractor::{Actor, ActorRef};
use serde_json::{Value, json};

/// Deadline for anything a test waits on.
pub const WAIT: Duration = Duration::from_secs(20);

// One harness per test crate may include this alongside another.
#[allow(clippy::duplicate_mod)]
#[path = "../../../tests/shared/scripted_agent.rs"]
mod scripted_agent;
pub use scripted_agent::agent_bin;

/// Knobs for one harness.
#[derive(Clone)]
pub struct Knobs {
    pub limits: Limits,
    pub stall: StallPolicy,
    pub policy: SupervisionPolicy,
    pub operators: Vec<String>,
    pub rules: intercom_actors::rules::SharedRules,
    /// Workspace-relative files and directories to guard as server files.
    pub protect_files: Vec<String>,
    pub protect_dirs: Vec<String>,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            limits: Limits {
                startup_timeout_secs: 20,
                shutdown_grace_secs: 1,
                ..Limits::default()
            },
            stall: StallPolicy {
                inactivity_secs: 0,
                ..StallPolicy::default()
            },
            policy: SupervisionPolicy {
                backoff_initial_secs: 0,
                backoff_max_secs: 0,
                ..SupervisionPolicy::default()
            },
            operators: vec![],
            rules: Default::default(),
            protect_files: vec![],
            protect_dirs: vec![],
        }
    }
}

pub struct Harness {
    pub sup: ActorRef<SupervisorMsg>,
    pub store: Arc<MemoryStore>,
    pub sink: Arc<RecordingSink>,
    pub dir: tempfile::TempDir,
    pub workspace: PathBuf,
    scenarios: std::sync::atomic::AtomicUsize,
}

impl Harness {
    pub async fn new(knobs: Knobs) -> Harness {
        Self::build(knobs, None).await
    }

    /// A harness whose supervisor offers `url` as the ACP-MCP bridge.
    pub async fn new_with_bridge(knobs: Knobs, url: &str) -> Harness {
        Self::build(knobs, Some(url.to_owned())).await
    }

    async fn build(knobs: Knobs, bridge_url: Option<String>) -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let workspace = dir.path().join("ws");
        std::fs::create_dir_all(&workspace).expect("mkdir ws");
        let workspace = workspace.canonicalize().expect("canon");
        let store = Arc::new(MemoryStore::new());
        let sink = Arc::new(RecordingSink::new());
        let settings = Arc::new(SessionSettings {
            limits: knobs.limits,
            stall: knobs.stall,
            operators: knobs.operators.into_iter().collect::<HashSet<_>>(),
            rules: knobs.rules.clone(),
            server_files: intercom_actors::workspace_fs::ServerFiles::new(
                knobs.protect_files.iter().map(|f| workspace.join(f)),
                knobs.protect_dirs.iter().map(|d| workspace.join(d)),
            ),
        });
        let args = SupervisorArgs {
            policy: knobs.policy,
            settings,
            store: store.clone(),
            sink: sink.clone(),
            bridge_url,
        };
        let (sup, _) = Actor::spawn(None, SessionSupervisor, args)
            .await
            .expect("supervisor");
        Harness {
            sup,
            store,
            sink,
            dir,
            workspace,
            scenarios: Default::default(),
        }
    }

    /// An agent profile running the scripted agent with `scenario`.
    pub fn profile(&self, scenario: Value) -> AgentProfile {
        let n = self
            .scenarios
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = self.dir.path().join(format!("scenario-{n}.json"));
        std::fs::write(&path, scenario.to_string()).expect("write scenario");
        let protocol = match scenario.get("protocol").and_then(Value::as_str) {
            Some("intercom") => Protocol::Intercom,
            _ => Protocol::Acp,
        };
        let framing = match scenario.get("framing").and_then(Value::as_str) {
            Some("lsp") => Framing::Lsp,
            _ => Framing::Ndjson,
        };
        AgentProfile {
            id: format!("scripted-{n}"),
            command: agent_bin().display().to_string(),
            args: vec!["--scenario".into(), path.display().to_string()],
            env: vec![],
            protocol,
            framing,
            auth_method: None,
        }
    }

    /// An agent profile running a hostile ACP agent written in Python.
    /// `body` defines `on(m, method, mid)`, called for every message after
    /// the handshake (which [`PYTHON_AGENT`] answers: session id `s1`), and
    /// may define `at_eof()`; it can use `send(m)`, `chunk(text)`,
    /// `ask(rid, title)` (a permission request for an edit) and
    /// `ask_for(rid, tool_call_id)` (one for a tool call announced before).
    pub fn python_agent(&self, body: &str) -> AgentProfile {
        let mut profile = self.profile(json!({}));
        profile.command = "python3".into();
        profile.args = vec![
            "-c".into(),
            format!("{PYTHON_AGENT_HEAD}\n{body}\n{PYTHON_AGENT_LOOP}"),
        ];
        profile
    }

    pub fn request(&self, profile: AgentProfile, prompt: &str) -> StartRequest {
        StartRequest {
            workspace: "ws".into(),
            cwd: self.workspace.clone(),
            channel_id: Some("C1".into()),
            profile,
            prompt: prompt.into(),
            owner: "U_OWNER".into(),
            mode: None,
        }
    }

    pub async fn start_req(&self, req: StartRequest) -> Result<SessionRecord, SupervisorError> {
        ractor::call!(self.sup, |reply| SupervisorMsg::Start { req, reply })
            .expect("supervisor call")
    }

    pub async fn start(&self, scenario: Value, prompt: &str) -> SessionRecord {
        let req = self.request(self.profile(scenario), prompt);
        self.start_req(req).await.expect("session starts")
    }

    pub async fn actor(&self, id: &SessionId) -> ActorRef<SessionMsg> {
        ractor::call!(self.sup, |reply| SupervisorMsg::Lookup {
            id: id.clone(),
            reply
        })
        .expect("lookup")
        .expect("session is live")
    }

    pub async fn transcript(&self, id: &SessionId) -> Vec<TranscriptEntry> {
        self.store.transcript(id).await.expect("transcript")
    }

    pub async fn transcript_text(&self, id: &SessionId) -> String {
        self.transcript(id)
            .await
            .into_iter()
            .map(|m| format!("[{}:{}] {}", m.role.as_str(), m.kind.as_str(), m.content))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until the session's transcript contains `needle`.
    pub async fn until_transcript(&self, id: &SessionId, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let text = self.transcript_text(id).await;
            if text.contains(needle) {
                return text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "transcript never contained {needle:?}:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until an event satisfies `pred`.
    pub async fn until(&self, what: &str, pred: impl Fn(&OperatorEvent) -> bool) -> OperatorEvent {
        match self.sink.wait_for(WAIT, pred).await {
            Some(e) => e,
            None => panic!("never saw {what}; events:\n{:#?}", self.sink.events()),
        }
    }

    /// Waits until the stored session satisfies `pred`.
    pub async fn until_record(
        &self,
        id: &SessionId,
        what: &str,
        pred: impl Fn(&SessionRecord) -> bool,
    ) -> SessionRecord {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(r) = self.store.get_session(id).await.expect("get")
                && pred(&r)
            {
                return r;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "session never became {what}: {:?}",
                self.store.get_session(id).await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn live_count(&self) -> usize {
        ractor::call!(self.sup, SupervisorMsg::LiveCount).expect("count")
    }
}

/// True while any process of the group exists.
pub fn group_alive(pgid: i32) -> bool {
    intercom_actors::child::group_alive(pgid)
}

/// Waits until a process group is gone.
pub async fn until_group_gone(pgid: i32) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while group_alive(pgid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "process group {pgid} still alive"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for the harness's `n`-th approval request (`req-n`) to be shown.
pub async fn request_opened(h: &Harness, n: usize) -> PendingRequest {
    let want = format!("req-{n}");
    match h
        .until(
            &want,
            |e| matches!(e, OperatorEvent::RequestOpened { request } if request.request_id == want),
        )
        .await
    {
        OperatorEvent::RequestOpened { request } => request,
        _ => unreachable!("matched above"),
    }
}

/// Decides an approval as the local operator; panics unless it is recorded.
/// Stops the session as the operator and waits for the stop to be taken.
pub async fn stop_as_operator(h: &Harness, id: &SessionId) {
    let actor = h.actor(id).await;
    ractor::call!(actor, |reply| SessionMsg::Stop {
        cause: intercom_actors::session::StopCause::Operator,
        caller: intercom_actors::session::Caller::local(),
        reply: Some(reply)
    })
    .expect("stop")
    .expect("stopped");
}

/// Steers a session as the local operator; panics unless it is taken.
pub async fn steer(h: &Harness, id: &SessionId, text: &str, interrupt: bool) {
    let actor = h.actor(id).await;
    ractor::call!(actor, |reply| SessionMsg::Steer {
        text: text.into(),
        interrupt,
        caller: Caller::local(),
        reply
    })
    .expect("steer call")
    .expect("steer taken");
}

pub async fn decide(h: &Harness, id: &SessionId, request: &str, choice: Choice) {
    decide_as(h, id, request, choice, None, Caller::local())
        .await
        .expect("decided");
}

/// Decides an approval as `caller`, with `reason`; the session's answer.
pub async fn decide_as(
    h: &Harness,
    id: &SessionId,
    request: &str,
    choice: Choice,
    reason: Option<&str>,
    caller: Caller,
) -> Result<Decision, SessionError> {
    let actor = h.actor(id).await;
    ractor::call!(actor, |reply| SessionMsg::Decide {
        request_id: request.into(),
        choice,
        reason: reason.map(str::to_owned),
        caller,
        reply
    })
    .expect("decide call")
    .map(|decided| decided.decision)
}

/// Asks for `req` without waiting for its handshake: the start's answer, to
/// be awaited, and the session as announced when its row was made.
pub async fn start_in_background(
    h: &Harness,
    req: StartRequest,
) -> (
    tokio::task::JoinHandle<Result<SessionRecord, SupervisorError>>,
    SessionRecord,
) {
    let sup = h.sup.clone();
    let starting = tokio::spawn(async move {
        ractor::call!(sup, |reply| SupervisorMsg::Start { req, reply }).expect("start call")
    });
    let OperatorEvent::SessionStarted { session } = h
        .until("session started", |e| {
            matches!(e, OperatorEvent::SessionStarted { .. })
        })
        .await
    else {
        unreachable!()
    };
    (starting, session)
}

/// Python agent lines (before its `on`) that hold the `initialize` answer
/// until a file `go` exists in the agent's directory, so a test acts while
/// the start waits; with `EXIT_AT_GO = True` the agent exits 3 there instead.
pub const HOLD_INITIALIZE_UNTIL_GO: &str = r#"
import os, time
EXIT_AT_GO = False
_send = send
def send(m):
    if isinstance(m.get("result"), dict) and "protocolVersion" in m["result"]:
        while not os.path.exists("go"):
            time.sleep(0.01)
        if EXIT_AT_GO:
            sys.exit(3)
    _send(m)
"#;

/// What every Python agent of the tests starts with (see
/// [`Harness::python_agent`]).
const PYTHON_AGENT_HEAD: &str = r#"
import json, sys
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
def chunk(text):
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1",
          "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}})
def ask(rid, title):
    send({"jsonrpc": "2.0", "id": rid, "method": "session/request_permission", "params": {
        "sessionId": "s1", "toolCall": {"toolCallId": title, "title": title, "kind": "edit"},
        "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}})
def ask_for(rid, tool_call_id):
    send({"jsonrpc": "2.0", "id": rid, "method": "session/request_permission", "params": {
        "sessionId": "s1", "toolCall": {"toolCallId": tool_call_id},
        "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}})
def at_eof():
    pass
"#;

/// The handshake, then each message to the body's `on`, then `at_eof`.
const PYTHON_AGENT_LOOP: &str = r#"
for line in sys.stdin:
    m = json.loads(line)
    method, mid = m.get("method"), m.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": "s1"}})
    else:
        on(m, method, mid)
at_eof()
"#;
