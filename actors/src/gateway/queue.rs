//! A session's queue of Slack operations: priority classes and coalescing.
//!
//! Why this exists: a busy channel must fall behind on chatter, never on
//! decisions. Every operation of a lane (a session, or `#channel` for
//! channel notices) is sorted into a [`Class`]: decisions (the thread root, a
//! request's buttons and its outcome, a diff uploaded for a request), chatter
//! (agent text, plan, tool calls, thinking, notices, reactions) and status
//! (the root's status line). A lane sends one operation at a time; the next
//! one is the oldest decision, else the oldest chatter, else a settled
//! status update, so order holds within a class and a decision overtakes
//! chatter queued before it. What can be merged is merged while it waits:
//! a newer version of a keyed message (status line, plan, tool call, a
//! request's outcome) replaces the queued one in place, and consecutive
//! agent texts become one message.

use std::collections::VecDeque;
use std::time::Instant;

use super::ROOT_KEY;
use crate::slack_port::{OutboundOp, OutboxEntry};

/// How urgent an operation is; lower sorts first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// The thread root, a request's buttons, its outcome, its diff.
    Decision,
    /// Agent text, plan, tool calls, thinking, notices, reactions.
    Chatter,
    /// The thread root's status line.
    Status,
}

impl Class {
    /// The class of an operation (a pure function of it, so rows re-read
    /// from the outbox after a restart sort the same way).
    pub fn of(op: &OutboundOp) -> Class {
        let decision_key = |k: &str| k == ROOT_KEY || k.starts_with("req:");
        match op {
            OutboundOp::Post { key: Some(k), .. } if decision_key(k) => Class::Decision,
            OutboundOp::Update { key, .. } if key == ROOT_KEY => Class::Status,
            OutboundOp::Update { key, .. } if decision_key(key) => Class::Decision,
            OutboundOp::Upload { .. } => Class::Decision,
            _ => Class::Chatter,
        }
    }

    fn index(self) -> usize {
        match self {
            Class::Decision => 0,
            Class::Chatter => 1,
            Class::Status => 2,
        }
    }
}

/// One waiting operation.
#[derive(Debug, Clone)]
pub struct Queued {
    /// The operation; its `id` is the gateway's ticket (a row read back at
    /// start keeps its row id as ticket).
    pub entry: OutboxEntry,
    /// Its class.
    pub class: Class,
    /// For agent text: the raw text (to merge the next text into it).
    pub text: Option<String>,
    /// Not before this (status lines settle); `None`: at once.
    pub ready_at: Option<Instant>,
    /// When the first version of it was queued (bounds settling).
    pub first_at: Instant,
    /// Whether its outbox row committed (write-ahead: only then may it go).
    pub persisted: bool,
}

impl Queued {
    /// A waiting operation whose outbox row is stored (read back at start).
    pub fn new(entry: OutboxEntry, now: Instant) -> Queued {
        Queued {
            class: Class::of(&entry.op),
            entry,
            text: None,
            ready_at: None,
            first_at: now,
            persisted: true,
        }
    }

    /// A new operation whose outbox row is still being written.
    pub fn unpersisted(entry: OutboxEntry, now: Instant) -> Queued {
        Queued {
            persisted: false,
            ..Queued::new(entry, now)
        }
    }

