//! End-to-end lifecycle tests: the real supervisor and session actors driving
//! the scripted agent as a child process, with in-memory ports.

mod support;

use intercom_actors::model::{MessageKind, RequestStatus, SessionId, SessionStatus};
use intercom_actors::ports::{OperatorEvent, SessionStore};
use intercom_actors::session::{Caller, Choice, SessionMsg, StartError, StopCause};
use intercom_actors::settings::{Limits, StallPolicy, SupervisionPolicy};
use intercom_actors::supervisor::{SupervisorError, SupervisorMsg};
use serde_json::{Value, json};
use support::{
    HOLD_INITIALIZE_UNTIL_GO, Harness, Knobs, decide, decide_as, group_alive, request_opened,
    start_in_background, until_group_gone,
};

fn owner() -> Caller {
    Caller {
        id: "U_OWNER".into(),
        operator: false,
    }
}

/// A rejection's reason reaches an ACP agent: its permission answer holds
/// only the option chosen, so the reason follows as steering once the turn
/// ends, and the transcript says who rejected what and why. "Reject with
/// feedback" asked the operator for words the agent never heard.
#[tokio::test]
async fn a_rejections_reason_reaches_an_acp_agent() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [
        [
            {"tool_call": {"id": "t1", "title": "Write big.bin", "kind": "edit", "status": "pending"}},
            {"permission": {"tool_call_id": "t1", "title": "Write big.bin", "kind": "edit"}},
            {"chunk": "first turn over."}
        ],
        [{"chunk": "heard it."}]
    ]});
    let rec = h.start(scenario, "go").await;
    h.until("permission request", |e| {
        matches!(e, OperatorEvent::RequestOpened { .. })
    })
    .await;
    let caller = intercom_actors::session::Caller {
        id: "U_OWNER".into(),
        operator: false,
    };
    support::decide_as(
        &h,
        &rec.id,
        "req-1",
        Choice::Reject,
        Some("use a smaller file"),
        caller,
    )
    .await
    .expect("decided");
    let text = h.until_transcript(&rec.id, "heard it.").await;
    assert!(
        text.contains("Rejected by U_OWNER: Write big.bin — use a smaller file"),
        "{text}"
    );
    assert!(
        text.contains(
            "prompt: The operator rejected your permission request (req-1) and says: use a smaller file"
        ),
        "{text}"
    );
}

/// A plan is bounded: past 500 entries the rest are counted in one more
/// entry. A probe's plans of 20,000 entries each held its session (and the
/// operator's cancel) for tens of seconds.
#[tokio::test]
async fn a_huge_plan_keeps_its_first_entries_and_counts_the_rest() {
    let h = Harness::new(Knobs::default()).await;
    let entries: Vec<_> = (0..2000)
        .map(|i| json!({"content": format!("step {i}"), "status": "pending", "priority": "low"}))
        .collect();
    let scenario = json!({"turns": [[{"plan": entries}, {"chunk": "planned."}]]});
    let rec = h.start(scenario, "plan").await;
    let shown = h
        .until("the plan", |e| matches!(e, OperatorEvent::Plan { .. }))
        .await;
    let OperatorEvent::Plan { entries, .. } = shown else {
        unreachable!()
    };
    assert_eq!(entries.len(), 501);
    assert_eq!(entries[499].0, "step 499");
    assert_eq!(
        entries[500].0,
        "(1500 more entries of this plan were not kept)"
    );
    h.until_transcript(&rec.id, "planned.").await;
}

#[tokio::test]
async fn happy_path_with_a_permission_round_trip() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[
        {"chunk": "Planning. "},
        {"plan": [{"content": "write it", "status": "in_progress", "priority": "high"}]},
        {"tool_call": {"id": "t1", "title": "Write notes.txt", "kind": "edit", "status": "pending"}},
        {"permission": {"tool_call_id": "t1", "title": "Write notes.txt", "kind": "edit"}},
        {"tool_update": {"id": "t1", "status": "completed"}},
        {"chunk": "Done."}
    ]]});
    let rec = h.start(scenario, "please write notes").await;
    assert_eq!(rec.status, SessionStatus::Active);
    assert_eq!(rec.title, "please write notes");
    let opened = h
        .until("permission request", |e| {
            matches!(e, OperatorEvent::RequestOpened { .. })
        })
        .await;
    let OperatorEvent::RequestOpened { request } = opened else {
        unreachable!()
    };
    assert_eq!(request.request_id, "req-1");
    assert_eq!(request.title, "Write notes.txt");
    assert_eq!(request.options.len(), 4);
    assert_eq!(
        h.store
            .list_requests(Some(&rec.id), true)
            .await
            .expect("list")
            .len(),
        1
    );

    let d = decide_as(
        &h,
        &rec.id,
        "req-1",
        Choice::Option("allow-once".into()),
        None,
        owner(),
    )
    .await
    .expect("decided");
    assert!(d.approved);
    assert_eq!(d.decided_by, "U_OWNER");
    let text = h
        .until_transcript(&rec.id, "permission t1: selected allow-once")
        .await;
    assert!(text.contains("[user:text] please write notes"), "{text}");
    assert!(text.contains("prompt: please write notes"), "{text}");
    let (req, decision) = h
        .store
        .get_request(&request.id)
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(req.status, RequestStatus::Decided);
    assert_eq!(decision.expect("decision").option_id, "allow-once");
    h.until(
        "agent text",
        |e| matches!(e, OperatorEvent::AgentText { text, .. } if text.contains("Done.")),
    )
    .await;
    let text = h
        .until_transcript(&rec.id, "\"status\":\"completed\"")
        .await;
    assert!(text.contains("[system:plan]"), "{text}");
    // A second decision on the same request is refused.
    let again = decide_as(&h, &rec.id, "req-1", Choice::Approve, None, owner()).await;
    assert!(
        matches!(
            again,
            Err(intercom_actors::session::SessionError::AlreadyResolved { .. })
        ),
        "{again:?}"
    );
    assert!(
        h.store
            .audit_entries()
            .iter()
            .any(|a| a.action == "request.decided")
    );
}

/// Pauses the session as its owner.
async fn pause(actor: &ractor::ActorRef<SessionMsg>) {
    ractor::call!(actor, |reply| SessionMsg::Pause {
        caller: owner(),
        reply
    })
    .expect("call")
    .expect("paused");
}

async fn snapshot(
    h: &Harness,
    id: &intercom_actors::model::SessionId,
) -> intercom_actors::session::SessionSnapshot {
    let actor = h.actor(id).await;
    ractor::call!(actor, SessionMsg::Snapshot).expect("snapshot")
}

/// Asks the supervisor to revive `id` with `profile`, as `caller`.
async fn revive(
    h: &Harness,
    id: intercom_actors::model::SessionId,
    profile: intercom_actors::settings::AgentProfile,
    caller: Caller,
) -> Result<intercom_actors::model::SessionRecord, SupervisorError> {
    ractor::call!(h.sup, |reply| SupervisorMsg::Revive {
        id,
        profile,
        caller,
        reply
    })
    .expect("revive call")
}

async fn steer(
    h: &Harness,
    id: &intercom_actors::model::SessionId,
    text: &str,
    interrupt: bool,
) -> intercom_actors::session::SteerOutcome {
    let actor = h.actor(id).await;
    ractor::call!(actor, |reply| SessionMsg::Steer {
        text: text.into(),
        interrupt,
        caller: owner(),
        reply
    })
    .expect("steer call")
    .expect("steer accepted")
}

