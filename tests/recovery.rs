//! The real binary as a child process: restart recovery after SIGKILL,
//! graceful SIGTERM, the generated token file, and refusing a second
//! instance (database locked) or a taken port.

mod common;

use std::io::Read;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{Http, Layout, Setup, WAIT, free_port, serve_command, until};
use serde_json::{Value, json};

/// `agent-intercom serve` as a child process; its stderr goes to a file.
struct ServerProcess {
    child: Child,
    log: std::path::PathBuf,
}

impl ServerProcess {
    fn spawn(layout: &Layout, name: &str) -> ServerProcess {
        let log = layout.dir.path().join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log).expect("log file");
        let child = serve_command(&layout.config)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn agent-intercom serve");
        ServerProcess { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit by itself; returns its status.
    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "server did not exit:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stdout(&mut self) -> String {
        let mut out = String::new();
        if let Some(mut pipe) = self.child.stdout.take() {
            pipe.read_to_string(&mut out).expect("read stdout");
        }
        out
    }

    fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.child.id()).expect("pid");
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(pid, sig) };
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_healthy(http: &Http, server: &mut ServerProcess) {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(r) = http.try_get("/healthz")
            && r.status == 200
        {
            return;
        }
        if let Some(status) = server.child.try_wait().expect("try_wait") {
            panic!(
                "server exited ({status}) before it was healthy:\n{}",
                server.log()
            );
        }
        assert!(
            Instant::now() < deadline,
            "server never became healthy:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn group_alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// Waits for an agent's process group to be gone; kills it and fails otherwise.
fn expect_group_gone(pgid: i32, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while group_alive(pgid) {
        if Instant::now() >= deadline {
            // SAFETY: kill(2) on a process group the test started through the server.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            panic!("agent process group {pgid} outlived {why}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn two_permissions() -> Value {
    json!({"turns": [[
        {"chunk": "step one. "},
        {"permission": {"tool_call_id": "p1", "title": "First step"}},
        {"permission": {"tool_call_id": "p2", "title": "Second step"}},
        {"chunk": "done."}
    ]]})
}

fn setup_on(port: u16, extra_agents: Vec<String>) -> Setup {
    Setup {
        scenario: two_permissions(),
        bind: format!("127.0.0.1:{port}"),
        extra_agents,
        ..Setup::default()
    }
}

fn start(http: &Http, agent: &str, prompt: &str) -> String {
    let r = http.post(
        "/api/sessions",
        &json!({"workspace": "demo", "prompt": prompt, "agent": agent}),
    );
    assert_eq!(r.status, 201, "{}", r.text);
    r.body["id"].as_str().expect("id").to_owned()
}

fn agent_pid(http: &Http, id: &str) -> i32 {
    let detail = http.get(&format!("/api/sessions/{id}"));
    let pid = detail.body["live"]["agent_pid"]
        .as_i64()
        .expect("agent pid");
    i32::try_from(pid).expect("pid fits")
}

fn read_token(layout: &Layout) -> String {
    let path = layout.database.parent().expect("db dir").join("api-token");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path)
            .expect("token file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "token file mode");
    }
    std::fs::read_to_string(path)
        .expect("token")
        .trim()
        .to_owned()
}

/// A first server on a fresh layout (`setup_on`, no extra agents), healthy,
/// and a client holding its API token.
fn first_server() -> (Layout, ServerProcess, Http) {
    first_server_with(two_permissions())
}

/// [`first_server`], its scripted agent running `scenario`.
fn first_server_with(scenario: Value) -> (Layout, ServerProcess, Http) {
    let port = free_port();
    let layout = Layout::new(&Setup {
        scenario,
        ..setup_on(port, Vec::new())
    });
    let base = format!("http://127.0.0.1:{port}");
    let mut first = ServerProcess::spawn(&layout, "first");
    wait_healthy(&Http::new(&base, None), &mut first);
    let http = Http::new(&base, Some(&read_token(&layout)));
    (layout, first, http)
}

/// SIGKILLs `first` (its agent `pid`'s group goes with it) and starts a
/// second server on the same layout and database, healthy.
fn kill_and_start_again(
    layout: &Layout,
    first: &mut ServerProcess,
    http: &Http,
    pid: i32,
) -> ServerProcess {
    first.signal(libc::SIGKILL);
    first.wait_exit();
    expect_group_gone(pid, "the SIGKILLed server");
    let mut second = ServerProcess::spawn(layout, "second");
    wait_healthy(http, &mut second);
    second
}

#[test]
fn sessions_survive_a_killed_server() {
    let port = free_port();
    let layout = Layout::new(&setup_on(port, vec!["doomed".into()]));
    let base = format!("http://127.0.0.1:{port}");
    let mut first = ServerProcess::spawn(&layout, "first");
    wait_healthy(&Http::new(&base, None), &mut first);
    let token = read_token(&layout);
    assert_eq!(token.len(), 64);
    let http = Http::new(&base, Some(&token));

    // Session A: one decision recorded, then blocked on a second request
    // with steering queued behind it.
    let a = start(&http, "scripted", "resume me");
    http.until_pending(&a, "req-1");
    let decided = http.post(
        &format!("/api/approvals/{a}:req-1"),
        &json!({"option_id": "allow-once"}),
    );
    assert_eq!(decided.status, 200, "{}", decided.text);
    http.until_pending(&a, "req-2");
    let steer = http.post(
        &format!("/api/sessions/{a}/prompt"),
        &json!({"text": "steer after restart"}),
    );
    assert_eq!(
        (steer.status, &steer.body),
        (202, &json!({"queued": true, "paused": false}))
    );
    // Session B: its agent profile will be gone after the restart.
    let b = start(&http, "doomed", "forget me");
    http.until_pending(&b, "req-1");
    let pids = [agent_pid(&http, &a), agent_pid(&http, &b)];

    first.signal(libc::SIGKILL);
    first.wait_exit();
    let out = first.stdout();
    assert!(out.contains("API token (shown once; saved to"), "{out}");
    assert_eq!(out.matches(&token).count(), 1, "{out}");
    assert!(!first.log().contains(&token), "the token is never logged");
    for pid in pids {
        expect_group_gone(pid, "the SIGKILLed server (stdin EOF)");
    }

    layout.write_config(&setup_on(port, Vec::new()));
    let mut second = ServerProcess::spawn(&layout, "second");
    wait_healthy(&http, &mut second);
    let log = second.log();
    assert!(log.contains("1 resuming, 1 interrupted"), "{log}");
    assert!(log.contains("Slack disabled: local operator mode"), "{log}");

    // A: resumed; the decision survived; the open request was expired
    // explicitly; the queued steering was delivered.
    let text = http.until_transcript(&a, "prompt: steer after restart");
    assert!(
        text.contains("Agent restarted: resumed the agent's session."),
        "{text}"
    );
    assert_eq!(
        http.get(&format!("/api/sessions/{a}")).body["status"],
        "active"
    );
    let kept = http.get(&format!("/api/approvals/{a}:req-1"));
    assert_eq!(kept.body["status"], "decided", "{}", kept.text);
    assert_eq!(kept.body["decision"]["option_id"], "allow-once");
    assert_eq!(kept.body["decision"]["decided_by"], "local");
    let expired = http.get(&format!("/api/approvals/{a}:req-2"));
    assert_eq!(expired.body["status"], "expired", "{}", expired.text);
    let late = http.post(
        &format!("/api/approvals/{a}:req-2"),
        &json!({"decision": "approve"}),
    );
    assert_eq!(late.status, 409, "{}", late.text);
    assert!(late.text.contains("server restarted"), "{}", late.text);

    // B: its agent profile is gone, so it is interrupted with a reason.
    let b_now = http.get(&format!("/api/sessions/{b}")).body;
    assert_eq!(b_now["status"], "interrupted", "{b_now}");
    assert!(
        b_now["status_reason"]
            .as_str()
            .is_some_and(|r| r.contains("could not be resumed")
                && r.contains("`doomed` is no longer configured")),
        "{b_now}"
    );
    assert_eq!(
        http.get(&format!("/api/approvals/{b}:req-1")).body["status"],
        "expired"
    );
    // Its transcript says so too, naming the request that expired.
    let b_text = http.until_transcript(&b, "could not be resumed");
    assert!(
        b_text.contains("`doomed` is no longer configured") && b_text.contains("req-1 expired"),
        "{b_text}"
    );

    // The resumed agent keeps working: its new turn asks again, and that
    // request can be decided.
    // Graceful stop: SIGTERM, exit 0, agents gone.
    let resumed_pid = agent_pid(&http, &a);
    second.signal(libc::SIGTERM);
    let status = second.wait_exit();
    assert!(status.success(), "{status}:\n{}", second.log());
    let out = second.stdout();
    assert!(!out.contains(&token), "printed only once: {out}");
    assert!(!second.log().contains(&token), "the token is never logged");
    expect_group_gone(resumed_pid, "a graceful shutdown");
}

/// An operator's pause holds steering until someone resumes: a server
/// killed and started again must not lift it and deliver what was held.
#[test]
fn a_pause_outlives_a_killed_server() {
    let (layout, mut first, http) = first_server();
    let a = start(&http, "scripted", "pause me");
    http.until_pending(&a, "req-1");
    let paused = http.post(&format!("/api/sessions/{a}/pause"), &json!({}));
    assert_eq!(paused.status, 200, "{}", paused.text);
    let held = http.post(
        &format!("/api/sessions/{a}/prompt"),
        &json!({"text": "held for later"}),
    );
    assert_eq!(
        (held.status, &held.body),
        (202, &json!({"queued": true, "paused": true}))
    );
    let pid = agent_pid(&http, &a);
    let _second = kill_and_start_again(&layout, &mut first, &http, pid);
    let text = http.until_transcript(&a, "Still paused");
    assert!(!text.contains("prompt: held for later"), "{text}");
    // The recovery notice says the steering stays held, not that it is
    // delivered once the agent is back.
    assert!(
        text.contains("its 1 queued instruction(s) stay held: it is paused"),
        "{text}"
    );
    let live = http.get(&format!("/api/sessions/{a}")).body;
    assert_eq!(live["status"], "active", "{live}");
    assert_eq!(live["live"]["paused"], true, "{live}");
    assert_eq!(live["live"]["queued_prompts"], 1, "{live}");

    let resumed = http.post(&format!("/api/sessions/{a}/resume"), &json!({}));
    assert_eq!(resumed.status, 200, "{}", resumed.text);
    http.until_transcript(&a, "prompt: held for later");
    assert_eq!(
        http.get(&format!("/api/sessions/{a}")).body["live"]["paused"],
        false
    );
}

/// A turn that a killed server cut after its approval was answered is
/// continued once the session is resumed, as after a crash: the approved
/// action has not run yet. A probe had such a turn dropped silently, the
/// session idle and nobody told.
#[test]
fn a_turn_cut_by_a_killed_server_is_continued() {
    let (layout, mut first, http) = first_server_with(json!({"turns": [[
        {"permission": {"tool_call_id": "p1", "title": "Edit a"}},
        {"chunk": "approved, now working. "},
        {"sleep_ms": 60000},
        {"chunk": "never reached"}
    ]]}));
    let a = start(&http, "scripted", "work");
    http.until_pending(&a, "req-1");
    let approved = http.post(
        &format!("/api/approvals/{a}:req-1"),
        &json!({"decision": "approve"}),
    );
    assert_eq!(approved.status, 200, "{}", approved.text);
    http.until_transcript(&a, "approved, now working");
    let pid = agent_pid(&http, &a);
    let _second = kill_and_start_again(&layout, &mut first, &http, pid);
    http.until_transcript(&a, "asked to continue its turn");
    // The resumed agent is prompted again (the scripted agent echoes each
    // prompt it gets): once for "work", once to continue.
    until("the continue prompt to reach the agent", || {
        (http.transcript(&a).matches("prompt: ").count() >= 2).then_some(())
    });
}

/// A cut turn with steering queued behind it: once resumed, the steering
/// goes first, and the transcript says so (it used to say the agent was
/// asked to continue, which did not happen).
#[test]
fn queued_steering_goes_first_after_a_killed_server_and_is_told() {
    let (layout, mut first, http) = first_server_with(json!({"turns": [[
        {"chunk": "working. "},
        {"sleep_ms": 60000}
    ]]}));
    let a = start(&http, "scripted", "work");
    http.until_transcript(&a, "working.");
    let queued = http.post(
        &format!("/api/sessions/{a}/prompt"),
        &json!({"text": "and then this"}),
    );
    assert_eq!(queued.status, 202, "{}", queued.text);
    let pid = agent_pid(&http, &a);
    let _second = kill_and_start_again(&layout, &mut first, &http, pid);
    let text = http.until_transcript(&a, "prompt: and then this");
    assert!(
        text.contains("its 1 queued instruction(s) are delivered"),
        "{text}"
    );
    assert!(!text.contains("asked to continue its turn"), "{text}");
    assert_eq!(text.matches("prompt: and then this").count(), 1, "{text}");
}

/// After a restart the session's new requests must not reuse the ids of
/// stored ones. Ignored until the core continues request numbering after a
/// restart: today the new actor starts again at `req-1`, the insert hits the
/// primary key of the stored `req-1`, and the agent's permission request is
/// answered with a storage error.
#[test]
fn requests_after_a_restart_get_fresh_ids() {
    let (layout, mut first, http) = first_server();
    let a = start(&http, "scripted", "before");
    http.until_pending(&a, "req-1");
    let r = http.post(
        &format!("/api/approvals/{a}:req-1"),
        &json!({"decision": "approve"}),
    );
    assert_eq!(r.status, 200, "{}", r.text);
    http.until_pending(&a, "req-2");
    let pid = agent_pid(&http, &a);
    let _second = kill_and_start_again(&layout, &mut first, &http, pid);
    // The agent was waiting on req-2: the transcript says it expired, and
    // the resumed agent is asked to continue its cut turn.
    http.until_transcript(&a, "Its open request req-2 expired");
    http.until_transcript(&a, "Continue working on the current task");
    let r = http.post(
        &format!("/api/sessions/{a}/prompt"),
        &json!({"text": "after"}),
    );
    assert_eq!(r.status, 202, "{}", r.text);
    let fresh = until("a new request in the resumed session", || {
        let r = http.get("/api/approvals?status=pending");
        r.body
            .as_array()
            .and_then(|l| l.iter().find(|x| x["session_id"] == a.as_str()).cloned())
    });
    assert!(
        !["req-1", "req-2"].contains(&fresh["request_id"].as_str().unwrap_or("")),
        "{fresh}"
    );
    let id = fresh["id"].as_str().expect("id");
    let r = http.post(
        &format!("/api/approvals/{id}"),
        &json!({"decision": "approve"}),
    );
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        http.get(&format!("/api/approvals/{a}:req-1")).body["status"],
        "decided"
    );
}

#[test]
fn a_second_instance_or_a_taken_port_is_refused() {
    let port = free_port();
    let layout = Layout::new(&setup_on(port, Vec::new()));
    let mut first = ServerProcess::spawn(&layout, "first");
    wait_healthy(
        &Http::new(&format!("http://127.0.0.1:{port}"), None),
        &mut first,
    );

    let mut locked = ServerProcess::spawn(&layout, "locked");
    let status = locked.wait_exit();
    assert!(!status.success());
    let log = locked.log();
    assert!(
        log.contains("locked by another agent-intercom instance"),
        "{log}"
    );

    let other = Layout::new(&setup_on(port, Vec::new()));
    let mut taken = ServerProcess::spawn(&other, "taken");
    let status = taken.wait_exit();
    assert!(!status.success());
    let log = taken.log();
    assert!(
        log.contains(&format!(
            "cannot listen on 127.0.0.1:{port}: address in use; is another agent-intercom running?"
        )),
        "{log}"
    );
    assert!(log.contains("change [server] bind"), "{log}");
    // It made no token: the next start, the one that runs, shows it.
    let token = agent_intercom::http::auth::token_path(&other.database);
    assert!(!token.exists(), "{} exists", token.display());
    drop(first);
}

/// Running: the process exists and is not a zombie (a dead agent whose new
/// parent, the machine's init, has not reaped it yet counts as gone).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = stat.rsplit_once(')')?.1.to_owned();
            rest.split_whitespace().next().map(str::to_owned)
        })
        .is_some_and(|state| state != "Z" && state != "X")
}

