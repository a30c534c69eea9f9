//! The operator event journal in SQLite (`events` table,
//! `migrations/0005_events_console.sql`).
//!
//! Why this exists: `GET /api/events` promises that a client reconnecting
//! with `Last-Event-ID` gets exactly the events it missed, also across a
//! server restart, so every operator event is stored with an increasing id
//! before it is streamed. One task (`src/journal.rs`) appends in batches (one
//! multi-row INSERT each, through the store's one writer, so it shares
//! transactions with the other writes); streams read pages after
//! an id. Old rows are pruned so the table stays bounded.

use futures::TryStreamExt;
use intercom_actors::ports::StoreError;
use intercom_actors::transcript::Budget;

use super::{SqliteStore, backend, exec, pages, write_error};

/// One event ready to be stored: its session, its kind (the event's tag) and
/// the whole event as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// Unix ms.
    pub at: i64,
    /// The session it concerns.
    pub session_id: String,
    /// `request_opened`, `status_changed`, ...
    pub kind: String,
    /// The event as JSON text.
    pub payload: String,
}

/// A stored event.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredEvent {
    /// Increasing id (the SSE `id:`).
    pub id: i64,
    /// Unix ms.
    pub at: i64,
    /// The session it concerns.
    pub session_id: String,
    /// The event's kind.
    pub kind: String,
    /// The event as JSON text.
    pub payload: String,
}