#[tokio::test]
async fn crash_restart_and_resume_with_session_load() {
    let h = Harness::new(Knobs::default()).await;
    let marker = h.dir.path().join("crashed-once");
    let scenario = json!({
        "load_session": true,
        "on_load": [{"user_chunk": "HISTORY-USER"}, {"chunk": "HISTORY-AGENT"}],
        "turns": [[
            {"chunk": "starting work"},
            {"exit_once": {"code": 7, "marker": marker}},
            {"chunk": "alive after restart"}
        ]]
    });
    let rec = h.start(scenario, "do the thing").await;
    let notice = h
        .until(
            "restart notice",
            |e| matches!(e, OperatorEvent::Notice { text, .. } if text.contains("Restarting")),
        )
        .await;
    let OperatorEvent::Notice { text, .. } = notice else {
        unreachable!()
    };
    assert!(text.contains("exit code 7"), "{text}");
    h.until("resume notice", |e| matches!(e, OperatorEvent::Notice { text, .. } if text.contains("resumed the agent's session")))
        .await;
    // Mid-turn crash + resume: the agent is told to continue.
    let transcript = h.until_transcript(&rec.id, "alive after restart").await;
    assert!(
        !transcript.contains("HISTORY-"),
        "replayed history was stored again:\n{transcript}"
    );
    let stored = h
        .until_record(&rec.id, "active after restart", |r| {
            r.status == SessionStatus::Active && r.restart_count == 1
        })
        .await;
    assert_eq!(
        stored.acp_session_id,
        rec.acp_session_id.clone().or(stored.acp_session_id.clone())
    );
    assert!(
        transcript.contains("agent exited unexpectedly (exit code 7)"),
        "{transcript}"
    );
}

/// A reloaded config's profile is what the next crash restart runs. A probe
/// fixed an agent's `command` while its session ran: every restart still
/// ran the old one, and the error said to fix what was already fixed.
#[tokio::test]
async fn a_crash_restart_runs_the_profile_the_config_has_now() {
    let h = Harness::new(Knobs::default()).await;
    let old = h.profile(json!({"turns": [[
        {"permission": {"tool_call_id": "t1", "title": "Go on"}},
        {"exit": 3}
    ]]}));
    let mut new = h.profile(json!({"turns": [[{"chunk": "the new command runs"}]]}));
    new.id = old.id.clone();
    let rec = h
        .start_req(h.request(old, "work"))
        .await
        .expect("session starts");
    h.until("the request", |e| {
        matches!(e, OperatorEvent::RequestOpened { .. })
    })
    .await;
    h.sup
        .send_message(SupervisorMsg::AgentsChanged(vec![new]))
        .expect("send");
    // A call after the message: the supervisor has taken it.
    let live = ractor::call!(h.sup, SupervisorMsg::LiveCount).expect("live count");
    assert_eq!(live, 1);
    decide(&h, &rec.id, "req-1", Choice::Approve).await;
    h.until_transcript(&rec.id, "the new command runs").await;
}

#[tokio::test]
async fn restart_budget_exhausted_marks_the_session_crashed() {
    let h = Harness::new(Knobs {
        policy: SupervisionPolicy {
            max_restarts: 2,
            restart_window_secs: 600,
            backoff_initial_secs: 0,
            backoff_max_secs: 0,
        },
        ..Knobs::default()
    })
    .await;
    let scenario = json!({"turns": [[{"stderr": "fatal: model exploded"}, {"exit": 1}]]});
    let rec = h.start(scenario, "go").await;
    h.until("session ended", |e| {
        matches!(
            e,
            OperatorEvent::SessionEnded {
                status: SessionStatus::Crashed,
                ..
            }
        )
    })
    .await;
    let stored = h
        .until_record(&rec.id, "crashed", |r| r.status == SessionStatus::Crashed)
        .await;
    assert_eq!(stored.restart_count, 2);
    let reason = stored.status_reason.unwrap_or_default();
    assert!(
        reason.contains("exit code 1") && reason.contains("model exploded"),
        "{reason}"
    );
    assert!(
        reason.ends_with("(gave up after 2 restarts within 600 s)"),
        "{reason}"
    );
    assert_eq!(h.live_count().await, 0);
}

/// Knobs for the stall tests: an alert after 1 s of silence, a nudge
/// ("wake up") every second after it, `max_nudges`, and the grace an
/// ignored cancel gets before the agent is restarted.
fn stall_knobs(max_nudges: u32, grace_secs: u64) -> Knobs {
    let mut knobs = Knobs {
        stall: StallPolicy {
            inactivity_secs: 1,
            escalation_secs: 1,
            max_nudges,
            nudge_text: "wake up".into(),
        },
        ..Knobs::default()
    };
    knobs.limits.shutdown_grace_secs = grace_secs;
    knobs
}

/// A nudge cancels a hung turn and prompts again; an agent that ignores
/// the cancel is restarted after the shutdown grace, as for an interrupt.
/// A probe's hung agent was nudged twice, told each time that its turn was
/// cancelled and it was prompted again, and nothing changed.
#[tokio::test]
async fn a_nudged_agent_that_ignores_the_cancel_is_restarted() {
    let h = Harness::new(stall_knobs(1, 1)).await;
    let m = h.dir.path().join("hung-once");
    let scenario =
        json!({"turns": [[{"chunk": "thinking"}, {"hang_once": m}, {"chunk": "working again"}]]});
    let rec = h.start(scenario, "go").await;
    let text = h.until_transcript(&rec.id, "working again").await;
    assert!(
        text.contains("did not end its turn within 1 s of being cancelled"),
        "{text}"
    );
    assert!(text.contains("prompt: wake up"), "{text}");
    let stored = h
        .until_record(&rec.id, "active", |r| r.status == SessionStatus::Active)
        .await;
    assert_eq!(stored.restart_count, 1);
}

/// The stall policy's own escalation: nudged, then marked stalled (the
/// agent's ignored cancels would restart it only after a grace longer than
/// the escalation).
#[tokio::test]
async fn a_stalled_agent_is_nudged_then_marked_stalled() {
    let h = Harness::new(stall_knobs(2, 60)).await;
    let rec = h
        .start(
            json!({"turns": [[{"chunk": "thinking"}, {"hang": true}]]}),
            "go",
        )
        .await;
    h.until(
        "stall alert",
        |e| matches!(e, OperatorEvent::Notice { text, .. } if text.contains("No activity")),
    )
    .await;
    h.until("stalled", |e| {
        matches!(
            e,
            OperatorEvent::StatusChanged {
                status: SessionStatus::Stalled,
                ..
            }
        )
    })
    .await;
    let nudges = h
        .store
        .audit_entries()
        .iter()
        .filter(|a| a.action == "session.nudged")
        .count();
    assert_eq!(nudges, 2);
    let stored = h
        .store
        .get_session(&rec.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(stored.status, SessionStatus::Stalled);
    assert!(
        stored
            .status_reason
            .unwrap_or_default()
            .contains("2 nudges")
    );
}

#[tokio::test]
async fn malformed_and_two_mib_lines_are_skipped_and_the_session_survives() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[
        {"raw": "this is not json {"},
        {"raw": "{\"jsonrpc\":\"2.0\",\"method\":42}"},
        {"big_line": 2097152},
        {"chunk": "still alive"}
    ]]});
    let rec = h.start(scenario, "go").await;
    let text = h.until_transcript(&rec.id, "still alive").await;
    assert!(text.contains("2097152-byte message"), "{text}");
    assert_eq!(snapshot(&h, &rec.id).await.status, SessionStatus::Active);
}

