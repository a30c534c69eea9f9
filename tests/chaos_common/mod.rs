//! Shared support for the no-loss, chaos and security suites: a deployment
//! laid out in a temp directory (config, workspace, database, one scenario
//! file per agent), the server either in-process or as the real binary, an
//! HTTP client whose calls may fail (the server is killed on purpose), a
//! seeded RNG, and `/proc` inspection (process groups, zombies, orphans).
//!
//! Everything waits with deadlines; nothing sleeps and hopes.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use agent_intercom::app::App;
use agent_intercom::config::Config;
use agent_intercom::storage::SqliteStore;
use serde_json::{Value, json};

// One harness per test crate may include this alongside another.
#[allow(clippy::duplicate_mod)]
#[path = "../shared/in_process.rs"]
mod in_process;

/// Deadline for anything a test waits on.
pub const WAIT: Duration = Duration::from_secs(30);

/// The token in-process servers (and binaries started with
/// `AGENT_INTERCOM_TOKEN`) use.
pub const TOKEN: &str = "chaos-token-0123456789abcdef";

// One harness per test crate may include this alongside another.
#[allow(clippy::duplicate_mod)]
#[path = "../shared/scripted_agent.rs"]
mod scripted_agent;
pub use scripted_agent::agent_bin;

/// Polls `f` every 20 ms until it returns `Some`, or panics after `limit`.
pub fn until_within<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `f` every 20 ms until it returns `Some`; `None` after `limit`.
pub fn poll_within<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`until_within`] with [`WAIT`].
pub fn until<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    until_within(what, WAIT, f)
}

// ---- seeded randomness ------------------------------------------------------

/// xorshift64*: tiny, deterministic for a seed, good enough to pick kill
/// points and options.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// From `CHAOS_SEED` when set, else from the clock; prints the seed so a
    /// failing run can be replayed with `CHAOS_SEED=<seed>`.
    pub fn from_env(test: &str) -> Rng {
        let seed = std::env::var("CHAOS_SEED")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or_else(|| {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0x9e37_79b9_7f4a_7c15);
                nanos ^ u64::from(std::process::id()).rotate_left(32)
            });
        eprintln!("{test}: CHAOS_SEED={seed}");
        Rng::new(seed)
    }

    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// `CHAOS_ROUNDS` when set, else `default`.
pub fn rounds(default: usize) -> usize {
    std::env::var("CHAOS_ROUNDS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
}

// ---- deployment ---------------------------------------------------------------

/// One `[[agent]]`.
#[derive(Clone)]
pub struct AgentSpec {
    pub id: String,
    pub scenario: Value,
    /// Run the agent through `sh -c` that first starts a straggler (a second
    /// scripted agent that hangs forever) in the background, in the same
    /// process group, like a real CLI's helper processes.
    pub with_straggler: bool,
    /// `env` passthrough names.
    pub env: Vec<String>,
}

impl AgentSpec {
    pub fn new(id: &str, scenario: Value) -> AgentSpec {
        AgentSpec {
            id: id.to_owned(),
            scenario,
            with_straggler: false,
            env: Vec::new(),
        }
    }
}

/// Knobs for the generated config.
#[derive(Clone)]
pub struct Spec {
    pub agents: Vec<AgentSpec>,
    pub bind: String,
    pub max_sessions: usize,
    pub max_restarts: u32,
    /// `[slack] api_url`; `Some` also sets the workspace channel to `C1`.
    pub slack_api_url: Option<String>,
    pub slack_operators: Vec<String>,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            agents: vec![AgentSpec::new(
                "scripted",
                json!({"turns": [[{"chunk": "ok"}]]}),
            )],
            bind: "127.0.0.1:0".into(),
            max_sessions: 10,
            max_restarts: 3,
            slack_api_url: None,
            slack_operators: Vec::new(),
        }
    }
}

/// A temp directory laid out like a deployment: `root/` is workspace_root,
/// workspace `demo` is `root/ws`, the database is `root/data/agent-intercom.db`.
pub struct Deployment {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub ws: PathBuf,
    pub config: PathBuf,
    pub database: PathBuf,
}

