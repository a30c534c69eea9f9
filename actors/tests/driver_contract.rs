//! The AgentDriver contract (`seeds/agent-driver-contract.md`, tests 1-10),
//! exercised end to end: the real supervisor and session actors driving the
//! scripted agent as a child process, over ACP and over the intercom dialect.
//!
//! The contract's driver methods map onto session messages:
//!
//! | contract            | here                                              |
//! |---------------------|---------------------------------------------------|
//! | `resolve_clearance` | `SessionMsg::Decide` (approve / reject)           |
//! | `send_prompt`       | `SessionMsg::Steer`                               |
//! | `interrupt`         | `SessionMsg::Stop { cause: StopCause::Operator }` |
//! | `resolve_prompt`    | `SessionMsg::Decide` on a forwarded prompt        |
//! | `resolve_wait`      | `SessionMsg::Steer` on an intercom session        |
//!
//! What the agent received is observed through what it says back: the
//! scripted agent reports every answer it gets (`permission t1: selected
//! allow-once`, `clearance req-001: approved`, `prompt prompt-001: refine ...`,
//! `prompt: <text>` at the start of each turn), which the server stores in the
//! session transcript. Nothing here sleeps and hopes: every wait is on an
//! event or on stored state, with a deadline.

mod support;

use std::time::Duration;

use intercom_actors::model::{
    Decision, PendingRequest, RequestKind, RequestStatus, SessionId, SessionStatus,
};
use intercom_actors::ports::{OperatorEvent, SessionStore};
use intercom_actors::session::{
    Caller, Choice, SessionError, SessionMsg, SessionSnapshot, SteerOutcome, StopCause,
};
use intercom_actors::supervisor::SupervisorMsg;
use serde_json::{Value, json};
use support::{Harness, Knobs, WAIT, decide_as};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn owner() -> Caller {
    Caller {
        id: "U_OWNER".into(),
        operator: false,
    }
}

fn stranger() -> Caller {
    Caller {
        id: "U_OTHER".into(),
        operator: false,
    }
}

async fn steer(
    h: &Harness,
    id: &SessionId,
    text: &str,
    interrupt: bool,
    caller: Caller,
) -> Result<SteerOutcome, SessionError> {
    let actor = h.actor(id).await;
    ractor::call!(actor, |reply| SessionMsg::Steer {
        text: text.into(),
        interrupt,
        caller,
        reply
    })
    .expect("steer call")
}

async fn stop(h: &Harness, id: &SessionId, caller: Caller) -> Result<(), SessionError> {
    let actor = h.actor(id).await;
    ractor::call!(actor, |reply| SessionMsg::Stop {
        cause: StopCause::Operator,
        caller,
        reply: Some(reply)
    })
    .expect("stop call")
}

async fn nudge(h: &Harness, id: &SessionId, caller: Caller) -> Result<(), SessionError> {
    let actor = h.actor(id).await;
    ractor::call!(actor, |reply| SessionMsg::Nudge { caller, reply }).expect("nudge call")
}

async fn snapshot(h: &Harness, id: &SessionId) -> SessionSnapshot {
    let actor = h.actor(id).await;
    ractor::call!(actor, SessionMsg::Snapshot).expect("snapshot call")
}

async fn lookup(h: &Harness, id: &SessionId) -> Option<ractor::ActorRef<SessionMsg>> {
    ractor::call!(h.sup, |reply| SupervisorMsg::Lookup {
        id: id.clone(),
        reply
    })
    .expect("lookup call")
}

/// Waits until `request_id` is opened in session `id`; returns the request.
async fn until_opened(h: &Harness, id: &SessionId, request_id: &str) -> PendingRequest {
    let e = h
        .until(&format!("{request_id} opened in {id}"), |e| {
            matches!(e, OperatorEvent::RequestOpened { request }
                if &request.session_id == id && request.request_id == request_id)
        })
        .await;
    match e {
        OperatorEvent::RequestOpened { request } => request,
        _ => unreachable!(),
    }
}

/// Waits until session `id` reports it ended; returns (status, reason).
async fn until_ended(h: &Harness, id: &SessionId) -> (SessionStatus, Option<String>) {
    let e = h
        .until(
            &format!("{id} ended"),
            |e| matches!(e, OperatorEvent::SessionEnded { session_id, .. } if session_id == id),
        )
        .await;
    match e {
        OperatorEvent::SessionEnded { status, reason, .. } => (status, reason),
        _ => unreachable!(),
    }
}

/// Waits until session `id` (ACP) has finished its running turn and is idle.
async fn until_idle(h: &Harness, id: &SessionId) {
    h.until(&format!("{id} idle"), |e| {
        matches!(e, OperatorEvent::StatusChanged { session_id, activity, .. }
            if session_id == id && activity == "idle")
    })
    .await;
}

/// Waits until the supervisor has forgotten the session (its actor is gone).
async fn until_gone(h: &Harness, id: &SessionId) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while lookup(h, id).await.is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "session {id} is still registered with the supervisor"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn request_status(h: &Harness, global: &str) -> (RequestStatus, Option<Decision>) {
    let (req, decision) = h
        .store
        .get_request(global)
        .await
        .expect("get request")
        .expect("request is stored");
    (req.status, decision)
}

