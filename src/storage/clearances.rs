//! MCP clearances in SQLite (`mcp_clearances`, `migrations/0006_mcp_clearances.sql`).
//!
//! Why this exists: `check_clearance` records the hash of every target file
//! when it asks the operator, and `check_diff` applies the approved change
//! only while the files are unchanged, and only once. Both facts used to
//! live in the MCP server's memory, so a server restart turned every
//! approved change into "unverifiable" (apply only with `force`) and forgot
//! which ones were applied. They are rows now, written through the
//! group-commit writer like every other write. A row this binary cannot read
//! is a [`StoreError::Backend`] naming it (never treated as "no record").

use intercom_actors::model::{SessionId, now_ms};
use intercom_actors::ports::{Clearance, StoreError};
use sqlx::Row;

use super::{SqliteStore, backend, exec};

type Files = Vec<(String, Option<[u8; 32]>)>;

fn encode(files: &Files) -> Result<String, StoreError> {
    let rows: Vec<(&str, Option<String>)> = files
        .iter()
        .map(|(path, hash)| {
            let hex = hash.map(|h| h.iter().map(|b| format!("{b:02x}")).collect());
            (path.as_str(), hex)
        })
        .collect();
    serde_json::to_string(&rows).map_err(|e| StoreError::Backend {
        op: "encode clearance",
        message: e.to_string(),
    })
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn decode(request_id: &str, text: &str) -> Result<Files, StoreError> {
    let unreadable = |why: String| StoreError::Backend {
        op: "read clearance",
        message: format!("the clearance of {request_id} is unreadable: {why}"),
    };
    let rows: Vec<(String, Option<String>)> =
        serde_json::from_str(text).map_err(|e| unreadable(e.to_string()))?;
    rows.into_iter()
        .map(|(path, hash)| match hash {
            None => Ok((path, None)),
            Some(h) => unhex(&h)
                .map(|h| (path.clone(), Some(h)))
                .ok_or_else(|| unreadable(format!("bad hash for {path}"))),
        })
        .collect()
}

impl SqliteStore {
    pub(super) async fn insert_clearance(&self, c: &Clearance) -> Result<(), StoreError> {
        let data = (
            c.request_id.clone(),
            c.session_id.0.clone(),
            encode(&c.files)?,
            now_ms(),
        );
        self.write(data, |(request, session, files, now), conn| {
            exec(
                conn,
                "record clearance",
                "INSERT INTO mcp_clearances (request_id, session_id, files, created_at) \
                 VALUES (?, ?, ?, ?) \
                 ON CONFLICT (request_id) DO UPDATE SET files = excluded.files",
                rusqlite::params![request, session, files, now],
            )?;
            Ok(())
        })
        .await
    }

    pub(super) async fn read_clearance(
        &self,
        request_id: &str,
    ) -> Result<Option<Clearance>, StoreError> {
        let row = sqlx::query(
            "SELECT session_id, files, applied_at FROM mcp_clearances WHERE request_id = ?",
        )
        .bind(request_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend("read clearance"))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let files: String = row.get("files");
        Ok(Some(Clearance {
            request_id: request_id.to_owned(),
            session_id: SessionId(row.get("session_id")),
            files: decode(request_id, &files)?,
            applied_at: row.get("applied_at"),
        }))
    }

    pub(super) async fn mark_clearance_applied(
        &self,
        request_id: &str,
        session_id: &SessionId,
        at: i64,
    ) -> Result<bool, StoreError> {
        let data = (request_id.to_owned(), session_id.0.clone(), at);
        self.write(data, |(request, session, at), conn| {
            let changed = exec(
                conn,
                "mark clearance applied",
                "INSERT INTO mcp_clearances (request_id, session_id, files, created_at, applied_at) \
                 VALUES (?, ?, '[]', ?, ?) \
                 ON CONFLICT (request_id) DO UPDATE SET applied_at = excluded.applied_at \
                 WHERE mcp_clearances.applied_at IS NULL",
                rusqlite::params![request, session, at, at],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    pub(super) async fn unmark_clearance_applied(
        &self,
        request_id: &str,
    ) -> Result<(), StoreError> {
        self.write(request_id.to_owned(), |request, conn| {
            exec(
                conn,
                "release clearance",
                "UPDATE mcp_clearances SET applied_at = NULL WHERE request_id = ?",
                [request],
            )?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use intercom_actors::ports::SessionStore;

    async fn store() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("db.sqlite"))
            .await
            .expect("open");
        (dir, store)
    }

    fn clearance() -> Clearance {
        Clearance {
            request_id: "s-1:req-1".into(),
            session_id: SessionId("s-1".into()),
            files: vec![("a.txt".into(), Some([7u8; 32])), ("new.txt".into(), None)],
            applied_at: None,
        }
    }

    #[tokio::test]
    async fn a_clearance_survives_reopening_and_is_applied_once() {
        let (dir, store) = store().await;
        store.record_clearance(&clearance()).await.expect("record");
        store.close().await;
        let store = SqliteStore::open(&dir.path().join("db.sqlite"))
            .await
            .expect("reopen");
        let got = store.clearance("s-1:req-1").await.expect("read");
        assert_eq!(got, Some(clearance()));
        let sid = SessionId("s-1".into());
        assert!(
            store
                .claim_clearance("s-1:req-1", &sid, 5)
                .await
                .expect("claim")
        );
        assert!(
            !store
                .claim_clearance("s-1:req-1", &sid, 6)
                .await
                .expect("again")
        );
        let got = store.clearance("s-1:req-1").await.expect("read");
        assert_eq!(got.and_then(|c| c.applied_at), Some(5));
        // Recording the same request again keeps it applied.
        store.record_clearance(&clearance()).await.expect("record");
        let got = store.clearance("s-1:req-1").await.expect("read");
        assert_eq!(got.and_then(|c| c.applied_at), Some(5));
        store.release_clearance("s-1:req-1").await.expect("release");
        assert!(
            store
                .claim_clearance("s-1:req-1", &sid, 7)
                .await
                .expect("claim")
        );
        assert_eq!(store.clearance("nope").await.expect("read"), None);
    }

    #[tokio::test]
    async fn an_unreadable_clearance_is_an_error_not_a_missing_record() {
        let (_dir, store) = store().await;
        sqlx::query(
            "INSERT INTO mcp_clearances (request_id, session_id, files, created_at) VALUES ('x', 's', '[[\"a\",\"zz\"]]', 0)",
        )
        .execute(&store.pool)
        .await
        .expect("insert");
        assert!(store.clearance("x").await.is_err());
    }
}
