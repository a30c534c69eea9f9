//! The HTTP API end to end: the real app (store, registry, supervisor) served
//! in-process on 127.0.0.1:0, driving the scripted agent as a child process.
//! Stopping sessions is in `api_stop.rs`, rules and modes in `api_rules.rs`.

mod common;

use agent_intercom::config::Config;
use common::api_server::in_process::open_app;
use common::api_server::{Served, Server, idle_ended, sid, with_permission};
use common::{Http, Layout, Setup, until};
use serde_json::{Value, json};
use std::time::Duration;

#[test]
fn health_needs_no_token_but_the_api_does() {
    let server = Server::start(Setup::default());
    let anonymous = Http::new(&server.http.base, None);
    let health = anonymous.get("/healthz");
    assert_eq!(health.status, 200);
    // The test config has an agent profile `missing` whose command does not
    // exist: counted for anyone, told (it names a path) only with the token.
    assert_eq!(
        health.body,
        json!({"status": "ok", "sessions": 0, "slack": "disabled", "config": "ok", "slack_dropped": 0, "slack_refused": 0, "config_warnings": 1})
    );
    let told = server.http.get("/healthz").body["config_warning_texts"].clone();
    assert!(
        told.to_string().contains("agent profile `missing`"),
        "{told}"
    );

    let missing = anonymous.get("/api/sessions");
    assert_eq!(missing.status, 401, "{}", missing.text);
    assert_eq!(missing.body["code"], "unauthorized");
    assert!(
        missing.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("Bearer"))
    );
    let wrong = Http::new(&server.http.base, Some("not-the-token"));
    let r = wrong.get("/api/sessions");
    assert_eq!(
        (r.status, r.body["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let r = wrong.post(
        "/api/sessions",
        &json!({"workspace": "demo", "prompt": "x"}),
    );
    assert_eq!(r.status, 401);
    // Unknown routes under /api are not probed without a token.
    assert_eq!(anonymous.get("/api/nope").status, 401);
    let r = server.http.get("/api/nope");
    assert_eq!(
        (r.status, r.body["code"].as_str()),
        (404, Some("not_found"))
    );
    assert_eq!(server.http.get("/api/sessions").body, json!([]));
}

#[test]
fn a_session_with_a_permission_round_trip() {
    let server = Server::start(with_permission());
    let http = &server.http;
    let session = http.start("please write notes");
    let id = sid(&session);
    assert!(id.starts_with("s-") && id.len() == 18, "{id}");
    assert_eq!(session["workspace"], "demo");
    assert_eq!(session["agent"], "scripted");
    assert_eq!(session["owner"], "local");
    assert_eq!(session["title"], "please write notes");
    assert_eq!(session["restart_count"], 0);
    assert!(
        session["created_at"]
            .as_i64()
            .is_some_and(|t| t > 1_600_000_000_000)
    );
    for key in [
        "status",
        "status_reason",
        "updated_at",
        "cwd",
        "protocol",
        "channel_id",
    ] {
        assert!(session.get(key).is_some(), "missing {key}: {session}");
    }

    let approval = http.until_pending(&id, "req-1");
    assert_eq!(approval["id"], format!("{id}:req-1"));
    assert_eq!(approval["kind"], "permission");
    assert_eq!(approval["title"], "Write notes.txt");
    assert_eq!(approval["status"], "pending");
    assert!(approval.get("diff").is_none(), "{approval}");
    let options: Vec<&str> = approval["options"]
        .as_array()
        .expect("options")
        .iter()
        .map(|o| o["id"].as_str().expect("option id"))
        .collect();
    assert_eq!(
        options,
        ["allow-once", "allow-always", "reject-once", "reject-always"]
    );
    assert_eq!(approval["options"][0]["kind"], "allow_once");

    let detail = http.get(&format!("/api/sessions/{id}"));
    assert_eq!(detail.status, 200);
    assert_eq!(detail.body["pending"][0]["request_id"], "req-1");
    assert!(
        detail.body["live"]["agent_pid"].as_i64().is_some(),
        "{}",
        detail.text
    );
    assert_eq!(detail.body["live"]["turn_running"], true);

    let decided = http.post(
        &format!("/api/approvals/{id}:req-1"),
        &json!({"option_id": "allow-once"}),
    );
    assert_eq!(decided.status, 200, "{}", decided.text);
    assert_eq!(decided.body["status"], "decided");
    assert_eq!(decided.body["decision"]["option_id"], "allow-once");
    assert_eq!(decided.body["decision"]["approved"], true);
    assert_eq!(decided.body["decision"]["decided_by"], "local");
    let text = http.until_transcript(&id, "permission t1: selected allow-once");
    assert!(text.contains("[user:text] please write notes"), "{text}");
    assert!(text.contains("prompt: please write notes"), "{text}");

    let again = http.post(
        &format!("/api/approvals/{id}:req-1"),
        &json!({"decision": "approve"}),
    );
    assert_eq!(again.status, 409, "{}", again.text);
    assert_eq!(again.body["code"], "conflict");
    let stored = http.get(&format!("/api/approvals/{id}:req-1"));
    assert_eq!(stored.body["decision"]["option_id"], "allow-once");
    // The decide answer comes from the session, not from a read of the row:
    // it must be the row as stored, field for field.
    assert_eq!(decided.body, stored.body);
    let unknown = http.post(
        &format!("/api/approvals/{id}:req-99"),
        &json!({"decision": "approve"}),
    );
    assert_eq!(unknown.status, 404, "{}", unknown.text);

    // A second turn asks again; this time reject it with a reason.
    let steer = http.post(
        &format!("/api/sessions/{id}/prompt"),
        &json!({"text": "one more"}),
    );
    assert_eq!(steer.status, 202, "{}", steer.text);
    http.until_pending(&id, "req-2");
    let rejected = http.post(
        &format!("/api/approvals/{id}:req-2"),
        &json!({"decision": "reject", "reason": "not now"}),
    );
    assert_eq!(rejected.status, 200, "{}", rejected.text);
    assert_eq!(rejected.body["decision"]["approved"], false);
    assert_eq!(rejected.body["decision"]["option_id"], "reject-once");
    assert_eq!(rejected.body["decision"]["reason"], "not now");
    http.until_transcript(&id, "permission t1: selected reject-once");
    // ACP's answer carries only the option: the reason follows as steering,
    // which starts the agent's next turn (here, asking once more).
    http.until_transcript(
        &id,
        "prompt: The operator rejected your permission request (req-2) and says: not now",
    );
    http.until_pending(&id, "req-3");

    let all = http.get("/api/approvals");
    assert_eq!(all.body.as_array().map(Vec::len), Some(3), "{}", all.text);
    let pending = http.get("/api/approvals?status=pending");
    assert_eq!(
        pending.body.as_array().map(Vec::len),
        Some(1),
        "{}",
        pending.text
    );
    assert_eq!(
        http.get("/api/approvals?status=decided")
            .body
            .as_array()
            .map(Vec::len),
        Some(2)
    );
}

#[test]
fn unknown_things_are_404() {
    let server = Server::start(Setup::default());
    let http = &server.http;
    let gets = [
        "/api/sessions/s-0000000000000000",
        "/api/sessions/s-0000000000000000/messages",
        "/api/approvals/s-0000000000000000:req-1",
        // As /api/events?session= answers: a typo'd id is not a quiet session.
        "/api/audit?session=s-0000000000000000",
    ];
    for path in gets {
        let r = http.get(path);
        assert_eq!(
            (r.status, r.body["code"].as_str()),
            (404, Some("not_found")),
            "{path}: {}",
            r.text
        );
    }
    let posts = [
        (
            "/api/sessions/s-0000000000000000/prompt",
            json!({"text": "hi"}),
        ),
        ("/api/sessions/s-0000000000000000/cancel", json!({})),
        (
            "/api/approvals/s-0000000000000000:req-1",
            json!({"decision": "approve"}),
        ),
        ("/api/approvals/garbage", json!({"decision": "approve"})),
        (
            "/api/sessions",
            json!({"workspace": "nope", "prompt": "hi"}),
        ),
        (
            "/api/sessions",
            json!({"workspace": "demo", "prompt": "hi", "agent": "nope"}),
        ),
        (
            "/api/sessions",
            json!({"path": "does/not/exist", "prompt": "hi"}),
        ),
    ];
    for (path, body) in posts {
        let r = http.post(path, &body);
        assert_eq!(
            (r.status, r.body["code"].as_str()),
            (404, Some("not_found")),
            "{path} {body}: {}",
            r.text
        );
    }
    // An id without its session says what an approval id looks like.
    let short = http.post("/api/approvals/req-1", &json!({"decision": "approve"}));
    assert!(
        short.text.contains("approval ids are <session-id>:req-N"),
        "{}",
        short.text
    );
    let unknown_ws = http.post(
        "/api/sessions",
        &json!({"workspace": "nope", "prompt": "hi"}),
    );
    assert!(
        unknown_ws.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("demo")),
        "{}",
        unknown_ws.text
    );
}

