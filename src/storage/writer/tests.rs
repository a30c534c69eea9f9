//! The writer's tests: answered only after commit, failures alone, close,
//! and chatter held back until the next awaited write.

use std::sync::mpsc as std_mpsc;

use intercom_actors::model::{AuditEntry, MessageKind, Role, SessionId};
use intercom_actors::ports::SessionStore;
use sqlx::Connection as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use tokio::task::JoinHandle;

use super::*;
use crate::storage::SqliteStore;
use crate::storage::tests::file_store;

/// Polls `cond` until it holds; panics after a generous deadline.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::task::yield_now().await;
    }
}

/// A connection of its own: it sees only committed rows.
async fn outsider(path: &Path) -> SqliteConnection {
    SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(path))
        .await
        .expect("outsider connection")
}

async fn visible_messages(conn: &mut SqliteConnection) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM messages")
        .fetch_one(conn)
        .await
        .expect("count")
}

/// The two signals of a plug write: it started; it may finish.
type Plug = (std_mpsc::SyncSender<()>, std_mpsc::Receiver<()>);

/// A write that holds the writer's transaction open until released.
fn plug_write(plug: &Plug, _: &Connection) -> Result<(), StoreError> {
    let _ = plug.0.send(());
    let _ = plug.1.recv();
    Ok(())
}

/// The release signal of a parked writer and the plug write's task.
type Parked = (std_mpsc::SyncSender<()>, JoinHandle<Result<(), StoreError>>);

/// Parks a writer inside the plug write `queue_plug` queues, so everything
/// written next waits in the queue.
async fn park<F>(queue_plug: impl FnOnce(Plug) -> F) -> Parked
where
    F: std::future::Future<Output = Result<(), StoreError>> + Send + 'static,
{
    let (started_tx, started) = std_mpsc::sync_channel(1);
    let (release, release_rx) = std_mpsc::sync_channel(1);
    let task = tokio::spawn(queue_plug((started_tx, release_rx)));
    tokio::task::spawn_blocking(move || started.recv())
        .await
        .expect("join")
        .expect("the plug write started");
    (release, task)
}

/// Parks the store's writer (see [`park`]).
async fn park_writer(store: &Arc<SqliteStore>) -> Parked {
    let s = Arc::clone(store);
    park(move |plug| async move { s.write(plug, plug_write).await }).await
}

/// Appends agent text `text` to `session`'s transcript, in a task of its own.
fn spawn_append(
    store: &Arc<SqliteStore>,
    session: &'static str,
    text: String,
) -> JoinHandle<Result<i64, StoreError>> {
    let s = Arc::clone(store);
    tokio::spawn(async move {
        s.append_message(
            &SessionId::from(session),
            Role::Agent,
            MessageKind::Text,
            &text,
        )
        .await
    })
}

#[tokio::test]
async fn callers_are_answered_only_after_their_transaction_committed() {
    let (_dir, path, store) = file_store().await;
    let mut outside = outsider(&path).await;
    let (release, plug) = park_writer(&store).await;
    let commits_before = store.commit_count();

    const N: usize = 50;
    let writes: Vec<_> = (0..N)
        .map(|i| spawn_append(&store, "s-1", format!("m{i}")))
        .collect();
    until("all writes to queue", || store.writer.queued() == N).await;

    // The writer is busy with the plug's transaction: nobody is answered
    // and nothing is visible from outside.
    assert!(!plug.is_finished());
    assert!(writes.iter().all(|w| !w.is_finished()));
    assert_eq!(visible_messages(&mut outside).await, 0);

    release.send(()).expect("release");
    plug.await.expect("join").expect("plug");
    for w in writes {
        let id = w.await.expect("join").expect("append");
        // Answered, so committed: an outside connection sees the row.
        let found: Option<i64> = sqlx::query_scalar("SELECT id FROM messages WHERE id = ?")
            .bind(id)
            .fetch_optional(&mut outside)
            .await
            .expect("read");
        assert_eq!(found, Some(id));
    }
    // The plug's transaction, then one for all fifty waiting writes.
    assert_eq!(store.commit_count() - commits_before, 2);
    assert_eq!(visible_messages(&mut outside).await, N as i64);
}

