//! Socket Mode: the WebSocket that brings slash commands, button clicks,
//! modal submissions and thread replies, kept alive with reconnect and backoff.
//!
//! Why this exists (and is not slack-morphism's own listener): the server
//! must know when the connection is down — `/healthz` reports it and every
//! channel with live sessions is told when it drops and when it recovers —
//! and slack-morphism's listener hides its reconnects. So this loop opens the
//! URL with slack-morphism's `apps.connections.open`, speaks the WebSocket
//! with tokio-tungstenite, acknowledges every envelope at once, parses the
//! payloads with slack-morphism's event models (its envelope types are not
//! exported, so the thin envelope is read here), and hands them to the
//! router. A `disconnect` frame (Slack's routine refresh) reconnects quietly;
//! a dropped socket posts a notice to every channel with live sessions, and
//! another once the connection is back.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use intercom_actors::gateway::GatewayMsg;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::Message;

use super::SlackTuning;
use super::api::MorphismApi;
use super::inbound::{Ctx, Inbound};
use super::render;

/// The Socket Mode WebSocket.
type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// How many envelope ids are remembered to drop redeliveries.
const SEEN_ENVELOPES: usize = 512;

/// Where the Socket Mode connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    /// Not connected yet since start.
    Connecting,
    /// `hello` received; events flow.
    Connected,
    /// Lost; trying again with backoff.
    Reconnecting,
    /// Shut down.
    Stopped,
}

impl ConnectionState {
    /// The word `/healthz` shows.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionState::Connecting => "connecting",
            ConnectionState::Connected => "connected",
            ConnectionState::Reconnecting => "reconnecting",
            ConnectionState::Stopped => "stopped",
        }
    }
}

/// How one connection ended.
#[derive(Debug)]
enum Ended {
    /// Slack asked us to reconnect (`disconnect`): routine.
    Refresh,
    /// The socket dropped or could not be opened.
    Lost(String),
    /// Shutdown.
    Stop,
}

/// The reconnecting Socket Mode loop.
pub struct SocketLoop {
    /// Web API (connections.open, auth.test).
    pub api: Arc<MorphismApi>,
    /// Shared inbound context (bot identity, gateway, store).
    pub ctx: Arc<Ctx>,
    /// Published connection state.
    pub status: watch::Sender<ConnectionState>,
    /// Where parsed payloads go.
    pub inbound: mpsc::Sender<Inbound>,
    /// Timing.
    pub tuning: SlackTuning,
    /// Set to true to stop.
    pub stop: watch::Receiver<bool>,
}

