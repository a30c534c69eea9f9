//! A bridge token is confined to its own session: an ACP agent the server
//! started (holding the per-session token it got in `mcpServers`) cannot
//! read another session's steering and requests (`reboot {session_id}`) nor
//! apply another session's approved change (`check_diff {request_id}`),
//! while its own session keeps working. The real router, rmcp's client, the
//! scripted ACP agent; the operator answers through the session actors.

mod mcp_common;

use intercom_actors::model::{PendingRequest, SessionId, SessionRecord};
use intercom_actors::session::Choice;
use mcp_common::{Client, Harness, WAIT, call, ok, refused};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

/// Operator steering meant for the IDE agent only.
const STEERING: &str = "steering-for-the-ide-agent-only";
/// The title of a request pending in the IDE agent's session.
const PENDING: &str = "pending-question-of-the-ide-agent";

/// An ACP session in workspace `ws` whose agent took the bridge, and an MCP
/// client presenting that session's bridge token.
async fn bridged_agent(h: &Harness) -> (SessionRecord, Client) {
    let acp = h
        .start_acp(json!({"mcp_http": true, "turns": [[{"echo_mcp": true}]]}))
        .await;
    let text = h.until_transcript(&acp.id, "Bearer ").await;
    let token = text
        .split("Bearer ")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the agent echoed its bridge token")
        .to_owned();
    let client = h.client_with("", &token).await;
    (acp, client)
}

