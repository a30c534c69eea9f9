//! Sending: from waiting operations to paced Web API calls, and what
//! their answers change.
//!
//! Why this exists: [`GatewayState::pump`] is the one place that decides
//! what goes to Slack next. It gathers the head of every class of every idle
//! lane, best class first and oldest first within a class, and starts each
//! whose rate-limit bucket has a token (at most one per lane); the first
//! refusal of a bucket ends that bucket's turn, so a lower class never takes
//! a token a higher one waits for. It then sleeps until the earliest token,
//! backoff or settling status line. Answers come back as
//! [`GatewayMsg::Done`]: success removes the row and remembers the message's
//! `ts`; a `429` pauses its bucket; a transient failure backs its lane off;
//! a permanent one is kept as failed and re-posted as plain text.

use std::collections::HashSet;
use std::time::Instant;

use super::bookkeeping::Write;
use super::pacing::{Bucket, Method};
use super::queue::{Class, Queued};
use super::{GatewayMsg, GatewayState, ROOT_KEY, request_key};
use crate::model::SessionId;
use crate::slack_port::{MessageBody, OutboundOp, SlackApi, SlackApiError, Snippet};

/// A call resolved against known message timestamps.
pub(super) enum Call {
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
    /// The rate-limit bucket the call draws from.
    fn bucket(&self) -> Bucket {
        let (method, channel) = match self {
            Call::Post { channel, .. } => (Method::PostMessage, channel),
            Call::Update { channel, .. } => (Method::Update, channel),
            Call::React {
                channel, add: true, ..
            } => (Method::ReactionsAdd, channel),
            Call::React { channel, .. } => (Method::ReactionsRemove, channel),
            Call::Upload { channel, .. } => (Method::Upload, channel),
        };
        Bucket::of(method, channel)
    }

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

impl GatewayState {
    pub(super) async fn ts_of(&mut self, lane: &str, key: &str) -> Option<String> {
        let k = (lane.to_owned(), key.to_owned());
        if let Some(known) = self.ts_cache.get(&k) {
            return known.clone();
        }
        match self.args.outbox.recall(lane, key).await {
            Ok(found) => {
                self.ts_cache.insert(k, found.clone());
                found
            }
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

    pub(super) async fn resolve(&mut self, lane: &str, op: &OutboundOp) -> Call {
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

    /// Starts what may go now, best first; schedules a wake-up for the
    /// earliest moment something else may.
    pub(super) async fn pump(&mut self) {
        let now = Instant::now();
        let (candidates, mut next) = self.candidates(now);
        let mut started: HashSet<String> = HashSet::new();
        let mut refused: HashSet<Bucket> = HashSet::new();
        for (class, id, lane) in candidates {
            if started.contains(&lane) {
                continue;
            }
            let Some(op) = self
                .lanes
                .get(&lane)
                .and_then(|l| l.get(id))
                .map(|q| q.entry.op.clone())
            else {
                continue;
            };
            if self.already_shown(&lane, &op) {
                self.take_done(&lane, id);
                self.delete_row(id);
                self.myself.send_message(GatewayMsg::Wake).ok();
                continue;
            }
            let call = self.resolve(&lane, &op).await;
            let bucket = call.bucket();
            if refused.contains(&bucket) {
                continue;
            }
            let taken = match class {
                Class::Decision => self.pacer.try_take(&bucket, now),
                Class::Chatter | Class::Status => self.pacer.try_take_chatter(&bucket, now),
            };
            match taken {
                Ok(()) => {
                    started.insert(lane.clone());
                    self.start(lane, id, call, bucket);
                }
                Err(at) => {
                    next = Some(next.map_or(at, |n| n.min(at)));
                    refused.insert(bucket);
                }
            }
        }
        if let Some(at) = next
            && self.wake_at.is_none_or(|w| at < w || w <= now)
        {
            self.wake_at = Some(at);
            self.myself
                .send_after(at.saturating_duration_since(now), || GatewayMsg::Wake);
        }
    }

    /// Every sendable head (class, outbox id, lane), best first, and the
    /// earliest moment a lane now held back may send.
    fn candidates(&self, now: Instant) -> (Vec<(Class, i64, String)>, Option<Instant>) {
        let mut next: Option<Instant> = None;
        let mut out = Vec::new();
        let mut later = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        for (name, lane) in &self.lanes {
            if lane.in_flight.is_some() {
                continue;
            }
            if let Some(t) = lane.not_before.filter(|t| *t > now) {
                later(t);
                continue;
            }
            if let Some(t) = lane.settles_at(now) {
                later(t);
            }
            for q in lane.heads(now) {
                out.push((q.class, q.entry.id, name.clone()));
            }
        }
        out.sort();
        (out, next)
    }

    fn start(&mut self, lane: String, id: i64, call: Call, bucket: Bucket) {
        if let Some(l) = self.lanes.get_mut(&lane) {
            l.in_flight = Some(id);
        }
        let api = self.args.api.clone();
        let me = self.myself.clone();
        tokio::spawn(async move {
            let result = call.run(api.as_ref()).await;
            let _ = me.send_message(GatewayMsg::Done {
                lane,
                id,
                bucket,
                result,
            });
        });
    }

    /// A status-line update that says what the root already shows is moot.
    fn already_shown(&self, lane: &str, op: &OutboundOp) -> bool {
        matches!(op, OutboundOp::Update { key, body, .. }
            if key == ROOT_KEY && self.shown.get(lane) == Some(body))
    }

    /// Removes a sent (or moot) operation from its lane; the caller hands
    /// its row's delete to bookkeeping.
    fn take_done(&mut self, lane: &str, id: i64) -> Option<Queued> {
        let l = self.lanes.get_mut(lane)?;
        let q = l.take(id);
        if l.is_empty() {
            self.lanes.remove(lane);
        }
        q
    }

    pub(super) async fn on_done(
        &mut self,
        lane: String,
        id: i64,
        bucket: Bucket,
        result: Result<Option<String>, SlackApiError>,
    ) {
        let Some(l) = self.lanes.get_mut(&lane) else {
            return;
        };
        if l.in_flight != Some(id) {
            tracing::error!(%lane, id, "Slack send finished for an operation that is not in flight");
            return;
        }
        l.in_flight = None;
        match result {
            Ok(ts) => {
                l.failures = 0;
                l.not_before = None;
                let Some(q) = self.take_done(&lane, id) else {
                    return;
                };
                self.note_shown(&lane, &q.entry.op);
                if let Some(ts) = ts {
                    self.on_posted(&lane, &q.entry.op, ts).await;
                }
                // After the remember: a crash never leaves a deleted row
                // whose message ts the outbox forgot.
                self.delete_row(id);
            }
            Err(SlackApiError::RateLimited { retry_after }) => {
                tracing::warn!(%lane, ?bucket, "Slack rate limit: pausing the bucket for {} ms", retry_after.as_millis());
                self.pacer.pause(&bucket, Instant::now() + retry_after);
            }
            Err(SlackApiError::Transient(e)) => {
                l.failures += 1;
                let delay = self.args.retry.delay(l.failures);
                l.not_before = Some(Instant::now() + delay);
                tracing::warn!(%lane, attempt = l.failures, "Slack call failed, retrying in {} ms: {e}", delay.as_millis());
            }
            Err(SlackApiError::Blocked(code)) => {
                // Kept at the head of its lane (what follows waits behind
                // it, in order) and tried again at the slowest retry pace
                // until someone acts; said once per streak.
                l.failures += 1;
                l.not_before = Some(Instant::now() + self.args.retry.max);
                let what = l.get(id).map(|q| q.entry.op.brief()).unwrap_or_default();
                let advice = SlackApiError::blocked_advice(&code);
                if l.failures == 1 {
                    tracing::error!(%lane, "Slack refuses the {what}: {code}; {advice}. It is kept, with what follows it, and tried again every {} s", self.args.retry.max.as_secs());
                } else {
                    tracing::debug!(%lane, attempt = l.failures, "Slack still refuses the {what}: {code}");
                }
            }
            Err(SlackApiError::Permanent(e)) => {
                l.failures = 0;
                l.not_before = None;
                let Some(q) = l.take(id) else {
                    return;
                };
                tracing::error!(%lane, op = %q.entry.op.brief(), "Slack refused a message for good: {e}; it is kept in the outbox marked failed, and what it said is in the transcript (web console, ctl log)");
                self.books.hand(Write::Fail {
                    ticket: id,
                    error: e.clone(),
                });
                self.fallback(&lane, q.entry.op, &e).await;
                if self.lanes.get(&lane).is_some_and(|l| l.is_empty()) {
                    self.lanes.remove(&lane);
                }
            }
        }
    }

    /// Remembers what a thread root shows after it was posted or updated.
    fn note_shown(&mut self, lane: &str, op: &OutboundOp) {
        match op {
            OutboundOp::Post {
                key: Some(k), body, ..
            }
            | OutboundOp::Update { key: k, body, .. }
                if k == ROOT_KEY =>
            {
                self.shown.insert(lane.to_owned(), body.clone());
            }
            _ => {}
        }
    }

    async fn fallback(&mut self, lane: &str, op: OutboundOp, error: &str) {
        // A diff too long to show inline goes out as a snippet, and the
        // request's message says it is "attached above": when Slack refuses
        // the upload for good, the thread says where the diff is instead.
        if let OutboundOp::Upload {
            channel,
            in_thread,
            snippet,
        } = &op
        {
            let op = snippet_refused(channel, *in_thread, snippet, error);
            self.enqueue(lane, op).await;
            return;
        }
        // Only a refusal of the formatting is helped by plain text: a
        // refused token or a deleted channel refuses that too, and a probe
        // saw a third top-level message posted for one session.
        if !refuses_formatting(error) {
            return;
        }
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
        // A request's buttons went with the blocks: say how to decide it
        // (a probe's request could then only be rejected, by reply).
        let decide = key
            .as_deref()
            .and_then(|k| k.strip_prefix(&request_key("")))
            .map(|id| {
                format!(
                    "\nDecide it in the web console, or with `agent-intercom ctl approve {0}` (or `reject {0}`); or reply `reject: <reason>` in this thread.",
                    escape_mrkdwn(id)
                )
            })
            .unwrap_or_default();
        // `body.text` is escaped by the renderer; Slack's error is escaped here.
        let text = format!(
            "{}\n_(shown as plain text: Slack refused the formatted message: {})_{decide}",
            body.text,
            escape_mrkdwn(error)
        );
        let op = OutboundOp::Post {
            channel,
            in_thread,
            key,
            body: MessageBody::text(text),
        };
        let q = self.written_ahead(lane, op, Instant::now());
        self.lanes.entry(lane.to_owned()).or_default().push_front(q);
    }

    /// Remembers the ts of a keyed message (in memory at once, in the
    /// outbox through bookkeeping); a root also becomes the thread.
    async fn on_posted(&mut self, lane: &str, op: &OutboundOp, ts: String) {
        let key = match op {
            OutboundOp::Post { key: Some(k), .. } | OutboundOp::Update { key: k, .. } => k,
            _ => return,
        };
        let k = (lane.to_owned(), key.clone());
        if self.ts_cache.get(&k).and_then(Option::as_deref) == Some(ts.as_str()) {
            // An update of a message whose ts is already stored: nothing new
            // to remember (this saved a store commit per update).
            return;
        }
        self.ts_cache.insert(k, Some(ts.clone()));
        // Handed over before the row's delete (bookkeeping keeps order), so
        // the outbox never forgets the ts of a message it no longer holds.
        self.books.hand(Write::Remember {
            lane: lane.to_owned(),
            key: key.clone(),
            ts: ts.clone(),
        });
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
/// Whether Slack's (or the renderer's) refusal is of a message's
/// formatting, which the same text without blocks may pass.
/// What the thread is told when Slack refused a request's snippet for good.
fn snippet_refused(channel: &str, in_thread: bool, snippet: &Snippet, error: &str) -> OutboundOp {
    let text = format!(
        ":warning: Slack refused the snippet `{}` (the diff of the request below, {} lines): {}. The whole diff is in the web console and at `GET /api/approvals/<request id>`.",
        escape_mrkdwn(&snippet.filename),
        snippet.content.lines().count(),
        escape_mrkdwn(error)
    );
    OutboundOp::Post {
        channel: channel.to_owned(),
        in_thread,
        key: None,
        body: MessageBody::text(text),
    }
}

/// Text the gateway writes itself (Slack's errors, a file name) escaped
/// for mrkdwn, as the renderer escapes everything else.
fn escape_mrkdwn(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn refuses_formatting(error: &str) -> bool {
    error.contains("invalid_blocks")
        || error.contains("invalid Block Kit")
        || error.contains("invalid_attachments")
}
