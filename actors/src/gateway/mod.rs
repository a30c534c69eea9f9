//! The SlackGateway actor: the only writer to Slack.
//!
//! Operator events arrive as [`GatewayMsg::Event`] (through [`GatewaySink`]);
//! replies to slash commands and button clicks arrive as the other messages.
//! Every durable operation is written to the [`Outbox`] first and deleted only
//! once Slack accepted it, so neither a Slack outage nor a server restart
//! loses a message: on start, pending rows are re-sent in order.
//!
//! Ordering and priority ([`queue`]): each session has one *lane* (and each
//! channel one for channel notices). A lane sends one operation at a time:
//! the thread root first, then the oldest decision (a request's buttons or
//! its outcome) before the oldest chatter (text, plan, tool calls) before a
//! settled status-line update; order holds within each class. Waiting
//! operations are coalesced: a newer version of a keyed message replaces the
//! queued one, consecutive agent texts become one message.
//!
//! Pacing ([`pacing`]): a call starts only when its Slack rate-limit bucket
//! (per method; `chat.postMessage` per channel) has a token, best class
//! first across all lanes, so a busy channel falls behind on chatter, never
//! on decisions. A `429` that still comes pauses its bucket for
//! `Retry-After`; a transient failure delays its lane with exponential
//! backoff and retries forever; a permanent failure is logged, kept in the
//! outbox as failed, and a rich message that Slack refused is re-posted as
//! plain text.
//!
//! Bookkeeping ([`bookkeeping`]): the handler never awaits an outbox
//! write; it hands them to one ordered task that writes whatever waits as
//! one batch (one commit). An operation is sent only once its push
//! committed ([`GatewayMsg::Booked`]).
//!
//! Messages that later change (the thread root's status line, a permission
//! request's buttons, the plan, tool call lines) are posted under a *key*;
//! their `ts` is remembered in the outbox so updates survive restarts.

pub mod bookkeeping;
mod enqueue;
mod ephemeral;
mod events;
mod immediate;
pub mod pacing;
pub mod queue;
mod send;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;

use crate::model::{PendingRequest, SessionId, SessionRecord};
use crate::ports::{OperatorEvent, OperatorSink, SessionStore};
use crate::slack_port::{
    MessageBody, OutboundOp, Outbox, Render, SlackApi, SlackApiError, StatusLine, ThreadIndex,
};
use crate::supervisor::SupervisorMsg;
use bookkeeping::{Booked, Bookkeeper, Handoff};
use pacing::{Bucket, Pacer, PacingPolicy};
use queue::{Lane, Queued};

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
        /// The slash command's `response_url`, when the answer is to one:
        /// tried first.
        response_url: Option<String>,
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
    /// How many durable operations wait to be delivered, plus the outbox
    /// writes handed to bookkeeping and not yet committed (0: idle, and the
    /// outbox says so).
    Backlog(RpcReplyPort<usize>),
    /// How many wait, by class (benches, `/healthz`-style probes).
    Depth(RpcReplyPort<QueueDepth>),
    /// A send finished (internal).
    Done {
        /// Lane.
        lane: String,
        /// The operation's ticket.
        id: i64,
        /// The rate-limit bucket the call drew from.
        bucket: Bucket,
        /// The new message's ts, when the call created one.
        result: Result<Option<String>, SlackApiError>,
    },
    /// A bookkeeping batch committed (internal).
    Booked(Booked),
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
    /// Slack's rate limits to stay under; status-line settling.
    pub pacing: PacingPolicy,
    /// Shared by the incarnations of one gateway (clone it for restarts).
    pub handoff: Handoff,
}

/// Durable operations waiting, by class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueDepth {
    /// Thread roots, requests and their outcomes.
    pub decisions: usize,
    /// Text, plan, tool calls, notices, reactions.
    pub chatter: usize,
    /// Status-line updates.
    pub status: usize,
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
        crate::supervisor::threads::posted(self, session, channel, ts);
    }
}

