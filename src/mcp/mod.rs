//! The MCP server: IDE agents connect over streamable HTTP at `/mcp`.
//!
//! [`router`] serves rmcp's streamable HTTP transport. Each MCP session
//! (rmcp's `Mcp-Session-Id`) gets one [`server::IntercomMcp`] handler, which
//! attaches ONE core session (`SupervisorMsg::Attach`) on its first tool call
//! and sends `McpCall::Disconnected` when the MCP session closes or expires.
//! The query string says where the session belongs: `?workspace_id=` (the
//! channel comes from the workspace map) or the deprecated `?channel_id=`.
//!
//! Every request is authenticated before rmcp sees it ([`auth`]):
//! `Authorization: Bearer <token>` with the operator API token, a
//! per-workspace MCP token (`[mcp] workspace_token_env`; the connection is
//! then confined to that workspace), or an ACP session's bridge token (the
//! ACP-MCP bridge: those calls go to the ACP session's actor, never
//! create a session, and may name no other session). Anything else is 401.
//! A browser `Origin` that is not loopback (or a configured `allowed_hosts`
//! entry) is 403, and rmcp's DNS-rebinding guard stays on for `Host`.
//! An MCP session answers only the credential that opened it
//! (`session_owners.rs`); to anyone else its id is unknown (404).
//!
//! Layout: `server.rs` (the handler and the tools), `tools.rs` (tool schemas
//! and argument checking), `patch.rs` (diffs and atomic writes), `auth.rs`
//! and `session_owners.rs` (who may call, and which MCP session is whose).

mod auth;
mod hangup;
mod malformed;
mod patch;
mod server;
mod session_owners;
mod tools;

pub use auth::McpCredentials;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{Method, StatusCode};
use axum::response::Response;
use intercom_actors::model::SessionId;
use intercom_actors::ports::SessionStore;
use intercom_actors::registry::RegistryMsg;

use crate::root::Current;
use intercom_actors::supervisor::SupervisorMsg;
use ractor::ActorRef;
use ractor::rpc::CallResult;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

pub use patch::{Change, PatchError};

/// Default for [`McpDeps::approval_timeout`]: 5 minutes.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(300);
/// Default for [`McpDeps::transmit_timeout`]: 5 minutes.
pub const DEFAULT_TRANSMIT_TIMEOUT: Duration = Duration::from_secs(300);
/// Hosts always allowed in the `Host` header (any port).
pub const LOOPBACK_HOSTS: &[&str] = &["localhost", "127.0.0.1", "::1"];
/// Where the router serves MCP.
pub const PATH: &str = "/mcp";

/// How long a call to an actor may take before it counts as a failure.
const ACTOR_TIMEOUT: Duration = Duration::from_secs(10);

/// What the MCP endpoint needs from the running server.
#[derive(Clone)]
pub struct McpDeps {
    /// Creates sessions, resolves bridge tokens, finds session actors.
    pub supervisor: ActorRef<SupervisorMsg>,
    /// The workspace map (workspace id / channel -> directory and channel),
    /// following Root's restarts.
    pub registry: Current<RegistryMsg>,
    /// Requests, transcripts, steering.
    pub store: Arc<dyn SessionStore>,
    /// How long `check_clearance` (and a `standby` without
    /// `timeout_seconds`) waits for the operator.
    pub approval_timeout: Duration,
    /// How long `transmit` waits before continuing on its own.
    pub transmit_timeout: Duration,
    /// Extra `Host` values to serve besides loopback (`name` or `name:port`),
    /// for a server reached through a proxy or by another name.
    pub allowed_hosts: Vec<String>,
    /// Cancelled at shutdown: ends every MCP session and open stream so the
    /// HTTP server's graceful shutdown does not wait on them.
    pub shutdown: CancellationToken,
    /// The approval rules `auto_check` consults (the server's shared set).
    pub rules: intercom_actors::rules::SharedRules,
    /// The server's own files: refused to MCP clients too.
    pub server_files: intercom_actors::workspace_fs::ServerFiles,
    /// Who may connect (besides bridged ACP agents).
    pub credentials: McpCredentials,
}

impl McpDeps {
    /// Deps with the default timeouts, loopback hosts only, and a fresh
    /// shutdown token.
    pub fn new(
        supervisor: ActorRef<SupervisorMsg>,
        registry: impl Into<Current<RegistryMsg>>,
        store: Arc<dyn SessionStore>,
    ) -> Self {
        McpDeps {
            supervisor,
            registry: registry.into(),
            store,
            approval_timeout: DEFAULT_APPROVAL_TIMEOUT,
            transmit_timeout: DEFAULT_TRANSMIT_TIMEOUT,
            allowed_hosts: Vec::new(),
            shutdown: CancellationToken::new(),
            rules: Default::default(),
            server_files: Default::default(),
            credentials: McpCredentials::default(),
        }
    }