#[tokio::test]
async fn startup_timeout_fails_the_start_and_leaves_no_record() {
    let h = Harness::new(Knobs {
        limits: Limits {
            startup_timeout_secs: 1,
            ..Knobs::default().limits
        },
        ..Knobs::default()
    })
    .await;
    // A CLI started without its ACP flag: its usage on stdout.
    let scenario = json!({"handshake_delay_ms": 30000,
        "on_start": [{"stderr": "\u{1b}[31merror\u{1b}[39m: waiting for the moon"},
                     {"raw": "Usage: agent [--acp] PROMPT"}, {"raw": "  --acp  speak ACP"}]});
    let req = h.request(h.profile(scenario), "go");
    let err = h.start_req(req).await.expect_err("must time out");
    assert!(
        err.to_string().contains(
            "it wrote 2 lines to stdout that are not JSON-RPC (the first: «Usage: agent [--acp] PROMPT»): is it started in its ACP mode"
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("stderr: error: waiting for the moon"),
        "the operator sees why, without escapes: {err}"
    );
    assert!(
        matches!(
            err,
            SupervisorError::StartFailed(StartError::Timeout { secs: 1, .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("within 1 s"), "{err}");
    // It names the setting, and the step the agent is stuck in.
    assert!(
        err.to_string()
            .contains("(limits.startup_timeout_secs): no answer to `"),
        "{err}"
    );
    assert!(h.store.list_sessions(false).await.expect("list").is_empty());
    assert_eq!(h.live_count().await, 0);
}

#[tokio::test]
async fn a_missing_agent_binary_is_a_clear_error_and_leaves_no_record() {
    let h = Harness::new(Knobs::default()).await;
    let mut profile = h.profile(json!({}));
    profile.command = "/nonexistent/gemini".into();
    let err = h
        .start_req(h.request(profile, "go"))
        .await
        .expect_err("missing binary");
    assert!(
        err.to_string().contains("`/nonexistent/gemini`") && err.to_string().contains("not found"),
        "{err}"
    );
    assert!(h.store.list_sessions(false).await.expect("list").is_empty());
}

#[tokio::test]
async fn the_session_limit_is_enforced() {
    let h = Harness::new(Knobs {
        limits: Limits {
            max_sessions: 1,
            ..Knobs::default().limits
        },
        ..Knobs::default()
    })
    .await;
    let first = h.start(json!({}), "one").await;
    let err = h
        .start_req(h.request(h.profile(json!({})), "two"))
        .await
        .expect_err("limit");
    assert_eq!(err, SupervisorError::LimitReached { max: 1 });
    assert_eq!(h.store.list_sessions(false).await.expect("list").len(), 1);
    // Stopping the first frees the slot.
    let actor = h.actor(&first.id).await;
    ractor::call!(actor, |reply| SessionMsg::Stop {
        cause: StopCause::Operator,
        caller: owner(),
        reply: Some(reply)
    })
    .expect("stop")
    .expect("ok");
    h.until("ended", |e| matches!(e, OperatorEvent::SessionEnded { .. }))
        .await;
    let deadline = tokio::time::Instant::now() + support::WAIT;
    while h.live_count().await != 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::task::yield_now().await;
    }
    h.start(json!({}), "three").await;
}

#[tokio::test]
async fn idle_timeout_completes_the_session() {
    let h = Harness::new(Knobs {
        limits: Limits {
            idle_timeout_secs: 1,
            ..Knobs::default().limits
        },
        ..Knobs::default()
    })
    .await;
    let rec = h.start(json!({"turns": [[{"chunk": "done"}]]}), "go").await;
    let pid = snapshot(&h, &rec.id).await.pid.expect("pid");
    h.until("idle end", |e| {
        matches!(
            e,
            OperatorEvent::SessionEnded {
                status: SessionStatus::Completed,
                ..
            }
        )
    })
    .await;
    let stored = h
        .store
        .get_session(&rec.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(
        (stored.status, stored.status_reason.as_deref()),
        (SessionStatus::Completed, Some("idle_timeout"))
    );
    until_group_gone(pid).await;
}

/// A request waiting for the operator is not idleness: a probe's session
/// was ended "completed" by the idle timeout and its request cancelled.
/// Two idle sessions started after the request opened end first (each
/// idle for the whole timeout after it), and the waiting one is still
/// there; once decided, its clock runs again.
#[tokio::test]
async fn a_request_waiting_for_the_operator_is_not_idle() {
    let h = Harness::new(Knobs {
        limits: Limits {
            idle_timeout_secs: 1,
            ..Knobs::default().limits
        },
        ..Knobs::default()
    })
    .await;
    let waiting = h
        .start(
            json!({"turns": [[{"permission": {"tool_call_id": "t1", "title": "x"}}, {"chunk": "done"}]]}),
            "wait for me",
        )
        .await;
    let request = request_opened(&h, 1).await;
    assert_eq!(request.session_id, waiting.id);
    let ended = |id: SessionId| move |e: &OperatorEvent| matches!(e, OperatorEvent::SessionEnded { session_id, .. } if *session_id == id);
    for n in ["first", "second"] {
        let idle = h.start(json!({"turns": [[{"chunk": "done"}]]}), n).await;
        h.until("an idle session's end", ended(idle.id.clone()))
            .await;
    }
    let stored = h.store.get_session(&waiting.id).await.expect("get");
    assert_eq!(stored.expect("row").status, SessionStatus::Active);
    assert!(
        !h.sink.events().iter().any(ended(waiting.id.clone())),
        "the waiting session ended"
    );
    decide(&h, &waiting.id, &request.id, Choice::Approve).await;
    h.until("the decided session's idle end", ended(waiting.id.clone()))
        .await;
    let stored = h.store.get_session(&waiting.id).await.expect("get");
    assert_eq!(
        stored.map(|s| (s.status, s.status_reason)),
        Some((SessionStatus::Completed, Some("idle_timeout".into())))
    );
}

#[tokio::test]
async fn shutdown_stops_live_sessions_and_kills_stubborn_agents() {
    let h = Harness::new(Knobs::default()).await;
    // One agent that exits on stdin EOF, one that ignores it (hangs).
    let polite = h
        .start(
            json!({"turns": [[{"permission": {"tool_call_id": "t1", "title": "x"}}]]}),
            "a",
        )
        .await;
    let stubborn = h.start(json!({"turns": [[{"hang": true}]]}), "b").await;
    h.until("permission", |e| {
        matches!(e, OperatorEvent::RequestOpened { .. })
    })
    .await;
    let pids = [
        snapshot(&h, &polite.id).await.pid.expect("pid"),
        snapshot(&h, &stubborn.id).await.pid.expect("pid"),
    ];
    ractor::call!(h.sup, SupervisorMsg::Shutdown).expect("shutdown");
    for id in [&polite.id, &stubborn.id] {
        let r = h.store.get_session(id).await.expect("get").expect("row");
        assert_eq!(
            (r.status, r.status_reason.as_deref()),
            (SessionStatus::Cancelled, Some("server_shutdown")),
            "{id}"
        );
    }
    for pid in pids {
        until_group_gone(pid).await;
    }
    // The pending permission was answered cancelled and recorded as such.
    let reqs = h
        .store
        .list_requests(Some(&polite.id), false)
        .await
        .expect("list");
    assert_eq!(reqs[0].status, RequestStatus::Cancelled);
}

/// An agent that ignores SIGTERM and leaves a daemon holding its pipes
/// outlives the shutdown's deadline. Its session is recorded as cancelled
/// all the same: it was stored live, and the next start brought it back.
#[tokio::test]
async fn a_session_left_at_the_shutdown_deadline_is_recorded_cancelled() {
    let mut knobs = Knobs::default();
    knobs.limits.shutdown_grace_secs = 1;
    let h = Harness::new(knobs).await;
    let pid_file = h.workspace.join("escaped.pid");
    let stubborn = h
        .start(
            json!({"turns": [[
                {"ignore_sigterm": true},
                {"escape_group": {"pid_file": pid_file.display().to_string(), "secs": 60, "detach": true}},
                {"chunk": "holding on"},
                {"hang": true}
            ]]}),
            "hold",
        )
        .await;
    h.until_transcript(&stubborn.id, "holding on").await;
    ractor::call!(h.sup, SupervisorMsg::Shutdown).expect("shutdown");
    let r = h
        .store
        .get_session(&stubborn.id)
        .await
        .expect("get")
        .expect("row");
    let escaped: i32 = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(0);
    if escaped > 0 {
        // SAFETY: kill(2) on the daemon this test's agent started.
        unsafe { libc::kill(escaped, libc::SIGKILL) };
    }
    assert_eq!(
        (r.status, r.status_reason.as_deref()),
        (SessionStatus::Cancelled, Some("server_shutdown"))
    );
}

#[tokio::test]
async fn fs_path_escapes_are_refused_and_inside_writes_are_gated() {
    let h = Harness::new(Knobs::default()).await;
    let outside = tempfile::tempdir().expect("outside");
    std::os::unix::fs::symlink(outside.path(), h.workspace.join("link")).expect("symlink");
    let scenario = json!({"turns": [[
        {"write_file": {"path": "../escape.txt", "content": "x"}},
        {"write_file": {"path": "/tmp/agent-intercom-escape.txt", "content": "x"}},
        {"write_file": {"path": "link/escape.txt", "content": "x"}},
        {"read_file": {"path": "/etc/hostname"}},
        {"write_file": {"path": "inside.txt", "content": "hello\n"}}
    ]]});
    let rec = h.start(scenario, "go").await;
    let opened = h
        .until("write approval", |e| {
            matches!(e, OperatorEvent::RequestOpened { .. })
        })
        .await;
    let OperatorEvent::RequestOpened { request } = opened else {
        unreachable!()
    };
    assert_eq!(request.title, "Write inside.txt");
    assert!(
        request
            .diff
            .as_deref()
            .unwrap_or_default()
            .contains("+hello"),
        "{:?}",
        request.diff
    );
    assert!(
        !h.workspace.join("inside.txt").exists(),
        "written before approval"
    );
    decide_as(
        &h,
        &rec.id,
        &request.request_id,
        Choice::Approve,
        None,
        owner(),
    )
    .await
    .expect("approve");
    let text = h.until_transcript(&rec.id, "inside.txt: ok").await;
    // Each refusal: an error to the agent and a notice to the operator.
    assert_eq!(text.matches(": error path").count(), 4, "{text}");
    assert_eq!(
        text.matches("may not use and was refused").count(),
        4,
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(h.workspace.join("inside.txt")).expect("written"),
        "hello\n"
    );
    assert!(!h.dir.path().join("escape.txt").exists());
    assert!(!outside.path().join("escape.txt").exists());
    assert!(!std::path::Path::new("/tmp/agent-intercom-escape.txt").exists());
}

#[tokio::test]
async fn the_server_environment_does_not_leak_into_agents() {
    // SAFETY: set before the agent is spawned; no other code reads it.
    unsafe { std::env::set_var("SLACK_BOT_TOKEN", "xoxb-test-secret") };
    let h = Harness::new(Knobs::default()).await;
    let rec = h
        .start(
            json!({"turns": [[{"echo_env": ["SLACK_BOT_TOKEN", "PATH"]}]]}),
            "go",
        )
        .await;
    let text = h.until_transcript(&rec.id, "env SLACK_BOT_TOKEN").await;
    let text = h.until_transcript(&rec.id, "env PATH").await.max(text);
    assert!(text.contains("env SLACK_BOT_TOKEN unset"), "{text}");
    assert!(!text.contains("xoxb-test-secret"));
}

#[tokio::test]
async fn steering_is_queued_during_a_turn_and_delivered_in_order() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[{"permission": {"tool_call_id": "t1", "title": "gate"}}], [{"chunk": "ok"}]]});
    let rec = h.start(scenario, "first").await;
    h.until("gate", |e| matches!(e, OperatorEvent::RequestOpened { .. }))
        .await;
    assert!(steer(&h, &rec.id, "steer A", false).await.queued);
    assert!(steer(&h, &rec.id, "steer B", false).await.queued);
    assert_eq!(snapshot(&h, &rec.id).await.queued.len(), 2);
    decide_as(&h, &rec.id, "req-1", Choice::Approve, None, owner())
        .await
        .expect("approve");
    let text = h.until_transcript(&rec.id, "prompt: steer B").await;
    let (a, b) = (
        text.find("prompt: steer A").expect("A"),
        text.find("prompt: steer B").expect("B"),
    );
    assert!(a < b, "{text}");
    h.until(
        "idle",
        |e| matches!(e, OperatorEvent::StatusChanged { activity, .. } if activity == "idle"),
    )
    .await;
    // Wait for the turn of B to end before steering again.
    let deadline = tokio::time::Instant::now() + support::WAIT;
    while snapshot(&h, &rec.id).await.turn_running {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::task::yield_now().await;
    }
    assert!(!steer(&h, &rec.id, "steer C", false).await.queued);
    h.until_transcript(&rec.id, "prompt: steer C").await;
    assert!(
        h.store
            .undelivered_steering(&rec.id)
            .await
            .expect("undelivered")
            .is_empty()
    );
}

