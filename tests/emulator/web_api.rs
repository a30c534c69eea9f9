//! The emulator's Web API: admission (recording, injected faults, Slack's
//! rate limits) and one function per method it answers.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Call, Ephemeral, Fault, Inner, Msg, Shared, lock};

/// The channel a call is about (`channel`, or `channel_id` for uploads).
fn p_channel(p: &Value) -> String {
    ["channel", "channel_id"]
        .iter()
        .find_map(|k| p.get(*k).and_then(Value::as_str))
        .unwrap_or_default()
        .to_owned()
}

pub(super) fn next_ts(g: &mut Inner) -> String {
    g.ts += 1;
    format!("1700000000.{:06}", g.ts)
}

fn ok(v: Value) -> Response {
    let mut v = v;
    v["ok"] = json!(true);
    axum::Json(v).into_response()
}

fn err(code: &str) -> Response {
    axum::Json(json!({"ok": false, "error": code})).into_response()
}

/// The message `ts` in `channel`, as recorded.
fn message<'a>(g: &'a mut Inner, channel: &str, ts: &str) -> Option<&'a mut Msg> {
    g.messages
        .iter_mut()
        .find(|m| m.channel == channel && m.ts == ts)
}

/// The call's Block Kit blocks (none when absent).
fn blocks(p: &Value) -> Vec<Value> {
    p.get("blocks")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// A string parameter that may be absent.
fn opt(p: &Value, k: &str) -> Option<String> {
    p.get(k).and_then(Value::as_str).map(str::to_owned)
}

fn s(v: &Value, k: &str) -> String {
    v.get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

pub(super) async fn web_api(
    State(st): State<Shared>,
    Path(method): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut params: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&body)
            .unwrap_or_else(|_| json!({"_raw": String::from_utf8_lossy(&body)}))
    };
    if let Some(obj) = params.as_object_mut() {
        for (k, v) in query {
            obj.insert(k, json!(v));
        }
    }
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .map(|h| h.trim_start_matches("Bearer ").to_owned())
        .unwrap_or_default();
    let mut g = lock(&st);
    g.seq += 1;
    let seq = g.seq;
    // Faults first.
    let fault = g.faults.iter_mut().find_map(|r| {
        let applies = r.remaining > 0
            && r.methods
                .as_ref()
                .is_none_or(|m| m.iter().any(|x| x == &method));
        if applies {
            r.remaining = r.remaining.saturating_sub(1);
            Some(r.fault)
        } else {
            None
        }
    });
    g.faults.retain(|r| r.remaining > 0);
    let channel = p_channel(&params);
    let fault = fault.or_else(|| {
        let limiter = g.limiter.as_mut()?;
        limiter
            .admit(&method, &channel)
            .err()
            .map(Fault::RateLimited)
    });
    if let Some(f) = fault {
        let status = match f {
            Fault::RateLimited(_) => 429,
            Fault::Status(s) => s,
            Fault::Refuse(_) => 200,
        };
        g.calls.push(Call {
            seq,
            method: method.clone(),
            token,
            params,
            status,
        });
        return match f {
            Fault::RateLimited(secs) => (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, secs.to_string())],
                axum::Json(json!({"ok": false, "error": "ratelimited"})),
            )
                .into_response(),
            Fault::Status(code) => (
                StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                "emulated failure",
            )
                .into_response(),
            Fault::Refuse(code) => axum::Json(json!({"ok": false, "error": code})).into_response(),
        };
    }
    g.calls.push(Call {
        seq,
        method: method.clone(),
        token,
        params: params.clone(),
        status: 200,
    });
    answer(&mut g, &method, &params)
}

/// Answers an admitted call from the emulator's state.
fn answer(g: &mut Inner, method: &str, p: &Value) -> Response {
    match method {
        "auth.test" => auth_test(),
        "apps.connections.open" => connections_open(g),
        "chat.postMessage" => post_message(g, p),
        "chat.update" => update(g, p),
        "chat.postEphemeral" => post_ephemeral(g, p),
        "reactions.add" | "reactions.remove" => react(g, method, p),
        "views.open" => views_open(g, p),
        "files.getUploadURLExternal" => upload_url(g, p),
        "files.completeUploadExternal" => complete_upload(g, p),
        _ => err("unknown_method"),
    }
}

/// `auth.test`.
fn auth_test() -> Response {
    ok(json!({
        "url": "https://emu.slack.example/",
        "team": "Emu",
        "user": "intercom",
        "team_id": "T1",
        "user_id": "UBOT",
        "bot_id": "BBOT",
    }))
}

/// `apps.connections.open`.
fn connections_open(g: &mut Inner) -> Response {
    if g.refuse_sockets {
        return err("internal_error");
    }
    g.ids += 1;
    ok(json!({"url": format!("ws://127.0.0.1:{}/link/?ticket={}", g.ws_port, g.ids)}))
}

