//! The operator HTTP API (axum): `/healthz` and the token-protected `/api`.
//!
//! [`router`] builds the routes over an [`App`]; [`serve_on`] runs them on a
//! bound listener until a shutdown future resolves (tests bind
//! `127.0.0.1:0` and call it directly); [`server`] is the `serve` command
//! around both. The routes are documented in `docs/api.md`.

pub mod auth;
pub mod body;
pub mod control;
pub mod error;
pub mod events;
pub mod listener;
pub mod paging;
pub mod routes;
pub mod rules;
pub mod server;
pub mod steering;
pub mod transcript;
pub mod views;
pub mod workspaces;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use tokio::net::TcpListener;

use crate::app::App;
use crate::web::Console;
use auth::ApiToken;

/// The whole HTTP surface, with a web console whose one-time login link
/// nobody was shown (tests; `serve` uses [`router_with_console`]).
pub fn router(app: App, token: ApiToken) -> Router {
    let console = Console::new(app.clone(), token.clone());
    router_with_console(app, token, console)
}

/// The whole HTTP surface: `/healthz`, `/api` (bearer token, or the
/// console's cookie with its CSRF token) and the web console at `/`.
pub fn router_with_console(app: App, token: ApiToken, console: Console) -> Router {
    let token = Arc::new(token);
    let health_token = token.clone();
    let api = Router::new()
        .route(
            "/sessions",
            get(routes::list_sessions).post(routes::create_session),
        )
        .route("/sessions/{id}", get(routes::get_session))
        .route("/workspaces", get(workspaces::list_workspaces))
        .route("/agents", get(workspaces::list_agents))
        .route("/sessions/{id}/messages", get(transcript::messages))
        .route("/sessions/{id}/prompt", post(routes::prompt))
        .route("/sessions/{id}/cancel", post(routes::cancel))
        .route("/sessions/{id}/restart", post(routes::restart))
        .route("/sessions/{id}/revive", post(routes::revive))
        .route("/sessions/{id}/mode", post(rules::set_mode))
        .route("/sessions/{id}/agent-mode", post(rules::set_agent_option))
        .route("/sessions/{id}/pause", post(control::pause))
        .route("/sessions/{id}/resume", post(control::resume))
        .route("/sessions/{id}/nudge", post(control::nudge))
        .route("/sessions/{id}/steering", get(steering::list))
        .route("/events", get(events::events))
        .route("/audit", get(control::audit))
        .route("/rules", get(rules::list).post(rules::create))
        .route("/rules/{id}", axum::routing::delete(rules::delete))
        .route("/approvals", get(routes::list_approvals))
        .route(
            "/approvals/{id}",
            get(routes::get_approval).post(routes::decide),
        )
        .route("/approvals/{id}/remember", post(rules::remember))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(middleware::from_fn(body::read_whole_body))
        .layer(middleware::from_fn_with_state(token, auth::require_token))
        .layer(middleware::from_fn_with_state(
            console.clone(),
            crate::web::login::api_cookie_auth,
        ))
        .layer(middleware::map_response(api_headers));
    Router::new()
        .route(
            "/healthz",
            get(move |State(app): State<App>, headers: HeaderMap| {
                routes::healthz(app, health_token.clone(), headers)
            }),
        )
        .nest("/api", api)
        .with_state(app)
        .merge(crate::web::router(console))
        .layer(middleware::from_fn(log_request))
}

/// Serves `router` on `listener` until `shutdown` resolves, then stops
/// accepting and lets in-flight requests finish.
///
/// The router is finished once here and shared by every connection (a clone
/// is a reference count). Served as a plain `Router`, axum rebuilds its route
/// tables for each connection, about 12 KiB per open keep-alive connection.
pub async fn serve_on<F>(listener: TcpListener, router: Router, shutdown: F) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let bounded = listener::BoundedListener::new(listener, listener::limit());
    // Every route's body arrives in time (the listener never sheds a
    // connection whose request head is complete).
    let router = router.layer(middleware::from_fn(body::body_deadline));
    axum::serve(bounded, router.with_state(()).into_make_service())
        .with_graceful_shutdown(shutdown)
        .await
}

/// Every `/api` answer carries agent text: never sniffed into another
/// type, never kept in a cache (the console's pages were; its API was not).
/// An answer that chose its own caching (the event stream) keeps it.
async fn api_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        axum::http::header::X_CONTENT_TYPE_OPTIONS,
        axum::http::HeaderValue::from_static("nosniff"),
    );
    headers
        .entry(axum::http::header::CACHE_CONTROL)
        .or_insert(axum::http::HeaderValue::from_static("no-store"));
    response
}

/// Logs each request at debug level (method, path, status, duration). The
/// query string and headers are never logged: they may carry secrets.
async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    tracing::debug!(
        %method,
        path,
        status = response.status().as_u16(),
        ms = started.elapsed().as_millis() as u64,
        "request"
    );
    response
}
