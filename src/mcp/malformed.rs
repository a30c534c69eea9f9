//! Malformed MCP bodies answered the JSON-RPC way.
//!
//! rmcp answers a POST whose body it cannot deserialize with HTTP 415
//! "Unsupported Media Type" in plain text, even when the media type was
//! right and the JSON was wrong: a client is sent to fix its headers. This
//! middleware reads the body first (up to rmcp's own limit) and answers
//! what is not JSON with 400 and a JSON-RPC parse error (-32700), and what
//! is JSON but not one message (a batch, a bare value) or that rmcp could
//! not read as a message with 400 and -32600, both with a null id as
//! JSON-RPC 2.0 asks.

use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// The most an MCP POST body may hold: rmcp's own default.
pub(crate) const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// The longest part of rmcp's own reason quoted back.
const REASON_BYTES: usize = 300;

/// Middleware: checks a JSON POST body is one JSON object before rmcp reads
/// it, and turns rmcp's 415 for a message it cannot read into a JSON-RPC
/// error.
pub(crate) async fn refuse_malformed(req: Request, next: Next) -> Response {
    let is_json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("json"));
    if req.method() != Method::POST || !is_json {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => bytes,
        Err(e) if crate::http::body::too_slow(&e) => {
            return (
                StatusCode::REQUEST_TIMEOUT,
                crate::http::body::too_slow_message(),
            )
                .into_response();
        }
        Err(e) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("cannot read the request body ({e}); send at most {MAX_BODY_BYTES} bytes"),
            )
                .into_response();
        }
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Err(e) => return rpc_error(-32700, format!("parse error: {e}")),
        Ok(Value::Object(message)) => {
            if let Some(why) = bad_tool_call(&message) {
                let id = message.get("id").cloned().unwrap_or(Value::Null);
                return rpc_error_for(id, -32602, why);
            }
        }
        Ok(_) => {
            return rpc_error(
                -32600,
                "invalid request: send one JSON-RPC message, an object, per POST (batches are not supported)".to_owned(),
            );
        }
    }
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    if response.status() != StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return response;
    }
    let reason: String = to_bytes(response.into_body(), REASON_BYTES * 4)
        .await
        .map(|b| {
            String::from_utf8_lossy(&b)
                .chars()
                .take(REASON_BYTES)
                .collect()
        })
        .unwrap_or_default();
    rpc_error(
        -32600,
        format!("invalid request: not a JSON-RPC message the server can read ({reason})"),
    )
}

/// 400 with a JSON-RPC error and a null id.
fn rpc_error(code: i64, message: String) -> Response {
    rpc_error_for(Value::Null, code, message)
}

/// 400 with a JSON-RPC error answering request `id`.
fn rpc_error_for(id: Value, code: i64, message: String) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

/// Why a `tools/call` cannot be a call of a tool: its `params` not an
/// object, its `name` not a string, its `arguments` not an object. rmcp
/// answers those "method not found" (-32601) naming `tools/call`, which
/// sends a client looking for a missing method; these are invalid params
/// (-32602), and the answer names the one at fault.
fn bad_tool_call(message: &serde_json::Map<String, Value>) -> Option<String> {
    if message.get("method").and_then(Value::as_str) != Some("tools/call") {
        return None;
    }
    let Some(params) = message.get("params").and_then(Value::as_object) else {
        return Some(
            "invalid params: `params` of tools/call must be an object with `name` and `arguments`"
                .into(),
        );
    };
    if !params.get("name").is_some_and(Value::is_string) {
        return Some(
            "invalid params: `name` of tools/call must be a string, the tool's name".into(),
        );
    }
    match params.get("arguments") {
        None | Some(Value::Object(_)) => None,
        Some(_) => Some(
            "invalid params: `arguments` of tools/call must be an object of the tool's arguments"
                .into(),
        ),
    }
}
