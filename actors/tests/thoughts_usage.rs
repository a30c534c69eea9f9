//! What the agent is doing, visible: thoughts are stored whole (in the
//! order the agent spoke) and shown to the operator; usage reports reach the
//! operator and the session's live state.

mod support;

use intercom_actors::model::MessageKind;
use intercom_actors::ports::OperatorEvent;
use intercom_actors::session::SessionMsg;
use serde_json::json;
use support::{Harness, Knobs};

#[tokio::test]
async fn thoughts_are_stored_whole_and_usage_is_shown() {
    let h = Harness::new(Knobs::default()).await;
    let usage = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "any",
        "update": {"sessionUpdate": "usage_update", "used": 53000, "size": 200000,
                   "cost": {"amount": 0.05, "currency": "USD"}}}});
    let scenario = json!({"turns": [[
        {"thought": "Let me look "},
        {"thought": "at the files."},
        {"chunk": "Here is the answer."},
        {"raw": usage.to_string()},
        {"chunk": " Done."}
    ]]});
    let rec = h.start(scenario, "go").await;
    h.until("thought", |e| {
        matches!(e, OperatorEvent::AgentThought { text, .. } if text == "Let me look at the files.")
    })
    .await;
    h.until("usage", |e| {
        matches!(e, OperatorEvent::Usage { usage, .. } if usage.used == 53000 && usage.cost == Some(0.05))
    })
    .await;
    h.until_transcript(&rec.id, "Done.").await;
    let entries = h.transcript(&rec.id).await;
    let thought = entries
        .iter()
        .position(|m| m.kind == MessageKind::Thought)
        .expect("the thought is stored");
    assert_eq!(entries[thought].content, "Let me look at the files.");
    let answer = entries
        .iter()
        .position(|m| m.content.contains("Here is the answer."))
        .expect("text stored");
    assert!(thought < answer, "stored in the order spoken: {entries:?}");
    let actor = h.actor(&rec.id).await;
    let snap = ractor::call!(actor, SessionMsg::Snapshot).expect("snapshot");
    let usage = snap.usage.expect("usage on the session");
    assert_eq!((usage.used, usage.size), (53000, 200000));
    assert_eq!(usage.describe(), "53k/200k tokens · 0.05 USD");
}

/// A flood of usage reports is shown as its latest one, not one event per
/// report (each event is stored in the operator's journal): an agent
/// cannot push everything else out of it.
#[tokio::test]
async fn a_flood_of_usage_reports_is_coalesced_to_the_latest() {
    let mut knobs = Knobs::default();
    knobs.limits.inbound_messages_per_sec = 100;
    let h = Harness::new(knobs).await;
    let report = |used: u64| {
        json!({"raw": json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "any",
            "update": {"sessionUpdate": "usage_update", "used": used, "size": 200000}}}).to_string()})
    };
    let mut turn: Vec<_> = (1..=3000).map(report).collect();
    turn.push(json!({"chunk": "after the reports"}));
    let rec = h.start(json!({"turns": [turn]}), "go").await;
    h.until_transcript(&rec.id, "after the reports").await;
    // The latest report is shown (on the next tick at the latest).
    h.until(
        "the latest usage",
        |e| matches!(e, OperatorEvent::Usage { usage, .. } if usage.used == 3000),
    )
    .await;
    let shown = h
        .sink
        .events()
        .iter()
        .filter(|e| matches!(e, OperatorEvent::Usage { .. }))
        .count();
    assert!(
        shown < 500,
        "{shown} usage events for 3000 reports: a flood is not coalesced"
    );
}
