//! Console logins: the one-time link, the token form, the session cookie,
//! the login's key, and the cookie check in front of `/api`.
//!
//! Why this exists: a browser cannot keep a bearer token safely. A login
//! exchanges the one-time code printed by `serve` (or the API token typed
//! into the form, sent in a POST body, never in a URL) for two secrets,
//! stored in SQLite (the cookie as a SHA-256) so a login survives a server
//! restart and a logout ends it:
//! - a random cookie (`HttpOnly`, `SameSite=Strict`);
//! - the login's key, handed over once, in the fragment of the redirect
//!   after the login (`/#key=...`: never sent to a server, never in a
//!   `Referer`), which the page keeps in `localStorage` and sends as
//!   `X-CSRF-Token` with every `/api` call.
//!
//! Why the cookie alone is not enough: browsers send a cookie to every port
//! of its host, so any process listening on another loopback port (another
//! user's server, a dev server an agent wrote) gets it as soon as the
//! operator's browser loads anything from there. `localStorage` is kept per
//! origin, port included, and the key is never in a page a cookie can fetch.
//! Requests under `/api` carrying the cookie are checked here (host, origin
//! on state-changing methods, the key on every method) and then handed to
//! the API as if they carried the bearer token: the console has no
//! operations of its own.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Form;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use intercom_actors::model::now_ms;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::Console;
use super::guard;
use crate::app::AppError;
use crate::http::auth::ct_eq;
use crate::http::error::ApiError;

/// The session cookie's name, before the port: browsers keep cookies per
/// host, not per port, so each server's cookie carries the port it is
/// reached at ([`cookie_name`]) and two servers on one host keep theirs.
pub const COOKIE_PREFIX: &str = "intercom_console";
/// The header carrying the login's key (its CSRF token, needed on every
/// `/api` call made with the cookie).
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a login lasts.
const LOGIN_TTL_MS: i64 = 12 * 60 * 60 * 1000;
/// How long the printed login link can be used (once).
const LINK_TTL_MS: i64 = 24 * 60 * 60 * 1000;

/// The one-time login link of this server run.
#[derive(Debug)]
pub struct LoginLink {
    code: String,
    used: AtomicBool,
    expires_at: i64,
}

impl LoginLink {
    /// A fresh random code, valid once within 24 hours.
    pub fn new() -> Self {
        LoginLink {
            code: random_hex(),
            used: AtomicBool::new(false),
            expires_at: now_ms() + LINK_TTL_MS,
        }
    }

    /// The code (for the printed link).
    pub fn code(&self) -> &str {
        &self.code
    }

    /// True the first time the right code is presented in time.
    fn redeem(&self, presented: &str) -> bool {
        ct_eq(self.code.as_bytes(), presented.as_bytes())
            && now_ms() < self.expires_at
            && !self.used.swap(true, Ordering::SeqCst)
    }
}

impl Default for LoginLink {
    fn default() -> Self {
        Self::new()
    }
}

/// 32 random bytes from the OS as hex (the process RNG when unavailable).
pub fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)) {
        Ok(()) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
        Err(_) => format!(
            "{}{}",
            intercom_actors::ids::random_token(),
            intercom_actors::ids::random_token()
        ),
    }
}

