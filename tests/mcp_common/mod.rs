//! Test harness for the MCP endpoint: the real core actors (supervisor,
//! workspace registry) over an in-memory SQLite store, the MCP router served
//! by axum on 127.0.0.1:0, rmcp's own client, and an operator simulated by
//! sending `Decide` / `Steer` to session actors.

#![allow(dead_code)]

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_intercom::mcp::{McpDeps, router};
use agent_intercom::storage::SqliteStore;
use intercom_actors::memory::RecordingSink;
use intercom_actors::model::{
    Decision, PendingRequest, Protocol, SessionId, SessionRecord, TranscriptEntry,
};
use intercom_actors::ports::{OperatorEvent, SessionStore};
use intercom_actors::registry::{RegistryMsg, WorkspaceMap, WorkspaceRegistry};
use intercom_actors::session::{Caller, Choice, SessionMsg, SessionSettings, SteerOutcome};
use intercom_actors::settings::{
    AgentProfile, Limits, StallPolicy, SupervisionPolicy, WorkspaceEntry,
};
use intercom_actors::supervisor::{SessionSupervisor, StartRequest, SupervisorArgs, SupervisorMsg};
use ractor::{Actor, ActorRef};
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceError, ServiceExt};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Deadline for anything a test waits on.
pub const WAIT: Duration = Duration::from_secs(20);

/// A connected rmcp client.
pub type Client = RunningService<RoleClient, ()>;

/// Timeouts (and the rule set) for one harness.
#[derive(Clone)]
pub struct Timeouts {
    pub approval: Duration,
    pub transmit: Duration,
    pub rules: intercom_actors::rules::SharedRules,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            approval: Duration::from_secs(60),
            transmit: Duration::from_secs(60),
            rules: Default::default(),
        }
    }
}

pub struct Harness {
    pub sup: ActorRef<SupervisorMsg>,
    pub registry: ActorRef<RegistryMsg>,
    pub store: Arc<dyn SessionStore>,
    /// The same store, for what the port does not read (the audit log).
    pub sqlite: Arc<SqliteStore>,
    pub sink: Arc<RecordingSink>,
    pub dir: tempfile::TempDir,
    /// `<tmp>/root/ws`, canonical: the workspace `ws` (channel C1).
    pub workspace: PathBuf,
    pub port: u16,
    scenarios: std::sync::atomic::AtomicUsize,
}

impl Harness {
    pub async fn new() -> Harness {
        Self::with(Timeouts::default()).await
    }

