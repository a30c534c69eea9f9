//! The gateway's outbox bookkeeping: one ordered task that writes whatever
//! waits as one batch, so the gateway never waits on a commit.
//!
//! Why this exists: the gateway used to await every outbox write inside its
//! message handler (a push before each send, a delete and a remember after
//! it, a replace per coalesced update). Each await was a commit of its own,
//! because nothing else was queued at that moment, so under a hundred busy
//! sessions the gateway was a serial chain of commits and a request's
//! buttons waited behind every other session's bookkeeping. Now the handler
//! hands each write to this task and moves on; the task takes everything
//! that waits and applies it with one [`Outbox::apply`] (one commit).
//!
//! Guarantees kept:
//! - *write-ahead*: the gateway identifies an operation by a *ticket* (its
//!   own number) and sends it only after the task reported its push
//!   committed ([`GatewayMsg::Booked`]), so a crash re-sends it. An
//!   operation whose push is still waiting is lost by a crash just as the
//!   event it came from (in the gateway's mailbox) always was: Slack never
//!   saw it;
//! - *order*: one task, first in first out, one batch at a time; a batch
//!   commits as a unit, so after a crash the outbox holds a prefix of what
//!   was handed over (a message's `ts` is remembered before, or with, the
//!   delete of its row, never after);
//! - *delete after Slack accepted*: deletes are only handed over after a
//!   successful call, which only starts after its push committed;
//! - *nothing lost silently*: a batch that fails is retried write by write
//!   with backoff; what still fails is logged (a push that cannot be stored
//!   is sent anyway, as before).
//!
//! The task maps tickets to outbox row ids; a replace of an operation whose
//! push waits in the same batch is folded into that push. Between gateway
//! incarnations (a restart after a panic) a [`Handoff`] makes the new one
//! wait until the old task wrote everything it was given before it reads
//! the outbox back.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use tokio::sync::{Mutex, OwnedMutexGuard, mpsc};
use tokio::task::JoinHandle;

use super::{GatewayMsg, RetryPolicy};
use crate::slack_port::{OutboundOp, Outbox, OutboxWrite};

/// The most writes one batch takes.
const MAX_BATCH: usize = 256;
/// Attempts per write once its batch failed.
const ATTEMPTS: u32 = 4;
/// Delays between those attempts: 50, 100, 200 ms.
const RETRY: RetryPolicy = RetryPolicy {
    initial: Duration::from_millis(50),
    max: Duration::from_millis(200),
};

/// Passed from one gateway incarnation to the next (it lives in the
/// gateway's arguments): held by the running bookkeeping task, so a new
/// incarnation reads the outbox only after the old task has finished.
#[derive(Clone, Default)]
pub struct Handoff(Arc<Mutex<()>>);

impl Handoff {
    /// Waits until no earlier bookkeeping task runs; the guard is the
    /// caller's until its own task ends.
    pub(super) async fn take(&self) -> OwnedMutexGuard<()> {
        Arc::clone(&self.0).lock_owned().await
    }
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handoff")
    }
}

/// A bookkeeping write, in the gateway's terms (tickets, not row ids).
#[derive(Debug)]
pub(super) enum Write {
    /// Store a new operation (write-ahead).
    Push {
        ticket: i64,
        lane: String,
        op: OutboundOp,
    },
    /// A waiting operation's new content.
    Replace { ticket: i64, op: OutboundOp },
    /// Slack accepted it (or it is moot).
    Delete { ticket: i64 },
    /// Slack refused it for good.
    Fail { ticket: i64, error: String },
    /// A keyed message's `ts`.
    Remember {
        lane: String,
        key: String,
        ts: String,
    },
}

/// What a batch did, reported to the gateway.
#[derive(Debug, Default)]
pub struct Booked {
    /// Pushes now committed (or given up on: sent without a row), as
    /// `(lane, ticket)`; their operations may be sent.
    pub(super) persisted: Vec<(String, i64)>,
    /// How many handed-over writes this batch settled.
    pub(super) settled: usize,
}