#[tokio::test]
async fn interrupt_and_steer_cancels_the_turn_first() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[{"permission": {"tool_call_id": "t1", "title": "gate"}}, {"chunk": "after gate"}], [{"chunk": "steered"}]]});
    let rec = h.start(scenario, "first").await;
    h.until("gate", |e| matches!(e, OperatorEvent::RequestOpened { .. }))
        .await;
    assert!(steer(&h, &rec.id, "change course", true).await.queued);
    let text = h.until_transcript(&rec.id, "prompt: change course").await;
    assert!(text.contains("permission t1: cancelled"), "{text}");
    assert!(!text.contains("after gate"), "{text}");
    let reqs = h
        .store
        .list_requests(Some(&rec.id), false)
        .await
        .expect("list");
    assert_eq!(reqs[0].status, RequestStatus::Cancelled);
}

/// ACP's cancellation: the client marks the cut turn's unfinished tool
/// calls cancelled when it sends `session/cancel`; a finished one keeps its
/// status, and so does a call from an earlier turn.
#[tokio::test]
async fn an_interrupt_marks_the_turns_unfinished_tool_calls_cancelled() {
    let h = Harness::new(Knobs::default()).await;
    let tool = |id: &str, status: &str| json!({"tool_call": {"id": id, "title": format!("call {id}"), "kind": "edit", "status": status}});
    let scenario = json!({"turns": [
        [tool("t0", "pending")],
        [tool("t1", "pending"), tool("t2", "in_progress"), tool("t3", "completed"), {"wait_cancel": true}],
        [{"chunk": "steered"}],
    ]});
    let rec = h.start(scenario, "first").await;
    h.until_transcript(&rec.id, "\"t0\"").await;
    // Queued behind the first turn, it starts the second.
    let actor = h.actor(&rec.id).await;
    ractor::call!(actor, |reply| SessionMsg::Steer {
        text: "second".into(),
        interrupt: false,
        caller: owner(),
        reply
    })
    .expect("steer call")
    .expect("steer accepted");
    h.until_transcript(&rec.id, "\"t3\"").await;
    assert!(steer(&h, &rec.id, "change course", true).await.queued);
    h.until_transcript(&rec.id, "steered").await;
    let tools: Vec<Value> = h
        .transcript(&rec.id)
        .await
        .into_iter()
        .filter(|m| m.kind == MessageKind::Tool)
        .map(|m| serde_json::from_str(&m.content).expect("a tool line is JSON"))
        .collect();
    let status = |id: &str| {
        let line = tools.iter().find(|t| t["id"] == id).expect("its line");
        line["status"].as_str().unwrap_or_default().to_owned()
    };
    assert_eq!(status("t1"), "cancelled");
    assert_eq!(status("t2"), "cancelled");
    assert_eq!(status("t3"), "completed");
    assert_eq!(
        status("t0"),
        "pending",
        "another turn's call is not this cancel's"
    );
    h.until("t1 shown cancelled", |e| {
        matches!(e, OperatorEvent::ToolCall { tool_call_id, status, .. }
            if tool_call_id == "t1" && status == "cancelled")
    })
    .await;
}