/// What the gateway knows about a session with a channel.
struct View {
    record: SessionRecord,
    line: StatusLine,
    requests: HashMap<String, PendingRequest>,
    /// Which turn the thread shows, in the keys of a turn's plan, tool
    /// calls and thinking line: a new turn's go to new messages at the
    /// bottom of the thread (its tool call `t1` updated the first turn's,
    /// far up, where nobody looked). Starts at the time the view was made,
    /// so a restarted server does not reuse the keys of the one before.
    turn: u64,
}

impl View {
    /// The key of `what` (`plan`, `thinking`, `tool:<id>`) in this turn.
    fn turn_key(&self, what: &str) -> String {
        format!("{what}@{}", self.turn)
    }
}

/// The gateway's state.
pub struct GatewayState {
    myself: ActorRef<GatewayMsg>,
    args: GatewayArgs,
    lanes: HashMap<String, Lane>,
    /// `None`: a session without a channel (its events are skipped).
    views: HashMap<SessionId, Option<View>>,
    /// Known `ts` of keyed messages; `None`: known not to be posted yet
    /// (the gateway is the only writer of remembered ts, so a key found
    /// absent stays absent until it is posted: no store read per pump).
    ts_cache: HashMap<(String, String), Option<String>>,
    /// What each lane's thread root shows now (an equal update is moot).
    shown: HashMap<String, MessageBody>,
    pacer: Pacer,
    wake_at: Option<Instant>,
    /// Queued steering replies waiting for delivery: id -> (channel, ts).
    steering: HashMap<i64, (String, String)>,
    delivered: VecDeque<i64>,
    /// The outbox writes, off the handler's path.
    books: Bookkeeper,
    /// The next operation's ticket.
    next_ticket: i64,
    /// Ephemeral answers, each user in turn.
    ephemeral: ephemeral::EphemeralLane,
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
        let mut pacer = Pacer::new(args.pacing.clone());
        let ephemeral = ephemeral::EphemeralLane::start(
            args.api.clone(),
            pacer.limiter(&Bucket::of(pacing::Method::PostEphemeral, "")),
        );
        // The previous incarnation's bookkeeping finishes before the outbox
        // is read back, so nothing it still wrote is missed.
        let baton = args.handoff.take().await;
        let rows = match args.outbox.pending().await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!("cannot read the Slack outbox: {e}");
                Vec::new()
            }
        };
        if !rows.is_empty() {
            tracing::info!(count = rows.len(), "re-sending queued Slack messages");
        }
        let stored = rows.iter().map(|r| r.id);
        let books = Bookkeeper::start(args.outbox.clone(), myself.clone(), stored, baton);
        let next_ticket = rows.iter().map(|r| r.id).max().unwrap_or(0) + 1;
        let mut state = GatewayState {
            myself,
            args,
            lanes: HashMap::new(),
            views: HashMap::new(),
            ts_cache: HashMap::new(),
            shown: HashMap::new(),
            pacer,
            wake_at: None,
            steering: HashMap::new(),
            delivered: VecDeque::new(),
            books,
            next_ticket,
            ephemeral,
        };
        let now = Instant::now();
        for row in rows {
            state
                .lanes
                .entry(row.lane.clone())
                .or_default()
                .push(Queued::new(row, now));
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

    async fn post_stop(
        &self,
        _myself: ActorRef<GatewayMsg>,
        state: &mut GatewayState,
    ) -> Result<(), ActorProcessingErr> {
        state.books.close().await;
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
                response_url,
                body,
            } => state.send_ephemeral(ephemeral::Ephemeral {
                channel,
                user,
                thread_ts,
                response_url,
                body,
            }),
            GatewayMsg::OpenView {
                trigger_id,
                view,
                reply,
            } => state.open_view(trigger_id, view, reply),
            GatewayMsg::Backlog(reply) => {
                let waiting: usize = state.lanes.values().map(Lane::len).sum();
                let _ = reply.send(waiting + state.books.unsettled);
            }
            GatewayMsg::Depth(reply) => {
                let _ = reply.send(state.depth());
            }
            GatewayMsg::Done {
                lane,
                id,
                bucket,
                result,
            } => state.on_done(lane, id, bucket, result).await,
            GatewayMsg::Booked(booked) => state.on_booked(booked),
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

/// The message key of a request.
pub fn request_key(global_id: &str) -> String {
    format!("req:{global_id}")
}

#[cfg(test)]
mod tests;