/// SIGHUP (a closed terminal, or `kill -HUP` meant as "reload") ended the
/// server at once, without the graceful stop. It is logged and ignored.
#[test]
fn a_hangup_is_logged_and_ignored() {
    let (_layout, mut server, http) = first_server();
    server.signal(libc::SIGHUP);
    until("the hangup logged", || {
        server
            .log()
            .contains("SIGHUP received and ignored")
            .then_some(())
    });
    assert_eq!(http.get("/healthz").status, 200, "{}", server.log());
    server.signal(libc::SIGTERM);
    let status = server.wait_exit();
    assert_eq!(status.code(), Some(0), "{status}:\n{}", server.log());
}

#[test]
fn a_second_signal_exits_at_once_and_leaves_no_agent_running() {
    let port = free_port();
    let layout = Layout::new(&Setup {
        // Agents that stay up after their stdin closes.
        scenario: json!({"turns": [[{"chunk": "working"}, {"ignore_sigterm": true}, {"hang": true}]]}),
        bind: format!("127.0.0.1:{port}"),
        ..Setup::default()
    });
    let base = format!("http://127.0.0.1:{port}");
    let mut server = ServerProcess::spawn(&layout, "first");
    wait_healthy(&Http::new(&base, None), &mut server);
    let http = Http::new(&base, Some(&read_token(&layout)));
    let ids: Vec<String> = (0..3)
        .map(|i| start(&http, "scripted", &format!("hang {i}")))
        .collect();
    for id in &ids {
        http.until_transcript(id, "working");
    }
    let pids: Vec<i32> = ids.iter().map(|id| agent_pid(&http, id)).collect();

    server.signal(libc::SIGTERM);
    until("the graceful stop to begin", || {
        server
            .log()
            .contains("shutting down gracefully")
            .then_some(())
    });
    server.signal(libc::SIGTERM);
    let status = server.wait_exit();
    assert_eq!(status.code(), Some(130), "{status}:\n{}", server.log());
    for pid in pids {
        until(
            &format!("agent {pid} to be gone after the immediate exit"),
            || (!running(pid)).then_some(()),
        );
    }
}

