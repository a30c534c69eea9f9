//! SQLite persistence: the edge that implements the core's `SessionStore` port.
//!
//! Why this exists: sessions, transcripts, pending requests and their
//! decisions, queued steering and the audit log must survive a restart of the
//! server. This module opens (and migrates) one SQLite file, makes sure only
//! one agent-intercom instance uses it, and funnels every write through one
//! writer thread that commits whatever is waiting as one transaction (group
//! commit), so concurrent actors never fight over SQLite's write lock and a
//! busy server pays one commit for many writes. Reads go through a small
//! sqlx pool; writes run on the writer's own `rusqlite` connection
//! (`writer.rs` says why).
//!
//! Layout: [`SqliteStore`] and opening live here; the trait implementation is
//! in `store.rs`, the writer in `writer.rs`, row decoding in `rows.rs`, the
//! instance lock in `lock.rs`, the session row's yes/no flags in `flags.rs`,
//! and the check that the database file is still the one opened in
//! `file_identity.rs`.

mod checkpointer;
mod clearances;
pub mod console;
pub mod events;
mod file_identity;
mod flags;
mod lock;
mod outbox;
pub mod pages;
mod rows;
pub mod rules;
mod store;
mod writer;

use std::path::{Path, PathBuf};
use std::time::Duration;

use intercom_actors::model::{AuditEntry, SessionId, Steering};
use intercom_actors::ports::StoreError;
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use lock::{InstanceLock, LockFailure};
use rows::AuditRow;
pub(crate) use writer::WriteFn;
use writer::Writer;

/// The schema, embedded at build time from `migrations/`.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How many connections a file-backed store keeps (reads run in parallel;
/// writes all go through the one writer).
const MAX_CONNECTIONS: u32 = 4;

