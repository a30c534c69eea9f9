//! A permission request is merged with the tool call it references (agents
//! like Claude Code send only `toolCallId`, a title and `rawInput`): the
//! operator sees the announced diff with workspace-relative paths, modes
//! judge the merged kind and paths, and the `fs/write_text_file` carrying out
//! exactly what an allowed permission announced is not asked again. A write
//! that differs from the announcement is held with its own diff.

mod support;

use intercom_actors::model::RequestKind;
use intercom_actors::ports::SessionStore;
use intercom_actors::rules::ApprovalMode;
use intercom_actors::session::{Caller, Choice};
use serde_json::{Value, json};
use support::{Harness, Knobs, decide, decide_as, request_opened};

/// A tool call announcing `diffs`, a permission naming only its id, then
/// (when allowed) a write of `path` with `content`.
fn announce_then_write(diffs: Value, path: &str, content: &str) -> Value {
    json!({"turns": [[
        {"plan": [{"content": "Write the file", "status": "in_progress", "priority": "high"}]},
        {"tool_call": {"id": "t1", "title": "Write", "kind": "edit", "status": "pending",
                       "diffs": diffs, "raw_input": {"file_path": path}}},
        {"permission": {"tool_call_id": "t1"}},
        {"if_allowed": {"then": [{"write_file": {"path": path, "content": content}}]}},
        {"chunk": "turn over"}
    ]]})
}

#[tokio::test]
async fn one_approval_with_the_diff_covers_the_announced_write() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = announce_then_write(
        json!([{"path": "hello.txt", "old_text": null, "new_text": "hello\n"}]),
        "hello.txt",
        "hello\n",
    );
    let rec = h.start(scenario, "create hello.txt").await;
    let req = request_opened(&h, 1).await;
    assert_eq!(req.kind, RequestKind::Permission);
    assert_eq!(req.title, "Write");
    assert_eq!(req.paths, vec!["hello.txt".to_owned()]);
    let diff = req.diff.clone().expect("the announced diff is shown");
    assert!(diff.contains("+++ b/hello.txt"), "{diff}");
    assert!(diff.contains("+hello"), "{diff}");
    assert!(
        !diff.contains(h.workspace.to_str().expect("utf-8")),
        "{diff}"
    );

    decide(&h, &rec.id, &req.request_id, Choice::Approve).await;
    h.until_transcript(&rec.id, "turn over").await;
    let text = h.transcript_text(&rec.id).await;
    assert!(text.contains(": ok"), "the write succeeded:\n{text}");
    assert_eq!(
        std::fs::read_to_string(h.workspace.join("hello.txt")).expect("written"),
        "hello\n"
    );
    let all = h
        .store
        .list_requests(Some(&rec.id), false)
        .await
        .expect("list");
    assert_eq!(all.len(), 1, "one human decision for one change: {all:?}");
    let covered = h
        .store
        .audit_entries()
        .into_iter()
        .find(|a| a.action == "fs.write_covered")
        .expect("the covered write is recorded");
    assert_eq!(covered.detail["covered_by"], json!(req.id));
    assert_eq!(covered.detail["path"], "hello.txt");
}

#[tokio::test]
async fn an_edit_fragment_is_shown_in_context_and_its_write_covered() {
    let h = Harness::new(Knobs::default()).await;
    std::fs::create_dir_all(h.workspace.join("src")).expect("mkdir");
    std::fs::write(h.workspace.join("src/x.rs"), "one\ntwo\nthree\n").expect("seed");
    let scenario = announce_then_write(
        json!([{"path": "src/x.rs", "old_text": "two", "new_text": "TWO"}]),
        "src/x.rs",
        "one\nTWO\nthree\n",
    );
    let rec = h.start(scenario, "edit").await;
    let req = request_opened(&h, 1).await;
    let diff = req.diff.clone().expect("diff");
    assert!(diff.contains("--- a/src/x.rs\n+++ b/src/x.rs"), "{diff}");
    assert!(diff.contains(" one\n-two\n+TWO\n three"), "{diff}");
    decide(&h, &rec.id, &req.request_id, Choice::Approve).await;
    h.until_transcript(&rec.id, "turn over").await;
    assert_eq!(
        std::fs::read_to_string(h.workspace.join("src/x.rs")).expect("read"),
        "one\nTWO\nthree\n"
    );
    let all = h
        .store
        .list_requests(Some(&rec.id), false)
        .await
        .expect("list");
    assert_eq!(all.len(), 1, "{all:?}");
}