/// A data directory deleted under the running server: SQLite would go on
/// writing into the unlinked file, so a probe's approvals were answered 200
/// and its steering 202 while nothing of it would survive a restart, and
/// `/healthz` said `ok`. Now nothing more is taken: the approval is refused
/// (503, saying the file was deleted and what to do), the agent is not
/// answered, and `/healthz` is `unavailable` with the reason.
#[test]
fn a_deleted_database_takes_nothing_more_and_says_so() {
    let (layout, _server, http) = first_server();
    let a = start(&http, "scripted", "work");
    http.until_pending(&a, "req-1");
    let dir = layout.database.parent().expect("db dir");
    std::fs::remove_dir_all(dir).expect("delete the data directory");

    let approved = http.post(
        &format!("/api/approvals/{a}:req-1"),
        &json!({"decision": "approve"}),
    );
    assert_eq!(approved.status, 503, "{}", approved.text);
    assert!(approved.text.contains("was deleted"), "{}", approved.text);
    let steer = http.post(
        &format!("/api/sessions/{a}/prompt"),
        &json!({"text": "more"}),
    );
    assert_eq!(steer.status, 503, "{}", steer.text);

    let health = http.get("/healthz");
    assert_eq!(health.status, 503, "{}", health.text);
    assert_eq!(health.body["status"], "unavailable", "{}", health.text);
    assert!(
        health.body["storage_error"]
            .as_str()
            .unwrap_or_default()
            .contains("restart the server"),
        "{}",
        health.text
    );
    // Without the token: unavailable, and the reason (it names the path)
    // left out.
    let open = Http::new(&http.base, None).get("/healthz");
    assert_eq!(open.body["status"], "unavailable", "{}", open.text);
    assert!(
        !open.text.contains(&*layout.database.to_string_lossy()),
        "{}",
        open.text
    );
    // Nothing was decided, not even in the file the server still holds open.
    let request = http.get(&format!("/api/approvals/{a}:req-1"));
    assert_eq!(request.body["status"], "pending", "{}", request.text);
}