#[test]
fn path_sessions_stay_under_the_workspace_root() {
    let server = Server::start(Setup::default());
    let http = &server.http;
    let outside = tempfile::tempdir().expect("outside");
    std::os::unix::fs::symlink(outside.path(), server.layout.root.join("escape")).expect("symlink");
    for path in [
        "/",
        "escape",
        "ws/../..",
        outside.path().to_str().expect("utf8"),
    ] {
        let r = http.post("/api/sessions", &json!({"path": path, "prompt": "hi"}));
        assert_eq!(
            (r.status, r.body["code"].as_str()),
            (403, Some("forbidden")),
            "{path}: {}",
            r.text
        );
    }
    let elsewhere = server.layout.root.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("mkdir");
    let ok = http.post(
        "/api/sessions",
        &json!({"path": "elsewhere", "prompt": "hi"}),
    );
    assert_eq!(ok.status, 201, "{}", ok.text);
    assert_eq!(ok.body["workspace"], elsewhere.display().to_string());
    assert_eq!(ok.body["cwd"], elsewhere.display().to_string());
    assert_eq!(ok.body["agent"], "scripted");
    // A configured workspace's directory is that workspace (its rules, mode
    // and channel hold there); a directory inside it is refused, saying
    // which workspace to start instead.
    let top = http.post("/api/sessions", &json!({"path": "ws", "prompt": "hi"}));
    assert_eq!(top.status, 201, "{}", top.text);
    assert_eq!(top.body["workspace"], "demo");
    std::fs::create_dir_all(server.layout.root.join("ws/sub")).expect("mkdir");
    let inside = http.post("/api/sessions", &json!({"path": "ws/sub", "prompt": "hi"}));
    assert_eq!(inside.status, 400, "{}", inside.text);
    assert!(inside.text.contains("workspace `demo`"), "{}", inside.text);
}