impl Deployment {
    pub fn new(spec: &Spec) -> Deployment {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("ws")).expect("mkdir ws");
        let root = root.canonicalize().expect("canon");
        let d = Deployment {
            config: dir.path().join("config.toml"),
            database: root.join("data").join("agent-intercom.db"),
            ws: root.join("ws"),
            root,
            dir,
        };
        d.write_config(spec);
        d
    }

    /// A string that occurs in the command line of every agent process this
    /// deployment starts, and of no other process (the server's own command
    /// line names the config file, not a scenario).
    pub fn marker(&self) -> String {
        self.dir.path().join("scenario-").display().to_string()
    }

    pub fn write_config(&self, spec: &Spec) {
        let bin = agent_bin().display().to_string();
        let hang = self.dir.path().join("scenario-straggler.json");
        std::fs::write(&hang, json!({"on_start": [{"hang": true}]}).to_string())
            .expect("write straggler scenario");
        let mut text = format!(
            "workspace_root = {:?}\ndefault_agent = {:?}\n\n[server]\nbind = {:?}\n\n[database]\npath = {:?}\n\n",
            self.root.display().to_string(),
            spec.agents[0].id,
            spec.bind,
            self.database.display().to_string()
        );
        if let Some(url) = &spec.slack_api_url {
            text.push_str(&format!(
                "[slack]\napi_url = {url:?}\noperators = {:?}\n\n",
                spec.slack_operators
            ));
        }
        for agent in &spec.agents {
            let scenario = self.dir.path().join(format!("scenario-{}.json", agent.id));
            std::fs::write(&scenario, agent.scenario.to_string()).expect("write scenario");
            let (command, args) = if agent.with_straggler {
                (
                    "/bin/sh".to_owned(),
                    vec![
                        "-c".to_owned(),
                        format!(
                            "'{bin}' --scenario '{}' </dev/null >/dev/null 2>&1 & exec '{bin}' --scenario '{}'",
                            hang.display(),
                            scenario.display()
                        ),
                    ],
                )
            } else {
                (
                    bin.clone(),
                    vec!["--scenario".to_owned(), scenario.display().to_string()],
                )
            };
            text.push_str(&format!(
                "[[agent]]\nid = {:?}\ncommand = {command:?}\nargs = {args:?}\nenv = {:?}\n\n",
                agent.id, agent.env
            ));
        }
        let channel = if spec.slack_api_url.is_some() {
            "C1"
        } else {
            ""
        };
        text.push_str(&format!(
            "[[workspace]]\nid = \"demo\"\npath = {:?}\nchannel_id = {channel:?}\n\n",
            self.ws.display().to_string()
        ));
        text.push_str(&format!(
            "[limits]\nmax_sessions = {}\nstartup_timeout_secs = 20\nshutdown_grace_secs = 1\n\n\
             [stall]\ninactivity_secs = 0\n\n\
             [supervision]\nmax_restarts = {}\nrestart_window_secs = 600\nbackoff_initial_secs = 0\nbackoff_max_secs = 0\n",
            spec.max_sessions, spec.max_restarts
        ));
        std::fs::write(&self.config, text).expect("write config");
    }

    /// Opens the database directly (only while no server holds it).
    pub fn open_store(&self, rt: &tokio::runtime::Runtime) -> SqliteStore {
        rt.block_on(SqliteStore::open(&self.database))
            .expect("open the database after the server stopped")
    }
}

impl Drop for Deployment {
    /// Safety net: no agent process of this deployment outlives the test,
    /// even when it failed (orphans are what the chaos suite looks for).
    fn drop(&mut self) {
        for p in processes_matching(&self.marker()) {
            // SAFETY: kill(2) on processes started from this test's scenarios.
            unsafe { libc::kill(p.pid, libc::SIGKILL) };
        }
    }
}

// One harness per test crate may include this alongside another.
#[allow(clippy::duplicate_mod)]
#[path = "../shared/ports.rs"]
mod ports;
#[allow(unused_imports)] // not every test crate starts a server of its own
pub use ports::free_port;

// ---- HTTP ---------------------------------------------------------------------

/// One HTTP answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub text: String,
}

/// A small API client. `try_*` return `None` when the server cannot be
/// reached (or dies mid-call); the plain calls panic then.
#[derive(Clone)]
pub struct Api {
    agent: ureq::Agent,
    pub base: String,
    pub auth: Option<String>,
}

impl Api {
    pub fn new(base: &str, token: Option<&str>) -> Api {
        Api::with_header(base, token.map(|t| format!("Bearer {t}")))
    }

    /// A client that sends `Authorization: <header>` verbatim.
    pub fn with_header(base: &str, header: Option<String>) -> Api {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build();
        Api {
            agent: config.into(),
            base: base.to_owned(),
            auth: header,
        }
    }

    pub fn try_get(&self, path: &str) -> Option<Reply> {
        let mut req = self.agent.get(format!("{}{path}", self.base));
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        reply(req.call())
    }

    pub fn try_post(&self, path: &str, body: &Value) -> Option<Reply> {
        let mut req = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json");
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        reply(req.send(body.to_string()))
    }

    pub fn get(&self, path: &str) -> Reply {
        self.try_get(path)
            .unwrap_or_else(|| panic!("GET {path}: server unreachable"))
    }

    pub fn post(&self, path: &str, body: &Value) -> Reply {
        self.try_post(path, body)
            .unwrap_or_else(|| panic!("POST {path}: server unreachable"))
    }

