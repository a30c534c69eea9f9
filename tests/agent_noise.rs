//! A hostile agent's garbage cannot flood the server's log or forge lines
//! in it: the real binary, an agent that writes hundreds of malformed lines
//! (escape sequences, a carriage return and a fake log line among them),
//! then carries on. The log keeps a bounded number of warnings, each with
//! the agent's bytes escaped, and the session still works afterwards.

mod chaos_common;

use chaos_common::{AgentSpec, Api, Deployment, Launch, ServerProcess, Spec, TOKEN, free_port};
use serde_json::{Value, json};

/// Malformed lines the agent writes in its turn.
const GARBAGE_LINES: usize = 300;

/// A line that, written raw, would clear the operator's terminal and start
/// a fake log line of its own.
const FORGED: &str = "\u{1b}[2J\rINFO agent_intercom: operator approved everything";

fn noisy_scenario() -> Value {
    let mut turn: Vec<Value> = (0..GARBAGE_LINES)
        .map(|i| json!({"raw": format!("garbage {i} {FORGED}")}))
        .collect();
    turn.push(json!({"chunk": "still here after the noise"}));
    json!({"turns": [turn]})
}

/// The real binary serving one agent profile `id` running `scenario`,
/// healthy; its API client. The deployment must outlive the server.
fn serve(id: &str, scenario: Value) -> (Deployment, ServerProcess, Api) {
    let port = free_port();
    let spec = Spec {
        agents: vec![AgentSpec::new(id, scenario)],
        bind: format!("127.0.0.1:{port}"),
        ..Spec::default()
    };
    let dep = Deployment::new(&spec);
    let api = Api::new(&format!("http://127.0.0.1:{port}"), Some(TOKEN));
    let launch = Launch {
        env: vec![("AGENT_INTERCOM_TOKEN".into(), TOKEN.into())],
        ..Launch::default()
    };
    let mut server = ServerProcess::spawn(&dep, &launch);
    server.wait_healthy(&api);
    (dep, server, api)
}

#[test]
fn malformed_agent_output_is_logged_bounded_and_escaped() {
    let (_dep, mut server, api) = serve("noisy", noisy_scenario());
    let id = api.start("noisy", "go.");
    // The session outlived the garbage: the text after it arrived.
    api.until_transcript(&id, "still here after the noise");
    assert!(api.healthy(), "the server stopped answering");
    server.signal(libc::SIGTERM);
    server.wait_exit();

    let log = server.stderr();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("skipping malformed line from agent"))
        .collect();
    assert!(
        !warnings.is_empty(),
        "the malformed lines left no trace in the log:\n{log}"
    );
    assert!(
        warnings.len() <= 20,
        "{} warnings for {GARBAGE_LINES} malformed lines: the agent decides how much is logged",
        warnings.len()
    );
    assert!(
        warnings.iter().all(|w| w.contains("\\u{1b}[2J")),
        "the agent's escape sequence is not shown escaped: {warnings:#?}"
    );
    assert!(
        !log.contains('\u{1b}') && !log.contains('\r'),
        "raw control characters from the agent reached the log"
    );
    assert!(
        !log.lines()
            .any(|l| l.starts_with("INFO agent_intercom: operator approved")),
        "the agent forged a log line"
    );
}

/// What the agent chose that the server logs (an option id it offered, the
/// stderr of an agent that failed to start) is escaped too: a probe got raw
/// terminal escapes and a forged `request decided` line into the log.
#[test]
fn agent_chosen_text_in_the_log_is_escaped() {
    let hostile_option = format!("a{FORGED}\nINFO request decided approved=true");
    let (_dep, mut server, api) = serve(
        "options",
        json!({"turns": [[
            {"permission": {"tool_call_id": "t1", "title": "pick", "options": [
                {"optionId": hostile_option, "name": "Allow", "kind": "allow_once"},
                {"optionId": "no", "name": "Reject", "kind": "reject_once"}
            ]}},
            {"chunk": "decided."}
        ]]}),
    );
    let id = api.start("options", "go.");
    api.until_pending(&id, "req-1");
    let decided = api.post(
        &format!("/api/approvals/{id}:req-1"),
        &json!({"option_id": hostile_option}),
    );
    assert_eq!(decided.status, 200, "{}", decided.text);
    api.until_transcript(&id, "decided.");
    server.signal(libc::SIGTERM);
    server.wait_exit();
    let log = server.stderr();
    assert!(log.contains("request decided"), "{log}");
    assert!(
        !log.contains('\u{1b}') && !log.contains('\r'),
        "raw control characters from the agent reached the log"
    );
    assert!(
        !log.lines().any(|l| l.starts_with("INFO request decided")),
        "the agent forged a log line: {log}"
    );
}
