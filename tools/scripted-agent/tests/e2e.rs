//! End-to-end tests: spawn the real `scripted-agent` binary and talk to it
//! over pipes, exactly as the agent-intercom server would.
//!
//! This file exists to pin down the wire behaviour other crates' tests rely
//! on. Every read has a timeout so a broken agent fails a test instead of
//! hanging it.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(5);

/// A running agent plus a reader thread that splits its stdout into frames.
struct Harness {
    child: Child,
    stdin: Option<ChildStdin>,
    frames: Receiver<Vec<u8>>,
    stderr: Arc<Mutex<String>>,
    /// Finishes once the agent's stderr is closed (i.e. it exited).
    stderr_reader: Option<thread::JoinHandle<()>>,
    lsp: bool,
    /// Scenario file to delete when the harness is dropped.
    scenario: Option<PathBuf>,
}

impl Harness {
    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_scripted-agent"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lsp = args.windows(2).any(|w| w == ["--framing", "lsp"]);
        let stdout = child.stdout.take().unwrap();
        let (tx, frames) = mpsc::channel();
        thread::spawn(move || {
            let mut out = BufReader::new(stdout);
            while let Some(frame) = if lsp {
                read_lsp(&mut out)
            } else {
                read_line(&mut out)
            } {
                if tx.send(frame).is_err() {
                    return;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let mut err = child.stderr.take().unwrap();
        let stderr_reader = thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = err.read(&mut buf) {
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            frames,
            stderr,
            stderr_reader: Some(stderr_reader),
            lsp,
            scenario: None,
        }
    }

    /// Writes `scenario` to a temp file and starts the agent on it.
    fn with_scenario(name: &str, scenario: &Value, extra: &[&str]) -> Self {
        let path = temp_path(&format!("{name}.json"));
        std::fs::write(&path, scenario.to_string()).unwrap();
        let arg = path.to_str().unwrap().to_owned();
        let mut args = vec!["--scenario", arg.as_str()];
        args.extend_from_slice(extra);
        let mut harness = Self::spawn(&args);
        harness.scenario = Some(path);
        harness
    }

    fn send(&mut self, msg: &Value) {
        let body = msg.to_string();
        let stdin = self.stdin.as_mut().unwrap();
        if self.lsp {
            write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        } else {
            writeln!(stdin, "{body}").unwrap();
        }
        stdin.flush().unwrap();
    }

    fn recv_raw(&self) -> Vec<u8> {
        self.frames
            .recv_timeout(TIMEOUT)
            .unwrap_or_else(|e| panic!("no output from agent ({e}); stderr:\n{}", self.stderr()))
    }

    fn recv(&self) -> Value {
        serde_json::from_slice(&self.recv_raw()).unwrap()
    }

    /// Receives until a message satisfies `pred`; returns it.
    fn recv_until(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            let msg = self.recv();
            if pred(&msg) {
                return msg;
            }
        }
        panic!("never saw {what}; stderr:\n{}", self.stderr());
    }

    /// Receives until an agent_message_chunk with exactly `text` arrives.
    fn expect_chunk(&self, text: &str) {
        self.recv_until(&format!("chunk {text:?}"), |m| chunk_text(m) == Some(text));
    }

    fn request(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.recv_until(&format!("response to {method}"), |m| {
            m.get("method").is_none() && m["id"] == id
        })
    }

    /// initialize + session/new in `cwd`; returns the session id.
    fn open_session(&mut self, cwd: &str) -> String {
        self.request(
            json!(0),
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        );
        let resp = self.request(
            json!(1),
            "session/new",
            json!({"cwd": cwd, "mcpServers": []}),
        );
        resp["result"]["sessionId"].as_str().unwrap().to_owned()
    }

    fn prompt(&mut self, id: i64, session: &str, text: &str) {
        let prompt = json!([{"type": "text", "text": text}]);
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt",
            "params": {"sessionId": session, "prompt": prompt}}),
        );
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    fn wait_exit(&mut self) -> i32 {
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                if let Some(reader) = self.stderr_reader.take() {
                    reader.join().unwrap();
                }
                return status.code().unwrap_or(-1);
            }
            thread::sleep(Duration::from_millis(10));
        }
        panic!("agent did not exit; stderr:\n{}", self.stderr());
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits (bounded) until stderr contains `needle`: the pipe is drained
    /// by a thread, so a line written just now may not be read yet.
    fn stderr_contains(&self, needle: &str) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if self.stderr().contains(needle) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        false
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(path) = &self.scenario {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn read_line(out: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = Vec::new();
    match out.read_until(b'\n', &mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => {
            assert_eq!(line.pop(), Some(b'\n'), "unterminated line");
            Some(line)
        }
    }
}

fn read_lsp(out: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut len = None;
    loop {
        let header = read_line(out)?;
        let header = String::from_utf8(header).unwrap();
        let header = header.strip_suffix('\r').expect("header lines end in CRLF");
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap();
        assert_eq!(name, "Content-Length");
        len = Some(value.trim().parse::<usize>().unwrap());
    }
    let mut body = vec![0; len.expect("Content-Length header")];
    out.read_exact(&mut body).ok()?;
    Some(body)
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("scripted-agent-test-{}-{name}", std::process::id()))
}