/// A crash loop given up is in the server's log, not only in the session's
/// status: an operator without Slack watching the journal saw each crash
/// as the same warning and never the end.
#[test]
fn a_crash_loop_given_up_is_logged() {
    let (_layout, server, http) = first_server_with(json!({"turns": [[{"exit": 5}]]}));
    let a = start(&http, "scripted", "work");
    until("the session to be given up", || {
        (http.get(&format!("/api/sessions/{a}")).body["status"] == "crashed").then_some(())
    });
    let log = server.log();
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains(&a) && l.contains("Restart budget spent")),
        "{log}"
    );
}

/// A session resumed after a server restart that later crashes is a crash
/// like any other: its restarts run under the supervision budget. Its
/// "recovering" mark used to stay, so the first failed restart ended it as
/// "could not resume after a server restart". Here the restarts fail
/// because the reloaded config points the agent's profile at a missing
/// command.
#[test]
fn a_resumed_session_that_crashes_later_is_restarted_under_supervision() {
    let (layout, mut first, http) = first_server_with(json!({"turns": [[
        {"chunk": "working. "},
        {"sleep_ms": 60000}
    ]]}));
    let a = start(&http, "scripted", "work");
    http.until_transcript(&a, "working.");
    let pid = agent_pid(&http, &a);
    let second = kill_and_start_again(&layout, &mut first, &http, pid);
    until("the session to be resumed", || {
        let s = http.get(&format!("/api/sessions/{a}"));
        (s.body["status"] == "active" && s.body["live"]["agent_pid"].as_i64().is_some())
            .then_some(())
    });
    let text = std::fs::read_to_string(&layout.config).expect("config");
    let agent = common::agent_bin().display().to_string();
    std::fs::write(
        &layout.config,
        text.replace(&agent, "/nonexistent/agent-intercom-moved-away"),
    )
    .expect("edit the config");
    until("the reload", || {
        second.log().contains("config reloaded").then_some(())
    });
    // SAFETY: kill(2) on the agent the server started for this test.
    unsafe { libc::kill(agent_pid(&http, &a), libc::SIGKILL) };
    let ended = until("the session to end", || {
        let s = http.get(&format!("/api/sessions/{a}"));
        (s.body["status"] != "active" && s.body["status"] != "starting").then_some(s.body)
    });
    assert_eq!(ended["status"], "crashed", "{ended}");
    let reason = ended["status_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("gave up after 3 restarts"), "{reason}");
}

/// A reload that changes what takes a restart (`[server] bind`) is shown on
/// `/healthz`: `ctl` already follows the file, and a probe's `ctl` said the
/// server was down while it ran on its old address.
#[test]
fn a_reload_that_moves_the_address_shows_a_restart_is_needed() {
    let (layout, server, http) = first_server();
    let health = http.get("/healthz");
    assert!(
        health.body.get("restart_needed").is_none(),
        "{}",
        health.text
    );
    let text = std::fs::read_to_string(&layout.config).expect("config");
    let bind = text
        .lines()
        .find(|l| l.trim_start().starts_with("bind"))
        .expect("a bind line")
        .to_owned();
    let moved = format!("bind = \"127.0.0.1:{}\"", free_port());
    std::fs::write(&layout.config, text.replace(&bind, &moved)).expect("edit the config");
    until("the reload", || {
        server.log().contains("that takes a restart").then_some(())
    });
    let health = http.get("/healthz");
    assert_eq!(health.status, 200, "{}", health.text);
    assert_eq!(health.body["config"], "ok", "{}", health.text);
    assert_eq!(
        health.body["restart_needed"],
        json!(["[server] bind"]),
        "{}",
        health.text
    );
}

/// Deleting every `[[rule]]` from the file: the allow rule the operator
/// deleted stops allowing (a probe's stayed in force, the reload refused as
/// a file caught being written), the deny rule is kept until the file
/// declares a rule again, and `/healthz` says so.
#[test]
fn deleting_every_rule_drops_the_allow_rules_and_keeps_the_deny_rules() {
    let (layout, server, http) = first_server();
    let text = std::fs::read_to_string(&layout.config).expect("config");
    let rules = "\n[[rule]]\nid = \"allow-edits\"\naction = \"allow\"\nkind = \"edit\"\npaths = [\"**\"]\n\
                 \n[[rule]]\nid = \"no-rm\"\naction = \"deny\"\nkind = \"execute\"\ncommand_prefix = \"rm \"\n";
    std::fs::write(&layout.config, format!("{text}{rules}")).expect("add the rules");
    let ids = config_rule_ids;
    until("both rules in force", || {
        (ids(&http) == ["allow-edits", "no-rm"]).then_some(())
    });
    std::fs::write(&layout.config, &text).expect("delete the rules");
    until("the partial reload", || {
        server
            .log()
            .contains("config change applied in part")
            .then_some(())
    });
    assert_eq!(ids(&http), ["no-rm"]);
    let health = http.get("/healthz");
    assert_eq!(health.body["config"], "stale", "{}", health.text);
}

/// A reload that removes the workspace a live session runs in tells that
/// session: it runs on, but a server restart cannot resume it (a probe's
/// reload said only "config reloaded"). One that puts it back says so, and
/// one that moves it to another directory warns again.
#[test]
fn a_reload_that_removes_a_live_sessions_workspace_tells_it() {
    let (layout, server, http) = first_server();
    let text = std::fs::read_to_string(&layout.config).expect("config");
    let extra_dir = layout.root.join("extra");
    std::fs::create_dir_all(&extra_dir).expect("extra");
    let extra = format!(
        "\n[[workspace]]\nid = \"extra\"\npath = {:?}\n",
        extra_dir.display().to_string()
    );
    std::fs::write(&layout.config, format!("{text}{extra}")).expect("add extra");
    let started = until("the extra workspace", || {
        let r = http.post(
            "/api/sessions",
            &json!({"workspace": "extra", "prompt": "hi"}),
        );
        (r.status == 201).then_some(r)
    });
    let id = started.body["id"].as_str().expect("id").to_owned();
    std::fs::write(&layout.config, &text).expect("remove extra");
    let removed = "cannot be resumed after a server restart, nor revived once it ends: its workspace `extra` is no longer configured";
    until("the notice", || {
        server.log().contains(removed).then_some(())
    });
    let s = http.get(&format!("/api/sessions/{id}"));
    assert_eq!(s.body["status"], "active", "it runs on: {}", s.text);
    // Kept in the transcript too, for an operator who was not watching.
    http.until_transcript(&id, removed);
    // Put back, the warning is withdrawn in the same place.
    std::fs::write(&layout.config, format!("{text}{extra}")).expect("extra again");
    http.until_transcript(&id, "The config allows this session again");
    // Put back somewhere else, the session could not come back where it
    // ran: that is told as well (it once read "as before").
    let elsewhere = layout.root.join("extra2");
    std::fs::create_dir_all(&elsewhere).expect("extra2");
    let moved = extra.replace(
        &format!("{:?}", extra_dir.display().to_string()),
        &format!("{:?}", elsewhere.display().to_string()),
    );
    assert_ne!(moved, extra);
    std::fs::write(&layout.config, format!("{text}{moved}")).expect("move extra");
    http.until_transcript(&id, "is no longer in workspace `extra`");
    // Moved and its agent's protocol changed: putting the directory back
    // tells the reason that remains (it said nothing).
    let agent = "[[agent]]\nid = \"scripted\"\n";
    let intercom = format!("{agent}protocol = \"intercom\"\n");
    assert!(text.contains(agent));
    let both = format!("{}{moved}", text.replace(agent, &intercom));
    let reloads = server.log().matches("config reloaded").count();
    std::fs::write(&layout.config, &both).expect("the protocol too");
    until("the protocol change applied", || {
        (server.log().matches("config reloaded").count() > reloads).then_some(())
    });
    let back = format!("{}{extra}", text.replace(agent, &intercom));
    std::fs::write(&layout.config, &back).expect("the directory back");
    http.until_transcript(&id, "its agent `scripted` now speaks intercom");
}

/// The config's own rules now in force, by id.
fn config_rule_ids(http: &Http) -> Vec<String> {
    http.get("/api/rules")
        .body
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|r| r["source"] == "config")
        .filter_map(|r| r["id"].as_str().map(str::to_owned))
        .collect()
}