/// A route that takes no body refuses one with fields, and does nothing: a
/// probe's `{"dry_run": true}` on a stop was ignored and the session
/// stopped. No body, or `{}`, is what the clients send.
#[test]
fn a_control_with_fields_it_does_not_take_is_refused_and_does_nothing() {
    let server = Server::start(with_permission());
    let http = &server.http;
    let started = http.post(
        "/api/sessions",
        &json!({"workspace": "demo", "prompt": "hi"}),
    );
    assert_eq!(started.status, 201, "{}", started.text);
    let id = started.body["id"].as_str().expect("id").to_owned();
    for what in ["cancel", "pause", "restart", "nudge", "resume", "revive"] {
        let r = http.post(
            &format!("/api/sessions/{id}/{what}"),
            &json!({"dry_run": true}),
        );
        assert_eq!(r.status, 400, "{what}: {}", r.text);
        let error = r.body["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("unknown field(s) \"dry_run\""),
            "{what}: {error}"
        );
    }
    let s = http.get(&format!("/api/sessions/{id}"));
    assert!(
        ["active", "starting"].contains(&s.body["status"].as_str().unwrap_or("")),
        "{}",
        s.text
    );
    let paused = http.post(&format!("/api/sessions/{id}/pause"), &json!({}));
    assert_eq!(paused.status, 200, "{}", paused.text);
}

#[test]
fn malformed_requests_are_400_with_json_errors() {
    let server = Server::start(with_permission());
    let http = &server.http;
    let cases = [
        json!({"workspace": "demo", "prompt": "   "}),
        json!({"workspace": "demo"}),
        json!({"workspace": "demo", "path": "ws", "prompt": "x"}),
        json!({"prompt": "x"}),
        json!({"workspace": "demo", "prompt": "x", "colour": "red"}),
        // A list of the fields' values in order is not a body.
        json!(["demo", null, "x"]),
    ];
    for body in cases {
        let r = http.post("/api/sessions", &body);
        assert_eq!(
            (r.status, r.body["code"].as_str()),
            (400, Some("bad_request")),
            "{body}: {}",
            r.text
        );
    }
    let r = http.post_raw("/api/sessions", "{\"workspace\": ");
    assert_eq!(
        (r.status, r.body["code"].as_str()),
        (400, Some("bad_request")),
        "{}",
        r.text
    );
    assert!(
        r.body["error"].as_str().is_some_and(|e| e.contains("JSON")),
        "{}",
        r.text
    );
    let r = http.get("/api/approvals?status=bogus");
    assert_eq!(r.status, 400, "{}", r.text);
    let r = http.get("/api/sessions?all=maybe");
    assert_eq!(r.status, 400, "{}", r.text);
    let r = http.get("/api/sessions?al=true");
    assert_eq!(r.status, 400, "a typo is not ignored: {}", r.text);
    // An id that is not UTF-8 gets the API's JSON error, not plain text.
    let r = http.get("/api/sessions/%ff%fe");
    assert_eq!(
        (r.status, r.body["code"].as_str()),
        (400, Some("bad_request")),
        "{}",
        r.text
    );

    let id = sid(&http.start("write"));
    http.until_pending(&id, "req-1");
    let r = http.post(&format!("/api/sessions/{id}/prompt"), &json!({"text": ""}));
    assert_eq!(r.status, 400, "{}", r.text);
    let approval = format!("/api/approvals/{id}:req-1");
    for body in [
        json!({}),
        json!({"decision": "maybe"}),
        json!({"decision": "approve", "option_id": "allow-once"}),
        json!({"option_id": "no-such-option"}),
        json!([null, "approve", null]),
    ] {
        let r = http.post(&approval, &body);
        assert_eq!(
            (r.status, r.body["code"].as_str()),
            (400, Some("bad_request")),
            "{body}: {}",
            r.text
        );
    }
    // None of that decided anything.
    assert_eq!(http.get(&approval).body["status"], "pending");
}

