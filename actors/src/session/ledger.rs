//! The session's ledger: the one way out of a session for its store writes
//! and its operator events, in order.
//!
//! Why this exists: the actor used to await every write one after another.
//! An approval then waited for a chain of commits (the agent's text, its
//! tool call line, the request, the decision), each alone in its own
//! transaction because nothing else was queued at that moment, and the
//! writer spent its time on many small commits (issue 13). Now chatter
//! writes (transcript text, tool call lines, the plan, activity touches)
//! are *queued*: handed to the store at once, in order, without the actor
//! waiting, so they ride in the transaction of the next write somebody does
//! wait for (the request, the decision) or of other sessions' writes.
//!
//! Guarantees:
//! - writes reach the store in the order they were queued (the store's
//!   writer commits one caller's writes in that order);
//! - an operator event leaves only after every write queued before it
//!   finished, so whoever sees the event can read what it announces;
//! - [`Ledger::wait`] answers only after every write queued before it
//!   finished, so what the actor does next (answer the agent, read back)
//!   sees all of them;
//! - with nothing in flight, events and awaited writes go straight through
//!   in the actor (no task hop): behaviour is exactly what it was before;
//! - when the session ends, the task finishes what was queued.
//!
//! A queued write's failure cannot stop the actor that queued it; each
//! queued write decides for itself what a failure means (a log line, or a
//! message back to the session so agent text is retried, never lost).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::FutureExt;
use futures::StreamExt;
use futures::future::{BoxFuture, Shared};
use futures::stream::FuturesOrdered;
use tokio::sync::{mpsc, oneshot};

use crate::ports::{OperatorEvent, OperatorSink, StoreError};

/// At most this many entries are in flight at once; more wait in the queue.
const MAX_IN_FLIGHT: usize = 256;

/// With this many entries not yet done, the session takes no more agent
/// input until they are ([`Ledger::make_room`]): an agent that writes faster
/// than the store commits is slowed down by its pipe, as when every write
/// was awaited, instead of growing the queue without bound. The same size
/// as the pipe reader's window (`child::INBOUND_FRAMES_IN_FLIGHT`).
pub(super) const HIGH_WATER: usize = 64;

/// What an entry leaves to do once every entry before it is done.
enum Completion {
    /// Nothing (a queued write that finished).
    Nothing,
    /// Tell the operator.
    Emit(Box<OperatorEvent>),
    /// Answer whoever waits for this entry.
    Reply(Box<dyn FnOnce() + Send>),
}

type Entry = BoxFuture<'static, Completion>;

/// The actor's handle to its ledger task.
pub(super) struct Ledger {
    entries: mpsc::UnboundedSender<Entry>,
    /// Entries queued and not yet completed (the actor adds, the task
    /// subtracts): zero means the actor may act directly, in order.
    in_flight: Arc<AtomicUsize>,
    sink: Arc<dyn OperatorSink>,
}

impl Ledger {
    /// Starts the ledger task of one session.
    pub(super) fn start(sink: Arc<dyn OperatorSink>) -> Ledger {
        let (entries, queue) = mpsc::unbounded_channel();
        let in_flight = Arc::new(AtomicUsize::new(0));
        tokio::spawn(run(queue, Arc::clone(&sink), Arc::clone(&in_flight)));
        Ledger {
            entries,
            in_flight,
            sink,
        }
    }