#[tokio::test]
async fn a_failing_write_does_not_fail_its_neighbours() {
    let (_dir, path, store) = file_store().await;
    let (release, plug) = park_writer(&store).await;
    let commits_before = store.commit_count();

    let append = |session: &'static str| spawn_append(&store, session, session.to_owned());
    let first = append("s-1");
    let hostile = append("no-such-session");
    let s = Arc::clone(&store);
    let audit = tokio::spawn(async move {
        s.audit(&AuditEntry {
            session_id: Some(SessionId::from("s-1")),
            actor: "op".into(),
            action: "decide".into(),
            detail: serde_json::json!({}),
        })
        .await
    });
    let last = append("s-1");
    until("all writes to queue", || store.writer.queued() == 4).await;
    release.send(()).expect("release");
    plug.await.expect("join").expect("plug");

    let first = first.await.expect("join").expect("first commits");
    let err = hostile.await.expect("join").expect_err("no session");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
    audit.await.expect("join").expect("audit commits");
    let last = last.await.expect("join").expect("last commits");
    assert_eq!(store.commit_count() - commits_before, 2);

    let mut outside = outsider(&path).await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM messages ORDER BY id")
        .fetch_all(&mut outside)
        .await
        .expect("read");
    assert_eq!(ids, vec![first, last]);
    let audits: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit")
        .fetch_one(&mut outside)
        .await
        .expect("read");
    assert_eq!(audits, 1);
}

/// A write that takes the whole transaction down with it (as SQLite
/// does on some errors, e.g. a full disk).
fn aborting_write(_: &(), conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch("ROLLBACK")
        .map_err(crate::storage::write_error("abort"))?;
    Err(StoreError::Backend {
        op: "abort",
        message: "transaction rolled back".into(),
    })
}

/// Queues "before", the write `f` and "after" behind a parked writer,
/// so the three run in one batch; checks that both neighbours committed
/// and the store still writes, and returns `f`'s error.
async fn fails_alone(f: WriteFn<(), ()>) -> StoreError {
    let (_dir, path, store) = file_store().await;
    let (release, plug) = park_writer(&store).await;
    let append = |text: &'static str| spawn_append(&store, "s-1", text.to_owned());
    let before = append("before");
    let s = Arc::clone(&store);
    let failing = tokio::spawn(async move { s.write((), f).await });
    let after = append("after");
    until("all writes to queue", || store.writer.queued() == 3).await;
    release.send(()).expect("release");
    plug.await.expect("join").expect("plug");

    before.await.expect("join").expect("before commits");
    let err = failing.await.expect("join").expect_err("the write fails");
    after.await.expect("join").expect("after commits");

    let mut outside = outsider(&path).await;
    let texts: Vec<String> = sqlx::query_scalar("SELECT content FROM messages ORDER BY id")
        .fetch_all(&mut outside)
        .await
        .expect("read");
    assert_eq!(texts, vec!["before", "after"]);
    store
        .touch(&SessionId::from("s-1"))
        .await
        .expect("the store still writes afterwards");
    err
}

#[tokio::test]
async fn a_write_that_loses_the_transaction_does_not_lose_the_others() {
    let err = fails_alone(aborting_write).await;
    assert!(
        matches!(err, StoreError::Backend { op: "abort", .. }),
        "{err}"
    );
}

#[tokio::test]
async fn closing_answers_the_queued_writes() {
    let (_dir, path, store) = file_store().await;
    let s = Arc::clone(&store);
    let write = tokio::spawn(async move {
        s.append_message(&SessionId::from("s-1"), Role::Agent, MessageKind::Text, "x")
            .await
    });
    until("the write to be answered", || write.is_finished()).await;
    write.await.expect("join").expect("append");
    let store = Arc::into_inner(store).expect("sole owner");
    store.close().await;
    let mut outside = outsider(&path).await;
    assert_eq!(visible_messages(&mut outside).await, 1);
}