/// How long SQLite waits for a lock held by someone else before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the database could not be opened. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum StorageOpenError {
    /// The directory for the database file could not be created.
    #[error("cannot create database directory {}: {source}; {}", .path.display(), create_dir_hint(.source))]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The instance lock file could not be opened or locked.
    #[error("cannot open lock file {}: {source}; check that its directory is writable by this user", .path.display())]
    LockFile {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another agent-intercom instance holds the database.
    #[error("database {} is locked by another agent-intercom instance; stop it or point [database] path elsewhere", .path.display())]
    Locked {
        /// The database file.
        path: PathBuf,
    },
    /// The database file could not be created or opened.
    #[error("cannot open database {}: {source}; check the [database] path, its permissions and free disk space", .path.display())]
    Open {
        /// The database file.
        path: PathBuf,
        /// The driver error.
        source: sqlx::Error,
    },
    /// The writer's connection could not be opened, or its thread started.
    #[error("cannot open the writer's connection to database {}: {source}; check the [database] path, its permissions and free disk space", .path.display())]
    Writer {
        /// The database file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// Applying the schema failed.
    #[error("migration failed on database {}: {source}; if a newer agent-intercom wrote this file, upgrade or point [database] path elsewhere", .path.display())]
    Migrate {
        /// The database file.
        path: PathBuf,
        /// The migrator's error.
        source: MigrateError,
    },
}

/// The SQLite-backed [`SessionStore`](intercom_actors::ports::SessionStore).
///
/// Cheap to share behind an `Arc`. Reads use a small pool; every write is
/// queued to the one writer thread, which batches what is waiting into one
/// transaction and answers each write once that transaction committed (WAL,
/// `synchronous = NORMAL`: durable across a process crash, the last commits
/// may be lost on power loss).
#[derive(Debug)]
pub struct SqliteStore {
    /// Connections for reading (and for migrating, before the writer starts).
    pool: SqlitePool,
    /// The one writer thread.
    writer: Writer,
    /// Held for the life of the store.
    instance_lock: InstanceLock,
    /// The directory of a temporary store, deleted after everything else
    /// closed (None for a store on a file the operator chose).
    _temporary: Option<tempfile::TempDir>,
}

/// How long a start waits for the instance lock of a server that was just
/// killed ([`InstanceLock::acquire_within`]).
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3);

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, takes the
    /// single-instance lock and applies migrations.
    ///
    /// A missing parent directory is created with mode 0700 on unix; a new
    /// database file is created with mode 0600.
    pub async fn open(path: &Path) -> Result<SqliteStore, StorageOpenError> {
        create_parent_dir(path)?;

        let lock_path = InstanceLock::path_for(path);
        let instance_lock = match InstanceLock::acquire_within(&lock_path, LOCK_PATIENCE).await {
            Ok(lock) => lock,
            Err(LockFailure::Held) => {
                return Err(StorageOpenError::Locked {
                    path: path.to_owned(),
                });
            }
            Err(LockFailure::Io(source)) => {
                return Err(StorageOpenError::LockFile {
                    path: lock_path,
                    source,
                });
            }
        };

        precreate_private_file(path).map_err(|e| StorageOpenError::Open {
            path: path.to_owned(),
            source: sqlx::Error::Io(e),
        })?;

        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            // A local file connection does not go stale like a network one,
            // and one the writer cannot prove clean is closed, never
            // returned: no ping (a hop to its worker thread) per acquire.
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .map_err(|source| StorageOpenError::Open {
                path: path.to_owned(),
                source,
            })?;

        migrate(&pool, path).await?;
        let writer =
            Writer::start(path, BUSY_TIMEOUT).map_err(|source| StorageOpenError::Writer {
                path: path.to_owned(),
                source,
            })?;
        tracing::debug!(
            db = %path.display(),
            lock = %lock_path.display(),
            "storage opened"
        );
        Ok(SqliteStore {
            pool,
            writer,
            instance_lock,
            _temporary: None,
        })
    }

    /// Opens a fresh, private database in a temporary directory that is
    /// deleted with the store (for tests and benches). It is a real file,
    /// so it behaves exactly like an operator's database: WAL, the writer's
    /// own connection, readers that see only committed rows.
    pub async fn open_in_memory() -> Result<SqliteStore, StorageOpenError> {
        let dir = tempfile::tempdir().map_err(|source| StorageOpenError::CreateDir {
            path: std::env::temp_dir(),
            source,
        })?;
        let mut store = SqliteStore::open(&dir.path().join("intercom.db")).await?;
        store._temporary = Some(dir);
        Ok(store)
    }

    /// Queues one write to the writer and waits until the transaction that
    /// holds it committed. If `f` fails, only its own changes are undone.
    pub(crate) async fn write<D, T>(&self, data: D, f: WriteFn<D, T>) -> Result<T, StoreError>
    where
        D: Send + 'static,
        T: Send + 'static,
    {
        self.writer.write(data, f).await
    }

    /// Why nothing can be stored now, for `/healthz`: the database file
    /// was deleted or replaced under the running server, or the last commit
    /// failed (a full disk, say) and none has succeeded since.
    pub fn storage_problem(&self) -> Option<String> {
        self.writer.problem()
    }

    /// How many write transactions have committed since the store opened
    /// (each holds one or more writes).
    pub fn commit_count(&self) -> u64 {
        self.writer.commits()
    }

    /// How many writes have committed since the store opened.
    pub fn write_count(&self) -> u64 {
        self.writer.writes()
    }

    /// Answers the queued writes, closes every connection (checkpointing the
    /// WAL), then releases the instance lock. Dropping the store also
    /// releases everything, but without waiting for the writer or the
    /// connections to finish.
    pub async fn close(self) {
        self.writer.close().await;
        self.pool.close().await;
        tracing::debug!(lock = %self.instance_lock.path().display(), "storage closed");
    }

    /// The newest page of the audit log, oldest first, as `(unix ms,
    /// entry)`; optionally only one session's entries
    /// ([`pages::Bounds::default`]).
    pub async fn audit_log(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<(i64, AuditEntry)>, StoreError> {
        let mut page = self.audit_page(session, pages::Bounds::default()).await?;
        page.items.reverse();
        Ok(page.items)
    }

    /// A page of the audit log, newest first, as `(unix ms, entry)`;
    /// optionally only one session's entries.
    pub async fn audit_page(
        &self,
        session: Option<&SessionId>,
        bounds: pages::Bounds,
    ) -> Result<pages::Page<(i64, AuditEntry)>, StoreError> {
        // Two statements, so one session's page uses `audit_session`.
        let rows = match session {
            Some(id) => sqlx::query_as::<_, AuditRow>(
                "SELECT id, at, session_id, actor, action, detail FROM audit \
                 WHERE session_id = ? AND id < ? ORDER BY id DESC",
            )
            .bind(&id.0)
            .bind(bounds.before_key())
            .fetch(&self.pool),
            None => sqlx::query_as::<_, AuditRow>(
                "SELECT id, at, session_id, actor, action, detail FROM audit \
                 WHERE id < ? ORDER BY id DESC",
            )
            .bind(bounds.before_key())
            .fetch(&self.pool),
        };
        pages::newest_first(rows, bounds, "read audit log", |row| {
            let (id, size) = (row.id, row.detail.len() + row.actor.len());
            Ok((id, size, row.into_entry()?))
        })
        .await
    }

    /// How many sessions are starting, active or stalled.
    pub async fn count_live_sessions(&self) -> Result<usize, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM sessions WHERE status IN ('starting', 'active', 'stalled')",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(backend("count live sessions"))?;
        usize::try_from(n).map_err(|_| StoreError::Backend {
            op: "count live sessions",
            message: format!("impossible count {n}"),
        })
    }

    /// Sets a session's approval mode (stored verbatim; the caller validates).
    pub async fn set_approval_mode(&self, id: &SessionId, mode: &str) -> Result<(), StoreError> {
        let data = (
            id.clone(),
            mode.to_owned(),
            intercom_actors::model::now_ms(),
        );
        self.write(data, |(id, mode, now), conn| {
            let done = exec(
                conn,
                "set approval mode",
                "UPDATE sessions SET approval_mode = ?, updated_at = ? WHERE id = ?",
                rusqlite::params![mode, now, id.0],
            )?;
            if done == 0 {
                return Err(session_not_found(id));
            }
            Ok(())
        })
        .await
    }

    /// A session's approval mode (`ask` unless set).
    pub async fn approval_mode(&self, id: &SessionId) -> Result<String, StoreError> {
        sqlx::query_scalar("SELECT approval_mode FROM sessions WHERE id = ?")
            .bind(&id.0)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend("read approval mode"))?
            .ok_or_else(|| session_not_found(id))
    }

    /// A session's latest `limit` steering messages, oldest first, each with
    /// when it reached the agent (`None`: still queued).
    pub async fn steering_history(
        &self,
        id: &SessionId,
        limit: u32,
    ) -> Result<Vec<(Steering, Option<i64>)>, StoreError> {
        let rows: Vec<(i64, String, String, i64, Option<i64>)> = sqlx::query_as(
            "SELECT id, text, author, created_at, delivered_at FROM steering \
             WHERE session_id = ? ORDER BY id DESC LIMIT ?",
        )
        .bind(&id.0)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(backend("read steering"))?;
        Ok(rows
            .into_iter()
            .rev()
            .map(|(sid, text, author, created_at, delivered_at)| {
                let steering = Steering {
                    id: sid,
                    session_id: id.clone(),
                    text,
                    author,
                    created_at,
                };
                (steering, delivered_at)
            })
            .collect())
    }
}