/// A save caught half-way is a valid prefix of the file, and a prefix can
/// only lose lines: an allow rule's `command_regex`, a deny rule further
/// down (a probe's `git push --force` was allowed in that window). Such a
/// change is held until the file has gone unchanged for 10 s: a file
/// finished meanwhile is never applied cut, and one left as it is applies.
#[test]
fn a_reload_that_loosens_waits_for_the_file_to_settle() {
    let (layout, server, http) = first_server();
    let text = std::fs::read_to_string(&layout.config).expect("config");
    let allow = "\n[[rule]]\nid = \"git-readonly\"\naction = \"allow\"\nkind = \"execute\"\ncommand_prefix = \"git \"\n";
    let regex = "command_regex = '^git (status|diff|log)\\b'\n";
    let deny = "\n[[rule]]\nid = \"no-force-push\"\naction = \"deny\"\nkind = \"execute\"\ncommand_regex = '^git\\s+push'\n";
    let whole = format!("{text}{allow}{regex}{deny}");
    let cut = format!("{text}{allow}");
    let reloads = |server: &ServerProcess| server.log().matches("config reloaded").count();
    std::fs::write(&layout.config, &whole).expect("write the rules");
    until("both rules in force", || {
        (config_rule_ids(&http) == ["git-readonly", "no-force-push"]).then_some(())
    });
    let before = reloads(&server);
    // The writer stalls after the allow rule's first lines...
    std::fs::write(&layout.config, &cut).expect("the first part");
    until("the change held", || {
        server
            .log()
            .contains("deny rule no-force-push removed or changed")
            .then_some(())
    });
    assert_eq!(config_rule_ids(&http), ["git-readonly", "no-force-push"]);
    // `/healthz` says a change is held, and (with the token) what it is.
    let held = until("healthz says held", || {
        let h = http.get("/healthz");
        (h.body["config"] == "held").then_some(h)
    });
    let what = held.body["config_held"].as_str().unwrap_or_default();
    assert!(what.contains("deny rule no-force-push"), "{}", held.text);
    let anonymous = Http::new(&http.base, None).get("/healthz");
    assert_eq!(anonymous.body["config"], "held", "{}", anonymous.text);
    assert!(
        !anonymous.text.contains("no-force-push"),
        "{}",
        anonymous.text
    );
    // ... and finishes: the whole file is what is applied.
    std::fs::write(&layout.config, &whole).expect("the rest");
    until("the whole file applied", || {
        (reloads(&server) > before).then_some(())
    });
    assert_eq!(reloads(&server), before + 1, "{}", server.log());
    assert_eq!(config_rule_ids(&http), ["git-readonly", "no-force-push"]);
    let applied = http.get("/healthz");
    assert_eq!(applied.body["config"], "ok", "{}", applied.text);
    assert!(
        applied.body.get("config_held").is_none(),
        "{}",
        applied.text
    );
    // Left as it is, a removal applies once the file has settled.
    std::fs::write(&layout.config, format!("{text}{allow}{regex}")).expect("remove the deny rule");
    until("the deny rule removed", || {
        (config_rule_ids(&http) == ["git-readonly"]).then_some(())
    });
}