    pub async fn with(timeouts: Timeouts) -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        let workspace = root.join("ws");
        std::fs::create_dir_all(&workspace).expect("mkdir ws");
        let root = root.canonicalize().expect("canon root");
        let workspace = workspace.canonicalize().expect("canon ws");
        let sqlite = Arc::new(SqliteStore::open_in_memory().await.expect("store"));
        let store: Arc<dyn SessionStore> = sqlite.clone();
        let sink = Arc::new(RecordingSink::new());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let settings = Arc::new(SessionSettings {
            server_files: Default::default(),
            limits: Limits {
                startup_timeout_secs: 20,
                shutdown_grace_secs: 1,
                ..Limits::default()
            },
            stall: StallPolicy {
                inactivity_secs: 0,
                ..StallPolicy::default()
            },
            operators: HashSet::new(),
            ..SessionSettings::default()
        });
        let (sup, _) = Actor::spawn(
            None,
            SessionSupervisor,
            SupervisorArgs {
                policy: SupervisionPolicy::default(),
                settings,
                store: store.clone(),
                sink: sink.clone(),
                bridge_url: Some(format!("http://127.0.0.1:{port}/mcp")),
            },
        )
        .await
        .expect("supervisor");
        let map = WorkspaceMap {
            workspace_root: root,
            workspaces: vec![WorkspaceEntry {
                id: "ws".into(),
                path: workspace.clone(),
                channel_id: "C1".into(),
                label: None,
                default_agent: None,
            }],
            agents: vec![],
            default_agent: None,
        };
        let (registry, _) = Actor::spawn(None, WorkspaceRegistry, map)
            .await
            .expect("registry");
        let mut deps = McpDeps::new(sup.clone(), registry.clone(), store.clone());
        deps.approval_timeout = timeouts.approval;
        deps.transmit_timeout = timeouts.transmit;
        deps.rules = timeouts.rules.clone();
        deps.credentials = agent_intercom::mcp::McpCredentials {
            api_token: Some(agent_intercom::http::auth::ApiToken::new(OPERATOR_TOKEN)),
            workspace_tokens: vec![(
                "ws".into(),
                agent_intercom::http::auth::ApiToken::new(WORKSPACE_TOKEN),
            )],
        };
        let app = router(deps);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Harness {
            sup,
            registry,
            store,
            sqlite,
            sink,
            dir,
            workspace,
            port,
            scenarios: Default::default(),
        }
    }

    pub fn url(&self, query: &str) -> String {
        format!("http://127.0.0.1:{}/mcp{query}", self.port)
    }

    /// An rmcp client connected to `/mcp<query>` with the operator token.
    pub async fn client(&self, query: &str) -> Client {
        self.client_with(query, OPERATOR_TOKEN).await
    }

    /// An rmcp client connected to `/mcp<query>` presenting `token`.
    pub async fn client_with(&self, query: &str, token: &str) -> Client {
        let config =
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                self.url(query),
            )
            .auth_header(token);
        let transport = StreamableHttpClientTransport::from_config(config);
        ().serve(transport).await.expect("client connects")
    }

    /// A client for the workspace `ws`.
    pub async fn ws_client(&self) -> Client {
        self.client("?workspace_id=ws").await
    }

    pub async fn lookup(&self, id: &SessionId) -> Option<ActorRef<SessionMsg>> {
        ractor::call!(self.sup, |reply| SupervisorMsg::Lookup {
            id: id.clone(),
            reply
        })
        .expect("lookup")
    }

    pub async fn actor(&self, id: &SessionId) -> ActorRef<SessionMsg> {
        self.lookup(id).await.expect("session is live")
    }

    /// The MCP sessions in the store, newest first.
    pub async fn mcp_sessions(&self) -> Vec<SessionRecord> {
        self.store
            .list_sessions(false)
            .await
            .expect("list")
            .into_iter()
            .filter(|s| s.protocol == Protocol::Mcp)
            .collect()
    }

    /// The single MCP session (waits for it to appear).
    pub async fn mcp_session(&self) -> SessionRecord {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let mut all = self.mcp_sessions().await;
            if let Some(s) = all.pop() {
                assert!(all.is_empty(), "more than one MCP session: {all:?}");
                return s;
            }
            assert!(tokio::time::Instant::now() < deadline, "no MCP session");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for a pending request and returns it.
    pub async fn pending(&self) -> PendingRequest {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let mut reqs = self.store.list_requests(None, true).await.expect("list");
            if let Some(r) = reqs.pop() {
                return r;
            }
            assert!(tokio::time::Instant::now() < deadline, "no pending request");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until exactly `n` requests are pending.
    pub async fn until_pending_count(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let now = self
                .store
                .list_requests(None, true)
                .await
                .expect("list")
                .len();
            if now == n {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{now} pending, not {n}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the stored request satisfies `pred`.
    pub async fn until_request(
        &self,
        id: &str,
        pred: impl Fn(&PendingRequest) -> bool,
    ) -> PendingRequest {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some((r, _)) = self.store.get_request(id).await.expect("get")
                && pred(&r)
            {
                return r;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "request {id} never got there: {:?}",
                self.store.get_request(id).await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The operator decides on a request.
    pub async fn decide(
        &self,
        req: &PendingRequest,
        choice: Choice,
        reason: Option<&str>,
    ) -> Decision {
        let actor = self.actor(&req.session_id).await;
        let request_id = req.id.clone();
        let reason = reason.map(str::to_owned);
        ractor::call!(actor, |reply| SessionMsg::Decide {
            request_id,
            choice,
            reason,
            caller: Caller::local(),
            reply
        })
        .expect("call")
        .expect("decided")
        .decision
    }

    /// The operator steers a session.
    pub async fn steer(&self, id: &SessionId, text: &str) -> SteerOutcome {
        let actor = self.actor(id).await;
        let text = text.to_owned();
        ractor::call!(actor, |reply| SessionMsg::Steer {
            text,
            interrupt: false,
            caller: Caller::local(),
            reply
        })
        .expect("call")
        .expect("steered")
    }

    pub async fn transcript(&self, id: &SessionId) -> Vec<TranscriptEntry> {
        self.store.transcript(id).await.expect("transcript")
    }

    /// Waits until the session's transcript contains `needle`.
    pub async fn until_transcript(&self, id: &SessionId, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let text = self
                .transcript(id)
                .await
                .into_iter()
                .map(|m| m.content)
                .collect::<Vec<_>>()
                .join("\n");
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

    /// Waits until an operator event satisfies `pred`.
    pub async fn until_event(
        &self,
        what: &str,
        pred: impl Fn(&OperatorEvent) -> bool,
    ) -> OperatorEvent {
        match self.sink.wait_for(WAIT, pred).await {
            Some(e) => e,
            None => panic!("never saw {what}; events:\n{:#?}", self.sink.events()),
        }
    }

    /// Waits until the stored session satisfies `pred`.
    pub async fn until_session(
        &self,
        id: &SessionId,
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
                "session {id} never got there: {:?}",
                self.store.get_session(id).await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// An agent profile running the scripted agent with `scenario`.
    pub fn profile(&self, scenario: Value) -> AgentProfile {
        let n = self
            .scenarios
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = self.dir.path().join(format!("scenario-{n}.json"));
        std::fs::write(&path, scenario.to_string()).expect("write scenario");
        AgentProfile {
            id: format!("scripted-{n}"),
            command: agent_bin().display().to_string(),
            args: vec!["--scenario".into(), path.display().to_string()],
            env: vec![],
            protocol: Protocol::Acp,
            framing: Default::default(),
            auth_method: None,
        }
    }

    /// Starts an ACP session with the scripted agent.
    pub async fn start_acp(&self, scenario: Value) -> SessionRecord {
        let req = StartRequest {
            workspace: "ws".into(),
            cwd: self.workspace.clone(),
            channel_id: Some("C1".into()),
            profile: self.profile(scenario),
            prompt: "go".into(),
            owner: "local".into(),
            mode: None,
        };
        ractor::call!(self.sup, |reply| SupervisorMsg::Start { req, reply })
            .expect("supervisor call")
            .expect("session starts")
    }

    /// An ACP session in workspace `ws` whose agent advertises HTTP MCP,
    /// and the bridge token it was given (the agent echoes it).
    pub async fn bridge_token(&self) -> (SessionRecord, String) {
        let acp = self
            .start_acp(serde_json::json!({"mcp_http": true, "turns": [[{"echo_mcp": true}]]}))
            .await;
        let text = self.until_transcript(&acp.id, "Bearer ").await;
        let token = text
            .split("Bearer ")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("the agent echoed its bridge token")
            .to_owned();
        (acp, token)
    }
}

// One harness per test crate may include this alongside another.
#[allow(clippy::duplicate_mod)]
#[path = "../shared/scripted_agent.rs"]
mod scripted_agent;
pub use scripted_agent::agent_bin;

/// JSON arguments as an rmcp object.
pub fn args(v: Value) -> JsonObject {
    match v {
        Value::Object(o) => o,
        other => panic!("arguments must be an object, got {other}"),
    }
}

/// Calls a tool.
pub async fn call(
    client: &Client,
    tool: &'static str,
    a: Value,
) -> Result<CallToolResult, ServiceError> {
    client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(args(a)))
        .await
}

/// Calls a tool that must succeed; returns its structured result.
pub async fn ok(client: &Client, tool: &'static str, a: Value) -> Value {
    let r = call(client, tool, a).await.expect("tool call");
    assert_ne!(r.is_error, Some(true), "{tool} failed: {r:?}");
    structured(&r)
}

/// Calls a tool that must be refused before it runs (an MCP error, such as
/// invalid params); returns the error.
pub async fn invalid(client: &Client, tool: &'static str, a: Value) -> rmcp::model::ErrorData {
    match call(client, tool, a).await {
        Err(ServiceError::McpError(e)) => e,
        other => panic!("{tool} should have been refused: {other:?}"),
    }
}

/// Calls a tool that must fail as a tool error; returns `{error, code}`.
pub async fn refused(client: &Client, tool: &'static str, a: Value) -> Value {
    let r = call(client, tool, a).await.expect("tool call");
    assert_eq!(r.is_error, Some(true), "{tool} should have failed: {r:?}");
    structured(&r)
}

/// The result as JSON: structured content, else the text parsed.
pub fn structured(r: &CallToolResult) -> Value {
    if let Some(v) = &r.structured_content {
        return v.clone();
    }
    let text = r
        .content
        .iter()
        .find_map(|c| c.as_text().map(|t| t.text.clone()))
        .expect("text content");
    serde_json::from_str(&text).expect("JSON text")
}

/// The operator API token the harness accepts on `/mcp`.
pub const OPERATOR_TOKEN: &str = "operator-token-for-tests-0123456789";
/// The MCP token confined to workspace `ws`.
pub const WORKSPACE_TOKEN: &str = "ws-token-for-tests-0123456789";

/// A raw HTTP/1.1 POST with the operator token; returns the status code.
pub async fn raw_post(port: u16, path: &str, host: &str, body: &str) -> u16 {
    let auth = format!("Bearer {OPERATOR_TOKEN}");
    raw_post_with(port, path, host, &[("Authorization", &auth)], body).await
}

/// A raw HTTP/1.1 POST of `body` to `/mcp` with the operator token, read
/// to its end (for answers that end: errors); (status, body).
pub async fn raw_post_answer(port: u16, body: &[u8]) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {OPERATOR_TOKEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("write");
    s.write_all(body).await.expect("write body");
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.expect("read");
    let answer = String::from_utf8_lossy(&answer).to_string();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A raw HTTP/1.1 POST with exactly these extra headers; returns the status code.
pub async fn raw_post_with(
    port: u16,
    path: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> u16 {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 64];
    let n = s.read(&mut buf).await.expect("read");
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    head.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"))
}

/// An `initialize` request body.
pub const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;

/// A raw HTTP/1.1 answer: the status, the headers (names lower-cased) and
/// the body as received (an SSE body keeps its framing).
pub struct RawReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl RawReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One raw request to `/mcp<query>` presenting `token` and, when given,
/// `Mcp-Session-Id: session`. A GET returns after the head (a granted GET
/// is an endless event stream); anything else reads the whole answer.
pub async fn raw_mcp(
    port: u16,
    method: &str,
    query: &str,
    token: &str,
    session: Option<&str>,
    body: &str,
) -> RawReply {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let session = session
        .map(|id| format!("Mcp-Session-Id: {id}\r\nMCP-Protocol-Version: 2025-06-18\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} /mcp{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n{session}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        let head_done = raw.windows(4).any(|w| w == b"\r\n\r\n");
        if head_done && method == "GET" {
            break;
        }
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) => break,
            Ok(Ok(n)) => raw.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => panic!("read: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    RawReply {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// Opens an MCP session by hand (`initialize`, then `initialized`) with
/// `token` at `/mcp<query>`; returns its `Mcp-Session-Id`.
pub async fn raw_session(port: u16, query: &str, token: &str) -> String {
    let init = raw_mcp(port, "POST", query, token, None, INITIALIZE).await;
    assert_eq!(init.status, 200, "initialize: {}", init.body);
    let id = init
        .header("mcp-session-id")
        .expect("an Mcp-Session-Id header")
        .to_owned();
    let done = raw_mcp(
        port,
        "POST",
        query,
        token,
        Some(&id),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;
    assert_eq!(done.status, 202, "initialized: {}", done.body);
    id
}

/// A raw `tools/call` of `tool` on MCP session `session` at `/mcp<query>`,
/// presenting `token`.
pub async fn raw_tool(
    port: u16,
    query: &str,
    token: &str,
    session: &str,
    tool: &str,
    a: Value,
) -> RawReply {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": tool, "arguments": a},
    });
    raw_mcp(port, "POST", query, token, Some(session), &body.to_string()).await
}
