//! A Slack emulator on loopback: the Web API methods agent-intercom uses
//! (axum) and a Socket Mode WebSocket endpoint (tokio-tungstenite).
//!
//! Why this exists: the Slack tests drive the real server code through the
//! real slack-morphism client, so they need something that answers like
//! Slack. Every Web API call is recorded in order (including the ones the
//! emulator failed on purpose); messages, threads, reactions, ephemerals,
//! modals and uploaded files are kept as state to assert on. Controls:
//! inject slash commands, button clicks, modal submissions and thread
//! replies as Socket Mode envelopes (acks are recorded); answer the next N
//! calls with 429 + Retry-After or with a 5xx; drop the socket; refuse new
//! connections for a while. Started with [`Emulator::start_with_limits`],
//! it also enforces Slack's published per-method rate limits ([`limits`]):
//! a call past them is answered 429 with `Retry-After`, and
//! [`Emulator::counts`] tells accepted calls and 429s per method.

#![allow(dead_code)]

pub mod limits;
mod socket;
mod web_api;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::routing::{any, post};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// Web API methods that write (faults apply to these by default).
pub const WRITE_METHODS: &[&str] = &[
    "chat.postMessage",
    "chat.update",
    "chat.postEphemeral",
    "reactions.add",
    "reactions.remove",
    "views.open",
    "files.getUploadURLExternal",
    "files.completeUploadExternal",
];

/// One recorded Web API call.
#[derive(Debug, Clone)]
pub struct Call {
    /// Order of arrival.
    pub seq: u64,
    /// e.g. `chat.postMessage`.
    pub method: String,
    /// The bearer token used.
    pub token: String,
    /// Parameters (JSON body merged with the query string).
    pub params: Value,
    /// HTTP status the emulator answered with.
    pub status: u16,
}

/// A message in a channel (bot posts, user replies, file shares).
#[derive(Debug, Clone)]
pub struct Msg {
    pub channel: String,
    pub ts: String,
    pub thread_ts: Option<String>,
    pub user: String,
    pub text: String,
    pub blocks: Vec<Value>,
    pub reactions: Vec<String>,
    /// Times it was changed with chat.update.
    pub updates: u32,
    /// For file shares: the file id.
    pub file: Option<String>,
}

impl Msg {
    /// Text plus blocks, for substring assertions.
    pub fn all_text(&self) -> String {
        format!("{}\n{}", self.text, Value::Array(self.blocks.clone()))
    }

