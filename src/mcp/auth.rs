//! Who may talk to `/mcp`: the bearer check and the `Origin` check.
//!
//! `/mcp` opens sessions, posts to Slack (`broadcast`) and reads pending
//! requests and queued steering (`reboot`), so it is as sensitive as `/api`.
//! Every request carries `Authorization: Bearer <token>`, one of:
//!
//! - the operator API token: an IDE client, any workspace;
//! - a workspace MCP token (`[mcp] workspace_token_env`): an IDE client
//!   confined to that workspace (tagged [`ScopedWorkspace`]);
//! - a bridge token the supervisor handed an ACP agent in its `mcpServers`
//!   headers: the calls act for that ACP session and may name no other
//!   session or another session's request (tagged [`BridgedSession`]; see
//!   `server/confine.rs`).
//!
//! An MCP session (`Mcp-Session-Id`) belongs to the credential that opened
//! it: any other credential naming it gets 404, as for an unknown session
//! (`session_owners.rs`). A workspace token whose workspace a config reload
//! removed is refused (403).
//!
//! Tokens in the URL (`?session_id=`) are refused: URLs end up in logs and
//! browser histories. A request whose `Origin` is not a loopback origin (or a
//! configured `allowed_hosts` entry) is refused, so a web page in the
//! operator's browser cannot drive the endpoint even if it learned a token.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use intercom_actors::supervisor::SupervisorMsg;

use super::session_owners::{Busy, NotYours, Owner, PER_OWNER, REPLACEABLE_AFTER, Reservation};
use super::{ACTOR_TIMEOUT, BridgedSession, ask, server, session_deleted_is_no_content};
use crate::http::auth::ApiToken;

/// The tokens `/mcp` accepts besides bridge tokens.
#[derive(Debug, Clone, Default)]
pub struct McpCredentials {
    /// The operator API token (any workspace).
    pub api_token: Option<ApiToken>,
    /// Per-workspace tokens: (workspace id, token).
    pub workspace_tokens: Vec<(String, ApiToken)>,
}

/// Request extension: the connection may only use this workspace.
#[derive(Debug, Clone)]
pub(crate) struct ScopedWorkspace(pub String);

/// What a presented token turned out to be.
enum Caller {
    Operator,
    Workspace(String),
}

impl McpCredentials {
    fn identify(&self, presented: &str) -> Option<Caller> {
        if self
            .api_token
            .as_ref()
            .is_some_and(|t| t.matches(presented))
        {
            return Some(Caller::Operator);
        }
        self.workspace_tokens
            .iter()
            .find(|(_, t)| t.matches(presented))
            .map(|(ws, _)| Caller::Workspace(ws.clone()))
    }
}

/// The header naming the MCP session a request belongs to (rmcp's
/// `Mcp-Session-Id`; header names are case-insensitive).
const SESSION_HEADER: &str = "mcp-session-id";

/// The middleware in front of rmcp's service: who is calling, and whether
/// the MCP session the request names is theirs (`session_owners.rs`).
pub(crate) async fn authenticate(
    State(shared): State<Arc<server::Shared>>,
    mut req: Request,
    next: Next,
) -> Response {
    let method = req.method().clone();
    if let Err(why) = origin_allowed(&req, &shared.deps.hosts()) {
        tracing::warn!("MCP request refused: {why}");
        return (StatusCode::FORBIDDEN, why).into_response();
    }
    let query: HashMap<String, String> = Query::try_from_uri(req.uri())
        .map(|Query(q)| q)
        .unwrap_or_default();
    if query.contains_key("session_id") {
        return unauthorized(
            "tokens are not accepted in the URL (?session_id=); send Authorization: Bearer <token>",
        );
    }
    let Some(presented) = bearer(&req) else {
        return unauthorized(
            "missing Authorization: Bearer <token> (the API token, a workspace MCP token or the session's bridge token)",
        );
    };
    let owner = match owner_of(&shared, presented, &query).await {
        Ok(owner) => owner,
        Err(refusal) => return refusal,
    };
    match &owner {
        Owner::Operator => {}
        Owner::Workspace(ws) => {
            req.extensions_mut().insert(ScopedWorkspace(ws.clone()));
        }
        Owner::Bridge(id) => {
            req.extensions_mut().insert(BridgedSession(id.clone()));
        }
    }
    let named = session_named(&req);
    if let Some(id) = &named
        && let Err(why) = shared.owners.check(id, &owner)
    {
        return session_not_found(&why);
    }
    // A request without a session may open one: it holds a place among
    // its credential's sessions from now until answered.
    let reservation = if named.is_none() && method == Method::POST {
        let Some(r) = reserve_making_room(&shared, &owner).await else {
            let why = format!(
                "{owner} already holds {PER_OWNER} open MCP sessions, each busy or used within {} s; close one (DELETE /mcp with its Mcp-Session-Id), then initialize again",
                REPLACEABLE_AFTER.as_secs()
            );
            tracing::warn!("MCP session refused: {why}");
            return (StatusCode::TOO_MANY_REQUESTS, why).into_response();
        };
        Some(r)
    } else {
        None
    };
    // The session is busy until this request's answer has been sent (a
    // blocking call's stream, a listening stream): not idle, not replaced.
    let busy = named.as_deref().map(|id| shared.owners.busy(id));
    let res = next.run(req).await;
    let res = match busy {
        Some(busy) => res.map(|body| {
            Body::new(Holding {
                inner: body,
                _busy: busy,
            })
        }),
        None => res,
    };
    if named.is_none() {
        match (new_session_id(&res), reservation) {
            (Some(id), Some(r)) => r.claim(&id),
            (Some(id), None) => shared.owners.claim(&id, owner),
            (None, _) => {}
        }
    }
    session_deleted_is_no_content(res, &method)
}