async fn pending_in_store(h: &Harness, id: &SessionId) -> Vec<PendingRequest> {
    h.store
        .list_requests(Some(id), true)
        .await
        .expect("list requests")
}

/// How often `needle` occurs in the session's transcript.
async fn occurrences(h: &Harness, id: &SessionId, needle: &str) -> usize {
    h.transcript_text(id).await.matches(needle).count()
}

/// Stops everything; answered once every agent is gone.
async fn shutdown(h: &Harness) {
    let done = tokio::time::timeout(WAIT, async {
        ractor::call!(h.sup, SupervisorMsg::Shutdown).expect("shutdown call")
    })
    .await;
    assert!(done.is_ok(), "shutdown did not finish");
    assert_eq!(h.live_count().await, 0);
}

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

/// ACP: one permission request in the first turn; later turns just talk.
fn acp_permission() -> Value {
    json!({"turns": [
        [
            {"tool_call": {"id": "t1", "title": "Write notes.txt", "kind": "edit", "status": "pending"}},
            {"permission": {"tool_call_id": "t1", "title": "Write notes.txt", "kind": "edit"}},
            {"chunk": " after-permission."}
        ],
        [{"chunk": "later turn."}]
    ]})
}

/// Intercom: one `clearance/request` (id `req-001`) in the first turn.
fn intercom_clearance() -> Value {
    json!({"protocol": "intercom", "turns": [
        [
            {"clearance": {
                "id": "req-001",
                "title": "Create new module",
                "description": "Adding src/driver/mod.rs",
                "diff": "--- /dev/null\n+++ b/src/driver/mod.rs\n@@ -0,0 +1 @@\n+pub mod acp;\n",
                "file_path": "src/driver/mod.rs",
                "risk_level": "low"
            }},
            {"status": "clearance turn done"}
        ],
        [{"status": "later turn"}]
    ]})
}

/// Intercom: one `prompt/forward` (id `prompt-001`) in the first turn.
fn intercom_forward() -> Value {
    json!({"protocol": "intercom", "turns": [
        [
            {"forward_prompt": {
                "id": "prompt-001",
                "text": "Should I refactor the error handling?",
                "type": "continuation"
            }},
            {"status": "forward turn done"}
        ],
        [{"status": "later turn"}]
    ]})
}

/// Intercom: every turn just says it waits for instructions.
fn intercom_waiting() -> Value {
    json!({"protocol": "intercom", "turns": [[{"status": "waiting for instruction"}]]})
}

// ---------------------------------------------------------------------------
// 1. resolve_clearance approved
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_01_resolve_clearance_approved() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(acp_permission(), "write the notes").await;
    let req = until_opened(&h, &rec.id, "req-1").await;
    assert_eq!(req.kind, RequestKind::Permission);
    assert_eq!(req.status, RequestStatus::Pending);
    assert_eq!(pending_in_store(&h, &rec.id).await.len(), 1);

    let d = decide_as(&h, &rec.id, "req-1", Choice::Approve, None, owner())
        .await
        .expect("approved");
    assert!(d.approved);
    assert_eq!(d.option_id, "allow-once");
    assert_eq!(d.decided_by, "U_OWNER");
    assert_eq!(d.reason, None);

    // The agent received the approval and carried on with its turn.
    h.until_transcript(&rec.id, "permission t1: selected allow-once")
        .await;
    h.until_transcript(&rec.id, "after-permission.").await;
    let (status, decision) = request_status(&h, &req.id).await;
    assert_eq!(status, RequestStatus::Decided);
    assert_eq!(decision.as_ref(), Some(&d));
    h.until("request closed as decided", |e| {
        matches!(e, OperatorEvent::RequestClosed { id, status: RequestStatus::Decided, decision: Some(d), .. }
            if id == &req.id && d.approved)
    })
    .await;
    assert!(snapshot(&h, &rec.id).await.pending.is_empty());
    assert!(pending_in_store(&h, &rec.id).await.is_empty());
    assert!(
        h.store
            .audit_entries()
            .iter()
            .any(|a| a.action == "request.decided" && a.detail["approved"] == json!(true))
    );
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_01_resolve_clearance_approved_intercom() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h
        .start(intercom_clearance(), "create the driver module")
        .await;
    let req = until_opened(&h, &rec.id, "req-1").await;
    // The dialect's own id is what the answer correlates on.
    assert_eq!(req.wire_id.as_deref(), Some("\"req-001\""));
    assert_eq!(req.kind, RequestKind::Permission);
    assert!(req.title.contains("Create new module"), "{}", req.title);
    assert!(req.title.contains("low risk"), "{}", req.title);
    assert!(
        req.title.contains("Adding src/driver/mod.rs"),
        "{}",
        req.title
    );
    assert_eq!(req.paths, vec!["src/driver/mod.rs".to_owned()]);
    assert!(req.diff.as_deref().unwrap_or("").contains("+pub mod acp;"));
    let ids: Vec<&str> = req.options.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, ["approve", "reject"]);

    let d = decide_as(&h, &rec.id, "req-1", Choice::Approve, None, owner())
        .await
        .expect("approved");
    assert!(d.approved);
    assert_eq!(d.option_id, "approve");
    // clearance/response {"status": "approved"} reached the agent.
    let text = h
        .until_transcript(&rec.id, "clearance req-001: approved")
        .await;
    assert!(text.contains("prompt: create the driver module"), "{text}");
    h.until_transcript(&rec.id, "clearance turn done").await;
    assert_eq!(request_status(&h, &req.id).await.0, RequestStatus::Decided);
    shutdown(&h).await;
}