#[test]
fn the_session_limit_answers_429_with_retry_after() {
    let server = Server::start(Setup {
        max_sessions: 1,
        ..with_permission()
    });
    let http = &server.http;
    let first = sid(&http.start("first"));
    let r = http.post(
        "/api/sessions",
        &json!({"workspace": "demo", "prompt": "second"}),
    );
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.body["code"], "limit_reached");
    assert_eq!(r.retry_after.as_deref(), Some("60"));
    assert_eq!(http.get("/healthz").body["sessions"], 1);
    // Once the first ends, there is room again.
    let r = http.post(&format!("/api/sessions/{first}/cancel"), &json!({}));
    assert!(r.status == 200 || r.status == 202, "{}", r.text);
    until("room for a new session", || {
        let r = http.post(
            "/api/sessions",
            &json!({"workspace": "demo", "prompt": "third"}),
        );
        (r.status == 201).then_some(())
    });
}

#[test]
fn an_agent_that_cannot_start_is_502_and_leaves_no_session() {
    let server = Server::start(Setup::default());
    let http = &server.http;
    let r = http.post(
        "/api/sessions",
        &json!({"workspace": "demo", "prompt": "hi", "agent": "missing"}),
    );
    assert_eq!(r.status, 502, "{}", r.text);
    assert_eq!(r.body["code"], "agent_start_failed");
    assert!(
        r.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("agent-intercom-test-agent")),
        "{}",
        r.text
    );
    assert_eq!(http.get("/api/sessions?all=true").body, json!([]));
    assert_eq!(http.get("/healthz").body["sessions"], 0);
}

#[test]
fn prompts_queue_behind_a_blocked_turn_and_arrive_in_order() {
    let server = Server::start(with_permission());
    let http = &server.http;
    let id = sid(&http.start("first"));
    http.until_pending(&id, "req-1");
    let prompt = format!("/api/sessions/{id}/prompt");
    for text in ["second", "third"] {
        let r = http.post(&prompt, &json!({"text": text}));
        assert_eq!(r.status, 202, "{}", r.text);
        assert_eq!(r.body, json!({"queued": true, "paused": false}));
    }
    let detail = http.get(&format!("/api/sessions/{id}"));
    assert_eq!(detail.body["live"]["queued_prompts"], 2, "{}", detail.text);
    // The stored steering, oldest first: the first prompt (delivered, it is
    // the session's first steering), then the two queued (no delivery time).
    let steering = format!("/api/sessions/{id}/steering");
    let listed = http.get(&steering);
    assert_eq!(listed.status, 200, "{}", listed.text);
    let texts = |body: &Value| -> Vec<(String, bool)> {
        body.as_array()
            .expect("list")
            .iter()
            .map(|s| {
                (
                    s["text"].as_str().unwrap_or("").to_owned(),
                    s["delivered_at"].is_i64(),
                )
            })
            .collect()
    };
    assert_eq!(
        texts(&listed.body),
        vec![
            ("first".to_owned(), true),
            ("second".to_owned(), false),
            ("third".to_owned(), false)
        ]
    );

    let approve = |req: &str| {
        let r = http.post(
            &format!("/api/approvals/{id}:{req}"),
            &json!({"decision": "approve"}),
        );
        assert_eq!(r.status, 200, "{}", r.text);
    };
    approve("req-1");
    http.until_pending(&id, "req-2");
    let text = http.until_transcript(&id, "prompt: second");
    let listed = http.get(&steering);
    assert_eq!(
        texts(&listed.body),
        vec![
            ("first".to_owned(), true),
            ("second".to_owned(), true),
            ("third".to_owned(), false)
        ],
        "{}",
        listed.text
    );
    assert!(
        !text.contains("prompt: third"),
        "third arrived early: {text}"
    );
    approve("req-2");
    http.until_pending(&id, "req-3");
    let text = http.until_transcript(&id, "prompt: third");
    let (second, third) = (
        text.find("prompt: second").expect("second"),
        text.find("prompt: third").expect("third"),
    );
    assert!(second < third, "{text}");
}

