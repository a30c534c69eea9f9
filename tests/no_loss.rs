//! No loss, counted: every permission request reaches the operator exactly
//! once, every decision reaches the agent exactly once and matches the
//! stored request and the audit log, and every steering message is
//! delivered once and in order.
//!
//! Two operator paths: the HTTP API (the real app in-process, an automatic
//! operator polling `GET /api/approvals?status=pending` while steering is
//! sent concurrently) and Slack (the emulator; the operator clicks buttons
//! and steers by thread replies). The agents are scripted: they report
//! `prompt: <text>` at each turn start and `permission <tool>: selected
//! <option>` for each answer, so the transcript is the agent's own account.
//!
//! Sizes are small so this runs in CI; `NO_LOSS_SESSIONS` / `NO_LOSS_STEERING`
//! raise them (e.g. `NO_LOSS_SESSIONS=50 cargo test --test no_loss`).

use agent_intercom::slack;

mod chaos_common;
mod emulator;
mod slack_common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chaos_common::{AgentSpec, InProcess, Rng, Spec, counts, markers, until};
use intercom_actors::model::{RequestStatus, SessionId};
use intercom_actors::ports::SessionStore;
use serde_json::{Value, json};

/// Options the operator picks from (all four standard ACP kinds).
const OPTIONS: [&str; 4] = ["allow-once", "allow-always", "reject-once", "reject-always"];

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
}

/// First turn: `first` permission requests (`p01`, `p02`, ...); every later
/// turn (one per steering message) asks once more (`q`). Chunks start with a
/// newline so each reported line can be cut out of the aggregated text.
fn gate_scenario(first: usize) -> Value {
    let mut turn0 = vec![json!({"chunk": "\nworking"})];
    for j in 1..=first {
        turn0.push(json!({"permission": {
            "tool_call_id": format!("p{j:02}"),
            "title": format!("Gate p{j:02}"),
            "kind": "edit"
        }}));
    }
    turn0.push(json!({"chunk": "\nfirst turn done"}));
    let later = vec![
        json!({"permission": {"tool_call_id": "q", "title": "Gate q", "kind": "edit"}}),
        json!({"chunk": "\nturn done"}),
    ];
    json!({"turns": [turn0, later]})
}

/// `permission <tool>: selected <option>` lines, as `<tool>: selected <option>`.
fn reported_decisions(transcript: &str) -> Vec<String> {
    markers(transcript, "permission ", '\n')
}

/// `prompt: <text>.` lines, as `<text>`.
fn reported_prompts(transcript: &str) -> Vec<String> {
    markers(transcript, "prompt: ", '.')
}

