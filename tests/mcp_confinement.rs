//! A bridge token is confined to its own session: an ACP agent the server
//! started (holding the per-session token it got in `mcpServers`) cannot
//! read another session's steering and requests (`reboot {session_id}`) nor
//! apply another session's approved change (`check_diff {request_id}`),
//! while its own session keeps working. An MCP session (`Mcp-Session-Id`)
//! answers only the credential that opened it: another client's workspace
//! token or an agent's bridge token naming it gets 404 and changes nothing.
//! A workspace token stops working when a reload removes its workspace. The
//! real router, rmcp's client (or raw HTTP where the test needs the session
//! id), the scripted ACP agent; the operator answers through the session
//! actors.

mod mcp_common;

use intercom_actors::model::SessionStatus;
use intercom_actors::model::{PendingRequest, SessionId, SessionRecord};
use intercom_actors::registry::RegistryMsg;
use intercom_actors::session::Choice;
use mcp_common::{
    Client, Harness, OPERATOR_TOKEN, RawReply, WAIT, WORKSPACE_TOKEN, call, ok, raw_mcp,
    raw_session, raw_tool, refused,
};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

/// Operator steering meant for the IDE agent only.
const STEERING: &str = "steering-for-the-ide-agent-only";
/// The title of a request pending in the IDE agent's session.
const PENDING: &str = "pending-question-of-the-ide-agent";

/// An ACP session in workspace `ws` whose agent took the bridge, and an MCP
/// client presenting that session's bridge token.
async fn bridged_agent(h: &Harness) -> (SessionRecord, Client) {
    let (acp, token) = h.bridge_token().await;
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

/// Where the IDE client of the session-binding tests connects.
const IDE_QUERY: &str = "?workspace_id=ws";

/// An operator-token IDE client's MCP session (opened by hand, so the test
/// knows its `Mcp-Session-Id`), attached to a core session with `STEERING`
/// queued. Returns the MCP session id and the core session.
async fn ide_session_with_steering(h: &Harness) -> (String, SessionRecord) {
    let mcp_id = raw_session(h.port, IDE_QUERY, OPERATOR_TOKEN).await;
    let first = raw_tool(
        h.port,
        IDE_QUERY,
        OPERATOR_TOKEN,
        &mcp_id,
        "ping",
        json!({}),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    let core = h.mcp_session().await;
    assert!(h.steer(&core.id, STEERING).await.queued);
    (mcp_id, core)
}

/// What another credential presenting `mcp_id` gets for a tool call, the
/// event stream (GET) and ending the session (DELETE): 404 each time, as
/// for a session that does not exist, with nothing of the session in it.
async fn foreign_use_is_not_found(h: &Harness, token: &str, mcp_id: &str) {
    for tool in ["ping", "reboot", "broadcast"] {
        let a = if tool == "broadcast" {
            json!({"message": "not yours"})
        } else {
            json!({})
        };
        let r = raw_tool(h.port, IDE_QUERY, token, mcp_id, tool, a).await;
        assert_eq!(r.status, 404, "{tool}: {}", r.body);
        assert!(!r.body.contains(STEERING), "{tool} leaked: {}", r.body);
    }
    let cancel = json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 7},
    });
    let r = raw_mcp(h.port, "POST", "", token, Some(mcp_id), &cancel.to_string()).await;
    assert_eq!(r.status, 404, "cancel: {}", r.body);
    let r = raw_mcp(h.port, "GET", "", token, Some(mcp_id), "").await;
    assert_eq!(r.status, 404, "GET stream");
    let r = raw_mcp(h.port, "DELETE", "", token, Some(mcp_id), "").await;
    assert_eq!(r.status, 404, "DELETE: {}", r.body);
}

/// The rightful client still uses its MCP session: its core session is
/// live and hands over the steering nobody else took.
async fn owner_still_works(h: &Harness, mcp_id: &str, core: &SessionRecord) {
    let r: RawReply = raw_tool(h.port, IDE_QUERY, OPERATOR_TOKEN, mcp_id, "ping", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body.contains(STEERING),
        "the steering is gone: {}",
        r.body
    );
    let record = h
        .store
        .get_session(&core.id)
        .await
        .expect("get")
        .expect("session");
    assert!(record.status.is_live(), "{record:?}");
    assert_eq!(
        h.mcp_sessions().await.len(),
        1,
        "no session was attached for the intruder"
    );
}