/// `chat.postMessage`.
fn post_message(g: &mut Inner, p: &Value) -> Response {
    let ts = next_ts(g);
    let channel = s(p, "channel");
    let thread = opt(p, "thread_ts");
    let text = s(p, "text");
    g.messages.push(Msg {
        channel: channel.clone(),
        ts: ts.clone(),
        thread_ts: thread,
        user: "UBOT".into(),
        text: text.clone(),
        blocks: blocks(p),
        reactions: vec![],
        updates: 0,
        file: None,
    });
    ok(json!({
        "channel": channel,
        "ts": ts,
        "message": {"type": "message", "ts": ts, "text": text, "user": "UBOT", "bot_id": "BBOT"},
    }))
}

/// `chat.update`.
fn update(g: &mut Inner, p: &Value) -> Response {
    let (channel, ts) = (s(p, "channel"), s(p, "ts"));
    let Some(m) = message(g, &channel, &ts) else {
        return err("message_not_found");
    };
    m.text = s(p, "text");
    m.blocks = blocks(p);
    m.updates += 1;
    let text = m.text.clone();
    ok(json!({"channel": channel, "ts": ts, "text": text, "message": {"text": text}}))
}

/// `chat.postEphemeral`.
fn post_ephemeral(g: &mut Inner, p: &Value) -> Response {
    if g.no_ephemeral.contains(&s(p, "channel")) {
        return err("channel_not_found");
    }
    let e = Ephemeral {
        channel: s(p, "channel"),
        user: s(p, "user"),
        thread_ts: opt(p, "thread_ts"),
        text: format!(
            "{} {}",
            s(p, "text"),
            p.get("blocks").cloned().unwrap_or(Value::Null)
        ),
    };
    g.ephemerals.push(e);
    let ts = next_ts(g);
    ok(json!({"message_ts": ts}))
}

/// `reactions.add | reactions.remove`.
fn react(g: &mut Inner, method: &str, p: &Value) -> Response {
    let (channel, ts, name) = (s(p, "channel"), s(p, "timestamp"), s(p, "name"));
    let Some(m) = message(g, &channel, &ts) else {
        return err("message_not_found");
    };
    let has = m.reactions.contains(&name);
    if method == "reactions.add" {
        if has {
            return err("already_reacted");
        }
        m.reactions.push(name);
    } else {
        if !has {
            return err("no_reaction");
        }
        m.reactions.retain(|r| r != &name);
    }
    ok(json!({}))
}

/// `views.open`.
fn views_open(g: &mut Inner, p: &Value) -> Response {
    let view = p.get("view").cloned().unwrap_or(Value::Null);
    g.views.push(view.clone());
    let mut v = view;
    v["id"] = json!("V1");
    v["team_id"] = json!("T1");
    v["hash"] = json!("h1");
    v["state"] = json!({"values": {}});
    ok(json!({"view": v}))
}

/// `files.getUploadURLExternal`.
fn upload_url(g: &mut Inner, p: &Value) -> Response {
    g.ids += 1;
    let id = format!("F{}", g.ids);
    g.files
        .insert(id.clone(), (s(p, "filename"), String::new()));
    ok(json!({
        "upload_url": format!("http://127.0.0.1:{}/upload/{id}", g.api_port),
        "file_id": id,
    }))
}

/// `files.completeUploadExternal`.
fn complete_upload(g: &mut Inner, p: &Value) -> Response {
    let channel = s(p, "channel_id");
    let thread = opt(p, "thread_ts");
    let files = p
        .get("files")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for f in files {
        let id = s(&f, "id");
        let title = s(&f, "title");
        if let Some(entry) = g.files.get_mut(&id) {
            entry.0 = title.clone();
        }
        let ts = next_ts(g);
        g.messages.push(Msg {
            channel: channel.clone(),
            ts,
            thread_ts: thread.clone(),
            user: "UBOT".into(),
            text: format!("[file {id}] {title}"),
            blocks: vec![],
            reactions: vec![],
            updates: 0,
            file: Some(id.clone()),
        });
        out.push(json!({"id": id, "title": title}));
    }
    ok(json!({"files": out}))
}

/// A slash command's `response_url`: kept as an ephemeral to the user who
/// typed it, in the channel where they did; Slack answers `ok` as text.
pub(super) async fn respond(
    State(st): State<Shared>,
    Path(command): Path<String>,
    body: Bytes,
) -> Response {
    let mut g = lock(&st);
    let Some((user, channel)) = g.commands.get(&command).cloned() else {
        return (StatusCode::NOT_FOUND, "no such command").into_response();
    };
    let p: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    g.ephemerals.push(Ephemeral {
        channel,
        user,
        thread_ts: None,
        text: format!(
            "{} {}",
            s(&p, "text"),
            p.get("blocks").cloned().unwrap_or(Value::Null)
        ),
    });
    (StatusCode::OK, "ok").into_response()
}

pub(super) async fn upload(
    State(st): State<Shared>,
    Path(file): Path<String>,
    body: Bytes,
) -> Response {
    let mut g = lock(&st);
    let content = String::from_utf8_lossy(&body).into_owned();
    let len = content.len();
    match g.files.get_mut(&file) {
        Some(entry) => {
            entry.1 = content;
            (StatusCode::OK, format!("OK - {len}")).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no such upload").into_response(),
    }
}
