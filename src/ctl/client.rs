//! A small blocking client of the HTTP API, for `ctl` (and tests).
//!
//! Every call returns the raw JSON text of a successful answer (so `--json`
//! can print it verbatim) or a [`CtlError`] that knows its exit code.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::http::views::ErrorBody;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a start, restart or revive may take (it waits for the agent's
/// handshake).
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long any other change may take (a stop waits up to the shutdown
/// grace for the agent).
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a read may take. A server that is stuck (stopped, a full disk)
/// left every `ctl` command hanging.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read: a transcript page carries about 8 MiB of
/// content, which JSON escaping can make several times larger.
const BODY_LIMIT: u64 = 128 << 20;

/// Exit codes scripts can rely on.
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// Anything else.
    pub const OTHER: i32 = 1;
    /// Bad command line (or the server said `bad_request`).
    pub const USAGE: i32 = 2;
    /// No such session or request.
    pub const NOT_FOUND: i32 = 3;
    /// The session or request is not in a state that allows it.
    pub const CONFLICT: i32 = 4;
    /// No token, a wrong token, or not allowed.
    pub const UNAUTHORIZED: i32 = 5;
    /// The server could not be reached.
    pub const UNREACHABLE: i32 = 6;
}

/// Why a `ctl` command failed.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// Nothing answered at the URL.
    #[error("cannot reach the server at {url}: {reason}; is `agent-intercom serve` running?")]
    Unreachable {
        /// The base URL.
        url: String,
        /// What failed.
        reason: String,
    },
    /// The connection broke after a change was sent, before its answer: a
    /// probe's `ctl start` said "cannot reach the server" for a start the
    /// server had stored (killed mid-start), and the retry made a second.
    #[error(
        "the connection to the server at {url} broke before its answer ({reason}); the change may still have been carried out: check with `ctl sessions` or `ctl pending` before trying again"
    )]
    Cut {
        /// The base URL.
        url: String,
        /// What failed.
        reason: String,
    },
    /// The server took the request and did not answer in time.
    #[error("{}", no_answer(url, *secs, *change))]
    NoAnswer {
        /// The base URL.
        url: String,
        /// How long ctl waited.
        secs: u64,
        /// It was a change (it may still be carried out).
        change: bool,
    },
    /// The server answered with an error.
    #[error("{} ({}, HTTP {status})", .body.error, .body.code)]
    Api {
        /// HTTP status.
        status: u16,
        /// The JSON error.
        body: ErrorBody,
    },
    /// The server's answer was not what the API documents.
    #[error("unexpected answer from the server: {0}")]
    Protocol(String),
    /// No token could be found.
    #[error("{0}")]
    NoToken(String),
    /// The command line is wrong.
    #[error("{0}")]
    Usage(String),
}

impl CtlError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            CtlError::Unreachable { .. } | CtlError::NoAnswer { .. } | CtlError::Cut { .. } => {
                exit::UNREACHABLE
            }
            CtlError::NoToken(_) => exit::UNAUTHORIZED,
            CtlError::Usage(_) => exit::USAGE,
            CtlError::Protocol(_) => exit::OTHER,
            CtlError::Api { status, .. } => match status {
                400 => exit::USAGE,
                401 | 403 => exit::UNAUTHORIZED,
                404 => exit::NOT_FOUND,
                409 => exit::CONFLICT,
                _ => exit::OTHER,
            },
        }
    }
}

/// What a request that got no answer in time means for the operator.
fn no_answer(url: &str, secs: u64, change: bool) -> String {
    if change {
        format!(
            "the server at {url} took the request but did not answer within {secs} s; it may still be carried out: check with `ctl sessions` or `ctl pending` before trying again"
        )
    } else {
        format!(
            "the server at {url} did not answer within {secs} s; it may be stuck: see its log and /healthz"
        )
    }
}

/// The API client.
#[derive(Debug, Clone)]
pub struct Client {
    agent: ureq::Agent,
    base: String,
    token: String,
    /// [`READ_TIMEOUT`], [`WRITE_TIMEOUT`], [`START_TIMEOUT`].
    limits: [Duration; 3],
}

impl Client {
    /// A client for the server at `base` (e.g. `http://127.0.0.1:3000`).
    pub fn new(base: &str, token: &str) -> Self {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .build();
        Client {
            agent: config.into(),
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            limits: [READ_TIMEOUT, WRITE_TIMEOUT, START_TIMEOUT],
        }
    }

