//! The web console's security end to end, without a browser: the login
//! link works once, the cookie is HttpOnly and SameSite=Strict, the page
//! carries a strict CSP and no secret, `/api` accepts the cookie only with
//! the login's key (handed over once, in the login redirect's fragment) on
//! every method, and hostile `Host` / `Origin` headers are refused. (`tests/browser/` drives the same console in Chromium.)

mod common;

use std::time::Duration;

use agent_intercom::config::Config;
use common::api_server::in_process;
use common::{Layout, Setup, TOKEN};
use serde_json::json;

/// The in-process server with its console, on a layout of its own (stopped
/// before the layout's directory goes: fields drop in order).
struct Server {
    _running: in_process::Running,
    base: String,
    login_path: String,
    _layout: Layout,
}

impl Server {
    fn start() -> Server {
        let layout = Layout::new(&Setup::default());
        let config = Config::load(&layout.config).expect("config loads");
        let (running, started) = in_process::Running::start(config, TOKEN);
        Server {
            _running: running,
            base: format!("http://{}", started.addr),
            login_path: started.login_path,
            _layout: layout,
        }
    }
}

/// One answer: status, headers we look at, body.
struct Answer {
    status: u16,
    location: Option<String>,
    set_cookie: Option<String>,
    csp: Option<String>,
    content_type: Option<String>,
    nosniff: Option<String>,
    cache: Option<String>,
    body: String,
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

fn answer(result: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
    let mut r = result.expect("HTTP call");
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (location, set_cookie, csp, content_type) = (
        header("location"),
        header("set-cookie"),
        header("content-security-policy"),
        header("content-type"),
    );
    let (nosniff, cache) = (header("x-content-type-options"), header("cache-control"));
    Answer {
        status: r.status().as_u16(),
        location,
        set_cookie,
        csp,
        content_type,
        nosniff,
        cache,
        body: r.body_mut().read_to_string().unwrap_or_default(),
    }
}

/// `GET` with optional cookie and extra headers.
fn get(base: &str, path: &str, cookie: Option<&str>, extra: &[(&str, &str)]) -> Answer {
    let mut req = agent().get(format!("{base}{path}"));
    if let Some(c) = cookie {
        req = req.header("Cookie", c);
    }
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    answer(req.call())
}

/// `POST` JSON with optional cookie and extra headers.
fn post(
    base: &str,
    path: &str,
    cookie: Option<&str>,
    extra: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut req = agent()
        .post(format!("{base}{path}"))
        .header("Content-Type", "application/json");
    if let Some(c) = cookie {
        req = req.header("Cookie", c);
    }
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    answer(req.send(body))
}

/// Logs in with the one-time link; returns the `name=value` cookie.
fn log_in(server: &Server) -> String {
    log_in_with_key(server).0
}

/// Logs in with the one-time link; returns the `name=value` cookie and the
/// login's key (from the redirect's fragment, where the page reads it).
fn log_in_with_key(server: &Server) -> (String, String) {
    let r = get(&server.base, &server.login_path, None, &[]);
    assert_eq!(r.status, 303);
    let location = r.location.expect("a redirect");
    let key = location
        .strip_prefix("/#key=")
        .unwrap_or_else(|| panic!("the key in the fragment: {location}"))
        .to_owned();
    assert_eq!(key.len(), 64);
    let set = r.set_cookie.expect("a cookie");
    assert!(set.contains("HttpOnly"), "{set}");
    assert!(set.contains("SameSite=Strict"), "{set}");
    (set.split(';').next().expect("name=value").to_owned(), key)
}

fn cookie_name(pair: &str) -> &str {
    pair.split('=').next().expect("name")
}

fn port_of(base: &str) -> &str {
    base.rsplit(':').next().expect("port")
}

#[test]
fn two_servers_on_one_host_keep_their_own_cookies() {
    let (a, b) = (Server::start(), Server::start());
    let ((ca, ka), (cb, kb)) = (log_in_with_key(&a), log_in_with_key(&b));
    assert_eq!(
        cookie_name(&ca),
        format!("intercom_console_{}", port_of(&a.base))
    );
    assert_ne!(cookie_name(&ca), cookie_name(&cb));
    // A browser sends both to either server (cookies are per host, not per
    // port): each finds its own.
    let both = format!("{ca}; {cb}");
    let (ka, kb) = (
        [("X-CSRF-Token", ka.as_str())],
        [("X-CSRF-Token", kb.as_str())],
    );
    assert_eq!(get(&a.base, "/api/sessions", Some(&both), &ka).status, 200);
    assert_eq!(get(&b.base, "/api/sessions", Some(&both), &kb).status, 200);
    assert_eq!(get(&b.base, "/api/sessions", Some(&ca), &ka).status, 401);
    assert_eq!(
        get(&b.base, "/api/sessions", Some(&both), &ka).status,
        401,
        "one server's key does not open the other"
    );
}

/// A page on another port of this host can set a cookie of the console's
/// name under a longer path, which the browser then sends first: the
/// console tried only the first one, and the operator was locked out (a
/// fresh login too). Every cookie of its name is tried now; the tossed one
/// opens nothing on its own.
#[test]
fn a_cookie_tossed_under_a_longer_path_does_not_lock_the_operator_out() {
    let server = Server::start();
    let (cookie, key) = log_in_with_key(&server);
    let tossed = format!("{}=x", cookie_name(&cookie));
    let both = format!("{tossed}; {cookie}");
    let k = [("X-CSRF-Token", key.as_str())];
    let r = get(&server.base, "/api/sessions", Some(&both), &k);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(get(&server.base, "/", Some(&both), &[]).status, 200);
    let alone = get(&server.base, "/api/sessions", Some(&tossed), &k);
    assert_eq!(alone.status, 401, "{}", alone.body);
    // Logging out ends the live login, not the tossed cookie's.
    let out = post(&server.base, "/logout", Some(&both), &k, "");
    assert_eq!(out.status, 204, "{}", out.body);
    assert_eq!(
        get(&server.base, "/api/sessions", Some(&cookie), &k).status,
        401
    );
}

/// The API's answers (sessions, transcripts, approvals: agent text) are
/// never sniffed into another type nor kept in a cache, with the console's
/// cookie or a token alike.
#[test]
fn api_answers_are_not_sniffed_or_cached() {
    let server = Server::start();
    let (cookie, key) = log_in_with_key(&server);
    for path in ["/api/sessions", "/api/approvals", "/api/nope"] {
        let r = get(&server.base, path, Some(&cookie), &[("X-CSRF-Token", &key)]);
        assert_eq!(r.nosniff.as_deref(), Some("nosniff"), "{path}");
        assert_eq!(r.cache.as_deref(), Some("no-store"), "{path}");
    }
}

/// Browsers send a host's cookies to every port of it, so a process
/// listening on another loopback port gets the console's cookie as soon as
/// the operator's browser loads anything from there. A probe approved
/// requests and added an allow-all rule with the cookie alone: it fetched
/// `/` for the CSRF token the page carried. Now the key comes only with the
/// login, and every `/api` call needs it.
#[test]
fn the_cookie_alone_neither_reads_nor_acts() {
    let server = Server::start();
    let (cookie, key) = log_in_with_key(&server);
    let c = Some(cookie.as_str());
    let page = get(&server.base, "/", c, &[]);
    assert_eq!(page.status, 200);
    assert!(!page.body.contains(&key), "the page holds no key");
    for path in [
        "/api/sessions",
        "/api/approvals",
        "/api/rules",
        "/api/events",
    ] {
        let r = get(&server.base, path, c, &[]);
        assert_eq!(r.status, 401, "{path}: {}", r.body);
        assert!(r.body.contains("X-CSRF-Token"), "{path}: {}", r.body);
    }
    let rule = json!({"scope": "global", "match": {}, "action": "allow"}).to_string();
    let refused = post(&server.base, "/api/rules", c, &[], &rule);
    assert_eq!(refused.status, 401, "{}", refused.body);
    let rules = get(&server.base, "/api/rules", c, &[("X-CSRF-Token", &key)]);
    assert_eq!(rules.status, 200, "{}", rules.body);
    assert_eq!(rules.body.trim(), "[]", "no rule was added");
}

#[test]
fn the_login_link_works_once_and_the_page_is_locked_down() {
    let server = Server::start();
    let r = get(&server.base, "/", None, &[]);
    assert_eq!((r.status, r.location.as_deref()), (303, Some("/login")));
    let wrong = get(&server.base, "/login?code=nope", None, &[]);
    assert_eq!(wrong.status, 401);
    let cookie = log_in(&server);
    let again = get(&server.base, &server.login_path, None, &[]);
    assert_eq!(again.status, 401, "the link works once");
    assert!(again.set_cookie.is_none());

    let page = get(&server.base, "/", Some(&cookie), &[]);
    assert_eq!(page.status, 200);
    let csp = page.csp.expect("CSP");
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert!(
        !page.body.contains(TOKEN),
        "the API token never reaches the page"
    );
    assert!(!page.body.contains("<script>"), "no inline script");

    // The icon a browser asks for on every load: empty, not a 404.
    assert_eq!(get(&server.base, "/favicon.ico", None, &[]).status, 204);
    let js = get(&server.base, "/assets/app.js", None, &[]);
    assert_eq!(js.status, 200);
    assert!(
        js.content_type
            .unwrap_or_default()
            .starts_with("text/javascript")
    );
    assert_eq!(
        js.body.matches("innerHTML").count(),
        1,
        "markup is inserted in one place only: diff2html's escaped output"
    );
    let diff = get(
        &server.base,
        "/assets/vendor/diff2html/diff2html.min.js",
        None,
        &[],
    );
    assert_eq!(diff.status, 200);
    assert_eq!(
        get(&server.base, "/assets/../Cargo.toml", None, &[]).status,
        404
    );
}

#[test]
fn the_api_takes_the_cookie_only_with_the_csrf_token_and_a_local_host() {
    let server = Server::start();
    let (cookie, csrf) = log_in_with_key(&server);
    let c = Some(cookie.as_str());
    let key = [("X-CSRF-Token", csrf.as_str())];

    assert_eq!(get(&server.base, "/api/sessions", c, &key).status, 200);
    assert_eq!(get(&server.base, "/api/sessions", None, &[]).status, 401);
    assert_eq!(
        get(
            &server.base,
            "/api/sessions",
            Some(&format!("{}=forged", cookie_name(&cookie))),
            &[]
        )
        .status,
        401
    );

    let start = json!({"workspace": "demo", "prompt": "hello"}).to_string();
    let no_csrf = post(&server.base, "/api/sessions", c, &[], &start);
    assert_eq!(no_csrf.status, 401, "{}", no_csrf.body);
    assert!(no_csrf.body.contains("CSRF"), "{}", no_csrf.body);
    let bad_csrf = post(
        &server.base,
        "/api/sessions",
        c,
        &[("X-CSRF-Token", "0000")],
        &start,
    );
    assert_eq!(bad_csrf.status, 401);
    let cross = post(
        &server.base,
        "/api/sessions",
        c,
        &[("X-CSRF-Token", &csrf), ("Origin", "http://evil.example")],
        &start,
    );
    assert_eq!(cross.status, 403, "{}", cross.body);
    // A rebinding name for this very server (same port, so the browser
    // would send the cookie).
    let evil = format!("evil.example:{}", port_of(&server.base));
    let rebound = get(
        &server.base,
        "/api/sessions",
        c,
        &[("Host", &evil), ("X-CSRF-Token", &csrf)],
    );
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    assert_eq!(get(&server.base, "/", c, &[("Host", &evil)]).status, 403);

    let own_origin = server.base.clone();
    let ok = post(
        &server.base,
        "/api/sessions",
        c,
        &[("X-CSRF-Token", &csrf), ("Origin", &own_origin)],
        &start,
    );
    assert_eq!(ok.status, 201, "{}", ok.body);

    let out = post(&server.base, "/logout", c, &[("X-CSRF-Token", &csrf)], "");
    assert_eq!(out.status, 204);
    assert_eq!(
        get(&server.base, "/api/sessions", c, &key).status,
        401,
        "logged out"
    );
}

#[test]
fn the_token_form_logs_in_and_a_wrong_token_does_not() {
    let server = Server::start();
    let form = |token: &str| {
        answer(
            agent()
                .post(format!("{}/login", server.base))
                .header("Content-Type", "application/x-www-form-urlencoded")
                .send(format!("token={token}")),
        )
    };
    let wrong = form("nope");
    assert_eq!(wrong.status, 401);
    assert!(wrong.set_cookie.is_none());
    assert!(wrong.body.contains("Wrong API token"));
    let right = form(TOKEN);
    assert_eq!(right.status, 303);
    let location = right.location.expect("a redirect");
    let key = location.strip_prefix("/#key=").expect("the key");
    let cookie = right.set_cookie.expect("cookie");
    let cookie = cookie.split(';').next().expect("pair");
    assert_eq!(
        get(
            &server.base,
            "/api/sessions",
            Some(cookie),
            &[("X-CSRF-Token", key)]
        )
        .status,
        200
    );
    let cross = answer(
        agent()
            .post(format!("{}/login", server.base))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .header("Origin", "http://evil.example")
            .send(format!("token={TOKEN}")),
    );
    assert_eq!(cross.status, 403, "a cross-site login post is refused");
    // A form that is not one gets the login page back, saying so.
    let garbled = answer(
        agent()
            .post(format!("{}/login", server.base))
            .header("Content-Type", "application/json")
            .send("{\"token\": 1}"),
    );
    assert_eq!(garbled.status, 400);
    assert!(
        garbled.body.contains("could not be read"),
        "{}",
        garbled.body
    );
}

/// The login form is the one body anyone may send without a token: one
/// that does not come within its deadline is answered 408 with the page
/// (a probe held thousands of such connections 30 s each).
#[test]
fn a_login_form_that_never_comes_is_answered_408() {
    use std::io::{Read, Write};
    let server = Server::start();
    let addr = server.base.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).expect("connect");
    conn.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .expect("timeout");
    let head = format!(
        "POST /login HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ntoken=ab"
    );
    conn.write_all(head.as_bytes()).expect("send");
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive within 5 s"), "{answer}");
}

