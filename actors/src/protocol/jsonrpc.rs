//! JSON-RPC 2.0 envelopes.
//!
//! A thin layer: classify a frame as request, notification or response, keep
//! ids exactly as the peer sent them (numbers and strings), and serialise our
//! own messages. Correlating responses with requests is the session actor's
//! job, not this module's. The intercom dialect uses the same envelope without
//! the `jsonrpc` member, so parsing accepts its absence.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::fmt;

/// Standard error codes.
pub mod codes {
    /// Invalid JSON was received.
    pub const PARSE_ERROR: i64 = -32700;
    /// The JSON is not a valid request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// The method does not exist.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid method parameters.
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal error.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// ACP: authentication required.
    pub const AUTH_REQUIRED: i64 = -32000;
    /// ACP: the request was cancelled (a cancelled write, for instance).
    pub const REQUEST_CANCELLED: i64 = -32800;
    /// A valid request this server will not take now (a limit, a bound):
    /// in JSON-RPC's range for servers, one ACP does not use.
    pub const REFUSED: i64 = -32001;
    /// ACP: a resource (a file to read) does not exist.
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
}

/// A request id: a number or a string, kept verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RpcId {
    /// Numeric id.
    Num(i64),
    /// String id.
    Str(String),
}

impl From<&str> for RpcId {
    fn from(s: &str) -> RpcId {
        RpcId::Str(s.to_owned())
    }
}

impl PartialEq<str> for RpcId {
    fn eq(&self, other: &str) -> bool {
        matches!(self, RpcId::Str(s) if s == other)
    }
}

impl PartialEq<&str> for RpcId {
    fn eq(&self, other: &&str) -> bool {
        self == *other
    }
}

impl fmt::Display for RpcId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RpcId::Num(n) => write!(f, "{n}"),
            RpcId::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    /// Error code.
    pub code: i64,
    /// Message.
    pub message: String,
    /// Extra data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    /// An error with no data.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)?;
        if let Some(data) = &self.data {
            write!(f, ": {data}")?;
        }
        Ok(())
    }
}

/// One JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub enum RpcMessage {
    /// A call that expects a response.
    Request {
        /// Correlation id.
        id: RpcId,
        /// Method name.
        method: String,
        /// Parameters (`null` when absent).
        params: Value,
    },
    /// A call without a response.
    Notification {
        /// Method name.
        method: String,
        /// Parameters (`null` when absent).
        params: Value,
    },
    /// The answer to one of our requests.
    Response {
        /// The id of the request it answers (`None` for errors about unparseable input).
        id: Option<RpcId>,
        /// Result or error.
        outcome: Result<Value, RpcError>,
    },
}