    /// The buttons (action elements) of the message.
    pub fn buttons(&self) -> Vec<Value> {
        self.blocks
            .iter()
            .filter(|b| b["type"] == "actions")
            .flat_map(|b| b["elements"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// The button whose value ends with `|<option>` (or whose action id is `action`).
    pub fn button(&self, option_or_action: &str) -> Option<Value> {
        self.buttons().into_iter().find(|b| {
            b["value"]
                .as_str()
                .is_some_and(|v| v.ends_with(&format!("|{option_or_action}")))
                || b["action_id"] == option_or_action
        })
    }
}

/// An ephemeral message.
#[derive(Debug, Clone)]
pub struct Ephemeral {
    pub channel: String,
    pub user: String,
    pub thread_ts: Option<String>,
    pub text: String,
}

/// What to answer instead of success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// 429 with `Retry-After: secs`.
    RateLimited(u64),
    /// An HTTP error status (e.g. 503).
    Status(u16),
    /// 200 with `{"ok": false, "error": code}`: Slack refusing the call
    /// for good (`channel_not_found`, `token_revoked`).
    Refuse(&'static str),
}

#[derive(Debug)]
struct FaultRule {
    methods: Option<Vec<String>>,
    remaining: u64,
    fault: Fault,
}

enum WsCmd {
    Send(String),
    Drop,
    Disconnect,
}

#[derive(Default)]
struct Inner {
    seq: u64,
    ts: u64,
    ids: u64,
    calls: Vec<Call>,
    messages: Vec<Msg>,
    ephemerals: Vec<Ephemeral>,
    views: Vec<Value>,
    files: HashMap<String, (String, String)>,
    faults: VecDeque<FaultRule>,
    refuse_sockets: bool,
    acks: HashSet<String>,
    socket: Option<mpsc::UnboundedSender<WsCmd>>,
    connections: u32,
    api_port: u16,
    ws_port: u16,
    limiter: Option<limits::Limiter>,
    /// Slash commands by the id in their `response_url`: (user, channel).
    commands: HashMap<String, (String, String)>,
    /// Channels where `chat.postEphemeral` is refused (`channel_not_found`),
    /// as Slack refuses it in a DM the bot is not in.
    no_ephemeral: HashSet<String>,
}

/// A running emulator.
#[derive(Clone)]
pub struct Emulator {
    inner: Arc<Mutex<Inner>>,
    /// Web API base, e.g. `http://127.0.0.1:1234/api/`.
    pub api_url: String,
}

type Shared = Arc<Mutex<Inner>>;

fn lock(s: &Shared) -> MutexGuard<'_, Inner> {
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Emulator {
    /// Starts the Web API and the Socket Mode listener on loopback, with
    /// no rate limits (only injected faults refuse calls).
    pub async fn start() -> Emulator {
        Emulator::start_inner(None).await
    }

    /// Like [`Emulator::start`], enforcing `limits` like Slack does.
    pub async fn start_with_limits(limits: limits::RateLimits) -> Emulator {
        Emulator::start_inner(Some(limits::Limiter::new(limits))).await
    }

    async fn start_inner(limiter: Option<limits::Limiter>) -> Emulator {
        let inner: Shared = Arc::new(Mutex::new(Inner {
            limiter,
            ..Inner::default()
        }));
        let api = TcpListener::bind("127.0.0.1:0").await.expect("bind api");
        let ws = TcpListener::bind("127.0.0.1:0").await.expect("bind ws");
        let api_addr: SocketAddr = api.local_addr().expect("addr");
        let ws_addr: SocketAddr = ws.local_addr().expect("addr");
        {
            let mut g = lock(&inner);
            g.api_port = api_addr.port();
            g.ws_port = ws_addr.port();
        }
        let app = Router::new()
            .route("/api/{method}", any(web_api::web_api))
            .route("/upload/{file}", post(web_api::upload))
            .route("/respond/{command}", post(web_api::respond))
            .with_state(inner.clone());
        tokio::spawn(async move {
            let _ = axum::serve(api, app).await;
        });
        tokio::spawn(socket::accept_sockets(ws, inner.clone()));
        Emulator {
            inner,
            api_url: format!("http://127.0.0.1:{}/api/", api_addr.port()),
        }
    }

    fn g(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    // ---- inspection -------------------------------------------------------

    /// Every Web API call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.g().calls.clone()
    }

    /// Successful calls of one method.
    pub fn ok_calls(&self, method: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.method == method && c.status == 200)
            .collect()
    }

    /// Accepted calls and 429s (rate limits or injected) of `method`.
    pub fn counts(&self, method: &str) -> limits::Counts {
        let mut c = limits::Counts::default();
        for call in self.g().calls.iter().filter(|c| c.method == method) {
            match call.status {
                200 => c.accepted += 1,
                429 => c.limited += 1,
                _ => {}
            }
        }
        c
    }

    /// 429s answered so far, every method.
    pub fn limited_total(&self) -> u64 {
        self.g().calls.iter().filter(|c| c.status == 429).count() as u64
    }

    /// Top-level messages of a channel (thread roots and channel posts), oldest first.
    pub fn channel(&self, channel: &str) -> Vec<Msg> {
        self.g()
            .messages
            .iter()
            .filter(|m| m.channel == channel && m.thread_ts.is_none())
            .cloned()
            .collect()
    }

    /// Every message of a channel, replies included, oldest first.
    pub fn messages_in(&self, channel: &str) -> Vec<Msg> {
        self.g()
            .messages
            .iter()
            .filter(|m| m.channel == channel)
            .cloned()
            .collect()
    }

    /// Replies in a thread, oldest first (the root excluded).
    pub fn thread(&self, channel: &str, root: &str) -> Vec<Msg> {
        self.g()
            .messages
            .iter()
            .filter(|m| m.channel == channel && m.thread_ts.as_deref() == Some(root))
            .cloned()
            .collect()
    }

    /// One message by ts.
    pub fn message(&self, channel: &str, ts: &str) -> Option<Msg> {
        self.g()
            .messages
            .iter()
            .find(|m| m.channel == channel && m.ts == ts)
            .cloned()
    }

    /// Ephemeral messages so far.
    pub fn ephemerals(&self) -> Vec<Ephemeral> {
        self.g().ephemerals.clone()
    }

    /// Modals opened so far.
    pub fn views(&self) -> Vec<Value> {
        self.g().views.clone()
    }

    /// Uploaded file content by file id: (title, content).
    pub fn file(&self, id: &str) -> Option<(String, String)> {
        self.g().files.get(id).cloned()
    }

    /// Whether the server acknowledged an envelope.
    pub fn acked(&self, envelope: &str) -> bool {
        self.g().acks.contains(envelope)
    }

    /// Socket Mode connections accepted so far.
    pub fn connections(&self) -> u32 {
        self.g().connections
    }

    /// Whether a Socket Mode connection is open now.
    pub fn socket_open(&self) -> bool {
        self.g().socket.as_ref().is_some_and(|s| !s.is_closed())
    }

    // ---- faults -----------------------------------------------------------

    /// Answers the next `n` write calls with `fault`.
    pub fn fail_next(&self, n: u64, fault: Fault) {
        self.g().faults.push_back(FaultRule {
            methods: Some(WRITE_METHODS.iter().map(|s| (*s).to_owned()).collect()),
            remaining: n,
            fault,
        });
    }

    /// Answers the next `n` calls of `method` (only) with `fault`.
    pub fn fail_next_on(&self, method: &str, n: u64, fault: Fault) {
        self.g().faults.push_back(FaultRule {
            methods: Some(vec![method.to_owned()]),
            remaining: n,
            fault,
        });
    }

    /// Answers every write call with `fault` until [`Emulator::heal`].
    pub fn fail_all(&self, fault: Fault) {
        self.fail_next(u64::MAX, fault);
    }

    /// Clears all faults.
    pub fn heal(&self) {
        self.g().faults.clear();
    }

    /// Makes `apps.connections.open` fail (true) or work again (false).
    pub fn refuse_sockets(&self, refuse: bool) {
        self.g().refuse_sockets = refuse;
    }

    /// Drops the current socket without a close frame.
    pub fn drop_socket(&self) {
        if let Some(s) = self.g().socket.take() {
            let _ = s.send(WsCmd::Drop);
        }
    }

    /// Sends Slack's routine `disconnect` (refresh) frame.
    pub fn send_disconnect(&self) {
        if let Some(s) = &self.g().socket {
            let _ = s.send(WsCmd::Disconnect);
        }
    }

    // ---- injection --------------------------------------------------------

    fn next_id(&self, prefix: &str) -> String {
        let mut g = self.g();
        g.ids += 1;
        format!("{prefix}{}", g.ids)
    }

    fn envelope(&self, kind: &str, payload: Value, accepts: bool) -> String {
        let id = self.next_id("env-");
        let frame = json!({
            "type": kind,
            "envelope_id": id,
            "accepts_response_payload": accepts,
            "payload": payload,
        });
        let g = self.g();
        match &g.socket {
            Some(s) => {
                let _ = s.send(WsCmd::Send(frame.to_string()));
            }
            None => panic!("no Socket Mode connection to inject into"),
        }
        id
    }

    /// Refuses `chat.postEphemeral` in `channel` from now on, as Slack
    /// does in a DM (or a channel) the bot is not in.
    pub fn refuse_ephemerals_in(&self, channel: &str) {
        self.g().no_ephemeral.insert(channel.to_owned());
    }

    /// `/intercom <text>` typed by `user` in `channel`; returns the envelope id.
    /// Its `response_url` is this emulator's: what is posted there is kept
    /// as an ephemeral to `user` in `channel`.
    pub fn slash(&self, user: &str, channel: &str, text: &str) -> String {
        let trigger = self.next_id("trig-");
        let response_url = {
            let mut g = self.g();
            g.commands
                .insert(trigger.clone(), (user.to_owned(), channel.to_owned()));
            format!("http://127.0.0.1:{}/respond/{trigger}", g.api_port)
        };
        self.envelope(
            "slash_commands",
            json!({
                "token": "verification",
                "team_id": "T1",
                "team_domain": "emu",
                "channel_id": channel,
                "channel_name": "general",
                "user_id": user,
                "user_name": user.to_lowercase(),
                "command": "/intercom",
                "text": text,
                "api_app_id": "A1",
                "response_url": response_url,
                "trigger_id": trigger,
            }),
            true,
        )
    }

    /// `user` clicks `button` (an element from [`Msg::buttons`]) on message `msg`.
    pub fn click(&self, user: &str, msg: &Msg, button: &Value) -> String {
        let trigger = self.next_id("trig-");
        let mut message = json!({"type": "message", "ts": msg.ts, "text": msg.text, "user": "UBOT", "bot_id": "BBOT"});
        if let Some(t) = &msg.thread_ts {
            message["thread_ts"] = json!(t);
        }
        self.envelope(
            "interactive",
            json!({
                "type": "block_actions",
                "team": {"id": "T1", "domain": "emu"},
                "user": {"id": user, "username": user.to_lowercase(), "team_id": "T1"},
                "api_app_id": "A1",
                "container": {"type": "message", "message_ts": msg.ts, "channel_id": msg.channel, "is_ephemeral": false},
                "trigger_id": trigger,
                "channel": {"id": msg.channel, "name": "general"},
                "message": message,
                "response_url": "https://hooks.slack.example/actions/1",
                "actions": [{
                    "type": "button",
                    "action_id": button["action_id"],
                    "block_id": "b1",
                    "value": button["value"],
                    "text": button["text"],
                    "action_ts": "1700000000.1",
                }],
            }),
            false,
        )
    }

    /// `user` submits the last opened modal with `text` in its input.
    pub fn submit_last_view(&self, user: &str, text: &str) -> String {
        let view = self.views().last().cloned().expect("a modal was opened");
        let mut v = view.clone();
        v["id"] = json!("V1");
        v["team_id"] = json!("T1");
        v["hash"] = json!("h1");
        v["app_id"] = json!("A1");
        v["bot_id"] = json!("BBOT");
        v["state"] =
            json!({"values": {"feedback": {"text": {"type": "plain_text_input", "value": text}}}});
        self.envelope(
            "interactive",
            json!({
                "type": "view_submission",
                "team": {"id": "T1", "domain": "emu"},
                "user": {"id": user, "username": user.to_lowercase(), "team_id": "T1"},
                "api_app_id": "A1",
                "trigger_id": "trig-view",
                "view": v,
            }),
            true,
        )
    }

    /// `user` replies `text` in the thread `root` of `channel`; returns the reply's ts.
    pub fn reply(&self, user: &str, channel: &str, root: &str, text: &str) -> String {
        self.message_event(json!({"user": user}), channel, Some(root), text)
    }

    /// `user` replies in the thread and also sends it to the channel
    /// (subtype `thread_broadcast`); returns the reply's ts.
    pub fn broadcast_reply(&self, user: &str, channel: &str, root: &str, text: &str) -> String {
        self.message_event(
            json!({"user": user, "subtype": "thread_broadcast"}),
            channel,
            Some(root),
            text,
        )
    }

    /// A bot (not ours) replies in a thread; returns its ts.
    pub fn bot_reply(&self, channel: &str, root: &str, text: &str) -> String {
        self.message_event(
            json!({"user": "UOTHERBOT", "bot_id": "BOTHER", "subtype": "bot_message"}),
            channel,
            Some(root),
            text,
        )
    }

    fn message_event(
        &self,
        sender: Value,
        channel: &str,
        root: Option<&str>,
        text: &str,
    ) -> String {
        let ts = {
            let mut g = self.g();
            let ts = web_api::next_ts(&mut g);
            let user = sender["user"].as_str().unwrap_or("U?").to_owned();
            g.messages.push(Msg {
                channel: channel.to_owned(),
                ts: ts.clone(),
                thread_ts: root.map(str::to_owned),
                user,
                text: text.to_owned(),
                blocks: vec![],
                reactions: vec![],
                updates: 0,
                file: None,
            });
            ts
        };
        let mut event = json!({
            "type": "message",
            "channel": channel,
            "text": text,
            "ts": ts,
            "channel_type": "channel",
            "event_ts": ts,
        });
        if let Some(r) = root {
            event["thread_ts"] = json!(r);
        }
        if let (Some(e), Some(s)) = (event.as_object_mut(), sender.as_object()) {
            for (k, v) in s {
                e.insert(k.clone(), v.clone());
            }
        }
        let event_id = self.next_id("Ev");
        self.envelope(
            "events_api",
            json!({
                "token": "verification",
                "team_id": "T1",
                "api_app_id": "A1",
                "event": event,
                "type": "event_callback",
                "event_id": event_id,
                "event_time": 1_700_000_000,
            }),
            false,
        );
        ts
    }

    // ---- waiting ----------------------------------------------------------

    /// Polls `f` until it returns Some, or panics with `what` after `wait`.
    pub async fn until<T>(
        &self,
        what: &str,
        wait: Duration,
        mut f: impl FnMut(&Emulator) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(v) = f(self) {
                return v;
            }
            if tokio::time::Instant::now() > deadline {
                let calls: Vec<String> = self
                    .calls()
                    .iter()
                    .map(|c| format!("{} {} {}", c.seq, c.status, c.method))
                    .collect();
                let messages: Vec<String> = self
                    .g()
                    .messages
                    .iter()
                    .map(|m| format!("{} {:?} {}", m.ts, m.thread_ts, m.text))
                    .collect();
                let ephemerals = self.ephemerals();
                panic!(
                    "timed out waiting for {what}\ncalls:\n{}\nmessages:\n{messages:#?}\nephemerals:\n{ephemerals:#?}",
                    calls.join("\n"),
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