/// Maps a driver error into [`StoreError::Backend`] for operation `op`.
fn backend(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::Backend {
        op,
        message: e.to_string(),
    }
}

/// Maps a driver error on the writer's connection to the port's error.
fn write_error(op: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |e| StoreError::Backend {
        op,
        message: e.to_string(),
    }
}

/// Runs one write statement (prepared once, cached on the writer's
/// connection); how many rows it changed.
fn exec(
    conn: &rusqlite::Connection,
    op: &'static str,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<usize, StoreError> {
    conn.prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute(params))
        .map_err(write_error(op))
}

/// Applies the schema (before the writer starts, so nothing writes beside it).
async fn migrate(pool: &SqlitePool, path: &Path) -> Result<(), StorageOpenError> {
    MIGRATOR
        .run(pool)
        .await
        .map_err(|source| StorageOpenError::Migrate {
            path: path.to_owned(),
            source,
        })
}

/// The error for a session id with no row.
fn session_not_found(id: &SessionId) -> StoreError {
    StoreError::NotFound {
        what: format!("session {id}"),
    }
}

/// Creates the database's parent directory (0700 on unix) when missing.
fn create_parent_dir(path: &Path) -> Result<(), StorageOpenError> {
    let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    if parent.is_dir() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder
        .create(parent)
        .map_err(|source| StorageOpenError::CreateDir {
            path: parent.to_owned(),
            source,
        })
}

