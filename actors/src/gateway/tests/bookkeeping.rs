//! The gateway's outbox bookkeeping: writes of many events share a batch,
//! a crash with deletes in flight re-sends only what the outbox could not
//! yet record as delivered, and a failing write is retried, not lost.

use super::*;
use crate::ports::StoreError;
use crate::slack_port::OutboxWrite;
use async_trait::async_trait;
use tokio::sync::watch;

/// Whether batches that delete rows may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Everything is written.
    Open,
    /// Batches holding a delete wait (pushes and the rest pass).
    HoldDeletes,
    /// The process "crashed": waiting and later batches write nothing.
    Crashed,
}

/// An [`Outbox`] over a [`MemoryOutbox`] that records every batch, can
/// hold batches back and can fail them.
struct GatedOutbox {
    inner: Arc<MemoryOutbox>,
    gate: watch::Sender<Gate>,
    batches: Mutex<Vec<Vec<OutboxWrite>>>,
    /// Batches holding a delete that fail before one may succeed.
    failing_deletes: Mutex<usize>,
}

impl GatedOutbox {
    fn new(inner: Arc<MemoryOutbox>, gate: Gate) -> Arc<GatedOutbox> {
        Arc::new(GatedOutbox {
            inner,
            gate: watch::Sender::new(gate),
            batches: Mutex::new(Vec::new()),
            failing_deletes: Mutex::new(0),
        })
    }

    fn set(&self, gate: Gate) {
        self.gate.send_replace(gate);
    }

    fn batches(&self) -> Vec<Vec<OutboxWrite>> {
        self.batches.lock().expect("lock").clone()
    }
}

fn has_delete(writes: &[OutboxWrite]) -> bool {
    writes
        .iter()
        .any(|w| matches!(w, OutboxWrite::Delete { .. }))
}

fn refused() -> StoreError {
    StoreError::Backend {
        op: "test outbox",
        message: "refused".into(),
    }
}

#[async_trait]
impl Outbox for GatedOutbox {
    async fn apply(&self, writes: &[OutboxWrite]) -> Result<Vec<Option<i64>>, StoreError> {
        let mut gate = self.gate.subscribe();
        let deletes = has_delete(writes);
        let now = *gate
            .wait_for(|g| *g != Gate::HoldDeletes || !deletes)
            .await
            .map_err(|_| refused())?;
        if now == Gate::Crashed {
            return Err(refused());
        }
        if deletes {
            let mut failing = self.failing_deletes.lock().expect("lock");
            if *failing > 0 {
                *failing -= 1;
                return Err(refused());
            }
        }
        self.batches.lock().expect("lock").push(writes.to_vec());
        self.inner.apply(writes).await
    }
    async fn pending(&self) -> Result<Vec<OutboxEntry>, StoreError> {
        self.inner.pending().await
    }
    async fn recall(&self, lane: &str, key: &str) -> Result<Option<String>, StoreError> {
        self.inner.recall(lane, key).await
    }
}

async fn gated_rig(gate: Gate) -> (Rig, Arc<GatedOutbox>) {
    let memory = Arc::new(MemoryOutbox::new());
    let gated = GatedOutbox::new(memory.clone(), gate);
    let rig = rig_over(
        gated.clone(),
        memory,
        Arc::new(MemoryStore::new()),
        PacingPolicy::unpaced(),
        Handoff::default(),
    )
    .await;
    (rig, gated)
}

