//! The step interpreter.
//!
//! This file exists to run a list of scenario steps in order. Steps that mean
//! the same thing in both dialects (sleeping, exiting, echoing the
//! environment, raw output...) are implemented here; dialect-specific steps
//! are delegated to `acp.rs` and `intercom.rs`.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::agent::{Agent, Phase, Wake, hang, note};
use crate::scenario::{EscapeGroup, ExitOnce, Protocol, Step};
use crate::{acp, intercom};

/// The kind of text a step emits (maps onto ACP `sessionUpdate` values).
#[derive(Debug, Clone, Copy)]
pub enum TextKind {
    Agent,
    User,
    Thought,
}

impl TextKind {
    pub fn session_update(self) -> &'static str {
        match self {
            Self::Agent => "agent_message_chunk",
            Self::User => "user_message_chunk",
            Self::Thought => "agent_thought_chunk",
        }
    }
}

/// What to do after a step.
pub enum Flow {
    Continue,
    /// End the turn with this stop reason.
    End(String),
}

/// Runs `steps`; returns the stop reason if a step ended the turn early.
pub fn run(agent: &mut Agent, steps: &[Step]) -> Option<String> {
    for step in steps {
        if interrupted(agent) {
            return Some("cancelled".to_owned());
        }
        if let Flow::End(reason) = run_step(agent, step) {
            return Some(reason);
        }
    }
    interrupted(agent).then(|| "cancelled".to_owned())
}

/// Checks for a cancel between steps (not during `on_start`).
fn interrupted(agent: &mut Agent) -> bool {
    if agent.phase == Phase::Start {
        return false;
    }
    agent.poll();
    agent.cancelled
}

fn run_step(agent: &mut Agent, step: &Step) -> Flow {
    match step {
        Step::Chunk(text) => emit(agent, TextKind::Agent, text),
        Step::UserChunk(text) => emit(agent, TextKind::User, text),
        Step::Thought(text) => emit(agent, TextKind::Thought, text),
        Step::Raw(text) => agent
            .out
            .frame(text.replace("$SESSION_ID", &agent.session_id).as_bytes()),
        Step::Unframed(text) => agent.out.unframed(text.as_bytes()),
        Step::BigLine(len) => big_line(agent, *len),
        Step::Flood(n) => {
            for _ in 0..*n {
                emit(agent, TextKind::Agent, "x");
            }
        }
        Step::SleepMs(ms) => return sleep(agent, *ms),
        Step::Hang(true) => hang(agent),
        Step::Exit(code) => std::process::exit(*code),
        Step::ExitOnce(spec) => exit_once(spec),
        Step::CloseStdinOnce(marker) => close_stdin_once(agent, marker),
        Step::HangOnce(marker) => {
            if first_time(marker) {
                hang(agent);
            }
        }
        Step::ExitAfterTurn(code) => agent.exit_after_turn = Some(*code),
        Step::IgnoreSigterm(true) => ignore_sigterm(),
        Step::EscapeGroup(spec) => escape_group(spec),
        Step::Stderr(text) => eprintln!("{text}"),
        Step::EchoEnv(names) => echo_env(agent, names),
        Step::EchoCwd(true) => echo_cwd(agent),
        Step::StopReason(reason) => return Flow::End(reason.clone()),
        Step::WaitCancel(true) => return wait_cancel(agent),
        Step::IfAllowed(branch) => {
            let steps = if agent.last_permission_allowed {
                &branch.then
            } else {
                &branch.otherwise
            };
            return run(agent, steps).map_or(Flow::Continue, Flow::End);
        }
        Step::Hang(false)
        | Step::EchoCwd(false)
        | Step::WaitCancel(false)
        | Step::IgnoreSigterm(false) => {}
        _ => return dialect_step(agent, step),
    }
    Flow::Continue
}

fn dialect_step(agent: &mut Agent, step: &Step) -> Flow {
    let handled = match agent.protocol {
        Protocol::Acp => acp::run_step(agent, step),
        Protocol::Intercom => intercom::run_step(agent, step),
    };
    handled.unwrap_or_else(|| {
        note(&format!(
            "step not supported in {:?} mode, skipped: {step:?}",
            agent.protocol
        ));
        Flow::Continue
    })
}

/// Emits a line of text in the current dialect.
pub fn emit(agent: &mut Agent, kind: TextKind, text: &str) {
    let msg = text_message(agent, kind, text);
    agent.send(&msg);
}

