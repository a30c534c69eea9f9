//! End-to-end Slack tests: the real slack-morphism client and Socket Mode
//! loop against the loopback emulator, the real supervisor and session
//! actors, the SQLite store, and the scripted agent as a child process.

use agent_intercom::slack;

mod emulator;
mod slack_common;

use std::time::Duration;

use emulator::Fault;
use intercom_actors::model::{RequestStatus, SessionStatus};
use intercom_actors::ports::SessionStore;
use intercom_actors::rules::{Rule, RuleAction, RuleMatch, Scope};
use intercom_actors::slack_port::Outbox;
use serde_json::json;
use slack::ConnectionState;
use slack_common::{CHANNEL, OWNER, Rig, RigOptions, STRANGER, WAIT, permission_scenario};

/// The agent's texts in the thread, in order. The gateway may merge
/// consecutive texts that wait together into one message (joined by a blank
/// line), so a message is split back into the texts it carries.
fn agent_texts(rig: &Rig, root: &str) -> Vec<String> {
    rig.emu
        .thread(CHANNEL, root)
        .into_iter()
        .map(|m| slack_common::unquoted(&m.text))
        .filter(|t| t.starts_with("prompt: "))
        .flat_map(|t| t.split("\n\n").map(str::to_owned).collect::<Vec<_>>())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_round_trip_from_a_slash_command() {
    let rig = Rig::start(&[("perm", permission_scenario())]).await;
    let (id, root) = rig.start_session("perm", "write the notes").await;

    // The thread root is the first message the bot posted, and it names the session.
    let posts = rig.emu.ok_calls("chat.postMessage");
    assert!(
        posts[0].params.get("thread_ts").is_none(),
        "{:?}",
        posts[0].params
    );
    let root_msg = rig.emu.message(CHANNEL, &root).expect("root");
    assert!(
        root_msg.all_text().contains(&id.0),
        "{}",
        root_msg.all_text()
    );
    assert!(root_msg.all_text().contains("write the notes"));

    let ask = rig
        .until_in_thread(&root, "the permission request", |m| !m.buttons().is_empty())
        .await;
    assert!(
        ask.all_text().contains("Write notes.txt"),
        "{}",
        ask.all_text()
    );
    let allow = ask.button("allow-once").expect("allow-once button");
    assert_eq!(allow["style"], "primary");
    assert_eq!(
        ask.button("reject-once").expect("reject button")["style"],
        "danger"
    );
    // Every later post is a reply in the session's thread.
    for call in rig.emu.ok_calls("chat.postMessage").iter().skip(1) {
        assert_eq!(call.params["thread_ts"], json!(root), "{:?}", call.params);
    }
    // The root's status line says a human is needed.
    rig.until_message(&root, "root says needs input", |m| {
        m.all_text().contains("needs input")
    })
    .await;

    let env = rig.emu.click(OWNER, &ask, &allow);
    rig.until_transcript(&id, "permission t1: selected allow-once")
        .await;
    let done = rig
        .until_message(&ask.ts, "buttons replaced by the outcome", |m| {
            m.buttons().is_empty()
        })
        .await;
    let text = done.all_text();
    assert!(
        text.contains("Allow once") && text.contains("<@UOWNER>"),
        "{text}"
    );
    assert!(rig.emu.acked(&env));
    rig.until_in_thread(&root, "the agent's text", |m| m.text.contains("Done."))
        .await;
    let (req, decision) = rig
        .store
        .get_request(&format!("{}:req-1", id.0))
        .await
        .expect("get")
        .expect("request");
    assert_eq!(req.status, RequestStatus::Decided);
    assert_eq!(decision.expect("decision").decided_by, OWNER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_is_refused_and_the_owner_rejects_with_feedback() {
    let rig = Rig::start(&[("perm", permission_scenario())]).await;
    let (id, root) = rig.start_session("perm", "write the notes").await;
    let ask = rig
        .until_in_thread(&root, "the permission request", |m| !m.buttons().is_empty())
        .await;

    // A stranger's click changes nothing and is answered ephemerally.
    let allow = ask.button("allow-once").expect("allow button");
    rig.emu.click(STRANGER, &ask, &allow);
    let refusal = rig.until_ephemeral(STRANGER, "may not").await;
    assert!(refusal.contains("<@UOWNER>"), "{refusal}");
    let global = format!("{}:req-1", id.0);
    let (req, _) = rig
        .store
        .get_request(&global)
        .await
        .expect("get")
        .expect("req");
    assert_eq!(req.status, RequestStatus::Pending);
    assert!(
        !rig.emu
            .message(CHANNEL, &ask.ts)
            .expect("msg")
            .buttons()
            .is_empty()
    );
    let audit = rig.store.audit_log(Some(&id)).await.expect("audit");
    assert!(
        audit
            .iter()
            .any(|(_, e)| e.actor == STRANGER && e.action == "action.denied"),
        "{audit:?}"
    );
    // Nor may the stranger open the feedback modal.
    let feedback = ask.button("feedback").expect("feedback button");
    rig.emu.click(STRANGER, &ask, &feedback);
    rig.emu
        .until("a second refusal", WAIT, |e| {
            (e.ephemerals().iter().filter(|m| m.user == STRANGER).count() >= 2).then_some(())
        })
        .await;
    assert!(rig.emu.views().is_empty());

    // The owner rejects with feedback through the modal.
    rig.emu.click(OWNER, &ask, &feedback);
    rig.emu
        .until("the feedback modal", WAIT, |e| {
            (!e.views().is_empty()).then_some(())
        })
        .await;
    // A form that does not open (its trigger expired) tells the clicker
    // what else decides the request; it said nothing.
    rig.emu
        .fail_next_on("views.open", 1, Fault::Refuse("expired_trigger_id"));
    rig.emu.click(OWNER, &ask, &feedback);
    rig.until_ephemeral(OWNER, "The feedback form did not open (")
        .await;
    rig.emu.submit_last_view(OWNER, "use a <temp> file instead");
    rig.until_transcript(&id, "permission t1: selected reject-once")
        .await;
    let closed = rig
        .until_message(&ask.ts, "the outcome", |m| m.buttons().is_empty())
        .await;
    assert!(
        closed
            .all_text()
            .contains("use a &lt;temp&gt; file instead"),
        "{}",
        closed.all_text()
    );
    let (_, decision) = rig
        .store
        .get_request(&global)
        .await
        .expect("get")
        .expect("req");
    let decision = decision.expect("decision");
    assert!(!decision.approved);
    assert_eq!(
        decision.reason.as_deref(),
        Some("use a <temp> file instead")
    );
}

/// A command typed where the bot cannot post (a DM, a channel it is not
/// in) is answered through the command's `response_url`: a probe's
/// `/intercom sessions` in a DM got no answer at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_typed_where_the_bot_cannot_post_is_still_answered() {
    let rig = Rig::start(&[("perm", permission_scenario())]).await;
    rig.emu.refuse_ephemerals_in("D_STRANGER");
    rig.emu.slash(STRANGER, "D_STRANGER", "help");
    rig.until_ephemeral(STRANGER, "/intercom").await;
    let answers: Vec<_> = rig
        .emu
        .ephemerals()
        .into_iter()
        .filter(|e| e.channel == "D_STRANGER")
        .collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(
        rig.emu.ok_calls("chat.postEphemeral").is_empty(),
        "answered through response_url, not chat.postEphemeral"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_in_one_channel_never_cross() {
    let rig = Rig::start(&[("perm", permission_scenario())]).await;
    let (a, root_a) = rig.start_session("perm", "session A").await;
    let (b, root_b) = rig.start_session("perm", "session B").await;
    assert_ne!(root_a, root_b);
    let ask_a = rig
        .until_in_thread(&root_a, "A's request", |m| !m.buttons().is_empty())
        .await;
    let ask_b = rig
        .until_in_thread(&root_b, "B's request", |m| !m.buttons().is_empty())
        .await;
    assert!(
        ask_a.button("allow-once").expect("btn")["value"]
            .as_str()
            .expect("value")
            .starts_with(&format!("{}:", a.0))
    );
    assert!(
        ask_b.button("allow-once").expect("btn")["value"]
            .as_str()
            .expect("value")
            .starts_with(&format!("{}:", b.0))
    );

    // Deciding A leaves B waiting.
    rig.emu
        .click(OWNER, &ask_a, &ask_a.button("allow-once").expect("btn"));
    rig.until_transcript(&a, "permission t1: selected allow-once")
        .await;
    rig.until_message(&ask_a.ts, "A's outcome", |m| m.buttons().is_empty())
        .await;
    assert!(!rig.transcript(&b).await.contains("permission t1: selected"));
    assert!(
        !rig.emu
            .message(CHANNEL, &ask_b.ts)
            .expect("b")
            .buttons()
            .is_empty()
    );

    // A reply in B's thread rejects B's request, not A's.
    rig.emu.reply(OWNER, CHANNEL, &root_b, "reject: not now");
    rig.until_transcript(&b, "permission t1: selected reject-once")
        .await;
    let (_, d) = rig
        .store
        .get_request(&format!("{}:req-1", b.0))
        .await
        .expect("get")
        .expect("req");
    assert_eq!(d.expect("decision").reason.as_deref(), Some("not now"));

    // Steering by reply reaches only the thread's own session.
    rig.emu.reply(OWNER, CHANNEL, &root_a, "only for A");
    rig.until_transcript(&a, "prompt: only for A").await;
    rig.emu.reply(OWNER, CHANNEL, &root_b, "only for B");
    rig.until_transcript(&b, "prompt: only for B").await;
    assert!(!rig.transcript(&a).await.contains("only for B"));
    assert!(!rig.transcript(&b).await.contains("only for A"));
    for m in rig.emu.thread(CHANNEL, &root_a) {
        assert!(
            !m.all_text().contains(&b.0),
            "A's thread mentions B: {}",
            m.all_text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steering_is_delivered_when_idle_and_queued_during_a_turn() {
    let scenario = json!({"turns": [[], [{"sleep_ms": 2500}], []]});
    let rig = Rig::start(&[("slow", scenario)]).await;
    let (id, root) = rig.start_session("slow", "begin").await;
    rig.until_message(&root, "idle", |m| m.all_text().contains("idle"))
        .await;

    // Idle: delivered at once, confirmed with a check mark.
    let first = rig.emu.reply(OWNER, CHANNEL, &root, "take the long road");
    rig.until_message(&first, "delivered reaction", |m| {
        m.reactions.contains(&"white_check_mark".to_owned())
    })
    .await;
    rig.until_transcript(&id, "prompt: take the long road")
        .await;

    // During that (slow) turn: queued, marked with an hourglass...
    let second = rig.emu.reply(OWNER, CHANNEL, &root, "and then this");
    rig.until_message(&second, "queued reaction", |m| {
        m.reactions.contains(&"hourglass_flowing_sand".to_owned())
    })
    .await;
    assert!(!rig.transcript(&id).await.contains("prompt: and then this"));
    // ...then delivered when the turn ends: the hourglass becomes a check.
    let done = rig
        .until_message(&second, "delivered after the turn", |m| {
            m.reactions == vec!["white_check_mark".to_owned()]
        })
        .await;
    assert_eq!(done.reactions, vec!["white_check_mark"]);
    rig.until_transcript(&id, "prompt: and then this").await;

    // A reply also sent to the channel steers too.
    rig.emu
        .broadcast_reply(OWNER, CHANNEL, &root, "also for the channel");
    rig.until_transcript(&id, "prompt: also for the channel")
        .await;

    // Other bots' messages and a stranger's reply do not steer.
    rig.emu.bot_reply(CHANNEL, &root, "bot noise");
    rig.emu.reply(STRANGER, CHANNEL, &root, "stranger danger");
    rig.until_ephemeral(STRANGER, "may not").await;
    let t = rig.transcript(&id).await;
    assert!(
        !t.contains("bot noise") && !t.contains("stranger danger"),
        "{t}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_storm_loses_and_reorders_nothing() {
    let rig = Rig::start(&[("echo", json!({"turns": [[]]}))]).await;
    let (id, root) = rig.start_session("echo", "go").await;
    rig.until_message(&root, "idle", |m| m.all_text().contains("idle"))
        .await;
    rig.until_drained().await;

    rig.emu.fail_next(4, Fault::RateLimited(1));
    let replies: Vec<String> = (1..=5)
        .map(|i| rig.emu.reply(OWNER, CHANNEL, &root, &format!("m{i}")))
        .collect();
    rig.until_transcript(&id, "prompt: m5").await;
    let want: Vec<String> = ["go", "m1", "m2", "m3", "m4", "m5"]
        .iter()
        .map(|s| format!("prompt: {s}"))
        .collect();
    rig.emu
        .until("every agent text", WAIT, |_| {
            (agent_texts(&rig, &root).len() >= want.len()).then_some(())
        })
        .await;
    rig.until_drained().await;
    assert_eq!(agent_texts(&rig, &root), want);
    for ts in &replies {
        let m = rig.emu.message(CHANNEL, ts).expect("reply");
        assert_eq!(m.reactions, vec!["white_check_mark"], "reply {ts}");
    }
    let limited = rig.emu.calls().iter().filter(|c| c.status == 429).count();
    assert_eq!(limited, 4);
    // A 429 pauses the token: after each one, Slack is left alone for Retry-After.
    let calls = rig.emu.calls();
    assert!(calls.iter().all(|c| c.status == 200 || c.status == 429));
    assert!(rig.store.pending().await.expect("outbox").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_socket_reconnects_and_the_channel_is_told() {
    let rig = Rig::start(&[("echo", json!({"turns": [[]]}))]).await;
    let (id, root) = rig.start_session("echo", "go").await;
    let connections = rig.emu.connections();

    rig.emu.refuse_sockets(true);
    rig.emu.drop_socket();
    rig.until_state(ConnectionState::Reconnecting).await;
    assert_eq!(rig.slack().status().as_str(), "reconnecting");
    rig.emu
        .until("the drop notice", WAIT, |e| {
            e.channel(CHANNEL)
                .into_iter()
                .find(|m| m.text.contains("lost its Slack connection"))
        })
        .await;

    rig.emu.refuse_sockets(false);
    rig.until_state(ConnectionState::Connected).await;
    assert!(rig.emu.connections() > connections);
    rig.emu
        .until("the recovery notice", WAIT, |e| {
            e.channel(CHANNEL)
                .into_iter()
                .find(|m| m.text.contains("connected to Slack again"))
        })
        .await;

    // Events flow again; a routine refresh reconnects without notices.
    rig.emu.reply(OWNER, CHANNEL, &root, "still there?");
    rig.until_transcript(&id, "prompt: still there?").await;
    let notices = rig.emu.channel(CHANNEL).len();
    rig.emu.send_disconnect();
    rig.emu
        .until("a fresh connection", WAIT, |e| {
            (e.connections() > connections + 1 && e.socket_open()).then_some(())
        })
        .await;
    rig.until_state(ConnectionState::Connected).await;
    rig.emu.reply(OWNER, CHANNEL, &root, "and now?");
    rig.until_transcript(&id, "prompt: and now?").await;
    assert_eq!(rig.emu.channel(CHANNEL).len(), notices);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_survives_a_restart_during_an_outage() {
    let mut rig = Rig::start(&[("echo", json!({"turns": [[]]}))]).await;
    let (id, root) = rig.start_session("echo", "go").await;
    rig.until_message(&root, "idle", |m| m.all_text().contains("idle"))
        .await;
    rig.until_drained().await;

    // Slack's Web API goes down; the socket still brings replies.
    rig.emu.fail_all(Fault::Status(503));
    let replies: Vec<String> = (1..=3)
        .map(|i| rig.emu.reply(OWNER, CHANNEL, &root, &format!("r{i}")))
        .collect();
    rig.until_transcript(&id, "prompt: r3").await;
    // Wait until the last turn's text is stored in the outbox, then "restart".
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let pending = rig.store.pending().await.expect("outbox");
        if pending
            .iter()
            .any(|e| format!("{:?}", e.op).contains("prompt: r3"))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "r3 never queued: {pending:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let handle = rig.slack.take().expect("slack");
    handle.shutdown().await;
    assert!(
        rig.emu
            .thread(CHANNEL, &root)
            .iter()
            .all(|m| !m.text.contains("prompt: r"))
    );

    rig.emu.heal();
    let (_sink, events) = slack::event_channel();
    rig.spawn_slack(events).await;
    rig.until_drained().await;
    let texts = agent_texts(&rig, &root);
    assert_eq!(
        texts,
        vec!["prompt: go", "prompt: r1", "prompt: r2", "prompt: r3"],
        "in order, nothing lost"
    );
    for ts in &replies {
        let m = rig.emu.message(CHANNEL, ts).expect("reply");
        assert!(
            m.reactions.contains(&"white_check_mark".to_owned()),
            "{ts}: {:?}",
            m.reactions
        );
    }
    assert!(rig.store.pending().await.expect("outbox").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_diffs_are_uploaded_as_snippets_before_the_buttons() {
    let long = "x".repeat(80);
    let lines: String = (0..60).map(|i| format!("line {i} {long}\n")).collect();
    let scenario = json!({"turns": [[
        {"write_file": {"path": "big.txt", "content": lines}},
    ], []]});
    let rig = Rig::start(&[("writer", scenario)]).await;
    let (_id, root) = rig.start_session("writer", "write big").await;
    let ask = rig
        .until_in_thread(&root, "the write request", |m| !m.buttons().is_empty())
        .await;
    let thread = rig.emu.thread(CHANNEL, &root);
    let file_pos = thread
        .iter()
        .position(|m| m.file.is_some())
        .expect("a snippet in the thread");
    let ask_pos = thread.iter().position(|m| m.ts == ask.ts).expect("ask");
    assert!(file_pos < ask_pos, "snippet first");
    let file_id = thread[file_pos].file.clone().expect("file id");
    let (_, content) = rig.emu.file(&file_id).expect("uploaded");
    assert!(content.contains("+line 59"), "{content}");
    assert!(!ask.all_text().contains("```"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_server_restart_an_unanswered_request_says_expired() {
    let mut rig = Rig::start(&[("perm", permission_scenario())]).await;
    let (id, root) = rig.start_session("perm", "write the notes").await;
    let ask = rig
        .until_in_thread(&root, "the permission request", |m| !m.buttons().is_empty())
        .await;
    rig.until_drained().await;

    // The server dies: Slack, the session actor (and its agent), the supervisor.
    rig.slack.take().expect("slack").shutdown().await;
    let actor = ractor::call!(rig.sup, |reply| {
        intercom_actors::supervisor::SupervisorMsg::Lookup {
            id: id.clone(),
            reply,
        }
    })
    .expect("lookup")
    .expect("live");
    actor.kill();
    rig.sup.kill();
    assert!(
        rig.store
            .get_session(&id)
            .await
            .expect("get")
            .expect("row")
            .status
            .is_live()
    );

    // A new server on the same database recovers the session.
    let events = rig.restart_core().await;
    rig.spawn_slack(events).await;
    let map = ractor::call!(rig.registry, intercom_actors::registry::RegistryMsg::Get)
        .expect("workspace map");
    let (resumed, _) = ractor::call!(rig.sup, |reply| {
        intercom_actors::supervisor::SupervisorMsg::Recover { map, reply }
    })
    .expect("recover");
    assert_eq!(resumed, 1);
    let expired = rig
        .until_message(&ask.ts, "the request marked expired", |m| {
            m.buttons().is_empty() && m.all_text().contains("Expired")
        })
        .await;
    assert!(expired.all_text().contains("Write notes.txt"));
    rig.until_in_thread(&root, "the restart notice", |m| {
        m.all_text().contains("server restarted")
    })
    .await;
    // The old button now says so instead of doing anything.
    rig.emu
        .click(OWNER, &ask, &ask.button("allow-once").expect("button"));
    rig.until_ephemeral(OWNER, "already expired").await;
    assert!(
        !rig.transcript(&id)
            .await
            .contains("permission t1: selected")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slash_commands_list_inspect_steer_and_stop() {
    let rig = Rig::start(&[("echo", json!({"turns": [[]]}))]).await;
    let (id, root) = rig.start_session("echo", "go").await;
    rig.until_message(&root, "idle", |m| m.all_text().contains("idle"))
        .await;

    rig.emu.slash(OWNER, CHANNEL, "sessions");
    rig.until_ephemeral(OWNER, &format!("`{}`", id.0)).await;
    rig.emu.slash(OWNER, CHANNEL, "status");
    rig.until_ephemeral(OWNER, ": idle").await;
    rig.emu.slash(OWNER, CHANNEL, "steer look at the tests");
    rig.until_ephemeral(OWNER, "Delivered").await;
    rig.until_transcript(&id, "prompt: look at the tests").await;
    // Slack's escaping is undone, as for `start` and thread replies.
    rig.emu
        .slash(OWNER, CHANNEL, "steer run a &amp;&amp; b &lt;x&gt;");
    rig.until_transcript(&id, "prompt: run a && b <x>").await;
    rig.emu.slash(OWNER, CHANNEL, "frobnicate");
    rig.until_ephemeral(OWNER, "Unknown command").await;

    // From elsewhere (a DM), someone who is neither owner nor operator
    // sees none of this channel's sessions: not in the list, not by id.
    rig.emu.slash(STRANGER, "D0STRANGER", "sessions --all");
    let listed = rig.until_ephemeral(STRANGER, "No sessions yet").await;
    assert!(!listed.contains(&id.0), "{listed}");
    rig.emu
        .slash(STRANGER, "D0STRANGER", &format!("status {}", id.0));
    rig.until_ephemeral(STRANGER, &format!("No live session `{}`", id.0))
        .await;

    // A stranger may look but not act, and may not start sessions.
    rig.emu.slash(STRANGER, CHANNEL, "stop");
    rig.until_ephemeral(STRANGER, "may not").await;
    rig.emu.slash(STRANGER, CHANNEL, "start --agent echo hi");
    rig.until_ephemeral(STRANGER, "Only operators").await;
    assert!(
        rig.store
            .get_session(&id)
            .await
            .expect("get")
            .expect("row")
            .status
            .is_live()
    );

    rig.emu.slash(OWNER, CHANNEL, &format!("stop {}", id.0));
    rig.until_ephemeral(OWNER, "Stopping").await;
    rig.until_message(&root, "the root says cancelled", |m| {
        m.all_text().contains("cancelled")
    })
    .await;
    rig.until_in_thread(&root, "the closing line", |m| {
        m.all_text().contains("Session ended")
    })
    .await;
    rig.emu.reply(OWNER, CHANNEL, &root, "are you there?");
    rig.until_ephemeral(OWNER, "has ended").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_cancels_the_turn_and_holds_steering_until_resume() {
    // The first turn runs until it is cancelled.
    let scenario = json!({"turns": [[{"wait_cancel": true}], []]});
    let rig = Rig::start(&[("busy", scenario)]).await;
    let (id, root) = rig.start_session("busy", "work forever").await;
    rig.until_snapshot(&id, "working", |s| s.turn_running).await;

    rig.emu.slash(OWNER, CHANNEL, "pause");
    rig.until_ephemeral(OWNER, "Paused").await;
    // The running turn is cancelled and the status line says paused.
    rig.until_snapshot(&id, "paused without a turn", |s| {
        s.paused && !s.turn_running
    })
    .await;
    rig.until_message(&root, "root says paused", |m| {
        m.all_text().contains("paused")
    })
    .await;
    rig.emu.slash(OWNER, CHANNEL, "status");
    rig.until_ephemeral(OWNER, ": paused").await;
    rig.emu.slash(OWNER, CHANNEL, "sessions");
    rig.until_ephemeral(OWNER, &format!("`{}` :double_vertical_bar: *paused*", id.0))
        .await;

    // A reply and a steer while paused are held (hourglass), not delivered.
    let held = rig
        .emu
        .reply(OWNER, CHANNEL, &root, "first, after the pause");
    rig.until_message(&held, "queued reaction", |m| {
        m.reactions.contains(&"hourglass_flowing_sand".to_owned())
    })
    .await;
    rig.emu
        .slash(OWNER, CHANNEL, "steer second, after the pause");
    rig.until_ephemeral(OWNER, "the session is paused").await;
    rig.until_snapshot(&id, "holding two", |s| s.queued.len() == 2)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = rig.transcript(&id).await;
    assert!(!t.contains("after the pause"), "{t}");

    // A stranger may not resume it.
    rig.emu
        .slash(STRANGER, CHANNEL, &format!("resume {}", id.0));
    rig.until_ephemeral(STRANGER, "may not").await;
    assert!(rig.snapshot(&id).await.expect("live").paused);

    // Resume delivers what was held, in order.
    rig.emu.slash(OWNER, CHANNEL, "resume");
    rig.until_ephemeral(OWNER, "Resumed").await;
    let t = rig
        .until_transcript(&id, "prompt: second, after the pause")
        .await;
    let first = t.find("prompt: first, after the pause").expect("first");
    let second = t.find("prompt: second, after the pause").expect("second");
    assert!(first < second, "{t}");
    rig.until_message(&held, "delivered after resume", |m| {
        m.reactions == vec!["white_check_mark".to_owned()]
    })
    .await;
    let audit = rig.store.audit_log(Some(&id)).await.expect("audit");
    for action in ["session.paused", "session.resumed"] {
        assert!(
            audit
                .iter()
                .any(|(_, e)| e.actor == OWNER && e.action == action),
            "{action}: {audit:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_revives_a_session_that_ended_by_idle_timeout() {
    let options = RigOptions {
        idle_timeout_secs: 1,
        ..RigOptions::default()
    };
    let rig = Rig::start_with(&[("echo", json!({"turns": [[]]}))], options).await;
    let (id, root) = rig.start_session("echo", "go").await;
    let ended = rig
        .until_record(&id, "ended by idle timeout", |r| {
            r.status == SessionStatus::Completed
        })
        .await;
    assert_eq!(ended.status_reason.as_deref(), Some("idle_timeout"));
    rig.until_in_thread(&root, "the closing line", |m| {
        m.all_text().contains("Session ended")
    })
    .await;
    rig.until_gone(&id).await;

    // Only the owner and operators may bring it back.
    rig.emu
        .reply(STRANGER, CHANNEL, &root, "wake up, stranger here");
    rig.until_ephemeral(STRANGER, "may not").await;

    let reply = rig.emu.reply(OWNER, CHANNEL, &root, "welcome back");
    rig.until_in_thread(&root, "the revive notice", |m| {
        m.all_text().contains("Reviving this session")
    })
    .await;
    rig.until_in_thread(&root, "how it came back", |m| {
        m.all_text()
            .contains("Revived: the agent resumed its session")
    })
    .await;
    let t = rig.until_transcript(&id, "prompt: welcome back").await;
    assert!(!t.contains("stranger here"), "{t}");
    rig.until_message(&reply, "delivered reaction", |m| {
        m.reactions.contains(&"white_check_mark".to_owned())
    })
    .await;
    let audit = rig.store.audit_log(Some(&id)).await.expect("audit");
    assert!(
        audit.iter().any(|(_, e)| e.action == "session.revived"),
        "{audit:?}"
    );
    assert!(
        audit
            .iter()
            .any(|(_, e)| e.actor == STRANGER && e.action == "action.denied"),
        "{audit:?}"
    );
    // The same thread and the same root: nothing new at the channel's top level.
    assert_eq!(rig.emu.channel(CHANNEL).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_revives_a_session_that_crashed_for_good() {
    // Every turn kills the agent: the restarts cannot fix it.
    let rig = Rig::start_with(
        &[("broken", json!({"turns": [[{"exit": 1}]]}))],
        RigOptions::default(),
    )
    .await;
    let (id, root) = rig.start_session("broken", "go").await;
    rig.until_record(&id, "crashed", |r| r.status == SessionStatus::Crashed)
        .await;
    rig.until_gone(&id).await;

    rig.emu.reply(OWNER, CHANNEL, &root, "try again");
    rig.until_in_thread(&root, "the revive notice", |m| {
        m.all_text()
            .contains("Reviving this session (it had crashed)")
    })
    .await;
    // The reply reached the revived agent (which is still broken, and
    // crashes again: the thread says so as for any crash).
    rig.until_transcript(&id, "prompt: try again").await;
    let audit = rig.store.audit_log(Some(&id)).await.expect("audit");
    assert!(
        audit
            .iter()
            .any(|(_, e)| e.actor == OWNER && e.action == "session.revived"),
        "{audit:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_are_listed_and_only_operators_may_remove_them() {
    let options = RigOptions {
        config_rules: vec![Rule {
            id: "cfg-0".into(),
            scope: Scope::Global,
            matcher: RuleMatch {
                kind: Some("read".into()),
                ..RuleMatch::default()
            },
            action: RuleAction::Allow,
        }],
        ..RigOptions::default()
    };
    let rig = Rig::start_with(&[("echo", json!({"turns": [[]]}))], options).await;

    rig.emu.slash(STRANGER, CHANNEL, "rules");
    let list = rig.until_ephemeral(STRANGER, "cfg-0").await;
    assert!(
        list.contains("every session") && list.contains("kind `read`") && list.contains("*allow*"),
        "{list}"
    );
    assert!(list.contains("config file"), "{list}");

    rig.emu.slash(STRANGER, CHANNEL, "rule rm cfg-0");
    rig.until_ephemeral(STRANGER, "Only operators").await;
    let audit = rig.store.audit_log(None).await.expect("audit");
    assert!(
        audit
            .iter()
            .any(|(_, e)| e.actor == STRANGER && e.action == "action.denied"),
        "{audit:?}"
    );
    rig.emu.slash(OWNER, CHANNEL, "rule rm cfg-0");
    rig.until_ephemeral(OWNER, "edit the config file").await;
    rig.emu.slash(OWNER, CHANNEL, "rule rm r-00000000");
    rig.until_ephemeral(OWNER, "No rule").await;
    assert_eq!(rig.rules_now().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_always_remembered_for_the_session_answers_matching_requests() {
    let ask = |id: &str| json!({"permission": {"tool_call_id": id, "title": "Write notes.txt", "kind": "edit", "locations": ["notes.txt"]}});
    let scenario = json!({"turns": [[
        {"tool_call": {"id": "t1", "title": "Write notes.txt", "kind": "edit", "status": "pending"}},
        ask("t1"),
        ask("t2"),
    ], [ask("t3")], []]});
    let rig = Rig::start(&[("perm", scenario)]).await;
    let (id, root) = rig.start_session("perm", "write the notes twice").await;

    let first = rig.until_request(&root, &[]).await;
    rig.emu.click(
        OWNER,
        &first,
        &first.button("allow-always").expect("allow-always"),
    );
    rig.until_transcript(&id, "permission t1: selected allow-always")
        .await;
    // The outcome offers to remember the decision.
    let decided = rig
        .until_message(&first.ts, "the remember buttons", |m| {
            m.button("remember:session").is_some()
        })
        .await;
    assert!(decided.button("remember:workspace").is_some());
    assert!(decided.button("allow-once").is_none());
    // The second request waits for a human...
    let second = rig.until_request(&root, &[&first.ts]).await;
    let remember = decided.button("remember:session").expect("button");

    // ...a stranger may not create the rule...
    rig.emu.click(STRANGER, &decided, &remember);
    rig.until_ephemeral(STRANGER, "may not").await;
    assert!(rig.rules_now().await.is_empty());
    assert!(
        !rig.transcript(&id)
            .await
            .contains("permission t2: selected")
    );

    // ...the owner does, and it answers the waiting request at once.
    rig.emu.click(OWNER, &decided, &remember);
    let ack = rig.until_ephemeral(OWNER, "Remembered as rule").await;
    rig.until_transcript(&id, "permission t2: selected allow-once")
        .await;
    let rules = rig.rules_now().await;
    assert_eq!(rules.len(), 1, "{rules:?}");
    let (rule, by) = &rules[0];
    assert!(ack.contains(&rule.id), "{ack}");
    assert_eq!(by, OWNER);
    assert_eq!(rule.scope, Scope::Session(id.clone()));
    assert_eq!(rule.action, RuleAction::Allow);
    assert_eq!(rule.matcher.kind.as_deref(), Some("edit"));
    let auto = rig
        .until_message(&second.ts, "the automatic outcome", |m| {
            m.buttons().is_empty() && m.all_text().contains("Allowed automatically")
        })
        .await;
    assert!(
        auto.all_text().contains(&format!("by rule `{}`", rule.id)),
        "{}",
        auto.all_text()
    );
    rig.until_in_thread(&root, "the rule notice", |m| {
        m.all_text()
            .contains(&format!("Rule {} created by {OWNER}", rule.id))
    })
    .await;
    // It went out through the operator fan-out (console and event stream
    // too), as a rule remembered from the console does, not to Slack alone.
    let told = rig.rules.told();
    assert!(
        told.iter().any(|t| t.contains(&rule.id)),
        "the notice was told to every operator side: {told:?}"
    );
    let audit = rig.store.audit_log(Some(&id)).await.expect("audit");
    assert!(
        audit
            .iter()
            .any(|(_, e)| e.actor == format!("rule:{}", rule.id)),
        "{audit:?}"
    );
    let (_, decision) = rig
        .store
        .get_request(&format!("{}:req-2", id.0))
        .await
        .expect("get")
        .expect("req-2");
    assert_eq!(
        decision.expect("decision").decided_by,
        format!("rule:{}", rule.id)
    );

    // A second click changes nothing.
    rig.emu.click(OWNER, &decided, &remember);
    rig.until_ephemeral(OWNER, "Already remembered").await;
    assert_eq!(rig.rules_now().await.len(), 1);

    // A new matching request in the next turn is answered without a click.
    rig.emu.reply(OWNER, CHANNEL, &root, "once more");
    rig.until_transcript(&id, "permission t3: selected allow-once")
        .await;

    // The rule is listed; a stranger may not remove it; an operator does.
    rig.emu.slash(OWNER, CHANNEL, "rules");
    let list = rig.until_ephemeral(OWNER, "Approval rules").await;
    assert!(list.contains(&format!("`{}`", rule.id)), "{list}");
    assert!(
        list.contains(&format!("session `{}`", id.0)) && list.contains("by <@UOWNER>"),
        "{list}"
    );
    rig.emu
        .slash(STRANGER, CHANNEL, &format!("rule rm {}", rule.id));
    rig.until_ephemeral(STRANGER, "Only operators").await;
    assert_eq!(rig.rules_now().await.len(), 1);
    rig.emu
        .slash(OWNER, CHANNEL, &format!("rule rm {}", rule.id));
    rig.until_ephemeral(OWNER, "Removed rule").await;
    assert!(rig.rules_now().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_auto_approves_without_asking() {
    let later = json!({"turns": [[], [
        {"permission": {"tool_call_id": "t1", "title": "Run the tests", "kind": "execute"}}
    ], []]});
    let rig = Rig::start(&[("later", later), ("perm", permission_scenario())]).await;
    let (id, root) = rig.start_session("later", "get ready").await;
    rig.until_message(&root, "idle", |m| m.all_text().contains("idle"))
        .await;

    rig.emu.slash(OWNER, CHANNEL, "mode yolo");
    rig.until_ephemeral(OWNER, "Unknown mode").await;
    rig.emu.slash(STRANGER, CHANNEL, "mode auto");
    rig.until_ephemeral(STRANGER, "may not").await;
    rig.emu.slash(OWNER, CHANNEL, "mode auto");
    rig.until_ephemeral(OWNER, "now in mode `auto`").await;
    rig.until_snapshot(&id, "in mode auto", |s| s.mode.as_str() == "auto")
        .await;
    rig.emu.slash(OWNER, CHANNEL, "status");
    rig.until_ephemeral(OWNER, "mode `auto`").await;

    rig.emu.reply(OWNER, CHANNEL, &root, "run the tests");
    rig.until_transcript(&id, "permission t1: selected allow-once")
        .await;
    rig.until_in_thread(&root, "the automatic outcome", |m| {
        m.all_text()
            .contains("Allowed automatically* by mode `auto`")
    })
    .await;
    let audit = rig.store.audit_log(Some(&id)).await.expect("audit");
    assert!(
        audit.iter().any(|(_, e)| e.actor == "mode:auto"),
        "{audit:?}"
    );

    // `start --mode auto`: the first request is answered without a click.
    let (auto, _) = rig.start_session("perm", "--mode auto write it").await;
    rig.until_transcript(&auto, "permission t1: selected allow-once")
        .await;
    assert!(rig.transcript(&auto).await.contains("prompt: write it"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_during_a_restart_is_stored_then_delivered_and_restart_is_a_command() {
    let markers = tempfile::tempdir().expect("tempdir");
    let crashed = markers.path().join("crashed").display().to_string();
    let scenario = json!({"turns": [[{"exit_once": {"code": 1, "marker": crashed}}], []]});
    let options = RigOptions {
        backoff_secs: 2,
        ..RigOptions::default()
    };
    let rig = Rig::start_with(&[("crashy", scenario)], options).await;
    let (id, root) = rig.start_session("crashy", "go").await;
    rig.until_record(&id, "waiting for its restart", |r| {
        r.status == SessionStatus::Starting && r.restart_count == 1
    })
    .await;
    // The agent is gone for the backoff: the reply is stored (hourglass) ...
    let held = rig.emu.reply(OWNER, CHANNEL, &root, "after the crash");
    rig.until_message(&held, "queued reaction", |m| {
        m.reactions.contains(&"hourglass_flowing_sand".to_owned())
    })
    .await;
    // ... and delivered to the restarted agent (check mark).
    rig.until_transcript(&id, "prompt: after the crash").await;
    rig.until_message(&held, "delivered reaction", |m| {
        m.reactions == vec!["white_check_mark".to_owned()]
    })
    .await;

    // `/intercom restart` respawns the agent in the same thread.
    rig.emu.slash(OWNER, CHANNEL, "restart");
    rig.until_ephemeral(OWNER, "Restarting the agent").await;
    rig.until_record(&id, "restarted by the operator", |r| {
        r.status == SessionStatus::Active && r.restart_count == 2
    })
    .await;
    rig.emu
        .slash(STRANGER, CHANNEL, &format!("restart {}", id.0));
    rig.until_ephemeral(STRANGER, "may not").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_click_is_answered_while_another_sessions_agent_hangs_in_initialize() {
    let slow = json!({"handshake_delay_ms": 120_000});
    let rig = Rig::start(&[("perm", permission_scenario()), ("slow", slow)]).await;
    let (id, root) = rig.start_session("perm", "write the notes").await;
    let ask = rig
        .until_in_thread(&root, "the permission request", |m| !m.buttons().is_empty())
        .await;
    rig.emu
        .slash(OWNER, CHANNEL, "start --agent slow hang in initialize");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let live = rig.store.list_sessions(true).await.expect("list");
        if live.iter().any(|s| s.agent == "slow") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slow session never started: {live:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The other session's agent sits in `initialize`; the click is answered.
    let allow = ask.button("allow-once").expect("allow-once button");
    let env = rig.emu.click(OWNER, &ask, &allow);
    rig.until_transcript(&id, "permission t1: selected allow-once")
        .await;
    assert!(rig.emu.acked(&env));
}