/// The same status is not shown twice in a row: a probe's event stream
/// showed "active · working" twice at each start.
#[tokio::test]
async fn a_start_shows_each_status_once() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(json!({"turns": [[{"chunk": "done"}]]}), "go").await;
    h.until(
        "idle",
        |e| matches!(e, OperatorEvent::StatusChanged { activity, .. } if activity == "idle"),
    )
    .await;
    let shown: Vec<(String, String)> = h
        .sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            OperatorEvent::StatusChanged {
                session_id,
                status,
                activity,
                ..
            } if session_id == rec.id => Some((status.as_str().to_owned(), activity)),
            _ => None,
        })
        .collect();
    assert!(
        shown.windows(2).all(|w| w[0] != w[1]),
        "a status shown twice in a row: {shown:?}"
    );
    assert!(
        shown.contains(&("active".into(), "working".into())),
        "{shown:?}"
    );
}

#[tokio::test]
async fn auth_required_without_a_method_names_the_offered_methods() {
    let h = Harness::new(Knobs::default()).await;
    let scenario =
        json!({"require_auth": true, "auth_methods": [{"id": "api-key", "name": "API key"}]});
    let err = h
        .start_req(h.request(h.profile(scenario.clone()), "go"))
        .await
        .expect_err("auth");
    let text = err.to_string();
    assert!(
        text.contains("requires authentication") && text.contains("api-key (API key)"),
        "{text}"
    );
    // With auth_method configured it authenticates and starts.
    let mut profile = h.profile(scenario);
    profile.auth_method = Some("api-key".into());
    h.start_req(h.request(profile, "go"))
        .await
        .expect("authenticated start");
}

/// A harness whose prompts time out after one second.
async fn one_second_prompt_timeout() -> Harness {
    Harness::new(Knobs {
        limits: Limits {
            prompt_timeout_secs: 1,
            ..Knobs::default().limits
        },
        ..Knobs::default()
    })
    .await
}

#[tokio::test]
async fn prompt_timeout_is_noted_and_the_session_stays_active() {
    let h = one_second_prompt_timeout().await;
    let rec = h.start(json!({"turns": [[{"hang": true}]]}), "go").await;
    let text = h
        .until_transcript(&rec.id, "has not answered the prompt within 1 s")
        .await;
    assert!(text.contains("stays active"));
    assert_eq!(snapshot(&h, &rec.id).await.status, SessionStatus::Active);
    assert!(group_alive(snapshot(&h, &rec.id).await.pid.expect("pid")));
}

#[tokio::test]
async fn waiting_for_the_operator_does_not_count_against_the_prompt_timeout() {
    let h = one_second_prompt_timeout().await;
    let scenario = json!({"turns": [[
        {"permission": {"tool_call_id": "t1", "title": "gate"}},
        {"chunk": "after the gate"}
    ]]});
    let rec = h.start(scenario, "go").await;
    h.until("gate", |e| matches!(e, OperatorEvent::RequestOpened { .. }))
        .await;
    // The operator takes longer than the timeout to decide: the condition
    // under test is time passing, several ticks of it.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    decide_as(&h, &rec.id, "req-1", Choice::Approve, None, owner())
        .await
        .expect("decided");
    let text = h.until_transcript(&rec.id, "after the gate").await;
    assert!(!text.contains("has not answered the prompt"), "{text}");
}

#[tokio::test]
async fn non_owners_cannot_act_and_operators_can() {
    let h = Harness::new(Knobs {
        operators: vec!["U_OPS".into()],
        ..Knobs::default()
    })
    .await;
    let rec = h
        .start(
            json!({"turns": [[{"permission": {"tool_call_id": "t1", "title": "gate"}}]]}),
            "go",
        )
        .await;
    h.until("gate", |e| matches!(e, OperatorEvent::RequestOpened { .. }))
        .await;
    let stranger = Caller {
        id: "U_STRANGER".into(),
        operator: false,
    };
    let err = decide_as(&h, &rec.id, "req-1", Choice::Approve, None, stranger)
        .await
        .expect_err("refused");
    assert!(matches!(
        err,
        intercom_actors::session::SessionError::Unauthorized { .. }
    ));
    assert_eq!(
        h.store
            .list_requests(Some(&rec.id), true)
            .await
            .expect("list")
            .len(),
        1
    );
    assert!(
        h.store
            .audit_entries()
            .iter()
            .any(|a| a.action == "action.denied" && a.actor == "U_STRANGER")
    );
    let ops = Caller {
        id: "U_OPS".into(),
        operator: false,
    };
    decide_as(&h, &rec.id, "req-1", Choice::Reject, Some("not now"), ops)
        .await
        .expect("operator decides");
    h.until_transcript(&rec.id, "permission t1: selected reject-once")
        .await;
}

#[tokio::test]
async fn a_flooding_agent_is_coalesced_and_its_permission_request_still_answered() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[
        {"flood": 100000},
        {"permission": {"tool_call_id": "t1", "title": "inside the flood"}},
        {"flood": 1000},
        {"chunk": "END"}
    ]]});
    let rec = h.start(scenario, "go").await;
    h.until("permission", |e| {
        matches!(e, OperatorEvent::RequestOpened { .. })
    })
    .await;
    decide_as(&h, &rec.id, "req-1", Choice::Approve, None, owner())
        .await
        .expect("answered");
    let text = h.until_transcript(&rec.id, "END").await;
    // Coalesced: the flood is one or a few transcript entries, not 101k rows,
    // and no chunk was dropped.
    let entries = h.transcript(&rec.id).await;
    assert!(entries.len() < 20, "{} entries", entries.len());
    let xs: usize = entries
        .iter()
        .filter(|m| m.role == intercom_actors::model::Role::Agent)
        .map(|m| m.content.matches('x').count())
        .sum();
    assert_eq!(xs, 101_000, "every chunk arrived");
    assert!(text.contains("permission t1: selected allow-once"));
}

