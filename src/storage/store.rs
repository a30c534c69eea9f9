//! `SessionStore` for [`SqliteStore`]: the queries behind the core's port.
//!
//! Why this exists: it is the only place that turns the port's operations into
//! SQL. Every write is queued to the store's one writer (`writer.rs`), which
//! runs it inside a savepoint of the transaction it is batching and answers
//! once that transaction committed, so a write is durable when its method
//! returns; reads go straight to the pool. Runtime-checked queries only, so
//! building needs no database.

use async_trait::async_trait;
use futures::TryStreamExt;
use intercom_actors::model::{
    AuditEntry, Decision, MessageKind, PendingRequest, RequestStatus, Role, SessionId,
    SessionRecord, SessionStatus, Steering, TranscriptEntry, now_ms,
};
use intercom_actors::ports::{Clearance, SessionStore, StoreError};
use intercom_actors::transcript::{PageFill, TranscriptPage, TranscriptSlice};
use rusqlite::{Connection, OptionalExtension, params};

use super::flags::SessionFlag;
use super::pages;
use super::rows::{
    KeyedRequestRow, MessageRow, RequestRow, SessionRow, SteeringRow, request_columns,
    session_columns,
};
use super::{SqliteStore, backend, exec, session_not_found, write_error};

/// Runs an insert that names session `id`; a foreign-key violation means
/// the session is missing. Returns the new row's id.
fn insert_for_session(
    conn: &Connection,
    op: &'static str,
    id: &SessionId,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<i64, StoreError> {
    match conn.prepare_cached(sql).and_then(|mut s| s.insert(params)) {
        Ok(row) => Ok(row),
        Err(e)
            if e.sqlite_error().is_some_and(|d| {
                d.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY
            }) =>
        {
            Err(session_not_found(id))
        }
        Err(e) => Err(write_error(op)(e)),
    }
}

/// Encodes a value as JSON text for a column.
pub(super) fn to_json<T: serde::Serialize>(
    op: &'static str,
    value: &T,
) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Backend {
        op,
        message: format!("cannot encode JSON: {e}"),
    })
}

/// NotFound for session `id` when an `UPDATE` of it touched no row.
pub(super) fn one_session(changed: usize, id: &SessionId) -> Result<(), StoreError> {
    if changed == 0 {
        return Err(session_not_found(id));
    }
    Ok(())
}

/// NotFound for message `id` when an `UPDATE` of it touched no row.
fn one_message(changed: usize, id: i64) -> Result<(), StoreError> {
    if changed == 0 {
        return Err(StoreError::NotFound {
            what: format!("message {id}"),
        });
    }
    Ok(())
}

/// Characters of a diff kept once its request closed undecided or was
/// decided by a rule or a mode.
const CLOSED_DIFF_KEPT: i64 = 64 * 1024;