/// A save that adds a deny rule together with a looser change is held as a
/// whole, but its deny rule holds at once (probe W's waited the whole hold).
#[test]
fn a_deny_rule_saved_with_a_looser_change_holds_at_once() {
    let (layout, server, http) = first_server();
    let text = std::fs::read_to_string(&layout.config).expect("config");
    let allow = "\n[[rule]]\nid = \"git-any\"\naction = \"allow\"\nkind = \"execute\"\ncommand_prefix = \"git \"\n";
    let deny = "\n[[rule]]\nid = \"no-rm\"\naction = \"deny\"\nkind = \"execute\"\ncommand_prefix = \"rm \"\n";
    std::fs::write(&layout.config, format!("{text}{allow}{deny}")).expect("both rules");
    until("the change held", || {
        server
            .log()
            .contains("allow rule git-any added or changed")
            .then_some(())
    });
    assert_eq!(config_rule_ids(&http), ["no-rm"]);
    until("the whole file applied", || {
        (config_rule_ids(&http) == ["git-any", "no-rm"]).then_some(())
    });
}

/// An `approval_mode` that asks more reaches the workspace's live sessions
/// that ask less (a probe's session kept `auto` and ran `git push --force`
/// after the file said `ask`), and each says so in its transcript.
#[test]
fn a_stricter_approval_mode_in_the_config_reaches_live_sessions() {
    let (layout, server, http) = first_server();
    let text = std::fs::read_to_string(&layout.config).expect("config");
    let ws = "[[workspace]]\nid = \"demo\"\n";
    let auto = text.replace(ws, &format!("{ws}approval_mode = \"auto\"\n"));
    assert_ne!(auto, text);
    let reloads = |server: &ServerProcess| server.log().matches("config reloaded").count();
    let before = reloads(&server);
    std::fs::write(&layout.config, &auto).expect("auto");
    until("the looser mode applied", || {
        (reloads(&server) > before).then_some(())
    });
    let id = start(&http, "scripted", "go");
    let mode = |http: &Http| http.get(&format!("/api/sessions/{id}")).body["approval_mode"].clone();
    assert_eq!(mode(&http), "auto");
    http.until_transcript(&id, "done.");
    std::fs::write(&layout.config, &text).expect("back to ask");
    until("the session asks again", || {
        (mode(&http) == "ask").then_some(())
    });
    http.until_transcript(&id, "Approval mode is now ask (set by config).");
}