/// A write that panics.
fn panicking_write(_: &(), _: &Connection) -> Result<(), StoreError> {
    panic!("a bug in one write")
}

#[tokio::test]
async fn a_write_that_panics_fails_alone_and_the_writer_goes_on() {
    let err = fails_alone(panicking_write).await;
    assert!(err.to_string().contains("panicked"), "{err}");
}

// ---- chatter ----------------------------------------------------------

fn sql(e: rusqlite::Error) -> StoreError {
    StoreError::Backend {
        op: "test",
        message: e.to_string(),
    }
}

fn create_table(_: &(), conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch("CREATE TABLE t (x TEXT)").map_err(sql)
}

fn insert(x: &&'static str, conn: &Connection) -> Result<(), StoreError> {
    conn.execute("INSERT INTO t (x) VALUES (?1)", [*x])
        .map(drop)
        .map_err(sql)
}

/// Rows of `t` an outside connection sees (committed ones only).
fn visible(path: &Path) -> Vec<String> {
    let conn = Connection::open(path).expect("outside connection");
    let mut stmt = conn
        .prepare("SELECT x FROM t ORDER BY rowid")
        .expect("prepare");
    stmt.query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

/// A bare writer on a fresh database holding chatter back for `hold`,
/// with table `t` created.
async fn bare_writer(hold: Duration) -> (tempfile::TempDir, PathBuf, Arc<Writer>) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("w.sqlite");
    let writer = Writer::start_holding(&path, Duration::from_secs(5), hold).expect("writer");
    writer.write((), create_table).await.expect("create");
    (dir, path, Arc::new(writer))
}

#[tokio::test]
async fn chatter_waits_for_the_next_awaited_write_and_shares_its_commit() {
    let hour = Duration::from_secs(3600);
    let (_dir, path, writer) = bare_writer(hour).await;
    // Park the writer so the chatter is surely queued first.
    let w = Arc::clone(&writer);
    let (release, plug) = park(move |plug| async move { w.write(plug, plug_write).await }).await;
    let before = writer.commits();
    let w = Arc::clone(&writer);
    let text = tokio::spawn(intercom_actors::ports::chatter(async move {
        w.write("text", insert).await
    }));
    until("the chatter to queue", || writer.queued() == 1).await;
    release.send(()).expect("release");
    plug.await.expect("join").expect("plug");

    // Only chatter is waiting now: nothing is committed for it.
    assert!(visible(&path).is_empty());
    assert!(!text.is_finished());

    // The request the agent waits on: committed at once, the chatter
    // with it, in the order they were queued.
    writer.write("request", insert).await.expect("request");
    text.await.expect("join").expect("chatter");
    assert_eq!(writer.commits() - before, 2, "the plug's commit, then one");
    assert_eq!(visible(&path), ["text", "request"]);
}

#[tokio::test]
async fn chatter_alone_is_committed_once_it_waited_its_hold() {
    let (_dir, path, writer) = bare_writer(Duration::from_millis(20)).await;
    let w = Arc::clone(&writer);
    intercom_actors::ports::chatter(async move { w.write("text", insert).await })
        .await
        .expect("chatter commits without any awaited write");
    assert_eq!(visible(&path), ["text"]);
}

#[tokio::test]
async fn closing_commits_held_chatter() {
    let hour = Duration::from_secs(3600);
    let (_dir, path, writer) = bare_writer(hour).await;
    let writer = Arc::try_unwrap(writer).expect("no other handle");
    let (reply, answer) = oneshot::channel();
    let job: Box<dyn Job> = Box::new(TypedJob {
        data: "text",
        f: insert,
        chatter: true,
        result: None,
        reply,
    });
    writer.jobs.send(job).expect("queue");
    writer.close().await;
    answer.await.expect("answered").expect("committed");
    assert_eq!(visible(&path), ["text"]);
}