    /// The `Host` values rmcp accepts: loopback plus the configured ones.
    fn hosts(&self) -> Vec<String> {
        allowed_hosts(&self.allowed_hosts)
    }

    /// The longest a tool call may block: an rmcp session must outlive it,
    /// since rmcp counts a session without traffic as idle.
    fn longest_wait(&self) -> Duration {
        self.approval_timeout
            .max(self.transmit_timeout)
            .max(Duration::from_secs(tools::MAX_STANDBY_SECS))
    }
}

/// Loopback plus `extra` (trimmed, without blanks and duplicates).
fn allowed_hosts(extra: &[String]) -> Vec<String> {
    let mut hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| (*h).to_owned()).collect();
    for h in extra {
        let h = h.trim();
        if !h.is_empty() && !hosts.iter().any(|x| x == h) {
            hosts.push(h.to_owned());
        }
    }
    hosts
}

/// Why an actor call failed.
#[derive(Debug, thiserror::Error)]
pub enum ActorCallError {
    /// The actor is gone or did not answer in time.
    #[error("{what} did not answer: {reason}")]
    NoAnswer {
        /// Which actor call.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

/// Calls an actor and waits (bounded) for the answer.
async fn ask<M, T, F>(
    actor: &ActorRef<M>,
    what: &'static str,
    timeout: Duration,
    build: F,
) -> Result<T, ActorCallError>
where
    M: ractor::Message,
    T: Send + 'static,
    F: FnOnce(ractor::RpcReplyPort<T>) -> M,
{
    match actor.call(build, Some(timeout)).await {
        Ok(CallResult::Success(v)) => Ok(v),
        Ok(CallResult::Timeout) => Err(ActorCallError::NoAnswer {
            what,
            reason: format!("no answer within {} s", timeout.as_secs()),
        }),
        Ok(CallResult::SenderError) => Err(ActorCallError::NoAnswer {
            what,
            reason: "the actor dropped the request".into(),
        }),
        Err(e) => Err(ActorCallError::NoAnswer {
            what,
            reason: e.to_string(),
        }),
    }
}

/// Request extension set by the bridge check: the ACP session this
/// connection acts for.
#[derive(Debug, Clone)]
pub(crate) struct BridgedSession(pub SessionId);

/// rmcp's session manager as the server wraps it.
pub(crate) type Sessions = session_owners::OwnedSessions<LocalSessionManager>;

/// The axum router serving MCP at [`PATH`], for a router of any state.
/// Mount it with `Router::merge` (not `nest`, which can drop the `Host`
/// header rmcp checks).
pub fn router<S>(deps: McpDeps) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    let shared = Arc::new(server::Shared::new(deps));
    let deps = &shared.deps;
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(deps.hosts())
        .with_max_request_body_bytes(malformed::MAX_BODY_BYTES)
        .with_cancellation_token(deps.shutdown.child_token());
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(deps.longest_wait() + Duration::from_secs(300));
    let sessions = Arc::new(session_owners::OwnedSessions::new(
        sessions,
        shared.owners.clone(),
    ));
    let _ = shared.sessions.set(sessions.clone());
    let factory_shared = shared.clone();
    let service = StreamableHttpService::new(
        move || Ok(server::IntercomMcp::new(factory_shared.clone())),
        sessions,
        config,
    );
    Router::new()
        .route_service(PATH, service)
        .route_layer(axum::middleware::from_fn(malformed::refuse_malformed))
        .route_layer(axum::middleware::from_fn(hangup::watch))
        .route_layer(axum::middleware::from_fn_with_state(
            shared,
            auth::authenticate,
        ))
}

/// rmcp answers a session `DELETE` with 202; the official Python SDK
/// expects 200 or 204 and logs a warning otherwise. The session is gone
/// either way, so say 204.
pub(crate) fn session_deleted_is_no_content(mut res: Response, method: &Method) -> Response {
    if *method == Method::DELETE && res.status() == StatusCode::ACCEPTED {
        *res.status_mut() = StatusCode::NO_CONTENT;
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;

    #[test]
    fn loopback_is_always_allowed_and_extra_hosts_are_added_once() {
        assert_eq!(allowed_hosts(&[]), vec!["localhost", "127.0.0.1", "::1"]);
        let extra = ["intercom.example:8443", "localhost", " "].map(String::from);
        assert_eq!(
            allowed_hosts(&extra),
            vec!["localhost", "127.0.0.1", "::1", "intercom.example:8443"]
        );
    }

    #[test]
    fn a_deleted_session_answers_no_content() {
        let res = (StatusCode::ACCEPTED, "").into_response();
        let res = session_deleted_is_no_content(res, &Method::DELETE);
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
        let res = (StatusCode::ACCEPTED, "").into_response();
        let res = session_deleted_is_no_content(res, &Method::POST);
        assert_eq!(res.status(), StatusCode::ACCEPTED);
    }
}
