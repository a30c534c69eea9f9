//! Taking an operation in: store it durably, then queue it on its lane, or
//! merge it into one that waits.
//!
//! Why this exists: a busy channel must not spend its Slack budget on
//! versions nobody will read. A newer version of a keyed message (status
//! line, plan, tool call, a request's outcome) replaces the waiting version
//! in place, in the outbox too, so it keeps its slot and the outbox never
//! holds both; consecutive agent texts of a session become one message while
//! they wait. Nothing is dropped that is not superseded: every other
//! operation gets its own outbox row (handed to [`super::bookkeeping`]; it
//! is sent once that row committed).

use std::time::Instant;

use super::bookkeeping::{Booked, Write};
use super::queue::{Class, Lane, Queued};
use super::{GatewayState, QueueDepth};
use crate::slack_port::{MessageBody, OutboundOp, OutboxEntry};

/// Separates merged agent texts (each was a whole message).
const TEXT_JOINER: &str = "\n\n";

impl GatewayState {
    /// Stores an operation durably and queues it on its lane (or merges it
    /// into the waiting version of the same keyed message).
    pub(super) async fn enqueue(&mut self, lane: &str, op: OutboundOp) {
        if self.replace_waiting(lane, &op).await {
            return;
        }
        self.append(lane, op, None).await;
    }

    /// Agent text: merged into the session's waiting text when the two
    /// still fit one message, else posted as its own message(s).
    pub(super) async fn enqueue_text(&mut self, lane: &str, channel: &str, text: String) {
        if self.merge_text(lane, &text).await {
            return;
        }
        let bodies = self.args.render.agent_text(&text);
        let whole = bodies.len() == 1;
        for body in bodies {
            let op = OutboundOp::Post {
                channel: channel.to_owned(),
                in_thread: true,
                key: None,
                body,
            };
            self.append(lane, op, whole.then(|| text.clone())).await;
        }
    }

    /// Operations waiting, by class.
    pub(super) fn depth(&self) -> QueueDepth {
        let sum = |c: Class| self.lanes.values().map(|l| l.len_of(c)).sum();
        QueueDepth {
            decisions: sum(Class::Decision),
            chatter: sum(Class::Chatter),
            status: sum(Class::Status),
        }
    }

    /// Hands the operation to bookkeeping (write-ahead) and queues it; it
    /// may be sent once its push committed ([`Self::on_booked`]).
    async fn append(&mut self, lane: &str, op: OutboundOp, text: Option<String>) {
        let now = Instant::now();
        let mut q = self.written_ahead(lane, op, now);
        q.text = text;
        if q.class == Class::Status && !self.pacer.policy().status_settle.is_zero() {
            q.ready_at = Some(now + self.pacer.policy().status_settle);
        }
        self.lanes.entry(lane.to_owned()).or_default().push(q);
    }

    /// An update of a keyed message whose earlier version still waits
    /// replaces that version's content (a waiting post then posts the new
    /// content). Returns whether it did.
    async fn replace_waiting(&mut self, lane: &str, op: &OutboundOp) -> bool {
        let OutboundOp::Update { key, body, .. } = op else {
            return false;
        };
        let Some(waiting) = self.lanes.get_mut(lane).and_then(|l| l.waiting_keyed(key)) else {
            return false;
        };
        let (id, merged) = (waiting.entry.id, with_body(&waiting.entry.op, body.clone()));
        let Some(merged) = merged else {
            return false;
        };
        self.store_replacement(id, &merged);
        let policy = self.pacer.policy().clone();
        let now = Instant::now();
        if let Some(q) = self.lanes.get_mut(lane).and_then(|l| l.waiting_keyed(key)) {
            q.entry.op = merged;
            if q.class == Class::Status && !policy.status_settle.is_zero() {
                let settled = now + policy.status_settle;
                q.ready_at = Some(settled.min(q.first_at + policy.status_hold_max));
            }
        }
        true
    }

    async fn merge_text(&mut self, lane: &str, text: &str) -> bool {
        let Some(waiting) = self.lanes.get_mut(lane).and_then(Lane::waiting_text) else {
            return false;
        };
        let Some(previous) = waiting.text.clone() else {
            return false;
        };
        let id = waiting.entry.id;
        let op = waiting.entry.op.clone();
        let merged_text = format!("{previous}{TEXT_JOINER}{text}");
        let mut bodies = self.args.render.agent_text(&merged_text);
        if bodies.len() != 1 {
            return false;
        }
        let Some(merged) = with_body(&op, bodies.remove(0)) else {
            return false;
        };
        self.store_replacement(id, &merged);
        if let Some(q) = self.lanes.get_mut(lane).and_then(Lane::waiting_text)
            && q.entry.id == id
        {
            q.entry.op = merged;
            q.text = Some(merged_text);
        }
        true
    }

    /// Hands the new content of a waiting operation to bookkeeping.
    fn store_replacement(&mut self, ticket: i64, op: &OutboundOp) {
        self.books.hand(Write::Replace {
            ticket,
            op: op.clone(),
        });
    }

    /// Hands the removal of a delivered (or moot) operation to bookkeeping.
    pub(super) fn delete_row(&mut self, ticket: i64) {
        self.books.hand(Write::Delete { ticket });
    }

    /// A new operation under a fresh ticket, its push handed to
    /// bookkeeping; it waits for the push to commit. Should bookkeeping be
    /// gone (a bug), it is sent without a row rather than never.
    pub(super) fn written_ahead(&mut self, lane: &str, op: OutboundOp, now: Instant) -> Queued {
        let id = self.ticket();
        let handed = self.books.hand(Write::Push {
            ticket: id,
            lane: lane.to_owned(),
            op: op.clone(),
        });
        let entry = OutboxEntry {
            id,
            lane: lane.to_owned(),
            op,
        };
        if handed {
            Queued::unpersisted(entry, now)
        } else {
            Queued::new(entry, now)
        }
    }

    /// The next operation's ticket.
    pub(super) fn ticket(&mut self) -> i64 {
        let t = self.next_ticket;
        self.next_ticket += 1;
        t
    }

    /// A bookkeeping batch committed: the operations it stored may go.
    pub(super) fn on_booked(&mut self, booked: Booked) {
        self.books.settled(booked.settled);
        for (lane, ticket) in booked.persisted {
            if let Some(l) = self.lanes.get_mut(&lane) {
                l.persisted(ticket);
            }
        }
    }
}

/// `op` with `body` as its content (posts and updates only).
fn with_body(op: &OutboundOp, body: MessageBody) -> Option<OutboundOp> {
    match op {
        OutboundOp::Post {
            channel,
            in_thread,
            key,
            ..
        } => Some(OutboundOp::Post {
            channel: channel.clone(),
            in_thread: *in_thread,
            key: key.clone(),
            body,
        }),
        OutboundOp::Update { channel, key, .. } => Some(OutboundOp::Update {
            channel: channel.clone(),
            key: key.clone(),
            body,
        }),
        _ => None,
    }
}
