//! `Outbox` for [`SqliteStore`]: the durable queue of messages bound for Slack.
//!
//! Why this exists: the Slack gateway writes every outbound operation here
//! before it tries Slack and deletes it only once Slack accepted it, so a
//! Slack outage or a server restart loses nothing. Operations are stored as
//! JSON (`OutboundOp`); `slack_messages` keeps the `ts` of keyed messages so
//! in-place updates work across restarts. Writes go through the store's one
//! writer like every other write, so an outbox row commits in the same
//! transaction as the decision or text it carries when both are waiting.

use async_trait::async_trait;
use intercom_actors::model::now_ms;
use intercom_actors::ports::StoreError;
use intercom_actors::slack_port::{OutboundOp, Outbox, OutboxEntry, OutboxWrite};
use rusqlite::{Connection, params};

use super::{SqliteStore, backend, exec, write_error};

/// An [`OutboxWrite`] ready for SQL (operations encoded as JSON).
enum Stmt {
    Push {
        lane: String,
        json: String,
    },
    Replace {
        id: i64,
        json: String,
    },
    Delete {
        id: i64,
    },
    Fail {
        id: i64,
        error: String,
    },
    Remember {
        lane: String,
        key: String,
        ts: String,
    },
}

fn encode(op: &OutboundOp, what: &'static str) -> Result<String, StoreError> {
    serde_json::to_string(op).map_err(|e| StoreError::Backend {
        op: what,
        message: format!("cannot encode JSON: {e}"),
    })
}

impl Stmt {
    fn of(w: &OutboxWrite) -> Result<Stmt, StoreError> {
        Ok(match w {
            OutboxWrite::Push { lane, op } => Stmt::Push {
                lane: lane.clone(),
                json: encode(op, "push outbox")?,
            },
            OutboxWrite::Replace { id, op } => Stmt::Replace {
                id: *id,
                json: encode(op, "replace outbox row")?,
            },
            OutboxWrite::Delete { id } => Stmt::Delete { id: *id },
            OutboxWrite::Fail { id, error } => Stmt::Fail {
                id: *id,
                error: error.clone(),
            },
            OutboxWrite::Remember { lane, key, ts } => Stmt::Remember {
                lane: lane.clone(),
                key: key.clone(),
                ts: ts.clone(),
            },
        })
    }

    /// Runs the statement; a push returns its row id.
    fn run(&self, now: i64, conn: &Connection) -> Result<Option<i64>, StoreError> {
        match self {
            Stmt::Push { lane, json } => {
                return conn
                    .prepare_cached(
                        "INSERT INTO slack_outbox (lane, op, created_at) VALUES (?, ?, ?)",
                    )
                    .and_then(|mut s| s.insert(params![lane, json, now]))
                    .map(Some)
                    .map_err(write_error("push outbox"));
            }
            Stmt::Replace { id, json } => exec(
                conn,
                "replace outbox row",
                "UPDATE slack_outbox SET op = ? WHERE id = ? AND status = 'pending'",
                params![json, id],
            ),
            Stmt::Delete { id } => exec(
                conn,
                "delete outbox row",
                "DELETE FROM slack_outbox WHERE id = ?",
                [id],
            ),
            Stmt::Fail { id, error } => exec(
                conn,
                "fail outbox row",
                "UPDATE slack_outbox SET status = 'failed', error = ? WHERE id = ?",
                params![error, id],
            ),
            Stmt::Remember { lane, key, ts } => exec(
                conn,
                "remember slack message",
                "INSERT INTO slack_messages (lane, key, ts, created_at) VALUES (?, ?, ?, ?) \
                 ON CONFLICT (lane, key) DO UPDATE SET ts = excluded.ts",
                params![lane, key, ts, now],
            ),
        }
        .map(|_| None)
    }
}

#[async_trait]
impl Outbox for SqliteStore {
    /// One write through the store's writer: the whole batch runs in one
    /// savepoint of one transaction, so it commits (or fails) as a unit.
    async fn apply(&self, writes: &[OutboxWrite]) -> Result<Vec<Option<i64>>, StoreError> {
        let stmts = writes.iter().map(Stmt::of).collect::<Result<Vec<_>, _>>()?;
        self.write((stmts, now_ms()), |(stmts, now), conn| {
            stmts.iter().map(|stmt| stmt.run(*now, conn)).collect()
        })
        .await
    }