fn request_number(request_id: &str) -> u64 {
    request_id
        .strip_prefix("req-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}

/// The tool id a request was about (`Gate p03` -> `p03`).
fn tool_of(title: &str) -> String {
    title.trim_start_matches("Gate ").to_owned()
}

#[test]
fn every_request_decision_and_steering_message_is_counted_once_through_the_api() {
    let sessions = env_usize("NO_LOSS_SESSIONS", 5);
    let first = env_usize("NO_LOSS_REQUESTS", 10);
    let steering = env_usize("NO_LOSS_STEERING", 4);
    let expected_requests = sessions * (first + steering);
    let server = InProcess::start(&Spec {
        agents: vec![AgentSpec::new("gate", gate_scenario(first))],
        max_sessions: sessions.max(1),
        ..Spec::default()
    });
    let api = server.api.clone();
    let mut rng = Rng::from_env("no_loss_api");

    let ids: Vec<String> = (0..sessions)
        .map(|k| api.start("gate", &format!("go s{k}.")))
        .collect();

    // The automatic operator: decides every pending request once, with a
    // random option, and records what it saw.
    let decided: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let seen_twice: Arc<Mutex<Vec<Value>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let operator = {
        let (api, decided, seen_twice, done) = (
            api.clone(),
            decided.clone(),
            seen_twice.clone(),
            done.clone(),
        );
        let mut rng = Rng::new(rng.next_u64());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                for approval in api.pending() {
                    let id = approval["id"].as_str().expect("id").to_owned();
                    if decided.lock().expect("lock").contains_key(&id) {
                        // Decided (and acknowledged) before: must not be pending again.
                        seen_twice.lock().expect("lock").push(approval);
                        continue;
                    }
                    let option = *rng.pick(&OPTIONS);
                    let r = api.post(
                        &format!("/api/approvals/{id}"),
                        &json!({"option_id": option}),
                    );
                    assert_eq!(r.status, 200, "deciding {id}: {}", r.text);
                    assert_eq!(r.body["decision"]["option_id"], option, "{}", r.text);
                    decided.lock().expect("lock").insert(id, option.to_owned());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    // Steering, interleaved with the operator: most of it queues behind
    // running turns, some reaches an idle agent.
    let mut sent: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for round in 0..steering {
        for (k, id) in ids.iter().enumerate() {
            let text = format!("steer s{k} #{round}");
            let r = api.post(
                &format!("/api/sessions/{id}/prompt"),
                &json!({"text": format!("{text}.")}),
            );
            assert_eq!(r.status, 202, "{}", r.text);
            sent.entry(id.clone()).or_default().push(text);
            std::thread::sleep(Duration::from_millis(rng.below(15)));
        }
    }

    until("every request to be decided", || {
        (decided.lock().expect("lock").len() >= expected_requests).then_some(())
    });
    for id in &ids {
        until(&format!("{id} to finish its turns"), || {
            let t = api.transcript(id);
            let s = api.session(id);
            (reported_decisions(&t).len() >= first + steering
                && s["live"]["turn_running"] == false
                && s["live"]["queued_prompts"] == 0)
                .then_some(())
        });
    }
    done.store(true, Ordering::Relaxed);
    operator.join().expect("operator thread");

    let decided = decided.lock().expect("lock").clone();
    let seen_twice = seen_twice.lock().expect("lock").clone();
    assert!(
        seen_twice.is_empty(),
        "requests shown to the operator again after their decision: {seen_twice:#?}"
    );
    assert_eq!(
        decided.len(),
        expected_requests,
        "requests the operator saw"
    );

    let store = server.app.store();
    let audit = server.block_on(store.audit_log(None)).expect("audit log");
    let decided_audit: Vec<(String, String)> = audit
        .iter()
        .filter(|(_, e)| e.action == "request.decided")
        .map(|(_, e)| {
            (
                e.detail["request"].as_str().unwrap_or("").to_owned(),
                e.detail["option"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let per_request = counts(decided_audit.iter().map(|(r, _)| r.clone()));
    assert!(
        per_request.values().all(|&n| n == 1),
        "a decision audited twice: {per_request:?}"
    );
    assert_eq!(decided_audit.len(), expected_requests);
    let audited: BTreeMap<String, String> = decided_audit.into_iter().collect();
    assert_eq!(
        audited, decided,
        "the audit log says what the operator chose"
    );

    for (k, id) in ids.iter().enumerate() {
        let sid = SessionId::from(id.as_str());
        let mut requests = server
            .block_on(store.list_requests(Some(&sid), false))
            .expect("requests");
        requests.sort_by_key(|r| request_number(&r.request_id));
        assert_eq!(requests.len(), first + steering, "{id}: {requests:#?}");
        let mut expected_lines = Vec::new();
        for (n, req) in requests.iter().enumerate() {
            assert_eq!(req.request_id, format!("req-{}", n + 1), "ids are dense");
            assert_eq!(req.status, RequestStatus::Decided, "{req:?}");
            let (_, decision) = server
                .block_on(store.get_request(&req.id))
                .expect("get")
                .expect("stored");
            let decision = decision.expect("a decided request has its decision");
            assert_eq!(
                decided.get(&req.id),
                Some(&decision.option_id),
                "{}: stored decision differs from the operator's",
                req.id
            );
            assert_eq!(decision.decided_by, "local");
            assert_eq!(
                decision.approved,
                decision.option_id.starts_with("allow"),
                "{decision:?}"
            );
            expected_lines.push(format!(
                "{}: selected {}",
                tool_of(&req.title),
                decision.option_id
            ));
        }
        let transcript = api.transcript(id);
        assert_eq!(
            reported_decisions(&transcript),
            expected_lines,
            "{id}: the agent received each decision exactly once, in order:\n{transcript}"
        );
        let mut want_prompts = vec![format!("go s{k}")];
        want_prompts.extend(sent[id].iter().cloned());
        assert_eq!(
            reported_prompts(&transcript),
            want_prompts,
            "{id}: steering delivered once each, in order:\n{transcript}"
        );
        let undelivered = server
            .block_on(store.undelivered_steering(&sid))
            .expect("steering");
        assert!(undelivered.is_empty(), "{undelivered:?}");
        let steered = audit
            .iter()
            .filter(|(_, e)| e.action == "session.steered" && e.session_id.as_ref() == Some(&sid))
            .count();
        assert_eq!(
            steered, steering,
            "{id}: one audit entry per steering message"
        );
    }
    eprintln!(
        "no_loss_api: {sessions} sessions, {expected_requests} requests decided once each, {} steering messages delivered in order",
        sessions * steering
    );
}

/// The Slack path: one session, its requests posted once each with buttons,
/// each click decides exactly that request, steering by thread reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_and_reply_is_counted_once_through_slack() {
    use slack_common::{CHANNEL, OWNER, Rig, WAIT};
    const FIRST: usize = 5;
    const STEERING: usize = 3;
    let expected = FIRST + STEERING;
    let rig = Rig::start(&[("gate", gate_scenario(FIRST))]).await;
    let (id, root) = rig.start_session("gate", "go.").await;
    let mut rng = Rng::from_env("no_loss_slack");

    let mut clicked: BTreeMap<String, (String, String)> = BTreeMap::new(); // ts -> (request, option)
    let mut replies = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while clicked.len() < expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {expected} requests reached Slack; thread: {:#?}",
            clicked.len(),
            rig.emu.thread(CHANNEL, &root)
        );
        let open: Vec<_> = rig
            .emu
            .thread(CHANNEL, &root)
            .into_iter()
            .filter(|m| !m.buttons().is_empty() && !clicked.contains_key(&m.ts))
            .collect();
        for msg in open {
            let option = *rng.pick(&OPTIONS[..]);
            let option = if msg.button(option).is_some() {
                option
            } else {
                "allow-once"
            };
            let button = msg.button(option).expect("option button");
            let request = button["value"]
                .as_str()
                .and_then(|v| v.split('|').next())
                .expect("button value names the request")
                .to_owned();
            rig.emu.click(OWNER, &msg, &button);
            clicked.insert(msg.ts.clone(), (request, option.to_owned()));
            // Steer while turns run: after the 2nd, 4th and 5th click.
            if replies.len() < STEERING && [2, 4, 5].contains(&clicked.len()) {
                let text = format!("steer #{}", replies.len());
                let ts = rig.emu.reply(OWNER, CHANNEL, &root, &format!("{text}."));
                replies.push((ts, text));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let transcript = rig
        .until_transcript(&id, &format!("steer #{}.", STEERING - 1))
        .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let transcript = loop {
        let t = rig.transcript(&id).await;
        if reported_decisions(&t).len() >= expected {
            break t;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "decisions never reached the agent:\n{transcript}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    rig.until_drained().await;

    // Each request was posted once (one message with buttons per request).
    let posted_with_buttons = rig
        .emu
        .ok_calls("chat.postMessage")
        .iter()
        .filter(|c| c.params.to_string().contains("\"actions\""))
        .count();
    assert_eq!(posted_with_buttons, expected, "request messages posted");

    let mut requests = rig
        .store
        .list_requests(Some(&id), false)
        .await
        .expect("requests");
    requests.sort_by_key(|r| request_number(&r.request_id));
    assert_eq!(requests.len(), expected);
    let by_request: BTreeMap<String, String> = clicked.values().cloned().collect();
    assert_eq!(by_request.len(), expected, "one message per request");
    let mut lines = Vec::new();
    for req in &requests {
        let (stored, decision) = rig
            .store
            .get_request(&req.id)
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(stored.status, RequestStatus::Decided);
        let decision = decision.expect("decision");
        assert_eq!(decision.decided_by, OWNER);
        assert_eq!(Some(&decision.option_id), by_request.get(&req.id));
        lines.push(format!(
            "{}: selected {}",
            tool_of(&req.title),
            decision.option_id
        ));
    }
    assert_eq!(reported_decisions(&transcript), lines, "{transcript}");
    let audit = rig.store.audit_log(Some(&id)).await.expect("audit");
    let decided = counts(
        audit
            .iter()
            .filter(|(_, e)| e.action == "request.decided")
            .map(|(_, e)| e.detail["request"].as_str().unwrap_or("").to_owned()),
    );
    let want: BTreeSet<String> = requests.iter().map(|r| r.id.clone()).collect();
    assert_eq!(decided.keys().cloned().collect::<BTreeSet<_>>(), want);
    assert!(decided.values().all(|&n| n == 1), "{decided:?}");

    let mut want_prompts = vec!["go".to_owned()];
    want_prompts.extend(replies.iter().map(|(_, t)| t.clone()));
    assert_eq!(reported_prompts(&transcript), want_prompts, "{transcript}");
    for (ts, _) in &replies {
        rig.until_message(ts, "the reply marked delivered", |m| {
            m.reactions == vec!["white_check_mark".to_owned()]
        })
        .await;
    }
    assert!(
        rig.store
            .undelivered_steering(&id)
            .await
            .expect("steering")
            .is_empty()
    );
}
