//! Agent Client Protocol (JSON-RPC 2.0) behaviour.
//!
//! This file exists to hold everything ACP-specific: the request loop
//! (`initialize`, `authenticate`, `session/new|load|prompt`, `session/cancel`),
//! the shape of `session/update` notifications, and the steps that make
//! requests to the client (`session/request_permission`, `fs/*`).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::agent::{Agent, Kind, Phase, SessionInfo, Wake, exit_on_eof, note};
use crate::scenario::{Diff, Permission, Step, ToolCall, ToolUpdate};
use crate::steps::{self, Flow, TextKind};
use crate::wire::Inbound;

const AUTH_REQUIRED: i64 = -32000;
const BUSY: i64 = -32000;
const INVALID_PARAMS: i64 = -32602;
const METHOD_NOT_FOUND: i64 = -32601;
const INTERNAL_ERROR: i64 = -32603;

/// Serves requests until stdin closes.
pub fn run(agent: &mut Agent) -> ! {
    agent.phase = Phase::Idle;
    loop {
        match agent.next_inbound(None) {
            Some(Inbound::Message(msg)) => handle_idle(agent, msg),
            Some(Inbound::Malformed(e)) => note(&format!("malformed input ignored: {e}")),
            Some(Inbound::Eof) | None => exit_on_eof(),
        }
    }
}

/// Sorts a JSON-RPC message by the presence of `method` and `id`.
pub fn classify(msg: &Value) -> Kind {
    let id = msg.get("id").cloned();
    match (msg.get("method").and_then(Value::as_str), id) {
        (Some(method), Some(id)) => Kind::Request(id, method.to_owned()),
        (Some(method), None) => Kind::Notification(method.to_owned()),
        (None, Some(id)) => Kind::Response(id),
        (None, None) => Kind::Invalid,
    }
}

fn handle_idle(agent: &mut Agent, msg: Value) {
    match classify(&msg) {
        Kind::Request(id, method) => handle_request(agent, id, &method, params(&msg)),
        Kind::Notification(method) => note(&format!("notification {method} ignored while idle")),
        Kind::Response(id) => note(&format!("ignoring response with unexpected id {id}: {msg}")),
        Kind::Invalid => note(&format!("ignoring invalid message: {msg}")),
    }
}

/// Handles a non-response message while a turn or load is running.
pub fn handle_busy(agent: &mut Agent, msg: Value) -> Option<Wake> {
    match classify(&msg) {
        // A prompt sent while `after_load` replays (no turn runs): taken
        // once the replay is over, as Gemini CLI does (refused, it read as
        // a busy agent to a server that prompted right after the replay).
        Kind::Request(_, method) if method == "session/prompt" && agent.phase == Phase::Idle => {
            agent.pending.push_back(msg);
            None
        }
        Kind::Request(id, method) if method == "session/prompt" || method == "session/load" => {
            respond_error(agent, id, BUSY, "turn already running");
            None
        }
        Kind::Request(id, method) => {
            handle_request(agent, id, &method, params(&msg));
            None
        }
        Kind::Notification(method) if method == "session/cancel" => cancel(agent, params(&msg)),
        Kind::Notification(method) => {
            note(&format!("notification {method} ignored"));
            None
        }
        Kind::Response(_) | Kind::Invalid => None,
    }
}

fn cancel(agent: &mut Agent, params: &Value) -> Option<Wake> {
    let target = params
        .get("sessionId")
        .and_then(Value::as_str)
        .unwrap_or("");
    if agent.phase != Phase::Turn || target != agent.session_id {
        note(&format!(
            "session/cancel for {target:?} ignored (no turn running for it)"
        ));
        return None;
    }
    note("turn cancelled");
    agent.cancelled = true;
    Some(Wake::Cancelled)
}

fn params(msg: &Value) -> &Value {
    msg.get("params").unwrap_or(&Value::Null)
}

fn handle_request(agent: &mut Agent, id: Value, method: &str, params: &Value) {
    match method {
        "initialize" => initialize(agent, id, params),
        "authenticate" => authenticate(agent, id, params),
        "session/new" => new_session(agent, id, params),
        "session/load" => load_session(agent, id, params),
        "session/prompt" => prompt(agent, id, params),
        "session/set_mode" | "session/set_model" | "session/set_config_option" => {
            set_option(agent, id, method, params)
        }
        _ => respond_error(
            agent,
            id,
            METHOD_NOT_FOUND,
            &format!("method not found: {method}"),
        ),
    }
}