impl SocketLoop {
    /// Runs until stopped.
    pub async fn run(mut self) {
        let mut failures: u32 = 0;
        let mut down_notified = false;
        let mut seen: VecDeque<String> = VecDeque::new();
        loop {
            if *self.stop.borrow() {
                break;
            }
            let ended = self
                .connect_once(&mut seen, &mut down_notified, &mut failures)
                .await;
            match ended {
                Ended::Stop => break,
                Ended::Refresh => {
                    tracing::info!("Slack asked to refresh the Socket Mode connection");
                    let _ = self.status.send(ConnectionState::Reconnecting);
                    continue;
                }
                Ended::Lost(why) => {
                    failures += 1;
                    let was = *self.status.borrow();
                    if was != ConnectionState::Connecting {
                        let _ = self.status.send(ConnectionState::Reconnecting);
                    }
                    tracing::warn!(
                        attempt = failures,
                        "Slack Socket Mode connection lost: {why}"
                    );
                    if was == ConnectionState::Connected && !down_notified {
                        self.notify(false).await;
                        down_notified = true;
                    }
                }
            }
            let delay = backoff(&self.tuning, failures);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.stop.changed() => break,
            }
        }
        let _ = self.status.send(ConnectionState::Stopped);
    }

    /// Posts a connection notice to every channel with a live session.
    async fn notify(&self, up: bool) {
        let sessions = match self.ctx.store.list_sessions(true).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("cannot list sessions for a connection notice: {e}");
                return;
            }
        };
        let mut channels: Vec<String> = sessions
            .into_iter()
            .filter_map(|s| s.channel_id)
            .filter(|c| !c.is_empty())
            .collect();
        channels.sort();
        channels.dedup();
        for channel in channels {
            super::dropped::send(
                &self.ctx.gateway,
                GatewayMsg::ChannelPost {
                    channel,
                    body: render::connection_notice(up),
                },
                "a connection notice",
            );
        }
    }

    async fn connect_once(
        &mut self,
        seen: &mut VecDeque<String>,
        down_notified: &mut bool,
        failures: &mut u32,
    ) -> Ended {
        let mut ws = match self.open().await {
            Ok(ws) => ws,
            Err(lost) => return lost,
        };
        let mut live = Liveness::new(&self.tuning).await;
        loop {
            let text = match self.next_text(&mut ws, &mut live).await {
                Ok(text) => text,
                Err(ended) => return ended,
            };
            let frame: Frame = match serde_json::from_str(&text) {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!("unreadable Socket Mode frame ({e}): {}", truncate(&text));
                    continue;
                }
            };
            match frame.kind.as_str() {
                "hello" => {
                    live.hello = true;
                    *failures = 0;
                    self.connected(down_notified).await;
                    continue;
                }
                "disconnect" => {
                    tracing::debug!(reason = ?frame.reason, "Socket Mode disconnect");
                    let _ = ws.close(None).await;
                    return Ended::Refresh;
                }
                _ => {}
            }
            if let Some(ended) = self.take_envelope(&mut ws, frame, seen).await {
                return ended;
            }
        }
    }

    /// The next text frame; on the way, pings Slack, and ends the
    /// connection when Slack has gone silent, never said hello, closed it,
    /// or the server stops.
    async fn next_text(&mut self, ws: &mut Socket, live: &mut Liveness) -> Result<String, Ended> {
        loop {
            let frame = tokio::select! {
                f = ws.next() => f,
                _ = live.ping.tick() => {
                    let silent = live.last_frame.elapsed();
                    if silent > self.tuning.ping_interval * 3 {
                        return Err(Ended::Lost(format!("no frame from Slack for {} s", silent.as_secs())));
                    }
                    if let Err(e) = ws.send(Message::Ping(Vec::new().into())).await {
                        return Err(Ended::Lost(format!("ping failed: {e}")));
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(live.hello_deadline), if !live.hello => {
                    return Err(Ended::Lost("no hello from Slack".into()));
                }
                _ = self.stop.changed() => {
                    let _ = ws.close(None).await;
                    return Err(Ended::Stop);
                }
            };
            live.last_frame = tokio::time::Instant::now();
            match frame {
                None => return Err(Ended::Lost("socket closed".into())),
                Some(Err(e)) => return Err(Ended::Lost(e.to_string())),
                Some(Ok(Message::Close(_))) => {
                    return Err(Ended::Lost("Slack closed the socket".into()));
                }
                Some(Ok(Message::Text(t))) => return Ok(t.to_string()),
                Some(Ok(_)) => continue,
            }
        }
    }

    /// An envelope: acknowledged first (Slack redelivers what is not acked
    /// in time), then decoded and handed on once, redeliveries dropped.
    /// `Some` ends the connection.
    async fn take_envelope(
        &mut self,
        ws: &mut Socket,
        frame: Frame,
        seen: &mut VecDeque<String>,
    ) -> Option<Ended> {
        let Some(envelope) = frame.envelope_id else {
            tracing::debug!(kind = %frame.kind, "ignoring a frame without an envelope");
            return None;
        };
        if let Err(e) = send_ack(ws, &envelope).await {
            return Some(Ended::Lost(e));
        }
        let key = delivery_key(&frame.payload, envelope);
        let inbound = decode(&frame.kind, frame.payload)?;
        if !first_delivery(seen, key) {
            return None;
        }
        if self.inbound.send(inbound).await.is_err() {
            return Some(Ended::Stop);
        }
        None
    }

    /// The bot's identity (asked once), a fresh Socket Mode URL, and the
    /// WebSocket opened on it.
    async fn open(&mut self) -> Result<Socket, Ended> {
        if self.ctx.bot_identity().is_none() {
            match self.api.identity().await {
                Ok(id) => self.ctx.set_bot_identity(id),
                Err(e) => return Err(Ended::Lost(format!("auth.test failed: {e}"))),
            }
        }
        let url = self
            .api
            .open_socket_url()
            .await
            .map_err(|e| Ended::Lost(format!("apps.connections.open failed: {e}")))?;
        match tokio_tungstenite::connect_async(url.as_str()).await {
            Ok((ws, _)) => Ok(ws),
            Err(e) => Err(Ended::Lost(format!("cannot open the WebSocket: {e}"))),
        }
    }

    /// Slack said hello: connected, and the channels told so if they heard
    /// the connection was down.
    async fn connected(&mut self, down_notified: &mut bool) {
        let _ = self.status.send(ConnectionState::Connected);
        tracing::info!("connected to Slack (Socket Mode)");
        if *down_notified {
            self.notify(true).await;
            *down_notified = false;
        }
    }
}

/// An envelope's payload as what the server handles, or `None` (logged)
/// for a type it does not handle or a payload it cannot read.
fn decode(kind: &str, payload: Option<Value>) -> Option<Inbound> {
    let payload = payload.unwrap_or(Value::Null);
    let inbound = match kind {
        "slash_commands" => serde_json::from_value(payload).map(|p| Inbound::Command(Box::new(p))),
        "interactive" => serde_json::from_value(payload).map(|p| Inbound::Interaction(Box::new(p))),
        "events_api" => serde_json::from_value(payload).map(|p| Inbound::Event(Box::new(p))),
        other => {
            tracing::debug!(kind = other, "ignoring an unknown envelope type");
            return None;
        }
    };
    inbound
        .map_err(|e| tracing::warn!(kind, "unreadable Socket Mode payload: {e}"))
        .ok()
}

/// What identifies a delivery: an Events API event's `event_id` (Slack
/// retries an event in a new envelope, with the same `event_id`: a retried
/// thread reply must not steer twice), else the envelope id.
fn delivery_key(payload: &Option<Value>, envelope: String) -> String {
    payload
        .as_ref()
        .and_then(|p| p.get("event_id"))
        .and_then(Value::as_str)
        .map_or(envelope, |id| format!("event:{id}"))
}

/// Whether `envelope` is new (remembered among the last [`SEEN_ENVELOPES`]);
/// false for a redelivery, which is dropped.
fn first_delivery(seen: &mut VecDeque<String>, envelope: String) -> bool {
    if seen.contains(&envelope) {
        tracing::debug!(%envelope, "dropping a redelivered envelope");
        return false;
    }
    seen.push_back(envelope);
    if seen.len() > SEEN_ENVELOPES {
        seen.pop_front();
    }
    true
}

/// What tells a live connection from a dead one: Slack's hello within
/// its deadline, and a frame (or a pong) at least every few pings.
struct Liveness {
    ping: tokio::time::Interval,
    last_frame: tokio::time::Instant,
    hello_deadline: tokio::time::Instant,
    hello: bool,
}

impl Liveness {
    /// For a connection just opened (the interval's first, immediate tick
    /// taken).
    async fn new(tuning: &SlackTuning) -> Self {
        let mut ping = tokio::time::interval(tuning.ping_interval);
        ping.tick().await;
        let now = tokio::time::Instant::now();
        Liveness {
            ping,
            last_frame: now,
            hello_deadline: now + tuning.hello_timeout,
            hello: false,
        }
    }
}

/// The Socket Mode envelope around a payload.
#[derive(Debug, Deserialize)]
struct Frame {
    #[serde(rename = "type")]
    kind: String,
    envelope_id: Option<String>,
    payload: Option<Value>,
    reason: Option<String>,
}

async fn send_ack<S>(ws: &mut S, envelope: &str) -> Result<(), String>
where
    S: futures::Sink<Message> + Unpin,
    S::Error: std::fmt::Display,
{
    let ack = serde_json::json!({ "envelope_id": envelope }).to_string();
    ws.send(Message::Text(ack.into()))
        .await
        .map_err(|e| format!("ack failed: {e}"))
}

fn truncate(text: &str) -> String {
    render::truncate(text, 300)
}

/// Reconnect delay after `failures` consecutive failures (0 = at once).
fn backoff(tuning: &SlackTuning, failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let factor = 1u32 << (failures - 1).min(16);
    tuning
        .reconnect_initial
        .saturating_mul(factor)
        .min(tuning.reconnect_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retried_event_in_a_new_envelope_is_the_same_delivery() {
        let mut seen = VecDeque::new();
        let event = Some(serde_json::json!({"event_id": "Ev1", "event": {"type": "message"}}));
        assert!(first_delivery(
            &mut seen,
            delivery_key(&event, "env-1".into())
        ));
        // Slack's retry: same event_id, another envelope.
        assert!(!first_delivery(
            &mut seen,
            delivery_key(&event, "env-2".into())
        ));
        // Payloads without an event id are told apart by their envelope.
        let click = Some(serde_json::json!({"type": "block_actions"}));
        assert!(first_delivery(
            &mut seen,
            delivery_key(&click, "env-3".into())
        ));
        assert!(!first_delivery(
            &mut seen,
            delivery_key(&click, "env-3".into())
        ));
        assert!(first_delivery(
            &mut seen,
            delivery_key(&click, "env-4".into())
        ));
    }

    #[test]
    fn reconnect_backoff_doubles_and_caps() {
        let t = SlackTuning {
            reconnect_initial: Duration::from_millis(100),
            reconnect_max: Duration::from_millis(350),
            ..SlackTuning::default()
        };
        let got: Vec<u128> = (0..5).map(|n| backoff(&t, n).as_millis()).collect();
        assert_eq!(got, vec![0, 100, 200, 350, 350]);
    }
}