/// The gateway's handle on its bookkeeping task.
pub(super) struct Bookkeeper {
    jobs: Option<mpsc::UnboundedSender<Write>>,
    task: Option<JoinHandle<()>>,
    /// Writes handed over and not yet reported settled.
    pub(super) unsettled: usize,
}

impl Bookkeeper {
    /// Starts the task. `rows` are the tickets already stored (outbox rows
    /// read back at start, whose ticket is their row id).
    pub(super) fn start(
        outbox: Arc<dyn Outbox>,
        gateway: ActorRef<GatewayMsg>,
        rows: impl IntoIterator<Item = i64>,
        baton: OwnedMutexGuard<()>,
    ) -> Bookkeeper {
        let (jobs, queue) = mpsc::unbounded_channel();
        let books = Books {
            outbox,
            gateway,
            rows: rows.into_iter().map(|id| (id, id)).collect(),
        };
        let task = tokio::spawn(run(books, queue, baton));
        Bookkeeper {
            jobs: Some(jobs),
            task: Some(task),
            unsettled: 0,
        }
    }

    /// Hands a write over; never waits. False when bookkeeping is gone
    /// (logged): nothing will report the write.
    pub(super) fn hand(&mut self, write: Write) -> bool {
        let Some(jobs) = &self.jobs else {
            tracing::error!(?write, "Slack outbox bookkeeping is closed; write dropped");
            return false;
        };
        match jobs.send(write) {
            Ok(()) => {
                self.unsettled += 1;
                true
            }
            Err(e) => {
                tracing::error!(write = ?e.0, "Slack outbox bookkeeping is gone; write dropped");
                false
            }
        }
    }

    /// A batch settled.
    pub(super) fn settled(&mut self, n: usize) {
        self.unsettled = self.unsettled.saturating_sub(n);
    }

    /// Stops taking writes and waits until the handed-over ones are written.
    pub(super) async fn close(&mut self) {
        self.jobs = None;
        if let Some(task) = self.task.take()
            && let Err(e) = task.await
        {
            tracing::error!("Slack outbox bookkeeping task failed: {e}");
        }
    }
}

/// The task's own state.
struct Books {
    outbox: Arc<dyn Outbox>,
    gateway: ActorRef<GatewayMsg>,
    /// Ticket -> outbox row id, for stored operations not yet deleted.
    rows: HashMap<i64, i64>,
}

async fn run(
    mut books: Books,
    mut queue: mpsc::UnboundedReceiver<Write>,
    baton: OwnedMutexGuard<()>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let settled = batch.len();
        let mut booked = books.apply(std::mem::take(&mut batch)).await;
        booked.settled = settled;
        // The gateway may be gone (stopping, restarting): what was written
        // stays written and is read back by the next incarnation.
        let _ = books.gateway.send_message(GatewayMsg::Booked(booked));
    }
    drop(baton);
}

/// One planned outbox write and the ticket it concerns.
struct Planned {
    ticket: Option<i64>,
    write: OutboxWrite,
}

impl Books {
    /// Writes one batch; reports the pushes it stored.
    async fn apply(&mut self, batch: Vec<Write>) -> Booked {
        let (tickets, writes): (Vec<Option<i64>>, Vec<OutboxWrite>) = self
            .plan(batch)
            .into_iter()
            .map(|p| (p.ticket, p.write))
            .unzip();
        let results = match self.outbox.apply(&writes).await {
            Ok(ids) => ids.into_iter().map(Ok).collect(),
            Err(e) => {
                tracing::warn!(
                    writes = writes.len(),
                    "Slack outbox batch failed, retrying write by write: {e}"
                );
                self.one_by_one(&writes).await
            }
        };
        let mut booked = Booked::default();
        for ((ticket, write), result) in tickets.into_iter().zip(writes).zip(results) {
            self.settle(Planned { ticket, write }, result, &mut booked);
        }
        booked
    }

