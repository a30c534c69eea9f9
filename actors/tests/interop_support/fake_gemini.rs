//! A fake of the Gemini API (`generativelanguage`, v1beta) on loopback, so
//! the real Gemini CLI (`GOOGLE_GEMINI_BASE_URL` pointed here, which also
//! selects its `gateway` auth type) runs whole turns offline: real tool
//! calls, real permissions, real writes.
//!
//! Endpoints, as the bundled `@google/genai` client calls them:
//! `POST /v1beta/models/{model}:streamGenerateContent?alt=sse` answered with
//! SSE `data:` frames of `GenerateContentResponse` chunks (a thought part,
//! text parts, a `functionCall` part, then `finishReason` and
//! `usageMetadata`); `:generateContent` for Gemini's side questions (model
//! router, next-speaker check), answered with one JSON text that satisfies
//! all of them; `:countTokens`. What the model "says" in a turn is decided by
//! the test's script from the request body; every request is recorded.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::loopback_http::{Listening, Request, respond, start_sse};

/// One part of a scripted model answer.
#[derive(Debug, Clone)]
pub enum Part {
    /// A thought summary (`thought: true`).
    Thought(String),
    /// Model text.
    Text(String),
    /// A function call, e.g. `write_file` with `file_path` and `content`.
    Call {
        /// The tool's name.
        name: String,
        /// Its arguments.
        args: Value,
    },
}

/// A scripted model answer (one streamed turn of the model).
#[derive(Debug, Clone)]
pub struct Reply {
    /// The parts, in order.
    pub parts: Vec<Part>,
}

impl Reply {
    /// Plain text.
    pub fn text(text: &str) -> Reply {
        Reply {
            parts: vec![Part::Text(text.to_owned())],
        }
    }

    /// A thought, some text, then one function call.
    pub fn call(text: &str, name: &str, args: Value) -> Reply {
        Reply {
            parts: vec![
                Part::Thought(format!("The user wants {name}; I should call it.")),
                Part::Text(text.to_owned()),
                Part::Call {
                    name: name.to_owned(),
                    args,
                },
            ],
        }
    }
}

/// Decides the answer to one streamed turn request body.
pub type Script = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

/// The answer to every non-streamed side question: Gemini's model router
/// reads `model_choice`, its next-speaker check reads `next_speaker`.
const SIDE_ANSWER: &str =
    r#"{"reasoning": "fake model", "model_choice": "flash", "next_speaker": "user"}"#;

/// The running fake; stops when dropped.
pub struct FakeGemini {
    /// `http://127.0.0.1:<port>`, for `GOOGLE_GEMINI_BASE_URL`.
    pub url: String,
    server: Listening,
}

impl FakeGemini {
    /// Listens on an ephemeral loopback port.
    pub async fn start(script: Script) -> FakeGemini {
        let server = Listening::start("fake gemini", move |stream, request| {
            serve(stream, request, script.clone())
        })
        .await;
        FakeGemini {
            url: server.url.clone(),
            server,
        }
    }

    /// Every request so far as (path, body).
    pub fn requests(&self) -> Vec<(String, Value)> {
        self.server.requests()
    }

    /// The bodies of streamed turn requests (those offering tools).
    pub fn turns(&self) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|(p, b)| p.contains(":streamGenerateContent") && offers_tools(b))
            .map(|(_, b)| b)
            .collect()
    }
}

fn offers_tools(body: &Value) -> bool {
    body["tools"].as_array().is_some_and(|t| !t.is_empty())
}

async fn serve(mut stream: TcpStream, request: Request, script: Script) -> std::io::Result<()> {
    let Request {
        method,
        path,
        body: parsed,
        ..
    } = request;
    let json_kind = "application/json";
    if method != "POST" {
        return respond(&mut stream, "404 Not Found", json_kind, "{}").await;
    }
    if path.contains(":countTokens") {
        let body = json!({"totalTokens": 42}).to_string();
        return respond(&mut stream, "200 OK", json_kind, &body).await;
    }
    let reply = if path.contains(":streamGenerateContent") && offers_tools(&parsed) {
        script(&parsed)
    } else {
        Reply::text(SIDE_ANSWER)
    };
    if path.contains(":streamGenerateContent") {
        start_sse(&mut stream).await?;
        for chunk in chunks(&reply) {
            let frame = format!("data: {chunk}\r\n\r\n");
            stream.write_all(frame.as_bytes()).await?;
        }
        stream.flush().await?;
        return stream.shutdown().await;
    }
    if path.contains(":generateContent") {
        let body = whole(&reply).to_string();
        return respond(&mut stream, "200 OK", json_kind, &body).await;
    }
    respond(&mut stream, "404 Not Found", json_kind, "{}").await
}

fn part_json(part: &Part) -> Value {
    match part {
        Part::Thought(text) => json!({"text": text, "thought": true}),
        Part::Text(text) => json!({"text": text}),
        Part::Call { name, args } => json!({"functionCall": {"name": name, "args": args}}),
    }
}

fn usage() -> Value {
    json!({"promptTokenCount": 120, "candidatesTokenCount": 25, "totalTokenCount": 145})
}

/// The streamed chunks: one per part, the last carrying `finishReason`.
fn chunks(reply: &Reply) -> Vec<Value> {
    let count = reply.parts.len();
    reply
        .parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            let mut candidate =
                json!({"content": {"role": "model", "parts": [part_json(part)]}, "index": 0});
            let mut chunk = json!({"modelVersion": "gemini-2.5-flash"});
            if i + 1 == count {
                candidate["finishReason"] = json!("STOP");
                chunk["usageMetadata"] = usage();
            }
            chunk["candidates"] = json!([candidate]);
            chunk
        })
        .collect()
}

/// The same answer as one `GenerateContentResponse`.
fn whole(reply: &Reply) -> Value {
    let parts: Vec<Value> = reply.parts.iter().map(part_json).collect();
    json!({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": usage(), "modelVersion": "gemini-2.5-flash"})
}

fn last_content(request: &Value) -> &Value {
    request["contents"]
        .as_array()
        .and_then(|c| c.last())
        .unwrap_or(&Value::Null)
}

/// True when the request's last content answers a function call (the model
/// is being told how its tool call went).
pub fn answers_a_tool(request: &Value) -> bool {
    last_content(request)["parts"]
        .as_array()
        .is_some_and(|parts| parts.iter().any(|p| p.get("functionResponse").is_some()))
}

/// The function responses of the last content, as text.
pub fn tool_result_text(request: &Value) -> String {
    last_content(request)["parts"].to_string()
}

/// Whether the last content mentions `word` (the prompt sent).
pub fn prompt_mentions(request: &Value, word: &str) -> bool {
    last_content(request).to_string().contains(word)
}

/// Whether any prompt the user typed in this conversation mentions `word`:
/// the user's text parts, leaving out Gemini's own `<session_context>`
/// preamble. A resumed chat is re-prompted with the server's "continue"
/// text, so the last content alone no longer says what the turn was about.
pub fn conversation_mentions(request: &Value, word: &str) -> bool {
    let contents = request["contents"].as_array().map(Vec::as_slice);
    contents
        .unwrap_or_default()
        .iter()
        .filter(|c| c["role"] == "user")
        .filter_map(|c| c["parts"].as_array())
        .flatten()
        .filter_map(|p| p["text"].as_str())
        .any(|t| !t.contains("<session_context>") && t.contains(word))
}