fn initialize(agent: &mut Agent, id: Value, params: &Value) {
    let caps = params.get("clientCapabilities").unwrap_or(&Value::Null);
    note(&format!("initialize: clientCapabilities {caps}"));
    let delay = agent.scenario.handshake_delay_ms;
    if delay > 0 {
        std::thread::sleep(std::time::Duration::from_millis(delay));
    }
    let s = &agent.scenario;
    let result = json!({
        "protocolVersion": 1,
        "agentCapabilities": {
            "loadSession": s.load_session,
            "promptCapabilities": {},
            "mcpCapabilities": {"http": s.mcp_http, "sse": false},
        },
        "authMethods": s.auth_methods,
        "agentInfo": {"name": s.agent_name, "version": "0.1.0"},
    });
    respond(agent, id, result);
}

fn authenticate(agent: &mut Agent, id: Value, params: &Value) {
    let method_id = params.get("methodId").and_then(Value::as_str).unwrap_or("");
    let listed = agent
        .scenario
        .auth_methods
        .iter()
        .any(|m| m.get("id").and_then(Value::as_str) == Some(method_id));
    if listed {
        agent.authenticated = true;
        respond(agent, id, json!({}));
    } else {
        let message = format!("unknown auth method: {method_id}");
        respond_error(agent, id, INVALID_PARAMS, &message);
    }
}

/// True (after answering with an error) when auth is required but missing.
fn auth_missing(agent: &mut Agent, id: &Value) -> bool {
    let missing = agent.scenario.require_auth && !agent.authenticated;
    if missing {
        respond_error(agent, id.clone(), AUTH_REQUIRED, "Authentication required");
    }
    missing
}

fn session_info(params: &Value) -> SessionInfo {
    let cwd = params.get("cwd").and_then(Value::as_str).unwrap_or(".");
    let mcp_servers = params.get("mcpServers").cloned().unwrap_or(Value::Null);
    note(&format!("session cwd {cwd}, mcpServers {mcp_servers}"));
    SessionInfo {
        cwd: PathBuf::from(cwd),
        mcp_servers,
    }
}

fn new_session(agent: &mut Agent, id: Value, params: &Value) {
    if auth_missing(agent, &id) {
        return;
    }
    agent.session_counter += 1;
    let session_id = format!("sess-{}-{}", std::process::id(), agent.session_counter);
    agent
        .sessions
        .insert(session_id.clone(), session_info(params));
    let mut result = json!({"sessionId": session_id});
    if let (Some(extra), Some(target)) = (
        agent
            .scenario
            .session_options
            .as_ref()
            .and_then(Value::as_object),
        result.as_object_mut(),
    ) {
        for (k, v) in extra {
            target.insert(k.clone(), v.clone());
        }
    }
    respond(agent, id, result);
}

/// `session/set_mode`, `session/set_model`, `session/set_config_option`:
/// accepted when the scenario offers options, and reported as agent text.
fn set_option(agent: &mut Agent, id: Value, method: &str, params: &Value) {
    if agent.scenario.session_options.is_none() {
        return respond_error(
            agent,
            id,
            METHOD_NOT_FOUND,
            &format!("method not found: {method}"),
        );
    }
    respond(agent, id, json!({}));
    let mut shown = params.clone();
    if let Some(o) = shown.as_object_mut() {
        o.remove("sessionId");
    }
    if method == "session/set_mode" {
        let mode = params.get("modeId").cloned().unwrap_or(Value::Null);
        let body = json!({"sessionUpdate": "current_mode_update", "currentModeId": mode});
        send_update(agent, body);
    }
    steps::emit(agent, TextKind::Agent, &format!("{method} {shown}"));
}

fn load_session(agent: &mut Agent, id: Value, params: &Value) {
    if !agent.scenario.load_session {
        return respond_error(
            agent,
            id,
            METHOD_NOT_FOUND,
            "method not found: session/load",
        );
    }
    if auth_missing(agent, &id) {
        return;
    }
    if let Some(error) = agent.scenario.load_error.clone() {
        return respond_error(agent, id, INTERNAL_ERROR, &error);
    }
    let Some(session_id) = params.get("sessionId").and_then(Value::as_str) else {
        return respond_error(agent, id, INVALID_PARAMS, "session/load: missing sessionId");
    };
    agent
        .sessions
        .insert(session_id.to_owned(), session_info(params));
    agent.session_id = session_id.to_owned();
    agent.phase = Phase::Load;
    let steps = agent.scenario.on_load.clone();
    steps::run(agent, &steps);
    agent.phase = Phase::Idle;
    respond(agent, id, Value::Null);
    // Only when there are steps: running none still polls stdin, and a
    // prompt sent right after the answer was then refused as busy.
    let late = agent.scenario.after_load.clone();
    if !late.is_empty() {
        steps::run(agent, &late);
        while let Some(msg) = agent.pending.pop_front() {
            handle_idle(agent, msg);
        }
    }
}

