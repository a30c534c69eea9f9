//! The console's files, embedded in the binary at build time.
//!
//! Why this exists: the console must run from the one binary with no Node
//! toolchain and no files beside it. The page, its script and style are
//! ours (`src/web/assets/`); diff2html is vendored, pinned, with its licence
//! (`src/web/assets/vendor/diff2html/`).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};

use super::Console;
use super::login;

/// The console page; `{{csrf}}` is replaced per login.
pub const INDEX_HTML: &str = include_str!("assets/index.html");
/// The login page; `{{message}}` is replaced (escaped).
pub const LOGIN_HTML: &str = include_str!("assets/login.html");

/// The vendored diff2html version.
pub const DIFF2HTML_VERSION: &str = "3.4.56";

/// (path under `/assets/`, content type, bytes).
const FILES: &[(&str, &str, &[u8])] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("assets/app.css"),
    ),
    (
        "vendor/diff2html/diff2html.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/vendor/diff2html/diff2html.min.js"),
    ),
    (
        "vendor/diff2html/diff2html.min.css",
        "text/css; charset=utf-8",
        include_bytes!("assets/vendor/diff2html/diff2html.min.css"),
    ),
    (
        "vendor/diff2html/LICENSE.md",
        "text/plain; charset=utf-8",
        include_bytes!("assets/vendor/diff2html/LICENSE.md"),
    ),
];

/// `GET /`: the console for a logged-in browser, else the login page.
pub async fn index(State(console): State<Console>, headers: HeaderMap) -> Response {
    // The page holds no secret: its key came with the login (see `login`),
    // so a cookie alone fetching `/` learns nothing it can use.
    if login::login_csrf(&console, &headers).await.is_none() {
        return Redirect::to("/login").into_response();
    }
    let mut response = Html(INDEX_HTML).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `GET /assets/{file}`.
pub async fn file(Path(path): Path<String>) -> Response {
    match FILES.iter().find(|(p, _, _)| *p == path) {
        Some((_, content_type, bytes)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *bytes,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}
