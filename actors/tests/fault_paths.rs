//! Fault paths: nothing lost, nothing wedged (issue 14).
//!
//! Queued instructions survive a crash, a pause and a broken pipe, in order
//! and once each, with `delivered` true to what the agent received (the
//! scripted agent reports `prompt: <text>` for every prompt that reached
//! it); a clean exit 0 ends the session `completed`; an operator restart
//! respawns the agent in the same session; a panicking session actor takes
//! its agent's process group with it; a spawn failure during a restart is
//! counted once.

mod support;

use intercom_actors::model::{SessionId, SessionStatus};
use intercom_actors::ports::{NoticeLevel, OperatorEvent, SessionStore};
use intercom_actors::session::{Caller, SessionError, SessionMsg, StartError, SteerOutcome};
use intercom_actors::settings::SupervisionPolicy;
use intercom_actors::supervisor::{SupervisorError, SupervisorMsg, steer_session};
use serde_json::{Value, json};
use support::{HOLD_INITIALIZE_UNTIL_GO, Harness, Knobs, start_in_background, until_group_gone};

fn owner() -> Caller {
    Caller {
        id: "U_OWNER".into(),
        operator: false,
    }
}

/// Restarts wait `backoff` seconds, so instructions can arrive meanwhile.
/// Someone who is neither the owner nor an operator.
fn stranger() -> Caller {
    Caller {
        id: "U_OTHER".into(),
        operator: false,
    }
}

fn knobs_with_backoff(backoff: u64) -> Knobs {
    Knobs {
        policy: SupervisionPolicy {
            max_restarts: 3,
            restart_window_secs: 600,
            backoff_initial_secs: backoff,
            backoff_max_secs: backoff,
        },
        ..Knobs::default()
    }
}

fn marker(h: &Harness, name: &str) -> String {
    h.dir.path().join(name).display().to_string()
}

async fn steer(h: &Harness, id: &SessionId, text: &str) -> SteerOutcome {
    steer_session(&h.sup, id, text, false, &owner())
        .await
        .expect("steer call")
        .expect("steer accepted")
}

/// Sends a control (pause, resume) in the owner's name; it must be taken.
async fn as_owner(
    actor: &ractor::ActorRef<SessionMsg>,
    control: impl FnOnce(Caller, ractor::RpcReplyPort<Result<(), SessionError>>) -> SessionMsg,
) {
    ractor::call!(actor, |reply| control(owner(), reply))
        .expect("control call")
        .expect("control taken");
}

async fn pid(h: &Harness, id: &SessionId) -> i32 {
    let actor = h.actor(id).await;
    ractor::call!(actor, SessionMsg::Snapshot)
        .expect("snapshot")
        .pid
        .expect("a pid")
}

