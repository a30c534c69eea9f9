//! Web console logins in SQLite (`console_logins` table,
//! `migrations/0005_events_console.sql`).
//!
//! Why this exists: a console login must survive a server restart (the page
//! reconnects on its own) and a logout must really end it. Only the SHA-256
//! of the session cookie is stored, so reading the database does not let
//! anyone log in; the CSRF token is stored beside it.

use intercom_actors::model::now_ms;
use intercom_actors::ports::StoreError;

use super::{SqliteStore, backend, exec};

/// A live console login.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ConsoleLogin {
    /// The CSRF token every state-changing request must carry.
    pub csrf: String,
    /// Unix ms after which the login is refused.
    pub expires_at: i64,
}

impl SqliteStore {
    /// Stores a login (and drops expired ones).
    pub async fn insert_console_login(
        &self,
        cookie_hash: &str,
        csrf: &str,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        let data = (
            cookie_hash.to_owned(),
            csrf.to_owned(),
            expires_at,
            now_ms(),
        );
        self.write(data, |(cookie_hash, csrf, expires_at, now), conn| {
            exec(
                conn,
                "drop expired console logins",
                "DELETE FROM console_logins WHERE expires_at < ?",
                [now],
            )?;
            exec(
                conn,
                "insert console login",
                "INSERT INTO console_logins (cookie_hash, csrf, created_at, expires_at) \
                 VALUES (?, ?, ?, ?)",
                rusqlite::params![cookie_hash, csrf, now, expires_at],
            )?;
            Ok(())
        })
        .await
    }

    /// The login for a cookie hash, when it exists and has not expired.
    pub async fn console_login(
        &self,
        cookie_hash: &str,
    ) -> Result<Option<ConsoleLogin>, StoreError> {
        sqlx::query_as(
            "SELECT csrf, expires_at FROM console_logins WHERE cookie_hash = ? AND expires_at >= ?",
        )
        .bind(cookie_hash)
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await
        .map_err(backend("read console login"))
    }

    /// Ends a login (logout); unknown hashes are fine.
    pub async fn delete_console_login(&self, cookie_hash: &str) -> Result<(), StoreError> {
        self.write(cookie_hash.to_owned(), |cookie_hash, conn| {
            exec(
                conn,
                "delete console login",
                "DELETE FROM console_logins WHERE cookie_hash = ?",
                [cookie_hash],
            )?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn logins_expire_and_end_at_logout() {
        let store = SqliteStore::open_in_memory().await.expect("store");
        let later = now_ms() + 60_000;
        store
            .insert_console_login("h1", "c1", later)
            .await
            .expect("insert");
        store
            .insert_console_login("h2", "c2", now_ms() - 1)
            .await
            .expect("insert expired");
        let found = store.console_login("h1").await.expect("read");
        assert_eq!(
            found,
            Some(ConsoleLogin {
                csrf: "c1".into(),
                expires_at: later
            })
        );
        assert_eq!(store.console_login("h2").await.expect("read"), None);
        assert_eq!(store.console_login("nope").await.expect("read"), None);
        store.delete_console_login("h1").await.expect("logout");
        assert_eq!(store.console_login("h1").await.expect("read"), None);
    }
}