/// Why a frame is not a JSON-RPC message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    /// Not JSON at all.
    #[error("malformed JSON: {0}")]
    Json(String),
    /// JSON, but not a message shape we understand (a malformed response:
    /// never answered, or two strict peers could answer each other for ever).
    #[error("not a JSON-RPC message: {0}")]
    Shape(&'static str),
    /// Not a valid request or notification: JSON-RPC answers it with
    /// -32600 and a null id.
    #[error("not a valid JSON-RPC request: {0}")]
    Invalid(&'static str),
    /// Not a valid request, but its id could be read: answered with -32600
    /// on that id (JSON-RPC keeps the null id for an id it cannot detect).
    #[error("not a valid JSON-RPC request {id}: {why}")]
    InvalidWithId {
        /// The request's id.
        id: RpcId,
        /// What is wrong.
        why: &'static str,
    },
    /// A JSON-RPC batch (a top-level array), which this side does not take;
    /// the ids of the requests in it, which each deserve an error answer.
    #[error("a JSON-RPC batch of {len} messages; batches are not supported")]
    Batch {
        /// How many messages it held.
        len: usize,
        /// The ids of the requests among them.
        requests: Vec<RpcId>,
    },
}

impl ParseError {
    /// The error a line that failed to parse is answered with (with a null
    /// id, as JSON-RPC 2.0 asks), or `None` when it must not be answered
    /// (a malformed response; a batch is answered per request).
    pub fn answer(&self) -> Option<RpcError> {
        match self {
            ParseError::Json(e) => Some(RpcError::new(
                codes::PARSE_ERROR,
                format!("parse error: {e}; send one JSON object per line"),
            )),
            ParseError::Invalid(why) | ParseError::InvalidWithId { why, .. } => Some(
                RpcError::new(codes::INVALID_REQUEST, format!("invalid request: {why}")),
            ),
            ParseError::Shape(_) | ParseError::Batch { .. } => None,
        }
    }

    /// The id the answer goes to: the request's when it could be read,
    /// else none (a null id).
    pub fn answer_id(&self) -> Option<RpcId> {
        match self {
            ParseError::InvalidWithId { id, .. } => Some(id.clone()),
            _ => None,
        }
    }
}

/// At most this many requests of one batch are answered (an error each):
/// a hostile agent's batch of thousands must not become as many writes.
const BATCH_ANSWERS: usize = 64;

/// A batch, with the ids of the requests in it (messages with a method and
/// an id, at most [`BATCH_ANSWERS`]) so that each can be answered.
fn batch(items: &[Value]) -> ParseError {
    let requests = items
        .iter()
        .filter_map(|item| {
            let obj = item.as_object()?;
            obj.get("method")?;
            parse_id(obj.get("id")?.clone()).ok()
        })
        .take(BATCH_ANSWERS)
        .collect();
    ParseError::Batch {
        len: items.len(),
        requests,
    }
}

impl RpcMessage {
    /// Parses one frame body.
    pub fn parse(body: &[u8]) -> Result<RpcMessage, ParseError> {
        let value: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            // Text a JavaScript or Python agent cut mid-emoji: read (the
            // lone surrogate as its escape's text), not lost.
            Err(e) => super::surrogates::mend(body)
                .and_then(|m| serde_json::from_slice(&m).ok())
                .ok_or_else(|| ParseError::Json(e.to_string()))?,
        };
        let mut obj = match value {
            Value::Object(obj) => obj,
            // An empty batch is one invalid request (JSON-RPC 2.0, 6).
            Value::Array(items) if items.is_empty() => {
                return Err(ParseError::Invalid("an empty batch"));
            }
            Value::Array(items) => return Err(batch(&items)),
            _ => return Err(ParseError::Invalid("top level is not an object")),
        };
        let asks = obj.contains_key("method");
        let id = match obj.remove("id") {
            None => None,
            // A request must be answered, and a notification has no id
            // member at all: a null id was taken for a notification, and
            // the agent waited for ever for its answer.
            Some(Value::Null) if asks => {
                return Err(ParseError::Invalid(
                    "the id is null: a request's id is an integer or a string, and a notification has no id",
                ));
            }
            Some(Value::Null) => Some(None),
            Some(v) => Some(Some(parse_id(v).map_err(|e| match e {
                ParseError::Shape(why) if asks => ParseError::Invalid(why),
                other => other,
            })?)),
        };
        let params = obj.remove("params").unwrap_or(Value::Null);
        if let Some(method) = obj.remove("method") {
            let Value::String(method) = method else {
                const WHY: &str = "method is not a string";
                return Err(match id {
                    Some(Some(id)) => ParseError::InvalidWithId { id, why: WHY },
                    _ => ParseError::Invalid(WHY),
                });
            };
            return Ok(match id {
                Some(Some(id)) => RpcMessage::Request { id, method, params },
                _ => RpcMessage::Notification { method, params },
            });
        }
        let id = id.ok_or(ParseError::Invalid("neither method nor id"))?;
        if let Some(err) = obj.remove("error") {
            let err: RpcError = serde_json::from_value(err)
                .map_err(|_| ParseError::Shape("error member is not an error object"))?;
            return Ok(RpcMessage::Response {
                id,
                outcome: Err(err),
            });
        }
        match obj.remove("result") {
            Some(result) => Ok(RpcMessage::Response {
                id,
                outcome: Ok(result),
            }),
            None => Err(ParseError::Shape("response without result or error")),
        }
    }

    /// Serialises as a JSON-RPC 2.0 message (no trailing newline).
    pub fn to_bytes(&self) -> Bytes {
        let value = match self {
            RpcMessage::Request { id, method, params } => {
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
            }
            RpcMessage::Notification { method, params } => {
                json!({"jsonrpc": "2.0", "method": method, "params": params})
            }
            RpcMessage::Response { id, outcome } => {
                let mut obj = Map::new();
                obj.insert("jsonrpc".into(), "2.0".into());
                obj.insert("id".into(), serde_json::to_value(id).unwrap_or(Value::Null));
                match outcome {
                    Ok(result) => obj.insert("result".into(), result.clone()),
                    Err(err) => obj.insert(
                        "error".into(),
                        serde_json::to_value(err).unwrap_or(Value::Null),
                    ),
                };
                Value::Object(obj)
            }
        };
        Bytes::from(value.to_string())
    }

    /// A success response.
    pub fn result(id: RpcId, result: Value) -> Self {
        RpcMessage::Response {
            id: Some(id),
            outcome: Ok(result),
        }
    }

    /// An error response.
    pub fn error(id: RpcId, err: RpcError) -> Self {
        RpcMessage::Response {
            id: Some(id),
            outcome: Err(err),
        }
    }
}