// ---------------------------------------------------------------------------
// 2. resolve_clearance rejected (with reason)
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_02_resolve_clearance_rejected() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(acp_permission(), "write the notes").await;
    let req = until_opened(&h, &rec.id, "req-1").await;

    let d = decide_as(
        &h,
        &rec.id,
        "req-1",
        Choice::Reject,
        Some("not in this PR"),
        owner(),
    )
    .await
    .expect("rejected");
    assert!(!d.approved);
    assert_eq!(d.option_id, "reject-once");
    assert_eq!(d.reason.as_deref(), Some("not in this PR"));

    h.until_transcript(&rec.id, "permission t1: selected reject-once")
        .await;
    // ACP's permission answer has no reason field: the reason is the record's.
    let (status, decision) = request_status(&h, &req.id).await;
    assert_eq!(status, RequestStatus::Decided);
    assert_eq!(
        decision.and_then(|d| d.reason).as_deref(),
        Some("not in this PR")
    );
    assert!(h.store.audit_entries().iter().any(|a| {
        a.action == "request.decided"
            && a.detail["approved"] == json!(false)
            && a.detail["reason"] == json!("not in this PR")
    }));
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_02_resolve_clearance_rejected_intercom() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h
        .start(intercom_clearance(), "create the driver module")
        .await;
    let req = until_opened(&h, &rec.id, "req-1").await;

    let d = decide_as(
        &h,
        &rec.id,
        "req-1",
        Choice::Option("reject".into()),
        Some("too risky"),
        owner(),
    )
    .await
    .expect("rejected");
    assert!(!d.approved);
    assert_eq!(d.reason.as_deref(), Some("too risky"));
    // clearance/response {"status": "rejected", "reason": "too risky"}.
    h.until_transcript(&rec.id, "clearance req-001: rejected too risky")
        .await;
    assert_eq!(request_status(&h, &req.id).await.0, RequestStatus::Decided);
    shutdown(&h).await;
}

// ---------------------------------------------------------------------------
// 3. resolve_clearance unknown
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_03_resolve_clearance_unknown() {
    let h = Harness::new(Knobs::default()).await;
    let acp = h.start(acp_permission(), "write the notes").await;
    let dialect = h.start(intercom_clearance(), "create the module").await;
    let acp_req = until_opened(&h, &acp.id, "req-1").await;
    let dialect_req = until_opened(&h, &dialect.id, "req-1").await;

    for id in [&acp.id, &dialect.id] {
        let r = decide_as(&h, id, "req-99", Choice::Approve, None, owner()).await;
        assert_eq!(r, Err(SessionError::NotFound("req-99".into())));
        // The dialect's wire id is not a session-scoped id.
        let r = decide_as(&h, id, "req-001", Choice::Approve, None, owner()).await;
        assert_eq!(r, Err(SessionError::NotFound("req-001".into())));
    }
    // An option the agent did not offer is refused too.
    let r = decide_as(
        &h,
        &acp.id,
        "req-1",
        Choice::Option("maybe".into()),
        None,
        owner(),
    )
    .await;
    assert!(
        matches!(&r, Err(SessionError::InvalidOption { option, valid })
            if option == "maybe" && valid.contains("allow-once")),
        "{r:?}"
    );
    // Nothing changed: both requests are still pending, in the actors and the store.
    assert_eq!(
        request_status(&h, &acp_req.id).await.0,
        RequestStatus::Pending
    );
    assert_eq!(
        request_status(&h, &dialect_req.id).await.0,
        RequestStatus::Pending
    );
    assert_eq!(snapshot(&h, &acp.id).await.pending.len(), 1);
    assert_eq!(snapshot(&h, &dialect.id).await.pending.len(), 1);

    // A known id that was already decided is AlreadyResolved, not NotFound.
    decide_as(&h, &acp.id, "req-1", Choice::Approve, None, owner())
        .await
        .expect("decided");
    let again = decide_as(&h, &acp.id, "req-1", Choice::Approve, None, owner()).await;
    assert!(
        matches!(&again, Err(SessionError::AlreadyResolved { id, status })
            if id == &acp_req.id && status == "decided"),
        "{again:?}"
    );

    // An unknown session has no actor at all.
    assert!(
        lookup(&h, &SessionId("no-such-session".into()))
            .await
            .is_none()
    );
    shutdown(&h).await;
}