#[tokio::test]
async fn a_workspace_token_cannot_use_another_clients_mcp_session() {
    let h = Harness::new().await;
    let (mcp_id, core) = ide_session_with_steering(&h).await;
    foreign_use_is_not_found(&h, WORKSPACE_TOKEN, &mcp_id).await;
    owner_still_works(&h, &mcp_id, &core).await;
    // The workspace token still opens and uses a session of its own.
    let own = raw_session(h.port, "", WORKSPACE_TOKEN).await;
    let r = raw_tool(h.port, "", WORKSPACE_TOKEN, &own, "ping", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // ... which the operator token may not use either.
    let r = raw_tool(h.port, "", OPERATOR_TOKEN, &own, "ping", json!({})).await;
    assert_eq!(r.status, 404, "{}", r.body);
}

#[tokio::test]
async fn a_bridge_token_cannot_use_or_end_another_clients_mcp_session() {
    let h = Harness::new().await;
    let (acp, token) = h.bridge_token().await;
    let (mcp_id, core) = ide_session_with_steering(&h).await;
    foreign_use_is_not_found(&h, &token, &mcp_id).await;
    owner_still_works(&h, &mcp_id, &core).await;
    // The DELETE ended nothing; the owner's own DELETE does.
    let r = raw_mcp(h.port, "DELETE", "", OPERATOR_TOKEN, Some(&mcp_id), "").await;
    assert_eq!(r.status, 204, "{}", r.body);
    h.until_session(&core.id, |r| r.status == SessionStatus::Completed)
        .await;
    // Once ended, the id is unknown to everyone.
    let r = raw_tool(
        h.port,
        IDE_QUERY,
        OPERATOR_TOKEN,
        &mcp_id,
        "ping",
        json!({}),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    // The agent's own bridge still works.
    let bridged = h.client_with("", &token).await;
    let state = ok(&bridged, "reboot", json!({})).await;
    assert_eq!(state["session_id"], json!(acp.id), "{state}");
}

#[tokio::test]
async fn a_workspace_token_is_refused_once_a_reload_removes_its_workspace() {
    let h = Harness::new().await;
    let before = h.client_with("", WORKSPACE_TOKEN).await;
    ok(&before, "ping", json!({})).await;
    let mut map = ractor::call!(h.registry, RegistryMsg::Get).expect("the workspace map");
    map.workspaces.retain(|w| w.id != "ws");
    h.registry
        .send_message(RegistryMsg::Reload(Box::new(map)))
        .expect("reload");
    // A new connection with the token is refused, and says why.
    let r = raw_mcp(
        h.port,
        "POST",
        "",
        WORKSPACE_TOKEN,
        None,
        mcp_common::INITIALIZE,
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("no longer configured"), "{}", r.body);
    // So is the next call of a connection opened before the reload.
    call(&before, "ping", json!({}))
        .await
        .expect_err("the old workspace token is refused");
    // No workspace-less session was attached for the token.
    assert!(
        h.mcp_sessions().await.iter().all(|s| s.workspace == "ws"),
        "{:?}",
        h.mcp_sessions().await
    );
    // The operator token still connects.
    let operator = h.client("").await;
    ok(&operator, "ping", json!({})).await;
}

/// One credential holds at most 32 MCP sessions open: past that its
/// `initialize` is answered 429 saying what to do, and other credentials
/// (the operator, another client) keep working. Closing one frees a slot.
/// Before, one workspace token opened thousands, filled the server's MCP
/// sessions for everyone and evicted other clients' sessions.
#[tokio::test]
async fn one_credential_cannot_hold_more_than_its_share_of_mcp_sessions() {
    let h = Harness::new().await;
    let operator = raw_session(h.port, "", OPERATOR_TOKEN).await;
    let mut mine = Vec::new();
    for _ in 0..32 {
        mine.push(raw_session(h.port, "", WORKSPACE_TOKEN).await);
    }
    let refused = raw_mcp(
        h.port,
        "POST",
        "",
        WORKSPACE_TOKEN,
        None,
        mcp_common::INITIALIZE,
    )
    .await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert!(
        refused.body.contains("already holds 32 open MCP sessions"),
        "{}",
        refused.body
    );
    // The operator's session still answers, and the operator may open more.
    let ping = raw_tool(h.port, "", OPERATOR_TOKEN, &operator, "ping", json!({})).await;
    assert_eq!(ping.status, 200, "{}", ping.body);
    raw_session(h.port, "", OPERATOR_TOKEN).await;
    // Many initializes at once cannot pass the bound together: each holds
    // its place from the check on.
    let burst: Vec<_> = (0..40)
        .map(|_| {
            let port = h.port;
            tokio::spawn(async move {
                raw_mcp(
                    port,
                    "POST",
                    "",
                    OPERATOR_TOKEN,
                    None,
                    mcp_common::INITIALIZE,
                )
                .await
                .status
            })
        })
        .collect();
    let mut opened = 0;
    for b in burst {
        if b.await.expect("join") == 200 {
            opened += 1;
        }
    }
    // The operator already held two.
    assert_eq!(opened, 30, "{opened} opened in a burst of 40");
    // Closing one of its sessions lets the workspace client open another.
    let closed = raw_mcp(
        h.port,
        "DELETE",
        "",
        WORKSPACE_TOKEN,
        mine.last().map(String::as_str),
        "",
    )
    .await;
    assert!(closed.status < 300, "{}: {}", closed.status, closed.body);
    raw_session(h.port, "", WORKSPACE_TOKEN).await;
}

/// `check_diff` applies only changes asked with `check_clearance`: an ACP
/// agent's permission in the same workspace, approved for that agent to
/// make, is not applied by an MCP client in its place, `force` or not.
#[tokio::test]
async fn check_diff_refuses_an_acp_agents_approved_permission() {
    let h = Harness::new().await;
    let acp = h
        .start_acp(json!({"turns": [[
            {"tool_call": {"id": "t1", "title": "Create acp.txt", "kind": "edit",
                "diffs": [{"path": "acp.txt", "new_text": "from the agent\n"}]}},
            {"permission": {"tool_call_id": "t1", "title": "Create acp.txt", "kind": "edit"}},
            {"chunk": "\ndone"}
        ]]}))
        .await;
    let req = h.pending().await;
    assert_eq!(req.session_id, acp.id);
    assert!(req.diff.is_some(), "the permission carries its diff");
    h.decide(&req, Choice::Approve, None).await;
    let ide = h.ws_client().await;
    for force in [false, true] {
        let err = call(
            &ide,
            "check_diff",
            json!({"request_id": req.id, "force": force}),
        )
        .await
        .expect_err("an agent's request");
        assert!(
            err.to_string()
                .contains("is from a session that is an agent's, not an MCP client's"),
            "force {force}: {err}"
        );
    }
    assert!(
        !h.workspace.join("acp.txt").exists(),
        "nothing was written for the agent"
    );
}
