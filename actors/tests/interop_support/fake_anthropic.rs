//! A fake of the Anthropic Messages API on loopback, so the real Claude Code
//! (through claude-code-acp, `ANTHROPIC_BASE_URL` pointed here) runs whole
//! turns offline: real tool calls, real permissions, real writes.
//!
//! It speaks just enough HTTP/1.1 (`loopback_http`) for the Anthropic
//! TypeScript SDK: `POST /v1/messages` answered
//! with the streaming SSE sequence (`message_start`, `content_block_start` /
//! `content_block_delta` with `text_delta` and `input_json_delta`,
//! `content_block_stop`, `message_delta` with `stop_reason`, `message_stop`)
//! or one JSON message when `stream` is false, and
//! `POST /v1/messages/count_tokens`. What the model "says" is decided by the
//! test's script from the request body; every request body is recorded.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::loopback_http::{Listening, Request, respond, start_sse};

/// One content block of a scripted model answer.
#[derive(Debug, Clone)]
pub enum Block {
    /// Extended thinking (streamed as `thinking_delta` + `signature_delta`).
    Thinking(String),
    /// Assistant text.
    Text(String),
    /// A tool use with its whole input (streamed as `input_json_delta`s).
    ToolUse {
        /// Tool name, e.g. `mcp__acp__Write`.
        name: String,
        /// The tool's input.
        input: Value,
    },
}

/// A scripted model answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The content, in order.
    pub blocks: Vec<Block>,
    /// `end_turn` or `tool_use`.
    pub stop_reason: &'static str,
}

impl Reply {
    /// Plain text that ends the turn.
    pub fn text(text: &str) -> Reply {
        Reply {
            blocks: vec![Block::Text(text.to_owned())],
            stop_reason: "end_turn",
        }
    }

    /// A thought, some text, then one tool use.
    pub fn tool(text: &str, name: &str, input: Value) -> Reply {
        Reply {
            blocks: vec![
                Block::Thinking(format!("The user wants {name}; I should call it.")),
                Block::Text(text.to_owned()),
                Block::ToolUse {
                    name: name.to_owned(),
                    input,
                },
            ],
            stop_reason: "tool_use",
        }
    }
}

/// Decides the answer to one `POST /v1/messages` body.
pub type Script = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

/// The running fake; stops when dropped.
pub struct FakeAnthropic {
    /// `http://127.0.0.1:<port>`, for `ANTHROPIC_BASE_URL`.
    pub url: String,
    server: Listening,
}

impl FakeAnthropic {
    /// Listens on an ephemeral loopback port.
    pub async fn start(script: Script) -> FakeAnthropic {
        let server = Listening::start("fake anthropic", move |stream, request| {
            serve(stream, request, script.clone())
        })
        .await;
        FakeAnthropic {
            url: server.url.clone(),
            server,
        }
    }

    /// Every request so far as (path, body).
    pub fn requests(&self) -> Vec<(String, Value)> {
        self.server.requests()
    }

    /// The `POST /v1/messages` bodies so far.
    pub fn messages(&self) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|(p, _)| p.starts_with("/v1/messages") && !p.contains("count_tokens"))
            .map(|(_, b)| b)
            .collect()
    }
}

async fn serve(mut stream: TcpStream, request: Request, script: Script) -> std::io::Result<()> {
    let Request {
        n,
        method,
        path,
        body: parsed,
    } = request;
    if method != "POST" {
        return respond(&mut stream, "404 Not Found", "application/json", "{}").await;
    }
    if path.starts_with("/v1/messages/count_tokens") {
        let body = json!({"input_tokens": 42}).to_string();
        return respond(&mut stream, "200 OK", "application/json", &body).await;
    }
    if !path.starts_with("/v1/messages") {
        return respond(&mut stream, "404 Not Found", "application/json", "{}").await;
    }
    let model = parsed["model"].as_str().unwrap_or("claude-fake").to_owned();
    let tools = parsed["tools"].as_array().is_some_and(|t| !t.is_empty());
    let reply = if tools {
        script(&parsed)
    } else {
        // Side requests (titles, summaries): a short text answer.
        Reply::text("ok")
    };
    if parsed["stream"].as_bool().unwrap_or(false) {
        start_sse(&mut stream).await?;
        for (event, data) in sse_events(&model, n, &reply) {
            let frame = format!("event: {event}\ndata: {data}\n\n");
            stream.write_all(frame.as_bytes()).await?;
        }
        stream.flush().await?;
        return stream.shutdown().await;
    }
    let body = whole_message(&model, n, &reply).to_string();
    respond(&mut stream, "200 OK", "application/json", &body).await
}

