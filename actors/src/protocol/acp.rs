//! The standard Agent Client Protocol (v1), client side.
//!
//! Builds the requests we send (`initialize`, `authenticate`, `session/new`,
//! `session/load`, `session/prompt`, `session/cancel`, permission answers) and
//! digests what agents send (`session/update`, `session/request_permission`,
//! `fs/*`) into the small shapes the session actor works with. The wire types
//! come from the official `agent-client-protocol-schema` crate; this module is
//! the only place that touches them, so a schema upgrade stays local.

use agent_client_protocol_schema::v1 as acp;
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::PathBuf;

use crate::model::{OptionKind, PermissionOption};
use crate::text::one_line;

/// How long matching the lines of one diff may take before it falls back
/// to a coarser (still correct) one. The diff runs in the session actor, on
/// an async worker: two agents sending updates with ten big diffs each at
/// 250 ms apiece held both workers of a 2-core machine, and `/healthz`
/// took seconds.
const DIFF_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(20);

/// Past this many lines on both sides together, lines are not matched at
/// all: past the common start and end, the old lines are shown removed and
/// the new ones added. Linear time, however hostile the texts.
const DIFF_MATCH_LINES: usize = 4000;

/// Method names used on the wire.
pub mod methods {
    /// Handshake.
    pub const INITIALIZE: &str = "initialize";
    /// Authentication.
    pub const AUTHENTICATE: &str = "authenticate";
    /// New session.
    pub const SESSION_NEW: &str = "session/new";
    /// Resume with history replay.
    pub const SESSION_LOAD: &str = "session/load";
    /// Resume without replay (where advertised).
    pub const SESSION_RESUME: &str = "session/resume";
    /// A prompt turn.
    pub const SESSION_PROMPT: &str = "session/prompt";
    /// Cancel the running turn (notification).
    pub const SESSION_CANCEL: &str = "session/cancel";
    /// Streamed progress (notification from the agent).
    pub const SESSION_UPDATE: &str = "session/update";
    /// The agent asks for permission.
    pub const REQUEST_PERMISSION: &str = "session/request_permission";
    /// The agent reads a file through us.
    pub const FS_READ: &str = "fs/read_text_file";
    /// The agent writes a file through us.
    pub const FS_WRITE: &str = "fs/write_text_file";
    /// The agent withdraws a request it made (a notification).
    pub const CANCEL_REQUEST: &str = "$/cancel_request";
}

/// What the agent told us about itself in `initialize`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentInfo {
    /// Agent-reported name and version, when given.
    pub name: Option<String>,
    /// `agentCapabilities.loadSession`.
    pub load_session: bool,
    /// `agentCapabilities.sessionCapabilities.resume` is present.
    pub resume_session: bool,
    /// `agentCapabilities.mcpCapabilities.http`.
    pub mcp_http: bool,
    /// Offered auth methods as (id, name).
    pub auth_methods: Vec<(String, String)>,
}

impl AgentInfo {
    /// Digests an `initialize` result.
    pub fn from_initialize(result: &Value) -> Result<AgentInfo, String> {
        let resp = acp::InitializeResponse::deserialize(result)
            .map_err(|e| format!("initialize result does not match the ACP schema: {e}"))?;
        // The agent answers with the version it will speak; one this server
        // does not speak is a conversation neither side can follow (ACP:
        // the client closes the connection and tells the user).
        if resp.protocol_version != agent_client_protocol_schema::ProtocolVersion::V1 {
            return Err(format!(
                "the agent speaks ACP protocol version {}, and this server speaks version 1; use an agent release that speaks version 1",
                serde_json::to_value(resp.protocol_version).unwrap_or(Value::Null)
            ));
        }
        let caps = &resp.agent_capabilities;
        let resume_session = result
            .pointer("/agentCapabilities/sessionCapabilities/resume")
            .is_some_and(|v| !v.is_null());
        Ok(AgentInfo {
            name: resp
                .agent_info
                .as_ref()
                .map(|i| format!("{} {}", i.name, i.version)),
            load_session: caps.load_session,
            resume_session,
            mcp_http: caps.mcp_capabilities.http,
            auth_methods: resp
                .auth_methods
                .iter()
                .map(|m| (m.id().to_string(), m.name().to_owned()))
                .collect(),
        })
    }

    /// "api-key (API key), oauth (Log in)" or "none". The agent names them:
    /// each is cut and escaped, and at most [`AUTH_METHODS_SHOWN`] are
    /// listed (the rest counted), as this reaches logs and notices.
    pub fn describe_auth_methods(&self) -> String {
        if self.auth_methods.is_empty() {
            return "none".to_owned();
        }
        let mut listed: Vec<String> = self
            .auth_methods
            .iter()
            .take(AUTH_METHODS_SHOWN)
            .map(|(id, name)| format!("{} ({})", one_line(id, 64), one_line(name, 128)))
            .collect();
        let more = self.auth_methods.len().saturating_sub(AUTH_METHODS_SHOWN);
        if more > 0 {
            listed.push(format!("{more} more"));
        }
        listed.join(", ")
    }
}