    async fn pending(&self) -> Result<Vec<OutboxEntry>, StoreError> {
        let rows: Vec<(i64, String, String)> = sqlx::query_as(
            "SELECT id, lane, op FROM slack_outbox WHERE status = 'pending' ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(backend("read outbox"))?;
        let mut out = Vec::with_capacity(rows.len());
        for (id, lane, op) in rows {
            match serde_json::from_str::<OutboundOp>(&op) {
                Ok(op) => out.push(OutboxEntry { id, lane, op }),
                Err(e) => {
                    // Unreadable (written by another version): keep it, flagged.
                    tracing::error!(id, "unreadable Slack outbox row: {e}");
                    self.fail(id, &format!("unreadable: {e}")).await?;
                }
            }
        }
        Ok(out)
    }

    async fn recall(&self, lane: &str, key: &str) -> Result<Option<String>, StoreError> {
        sqlx::query_scalar("SELECT ts FROM slack_messages WHERE lane = ? AND key = ?")
            .bind(lane)
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend("recall slack message"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use intercom_actors::slack_port::MessageBody;

    fn post(text: &str) -> OutboundOp {
        OutboundOp::Post {
            channel: "C1".into(),
            in_thread: true,
            key: None,
            body: MessageBody::text(text),
        }
    }

    #[tokio::test]
    async fn pending_rows_come_back_in_order_until_delivered() {
        let store = SqliteStore::open_in_memory().await.expect("open");
        let a = store.push("s-1", &post("a")).await.expect("push");
        let b = store.push("s-2", &post("b")).await.expect("push");
        let c = store.push("s-1", &post("c")).await.expect("push");
        store.delete(b).await.expect("delete");
        store.fail(c, "invalid_blocks").await.expect("fail");
        let pending = store.pending().await.expect("pending");
        assert_eq!(pending.len(), 1);
        assert_eq!((pending[0].id, pending[0].lane.as_str()), (a, "s-1"));
        assert_eq!(pending[0].op, post("a"));
    }

    #[tokio::test]
    async fn a_replaced_row_keeps_its_place_and_a_failed_one_is_not_revived() {
        let store = SqliteStore::open_in_memory().await.expect("open");
        let a = store.push("s-1", &post("a")).await.expect("push");
        let b = store.push("s-1", &post("b")).await.expect("push");
        store.fail(b, "invalid_blocks").await.expect("fail");
        store.replace(a, &post("a2")).await.expect("replace");
        store.replace(b, &post("b2")).await.expect("replace");
        let pending = store.pending().await.expect("pending");
        assert_eq!(pending.len(), 1);
        assert_eq!((pending[0].id, &pending[0].op), (a, &post("a2")));
    }

    #[tokio::test]
    async fn keyed_timestamps_are_remembered_and_replaced() {
        let store = SqliteStore::open_in_memory().await.expect("open");
        assert_eq!(store.recall("s-1", "root").await.expect("recall"), None);
        store
            .remember("s-1", "root", "1.0")
            .await
            .expect("remember");
        store
            .remember("s-1", "root", "2.0")
            .await
            .expect("remember");
        assert_eq!(
            store
                .recall("s-1", "root")
                .await
                .expect("recall")
                .as_deref(),
            Some("2.0")
        );
    }

    #[tokio::test]
    async fn a_batch_applies_in_order_as_one_commit() {
        let store = SqliteStore::open_in_memory().await.expect("open");
        let kept = store.push("s-1", &post("kept")).await.expect("push");
        let before = store.commit_count();
        let ids = store
            .apply(&[
                OutboxWrite::Push {
                    lane: "s-1".into(),
                    op: post("new"),
                },
                OutboxWrite::Replace {
                    id: kept,
                    op: post("kept2"),
                },
                OutboxWrite::Remember {
                    lane: "s-1".into(),
                    key: "root".into(),
                    ts: "1.0".into(),
                },
                OutboxWrite::Delete { id: kept },
            ])
            .await
            .expect("apply");
        assert_eq!(store.commit_count() - before, 1, "one commit for the batch");
        assert_eq!(ids.len(), 4);
        let new = ids[0].expect("a push returns its id");
        assert!(ids[1..].iter().all(Option::is_none));
        let pending = store.pending().await.expect("pending");
        assert_eq!(pending.len(), 1);
        assert_eq!((pending[0].id, &pending[0].op), (new, &post("new")));
        assert_eq!(
            store
                .recall("s-1", "root")
                .await
                .expect("recall")
                .as_deref(),
            Some("1.0")
        );
    }

    #[tokio::test]
    async fn a_file_database_keeps_the_outbox_across_reopening() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("db.sqlite");
        {
            let store = SqliteStore::open(&path).await.expect("open");
            store.push("s-1", &post("kept")).await.expect("push");
            store.close().await;
        }
        let store = SqliteStore::open(&path).await.expect("reopen");
        let pending = store.pending().await.expect("pending");
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].op, post("kept"));
    }
}
