//! Shared test support: a temp workspace and config, the scripted agent, a
//! tiny HTTP client, and polling with deadlines (nothing sleeps and hopes).

#![allow(dead_code)]

pub mod api_server;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Deadline for anything a test waits on.
pub const WAIT: Duration = Duration::from_secs(30);

/// The token the in-process tests use.
pub const TOKEN: &str = "test-token-0123456789";

// One harness per test crate may include this alongside another.
#[allow(clippy::duplicate_mod)]
#[path = "../shared/scripted_agent.rs"]
mod scripted_agent;
pub use scripted_agent::agent_bin;

// One harness per test crate may include this alongside another.
#[allow(clippy::duplicate_mod)]
#[path = "../shared/ports.rs"]
mod ports;
#[allow(unused_imports)] // not every test crate starts a server of its own
pub use ports::free_port;

/// `agent-intercom serve --config <config>` with no API token or Slack
/// credentials from the test's environment, info logging and no stdin; the
/// caller chooses where stdout and stderr go.
pub fn serve_command(config: &std::path::Path) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_agent-intercom"));
    command
        .arg("serve")
        .arg("--config")
        .arg(config)
        .env_remove("AGENT_INTERCOM_TOKEN")
        .env_remove("SLACK_BOT_TOKEN")
        .env_remove("SLACK_APP_TOKEN")
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null());
    command
}

/// Polls `f` every 50 ms until it returns `Some`, or panics after [`WAIT`].
pub fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A temp directory laid out like a deployment: `root/` is the
/// workspace_root with workspace `demo` at `root/ws`; the database lives in
/// `root/data`; scenarios are written next to the config.
pub struct Layout {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub config: PathBuf,
    pub database: PathBuf,
}

/// Knobs for the generated config.
#[derive(Clone)]
pub struct Setup {
    pub scenario: Value,
    pub max_sessions: usize,
    pub bind: String,
    /// Extra `[[agent]]` ids running the same scenario.
    pub extra_agents: Vec<String>,
    /// `limits.idle_timeout_secs` (the server's default when `None`).
    pub idle_timeout_secs: Option<u64>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            scenario: serde_json::json!({"turns": [[{"chunk": "ok"}]]}),
            max_sessions: 5,
            bind: "127.0.0.1:0".into(),
            extra_agents: Vec::new(),
            idle_timeout_secs: None,
        }
    }
}

impl Layout {
    pub fn new(setup: &Setup) -> Layout {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("ws")).expect("mkdir ws");
        let root = root.canonicalize().expect("canon");
        let layout = Layout {
            config: dir.path().join("config.toml"),
            database: root.join("data").join("agent-intercom.db"),
            root,
            dir,
        };
        layout.write_config(setup);
        layout
    }

    /// (Re)writes the config file for `setup`.
    pub fn write_config(&self, setup: &Setup) {
        let scenario = self.dir.path().join("scenario.json");
        std::fs::write(&scenario, setup.scenario.to_string()).expect("write scenario");
        let bin = agent_bin();
        let agent = |id: &str| {
            format!(
                "[[agent]]\nid = \"{id}\"\ncommand = {:?}\nargs = [\"--scenario\", {:?}]\n\n",
                bin.display().to_string(),
                scenario.display().to_string()
            )
        };
        let mut text = format!(
            "workspace_root = {:?}\ndefault_agent = \"scripted\"\n\n[server]\nbind = {:?}\n\n[database]\npath = {:?}\n\n",
            self.root.display().to_string(),
            setup.bind,
            self.database.display().to_string()
        );
        text.push_str(&agent("scripted"));
        for id in &setup.extra_agents {
            text.push_str(&agent(id));
        }
        text.push_str(
            "[[agent]]\nid = \"missing\"\ncommand = \"/nonexistent/agent-intercom-test-agent\"\n\n",
        );
        text.push_str(&format!(
            "[[workspace]]\nid = \"demo\"\npath = {:?}\n\n",
            self.root.join("ws").display().to_string()
        ));
        let idle = setup
            .idle_timeout_secs
            .map(|s| format!("idle_timeout_secs = {s}\n"))
            .unwrap_or_default();
        text.push_str(&format!(
            "[limits]\n{idle}max_sessions = {}\nstartup_timeout_secs = 20\nshutdown_grace_secs = 1\n\n[stall]\ninactivity_secs = 0\n\n[supervision]\nbackoff_initial_secs = 0\nbackoff_max_secs = 0\n",
            setup.max_sessions
        ));
        std::fs::write(&self.config, text).expect("write config");
    }
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub retry_after: Option<String>,
    /// The `Link` header (paged lists).
    pub link: Option<String>,
    pub body: Value,
    pub text: String,
}