/// Waits until the agent reported every prompt in `texts`, then checks it
/// saw each exactly once, in this order, and that storage calls every one
/// delivered (and nothing else waiting).
async fn assert_received_in_order(h: &Harness, id: &SessionId, texts: &[&str]) {
    let last = format!("prompt: {}", texts[texts.len() - 1]);
    let transcript = h.until_transcript(id, &last).await;
    let mut at = 0;
    for text in texts {
        let needle = format!("prompt: {text}\n");
        let full = format!("{transcript}\n");
        assert_eq!(
            full.matches(&needle).count(),
            1,
            "{text:?} reached the agent once:\n{transcript}"
        );
        let pos = full.find(&needle).expect("present");
        assert!(pos >= at, "{text:?} out of order:\n{transcript}");
        at = pos;
    }
    let deadline = tokio::time::Instant::now() + support::WAIT;
    loop {
        let left = h.store.undelivered_steering(id).await.expect("steering");
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still undelivered: {left:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Number of `SteeringDelivered` events for `id`.
fn delivered_events(h: &Harness, id: &SessionId) -> usize {
    h.sink
        .events()
        .iter()
        .filter(|e| matches!(e, OperatorEvent::SteeringDelivered { session_id, .. } if session_id == id))
        .count()
}

/// Asks the supervisor to restart `id` in its owner's name.
async fn restart_as_owner(h: &Harness, id: &SessionId) {
    ractor::call!(h.sup, |reply| SupervisorMsg::Restart {
        id: id.clone(),
        caller: owner(),
        reply
    })
    .expect("restart call")
    .expect("restart accepted");
}

/// Waits for the notice that the restarted agent resumed its session.
async fn until_resumed(h: &Harness, id: &SessionId) {
    h.until("resumed notice", |e| {
        matches!(e, OperatorEvent::Notice { session_id, text, .. }
            if session_id == id && text.contains("resumed the agent's session"))
    })
    .await;
}

async fn until_restart_scheduled(h: &Harness, id: &SessionId) {
    h.until("restart scheduled", |e| {
        matches!(e, OperatorEvent::StatusChanged { session_id, status: SessionStatus::Starting, .. }
            if session_id == id)
    })
    .await;
}

async fn crash_then_three_queued(scenario: Value) {
    let h = Harness::new(knobs_with_backoff(2)).await;
    let m = marker(&h, "crashed");
    let mut scenario = scenario;
    scenario["turns"] = json!([[{"exit_once": {"code": 1, "marker": m}}], []]);
    let rec = h.start(scenario, "first").await;
    until_restart_scheduled(&h, &rec.id).await;
    for text in ["a", "b", "c"] {
        let o = steer(&h, &rec.id, text).await;
        assert!(o.queued, "{text} waits for the restart");
    }
    assert_received_in_order(&h, &rec.id, &["a", "b", "c"]).await;
    // Later instructions go straight through.
    steer(&h, &rec.id, "d").await;
    assert_received_in_order(&h, &rec.id, &["a", "b", "c", "d"]).await;
    // The first prompt is the session's first steering: it counts too.
    assert_eq!(delivered_events(&h, &rec.id), 5);
}

/// An agent that cannot resume starts a fresh session after a crash: it
/// lost the cut turn. A probe queued steering during the restart, and the
/// fresh agent was given only that, never the task. The cut turn's prompt
/// goes first, the steering after it, and the transcript says so.
#[tokio::test]
async fn a_fresh_agent_after_a_crash_gets_the_cut_turn_before_queued_steering() {
    let h = Harness::new(knobs_with_backoff(2)).await;
    let m = marker(&h, "crashed");
    let scenario = json!({"load_session": false, "turns": [
        [{"chunk": "on it"}, {"exit_once": {"code": 1, "marker": m}}, {"chunk": "task done"}],
        [{"chunk": "steered"}]
    ]});
    let rec = h.start(scenario, "the task").await;
    until_restart_scheduled(&h, &rec.id).await;
    assert!(steer(&h, &rec.id, "and then this").await.queued);
    let text = h.until_transcript(&rec.id, "steered").await;
    let at = |needle: &str| {
        text.match_indices(needle)
            .map(|(i, _)| i)
            .collect::<Vec<_>>()
    };
    let task = at("prompt: the task");
    assert_eq!(task.len(), 2, "given again once:\n{text}");
    let then = at("prompt: and then this");
    assert_eq!(then.len(), 1, "{text}");
    assert!(task[1] < then[0], "the task first:\n{text}");
    assert!(at("task done")[0] < then[0], "{text}");
    assert!(
        text.contains("its prompt is given again first; 1 queued instruction(s) follow it"),
        "{text}"
    );
}

/// Paused, its turn cut, then the agent crashes and comes back fresh: the
/// resume gives it the cut turn's prompt before the steering held for it.
/// A probe's fresh agent was given nothing (or only the steering); and
/// steering sent between the crash and the restart answered `paused:
/// false` while it was held.
#[tokio::test]
async fn a_crash_while_paused_leaves_the_cut_turn_owed_to_the_fresh_agent() {
    let h = Harness::new(knobs_with_backoff(2)).await;
    let scenario =
        json!({"load_session": false, "turns": [[{"chunk": "working"}, {"wait_cancel": true}]]});
    let rec = h.start(scenario, "the task").await;
    h.until_transcript(&rec.id, "working").await;
    let actor = h.actor(&rec.id).await;
    as_owner(&actor, |caller, reply| SessionMsg::Pause { caller, reply }).await;
    // The pause's cancel ends the turn; then the agent dies.
    let deadline = std::time::Instant::now() + support::WAIT;
    while ractor::call!(actor, SessionMsg::Snapshot)
        .expect("snapshot")
        .turn_running
    {
        assert!(std::time::Instant::now() < deadline, "the turn never ended");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let old = pid(&h, &rec.id).await;
    // SAFETY: kill(2) on the agent this test started.
    unsafe { libc::kill(old, libc::SIGKILL) };
    until_restart_scheduled(&h, &rec.id).await;
    let held = steer(&h, &rec.id, "and then this").await;
    assert!(held.queued && held.paused, "{held:?}");
    h.until_transcript(&rec.id, "Still paused").await;
    let actor = h.actor(&rec.id).await;
    as_owner(&actor, |caller, reply| SessionMsg::Resume { caller, reply }).await;
    // The fresh agent's first turn is the cut one again (it waits for a
    // cancel again, so the held steering stays queued behind it).
    h.until_transcript(&rec.id, "The agent lost the cut turn")
        .await;
    let deadline = std::time::Instant::now() + support::WAIT;
    let text = loop {
        let text = h.transcript_text(&rec.id).await;
        if text.matches("prompt: the task").count() == 2 {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never given again:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(!text.contains("prompt: and then this"), "{text}");
}

/// A tool call the dead agent left unfinished will not finish: it is
/// shown cancelled, not `in_progress` for good.
#[tokio::test]
async fn a_crash_cancels_the_tool_calls_its_turn_left_unfinished() {
    let h = Harness::new(knobs_with_backoff(1)).await;
    let m = marker(&h, "crashed");
    let scenario = json!({"turns": [[
        {"tool_call": {"id": "t1", "title": "Run tests", "kind": "execute", "status": "in_progress"}},
        {"tool_call": {"id": "t2", "title": "Read", "kind": "read", "status": "completed"}},
        {"exit_once": {"code": 1, "marker": m}}
    ]]});
    h.start(scenario, "go").await;
    h.until("t1 cancelled", |e| {
        matches!(e, OperatorEvent::ToolCall { tool_call_id, status, .. }
            if tool_call_id == "t1" && status == "cancelled")
    })
    .await;
    let t2_cancelled = h.sink.events().iter().any(|e| {
        matches!(e, OperatorEvent::ToolCall { tool_call_id, status, .. }
            if tool_call_id == "t2" && status == "cancelled")
    });
    assert!(!t2_cancelled, "a finished call keeps its status");
}

/// A row stored live that the supervisor does not know (a start whose
/// storage failed half-way, on a full disk) has no agent and never will: a
/// stop ends it, where a probe's stop answered "stopping" for ever.
#[tokio::test]
async fn a_stop_ends_a_live_row_that_has_no_agent() {
    let h = Harness::new(Knobs::default()).await;
    let real = h.start(json!({"turns": [[{"chunk": "up"}]]}), "go").await;
    let ghost = intercom_actors::model::SessionRecord {
        id: SessionId::from("s-0000000000000ghost"),
        status: SessionStatus::Starting,
        ..real
    };
    h.store.create_session(&ghost).await.expect("stored");
    let refused = ractor::call!(h.sup, |reply| SupervisorMsg::Stop {
        id: ghost.id.clone(),
        caller: stranger(),
        reply
    })
    .expect("stop call");
    assert!(
        matches!(refused, Err(SessionError::Unauthorized { .. })),
        "{refused:?}"
    );
    let stopped = ractor::call!(h.sup, |reply| SupervisorMsg::Stop {
        id: ghost.id.clone(),
        caller: owner(),
        reply
    })
    .expect("stop call")
    .expect("stop accepted");
    assert!(stopped);
    let ended = h
        .until_record(&ghost.id, "cancelled", |r| {
            r.status == SessionStatus::Cancelled
        })
        .await;
    assert_eq!(ended.status_reason.as_deref(), Some("stopped by operator"));
}

/// A delivered prompt whose delivered mark the store refused (a full disk)
/// is marked once the store takes writes again: left unmarked, a revive
/// after a restart delivered the first prompt a second time.
#[tokio::test]
async fn a_delivery_mark_the_store_refused_is_retried() {
    let h = Harness::new(Knobs::default()).await;
    h.store.fail_delivery_marks(2);
    let rec = h
        .start(
            json!({"turns": [[{"chunk": "one"}], [{"chunk": "two"}]]}),
            "first",
        )
        .await;
    h.until_transcript(&rec.id, "one").await;
    steer(&h, &rec.id, "second").await;
    h.until_transcript(&rec.id, "prompt: second").await;
    let deadline = std::time::Instant::now() + support::WAIT;
    loop {
        let left = h
            .store
            .undelivered_steering(&rec.id)
            .await
            .expect("steering");
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never marked delivered: {left:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn dialect_crash_delivers_every_queued_instruction_in_order() {
    crash_then_three_queued(json!({"protocol": "intercom"})).await;
}

#[tokio::test]
async fn acp_crash_delivers_every_queued_instruction_in_order() {
    crash_then_three_queued(json!({})).await;
}

#[tokio::test]
async fn dialect_pause_holds_then_resume_delivers_all_in_order() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(json!({"protocol": "intercom"}), "first").await;
    h.until_transcript(&rec.id, "prompt: first").await;
    let actor = h.actor(&rec.id).await;
    ractor::call!(actor, |reply| SessionMsg::Pause {
        caller: owner(),
        reply
    })
    .expect("pause call")
    .expect("paused");
    for text in ["a", "b", "c"] {
        assert!(steer(&h, &rec.id, text).await.queued, "{text} is held");
    }
    ractor::call!(actor, |reply| SessionMsg::Resume {
        caller: owner(),
        reply
    })
    .expect("resume call")
    .expect("resumed");
    assert_received_in_order(&h, &rec.id, &["first", "a", "b", "c"]).await;
    let o = steer(&h, &rec.id, "d").await;
    assert!(
        !o.queued,
        "after the queue drained, instructions go straight through"
    );
    assert_received_in_order(&h, &rec.id, &["first", "a", "b", "c", "d"]).await;
    let snap = ractor::call!(actor, SessionMsg::Snapshot).expect("snapshot");
    assert!(snap.queued.is_empty(), "{:?}", snap.queued);
}

async fn broken_pipe_then_three(scenario: Value) {
    let h = Harness::new(knobs_with_backoff(1)).await;
    let m = marker(&h, "closed");
    let mut scenario = scenario;
    scenario["turns"] = json!([[{"close_stdin_once": m}], []]);
    let rec = h.start(scenario, "first").await;
    h.until_transcript(&rec.id, "stdin closed").await;
    let old = pid(&h, &rec.id).await;
    for text in ["a", "b", "c"] {
        // Written to a closed pipe, held behind the failed one, or stored
        // during the restart: never delivered to the agent that cannot read.
        steer(&h, &rec.id, text).await;
    }
    until_group_gone(old).await;
    assert_received_in_order(&h, &rec.id, &["a", "b", "c"]).await;
    // With the first prompt, delivered as the session's first steering.
    assert_eq!(delivered_events(&h, &rec.id), 4);
    let text = h.transcript_text(&rec.id).await;
    assert!(
        text.contains("agent-intercom killed it because writing to its stdin failed"),
        "the crash says why the agent was killed:\n{text}"
    );
}

#[tokio::test]
async fn dialect_broken_pipe_keeps_instructions_for_the_restarted_agent() {
    broken_pipe_then_three(json!({"protocol": "intercom"})).await;
}

#[tokio::test]
async fn acp_broken_pipe_keeps_instructions_for_the_restarted_agent() {
    broken_pipe_then_three(json!({})).await;
}

async fn until_ended(h: &Harness, id: &SessionId) -> (SessionStatus, Option<String>) {
    let ev = h
        .until(
            "session ended",
            |e| matches!(e, OperatorEvent::SessionEnded { session_id, .. } if session_id == id),
        )
        .await;
    match ev {
        OperatorEvent::SessionEnded { status, reason, .. } => (status, reason),
        _ => unreachable!(),
    }
}

#[tokio::test]
async fn dialect_clean_exit_completes_the_session() {
    let h = Harness::new(Knobs::default()).await;
    let scenario =
        json!({"protocol": "intercom", "turns": [[{"status": "all done"}, {"exit": 0}]]});
    let rec = h.start(scenario, "go").await;
    let (status, reason) = until_ended(&h, &rec.id).await;
    assert_eq!(status, SessionStatus::Completed);
    assert_eq!(reason.as_deref(), Some("agent_finished"));
    h.until("completion notice", |e| {
        matches!(e, OperatorEvent::Notice { session_id, level: NoticeLevel::Info, text }
            if session_id == &rec.id && text.contains("exited (exit code 0)"))
    })
    .await;
    let stored = h
        .until_record(&rec.id, "completed", |r| {
            r.status == SessionStatus::Completed
        })
        .await;
    assert_eq!(stored.restart_count, 0, "not restarted");
    assert_eq!(h.live_count().await, 0);
}

#[tokio::test]
async fn acp_clean_exit_between_turns_completes_the_session() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[{"chunk": "done"}, {"exit_after_turn": 0}]]});
    let rec = h.start(scenario, "go").await;
    let (status, reason) = until_ended(&h, &rec.id).await;
    assert_eq!(status, SessionStatus::Completed);
    assert_eq!(reason.as_deref(), Some("agent_finished"));
    assert_eq!(h.live_count().await, 0);
}

#[tokio::test]
async fn acp_exit_0_mid_turn_and_nonzero_exits_are_crashes() {
    let h = Harness::new(knobs_with_backoff(0)).await;
    let m = marker(&h, "exit0");
    let scenario = json!({"turns": [[{"exit_once": {"code": 0, "marker": m}}]]});
    let rec = h.start(scenario, "go").await;
    h.until("restart notice", |e| {
        matches!(e, OperatorEvent::Notice { session_id, level: NoticeLevel::Warning, text }
            if session_id == &rec.id && text.contains("exited unexpectedly (exit code 0)"))
    })
    .await;
    h.until_record(&rec.id, "restarted", |r| {
        r.status == SessionStatus::Active && r.restart_count == 1
    })
    .await;
}

#[tokio::test]
async fn operator_restart_resumes_a_hung_agent_in_the_same_session() {
    let h = Harness::new(Knobs::default()).await;
    let m = marker(&h, "hung");
    let scenario = json!({"turns": [[{"hang_once": m}, {"chunk": "working again"}]]});
    let rec = h.start(scenario, "go").await;
    h.until_transcript(&rec.id, "prompt: go").await;
    let old = pid(&h, &rec.id).await;
    // Only the owner and operators may restart.
    let refused = ractor::call!(h.sup, |reply| SupervisorMsg::Restart {
        id: rec.id.clone(),
        caller: stranger(),
        reply
    })
    .expect("restart call");
    assert!(
        matches!(refused, Err(SessionError::Unauthorized { .. })),
        "{refused:?}"
    );
    restart_as_owner(&h, &rec.id).await;
    until_group_gone(old).await;
    until_resumed(&h, &rec.id).await;
    // Resumed mid-turn: continued with the nudge text.
    h.until_transcript(&rec.id, "working again").await;
    let stored = h
        .until_record(&rec.id, "active", |r| r.status == SessionStatus::Active)
        .await;
    assert_eq!(stored.restart_count, 1);
    assert_ne!(pid(&h, &rec.id).await, old);
}

#[tokio::test]
async fn operator_restart_without_load_resends_the_original_prompt() {
    let h = Harness::new(Knobs::default()).await;
    let m = marker(&h, "hung");
    let scenario =
        json!({"load_session": false, "turns": [[{"hang_once": m}, {"chunk": "working again"}]]});
    let rec = h.start(scenario, "the task").await;
    h.until_transcript(&rec.id, "prompt: the task").await;
    let old = pid(&h, &rec.id).await;
    restart_as_owner(&h, &rec.id).await;
    until_group_gone(old).await;
    let text = h.until_transcript(&rec.id, "working again").await;
    assert_eq!(text.matches("prompt: the task").count(), 2, "{text}");
}

#[tokio::test]
async fn a_panicking_session_actor_takes_its_agent_group_with_it() {
    let h = Harness::new(knobs_with_backoff(0)).await;
    let rec = h.start(json!({"protocol": "intercom"}), "first").await;
    h.until_transcript(&rec.id, "prompt: first").await;
    let old = pid(&h, &rec.id).await;
    let actor = h.actor(&rec.id).await;
    actor
        .send_message(SessionMsg::PanicForTest)
        .expect("send the panic");
    until_group_gone(old).await;
    assert!(
        !std::path::Path::new(&format!("/proc/{old}")).exists(),
        "the old agent is gone from /proc"
    );
    // The supervisor restarted the session with a new agent.
    h.until_record(&rec.id, "restarted", |r| {
        r.status == SessionStatus::Active && r.restart_count == 1
    })
    .await;
    assert_ne!(pid(&h, &rec.id).await, old);
}

#[tokio::test]
async fn a_spawn_failure_during_a_restart_is_counted_once() {
    let h = Harness::new(knobs_with_backoff(1)).await;
    let copy = h.dir.path().join("agent-copy");
    std::fs::copy(support::agent_bin(), &copy).expect("copy the agent");
    let mut profile = h.profile(json!({"protocol": "intercom", "turns": [[{"exit": 1}]]}));
    profile.command = copy.display().to_string();
    let rec = h.start_req(h.request(profile, "go")).await.expect("starts");
    // Every restart from now on fails to spawn.
    std::fs::remove_file(&copy).expect("remove the agent");
    h.until_record(&rec.id, "crashed", |r| r.status == SessionStatus::Crashed)
        .await;
    let attempts: Vec<Value> = h
        .store
        .audit_entries()
        .iter()
        .filter(|a| {
            a.action == "session.restart_scheduled" && a.session_id.as_ref() == Some(&rec.id)
        })
        .map(|a| a.detail["attempt"].clone())
        .collect();
    assert_eq!(attempts, vec![json!(1), json!(2), json!(3)]);
    let stored = h
        .store
        .get_session(&rec.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(stored.restart_count, 3);
}

/// An operator's restart whose agent binary is gone is not a crash: the
/// operator is told the restart did not start, not sent looking for a crash.
#[tokio::test]
async fn a_restart_whose_agent_is_gone_is_not_called_a_crash() {
    let h = Harness::new(knobs_with_backoff(1)).await;
    let copy = h.dir.path().join("agent-copy");
    std::fs::copy(support::agent_bin(), &copy).expect("copy the agent");
    let mut profile = h.profile(json!({"turns": [[{"chunk": "idle now"}]]}));
    profile.command = copy.display().to_string();
    let rec = h.start_req(h.request(profile, "go")).await.expect("starts");
    h.until_transcript(&rec.id, "idle now").await;
    std::fs::remove_file(&copy).expect("remove the agent");
    restart_as_owner(&h, &rec.id).await;
    let stored = h
        .until_record(&rec.id, "retrying the failed restart", |r| {
            r.status == SessionStatus::Starting
                && r.status_reason
                    .as_deref()
                    .is_some_and(|s| s.contains("retrying"))
        })
        .await;
    let reason = stored.status_reason.unwrap_or_default();
    assert!(
        reason.contains("did not start") && !reason.contains("crash"),
        "{reason}"
    );
}

/// A stop during the handshake leaves a `cancelled` row, whether the agent
/// is still stuck in its handshake (killed after the grace) or answers the
/// `initialize` it owed after the stop and then exits on the closed stdin, as
/// most agents do. That answer used to move the handshake on (overwriting
/// the stop), the exit then read as a failed start, and the row was erased:
/// the person who pressed stop was told "no session".
#[tokio::test]
async fn a_stop_during_start_leaves_a_cancelled_record() {
    for delay_ms in [60_000, 1_000] {
        let h = Harness::new(Knobs::default()).await;
        let req = h.request(h.profile(json!({"handshake_delay_ms": delay_ms})), "go");
        let sup = h.sup.clone();
        let starting = tokio::spawn(async move {
            ractor::call!(sup, |reply| SupervisorMsg::Start { req, reply }).expect("start call")
        });
        let started = h
            .until("session started", |e| {
                matches!(e, OperatorEvent::SessionStarted { .. })
            })
            .await;
        let OperatorEvent::SessionStarted { session } = started else {
            unreachable!()
        };
        let stopped = ractor::call!(h.sup, |reply| SupervisorMsg::Stop {
            id: session.id.clone(),
            caller: Caller::local(),
            reply
        })
        .expect("stop call")
        .expect("stop accepted");
        assert!(stopped);
        let outcome = starting.await.expect("start task");
        // Not "the agent failed to start" (502): the stop came first (409).
        assert!(
            matches!(outcome, Err(SupervisorError::StoppedBeforeReady)),
            "the start reports it was stopped: {outcome:?}"
        );
        let rec = h
            .until_record(&session.id, "cancelled", |r| {
                r.status == SessionStatus::Cancelled
            })
            .await;
        assert_eq!(
            rec.status_reason.as_deref(),
            Some("stopped by operator"),
            "handshake delay {delay_ms} ms"
        );
    }
}

#[tokio::test]
async fn mcp_clients_do_not_take_agent_slots() {
    let mut knobs = Knobs::default();
    knobs.limits.max_sessions = 2;
    let h = Harness::new(knobs).await;
    for n in 0..3 {
        let req = intercom_actors::supervisor::AttachRequest {
            workspace: "ws".into(),
            cwd: h.workspace.clone(),
            channel_id: None,
            title: format!("IDE {n}"),
            owner: "U_OWNER".into(),
        };
        ractor::call!(h.sup, |reply| SupervisorMsg::Attach { req, reply })
            .expect("attach call")
            .expect("an MCP client attaches whatever max_sessions is");
    }
    h.start(json!({"protocol": "intercom"}), "one").await;
    h.start(json!({"protocol": "intercom"}), "two").await;
    let third = h
        .start_req(h.request(h.profile(json!({"protocol": "intercom"})), "three"))
        .await;
    assert!(
        matches!(
            third,
            Err(intercom_actors::supervisor::SupervisorError::LimitReached { max: 2 })
        ),
        "{third:?}"
    );
}

#[tokio::test]
async fn an_agent_killed_for_a_framing_error_is_told_why() {
    let h = Harness::new(knobs_with_backoff(0)).await;
    let scenario = json!({"framing": "lsp", "turns": [[
        {"unframed": "Content-Type: text/plain\r\n\r\n"},
        {"hang": true}
    ]]});
    let rec = h.start(scenario, "go").await;
    h.until("the crash notice", |e| {
        matches!(e, OperatorEvent::Notice { session_id, text, .. }
            if session_id == &rec.id
                && text.contains("(signal 9: agent-intercom killed it because reading its output failed"))
    })
    .await;
}

/// An agent that reuses a request id while the first request waits, asks
/// again once the session is stopping (after `session/cancel`), and once
/// more at stdin's end; it reports the first answer it gets on the reused id.
const ASKS_OUT_OF_TURN: &str = r#"
prompt = None
def on(m, method, mid):
    global prompt
    if method == "session/prompt":
        prompt = mid
        ask(77, "FIRST")
        ask(77, "SECOND")
    elif method == "session/cancel":
        ask(99, "DURING STOP")
        send({"jsonrpc": "2.0", "id": prompt, "result": {"stopReason": "cancelled"}})
    elif method is None and mid == 77:
        chunk("first answer for 77: %s\n" % ("error" if "error" in m else "result"))
def at_eof():
    ask(100, "AT EOF")
"#;

/// A request whose id is still waiting for an answer is not taken and not
/// answered (an answer on that id could not be told from the first one's),
/// and requests sent while the
/// session stops are refused, not left pending for ever. A probe had both
/// shown to the operator; the stopping ones stayed pending across restarts.
#[tokio::test]
async fn a_reused_id_or_a_request_during_stop_is_refused_not_left_pending() {
    let h = Harness::new(Knobs::default()).await;
    let profile = h.python_agent(ASKS_OUT_OF_TURN);
    let rec = h.start_req(h.request(profile, "go")).await.expect("start");
    h.until_transcript(&rec.id, "reused the id").await;
    let open = h
        .store
        .list_requests(Some(&rec.id), true)
        .await
        .expect("open");
    let titles: Vec<&str> = open.iter().map(|r| r.title.as_str()).collect();
    assert_eq!(titles, ["FIRST"]);
    // The agent hears one answer on id 77: the operator's, not a refusal it
    // would take for the first request's answer.
    support::decide(
        &h,
        &rec.id,
        "req-1",
        intercom_actors::session::Choice::Approve,
    )
    .await;
    let text = h.until_transcript(&rec.id, "first answer for 77").await;
    assert!(text.contains("first answer for 77: result"), "{text}");

    support::stop_as_operator(&h, &rec.id).await;
    h.until_record(&rec.id, "ended", |r| !r.status.is_live())
        .await;
    let open = h
        .store
        .list_requests(Some(&rec.id), true)
        .await
        .expect("open");
    assert!(open.is_empty(), "left pending: {open:?}");
    let all = h
        .store
        .list_requests(Some(&rec.id), false)
        .await
        .expect("all");
    let titles: Vec<&str> = all.iter().map(|r| r.title.as_str()).collect();
    assert_eq!(titles, ["FIRST"], "only the first request was ever taken");
}

/// An agent that sends a request with a float id, a line that is not
/// JSON and a line over `max_line_bytes`, and reports every answer it gets
/// with a null id.
const SENDS_UNREADABLE_LINES: &str = r#"
answers, prompt = [], None
def on(m, method, mid):
    global prompt
    if method == "session/prompt":
        prompt = mid
        send({"jsonrpc": "2.0", "id": 1.5, "method": "session/request_permission", "params": {}})
        sys.stdout.write("this is not json\n")
        sys.stdout.write('{"jsonrpc": "2.0", "id": 9, "method": "x", "params": "' + "a" * 5000 + '"}\n')
        sys.stdout.flush()
    elif method is None and mid != prompt and "error" in m:
        answers.append("%s@%s" % (m["error"]["code"], mid))
        if len(answers) == 3:
            chunk("answers: %s\n" % ",".join(answers))
            send({"jsonrpc": "2.0", "id": prompt, "result": {"stopReason": "end_turn"}})
"#;

/// A request the server cannot read is answered with an error, so the agent
/// is not left waiting for an answer that never comes: a float id, a line
/// that is not JSON (a null id, JSON-RPC 2.0), a line over the limit (on the
/// id its start names). A probe's agent waited for ever on each.
#[tokio::test]
async fn lines_that_cannot_be_read_are_answered() {
    let mut knobs = Knobs::default();
    knobs.limits.max_line_bytes = 4096;
    let h = Harness::new(knobs).await;
    let profile = h.python_agent(SENDS_UNREADABLE_LINES);
    let rec = h.start_req(h.request(profile, "go")).await.expect("start");
    let text = h.until_transcript(&rec.id, "answers: ").await;
    assert!(
        text.contains("answers: -32600@None,-32700@None,-32600@9"),
        "{text}"
    );
}

/// Steering still queued when a session is stopped stays stored, and the
/// transcript says it was never delivered: stored alone it looked the same
/// as steering still waiting.
#[tokio::test]
async fn steering_a_stop_left_undelivered_is_named() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h
        .start(
            json!({"turns": [[{"chunk": "working"}, {"hang": true}]]}),
            "go",
        )
        .await;
    h.until_transcript(&rec.id, "working").await;
    for text in ["later one", "later two"] {
        assert!(steer(&h, &rec.id, text).await.queued, "{text}");
    }
    support::stop_as_operator(&h, &rec.id).await;
    let text = h.until_transcript(&rec.id, "Not delivered").await;
    assert!(text.contains("«later one», «later two»"), "{text}");
    // Stopped on purpose: it cannot be revived, so the notice does not say to.
    assert!(
        text.contains("start a new session to give them again"),
        "{text}"
    );
    assert!(!text.contains("revive"), "{text}");
}

/// A shutdown that cuts a start's handshake answers the start that the
/// server is shutting down, not that the agent failed to start (a 502 where
/// the API promises one only when no session is kept).
#[tokio::test]
async fn a_shutdown_during_start_answers_shutting_down() {
    let h = Harness::new(Knobs::default()).await;
    let req = h.request(h.profile(json!({"handshake_delay_ms": 60000})), "go");
    let sup = h.sup.clone();
    let starting = tokio::spawn(async move {
        ractor::call!(sup, |reply| SupervisorMsg::Start { req, reply }).expect("start call")
    });
    h.until("session started", |e| {
        matches!(e, OperatorEvent::SessionStarted { .. })
    })
    .await;
    ractor::call!(h.sup, SupervisorMsg::Shutdown).expect("shutdown");
    let outcome = starting.await.expect("start task");
    assert!(
        matches!(outcome, Err(SupervisorError::ShuttingDown)),
        "{outcome:?}"
    );
}

/// An intercom (dialect) agent that crashes is given its prompt again once
/// restarted: the dialect has no turns, so its work was cut. A probe's
/// session sat active and idle for ever after the restart.
#[tokio::test]
async fn a_crashed_dialect_agent_is_given_its_prompt_again() {
    let h = Harness::new(Knobs::default()).await;
    let once = marker(&h, "dialect-exit-once");
    let rec = h
        .start(
            json!({"protocol": "intercom", "turns": [[
                {"status": "working"},
                {"exit_once": {"code": 1, "marker": once}},
                {"status": "second run did the work"}
            ]]}),
            "do the work",
        )
        .await;
    h.until_transcript(&rec.id, "second run did the work").await;
}

/// An `initialize` (or `session/new`) answer over `max_line_bytes` fails
/// the start at once and says why; it used to fail after the startup
/// timeout as "did not finish the handshake", the size only in the log (a
/// probe's 4 MB `session/new` answer held a start slot for 30 s).
#[tokio::test]
async fn an_oversized_handshake_answer_fails_the_start_saying_so() {
    const AGENT: &str = r#"
import json, sys
big = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    pad = {"_meta": {"pad": "x" * 10000}}
    if m.get("method") == "initialize":
        result = {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}
        if big == "initialize": result.update(pad)
    elif m.get("method") == "session/new":
        result = {"sessionId": "s1"}
        if big == "session/new": result.update(pad)
    else:
        continue
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": result}) + "\n")
    sys.stdout.flush()
"#;
    for method in ["initialize", "session/new"] {
        let mut knobs = Knobs::default();
        knobs.limits.max_line_bytes = 4096;
        knobs.limits.startup_timeout_secs = 60;
        let h = Harness::new(knobs).await;
        let mut profile = h.profile(json!({}));
        profile.command = "python3".into();
        profile.args = vec!["-c".into(), AGENT.into(), method.into()];
        let err = h
            .start_req(h.request(profile, "go"))
            .await
            .expect_err("the start fails");
        let text = err.to_string();
        assert!(
            text.contains("over limits.max_line_bytes (4096)") && text.contains(method),
            "{method}: {text}"
        );
        assert!(
            !matches!(
                err,
                SupervisorError::StartFailed(StartError::Timeout { .. })
            ),
            "{method}: {err:?}"
        );
    }
}

/// A session restarted while it waits for the operator (its turn over)
/// says it is idle once its agent is back; it read "working" for ever
/// after a server restart (a probe's `ctl watch`).
#[tokio::test]
async fn a_restarted_idle_session_shows_idle_not_working() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"load_session": true, "turns": [[{"chunk": "done"}]]});
    let rec = h.start(scenario, "go").await;
    h.until("the turn's end", |e| {
        matches!(e, OperatorEvent::StatusChanged { session_id, activity, .. }
            if session_id == &rec.id && activity == "idle")
    })
    .await;
    restart_as_owner(&h, &rec.id).await;
    until_resumed(&h, &rec.id).await;
    // After the notice, the session's activity comes to rest at idle.
    let activities = |events: &[OperatorEvent]| -> Vec<String> {
        let from = events
            .iter()
            .rposition(|e| matches!(e, OperatorEvent::Notice { text, .. } if text.contains("resumed the agent's session")))
            .unwrap_or(0);
        events[from..]
            .iter()
            .filter_map(|e| match e {
                OperatorEvent::StatusChanged {
                    session_id,
                    activity,
                    ..
                } if session_id == &rec.id => Some(activity.clone()),
                _ => None,
            })
            .collect()
    };
    let rested = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let seen = activities(&h.sink.events());
            if seen.last().map(String::as_str) == Some("idle") {
                return seen;
            }
            h.sink
                .wait_for(std::time::Duration::from_millis(200), |_| false)
                .await;
        }
    })
    .await;
    assert!(
        rested.is_ok(),
        "no idle after the restart: {:?}",
        activities(&h.sink.events())
    );
}