#[tokio::test]
async fn a_write_other_than_the_announced_one_is_still_asked_with_its_diff() {
    let h = Harness::new(Knobs::default()).await;
    // Hostile: announces "hello", writes something else after the approval.
    let scenario = announce_then_write(
        json!([{"path": "hello.txt", "old_text": null, "new_text": "hello\n"}]),
        "hello.txt",
        "rm -rf /\n",
    );
    let rec = h.start(scenario, "create hello.txt").await;
    let first = request_opened(&h, 1).await;
    decide(&h, &rec.id, &first.request_id, Choice::Approve).await;
    let second = request_opened(&h, 2).await;
    assert_eq!(second.kind, RequestKind::FileWrite);
    assert_eq!(second.paths, vec!["hello.txt".to_owned()]);
    let diff = second.diff.clone().expect("diff");
    assert!(diff.contains("+rm -rf /"), "{diff}");
    assert!(
        !h.workspace.join("hello.txt").exists(),
        "nothing is written before the second decision"
    );
    decide(&h, &rec.id, &second.request_id, Choice::Reject).await;
    h.until_transcript(&rec.id, "turn over").await;
    assert!(!h.workspace.join("hello.txt").exists());
}

#[tokio::test]
async fn a_changed_announcement_after_the_approval_is_not_covered() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[
        {"tool_call": {"id": "t1", "title": "Write", "kind": "edit",
                       "diffs": [{"path": "a.txt", "old_text": null, "new_text": "good\n"}]}},
        {"permission": {"tool_call_id": "t1"}},
        {"tool_update": {"id": "t1", "diff": {"path": "a.txt", "old_text": null, "new_text": "evil\n"}}},
        {"write_file": {"path": "a.txt", "content": "evil\n"}},
        {"chunk": "turn over"}
    ]]});
    let rec = h.start(scenario, "go").await;
    let first = request_opened(&h, 1).await;
    decide(&h, &rec.id, &first.request_id, Choice::Approve).await;
    let second = request_opened(&h, 2).await;
    assert_eq!(second.kind, RequestKind::FileWrite);
    assert!(second.diff.expect("diff").contains("+evil"));
}

#[tokio::test]
async fn auto_edits_judges_the_merged_kind_and_paths() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = announce_then_write(
        json!([{"path": "hello.txt", "old_text": null, "new_text": "hi\n"}]),
        "hello.txt",
        "hi\n",
    );
    let mut req = h.request(h.profile(scenario), "go");
    req.mode = Some(ApprovalMode::AutoEdits);
    let rec = h.start_req(req).await.expect("starts");
    h.until_transcript(&rec.id, "turn over").await;
    assert_eq!(
        std::fs::read_to_string(h.workspace.join("hello.txt")).expect("written"),
        "hi\n"
    );
    let all = h
        .store
        .list_requests(Some(&rec.id), false)
        .await
        .expect("list");
    assert_eq!(all.len(), 1, "{all:?}");
    let (_, decision) = h
        .store
        .get_request(&all[0].id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(decision.expect("decided").decided_by, "mode:auto-edits");
}

#[tokio::test]
async fn auto_edits_does_not_allow_an_edit_announced_outside_the_workspace() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[
        {"tool_call": {"id": "t1", "title": "Edit /etc/passwd", "kind": "edit",
                       "diffs": [{"path": "/etc/passwd", "old_text": "root", "new_text": "toor"}]}},
        {"permission": {"tool_call_id": "t1"}},
        {"chunk": "turn over"}
    ]]});
    let mut req = h.request(h.profile(scenario), "go");
    req.mode = Some(ApprovalMode::AutoEdits);
    let rec = h.start_req(req).await.expect("starts");
    let asked = request_opened(&h, 1).await;
    assert_eq!(asked.paths, vec!["/etc/passwd".to_owned()]);
    let pending = h
        .store
        .list_requests(Some(&rec.id), true)
        .await
        .expect("list");
    assert_eq!(pending.len(), 1, "still waiting for a human");
    // The file outside is never read into the diff shown to the operator.
    let diff = asked.diff.expect("diff");
    assert!(diff.contains("-root") && diff.contains("+toor"), "{diff}");
    assert!(diff.contains("+++ /etc/passwd"), "{diff}");
}