fn hash(cookie: &str) -> String {
    Sha256::digest(cookie.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The session cookie's name for a request: [`COOKIE_PREFIX`] and the
/// port of its `Host` (`intercom_console_3000`); the bare prefix when the
/// `Host` names no port.
pub fn cookie_name(headers: &HeaderMap) -> String {
    let port = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| guard::host_port(h.trim()));
    match port {
        Some(port) => format!("{COOKIE_PREFIX}_{port}"),
        None => COOKIE_PREFIX.to_owned(),
    }
}

/// Every value sent under the console's cookie name, in the order the
/// browser sent them.
fn cookie_values(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    let wanted = cookie_name(headers);
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(move |(name, _)| *name == wanted)
        .map(|(_, value)| value.trim())
}

/// Most cookies of the console's name looked up per request.
const COOKIES_TRIED: usize = 4;

/// The request's live login and its CSRF token. Every cookie of the
/// console's name is tried, a few at most: a page on another port of this
/// host can set one under a longer path, which the browser then sends
/// first (a probe's `Path=/api` cookie locked the operator out, and logging
/// in again did not help).
pub async fn live_login(
    console: &Console,
    headers: &HeaderMap,
) -> Option<(ConsoleLoginRef, String)> {
    for cookie in cookie_values(headers).take(COOKIES_TRIED) {
        let login = ConsoleLoginRef::of(cookie);
        if let Some(csrf) = login.csrf(console.app().store()).await {
            return Some((login, csrf));
        }
    }
    None
}

/// The CSRF token of the request's login, when it has a live one.
pub async fn login_csrf(console: &Console, headers: &HeaderMap) -> Option<String> {
    live_login(console, headers).await.map(|(_, csrf)| csrf)
}

/// Creates a login and answers with its cookie and a redirect to `/` whose
/// fragment carries the login's key (for the page alone: a fragment is
/// neither sent to a server nor put in a `Referer`).
async fn start_login(console: &Console, headers: &HeaderMap) -> Response {
    let cookie = random_hex();
    let csrf = random_hex();
    let stored = console
        .app()
        .store()
        .insert_console_login(&hash(&cookie), &csrf, now_ms() + LOGIN_TTL_MS)
        .await;
    if let Err(e) = stored {
        tracing::error!("cannot store a console login: {e}");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "storage unavailable; try again",
        )
            .into_response();
    }
    tracing::info!("console login");
    let set = format!(
        "{}={cookie}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        cookie_name(headers),
        LOGIN_TTL_MS / 1000
    );
    let mut response = Redirect::to(&format!("/#key={csrf}")).into_response();
    if let Ok(value) = HeaderValue::from_str(&set) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// Which console login a request to `/api` came with (the SHA-256 of its
/// cookie): a long-lived answer (the event stream) ends when that login
/// does.
#[derive(Debug, Clone)]
pub struct ConsoleLoginRef(String);

impl ConsoleLoginRef {
    /// The login a cookie's value stands for.
    fn of(cookie: &str) -> ConsoleLoginRef {
        ConsoleLoginRef(hash(cookie))
    }

    /// The login's CSRF token (its key), while it is live.
    async fn csrf(&self, store: &crate::storage::SqliteStore) -> Option<String> {
        match store.console_login(&self.0).await {
            Ok(login) => login.map(|l| l.csrf),
            Err(e) => {
                tracing::warn!("cannot read console logins: {e}");
                None
            }
        }
    }

    /// True while the login is live (not logged out, not expired); true
    /// too when the store cannot say (a passing read error ends nothing).
    pub async fn is_live(&self, store: &crate::storage::SqliteStore) -> bool {
        !matches!(store.console_login(&self.0).await, Ok(None))
    }
}

/// `GET /login[?code=...]` query.
#[derive(Debug, Deserialize)]
pub struct LinkQuery {
    code: Option<String>,
}

/// `GET /login`: redeems a one-time code, else shows the token form.
pub async fn login_page(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(q): Query<LinkQuery>,
) -> Response {
    match q.code {
        Some(code) if console.link().redeem(&code) => start_login(&console, &headers).await,
        Some(_) => form_page(
            StatusCode::UNAUTHORIZED,
            "This login link was already used or is wrong. Log in with the API token \
             (data/api-token), or restart the server for a new link.",
        ),
        None => form_page(StatusCode::OK, ""),
    }
}

/// `POST /login` form.
#[derive(Debug, Deserialize)]
pub struct TokenForm {
    token: String,
}

/// `POST /login`: the API token from the form, for a cookie.
pub async fn login_form(
    State(console): State<Console>,
    headers: HeaderMap,
    form: Result<Form<TokenForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let form = match form {
        Ok(Form(form)) => form,
        // The body did not come within its deadline (`body::LOGIN_BODY_DEADLINE`).
        Err(e) if crate::http::body::too_slow(&e) => {
            return form_page(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "The form did not arrive within {} s; send it again.",
                    crate::http::body::LOGIN_BODY_DEADLINE.as_secs()
                ),
            );
        }
        Err(_) => {
            return form_page(
                StatusCode::BAD_REQUEST,
                "The form could not be read; paste the API token and send it again.",
            );
        }
    };
    if console.token().matches(form.token.trim()) {
        start_login(&console, &headers).await
    } else {
        crate::http::auth::wrong_token("the console's login form");
        form_page(StatusCode::UNAUTHORIZED, "Wrong API token.")
    }
}