fn prompt(agent: &mut Agent, id: Value, params: &Value) {
    let session_id = params
        .get("sessionId")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !agent.sessions.contains_key(session_id) {
        let message = format!("unknown session: {session_id}");
        return respond_error(agent, id, INVALID_PARAMS, &message);
    }
    agent.session_id = session_id.to_owned();
    agent.phase = Phase::Turn;
    agent.cancelled = false;
    steps::emit(
        agent,
        TextKind::Agent,
        &format!("prompt: {}", prompt_text(params)),
    );
    let steps = agent.scenario.turn(agent.turn_counter).to_vec();
    agent.turn_counter += 1;
    let stop = steps::run(agent, &steps);
    let reason = stop.unwrap_or_else(|| "end_turn".to_owned());
    agent.phase = Phase::Idle;
    agent.cancelled = false;
    respond(agent, id, json!({"stopReason": reason}));
    if let Some(code) = agent.exit_after_turn.take() {
        note(&format!("exit_after_turn: exiting with {code}"));
        std::process::exit(code);
    }
}

/// The text blocks of a prompt, joined by newlines.
fn prompt_text(params: &Value) -> String {
    let blocks = params.get("prompt").and_then(Value::as_array);
    let texts: Vec<&str> = blocks
        .into_iter()
        .flatten()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    texts.join("\n")
}