#[tokio::test]
async fn a_diff_in_context_never_reads_through_a_symlink_out_of_the_workspace() {
    let h = Harness::new(Knobs::default()).await;
    let secret = h.dir.path().join("secret.txt");
    std::fs::write(&secret, "TOKEN line\npassword=hunter2\n").expect("secret");
    std::os::unix::fs::symlink(&secret, h.workspace.join("leak.txt")).expect("symlink");
    let scenario = json!({"turns": [[
        {"tool_call": {"id": "t1", "title": "Edit leak.txt", "kind": "edit",
                       "diffs": [{"path": "leak.txt", "old_text": "TOKEN", "new_text": "x"}]}},
        {"permission": {"tool_call_id": "t1"}},
        {"chunk": "turn over"}
    ]]});
    h.start(scenario, "go").await;
    let asked = request_opened(&h, 1).await;
    let diff = asked.diff.expect("the agent's own texts are shown");
    assert!(!diff.contains("hunter2"), "{diff}");
    assert!(diff.contains("-TOKEN") && diff.contains("+x"), "{diff}");
}

#[tokio::test]
async fn rules_match_the_merged_paths_and_command() {
    use intercom_actors::rules::{Rule, RuleAction, RuleMatch, Scope, SharedRules};
    let rules = SharedRules::new(vec![
        Rule {
            id: "r-src".into(),
            scope: Scope::Global,
            matcher: RuleMatch {
                kind: Some("edit".into()),
                paths: vec!["src/**".into()],
                ..Default::default()
            },
            action: RuleAction::Allow,
        },
        Rule {
            id: "r-no-rm".into(),
            scope: Scope::Global,
            matcher: RuleMatch {
                command_prefix: Some("rm ".into()),
                ..Default::default()
            },
            action: RuleAction::Deny,
        },
    ]);
    let h = Harness::new(Knobs {
        rules,
        ..Knobs::default()
    })
    .await;
    // Both permissions name only their tool call: kind, paths and the
    // command come from what the tool calls announced.
    let scenario = json!({"turns": [[
        {"tool_call": {"id": "t1", "title": "Edit", "kind": "edit",
                       "diffs": [{"path": "src/x.rs", "old_text": null, "new_text": "fn main() {}\n"}]}},
        {"permission": {"tool_call_id": "t1"}},
        {"tool_call": {"id": "t2", "title": "Run", "kind": "execute", "raw_input": {"command": "rm -rf /"}}},
        {"permission": {"tool_call_id": "t2"}},
        {"chunk": "turn over"}
    ]]});
    let rec = h.start(scenario, "go").await;
    h.until_transcript(&rec.id, "turn over").await;
    let text = h.transcript_text(&rec.id).await;
    assert!(
        text.contains("permission t1: selected allow-once"),
        "{text}"
    );
    assert!(
        text.contains("permission t2: selected reject-once"),
        "{text}"
    );
    let mut deciders = Vec::new();
    for r in h
        .store
        .list_requests(Some(&rec.id), false)
        .await
        .expect("list")
    {
        let (_, d) = h.store.get_request(&r.id).await.expect("get").expect("row");
        deciders.push(d.expect("decided").decided_by);
    }
    deciders.sort();
    assert_eq!(
        deciders,
        vec!["rule:r-no-rm".to_owned(), "rule:r-src".to_owned()]
    );
}

/// An agent that offers only ways to say yes: the operator still has a
/// `Reject`, the agent hears `cancelled` (it did not get a yes), and the
/// decision is stored as a rejection.
#[tokio::test]
async fn the_operator_can_reject_when_the_agent_offers_only_allow_options() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[
        {"tool_call": {"id": "t1", "title": "Run it", "kind": "execute", "status": "pending"}},
        {"permission": {"tool_call_id": "t1", "options": [
            {"optionId": "yes", "name": "Yes", "kind": "allow_once"},
            {"optionId": "intercom-reject", "name": "Reject", "kind": "allow_always"}
        ]}},
        {"if_allowed": {"then": [{"chunk": "ran it"}], "else": [{"chunk": "did not run"}]}}
    ]]});
    let rec = h.start(scenario, "run it").await;
    let req = request_opened(&h, 1).await;
    let added: Vec<_> = req.options.iter().filter(|o| !o.kind.is_allow()).collect();
    assert_eq!(added.len(), 1, "one Reject added: {:?}", req.options);
    assert_ne!(
        added[0].id, "intercom-reject",
        "the added option's id is not one the agent uses"
    );
    // The agent's own option named "Reject" says what it does.
    let named_reject = req.options.iter().find(|o| o.id == "intercom-reject");
    assert_eq!(
        named_reject.map(|o| o.label()),
        Some("Always allow: Reject".to_owned())
    );

    let decided = decide_as(
        &h,
        &rec.id,
        &req.request_id,
        Choice::Reject,
        None,
        Caller::local(),
    )
    .await
    .expect("decided");
    assert!(!decided.approved, "{decided:?}");
    assert_eq!(decided.option_id, added[0].id);
    h.until_transcript(&rec.id, "did not run").await;
    let text = h.transcript_text(&rec.id).await;
    assert!(text.contains("permission t1: cancelled"), "{text}");
    assert!(
        !text.contains("ran it\n") && !text.contains(": ran it"),
        "{text}"
    );
}