/// Steering someone sent while a session started was answered "queued";
/// a probe's was erased with the row when the start failed. Now the row
/// stays, ended in error (revivable), with the steering and a notice.
#[tokio::test]
async fn a_failed_start_keeps_steering_sent_while_it_started() {
    let h = Harness::new(Knobs::default()).await;
    let req = h.request(h.python_agent(&exits_at_initialize()), "first words");
    let (starting, session) = start_in_background(&h, req).await;
    let queued = steer(&h, &session.id, "meanwhile, also this").await;
    assert!(queued.queued, "{queued:?}");
    std::fs::write(h.workspace.join("go"), "").expect("go");
    let outcome = starting.await.expect("start task");
    // The answer names the session kept (a probe's 502 did not).
    match &outcome {
        Err(e @ SupervisorError::StartFailedKept { session: kept, .. }) => {
            assert_eq!(kept, &session.id);
            assert!(e.to_string().contains("revive it"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let rec = h
        .store
        .get_session(&session.id)
        .await
        .expect("read")
        .expect("the row is kept");
    assert_eq!(rec.status, SessionStatus::Error);
    assert!(rec.revivable(), "{rec:?}");
    let waiting = h
        .store
        .undelivered_steering(&session.id)
        .await
        .expect("steering");
    let texts: Vec<&str> = waiting.iter().map(|s| s.text.as_str()).collect();
    assert_eq!(texts, ["first words", "meanwhile, also this"]);
    h.until_transcript(&session.id, "«meanwhile, also this»")
        .await;
}

/// A failed start with nothing but its first prompt leaves no row, as
/// before (the starter is told why).
#[tokio::test]
async fn a_failed_start_with_only_its_first_prompt_leaves_no_row() {
    let h = Harness::new(Knobs::default()).await;
    std::fs::write(h.workspace.join("go"), "").expect("go");
    let req = h.request(h.python_agent(&exits_at_initialize()), "first words");
    let outcome =
        ractor::call!(h.sup, |reply| SupervisorMsg::Start { req, reply }).expect("start call");
    let Err(SupervisorError::StartFailed(_)) = outcome else {
        panic!("{outcome:?}")
    };
    let sessions = h.store.list_sessions(false).await.expect("list");
    assert!(sessions.is_empty(), "{sessions:?}");
}

/// Exits instead of answering `initialize`, once a file `go` exists in its
/// directory (the test holds the start there).
fn exits_at_initialize() -> String {
    format!("{HOLD_INITIALIZE_UNTIL_GO}\nEXIT_AT_GO = True\ndef on(m, method, mid):\n    pass\n")
}

/// History an agent replays after answering `session/load` (Gemini CLI
/// does; the spec has it before the answer) is not new activity: it read as
/// the agent redoing earlier writes, old replies glued to new ones. While
/// no turn runs after a load, transcript updates are history; state the
/// agent reports (usage, modes) still counts.
#[tokio::test]
async fn history_replayed_after_a_load_answer_is_not_new_activity() {
    let h = Harness::new(Knobs::default()).await;
    let usage = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "$SESSION_ID",
        "update": {"sessionUpdate": "usage_update", "used": 42, "size": 100}}});
    let scenario = json!({"load_session": true,
        "after_load": [
            {"user_chunk": "the first prompt, again"},
            {"chunk": "OLD REPLY"},
            {"tool_call": {"id": "old1", "title": "Write old.txt", "kind": "edit", "status": "completed"}},
            {"raw": usage.to_string()}
        ],
        "turns": [[{"chunk": "first turn done"}]]});
    let rec = h.start(scenario, "go").await;
    h.until_transcript(&rec.id, "first turn done").await;
    restart_as_owner(&h, &rec.id).await;
    until_resumed(&h, &rec.id).await;
    // The usage the agent sent last is seen: what came before it was read.
    h.until("the usage sent after the replay", |e| {
        matches!(e, OperatorEvent::Usage { session_id, usage } if session_id == &rec.id && usage.used == 42)
    })
    .await;
    let text = h.transcript_text(&rec.id).await;
    assert!(!text.contains("OLD REPLY"), "{text}");
    assert!(!text.contains("Write old.txt"), "{text}");
    // The next turn is the agent's own again (the new process plays its
    // first turn).
    steer(&h, &rec.id, "next").await;
    let text = h
        .until_transcript(&rec.id, "prompt: nextfirst turn done")
        .await;
    assert!(!text.contains("OLD REPLY"), "{text}");
}

/// A tool call streamed right after a load is not shown (it may be replayed
/// history), but it still counts for the permission that names it: a
/// probe's agent announced `rm -rf` there and asked by id alone, and the
/// request reached rules and the operator without its command.
#[tokio::test]
async fn a_tool_call_in_the_replay_tail_still_counts_for_its_permission() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"load_session": true,
        "after_load": [
            {"tool_call": {"id": "rm1", "title": "Run", "kind": "execute", "status": "pending",
                           "raw_input": {"command": "rm -rf victim"}}},
            {"permission": {"tool_call_id": "rm1"}}
        ],
        "turns": [[{"chunk": "first turn done"}]]});
    let rec = h.start(scenario, "go").await;
    h.until_transcript(&rec.id, "first turn done").await;
    restart_as_owner(&h, &rec.id).await;
    let opened = h
        .until("the permission after the load", |e| {
            matches!(e, OperatorEvent::RequestOpened { request } if request.session_id == rec.id)
        })
        .await;
    let OperatorEvent::RequestOpened { request } = opened else {
        unreachable!()
    };
    assert_eq!(
        request.command.as_deref(),
        Some("rm -rf victim"),
        "{request:?}"
    );
}