#[async_trait]
impl SessionStore for SqliteStore {
    async fn create_session(&self, rec: &SessionRecord) -> Result<(), StoreError> {
        self.write(rec.clone(), |rec, conn| {
            exec(
                conn,
                "insert session",
                concat!(
                    "INSERT INTO sessions (",
                    session_columns!(),
                    ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                ),
                params![
                    rec.id.0,
                    rec.workspace,
                    rec.cwd,
                    rec.agent,
                    rec.protocol.as_str(),
                    rec.status.as_str(),
                    rec.status_reason,
                    rec.title,
                    rec.owner,
                    rec.acp_session_id,
                    rec.channel_id,
                    rec.thread_ts,
                    i64::from(rec.restart_count),
                    rec.created_at,
                    rec.updated_at,
                    rec.last_activity_at,
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn delete_session(&self, id: &SessionId) -> Result<(), StoreError> {
        self.write(id.clone(), |id, conn| {
            exec(
                conn,
                "delete session",
                "DELETE FROM sessions WHERE id = ?",
                [&id.0],
            )?;
            Ok(())
        })
        .await
    }

    async fn get_session(&self, id: &SessionId) -> Result<Option<SessionRecord>, StoreError> {
        let row: Option<SessionRow> = sqlx::query_as(concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions WHERE id = ?"
        ))
        .bind(&id.0)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend("read session"))?;
        row.map(SessionRecord::try_from).transpose()
    }

    async fn session_by_thread(
        &self,
        channel: &str,
        thread_ts: &str,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let row: Option<SessionRow> = sqlx::query_as(concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions WHERE channel_id = ? AND thread_ts = ? LIMIT 1"
        ))
        .bind(channel)
        .bind(thread_ts)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend("find session by thread"))?;
        row.map(SessionRecord::try_from).transpose()
    }

    async fn list_sessions(&self, live_only: bool) -> Result<Vec<SessionRecord>, StoreError> {
        let query = if live_only {
            concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE status IN ('starting', 'active', 'stalled') \
                 ORDER BY created_at DESC, id DESC"
            )
        } else {
            concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions ORDER BY created_at DESC, id DESC"
            )
        };
        let rows: Vec<SessionRow> = sqlx::query_as(query)
            .fetch_all(&self.pool)
            .await
            .map_err(backend("list sessions"))?;
        rows.into_iter().map(SessionRecord::try_from).collect()
    }

    async fn set_status(
        &self,
        id: &SessionId,
        status: SessionStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        let data = (id.clone(), status, reason.map(str::to_owned), now_ms());
        self.write(data, |(id, status, reason, now), conn| {
            let changed = exec(
                conn,
                "set session status",
                "UPDATE sessions SET status = ?, status_reason = ?, updated_at = ? WHERE id = ?",
                params![status.as_str(), reason, now, id.0],
            )?;
            one_session(changed, id)
        })
        .await
    }

    async fn set_acp_session_id(&self, id: &SessionId, acp_id: &str) -> Result<(), StoreError> {
        let data = (id.clone(), acp_id.to_owned(), now_ms());
        self.write(data, |(id, acp_id, now), conn| {
            let changed = exec(
                conn,
                "set acp session id",
                "UPDATE sessions SET acp_session_id = ?, updated_at = ? WHERE id = ?",
                params![acp_id, now, id.0],
            )?;
            one_session(changed, id)
        })
        .await
    }

    async fn set_thread(&self, id: &SessionId, channel: &str, ts: &str) -> Result<(), StoreError> {
        const OP: &str = "set session thread";
        let data = (id.clone(), channel.to_owned(), ts.to_owned(), now_ms());
        self.write(data, |(id, channel, ts, now), conn| {
            let changed = exec(
                conn,
                OP,
                "UPDATE sessions SET channel_id = ?, thread_ts = ?, updated_at = ? \
                 WHERE id = ? AND thread_ts IS NULL",
                params![channel, ts, now, id.0],
            )?;
            if changed == 0 {
                // Either the thread is already set (immutable: ignore) or no such session.
                let found: Option<i64> = conn
                    .prepare_cached("SELECT 1 FROM sessions WHERE id = ?")
                    .and_then(|mut s| s.query_row([&id.0], |r| r.get(0)).optional())
                    .map_err(write_error(OP))?;
                if found.is_none() {
                    return Err(session_not_found(id));
                }
                tracing::debug!(session = %id, "thread already set; keeping the first one");
            }
            Ok(())
        })
        .await
    }

    async fn set_restart_count(&self, id: &SessionId, count: u32) -> Result<(), StoreError> {
        let data = (id.clone(), count, now_ms());
        self.write(data, |(id, count, now), conn| {
            let changed = exec(
                conn,
                "set restart count",
                "UPDATE sessions SET restart_count = ?, updated_at = ? WHERE id = ?",
                params![i64::from(*count), now, id.0],
            )?;
            one_session(changed, id)
        })
        .await
    }

    async fn set_agent_process(
        &self,
        id: &SessionId,
        process: Option<(i32, u64)>,
    ) -> Result<(), StoreError> {
        self.write((id.clone(), process), |(id, process), conn| {
            let changed = exec(
                conn,
                "record agent process",
                "UPDATE sessions SET agent_pid = ?, agent_start = ? WHERE id = ?",
                params![
                    process.map(|p| i64::from(p.0)),
                    process.map(|p| p.1 as i64),
                    id.0
                ],
            )?;
            one_session(changed, id)
        })
        .await
    }

    async fn agent_process(&self, id: &SessionId) -> Result<Option<(i32, u64)>, StoreError> {
        let row: Option<(Option<i64>, Option<i64>)> =
            sqlx::query_as("SELECT agent_pid, agent_start FROM sessions WHERE id = ?")
                .bind(&id.0)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| StoreError::Backend {
                    op: "read agent process",
                    message: e.to_string(),
                })?;
        Ok(match row {
            Some((Some(pid), Some(start))) => Some((pid as i32, start as u64)),
            _ => None,
        })
    }

    async fn touch(&self, id: &SessionId) -> Result<(), StoreError> {
        self.write((id.clone(), now_ms()), |(id, now), conn| {
            let changed = exec(
                conn,
                "touch session",
                "UPDATE sessions SET last_activity_at = ? WHERE id = ?",
                params![now, id.0],
            )?;
            one_session(changed, id)
        })
        .await
    }

    async fn append_message(
        &self,
        id: &SessionId,
        role: Role,
        kind: MessageKind,
        content: &str,
    ) -> Result<i64, StoreError> {
        let data = (id.clone(), role, kind, content.to_owned(), now_ms());
        self.write(data, |(id, role, kind, content, now), conn| {
            insert_for_session(
                conn,
                "append message",
                id,
                "INSERT INTO messages (session_id, role, kind, content, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, ?, ?)",
                params![id.0, role.as_str(), kind.as_str(), content, now, now],
            )
        })
        .await
    }

    async fn append_to_message(&self, message_id: i64, tail: &str) -> Result<(), StoreError> {
        let data = (message_id, tail.to_owned(), now_ms());
        self.write(data, |(message_id, tail, now), conn| {
            let changed = exec(
                conn,
                "append to message",
                "UPDATE messages SET content = content || ?, updated_at = ? WHERE id = ?",
                params![tail, now, message_id],
            )?;
            one_message(changed, *message_id)
        })
        .await
    }

    async fn update_message(&self, message_id: i64, content: &str) -> Result<(), StoreError> {
        let data = (message_id, content.to_owned(), now_ms());
        self.write(data, |(message_id, content, now), conn| {
            let changed = exec(
                conn,
                "update message",
                "UPDATE messages SET content = ?, updated_at = ? WHERE id = ?",
                params![content, now, message_id],
            )?;
            one_message(changed, *message_id)
        })
        .await
    }

    async fn transcript_page(
        &self,
        id: &SessionId,
        page: TranscriptPage,
    ) -> Result<TranscriptSlice, StoreError> {
        // Rows stream in reading order and the page stops taking them at its
        // bounds, so a huge transcript is never loaded whole.
        let sql = if page.newest_first() {
            "SELECT id, role, kind, content, created_at FROM messages \
             WHERE session_id = ?1 AND id < ?2 AND (?3 IS NULL OR kind = ?3) ORDER BY id DESC"
        } else {
            "SELECT id, role, kind, content, created_at FROM messages \
             WHERE session_id = ?1 AND id > ?2 AND (?3 IS NULL OR kind = ?3) ORDER BY id"
        };
        let mut rows = sqlx::query_as::<_, MessageRow>(sql)
            .bind(&id.0)
            .bind(page.bound())
            .bind(page.kind.map(|k| k.as_str()))
            .fetch(&self.pool);
        let mut fill = PageFill::new(page);
        while let Some(row) = rows.try_next().await.map_err(backend("read transcript"))? {
            if !fill.offer(TranscriptEntry::try_from(row)?) {
                break;
            }
        }
        Ok(fill.finish())
    }

    async fn insert_request(&self, req: &PendingRequest) -> Result<(), StoreError> {
        const OP: &str = "insert request";
        let paths = to_json(OP, &req.paths)?;
        let options = to_json(OP, &req.options)?;
        self.write(
            (req.clone(), paths, options),
            |(req, paths, options), conn| {
                insert_for_session(
                    conn,
                    OP,
                    &req.session_id,
                    "INSERT INTO requests (id, session_id, request_id, kind, title, diff, paths, \
                 options, status, wire_id, created_at, tool_kind, command) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    params![
                        req.id,
                        req.session_id.0,
                        req.request_id,
                        req.kind.as_str(),
                        req.title,
                        req.diff,
                        paths,
                        options,
                        req.status.as_str(),
                        req.wire_id,
                        req.created_at,
                        req.tool_kind,
                        req.command,
                    ],
                )?;
                Ok(())
            },
        )
        .await
    }

    async fn decide_request(&self, id: &str, decision: &Decision) -> Result<(), StoreError> {
        self.write((id.to_owned(), decision.clone()), |(id, decision), conn| {
            decide_on(conn, id, decision)
        })
        .await
    }

    async fn decide_request_audited(
        &self,
        id: &str,
        decision: &Decision,
        entry: &AuditEntry,
    ) -> Result<(), StoreError> {
        let data = (id.to_owned(), decision.clone(), AuditRow::of(entry)?);
        self.write(data, |(id, decision, row), conn| {
            decide_on(conn, id, decision)?;
            row.insert_on(conn)
        })
        .await
    }

    /// Closes a pending request undecided (cancelled, expired, ...);
    /// its diff is cut to [`CLOSED_DIFF_KEPT`] characters.
    async fn close_request(&self, id: &str, status: RequestStatus) -> Result<(), StoreError> {
        const OP: &str = "close request";
        if status == RequestStatus::Pending {
            return Err(StoreError::Backend {
                op: OP,
                message: format!("request {id} cannot be closed as pending"),
            });
        }
        self.write((id.to_owned(), status), |(id, status), conn| {
            let changed = exec(
                conn,
                OP,
                // A request closed undecided keeps the start of its diff
                // only: nobody will act on the rest, and a probe's client
                // filled the disk at 40 MB a second by opening and
                // cancelling clearances of 3.9 MB diffs.
                "UPDATE requests SET status = ?1, diff = CASE WHEN length(diff) > ?3 \
                 THEN substr(diff, 1, ?3) || ?4 ELSE diff END \
                 WHERE id = ?2 AND status = 'pending'",
                params![
                    status.as_str(),
                    id,
                    CLOSED_DIFF_KEPT,
                    "\n(the rest of this diff was not kept: the request closed undecided)\n"
                ],
            )?;
            if changed == 0 {
                let exists: Option<i64> = conn
                    .prepare_cached("SELECT 1 FROM requests WHERE id = ?")
                    .and_then(|mut s| s.query_row([id], |r| r.get(0)).optional())
                    .map_err(write_error(OP))?;
                if exists.is_none() {
                    return Err(StoreError::NotFound {
                        what: format!("request {id}"),
                    });
                }
            }
            Ok(())
        })
        .await
    }

    async fn get_request(
        &self,
        id: &str,
    ) -> Result<Option<(PendingRequest, Option<Decision>)>, StoreError> {
        let row: Option<RequestRow> = sqlx::query_as(concat!(
            "SELECT ",
            request_columns!(),
            " FROM requests WHERE id = ?"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend("read request"))?;
        row.map(RequestRow::into_parts).transpose()
    }

    async fn list_requests(
        &self,
        session: Option<&SessionId>,
        pending_only: bool,
    ) -> Result<Vec<PendingRequest>, StoreError> {
        // `?1 IS NULL` keeps one statement for all four filter combinations.
        let rows: Vec<RequestRow> = sqlx::query_as(concat!(
            "SELECT ",
            request_columns!(),
            " FROM requests WHERE (?1 IS NULL OR session_id = ?1) \
             AND (?2 = 0 OR status = 'pending') \
             ORDER BY created_at DESC, rowid DESC"
        ))
        .bind(session.map(|s| s.0.as_str()))
        .bind(pending_only)
        .fetch_all(&self.pool)
        .await
        .map_err(backend("list requests"))?;
        rows.into_iter()
            .map(|r| r.into_parts().map(|(req, _)| req))
            .collect()
    }

    async fn request_ids(&self, session: &SessionId) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar("SELECT request_id FROM requests WHERE session_id = ?")
            .bind(&session.0)
            .fetch_all(&self.pool)
            .await
            .map_err(backend("list request ids"))
    }

    async fn enqueue_steering(
        &self,
        id: &SessionId,
        text: &str,
        author: &str,
    ) -> Result<Steering, StoreError> {
        let steering = Steering {
            id: 0,
            session_id: id.clone(),
            text: text.to_owned(),
            author: author.to_owned(),
            created_at: now_ms(),
        };
        self.write(steering, |steering, conn| {
            let id = insert_for_session(
                conn,
                "enqueue steering",
                &steering.session_id,
                "INSERT INTO steering (session_id, text, author, created_at) \
                 VALUES (?, ?, ?, ?)",
                params![
                    steering.session_id.0,
                    steering.text,
                    steering.author,
                    steering.created_at
                ],
            )?;
            Ok(Steering {
                id,
                ..steering.clone()
            })
        })
        .await
    }

    async fn set_paused(&self, id: &SessionId, paused: bool) -> Result<(), StoreError> {
        self.set_flag(id, SessionFlag::Paused, paused).await
    }

    async fn is_paused(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.flag(id, SessionFlag::Paused).await
    }

    async fn set_turn_running(&self, id: &SessionId, running: bool) -> Result<(), StoreError> {
        self.set_flag(id, SessionFlag::TurnRunning, running).await
    }

    async fn turn_was_running(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.flag(id, SessionFlag::TurnRunning).await
    }

    async fn undelivered_steering(&self, id: &SessionId) -> Result<Vec<Steering>, StoreError> {
        let rows: Vec<SteeringRow> = sqlx::query_as(
            "SELECT id, session_id, text, author, created_at FROM steering \
             WHERE session_id = ? AND delivered_at IS NULL ORDER BY id",
        )
        .bind(&id.0)
        .fetch_all(&self.pool)
        .await
        .map_err(backend("read undelivered steering"))?;
        Ok(rows.into_iter().map(Steering::from).collect())
    }

    async fn mark_steering_delivered(&self, steering_id: i64) -> Result<(), StoreError> {
        self.write((steering_id, now_ms()), |(steering_id, now), conn| {
            // COALESCE keeps the first delivery time if this is called twice.
            let changed = exec(
                conn,
                "mark steering delivered",
                "UPDATE steering SET delivered_at = COALESCE(delivered_at, ?) WHERE id = ?",
                params![now, steering_id],
            )?;
            if changed == 0 {
                return Err(StoreError::NotFound {
                    what: format!("steering {steering_id}"),
                });
            }
            Ok(())
        })
        .await
    }

    async fn approval_mode(
        &self,
        id: &SessionId,
    ) -> Result<intercom_actors::rules::ApprovalMode, StoreError> {
        let name = SqliteStore::approval_mode(self, id).await?;
        Ok(intercom_actors::rules::ApprovalMode::parse(&name).unwrap_or_default())
    }

    async fn set_approval_mode(
        &self,
        id: &SessionId,
        mode: intercom_actors::rules::ApprovalMode,
    ) -> Result<(), StoreError> {
        SqliteStore::set_approval_mode(self, id, mode.as_str()).await
    }

    async fn record_clearance(&self, clearance: &Clearance) -> Result<(), StoreError> {
        self.insert_clearance(clearance).await
    }

    async fn clearance(&self, request_id: &str) -> Result<Option<Clearance>, StoreError> {
        self.read_clearance(request_id).await
    }

    async fn claim_clearance(
        &self,
        request_id: &str,
        session_id: &SessionId,
        at: i64,
    ) -> Result<bool, StoreError> {
        self.mark_clearance_applied(request_id, session_id, at)
            .await
    }

    async fn release_clearance(&self, request_id: &str) -> Result<(), StoreError> {
        self.unmark_clearance_applied(request_id).await
    }

    async fn audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        self.write(AuditRow::of(entry)?, |row, conn| row.insert_on(conn))
            .await
    }
}

