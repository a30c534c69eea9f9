//! What one turn of a hostile agent can cost is bounded.
//!
//! What an agent makes the server write between two prompts: a probe's
//! agent wrote 45,000 tool calls in 15 s (28 MB a second into the
//! database) and pushed every other session's events out of the journal.
//! Past the turn's budget its tool calls are neither kept nor shown, one
//! notice says so, its request still reaches the operator, and the next
//! prompt brings a new budget (a restart nobody asked for does not).
//!
//! How long it can ignore being cancelled: past the shutdown grace it is
//! restarted, and the steering the interrupt was for goes out.

mod support;

use intercom_actors::model::{MessageKind, SessionId, TranscriptEntry};
use intercom_actors::ports::SessionStore;
use intercom_actors::session::Choice;
use intercom_actors::transcript::{Anchor, TranscriptPage};
use support::{Harness, Knobs, decide, request_opened, steer};

/// Every entry of a session's transcript, page by page.
async fn whole_transcript(h: &Harness, id: &SessionId) -> Vec<TranscriptEntry> {
    let mut all = Vec::new();
    let mut anchor = Anchor::After(0);
    loop {
        let page = TranscriptPage {
            anchor,
            ..TranscriptPage::LATEST
        };
        let slice = h.store.transcript_page(id, page).await.expect("page");
        let Some(last) = slice.entries.last() else {
            return all;
        };
        anchor = Anchor::After(last.id);
        all.extend(slice.entries);
    }
}

/// `tool(i, title)`: announces a completed read, the flooding agents' unit.
const TOOL: &str = r#"
def tool(i, title):
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1",
          "update": {"sessionUpdate": "tool_call", "toolCallId": "t%d" % i, "title": title,
                     "kind": "read", "status": "completed"}}})
"#;

const FLOODER: &str = r#"
turn = [0]
prompt = [None]
def on(m, method, mid):
    if method == "session/prompt":
        turn[0] += 1
        prompt[0] = mid
        if turn[0] == 1:
            for i in range(20100):
                tool(i, "flood %d" % i)
            ask("p1", "Edit after the flood")
        else:
            tool(0, "kept again")
            send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn"}})
    elif method is None and mid == "p1":
        send({"jsonrpc": "2.0", "id": prompt[0], "result": {"stopReason": "end_turn"}})
"#;

/// Within the budget, every update of a call rewrites the call's one line
/// (the line is taken out of the session's table and put back per update).
#[tokio::test]
async fn a_tool_calls_updates_rewrite_its_one_line() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = serde_json::json!({"turns": [[
        {"tool_call": {"id": "t1", "title": "Build", "kind": "execute", "status": "pending"}},
        {"tool_update": {"id": "t1", "status": "in_progress"}},
        {"tool_update": {"id": "t1", "status": "completed", "title": "Build all"}},
        {"tool_call": {"id": "t2", "title": "Test", "kind": "execute", "status": "pending"}},
        {"chunk": "Done."}
    ]]});
    let rec = h.start(scenario, "go").await;
    h.until_transcript(&rec.id, "Done.").await;
    let all = whole_transcript(&h, &rec.id).await;
    let tools: Vec<&TranscriptEntry> = all.iter().filter(|m| m.kind == MessageKind::Tool).collect();
    assert_eq!(tools.len(), 2, "one line per call: {tools:?}");
    assert!(
        tools[0].content.contains("\"title\":\"Build all\""),
        "{}",
        tools[0].content
    );
    assert!(
        tools[0].content.contains("\"status\":\"completed\""),
        "{}",
        tools[0].content
    );
    assert!(
        tools[1].content.contains("\"title\":\"Test\""),
        "{}",
        tools[1].content
    );
}

#[tokio::test]
async fn tool_calls_past_the_turns_budget_are_dropped_with_one_notice() {
    let h = Harness::new(Knobs::default()).await;
    let profile = h.python_agent(&format!("{TOOL}{FLOODER}"));
    let rec = h
        .start_req(h.request(profile, "flood"))
        .await
        .expect("start");
    // The request after the flood reaches the operator all the same.
    let request = request_opened(&h, 1).await;
    assert_eq!(request.title, "Edit after the flood");
    h.until_transcript(&rec.id, "to the transcript since the last prompt")
        .await;
    let all = whole_transcript(&h, &rec.id).await;
    let tools = all.iter().filter(|m| m.kind == MessageKind::Tool).count();
    assert!(tools <= 20_000, "{tools} tool call lines kept");
    assert!(tools >= 19_000, "only {tools} tool call lines kept");
    assert!(
        !all.iter().any(|m| m.content.contains("flood 20099")),
        "the last calls were kept"
    );
    let notices = all
        .iter()
        .filter(|m| {
            m.content
                .contains("to the transcript since the last prompt")
        })
        .count();
    assert_eq!(notices, 1, "one notice");
    decide(&h, &rec.id, "req-1", Choice::Approve).await;
    // A new prompt: a new budget.
    steer(&h, &rec.id, "again", false).await;
    h.until_transcript(&rec.id, "kept again").await;
}