impl SqliteStore {
    /// Appends events as one statement through the store's one writer (in
    /// the transaction it is batching; a failure undoes only this insert);
    /// returns them with their ids, in order, once committed.
    pub async fn append_events(&self, events: &[NewEvent]) -> Result<Vec<StoredEvent>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        self.write(events.to_vec(), |events, conn| {
            let mut insert = conn
                .prepare_cached(
                    "INSERT INTO events (at, session_id, kind, payload) VALUES (?, ?, ?, ?)",
                )
                .map_err(write_error("append events"))?;
            let mut stored = Vec::with_capacity(events.len());
            for e in events {
                let id = insert
                    .insert(rusqlite::params![e.at, e.session_id, e.kind, e.payload])
                    .map_err(write_error("append events"))?;
                stored.push(StoredEvent {
                    id,
                    at: e.at,
                    session_id: e.session_id.clone(),
                    kind: e.kind.clone(),
                    payload: e.payload.clone(),
                });
            }
            Ok(stored)
        })
        .await
    }

    /// Up to `limit` events with an id above `after`, oldest first, and no
    /// more than about [`pages::MAX_PAGE_BYTES`] of them (at least one: an
    /// agent sets the size of some events); optionally only one session's.
    pub async fn events_after(
        &self,
        after: i64,
        session: Option<&str>,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        // Two statements, so one session's page uses `events_by_session`.
        let mut rows = match session {
            Some(s) => sqlx::query_as::<_, StoredEvent>(
                "SELECT id, at, session_id, kind, payload FROM events \
                 WHERE session_id = ? AND id > ? ORDER BY id LIMIT ?",
            )
            .bind(s)
            .bind(after)
            .bind(limit)
            .fetch(&self.pool),
            None => sqlx::query_as::<_, StoredEvent>(
                "SELECT id, at, session_id, kind, payload FROM events \
                 WHERE id > ? ORDER BY id LIMIT ?",
            )
            .bind(after)
            .bind(limit)
            .fetch(&self.pool),
        };
        // The SQL LIMIT bounds the count; the budget the bytes.
        let mut budget = Budget::new(usize::MAX, pages::MAX_PAGE_BYTES);
        let mut out: Vec<StoredEvent> = Vec::new();
        while let Some(event) = rows.try_next().await.map_err(backend("read events"))? {
            if !budget.admit(event.payload.len()) {
                break;
            }
            out.push(event);
        }
        Ok(out)
    }

    /// The newest event id (0 when there is none).
    pub async fn last_event_id(&self) -> Result<i64, StoreError> {
        let id: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM events")
            .fetch_one(&self.pool)
            .await
            .map_err(backend("read last event id"))?;
        Ok(id.unwrap_or(0))
    }

    /// The oldest stored id, if any is stored.
    pub async fn first_event_id(&self) -> Result<Option<i64>, StoreError> {
        sqlx::query_scalar("SELECT MIN(id) FROM events")
            .fetch_one(&self.pool)
            .await
            .map_err(backend("read first event id"))
    }

    /// Deletes the events up to and including id `through`; returns how
    /// many went.
    pub async fn prune_events_through(&self, through: i64) -> Result<u64, StoreError> {
        self.write(through, |through, conn| {
            let gone = exec(
                conn,
                "prune events",
                "DELETE FROM events WHERE id <= ?",
                [through],
            )?;
            Ok(gone as u64)
        })
        .await
    }

    /// Every stored event's id and payload size in bytes, oldest first (the
    /// journal's retention reads it once at start).
    pub async fn event_sizes(&self) -> Result<Vec<(i64, usize)>, StoreError> {
        let rows: Vec<(i64, i64)> =
            sqlx::query_as("SELECT id, length(CAST(payload AS BLOB)) FROM events ORDER BY id")
                .fetch_all(&self.pool)
                .await
                .map_err(backend("read event sizes"))?;
        Ok(rows
            .into_iter()
            .map(|(id, size)| (id, usize::try_from(size).unwrap_or(0)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(session: &str, kind: &str) -> NewEvent {
        NewEvent {
            at: 1,
            session_id: session.into(),
            kind: kind.into(),
            payload: format!("{{\"event\":\"{kind}\"}}"),
        }
    }

    #[tokio::test]
    async fn events_get_increasing_ids_and_page_by_session() {
        let store = SqliteStore::open_in_memory().await.expect("store");
        assert_eq!(store.last_event_id().await.expect("last"), 0);
        let batch = [event("s-1", "a"), event("s-2", "b"), event("s-1", "c")];
        let stored = store.append_events(&batch).await.expect("append");
        let ids: Vec<i64> = stored.iter().map(|e| e.id).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
        let all = store.events_after(0, None, 10).await.expect("all");
        assert_eq!(all, stored);
        let after_first = store.events_after(ids[0], None, 10).await.expect("after");
        assert_eq!(after_first.len(), 2);
        let s1 = store.events_after(0, Some("s-1"), 10).await.expect("s-1");
        let kinds: Vec<&str> = s1.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["a", "c"]);
        let one = store.events_after(0, None, 1).await.expect("page");
        assert_eq!(one.len(), 1);
        assert_eq!(store.last_event_id().await.expect("last"), ids[2]);
    }

    #[tokio::test]
    async fn a_page_of_events_stops_at_its_byte_bound() {
        let store = SqliteStore::open_in_memory().await.expect("store");
        let big = |n: usize| NewEvent {
            payload: format!("{{\"n\":{n},\"x\":\"{}\"}}", "x".repeat(3 << 20)),
            ..event("s-1", "plan")
        };
        let stored = store
            .append_events(&[big(0), big(1), big(2), big(3)])
            .await
            .expect("append");
        // 3 MiB each: two fit in a page's 8 MiB.
        let page = store.events_after(0, None, 500).await.expect("page");
        assert_eq!(page, stored[..2].to_vec());
        let next = store
            .events_after(page[1].id, Some("s-1"), 500)
            .await
            .expect("next");
        assert_eq!(next, stored[2..].to_vec());
        // One event bigger than the bound still comes alone.
        let huge = NewEvent {
            payload: "y".repeat(9 << 20),
            ..event("s-1", "plan")
        };
        let one = store.append_events(&[huge]).await.expect("append");
        let page = store
            .events_after(stored[3].id, None, 500)
            .await
            .expect("page");
        assert_eq!(page, one);
    }

    #[tokio::test]
    async fn pruning_keeps_the_newest_and_ids_never_repeat() {
        let store = SqliteStore::open_in_memory().await.expect("store");
        let batch: Vec<NewEvent> = (0..5).map(|_| event("s-1", "x")).collect();
        let stored = store.append_events(&batch).await.expect("append");
        let gone = store
            .prune_events_through(stored[2].id)
            .await
            .expect("prune");
        assert_eq!(gone, 3);
        let left = store.events_after(0, None, 10).await.expect("left");
        assert_eq!(left, stored[3..].to_vec());
        let sizes = store.event_sizes().await.expect("sizes");
        let expected: Vec<(i64, usize)> = left.iter().map(|e| (e.id, e.payload.len())).collect();
        assert_eq!(sizes, expected);
        store
            .prune_events_through(i64::MAX)
            .await
            .expect("prune all");
        let next = store
            .append_events(&[event("s-1", "y")])
            .await
            .expect("append");
        assert!(next[0].id > stored[4].id, "AUTOINCREMENT never reuses ids");
    }
}