/// The first pending request of `session` (waits for it).
async fn pending_of(h: &Harness, session: &SessionId) -> PendingRequest {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let reqs = h
            .store
            .list_requests(Some(session), true)
            .await
            .expect("list requests");
        if let Some(r) = reqs.into_iter().next() {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pending request in {session}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `client` asks clearance to write `content` to `file`; `session` (the
/// client's) is approved by the operator. Returns the request.
async fn approved_clearance(
    h: &Harness,
    client: &Client,
    session: impl AsyncFnOnce() -> SessionId,
    file: &str,
    content: &str,
) -> PendingRequest {
    let peer = client.peer().clone();
    let args = json!({"title": "Edit", "diff": content, "file_path": file});
    let task = tokio::spawn(async move {
        peer.call_tool(
            CallToolRequestParams::new("check_clearance").with_arguments(mcp_common::args(args)),
        )
        .await
    });
    let req = pending_of(h, &session().await).await;
    h.decide(&req, Choice::Approve, None).await;
    let result = mcp_common::structured(&task.await.expect("join").expect("call"));
    assert_eq!(result["status"], "approved", "{result}");
    req
}

/// The `action.denied` entries audited on `session` (waits for one).
async fn denials(h: &Harness, session: &SessionId) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let found: Vec<Value> = h
            .sqlite
            .audit_log(Some(session))
            .await
            .expect("audit log")
            .into_iter()
            .filter(|(_, e)| e.action == "action.denied")
            .map(|(_, e)| e.detail)
            .collect();
        if !found.is_empty() {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no action.denied audited on {session}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

fn read(h: &Harness, file: &str) -> String {
    std::fs::read_to_string(h.workspace.join(file)).expect("read")
}

/// Whether the stored clearance of `request` was used up.
async fn applied(h: &Harness, request: &str) -> bool {
    h.store
        .clearance(request)
        .await
        .expect("clearance")
        .is_some_and(|c| c.applied_at.is_some())
}

#[tokio::test]
async fn bridge_reboot_of_another_session_is_refused_and_leaks_nothing() {
    let h = Harness::new().await;
    let (acp, bridged) = bridged_agent(&h).await;
    // The victim: an IDE agent of the same workspace, with steering queued
    // and a question pending.
    let ide = h.ws_client().await;
    ok(&ide, "ping", json!({})).await;
    let victim = h.mcp_session().await;
    assert!(h.steer(&victim.id, STEERING).await.queued);
    let peer = ide.peer().clone();
    let asking = tokio::spawn(async move {
        peer.call_tool(
            CallToolRequestParams::new("transmit")
                .with_arguments(mcp_common::args(json!({"prompt_text": PENDING}))),
        )
        .await
    });
    pending_of(&h, &victim.id).await;

    let r = call(&bridged, "reboot", json!({"session_id": victim.id}))
        .await
        .expect("tool call");
    let whole = format!("{r:?}");
    assert!(!whole.contains(STEERING), "steering leaked: {whole}");
    assert!(!whole.contains(PENDING), "pending request leaked: {whole}");
    assert_eq!(r.is_error, Some(true), "reboot should be refused: {whole}");
    let err = mcp_common::structured(&r);
    assert_eq!(err["code"], "other_session", "{err}");
    let message = err["error"].as_str().expect("message");
    assert!(
        message.contains(&format!(
            "this token belongs to session {}; it cannot act on session {}",
            acp.id, victim.id
        )),
        "{message}"
    );
    // An unknown session gets the same answer: no oracle for session ids.
    let r = refused(
        &bridged,
        "reboot",
        json!({"session_id": "s-0000000000000000"}),
    )
    .await;
    assert_eq!(r["code"], "other_session", "{r}");
    let audited = denials(&h, &acp.id).await;
    assert!(
        audited
            .iter()
            .any(|d| d["action"] == "mcp.reboot" && d["named_session"] == json!(victim.id)),
        "{audited:?}"
    );

    // The agent's own session still answers, with or without its id.
    for a in [json!({}), json!({"session_id": acp.id})] {
        let state = ok(&bridged, "reboot", a).await;
        assert_eq!(state["session_id"], json!(acp.id), "{state}");
    }
    // The victim's steering is still there for the IDE agent.
    let state = ok(&ide, "reboot", json!({})).await;
    assert_eq!(state["queued_steering"], json!([STEERING]));
    asking.abort();
}

#[tokio::test]
async fn bridge_check_diff_of_another_sessions_approval_is_refused_and_left_to_its_owner() {
    let h = Harness::new().await;
    std::fs::write(h.workspace.join("f.txt"), "v1\n").expect("seed");
    let (acp, bridged) = bridged_agent(&h).await;
    // The operator approved a change for the IDE agent's session.
    let ide = h.ws_client().await;
    let ide_session = async || h.mcp_session().await.id;
    let theirs = approved_clearance(&h, &ide, ide_session, "f.txt", "for the IDE\n").await;
    for force in [false, true] {
        let r = refused(
            &bridged,
            "check_diff",
            json!({"request_id": theirs.id, "force": force}),
        )
        .await;
        assert_eq!(r["code"], "other_session", "force {force}: {r}");
        let message = r["error"].as_str().expect("message");
        assert!(
            message.contains(&format!(
                "this token belongs to session {}; it cannot act on session {}",
                acp.id, theirs.session_id
            )),
            "{message}"
        );
        assert_eq!(read(&h, "f.txt"), "v1\n", "nothing is written");
        assert!(
            !applied(&h, &theirs.id).await,
            "the approval is not used up"
        );
    }
    let audited = denials(&h, &acp.id).await;
    assert!(
        audited
            .iter()
            .any(|d| d["action"] == "mcp.check_diff" && d["request_id"] == json!(theirs.id)),
        "{audited:?}"
    );
    // The rightful owner still applies it.
    let done = ok(&ide, "check_diff", json!({"request_id": theirs.id})).await;
    assert_eq!(done["files_written"], json!(["f.txt"]));
    assert_eq!(read(&h, "f.txt"), "for the IDE\n");
    // The operator edits the file; the agent cannot force the old approved
    // content back.
    std::fs::write(h.workspace.join("f.txt"), "operator edit\n").expect("edit");
    let r = refused(
        &bridged,
        "check_diff",
        json!({"request_id": theirs.id, "force": true}),
    )
    .await;
    assert_eq!(r["code"], "other_session", "{r}");
    assert_eq!(read(&h, "f.txt"), "operator edit\n");

    // Its own approval the agent applies, by global or short id.
    let acp_id = acp.id.clone();
    let own = approved_clearance(&h, &bridged, async || acp_id, "own.txt", "mine\n").await;
    assert_eq!(own.session_id, acp.id);
    let done = ok(&bridged, "check_diff", json!({"request_id": own.id})).await;
    assert_eq!(done["files_written"], json!(["own.txt"]));
    assert_eq!(read(&h, "own.txt"), "mine\n");
    let short = own.id.rsplit(':').next().expect("short id");
    let again = refused(&bridged, "check_diff", json!({"request_id": short})).await;
    assert_eq!(again["code"], "already_applied", "{again}");
}