fn chunk_text(msg: &Value) -> Option<&str> {
    let update = &msg["params"]["update"];
    (msg["method"] == "session/update" && update["sessionUpdate"] == "agent_message_chunk")
        .then(|| update["content"]["text"].as_str())
        .flatten()
}

fn is_method(method: &'static str) -> impl Fn(&Value) -> bool {
    move |m| m["method"] == method
}

fn selected(option: &str) -> Value {
    json!({"outcome": {"outcome": "selected", "optionId": option}})
}

#[test]
fn initialize_has_expected_shape() {
    let mut agent = Harness::spawn(&[]);
    let caps = json!({"fs": {"readTextFile": true, "writeTextFile": true}});
    let resp = agent.request(
        json!("init-1"),
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": caps}),
    );
    assert_eq!(resp["jsonrpc"], "2.0");
    let r = &resp["result"];
    assert_eq!(r["protocolVersion"], 1);
    assert_eq!(r["agentCapabilities"]["loadSession"], true);
    assert_eq!(r["agentCapabilities"]["promptCapabilities"], json!({}));
    assert_eq!(
        r["agentCapabilities"]["mcpCapabilities"],
        json!({"http": false, "sse": false})
    );
    assert_eq!(r["authMethods"], json!([]));
    assert_eq!(
        r["agentInfo"],
        json!({"name": "scripted-agent", "version": "0.1.0"})
    );
    let unknown = agent.request(json!(7), "bogus/method", json!({}));
    assert_eq!(unknown["error"]["code"], -32601);
    assert_eq!(
        unknown["error"]["message"],
        "method not found: bogus/method"
    );
    agent.close_stdin();
    assert_eq!(agent.wait_exit(), 0);
    assert!(agent.stderr_contains("writeTextFile"));
}

#[test]
fn demo_permission_round_trip_writes_file() {
    let mut agent = Harness::spawn(&[]);
    let session = agent.open_session("/work/project");
    agent.prompt(2, &session, "make hello");
    agent.expect_chunk("prompt: make hello");
    let plan = agent.recv_until("plan", |m| m["params"]["update"]["sessionUpdate"] == "plan");
    assert_eq!(
        plan["params"]["update"]["entries"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let req = agent.recv_until(
        "permission request",
        is_method("session/request_permission"),
    );
    assert_eq!(req["id"], 0);
    assert_eq!(req["params"]["sessionId"], session.as_str());
    assert_eq!(req["params"]["toolCall"]["toolCallId"], "t1");
    let ids: Vec<&str> = req["params"]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["optionId"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["allow-once", "allow-always", "reject-once", "reject-always"]
    );
    agent.send(&json!({"jsonrpc": "2.0", "id": 0, "result": selected("allow-once")}));
    agent.expect_chunk("permission t1: selected allow-once");
    let write = agent.recv_until("fs write", is_method("fs/write_text_file"));
    assert_eq!(write["id"], 1);
    assert_eq!(write["params"]["path"], "/work/project/hello.txt");
    assert_eq!(write["params"]["content"], "hello from scripted-agent\n");
    agent.send(&json!({"jsonrpc": "2.0", "id": 1, "result": null}));
    agent.expect_chunk("write /work/project/hello.txt: ok");
    let done = agent.recv_until("tool update", |m| {
        m["params"]["update"]["sessionUpdate"] == "tool_call_update"
    });
    assert_eq!(done["params"]["update"]["status"], "completed");
    agent.expect_chunk("Done.");
    let resp = agent.recv_until("prompt response", |m| m["id"] == 2);
    assert_eq!(resp["result"]["stopReason"], "end_turn");
    assert!(agent.stderr_contains("permission t1: selected allow-once"));
}

#[test]
fn demo_reject_marks_tool_failed() {
    let mut agent = Harness::spawn(&[]);
    let session = agent.open_session("/tmp");
    agent.prompt(2, &session, "go");
    agent.recv_until(
        "permission request",
        is_method("session/request_permission"),
    );
    agent.send(&json!({"jsonrpc": "2.0", "id": 0, "result": selected("reject-once")}));
    let upd = agent.recv_until("tool update", |m| {
        m["params"]["update"]["sessionUpdate"] == "tool_call_update"
    });
    assert_eq!(upd["params"]["update"]["status"], "failed");
    let resp = agent.recv_until("prompt response", |m| m["id"] == 2);
    assert_eq!(resp["result"]["stopReason"], "end_turn");
}

#[test]
fn cancel_during_permission_wait_yields_cancelled() {
    let mut agent = Harness::spawn(&[]);
    let session = agent.open_session("/tmp");
    agent.prompt(2, &session, "go");
    agent.recv_until(
        "permission request",
        is_method("session/request_permission"),
    );
    // A second prompt while a turn runs is a server bug and gets an error.
    agent.prompt(3, &session, "again");
    let busy = agent.recv_until("busy error", |m| m["id"] == 3);
    assert_eq!(busy["error"]["code"], -32000);
    agent.send(
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}),
    );
    agent
        .send(&json!({"jsonrpc": "2.0", "id": 0, "result": {"outcome": {"outcome": "cancelled"}}}));
    agent.expect_chunk("permission t1: cancelled");
    let resp = agent.recv_until("prompt response", |m| m["id"] == 2);
    assert_eq!(resp["result"]["stopReason"], "cancelled");
}

