//! Stopping sessions over the HTTP API: `POST /api/sessions/{id}/cancel`
//! waits for the end (200) or says the agent is still being terminated
//! (202 "stopping"), is idempotent, and an ended session refuses prompts.

mod common;

use common::api_server::{Server, sid, with_permission};
use common::{Setup, until};
use serde_json::json;

#[test]
fn cancel_is_idempotent_and_an_ended_session_refuses_prompts() {
    let server = Server::start(with_permission());
    let http = &server.http;
    let id = sid(&http.start("first"));
    http.until_pending(&id, "req-1");
    let cancel = format!("/api/sessions/{id}/cancel");
    let r = http.post(&cancel, &json!({}));
    // Either the session ended within the wait (200, and then it says so),
    // or 202 "stopping": never 200 with a stale "active".
    match r.status {
        200 => assert_eq!(r.body["status"], "cancelled", "{}", r.text),
        202 => assert_eq!(r.body["status"], "stopping", "{}", r.text),
        other => panic!("cancel answered {other}: {}", r.text),
    }
    http.until_status(&id, "cancelled");
    let again = http.post(&cancel, &json!({}));
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.body["status"], "cancelled");
    assert_eq!(again.body["status_reason"], "stopped by operator");

    let r = http.post(
        &format!("/api/sessions/{id}/prompt"),
        &json!({"text": "hello?"}),
    );
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(r.body["code"], "conflict");
    assert_eq!(r.body["status"], "cancelled");
    assert_eq!(r.body["error"], "session is cancelled; start a new one");

    let r = http.post(
        &format!("/api/approvals/{id}:req-1"),
        &json!({"decision": "approve"}),
    );
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(http.get("/api/sessions").body, json!([]));
    assert_eq!(http.get("/api/sessions?all=true").body[0]["id"], id);
}

/// Kills the escaped descendant of a hostile agent when the test ends.
struct Escaped(i32);

impl Drop for Escaped {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the `sleep` this test's agent started.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

/// A session whose agent ignores cancel, stdin EOF and SIGTERM, hangs, and
/// has left a `sleep` in a process group of its own (re-parented first when
/// `detach`); returns the server, the session id and that descendant.
fn hostile_session(detach: bool) -> (Server, String, Escaped) {
    let pids = tempfile::tempdir().expect("tempdir");
    let pid_file = pids.path().join("escaped.pid");
    let server = Server::start(Setup {
        scenario: json!({"turns": [[
            {"ignore_sigterm": true},
            {"escape_group": {"pid_file": pid_file, "secs": 120, "detach": detach}},
            {"hang": true}
        ]]}),
        ..Setup::default()
    });
    let id = sid(&server.http.start("hold on"));
    let escaped = Escaped(until("the escaped descendant", || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    }));
    (server, id, escaped)
}

#[test]
fn cancel_answers_202_stopping_while_a_hostile_agent_outlives_the_wait() {
    // The agent ignores session/cancel, stdin EOF and SIGTERM, and leaves a
    // detached descendant (double fork: re-parented, out of the server's
    // reach) in a group of its own holding its stdout: the SIGKILL comes
    // at grace + 2 s and its end is seen only when the pipes drain (bounded
    // at 2 s), after the API's wait (grace + 2 s + 1 s).
    let (server, id, escaped) = hostile_session(true);
    let http = &server.http;
    let r = http.post(&format!("/api/sessions/{id}/cancel"), &json!({}));
    assert_eq!(r.status, 202, "{}", r.text);
    assert_eq!(r.body["status"], "stopping", "{}", r.text);
    assert_eq!(r.body["id"], id.as_str(), "{}", r.text);
    let ended = http.until_status(&id, "cancelled");
    assert_eq!(ended["status_reason"], "stopped by operator", "{ended}");
    drop(escaped);
}

/// Dead, or a zombie nobody reaped yet (a container's init may not reap).
fn gone(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X")
    })
}

#[test]
fn a_descendant_that_left_the_agents_group_dies_with_the_session() {
    // A hostile agent moves a child into a process group of its own, where
    // the group kill cannot reach it: the server finds it by its parent link
    // and kills it with the agent.
    let (server, id, escaped) = hostile_session(false);
    let http = &server.http;
    assert!(!gone(escaped.0), "the descendant should run until the stop");
    http.post(&format!("/api/sessions/{id}/cancel"), &json!({}));
    http.until_status(&id, "cancelled");
    until("the escaped descendant to be killed", || {
        gone(escaped.0).then_some(())
    });
}

#[test]
fn a_descendant_in_its_own_session_dies_when_a_cooperative_agent_stops() {
    // The agent exits as soon as its stdin closes (the stop's first step),
    // which re-parents the `sleep` it moved into a group of its own before
    // any kill: the stop notes the descendants first and kills them once
    // the agent exited.
    let pids = tempfile::tempdir().expect("tempdir");
    let pid_file = pids.path().join("escaped.pid");
    let server = Server::start(Setup {
        scenario: json!({"turns": [[
            {"escape_group": {"pid_file": pid_file, "secs": 120, "detach": false}},
            {"chunk": "left a sleep behind"}
        ]]}),
        ..Setup::default()
    });
    let id = sid(&server.http.start("go"));
    let escaped = Escaped(until("the escaped descendant", || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    }));
    server.http.until_transcript(&id, "left a sleep behind");
    assert!(!gone(escaped.0), "the descendant should run until the stop");
    server
        .http
        .post(&format!("/api/sessions/{id}/cancel"), &json!({}));
    server.http.until_status(&id, "cancelled");
    until("the escaped descendant to be killed", || {
        gone(escaped.0).then_some(())
    });
}

#[test]
fn healthz_says_shutting_down_while_the_sessions_are_being_stopped() {
    use agent_intercom::config::Config;
    use common::api_server::in_process::Running;
    use common::{Http, Layout, TOKEN};
    // An agent that ignores SIGTERM holds the stop for the grace and the
    // kill after it: long enough to ask the server how it is.
    let layout = Layout::new(&Setup {
        scenario: json!({"turns": [[{"ignore_sigterm": true}, {"hang": true}]]}),
        ..Setup::default()
    });
    let config = Config::load(&layout.config).expect("config");
    let (running, started) = Running::start(config, TOKEN);
    let http = Http::new(&format!("http://{}", started.addr), Some(TOKEN));
    let id = sid(&http.start("hold on"));
    http.until_status(&id, "active");
    assert_eq!(http.get("/healthz").body["status"], "ok");

    let app = started.app.clone();
    let stopping = started.rt.spawn(async move { app.shutdown().await });
    let health = until("/healthz to say shutting_down", || {
        let r = http.get("/healthz");
        (r.status == 503 && r.body["status"] == "shutting_down").then_some(r)
    });
    assert_eq!(health.body["sessions"], 0, "{}", health.text);
    started.rt.block_on(stopping).expect("shutdown");
    drop(running);
}
