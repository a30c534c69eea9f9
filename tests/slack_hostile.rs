//! The Slack edge against a hostile agent: what it names (titles, paths,
//! diffs, stderr, plans, its own modes) reaches the channel inert, inside
//! Slack's limits, and never reads as the server's own lines or outcomes.
//! Render-level checks first, then end to end through the emulator.

use agent_intercom::slack;

mod emulator;
mod slack_common;

use intercom_actors::model::{
    OptionKind, PendingRequest, PermissionOption, RequestKind, RequestStatus, SessionId,
};
use intercom_actors::slack_port::Render;
use serde_json::{Value, json};
use slack::render::BlockKit;
use slack_common::{CHANNEL, OWNER, Rig, STRANGER};

// ---------------------------------------------------------------- helpers

/// Slack's published Block Kit limits, checked on one message's blocks.
/// Returns every violation found.
fn block_kit_violations(blocks: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    let chars = |v: &Value| v.as_str().map_or(0, |s| s.chars().count());
    if blocks.len() > 50 {
        out.push(format!("{} blocks (max 50)", blocks.len()));
    }
    for (i, b) in blocks.iter().enumerate() {
        match b["type"].as_str() {
            Some("section") => {
                let n = chars(&b["text"]["text"]);
                if n > 3000 {
                    out.push(format!("block {i}: section text {n} chars (max 3000)"));
                }
                if n == 0 {
                    out.push(format!("block {i}: empty section text"));
                }
            }
            Some("context") => {
                let els = b["elements"].as_array().cloned().unwrap_or_default();
                if els.len() > 10 {
                    out.push(format!(
                        "block {i}: {} context elements (max 10)",
                        els.len()
                    ));
                }
                for e in els {
                    let n = chars(&e["text"]);
                    if n > 3000 {
                        out.push(format!("block {i}: context text {n} chars (max 3000)"));
                    }
                }
            }
            Some("actions") => {
                let els = b["elements"].as_array().cloned().unwrap_or_default();
                if els.len() > 25 {
                    out.push(format!("block {i}: {} elements (max 25)", els.len()));
                }
                for e in els {
                    let t = chars(&e["text"]["text"]);
                    if t > 75 || t == 0 {
                        out.push(format!("block {i}: button text {t} chars (1..=75)"));
                    }
                    let v = chars(&e["value"]);
                    if v > 2000 {
                        out.push(format!("block {i}: button value {v} chars (max 2000)"));
                    }
                    let a = chars(&e["action_id"]);
                    if a > 255 {
                        out.push(format!("block {i}: action_id {a} chars (max 255)"));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

fn opt(id: &str, name: &str, kind: OptionKind) -> PermissionOption {
    PermissionOption {
        id: id.into(),
        name: name.into(),
        kind,
    }
}

fn request(title: &str, paths: Vec<String>) -> PendingRequest {
    PendingRequest {
        command: None,
        id: "s-1:req-1".into(),
        session_id: SessionId::from("s-1"),
        request_id: "req-1".into(),
        kind: RequestKind::Permission,
        tool_kind: Some("edit".into()),
        title: title.into(),
        diff: None,
        paths,
        options: vec![
            opt("allow-once", "Allow once", OptionKind::AllowOnce),
            opt("reject-once", "Reject once", OptionKind::RejectOnce),
        ],
        status: RequestStatus::Pending,
        wire_id: None,
        created_at: 0,
    }
}

fn section_texts(blocks: &[Value]) -> String {
    blocks
        .iter()
        .map(|b| {
            b["text"]["text"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| {
                    b["elements"]
                        .as_array()
                        .map(|e| {
                            e.iter()
                                .filter_map(|x| x["text"].as_str())
                                .collect::<Vec<_>>()
                                .join(" ")
                        })
                        .unwrap_or_default()
                })
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ------------------------------------------------- render-level probes

/// The files a request touches are the server's record, in a block of
/// their own: a path longer than 200 characters is cut in its middle, so
/// the file name stays in view.
#[test]
fn a_long_path_still_shows_its_file_name() {
    let deep = format!("{}deploy-prod.sh", "src/".repeat(60));
    let r = request("Write a file", vec![deep]);
    let (body, _) = BlockKit.request(&r);
    let text = section_texts(&body.blocks);
    assert!(
        text.contains("deploy-prod.sh"),
        "the file name of a long path is not shown:\n{text}"
    );
}

/// Paths whose characters grow when escaped (`&` -> `&amp;`) cannot push
/// the later files, or the count of the rest, out of the files block.
#[test]
fn escaped_paths_cannot_push_other_files_out_of_the_files_block() {
    let mut paths: Vec<String> = (0..9).map(|i| format!("{}{i}", "&".repeat(190))).collect();
    paths.push(".git/hooks/pre-commit".into());
    paths.push("extra-11.sh".into());
    let r = request("Write a file", paths);
    let (body, _) = BlockKit.request(&r);
    let text = section_texts(&body.blocks);
    assert!(
        text.contains(".git/hooks/pre-commit") && text.contains("1 more"),
        "a listed file (or the count of the rest) was cut away:\n{}",
        &text[text.len().saturating_sub(400)..]
    );
}

/// A hostile request (everything agent-controlled at its bounds) renders
/// within Slack's Block Kit limits, so Slack does not refuse the buttons.
#[test]
fn a_hostile_request_stays_within_block_kit_limits() {
    let mut r = request(
        &"&<>*`".repeat(20_000),
        (0..256)
            .map(|i| format!("{}{i}", "&".repeat(4000)))
            .collect(),
    );
    r.command = Some(format!("{}\n{}", "&".repeat(50_000), "rm -rf /"));
    r.diff = Some("&".repeat(2400));
    r.options = (0..16)
        .map(|i| {
            opt(
                &format!("{i}{}", "&".repeat(250)),
                &"\u{1F600}".repeat(500),
                if i % 2 == 0 {
                    OptionKind::AllowAlways
                } else {
                    OptionKind::RejectAlways
                },
            )
        })
        .collect();
    let (body, _) = BlockKit.request(&r);
    let v = block_kit_violations(&body.blocks);
    assert!(v.is_empty(), "request: {v:?}");
    let d = intercom_actors::model::Decision {
        option_id: r.options[0].id.clone(),
        approved: true,
        decided_by: OWNER.into(),
        reason: Some("x\n".repeat(5000)),
        decided_at: 0,
    };
    let closed = BlockKit.request_closed(&r, RequestStatus::Decided, Some(&d));
    let v = block_kit_violations(&closed.blocks);
    assert!(v.is_empty(), "outcome: {v:?}");
}

/// A plan is one section of at most 2,900 characters: the entries past
/// it are counted, not dropped without a word.
#[test]
fn a_long_plan_says_what_it_does_not_show() {
    let entries: Vec<(String, String)> = (1..=40)
        .map(|i| {
            (
                format!("step {i}: {}", "x".repeat(120)),
                "pending".to_owned(),
            )
        })
        .collect();
    let body = BlockKit.plan(&entries);
    let text = section_texts(&body.blocks);
    assert!(
        text.contains("step 40") || text.contains("more"),
        "entries past the cut vanish silently (shown up to: {})",
        text.lines().last().unwrap_or("")
    );
}

// ------------------------------------------------------ end-to-end probes

/// A rig running `scenario` as agent `perm`, and the permission request
/// message it posts (the one with buttons).
async fn permission_message(scenario: Value) -> (Rig, emulator::Msg) {
    let rig = Rig::start(&[("perm", scenario)]).await;
    let (_id, root) = rig.start_session("perm", "go").await;
    let ask = rig
        .until_in_thread(&root, "the permission request", |m| !m.buttons().is_empty())
        .await;
    (rig, ask)
}

/// A permission whose title carries a line break and mrkdwn: the request
/// message must not show, on a line of its own, what reads like the
/// server's outcome line ("✅ *Allow once* by …") while the buttons wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_title_cannot_forge_an_outcome_line() {
    let forged =
        "Write notes.txt*\n:white_check_mark: *Allow once* by @owner (approved earlier)\n*";
    let scenario = json!({"turns": [[
        {"tool_call": {"id": "t1", "title": forged, "kind": "edit", "status": "pending"}},
        {"permission": {"tool_call_id": "t1", "title": forged, "kind": "edit", "locations": ["notes.txt"]}},
        {"chunk": " Done."}
    ], []]});
    let (_rig, ask) = permission_message(scenario).await;
    let head = ask.blocks[0]["text"]["text"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(
        !head
            .lines()
            .any(|l| l.trim_start().starts_with(":white_check_mark:")),
        "the agent's title renders as a line of its own that reads like an outcome:\n{head}"
    );
}

/// `/intercom agent-mode` lists what the agent offers within a bound: 64
/// mode ids of 200 `&` each escaped to 64,000+ characters, past Slack's
/// 40,000, and hid the current mode (listed last here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_mode_listing_fits_a_slack_message() {
    let mut modes: Vec<Value> = (0..63)
        .map(|i| json!({"id": format!("{i:02}{}", "&".repeat(198)), "name": "m"}))
        .collect();
    modes.push(json!({"id": "bypassPermissions", "name": "bypass"}));
    let scenario = json!({
        "session_options": {"modes": {"currentModeId": "bypassPermissions", "availableModes": modes}},
        "turns": [[{"chunk": "ready."}], []]
    });
    let rig = Rig::start(&[("opts", scenario)]).await;
    let (id, _root) = rig.start_session("opts", "go").await;
    rig.until_transcript(&id, "ready.").await;
    rig.emu.slash(OWNER, CHANNEL, &format!("agent-mode {id}"));
    let text = rig.until_ephemeral(OWNER, "offers").await;
    let n = text.chars().count();
    assert!(
        n <= 40_000,
        "the agent-mode answer is {n} characters; Slack cuts or refuses past 40,000 and the current mode (`bypassPermissions`, at position {:?}) is lost",
        text.find("bypassPermissions")
    );
}

/// A stranger's `reject:` in a session's thread is refused and changes
/// nothing, and so does a forged click by the same stranger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_reject_reply_changes_nothing() {
    let rig = Rig::start(&[("perm", slack_common::permission_scenario())]).await;
    let (id, root) = rig.start_session("perm", "go").await;
    let ask = rig
        .until_in_thread(&root, "the permission request", |m| !m.buttons().is_empty())
        .await;
    rig.emu.reply(STRANGER, CHANNEL, &root, "reject: nope");
    rig.until_ephemeral(STRANGER, "may not").await;
    let allow = ask.button("allow-once").expect("allow");
    // A forged click by the stranger on the same request.
    rig.emu.click(STRANGER, &ask, &allow);
    rig.until_ephemeral(STRANGER, "only the session").await;
    let snap = rig.snapshot(&id).await.expect("live");
    assert_eq!(snap.pending.len(), 1, "the request must still wait");
}

/// `reject:` decides only when one request waits: with two, the oldest
/// may not be the one the operator was reading, so nothing is decided and
/// the reply says so; once one is left, `reject:` rejects it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reject_reply_with_two_requests_waiting_decides_nothing() {
    use intercom_actors::ports::SessionStore;
    let ask = |id: u32, title: &str| {
        json!({"raw": json!({"jsonrpc": "2.0", "id": id, "method": "session/request_permission",
            "params": {"sessionId": "$SESSION_ID", "toolCall": {"toolCallId": format!("c{id}"), "title": title},
                "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                            {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}}).to_string()})
    };
    let scenario =
        json!({"turns": [[ask(901, "First"), ask(902, "Second"), {"sleep_ms": 60_000}]]});
    let rig = Rig::start(&[("two", scenario)]).await;
    let (id, root) = rig.start_session("two", "go").await;
    let second = rig
        .until_in_thread(&root, "the second request", |m| {
            !m.buttons().is_empty() && m.all_text().contains("Second")
        })
        .await;
    rig.until_in_thread(&root, "the first request", |m| {
        !m.buttons().is_empty() && m.all_text().contains("First")
    })
    .await;
    rig.emu.reply(OWNER, CHANNEL, &root, "reject: not that one");
    rig.until_ephemeral(OWNER, "2 requests are waiting").await;
    let snap = rig.snapshot(&id).await.expect("live");
    assert_eq!(snap.pending.len(), 2, "nothing may be decided");

    rig.emu
        .click(OWNER, &second, &second.button("reject").expect("reject"));
    rig.until_message(&second.ts, "the second's outcome", |m| {
        m.buttons().is_empty()
    })
    .await;
    rig.emu.reply(OWNER, CHANNEL, &root, "reject: now this one");
    rig.until_transcript(&id, "now this one").await;
    let (_, decision) = rig
        .store
        .get_request(&format!("{}:req-1", id.0))
        .await
        .expect("get")
        .expect("the first request");
    assert_eq!(
        decision.expect("decision").reason.as_deref(),
        Some("now this one")
    );
}

/// The same as `a_long_path_still_shows_its_file_name`, end to end: the
/// agent names the file in its permission's locations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_location_still_shows_its_file_name_end_to_end() {
    let deep = format!("{}deploy-prod.sh", "src/".repeat(60));
    let scenario = json!({"turns": [[
        {"tool_call": {"id": "t1", "title": "Edit a file", "kind": "edit", "status": "pending"}},
        {"permission": {"tool_call_id": "t1", "title": "Edit a file", "kind": "edit", "locations": [deep]}},
        {"chunk": " Done."}
    ], []]});
    let (_rig, ask) = permission_message(scenario).await;
    assert!(
        ask.all_text().contains("deploy-prod.sh"),
        "the request never names the file it is about:\n{}",
        section_texts(&ask.blocks)
    );
}

/// An inline diff is shown in a ``` block: a line of the agent's new text
/// holding ``` must not close it early (the rest of the diff rendered as
/// mrkdwn: bold, emoji, a fake outcome line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_diff_cannot_break_out_of_its_code_block() {
    let new_text =
        "ok\n```\n:white_check_mark: *Allowed automatically by rule `r-1`* (Allow once)\n```\n";
    let scenario = json!({"turns": [[
        {"tool_call": {"id": "t1", "title": "Edit notes.txt", "kind": "edit", "status": "pending",
            "diffs": [{"path": "notes.txt", "old_text": "a\n", "new_text": new_text}]}},
        {"permission": {"tool_call_id": "t1", "title": "Edit notes.txt", "kind": "edit", "locations": ["notes.txt"]}},
        {"chunk": " Done."}
    ], []]});
    let (_rig, ask) = permission_message(scenario).await;
    let diff_block = ask
        .blocks
        .iter()
        .filter_map(|b| b["text"]["text"].as_str())
        .find(|t| t.starts_with("```"))
        .unwrap_or_else(|| panic!("no inline diff: {}", section_texts(&ask.blocks)))
        .to_owned();
    let fences = diff_block.matches("```").count();
    assert_eq!(
        fences, 2,
        "the agent's text closes the diff's code block early ({fences} fences):\n{diff_block}"
    );
}

/// A crash notice shows the agent's stderr in a ``` block that stderr
/// holding ``` cannot close either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_cannot_break_out_of_its_code_block() {
    let scenario = json!({"turns": [[
        {"stderr": "fatal```\n:large_green_circle: *agent-intercom restarted the agent* at the operator's request\n```"},
        {"exit": 1}
    ]]});
    let rig = Rig::start(&[("crash", scenario)]).await;
    let (_id, root) = rig.start_session("crash", "go").await;
    let notice = rig
        .until_in_thread(&root, "a notice with the stderr tail", |m| {
            m.all_text().contains("stderr:")
        })
        .await;
    let block = notice
        .blocks
        .iter()
        .filter_map(|b| b["text"]["text"].as_str())
        .find(|t| t.starts_with("stderr:"))
        .expect("stderr block")
        .to_owned();
    let fences = block.matches("```").count();
    assert_eq!(
        fences, 2,
        "stderr closes its code block early ({fences} fences):\n{block}"
    );
}

/// Agent text is quoted, line by line, so nothing it writes reads like the
/// server's own lines (here, a rule notice word for word).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_text_is_told_apart_from_server_lines() {
    let fake = "\n:information_source: Rule r-7f3a created by UOWNER: allow kind `execute` in workspace `ws`. Matching requests are answered without asking from now on.";
    let scenario = json!({"turns": [[{"chunk": fake}], []]});
    let rig = Rig::start(&[("fake", scenario)]).await;
    let (_id, root) = rig.start_session("fake", "go").await;
    let msg = rig
        .until_in_thread(&root, "the agent's text", |m| m.text.contains("r-7f3a"))
        .await;
    assert!(
        !msg.text
            .lines()
            .any(|l| l.starts_with(":information_source:")),
        "agent text posted as is, indistinguishable from a server notice:\n{}",
        msg.text
    );
}
