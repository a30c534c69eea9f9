//! MCP sessions in the core: an attached client with no child process, its
//! blocking tools answered by operator decisions and steering, and the
//! ACP-MCP bridge token handed to agents that speak HTTP MCP.

mod support;

use intercom_actors::model::{RequestStatus, SessionId, SessionStatus};
use intercom_actors::ports::{NoticeLevel, OperatorEvent, SessionStore};
use intercom_actors::session::{Caller, Choice, McpAnswer, McpCall, SessionMsg};
use intercom_actors::supervisor::{AttachRequest, SupervisorMsg};
use serde_json::json;
use support::{Harness, Knobs, steer};
use tokio::sync::oneshot;

async fn attach(h: &Harness) -> SessionId {
    let req = AttachRequest {
        workspace: "ws".into(),
        cwd: h.workspace.clone(),
        channel_id: Some("C1".into()),
        title: "VS Code".into(),
        owner: "U_OWNER".into(),
    };
    let rec = ractor::call!(h.sup, |reply| SupervisorMsg::Attach { req, reply })
        .expect("call")
        .expect("attached");
    assert_eq!(rec.status, SessionStatus::Active);
    rec.id
}

/// The steering a `ping` (with `status`) hands over, in order.
async fn ping(actor: &ractor::ActorRef<SessionMsg>, status: Option<&str>) -> Vec<String> {
    let (tx, rx) = oneshot::channel();
    actor
        .send_message(SessionMsg::Mcp(McpCall::Ping {
            status: status.map(str::to_owned),
            progress: vec![],
            reply: tx,
        }))
        .expect("ping");
    rx.await
        .expect("answered")
        .into_iter()
        .map(|s| s.text)
        .collect()
}

async fn clearance(h: &Harness, id: &SessionId) -> (String, oneshot::Receiver<McpAnswer>) {
    let (opened, rx) = open_clearance(&h.actor(id).await).await;
    (opened.expect("stored"), rx)
}

/// Asks `actor` for a clearance of main.rs: the request id (or why it was
/// refused) and where the answer will come.
async fn open_clearance(
    actor: &ractor::ActorRef<SessionMsg>,
) -> (Result<String, String>, oneshot::Receiver<McpAnswer>) {
    let (opened_tx, opened_rx) = oneshot::channel();
    let (tx, rx) = oneshot::channel();
    actor
        .send_message(SessionMsg::Mcp(McpCall::Clearance {
            title: "Edit main.rs".into(),
            description: "refactor".into(),
            diff: Some("--- a/main.rs\n+++ b/main.rs\n".into()),
            paths: vec!["main.rs".into()],
            risk_level: "low".into(),
            opened: opened_tx,
            reply: tx,
        }))
        .expect("send");
    (opened_rx.await.expect("opened"), rx)
}

