//! Host and Origin checks, and the security headers of console pages.
//!
//! Why this exists: a page on another site must not be able to use the
//! console through the operator's browser. DNS rebinding (a hostile name
//! that resolves to 127.0.0.1) is refused by accepting only IP literals and
//! `localhost` in `Host`; cross-site form posts by requiring a same-origin
//! `Origin` on state-changing requests (besides the CSRF token and the
//! `SameSite=Strict` cookie); script injection by a Content-Security-Policy
//! that allows only the console's own files (no inline script).

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The policy of every console page: own files only, no inline script or
/// style, no framing, forms and fetches to this origin only.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; \
frame-ancestors 'none'; base-uri 'none'";

/// The host name of a `Host` header value, without the port.
pub fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    }
}

/// The port of a `Host` header value, when it names one.
pub fn host_port(host: &str) -> Option<&str> {
    let after_name = match host.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map(|(_, tail)| tail)?,
        None => host,
    };
    let (_, port) = after_name.rsplit_once(':')?;
    (!port.is_empty() && port.chars().all(|c| c.is_ascii_digit())).then_some(port)
}

/// True for hosts a DNS rebinding attack cannot name: IP literals and
/// `localhost`.
pub fn host_is_local(host: &str) -> bool {
    let name = host_name(host.trim());
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// True when the request's `Host` is acceptable.
pub fn request_host_ok(headers: &HeaderMap) -> bool {
    headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .is_some_and(host_is_local)
}

/// True when the request may change state as far as its origin goes: an
/// `Origin` header, when present, must be this very host (`http://` or
/// `https://` + `Host`); `Sec-Fetch-Site`, when present, must not be
/// `cross-site` or `same-site`.
pub fn origin_ok(headers: &HeaderMap) -> bool {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let origin_fine = match headers.get(header::ORIGIN).map(|o| o.to_str()) {
        None => true,
        Some(Ok(origin)) => {
            origin == format!("http://{host}") || origin == format!("https://{host}")
        }
        Some(Err(_)) => false,
    };
    let site_fine = !matches!(
        headers.get("sec-fetch-site").and_then(|s| s.to_str().ok()),
        Some("cross-site" | "same-site")
    );
    origin_fine && site_fine
}

/// True for methods that change state.
pub fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Middleware: console routes answer only to local hosts.
pub async fn require_local_host(request: Request, next: Next) -> Response {
    if !request_host_ok(request.headers()) {
        return refused(
            "this console answers only at an IP address or localhost (DNS rebinding guard)",
        );
    }
    if changes_state(request.method()) && !origin_ok(request.headers()) {
        return refused("cross-origin request refused");
    }
    next.run(request).await
}

/// A plain-text 403.
pub fn refused(why: &'static str) -> Response {
    (StatusCode::FORBIDDEN, why).into_response()
}

/// Middleware: the security headers of every console answer.
pub async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let set = [
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        // `same-origin`, not `no-referrer`: the one-time code in the login
        // page's URL still never leaves for another site, but Chromium
        // sends `Origin: null` for a form posted under `no-referrer`, and
        // the cross-origin guard then refused every login with the token.
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        ),
    ];
    for (name, value) in set {
        headers.insert(name, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ip_literals_and_localhost_are_local() {
        for ok in [
            "127.0.0.1:3000",
            "localhost:3000",
            "LOCALHOST",
            "[::1]:3000",
            "192.168.1.20:3000",
            "127.0.0.1",
        ] {
            assert!(host_is_local(ok), "{ok}");
        }
        for bad in [
            "evil.example:3000",
            "127.0.0.1.nip.io",
            "localhost.evil.com:3000",
            "",
        ] {
            assert!(!host_is_local(bad), "{bad}");
        }
    }

    #[test]
    fn origin_must_be_this_host() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().expect("value"));
            }
            h
        };
        assert!(origin_ok(&headers(&[("host", "127.0.0.1:3000")])));
        assert!(origin_ok(&headers(&[
            ("host", "127.0.0.1:3000"),
            ("origin", "http://127.0.0.1:3000")
        ])));
        assert!(!origin_ok(&headers(&[
            ("host", "127.0.0.1:3000"),
            ("origin", "http://evil.example")
        ])));
        assert!(!origin_ok(&headers(&[
            ("host", "127.0.0.1:3000"),
            ("origin", "null")
        ])));
        assert!(!origin_ok(&headers(&[
            ("host", "127.0.0.1:3000"),
            ("sec-fetch-site", "cross-site")
        ])));
    }
}