/// How many of an agent's authentication methods a notice lists.
pub const AUTH_METHODS_SHOWN: usize = 16;

/// `initialize` params: protocol v1, fs read/write capabilities, our identity.
pub fn initialize_params() -> Value {
    let caps = acp::ClientCapabilities::new().fs(acp::FileSystemCapabilities::new()
        .read_text_file(true)
        .write_text_file(true));
    let req = acp::InitializeRequest::new(agent_client_protocol_schema::ProtocolVersion::V1)
        .client_capabilities(caps)
        .client_info(acp::Implementation::new(
            "agent-intercom",
            env!("CARGO_PKG_VERSION"),
        ));
    serde_json::to_value(req).unwrap_or(Value::Null)
}

/// `authenticate` params.
pub fn authenticate_params(method_id: &str) -> Value {
    serde_json::to_value(acp::AuthenticateRequest::new(method_id.to_owned())).unwrap_or(Value::Null)
}

/// An MCP server to hand to the agent in `session/new`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpHttpServer {
    /// Display name.
    pub name: String,
    /// The endpoint URL (no credentials in it: URLs end up in logs).
    pub url: String,
    /// HTTP headers the agent sends with every request (the bridge token as
    /// `Authorization: Bearer ...`).
    pub headers: Vec<(String, String)>,
}

fn mcp_servers_json(servers: &[McpHttpServer]) -> Value {
    Value::Array(
        servers
            .iter()
            .map(|s| {
                let headers: Vec<Value> = s
                    .headers
                    .iter()
                    .map(|(name, value)| json!({"name": name, "value": value}))
                    .collect();
                json!({"type": "http", "name": s.name, "url": s.url, "headers": headers})
            })
            .collect(),
    )
}

/// `session/new` params.
pub fn new_session_params(cwd: &std::path::Path, mcp: &[McpHttpServer]) -> Value {
    json!({"cwd": cwd, "mcpServers": mcp_servers_json(mcp)})
}

/// `session/load` or `session/resume` params.
pub fn load_session_params(
    session_id: &str,
    cwd: &std::path::Path,
    mcp: &[McpHttpServer],
) -> Value {
    json!({"sessionId": session_id, "cwd": cwd, "mcpServers": mcp_servers_json(mcp)})
}

/// `session/new` result -> the agent's session id.
pub fn session_id_from_new(result: &Value) -> Result<String, String> {
    let resp = acp::NewSessionResponse::deserialize(result)
        .map_err(|e| format!("session/new result does not match the ACP schema: {e}"))?;
    Ok(resp.session_id.to_string())
}

/// `session/prompt` params with one text block.
pub fn prompt_params(session_id: &str, text: &str) -> Value {
    let req = acp::PromptRequest::new(
        session_id.to_owned(),
        vec![acp::ContentBlock::Text(acp::TextContent::new(
            text.to_owned(),
        ))],
    );
    serde_json::to_value(req).unwrap_or(Value::Null)
}

/// `session/prompt` result -> stop reason (`end_turn`, `cancelled`, ...).
pub fn stop_reason(result: &Value) -> String {
    result
        .get("stopReason")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_owned()
}

/// `session/cancel` params.
pub fn cancel_params(session_id: &str) -> Value {
    serde_json::to_value(acp::CancelNotification::new(session_id.to_owned())).unwrap_or(Value::Null)
}

/// A `session/request_permission` answer choosing an option.
pub fn permission_selected(option_id: &str) -> Value {
    let outcome = acp::RequestPermissionOutcome::Selected(acp::SelectedPermissionOutcome::new(
        option_id.to_owned(),
    ));
    serde_json::to_value(acp::RequestPermissionResponse::new(outcome)).unwrap_or(Value::Null)
}

/// A `session/request_permission` answer saying the turn was cancelled.
pub fn permission_cancelled() -> Value {
    serde_json::to_value(acp::RequestPermissionResponse::new(
        acp::RequestPermissionOutcome::Cancelled,
    ))
    .unwrap_or(Value::Null)
}

/// One `diff` content block of a tool call, as the agent sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnouncedEdit {
    /// The file, as the agent named it (usually absolute).
    pub path: PathBuf,
    /// The text replaced; `None` for a new (or wholly rewritten) file.
    pub old_text: Option<String>,
    /// The replacement text.
    pub new_text: String,
}