    fn key(&self) -> Option<&str> {
        match &self.entry.op {
            OutboundOp::Post { key, .. } => key.as_deref(),
            OutboundOp::Update { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// One ordering lane.
#[derive(Default)]
pub struct Lane {
    queues: [VecDeque<Queued>; 3],
    /// The outbox id being sent now.
    pub in_flight: Option<i64>,
    /// Backoff after transient failures.
    pub not_before: Option<Instant>,
    /// Consecutive transient failures.
    pub failures: u32,
}

impl Lane {
    /// Queues `q` behind its class.
    pub fn push(&mut self, q: Queued) {
        self.queues[q.class.index()].push_back(q);
    }

    /// Queues `q` first in its class (a fallback for a refused message).
    pub fn push_front(&mut self, q: Queued) {
        self.queues[q.class.index()].push_front(q);
    }

    /// Operations waiting (the one in flight included).
    pub fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Operations of `class` waiting.
    pub fn len_of(&self, class: Class) -> usize {
        self.queues[class.index()].len()
    }

    /// What may be sent next, best first: nothing while one is in flight;
    /// only the root while it is not posted (every reply needs its ts);
    /// otherwise the head of each class (a status update once settled).
    /// A head whose outbox row is not committed yet holds its class and
    /// every lower one back.
    pub fn heads(&self, now: Instant) -> Vec<&Queued> {
        if self.in_flight.is_some() {
            return Vec::new();
        }
        if let Some(first) = self.queues[0].front()
            && matches!(&first.entry.op, OutboundOp::Post { key: Some(k), .. } if k == ROOT_KEY)
        {
            return if first.persisted {
                vec![first]
            } else {
                Vec::new()
            };
        }
        let mut heads = Vec::with_capacity(self.queues.len());
        for q in self.queues.iter().filter_map(VecDeque::front) {
            if !q.persisted {
                // It goes first once stored; a lower class must not
                // overtake it meanwhile.
                break;
            }
            if q.ready_at.is_none_or(|t| t <= now) {
                heads.push(q);
            }
        }
        heads
    }

    /// The operation `ticket`'s outbox row committed.
    pub fn persisted(&mut self, ticket: i64) {
        if let Some(q) = self
            .queues
            .iter_mut()
            .flatten()
            .find(|q| q.entry.id == ticket)
        {
            q.persisted = true;
        }
    }

    /// The earliest moment a settling status update becomes ready.
    pub fn settles_at(&self, now: Instant) -> Option<Instant> {
        self.queues[Class::Status.index()]
            .front()
            .and_then(|q| q.ready_at)
            .filter(|t| *t > now)
    }

    /// The newest waiting (not in flight) operation carrying `key`, whose
    /// content a newer version may replace.
    pub fn waiting_keyed(&mut self, key: &str) -> Option<&mut Queued> {
        let in_flight = self.in_flight;
        self.queues
            .iter_mut()
            .flat_map(|q| q.iter_mut().rev())
            .find(|q| Some(q.entry.id) != in_flight && q.key() == Some(key))
    }

    /// The last chatter operation when it is agent text not yet in flight.
    pub fn waiting_text(&mut self) -> Option<&mut Queued> {
        let in_flight = self.in_flight;
        self.queues[Class::Chatter.index()]
            .back_mut()
            .filter(|q| q.text.is_some() && Some(q.entry.id) != in_flight)
    }

    /// The operation with outbox id `id`, if it waits here.
    pub fn get(&self, id: i64) -> Option<&Queued> {
        self.queues.iter().flatten().find(|q| q.entry.id == id)
    }

    /// Removes the operation `id` (it was sent, refused or is moot).
    pub fn take(&mut self, id: i64) -> Option<Queued> {
        for queue in &mut self.queues {
            if let Some(i) = queue.iter().position(|q| q.entry.id == id) {
                return queue.remove(i);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slack_port::MessageBody;

    fn entry(id: i64, op: OutboundOp) -> Queued {
        Queued::new(
            OutboxEntry {
                id,
                lane: "s-1".into(),
                op,
            },
            Instant::now(),
        )
    }

    fn post(key: Option<&str>) -> OutboundOp {
        OutboundOp::Post {
            channel: "C1".into(),
            in_thread: true,
            key: key.map(str::to_owned),
            body: MessageBody::text("x"),
        }
    }

    fn update(key: &str) -> OutboundOp {
        OutboundOp::Update {
            channel: "C1".into(),
            key: key.into(),
            body: MessageBody::text("x"),
        }
    }

    #[test]
    fn operations_sort_into_classes() {
        assert_eq!(Class::of(&post(Some(ROOT_KEY))), Class::Decision);
        assert_eq!(Class::of(&post(Some("req:s-1:r1"))), Class::Decision);
        assert_eq!(Class::of(&update("req:s-1:r1")), Class::Decision);
        assert_eq!(Class::of(&update(ROOT_KEY)), Class::Status);
        assert_eq!(Class::of(&post(None)), Class::Chatter);
        assert_eq!(Class::of(&update("plan")), Class::Chatter);
        // A hostile agent naming a tool call "req:..." stays chatter: tool
        // keys are "tool:<id>", never bare.
        assert_eq!(Class::of(&update("tool:req:x")), Class::Chatter);
    }

    #[test]
    fn a_decision_overtakes_chatter_but_not_the_root() {
        let mut lane = Lane::default();
        lane.push(entry(1, post(Some(ROOT_KEY))));
        lane.push(entry(2, post(None)));
        lane.push(entry(3, post(Some("req:a"))));
        let now = Instant::now();
        let ids = |l: &Lane| -> Vec<i64> { l.heads(now).iter().map(|q| q.entry.id).collect() };
        assert_eq!(ids(&lane), vec![1], "only the root until it is posted");
        lane.take(1);
        assert_eq!(ids(&lane), vec![3, 2], "the request before older text");
        lane.in_flight = Some(3);
        assert!(ids(&lane).is_empty(), "one at a time");
    }

    #[test]
    fn an_operation_waits_until_its_row_committed() {
        let mut lane = Lane::default();
        let now = Instant::now();
        lane.push(Queued::unpersisted(
            OutboxEntry {
                id: 1,
                lane: "s-1".into(),
                op: post(Some(ROOT_KEY)),
            },
            now,
        ));
        assert!(lane.heads(now).is_empty(), "the root is not stored yet");
        lane.persisted(1);
        assert_eq!(lane.heads(now).len(), 1);
        lane.take(1);
        lane.push(entry(2, post(None)));
        lane.push(Queued::unpersisted(
            OutboxEntry {
                id: 3,
                lane: "s-1".into(),
                op: post(Some("req:a")),
            },
            now,
        ));
        assert!(
            lane.heads(now).is_empty(),
            "older chatter does not overtake the request while it is stored"
        );
        lane.persisted(3);
        let ids: Vec<i64> = lane.heads(now).iter().map(|q| q.entry.id).collect();
        assert_eq!(ids, vec![3, 2]);
    }

    #[test]
    fn a_settling_status_waits_and_in_flight_is_never_merged_into() {
        let mut lane = Lane::default();
        let now = Instant::now();
        let mut status = entry(5, update(ROOT_KEY));
        status.ready_at = Some(now + std::time::Duration::from_secs(1));
        lane.push(status);
        assert!(lane.heads(now).is_empty());
        assert_eq!(
            lane.settles_at(now),
            Some(now + std::time::Duration::from_secs(1))
        );
        assert!(lane.waiting_keyed(ROOT_KEY).is_some());
        lane.in_flight = Some(5);
        assert!(lane.waiting_keyed(ROOT_KEY).is_none());
    }
}