// ---------------------------------------------------------------------------
// 4. send_prompt
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_04_send_prompt() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[{"chunk": "first turn."}], [{"chunk": "second turn."}]]});
    let rec = h.start(scenario, "start here").await;
    h.until_transcript(&rec.id, "first turn.").await;
    until_idle(&h, &rec.id).await;

    // Idle: the prompt goes straight to the agent as a new session/prompt.
    let out = steer(&h, &rec.id, "focus on error handling", false, owner())
        .await
        .expect("steered");
    assert!(!out.queued);
    let text = h
        .until_transcript(&rec.id, "prompt: focus on error handling")
        .await;
    assert!(
        text.contains("[user:text] focus on error handling"),
        "{text}"
    );
    h.until_transcript(&rec.id, "second turn.").await;
    let sid = out.steering_id;
    h.until("steering delivered", |e| {
        matches!(e, OperatorEvent::SteeringDelivered { steering_id, .. } if *steering_id == sid)
    })
    .await;
    assert!(
        h.store
            .undelivered_steering(&rec.id)
            .await
            .expect("undelivered")
            .is_empty()
    );
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_04_send_prompt_during_a_turn_is_queued_then_delivered() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(acp_permission(), "write the notes").await;
    until_opened(&h, &rec.id, "req-1").await;

    let out = steer(&h, &rec.id, "then update the changelog", false, owner())
        .await
        .expect("steered");
    assert!(out.queued, "a running turn queues steering");
    let snap = snapshot(&h, &rec.id).await;
    assert!(snap.turn_running);
    assert_eq!(snap.queued.len(), 1);
    assert_eq!(snap.queued[0].text, "then update the changelog");
    assert_eq!(
        h.store
            .undelivered_steering(&rec.id)
            .await
            .expect("undelivered")
            .len(),
        1
    );
    assert_eq!(
        occurrences(&h, &rec.id, "prompt: then update the changelog").await,
        0
    );

    decide_as(&h, &rec.id, "req-1", Choice::Approve, None, owner())
        .await
        .expect("decided");
    // The turn ends, then the queued prompt starts the next one.
    let text = h
        .until_transcript(&rec.id, "prompt: then update the changelog")
        .await;
    let approved = text.find("permission t1: selected allow-once");
    let prompted = text.find("prompt: then update the changelog");
    assert!(approved < prompted, "{text}");
    h.until_transcript(&rec.id, "later turn.").await;
    assert!(snapshot(&h, &rec.id).await.queued.is_empty());
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_04_send_prompt_intercom() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(intercom_waiting(), "start here").await;
    h.until_transcript(&rec.id, "prompt: start here").await;
    let out = steer(&h, &rec.id, "Focus on the parser next.", false, owner())
        .await
        .expect("steered");
    assert!(!out.queued);
    // prompt/send {"text": ...} reached the agent and started a turn.
    h.until_transcript(&rec.id, "prompt: Focus on the parser next.")
        .await;
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_04_send_prompt_to_a_stopping_session_is_refused() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(acp_permission(), "write the notes").await;
    until_opened(&h, &rec.id, "req-1").await;
    let actor = h.actor(&rec.id).await;
    // Both messages are in the mailbox before the actor handles either.
    let (stop_tx, stop_rx) = ractor::concurrency::oneshot();
    let (steer_tx, steer_rx) = ractor::concurrency::oneshot();
    actor
        .send_message(SessionMsg::Stop {
            cause: StopCause::Operator,
            caller: owner(),
            reply: Some(stop_tx.into()),
        })
        .expect("send stop");
    actor
        .send_message(SessionMsg::Steer {
            text: "too late".into(),
            interrupt: false,
            caller: owner(),
            reply: steer_tx.into(),
        })
        .expect("send steer");
    assert_eq!(stop_rx.await.expect("stop reply"), Ok(()));
    let r = steer_rx.await.expect("steer reply");
    assert!(matches!(r, Err(SessionError::NotLive(_))), "{r:?}");
    assert_eq!(until_ended(&h, &rec.id).await.0, SessionStatus::Cancelled);
    assert!(
        h.store
            .undelivered_steering(&rec.id)
            .await
            .expect("undelivered")
            .is_empty(),
        "a refused prompt is not stored"
    );
    // Once it has ended the supervisor forgets it: there is nothing to send to.
    until_gone(&h, &rec.id).await;
    shutdown(&h).await;
}