    /// True when everything queued so far is done.
    fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Queues `entry`; runs it here and now should the task be gone.
    fn push(&self, entry: Entry) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError(entry)) = self.entries.send(entry) {
            // Unreachable while the actor lives (the task ends only when
            // this handle is dropped); never lose the write or the event.
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            let sink = Arc::clone(&self.sink);
            tokio::spawn(async move { finish(entry.await, &*sink) });
        }
    }

    /// Hands `write` to the store now, after everything queued before it,
    /// without waiting for it. It goes as [`crate::ports::chatter`]: the
    /// store may hold it back until the next write somebody waits for.
    pub(super) fn queue(&self, write: impl Future<Output = ()> + Send + 'static) {
        self.push(Box::pin(crate::ports::chatter(async move {
            write.await;
            Completion::Nothing
        })));
    }

    /// Runs `write` after everything queued before it and waits for it; the
    /// answer comes once every earlier entry is done too.
    pub(super) async fn wait<T: Send + 'static>(
        &self,
        write: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        if self.idle() {
            return write.await;
        }
        let (answer, answered) = oneshot::channel();
        self.push(Box::pin(async move {
            let value = write.await;
            Completion::Reply(Box::new(move || {
                let _ = answer.send(value);
            }))
        }));
        // No answer only if the write panicked (the task carries on).
        answered.await.unwrap_or_else(|_| {
            Err(StoreError::Backend {
                op: "write",
                message: "the write failed inside the session's ledger".into(),
            })
        })
    }

    /// Waits for the queue to drain when [`HIGH_WATER`] entries are not
    /// yet done (called before each frame from the agent is handled).
    pub(super) async fn make_room(&self) {
        if self.in_flight.load(Ordering::Acquire) >= HIGH_WATER {
            self.settle().await;
        }
    }

    /// Waits until everything queued so far is done.
    pub(super) async fn settle(&self) {
        let _ = self.wait(async { Ok(()) }).await;
    }

    /// Tells the operator, after every write queued before it finished.
    pub(super) fn emit(&self, event: OperatorEvent) {
        if self.idle() {
            self.sink.emit(event);
            return;
        }
        self.push(Box::pin(std::future::ready(Completion::Emit(Box::new(
            event,
        )))));
    }
}

/// A transcript row's id, which may still be on its way from the store
/// (its append was queued, not awaited).
#[derive(Debug, Clone, Default)]
pub(super) enum RowId {
    /// No row (never written, or its append failed).
    #[default]
    None,
    /// Appended; the id arrives with the write's answer (`None`: it failed).
    Pending(Shared<oneshot::Receiver<Option<i64>>>),
    /// The row.
    Known(i64),
}

impl RowId {
    /// An id that arrives on `answer` (`None` when the append failed).
    pub(super) fn pending(answer: oneshot::Receiver<Option<i64>>) -> RowId {
        RowId::Pending(answer.shared())
    }

    /// Takes in an id that has arrived meanwhile (or the news that the
    /// append failed), without waiting.
    pub(super) fn refresh(&mut self) {
        if let RowId::Pending(answer) = self
            && let Some(arrived) = answer.clone().now_or_never()
        {
            *self = match arrived {
                Ok(Some(id)) => RowId::Known(id),
                _ => RowId::None,
            };
        }
    }

    /// True while the row's id has not arrived yet (its append has not
    /// committed): a write that needs the id reaches the store only later.
    pub(super) fn is_on_its_way(&self) -> bool {
        matches!(self, RowId::Pending(answer) if answer.clone().now_or_never().is_none())
    }

    /// True when no row exists or is on its way.
    pub(super) fn is_none(&self) -> bool {
        matches!(self, RowId::None)
    }

    /// The id, as a future a queued write can own (it waits for the append
    /// queued before it).
    pub(super) fn later(&self) -> impl Future<Output = Option<i64>> + Send + 'static {
        let row = self.clone();
        async move {
            match row {
                RowId::None => None,
                RowId::Known(id) => Some(id),
                RowId::Pending(answer) => answer.await.ok().flatten(),
            }
        }
    }
}

/// Carries out what a finished entry left to do.
fn finish(done: Completion, sink: &dyn OperatorSink) {
    match done {
        Completion::Nothing => {}
        Completion::Emit(event) => sink.emit(*event),
        Completion::Reply(answer) => answer(),
    }
}

/// The entry with its panic caught: a bug in one write must not take the
/// session's later writes and events down with the task.
fn caught(entry: Entry) -> Entry {
    Box::pin(async move {
        match std::panic::AssertUnwindSafe(entry).catch_unwind().await {
            Ok(done) => done,
            Err(_) => {
                tracing::error!(
                    "a write in a session's ledger panicked; its caller is told it failed"
                );
                Completion::Nothing
            }
        }
    })
}

