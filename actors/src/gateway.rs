//! The SlackGateway actor: the only writer to Slack.
//!
//! Operator events arrive as [`GatewayMsg::Event`] (through [`GatewaySink`]);
//! replies to slash commands and button clicks arrive as the other messages.
//! Every durable operation is written to the [`Outbox`] first and deleted only
//! once Slack accepted it, so neither a Slack outage nor a server restart
//! loses a message: on start, pending rows are re-sent in order.
//!
//! Ordering: each session has one *lane* (and each channel one for channel
//! notices). A lane sends one operation at a time, oldest first, so the thread
//! root goes out before any reply and replies keep their order. Lanes run
//! concurrently. A `429` pauses every lane for `Retry-After` (Slack limits per
//! token); a transient failure delays its lane with exponential backoff and
//! retries forever; a permanent failure is logged, kept in the outbox as
//! failed, and a rich message that Slack refused is re-posted as plain text.
//!
//! Messages that later change (the thread root's status line, a permission
//! request's buttons, the plan, tool call lines) are posted under a *key*;
//! their `ts` is remembered in the outbox so updates survive restarts.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;

use crate::model::{PendingRequest, SessionId, SessionRecord, SessionStatus};
use crate::ports::{OperatorEvent, OperatorSink, SessionStore};
use crate::slack_port::{
    MessageBody, OutboundOp, Outbox, OutboxEntry, Render, SlackApi, SlackApiError, Snippet,
    StatusLine, ThreadIndex,
};
use crate::supervisor::SupervisorMsg;

/// Key of the thread root message.
pub const ROOT_KEY: &str = "root";
/// The key of a thread's collapsed "thinking" line, updated in place.
pub const THINKING_KEY: &str = "thinking";
/// Reaction on a steering reply that reached the agent.
pub const DELIVERED_REACTION: &str = "white_check_mark";
/// Reaction on a steering reply waiting for the running turn.
pub const QUEUED_REACTION: &str = "hourglass_flowing_sand";
/// How many delivered steering ids are remembered for late acknowledgements.
const DELIVERED_MEMORY: usize = 1024;
/// Attempts for ephemeral messages and modals (not durable: they expire).
const IMMEDIATE_ATTEMPTS: u32 = 4;