/// A tool call or a partial update of one: only the fields the agent sent.
/// `session/request_permission` carries one too (often only the id).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolCallView {
    /// Agent's id.
    pub id: String,
    /// Title, when given (updates may omit it).
    pub title: Option<String>,
    /// read / edit / execute / ...
    pub kind: Option<String>,
    /// pending / in_progress / completed / failed.
    pub status: Option<String>,
    /// The `diff` blocks of `content`, when `content` was sent (it replaces
    /// the previous content as a whole).
    pub edits: Option<Vec<AnnouncedEdit>>,
    /// `locations`, when sent.
    pub locations: Option<Vec<PathBuf>>,
    /// `rawInput`, when sent (the command of an `execute` call lives there).
    pub raw_input: Option<Value>,
}

/// The command of an execute call (`rawInput.command`), when given.
pub fn command_of(raw: Option<&Value>) -> Option<String> {
    let raw = raw?;
    let present: Vec<(&str, &Value)> = COMMAND_KEYS
        .iter()
        .filter_map(|k| raw.get(*k).map(|v| (*k, v)))
        .collect();
    // Two keys that could each be what runs: both are shown (as JSON, which
    // no allow rule's prefix matches), not the first alone (a probe's
    // `command` said `git status` while its `cmd` said something else).
    if present.len() > 1 {
        let both: serde_json::Map<String, Value> = present
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).clone()))
            .collect();
        return Some(Value::Object(both).to_string());
    }
    let (_, value) = present.into_iter().next()?;
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) if parts.iter().all(Value::is_string) => Some(
            parts
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" "),
        ),
        // Any other shape is shown (and judged) as the JSON it is: dropping
        // the parts that are not strings hid `; curl …` from the operator.
        other => Some(other.to_string()),
    }
}

/// Keys of `rawInput` that carry the command an execute call runs, in the
/// order they are looked for (Claude Code's and Gemini CLI's `command`;
/// `cmd`, `script`, `commandLine` elsewhere).
const COMMAND_KEYS: &[&str] = &["command", "cmd", "script", "commandLine", "command_line"];

/// What the agent reported about its context window and cost
/// (`usage_update`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Usage {
    /// Tokens in context.
    pub used: u64,
    /// Context window size in tokens.
    pub size: u64,
    /// Cumulative session cost, when given.
    pub cost: Option<f64>,
    /// Unit of `cost` (`USD`, ...).
    pub currency: Option<String>,
}

impl Usage {
    /// "53k/200k tokens · 0.05 USD".
    pub fn describe(&self) -> String {
        let k = |n: u64| {
            if n >= 1000 {
                format!("{}k", n / 1000)
            } else {
                n.to_string()
            }
        };
        let mut text = format!("{}/{} tokens", k(self.used), k(self.size));
        if let Some(cost) = self.cost {
            text.push_str(&format!(
                " · {cost:.2} {}",
                self.currency.as_deref().unwrap_or("")
            ));
        }
        text.trim_end().to_owned()
    }
}

/// A `session/update`, digested.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// Agent message text.
    AgentText(String),
    /// User message text (history replay).
    UserText(String),
    /// Agent reasoning.
    Thought(String),
    /// A new tool call.
    ToolCall(ToolCallView),
    /// A change to a tool call.
    ToolCallUpdate(ToolCallView),
    /// The plan, replaced as a whole: (content, status).
    Plan(Vec<(String, String)>),
    /// Context window and cost.
    Usage(Usage),
    /// Anything else we keep only as a count (commands, mode, config, usage, ...).
    Other(String),
}

fn text_of(block: &acp::ContentBlock) -> String {
    match block {
        acp::ContentBlock::Text(t) => t.text.clone(),
        _ => "[non-text content]".to_owned(),
    }
}

fn snake(v: impl serde::Serialize) -> Option<String> {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
}

fn edits_of(content: &[acp::ToolCallContent]) -> Vec<AnnouncedEdit> {
    content
        .iter()
        .filter_map(|c| match c {
            acp::ToolCallContent::Diff(d) => Some(AnnouncedEdit {
                path: d.path.clone(),
                old_text: d.old_text.clone(),
                new_text: d.new_text.clone(),
            }),
            _ => None,
        })
        .collect()
}

fn view_of_call(call: &acp::ToolCall) -> ToolCallView {
    ToolCallView {
        id: call.tool_call_id.to_string(),
        title: Some(call.title.clone()),
        kind: snake(call.kind),
        status: snake(call.status),
        edits: Some(edits_of(&call.content)),
        locations: Some(call.locations.iter().map(|l| l.path.clone()).collect()),
        raw_input: call.raw_input.clone(),
    }
}