#[test]
fn cancel_interrupts_sleep_and_wait_cancel() {
    let scenario = json!({"turns": [[{"sleep_ms": 60000}], [{"wait_cancel": true}], [{"stop_reason": "max_tokens"}]]});
    let mut agent = Harness::with_scenario("sleep", &scenario, &[]);
    let session = agent.open_session("/tmp");
    for id in [2, 3] {
        agent.prompt(id, &session, "x");
        agent.expect_chunk("prompt: x");
        agent.send(&json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}));
        let resp = agent.recv_until("prompt response", |m| m["id"] == id);
        assert_eq!(resp["result"]["stopReason"], "cancelled");
    }
    agent.prompt(4, &session, "x");
    let resp = agent.recv_until("prompt response", |m| m["id"] == 4);
    assert_eq!(resp["result"]["stopReason"], "max_tokens");
}

#[test]
fn big_line_has_exact_length() {
    let len = 2_097_152;
    let mut agent = Harness::with_scenario("big", &json!({"turns": [[{"big_line": len}]]}), &[]);
    let session = agent.open_session("/tmp");
    agent.prompt(2, &session, "big");
    agent.expect_chunk("prompt: big");
    let line = agent.recv_raw();
    assert_eq!(line.len(), len);
    let msg: Value = serde_json::from_slice(&line).unwrap();
    assert!(chunk_text(&msg).unwrap().bytes().all(|b| b == b'x'));
}

#[test]
fn lsp_framing_round_trip() {
    let scenario =
        json!({"framing": "ndjson", "turns": [[{"chunk": "over lsp"}, {"raw": "not json {"}]]});
    let mut agent = Harness::with_scenario("lsp", &scenario, &["--framing", "lsp"]);
    let session = agent.open_session("/tmp");
    agent.prompt(2, &session, "hi");
    agent.expect_chunk("prompt: hi");
    agent.expect_chunk("over lsp");
    assert_eq!(agent.recv_raw(), b"not json {");
    assert_eq!(agent.recv()["result"]["stopReason"], "end_turn");
}

#[test]
fn intercom_clearance_round_trip() {
    let scenario = json!({"protocol": "intercom", "turns": [[
        {"clearance": {"id": "req-001", "title": "Create", "file_path": "a.rs", "risk_level": "low"}},
        {"forward_prompt": {"id": "prompt-001", "text": "continue?", "type": "continuation"}},
        {"heartbeat": [{"label": "x", "status": "in_progress"}]}
    ]]});
    let mut agent = Harness::with_scenario("intercom", &scenario, &[]);
    agent.send(&json!({"method": "prompt/send", "params": {"text": "do it"}}));
    assert_eq!(
        agent.recv(),
        json!({"method": "status/update", "params": {"message": "prompt: do it"}})
    );
    let req = agent.recv();
    assert!(req.get("jsonrpc").is_none());
    assert_eq!(req["method"], "clearance/request");
    assert_eq!(req["id"], "req-001");
    assert_eq!(req["params"]["risk_level"], "low");
    agent.send(&json!({"method": "clearance/response", "id": "req-001", "params": {"status": "approved", "reason": null}}));
    assert_eq!(
        agent.recv()["params"]["message"],
        "clearance req-001: approved"
    );
    let fwd = agent.recv();
    assert_eq!(
        (fwd["method"].as_str(), fwd["params"]["type"].as_str()),
        (Some("prompt/forward"), Some("continuation"))
    );
    agent.send(&json!({"method": "prompt/response", "id": "prompt-001", "params": {"decision": "stop", "instruction": "enough"}}));
    assert_eq!(
        agent.recv()["params"]["message"],
        "prompt prompt-001: stop enough"
    );
    assert_eq!(agent.recv()["params"]["progress"][0]["label"], "x");
    agent.send(&json!({"method": "session/interrupt", "params": {"reason": "bye"}}));
    assert_eq!(agent.recv()["params"]["message"], "interrupted");
    assert_eq!(agent.wait_exit(), 0);
}

