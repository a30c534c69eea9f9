//! From operator events to Slack operations.
//!
//! Why this exists: the gateway keeps a small view of each session with a
//! channel (its record, the status line, its open requests) and turns each
//! event into the operations that show it: a thread root when a session
//! starts, replies for text and notices, in-place updates for the status
//! line, plan, tool calls and a request's outcome, reactions for steering.

use std::collections::HashMap;

use super::{
    DELIVERED_MEMORY, DELIVERED_REACTION, GatewayState, QUEUED_REACTION, ROOT_KEY, THINKING_KEY,
    View, request_key,
};
use crate::model::{PendingRequest, SessionId, SessionRecord, SessionStatus};
use crate::ports::OperatorEvent;
use crate::slack_port::{MessageBody, OutboundOp, StatusLine};

impl GatewayState {
    /// The view of a session, loading it from the store when unknown.
    /// `None` when the session has no channel (or does not exist).
    pub(super) async fn view(&mut self, id: &SessionId) -> Option<&mut View> {
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

    pub(super) async fn on_event(&mut self, event: OperatorEvent) {
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
        let mut text_out: Option<String> = None;
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
            OperatorEvent::AgentText { text, .. } => text_out = Some(text),
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
                if let Some(request) = self.closed_request(cached, &request_id).await {
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
                ops.extend(self.steering_delivered(steering_id));
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
            self.unposted.retain(|(lane, _)| lane != &id.0);
            self.shown.remove(&id.0);
        } else {
            self.views.insert(id.clone(), Some(view));
        }
        for op in ops {
            self.enqueue(&id.0, op).await;
        }
        if let Some(text) = text_out {
            self.enqueue_text(&id.0, &channel, text).await;
        }
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
        match self.args.store.get_request(request_id).await {
            Ok(found) => found.map(|(r, _)| r),
            Err(e) => {
                tracing::error!(request = %request_id, "cannot read request: {e}");
                None
            }
        }
    }

    /// A steering reply reached the agent: swap its hourglass for a check
    /// mark, or remember the id until the gateway hears of the reply.
    fn steering_delivered(&mut self, steering_id: i64) -> Vec<OutboundOp> {
        let Some((channel, ts)) = self.steering.remove(&steering_id) else {
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