/// Backoff for transient failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First delay.
    pub initial: Duration,
    /// Ceiling.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// Delay after the `n`-th consecutive failure (1-based).
    pub fn delay(&self, n: u32) -> Duration {
        let factor = 1u32 << n.saturating_sub(1).min(16);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// Messages the gateway handles.
pub enum GatewayMsg {
    /// Something the operator should see.
    Event(OperatorEvent),
    /// A top-level message in a channel (connection notices).
    ChannelPost {
        /// Channel id.
        channel: String,
        /// The message.
        body: MessageBody,
    },
    /// A steering reply was handed to a session: react on it.
    SteeringAck {
        /// The session.
        session_id: SessionId,
        /// The stored steering id.
        steering_id: i64,
        /// Channel of the reply.
        channel: String,
        /// The reply's ts.
        ts: String,
        /// Whether it waits behind a running turn.
        queued: bool,
    },
    /// An ephemeral message to one user (not durable).
    Ephemeral {
        /// Channel id.
        channel: String,
        /// Slack user id.
        user: String,
        /// Thread, when the user acted in one.
        thread_ts: Option<String>,
        /// The message.
        body: MessageBody,
    },
    /// Open a modal (not durable: trigger ids expire in seconds).
    OpenView {
        /// The interaction's trigger id.
        trigger_id: String,
        /// The modal view.
        view: Value,
        /// Told how it went.
        reply: Option<RpcReplyPort<Result<(), SlackApiError>>>,
    },
    /// How many durable operations wait to be delivered.
    Backlog(RpcReplyPort<usize>),
    /// A send finished (internal).
    Done {
        /// Lane.
        lane: String,
        /// Outbox id.
        id: i64,
        /// The new message's ts, when the call created one.
        result: Result<Option<String>, SlackApiError>,
    },
    /// A backoff or pause elapsed (internal).
    Wake,
    /// Panics inside the handler (supervision tests only).
    #[cfg(feature = "test-hooks")]
    PanicForTest,
}

/// What the gateway is built from (cloned when Root restarts it).
#[derive(Clone)]
pub struct GatewayArgs {
    /// The Slack Web API.
    pub api: Arc<dyn SlackApi>,
    /// Durable outbound queue.
    pub outbox: Arc<dyn Outbox>,
    /// Sessions (read records, record thread roots).
    pub store: Arc<dyn SessionStore>,
    /// Block Kit rendering.
    pub render: Arc<dyn Render>,
    /// Told about posted thread roots (the supervisor's routing index).
    pub threads: Option<Arc<dyn ThreadIndex>>,
    /// Backoff for transient failures.
    pub retry: RetryPolicy,
}

/// Forwards operator events into the gateway; never blocks.
pub struct GatewaySink(pub ActorRef<GatewayMsg>);

impl OperatorSink for GatewaySink {
    fn emit(&self, event: OperatorEvent) {
        if let Err(e) = self.0.send_message(GatewayMsg::Event(event)) {
            tracing::error!("Slack gateway is gone; event dropped: {e}");
        }
    }
}

impl ThreadIndex for ActorRef<SupervisorMsg> {
    fn thread_posted(&self, session: &SessionId, channel: &str, ts: &str) {
        if let Err(e) = self.send_message(SupervisorMsg::ThreadPosted {
            id: session.clone(),
            channel: channel.to_owned(),
            ts: ts.to_owned(),
        }) {
            // The thread is stored on the session row too (recovery reads it).
            tracing::error!(session = %session, "the supervisor did not get the session's thread ({e}); replies route after a restart");
        }
    }
}

/// One ordering lane.
#[derive(Default)]
struct Lane {
    queue: VecDeque<OutboxEntry>,
    in_flight: bool,
    not_before: Option<Instant>,
    failures: u32,
}

/// What the gateway knows about a session with a channel.
struct View {
    record: SessionRecord,
    line: StatusLine,
    requests: HashMap<String, PendingRequest>,
}

/// A call resolved against known message timestamps.
enum Call {
    Post {
        channel: String,
        thread_ts: Option<String>,
        body: MessageBody,
    },
    Update {
        channel: String,
        ts: String,
        body: MessageBody,
    },
    React {
        channel: String,
        ts: String,
        name: String,
        add: bool,
    },
    Upload {
        channel: String,
        thread_ts: Option<String>,
        snippet: Snippet,
    },
}

impl Call {
    async fn run(self, api: &dyn SlackApi) -> Result<Option<String>, SlackApiError> {
        match self {
            Call::Post {
                channel,
                thread_ts,
                body,
            } => api
                .post_message(&channel, thread_ts.as_deref(), &body)
                .await
                .map(Some),
            Call::Update { channel, ts, body } => api
                .update_message(&channel, &ts, &body)
                .await
                .map(|()| None),
            Call::React {
                channel,
                ts,
                name,
                add: true,
            } => api.add_reaction(&channel, &ts, &name).await.map(|()| None),
            Call::React {
                channel, ts, name, ..
            } => api
                .remove_reaction(&channel, &ts, &name)
                .await
                .map(|()| None),
            Call::Upload {
                channel,
                thread_ts,
                snippet,
            } => api
                .upload_snippet(&channel, thread_ts.as_deref(), &snippet)
                .await
                .map(|()| None),
        }
    }
}

/// The gateway's state.
pub struct GatewayState {
    myself: ActorRef<GatewayMsg>,
    args: GatewayArgs,
    lanes: HashMap<String, Lane>,
    /// `None`: a session without a channel (its events are skipped).
    views: HashMap<SessionId, Option<View>>,
    ts_cache: HashMap<(String, String), String>,
    paused_until: Option<Instant>,
    wake_at: Option<Instant>,
    /// Queued steering replies waiting for delivery: id -> (channel, ts).
    steering: HashMap<i64, (String, String)>,
    delivered: VecDeque<i64>,
    /// Ids for operations that could not be stored (kept in memory only).
    volatile_id: i64,
}

/// The SlackGateway handler.
pub struct SlackGateway;

impl Actor for SlackGateway {
    type Msg = GatewayMsg;
    type State = GatewayState;
    type Arguments = GatewayArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<GatewayMsg>,
        args: GatewayArgs,
    ) -> Result<GatewayState, ActorProcessingErr> {
        let mut state = GatewayState {
            myself,
            args,
            lanes: HashMap::new(),
            views: HashMap::new(),
            ts_cache: HashMap::new(),
            paused_until: None,
            wake_at: None,
            steering: HashMap::new(),
            delivered: VecDeque::new(),
            volatile_id: 0,
        };
        match state.args.outbox.pending().await {
            Ok(rows) => {
                if !rows.is_empty() {
                    tracing::info!(count = rows.len(), "re-sending queued Slack messages");
                }
                for row in rows {
                    state
                        .lanes
                        .entry(row.lane.clone())
                        .or_default()
                        .queue
                        .push_back(row);
                }
            }
            Err(e) => tracing::error!("cannot read the Slack outbox: {e}"),
        }
        Ok(state)
    }

    async fn post_start(
        &self,
        _myself: ActorRef<GatewayMsg>,
        state: &mut GatewayState,
    ) -> Result<(), ActorProcessingErr> {
        state.pump().await;
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<GatewayMsg>,
        msg: GatewayMsg,
        state: &mut GatewayState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            GatewayMsg::Event(event) => state.on_event(event).await,
            GatewayMsg::ChannelPost { channel, body } => {
                let lane = format!("#{channel}");
                let op = OutboundOp::Post {
                    channel,
                    in_thread: false,
                    key: None,
                    body,
                };
                state.enqueue(&lane, op).await;
            }
            GatewayMsg::SteeringAck {
                session_id,
                steering_id,
                channel,
                ts,
                queued,
            } => {
                state
                    .on_steering_ack(session_id, steering_id, channel, ts, queued)
                    .await
            }
            GatewayMsg::Ephemeral {
                channel,
                user,
                thread_ts,
                body,
            } => {
                let api = state.args.api.clone();
                let pause = state.paused_until;
                tokio::spawn(async move {
                    let r = immediate(pause, || {
                        api.post_ephemeral(&channel, &user, thread_ts.as_deref(), &body)
                    })
                    .await;
                    if let Err(e) = r {
                        tracing::warn!(%channel, %user, "ephemeral message not delivered: {e}");
                    }
                });
            }
            GatewayMsg::OpenView {
                trigger_id,
                view,
                reply,
            } => {
                let api = state.args.api.clone();
                let pause = state.paused_until;
                tokio::spawn(async move {
                    let r = immediate(pause, || api.open_view(&trigger_id, &view)).await;
                    if let Err(e) = &r {
                        tracing::warn!("modal not opened: {e}");
                    }
                    if let Some(reply) = reply {
                        let _ = reply.send(r);
                    }
                });
            }
            GatewayMsg::Backlog(reply) => {
                let _ = reply.send(state.lanes.values().map(|l| l.queue.len()).sum());
            }
            GatewayMsg::Done { lane, id, result } => state.on_done(lane, id, result).await,
            GatewayMsg::Wake => {
                state.wake_at = None;
            }
            #[cfg(feature = "test-hooks")]
            GatewayMsg::PanicForTest => panic!("Slack gateway panicked on request (test hook)"),
        }
        state.pump().await;
        Ok(())
    }
}