/// Floods past the turn's budget, then (its first life) exits or goes quiet
/// deaf to cancels and nudges, as `AFTER_FLOOD` says; its second life (the
/// restarted process, given the cut turn again) floods again, then asks (a
/// request always reaches the operator).
const FLOOD_THEN: &str = r#"
import os
second_life = os.path.exists("second-life")
prompt = [None]
def on(m, method, mid):
    if method == "session/prompt" and prompt[0] is None and not second_life:
        prompt[0] = mid
        open("second-life", "w").close()
        for i in range(20100):
            tool(i, "flood %d" % i)
        if AFTER_FLOOD == "exit":
            os._exit(3)
    elif method == "session/prompt" and prompt[0] is None:
        prompt[0] = mid
        for i in range(50):
            tool(i, "second life %d" % i)
        ask("p1", "After the second flood")
    elif method is None and mid == "p1":
        send({"jsonrpc": "2.0", "id": prompt[0], "result": {"stopReason": "end_turn"}})
"#;

/// Runs [`FLOOD_THEN`] (`after_flood`: "exit" or "hang") until its second
/// life asks, then checks why it was restarted (`restarted_for`, in the
/// transcript) and that none of the second life's tool calls was kept.
async fn second_life_keeps_nothing(h: &Harness, after_flood: &str, restarted_for: &str) {
    let agent = format!("AFTER_FLOOD = {after_flood:?}\n{TOOL}{FLOOD_THEN}");
    let rec = h
        .start_req(h.request(h.python_agent(&agent), "flood"))
        .await
        .expect("start");
    // Its tool calls came before its request: all of them are in by now.
    let request = request_opened(h, 1).await;
    assert_eq!(request.title, "After the second flood");
    let all = whole_transcript(h, &rec.id).await;
    assert!(
        all.iter().any(|m| m.content.contains(restarted_for)),
        "restarted for {restarted_for:?}"
    );
    let second = all
        .iter()
        .filter(|m| m.kind == MessageKind::Tool && m.content.contains("second life"))
        .count();
    assert_eq!(second, 0, "the second life's tool calls were kept");
}

/// A restart nobody asked for keeps what the agent wrote since the last
/// prompt: after a crash, the restarted agent's flood is not kept.
#[tokio::test]
async fn a_restart_after_a_flood_does_not_bring_a_new_budget() {
    let h = Harness::new(Knobs::default()).await;
    second_life_keeps_nothing(&h, "exit", "agent exited unexpectedly").await;
}

/// The stall policy's restart (the agent went quiet after a flood and
/// ignored the nudge's cancel) is nobody acting either: a probe's agent
/// flooded, hung, was restarted with a fresh budget and flooded again,
/// 570 MB in 150 s.
#[tokio::test]
async fn a_stall_restart_after_a_flood_does_not_bring_a_new_budget() {
    let mut knobs = Knobs::default();
    knobs.limits.shutdown_grace_secs = 1;
    knobs.stall.inactivity_secs = 1;
    knobs.stall.escalation_secs = 1;
    knobs.stall.max_nudges = 1;
    let h = Harness::new(knobs).await;
    second_life_keeps_nothing(&h, "hang", "of being cancelled").await;
}