#[test]
fn exit_step_sets_exit_code() {
    let mut agent = Harness::with_scenario(
        "exit",
        &json!({"turns": [[{"chunk": "bye"}, {"exit": 3}]]}),
        &[],
    );
    let session = agent.open_session("/tmp");
    agent.prompt(2, &session, "crash");
    agent.expect_chunk("bye");
    assert_eq!(agent.wait_exit(), 3);
}

#[test]
fn exit_once_crashes_only_the_first_time() {
    let marker = temp_path("exit-once.marker");
    let _ = std::fs::remove_file(&marker);
    let scenario = json!({"on_start": [{"exit_once": {"code": 1, "marker": marker}}]});
    let mut first = Harness::with_scenario("exit-once", &scenario, &[]);
    assert_eq!(first.wait_exit(), 1);
    let mut second = Harness::with_scenario("exit-once", &scenario, &[]);
    second.open_session("/tmp");
    second.close_stdin();
    assert_eq!(second.wait_exit(), 0);
    let _ = std::fs::remove_file(&marker);
}

#[test]
fn eof_exits_zero_but_hang_does_not() {
    let mut agent = Harness::spawn(&[]);
    agent.close_stdin();
    assert_eq!(agent.wait_exit(), 0);

    let mut hung = Harness::with_scenario("hang", &json!({"on_start": [{"hang": true}]}), &[]);
    hung.send(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}));
    hung.close_stdin();
    thread::sleep(Duration::from_millis(200));
    assert!(
        hung.child.try_wait().unwrap().is_none(),
        "hung agent exited"
    );
    assert!(hung.frames.try_recv().is_err(), "hung agent answered");
}

#[test]
fn require_auth_gates_sessions() {
    let scenario =
        json!({"require_auth": true, "auth_methods": [{"id": "api-key", "name": "API key"}]});
    let mut agent = Harness::with_scenario("auth", &scenario, &[]);
    let denied = agent.request(
        json!(1),
        "session/new",
        json!({"cwd": "/tmp", "mcpServers": []}),
    );
    assert_eq!(
        denied["error"],
        json!({"code": -32000, "message": "Authentication required"})
    );
    let bad = agent.request(json!(2), "authenticate", json!({"methodId": "nope"}));
    assert_eq!(bad["error"]["code"], -32602);
    let ok = agent.request(json!(3), "authenticate", json!({"methodId": "api-key"}));
    assert_eq!(ok["result"], json!({}));
    let new = agent.request(
        json!(4),
        "session/new",
        json!({"cwd": "/tmp", "mcpServers": []}),
    );
    assert!(
        new["result"]["sessionId"]
            .as_str()
            .unwrap()
            .starts_with("sess-")
    );
}

#[test]
fn session_load_replays_history() {
    let scenario = json!({"on_load": [{"user_chunk": "old question"}, {"chunk": "old answer"}],
                          "turns": [[{"echo_mcp": true}]]});
    let mut agent = Harness::with_scenario("load", &scenario, &[]);
    let servers = json!([{"name": "intercom", "type": "http", "url": "http://x", "headers": []}]);
    let params = json!({"sessionId": "old-1", "cwd": "/tmp", "mcpServers": servers});
    agent.send(&json!({"jsonrpc": "2.0", "id": 5, "method": "session/load", "params": params}));
    let user = agent.recv();
    assert_eq!(user["params"]["sessionId"], "old-1");
    assert_eq!(
        user["params"]["update"]["sessionUpdate"],
        "user_message_chunk"
    );
    assert_eq!(chunk_text(&agent.recv()), Some("old answer"));
    assert_eq!(
        agent.recv(),
        json!({"jsonrpc": "2.0", "id": 5, "result": null})
    );
    agent.prompt(6, "old-1", "mcp?");
    agent.expect_chunk("prompt: mcp?");
    agent.expect_chunk(&format!("mcp {servers}"));
}

#[test]
fn invalid_scenario_exits_2_naming_file() {
    let mut agent = Harness::with_scenario("invalid", &json!({"turns": [[{"nonsense": 1}]]}), &[]);
    assert_eq!(agent.wait_exit(), 2);
    assert!(
        agent.stderr_contains("invalid.json") && agent.stderr_contains("nonsense"),
        "{}",
        agent.stderr()
    );
}
