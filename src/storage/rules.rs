//! Operator approval rules in SQLite (`rules` table, `migrations/0003_rules.sql`).
//!
//! Why this exists: a rule an operator creates ("allow always" on a request,
//! `/intercom rules`, `POST /api/rules`) must survive a restart. Config-file
//! rules are not stored; the running rule set is the config's rules plus
//! [`SqliteStore::list_rules`]. The scope is stored as `scope` + `scope_id`,
//! the conditions as the core's [`RuleMatch`] in JSON. Writes take the
//! store's write gate like every other write; a row this binary cannot read
//! (a newer version wrote it, or the file was edited) is a
//! [`StoreError::Backend`] naming it, never silently skipped — dropping a
//! deny rule would allow what an operator forbade.

use intercom_actors::ids::random_u64;
use intercom_actors::model::{SessionId, now_ms};
use intercom_actors::ports::StoreError;
use intercom_actors::rules::{Rule, RuleAction, RuleMatch, Scope};

use super::{SqliteStore, backend, exec};

/// A fresh operator rule id: `r-` and 8 hex digits.
pub fn new_rule_id() -> String {
    format!("r-{:08x}", random_u64() & 0xffff_ffff)
}

/// A stored rule with who created it and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRule {
    /// The rule.
    pub rule: Rule,
    /// Who created it (Slack user id, `api`, ...), as given to
    /// [`SqliteStore::insert_rule`].
    pub created_by: String,
    /// When, in Unix milliseconds.
    pub created_at: i64,
}

/// `rules` row.
#[derive(Debug, sqlx::FromRow)]
struct RuleRow {
    id: String,
    scope: String,
    scope_id: Option<String>,
    #[sqlx(rename = "match")]
    matcher: String,
    action: String,
    created_by: String,
    created_at: i64,
}

const LIST_OP: &str = "list rules";

impl RuleRow {
    fn into_stored(self) -> Result<StoredRule, StoreError> {
        let bad = |message: String| StoreError::Backend {
            op: LIST_OP,
            message: format!("rule {}: {message}", self.id),
        };
        let scope = match (self.scope.as_str(), self.scope_id.clone()) {
            ("global", None) => Scope::Global,
            ("workspace", Some(ws)) => Scope::Workspace(ws),
            ("session", Some(s)) => Scope::Session(SessionId(s)),
            (scope, id) => {
                return Err(bad(format!(
                    "unreadable scope {scope:?} with scope_id {id:?}"
                )));
            }
        };
        let action = match self.action.as_str() {
            "allow" => RuleAction::Allow,
            "ask" => RuleAction::Ask,
            "deny" => RuleAction::Deny,
            other => return Err(bad(format!("unreadable action {other:?}"))),
        };
        let matcher: RuleMatch = serde_json::from_str(&self.matcher)
            .map_err(|e| bad(format!("unreadable match {:?}: {e}", self.matcher)))?;
        Ok(StoredRule {
            rule: Rule {
                id: self.id,
                scope,
                matcher,
                action,
            },
            created_by: self.created_by,
            created_at: self.created_at,
        })
    }
}

impl SqliteStore {
    /// Stores an operator rule (give it an id from [`new_rule_id`]). A rule
    /// whose globs or regex do not compile, or whose id is taken, is refused.
    pub async fn insert_rule(&self, rule: &Rule, created_by: &str) -> Result<(), StoreError> {
        const OP: &str = "insert rule";
        rule.validate().map_err(|e| StoreError::Backend {
            op: OP,
            message: e.to_string(),
        })?;
        let (scope, scope_id) = match &rule.scope {
            Scope::Global => ("global", None),
            Scope::Workspace(ws) => ("workspace", Some(ws.as_str())),
            Scope::Session(s) => ("session", Some(s.0.as_str())),
        };
        let matcher = serde_json::to_string(&rule.matcher).map_err(|e| StoreError::Backend {
            op: OP,
            message: format!("cannot encode JSON: {e}"),
        })?;
        let data = (
            rule.id.clone(),
            scope,
            scope_id.map(str::to_owned),
            matcher,
            rule.action.as_str(),
            created_by.to_owned(),
            now_ms(),
        );
        self.write(
            data,
            |(id, scope, scope_id, matcher, action, by, now), conn| {
                exec(
                    conn,
                    OP,
                    "INSERT INTO rules (id, scope, scope_id, \"match\", action, created_by, \
                     created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    rusqlite::params![id, scope, scope_id, matcher, action, by, now],
                )?;
                Ok(())
            },
        )
        .await
    }

    /// Deletes the operator rule `id`; `false` when there was none.
    pub async fn delete_rule(&self, id: &str) -> Result<bool, StoreError> {
        self.write(id.to_owned(), |id, conn| {
            Ok(exec(conn, "delete rule", "DELETE FROM rules WHERE id = ?", [id])? > 0)
        })
        .await
    }

    /// Every operator rule, oldest first.
    pub async fn list_rules(&self) -> Result<Vec<Rule>, StoreError> {
        Ok(self
            .list_stored_rules()
            .await?
            .into_iter()
            .map(|s| s.rule)
            .collect())
    }

    /// Every operator rule with its creator and creation time, oldest first.
    pub async fn list_stored_rules(&self) -> Result<Vec<StoredRule>, StoreError> {
        let rows: Vec<RuleRow> = sqlx::query_as(
            "SELECT id, scope, scope_id, \"match\", action, created_by, created_at \
             FROM rules ORDER BY created_at, id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(backend(LIST_OP))?;
        rows.into_iter().map(RuleRow::into_stored).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_the_operator_shape() {
        let id = new_rule_id();
        assert_eq!(id.len(), 10, "{id}");
        assert!(id.starts_with("r-"), "{id}");
        assert!(id[2..].chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        assert_ne!(new_rule_id(), new_rule_id());
    }

    #[tokio::test]
    async fn unreadable_rows_are_errors_naming_the_rule() {
        let store = SqliteStore::open_in_memory().await.expect("open");
        sqlx::query(
            "INSERT INTO rules (id, scope, scope_id, \"match\", action, created_by, created_at) \
             VALUES ('r-bad', 'workspace', 'api', '{\"colour\": 1}', 'allow', 'u', 1)",
        )
        .execute(&store.pool)
        .await
        .expect("insert");
        let err = store.list_rules().await.expect_err("unreadable");
        assert!(err.to_string().contains("rule r-bad"), "{err}");
    }

    #[tokio::test]
    async fn the_schema_refuses_inconsistent_scopes() {
        let store = SqliteStore::open_in_memory().await.expect("open");
        for (scope, scope_id) in [("global", Some("x")), ("workspace", None), ("team", None)] {
            let res = sqlx::query(
                "INSERT INTO rules (id, scope, scope_id, action, created_by, created_at) \
                 VALUES ('r-1', ?, ?, 'allow', 'u', 1)",
            )
            .bind(scope)
            .bind(scope_id)
            .execute(&store.pool)
            .await;
            assert!(res.is_err(), "{scope} {scope_id:?}");
        }
    }
}