/// A valid config can still name an agent binary that is not there: the
/// reload warns in the log, and `/healthz` counts it (a walk-through saw
/// `"config": "ok"` and nothing else after such an edit). The texts, which
/// name paths, go only to a caller with the token.
#[test]
fn a_config_naming_a_missing_agent_is_counted_on_healthz() {
    let (layout, server, http) = first_server();
    let before = http.get("/healthz");
    let texts = |h: &common::Reply| {
        h.body["config_warning_texts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    assert!(
        texts(&before)
            .iter()
            .all(|w| !w.to_string().contains("agent-intercom-moved-away")),
        "{}",
        before.text
    );
    let count = before.body["config_warnings"].as_u64().expect("a count");
    let text = std::fs::read_to_string(&layout.config).expect("config");
    let agent = common::agent_bin().display().to_string();
    let gone = "/nonexistent/agent-intercom-moved-away";
    std::fs::write(&layout.config, text.replace(&agent, gone)).expect("edit the config");
    until("the reload", || {
        server.log().contains("config reloaded").then_some(())
    });
    let health = http.get("/healthz");
    assert_eq!(health.body["config"], "ok", "{}", health.text);
    assert_eq!(health.body["config_warnings"], count + 1, "{}", health.text);
    assert!(
        texts(&health)
            .iter()
            .any(|w| w.as_str().is_some_and(|w| w.contains(gone))),
        "{}",
        health.text
    );
    let anonymous = Http::new(&http.base, None).get("/healthz");
    assert_eq!(
        anonymous.body["config_warnings"],
        count + 1,
        "{}",
        anonymous.text
    );
    assert!(
        anonymous.body.get("config_warning_texts").is_none(),
        "{}",
        anonymous.text
    );
}

/// Starts "write the report" on a first server, waits for `seen` in its
/// transcript, then kills that server and starts a second on the same
/// database (kept alive by the caller).
fn killed_in_a_turn(layout: &Layout, port: u16, seen: &str) -> (Http, String, ServerProcess) {
    let base = format!("http://127.0.0.1:{port}");
    let mut first = ServerProcess::spawn(layout, "first");
    wait_healthy(&Http::new(&base, None), &mut first);
    let http = Http::new(&base, Some(&read_token(layout)));
    let a = start(&http, "scripted", "write the report");
    http.until_transcript(&a, seen);
    let pid = agent_pid(&http, &a);
    let second = kill_and_start_again(layout, &mut first, &http, pid);
    (http, a, second)
}

/// The contents of a session's newest `limit` transcript entries.
fn contents(http: &Http, id: &str, limit: usize) -> Option<Vec<String>> {
    let page = http.get(&format!("/api/sessions/{id}/messages?limit={limit}"));
    Some(
        page.body
            .as_array()?
            .iter()
            .filter_map(|m| m["content"].as_str().map(str::to_owned))
            .collect(),
    )
}

/// An ACP agent that fails to load its session (it lost it with its
/// process, as Claude Code and Gemini CLI do), killed with the server in
/// its first turn: the restarted server starts a fresh session and gives
/// it the cut turn's prompt. It gave nothing, after saying the agent would
/// be asked to continue, and the session's task was lost.
#[test]
fn a_fresh_acp_agent_after_a_server_kill_gets_the_cut_turns_prompt() {
    let port = free_port();
    let layout = Layout::new(&Setup {
        scenario: json!({"load_error": "Invalid session identifier", "turns": [[
            {"chunk": "working on it. "},
            {"sleep_ms": 60000}
        ]]}),
        ..setup_on(port, Vec::new())
    });
    let (http, a, _second) = killed_in_a_turn(&layout, port, "working on it.");
    until("the cut turn's prompt given to the fresh agent", || {
        let t = contents(&http, &a, 500)?;
        let fresh = t
            .iter()
            .rposition(|c| c.contains("cannot resume, so it started a fresh session"))?;
        let given = fresh + t[fresh..].iter().position(|c| *c == "write the report")?;
        t[given..]
            .iter()
            .any(|c| c.contains("working on it."))
            .then_some(())
    });
}

/// An intercom-dialect session has no turns and no session to load: after
/// the server is killed, its fresh agent is given its last prompt again (as
/// after a crash). It was given nothing, while the transcript said it was
/// asked to continue.
#[test]
fn an_intercom_session_gets_its_last_prompt_again_after_a_server_kill() {
    let port = free_port();
    let layout = Layout::new(&Setup {
        // A busy agent: its status lines push the prompt out of the
        // transcript's newest page (it was then looked for there only).
        scenario: {
            let mut steps = vec![json!({"chunk": "working on it. "})];
            steps.extend((0..1100).map(|_| json!({"chunk": "still busy. "})));
            steps.push(json!({"chunk": "at the end. "}));
            steps.push(json!({"sleep_ms": 60000}));
            json!({"protocol": "intercom", "turns": [steps]})
        },
        ..setup_on(port, Vec::new())
    });
    let text = std::fs::read_to_string(&layout.config).expect("config");
    let text = text.replacen(
        "[[agent]]\nid = \"scripted\"\n",
        "[[agent]]\nid = \"scripted\"\nprotocol = \"intercom\"\n",
        1,
    );
    std::fs::write(&layout.config, text).expect("config");
    let (http, a, _second) = killed_in_a_turn(&layout, port, "at the end.");
    // The whole transcript: the fresh agent's own 1,100 lines soon push the
    // notice out of the newest page.
    until("the last prompt given again", || {
        let t = contents(&http, &a, 5000)?;
        let at = t
            .iter()
            .rposition(|c| c.contains("is given its last prompt again"))?;
        t[at..]
            .iter()
            .any(|c| c.contains("working on it."))
            .then_some(())
    });
}

/// Started on the shipped example for want of `config.toml` (the README's
/// first command), the server reads `config.toml` once it is created, as
/// it reads a save: a probe's deny rule added there was never read, and
/// `/healthz` said "ok" all along. Agents are refused the file it waits for.
#[test]
fn a_config_toml_created_after_starting_on_the_example_is_read() {
    let port = free_port();
    let layout = Layout::new(&setup_on(port, Vec::new()));
    let dir = layout.config.parent().expect("config dir").to_path_buf();
    let example = dir.join("config.toml.example");
    std::fs::rename(&layout.config, &example).expect("only the example");
    let log = layout.dir.path().join("example.log");
    // As the README runs it: no --config, from the directory holding the example.
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_agent-intercom"));
    command
        .arg("serve")
        .current_dir(&dir)
        .env_remove("AGENT_INTERCOM_TOKEN")
        .env_remove("SLACK_BOT_TOKEN")
        .env_remove("SLACK_APP_TOKEN")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).expect("log")));
    let mut server = ServerProcess {
        child: command.spawn().expect("serve"),
        log,
    };
    let base = format!("http://127.0.0.1:{port}");
    wait_healthy(&Http::new(&base, None), &mut server);
    assert!(
        server
            .log()
            .contains("no config.toml; using config.toml.example"),
        "{}",
        server.log()
    );
    let http = Http::new(&base, Some(&read_token(&layout)));
    assert!(config_rule_ids(&http).is_empty());
    let text = std::fs::read_to_string(&example).expect("example");
    let deny = "\n[[rule]]\nid = \"no-curl\"\naction = \"deny\"\nkind = \"execute\"\ncommand_prefix = \"curl \"\n";
    std::fs::write(dir.join("config.toml"), format!("{text}{deny}")).expect("config.toml");
    until("the new file's rule in force", || {
        (config_rule_ids(&http) == ["no-curl"]).then_some(())
    });
    let health = http.get("/healthz");
    assert_eq!(health.body["config"], "ok", "{}", health.text);
}
