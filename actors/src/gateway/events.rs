//! From operator events to Slack operations.
//!
//! Why this exists: the gateway keeps a small view of each session with a
//! channel (its record, the status line, its open requests) and turns each
//! event into the operations that show it: a thread root when a session
//! starts, replies for text and notices, in-place updates for the status
//! line, plan, tool calls and a request's outcome, reactions for steering.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use super::bookkeeping::Write;
use super::{
    DELIVERED_MEMORY, DELIVERED_REACTION, GatewayState, QUEUED_REACTION, ROOT_KEY, THINKING_KEY,
    View, request_key,
};
use crate::model::{PendingRequest, SessionId, SessionRecord, SessionStatus};
use crate::ports::{OperatorEvent, StoreError};
use crate::slack_port::{MessageBody, OutboundOp, Render, StatusLine};

impl GatewayState {
    /// The view of a session, loading it from the store when unknown.
    /// `None` when the session has no channel (or does not exist). A read
    /// that keeps failing is not remembered: remembered as "no channel", one
    /// failed read silenced the session's thread for the gateway's lifetime.
    pub(super) async fn view(&mut self, id: &SessionId) -> Option<&mut View> {
        if !self.views.contains_key(id) {
            let read = retried("read session for Slack", id, || {
                self.args.store.get_session(id)
            })
            .await;
            match read {
                Ok(Some(rec)) => self.adopt(rec).await,
                Ok(None) => {
                    self.views.insert(id.clone(), None);
                }
                Err(()) => return None,
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
                    .insert((id.0.clone(), ROOT_KEY.to_owned()), Some(ts.clone()));
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
                turn: crate::model::now_ms().unsigned_abs(),
            }),
        );
    }

    pub(super) async fn on_event(&mut self, event: OperatorEvent) {
        if let OperatorEvent::SessionStarted { session } = event {
            self.session_started(session).await;
            return;
        }
        let id = event.session_id().clone();
        if self.view(&id).await.is_none() {
            return;
        }
        let Some(Some(mut view)) = self.views.remove(&id) else {
            return;
        };
        let channel = view.record.channel_id.clone().unwrap_or_default();
        let shown = self.show(&mut view, event).await;
        if shown.ended {
            // Nothing more is expected; late events reload from the store
            // and the outbox remembers every message ts.
            self.ts_cache.retain(|(lane, _), _| lane != &id.0);
            self.shown.remove(&id.0);
        } else {
            self.views.insert(id.clone(), Some(view));
        }
        for op in shown.ops {
            self.enqueue(&id.0, op).await;
        }
        if let Some(text) = shown.text {
            self.enqueue_text(&id.0, &channel, text).await;
        }
    }

    /// A new session: its root is posted and its status line says "starting".
    async fn session_started(&mut self, session: SessionRecord) {
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
    }

    /// What one event of a tracked session shows in its thread.
    async fn show(&mut self, view: &mut View, event: OperatorEvent) -> Shown {
        let render = self.args.render.clone();
        let to = Thread(view.record.channel_id.clone().unwrap_or_default());
        let mut shown = Shown::default();
        match event {
            OperatorEvent::SessionStarted { .. } | OperatorEvent::SteeringQueued { .. } => {}
            OperatorEvent::StatusChanged {
                status,
                activity,
                reason,
                ..
            } => shown.ops = status_changed(&*render, &to, view, status, activity, reason),
            OperatorEvent::AgentText { text, .. } => shown.text = Some(text),
            OperatorEvent::AgentThought { text, .. } => {
                shown
                    .ops
                    .push(to.update(&view.turn_key(THINKING_KEY), render.thinking(&text)));
            }
            OperatorEvent::Usage { usage, .. } => {
                view.line.usage = Some(usage.describe());
                let root = render.root(&view.record, &view.line);
                shown.ops.push(to.update(ROOT_KEY, root));
            }
            OperatorEvent::ToolCall {
                tool_call_id,
                title,
                status,
                ..
            } => {
                let body = render.tool_call(&title, &status);
                shown
                    .ops
                    .push(to.update(&view.turn_key(&format!("tool:{tool_call_id}")), body));
            }
            OperatorEvent::Plan { entries, .. } => {
                shown
                    .ops
                    .push(to.update(&view.turn_key("plan"), render.plan(&entries)));
            }
            OperatorEvent::RequestOpened { request } => {
                shown.ops = request_opened(&*render, &to, view, request);
            }
            OperatorEvent::RequestClosed {
                id,
                status,
                decision,
                ..
            } => {
                let cached = view.requests.remove(&id);
                if let Some(request) = self.closed_request(cached, &id).await {
                    let body = render.request_closed(&request, status, decision.as_ref());
                    shown.ops.push(to.update(&request_key(&id), body));
                }
            }
            OperatorEvent::SteeringDelivered { steering_id, .. } => {
                // An instruction reached the agent: a new turn.
                view.turn += 1;
                shown.ops = self.steering_delivered(&view.record, steering_id).await;
            }
            OperatorEvent::Notice { level, text, .. } => {
                shown.ops.push(to.post(render.notice(level, &text), None));
            }
            OperatorEvent::SessionEnded { status, reason, .. } => {
                shown
                    .ops
                    .push(to.post(render.ended(status, reason.as_deref()), None));
                shown.ended = true;
            }
        }
        shown
    }

    /// The request a close event is about: the view's copy, else the store's.
    async fn closed_request(
        &self,
        cached: Option<PendingRequest>,
        request_id: &str,
    ) -> Option<PendingRequest> {
        if cached.is_some() {
            return cached;
        }
        retried("read request for Slack", request_id, || {
            self.args.store.get_request(request_id)
        })
        .await
        .ok()
        .flatten()
        .map(|(r, _)| r)
    }

    /// A steering reply reached the agent: swap its hourglass for a check
    /// mark, or remember the id until the gateway hears of the reply.
    async fn steering_delivered(
        &mut self,
        session: &SessionRecord,
        steering_id: i64,
    ) -> Vec<OutboundOp> {
        let known = match self.steering.remove(&steering_id) {
            Some(found) => Some(found),
            // Queued before the server (or this gateway) restarted: the
            // reply's ts was remembered with the session's messages.
            None => match &session.channel_id {
                Some(channel) => self
                    .ts_of(&session.id.0, &steering_key(steering_id))
                    .await
                    .map(|ts| (channel.clone(), ts)),
                None => None,
            },
        };
        let Some((channel, ts)) = known else {
            self.delivered.push_back(steering_id);
            if self.delivered.len() > DELIVERED_MEMORY {
                self.delivered.pop_front();
            }
            return Vec::new();
        };
        vec![
            OutboundOp::Unreact {
                channel: channel.clone(),
                ts: ts.clone(),
                name: QUEUED_REACTION.into(),
            },
            OutboundOp::React {
                channel,
                ts,
                name: DELIVERED_REACTION.into(),
            },
        ]
    }

    pub(super) async fn on_steering_ack(
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
            // Kept durable too, so the hourglass is swapped even when the
            // reply is delivered after a restart.
            let key = steering_key(steering_id);
            self.ts_cache
                .insert((session_id.0.clone(), key.clone()), Some(ts.clone()));
            self.books.hand(Write::Remember {
                lane: session_id.0.clone(),
                key,
                ts: ts.clone(),
            });
            QUEUED_REACTION
        };
        let op = OutboundOp::React {
            channel,
            ts,
            name: name.into(),
        };
        self.enqueue(&session_id.0, op).await;
    }
}