    /// How long a `POST path` may take.
    fn write_limit(&self, path: &str) -> Duration {
        let starts =
            path == "/api/sessions" || path.ends_with("/restart") || path.ends_with("/revive");
        if starts {
            self.limits[2]
        } else {
            self.limits[1]
        }
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `GET path`, the raw JSON text.
    pub fn get(&self, path: &str) -> Result<String, CtlError> {
        let request = self
            .agent
            .get(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token))
            .config()
            .timeout_global(Some(self.limits[0]))
            .build();
        self.finish(request.call(), self.limits[0], false)
    }

    /// `GET path` as a stream (Server-Sent Events): answers once the
    /// headers arrived, with the body to read line by line. No overall
    /// timeout: the server keeps the stream open and sends keep-alives.
    pub fn stream(
        &self,
        path: &str,
        last_event_id: Option<i64>,
    ) -> Result<impl std::io::BufRead + use<>, CtlError> {
        // The answer's headers must come as a read's would; the body then
        // has no bound (the server sends keep-alives). A stopped server
        // left `ctl watch` waiting in silence.
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_recv_response(Some(self.limits[0]))
            .build();
        let agent: ureq::Agent = config.into();
        let mut request = agent
            .get(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token))
            .header("Accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        let response = request
            .call()
            .map_err(|e| self.transport(e, self.limits[0], false))?;
        if !response.status().is_success() {
            return Err(self
                .finish(Ok(response), self.limits[0], false)
                .err()
                .unwrap_or_else(|| {
                    CtlError::Protocol("the event stream answered without events".into())
                }));
        }
        Ok(std::io::BufReader::new(response.into_body().into_reader()))
    }

    /// `GET path` of a paged list, the raw JSON text and, when older
    /// entries lie beyond the page, the id its `Link: <...?before=ID...>;
    /// rel="prev"` header names.
    pub fn get_page(&self, path: &str) -> Result<(String, Option<i64>), CtlError> {
        let limit = self.limits[0];
        let request = self
            .agent
            .get(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token))
            .config()
            .timeout_global(Some(limit))
            .build();
        let response = request
            .call()
            .map_err(|e| self.transport(e, limit, false))?;
        let earlier = response
            .headers()
            .get("link")
            .and_then(|v| v.to_str().ok())
            .and_then(earlier_page);
        Ok((self.finish(Ok(response), limit, false)?, earlier))
    }

    /// `POST path` with a JSON body, the raw JSON text.
    pub fn post(&self, path: &str, body: &Value) -> Result<String, CtlError> {
        let limit = self.write_limit(path);
        let request = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token))
            .config()
            .timeout_global(Some(limit))
            .build();
        self.finish(request.send_json(body), limit, true)
    }

    /// `GET path`, parsed.
    pub fn get_as<T: DeserializeOwned>(&self, path: &str) -> Result<(String, T), CtlError> {
        let raw = self.get(path)?;
        let parsed = parse(&raw)?;
        Ok((raw, parsed))
    }

    /// `POST path`, parsed.
    pub fn post_as<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<(String, T), CtlError> {
        let raw = self.post(path, body)?;
        let parsed = parse(&raw)?;
        Ok((raw, parsed))
    }

    fn finish(
        &self,
        result: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
        limit: Duration,
        change: bool,
    ) -> Result<String, CtlError> {
        let mut response = result.map_err(|e| self.transport(e, limit, change))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(BODY_LIMIT)
            .read_to_string()
            .map_err(|e| match e {
                ureq::Error::Timeout(_) => self.transport(e, limit, change),
                e => CtlError::Protocol(format!("reading the body: {e}")),
            })?;
        if (200..300).contains(&status) {
            return Ok(text);
        }
        let body = serde_json::from_str::<ErrorBody>(&text).unwrap_or_else(|_| ErrorBody {
            error: if text.trim().is_empty() {
                format!("HTTP {status}")
            } else {
                text.trim().to_owned()
            },
            code: "unknown".into(),
            status: None,
        });
        Err(CtlError::Api { status, body })
    }

    /// A failure to get an answer: the server cannot be reached, or it took
    /// the request (a `change` when it was one) and gave no answer within
    /// `limit`.
    fn transport(&self, e: ureq::Error, limit: Duration, change: bool) -> CtlError {
        match e {
            ureq::Error::Timeout(t)
                if !matches!(t, ureq::Timeout::Connect | ureq::Timeout::Resolve) =>
            {
                CtlError::NoAnswer {
                    url: self.base.clone(),
                    secs: limit.as_secs().max(1),
                    change,
                }
            }
            // Connected, then cut: a change may have reached the server.
            ureq::Error::Io(_) if change => CtlError::Cut {
                url: self.base.clone(),
                reason: e.to_string(),
            },
            ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::HostNotFound
            | ureq::Error::ConnectionFailed => CtlError::Unreachable {
                url: self.base.clone(),
                reason: e.to_string(),
            },
            ureq::Error::BadUri(_) => CtlError::Usage(format!("bad --url {}: {e}", self.base)),
            other => CtlError::Protocol(other.to_string()),
        }
    }
}