// ---------------------------------------------------------------------------
// 5. interrupt
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_05_interrupt() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(acp_permission(), "write the notes").await;
    let req = until_opened(&h, &rec.id, "req-1").await;
    let actor = h.actor(&rec.id).await;

    stop(&h, &rec.id, owner()).await.expect("stop begins");
    let (status, reason) = until_ended(&h, &rec.id).await;
    assert_eq!(status, SessionStatus::Cancelled);
    assert_eq!(reason.as_deref(), Some("stopped by operator"));
    // session/cancel, then the pending permission answered `cancelled`: the
    // agent says so and ends its turn. (Its last lines race its exit inside
    // the server; on this current-thread runtime the frames win. See
    // `contract_06_last_lines_before_exit_are_kept` in stream_contract.rs.)
    let text = h.transcript_text(&rec.id).await;
    assert!(text.contains("permission t1: cancelled"), "{text}");
    assert!(!text.contains("after-permission."), "{text}");
    // The agent's pending permission was answered `cancelled` and recorded so.
    assert_eq!(
        request_status(&h, &req.id).await.0,
        RequestStatus::Cancelled
    );
    h.until("request closed as cancelled", |e| {
        matches!(e, OperatorEvent::RequestClosed { id, status: RequestStatus::Cancelled, .. } if id == &req.id)
    })
    .await;
    let stored = h
        .until_record(&rec.id, "cancelled", |r| {
            r.status == SessionStatus::Cancelled
        })
        .await;
    assert_eq!(stored.status_reason.as_deref(), Some("stopped by operator"));
    let audit = h.store.audit_entries();
    assert!(
        audit
            .iter()
            .any(|a| a.action == "session.stop_requested" && a.actor == "U_OWNER")
    );
    assert!(audit.iter().any(|a| a.action == "session.ended"));

    // Interrupting again is harmless: the supervisor has forgotten the
    // session, and the old actor no longer takes messages (no panic).
    until_gone(&h, &rec.id).await;
    let r = ractor::call!(actor, |reply| SessionMsg::Stop {
        cause: StopCause::Operator,
        caller: owner(),
        reply: Some(reply)
    });
    assert!(r.is_err(), "a stopped actor cannot be called: {r:?}");
    assert_eq!(h.live_count().await, 0);
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_05_interrupt_is_idempotent_while_stopping() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(acp_permission(), "write the notes").await;
    until_opened(&h, &rec.id, "req-1").await;
    let actor = h.actor(&rec.id).await;
    // Two interrupts queued back to back: the second finds the session
    // already stopping and is a no-op that succeeds.
    let (a_tx, a_rx) = ractor::concurrency::oneshot();
    let (b_tx, b_rx) = ractor::concurrency::oneshot();
    for tx in [a_tx, b_tx] {
        actor
            .send_message(SessionMsg::Stop {
                cause: StopCause::Operator,
                caller: owner(),
                reply: Some(tx.into()),
            })
            .expect("send stop");
    }
    assert_eq!(a_rx.await.expect("first reply"), Ok(()));
    assert_eq!(b_rx.await.expect("second reply"), Ok(()));
    assert_eq!(until_ended(&h, &rec.id).await.0, SessionStatus::Cancelled);
    let ended = h
        .sink
        .events()
        .iter()
        .filter(|e| matches!(e, OperatorEvent::SessionEnded { session_id, .. } if session_id == &rec.id))
        .count();
    assert_eq!(ended, 1, "one stop, one ending");
    let requested = h
        .store
        .audit_entries()
        .iter()
        .filter(|a| a.action == "session.stop_requested")
        .count();
    assert_eq!(requested, 2, "both requests are audited");
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_05_interrupt_intercom() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(intercom_clearance(), "create the module").await;
    let req = until_opened(&h, &rec.id, "req-1").await;

    stop(&h, &rec.id, owner()).await.expect("stop begins");
    // session/interrupt: the agent says so and exits 0; that is a clean stop.
    let (status, reason) = until_ended(&h, &rec.id).await;
    assert_eq!(status, SessionStatus::Cancelled);
    assert_eq!(reason.as_deref(), Some("stopped by operator"));
    // It got the interrupt while waiting for its clearance, so it never saw
    // the clearance answer (same caveat on the last lines as above).
    let text = h.transcript_text(&rec.id).await;
    assert!(text.contains("[agent:text] interrupted"), "{text}");
    assert!(!text.contains("clearance req-001:"), "{text}");
    assert_eq!(
        request_status(&h, &req.id).await.0,
        RequestStatus::Cancelled
    );
    assert!(
        !h.sink.events().iter().any(
            |e| matches!(e, OperatorEvent::Notice { session_id, .. } if session_id == &rec.id)
        ),
        "a requested stop is not reported as a crash"
    );
    until_gone(&h, &rec.id).await;
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_05_interrupt_and_steer_cancels_the_turn_only() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(acp_permission(), "write the notes").await;
    let req = until_opened(&h, &rec.id, "req-1").await;

    // Interrupt-and-steer: session/cancel for the turn, the permission is
    // answered `cancelled`, and the new prompt follows; the session lives on.
    let out = steer(&h, &rec.id, "do something else", true, owner())
        .await
        .expect("steered");
    assert!(out.queued);
    let text = h
        .until_transcript(&rec.id, "prompt: do something else")
        .await;
    assert!(text.contains("permission t1: cancelled"), "{text}");
    assert!(!text.contains("after-permission."), "{text}");
    assert_eq!(
        request_status(&h, &req.id).await.0,
        RequestStatus::Cancelled
    );
    h.until_transcript(&rec.id, "later turn.").await;
    assert_eq!(snapshot(&h, &rec.id).await.status, SessionStatus::Active);
    shutdown(&h).await;
}