/// Runs a non-durable call, waiting out a pause and retrying a few times.
async fn immediate<F, Fut>(pause: Option<Instant>, mut call: F) -> Result<(), SlackApiError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), SlackApiError>>,
{
    if let Some(until) = pause {
        tokio::time::sleep_until(until.into()).await;
    }
    let mut attempt = 0;
    loop {
        attempt += 1;
        match call().await {
            Ok(()) => return Ok(()),
            Err(SlackApiError::RateLimited { retry_after }) if attempt < IMMEDIATE_ATTEMPTS => {
                tokio::time::sleep(retry_after).await;
            }
            Err(SlackApiError::Transient(_)) if attempt < IMMEDIATE_ATTEMPTS => {
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
            Err(e) => return Err(e),
        }
    }
}

impl GatewayState {
    /// The view of a session, loading it from the store when unknown.
    /// `None` when the session has no channel (or does not exist).
    async fn view(&mut self, id: &SessionId) -> Option<&mut View> {
        if !self.views.contains_key(id) {
            let record = match self.args.store.get_session(id).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(session = %id, "cannot read session for Slack: {e}");
                    None
                }
            };
            match record {
                Some(rec) => self.adopt(rec).await,
                None => {
                    self.views.insert(id.clone(), None);
                }
            }
        }
        self.views.get_mut(id).and_then(Option::as_mut)
    }

    /// Starts tracking a session: posts its root unless it has one.
    async fn adopt(&mut self, rec: SessionRecord) {
        let id = rec.id.clone();
        let Some(channel) = rec.channel_id.clone().filter(|c| !c.is_empty()) else {
            self.views.insert(id, None);
            return;
        };
        let line = StatusLine {
            status: rec.status,
            activity: rec.status.as_str().to_owned(),
            reason: rec.status_reason.clone(),
            usage: None,
        };
        match &rec.thread_ts {
            Some(ts) => {
                self.ts_cache
                    .insert((id.0.clone(), ROOT_KEY.to_owned()), ts.clone());
            }
            None => {
                let known = self.ts_of(&id.0, ROOT_KEY).await.is_some();
                if !known {
                    let body = self.args.render.root(&rec, &line);
                    let op = OutboundOp::Post {
                        channel,
                        in_thread: false,
                        key: Some(ROOT_KEY.to_owned()),
                        body,
                    };
                    self.enqueue(&id.0, op).await;
                }
            }
        }
        self.views.insert(
            id,
            Some(View {
                record: rec,
                line,
                requests: HashMap::new(),
            }),
        );
    }

    async fn on_event(&mut self, event: OperatorEvent) {
        if let OperatorEvent::SessionStarted { session } = event {
            let line = StatusLine {
                status: session.status,
                activity: "starting".into(),
                reason: None,
                usage: None,
            };
            let id = session.id.clone();
            self.adopt(session).await;
            if let Some(Some(v)) = self.views.get_mut(&id) {
                v.line = line;
            }
            return;
        }
        let id = event.session_id().clone();
        let render = self.args.render.clone();
        if self.view(&id).await.is_none() {
            return;
        }
        let Some(Some(mut view)) = self.views.remove(&id) else {
            return;
        };
        let channel = view.record.channel_id.clone().unwrap_or_default();
        let mut ops: Vec<OutboundOp> = Vec::new();
        let mut ended = false;
        let post = |body: MessageBody, key: Option<String>| OutboundOp::Post {
            channel: channel.clone(),
            in_thread: true,
            key,
            body,
        };
        let update = |key: String, body: MessageBody| OutboundOp::Update {
            channel: channel.clone(),
            key,
            body,
        };
        match event {
            OperatorEvent::SessionStarted { .. } => {}
            OperatorEvent::StatusChanged {
                status,
                activity,
                reason,
                ..
            } => {
                let was = view.line.status;
                view.line = StatusLine {
                    status,
                    activity,
                    reason: reason.clone(),
                    usage: view.line.usage.take(),
                };
                view.record.status = status;
                ops.push(update(
                    ROOT_KEY.to_owned(),
                    render.root(&view.record, &view.line),
                ));
                if status == SessionStatus::Stalled && was != SessionStatus::Stalled {
                    ops.push(post(render.stalled(&id, reason.as_deref()), None));
                }
            }
            OperatorEvent::AgentText { text, .. } => {
                for body in render.agent_text(&text) {
                    ops.push(post(body, None));
                }
            }
            OperatorEvent::AgentThought { text, .. } => {
                ops.push(update(THINKING_KEY.to_owned(), render.thinking(&text)));
            }
            OperatorEvent::Usage { usage, .. } => {
                view.line.usage = Some(usage.describe());
                ops.push(update(
                    ROOT_KEY.to_owned(),
                    render.root(&view.record, &view.line),
                ));
            }
            OperatorEvent::ToolCall {
                tool_call_id,
                title,
                status,
                ..
            } => ops.push(update(
                format!("tool:{tool_call_id}"),
                render.tool_call(&title, &status),
            )),
            OperatorEvent::Plan { entries, .. } => {
                ops.push(update("plan".to_owned(), render.plan(&entries)));
            }
            OperatorEvent::RequestOpened { request } => {
                let (body, snippet) = render.request(&request);
                if let Some(snippet) = snippet {
                    ops.push(OutboundOp::Upload {
                        channel: channel.clone(),
                        in_thread: true,
                        snippet,
                    });
                }
                ops.push(post(body, Some(request_key(&request.id))));
                view.requests.insert(request.id.clone(), request);
            }
            OperatorEvent::RequestClosed {
                id: request_id,
                status,
                decision,
                ..
            } => {
                let cached = view.requests.remove(&request_id);
                let request = match cached {
                    Some(r) => Some(r),
                    None => match self.args.store.get_request(&request_id).await {
                        Ok(found) => found.map(|(r, _)| r),
                        Err(e) => {
                            tracing::error!(request = %request_id, "cannot read request: {e}");
                            None
                        }
                    },
                };
                if let Some(request) = request {
                    let body = render.request_closed(&request, status, decision.as_ref());
                    ops.push(OutboundOp::Update {
                        channel: channel.clone(),
                        key: request_key(&request_id),
                        body,
                    });
                }
            }
            OperatorEvent::SteeringQueued { .. } => {}
            OperatorEvent::SteeringDelivered { steering_id, .. } => {
                match self.steering.remove(&steering_id) {
                    Some((ch, ts)) => {
                        ops.push(OutboundOp::Unreact {
                            channel: ch.clone(),
                            ts: ts.clone(),
                            name: QUEUED_REACTION.into(),
                        });
                        ops.push(OutboundOp::React {
                            channel: ch,
                            ts,
                            name: DELIVERED_REACTION.into(),
                        });
                    }
                    None => {
                        self.delivered.push_back(steering_id);
                        if self.delivered.len() > DELIVERED_MEMORY {
                            self.delivered.pop_front();
                        }
                    }
                }
            }
            OperatorEvent::Notice { level, text, .. } => {
                ops.push(post(render.notice(level, &text), None));
            }
            OperatorEvent::SessionEnded { status, reason, .. } => {
                ops.push(post(render.ended(status, reason.as_deref()), None));
                ended = true;
            }
        }
        if ended {
            // Nothing more is expected; late events reload from the store
            // and the outbox remembers every message ts.
            self.ts_cache.retain(|(lane, _), _| lane != &id.0);
        } else {
            self.views.insert(id.clone(), Some(view));
        }
        for op in ops {
            self.enqueue(&id.0, op).await;
        }
    }

    async fn on_steering_ack(
        &mut self,
        session_id: SessionId,
        steering_id: i64,
        channel: String,
        ts: String,
        queued: bool,
    ) {
        let delivered = !queued || self.delivered.contains(&steering_id);
        let name = if delivered {
            DELIVERED_REACTION
        } else {
            self.steering
                .insert(steering_id, (channel.clone(), ts.clone()));
            QUEUED_REACTION
        };
        let op = OutboundOp::React {
            channel,
            ts,
            name: name.into(),
        };
        self.enqueue(&session_id.0, op).await;
    }

    /// Stores an operation durably and queues it on its lane.
    async fn enqueue(&mut self, lane: &str, op: OutboundOp) {
        if let OutboundOp::Update { key, .. } = &op
            && self.ts_cache.contains_key(&(lane.to_owned(), key.clone()))
        {
            self.drop_superseded_update(lane, key).await;
        }
        let id = match self.args.outbox.push(lane, &op).await {
            Ok(id) => id,
            Err(e) => {
                tracing::error!(%lane, "cannot store a Slack message durably, sending it anyway: {e}");
                self.volatile_id -= 1;
                self.volatile_id
            }
        };
        self.lanes
            .entry(lane.to_owned())
            .or_default()
            .queue
            .push_back(OutboxEntry {
                id,
                lane: lane.to_owned(),
                op,
            });
    }

    /// An update of an existing message makes earlier queued updates of it moot.
    async fn drop_superseded_update(&mut self, lane: &str, key: &str) {
        let Some(l) = self.lanes.get_mut(lane) else {
            return;
        };
        let skip = usize::from(l.in_flight);
        let mut dropped = Vec::new();
        let mut kept = VecDeque::with_capacity(l.queue.len());
        for (i, e) in std::mem::take(&mut l.queue).into_iter().enumerate() {
            let superseded =
                i >= skip && matches!(&e.op, OutboundOp::Update { key: k, .. } if k == key);
            if superseded {
                dropped.push(e.id);
            } else {
                kept.push_back(e);
            }
        }
        l.queue = kept;
        for id in dropped {
            self.delete_row(id).await;
        }
    }

    async fn delete_row(&self, id: i64) {
        if id > 0
            && let Err(e) = self.args.outbox.delete(id).await
        {
            tracing::error!(
                id,
                "cannot remove a delivered Slack message from the outbox: {e}"
            );
        }
    }

    async fn ts_of(&mut self, lane: &str, key: &str) -> Option<String> {
        let k = (lane.to_owned(), key.to_owned());
        if let Some(ts) = self.ts_cache.get(&k) {
            return Some(ts.clone());
        }
        match self.args.outbox.recall(lane, key).await {
            Ok(Some(ts)) => {
                self.ts_cache.insert(k, ts.clone());
                Some(ts)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::error!(%lane, %key, "cannot read a Slack message ts: {e}");
                None
            }
        }
    }

    async fn thread_of(&mut self, lane: &str, in_thread: bool) -> Option<String> {
        if !in_thread {
            return None;
        }
        let ts = self.ts_of(lane, ROOT_KEY).await;
        if ts.is_none() {
            tracing::warn!(%lane, "no thread root known; posting at the top level");
        }
        ts
    }

    async fn resolve(&mut self, lane: &str, op: &OutboundOp) -> Call {
        match op.clone() {
            OutboundOp::Post {
                channel,
                in_thread,
                body,
                ..
            } => Call::Post {
                thread_ts: self.thread_of(lane, in_thread).await,
                channel,
                body,
            },
            OutboundOp::Update { channel, key, body } => match self.ts_of(lane, &key).await {
                Some(ts) => Call::Update { channel, ts, body },
                None => Call::Post {
                    thread_ts: self.thread_of(lane, key != ROOT_KEY).await,
                    channel,
                    body,
                },
            },
            OutboundOp::React { channel, ts, name } => Call::React {
                channel,
                ts,
                name,
                add: true,
            },
            OutboundOp::Unreact { channel, ts, name } => Call::React {
                channel,
                ts,
                name,
                add: false,
            },
            OutboundOp::Upload {
                channel,
                in_thread,
                snippet,
            } => Call::Upload {
                thread_ts: self.thread_of(lane, in_thread).await,
                channel,
                snippet,
            },
        }
    }

    /// Starts the next send on every lane that may send now; schedules a
    /// wake-up for the earliest lane that has to wait.
    async fn pump(&mut self) {
        let now = Instant::now();
        if self.paused_until.is_some_and(|t| t <= now) {
            self.paused_until = None;
        }
        let mut next: Option<Instant> = None;
        let ready: Vec<(String, OutboxEntry)> = self
            .lanes
            .iter()
            .filter(|(_, l)| !l.in_flight)
            .filter_map(|(name, l)| {
                let front = l.queue.front()?;
                let wait = match (self.paused_until, l.not_before) {
                    (Some(p), Some(n)) => Some(p.max(n)),
                    (p, n) => p.or(n),
                }
                .filter(|t| *t > now);
                match wait {
                    Some(t) => {
                        next = Some(next.map_or(t, |n| n.min(t)));
                        None
                    }
                    None => Some((name.clone(), front.clone())),
                }
            })
            .collect();
        for (lane, entry) in ready {
            let call = self.resolve(&lane, &entry.op).await;
            if let Some(l) = self.lanes.get_mut(&lane) {
                l.in_flight = true;
            }
            let api = self.args.api.clone();
            let me = self.myself.clone();
            tokio::spawn(async move {
                let result = call.run(api.as_ref()).await;
                let _ = me.send_message(GatewayMsg::Done {
                    lane,
                    id: entry.id,
                    result,
                });
            });
        }
        if let Some(at) = next
            && self.wake_at.is_none_or(|w| at < w)
        {
            self.wake_at = Some(at);
            self.myself
                .send_after(at.saturating_duration_since(now), || GatewayMsg::Wake);
        }
    }

    async fn on_done(
        &mut self,
        lane: String,
        id: i64,
        result: Result<Option<String>, SlackApiError>,
    ) {
        let Some(l) = self.lanes.get_mut(&lane) else {
            return;
        };
        l.in_flight = false;
        if l.queue.front().is_none_or(|e| e.id != id) {
            tracing::error!(%lane, id, "Slack send finished for an operation that is not at the head of its lane");
            return;
        }
        match result {
            Ok(ts) => {
                l.failures = 0;
                l.not_before = None;
                let Some(entry) = l.queue.pop_front() else {
                    return;
                };
                let empty = l.queue.is_empty();
                if empty {
                    self.lanes.remove(&lane);
                }
                if let Some(ts) = ts {
                    self.on_posted(&lane, &entry.op, ts).await;
                }
                self.delete_row(id).await;
            }
            Err(SlackApiError::RateLimited { retry_after }) => {
                let until = Instant::now() + retry_after;
                tracing::warn!(%lane, "Slack rate limit: pausing every lane for {} ms", retry_after.as_millis());
                self.paused_until = Some(self.paused_until.map_or(until, |p| p.max(until)));
            }
            Err(SlackApiError::Transient(e)) => {
                l.failures += 1;
                let delay = self.args.retry.delay(l.failures);
                l.not_before = Some(Instant::now() + delay);
                tracing::warn!(%lane, attempt = l.failures, "Slack call failed, retrying in {} ms: {e}", delay.as_millis());
            }
            Err(SlackApiError::Permanent(e)) => {
                l.failures = 0;
                l.not_before = None;
                let Some(entry) = l.queue.pop_front() else {
                    return;
                };
                tracing::error!(%lane, op = ?entry.op, "Slack refused a message for good: {e}");
                if id > 0
                    && let Err(se) = self.args.outbox.fail(id, &e).await
                {
                    tracing::error!(id, "cannot mark a Slack message failed: {se}");
                }
                self.fallback(&lane, entry.op, &e).await;
            }
        }
    }

    /// A rich message Slack refused is re-posted as plain text, first in its lane.
    async fn fallback(&mut self, lane: &str, op: OutboundOp, error: &str) {
        let (channel, in_thread, key, body) = match op {
            OutboundOp::Post {
                channel,
                in_thread,
                key,
                body,
            } => (channel, in_thread, key, body),
            OutboundOp::Update { channel, key, body } => {
                let in_thread = key != ROOT_KEY;
                (channel, in_thread, None, body)
            }
            _ => return,
        };
        if body.blocks.is_empty() {
            return;
        }
        // `body.text` is escaped by the renderer; Slack's error is escaped here.
        let error = error
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        let text = format!(
            "{}\n_(shown as plain text: Slack refused the formatted message: {error})_",
            body.text
        );
        let op = OutboundOp::Post {
            channel,
            in_thread,
            key,
            body: MessageBody::text(text),
        };
        let id = match self.args.outbox.push(lane, &op).await {
            Ok(id) => id,
            Err(e) => {
                tracing::error!(%lane, "cannot store a fallback message: {e}");
                self.volatile_id -= 1;
                self.volatile_id
            }
        };
        self.lanes
            .entry(lane.to_owned())
            .or_default()
            .queue
            .push_front(OutboxEntry {
                id,
                lane: lane.to_owned(),
                op,
            });
    }

    /// Remembers the ts of a keyed message; a root also becomes the thread.
    async fn on_posted(&mut self, lane: &str, op: &OutboundOp, ts: String) {
        let key = match op {
            OutboundOp::Post { key: Some(k), .. } | OutboundOp::Update { key: k, .. } => k,
            _ => return,
        };
        self.ts_cache
            .insert((lane.to_owned(), key.clone()), ts.clone());
        if let Err(e) = self.args.outbox.remember(lane, key, &ts).await {
            tracing::error!(%lane, %key, "cannot remember a Slack message ts: {e}");
        }
        if key != ROOT_KEY || lane.starts_with('#') {
            return;
        }
        let session = SessionId(lane.to_owned());
        let channel = op.channel();
        if let Err(e) = self.args.store.set_thread(&session, channel, &ts).await {
            tracing::warn!(%session, "cannot record the thread root: {e}");
        }
        if let Some(Some(v)) = self.views.get_mut(&session) {
            v.record.thread_ts = Some(ts.clone());
        }
        if let Some(index) = &self.args.threads {
            index.thread_posted(&session, channel, &ts);
        }
    }
}