/// The `before` id of a `Link` header's `rel="prev"` page
/// (`</api/sessions/s-1/messages?before=42&limit=1000>; rel="prev"`).
fn earlier_page(link: &str) -> Option<i64> {
    link.split(',').find_map(|part| {
        let (target, params) = part.trim().split_once(';')?;
        if !params.contains("rel=\"prev\"") {
            return None;
        }
        let query = target
            .trim()
            .strip_prefix('<')?
            .strip_suffix('>')?
            .split_once('?')?
            .1;
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix("before="))?
            .parse()
            .ok()
    })
}

/// Percent-encodes one path segment (ids are plain, but be safe).
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b':' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

pub fn parse<T: DeserializeOwned>(raw: &str) -> Result<T, CtlError> {
    serde_json::from_str(raw).map_err(|e| CtlError::Protocol(format!("{e}: {raw}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that reads a request and drops the connection (killed in
    /// the middle): a change may have been carried out, and ctl says so
    /// instead of "cannot reach the server"; a read is just unreachable.
    #[test]
    fn a_connection_cut_after_a_change_was_sent_says_it_may_be_done() {
        use std::io::Read;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                drop(conn);
            }
        });
        let client = Client::new(&base, "t");
        let err = client
            .post("/api/sessions", &serde_json::json!({"workspace": "w"}))
            .expect_err("cut");
        assert!(matches!(err, CtlError::Cut { .. }), "{err:?}");
        assert!(
            err.to_string().contains("may still have been carried out"),
            "{err}"
        );
        assert_eq!(err.exit_code(), exit::UNREACHABLE);
        let err = client.get("/api/sessions").expect_err("cut");
        assert!(matches!(err, CtlError::Unreachable { .. }), "{err:?}");
    }

    /// A server that takes connections and never answers (a stopped
    /// process): ctl gives up, and says a change may still be carried out.
    #[test]
    fn a_server_that_never_answers_is_given_up_on_with_what_to_check() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming() {
                held.push(conn);
            }
        });
        let mut client = Client::new(&base, "t");
        client.limits = [Duration::from_millis(200); 3];
        let err = client
            .post("/api/approvals/s-1:req-1", &serde_json::json!({}))
            .expect_err("no answer");
        assert!(
            matches!(err, CtlError::NoAnswer { change: true, .. }),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("may still be carried out"),
            "{err}"
        );
        assert_eq!(err.exit_code(), exit::UNREACHABLE);
        let err = client.get("/api/sessions").expect_err("no answer");
        assert!(
            matches!(err, CtlError::NoAnswer { change: false, .. }),
            "{err:?}"
        );
        // The event stream's headers too (`ctl watch` waited in silence).
        let err = client.stream("/api/events", None).err().expect("no answer");
        assert!(
            matches!(err, CtlError::NoAnswer { change: false, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn exit_codes_follow_the_http_status() {
        let api = |status| CtlError::Api {
            status,
            body: ErrorBody {
                error: "x".into(),
                code: "x".into(),
                status: None,
            },
        };
        assert_eq!(api(404).exit_code(), exit::NOT_FOUND);
        assert_eq!(api(409).exit_code(), exit::CONFLICT);
        assert_eq!(api(401).exit_code(), exit::UNAUTHORIZED);
        assert_eq!(api(400).exit_code(), exit::USAGE);
        assert_eq!(api(502).exit_code(), exit::OTHER);
    }

    #[test]
    fn unreachable_server_is_exit_6() {
        // Port 9 on loopback: nothing listens there in a test sandbox.
        let client = Client::new("http://127.0.0.1:9", "t");
        let err = client.get("/healthz").expect_err("nothing listens");
        assert_eq!(err.exit_code(), exit::UNREACHABLE, "{err}");
    }

    #[test]
    fn the_earlier_page_is_read_from_the_link_header() {
        let link = r#"</api/sessions/s-1/messages?before=42&limit=1000>; rel="prev""#;
        assert_eq!(earlier_page(link), Some(42));
        let next = r#"</api/sessions/s-1/messages?after=42&limit=10>; rel="next""#;
        assert_eq!(earlier_page(next), None);
        assert_eq!(earlier_page("garbage"), None);
    }

    #[test]
    fn segments_are_escaped() {
        assert_eq!(segment("s-1:req-2"), "s-1:req-2");
        assert_eq!(segment("a b/c"), "a%20b%2Fc");
    }
}
