//! Approval rules and modes end to end: automatic answers reach the agent
//! like human ones, deny rules reject, a new rule resolves what is pending,
//! and a session's mode survives a crash-restart of its agent.

mod support;

use intercom_actors::model::RequestStatus;
use intercom_actors::ports::{OperatorEvent, SessionStore};
use intercom_actors::rules::{ApprovalMode, Rule, RuleAction, RuleMatch, Scope, SharedRules};
use intercom_actors::session::{Caller, SessionMsg};
use intercom_actors::supervisor::SupervisorMsg;
use serde_json::{Value, json};
use support::{Harness, Knobs};

fn gate(kind: &str) -> Value {
    json!({"turns": [[
        {"tool_call": {"id": "t1", "title": "Touch file", "kind": kind, "status": "pending"}},
        {"permission": {"tool_call_id": "t1", "title": "Touch file", "kind": kind}}
    ]]})
}

fn rule(id: &str, kind: &str, action: RuleAction) -> Rule {
    Rule {
        id: id.into(),
        scope: Scope::Global,
        matcher: RuleMatch {
            kind: Some(kind.into()),
            ..Default::default()
        },
        action,
    }
}

#[tokio::test]
async fn an_allow_rule_answers_without_a_human() {
    let rules = SharedRules::new(vec![rule("r-edit", "edit", RuleAction::Allow)]);
    let h = Harness::new(Knobs {
        rules,
        ..Knobs::default()
    })
    .await;
    let rec = h.start(gate("edit"), "go").await;
    h.until_transcript(&rec.id, "permission t1: selected allow-once")
        .await;
    let reqs = h
        .store
        .list_requests(Some(&rec.id), false)
        .await
        .expect("list");
    let (_, decision) = h
        .store
        .get_request(&reqs[0].id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(decision.expect("decided").decided_by, "rule:r-edit");
    assert!(
        h.store
            .audit_entries()
            .iter()
            .any(|a| a.action == "request.decided" && a.actor == "rule:r-edit")
    );
    h.until("auto note", |e| matches!(e, OperatorEvent::Notice { text, .. } if text.contains("allowed automatically"))).await;
}

#[tokio::test]
async fn a_deny_rule_rejects() {
    let rules = SharedRules::new(vec![rule("r-no-exec", "execute", RuleAction::Deny)]);
    let h = Harness::new(Knobs {
        rules,
        ..Knobs::default()
    })
    .await;
    let rec = h.start(gate("execute"), "go").await;
    h.until_transcript(&rec.id, "permission t1: selected reject-once")
        .await;
}

#[tokio::test]
async fn a_new_rule_resolves_an_already_pending_request() {
    let rules = SharedRules::default();
    let h = Harness::new(Knobs {
        rules: rules.clone(),
        ..Knobs::default()
    })
    .await;
    let rec = h.start(gate("read"), "go").await;
    h.until("pending", |e| {
        matches!(e, OperatorEvent::RequestOpened { .. })
    })
    .await;
    assert_eq!(
        h.store
            .list_requests(Some(&rec.id), true)
            .await
            .expect("list")
            .len(),
        1
    );
    rules.set(vec![rule("r-read", "read", RuleAction::Allow)]);
    h.sup
        .send_message(SupervisorMsg::RulesChanged)
        .expect("send");
    h.until_transcript(&rec.id, "permission t1: selected allow-once")
        .await;
    let reqs = h
        .store
        .list_requests(Some(&rec.id), false)
        .await
        .expect("list");
    assert_eq!(reqs[0].status, RequestStatus::Decided);
}

#[tokio::test]
async fn the_mode_sticks_across_a_crash_restart() {
    let h = Harness::new(Knobs::default()).await;
    let marker = h.dir.path().join("crash-marker");
    let scenario = json!({"turns": [
        [{"permission": {"tool_call_id": "t0", "title": "first", "kind": "execute"}}],
        [{"exit_once": {"code": 3, "marker": marker}},
         {"permission": {"tool_call_id": "t1", "title": "after restart", "kind": "execute"}}]
    ]});
    let rec = h.start(scenario, "go").await;
    h.until("first ask", |e| {
        matches!(e, OperatorEvent::RequestOpened { .. })
    })
    .await;
    let actor = h.actor(&rec.id).await;
    let owner = Caller {
        id: "U_OWNER".into(),
        operator: false,
    };
    ractor::call!(actor, |reply| SessionMsg::SetMode {
        mode: ApprovalMode::Auto,
        caller: owner.clone(),
        reply
    })
    .expect("call")
    .expect("mode set");
    // Switching to auto answers what was pending.
    h.until_transcript(&rec.id, "permission t0: selected allow-once")
        .await;
    // Next turn: crash once, restart (fresh turn counter in the new process
    // starts at turn 0 again, so steer to reach turn 1 semantics via resume).
    ractor::call!(actor, |reply| SessionMsg::Steer {
        text: "continue".into(),
        interrupt: false,
        caller: owner.clone(),
        reply
    })
    .expect("call")
    .expect("steer");
    h.until("restart", |e| matches!(e, OperatorEvent::Notice { text, .. } if text.contains("resumed the agent's session"))).await;
    let actor = h.actor(&rec.id).await;
    let snap = ractor::call!(actor, SessionMsg::Snapshot).expect("snapshot");
    assert_eq!(snap.mode, ApprovalMode::Auto);
    assert_eq!(
        h.store.approval_mode(&rec.id).await.expect("mode"),
        ApprovalMode::Auto
    );
}

/// The agent decides how many requests an allow rule answers and how long
/// their titles are: every one is decided and audited, but the operator is
/// told of the first ten of a window, each title cut, and the next notice
/// counts the rest.
#[tokio::test]
async fn a_flood_of_automatic_decisions_is_told_bounded() {
    let rules = SharedRules::new(vec![rule("r-edit", "edit", RuleAction::Allow)]);
    let h = Harness::new(Knobs {
        rules,
        ..Knobs::default()
    })
    .await;
    let title = format!("Touch {}", "x".repeat(100_000));
    let mut steps: Vec<Value> = Vec::new();
    for i in 0..30 {
        let id = format!("t{i}");
        steps.push(
            json!({"tool_call": {"id": id, "title": title, "kind": "edit", "status": "pending"}}),
        );
        steps.push(json!({"permission": {"tool_call_id": id, "title": title, "kind": "edit"}}));
    }
    steps.push(json!({"chunk": "\nall asked"}));
    let rec = h.start(json!({"turns": [steps]}), "go").await;
    h.until_transcript(&rec.id, "\nall asked").await;
    let reqs = h
        .store
        .list_requests(Some(&rec.id), false)
        .await
        .expect("list");
    assert_eq!(reqs.len(), 30);
    assert!(reqs.iter().all(|r| r.status == RequestStatus::Decided));
    let notices: Vec<String> = h
        .transcript(&rec.id)
        .await
        .into_iter()
        .map(|m| m.content)
        .filter(|c| c.contains("allowed automatically"))
        .collect();
    // Ten per 10 s window: 30 requests take well under one window here.
    assert!(
        (10..=20).contains(&notices.len()),
        "{} notices",
        notices.len()
    );
    assert!(notices.iter().all(|n| n.len() < 600), "titles are cut");
}
