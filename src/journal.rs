//! The operator event journal: every [`OperatorEvent`] stored with an
//! increasing id, then published to live streams.
//!
//! Why this exists: `GET /api/events` (and the web console, `ctl watch`)
//! must be able to resume after a reconnect, or a server restart, without a
//! gap. So the journal is an [`OperatorSink`] like the Slack gateway: `emit`
//! only queues (it must not block an actor), and one writer task, the only
//! owner of the queue, appends what arrived to SQLite in one INSERT statement per
//! batch and only then broadcasts the stored events with their ids. A
//! stream subscribes to the broadcast first and reads the table second, so
//! every event is in one or the other (duplicates are dropped by id).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use intercom_actors::model::now_ms;
use intercom_actors::ports::{OperatorEvent, OperatorSink, StoreError};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::storage::SqliteStore;
use crate::storage::events::{NewEvent, StoredEvent};

/// At most this many queued events go into one transaction.
const BATCH: usize = 256;
/// Live events buffered per stream before it must catch up from the table.
const LIVE_BUFFER: usize = 1024;
/// Events kept in the table; older ones are pruned.
const KEEP: usize = 100_000;
/// Bytes of events kept in the table: the agent sets the size of many
/// events (a plan, a tool call's title, a request's diff), so rows alone
/// do not bound it.
const KEEP_BYTES: usize = 256 << 20;
/// A prune goes this far below the bounds, so it runs once per this many
/// events (or 1/16 of the bytes), not after every batch.
const PRUNE_EVERY: usize = 1_000;
/// How often a failed append is retried before the batch is given up.
const RETRIES: u32 = 5;

enum JournalMsg {
    Event(Box<OperatorEvent>),
    /// Write what is queued, answer, and stop.
    Close(oneshot::Sender<()>),
}

/// The journal: a sink for operator events and a source of stored ones.
#[derive(Debug)]
pub struct EventJournal {
    queue: mpsc::UnboundedSender<JournalMsg>,
    live: broadcast::Sender<Arc<StoredEvent>>,
    store: Arc<SqliteStore>,
    streams_end: CancellationToken,
}

impl std::fmt::Debug for JournalMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JournalMsg::Event(_) => f.write_str("Event"),
            JournalMsg::Close(_) => f.write_str("Close"),
        }
    }
}

impl EventJournal {
    /// Starts the writer task over `store`.
    pub fn start(store: Arc<SqliteStore>) -> Arc<EventJournal> {
        Self::start_within(store, KEEP, KEEP_BYTES)
    }

    /// [`EventJournal::start`] keeping at most `rows` events and about
    /// `bytes` of them.
    fn start_within(store: Arc<SqliteStore>, rows: usize, bytes: usize) -> Arc<EventJournal> {
        let (queue, rx) = mpsc::unbounded_channel();
        let (live, _) = broadcast::channel(LIVE_BUFFER);
        let kept = Retention::new(rows, bytes);
        tokio::spawn(write_loop(store.clone(), rx, live.clone(), kept));
        Arc::new(EventJournal {
            queue,
            live,
            store,
            streams_end: CancellationToken::new(),
        })
    }