fn respond(agent: &mut Agent, id: Value, result: Value) {
    agent.send(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
}

fn respond_error(agent: &mut Agent, id: Value, code: i64, message: &str) {
    let error = json!({"code": code, "message": message});
    agent.send(&json!({"jsonrpc": "2.0", "id": id, "error": error}));
}

/// Sends a request and waits for its response (`None`: gave up after cancel).
fn request(agent: &mut Agent, method: &str, params: Value) -> Option<Value> {
    let id = Value::from(agent.next_id());
    agent.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    agent.await_response(&id)
}

/// A `session/update` notification.
fn update(session_id: &str, update: Value) -> Value {
    json!({
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": session_id, "update": update},
    })
}

/// A text chunk `session/update`.
pub fn text_update(session_id: &str, kind: TextKind, text: &str) -> Value {
    update(
        session_id,
        json!({
            "sessionUpdate": kind.session_update(),
            "content": {"type": "text", "text": text},
        }),
    )
}

/// Runs an ACP-only step; `None` if the step is not an ACP step.
pub fn run_step(agent: &mut Agent, step: &Step) -> Option<Flow> {
    match step {
        Step::ToolCall(call) => {
            let body = tool_call(cwd_of(agent).as_deref(), call);
            send_update(agent, body)
        }
        Step::ToolUpdate(upd) => {
            let body = tool_update(cwd_of(agent).as_deref(), upd);
            send_update(agent, body)
        }
        Step::Plan(entries) => {
            send_update(agent, json!({"sessionUpdate": "plan", "entries": entries}))
        }
        Step::Permission(perm) => return Some(permission(agent, perm)),
        Step::WriteFile(w) => write_file(agent, &w.path, &w.content),
        Step::ReadFile(r) => read_file(agent, r),
        Step::EchoMcp(true) => echo_mcp(agent),
        Step::EchoMcp(false) => {}
        _ => return None,
    }
    Some(Flow::Continue)
}

fn send_update(agent: &mut Agent, body: Value) {
    let msg = update(&agent.session_id, body);
    agent.send(&msg);
}

fn cwd_of(agent: &Agent) -> Option<PathBuf> {
    agent.session().map(|s| s.cwd.clone())
}

/// Joins a relative path onto `cwd` (agents send absolute paths).
fn joined(cwd: Option<&Path>, path: &str) -> String {
    match cwd {
        Some(cwd) if Path::new(path).is_relative() => cwd.join(path).display().to_string(),
        _ => path.to_owned(),
    }
}

fn tool_call(cwd: Option<&Path>, call: &ToolCall) -> Value {
    let mut v = json!({"sessionUpdate": "tool_call", "toolCallId": call.id});
    insert_opt(&mut v, "title", call.title.as_deref());
    insert_opt(&mut v, "kind", call.kind.as_deref());
    insert_opt(&mut v, "status", call.status.as_deref());
    if !call.diffs.is_empty() {
        v["content"] = call.diffs.iter().map(|d| diff_content(cwd, d)).collect();
        v["locations"] = call
            .diffs
            .iter()
            .map(|d| json!({"path": joined(cwd, &d.path)}))
            .collect();
    }
    if let Some(raw) = &call.raw_input {
        v["rawInput"] = raw.clone();
    }
    v
}

fn tool_update(cwd: Option<&Path>, upd: &ToolUpdate) -> Value {
    let mut v = json!({"sessionUpdate": "tool_call_update", "toolCallId": upd.id});
    insert_opt(&mut v, "title", upd.title.as_deref());
    insert_opt(&mut v, "status", upd.status.as_deref());
    if let Some(diff) = &upd.diff {
        v["content"] = json!([diff_content(cwd, diff)]);
    }
    v
}

fn diff_content(cwd: Option<&Path>, diff: &Diff) -> Value {
    json!({"type": "diff", "path": joined(cwd, &diff.path), "oldText": diff.old_text, "newText": diff.new_text})
}

fn insert_opt(target: &mut Value, key: &str, value: Option<&str>) {
    if let Some(value) = value {
        target[key] = Value::from(value);
    }
}

fn standard_options() -> Vec<Value> {
    [
        ("allow-once", "Allow once", "allow_once"),
        ("allow-always", "Allow always", "allow_always"),
        ("reject-once", "Reject", "reject_once"),
        ("reject-always", "Reject always", "reject_always"),
    ]
    .into_iter()
    .map(|(id, name, kind)| json!({"optionId": id, "name": name, "kind": kind}))
    .collect()
}

fn permission(agent: &mut Agent, perm: &Permission) -> Flow {
    let options = perm.options.clone().unwrap_or_else(standard_options);
    let mut tool_call = json!({"toolCallId": perm.tool_call_id});
    insert_opt(&mut tool_call, "title", perm.title.as_deref());
    insert_opt(&mut tool_call, "kind", perm.kind.as_deref());
    if !perm.locations.is_empty() {
        let locations: Vec<Value> = perm.locations.iter().map(|p| json!({"path": p})).collect();
        tool_call["locations"] = Value::Array(locations);
    }
    let params = json!({"sessionId": agent.session_id, "toolCall": tool_call, "options": options});
    let started = std::time::Instant::now();
    let response = request(agent, "session/request_permission", params);
    record_rtt(agent, started.elapsed());
    let (line, allowed) = permission_outcome(&perm.tool_call_id, response.as_ref(), &options);
    agent.last_permission_allowed = allowed;
    eprintln!("{line}");
    steps::emit(agent, TextKind::Agent, &line);
    if agent.cancelled {
        Flow::End("cancelled".to_owned())
    } else {
        Flow::Continue
    }
}

/// Appends a round trip to the scenario's `rtt_log`, one line per request.
fn record_rtt(agent: &Agent, rtt: std::time::Duration) {
    let Some(path) = &agent.scenario.rtt_log else {
        return;
    };
    let line = format!("{}\n", rtt.as_micros());
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    if let Err(e) = written {
        crate::agent::note(&format!("cannot append to rtt_log {}: {e}", path.display()));
    }
}

/// Describes a permission response; also says whether an allow option won.
fn permission_outcome(tool: &str, response: Option<&Value>, options: &[Value]) -> (String, bool) {
    let Some(response) = response else {
        return (format!("permission {tool}: no response"), false);
    };
    if let Some(message) = error_message(response) {
        return (format!("permission {tool}: error {message}"), false);
    }
    let outcome = &response["result"]["outcome"];
    match outcome["outcome"].as_str() {
        Some("selected") => {
            let option = outcome["optionId"].as_str().unwrap_or("");
            (
                format!("permission {tool}: selected {option}"),
                is_allow(option, options),
            )
        }
        Some("cancelled") => (format!("permission {tool}: cancelled"), false),
        _ => (format!("permission {tool}: unexpected {response}"), false),
    }
}

fn is_allow(option_id: &str, options: &[Value]) -> bool {
    let kind = options
        .iter()
        .find(|o| o["optionId"].as_str() == Some(option_id))
        .and_then(|o| o["kind"].as_str());
    kind.unwrap_or(option_id).starts_with("allow")
}

fn error_message(response: &Value) -> Option<String> {
    let error = response.get("error")?;
    let message = error.get("message").and_then(Value::as_str);
    Some(message.map_or_else(|| error.to_string(), str::to_owned))
}

/// Joins a relative path onto the current session's cwd.
fn resolve(agent: &Agent, path: &str) -> String {
    let path = Path::new(path);
    match agent.session() {
        Some(info) if path.is_relative() => info.cwd.join(path).display().to_string(),
        _ => path.display().to_string(),
    }
}

fn write_file(agent: &mut Agent, path: &str, content: &str) {
    let path = resolve(agent, path);
    let params = json!({"sessionId": agent.session_id, "path": path, "content": content});
    let outcome = match request(agent, "fs/write_text_file", params) {
        Some(resp) => {
            error_message(&resp).map_or_else(|| "ok".to_owned(), |m| format!("error {m}"))
        }
        None => "no response".to_owned(),
    };
    steps::emit(agent, TextKind::Agent, &format!("write {path}: {outcome}"));
}

fn read_file(agent: &mut Agent, r: &crate::scenario::ReadFile) {
    let path = resolve(agent, &r.path);
    let mut params = json!({"sessionId": agent.session_id, "path": path});
    if let Some(line) = r.line {
        params["line"] = json!(line);
    }
    if let Some(limit) = r.limit {
        params["limit"] = json!(limit);
    }
    let outcome = match request(agent, "fs/read_text_file", params) {
        Some(resp) => match error_message(&resp) {
            Some(m) => format!("error {m}"),
            None => resp["result"]["content"].as_str().unwrap_or("").to_owned(),
        },
        None => "no response".to_owned(),
    };
    steps::emit(agent, TextKind::Agent, &format!("read {path}: {outcome}"));
}

fn echo_mcp(agent: &mut Agent) {
    let servers = agent
        .session()
        .map_or(Value::Null, |s| s.mcp_servers.clone());
    steps::emit(agent, TextKind::Agent, &format!("mcp {servers}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_distinguishes_shapes() {
        assert!(matches!(
            classify(&json!({"id": 1, "method": "m"})),
            Kind::Request(..)
        ));
        assert!(matches!(
            classify(&json!({"method": "m"})),
            Kind::Notification(_)
        ));
        assert!(matches!(
            classify(&json!({"id": "x", "result": null})),
            Kind::Response(_)
        ));
        assert!(matches!(classify(&json!({"foo": 1})), Kind::Invalid));
    }

    #[test]
    fn permission_outcomes_are_described() {
        let opts = standard_options();
        let sel = json!({"result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}}});
        assert_eq!(
            permission_outcome("t1", Some(&sel), &opts),
            ("permission t1: selected allow-once".to_owned(), true)
        );
        let rej =
            json!({"result": {"outcome": {"outcome": "selected", "optionId": "reject-once"}}});
        assert!(!permission_outcome("t1", Some(&rej), &opts).1);
        let can = json!({"result": {"outcome": {"outcome": "cancelled"}}});
        assert_eq!(
            permission_outcome("t1", Some(&can), &opts).0,
            "permission t1: cancelled"
        );
        let err = json!({"error": {"code": -1, "message": "boom"}});
        assert_eq!(
            permission_outcome("t1", Some(&err), &opts).0,
            "permission t1: error boom"
        );
    }

    #[test]
    fn tool_update_with_diff() {
        let upd = ToolUpdate {
            id: "t1".to_owned(),
            status: Some("completed".to_owned()),
            title: None,
            diff: Some(Diff {
                path: "/p".to_owned(),
                old_text: None,
                new_text: "b".to_owned(),
            }),
        };
        let v = tool_update(Some(Path::new("/w")), &upd);
        assert_eq!(v["content"][0]["newText"], "b");
        assert_eq!(v["content"][0]["path"], "/p");
        let rel = ToolCall {
            id: "t2".to_owned(),
            title: None,
            kind: Some("edit".to_owned()),
            status: None,
            diffs: vec![Diff {
                path: "src/x.rs".to_owned(),
                old_text: Some("a".to_owned()),
                new_text: "b".to_owned(),
            }],
            raw_input: Some(json!({"file_path": "src/x.rs"})),
        };
        let call = tool_call(Some(Path::new("/w")), &rel);
        assert_eq!(call["content"][0]["path"], "/w/src/x.rs");
        assert_eq!(call["locations"][0]["path"], "/w/src/x.rs");
        assert_eq!(call["rawInput"]["file_path"], "src/x.rs");
        assert!(v["content"][0]["oldText"].is_null());
        assert!(v.get("title").is_none());
    }

    #[test]
    fn prompt_text_joins_text_blocks() {
        let p = json!({"prompt": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]});
        assert_eq!(prompt_text(&p), "a\nb");
    }
}