fn parse_id(v: Value) -> Result<RpcId, ParseError> {
    match v {
        Value::String(s) => Ok(RpcId::Str(s)),
        Value::Number(n) => n.as_i64().map(RpcId::Num).ok_or(ParseError::Shape(
            "the id is not an integer (use an integer or a string)",
        )),
        _ => Err(ParseError::Shape(
            "the id is neither an integer nor a string",
        )),
    }
}

/// The id of a request from the start of a message too long to read, so the
/// error can be answered on it: an agent writing a file over the line limit
/// otherwise waited for ever for an answer that went to id null.
///
/// Only members of the top-level object count, and only a `"method"` and an
/// `"id"` that both come before any `"params"` (the order agents write; a
/// nested `"id"`, as in `_meta`, is not the request's), and only an integer
/// id or a string id without escapes. Anything else is `None`: answered
/// with a null id, as before.
pub fn request_id_in_head(head: &[u8]) -> Option<RpcId> {
    let mut method = false;
    let mut id_at = None;
    for (key, value_at) in top_level_members(head) {
        match key {
            b"params" => break,
            b"method" => method = true,
            b"id" => id_at = Some(value_at),
            _ => {}
        }
    }
    let value = &head[id_at.filter(|_| method)?..];
    match value.first()? {
        b'"' => plain_string(value).map(|s| RpcId::Str(s.to_owned())),
        _ => {
            let digits = value
                .iter()
                .position(|b| !(b.is_ascii_digit() || *b == b'-'))
                .unwrap_or(value.len());
            let tail = value
                .get(digits..)
                .and_then(|t| t.trim_ascii_start().first().copied());
            if !matches!(tail, Some(b',' | b'}')) {
                return None;
            }
            std::str::from_utf8(&value[..digits])
                .ok()?
                .parse()
                .ok()
                .map(RpcId::Num)
        }
    }
}