#[tokio::test]
async fn pause_holds_steering_and_resume_delivers_it() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[{"permission": {"tool_call_id": "t1", "title": "gate"}}], [{"chunk": "ok"}]]});
    let rec = h.start(scenario, "first").await;
    h.until("gate", |e| matches!(e, OperatorEvent::RequestOpened { .. }))
        .await;
    let actor = h.actor(&rec.id).await;
    pause(&actor).await;
    // The running turn was cancelled, its permission answered cancelled,
    // and the transcript says the waiting request went with it.
    h.until_transcript(&rec.id, "permission t1: cancelled")
        .await;
    h.until_transcript(
        &rec.id,
        "The pause cancelled what was waiting for a decision: req-1 (gate)",
    )
    .await;
    assert!(steer(&h, &rec.id, "while paused", false).await.queued);
    let snap = snapshot(&h, &rec.id).await;
    assert!(
        snap.paused && !snap.turn_running && snap.queued.len() == 1,
        "{snap:?}"
    );
    // A nudge is a prompt too: refused while paused, and nothing is sent.
    let nudged = ractor::call!(actor, |reply| SessionMsg::Nudge {
        caller: owner(),
        reply
    })
    .expect("call");
    assert!(
        matches!(
            nudged,
            Err(intercom_actors::session::SessionError::Paused(_))
        ),
        "{nudged:?}"
    );
    assert!(!snapshot(&h, &rec.id).await.turn_running);
    let text = h.transcript_text(&rec.id).await;
    assert!(
        !text.contains("prompt: while paused") && !text.contains("Nudging"),
        "delivered while paused:\n{text}"
    );
    ractor::call!(actor, |reply| SessionMsg::Resume {
        caller: owner(),
        reply
    })
    .expect("call")
    .expect("resumed");
    h.until_transcript(&rec.id, "prompt: while paused").await;
    // Once resumed, a nudge goes through, in the name of who asked.
    ractor::call!(actor, |reply| SessionMsg::Nudge {
        caller: owner(),
        reply
    })
    .expect("call")
    .expect("nudged");
    let nudges: Vec<_> = h
        .store
        .audit_entries()
        .into_iter()
        .filter(|a| a.action == "session.nudged")
        .collect();
    assert_eq!(nudges.len(), 1, "{nudges:?}");
    assert_eq!(nudges[0].actor, "U_OWNER");
    let stranger = Caller {
        id: "U_X".into(),
        operator: false,
    };
    let err = ractor::call!(actor, |reply| SessionMsg::Pause {
        caller: stranger,
        reply
    })
    .expect("call");
    assert!(matches!(
        err,
        Err(intercom_actors::session::SessionError::Unauthorized { .. })
    ));
}

#[tokio::test]
async fn a_session_ended_by_idle_timeout_can_be_revived_and_an_explicit_stop_cannot() {
    let h = Harness::new(Knobs {
        limits: Limits {
            idle_timeout_secs: 1,
            ..Knobs::default().limits
        },
        ..Knobs::default()
    })
    .await;
    let scenario = json!({"load_session": true, "on_load": [{"chunk": "HISTORY"}], "turns": [[{"chunk": "first turn"}]]});
    let profile = h.profile(scenario);
    let rec = h
        .start_req(h.request(profile.clone(), "go"))
        .await
        .expect("start");
    h.until_record(&rec.id, "idle ended", |r| {
        r.status == SessionStatus::Completed
    })
    .await;
    let revived = revive(&h, rec.id.clone(), profile.clone(), owner())
        .await
        .expect("revived");
    assert_eq!(revived.status, SessionStatus::Active);
    let out = steer(&h, &rec.id, "after revive", false).await;
    assert!(!out.queued);
    let text = h.until_transcript(&rec.id, "prompt: after revive").await;
    assert!(!text.contains("HISTORY"), "replay stored:\n{text}");
    // An explicitly stopped session stays stopped.
    let stopped = h
        .start_req(h.request(profile.clone(), "go"))
        .await
        .expect("start");
    let actor = h.actor(&stopped.id).await;
    ractor::call!(actor, |reply| SessionMsg::Stop {
        cause: StopCause::Operator,
        caller: owner(),
        reply: Some(reply)
    })
    .expect("stop")
    .expect("ok");
    h.until_record(&stopped.id, "cancelled", |r| {
        r.status == SessionStatus::Cancelled
    })
    .await;
    let err = ractor::call!(h.sup, |reply| SupervisorMsg::Revive {
        id: stopped.id.clone(),
        profile,
        caller: owner(),
        reply
    })
    .expect("call")
    .expect_err("not revivable");
    assert!(matches!(err, SupervisorError::NotRevivable(_)), "{err:?}");
}

/// A session paused when it crashed comes back working when revived (it
/// was brought back on purpose), and the transcript says the pause was
/// lifted, so whoever paused it is not surprised by its steering going out.
#[tokio::test]
async fn a_revive_of_a_paused_session_says_it_lifted_the_pause() {
    let h = Harness::new(Knobs {
        policy: SupervisionPolicy {
            max_restarts: 0,
            ..Knobs::default().policy
        },
        ..Knobs::default()
    })
    .await;
    let scenario = json!({"turns": [[{"chunk": "up"}, {"hang": true}]]});
    let profile = h.profile(scenario);
    let rec = h.start_req(h.request(profile, "go")).await.expect("start");
    h.until_transcript(&rec.id, "up").await;
    pause(&h.actor(&rec.id).await).await;
    // Paused, its agent dies.
    let pid = snapshot(&h, &rec.id).await.pid.expect("a pid");
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    h.until_record(&rec.id, "crashed", |r| r.status == SessionStatus::Crashed)
        .await;
    let fixed = h.profile(json!({"turns": [[{"chunk": "working again"}]]}));
    let revived = revive(&h, rec.id.clone(), fixed, owner())
        .await
        .expect("revived");
    assert_eq!(revived.status, SessionStatus::Active);
    h.until_transcript(&rec.id, "the revive lifted the pause")
        .await;
    assert!(!h.store.is_paused(&rec.id).await.expect("flag"));
    assert!(!steer(&h, &rec.id, "after revive", false).await.paused);
}

/// A harness whose supervisor restarts nothing: a crash ends the session.
async fn no_restarts() -> Harness {
    Harness::new(Knobs {
        policy: SupervisionPolicy {
            max_restarts: 0,
            restart_window_secs: 600,
            backoff_initial_secs: 0,
            backoff_max_secs: 0,
        },
        ..Knobs::default()
    })
    .await
}

/// A session that crashed in a turn comes back from a revive with that turn
/// continued (a resumed agent) or its prompt given again (a fresh one). It
/// sat idle with its task unfinished, and the "in a turn" kept in the store
/// made a later server restart resume it unasked.
#[tokio::test]
async fn a_revive_continues_the_turn_the_crash_cut() {
    let h = no_restarts().await;
    for (load_session, expected) in [
        (true, "prompt: Continue working on the current task"),
        (false, "prompt: write the report"),
    ] {
        let broken = json!({"turns": [[{"chunk": "starting. "}, {"exit": 1}]]});
        let rec = h.start(broken, "write the report").await;
        h.until_record(&rec.id, "crashed", |r| r.status == SessionStatus::Crashed)
            .await;
        let fixed = h.profile(json!({"load_session": load_session,
            "turns": [[{"chunk": "working again"}]]}));
        revive(&h, rec.id.clone(), fixed, owner())
            .await
            .expect("revived");
        let text = h.until_transcript(&rec.id, "working again").await;
        let after = text.rsplit("Session revived").next().unwrap_or_default();
        assert!(after.contains(expected), "{load_session}: {after}");
        h.until("the continued turn's end", |e| {
            matches!(e, OperatorEvent::StatusChanged { session_id, activity, .. }
                if *session_id == rec.id && activity == "idle")
        })
        .await;
        assert!(
            !h.store.turn_was_running(&rec.id).await.expect("flag"),
            "the finished turn is no longer stored as running"
        );
    }
}