/// Records `decision` on request `id` if it is still pending (on the
/// writer's connection, inside its transaction).
fn decide_on(conn: &Connection, id: &str, decision: &Decision) -> Result<(), StoreError> {
    const OP: &str = "decide request";
    // A request decided by a rule or a mode keeps the start of its diff
    // only, as one closed undecided does: no one read it, and a probe's
    // agent in mode `auto` stored 103 MB of diffs in 10 s.
    let automatic =
        decision.decided_by.starts_with("rule:") || decision.decided_by.starts_with("mode:");
    let changed = exec(
        conn,
        OP,
        "UPDATE requests SET status = 'decided', option_id = ?1, approved = ?2, \
         reason = ?3, decided_by = ?4, decided_at = ?5, \
         diff = CASE WHEN ?7 AND length(diff) > ?8 THEN substr(diff, 1, ?8) || ?9 ELSE diff END \
         WHERE id = ?6 AND status = 'pending'",
        params![
            decision.option_id,
            decision.approved,
            decision.reason,
            decision.decided_by,
            decision.decided_at,
            id,
            automatic,
            CLOSED_DIFF_KEPT,
            "\n(the rest of this diff was not kept: the request was decided automatically)\n"
        ],
    )?;
    if changed == 1 {
        return Ok(());
    }
    // Same transaction, so the status read here is the one that made the
    // update miss.
    let status: Option<String> = conn
        .prepare_cached("SELECT status FROM requests WHERE id = ?")
        .and_then(|mut s| s.query_row([id], |r| r.get(0)).optional())
        .map_err(write_error(OP))?;
    match status {
        None => Err(StoreError::NotFound {
            what: format!("request {id}"),
        }),
        Some(status) => Err(StoreError::AlreadyResolved {
            id: id.to_owned(),
            status,
        }),
    }
}