impl Rig {
    /// Polls the gateway's backlog (operations plus unwritten bookkeeping)
    /// until it is `n`.
    async fn until_backlog(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = ractor::call!(self.gw, GatewayMsg::Backlog).expect("backlog");
            if now == n {
                return;
            }
            assert!(Instant::now() < deadline, "backlog stays {now}, not {n}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn notice(&self, id: &str, text: &str) {
        self.emit(OperatorEvent::Notice {
            session_id: SessionId::from(id),
            level: NoticeLevel::Info,
            text: text.into(),
        });
    }
}

#[tokio::test]
async fn the_pushes_of_many_events_share_one_batch() {
    let (r, gated) = gated_rig(Gate::Open).await;
    let notices = 20;
    r.start("s-0", Some("C1")).await;
    r.drained().await;
    // A delivered notice whose delete is held stalls the bookkeeping ...
    gated.set(Gate::HoldDeletes);
    r.notice("s-0", "hold");
    r.until_call("the held notice", |c| c.ends_with("notice hold"))
        .await;
    r.until_backlog(1).await;
    // ... so every push handed over meanwhile waits for the next batch:
    // one lane operation and one unwritten push each.
    for i in 0..notices {
        r.notice("s-0", &format!("n{i}"));
    }
    r.until_backlog(1 + 2 * notices).await;
    assert_eq!(r.api.calls().len(), 2, "nothing goes before its push");
    gated.set(Gate::Open);
    r.drained().await;
    let pushes: Vec<usize> = gated
        .batches()
        .iter()
        .map(|b| {
            b.iter()
                .filter(|w| matches!(w, OutboxWrite::Push { .. }))
                .count()
        })
        .filter(|&n| n > 0)
        .collect();
    assert_eq!(
        pushes.iter().sum::<usize>(),
        2 + notices,
        "every operation was stored: {pushes:?}"
    );
    assert!(
        pushes.contains(&notices),
        "the pushes that waited went in one batch: {pushes:?}"
    );
    assert!(r.outbox.pending().await.expect("pending").is_empty());
    assert_eq!(r.api.calls().len(), 2 + notices);
}

#[tokio::test]
async fn a_crash_with_deletes_in_flight_resends_only_what_was_not_recorded_delivered() {
    let (first, gated) = gated_rig(Gate::Open).await;
    first.start("s-1", Some("C1")).await;
    first.notice("s-1", "n0");
    first.drained().await;
    gated.set(Gate::HoldDeletes);
    first.notice("s-1", "n1");
    first
        .until_call("n1 reached Slack", |c| c.ends_with("notice n1"))
        .await;
    // Slack accepted n1; its delete waits in bookkeeping. Crash.
    first.until_backlog(1).await;
    first.gw.kill();
    gated.set(Gate::Crashed);
    let pending = first.outbox.pending().await.expect("pending");
    assert_eq!(pending.len(), 1, "{pending:?}");

    let second = rig_with(first.outbox.clone(), Arc::new(MemoryStore::new())).await;
    second.drained().await;
    assert_eq!(
        second.api.calls(),
        vec!["post C1 Some(\"1.000\") notice n1"],
        "the root and n0 were recorded delivered; n1 may not have been"
    );
    assert!(second.outbox.pending().await.expect("pending").is_empty());
}

#[tokio::test]
async fn a_failing_delete_is_retried_and_the_ts_kept() {
    let (r, gated) = gated_rig(Gate::Open).await;
    r.start("s-1", Some("C1")).await;
    r.drained().await;
    // The batch (remember + delete) fails, then the delete alone once more.
    *gated.failing_deletes.lock().expect("lock") = 2;
    r.emit(OperatorEvent::RequestOpened {
        request: priority::permission("s-1", "Run ls"),
    });
    r.drained().await;
    assert_eq!(*gated.failing_deletes.lock().expect("lock"), 0);
    assert!(r.outbox.pending().await.expect("pending").is_empty());
    assert_eq!(
        r.outbox
            .recall("s-1", &request_key("s-1:req-1"))
            .await
            .expect("recall")
            .as_deref(),
        Some("2.000")
    );
}

#[tokio::test]
async fn a_restarted_gateway_reads_the_outbox_after_the_old_bookkeeping_finished() {
    let memory = Arc::new(MemoryOutbox::new());
    let gated = GatedOutbox::new(memory.clone(), Gate::Open);
    let handoff = Handoff::default();
    let store = Arc::new(MemoryStore::new());
    let first = rig_over(
        gated.clone(),
        memory.clone(),
        store.clone(),
        PacingPolicy::unpaced(),
        handoff.clone(),
    )
    .await;
    first.start("s-1", Some("C1")).await;
    first.drained().await;
    gated.set(Gate::HoldDeletes);
    first.notice("s-1", "n1");
    first
        .until_call("n1 reached Slack", |c| c.ends_with("notice n1"))
        .await;
    first.until_backlog(1).await;
    // The gateway dies (a panic: no post_stop) with n1's delete in flight;
    // Root restarts it with the same arguments.
    first.gw.kill();
    let restart = tokio::spawn(rig_over(
        gated.clone(),
        memory.clone(),
        store,
        PacingPolicy::unpaced(),
        handoff,
    ));
    tokio::task::yield_now().await;
    gated.set(Gate::Open);
    let second = restart.await.expect("restart");
    second.drained().await;
    assert!(
        second.api.calls().is_empty(),
        "n1's delete landed before the outbox was read back: {:?}",
        second.api.calls()
    );
    assert!(memory.pending().await.expect("pending").is_empty());
}