/// The remembered-ts key of a queued steering reply (its hourglass).
fn steering_key(steering_id: i64) -> String {
    format!("steering:{steering_id}")
}

/// What an event shows: operations in order, agent text to merge into the
/// thread's running text, and whether the session is over.
#[derive(Default)]
struct Shown {
    ops: Vec<OutboundOp>,
    text: Option<String>,
    ended: bool,
}

/// A session's thread in its channel: builds the operations aimed at it.
struct Thread(String);

impl Thread {
    /// A reply in the thread; `key` names it for later updates.
    fn post(&self, body: MessageBody, key: Option<String>) -> OutboundOp {
        OutboundOp::Post {
            channel: self.0.clone(),
            in_thread: true,
            key,
            body,
        }
    }

    /// An in-place update of the thread message named `key`.
    fn update(&self, key: &str, body: MessageBody) -> OutboundOp {
        OutboundOp::Update {
            channel: self.0.clone(),
            key: key.to_owned(),
            body,
        }
    }
}

/// The status line changed: the root shows it; a session that just stalled
/// also gets the stall alert with its buttons.
fn status_changed(
    render: &dyn Render,
    to: &Thread,
    view: &mut View,
    status: SessionStatus,
    activity: String,
    reason: Option<String>,
) -> Vec<OutboundOp> {
    let was = view.line.status;
    view.line = StatusLine {
        status,
        activity,
        reason: reason.clone(),
        usage: view.line.usage.take(),
    };
    view.record.status = status;
    let mut ops = vec![to.update(ROOT_KEY, render.root(&view.record, &view.line))];
    if status == SessionStatus::Stalled && was != SessionStatus::Stalled {
        ops.push(to.post(render.stalled(&view.record.id, reason.as_deref()), None));
    }
    ops
}

/// A request opened: its diff as a snippet (when too long for a message),
/// then the message with its buttons; the view remembers it for the outcome.
fn request_opened(
    render: &dyn Render,
    to: &Thread,
    view: &mut View,
    request: PendingRequest,
) -> Vec<OutboundOp> {
    let (body, snippet) = render.request(&request);
    let mut ops = Vec::with_capacity(2);
    if let Some(snippet) = snippet {
        ops.push(OutboundOp::Upload {
            channel: to.0.clone(),
            in_thread: true,
            snippet,
        });
    }
    ops.push(to.post(body, Some(request_key(&request.id))));
    view.requests.insert(request.id.clone(), request);
    ops
}

/// Pauses between the tries of a store read the gateway depends on (a
/// session's channel, a closed request's buttons): a busy or briefly
/// unreadable database should not cost the operator what it shows.
pub(super) const READ_RETRIES: [Duration; 3] = [
    Duration::from_millis(20),
    Duration::from_millis(100),
    Duration::from_millis(400),
];

/// Runs `read` until it succeeds or [`READ_RETRIES`] are spent; logs each
/// failure with `what` and `id`. `Err(())` when every try failed.
async fn retried<T, F, Fut>(what: &str, id: impl Display, mut read: F) -> Result<T, ()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    for pause in READ_RETRIES.iter().map(Some).chain([None]) {
        match read().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                tracing::error!(id = %id, "cannot {what}: {e}");
                match pause {
                    Some(p) => tokio::time::sleep(*p).await,
                    None => return Err(()),
                }
            }
        }
    }
    Err(())
}