/// The message key of a request.
pub fn request_key(global_id: &str) -> String {
    format!("req:{global_id}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;
    use crate::model::{
        Decision, OptionKind, PermissionOption, Protocol, RequestKind, RequestStatus,
    };
    use crate::ports::NoticeLevel;
    use crate::slack_port::MemoryOutbox;
    use std::sync::Mutex;

    /// Records calls; answers from a script of failures, then success.
    #[derive(Default)]
    struct FakeApi {
        calls: Mutex<Vec<String>>,
        script: Mutex<VecDeque<SlackApiError>>,
        next_ts: Mutex<u64>,
    }

    impl FakeApi {
        fn answer(&self, what: String) -> Result<String, SlackApiError> {
            if let Some(e) = self.script.lock().expect("lock").pop_front() {
                self.calls
                    .lock()
                    .expect("lock")
                    .push(format!("FAIL {what}"));
                return Err(e);
            }
            self.calls.lock().expect("lock").push(what);
            let mut n = self.next_ts.lock().expect("lock");
            *n += 1;
            Ok(format!("{}.000", *n))
        }
        fn calls(&self) -> Vec<String> {
            self.calls.lock().expect("lock").clone()
        }
        fn fail_next(&self, errors: Vec<SlackApiError>) {
            self.script.lock().expect("lock").extend(errors);
        }
    }

    #[async_trait::async_trait]
    impl SlackApi for FakeApi {
        async fn post_message(
            &self,
            channel: &str,
            thread_ts: Option<&str>,
            body: &MessageBody,
        ) -> Result<String, SlackApiError> {
            self.answer(format!("post {channel} {thread_ts:?} {}", body.text))
        }
        async fn update_message(
            &self,
            channel: &str,
            ts: &str,
            body: &MessageBody,
        ) -> Result<(), SlackApiError> {
            self.answer(format!("update {channel} {ts} {}", body.text))
                .map(|_| ())
        }
        async fn add_reaction(&self, _c: &str, ts: &str, name: &str) -> Result<(), SlackApiError> {
            self.answer(format!("react {ts} {name}")).map(|_| ())
        }
        async fn remove_reaction(
            &self,
            _c: &str,
            ts: &str,
            name: &str,
        ) -> Result<(), SlackApiError> {
            self.answer(format!("unreact {ts} {name}")).map(|_| ())
        }
        async fn upload_snippet(
            &self,
            _c: &str,
            thread_ts: Option<&str>,
            snippet: &Snippet,
        ) -> Result<(), SlackApiError> {
            self.answer(format!("upload {thread_ts:?} {}", snippet.filename))
                .map(|_| ())
        }
        async fn post_ephemeral(
            &self,
            _c: &str,
            user: &str,
            _t: Option<&str>,
            body: &MessageBody,
        ) -> Result<(), SlackApiError> {
            self.answer(format!("ephemeral {user} {}", body.text))
                .map(|_| ())
        }
        async fn open_view(&self, trigger_id: &str, _v: &Value) -> Result<(), SlackApiError> {
            self.answer(format!("view {trigger_id}")).map(|_| ())
        }
    }

    struct TextRender;

    impl Render for TextRender {
        fn root(&self, s: &SessionRecord, line: &StatusLine) -> MessageBody {
            MessageBody::text(format!("root {} [{}]", s.title, line.activity))
        }
        fn request(&self, r: &PendingRequest) -> (MessageBody, Option<Snippet>) {
            let snippet = r.diff.as_ref().filter(|d| d.len() > 10).map(|d| Snippet {
                filename: "x.diff".into(),
                title: "diff".into(),
                content: d.clone(),
            });
            (
                MessageBody {
                    text: format!("ask {}", r.title),
                    blocks: vec![serde_json::json!({"type": "actions"})],
                },
                snippet,
            )
        }
        fn request_closed(
            &self,
            r: &PendingRequest,
            status: RequestStatus,
            d: Option<&Decision>,
        ) -> MessageBody {
            MessageBody::text(format!(
                "closed {} {} {}",
                r.title,
                status.as_str(),
                d.map(|d| d.decided_by.as_str()).unwrap_or("-")
            ))
        }
        fn agent_text(&self, text: &str) -> Vec<MessageBody> {
            vec![MessageBody::text(format!("text {text}"))]
        }
        fn tool_call(&self, title: &str, status: &str) -> MessageBody {
            MessageBody::text(format!("tool {title} {status}"))
        }
        fn plan(&self, entries: &[(String, String)]) -> MessageBody {
            MessageBody::text(format!("plan {}", entries.len()))
        }
        fn notice(&self, _l: NoticeLevel, text: &str) -> MessageBody {
            MessageBody::text(format!("notice {text}"))
        }
        fn stalled(&self, _s: &SessionId, _r: Option<&str>) -> MessageBody {
            MessageBody::text("stalled")
        }
        fn ended(&self, status: SessionStatus, _r: Option<&str>) -> MessageBody {
            MessageBody::text(format!("ended {status}"))
        }
    }

    #[derive(Default)]
    struct Threads(Mutex<Vec<(SessionId, String, String)>>);

    impl ThreadIndex for Threads {
        fn thread_posted(&self, s: &SessionId, c: &str, ts: &str) {
            self.0
                .lock()
                .expect("lock")
                .push((s.clone(), c.to_owned(), ts.to_owned()));
        }
    }

    fn record(id: &str, channel: Option<&str>) -> SessionRecord {
        SessionRecord {
            id: SessionId::from(id),
            workspace: "ws".into(),
            cwd: "/tmp".into(),
            agent: "a".into(),
            protocol: Protocol::Acp,
            status: SessionStatus::Starting,
            status_reason: None,
            title: format!("title {id}"),
            owner: "U1".into(),
            acp_session_id: None,
            channel_id: channel.map(str::to_owned),
            thread_ts: None,
            restart_count: 0,
            created_at: 0,
            updated_at: 0,
            last_activity_at: 0,
        }
    }

    struct Rig {
        gw: ActorRef<GatewayMsg>,
        api: Arc<FakeApi>,
        outbox: Arc<MemoryOutbox>,
        store: Arc<MemoryStore>,
        threads: Arc<Threads>,
    }

    async fn rig_with(outbox: Arc<MemoryOutbox>, store: Arc<MemoryStore>) -> Rig {
        let api = Arc::new(FakeApi::default());
        let threads = Arc::new(Threads::default());
        let args = GatewayArgs {
            api: api.clone(),
            outbox: outbox.clone(),
            store: store.clone(),
            render: Arc::new(TextRender),
            threads: Some(threads.clone()),
            retry: RetryPolicy {
                initial: Duration::from_millis(10),
                max: Duration::from_millis(40),
            },
        };
        let (gw, _) = Actor::spawn(None, SlackGateway, args).await.expect("spawn");
        Rig {
            gw,
            api,
            outbox,
            store,
            threads,
        }
    }

    async fn rig() -> Rig {
        rig_with(Arc::new(MemoryOutbox::new()), Arc::new(MemoryStore::new())).await
    }

    impl Rig {
        async fn start(&self, id: &str, channel: Option<&str>) {
            let rec = record(id, channel);
            self.store.create_session(&rec).await.expect("create");
            self.emit(OperatorEvent::SessionStarted { session: rec });
        }
        fn emit(&self, e: OperatorEvent) {
            GatewaySink(self.gw.clone()).emit(e);
        }
        fn text(&self, id: &str, t: &str) {
            self.emit(OperatorEvent::AgentText {
                session_id: SessionId::from(id),
                text: t.into(),
            });
        }
        async fn drained(&self) {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let n = ractor::call!(self.gw, GatewayMsg::Backlog).expect("backlog");
                if n == 0 {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "never drained: {:?}",
                    self.api.calls()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    fn ok_calls(calls: &[String]) -> Vec<String> {
        calls
            .iter()
            .filter(|c| !c.starts_with("FAIL"))
            .cloned()
            .collect()
    }

    #[tokio::test]
    async fn root_goes_first_and_replies_thread_under_it_in_order() {
        let r = rig().await;
        r.start("s-1", Some("C1")).await;
        for i in 0..5 {
            r.text("s-1", &format!("m{i}"));
        }
        r.drained().await;
        let calls = r.api.calls();
        assert_eq!(calls[0], "post C1 None root title s-1 [starting]");
        for (i, c) in calls[1..].iter().enumerate() {
            assert_eq!(c, &format!("post C1 Some(\"1.000\") text m{i}"));
        }
        let rec = r
            .store
            .get_session(&SessionId::from("s-1"))
            .await
            .expect("get")
            .expect("row");
        assert_eq!(rec.thread_ts.as_deref(), Some("1.000"));
        assert_eq!(
            r.threads.0.lock().expect("lock").clone(),
            vec![(SessionId::from("s-1"), "C1".into(), "1.000".into())]
        );
        assert!(r.outbox.pending().await.expect("pending").is_empty());
    }

    #[tokio::test]
    async fn thoughts_share_one_thinking_line_and_usage_updates_the_root() {
        let r = rig().await;
        r.start("s-1", Some("C1")).await;
        for t in ["first idea", "second idea"] {
            r.emit(OperatorEvent::AgentThought {
                session_id: SessionId::from("s-1"),
                text: t.into(),
            });
        }
        r.emit(OperatorEvent::Usage {
            session_id: SessionId::from("s-1"),
            usage: crate::protocol::acp::Usage {
                used: 1000,
                size: 2000,
                cost: None,
                currency: None,
            },
        });
        r.drained().await;
        let calls = ok_calls(&r.api.calls());
        let thinking: Vec<&String> = calls.iter().filter(|c| c.contains("thinking:")).collect();
        assert_eq!(thinking.len(), 2, "{calls:?}");
        assert!(
            thinking[0].starts_with("post C1 Some")
                && thinking[0].ends_with("thinking: first idea")
        );
        assert!(
            thinking[1].starts_with("update C1") && thinking[1].ends_with("thinking: second idea")
        );
        assert!(
            calls.iter().any(|c| c.starts_with("update C1 1.000 root")),
            "{calls:?}"
        );
    }

    #[tokio::test]
    async fn sessions_without_a_channel_are_skipped() {
        let r = rig().await;
        r.start("s-1", None).await;
        r.text("s-1", "hello");
        r.text("s-unknown", "hello");
        r.drained().await;
        assert!(r.api.calls().is_empty(), "{:?}", r.api.calls());
    }

    #[tokio::test]
    async fn rate_limits_pause_and_nothing_is_lost_or_reordered() {
        let r = rig().await;
        r.api.fail_next(vec![
            SlackApiError::RateLimited {
                retry_after: Duration::from_millis(50),
            },
            SlackApiError::RateLimited {
                retry_after: Duration::from_millis(20),
            },
            SlackApiError::Transient("502".into()),
        ]);
        r.start("s-1", Some("C1")).await;
        for i in 0..10 {
            r.text("s-1", &format!("m{i}"));
        }
        r.drained().await;
        let calls = ok_calls(&r.api.calls());
        assert_eq!(calls.len(), 11, "{calls:?}");
        assert!(calls[0].starts_with("post C1 None root"));
        for (i, c) in calls[1..].iter().enumerate() {
            assert!(c.ends_with(&format!("text m{i}")), "{calls:?}");
        }
    }

    #[tokio::test]
    async fn request_lifecycle_updates_the_same_message_and_status_line() {
        let r = rig().await;
        r.start("s-1", Some("C1")).await;
        let req = PendingRequest {
            id: "s-1:req-1".into(),
            session_id: SessionId::from("s-1"),
            request_id: "req-1".into(),
            kind: RequestKind::Permission,
            title: "Write x".into(),
            diff: Some("a long diff body".into()),
            paths: vec![],
            options: vec![PermissionOption {
                id: "allow".into(),
                name: "Allow".into(),
                kind: OptionKind::AllowOnce,
            }],
            status: RequestStatus::Pending,
            wire_id: None,
            created_at: 0,
        };
        r.emit(OperatorEvent::RequestOpened {
            request: req.clone(),
        });
        r.emit(OperatorEvent::StatusChanged {
            session_id: SessionId::from("s-1"),
            status: SessionStatus::Active,
            activity: "needs input".into(),
            reason: None,
        });
        r.emit(OperatorEvent::RequestClosed {
            session_id: SessionId::from("s-1"),
            id: req.id.clone(),
            status: RequestStatus::Decided,
            decision: Some(Decision {
                option_id: "allow".into(),
                approved: true,
                reason: None,
                decided_by: "U1".into(),
                decided_at: 0,
            }),
        });
        r.drained().await;
        assert_eq!(
            r.api.calls(),
            vec![
                "post C1 None root title s-1 [starting]",
                "upload Some(\"1.000\") x.diff",
                "post C1 Some(\"1.000\") ask Write x",
                "update C1 1.000 root title s-1 [needs input]",
                "update C1 3.000 closed Write x decided U1",
            ]
        );
    }

    #[tokio::test]
    async fn permanent_failures_fall_back_to_text_and_are_kept_as_failed() {
        let r = rig().await;
        r.start("s-1", Some("C1")).await;
        r.drained().await;
        r.api
            .fail_next(vec![SlackApiError::Permanent("invalid_blocks".into())]);
        let req = PendingRequest {
            id: "s-1:req-1".into(),
            session_id: SessionId::from("s-1"),
            request_id: "req-1".into(),
            kind: RequestKind::Permission,
            title: "Run ls".into(),
            diff: None,
            paths: vec![],
            options: vec![],
            status: RequestStatus::Pending,
            wire_id: None,
            created_at: 0,
        };
        r.emit(OperatorEvent::RequestOpened { request: req });
        r.text("s-1", "after");
        r.drained().await;
        let calls = r.api.calls();
        assert!(calls[1].starts_with("FAIL post"), "{calls:?}");
        assert!(
            calls[2].contains("ask Run ls") && calls[2].contains("invalid_blocks"),
            "{calls:?}"
        );
        assert!(calls[3].ends_with("text after"), "{calls:?}");
        assert_eq!(r.outbox.failed().len(), 1);
    }

    #[tokio::test]
    async fn a_restarted_gateway_resends_the_outbox_in_order() {
        let outbox = Arc::new(MemoryOutbox::new());
        let store = Arc::new(MemoryStore::new());
        let first = rig_with(outbox.clone(), store.clone()).await;
        first.api.fail_next(
            (0..1000)
                .map(|_| SlackApiError::Transient("503".into()))
                .collect(),
        );
        first.start("s-1", Some("C1")).await;
        for i in 0..3 {
            first.text("s-1", &format!("m{i}"));
        }
        // Wait until everything is stored, then "crash".
        let deadline = Instant::now() + Duration::from_secs(5);
        while outbox.pending().await.expect("pending").len() < 4 {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        first.gw.stop(None);
        tokio::time::sleep(Duration::from_millis(20)).await;

        let second = rig_with(outbox.clone(), store.clone()).await;
        second.drained().await;
        let calls = second.api.calls();
        assert_eq!(calls[0], "post C1 None root title s-1 [starting]");
        assert_eq!(
            &calls[1..],
            &[
                "post C1 Some(\"1.000\") text m0",
                "post C1 Some(\"1.000\") text m1",
                "post C1 Some(\"1.000\") text m2",
            ]
        );
        assert!(outbox.pending().await.expect("pending").is_empty());
    }

    #[tokio::test]
    async fn steering_reactions_follow_delivery_in_either_order() {
        let r = rig().await;
        r.start("s-1", Some("C1")).await;
        let sid = SessionId::from("s-1");
        // Queued, delivered later.
        r.gw.send_message(GatewayMsg::SteeringAck {
            session_id: sid.clone(),
            steering_id: 1,
            channel: "C1".into(),
            ts: "9.1".into(),
            queued: true,
        })
        .expect("send");
        r.emit(OperatorEvent::SteeringDelivered {
            session_id: sid.clone(),
            steering_id: 1,
        });
        // Delivered before the gateway heard about the reply.
        r.emit(OperatorEvent::SteeringDelivered {
            session_id: sid.clone(),
            steering_id: 2,
        });
        r.gw.send_message(GatewayMsg::SteeringAck {
            session_id: sid,
            steering_id: 2,
            channel: "C1".into(),
            ts: "9.2".into(),
            queued: true,
        })
        .expect("send");
        r.drained().await;
        assert_eq!(
            &r.api.calls()[1..],
            &[
                "react 9.1 hourglass_flowing_sand",
                "unreact 9.1 hourglass_flowing_sand",
                "react 9.1 white_check_mark",
                "react 9.2 white_check_mark",
            ]
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let p = RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(500),
        };
        let got: Vec<u128> = (1..=5).map(|n| p.delay(n).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 500, 500]);
    }
}