#[tokio::test]
async fn a_crashed_session_comes_back_once_its_agent_is_fixed() {
    let h = no_restarts().await;
    let broken = json!({"turns": [[{"stderr": "fatal: bad flag"}, {"exit": 1}]]});
    let rec = h.start(broken, "go").await;
    let crashed = h
        .until_record(&rec.id, "crashed", |r| r.status == SessionStatus::Crashed)
        .await;
    assert!(crashed.revivable());
    let reason = crashed.status_reason.clone().unwrap_or_default();
    // The operator's fix is not there yet: the revive fails and the session
    // stays crashed, with the reason it had.
    let mut missing = h.profile(json!({"turns": []}));
    missing.command = h.dir.path().join("no-such-agent").display().to_string();
    let err = revive(&h, rec.id.clone(), missing, owner())
        .await
        .expect_err("the agent cannot start");
    assert!(matches!(err, SupervisorError::StartFailed(_)), "{err:?}");
    let still = h
        .until_record(&rec.id, "crashed again", |r| !r.status.is_live())
        .await;
    assert_eq!(still.status, SessionStatus::Crashed);
    assert_eq!(still.status_reason.as_deref(), Some(reason.as_str()));
    // Someone else may not bring it back.
    let stranger = Caller {
        id: "U_X".into(),
        operator: false,
    };
    let fixed = h.profile(json!({"turns": [[{"chunk": "working again"}]]}));
    let err = revive(&h, rec.id.clone(), fixed.clone(), stranger)
        .await
        .expect_err("not the owner");
    assert!(
        matches!(err, SupervisorError::Unauthorized { .. }),
        "{err:?}"
    );
    // Fixed: it comes back in the same session and takes a prompt.
    let revived = revive(&h, rec.id.clone(), fixed, owner())
        .await
        .expect("revived");
    assert_eq!(revived.status, SessionStatus::Active);
    assert_eq!(revived.id, rec.id);
    steer(&h, &rec.id, "after the fix", false).await;
    h.until_transcript(&rec.id, "working again").await;
    let audit: Vec<String> = h
        .store
        .audit_entries()
        .iter()
        .filter(|a| a.session_id.as_ref() == Some(&rec.id))
        .map(|a| a.action.clone())
        .collect();
    assert!(
        audit.contains(&"session.revive_failed".to_owned())
            && audit.contains(&"session.revived".to_owned()),
        "{audit:?}"
    );
}

#[tokio::test]
async fn flooded_tool_updates_are_coalesced_not_dropped() {
    let h = Harness::new(Knobs {
        limits: Limits {
            inbound_messages_per_sec: 100,
            ..Knobs::default().limits
        },
        ..Knobs::default()
    })
    .await;
    let mut turn = vec![
        json!({"tool_call": {"id": "t1", "title": "Build", "kind": "execute", "status": "pending"}}),
    ];
    for _ in 0..3000 {
        turn.push(json!({"tool_update": {"id": "t1", "status": "in_progress"}}));
    }
    turn.push(json!({"tool_update": {"id": "t1", "status": "completed"}}));
    turn.push(json!({"permission": {"tool_call_id": "t2", "title": "after the flood"}}));
    let rec = h.start(json!({"turns": [turn]}), "go").await;
    h.until("permission", |e| {
        matches!(e, OperatorEvent::RequestOpened { .. })
    })
    .await;
    decide_as(&h, &rec.id, "req-1", Choice::Approve, None, owner())
        .await
        .expect("answered");
    h.until_transcript(&rec.id, "permission t2: selected allow-once")
        .await;
    h.until_transcript(&rec.id, "\"status\":\"completed\"")
        .await;
    let tool_events = h
        .sink
        .events()
        .iter()
        .filter(|e| matches!(e, OperatorEvent::ToolCall { .. }))
        .count();
    assert!(
        tool_events < 100,
        "{tool_events} tool events for 3001 updates"
    );
    let last = h
        .until(
            "final status shown",
            |e| matches!(e, OperatorEvent::ToolCall { status, .. } if status == "completed"),
        )
        .await;
    assert!(matches!(last, OperatorEvent::ToolCall { .. }));
}

#[tokio::test]
async fn agent_and_operator_activity_move_last_activity_at() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[
        {"tool_call": {"id": "t1", "title": "Edit", "kind": "edit"}},
        {"permission": {"tool_call_id": "t1"}},
        {"chunk": "Done."}
    ]]});
    let rec = h.start(scenario, "go").await;
    let created = rec.created_at;
    let agent_touched = h
        .until_record(&rec.id, "touched by the agent", |r| {
            r.last_activity_at > created
        })
        .await
        .last_activity_at;
    h.until("permission", |e| {
        matches!(e, OperatorEvent::RequestOpened { .. })
    })
    .await;
    // Let the millisecond clock pass the agent's touch before the operator acts.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while intercom_actors::model::now_ms() <= agent_touched {
        assert!(std::time::Instant::now() < deadline, "clock stuck");
        tokio::task::yield_now().await;
    }
    decide_as(&h, &rec.id, "req-1", Choice::Approve, None, Caller::local())
        .await
        .expect("decided");
    h.until_record(&rec.id, "touched by the operator", |r| {
        r.last_activity_at > agent_touched
    })
    .await;
}

#[tokio::test]
async fn starts_past_max_concurrent_starts_wait_for_a_start_to_finish() {
    let h = Harness::new(Knobs {
        limits: Limits {
            max_concurrent_starts: 1,
            ..Knobs::default().limits
        },
        ..Knobs::default()
    })
    .await;
    // A: admitted, its agent stuck in the handshake.
    let stuck = h.request(h.profile(json!({"handshake_delay_ms": 120_000})), "stuck");
    let (a_tx, a_rx) = ractor::concurrency::oneshot();
    h.sup
        .send_message(SupervisorMsg::Start {
            req: stuck,
            reply: a_tx.into(),
        })
        .expect("send A");
    let a_id = match h
        .until("A started", |e| {
            matches!(e, OperatorEvent::SessionStarted { .. })
        })
        .await
    {
        OperatorEvent::SessionStarted { session } => session.id,
        _ => unreachable!("matched above"),
    };
    // B: asked while A is starting.
    let quick = h.request(
        h.profile(json!({"turns": [[{"chunk": "b here"}]]})),
        "quick",
    );
    let (b_tx, b_rx) = ractor::concurrency::oneshot();
    h.sup
        .send_message(SupervisorMsg::Start {
            req: quick,
            reply: b_tx.into(),
        })
        .expect("send B");
    // The supervisor handles messages in order: once it answers this, it
    // has taken B's start, and must have queued it.
    assert_eq!(h.live_count().await, 1, "only A runs");
    let started = h
        .sink
        .events()
        .into_iter()
        .filter(|e| matches!(e, OperatorEvent::SessionStarted { .. }))
        .count();
    assert_eq!(started, 1, "B waits for A's start to finish");

    // A's start ends (stopped mid-handshake): B is admitted and starts.
    let stopped = ractor::call!(h.sup, |reply| SupervisorMsg::Stop {
        id: a_id,
        caller: Caller::local(),
        reply,
    })
    .expect("stop call");
    assert!(stopped.is_ok(), "{stopped:?}");
    assert!(
        a_rx.await.expect("A answered").is_err(),
        "A never got ready"
    );
    let b = b_rx.await.expect("B answered").expect("B started");
    h.until_transcript(&b.id, "b here").await;
}