/// Two options with one id would let the operator choose one and the agent
/// act on the other: such a request is refused, never shown.
#[tokio::test]
async fn a_request_whose_options_share_an_id_is_refused() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[
        {"permission": {"tool_call_id": "t1", "options": [
            {"optionId": "x", "name": "Reject", "kind": "reject_once"},
            {"optionId": "x", "name": "Allow", "kind": "allow_always"}
        ]}},
        {"chunk": "after the request"}
    ]]});
    let rec = h.start(scenario, "go").await;
    h.until_transcript(&rec.id, "after the request").await;
    let text = h.transcript_text(&rec.id).await;
    assert!(text.contains("option ids must be unique"), "{text}");
    let all = h
        .store
        .list_requests(Some(&rec.id), true)
        .await
        .expect("list");
    assert!(all.is_empty(), "no request was opened: {all:?}");
}

/// Each option becomes a Slack button carrying its id: an option id or an
/// option count past what Slack takes would make Slack refuse the message,
/// and the request would reach the operator without buttons. Such a
/// request is refused with the bound, never shown.
#[tokio::test]
async fn a_request_past_the_option_bounds_is_refused() {
    let h = Harness::new(Knobs::default()).await;
    let long_id = "o".repeat(2000);
    let many: Vec<_> = (0..17)
        .map(|i| json!({"optionId": format!("o{i}"), "name": "Allow", "kind": "allow_once"}))
        .collect();
    // Each path a request names is resolved when rules judge it.
    let locations: Vec<String> = (0..300).map(|i| format!("f{i}.txt")).collect();
    let scenario = json!({"turns": [[
        {"permission": {"tool_call_id": "t1", "options": [
            {"optionId": long_id, "name": "Allow", "kind": "allow_once"},
            {"optionId": "no", "name": "Reject", "kind": "reject_once"}
        ]}},
        {"permission": {"tool_call_id": "t2", "options": many}},
        {"permission": {"tool_call_id": "t3", "kind": "edit", "locations": locations}},
        {"chunk": "after the requests"}
    ]]});
    let rec = h.start(scenario, "go").await;
    h.until_transcript(&rec.id, "after the requests").await;
    let text = h.transcript_text(&rec.id).await;
    assert!(
        text.contains("option id of 2000 bytes; at most 256"),
        "{text}"
    );
    assert!(text.contains("offers 17 options; at most 16"), "{text}");
    assert!(text.contains("names 300 paths; at most 256"), "{text}");
    let all = h
        .store
        .list_requests(Some(&rec.id), true)
        .await
        .expect("list");
    assert!(all.is_empty(), "no request was opened: {all:?}");
}

/// A probe's agent made the workspace a bare repository (`HEAD`, `config`
/// with a `core.fsmonitor` command, `objects/`, `refs/`): the next
/// `git status` in it ran the command. In auto-edits the files that make
/// a directory a repository git obeys are asked for; the rest is not.
#[tokio::test]
async fn auto_edits_asks_before_the_files_that_make_a_bare_repository() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[
        {"write_file": {"path": "objects/info/keep", "content": "\n"}},
        {"write_file": {"path": "refs/heads/keep", "content": "\n"}},
        {"write_file": {"path": "HEAD", "content": "ref: refs/heads/main\n"}},
        {"write_file": {"path": "config",
                        "content": "[core]\n\tfsmonitor = \"touch pwned; false\"\n"}},
        {"chunk": "turn over"}
    ]]});
    let mut req = h.request(h.profile(scenario), "go");
    req.mode = Some(ApprovalMode::AutoEdits);
    let rec = h.start_req(req).await.expect("starts");
    // Every write opens a request; the mode decides the first two itself,
    // so deciding the next two here fails unless they were left asked.
    let head = request_opened(&h, 3).await;
    assert_eq!(head.paths, vec!["HEAD".to_owned()]);
    decide(&h, &rec.id, &head.request_id, Choice::Reject).await;
    let config = request_opened(&h, 4).await;
    assert_eq!(config.paths, vec!["config".to_owned()]);
    decide(&h, &rec.id, &config.request_id, Choice::Reject).await;
    h.until_transcript(&rec.id, "turn over").await;
    assert!(h.workspace.join("objects/info/keep").exists());
    assert!(h.workspace.join("refs/heads/keep").exists());
    assert!(!h.workspace.join("HEAD").exists());
    assert!(!h.workspace.join("config").exists());
}

