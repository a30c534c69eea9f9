//! Operator approval rules in SQLite: insert, list, delete, and survival of a
//! restart (reopening the database file), and rules added at once all in
//! force.

use agent_intercom::app::{App, AppOptions};
use agent_intercom::config::Config;
use agent_intercom::storage::SqliteStore;
use agent_intercom::storage::rules::new_rule_id;
use intercom_actors::model::SessionId;
use intercom_actors::rules::{Rule, RuleAction, RuleMatch, Scope};

fn rules() -> Vec<Rule> {
    vec![
        Rule {
            id: new_rule_id(),
            scope: Scope::Global,
            matcher: RuleMatch {
                kind: Some("read".into()),
                ..Default::default()
            },
            action: RuleAction::Allow,
        },
        Rule {
            id: new_rule_id(),
            scope: Scope::Workspace("api".into()),
            matcher: RuleMatch {
                kind: Some("execute".into()),
                command_prefix: Some("git ".into()),
                command_regex: Some(r"^git (status|diff)\b".into()),
                agent: Some("claude".into()),
                ..Default::default()
            },
            action: RuleAction::Ask,
        },
        Rule {
            id: new_rule_id(),
            scope: Scope::Session(SessionId::from("s-0123456789abcdef")),
            matcher: RuleMatch {
                kind: Some("edit".into()),
                paths: vec!["docs/**".into(), "*.md".into()],
                ..Default::default()
            },
            action: RuleAction::Deny,
        },
    ]
}

#[tokio::test]
async fn insert_list_delete_round_trip() {
    let store = SqliteStore::open_in_memory().await.expect("open");
    assert!(store.list_rules().await.expect("list").is_empty());
    let rules = rules();
    for (n, rule) in rules.iter().enumerate() {
        store
            .insert_rule(rule, &format!("U{n}"))
            .await
            .expect("insert");
    }
    let mut listed = store.list_rules().await.expect("list");
    let mut expected = rules.clone();
    // Same millisecond is possible: order by (created_at, id) then compare as sets.
    listed.sort_by(|a, b| a.id.cmp(&b.id));
    expected.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(listed, expected);

    let stored = store.list_stored_rules().await.expect("list");
    let session_rule = stored
        .iter()
        .find(|s| s.rule.id == rules[2].id)
        .expect("stored");
    assert_eq!(session_rule.created_by, "U2");
    assert!(session_rule.created_at > 0);

    assert!(store.delete_rule(&rules[1].id).await.expect("delete"));
    assert!(!store.delete_rule(&rules[1].id).await.expect("delete again"));
    assert!(
        !store
            .delete_rule("r-00000000")
            .await
            .expect("delete unknown")
    );
    let ids: Vec<String> = store
        .list_rules()
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids.len(), 2);
    assert!(!ids.contains(&rules[1].id));
}

#[tokio::test]
async fn duplicate_ids_and_invalid_rules_are_refused() {
    let store = SqliteStore::open_in_memory().await.expect("open");
    let rule = rules().remove(0);
    store.insert_rule(&rule, "U1").await.expect("insert");
    let err = store.insert_rule(&rule, "U2").await.expect_err("duplicate");
    assert!(err.to_string().contains("insert rule"), "{err}");

    let mut bad = rules().remove(1);
    bad.matcher.command_regex = Some("(".into());
    let err = store.insert_rule(&bad, "U1").await.expect_err("bad regex");
    assert!(err.to_string().contains("command_regex"), "{err}");
    let mut bad = rules().remove(2);
    bad.matcher.paths = vec!["a/[".into()];
    assert!(store.insert_rule(&bad, "U1").await.is_err());
    assert_eq!(store.list_rules().await.expect("list"), vec![rule]);
}

#[tokio::test]
async fn rules_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let db = dir.path().join("data/intercom.db");
    let rules = rules();
    {
        let store = SqliteStore::open(&db).await.expect("open");
        for rule in &rules {
            store.insert_rule(rule, "api").await.expect("insert");
        }
        store.close().await;
    }
    let store = SqliteStore::open(&db).await.expect("reopen");
    let mut listed = store.list_rules().await.expect("list");
    let mut expected = rules;
    listed.sort_by(|a, b| a.id.cmp(&b.id));
    expected.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(listed, expected);
    store.close().await;
}

/// Rules added at the same moment are all in force once each add is
/// answered. Each add stores its rule and then publishes the stored list to
/// the sessions; two publications that overlapped could land in the wrong
/// order, the later one a list read before the other rule was stored: a
/// deny rule answered "created" and was not in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rules_added_at_the_same_moment_are_all_in_force() {
    let dir = tempfile::tempdir().expect("tmp");
    let config =
        Config::from_toml_str("[database]\npath = \"rules.db\"\n", dir.path()).expect("config");
    let store = SqliteStore::open(&config.database.path)
        .await
        .expect("store");
    let app = App::start(&config, store, AppOptions::default())
        .await
        .expect("app");
    let adds: Vec<_> = (0..48)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                let rule = Rule {
                    id: String::new(),
                    scope: Scope::Global,
                    matcher: RuleMatch {
                        kind: Some("execute".into()),
                        command_prefix: Some(format!("tool{i} ")),
                        ..Default::default()
                    },
                    action: RuleAction::Deny,
                };
                app.add_rule(rule, "test").await
            })
        })
        .collect();
    let mut added = Vec::new();
    for add in adds {
        added.push(add.await.expect("task").expect("rule added").id);
    }
    let in_force: std::collections::HashSet<String> = app
        .shared_rules()
        .current()
        .iter()
        .map(|r| r.id.clone())
        .collect();
    let missing: Vec<&String> = added.iter().filter(|id| !in_force.contains(*id)).collect();
    assert!(missing.is_empty(), "added but not in force: {missing:?}");
}
