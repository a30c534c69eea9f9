//! The real `agent-intercom serve` binary with Slack on: tokens from the
//! environment, `[slack] api_url` pointing at the loopback emulator. Proves
//! the wiring in `serve` (Socket Mode up, `/healthz` says connected) and that
//! a broken config edit keeps the previous config, shows `stale` on
//! `/healthz` and tells the operators in Slack; the fix recovers.

mod common;
mod emulator;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Http, agent_bin, free_port};
use emulator::{Emulator, Fault};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn config(dir: &std::path::Path, port: u16, api_url: &str, extra: &str) -> String {
    format!(
        r#"workspace_root = "{root}"
[server]
bind = "127.0.0.1:{port}"
[database]
path = "{root}/data/db.sqlite"
[slack]
api_url = "{api_url}"
operators = ["U_OPS"]
[[agent]]
id = "scripted"
command = "{agent}"
[[workspace]]
id = "demo"
path = "{root}"
channel_id = "C1"
{extra}"#,
        root = dir.display(),
        agent = agent_bin().display(),
    )
}

async fn health(http: &Http) -> serde_json::Value {
    let http = Http::new(&http.base, http.token.as_deref());
    tokio::task::spawn_blocking(move || {
        http.try_get("/healthz").map(|r| r.body).unwrap_or_default()
    })
    .await
    .expect("join")
}

async fn until_health(
    http: &Http,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let h = health(http).await;
        if pred(&h) {
            return h;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "healthz never {what}: {h}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `serve` on a fresh config, Slack tokens set, the emulator as Slack,
/// connected; its temp directory and process live as long as this.
struct Running {
    emu: Emulator,
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    port: u16,
    path: std::path::PathBuf,
    _server: Server,
    http: Http,
}

async fn serve_with_slack() -> Running {
    let emu = Emulator::start().await;
    let _dir = tempfile::tempdir().expect("tmp");
    let root = _dir.path().canonicalize().expect("canon");
    let port = free_port();
    let path = root.join("config.toml");
    std::fs::write(&path, config(&root, port, &emu.api_url, "")).expect("config");
    let child = Command::new(env!("CARGO_BIN_EXE_agent-intercom"))
        .args(["serve", "--config"])
        .arg(&path)
        .env("SLACK_BOT_TOKEN", "xoxb-serve-test")
        .env("SLACK_APP_TOKEN", "xapp-serve-test")
        .env("AGENT_INTERCOM_TOKEN", "serve-slack-token")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn server");
    let _server = Server(child);
    let http = Http::new(
        &format!("http://127.0.0.1:{port}"),
        Some("serve-slack-token"),
    );
    until_health(&http, "connected", |h| h["slack"] == "connected").await;
    Running {
        emu,
        _dir,
        root,
        port,
        path,
        _server,
        http,
    }
}

/// `POST /api/sessions` in workspace `demo` (off the runtime: the client
/// blocks).
async fn start_in_demo(http: &Http, prompt: &'static str) -> common::Reply {
    let api = Http::new(&http.base, Some("serve-slack-token"));
    tokio::task::spawn_blocking(move || {
        api.post(
            "/api/sessions",
            &serde_json::json!({"workspace": "demo", "prompt": prompt}),
        )
    })
    .await
    .expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_connects_to_slack_and_reports_a_broken_config_edit() {
    let Running {
        emu,
        _dir,
        root,
        port,
        path,
        _server,
        http,
    } = serve_with_slack().await;

    // Break the file: duplicate workspace id.
    let broken = config(
        &root,
        port,
        &emu.api_url,
        "[[workspace]]\nid = \"demo\"\npath = \".\"\n",
    );
    std::fs::write(&path, broken).expect("break");
    let h = until_health(&http, "stale", |h| h["config"] == "stale").await;
    assert!(
        h["config_error"]
            .as_str()
            .unwrap_or_default()
            .contains("workspace[1].id"),
        "{h}"
    );
    // Without the token, /healthz says stale but not what the file holds:
    // a parse error quotes the file (a token pasted into it, say).
    let open = health(&Http::new(&format!("http://127.0.0.1:{port}"), None)).await;
    assert_eq!(open["config"], "stale", "{open}");
    let hidden = open["config_error"].as_str().unwrap_or_default();
    assert!(
        !hidden.contains("workspace") && hidden.contains("check-config"),
        "{hidden}"
    );
    emu.until("operator notice", Duration::from_secs(30), |e| {
        e.channel("U_OPS")
            .into_iter()
            .find(|m| m.all_text().contains("kept its previous configuration"))
    })
    .await;

    // The previous map is still in use: starting in `demo` works.
    let started = start_in_demo(&http, "still works").await;
    assert_eq!(started.status, 201, "{}", started.text);

    // Fixing the file recovers without a restart.
    std::fs::write(&path, config(&root, port, &emu.api_url, "")).expect("fix");
    until_health(&http, "fresh", |h| h["config"] == "ok").await;
}

/// A bot token Slack refuses (revoked, say) makes every post fail while
/// Socket Mode, on the app token, stays up: `/healthz` says so
/// (`token_refused`) instead of `connected`. The messages are kept to be
/// tried again (not refused for good: someone can replace the token). A
/// message that goes out clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_bot_token_shows_on_healthz() {
    let Running {
        emu,
        _dir,
        _server,
        http,
        ..
    } = serve_with_slack().await;
    emu.fail_all(Fault::Refuse("token_revoked"));
    let started = start_in_demo(&http, "into the void").await;
    assert_eq!(started.status, 201, "{}", started.text);
    let h = until_health(&http, "token_refused", |h| h["slack"] == "token_refused").await;
    assert_eq!(h["slack_refused"], 0, "{h}");
    emu.heal();
    let again = start_in_demo(&http, "heard again").await;
    assert_eq!(again.status, 201, "{}", again.text);
    until_health(&http, "connected again", |h| h["slack"] == "connected").await;
}