    /// Tickets to row ids; a replace of a push in the same batch is folded
    /// into it; writes about tickets without a row are dropped (they were
    /// never stored, or are already deleted).
    fn plan(&self, batch: Vec<Write>) -> Vec<Planned> {
        let mut plan: Vec<Planned> = Vec::with_capacity(batch.len());
        let mut pushed: HashMap<i64, usize> = HashMap::new();
        for w in batch {
            let (ticket, write) = match w {
                Write::Push { ticket, lane, op } => {
                    pushed.insert(ticket, plan.len());
                    (Some(ticket), OutboxWrite::Push { lane, op })
                }
                Write::Replace { ticket, op } => {
                    if let Some(p) = pushed.get(&ticket).and_then(|&i| plan.get_mut(i))
                        && let OutboxWrite::Push { op: pushed_op, .. } = &mut p.write
                    {
                        *pushed_op = op;
                        continue;
                    }
                    let Some(&id) = self.rows.get(&ticket) else {
                        continue;
                    };
                    (Some(ticket), OutboxWrite::Replace { id, op })
                }
                Write::Delete { ticket } => {
                    let Some(&id) = self.rows.get(&ticket) else {
                        continue;
                    };
                    (Some(ticket), OutboxWrite::Delete { id })
                }
                Write::Fail { ticket, error } => {
                    let Some(&id) = self.rows.get(&ticket) else {
                        continue;
                    };
                    (Some(ticket), OutboxWrite::Fail { id, error })
                }
                Write::Remember { lane, key, ts } => {
                    (None, OutboxWrite::Remember { lane, key, ts })
                }
            };
            plan.push(Planned { ticket, write });
        }
        plan
    }

    /// After a failed batch: each write alone, with backoff, so one bad
    /// write does not take its neighbours down.
    async fn one_by_one(&self, writes: &[OutboxWrite]) -> Vec<Result<Option<i64>, String>> {
        let mut out = Vec::with_capacity(writes.len());
        for w in writes {
            let mut attempt = 1;
            let result = loop {
                match self.outbox.apply(std::slice::from_ref(w)).await {
                    Ok(mut ids) => break Ok(ids.pop().flatten()),
                    Err(e) if attempt >= ATTEMPTS => break Err(e.to_string()),
                    Err(_) => {
                        tokio::time::sleep(RETRY.delay(attempt)).await;
                        attempt += 1;
                    }
                }
            };
            out.push(result);
        }
        out
    }

    /// Records what one write did; logs what could not be written.
    fn settle(&mut self, p: Planned, result: Result<Option<i64>, String>, booked: &mut Booked) {
        match (&p.write, result) {
            (OutboxWrite::Push { lane, .. }, result) => {
                let Some(ticket) = p.ticket else { return };
                match result {
                    Ok(Some(id)) => {
                        self.rows.insert(ticket, id);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::error!(%lane, "cannot store a Slack message durably, sending it anyway: {e}")
                    }
                }
                booked.persisted.push((lane.clone(), ticket));
            }
            (OutboxWrite::Delete { id } | OutboxWrite::Fail { id, .. }, Ok(_)) => {
                if let Some(ticket) = p.ticket {
                    self.rows.remove(&ticket);
                }
                tracing::trace!(id, "outbox row settled");
            }
            (OutboxWrite::Delete { id }, Err(e)) => tracing::error!(
                id,
                "cannot remove a delivered Slack message from the outbox (it is sent again after a restart): {e}"
            ),
            (OutboxWrite::Fail { id, .. }, Err(e)) => tracing::error!(
                id,
                "cannot mark a Slack message failed (it is tried again after a restart): {e}"
            ),
            (OutboxWrite::Replace { id, .. }, Err(e)) => tracing::error!(
                id,
                "cannot store a merged Slack message (a restart sends the older version): {e}"
            ),
            (OutboxWrite::Remember { lane, key, .. }, Err(e)) => tracing::error!(
                %lane, %key,
                "cannot remember a Slack message ts (after a restart an update posts it anew): {e}"
            ),
            (OutboxWrite::Replace { .. } | OutboxWrite::Remember { .. }, Ok(_)) => {}
        }
    }
}