fn text_message(agent: &Agent, kind: TextKind, text: &str) -> serde_json::Value {
    match agent.protocol {
        Protocol::Acp => acp::text_update(&agent.session_id, kind, text),
        Protocol::Intercom => intercom::status_message(text),
    }
}

/// Emits a text message padded with 'x' so its frame body is exactly `len` bytes.
fn big_line(agent: &mut Agent, len: usize) {
    let base = text_message(agent, TextKind::Agent, "").to_string().len();
    if len < base {
        note(&format!(
            "big_line {len} is shorter than an empty message ({base} bytes); sending that"
        ));
    }
    let padding = "x".repeat(len.saturating_sub(base));
    let body = text_message(agent, TextKind::Agent, &padding).to_string();
    agent.out.frame(body.as_bytes());
}

/// Sleeps, but notices a cancel (ending the turn) while doing so.
fn sleep(agent: &mut Agent, ms: u64) -> Flow {
    let duration = Duration::from_millis(ms);
    if agent.phase == Phase::Start {
        std::thread::sleep(duration);
        return Flow::Continue;
    }
    let deadline = Instant::now() + duration;
    match agent.wait(None, Some(deadline)) {
        Wake::Cancelled => Flow::End("cancelled".to_owned()),
        _ => Flow::Continue,
    }
}

fn wait_cancel(agent: &mut Agent) -> Flow {
    while !agent.cancelled {
        agent.wait(None, None);
    }
    Flow::End("cancelled".to_owned())
}

fn exit_once(spec: &ExitOnce) {
    let marker = Path::new(&spec.marker);
    if marker.exists() {
        return;
    }
    if let Err(e) = std::fs::write(marker, b"") {
        note(&format!(
            "exit_once: cannot create marker {}: {e}",
            marker.display()
        ));
        std::process::exit(2);
    }
    note(&format!("exit_once: exiting with {}", spec.code));
    std::process::exit(spec.code);
}

/// True the first time for `marker` (it did not exist and now does).
fn first_time(marker: &str) -> bool {
    let marker = Path::new(marker);
    if marker.exists() {
        return false;
    }
    if let Err(e) = std::fs::write(marker, b"") {
        note(&format!("cannot create marker {}: {e}", marker.display()));
        std::process::exit(2);
    }
    true
}

fn close_stdin_once(agent: &mut Agent, marker: &str) {
    if !first_time(marker) {
        return;
    }
    if !crate::wire::close_stdin() {
        note("close_stdin_once: stdin did not close within a second");
        std::process::exit(2);
    }
    emit(agent, TextKind::Agent, "stdin closed");
}

fn echo_env(agent: &mut Agent, names: &[String]) {
    for name in names {
        let line = match std::env::var_os(name) {
            Some(value) => format!("env {name}={}", value.to_string_lossy()),
            None => format!("env {name} unset"),
        };
        emit(agent, TextKind::Agent, &line);
    }
}

fn echo_cwd(agent: &mut Agent) {
    let line = match std::env::current_dir() {
        Ok(dir) => format!("cwd {}", dir.display()),
        Err(e) => format!("cwd error {e}"),
    };
    emit(agent, TextKind::Agent, &line);
}

fn ignore_sigterm() {
    // SAFETY: installs SIG_IGN for SIGTERM; no handler code runs.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
    note("ignoring SIGTERM");
}

fn escape_group(spec: &EscapeGroup) {
    use std::os::unix::process::CommandExt;
    let secs = spec.secs.to_string();
    let mut command = if spec.detach {
        // The shell starts the sleep and exits: the sleep is orphaned.
        let mut sh = std::process::Command::new("sh");
        sh.args([
            "-c",
            "sleep \"$1\" & echo $! > \"$2\"",
            "sh",
            &secs,
            &spec.pid_file,
        ]);
        sh
    } else {
        let mut sleep = std::process::Command::new("sleep");
        sleep.arg(&secs);
        sleep
    };
    let spawned = command
        .stdin(std::process::Stdio::null())
        .process_group(0)
        .spawn();
    let recorded = match spawned {
        Ok(mut child) if spec.detach => child.wait().map(|_| ()).map_err(|e| e.to_string()),
        Ok(child) => std::fs::write(&spec.pid_file, child.id().to_string())
            .map_err(|e| format!("cannot write {}: {e}", spec.pid_file)),
        Err(e) => Err(format!("cannot spawn: {e}")),
    };
    match recorded {
        Ok(()) => note(&format!(
            "escape_group: a sleep in its own group (detached: {})",
            spec.detach
        )),
        Err(e) => {
            note(&format!("escape_group: {e}"));
            std::process::exit(2);
        }
    }
}