/// The ledger task: starts every entry as soon as it arrives (so writes
/// reach the store in order), completes them in the same order, and ends
/// once the session dropped its handle and everything is done.
async fn run(
    mut queue: mpsc::UnboundedReceiver<Entry>,
    sink: Arc<dyn OperatorSink>,
    in_flight: Arc<AtomicUsize>,
) {
    let mut running: FuturesOrdered<Entry> = FuturesOrdered::new();
    let mut open = true;
    while open || !running.is_empty() {
        tokio::select! {
            biased;
            Some(done) = running.next(), if !running.is_empty() => {
                finish(done, &*sink);
                in_flight.fetch_sub(1, Ordering::AcqRel);
            }
            entry = queue.recv(), if open && running.len() < MAX_IN_FLIGHT => match entry {
                Some(entry) => running.push_back(caught(entry)),
                None => open = false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::model::SessionId;

    /// Records what it was told, in order.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl OperatorSink for Recorder {
        fn emit(&self, event: OperatorEvent) {
            if let OperatorEvent::AgentText { text, .. } = event {
                self.0
                    .lock()
                    .expect("recorder")
                    .push(format!("event {text}"));
            }
        }
    }

    fn text(t: &str) -> OperatorEvent {
        OperatorEvent::AgentText {
            session_id: SessionId::from("s-1"),
            text: t.into(),
        }
    }

    /// A write that finishes when told to, noting when it ran.
    fn slow_write(
        log: &Arc<Recorder>,
        name: &'static str,
    ) -> (
        oneshot::Sender<()>,
        impl Future<Output = ()> + Send + 'static,
    ) {
        let (go, gate) = oneshot::channel::<()>();
        let log = Arc::clone(log);
        (go, async move {
            let _ = gate.await;
            log.0.lock().expect("log").push(format!("wrote {name}"));
        })
    }

    #[tokio::test]
    async fn an_event_waits_for_the_writes_queued_before_it() {
        let log = Arc::new(Recorder::default());
        let ledger = Ledger::start(log.clone());
        let (go, write) = slow_write(&log, "text");
        ledger.queue(write);
        ledger.emit(text("after the text"));
        // The write has not finished: the event must not be out yet.
        tokio::time::timeout(Duration::from_millis(50), ledger.settle())
            .await
            .expect_err("settle must wait for the blocked write");
        assert!(log.0.lock().expect("log").is_empty());
        go.send(()).expect("release");
        ledger.settle().await;
        assert_eq!(
            *log.0.lock().expect("log"),
            vec!["wrote text".to_owned(), "event after the text".to_owned()]
        );
    }

    #[tokio::test]
    async fn a_waited_write_answers_after_every_earlier_write() {
        let log = Arc::new(Recorder::default());
        let ledger = Ledger::start(log.clone());
        let (first, write1) = slow_write(&log, "first");
        ledger.queue(write1);
        // The second write itself is quick; its answer must still wait.
        let log2 = Arc::clone(&log);
        let answer = ledger.wait(async move {
            log2.0.lock().expect("log").push("wrote second".into());
            Ok(7)
        });
        tokio::pin!(answer);
        tokio::time::timeout(Duration::from_millis(50), &mut answer)
            .await
            .expect_err("the answer must wait for the first write");
        first.send(()).expect("release");
        assert_eq!(answer.await.expect("answer"), 7);
        let log = log.0.lock().expect("log").clone();
        assert!(log.contains(&"wrote first".to_owned()), "{log:?}");
    }

    #[tokio::test]
    async fn with_nothing_in_flight_events_go_out_at_once() {
        let log = Arc::new(Recorder::default());
        let ledger = Ledger::start(log.clone());
        ledger.emit(text("now"));
        assert_eq!(*log.0.lock().expect("log"), vec!["event now".to_owned()]);
        assert_eq!(ledger.wait(async { Ok(3) }).await.expect("answer"), 3);
    }

    #[tokio::test]
    async fn writes_start_in_the_order_they_were_queued_without_waiting() {
        let log = Arc::new(Recorder::default());
        let ledger = Ledger::start(log.clone());
        let (started_tx, mut started) = mpsc::unbounded_channel();
        let mut gates = Vec::new();
        for i in 0..20 {
            let (go, gate) = oneshot::channel::<()>();
            gates.push(go);
            let started_tx = started_tx.clone();
            ledger.queue(async move {
                let _ = started_tx.send(i);
                let _ = gate.await;
            });
        }
        // All twenty are started while none has finished.
        let mut order = Vec::new();
        for _ in 0..20 {
            order.push(started.recv().await.expect("started"));
        }
        assert_eq!(order, (0..20).collect::<Vec<_>>());
        for go in gates {
            let _ = go.send(());
        }
        ledger.settle().await;
    }

    #[tokio::test]
    async fn a_write_that_panics_fails_alone_and_the_ledger_goes_on() {
        let log = Arc::new(Recorder::default());
        let ledger = Ledger::start(log.clone());
        let (go, write) = slow_write(&log, "first");
        ledger.queue(write);
        let failed = ledger.wait(async {
            if true {
                panic!("a bug in a write");
            }
            Ok(1)
        });
        go.send(()).expect("release");
        assert!(failed.await.is_err(), "the waiter is told");
        ledger.emit(text("still here"));
        ledger.settle().await;
        assert_eq!(
            *log.0.lock().expect("log"),
            vec!["wrote first".to_owned(), "event still here".to_owned()]
        );
    }

    #[tokio::test]
    async fn a_row_id_arrives_or_its_failure_is_noticed() {
        let (send, answer) = oneshot::channel();
        let mut row = RowId::pending(answer);
        row.refresh();
        assert!(!row.is_none(), "still on its way");
        let later = row.later();
        send.send(Some(7)).expect("send");
        assert_eq!(later.await, Some(7));
        row.refresh();
        assert!(matches!(row, RowId::Known(7)));

        // A failed append: the next update appends a new row instead.
        let (send, answer) = oneshot::channel();
        let mut failed = RowId::pending(answer);
        send.send(None).expect("send");
        failed.refresh();
        assert!(failed.is_none());
    }

    #[tokio::test]
    async fn a_full_ledger_holds_the_next_frame_until_it_drained() {
        let log = Arc::new(Recorder::default());
        let ledger = Ledger::start(log.clone());
        let mut gates = Vec::new();
        for _ in 0..HIGH_WATER - 1 {
            let (go, write) = slow_write(&log, "w");
            gates.push(go);
            ledger.queue(write);
        }
        // Below the high-water mark: room at once.
        ledger.make_room().await;
        let (go, write) = slow_write(&log, "w");
        gates.push(go);
        ledger.queue(write);
        tokio::time::timeout(Duration::from_millis(50), ledger.make_room())
            .await
            .expect_err("a full ledger makes the session wait");
        for go in gates {
            let _ = go.send(());
        }
        ledger.make_room().await;
        assert_eq!(log.0.lock().expect("log").len(), HIGH_WATER);
    }

    #[tokio::test]
    async fn what_was_queued_is_finished_after_the_handle_is_dropped() {
        let log = Arc::new(Recorder::default());
        let ledger = Ledger::start(log.clone());
        let (go, write) = slow_write(&log, "last");
        ledger.queue(write);
        ledger.emit(text("bye"));
        drop(ledger);
        go.send(()).expect("release");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while log.0.lock().expect("log").len() < 2 {
            assert!(tokio::time::Instant::now() < deadline, "not finished");
            tokio::task::yield_now().await;
        }
        assert_eq!(
            *log.0.lock().expect("log"),
            vec!["wrote last".to_owned(), "event bye".to_owned()]
        );
    }

    #[test]
    fn a_row_is_on_its_way_only_until_its_id_arrives() {
        let (send, answer) = oneshot::channel();
        let row = RowId::pending(answer);
        assert!(row.is_on_its_way());
        send.send(Some(7)).expect("send");
        assert!(!row.is_on_its_way(), "the id arrived");
        assert!(!RowId::Known(7).is_on_its_way());
        assert!(!RowId::None.is_on_its_way());
    }
}