#[test]
fn interrupting_cancels_the_turn_and_delivers_at_once() {
    let server = Server::start(with_permission());
    let http = &server.http;
    let id = sid(&http.start("first"));
    http.until_pending(&id, "req-1");
    let r = http.post(
        &format!("/api/sessions/{id}/prompt"),
        &json!({"text": "change of plan", "interrupt": true}),
    );
    assert_eq!(r.status, 202, "{}", r.text);
    http.until_transcript(&id, "prompt: change of plan");
    let old = http.get(&format!("/api/approvals/{id}:req-1"));
    assert_eq!(old.body["status"], "cancelled", "{}", old.text);
}

/// The agent's transcript as one string (what it reported receiving).
fn transcript(http: &Http, id: &str) -> String {
    let r = http.get(&format!("/api/sessions/{id}/messages"));
    r.body
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|e| e["content"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

#[test]
fn restart_respawns_a_hung_agent_in_the_same_session() {
    let markers = tempfile::tempdir().expect("tempdir");
    let hung = markers.path().join("hung").display().to_string();
    let server = Server::start(Setup {
        scenario: json!({"turns": [[{"hang_once": hung}, {"chunk": "working again"}]]}),
        ..Setup::default()
    });
    let http = &server.http;
    let id = sid(&http.start("the task"));
    until("the agent got the task", || {
        transcript(http, &id)
            .contains("prompt: the task")
            .then_some(())
    });
    let pid = http.get(&format!("/api/sessions/{id}")).body["live"]["agent_pid"].clone();
    let r = http.post(&format!("/api/sessions/{id}/restart"), &json!({}));
    assert_eq!(r.status, 202, "{}", r.text);
    assert_eq!(r.body["id"], id.as_str());
    assert_eq!(r.body["status"], "starting", "{}", r.text);
    until("resumed and working", || {
        transcript(http, &id)
            .contains("working again")
            .then_some(())
    });
    let detail = http.get(&format!("/api/sessions/{id}"));
    assert_eq!(detail.body["restart_count"], 1, "{}", detail.text);
    assert_ne!(detail.body["live"]["agent_pid"], pid, "a new agent process");

    let r = http.post("/api/sessions/s-0000000000000000/restart", &json!({}));
    assert_eq!(r.status, 404, "{}", r.text);
    http.post(&format!("/api/sessions/{id}/cancel"), &json!({}));
    let r = http.post(&format!("/api/sessions/{id}/restart"), &json!({}));
    assert_eq!(
        r.status, 409,
        "an ended session is not restarted: {}",
        r.text
    );
}

#[test]
fn the_agents_own_modes_are_shown_and_switched() {
    let server = Server::start(Setup {
        scenario: json!({
            "session_options": {"modes": {"currentModeId": "default", "availableModes": [
                {"id": "default", "name": "Default"}, {"id": "plan", "name": "Plan Mode"}]}},
            "turns": [[{"chunk": "ready."}]]
        }),
        ..Setup::default()
    });
    let http = &server.http;
    let id = sid(&http.start("go"));
    http.until_transcript(&id, "ready.");
    let detail = http.get(&format!("/api/sessions/{id}"));
    let offered = &detail.body["live"]["agent_options"];
    assert_eq!(offered["current_mode"], "default", "{}", detail.text);
    assert_eq!(offered["modes"][1]["id"], "plan");

    let url = format!("/api/sessions/{id}/agent-mode");
    let r = http.post(&url, &json!({"mode": "plan"}));
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["agent_options"]["current_mode"], "plan");
    http.until_transcript(&id, "session/set_mode");

    let r = http.post(&url, &json!({"mode": "bypassPermissions"}));
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(
        r.body["error"]
            .as_str()
            .unwrap_or("")
            .contains("default, plan"),
        "{}",
        r.text
    );
    let r = http.post(&url, &json!({}));
    assert_eq!(r.status, 400, "{}", r.text);
}

#[test]
fn a_prompt_of_only_quotes_is_empty() {
    let server = Server::start(Setup::default());
    let r = server.http.post(
        "/api/sessions",
        &json!({"workspace": "demo", "prompt": " \"\" "}),
    );
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(
        r.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("empty")),
        "{}",
        r.text
    );
    assert_eq!(server.http.get("/api/sessions").body, json!([]));
}