    /// Stored events from now on, as they are committed.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<StoredEvent>> {
        self.live.subscribe()
    }

    /// Up to `limit` stored events after id `after` (optionally one session's).
    pub async fn after(
        &self,
        after: i64,
        session: Option<&str>,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.store.events_after(after, session, limit).await
    }

    /// The oldest id still kept, if any.
    pub async fn first_id(&self) -> Result<Option<i64>, StoreError> {
        self.store.first_event_id().await
    }

    /// The newest stored id.
    pub async fn last_id(&self) -> Result<i64, StoreError> {
        self.store.last_event_id().await
    }

    /// Cancelled when the server shuts down: open streams end then, so a
    /// graceful shutdown does not wait for clients that never hang up.
    pub fn streams_end(&self) -> CancellationToken {
        self.streams_end.clone()
    }

    /// Ends every open stream (clients reconnect with `Last-Event-ID`).
    pub fn end_streams(&self) {
        self.streams_end.cancel();
    }

    /// Writes what is still queued and stops the writer (so the store can
    /// close). Events emitted afterwards are dropped.
    pub async fn close(&self) {
        let (tx, rx) = oneshot::channel();
        if self.queue.send(JournalMsg::Close(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

impl OperatorSink for EventJournal {
    fn emit(&self, event: OperatorEvent) {
        if self.queue.send(JournalMsg::Event(Box::new(event))).is_err() {
            tracing::debug!("event journal closed; event not recorded");
        }
    }
}

/// Encodes an event for the table: (session, kind, JSON), serializing it
/// once, straight to text.
pub fn encode(event: &OperatorEvent) -> Result<NewEvent, serde_json::Error> {
    let payload = match event {
        // The journal keeps the start of a request's diff only (the request
        // itself keeps it whole, `GET /api/approvals/{id}`): a probe's
        // client opened and dropped clearances of 900 KB diffs, and 271
        // such events filled the journal's 256 MiB, pushing out every
        // other session's history.
        OperatorEvent::RequestOpened { request }
            if request
                .diff
                .as_ref()
                .is_some_and(|d| d.len() > EVENT_DIFF_KEPT) =>
        {
            let mut kept = request.clone();
            if let Some(diff) = &mut kept.diff {
                let mut cut = EVENT_DIFF_KEPT;
                while !diff.is_char_boundary(cut) {
                    cut -= 1;
                }
                diff.truncate(cut);
                diff.push_str(
                    "\n(the rest of this diff is in the request: GET /api/approvals/{id})\n",
                );
            }
            serde_json::to_string(&OperatorEvent::RequestOpened { request: kept })?
        }
        _ => serde_json::to_string(event)?,
    };
    Ok(NewEvent {
        at: now_ms(),
        session_id: event.session_id().0.clone(),
        kind: event.kind().to_owned(),
        payload,
    })
}

/// Bytes of a request's diff an event in the journal keeps.
const EVENT_DIFF_KEPT: usize = 64 * 1024;

async fn write_loop(
    store: Arc<SqliteStore>,
    mut rx: mpsc::UnboundedReceiver<JournalMsg>,
    live: broadcast::Sender<Arc<StoredEvent>>,
    mut kept: Retention,
) {
    match store.event_sizes().await {
        Ok(sizes) => sizes
            .into_iter()
            .for_each(|(id, size)| kept.appended(id, size)),
        Err(e) => tracing::warn!("cannot read the event journal's size: {e}"),
    }
    while let Some(first) = rx.recv().await {
        let mut batch = Vec::new();
        let mut closing = None;
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                JournalMsg::Event(event) => match encode(&event) {
                    Ok(e) => batch.push(e),
                    Err(e) => tracing::error!("cannot encode operator event: {e}"),
                },
                JournalMsg::Close(reply) => {
                    closing = Some(reply);
                    break;
                }
            }
            if batch.len() < BATCH {
                next = rx.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            for stored in append_with_retry(&store, &batch).await {
                kept.appended(stored.id, stored.payload.len());
                let _ = live.send(Arc::new(stored));
            }
            if let Some((through, forgotten)) = kept.excess()
                && let Err(e) = store.prune_events_through(through).await
            {
                // Still in the table: keep counting them, and try again
                // after the next batch.
                kept.restore(forgotten);
                tracing::warn!("cannot prune the event journal: {e}");
            }
        }
        if let Some(reply) = closing {
            let _ = reply.send(());
            return;
        }
    }
}

/// What the journal's table holds, oldest first, so it can be kept within
/// rows and bytes without reading the table again. Owned by the writer task.
#[derive(Debug)]
struct Retention {
    rows: VecDeque<(i64, usize)>,
    bytes: usize,
    max_rows: usize,
    max_bytes: usize,
}

impl Retention {
    fn new(max_rows: usize, max_bytes: usize) -> Self {
        Retention {
            rows: VecDeque::new(),
            bytes: 0,
            max_rows,
            max_bytes,
        }
    }

    /// An event was stored.
    fn appended(&mut self, id: i64, size: usize) {
        self.rows.push_back((id, size));
        self.bytes += size;
    }

    /// Past either bound: forgets the oldest events until the table is
    /// [`PRUNE_EVERY`] rows and 1/16 of the bytes below both, and returns
    /// the last id to delete.
    fn excess(&mut self) -> Option<(i64, Vec<(i64, usize)>)> {
        if self.rows.len() <= self.max_rows && self.bytes <= self.max_bytes {
            return None;
        }
        let rows_goal = self.max_rows.saturating_sub(PRUNE_EVERY);
        let bytes_goal = self.max_bytes - self.max_bytes / 16;
        let mut forgotten = Vec::new();
        while self.rows.len() > rows_goal || self.bytes > bytes_goal {
            let Some((id, size)) = self.rows.pop_front() else {
                break;
            };
            self.bytes -= size;
            forgotten.push((id, size));
        }
        let through = forgotten.last()?.0;
        Some((through, forgotten))
    }

    /// Puts back rows [`Retention::excess`] gave up whose delete failed.
    fn restore(&mut self, forgotten: Vec<(i64, usize)>) {
        for (id, size) in forgotten.into_iter().rev() {
            self.rows.push_front((id, size));
            self.bytes += size;
        }
    }
}

/// Appends a batch, retrying a storage failure with backoff; a batch that
/// still fails is logged and dropped (the sessions' own records keep the
/// state; only the stream misses those events).
async fn append_with_retry(store: &SqliteStore, batch: &[NewEvent]) -> Vec<StoredEvent> {
    let mut delay = Duration::from_millis(100);
    for attempt in 1..=RETRIES {
        match store.append_events(batch).await {
            Ok(stored) => return stored,
            Err(e) if attempt < RETRIES => {
                tracing::warn!(attempt, "cannot record operator events, retrying: {e}");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => {
                tracing::error!(
                    events = batch.len(),
                    "cannot record operator events; the event stream misses them: {e}"
                );
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use intercom_actors::model::{SessionId, SessionStatus};
    use intercom_actors::ports::NoticeLevel;

    fn notice(session: &str, text: &str) -> OperatorEvent {
        OperatorEvent::Notice {
            session_id: SessionId(session.into()),
            level: NoticeLevel::Info,
            text: text.into(),
        }
    }

    #[test]
    fn retention_keeps_the_newest_within_rows_and_bytes() {
        // Rows: past 2,000 events, the oldest go down to 1,000 (PRUNE_EVERY below).
        let mut kept = Retention::new(2_000, usize::MAX / 2);
        (1..=2_000).for_each(|id| kept.appended(id, 10));
        assert!(kept.excess().is_none());
        kept.appended(2_001, 10);
        assert_eq!(kept.excess().map(|(t, _)| t), Some(1_001));
        assert_eq!(kept.rows.len(), 1_000);
        assert!(kept.excess().is_none());
        // Bytes: a few huge events push out many small ones, down to 15/16.
        let mut kept = Retention::new(KEEP, 1_600);
        (1..=100).for_each(|id| kept.appended(id, 10));
        assert!(kept.excess().is_none());
        kept.appended(101, 1_000);
        let (through, forgotten) = kept.excess().expect("past the bytes");
        assert_eq!(through, 50);
        // A failed delete puts them back.
        kept.restore(forgotten);
        assert_eq!((kept.rows.len(), kept.bytes), (101, 2_000));
        assert_eq!(kept.excess().map(|(t, _)| t), Some(50));
        assert_eq!(kept.bytes, 1_500);
        assert_eq!(kept.rows.front(), Some(&(51, 10)));
    }

    #[tokio::test]
    async fn a_flood_of_big_events_keeps_the_table_within_its_bytes() {
        let store = Arc::new(SqliteStore::open_in_memory().await.expect("store"));
        let bound = 4 << 20;
        let journal = EventJournal::start_within(store.clone(), KEEP, bound);
        // 400 events of 64 KiB: 25 MiB, past a 4 MiB bound.
        let big = "x".repeat(64 << 10);
        for i in 0..400 {
            journal.emit(notice("s-1", &format!("{i} {big}")));
        }
        journal.close().await;
        let sizes = store.event_sizes().await.expect("sizes");
        let bytes: usize = sizes.iter().map(|(_, s)| s).sum();
        assert!(bytes <= bound, "{bytes} bytes kept");
        assert!(sizes.len() >= 50, "the newest stay: {}", sizes.len());
        let last = store
            .events_after(sizes[sizes.len() - 2].0, None, 5)
            .await
            .expect("last");
        assert!(
            last[0].payload.contains("\"399 "),
            "the newest event is kept"
        );
    }

    #[tokio::test]
    async fn events_are_stored_before_they_are_published() {
        let store = Arc::new(SqliteStore::open_in_memory().await.expect("store"));
        let journal = EventJournal::start(store.clone());
        let mut live = journal.subscribe();
        journal.emit(notice("s-1", "one"));
        journal.emit(OperatorEvent::SessionEnded {
            session_id: SessionId("s-2".into()),
            status: SessionStatus::Completed,
            reason: None,
        });
        let first = live.recv().await.expect("first");
        let second = live.recv().await.expect("second");
        assert!(first.id < second.id);
        assert_eq!(
            (first.kind.as_str(), second.kind.as_str()),
            ("notice", "session_ended")
        );
        let stored = journal.after(0, None, 10).await.expect("read");
        assert_eq!(stored, vec![(*first).clone(), (*second).clone()]);
        let payload: serde_json::Value = serde_json::from_str(&first.payload).expect("json");
        assert_eq!(payload["text"], "one");
        assert_eq!(first.session_id, "s-1");
    }

    /// A request's diff is kept in the journal up to 64 KiB; the rest
    /// stays in the request.
    #[test]
    fn a_big_diff_is_kept_in_the_journal_only_in_part() {
        use serde_json::json;
        let request = serde_json::from_value(json!({
            "id": "s-1:req-1", "session_id": "s-1", "request_id": "req-1",
            "kind": "permission", "title": "t", "diff": "+x\n".repeat(300_000), "paths": [],
            "options": [], "status": "pending", "wire_id": null, "created_at": 0
        }))
        .expect("a pending request");
        let event = encode(&OperatorEvent::RequestOpened { request }).expect("encode");
        assert!(event.payload.len() < 100 * 1024, "{}", event.payload.len());
        let back: serde_json::Value = serde_json::from_str(&event.payload).expect("json");
        assert!(
            back["request"]["diff"]
                .as_str()
                .is_some_and(|d| d.ends_with("GET /api/approvals/{id})\n")),
            "{back}"
        );
    }

    /// The kind column is the payload's own `event` field, for every kind
    /// the server emits (a variant added to `OperatorEvent` without its
    /// name in `kind()` fails to compile; a misspelt name fails here).
    #[test]
    fn the_kind_column_is_the_payloads_event_field() {
        use intercom_actors::model::{Decision, RequestStatus};
        use serde_json::json;
        let s = || SessionId("s-1".into());
        let session = serde_json::from_value(json!({
            "id": "s-1", "workspace": "w", "cwd": "/w", "agent": "a", "protocol": "acp",
            "status": "active", "status_reason": null, "title": "t", "owner": "U1",
            "acp_session_id": null, "channel_id": null, "thread_ts": null,
            "restart_count": 0, "created_at": 0, "updated_at": 0, "last_activity_at": 0
        }))
        .expect("a session record");
        let request = serde_json::from_value(json!({
            "id": "s-1:req-1", "session_id": "s-1", "request_id": "req-1",
            "kind": "permission", "title": "t", "diff": null, "paths": [], "options": [],
            "status": "pending", "wire_id": null, "created_at": 0
        }))
        .expect("a pending request");
        let events = vec![
            OperatorEvent::SessionStarted { session },
            OperatorEvent::StatusChanged {
                session_id: s(),
                status: SessionStatus::Active,
                activity: "working".into(),
                reason: None,
            },
            OperatorEvent::AgentText {
                session_id: s(),
                text: "t".into(),
            },
            OperatorEvent::AgentThought {
                session_id: s(),
                text: "t".into(),
            },
            OperatorEvent::Usage {
                session_id: s(),
                usage: intercom_actors::protocol::acp::Usage {
                    used: 1,
                    size: 2,
                    cost: None,
                    currency: None,
                },
            },
            OperatorEvent::ToolCall {
                session_id: s(),
                tool_call_id: "c".into(),
                title: "t".into(),
                status: "pending".into(),
            },
            OperatorEvent::Plan {
                session_id: s(),
                entries: vec![],
            },
            OperatorEvent::RequestOpened { request },
            OperatorEvent::RequestClosed {
                session_id: s(),
                id: "r".into(),
                status: RequestStatus::Decided,
                decision: None::<Decision>,
            },
            OperatorEvent::SteeringQueued {
                session_id: s(),
                steering: intercom_actors::model::Steering {
                    id: 1,
                    session_id: s(),
                    text: "t".into(),
                    author: "U1".into(),
                    created_at: 0,
                },
            },
            OperatorEvent::SteeringDelivered {
                session_id: s(),
                steering_id: 1,
            },
            notice("s-1", "n"),
            OperatorEvent::SessionEnded {
                session_id: s(),
                status: SessionStatus::Completed,
                reason: None,
            },
        ];
        for event in &events {
            let row = encode(event).expect("encodes");
            let payload: serde_json::Value = serde_json::from_str(&row.payload).expect("json");
            assert_eq!(payload["event"], row.kind.as_str(), "{event:?}");
        }
    }

    #[tokio::test]
    async fn close_writes_what_is_queued_then_drops_later_events() {
        let store = Arc::new(SqliteStore::open_in_memory().await.expect("store"));
        let journal = EventJournal::start(store.clone());
        for i in 0..600 {
            journal.emit(notice("s-1", &format!("n{i}")));
        }
        journal.close().await;
        assert_eq!(
            store.events_after(0, None, 1000).await.expect("read").len(),
            600
        );
        journal.emit(notice("s-1", "late"));
        journal.close().await;
        assert_eq!(
            store.events_after(0, None, 1000).await.expect("read").len(),
            600
        );
    }
}
