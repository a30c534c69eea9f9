//! The older intercom NDJSON dialect.
//!
//! This file exists to hold the intercom-specific behaviour: no handshake,
//! `prompt/send` / `nudge` start turns, `session/interrupt` ends the process,
//! text is reported via `status/update`, and the `clearance`, `status`,
//! `heartbeat` and `forward_prompt` steps. Messages carry no `jsonrpc` field.

use serde_json::{Map, Value, json};

use crate::agent::{Agent, Kind, Phase, Wake, exit_on_eof, note};
use crate::scenario::{Clearance, ForwardPrompt, Step};
use crate::steps::{self, Flow};
use crate::wire::Inbound;

/// Serves prompts until stdin closes or the session is interrupted.
pub fn run(agent: &mut Agent) -> ! {
    agent.phase = Phase::Idle;
    loop {
        if let Some(msg) = agent.pending.pop_front() {
            handle_idle(agent, &msg);
            continue;
        }
        match agent.next_inbound(None) {
            Some(Inbound::Message(msg)) => handle_idle(agent, &msg),
            Some(Inbound::Malformed(e)) => note(&format!("malformed input ignored: {e}")),
            Some(Inbound::Eof) | None => exit_on_eof(),
        }
    }
}

/// Responses are `clearance/response` / `prompt/response` carrying an id.
pub fn classify(msg: &Value) -> Kind {
    let Some(method) = msg.get("method").and_then(Value::as_str) else {
        return Kind::Invalid;
    };
    match msg.get("id") {
        Some(id) if method.ends_with("/response") => Kind::Response(id.clone()),
        Some(id) => Kind::Request(id.clone(), method.to_owned()),
        None => Kind::Notification(method.to_owned()),
    }
}

fn method(msg: &Value) -> &str {
    msg.get("method").and_then(Value::as_str).unwrap_or("")
}

fn param_str<'a>(msg: &'a Value, key: &str) -> &'a str {
    msg["params"][key].as_str().unwrap_or("")
}

fn handle_idle(agent: &mut Agent, msg: &Value) {
    match method(msg) {
        "prompt/send" => turn(agent, &format!("prompt: {}", param_str(msg, "text"))),
        "nudge" => turn(agent, &format!("nudged: {}", param_str(msg, "message"))),
        "session/interrupt" => interrupt(agent),
        other => note(&format!("ignoring {other:?} while idle: {msg}")),
    }
}

/// Handles a message that arrives while a turn is running.
pub fn handle_busy(agent: &mut Agent, msg: Value) -> Option<Wake> {
    match method(&msg) {
        "prompt/send" | "nudge" => agent.pending.push_back(msg),
        "session/interrupt" => interrupt(agent),
        other => note(&format!("ignoring {other:?} during a turn: {msg}")),
    }
    None
}

fn interrupt(agent: &mut Agent) -> ! {
    status(agent, "interrupted");
    note("interrupted, exiting");
    std::process::exit(0)
}

fn turn(agent: &mut Agent, first_status: &str) {
    agent.phase = Phase::Turn;
    status(agent, first_status);
    let steps = agent.scenario.turn(agent.turn_counter).to_vec();
    agent.turn_counter += 1;
    steps::run(agent, &steps);
    agent.phase = Phase::Idle;
}

/// A `status/update` message.
pub fn status_message(text: &str) -> Value {
    json!({"method": "status/update", "params": {"message": text}})
}

fn status(agent: &mut Agent, text: &str) {
    agent.send(&status_message(text));
}

/// Runs an intercom-only step; `None` if the step is not one.
pub fn run_step(agent: &mut Agent, step: &Step) -> Option<Flow> {
    match step {
        Step::Status(text) => status(agent, text),
        Step::Heartbeat(progress) => {
            agent.send(&json!({"method": "heartbeat", "params": {"progress": progress}}));
        }
        Step::Clearance(c) => clearance(agent, c),
        Step::ForwardPrompt(f) => forward_prompt(agent, f),
        _ => return None,
    }
    Some(Flow::Continue)
}

/// Sends a request with our scenario-given id and waits for its response.
fn request(agent: &mut Agent, method: &str, id: &str, params: &Map<String, Value>) -> Value {
    let id = Value::from(id);
    agent.send(&json!({"method": method, "id": id, "params": params}));
    match agent.wait(Some(&id), None) {
        Wake::Response(msg) => msg,
        // Cancels do not exist in this dialect and there is no deadline.
        Wake::Cancelled | Wake::TimedOut => Value::Null,
    }
}

fn clearance(agent: &mut Agent, c: &Clearance) {
    let resp = request(agent, "clearance/request", &c.id, &c.params);
    let state = param_str(&resp, "status");
    let line = if state == "approved" {
        format!("clearance {}: approved", c.id)
    } else {
        format!("clearance {}: {state} {}", c.id, param_str(&resp, "reason"))
    };
    status(agent, line.trim_end());
}

fn forward_prompt(agent: &mut Agent, f: &ForwardPrompt) {
    let resp = request(agent, "prompt/forward", &f.id, &f.params);
    let decision = param_str(&resp, "decision");
    let instruction = param_str(&resp, "instruction");
    let line = format!("prompt {}: {decision} {instruction}", f.id);
    status(agent, line.trim_end());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_treats_slash_response_as_response() {
        let resp = json!({"method": "clearance/response", "id": "r1", "params": {}});
        assert!(matches!(classify(&resp), Kind::Response(id) if id == "r1"));
        assert!(matches!(
            classify(&json!({"method": "nudge", "params": {}})),
            Kind::Notification(_)
        ));
        assert!(matches!(classify(&json!({"id": "x"})), Kind::Invalid));
    }
}