/// An agent that ignores `session/cancel` (and keeps chatting, so it never
/// looks stalled) is restarted once the shutdown grace has passed, and the
/// steering the interrupt was for reaches it: an interrupt did nothing, and
/// the steering waited for ever.
#[tokio::test]
async fn an_agent_that_ignores_a_cancel_is_restarted_and_the_steering_goes_out() {
    let mut knobs = Knobs::default();
    knobs.limits.shutdown_grace_secs = 1;
    let h = Harness::new(knobs).await;
    let profile = h.python_agent(
        r#"
def on(m, method, mid):
    if method == "session/prompt":
        text = m["params"]["prompt"][0]["text"]
        if text == "first":
            chunk("busy, and deaf to cancels. ")
        else:
            chunk("got: " + text)
            send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn"}})
"#,
    );
    let rec = h
        .start_req(h.request(profile, "first"))
        .await
        .expect("start");
    h.until_transcript(&rec.id, "deaf to cancels").await;
    steer(&h, &rec.id, "second", true).await;
    h.until_transcript(
        &rec.id,
        "did not end its turn within 1 s of being cancelled",
    )
    .await;
    let text = h.until_transcript(&rec.id, "got: second").await;
    // The interrupted turn was given up for the steering: a fresh agent is
    // not given it again.
    assert!(!text.contains("[system:text] first"), "{text}");
    assert!(!text.contains("lost the cut turn"), "{text}");
}

/// Text blocks count against the turn too: a probe's agent alternated
/// one-byte text with blank thoughts, each thought closing the text before
/// it as its own row and event, 15,000 a second within the turn's text
/// bytes.
#[tokio::test]
async fn text_blocks_split_by_blank_thoughts_count_against_the_turn() {
    let h = Harness::new(Knobs::default()).await;
    let profile = h.python_agent(
        r#"
def thought(t):
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1",
          "update": {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": t}}}})
def on(m, method, mid):
    if method == "session/prompt":
        for i in range(20100):
            chunk("y")
            thought(" ")
        send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn"}})
"#,
    );
    let rec = h
        .start_req(h.request(profile, "split"))
        .await
        .expect("start");
    h.until_transcript(&rec.id, "to the transcript since the last prompt")
        .await;
    let all = whole_transcript(&h, &rec.id).await;
    let blocks = all
        .iter()
        .filter(|m| m.kind == MessageKind::Text && m.content == "y")
        .count();
    assert!(blocks <= 20_000, "{blocks} text blocks kept");
}

/// Requests decided by a mode do not count against the turn's requests: a
/// long autonomous turn in mode `auto` asks for more than the 1,000 the
/// budget leaves undecided.
#[tokio::test]
async fn requests_a_mode_decides_are_not_counted_against_the_turn() {
    let h = Harness::new(Knobs::default()).await;
    let profile = h.python_agent(
        r#"
answered = [0]
def search(rid, n):
    send({"jsonrpc": "2.0", "id": rid, "method": "session/request_permission", "params": {
        "sessionId": "s1", "toolCall": {"toolCallId": "t%d" % n, "title": "grep todo", "kind": "search"},
        "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}})
def on(m, method, mid):
    if method == "session/prompt":
        for i in range(1100):
            search("p%d" % i, i)
    elif method is None and "result" in m:
        answered[0] += 1
        if answered[0] == 1100:
            chunk("all 1100 answered")
    elif method is None and "error" in m:
        chunk("refused " + str(mid))
"#,
    );
    let mut req = h.request(profile, "work alone");
    req.mode = Some(intercom_actors::rules::ApprovalMode::Auto);
    let rec = h.start_req(req).await.expect("start");
    let text = h.until_transcript(&rec.id, "all 1100 answered").await;
    assert!(!text.contains("refused"), "{text}");
}

/// The stall policy's nudges are counted since the last prompt, across the
/// restarts it makes: a probe's agent wrote a line after each prompt and
/// hung, deaf to cancels, and was nudged and restarted for ever (its line
/// cleared the count), never marked stalled.
#[tokio::test]
async fn an_agent_that_hangs_after_every_prompt_is_marked_stalled() {
    let mut knobs = Knobs::default();
    knobs.limits.shutdown_grace_secs = 1;
    knobs.stall.inactivity_secs = 1;
    knobs.stall.escalation_secs = 1;
    knobs.stall.max_nudges = 2;
    let h = Harness::new(knobs).await;
    let profile = h.python_agent(
        r#"
def on(m, method, mid):
    if method == "session/prompt":
        chunk("on it. ")
"#,
    );
    let rec = h.start_req(h.request(profile, "go")).await.expect("start");
    let text = h
        .until_transcript(&rec.id, "The agent is stalled: no activity after 2 nudges")
        .await;
    let restarts = text.matches("restarting it").count();
    assert!(restarts <= 2, "{restarts} restarts:\n{text}");
    let stored = h.store.get_session(&rec.id).await.expect("get");
    assert_eq!(
        stored.map(|s| s.status),
        Some(intercom_actors::model::SessionStatus::Stalled)
    );
}