/// What to do when the database's directory cannot be made, by why.
fn create_dir_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        // A file where the directory (or one above it) should be: "create
        // it" would be wrong advice.
        std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotADirectory => {
            "a file stands where that directory (or one above it) should be: move the file away or point [database] path elsewhere"
        }
        std::io::ErrorKind::PermissionDenied => {
            "make the directory above it writable by this user, or point [database] path elsewhere"
        }
        _ => "create it or point [database] path elsewhere",
    }
}

/// Creates an empty database file readable only by this user, when missing.
/// SQLite treats an empty file as a new database and gives its `-wal` and
/// `-shm` files the same permissions.
fn precreate_private_file(path: &Path) -> std::io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    match opts.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use intercom_actors::model::{MessageKind, Protocol, Role, SessionRecord, SessionStatus};
    use intercom_actors::ports::SessionStore;

    /// A minimal active session row (also used by the writer's tests).
    pub(crate) fn rec(id: &str) -> SessionRecord {
        SessionRecord {
            id: SessionId::from(id),
            workspace: "w".into(),
            cwd: "/".into(),
            agent: "a".into(),
            protocol: Protocol::Acp,
            status: SessionStatus::Active,
            status_reason: None,
            title: "t".into(),
            owner: "u".into(),
            acp_session_id: None,
            channel_id: None,
            thread_ts: None,
            restart_count: 0,
            created_at: 1,
            updated_at: 1,
            last_activity_at: 1,
        }
    }

    /// A store in a file of its own (deleted with the returned directory)
    /// holding session `s-1`; also used by the writer's and the
    /// checkpointer's tests.
    pub(crate) async fn file_store() -> (
        tempfile::TempDir,
        std::path::PathBuf,
        std::sync::Arc<SqliteStore>,
    ) {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("db.sqlite");
        let store = SqliteStore::open(&path).await.expect("open");
        store.create_session(&rec("s-1")).await.expect("create");
        (dir, path, std::sync::Arc::new(store))
    }

    impl SqliteStore {
        /// Runs `sql` (a pragma) on the writer's connection.
        async fn on_writer(&self, sql: &'static str) {
            self.write(sql, |sql, conn| {
                conn.execute_batch(sql).map_err(write_error("pragma"))
            })
            .await
            .expect("pragma on the writer's connection");
        }
    }

    #[tokio::test]
    async fn disk_full_surfaces_as_backend_error() {
        let store = SqliteStore::open_in_memory().await.expect("open");
        store.create_session(&rec("s-1")).await.expect("create");
        // Cap the database at its current size: the next growth is SQLITE_FULL.
        store.on_writer("PRAGMA max_page_count = 1").await;
        let big = "x".repeat(64 * 1024);
        let err = store
            .append_message(
                &SessionId::from("s-1"),
                Role::Agent,
                MessageKind::Text,
                &big,
            )
            .await
            .expect_err("must not fit");
        match err {
            StoreError::Backend { op, message } => {
                assert_eq!(op, "append message");
                assert!(message.contains("full"), "{message}");
            }
            other => panic!("expected Backend, got {other}"),
        }
        // Reads still work.
        assert!(
            store
                .get_session(&SessionId::from("s-1"))
                .await
                .expect("get")
                .is_some()
        );
    }

    #[tokio::test]
    async fn read_only_database_surfaces_as_backend_error() {
        let store = SqliteStore::open_in_memory().await.expect("open");
        store.on_writer("PRAGMA query_only = ON").await;
        let err = store
            .create_session(&rec("s-1"))
            .await
            .expect_err("read only");
        assert!(
            matches!(
                err,
                StoreError::Backend {
                    op: "insert session",
                    ..
                }
            ),
            "{err}"
        );
        let err = store
            .set_status(&SessionId::from("s-1"), SessionStatus::Crashed, None)
            .await
            .expect_err("read only");
        assert!(matches!(err, StoreError::Backend { .. }), "{err}");
    }

    #[tokio::test]
    async fn migrations_are_idempotent() {
        let store = SqliteStore::open_in_memory().await.expect("open");
        migrate(&store.pool, Path::new("again"))
            .await
            .expect("second run");
    }
}