fn usage() -> Value {
    json!({"input_tokens": 120, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
}

/// The SSE events of one streamed answer.
fn sse_events(model: &str, n: u64, reply: &Reply) -> Vec<(&'static str, String)> {
    let mut out = vec![(
        "message_start",
        json!({"type": "message_start", "message": {"id": format!("msg_fake_{n}"), "type": "message",
            "role": "assistant", "model": model, "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": usage()}})
        .to_string(),
    )];
    for (index, block) in reply.blocks.iter().enumerate() {
        let (start, deltas) = match block {
            Block::Thinking(text) => (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                vec![
                    json!({"type": "thinking_delta", "thinking": text}),
                    json!({"type": "signature_delta", "signature": "fake-signature"}),
                ],
            ),
            Block::Text(text) => (
                json!({"type": "text", "text": ""}),
                vec![json!({"type": "text_delta", "text": text})],
            ),
            Block::ToolUse { name, input } => {
                let json_text = input.to_string();
                let mid = json_text.len() / 2;
                let cut = (mid..json_text.len())
                    .find(|i| json_text.is_char_boundary(*i))
                    .unwrap_or(json_text.len());
                (
                    json!({"type": "tool_use", "id": format!("toolu_fake_{n}_{index}"), "name": name, "input": {}}),
                    vec![
                        json!({"type": "input_json_delta", "partial_json": &json_text[..cut]}),
                        json!({"type": "input_json_delta", "partial_json": &json_text[cut..]}),
                    ],
                )
            }
        };
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start})
                .to_string(),
        ));
        for delta in deltas {
            out.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}).to_string(),
            ));
        }
        out.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}).to_string(),
        ));
    }
    out.push((
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": reply.stop_reason, "stop_sequence": null},
            "usage": {"output_tokens": 25}})
        .to_string(),
    ));
    out.push(("message_stop", json!({"type": "message_stop"}).to_string()));
    out
}

/// The same answer as one JSON message (`stream: false`).
fn whole_message(model: &str, n: u64, reply: &Reply) -> Value {
    let content: Vec<Value> = reply
        .blocks
        .iter()
        .enumerate()
        .map(|(index, b)| match b {
            Block::Thinking(text) => {
                json!({"type": "thinking", "thinking": text, "signature": "fake-signature"})
            }
            Block::Text(text) => json!({"type": "text", "text": text}),
            Block::ToolUse { name, input } => {
                json!({"type": "tool_use", "id": format!("toolu_fake_{n}_{index}"), "name": name, "input": input})
            }
        })
        .collect();
    json!({"id": format!("msg_fake_{n}"), "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": reply.stop_reason, "stop_sequence": null, "usage": usage()})
}

/// True when the request's last message carries a tool result (the model is
/// being told how its tool call went).
pub fn answers_a_tool(request: &Value) -> bool {
    last_message(request)["content"]
        .as_array()
        .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"))
}

/// The tool results of the last message, as text.
pub fn tool_result_text(request: &Value) -> String {
    last_message(request)["content"].to_string()
}

/// Whether the last user message mentions `word` (the prompt sent).
pub fn prompt_mentions(request: &Value, word: &str) -> bool {
    last_message(request).to_string().contains(word)
}

fn last_message(request: &Value) -> &Value {
    request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .unwrap_or(&Value::Null)
}