fn view_of_update(upd: &acp::ToolCallUpdate) -> ToolCallView {
    let f = &upd.fields;
    ToolCallView {
        id: upd.tool_call_id.to_string(),
        title: f.title.clone(),
        kind: f.kind.and_then(snake),
        status: f.status.and_then(snake),
        edits: f.content.as_deref().map(edits_of),
        locations: f
            .locations
            .as_ref()
            .map(|locs| locs.iter().map(|l| l.path.clone()).collect()),
        raw_input: f.raw_input.clone(),
    }
}

/// Digests `session/update` params; errors name what did not match.
pub fn parse_update(params: &Value) -> Result<(String, Update), String> {
    let n = match acp::SessionNotification::deserialize(params) {
        Ok(n) => n,
        Err(e) => {
            return lenient_plan(params)
                .or_else(|| lenient_chunk(params))
                .ok_or_else(|| format!("session/update does not match the ACP schema: {e}"));
        }
    };
    Ok(digest(&n, params))
}

/// A message chunk whose content block is of a type this schema does not
/// know (a newer agent's): shown as non-text content, as a known non-text
/// block is, rather than the whole chunk dropped unseen.
fn lenient_chunk(params: &Value) -> Option<(String, Update)> {
    let update = params.get("update")?;
    let kind = update.get("content")?.get("type")?.as_str()?;
    if kind == "text" {
        return None; // a text block that did not match: a real mismatch
    }
    let session = params.get("sessionId")?.as_str()?.to_owned();
    let text = "[non-text content]".to_owned();
    let update = match update.get("sessionUpdate")?.as_str()? {
        "agent_message_chunk" => Update::AgentText(text),
        "agent_thought_chunk" => Update::Thought(text),
        "user_message_chunk" => Update::UserText(text),
        _ => return None,
    };
    Some((session, update))
}

/// A whole frame that is a `session/update` notification, read straight
/// into the schema's types: most of what an agent sends is streamed text
/// and tool calls, and building a JSON tree first, then reading the types
/// from it, was about a seventh of the server's time under load (see
/// BENCHMARKS.md, "Issue 13, session 22").
///
/// `None` for anything else, or anything it cannot read as it stands (a
/// request, another member, a plan, which is read leniently, a mode or
/// config change, a string cut mid-emoji, a mismatch): the caller then
/// takes the general path, which reads, mends or refuses it as before. So
/// this can only be faster, never more lenient.
pub fn parse_update_frame(body: &[u8]) -> Option<(String, Update)> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct UpdateFrame<'a> {
        #[serde(default, rename = "jsonrpc")]
        _jsonrpc: Option<serde::de::IgnoredAny>,
        #[serde(borrow)]
        method: &'a str,
        #[serde(borrow)]
        params: &'a serde_json::value::RawValue,
    }
    let frame: UpdateFrame = serde_json::from_slice(body).ok()?;
    if frame.method != methods::SESSION_UPDATE {
        return None;
    }
    let n: acp::SessionNotification = serde_json::from_str(frame.params.get()).ok()?;
    if matches!(n.update, acp::SessionUpdate::Plan(_)) {
        return None;
    }
    let digested = digest(&n, &Value::Null);
    // Modes and config options are read from the raw update.
    (!matches!(digested.1, Update::Other(_))).then_some(digested)
}