#[tokio::test]
async fn healthz_answers_503_when_the_supervisor_is_stuck() {
    use agent_intercom::http::auth::ApiToken;
    use agent_intercom::http::routes::healthz;
    use intercom_actors::supervisor::SupervisorMsg;
    let layout = Layout::new(&Setup::default());
    let config = Config::load(&layout.config).expect("config loads");
    let app = open_app(&config).await;
    let token = std::sync::Arc::new(ApiToken::new("t"));
    let headers = axum::http::HeaderMap::new();
    let healthy = healthz(app.clone(), token.clone(), headers.clone()).await;
    assert_eq!(healthy.status(), 200);
    let body = axum::body::to_bytes(healthy.into_body(), 1 << 16)
        .await
        .expect("body");
    let body: Value = serde_json::from_slice(&body).expect("json");
    assert!(body["slack_dropped"].is_u64(), "{body}");
    app.supervisor()
        .send_message(SupervisorMsg::StallForTest(std::time::Duration::from_secs(
            30,
        )))
        .expect("stall the supervisor");
    // Bounded only so a regression fails instead of hanging the suite.
    let stuck = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        healthz(app.clone(), token, headers),
    )
    .await
    .expect("healthz answers while the supervisor is stuck");
    assert_eq!(stuck.status(), 503);
}

/// Sends `method path` with `body` on `conn`, the body in a second write a
/// moment after the headers (as a client whose body is not in the headers'
/// packet), and reads the whole response: its status line.
fn split_request(conn: &mut std::net::TcpStream, method: &str, path: &str, body: &str) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        common::TOKEN,
        body.len()
    );
    conn.write_all(head.as_bytes()).expect("write headers");
    conn.flush().expect("flush");
    // Shapes the input (the body in its own segment, after the server may
    // already have answered); the assertions do not depend on it.
    std::thread::sleep(Duration::from_millis(20));
    conn.write_all(body.as_bytes()).expect("write body");
    let mut reader = BufReader::new(conn.try_clone().expect("clone"));
    let mut status = String::new();
    reader.read_line(&mut status).expect("status line");
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("header");
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().expect("length");
        }
    }
    let mut rest = vec![0; length];
    reader.read_exact(&mut rest).expect("body");
    status.trim_end().to_owned()
}

#[test]
fn a_kept_alive_connection_survives_a_body_the_route_does_not_read() {
    let server = Server::start(Setup::default());
    let addr = server.http.base.trim_start_matches("http://").to_owned();
    let mut conn = std::net::TcpStream::connect(&addr).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // `restart` takes no body and answers 404 for an unknown session; the
    // same connection must then answer the next request.
    for _ in 0..3 {
        let status = split_request(
            &mut conn,
            "POST",
            "/api/sessions/s-0000000000000000/restart",
            "{}",
        );
        assert_eq!(status, "HTTP/1.1 404 Not Found");
    }
    let status = split_request(
        &mut conn,
        "POST",
        "/api/sessions/s-0000000000000000/cancel",
        "{}",
    );
    assert_eq!(status, "HTTP/1.1 404 Not Found");
}

/// A revived session takes instructions again, and its transcript says it
/// was revived, not restarted after a crash.
fn takes_a_prompt_once_revived(http: &common::Http, id: &str) {
    let r = http.post(
        &format!("/api/sessions/{id}/prompt"),
        &json!({"text": "welcome back"}),
    );
    assert_eq!(r.status, 202, "{}", r.text);
    let transcript = http.until_transcript(id, "prompt: welcome back");
    assert!(transcript.contains("Session revived"), "{transcript}");
    assert!(!transcript.contains("Agent restarted"), "{transcript}");
}

#[test]
fn a_session_ended_by_idle_timeout_is_revived_over_the_api() {
    let server = Server::start(Setup {
        idle_timeout_secs: Some(1),
        ..Setup::default()
    });
    let http = &server.http;
    let id = idle_ended(http, "the task");

    let r = http.post(&format!("/api/sessions/{id}/revive"), &json!({}));
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["id"], id.as_str());
    assert_eq!(r.body["status"], "active", "{}", r.text);
    takes_a_prompt_once_revived(http, &id);
    let audit = http.get(&format!("/api/audit?session={id}"));
    assert!(audit.text.contains("session.revived"), "{}", audit.text);
    assert!(!audit.text.contains("session.restarted"), "{}", audit.text);

    // A live session, a cancelled one and an unknown one do not come back.
    let r = http.post(&format!("/api/sessions/{id}/revive"), &json!({}));
    assert_eq!(r.status, 409, "a live session: {}", r.text);
    http.post(&format!("/api/sessions/{id}/cancel"), &json!({}));
    let r = http.post(&format!("/api/sessions/{id}/revive"), &json!({}));
    assert_eq!(r.status, 409, "a cancelled session: {}", r.text);
    assert!(r.text.contains("idle timeout"), "{}", r.text);
    let r = http.post("/api/sessions/s-0000000000000000/revive", &json!({}));
    assert_eq!(r.status, 404, "{}", r.text);
}