/// A minimal client for the API.
pub struct Http {
    agent: ureq::Agent,
    pub base: String,
    pub token: Option<String>,
}

impl Http {
    pub fn new(base: &str, token: Option<&str>) -> Http {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build();
        Http {
            agent: config.into(),
            base: base.to_owned(),
            token: token.map(str::to_owned),
        }
    }

    fn auth(&self) -> Option<String> {
        self.token.as_ref().map(|t| format!("Bearer {t}"))
    }

    pub fn get(&self, path: &str) -> Reply {
        let mut req = self.agent.get(format!("{}{path}", self.base));
        if let Some(a) = self.auth() {
            req = req.header("Authorization", a);
        }
        reply(req.call())
    }

    /// `get`, or `None` when the server cannot be reached.
    pub fn try_get(&self, path: &str) -> Option<Reply> {
        let mut req = self.agent.get(format!("{}{path}", self.base));
        if let Some(a) = self.auth() {
            req = req.header("Authorization", a);
        }
        req.call().ok().map(|r| reply(Ok(r)))
    }

    pub fn delete(&self, path: &str) -> Reply {
        let mut req = self.agent.delete(format!("{}{path}", self.base));
        if let Some(a) = self.auth() {
            req = req.header("Authorization", a);
        }
        reply(req.call())
    }

    pub fn post(&self, path: &str, body: &Value) -> Reply {
        self.post_raw(path, &body.to_string())
    }

    pub fn post_raw(&self, path: &str, body: &str) -> Reply {
        let mut req = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json");
        if let Some(a) = self.auth() {
            req = req.header("Authorization", a);
        }
        reply(req.send(body))
    }

    /// The transcript as one `role:kind content` line per entry.
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

    /// Waits until the transcript contains `needle`; returns it.
    pub fn until_transcript(&self, id: &str, needle: &str) -> String {
        until(&format!("transcript of {id} to contain {needle:?}"), || {
            let t = self.transcript(id);
            t.contains(needle).then_some(t)
        })
    }

    /// Waits until the session has a pending approval with `request_id`.
    pub fn until_pending(&self, session: &str, request_id: &str) -> Value {
        until(&format!("{session}:{request_id} to be pending"), || {
            let r = self.get("/api/approvals?status=pending");
            r.body.as_array().and_then(|list| {
                list.iter()
                    .find(|a| a["session_id"] == session && a["request_id"] == request_id)
                    .cloned()
            })
        })
    }

    /// Waits until the session's status is `status`.
    pub fn until_status(&self, session: &str, status: &str) -> Value {
        until(&format!("{session} to be {status}"), || {
            let r = self.get(&format!("/api/sessions/{session}"));
            (r.body["status"] == status).then_some(r.body)
        })
    }

    /// Starts a session in workspace `demo`; panics unless 201.
    pub fn start(&self, prompt: &str) -> Value {
        let r = self.post(
            "/api/sessions",
            &serde_json::json!({"workspace": "demo", "prompt": prompt}),
        );
        assert_eq!(r.status, 201, "{}", r.text);
        r.body
    }
}

fn reply(result: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Reply {
    let mut response = result.expect("HTTP call");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let link = response
        .headers()
        .get("link")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = response
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply {
        status,
        retry_after,
        link,
        body,
        text,
    }
}