/// A stream opened with a console login ends when the login does: a probe's
/// went on delivering prompts after its logout.
#[test]
fn an_event_stream_ends_with_its_login() {
    let server = Server::start();
    let (cookie, key) = log_in_with_key(&server);
    let url = format!("{}/api/events", server.base);
    let (c, k) = (cookie.clone(), key.clone());
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // A client that would wait far longer than the test does.
        let patient: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(600)))
            .build()
            .into();
        let r = patient
            .get(&url)
            .header("Cookie", &c)
            .header("X-CSRF-Token", &k)
            .call();
        let status = r.as_ref().map(|r| r.status().as_u16()).unwrap_or(0);
        let _ = done_tx.send(("opened", status));
        if let Ok(mut r) = r {
            // Reads until the server ends the stream.
            let _ = r.body_mut().read_to_string();
        }
        let _ = done_tx.send(("ended", 0));
    });
    let opened = done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("opened");
    assert_eq!(opened, ("opened", 200));
    let out = post(
        &server.base,
        "/logout",
        Some(&cookie),
        &[("X-CSRF-Token", &key)],
        "",
    );
    assert_eq!(out.status, 204);
    // The login is checked every 5 s.
    let ended = done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the stream ended after the logout");
    assert_eq!(ended.0, "ended");
}