/// The configured agent behind a shell script, so what runs can change
/// between starts (a config fix, without a reload).
struct AgentScript(std::path::PathBuf);

impl AgentScript {
    fn install(layout: &Layout) -> AgentScript {
        let script = AgentScript(layout.dir.path().join("agent.sh"));
        script.runs_the_agent();
        let config = std::fs::read_to_string(&layout.config).expect("config");
        let scripted = format!("command = {:?}", common::agent_bin().display().to_string());
        assert!(config.contains(&scripted), "{config}");
        let config = config.replacen(
            &scripted,
            &format!("command = {:?}", script.0.display().to_string()),
            1,
        );
        std::fs::write(&layout.config, config).expect("config");
        script
    }

    fn set(&self, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&self.0, format!("#!/bin/sh\n{body}\n")).expect("script");
        std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    fn runs_the_agent(&self) {
        self.set(&format!("exec {:?} \"$@\"", common::agent_bin()));
    }
}

#[test]
fn a_revive_that_fails_leaves_the_session_revivable() {
    let layout = Layout::new(&Setup {
        idle_timeout_secs: Some(1),
        ..Setup::default()
    });
    let agent = AgentScript::install(&layout);
    let served = Served::on(&layout);
    let http = &served.http;
    let id = idle_ended(http, "the task");

    // The agent cannot start now: the revive fails, and says so...
    agent.set("exit 3");
    let r = http.post(&format!("/api/sessions/{id}/revive"), &json!({}));
    assert_eq!(r.status, 502, "{}", r.text);
    // ...and the session is left as it was, not crashed: it can come back.
    let after = http.until_status(&id, "completed");
    assert_eq!(after["status_reason"], "idle_timeout", "{after}");
    let audit = http.get(&format!("/api/audit?session={id}")).text;
    assert!(audit.contains("session.revive_failed"), "{audit}");
    assert!(!audit.contains("\"session.revived\""), "{audit}");
    // Steering it says what to do.
    let r = http.post(
        &format!("/api/sessions/{id}/prompt"),
        &json!({"text": "are you there?"}),
    );
    assert_eq!(r.status, 409, "{}", r.text);
    assert!(r.text.contains("revive"), "{}", r.text);

    agent.runs_the_agent();
    let r = http.post(&format!("/api/sessions/{id}/revive"), &json!({}));
    assert_eq!(r.status, 200, "{}", r.text);
    let audit = http.get(&format!("/api/audit?session={id}")).body;
    let revived = audit
        .as_array()
        .and_then(|a| a.iter().find(|e| e["action"] == "session.revived"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(revived["actor"], "local", "{audit}");
}

#[test]
fn a_session_a_server_shutdown_stopped_is_revived_with_its_queued_steering() {
    let layout = Layout::new(&Setup {
        scenario: json!({"turns": [[{"chunk": "working"}, {"hang": true}]]}),
        ..Setup::default()
    });
    let id = {
        let served = Served::on(&layout);
        let http = &served.http;
        let id = sid(&http.start("the task"));
        http.until_transcript(&id, "working");
        let r = http.post(
            &format!("/api/sessions/{id}/prompt"),
            &json!({"text": "after the restart"}),
        );
        assert_eq!(r.status, 202, "{}", r.text);
        id
        // Dropped: a graceful shutdown stops the session.
    };
    let served = Served::on(&layout);
    let http = &served.http;
    let ended = http.get(&format!("/api/sessions/{id}")).body;
    assert_eq!(ended["status"], "cancelled", "{ended}");
    assert_eq!(ended["status_reason"], "server_shutdown", "{ended}");
    assert_eq!(ended["revivable"], true, "{ended}");
    let t = http.until_transcript(&id, "Not delivered");
    assert!(t.contains("revive the session"), "{t}");

    let r = http.post(&format!("/api/sessions/{id}/revive"), &json!({}));
    assert_eq!(r.status, 200, "{}", r.text);
    let t = http.until_transcript(&id, "prompt: after the restart");
    assert_eq!(t.matches("prompt: after the restart").count(), 1, "{t}");
}

/// A turn a graceful shutdown cut is continued by the revive: the
/// operator's task, given just before a SIGTERM, was never finished (the
/// revived session sat idle).
#[test]
fn a_turn_a_server_shutdown_cut_is_continued_by_the_revive() {
    let layout = Layout::new(&Setup {
        scenario: json!({"turns": [[{"chunk": "working"}, {"sleep_ms": 60000}]]}),
        ..Setup::default()
    });
    let id = {
        let served = Served::on(&layout);
        let http = &served.http;
        let id = sid(&http.start("the task"));
        http.until_transcript(&id, "working");
        id
        // Dropped: a graceful shutdown cancels the turn and stops the session.
    };
    let served = Served::on(&layout);
    let http = &served.http;
    let ended = http.get(&format!("/api/sessions/{id}")).body;
    assert_eq!(ended["status_reason"], "server_shutdown", "{ended}");
    let r = http.post(&format!("/api/sessions/{id}/revive"), &json!({}));
    assert_eq!(r.status, 200, "{}", r.text);
    let t = http.until_transcript(&id, "prompt: Continue working on the current task");
    let after = t.rsplit("Session revived").next().unwrap_or_default();
    assert!(after.contains("prompt: Continue working"), "{t}");
}

/// A start cut by a graceful shutdown during its agent's handshake ends
/// `cancelled` (`server_shutdown`), and its revive delivers the first
/// prompt: it is kept as the session's first steering. A probe's revived
/// session started its agent and sent it nothing (the prompt lived only in
/// the 80-character title).
#[test]
fn a_start_cut_by_a_shutdown_is_revived_with_its_first_prompt() {
    let layout = Layout::new(&Setup {
        scenario: json!({"handshake_delay_ms": 2000, "turns": [[{"chunk": "did it"}]]}),
        ..Setup::default()
    });
    let id = {
        let served = Served::on(&layout);
        let (base, token) = (served.http.base.clone(), served.http.token.clone());
        let starting = std::thread::spawn(move || {
            Http::new(&base, token.as_deref()).post(
                "/api/sessions",
                &json!({"workspace": "demo", "prompt": "the cut task, in full"}),
            )
        });
        let id = until("the session row", || {
            let list = served.http.get("/api/sessions").body;
            list.as_array()?
                .iter()
                .find(|s| s["status"] == "starting")
                .and_then(|s| s["id"].as_str().map(str::to_owned))
        });
        drop(served); // a graceful shutdown, mid-handshake
        let cut = starting.join().expect("start thread");
        assert_ne!(cut.status, 201, "{}", cut.text);
        id
    };
    let served = Served::on(&layout);
    let http = &served.http;
    let ended = http.get(&format!("/api/sessions/{id}")).body;
    assert_eq!(ended["status_reason"], "server_shutdown", "{ended}");
    assert_eq!(ended["revivable"], true, "{ended}");
    let r = http.post(&format!("/api/sessions/{id}/revive"), &json!({}));
    assert_eq!(r.status, 200, "{}", r.text);
    let t = http.until_transcript(&id, "did it");
    assert_eq!(t.matches("prompt: the cut task, in full").count(), 1, "{t}");
}

#[test]
fn a_crashed_session_is_revived_once_its_agent_is_fixed() {
    let layout = Layout::new(&Setup::default());
    let agent = AgentScript::install(&layout);
    let served = Served::on(&layout);
    let http = &served.http;
    let id = sid(&http.start("the task"));
    http.until_transcript(&id, "ok");
    // A config edit breaks the agent; its restarts fail until the budget
    // is spent and the session ends crashed.
    agent.set("echo 'fatal: bad flag' >&2; exit 3");
    let r = http.post(&format!("/api/sessions/{id}/restart"), &json!({}));
    assert_eq!(r.status, 202, "{}", r.text);
    let crashed = http.until_status(&id, "crashed");
    assert_eq!(crashed["revivable"], true, "{crashed}");
    // Steering it says what to do.
    let r = http.post(
        &format!("/api/sessions/{id}/prompt"),
        &json!({"text": "are you there?"}),
    );
    assert_eq!(r.status, 409, "{}", r.text);
    assert!(r.text.contains("revive"), "{}", r.text);
    // Not fixed yet: the revive fails and it stays crashed, revivable.
    let r = http.post(&format!("/api/sessions/{id}/revive"), &json!({}));
    assert_eq!(r.status, 502, "{}", r.text);
    let still = http.until_status(&id, "crashed");
    assert_eq!(still["status_reason"], crashed["status_reason"], "{still}");
    // Fixed: the same session comes back and takes a prompt.
    agent.runs_the_agent();
    let r = http.post(&format!("/api/sessions/{id}/revive"), &json!({}));
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["status"], "active", "{}", r.text);
    assert_eq!(r.body["revivable"], false, "{}", r.text);
    takes_a_prompt_once_revived(http, &id);
}