/// Who `presented` is, or the answer refusing them.
async fn owner_of(
    shared: &server::Shared,
    presented: String,
    query: &HashMap<String, String>,
) -> Result<Owner, Response> {
    match shared.deps.credentials.identify(&presented) {
        Some(Caller::Operator) => Ok(Owner::Operator),
        Some(Caller::Workspace(ws)) => {
            if let Some(asked) = query.get("workspace_id").filter(|w| **w != ws) {
                return Err((
                    StatusCode::FORBIDDEN,
                    format!("this token is for workspace `{ws}`, not `{asked}`"),
                )
                    .into_response());
            }
            ensure_configured(shared, &ws).await?;
            Ok(Owner::Workspace(ws))
        }
        None => {
            let resolved = ask(
                &shared.deps.supervisor,
                "supervisor (resolve bridge token)",
                ACTOR_TIMEOUT,
                |reply| SupervisorMsg::ResolveBridgeToken {
                    token: presented,
                    reply,
                },
            )
            .await;
            match resolved {
                Ok(Some(id)) => Ok(Owner::Bridge(id)),
                Ok(None) => {
                    crate::http::auth::wrong_token("/mcp");
                    Err(unauthorized("unknown or expired token"))
                }
                Err(e) => {
                    tracing::error!("bridge token check failed: {e}");
                    Err((StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response())
                }
            }
        }
    }
}

/// A workspace token is only as good as its workspace: tokens are read once
/// at startup, but a config reload can remove the workspace. Its client
/// must not carry on as a session without a workspace.
async fn ensure_configured(shared: &server::Shared, ws: &str) -> Result<(), Response> {
    match shared.workspace_map().await {
        Ok(map) if map.workspaces.iter().any(|w| w.id == ws) => Ok(()),
        Ok(_) => {
            let why = WorkspaceGone(ws.to_owned()).to_string();
            tracing::warn!("MCP request refused: {why}");
            Err((StatusCode::FORBIDDEN, why).into_response())
        }
        Err(e) => {
            tracing::error!("workspace check of an MCP token failed: {e}");
            Err((StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response())
        }
    }
}

/// A workspace token whose workspace a config reload removed.
#[derive(Debug, thiserror::Error)]
#[error(
    "this token is for workspace `{0}`, which is no longer configured; add the workspace back to the config file or use the token of a configured workspace"
)]
pub(crate) struct WorkspaceGone(pub(crate) String);

/// The MCP session a request names, if any.
fn session_named(req: &Request) -> Option<String> {
    req.headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A place for one more MCP session of `owner`: at once when it holds fewer
/// than [`PER_OWNER`], else after closing its session idle longest (nothing
/// under way for [`REPLACEABLE_AFTER`]): an IDE that reloads without
/// `DELETE` leaves sessions behind that would otherwise lock it out until
/// they expire.
async fn reserve_making_room(shared: &server::Shared, owner: &Owner) -> Option<Reservation> {
    if let Some(r) = shared.owners.reserve(owner) {
        return Some(r);
    }
    let idle = shared.owners.idlest(owner, REPLACEABLE_AFTER)?;
    let sessions = shared.sessions.get()?;
    tracing::info!(
        "{owner} holds {PER_OWNER} MCP sessions: closing its session idle longest to open a new one"
    );
    if let Err(e) = rmcp::transport::streamable_http_server::session::SessionManager::close_session(
        sessions.as_ref(),
        &idle.into(),
    )
    .await
    {
        tracing::warn!("closing an idle MCP session failed: {e}");
    }
    shared.owners.reserve(owner)
}

/// A response body that keeps its session [`Busy`] until it ends or is
/// dropped.
struct Holding {
    inner: Body,
    _busy: Busy,
}

impl http_body::Body for Holding {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<axum::body::Bytes>, axum::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The new session id an `initialize` answer carries, if any.
fn new_session_id(res: &Response) -> Option<String> {
    res.headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A session the caller did not open is, to them, a session that does not
/// exist: the MCP spec's answer for an unknown session id (rmcp's words).
fn session_not_found(why: &NotYours) -> Response {
    match why {
        NotYours::Unknown => tracing::info!("MCP request refused: {why}"),
        NotYours::Other { .. } => tracing::warn!("MCP request refused: {why}"),
    }
    (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response()
}

fn bearer(req: &Request) -> Option<String> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_owned())
}

/// A browser's `Origin` must be one of ours; non-browser clients send none.
fn origin_allowed(req: &Request, hosts: &[String]) -> Result<(), String> {
    let Some(origin) = req.headers().get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    let host = origin
        .split_once("://")
        .map(|(_, rest)| rest.trim_end_matches('/'))
        .unwrap_or("");
    if host.is_empty() {
        return Err(format!("Origin {origin:?} is not allowed"));
    }
    let bare = strip_port(host);
    let ok = hosts.iter().any(|h| {
        let h = h.trim_matches(|c| c == '[' || c == ']');
        h == host || h == bare
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "Origin {origin} is not allowed (loopback or [mcp] allowed_hosts only)"
        ))
    }
}

/// `host:port` -> `host`; `[::1]:3000` -> `::1`.
fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    }
}

