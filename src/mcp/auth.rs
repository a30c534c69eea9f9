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
//! Tokens in the URL (`?session_id=`) are refused: URLs end up in logs and
//! browser histories. A request whose `Origin` is not a loopback origin (or a
//! configured `allowed_hosts` entry) is refused, so a web page in the
//! operator's browser cannot drive the endpoint even if it learned a token.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use intercom_actors::supervisor::SupervisorMsg;

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

/// The middleware in front of rmcp's service.
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
    match shared.deps.credentials.identify(&presented) {
        Some(Caller::Operator) => {}
        Some(Caller::Workspace(ws)) => {
            if let Some(asked) = query.get("workspace_id").filter(|w| **w != ws) {
                return (
                    StatusCode::FORBIDDEN,
                    format!("this token is for workspace `{ws}`, not `{asked}`"),
                )
                    .into_response();
            }
            req.extensions_mut().insert(ScopedWorkspace(ws));
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
                Ok(Some(id)) => {
                    req.extensions_mut().insert(BridgedSession(id));
                }
                Ok(None) => return unauthorized("unknown or expired token"),
                Err(e) => {
                    tracing::error!("bridge token check failed: {e}");
                    return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response();
                }
            }
        }
    }
    session_deleted_is_no_content(next.run(req).await, &method)
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