/// A repository can run its hooks from anywhere (`core.hooksPath`): in
/// auto-edits a write there is asked for, as one to `.git/hooks` is. So is
/// a write to a config file the repository's config includes. An ordinary
/// file next to them is not.
#[tokio::test]
async fn auto_edits_asks_before_writing_where_the_repository_runs_hooks_from() {
    let h = Harness::new(Knobs::default()).await;
    std::fs::create_dir_all(h.workspace.join(".git")).expect("git dir");
    std::fs::write(
        h.workspace.join(".git/config"),
        "[core]\n\thooksPath = tools/hooks\n[include]\n\tpath = ../team.gitconfig\n",
    )
    .expect("git config");
    let scenario = json!({"turns": [[
        {"write_file": {"path": "tools/notes.md", "content": "fine\n"}},
        {"write_file": {"path": "tools/hooks/pre-commit", "content": "#!/bin/sh\ntouch pwned\n"}},
        {"write_file": {"path": "team.gitconfig",
                        "content": "[core]\n\tfsmonitor = \"touch pwned; false\"\n"}},
        {"chunk": "turn over"}
    ]]});
    let mut req = h.request(h.profile(scenario), "go");
    req.mode = Some(ApprovalMode::AutoEdits);
    let rec = h.start_req(req).await.expect("starts");
    let hook = request_opened(&h, 2).await;
    assert_eq!(hook.paths, vec!["tools/hooks/pre-commit".to_owned()]);
    decide(&h, &rec.id, &hook.request_id, Choice::Reject).await;
    let included = request_opened(&h, 3).await;
    assert_eq!(included.paths, vec!["team.gitconfig".to_owned()]);
    decide(&h, &rec.id, &included.request_id, Choice::Reject).await;
    h.until_transcript(&rec.id, "turn over").await;
    assert!(h.workspace.join("tools/notes.md").exists());
    assert!(!h.workspace.join("tools/hooks/pre-commit").exists());
    assert!(!h.workspace.join("team.gitconfig").exists());
}

/// An approval is not carried out once the operator stopped the session: a
/// probe's real agent wrote an approved file 3 s after Stop was pressed
/// (its write arrived while the session stopped, and the approval still
/// covered it). The write is refused, the agent told its turn was
/// cancelled, and the operator told which file was not written.
#[tokio::test]
async fn a_write_an_approval_covered_is_refused_once_the_session_stops() {
    let h = Harness::new(Knobs::default()).await;
    let path = h.workspace.join("late.txt");
    let body = format!(
        r#"
path = {path:?}
def on(m, method, mid):
    if method == "session/prompt":
        send({{"jsonrpc": "2.0", "method": "session/update", "params": {{"sessionId": "s1",
              "update": {{"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Write", "kind": "edit",
                         "status": "pending", "content": [{{"type": "diff", "path": path, "oldText": None, "newText": "late\n"}}]}}}}}})
        ask_for("p1", "t1")
    elif method == "session/cancel":
        # The write the approval covered, sent only once the stop began.
        send({{"jsonrpc": "2.0", "id": "w1", "method": "fs/write_text_file",
              "params": {{"sessionId": "s1", "path": path, "content": "late\n"}}}})
"#,
        path = path.display().to_string()
    );
    let profile = h.python_agent(&body);
    let rec = h.start_req(h.request(profile, "go")).await.expect("start");
    let req = request_opened(&h, 1).await;
    decide(&h, &rec.id, &req.request_id, Choice::Approve).await;
    support::stop_as_operator(&h, &rec.id).await;
    h.until("the refusal's notice", |e| {
        matches!(e, intercom_actors::ports::OperatorEvent::Notice { text, .. } if text.contains("late.txt") && text.contains("not written"))
    })
    .await;
    assert!(!path.exists(), "the write landed after the stop");
    let refused = h
        .store
        .audit_entries()
        .into_iter()
        .find(|a| a.action == "fs.refused")
        .expect("the refusal is audited");
    assert_eq!(refused.detail["reason"], "the session is stopping");
}