fn unauthorized(why: &'static str) -> Response {
    tracing::warn!("MCP request refused: {why}");
    // No WWW-Authenticate: this is not OAuth, and MCP clients that see one
    // start an authorization-server discovery that cannot succeed.
    (StatusCode::UNAUTHORIZED, why).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::session_owners::SessionOwners;

    /// An `initialize` answer carrying a new session id: `owner` opened it.
    fn claim_new_session(owners: &SessionOwners, res: &Response, owner: Owner) {
        if let Some(id) = new_session_id(res) {
            owners.claim(&id, owner);
        }
    }
    use axum::body::Body;

    fn req(origin: Option<&str>, auth: Option<&str>) -> Request {
        let mut b = Request::builder().uri("/mcp");
        if let Some(o) = origin {
            b = b.header(header::ORIGIN, o);
        }
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        b.body(Body::empty()).expect("request")
    }

    #[test]
    fn only_loopback_or_configured_origins_pass() {
        let hosts = super::super::allowed_hosts(&["intercom.example".into()]);
        for ok in [
            None,
            Some("http://127.0.0.1:3000"),
            Some("http://localhost:3000"),
            Some("http://[::1]:3000"),
            Some("https://intercom.example"),
        ] {
            assert!(origin_allowed(&req(ok, None), &hosts).is_ok(), "{ok:?}");
        }
        for bad in [
            "https://evil.example",
            "http://127.0.0.1.evil.example",
            "null",
            "http://localhost.evil:3000",
        ] {
            assert!(
                origin_allowed(&req(Some(bad), None), &hosts).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn tokens_are_told_apart() {
        let creds = McpCredentials {
            api_token: Some(ApiToken::new("operator-token")),
            workspace_tokens: vec![("demo".into(), ApiToken::new("demo-token"))],
        };
        assert!(matches!(
            creds.identify("operator-token"),
            Some(Caller::Operator)
        ));
        assert!(matches!(creds.identify("demo-token"), Some(Caller::Workspace(w)) if w == "demo"));
        assert!(creds.identify("operator-token ").is_none());
        assert!(creds.identify("").is_none());
        assert!(McpCredentials::default().identify("anything").is_none());
    }

    #[test]
    fn a_new_session_id_is_claimed_and_another_credential_gets_not_found() {
        let owners = SessionOwners::default();
        let mut res = (StatusCode::OK, "").into_response();
        res.headers_mut()
            .insert("Mcp-Session-Id", header::HeaderValue::from_static("m-1"));
        claim_new_session(&owners, &res, Owner::Workspace("a".into()));
        assert!(owners.check("m-1", &Owner::Workspace("a".into())).is_ok());
        let why = owners
            .check("m-1", &Owner::Operator)
            .expect_err("another credential");
        assert_eq!(session_not_found(&why).status(), StatusCode::NOT_FOUND);
        // An answer without the header claims nothing.
        claim_new_session(
            &owners,
            &(StatusCode::OK, "").into_response(),
            Owner::Operator,
        );
        assert!(owners.check("m-1", &Owner::Workspace("a".into())).is_ok());
        let named = Request::builder()
            .uri("/mcp")
            .header("MCP-SESSION-ID", "m-1")
            .body(Body::empty())
            .expect("request");
        assert_eq!(session_named(&named).as_deref(), Some("m-1"));
        assert_eq!(session_named(&req(None, None)), None);
    }

    #[test]
    fn bearer_needs_the_scheme_and_a_token() {
        assert_eq!(
            bearer(&req(None, Some("Bearer abc"))).as_deref(),
            Some("abc")
        );
        assert_eq!(
            bearer(&req(None, Some("bearer abc"))).as_deref(),
            Some("abc")
        );
        assert_eq!(bearer(&req(None, Some("Basic abc"))), None);
        assert_eq!(bearer(&req(None, Some("Bearer "))), None);
        assert_eq!(bearer(&req(None, None)), None);
    }
}