#[tokio::test]
async fn clearance_blocks_until_the_operator_decides() {
    let h = Harness::new(Knobs::default()).await;
    let id = attach(&h).await;
    let (request_id, rx) = clearance(&h, &id).await;
    assert_eq!(request_id, format!("{id}:req-1"));
    assert_eq!(
        h.store
            .list_requests(Some(&id), true)
            .await
            .expect("list")
            .len(),
        1
    );
    let actor = h.actor(&id).await;
    let decision = ractor::call!(actor, |reply| SessionMsg::Decide {
        request_id: "req-1".into(),
        choice: Choice::Reject,
        reason: Some("too risky".into()),
        caller: Caller {
            id: "U_OWNER".into(),
            operator: false
        },
        reply
    })
    .expect("call")
    .expect("decided")
    .decision;
    assert!(!decision.approved);
    match rx.await.expect("answer") {
        McpAnswer::Decided(d) => assert_eq!(
            (d.option_id.as_str(), d.reason.as_deref()),
            ("reject", Some("too risky"))
        ),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn an_abandoned_call_closes_its_request() {
    let h = Harness::new(Knobs::default()).await;
    let id = attach(&h).await;
    let (request_id, rx) = clearance(&h, &id).await;
    let actor = h.actor(&id).await;
    actor
        .send_message(SessionMsg::Mcp(McpCall::Abandon {
            request_id: request_id.clone(),
            status: RequestStatus::Expired,
        }))
        .expect("send");
    assert!(rx.await.is_err(), "the waiter is dropped");
    h.until("closed", |e| {
        matches!(
            e,
            OperatorEvent::RequestClosed {
                status: RequestStatus::Expired,
                ..
            }
        )
    })
    .await;
    let (req, _) = h
        .store
        .get_request(&request_id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(req.status, RequestStatus::Expired);
}

#[tokio::test]
async fn standby_receives_steering_and_ping_drains_the_queue() {
    let h = Harness::new(Knobs::default()).await;
    let id = attach(&h).await;
    let actor = h.actor(&id).await;
    let owner = Caller {
        id: "U_OWNER".into(),
        operator: false,
    };
    // Queued while nobody waits.
    let out = ractor::call!(actor, |reply| SessionMsg::Steer {
        text: "first".into(),
        interrupt: false,
        caller: owner.clone(),
        reply
    })
    .expect("call")
    .expect("ok");
    assert!(out.queued);
    let (tx, rx) = oneshot::channel();
    actor
        .send_message(SessionMsg::Mcp(McpCall::Standby {
            message: Some("waiting".into()),
            reply: tx,
        }))
        .expect("send");
    assert_eq!(rx.await.expect("instruction").as_deref(), Some("first"));
    // A standby that waits gets the next steering at once.
    let (tx, rx) = oneshot::channel();
    actor
        .send_message(SessionMsg::Mcp(McpCall::Standby {
            message: None,
            reply: tx,
        }))
        .expect("send");
    let out = ractor::call!(actor, |reply| SessionMsg::Steer {
        text: "second".into(),
        interrupt: false,
        caller: owner.clone(),
        reply
    })
    .expect("call")
    .expect("ok");
    assert!(!out.queued);
    assert_eq!(rx.await.expect("instruction").as_deref(), Some("second"));
    // Ping hands over everything queued, once.
    for t in ["third", "fourth"] {
        ractor::call!(actor, |reply| SessionMsg::Steer {
            text: t.into(),
            interrupt: false,
            caller: owner.clone(),
            reply
        })
        .expect("call")
        .expect("ok");
    }
    assert_eq!(ping(&actor, Some("50%")).await, vec!["third", "fourth"]);
    assert!(ping(&actor, None).await.is_empty());
    assert!(
        h.store
            .undelivered_steering(&id)
            .await
            .expect("q")
            .is_empty()
    );
}

#[tokio::test]
async fn broadcast_reaches_the_operator_and_disconnect_ends_the_session() {
    let h = Harness::new(Knobs::default()).await;
    let id = attach(&h).await;
    let actor = h.actor(&id).await;
    actor
        .send_message(SessionMsg::Mcp(McpCall::Broadcast {
            message: "tests pass".into(),
            level: NoticeLevel::Info,
        }))
        .expect("send");
    h.until(
        "broadcast",
        |e| matches!(e, OperatorEvent::Notice { text, .. } if text == "tests pass"),
    )
    .await;
    actor
        .send_message(SessionMsg::Mcp(McpCall::Disconnected))
        .expect("send");
    let rec = h
        .until_record(&id, "completed", |r| r.status == SessionStatus::Completed)
        .await;
    assert_eq!(rec.status_reason.as_deref(), Some("client_disconnected"));
    // Not revived, and told why (its "agent" is no profile to start).
    let err = ractor::call!(h.sup, |reply| SupervisorMsg::Revive {
        id: id.clone(),
        profile: h.profile(json!({"turns": []})),
        caller: Caller::local(),
        reply
    })
    .expect("call")
    .expect_err("not revivable");
    assert!(err.to_string().contains("reconnects on its own"), "{err}");
}

#[tokio::test]
async fn the_bridge_is_offered_only_to_agents_that_speak_http_mcp() {
    let h = Harness::new_with_bridge(Knobs::default(), "http://127.0.0.1:9/mcp").await;
    let with = h
        .start(
            json!({"mcp_http": true, "turns": [[{"echo_mcp": true}]]}),
            "go",
        )
        .await;
    let text = h.until_transcript(&with.id, "mcp ").await;
    // The token travels in a header, never in the URL.
    assert!(!text.contains("session_id="), "{text}");
    assert!(text.contains(r#""url":"http://127.0.0.1:9/mcp""#), "{text}");
    let token = text
        .split("Bearer ")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("bearer token in headers")
        .to_owned();
    assert_eq!(token.len(), 64, "{token}");
    let resolved = ractor::call!(h.sup, |reply| SupervisorMsg::ResolveBridgeToken {
        token: token.clone(),
        reply
    })
    .expect("call");
    assert_eq!(resolved, Some(with.id.clone()));
    let bogus = ractor::call!(h.sup, |reply| SupervisorMsg::ResolveBridgeToken {
        token: "nope".into(),
        reply
    })
    .expect("call");
    assert_eq!(bogus, None);
    let without = h
        .start(
            json!({"mcp_http": false, "turns": [[{"echo_mcp": true}]]}),
            "go",
        )
        .await;
    let text = h.until_transcript(&without.id, "mcp ").await;
    assert!(text.contains("mcp []"), "{text}");
}

/// Requests opened and dropped at once never reach the pending cap: a
/// probe's client opened and abandoned 1,000 clearances of 900 KB a minute.
/// Past 1,000 since the operator last acted, new ones are refused; a
/// decision renews the allowance.
#[tokio::test]
async fn requests_opened_and_dropped_are_bounded_until_the_operator_acts() {
    let h = Harness::new(Knobs::default()).await;
    let id = attach(&h).await;
    let actor = h.actor(&id).await;
    let open = || async { open_clearance(&actor).await.0 };
    for _ in 0..1000 {
        let request_id = open().await.expect("taken");
        actor
            .send_message(SessionMsg::Mcp(McpCall::Abandon {
                request_id,
                status: RequestStatus::Cancelled,
            }))
            .expect("abandon");
    }
    let refused = open().await.expect_err("past the allowance");
    assert!(refused.contains("1000 requests"), "{refused}");
    // An instruction from the operator, handed over, renews it.
    steer(&h, &id, "go on", false).await;
    assert_eq!(ping(&actor, None).await, vec!["go on"]);
    open().await.expect("taken again");
}
