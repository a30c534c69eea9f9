//! An approved MCP change survives a server restart (issue 14, item 17):
//! `check_clearance` records the target files' hashes in SQLite, so after
//! `agent-intercom serve` is stopped and started again on the same database
//! a new MCP client applies the approved change with `check_diff` and no
//! `force`; a second apply is refused (the applied mark is stored too), and
//! a client of another workspace can never use the clearance.

mod chaos_common;
mod mcp_common;

use chaos_common::{Api, Deployment, Launch, ServerProcess, Spec, free_port};
use mcp_common::{Client, call, ok, refused};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::json;

const TOKEN: &str = "mcp-restart-test-token-0123456789";

fn launch() -> Launch {
    Launch {
        env: vec![("AGENT_INTERCOM_TOKEN".into(), TOKEN.into())],
        ..Launch::default()
    }
}

async fn client(port: u16, query: &str) -> Client {
    let config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            format!("http://127.0.0.1:{port}/mcp{query}"),
        )
        .auth_header(TOKEN);
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("MCP client connects")
}

fn start(deployment: &Deployment, api: &Api) -> ServerProcess {
    let mut server = ServerProcess::spawn(deployment, &launch());
    server.wait_healthy(api);
    server
}

fn stop(mut server: ServerProcess) {
    server.signal(libc::SIGTERM);
    let status = server.wait_exit();
    assert!(status.success(), "{status}:\n{}", server.stderr());
}

/// A free port, a deployment serving on it, its API and a runtime for the
/// MCP clients.
fn rig() -> (u16, Deployment, Api, tokio::runtime::Runtime) {
    let port = free_port();
    let spec = Spec {
        bind: format!("127.0.0.1:{port}"),
        ..Spec::default()
    };
    let deployment = Deployment::new(&spec);
    let api = Api::new(&format!("http://127.0.0.1:{port}"), Some(TOKEN));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    (port, deployment, api, rt)
}

/// A `demo` client calling `check_clearance` for an edit of notes.txt:
/// the client, the waiting call, and the request once it is pending.
async fn ask_to_edit_notes(
    port: u16,
    api: &Api,
) -> (
    Client,
    tokio::task::JoinHandle<Result<rmcp::model::CallToolResult, rmcp::ServiceError>>,
    serde_json::Value,
) {
    let c = client(port, "?workspace_id=demo").await;
    let args = json!({"title": "Edit notes", "diff": "new\n", "file_path": "notes.txt"});
    let peer = c.peer().clone();
    let call = tokio::spawn(async move {
        peer.call_tool(
            CallToolRequestParams::new("check_clearance").with_arguments(mcp_common::args(args)),
        )
        .await
    });
    let pending = tokio::task::spawn_blocking({
        let api = api.clone();
        move || chaos_common::until("the clearance request", || api.pending().into_iter().next())
    })
    .await
    .expect("join");
    (c, call, pending)
}

#[test]
fn an_approved_change_is_applied_once_after_a_server_restart() {
    let (port, deployment, api, rt) = rig();
    std::fs::write(deployment.ws.join("notes.txt"), "old\n").expect("seed");

    let first = start(&deployment, &api);
    let asked = rt.block_on(async {
        let (c, call, pending) = ask_to_edit_notes(port, &api).await;
        let id = pending["id"].as_str().expect("id").to_owned();
        let decided = tokio::task::spawn_blocking({
            let api = api.clone();
            let id = id.clone();
            move || {
                api.post(
                    &format!("/api/approvals/{id}"),
                    &json!({"decision": "approve"}),
                )
            }
        })
        .await
        .expect("join");
        assert_eq!(decided.status, 200, "{}", decided.text);
        let result = mcp_common::structured(&call.await.expect("join").expect("call"));
        assert_eq!(result["status"], "approved", "{result}");
        c.cancel().await.expect("close");
        id
    });
    stop(first);
    assert_eq!(
        std::fs::read_to_string(deployment.ws.join("notes.txt")).expect("read"),
        "old\n",
        "nothing is written before check_diff"
    );

    let second = start(&deployment, &api);
    rt.block_on(async {
        // A client of another workspace may not apply it, even with force.
        let other = client(port, "").await;
        let err = call(
            &other,
            "check_diff",
            json!({"request_id": asked, "force": true}),
        )
        .await;
        let refused_other = match err {
            Err(rmcp::ServiceError::McpError(e)) => e.message.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert!(
            refused_other.contains("another workspace"),
            "{refused_other}"
        );

        let c = client(port, "?workspace_id=demo").await;
        let applied = ok(&c, "check_diff", json!({"request_id": asked})).await;
        assert_eq!(applied["files_written"], json!(["notes.txt"]), "{applied}");
        let again = refused(&c, "check_diff", json!({"request_id": asked})).await;
        assert_eq!(again["code"], "already_applied", "{again}");
        c.cancel().await.expect("close");
        other.cancel().await.expect("close");
    });
    assert_eq!(
        std::fs::read_to_string(deployment.ws.join("notes.txt")).expect("read"),
        "new\n"
    );
    // The write is in the audit of the request's session, where the
    // operator who approved it looks (it went to the applying connection's).
    let session = asked.split(':').next().expect("a session id");
    let audit = api.get(&format!("/api/audit?session={session}"));
    assert!(audit.text.contains("change.applied"), "{}", audit.text);
    stop(second);
    // The replay is refused after another restart too.
    let third = start(&deployment, &api);
    rt.block_on(async {
        let c = client(port, "?workspace_id=demo").await;
        let again = refused(&c, "check_diff", json!({"request_id": asked})).await;
        assert_eq!(again["code"], "already_applied", "{again}");
        c.cancel().await.expect("close");
    });
    stop(third);
}

/// A `check_clearance` still waiting when the server is stopped gets its
/// request's end as an answer (rejected: cancelled before the operator
/// decided), not an empty stream: the MCP
/// streams used to be ended before the sessions, and the log blamed the
/// client.
#[test]
fn a_clearance_waiting_at_shutdown_is_answered() {
    let (port, deployment, api, rt) = rig();
    let mut server = start(&deployment, &api);
    let answer = rt.block_on(async {
        let (_c, call, _) = ask_to_edit_notes(port, &api).await;
        server.signal(libc::SIGTERM);
        call.await.expect("join")
    });
    let status = server.wait_exit();
    assert!(status.success(), "{status}:\n{}", server.stderr());
    let result = mcp_common::structured(&answer.expect("an answer, not a broken stream"));
    assert_eq!(result["status"], "rejected", "{result}");
    assert!(
        result["reason"]
            .as_str()
            .is_some_and(|r| r.contains("cancelled")),
        "{result}"
    );
}
