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

use intercom_actors::ports::StoreError;

use super::{SqliteStore, backend};

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
            Box::pin(async move {
                let mut insert =
                    sqlx::QueryBuilder::new("INSERT INTO events (at, session_id, kind, payload) ");
                insert.push_values(events, |mut row, e| {
                    row.push_bind(e.at)
                        .push_bind(&e.session_id)
                        .push_bind(&e.kind)
                        .push_bind(&e.payload);
                });
                insert.push(" RETURNING id");
                let mut ids: Vec<i64> = insert
                    .build_query_scalar()
                    .fetch_all(conn)
                    .await
                    .map_err(backend("append events"))?;
                // Rows get increasing ids in VALUES order; RETURNING's order is unspecified.
                ids.sort_unstable();
                Ok(ids
                    .into_iter()
                    .zip(events)
                    .map(|(id, e)| StoredEvent {
                        id,
                        at: e.at,
                        session_id: e.session_id.clone(),
                        kind: e.kind.clone(),
                        payload: e.payload.clone(),
                    })
                    .collect())
            })
        })
        .await
    }

    /// Up to `limit` events with an id above `after`, oldest first;
    /// optionally only one session's.
    pub async fn events_after(
        &self,
        after: i64,
        session: Option<&str>,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let rows = match session {
            Some(s) => {
                sqlx::query_as(
                    "SELECT id, at, session_id, kind, payload FROM events \
                     WHERE session_id = ? AND id > ? ORDER BY id LIMIT ?",
                )
                .bind(s)
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await
            }
            None => {
                sqlx::query_as(
                    "SELECT id, at, session_id, kind, payload FROM events \
                     WHERE id > ? ORDER BY id LIMIT ?",
                )
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await
            }
        };
        rows.map_err(backend("read events"))
    }

    /// The newest event id (0 when there is none).
    pub async fn last_event_id(&self) -> Result<i64, StoreError> {
        let id: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM events")
            .fetch_one(&self.pool)
            .await
            .map_err(backend("read last event id"))?;
        Ok(id.unwrap_or(0))
    }

    /// Deletes all but the newest `keep` events; returns how many went.
    pub async fn prune_events(&self, keep: i64) -> Result<u64, StoreError> {
        self.write(keep, |keep, conn| {
            Box::pin(async move {
                let done =
                    sqlx::query("DELETE FROM events WHERE id <= (SELECT MAX(id) FROM events) - ?")
                        .bind(keep)
                        .execute(conn)
                        .await
                        .map_err(backend("prune events"))?;
                Ok(done.rows_affected())
            })
        })
        .await
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
    async fn pruning_keeps_the_newest_and_ids_never_repeat() {
        let store = SqliteStore::open_in_memory().await.expect("store");
        let batch: Vec<NewEvent> = (0..5).map(|_| event("s-1", "x")).collect();
        let stored = store.append_events(&batch).await.expect("append");
        assert_eq!(store.prune_events(2).await.expect("prune"), 3);
        let left = store.events_after(0, None, 10).await.expect("left");
        assert_eq!(left, stored[3..].to_vec());
        store.prune_events(0).await.expect("prune all");
        let next = store
            .append_events(&[event("s-1", "y")])
            .await
            .expect("append");
        assert!(next[0].id > stored[4].id, "AUTOINCREMENT never reuses ids");
    }
}