/// `POST /logout` (needs the CSRF header): ends the login.
pub async fn logout(State(console): State<Console>, headers: HeaderMap) -> Response {
    let Some((login, csrf)) = live_login(&console, &headers).await else {
        return Redirect::to("/login").into_response();
    };
    if !csrf_matches(&headers, &csrf) {
        return guard::refused("missing or wrong CSRF token");
    }
    if let Err(e) = console.app().store().delete_console_login(&login.0).await {
        tracing::error!("cannot end a console login: {e}");
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    let clear = format!(
        "{}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0",
        cookie_name(&headers)
    );
    if let Ok(value) = HeaderValue::from_str(&clear) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

fn csrf_matches(headers: &HeaderMap, csrf: &str) -> bool {
    headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|presented| ct_eq(presented.as_bytes(), csrf.as_bytes()))
}

fn form_page(status: StatusCode, message: &str) -> Response {
    let page = super::assets::LOGIN_HTML.replace("{{message}}", &escape(message));
    (status, Html(page)).into_response()
}

/// Escapes text for HTML (the login page's server-side message).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Middleware in front of `/api`: a request with the console cookie (and
/// no bearer token) is checked (host, origin on state-changing methods, the
/// login's key on every method) and then carries the API token inward. Anything else passes
/// unchanged to the bearer check.
pub async fn api_cookie_auth(
    State(console): State<Console>,
    mut request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    if headers.contains_key(header::AUTHORIZATION) {
        return next.run(request).await;
    }
    let Some((login, csrf)) = live_login(&console, headers).await else {
        return next.run(request).await;
    };
    if !guard::request_host_ok(headers) {
        return forbidden("the console answers only at an IP address or localhost");
    }
    if guard::changes_state(request.method()) && !guard::origin_ok(headers) {
        return forbidden("cross-origin request refused");
    }
    // On every method, reads too: the cookie reaches any port of this host,
    // the key only the console's own page.
    if !csrf_matches(headers, &csrf) {
        return ApiError::Unauthorized(
            "the console cookie needs the login's key in X-CSRF-Token (the page keeps it from \
             the login): reload the console, or log in again"
                .into(),
        )
        .into_response();
    }
    let bearer = format!("Bearer {}", console.token().expose());
    match HeaderValue::from_str(&bearer) {
        Ok(mut value) => {
            value.set_sensitive(true);
            request.headers_mut().insert(header::AUTHORIZATION, value);
            request.extensions_mut().insert(login);
            next.run(request).await
        }
        Err(_) => forbidden("the API token cannot be sent as a header"),
    }
}

fn forbidden(why: &str) -> Response {
    ApiError::App(AppError::Forbidden(why.to_owned())).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_works_once() {
        let link = LoginLink::new();
        assert_eq!(link.code().len(), 64);
        assert!(!link.redeem("wrong"));
        let code = link.code().to_owned();
        assert!(link.redeem(&code));
        assert!(!link.redeem(&code), "a second use is refused");
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:3000"));
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; intercom_console_3000=abc ; b=2"),
        );
        assert_eq!(cookie_values(&h).next(), Some("abc"));
        assert_eq!(cookie_values(&HeaderMap::new()).next(), None);
    }

    #[test]
    fn each_port_has_its_own_cookie() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("localhost:3001"));
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("intercom_console_3000=other; intercom_console_3001=mine"),
        );
        assert_eq!(cookie_name(&h), "intercom_console_3001");
        assert_eq!(cookie_values(&h).next(), Some("mine"));
        h.insert(header::HOST, HeaderValue::from_static("[::1]:3000"));
        assert_eq!(cookie_values(&h).next(), Some("other"));
        h.insert(header::HOST, HeaderValue::from_static("localhost:3002"));
        assert_eq!(
            cookie_values(&h).next(),
            None,
            "another server's cookie is not ours"
        );
        h.insert(header::HOST, HeaderValue::from_static("[::1]"));
        assert_eq!(cookie_name(&h), "intercom_console");
    }

    #[test]
    fn escaping_covers_markup() {
        assert_eq!(
            escape("<script>\"x\"&'y'</script>"),
            "&lt;script&gt;&quot;x&quot;&amp;&#39;y&#39;&lt;/script&gt;"
        );
    }
}