/// What the session actor needs of one update (`params`: the raw update,
/// for a plan read leniently).
fn digest(n: &acp::SessionNotification, params: &Value) -> (String, Update) {
    let update = match &n.update {
        acp::SessionUpdate::AgentMessageChunk(c) => Update::AgentText(text_of(&c.content)),
        acp::SessionUpdate::UserMessageChunk(c) => Update::UserText(text_of(&c.content)),
        acp::SessionUpdate::AgentThoughtChunk(c) => Update::Thought(text_of(&c.content)),
        acp::SessionUpdate::ToolCall(call) => Update::ToolCall(view_of_call(call)),
        acp::SessionUpdate::ToolCallUpdate(u) => Update::ToolCallUpdate(view_of_update(u)),
        // Read from the wire, not the schema's type: it leaves out entries
        // whose status or priority it does not know.
        acp::SessionUpdate::Plan(p) => lenient_plan(params).map_or_else(
            || {
                Update::Plan(
                    p.entries
                        .iter()
                        .map(|e| (e.content.clone(), snake(&e.status).unwrap_or_default()))
                        .collect(),
                )
            },
            |(_, plan)| plan,
        ),
        acp::SessionUpdate::UsageUpdate(u) => Update::Usage(Usage {
            used: u.used,
            size: u.size,
            cost: u.cost.as_ref().map(|c| c.amount),
            currency: u.cost.as_ref().map(|c| c.currency.clone()),
        }),
        other => Update::Other(
            serde_json::to_value(other)
                .ok()
                .and_then(|v| {
                    v.get("sessionUpdate")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| "unknown".to_owned()),
        ),
    };
    (n.session_id.to_string(), update)
}

/// A status outside the schema, kept when it is one short word
/// (`blocked`), else `other`: viewers may style by status, and a probe's
/// `x toast` drew a plan entry as the console's own decision toast.
fn plan_status(status: &str) -> String {
    let word = !status.is_empty()
        && status.len() <= 32
        && status
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if word {
        status.to_owned()
    } else {
        "other".to_owned()
    }
}

/// A plan whose entries stray from the schema (a status such as
/// `blocked`, a missing or unknown priority): every entry with text is kept,
/// its status as given, rather than the whole plan dropped unseen.
fn lenient_plan(params: &Value) -> Option<(String, Update)> {
    let update = params.get("update")?;
    if update.get("sessionUpdate")?.as_str()? != "plan" {
        return None;
    }
    let session = params.get("sessionId")?.as_str()?.to_owned();
    let entries = update
        .get("entries")?
        .as_array()?
        .iter()
        .filter_map(|e| {
            let content = e.get("content")?.as_str()?.to_owned();
            let status = e.get("status").and_then(Value::as_str).unwrap_or("");
            Some((content, plan_status(status)))
        })
        .collect();
    Some((session, Update::Plan(entries)))
}

/// A permission request, digested.
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionAsk {
    /// The tool call it is about.
    pub tool: ToolCallView,
    /// The options to offer.
    pub options: Vec<PermissionOption>,
}

/// The most options one permission request may offer.
pub const MAX_PERMISSION_OPTIONS: usize = 16;
/// The longest option id accepted, in bytes.
pub const MAX_OPTION_ID_BYTES: usize = 256;

/// Digests `session/request_permission` params.
pub fn parse_permission(params: &Value) -> Result<PermissionAsk, String> {
    let req = acp::RequestPermissionRequest::deserialize(params)
        .map_err(|e| format!("session/request_permission does not match the ACP schema: {e}"))?;
    let options = req
        .options
        .iter()
        .map(|o| PermissionOption {
            id: o.option_id.to_string(),
            name: o.name.clone(),
            kind: match o.kind {
                acp::PermissionOptionKind::AllowOnce => OptionKind::AllowOnce,
                acp::PermissionOptionKind::AllowAlways => OptionKind::AllowAlways,
                acp::PermissionOptionKind::RejectOnce => OptionKind::RejectOnce,
                _ => OptionKind::RejectAlways,
            },
        })
        .collect::<Vec<_>>();
    if options.is_empty() {
        return Err("session/request_permission offers no options".to_owned());
    }
    // Each option becomes a button whose value carries its id (Slack takes
    // 2,000 characters and 50 blocks at most): past these bounds Slack
    // would refuse the message and the request would reach the operator
    // without buttons.
    if options.len() > MAX_PERMISSION_OPTIONS {
        return Err(format!(
            "session/request_permission offers {} options; at most {MAX_PERMISSION_OPTIONS} are accepted",
            options.len()
        ));
    }
    if let Some(long) = options.iter().find(|o| o.id.len() > MAX_OPTION_ID_BYTES) {
        return Err(format!(
            "session/request_permission offers an option id of {} bytes; at most {MAX_OPTION_ID_BYTES} are accepted",
            long.id.len()
        ));
    }
    // One id for two options would let the operator choose one and the
    // agent act on the other.
    let mut ids = std::collections::HashSet::new();
    if let Some(twice) = options.iter().find(|o| !ids.insert(o.id.as_str())) {
        return Err(format!(
            "session/request_permission offers option id {:?} twice; option ids must be unique",
            twice.id
        ));
    }
    Ok(PermissionAsk {
        tool: view_of_update(&req.tool_call),
        options,
    })
}

/// Digests `fs/write_text_file` params into (path, content).
pub fn parse_fs_write(params: &Value) -> Result<(PathBuf, String), String> {
    let req = acp::WriteTextFileRequest::deserialize(params)
        .map_err(|e| format!("fs/write_text_file params: {e}"))?;
    Ok((req.path, req.content))
}

/// Digests `fs/read_text_file` params into (path, first line (1-based), line limit).
pub fn parse_fs_read(params: &Value) -> Result<(PathBuf, Option<u32>, Option<u32>), String> {
    let req = acp::ReadTextFileRequest::deserialize(params)
        .map_err(|e| format!("fs/read_text_file params: {e}"))?;
    Ok((req.path, req.line, req.limit))
}

/// `fs/read_text_file` result.
pub fn fs_read_result(content: String) -> Value {
    json!({ "content": content })
}

/// Applies `line` (1-based) and `limit` to file content, as ACP specifies.
pub fn slice_lines(content: &str, line: Option<u32>, limit: Option<u32>) -> String {
    if line.is_none() && limit.is_none() {
        return content.to_owned();
    }
    let start = line.unwrap_or(1).saturating_sub(1) as usize;
    let take = limit.map_or(usize::MAX, |l| l as usize);
    content
        .split_inclusive('\n')
        .skip(start)
        .take(take)
        .collect()
}

/// A unified diff of `old` -> `new` for `path` (empty old = new file).
/// A workspace-relative path gets git's `a/` and `b/` prefixes; an absolute
/// one (outside the workspace) is shown as it is.
pub fn unified_diff(path: &str, old: &str, new: &str) -> String {
    unified_diff_within(path, old, new, DIFF_TIMEOUT)
}

/// [`unified_diff`] taking at most about `timeout` to match lines (zero: a
/// coarse but correct diff at once).
pub fn unified_diff_within(
    path: &str,
    old: &str,
    new: &str,
    timeout: std::time::Duration,
) -> String {
    // Texts come from the agent: bound the work (the diff degrades to a
    // coarser but correct one past the deadline, at once for big texts).
    let lines = old.lines().count() + new.lines().count();
    let budget = if lines > DIFF_MATCH_LINES {
        std::time::Duration::ZERO
    } else {
        timeout.min(DIFF_TIMEOUT)
    };
    let diff = similar::TextDiff::configure()
        .timeout(budget)
        .diff_lines(old, new);
    // A control character in the name (the agent's) would forge headers:
    // `x\n--- a/CHANGELOG.md` read as a second file. Written escaped.
    let path: String = if path.chars().any(crate::text::breaks_a_line) {
        path.chars()
            .map(|c| {
                if crate::text::breaks_a_line(c) {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect()
    } else {
        path.to_owned()
    };
    let (a, b) = if path.starts_with('/') {
        (path.clone(), path.clone())
    } else {
        (format!("a/{path}"), format!("b/{path}"))
    };
    let from = if old.is_empty() {
        "/dev/null".to_owned()
    } else {
        a
    };
    diff.unified_diff()
        .context_radius(3)
        .header(&from, &b)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frame-level reading of an update gives exactly what the general
    /// path gives, and leaves to it everything else.
    #[test]
    fn an_update_read_from_its_frame_is_the_same_as_read_from_json() {
        let updates = [
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "héllo\n"}}),
            json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hm"}}),
            json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Edit a.rs", "kind": "edit", "status": "pending",
                   "content": [{"type": "diff", "path": "/w/a.rs", "oldText": "a", "newText": "b"}], "locations": [{"path": "/w/a.rs"}]}),
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed", "_meta": {"x": 1}}),
            json!({"sessionUpdate": "usage_update", "used": 10, "size": 100}),
        ];
        for update in updates {
            let params = json!({"sessionId": "s1", "update": update});
            let line =
                json!({"jsonrpc": "2.0", "method": "session/update", "params": params}).to_string();
            let fast = parse_update_frame(line.as_bytes());
            assert!(fast.is_some(), "{line}");
            assert_eq!(fast, parse_update(&params).ok(), "{line}");
        }
        let plan = json!({"sessionId": "s1", "update": {"sessionUpdate": "plan", "entries": []}});
        for line in [
            // A request, a plan (read leniently), another member, a lone
            // surrogate (mended), a mismatch: the general path's.
            json!({"jsonrpc": "2.0", "id": 1, "method": "session/update", "params": plan}).to_string(),
            json!({"jsonrpc": "2.0", "method": "session/update", "params": plan}).to_string(),
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}},"extra":1}"#.to_owned(),
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"\ud83d"}}}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"nonsense"}}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"current_mode_update","currentModeId":"plan"}}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","method":"fs/read_text_file","params":{}}"#.to_owned(),
        ] {
            assert_eq!(parse_update_frame(line.as_bytes()), None, "{line}");
        }
    }

    /// A chunk of a content type the schema does not know is shown as
    /// non-text content, not dropped; a text block that does not match
    /// stays an error.
    #[test]
    fn a_chunk_of_an_unknown_content_type_is_shown_as_non_text() {
        let params = json!({"sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk",
            "content": {"type": "hologram", "data": "..."}}});
        assert_eq!(
            parse_update(&params),
            Ok((
                "s1".to_owned(),
                Update::AgentText("[non-text content]".into())
            ))
        );
        let bad = json!({"sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk",
            "content": {"type": "text"}}});
        assert!(parse_update(&bad).is_err());
    }

    /// How much the frame-level reading saves (run by hand:
    /// `cargo test --release -p intercom-actors --lib update_reading_cost -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn update_reading_cost() {
        let chunk = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess-1-1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"streaming some agent text for the operator to read. "}}}}"#;
        let call = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess-1-1","update":{"sessionUpdate":"tool_call","toolCallId":"t1","title":"Edit file","kind":"edit","status":"pending"}}}"#;
        for (what, line) in [("chunk", chunk), ("tool_call", call)] {
            let n = 200_000;
            let t = std::time::Instant::now();
            for _ in 0..n {
                let msg =
                    crate::protocol::jsonrpc::RpcMessage::parse(line.as_bytes()).expect("parse");
                let crate::protocol::jsonrpc::RpcMessage::Notification { params, .. } = msg else {
                    panic!("a notification")
                };
                std::hint::black_box(parse_update(&params).expect("update"));
            }
            let general = t.elapsed().as_nanos() / n;
            let t = std::time::Instant::now();
            for _ in 0..n {
                std::hint::black_box(parse_update_frame(line.as_bytes()).expect("update"));
            }
            let frame = t.elapsed().as_nanos() / n;
            println!("{what}: general path {general} ns, from the frame {frame} ns");
        }
    }

    #[test]
    fn a_control_character_in_a_path_cannot_forge_diff_headers() {
        let d = unified_diff("x.sh\n--- a/CHANGELOG.md\n+++ b/CHANGELOG.md", "", "y\n");
        assert_eq!(
            d.lines().filter(|l| l.starts_with("+++ ")).count(),
            1,
            "{d}"
        );
        assert!(d.contains("+++ b/x.sh\\n--- a/CHANGELOG.md"), "{d}");
    }

    #[test]
    fn a_huge_diff_is_coarse_but_complete() {
        let old = "same start\n".to_owned() + &"a\n".repeat(15_000) + "same end\n";
        let new = "same start\n".to_owned() + &"b\n".repeat(15_000) + "same end\n";
        let started = std::time::Instant::now();
        let diff = unified_diff("big.txt", &old, &new);
        eprintln!("15,000-line diff in {:?}", started.elapsed());
        assert!(
            diff.starts_with("--- a/big.txt\n+++ b/big.txt\n"),
            "{}",
            &diff[..80]
        );
        assert_eq!(diff.lines().filter(|l| *l == "-a").count(), 15_000);
        assert_eq!(diff.lines().filter(|l| *l == "+b").count(), 15_000);
        assert!(diff.contains(" same start") && diff.contains(" same end"));
    }

    #[test]
    fn initialize_params_advertise_fs_and_identity() {
        let p = initialize_params();
        assert_eq!(p["protocolVersion"], 1);
        assert_eq!(p["clientCapabilities"]["fs"]["readTextFile"], true);
        assert_eq!(p["clientCapabilities"]["fs"]["writeTextFile"], true);
        assert_eq!(p["clientInfo"]["name"], "agent-intercom");
    }

    #[test]
    fn agent_info_reads_capabilities_and_auth_methods() {
        let r = json!({"protocolVersion":1,"agentCapabilities":{"loadSession":true,"mcpCapabilities":{"http":true}},
            "authMethods":[{"id":"oauth-personal","name":"Log in with Google"},{"id":"gemini-api-key","name":"Use Gemini API key","description":null}]});
        let info = AgentInfo::from_initialize(&r).expect("info");
        assert!(info.load_session && info.mcp_http && !info.resume_session);
        assert_eq!(
            info.describe_auth_methods(),
            "oauth-personal (Log in with Google), gemini-api-key (Use Gemini API key)"
        );
    }

    /// The agent names its methods, and the list reaches logs and notices:
    /// escaped, cut, and at most 16 of them.
    #[test]
    fn hostile_auth_methods_are_escaped_cut_and_counted() {
        let methods: Vec<Value> = (0..40)
            .map(|i| json!({"id": format!("m{i}\r\u{1b}[2K"), "name": "x".repeat(10_000)}))
            .collect();
        let r = json!({"protocolVersion": 1, "authMethods": methods});
        let shown = AgentInfo::from_initialize(&r)
            .expect("info")
            .describe_auth_methods();
        assert!(!shown.chars().any(char::is_control), "{shown}");
        assert!(shown.contains("m0\\u{d}\\u{1b}[2K ("), "{shown}");
        assert!(shown.ends_with(", 24 more"), "{shown}");
        assert!(shown.len() < 16 * 200, "{} bytes", shown.len());
    }

    /// A version the server does not speak fails the start, saying so: a
    /// probe's agents answering version 0 and 2 ran as if they spoke 1.
    #[test]
    fn an_agent_speaking_another_protocol_version_is_refused() {
        for version in [0, 2] {
            let r = json!({"protocolVersion": version, "agentCapabilities": {}, "authMethods": []});
            let e = AgentInfo::from_initialize(&r).expect_err("refused");
            assert!(e.contains(&format!("version {version}")), "{e}");
        }
    }

    #[test]
    fn permission_answers_have_the_acp_shape() {
        assert_eq!(
            permission_selected("allow-once"),
            json!({"outcome":{"outcome":"selected","optionId":"allow-once"}})
        );
        assert_eq!(
            permission_cancelled(),
            json!({"outcome":{"outcome":"cancelled"}})
        );
    }

    #[test]
    fn updates_are_digested() {
        let chunk = json!({"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}});
        assert_eq!(
            parse_update(&chunk).expect("chunk").1,
            Update::AgentText("hi".into())
        );
        let tool = json!({"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"completed",
            "content":[{"type":"diff","path":"/w/a.txt","oldText":"a\n","newText":"b\n"}]}});
        match parse_update(&tool).expect("tool").1 {
            Update::ToolCallUpdate(v) => {
                assert_eq!(v.status.as_deref(), Some("completed"));
                let edits = v.edits.expect("content was sent");
                assert_eq!(edits[0].path, PathBuf::from("/w/a.txt"));
                assert_eq!(edits[0].old_text.as_deref(), Some("a\n"));
                assert_eq!(edits[0].new_text, "b\n");
                assert!(v.locations.is_none() && v.title.is_none());
            }
            other => panic!("unexpected {other:?}"),
        }
        // Entries off the schema are kept, as given, not dropped unseen.
        let loose = json!({"sessionId":"s","update":{"sessionUpdate":"plan","entries":[
            {"content":"a","status":"blocked","priority":"low"},
            {"content":"b","status":"pending"},
            {"content":"c","status":"pending","priority":"urgent"}]}});
        assert_eq!(
            parse_update(&loose).expect("plan").1,
            Update::Plan(vec![
                ("a".into(), "blocked".into()),
                ("b".into(), "pending".into()),
                ("c".into(), "pending".into())
            ])
        );
        // A status that is not one short word is `other`: viewers style by
        // it (`x toast` was drawn as the console's decision toast).
        let hostile = json!({"sessionId":"s","update":{"sessionUpdate":"plan","entries":[
            {"content":"a","status":"x toast"},
            {"content":"b","status":"done<b>"},
            {"content":"c","status":"in_progress"}]}});
        assert_eq!(
            parse_update(&hostile).expect("plan").1,
            Update::Plan(vec![
                ("a".into(), "other".into()),
                ("b".into(), "other".into()),
                ("c".into(), "in_progress".into())
            ])
        );
        let plan = json!({"sessionId":"s","update":{"sessionUpdate":"plan","entries":[{"content":"x","status":"pending","priority":"low"}]}});
        assert_eq!(
            parse_update(&plan).expect("plan").1,
            Update::Plan(vec![("x".into(), "pending".into())])
        );
        let usage = json!({"sessionId":"s","update":{"sessionUpdate":"usage_update","used":53000,"size":200000,
            "cost":{"amount":0.045,"currency":"USD"}}});
        let Update::Usage(u) = parse_update(&usage).expect("usage").1 else {
            panic!("not usage")
        };
        assert_eq!(u.describe(), "53k/200k tokens · 0.04 USD");
        let thought = json!({"sessionId":"s","update":{"sessionUpdate":"agent_thought_chunk","content":{"type":"text","text":"hmm"}}});
        assert_eq!(
            parse_update(&thought).expect("thought").1,
            Update::Thought("hmm".into())
        );
        let other = json!({"sessionId":"s","update":{"sessionUpdate":"available_commands_update","availableCommands":[]}});
        assert_eq!(
            parse_update(&other).expect("other").1,
            Update::Other("available_commands_update".into())
        );
    }

    #[test]
    fn permission_request_is_digested() {
        let p = json!({"sessionId":"s","toolCall":{"toolCallId":"t1","title":"Write","kind":"edit"},
            "options":[{"optionId":"a","name":"Allow","kind":"allow_once"},{"optionId":"r","name":"Reject","kind":"reject_once"}]});
        let ask = parse_permission(&p).expect("ask");
        assert_eq!(ask.options.len(), 2);
        assert_eq!(ask.tool.title.as_deref(), Some("Write"));
        assert!(parse_permission(&json!({"sessionId":"s"})).is_err());
    }

    #[test]
    fn line_slicing_follows_the_spec() {
        assert_eq!(slice_lines("a\nb\nc\n", Some(2), Some(1)), "b\n");
        assert_eq!(slice_lines("a\nb\n", None, None), "a\nb\n");
    }
}