/// The members of the object `head` starts with, as far as `head` goes:
/// each key (as written, escapes and all) and where its value starts.
/// Strings are skipped whole and nesting is counted, so a key inside a
/// nested object or a string is never taken for one of the top level.
fn top_level_members(head: &[u8]) -> Vec<(&[u8], usize)> {
    let mut members = Vec::new();
    if head.trim_ascii_start().first() != Some(&b'{') {
        return members;
    }
    let (mut depth, mut i, mut expect_key) = (0usize, 0usize, false);
    while i < head.len() {
        match head[i] {
            b'"' => {
                let start = i + 1;
                let mut j = start;
                while j < head.len() && head[j] != b'"' {
                    j += if head[j] == b'\\' { 2 } else { 1 };
                }
                if j >= head.len() {
                    break;
                }
                if depth == 1 && expect_key {
                    let after = head[j + 1..].trim_ascii_start();
                    if let Some(value) = after.strip_prefix(b":") {
                        members
                            .push((&head[start..j], head.len() - value.trim_ascii_start().len()));
                    }
                    expect_key = false;
                }
                i = j + 1;
                continue;
            }
            b'{' | b'[' => {
                depth += 1;
                expect_key = depth == 1;
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' if depth == 1 => expect_key = true,
            _ => {}
        }
        i += 1;
    }
    members
}

/// The string value of the first `"key":` member anywhere in `head` (the
/// start of a message too long to read), when it has no escapes; at most
/// 256 bytes.
pub fn string_member_in_head(head: &[u8], key: &str) -> Option<String> {
    let quoted = format!("\"{key}\"");
    let at = memchr::memmem::find(head, quoted.as_bytes())?;
    let value = head[at + quoted.len()..]
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    plain_string(value)
        .filter(|s| s.len() <= 256)
        .map(str::to_owned)
}

/// The string value of the top-level `"key":` member of `head`, when it has
/// no escapes (see [`top_level_members`]).
pub fn top_level_string_in_head(head: &[u8], key: &str) -> Option<String> {
    let (_, at) = top_level_members(head)
        .into_iter()
        .find(|(k, _)| *k == key.as_bytes())?;
    plain_string(&head[at..]).map(str::to_owned)
}

/// The JSON string `value` starts with, when it has no escapes.
fn plain_string(value: &[u8]) -> Option<&str> {
    let body = value.strip_prefix(b"\"")?;
    let end = memchr::memchr2(b'"', b'\\', body)?;
    (body[end] == b'"')
        .then(|| std::str::from_utf8(&body[..end]).ok())
        .flatten()
}

/// Truncates raw input for a log line: at most `max` bytes, valid UTF-8.
pub fn truncate_for_log(raw: &[u8], max: usize) -> String {
    let cut = &raw[..raw.len().min(max)];
    let text = String::from_utf8_lossy(cut);
    if raw.len() > max {
        format!("{text}… ({} bytes)", raw.len())
    } else {
        text.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_id_is_found_at_the_start_of_a_message_too_long_to_read() {
        let find = |s: &str| request_id_in_head(s.as_bytes());
        assert_eq!(
            find(
                r#"{"jsonrpc":"2.0","id":"big1","method":"fs/write_text_file","params":{"content":"xx"#
            ),
            Some(RpcId::Str("big1".into()))
        );
        assert_eq!(
            find(r#"{"method": "session/request_permission", "id" : -7 , "params": {"#),
            Some(RpcId::Num(-7))
        );
        // An id inside the params, or no method (a response), or an id cut
        // off by the head: none, and the answer goes to id null.
        assert_eq!(find(r#"{"method":"m","params":{"id":5,"x":"#), None);
        assert_eq!(find(r#"{"jsonrpc":"2.0","id":3,"result":{"a":"#), None);
        assert_eq!(find(r#"{"method":"m","id":12"#), None);
        assert_eq!(
            string_member_in_head(br#"{"params":{"update":{"sessionUpdate":"tool_call","toolCallId" : "toolu_1","content":"#, "toolCallId"),
            Some("toolu_1".into())
        );
        assert_eq!(
            string_member_in_head(br#"{"toolCallId":"a\"b"}"#, "toolCallId"),
            None
        );
        assert_eq!(find(r#"{"method":"m","id":"a\"b","params":"#), None);
        // A nested id (a probe's `_meta`), a method or id inside a string
        // or a nested object: not the request's.
        assert_eq!(
            find(r#"{"method":"session/update","_meta":{"id":4242},"params":{"#),
            None
        );
        assert_eq!(
            find(r#"{"x":"\"id\":5,","method":"m","y":{"id":66},"params":"#),
            None
        );
        assert_eq!(find(r#"{"id":1,"result":{"method":"m","x":"#), None);
        assert_eq!(
            find(r#"{"x":{"id":3},"id":4,"method":"m","params":"#),
            Some(RpcId::Num(4))
        );
    }

    #[test]
    fn classifies_requests_notifications_and_responses() {
        let r = RpcMessage::parse(
            br#"{"jsonrpc":"2.0","id":7,"method":"fs/read_text_file","params":{}}"#,
        );
        assert!(matches!(
            r,
            Ok(RpcMessage::Request {
                id: RpcId::Num(7),
                ..
            })
        ));
        let n = RpcMessage::parse(br#"{"jsonrpc":"2.0","method":"session/update","params":{}}"#);
        assert!(matches!(n, Ok(RpcMessage::Notification { .. })));
        let ok = RpcMessage::parse(br#"{"jsonrpc":"2.0","id":"a","result":null}"#);
        assert_eq!(
            ok,
            Ok(RpcMessage::Response {
                id: Some(RpcId::Str("a".into())),
                outcome: Ok(Value::Null)
            })
        );
        let err = RpcMessage::parse(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"Authentication required"}}"#);
        match err {
            Ok(RpcMessage::Response {
                outcome: Err(e), ..
            }) => assert_eq!(e.code, -32000),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn what_an_agent_got_wrong_is_answered_and_a_bad_response_is_not() {
        let answered = |line: &[u8]| {
            RpcMessage::parse(line)
                .expect_err("malformed")
                .answer()
                .map(|e| e.code)
        };
        assert_eq!(
            answered(b"{\"id\": 1, \"method\""),
            Some(codes::PARSE_ERROR)
        );
        for bad_request in [
            &br#"{"jsonrpc":"2.0","id":1.5,"method":"session/request_permission"}"#[..],
            br#"{"jsonrpc":"2.0","id":{"a":1},"method":"fs/read_text_file"}"#,
            br#"{"jsonrpc":"2.0","id":true,"method":"x"}"#,
            br#"{"jsonrpc":"2.0","id":1180591620717411303424,"method":"x"}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":42}"#,
            br#"{"jsonrpc":"2.0"}"#,
            b"42",
        ] {
            assert_eq!(
                answered(bad_request),
                Some(codes::INVALID_REQUEST),
                "{}",
                String::from_utf8_lossy(bad_request)
            );
        }
        for bad_response in [
            &br#"{"jsonrpc":"2.0","id":1}"#[..],
            br#"{"jsonrpc":"2.0","id":1.5,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":1,"error":"nope"}"#,
        ] {
            assert_eq!(answered(bad_response), None);
        }
        // The answer carries a null id, as JSON-RPC 2.0 asks.
        let bytes = RpcMessage::Response {
            id: None,
            outcome: Err(RpcError::new(codes::INVALID_REQUEST, "x")),
        }
        .to_bytes();
        let v: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v["id"], Value::Null);
        assert_eq!(v["error"]["code"], codes::INVALID_REQUEST);
    }

    #[test]
    fn dialect_envelope_without_jsonrpc_member_parses() {
        let m = RpcMessage::parse(
            br#"{"method":"clearance/request","id":"req-001","params":{"title":"t"}}"#,
        );
        assert!(matches!(
            m,
            Ok(RpcMessage::Request {
                id: RpcId::Str(_),
                ..
            })
        ));
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        for bad in [
            &b"{"[..],
            b"[]",
            b"{\"id\":1}",
            b"{\"method\":3}",
            b"{\"id\":{},\"result\":1}",
            b"\xff\xfe",
        ] {
            assert!(RpcMessage::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_empty_batch_is_one_invalid_request() {
        let e = RpcMessage::parse(b"[]").expect_err("refused");
        assert_eq!(e.answer().map(|a| a.code), Some(codes::INVALID_REQUEST));
    }

    #[test]
    fn a_batch_names_the_requests_to_answer() {
        let batch = br#"[{"jsonrpc":"2.0","id":"b1","method":"x"},{"jsonrpc":"2.0","method":"note"},{"jsonrpc":"2.0","id":7,"result":1},{"jsonrpc":"2.0","id":2,"method":"y"},3]"#;
        assert_eq!(
            RpcMessage::parse(batch),
            Err(ParseError::Batch {
                len: 5,
                requests: vec![RpcId::Str("b1".into()), RpcId::Num(2)],
            })
        );
        // A hostile batch of thousands is answered at most BATCH_ANSWERS times.
        let many: Vec<Value> = (0..10_000)
            .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "x"}))
            .collect();
        let body = serde_json::to_vec(&many).expect("json");
        match RpcMessage::parse(&body) {
            Err(ParseError::Batch { len, requests }) => {
                assert_eq!(len, 10_000);
                assert_eq!(requests.len(), BATCH_ANSWERS);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn serialises_with_version_and_verbatim_ids() {
        let bytes = RpcMessage::result(RpcId::Str("x-1".into()), json!({"a":1})).to_bytes();
        let v: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v, json!({"jsonrpc":"2.0","id":"x-1","result":{"a":1}}));
    }

    #[test]
    fn truncation_marks_long_input() {
        assert_eq!(truncate_for_log(b"abc", 10), "abc");
        assert!(truncate_for_log(&[b'a'; 20], 5).ends_with("(20 bytes)"));
    }
}
