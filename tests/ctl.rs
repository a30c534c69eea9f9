//! `ctl` against a real in-process server: every session control the API
//! offers (pause, resume, nudge, approval mode, stop, revive) is there in
//! the terminal too, and a refused one exits non-zero.

mod common;

use agent_intercom::ctl::{CtlArgs, run};
use clap::Parser;
use common::api_server::{Server, idle_ended, sid};
use common::{Setup, TOKEN};
use serde_json::json;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    ctl: CtlArgs,
}

/// Runs `ctl <words>` against `server`; returns its exit code.
fn ctl(server: &Server, words: &[&str]) -> i32 {
    let mut argv = vec!["ctl", "--url", &server.http.base, "--token", TOKEN];
    argv.extend_from_slice(words);
    run(&Cli::parse_from(argv).ctl)
}

#[test]
fn pause_resume_mode_nudge_and_stop_from_the_terminal() {
    let server = Server::start(Setup {
        scenario: json!({"turns": [[{"chunk": "ok"}]]}),
        ..Setup::default()
    });
    let http = &server.http;
    let id = sid(&http.start("hello"));
    let show = |field: &str| http.get(&format!("/api/sessions/{id}")).body[field].clone();

    assert_eq!(ctl(&server, &["pause", &id]), 0);
    assert_eq!(show("live")["paused"], true);
    // Steering while paused is held for the resume, and the answer says so
    // (ctl used to say it waited for a running turn).
    let held = http.post(
        &format!("/api/sessions/{id}/prompt"),
        &json!({"text": "later"}),
    );
    assert_eq!(held.status, 202, "{}", held.text);
    assert_eq!(
        (held.body["queued"].as_bool(), held.body["paused"].as_bool()),
        (Some(true), Some(true)),
        "{}",
        held.text
    );
    assert_eq!(ctl(&server, &["resume", &id]), 0);
    assert_eq!(show("live")["paused"], false);

    assert_eq!(ctl(&server, &["mode", &id, "auto-edits"]), 0);
    assert_eq!(show("approval_mode"), "auto-edits");
    assert_ne!(ctl(&server, &["mode", &id, "anything-goes"]), 0);
    assert_eq!(show("approval_mode"), "auto-edits");

    assert_eq!(ctl(&server, &["nudge", &id]), 0);
    let audit = http.get(&format!("/api/audit?session={id}")).body;
    assert!(audit.to_string().contains("nudge"), "{audit}");

    assert_eq!(ctl(&server, &["stop", &id]), 0);
    assert_eq!(show("status"), "cancelled");
    assert_ne!(ctl(&server, &["pause", "s-no-such-session"]), 0);
    // An ended session's agent modes are a conflict (exit 4), as every
    // other control on it; it said "offers no modes" and exit 0.
    assert_eq!(ctl(&server, &["agent-mode", &id]), 4);
    assert_eq!(ctl(&server, &["cancel", "s-no-such-session"]), 3);

    // Watching a session that ended says so and returns (it waited in
    // silence for ever).
    let (done, watched) = std::sync::mpsc::channel();
    let (url, watch_id) = (server.http.base.clone(), id.clone());
    std::thread::spawn(move || {
        let argv = ["ctl", "--url", &url, "--token", TOKEN, "watch", &watch_id];
        let _ = done.send(run(&Cli::parse_from(argv).ctl));
    });
    let code = watched
        .recv_timeout(common::WAIT)
        .expect("watch of an ended session returns");
    assert_eq!(code, 0);
}

#[test]
fn revive_from_the_terminal() {
    let server = Server::start(Setup {
        idle_timeout_secs: Some(1),
        ..Setup::default()
    });
    let http = &server.http;
    let id = idle_ended(http, "hello");
    assert_eq!(ctl(&server, &["revive", &id]), 0);
    assert_eq!(
        http.get(&format!("/api/sessions/{id}")).body["status"],
        "active"
    );
    assert_ne!(ctl(&server, &["revive", "s-no-such-session"]), 0);
}