/// An agent that ignores the cancel a pause sends keeps working: what it
/// asks meanwhile is refused (a probe's agent opened a request for
/// `rm -rf build` while paused), it is restarted after the shutdown grace as
/// for an interrupt, and the session stays paused.
#[tokio::test]
async fn a_pause_the_agent_ignores_refuses_its_requests_and_restarts_it() {
    let mut knobs = Knobs::default();
    knobs.limits.shutdown_grace_secs = 1;
    let h = Harness::new(knobs).await;
    let profile = h.python_agent(KEEPS_ASKING_AFTER_CANCEL);
    let rec = h
        .start_req(h.request(profile, "work"))
        .await
        .expect("start");
    request_opened(&h, 1).await;
    let actor = h.actor(&rec.id).await;
    pause(&actor).await;
    h.until("the refusal while paused", |e| {
        matches!(e, OperatorEvent::Notice { text, .. } if text.contains("while the session was paused"))
    })
    .await;
    h.until("the restart after the grace", |e| {
        matches!(e, OperatorEvent::Notice { text, .. } if text.contains("of the pause") && text.contains("stays paused"))
    })
    .await;
    let requests = h
        .store
        .list_requests(Some(&rec.id), false)
        .await
        .expect("list");
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].status, RequestStatus::Cancelled);
    // Back after the restart, still paused, sending it nothing.
    h.until_record(&rec.id, "restarted", |r| r.restart_count == 1)
        .await;
    let snap = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        loop {
            let found = ractor::call!(h.sup, |reply| SupervisorMsg::Lookup {
                id: rec.id.clone(),
                reply
            });
            if let Ok(Some(actor)) = found
                && let Ok(snap) = ractor::call!(actor, SessionMsg::Snapshot)
            {
                return snap;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the restarted session is live");
    assert!(snap.paused && !snap.turn_running, "{snap:?}");
}

/// A pause during the start holds the first prompt until the resume: a
/// probe's operator could not hold a misbehaving agent (409 "start a new
/// one") until it was back, and it then got its prompt.
#[tokio::test]
async fn a_pause_during_the_start_holds_the_first_prompt_until_resumed() {
    let h = Harness::new(Knobs::default()).await;
    let agent = format!("{HOLD_INITIALIZE_UNTIL_GO}{ECHOES_PROMPTS}");
    let req = h.request(h.python_agent(&agent), "first words");
    let (starting, session) = start_in_background(&h, req).await;
    pause(&h.actor(&session.id).await).await;
    std::fs::write(h.workspace.join("go"), "").expect("go");
    let rec = starting.await.expect("start task").expect("started");
    h.until_transcript(
        &rec.id,
        "the first prompt waits until the session is resumed",
    )
    .await;
    let waiting = h
        .store
        .undelivered_steering(&rec.id)
        .await
        .expect("steering");
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!(waiting[0].text, "first words");
    let actor = h.actor(&rec.id).await;
    ractor::call!(actor, |reply| SessionMsg::Resume {
        caller: owner(),
        reply
    })
    .expect("call")
    .expect("resumed");
    let text = h.until_transcript(&rec.id, "got: first words").await;
    assert_eq!(text.matches("got: first words").count(), 1, "{text}");
}

/// Echoes each prompt and ends the turn.
const ECHOES_PROMPTS: &str = r#"
def on(m, method, mid):
    if method == "session/prompt":
        chunk("got: " + m["params"]["prompt"][0]["text"])
        send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn"}})
"#;

/// A paused agent's reads are refused too: a probe's agent, ignoring the
/// pause's cancel, went on reading the workspace.
#[tokio::test]
async fn a_paused_agents_reads_are_refused() {
    let h = Harness::new(Knobs::default()).await;
    std::fs::write(h.workspace.join("notes.txt"), "secret plans\n").expect("file");
    let profile = h.python_agent(READS_AFTER_CANCEL);
    let rec = h
        .start_req(h.request(profile, "work"))
        .await
        .expect("start");
    request_opened(&h, 1).await;
    pause(&h.actor(&rec.id).await).await;
    h.until("the refusal while paused", |e| {
        matches!(e, OperatorEvent::Notice { text, .. } if text.contains("while the session was paused"))
    })
    .await;
    let answer = h.workspace.join("read-answer.json");
    let text = tokio::time::timeout(support::WAIT, async {
        loop {
            match std::fs::read_to_string(&answer) {
                Ok(t) if t.ends_with('\n') => return t,
                _ => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    })
    .await
    .expect("the agent wrote down the answer to its read");
    assert!(text.contains("paused"), "{text}");
    assert!(!text.contains("secret plans"), "{text}");
}

/// Asks once per prompt; on `session/cancel` reads `notes.txt` and writes
/// the answer it got to `read-answer.json` (an agent that ignores a pause).
const READS_AFTER_CANCEL: &str = r#"
def on(m, method, mid):
    if method == "session/prompt":
        ask(1, "first")
    elif method == "session/cancel":
        send({"jsonrpc": "2.0", "id": 50, "method": "fs/read_text_file",
              "params": {"sessionId": "s1", "path": __import__("os").getcwd() + "/notes.txt"}})
    elif method is None and mid == 50:
        with open("read-answer.json", "w") as f:
            f.write(json.dumps(m) + "\n")
"#;

/// Asks once per prompt; on `session/cancel` asks again and never ends the
/// turn (an agent that ignores a pause).
const KEEPS_ASKING_AFTER_CANCEL: &str = r#"
def on(m, method, mid):
    if method == "session/prompt":
        ask(1, "first")
    elif method == "session/cancel":
        ask(2, "rm -rf build")
"#;

/// A write an approval covered is not carried out once the session is
/// paused: the agent that writes anyway (it ignored the pause's cancel) is
/// refused, and the file is not written.
#[tokio::test]
async fn a_pause_ends_what_the_cut_turn_was_allowed_to_write() {
    let h = Harness::new(Knobs::default()).await;
    let target = h.workspace.join("notes.txt");
    let body = WRITES_AFTER_CANCEL.replace("TARGET", &target.display().to_string());
    let profile = h.python_agent(&body);
    let rec = h
        .start_req(h.request(profile, "work"))
        .await
        .expect("start");
    request_opened(&h, 1).await;
    decide(&h, &rec.id, "req-1", Choice::Approve).await;
    let actor = h.actor(&rec.id).await;
    pause(&actor).await;
    // The notice names the file that was not written.
    h.until("the refusal while paused", |e| {
        matches!(e, OperatorEvent::Notice { text, .. }
            if text.contains("notes.txt") && text.contains("after the session was paused") && text.contains("not written"))
    })
    .await;
    assert!(!target.exists(), "written while paused");
}

/// Announces a diff for TARGET and asks for it; once cancelled (a pause),
/// writes exactly that content anyway.
const WRITES_AFTER_CANCEL: &str = r#"
def on(m, method, mid):
    if method == "session/prompt":
        send({"jsonrpc": "2.0", "id": 1, "method": "session/request_permission", "params": {
            "sessionId": "s1", "toolCall": {"toolCallId": "t1", "title": "Write notes", "kind": "edit",
                "content": [{"type": "diff", "path": "TARGET", "oldText": None, "newText": "later\n"}]},
            "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                        {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}})
    elif method == "session/cancel":
        send({"jsonrpc": "2.0", "id": 2, "method": "fs/write_text_file",
              "params": {"sessionId": "s1", "path": "TARGET", "content": "later\n"}})
"#;
