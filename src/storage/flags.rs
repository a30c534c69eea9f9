//! Yes/no columns of a session row kept across restarts (`paused`,
//! `turn_running`): one write and one read serve each, so the two flags
//! are stored and read the same way.

use intercom_actors::model::SessionId;
use intercom_actors::ports::StoreError;
use rusqlite::params;

use super::store::one_session;
use super::{SqliteStore, backend, exec};

/// A yes/no column of a session row kept across restarts.
#[derive(Debug, Clone, Copy)]
pub(super) enum SessionFlag {
    /// `paused`: a pause outlives a restart.
    Paused,
    /// `turn_running`: a turn a killed server cut is continued.
    TurnRunning,
}

impl SessionFlag {
    /// (what a failed write was doing, its statement, what a failed read
    /// was doing, its query).
    fn sql(self) -> (&'static str, &'static str, &'static str, &'static str) {
        match self {
            SessionFlag::Paused => (
                "record pause",
                "UPDATE sessions SET paused = ? WHERE id = ?",
                "read pause",
                "SELECT paused FROM sessions WHERE id = ?",
            ),
            SessionFlag::TurnRunning => (
                "record turn",
                "UPDATE sessions SET turn_running = ? WHERE id = ?",
                "read turn",
                "SELECT turn_running FROM sessions WHERE id = ?",
            ),
        }
    }
}

impl SqliteStore {
    pub(super) async fn set_flag(
        &self,
        id: &SessionId,
        flag: SessionFlag,
        on: bool,
    ) -> Result<(), StoreError> {
        self.write((id.clone(), flag, on), |(id, flag, on), conn| {
            let (op, update, _, _) = flag.sql();
            let changed = exec(conn, op, update, params![on, id.0])?;
            one_session(changed, id)
        })
        .await
    }

    pub(super) async fn flag(&self, id: &SessionId, flag: SessionFlag) -> Result<bool, StoreError> {
        let (_, _, op, select) = flag.sql();
        let on: Option<bool> = sqlx::query_scalar(select)
            .bind(&id.0)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend(op))?;
        Ok(on.unwrap_or(false))
    }
}