/// A `--url` that is not an http:// address is a usage error naming the
/// option, not "an unexpected answer from the server".
#[test]
fn a_url_that_is_not_http_is_a_usage_error() {
    for url in ["notaurl", "https://127.0.0.1:3000", "http://"] {
        let argv = vec!["ctl", "--url", url, "--token", TOKEN, "sessions"];
        assert_eq!(run(&Cli::parse_from(argv).ctl), 2, "{url}");
    }
}

/// A config file with an error (a rule's bad regex) still tells ctl where
/// the server listens and where its token is: a bad edit at 2 a.m. must not
/// lock the operator out of the terminal while the server runs on.
#[test]
fn a_broken_config_still_tells_ctl_where_the_server_is() {
    let server = Server::start(Setup::default());
    let dir = tempfile::tempdir().expect("tmp");
    let bind = server.http.base.trim_start_matches("http://");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    std::fs::write(
        data.join(agent_intercom::http::auth::TOKEN_FILE_NAME),
        format!("{TOKEN}\n"),
    )
    .expect("token");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nbind = \"{bind}\"\n\n[database]\npath = \"data/db.sqlite\"\n\n[[rule]]\naction = \"deny\"\ncommand_regex = \"(\"\n"
        ),
    )
    .expect("config");
    let argv = vec![
        "ctl",
        "--config",
        config.to_str().expect("utf-8"),
        "sessions",
    ];
    assert_eq!(run(&Cli::parse_from(argv).ctl), 0);
    // Not TOML at all: a usage error naming the way out.
    std::fs::write(&config, "[server\nbind = ").expect("broken");
    let argv = vec![
        "ctl",
        "--config",
        config.to_str().expect("utf-8"),
        "sessions",
    ];
    assert_eq!(run(&Cli::parse_from(argv).ctl), 2);
}

/// What a start can name is listed (a newcomer had only the error for a
/// wrong workspace to learn the ids from), and `ctl start --mode` starts a
/// session in the mode asked for, as the API and the console can.
#[test]
fn workspaces_and_agents_are_listed_and_a_start_can_choose_its_mode() {
    let server = Server::start(Setup {
        scenario: json!({"turns": [[{"chunk": "ok"}]]}),
        ..Setup::default()
    });
    let http = &server.http;
    let workspaces = http.get("/api/workspaces");
    assert_eq!(workspaces.status, 200, "{}", workspaces.text);
    let ws = &workspaces.body[0];
    assert_eq!(
        (&ws["id"], &ws["agent"], &ws["approval_mode"]),
        (&json!("demo"), &json!("scripted"), &json!("ask")),
        "{}",
        workspaces.text
    );
    assert!(
        ws["path"].as_str().is_some_and(|p| p.ends_with("/ws")),
        "{}",
        workspaces.text
    );
    let agents = http.get("/api/agents");
    let ids: Vec<(&str, bool)> = agents
        .body
        .as_array()
        .expect("a list")
        .iter()
        .map(|a| (a["id"].as_str().unwrap_or("?"), a["default"] == true))
        .collect();
    assert_eq!(
        ids,
        [("scripted", true), ("missing", false)],
        "{}",
        agents.text
    );
    assert_eq!(ctl(&server, &["workspaces"]), 0);
    assert_eq!(ctl(&server, &["agents"]), 0);

    assert_eq!(
        ctl(
            &server,
            &["start", "demo", "carefully", "--mode", "auto-edits"]
        ),
        0
    );
    let sessions = http.get("/api/sessions").body;
    let id = sessions[0]["id"].as_str().expect("the session").to_owned();
    let detail = http.get(&format!("/api/sessions/{id}")).body;
    assert_eq!(detail["approval_mode"], "auto-edits", "{detail}");
    assert_ne!(
        ctl(&server, &["start", "demo", "x", "--mode", "anything-goes"]),
        0
    );
    assert_eq!(
        http.get("/api/sessions").body.as_array().map(Vec::len),
        Some(1)
    );
}
