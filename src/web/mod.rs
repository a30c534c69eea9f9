//! The web console: a browser front end served by the same binary at `/`.
//!
//! Why this exists: many operators cannot install a Slack app, and `ctl`
//! cannot show a diff worth approving. The console is a small vanilla
//! JavaScript page (assets embedded in the binary, no Node toolchain) that
//! acts only through the HTTP API (`/api/...`) and listens to the event
//! stream (`/api/events`); it has no operations of its own.
//!
//! What lives here is what a browser needs on top of the API: logging in
//! (a one-time link printed by `serve`, or the API token in a form) with an
//! `HttpOnly`, `SameSite=Strict` cookie stored in SQLite, CSRF tokens on
//! every state-changing request, `Host`/`Origin` checks against DNS
//! rebinding and cross-site requests, and a strict Content-Security-Policy.
//! Layout: [`login`] (logins, cookies, the `/api` cookie check), [`guard`]
//! (host and origin checks, security headers), [`assets`] (the embedded files).

pub mod assets;
pub mod guard;
pub mod login;

use std::sync::Arc;

use axum::Router;
use axum::middleware;
use axum::routing::{get, post};

use crate::app::App;
use crate::http::auth::ApiToken;
use login::LoginLink;

/// The console's shared state: the app (for its store), the API token
/// (exchanged for a cookie) and the one-time login link of this run.
#[derive(Clone)]
pub struct Console {
    inner: Arc<ConsoleInner>,
}

struct ConsoleInner {
    app: App,
    token: ApiToken,
    link: LoginLink,
}

impl Console {
    /// A console for `app`, with a fresh one-time login link.
    pub fn new(app: App, token: ApiToken) -> Console {
        Console {
            inner: Arc::new(ConsoleInner {
                app,
                token,
                link: LoginLink::new(),
            }),
        }
    }

    /// The path (with its one-time code) that logs a browser in once.
    pub fn login_path(&self) -> String {
        format!("/login?code={}", self.inner.link.code())
    }

    fn app(&self) -> &App {
        &self.inner.app
    }

    fn token(&self) -> &ApiToken {
        &self.inner.token
    }

    fn link(&self) -> &LoginLink {
        &self.inner.link
    }
}

/// The console's routes: `/`, `/login`, `/logout` and `/assets/...`, with
/// the host check and security headers on every answer.
pub fn router(console: Console) -> Router {
    Router::new()
        .route("/", get(assets::index))
        .route("/login", get(login::login_page).post(login::login_form))
        .route("/logout", post(login::logout))
        .route("/assets/{*file}", get(assets::file))
        // No icon: answered empty, not 404 (a browser asks on every load,
        // and a walk-through read the 404 in its log as a broken asset).
        .route(
            "/favicon.ico",
            get(|| async { axum::http::StatusCode::NO_CONTENT }),
        )
        .layer(middleware::from_fn(guard::security_headers))
        .layer(middleware::from_fn(guard::require_local_host))
        .with_state(console)
}

/// The URL printed at start: the login link on a loopback address.
pub fn login_url(bind: std::net::SocketAddr, console: &Console) -> String {
    let host = match bind.ip() {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!(
        "http://{}{}",
        std::net::SocketAddr::new(host, bind.port()),
        console.login_path()
    )
}