    /// Starts a session in workspace `demo` with `agent`; panics unless 201.
    pub fn start(&self, agent: &str, prompt: &str) -> String {
        let r = self.post(
            "/api/sessions",
            &json!({"workspace": "demo", "prompt": prompt, "agent": agent}),
        );
        assert_eq!(r.status, 201, "{}", r.text);
        r.body["id"].as_str().expect("id").to_owned()
    }

    /// The transcript's contents joined by newlines.
    pub fn transcript(&self, id: &str) -> String {
        let r = self.get(&format!("/api/sessions/{id}/messages"));
        assert_eq!(r.status, 200, "{}", r.text);
        r.body
            .as_array()
            .expect("array")
            .iter()
            .map(|m| {
                format!(
                    "[{}:{}] {}",
                    m["role"].as_str().unwrap_or(""),
                    m["kind"].as_str().unwrap_or(""),
                    m["content"].as_str().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn until_transcript(&self, id: &str, needle: &str) -> String {
        until(&format!("transcript of {id} to contain {needle:?}"), || {
            let t = self.transcript(id);
            t.contains(needle).then_some(t)
        })
    }

    /// Pending approvals (empty when unreachable).
    pub fn pending(&self) -> Vec<Value> {
        self.try_get("/api/approvals?status=pending")
            .and_then(|r| r.body.as_array().cloned())
            .unwrap_or_default()
    }

    pub fn until_pending(&self, session: &str, request_id: &str) -> Value {
        until(&format!("{session}:{request_id} to be pending"), || {
            self.pending()
                .into_iter()
                .find(|a| a["session_id"] == session && a["request_id"] == request_id)
        })
    }

    pub fn session(&self, id: &str) -> Value {
        let r = self.get(&format!("/api/sessions/{id}"));
        assert_eq!(r.status, 200, "{}", r.text);
        r.body
    }

    pub fn until_status(&self, id: &str, status: &str) -> Value {
        until(&format!("{id} to be {status}"), || {
            let s = self.session(id);
            (s["status"] == status).then_some(s)
        })
    }

    /// `/healthz` answers 200.
    pub fn healthy(&self) -> bool {
        self.try_get("/healthz").is_some_and(|r| r.status == 200)
    }
}

fn reply(result: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Option<Reply> {
    let mut response = result.ok()?;
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().ok()?;
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Some(Reply { status, body, text })
}

/// Agent text lines of the form `prefix<rest>` in a transcript, in order.
/// One transcript entry may hold several agent chunks glued together, so
/// `rest` ends at `terminator` or at the next `prefix`, whichever is first.
pub fn markers(transcript: &str, prefix: &str, terminator: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = transcript;
    while let Some(at) = rest.find(prefix) {
        let after = &rest[at + prefix.len()..];
        let end = [after.find(terminator), after.find(prefix)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(after.len());
        out.push(after[..end].to_owned());
        rest = &after[end..];
    }
    out
}

// ---- the server in-process ------------------------------------------------------

/// The real app (store, registry, supervisor, HTTP API) in its own thread
/// and runtime on 127.0.0.1:0 (`tests/shared/in_process.rs`); stopped
/// gracefully on drop, before the deployment's directory goes (fields drop
/// in order).
pub struct InProcess {
    _running: in_process::Running,
    pub api: Api,
    pub app: App,
    pub rt: tokio::runtime::Handle,
    pub deployment: Deployment,
}

impl InProcess {
    pub fn start(spec: &Spec) -> InProcess {
        let deployment = Deployment::new(spec);
        let config = Config::load(&deployment.config).expect("config loads");
        let (running, started) = in_process::Running::start(config, TOKEN);
        InProcess {
            _running: running,
            api: Api::new(&format!("http://{}", started.addr), Some(TOKEN)),
            app: started.app,
            rt: started.rt,
            deployment,
        }
    }

    /// Runs a future on the server's runtime (e.g. a store query).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }
}

// ---- the server binary ------------------------------------------------------------

/// How to start the binary.
#[derive(Clone, Default)]
pub struct Launch {
    /// Extra environment (the server's own is cleared of tokens first).
    pub env: Vec<(String, String)>,
    /// `RUST_LOG` (default `info`).
    pub rust_log: Option<String>,
    /// Ignore SIGXFSZ in the child (so a file size limit makes writes fail
    /// with EFBIG instead of killing the process).
    pub ignore_sigxfsz: bool,
    /// Set this umask in the child (e.g. 0, to prove modes are explicit).
    pub umask: Option<libc::mode_t>,
}

/// `agent-intercom serve` as a child process; stdout and stderr are captured
/// through pipes (never files: the disk-full test limits file sizes).
pub struct ServerProcess {
    pub child: Child,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
}

fn drain(mut pipe: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => into
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend_from_slice(&buf[..n]),
            }
        }
    })
}

impl ServerProcess {
    pub fn spawn(deployment: &Deployment, launch: &Launch) -> ServerProcess {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agent-intercom"));
        cmd.arg("serve")
            .arg("--config")
            .arg(&deployment.config)
            .env_remove("AGENT_INTERCOM_TOKEN")
            .env_remove("SLACK_BOT_TOKEN")
            .env_remove("SLACK_APP_TOKEN")
            .env_remove("SLACK_MEMBER_IDS")
            .env(
                "RUST_LOG",
                launch.rust_log.clone().unwrap_or_else(|| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &launch.env {
            cmd.env(k, v);
        }
        if launch.ignore_sigxfsz || launch.umask.is_some() {
            use std::os::unix::process::CommandExt;
            let (ignore, umask) = (launch.ignore_sigxfsz, launch.umask);
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    if ignore {
                        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                    }
                    if let Some(mask) = umask {
                        libc::umask(mask);
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("spawn agent-intercom serve");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            drain(child.stdout.take().expect("stdout"), stdout.clone()),
            drain(child.stderr.take().expect("stderr"), stderr.clone()),
        ];
        ServerProcess {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid")
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap_or_else(|e| e.into_inner())).into()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(|e| e.into_inner())).into()
    }

    /// Waits until `/healthz` answers 200; panics with the log if the
    /// process exits first or never gets there.
    pub fn wait_healthy(&mut self, api: &Api) {
        let deadline = Instant::now() + WAIT;
        loop {
            if api.healthy() {
                return;
            }
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!(
                    "server exited ({status}) before it was healthy:\n{}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "server never became healthy:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits for the process to exit by itself (and its pipes to close).
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "server did not exit:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // The pipes close when the last holder exits; agents that outlive the
        // server (a bug the chaos suite looks for) could hold them, so only
        // wait a little for the readers.
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        status
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        self.wait_exit();
    }
}

impl Drop for ServerProcess {
    /// A graceful stop when still running (a failing test's agents are
    /// stopped too), SIGKILL after 5 s.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal(libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- /proc ------------------------------------------------------------------------

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub comm: String,
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    pub cmdline: String,
}

/// Reads one process; `None` when it does not exist (any more).
pub fn proc_info(pid: i32) -> Option<ProcInfo> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_owned();
    let mut fields = stat[close + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            String::from_utf8_lossy(&b)
                .replace('\0', " ")
                .trim()
                .to_owned()
        })
        .unwrap_or_default();
    Some(ProcInfo {
        pid,
        comm,
        state,
        ppid,
        pgrp,
        cmdline,
    })
}

/// Every process on the machine (that can be read).
pub fn all_processes() -> Vec<ProcInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(proc_info)
        .collect()
}

/// A live (not zombie) process.
pub fn alive(pid: i32) -> bool {
    proc_info(pid).is_some_and(|p| p.state != 'Z' && p.state != 'X')
}

/// Processes whose command line contains `needle` (zombies have none).
pub fn processes_matching(needle: &str) -> Vec<ProcInfo> {
    all_processes()
        .into_iter()
        .filter(|p| p.cmdline.contains(needle))
        .collect()
}

/// Members of process group `pgid`.
pub fn group_members(pgid: i32) -> Vec<ProcInfo> {
    all_processes()
        .into_iter()
        .filter(|p| p.pgrp == pgid)
        .collect()
}

/// Zombie children of `ppid`.
pub fn zombies_of(ppid: i32) -> Vec<ProcInfo> {
    all_processes()
        .into_iter()
        .filter(|p| p.ppid == ppid && p.state == 'Z')
        .collect()
}

/// Waits until no process matches `needle`; SIGKILLs the leftovers (so a
/// failing test does not leak them) and panics otherwise.
pub fn expect_no_process_matching(needle: &str, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = processes_matching(needle);
        if left.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            for p in &left {
                // SAFETY: kill(2) on processes this test started (through the server).
                unsafe { libc::kill(p.pid, libc::SIGKILL) };
            }
            panic!("agent processes outlived {why}: {left:#?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until process group `pgid` is empty; kills it and panics otherwise.
pub fn expect_group_gone(pgid: i32, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<ProcInfo> = group_members(pgid)
            .into_iter()
            .filter(|p| p.state != 'Z')
            .collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            // SAFETY: kill(2) on a process group the test started through the server.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            panic!("process group {pgid} outlived {why}: {left:#?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `ppid` has no zombie children.
pub fn expect_no_zombies(ppid: i32, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let z = zombies_of(ppid);
        if z.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "zombies left {why}: {z:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Counts occurrences per key.
pub fn counts<K: Ord + Clone>(items: impl IntoIterator<Item = K>) -> BTreeMap<K, usize> {
    let mut m = BTreeMap::new();
    for k in items {
        *m.entry(k).or_insert(0) += 1;
    }
    m
}
