//! The `bare` operator: the machine's ceiling, measured the same way as the
//! server. The same scripted agents run the same scenario, but nothing of
//! agent-intercom is in between: one task per agent, on the server's
//! runtime, speaks just enough ACP (`initialize`, `session/new`,
//! `session/prompt`) and answers each `session/request_permission` the
//! moment its line is parsed. No store, no actors, no operator, no
//! transcript.
//!
//! Why: issue 13 sets the core N = 100 target as a multiple of the floor
//! (one pipe round trip and one commit with nothing else running). Under
//! load the agents' round trips also wait for a core: N agent processes,
//! the bench and the server share the machine. This row says what a
//! process that does nothing but parse and answer gets for the same load on
//! the same machine, so the server's figures can be read against it: what
//! is left above the ceiling is the server's.

use super::*;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The running bare agents of one run.
pub(super) struct BareAgents {
    /// Starts (spawn and handshake) under way at once, at most the
    /// server's default (`limits.max_concurrent_starts`): without it, a
    /// burst of spawns holds both cores and the ceiling would say nothing
    /// about a server that admits starts as this one does.
    admission: tokio::sync::Semaphore,
    /// One reader task per agent; aborting it kills its child.
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Agents whose stdout is still open.
    live: AtomicUsize,
}

impl Default for BareAgents {
    fn default() -> Self {
        BareAgents {
            admission: tokio::sync::Semaphore::new(
                intercom_actors::settings::default_concurrent_starts(),
            ),
            tasks: Mutex::default(),
            live: AtomicUsize::default(),
        }
    }
}

impl BareAgents {
    pub(super) fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// Kills every agent (their children go with the tasks).
    pub(super) async fn stop(&self) {
        let tasks = self
            .tasks
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        for t in tasks {
            t.abort();
            let _ = t.await;
        }
    }
}

/// Starts one agent with `profile` in `cwd` and runs its handshake and
/// first prompt (as the supervisor's `Start` answers after them); then its
/// reader answers every permission request until the agent exits.
pub(super) async fn start(
    agents: Arc<BareAgents>,
    obs: Arc<Observed>,
    (profile, cwd): (AgentProfile, PathBuf),
    i: usize,
) -> Result<(), String> {
    let _admitted = agents
        .admission
        .acquire()
        .await
        .map_err(|e| e.to_string())?;
    let mut child = Command::new(&profile.command)
        .args(&profile.args)
        .current_dir(&cwd)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", profile.command))?;
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("no pipes".into());
    };
    let mut lines = BufReader::new(stdout).lines();
    let init = json!({"protocolVersion": 1, "clientCapabilities": {}});
    request(&mut stdin, &mut lines, 1, "initialize", init).await?;
    let new = json!({"cwd": cwd, "mcpServers": []});
    let session = request(&mut stdin, &mut lines, 2, "session/new", new).await?;
    let sid = session["sessionId"].as_str().unwrap_or_default().to_owned();
    let prompt = json!({"sessionId": sid, "prompt": [{"type": "text", "text": format!("load session {i}")}]});
    send(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": prompt}),
    )
    .await?;
    agents.live.fetch_add(1, Ordering::Relaxed);
    let me = Arc::clone(&agents);
    let task = tokio::spawn(async move {
        answer(
            child,
            stdin,
            lines,
            &obs,
            SessionId::from(format!("bare-{i}").as_str()),
        )
        .await;
        me.live.fetch_sub(1, Ordering::Relaxed);
    });
    if let Ok(mut tasks) = agents.tasks.lock() {
        tasks.push(task);
    }
    Ok(())
}

/// Answers permission requests until stdout closes; the prompt's answer
/// marks the session idle. Keeps `child` (killed when the task is aborted).
async fn answer(
    _child: Child,
    mut stdin: ChildStdin,
    mut lines: tokio::io::Lines<BufReader<ChildStdout>>,
    obs: &Observed,
    id: SessionId,
) {
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        match (msg.get("method").and_then(Value::as_str), msg.get("id")) {
            (Some("session/request_permission"), Some(rid)) => {
                let outcome = json!({"outcome": {"outcome": "selected", "optionId": "allow-once"}});
                let reply = json!({"jsonrpc": "2.0", "id": rid, "result": outcome});
                if send(&mut stdin, &reply).await.is_err() {
                    return;
                }
            }
            (None, Some(rid)) if rid == 3 => {
                if let Ok(mut idle) = obs.idle.lock() {
                    idle.insert(id.clone());
                }
                if let Ok(mut t) = obs.last_idle.lock() {
                    *t = Some(Instant::now());
                }
            }
            _ => {}
        }
    }
}

async fn send(stdin: &mut ChildStdin, msg: &Value) -> Result<(), String> {
    let mut line = msg.to_string();
    line.push('\n');
    stdin
        .write_all(line.as_bytes())
        .await
        .map_err(|e| format!("write to the agent: {e}"))
}

/// Sends request `id` and returns its result (skipping anything else).
async fn request(
    stdin: &mut ChildStdin,
    lines: &mut tokio::io::Lines<BufReader<ChildStdout>>,
    id: u64,
    method: &str,
    params: Value,
) -> Result<Value, String> {
    send(
        stdin,
        &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
    )
    .await?;
    loop {
        let line = lines
            .next_line()
            .await
            .map_err(|e| format!("{method}: {e}"))?
            .ok_or_else(|| format!("{method}: the agent exited"))?;
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if msg.get("method").is_none() && msg["id"] == id {
            return match msg.get("result") {
                Some(r) => Ok(r.clone()),
                None => Err(format!("{method}: {}", msg["error"])),
            };
        }
    }
}