// ---------------------------------------------------------------------------
// 6. concurrent resolution
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_06_concurrent_resolution() {
    let h = Harness::new(Knobs::default()).await;
    let a = h.start(acp_permission(), "session a").await;
    let b = h.start(acp_permission(), "session b").await;
    let c = h.start(intercom_clearance(), "session c").await;
    for id in [&a.id, &b.id, &c.id] {
        until_opened(&h, id, "req-1").await;
    }

    let (ra, rb, rc) = tokio::join!(
        decide_as(&h, &a.id, "req-1", Choice::Approve, None, owner()),
        decide_as(&h, &b.id, "req-1", Choice::Reject, Some("no"), owner()),
        decide_as(&h, &c.id, "req-1", Choice::Approve, None, owner()),
    );
    assert!(ra.expect("a decided").approved);
    assert!(!rb.expect("b decided").approved);
    assert!(rc.expect("c decided").approved);
    h.until_transcript(&a.id, "permission t1: selected allow-once")
        .await;
    h.until_transcript(&b.id, "permission t1: selected reject-once")
        .await;
    h.until_transcript(&c.id, "clearance req-001: approved")
        .await;
    for id in [&a.id, &b.id, &c.id] {
        assert!(pending_in_store(&h, id).await.is_empty());
    }
    shutdown(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_06_the_same_request_resolved_concurrently_wins_once() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(acp_permission(), "write the notes").await;
    let req = until_opened(&h, &rec.id, "req-1").await;
    let admin = Caller {
        id: "U_ADMIN".into(),
        operator: true,
    };

    let (r1, r2) = tokio::join!(
        decide_as(&h, &rec.id, "req-1", Choice::Approve, None, owner()),
        decide_as(&h, &rec.id, "req-1", Choice::Reject, Some("racing"), admin),
    );
    let results = [r1, r2];
    let winners: Vec<&Decision> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "exactly one decision wins: {results:?}");
    let loser = results
        .iter()
        .find_map(|r| r.as_ref().err())
        .expect("one loses");
    assert!(
        matches!(loser, SessionError::AlreadyResolved { id, status } if id == &req.id && status == "decided"),
        "{loser:?}"
    );
    let winner = winners[0].clone();
    let (status, stored) = request_status(&h, &req.id).await;
    assert_eq!(status, RequestStatus::Decided);
    assert_eq!(stored, Some(winner.clone()), "the store has the winner");

    // The agent got exactly one answer: the winner's.
    let line = format!("permission t1: selected {}", winner.option_id);
    h.until_transcript(&rec.id, &line).await;
    h.until_transcript(&rec.id, "after-permission.").await;
    assert_eq!(occurrences(&h, &rec.id, "permission t1: selected").await, 1);
    let decided = h
        .store
        .audit_entries()
        .iter()
        .filter(|a| a.action == "request.decided")
        .count();
    assert_eq!(decided, 1);
    shutdown(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_06_many_concurrent_callers_one_winner() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(intercom_clearance(), "create the module").await;
    until_opened(&h, &rec.id, "req-1").await;
    let actor = h.actor(&rec.id).await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let actor = actor.clone();
        tasks.push(tokio::spawn(async move {
            let caller = Caller {
                id: format!("U_OP{i}"),
                operator: true,
            };
            ractor::call!(actor, |reply| SessionMsg::Decide {
                request_id: "req-1".into(),
                choice: Choice::Approve,
                reason: None,
                caller,
                reply
            })
            .expect("decide call")
        }));
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.expect("task") {
            Ok(_) => ok += 1,
            Err(SessionError::AlreadyResolved { .. }) => {}
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(ok, 1);
    h.until_transcript(&rec.id, "clearance turn done").await;
    assert_eq!(
        occurrences(&h, &rec.id, "clearance req-001: approved").await,
        1
    );
    shutdown(&h).await;
}

// ---------------------------------------------------------------------------
// 7. session-scoped ids
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_07_session_scoped_ids() {
    let h = Harness::new(Knobs::default()).await;
    let a = h.start(acp_permission(), "session a").await;
    let b = h.start(acp_permission(), "session b").await;
    let ra = until_opened(&h, &a.id, "req-1").await;
    let rb = until_opened(&h, &b.id, "req-1").await;
    assert_ne!(ra.id, rb.id, "global ids differ");
    assert_eq!(ra.id, PendingRequest::global_id(&a.id, "req-1"));

    decide_as(&h, &a.id, "req-1", Choice::Approve, None, owner())
        .await
        .expect("a decided");
    h.until_transcript(&a.id, "permission t1: selected allow-once")
        .await;

    // b's req-1 is untouched: pending in its actor and in the store, and its
    // agent has heard nothing.
    let snap = snapshot(&h, &b.id).await;
    assert_eq!(snap.pending.len(), 1);
    assert_eq!(snap.pending[0].request_id, "req-1");
    assert_eq!(snap.pending[0].id, rb.id);
    assert!(snap.turn_running);
    assert_eq!(request_status(&h, &rb.id).await.0, RequestStatus::Pending);
    assert_eq!(pending_in_store(&h, &b.id).await.len(), 1);
    assert_eq!(occurrences(&h, &b.id, "permission t1").await, 0);

    // And it can still be resolved on its own.
    decide_as(&h, &b.id, "req-1", Choice::Reject, None, owner())
        .await
        .expect("b decided");
    h.until_transcript(&b.id, "permission t1: selected reject-once")
        .await;
    assert_eq!(
        occurrences(&h, &a.id, "permission t1: selected reject-once").await,
        0
    );
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_07_session_scoped_ids_intercom() {
    let h = Harness::new(Knobs::default()).await;
    // Both agents use the dialect id `req-001` for their clearance.
    let a = h.start(intercom_clearance(), "session a").await;
    let b = h.start(intercom_clearance(), "session b").await;
    let ra = until_opened(&h, &a.id, "req-1").await;
    let rb = until_opened(&h, &b.id, "req-1").await;
    assert_eq!(ra.wire_id, rb.wire_id);
    assert_ne!(ra.id, rb.id);

    decide_as(
        &h,
        &b.id,
        "req-1",
        Choice::Reject,
        Some("wrong crate"),
        owner(),
    )
    .await
    .expect("b decided");
    h.until_transcript(&b.id, "clearance req-001: rejected wrong crate")
        .await;

    let snap = snapshot(&h, &a.id).await;
    assert_eq!(snap.pending.len(), 1);
    assert_eq!(snap.pending[0].id, ra.id);
    assert_eq!(request_status(&h, &ra.id).await.0, RequestStatus::Pending);
    assert_eq!(occurrences(&h, &a.id, "clearance req-001").await, 0);

    decide_as(&h, &a.id, "req-1", Choice::Approve, None, owner())
        .await
        .expect("a decided");
    h.until_transcript(&a.id, "clearance req-001: approved")
        .await;
    assert_eq!(
        occurrences(&h, &b.id, "clearance req-001: approved").await,
        0
    );
    shutdown(&h).await;
}

// ---------------------------------------------------------------------------
// 8. owner verification
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_08_owner_verification() {
    let knobs = Knobs {
        operators: vec!["U_OPS".into()],
        ..Knobs::default()
    };
    let h = Harness::new(knobs).await;
    let rec = h.start(acp_permission(), "write the notes").await;
    assert_eq!(rec.owner, "U_OWNER");
    let req = until_opened(&h, &rec.id, "req-1").await;

    let r = decide_as(&h, &rec.id, "req-1", Choice::Approve, None, stranger()).await;
    assert_eq!(
        r,
        Err(SessionError::Unauthorized {
            user: "U_OTHER".into(),
            session: rec.id.clone(),
            owner: "U_OWNER".into(),
        })
    );
    // Every session-modifying action is refused the same way.
    let r = steer(&h, &rec.id, "hijack", false, stranger()).await;
    assert!(matches!(r, Err(SessionError::Unauthorized { .. })), "{r:?}");
    let r = stop(&h, &rec.id, stranger()).await;
    assert!(matches!(r, Err(SessionError::Unauthorized { .. })), "{r:?}");
    let r = nudge(&h, &rec.id, stranger()).await;
    assert!(matches!(r, Err(SessionError::Unauthorized { .. })), "{r:?}");

    // Nothing changed.
    let snap = snapshot(&h, &rec.id).await;
    assert_eq!(snap.status, SessionStatus::Active);
    assert_eq!(snap.pending.len(), 1);
    assert!(snap.queued.is_empty());
    assert_eq!(request_status(&h, &req.id).await.0, RequestStatus::Pending);
    assert!(
        h.store
            .undelivered_steering(&rec.id)
            .await
            .expect("undelivered")
            .is_empty()
    );
    assert_eq!(occurrences(&h, &rec.id, "hijack").await, 0);
    let denied: Vec<String> = h
        .store
        .audit_entries()
        .into_iter()
        .filter(|a| a.action == "action.denied" && a.actor == "U_OTHER")
        .map(|a| {
            assert_eq!(a.session_id.as_ref(), Some(&rec.id));
            assert_eq!(a.detail["owner"], json!("U_OWNER"));
            a.detail["action"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    assert_eq!(denied, ["decide", "steer", "stop", "nudge"]);

    // A configured operator (by id) may steer; an operator caller may decide.
    let out = steer(&h, &rec.id, "ops says hi", false, {
        Caller {
            id: "U_OPS".into(),
            operator: false,
        }
    })
    .await
    .expect("configured operator steers");
    assert!(out.queued);
    let admin = Caller {
        id: "U_ADMIN".into(),
        operator: true,
    };
    let d = decide_as(&h, &rec.id, "req-1", Choice::Approve, None, admin)
        .await
        .expect("operator decides");
    assert_eq!(d.decided_by, "U_ADMIN");
    h.until_transcript(&rec.id, "permission t1: selected allow-once")
        .await;
    h.until_transcript(&rec.id, "prompt: ops says hi").await;
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_08_owner_verification_intercom() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(intercom_forward(), "think about it").await;
    let req = until_opened(&h, &rec.id, "req-1").await;
    let r = decide_as(
        &h,
        &rec.id,
        "req-1",
        Choice::Option("refine".into()),
        Some("x"),
        stranger(),
    )
    .await;
    assert!(matches!(r, Err(SessionError::Unauthorized { .. })), "{r:?}");
    let r = steer(&h, &rec.id, "hijack", false, stranger()).await;
    assert!(matches!(r, Err(SessionError::Unauthorized { .. })), "{r:?}");
    assert_eq!(request_status(&h, &req.id).await.0, RequestStatus::Pending);
    assert_eq!(snapshot(&h, &rec.id).await.pending.len(), 1);
    decide_as(
        &h,
        &rec.id,
        "req-1",
        Choice::Option("continue".into()),
        None,
        owner(),
    )
    .await
    .expect("owner decides");
    h.until_transcript(&rec.id, "prompt prompt-001: continue")
        .await;
    assert_eq!(occurrences(&h, &rec.id, "hijack").await, 0);
    shutdown(&h).await;
}

// ---------------------------------------------------------------------------
// 9. prompt resolution (prompt/forward -> prompt/response)
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_09_prompt_resolution() {
    let h = Harness::new(Knobs::default()).await;
    let a = h.start(intercom_forward(), "session a").await;
    let b = h.start(intercom_forward(), "session b").await;
    let ra = until_opened(&h, &a.id, "req-1").await;
    until_opened(&h, &b.id, "req-1").await;
    assert_eq!(ra.kind, RequestKind::ForwardedPrompt);
    assert_eq!(
        ra.title,
        "[continuation] Should I refactor the error handling?"
    );
    assert_eq!(ra.wire_id.as_deref(), Some("\"prompt-001\""));
    let ids: Vec<&str> = ra.options.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, ["continue", "refine", "stop"]);

    // Refine with an instruction, in session a only.
    let d = decide_as(
        &h,
        &a.id,
        "req-1",
        Choice::Option("refine".into()),
        Some("only the parser module"),
        owner(),
    )
    .await
    .expect("refined");
    assert_eq!(d.option_id, "refine");
    assert!(d.approved);
    assert_eq!(d.reason.as_deref(), Some("only the parser module"));
    h.until_transcript(&a.id, "prompt prompt-001: refine only the parser module")
        .await;
    h.until_transcript(&a.id, "forward turn done").await;
    // prompt/response went to a's stream, not b's.
    assert_eq!(occurrences(&h, &b.id, "prompt prompt-001").await, 0);
    assert_eq!(snapshot(&h, &b.id).await.pending.len(), 1);

    // Stop (the reject option) in session b.
    let d = decide_as(&h, &b.id, "req-1", Choice::Reject, Some("enough"), owner())
        .await
        .expect("stopped");
    assert_eq!(d.option_id, "stop");
    assert!(!d.approved);
    h.until_transcript(&b.id, "prompt prompt-001: stop enough")
        .await;
    assert_eq!(occurrences(&h, &a.id, "prompt prompt-001: stop").await, 0);
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_09_prompt_resolution_continue_without_instruction() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(intercom_forward(), "think about it").await;
    let req = until_opened(&h, &rec.id, "req-1").await;
    let d = decide_as(&h, &rec.id, "req-1", Choice::Approve, None, owner())
        .await
        .expect("continued");
    assert_eq!(d.option_id, "continue");
    let text = h
        .until_transcript(&rec.id, "prompt prompt-001: continue")
        .await;
    assert!(!text.contains("prompt prompt-001: continue "), "{text}");
    assert_eq!(request_status(&h, &req.id).await.0, RequestStatus::Decided);
    shutdown(&h).await;
}

// ---------------------------------------------------------------------------
// 10. wait resolution (prompt/send)
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_10_wait_resolution() {
    let h = Harness::new(Knobs::default()).await;
    let a = h.start(intercom_waiting(), "session a").await;
    let b = h.start(intercom_waiting(), "session b").await;
    h.until_transcript(&a.id, "waiting for instruction").await;
    h.until_transcript(&b.id, "waiting for instruction").await;

    let out = steer(
        &h,
        &a.id,
        "Focus on the error handling module next.",
        false,
        owner(),
    )
    .await
    .expect("resolved");
    assert!(!out.queued);
    let text = h
        .until_transcript(&a.id, "prompt: Focus on the error handling module next.")
        .await;
    assert!(
        text.contains("[user:text] Focus on the error handling module next."),
        "{text}"
    );
    let sid = out.steering_id;
    h.until("steering delivered", |e| {
        matches!(e, OperatorEvent::SteeringDelivered { session_id, steering_id } if session_id == &a.id && *steering_id == sid)
    })
    .await;
    // The other session's stream got nothing.
    assert_eq!(occurrences(&h, &b.id, "error handling").await, 0);
    // Waiting again after the new turn.
    let deadline = tokio::time::Instant::now() + WAIT;
    while occurrences(&h, &a.id, "waiting for instruction").await < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no second turn:\n{}",
            h.transcript_text(&a.id).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_10_wait_resolution_reaches_a_busy_agent_in_order() {
    let h = Harness::new(Knobs::default()).await;
    let rec = h.start(intercom_clearance(), "create the module").await;
    until_opened(&h, &rec.id, "req-1").await;
    // The dialect has no turn tracking: prompt/send goes out at once and the
    // agent takes it up after its current work.
    let out = steer(&h, &rec.id, "then write tests", false, owner())
        .await
        .expect("sent");
    assert!(!out.queued);
    decide_as(&h, &rec.id, "req-1", Choice::Approve, None, owner())
        .await
        .expect("decided");
    let text = h
        .until_transcript(&rec.id, "prompt: then write tests")
        .await;
    let approved = text.find("clearance req-001: approved").expect("approved");
    let done = text.find("clearance turn done").expect("turn done");
    let prompted = text.find("prompt: then write tests").expect("prompted");
    assert!(approved < done && done < prompted, "{text}");
    h.until_transcript(&rec.id, "later turn").await;
    shutdown(&h).await;
}
