//! Slack within Slack's limits: 20 busy sessions in one channel against an
//! emulator that enforces Slack's published rate limits (sped up
//! [`PACE_FACTOR`] times, like the gateway's pacing in these tests).
//!
//! What must hold: nothing is lost (every text and every request reaches the
//! channel, texts in order in their thread), the gateway never draws a `429`
//! (it paces itself instead of learning from refusals), every approval
//! costs two Web API calls on its message (the buttons, then the outcome),
//! and the outbox is empty once everything was delivered.

use agent_intercom::slack;

mod emulator;
mod slack_common;

use std::collections::HashSet;
use std::time::Duration;

use emulator::limits::RateLimits;
use intercom_actors::model::{RequestStatus, SessionId};
use intercom_actors::ports::SessionStore;
use intercom_actors::slack_port::Outbox;
use intercom_actors::supervisor::{StartRequest, SupervisorMsg};
use serde_json::{Value, json};
use slack_common::{CHANNEL, OWNER, PACE_FACTOR, Rig, RigOptions};

/// Sessions sharing the channel.
const SESSIONS: usize = 20;
/// Deadline for the whole busy spell (at 10x Slack's pace it needs ~15 s).
const BUSY_WAIT: Duration = Duration::from_secs(90);

/// Text, a plan, a tool call, more text, a permission request, the tool
/// call's completion and closing text.
fn busy_scenario() -> Value {
    json!({"turns": [[
        {"chunk": "alpha: reading the code."},
        {"plan": [{"content": "edit", "priority": "medium", "status": "in_progress"}]},
        {"tool_call": {"id": "t1", "title": "Write notes.txt", "kind": "edit", "status": "pending"}},
        {"chunk": "beta: about to write."},
        {"permission": {"tool_call_id": "t1", "title": "Write notes.txt", "kind": "edit", "locations": ["notes.txt"]}},
        {"tool_update": {"id": "t1", "status": "completed"}},
        {"chunk": "gamma: done."}
    ], []]})
}

async fn start_sessions(rig: &Rig) -> Vec<SessionId> {
    let mut starts = Vec::new();
    for i in 0..SESSIONS {
        let req = StartRequest {
            workspace: "ws".into(),
            cwd: rig.dir.path().canonicalize().expect("canon").join("ws"),
            channel_id: Some(CHANNEL.into()),
            profile: rig.profiles[0].clone(),
            prompt: format!("busy session {i}"),
            owner: OWNER.into(),
            mode: None,
        };
        let sup = rig.sup.clone();
        starts.push(tokio::spawn(async move {
            ractor::call!(sup, |reply| SupervisorMsg::Start { req, reply })
        }));
    }
    let mut ids = Vec::new();
    for s in starts {
        let rec = s.await.expect("join").expect("call").expect("started");
        ids.push(rec.id);
    }
    ids
}

/// Clicks "allow once" on every request message as soon as it appears,
/// until every one of `want` requests was clicked.
async fn operator(rig: &Rig, want: usize) {
    let mut clicked: HashSet<String> = HashSet::new();
    let deadline = tokio::time::Instant::now() + BUSY_WAIT;
    while clicked.len() < want {
        for m in rig.emu.messages_in(CHANNEL) {
            if clicked.contains(&m.ts) {
                continue;
            }
            if let Some(allow) = m.button("allow-once") {
                rig.emu.click(OWNER, &m, &allow);
                clicked.insert(m.ts.clone());
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {want} requests were posted",
            clicked.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The thread's messages' text, in posting order, as one string.
fn thread_text(rig: &Rig, root: &str) -> String {
    rig.emu
        .thread(CHANNEL, root)
        .iter()
        .map(|m| m.text.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `needles` appear in `text` in this order.
fn in_order(text: &str, needles: &[&str]) -> bool {
    let mut at = 0;
    needles.iter().all(|n| match text[at..].find(n) {
        Some(i) => {
            at += i + n.len();
            true
        }
        None => false,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_busy_sessions_in_one_channel_stay_within_slacks_limits() {
    let options = RigOptions {
        emulator_limits: Some(RateLimits::slack().faster(PACE_FACTOR)),
        max_sessions: SESSIONS,
        ..RigOptions::default()
    };
    let rig = Rig::start_with(&[("busy", busy_scenario())], options).await;
    let ids = start_sessions(&rig).await;
    operator(&rig, SESSIONS).await;

    // Every session finishes its turn and every text reaches its thread.
    let mut roots = Vec::new();
    for id in &ids {
        let root = rig.root_ts(id).await;
        rig.emu
            .until("every text in every thread", BUSY_WAIT, |_| {
                thread_text(&rig, &root).contains("gamma:").then_some(())
            })
            .await;
        roots.push(root);
    }
    rig.until_drained().await;

    for (id, root) in ids.iter().zip(&roots) {
        let text = thread_text(&rig, root);
        assert!(
            in_order(&text, &["alpha:", "beta:", "gamma:"]),
            "texts lost or out of order in {id}: {text}"
        );
        let requests = rig
            .store
            .list_requests(Some(id), false)
            .await
            .expect("list");
        assert_eq!(requests.len(), 1, "{id}: {requests:?}");
        let (req, decision) = rig
            .store
            .get_request(&requests[0].id)
            .await
            .expect("get")
            .expect("request");
        assert_eq!(req.status, RequestStatus::Decided, "{id}");
        assert_eq!(decision.expect("decision").decided_by, OWNER);
    }

    // Each request message: one post with buttons, one update with the outcome.
    let asks: Vec<emulator::Msg> = roots
        .iter()
        .flat_map(|r| rig.emu.thread(CHANNEL, r))
        .filter(|m| m.all_text().contains("Allow once") && m.all_text().contains("<@UOWNER>"))
        .collect();
    assert_eq!(asks.len(), SESSIONS, "every request shown and decided");
    for ask in &asks {
        assert_eq!(ask.updates, 1, "{}", ask.all_text());
        assert!(ask.buttons().is_empty(), "{}", ask.all_text());
    }

    // Paced, not refused; and nothing left in the outbox.
    assert_eq!(
        rig.emu.limited_total(),
        0,
        "429s: postMessage {:?}, update {:?}",
        rig.emu.counts("chat.postMessage"),
        rig.emu.counts("chat.update")
    );
    assert!(rig.store.pending().await.expect("pending").is_empty());
}

/// Posts `chat.postMessage` into `channel`; returns the status and `Retry-After`.
async fn raw_post(emu: &emulator::Emulator, channel: &str) -> (u16, Option<String>) {
    let url = format!("{}chat.postMessage", emu.api_url);
    let body = json!({"channel": channel, "text": "x"});
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let resp = agent.post(&url).send_json(&body).expect("post");
        let retry = resp
            .headers()
            .get("retry-after")
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned);
        (resp.status().as_u16(), retry)
    })
    .await
    .expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_refuses_past_the_limit_with_retry_after() {
    let emu = emulator::Emulator::start_with_limits(RateLimits::slack()).await;
    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(raw_post(&emu, "C9").await);
    }
    // A burst of three, then 429 with Retry-After in whole seconds.
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    assert_eq!(statuses, vec![200, 200, 200, 429, 429]);
    assert_eq!(answers[4].1.as_deref(), Some("1"));
    // Another channel has its own budget; counts are per method.
    assert_eq!(raw_post(&emu, "C8").await.0, 200);
    let counts = emu.counts("chat.postMessage");
    assert_eq!((counts.accepted, counts.limited), (4, 2));
    assert_eq!(
        emu.counts("chat.update"),
        emulator::limits::Counts::default()
    );
}