/// An audit entry as stored.
struct AuditRow {
    session_id: Option<SessionId>,
    actor: String,
    action: String,
    detail: String,
    at: i64,
}

impl AuditRow {
    fn of(entry: &AuditEntry) -> Result<AuditRow, StoreError> {
        Ok(AuditRow {
            session_id: entry.session_id.clone(),
            actor: entry.actor.clone(),
            action: entry.action.clone(),
            detail: to_json("append audit entry", &entry.detail)?,
            at: now_ms(),
        })
    }

    /// Appends the row (on the writer's connection).
    fn insert_on(&self, conn: &Connection) -> Result<(), StoreError> {
        exec(
            conn,
            "append audit entry",
            "INSERT INTO audit (at, session_id, actor, action, detail) VALUES (?, ?, ?, ?, ?)",
            params![
                self.at,
                self.session_id.as_ref().map(|s| s.0.as_str()),
                self.actor,
                self.action,
                self.detail
            ],
        )?;
        Ok(())
    }
}

impl SqliteStore {
    /// A page of every session's requests, newest first, optionally with
    /// one status ([`pages`]: bounded in count and bytes, streamed).
    pub async fn requests_page(
        &self,
        status: Option<RequestStatus>,
        bounds: pages::Bounds,
    ) -> Result<pages::Page<PendingRequest>, StoreError> {
        // The key is the rowid; the order is (created_at, rowid). Two
        // statements, so each uses its index (`requests_status` with a
        // status, `requests_created` without) and starts at the cursor's
        // (created_at, rowid) instead of scanning from the newest row.
        let (at, seq) = match bounds.before {
            None => (i64::MAX, i64::MAX),
            Some(key) => sqlx::query_as::<_, (i64, i64)>(
                "SELECT created_at, rowid FROM requests WHERE rowid = ?",
            )
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend("list requests"))?
            // Requests are never deleted; an unknown key starts at the top.
            .unwrap_or((i64::MAX, i64::MAX)),
        };
        let rows = match status {
            Some(status) => sqlx::query_as::<_, KeyedRequestRow>(concat!(
                "SELECT rowid AS seq, ",
                request_columns!(),
                " FROM requests WHERE status = ? AND (created_at, rowid) < (?, ?) \
                 ORDER BY created_at DESC, rowid DESC"
            ))
            .bind(status.as_str())
            .bind(at)
            .bind(seq),
            None => sqlx::query_as::<_, KeyedRequestRow>(concat!(
                "SELECT rowid AS seq, ",
                request_columns!(),
                " FROM requests WHERE (created_at, rowid) < (?, ?) \
                 ORDER BY created_at DESC, rowid DESC"
            ))
            .bind(at)
            .bind(seq),
        }
        .fetch(&self.pool);
        pages::newest_first(rows, bounds, "list requests", |keyed| {
            let size = keyed.size();
            let (request, _) = keyed.row.into_parts()?;
            Ok((keyed.seq, size, request))
        })
        .await
    }
}
