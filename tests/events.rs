//! `GET /api/events` end to end: the real app served in-process, the
//! scripted agent as the child, the stream read as a client reads it.
//! Reconnecting with `Last-Event-ID` must give exactly the missed events,
//! also across a server restart (the journal is in SQLite).

mod common;

use std::sync::mpsc;
use std::time::Instant;

use agent_intercom::ctl::client::Client;
use agent_intercom::ctl::watch::next_message;
use common::api_server::Served;
use common::{Http, Layout, Setup, TOKEN, WAIT};
use serde_json::{Value, json};

/// An open event stream read on its own thread: (id, event) pairs; a
/// position marker has `Value::Null`.
struct Stream {
    rx: mpsc::Receiver<(Option<i64>, Value)>,
}

impl Stream {
    fn open(base: &str, path: &str, last: Option<i64>) -> Stream {
        let client = Client::new(base, TOKEN);
        let mut reader = client.stream(path, last).expect("stream opens");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            while let Ok(Some(m)) = next_message(&mut reader) {
                let value = serde_json::from_str(&m.data).unwrap_or(Value::Null);
                if tx.send((m.id, value)).is_err() {
                    return;
                }
            }
        });
        Stream { rx }
    }

    /// Events (not markers) until one matches `stop`, inclusive.
    fn until(&self, what: &str, stop: impl Fn(&Value) -> bool) -> Vec<(i64, Value)> {
        let deadline = Instant::now() + WAIT;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (id, value) = self
                .rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("timed out waiting for {what}; got {got:?}"));
            if value.is_null() {
                continue;
            }
            let id = id.expect("every event has an id");
            assert_eq!(value["event_id"], id, "data carries the id");
            let done = stop(&value);
            got.push((id, value));
            if done {
                return got;
            }
        }
    }

    /// The first message: the position marker.
    fn marker(&self) -> i64 {
        let (id, value) = self
            .rx
            .recv_timeout(WAIT)
            .expect("the stream starts with a marker");
        assert!(value.is_null(), "marker without data, got {value}");
        id.expect("marker id")
    }
}

fn kind(e: &Value) -> &str {
    e["event"].as_str().unwrap_or_default()
}

fn permission_setup() -> Setup {
    Setup {
        scenario: json!({"turns": [[
            {"chunk": "working. "},
            {"permission": {"tool_call_id": "t1", "title": "Write notes.txt", "kind": "edit", "locations": ["notes.txt"]}},
            {"chunk": "done."}
        ]]}),
        ..Setup::default()
    }
}

fn assert_contiguous(ids: &[i64], after: i64) {
    let expected: Vec<i64> = (after + 1..after + 1 + ids.len() as i64).collect();
    assert_eq!(ids, expected, "no gap, no duplicate after {after}");
}

#[test]
fn reconnecting_with_last_event_id_gets_exactly_the_missed_events() {
    let layout = Layout::new(&permission_setup());
    let server = Served::on(&layout);
    let base = server.http.base.clone();
    let first = Stream::open(&base, "/api/events", None);
    let start = first.marker();
    let session = server.http.start("write notes");
    let id = session["id"].as_str().expect("id").to_owned();
    let seen = first.until("the request", |e| kind(e) == "request_opened");
    assert_eq!(seen[0].1["event"], "session_started");
    assert_eq!(seen[0].1["session_id"], id.as_str());
    let ids: Vec<i64> = seen.iter().map(|(i, _)| *i).collect();
    assert_contiguous(&ids, start);
    let last_seen = *ids.last().expect("ids");
    drop(first);

    // While nobody listens: approve, the turn ends, the session is stopped.
    let decided = server.http.post(
        &format!("/api/approvals/{id}:req-1"),
        &json!({"option_id": "allow-once"}),
    );
    assert_eq!(decided.status, 200, "{}", decided.text);
    let stopped = server
        .http
        .post(&format!("/api/sessions/{id}/cancel"), &json!({}));
    assert_eq!(stopped.status, 200, "{}", stopped.text);

    let again = Stream::open(&base, "/api/events", Some(last_seen));
    assert_eq!(again.marker(), last_seen);
    let missed = again.until("the end", |e| kind(e) == "session_ended");
    let ids: Vec<i64> = missed.iter().map(|(i, _)| *i).collect();
    assert_contiguous(&ids, last_seen);
    let closed = missed
        .iter()
        .find(|(_, e)| kind(e) == "request_closed")
        .expect("request_closed among the missed events");
    assert_eq!(closed.1["id"], format!("{id}:req-1"));
    assert_eq!(closed.1["decision"]["option_id"], "allow-once");
    assert_eq!(closed.1["decision"]["decided_by"], "local");
    assert!(
        missed.iter().any(|(_, e)| kind(e) == "agent_text"),
        "{missed:?}"
    );

    // `?after=` is the same as the header (for clients that cannot set it).
    let replay = Stream::open(&base, &format!("/api/events?after={last_seen}"), None);
    assert_eq!(replay.marker(), last_seen);
    let replayed = replay.until("the end", |e| kind(e) == "session_ended");
    assert_eq!(replayed, missed);

    // An id from another history (beyond the newest: a database that was
    // reset) gets everything kept from the first event, not silence.
    let ahead = Stream::open(&base, "/api/events?after=1000000", None);
    assert_eq!(ahead.marker(), 0);
    let everything = ahead.until("the end", |e| kind(e) == "session_ended");
    assert_eq!(everything.first().map(|(id, _)| *id), Some(1));
    assert_eq!(everything.last(), missed.last());
}

#[test]
fn the_stream_resumes_across_a_server_restart_and_filters_by_session() {
    let layout = Layout::new(&permission_setup());
    let server = Served::on(&layout);
    let base = server.http.base.clone();
    let a = server.http.start("first")["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let b = server.http.start("second")["id"]
        .as_str()
        .expect("id")
        .to_owned();
    server.http.until_pending(&b, "req-1");
    let only_b = Stream::open(&base, &format!("/api/events?session={b}"), Some(0));
    only_b.marker();
    let seen = only_b.until("b's request", |e| kind(e) == "request_opened");
    assert!(
        seen.iter().all(|(_, e)| e["session_id"] == b.as_str()),
        "{seen:?}"
    );
    let last = seen.last().expect("events").0;
    drop(only_b);
    // A graceful restart ends both sessions; b's end is stored while no
    // client is connected, and arrives after the restart.
    drop(server);
    let server = Served::on(&layout);
    let resumed = Stream::open(
        &server.http.base,
        &format!("/api/events?session={b}"),
        Some(last),
    );
    resumed.marker();
    let after = resumed.until("b's end", |e| kind(e) == "session_ended");
    assert!(
        after
            .iter()
            .all(|(i, e)| *i > last && e["session_id"] == b.as_str())
    );
    assert_eq!(after.last().expect("end").1["status"], "cancelled");
    let everything = Stream::open(&server.http.base, "/api/events", Some(0));
    everything.marker();
    let all = everything.until("a's end", |e| {
        kind(e) == "session_ended" && e["session_id"] == a.as_str()
    });
    assert!(all.iter().any(|(_, e)| e["session_id"] == a.as_str()));
}

#[test]
fn the_stream_needs_the_token_and_a_numeric_last_event_id() {
    let layout = Layout::new(&Setup::default());
    let server = Served::on(&layout);
    let anonymous = Http::new(&server.http.base, None);
    let r = anonymous.get("/api/events");
    assert_eq!(
        (r.status, r.body["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let client = Client::new(&server.http.base, TOKEN);
    let bad = client
        .stream("/api/events?after=x", None)
        .err()
        .expect("400");
    assert_eq!(bad.exit_code(), 2, "{bad}");
    // A negative id is refused too, not read as "replay everything".
    let negative = client
        .stream("/api/events?after=-5", None)
        .err()
        .expect("400");
    assert_eq!(negative.exit_code(), 2, "{negative}");
    assert!(negative.to_string().contains("0 or more"), "{negative}");
    // A stream for a session that does not exist would stay silent for
    // ever (`ctl watch nope` hung): 404 instead.
    let unknown = client
        .stream("/api/events?session=nope", None)
        .err()
        .expect("404");
    assert!(unknown.to_string().contains("no session nope"), "{unknown}");
    // A client that never hangs up does not keep a graceful shutdown
    // waiting: shutting down ends the stream (this drop returns).
    let open = Stream::open(&server.http.base, "/api/events", None);
    open.marker();
    drop(server);
    assert!(open.rx.recv_timeout(WAIT).is_err(), "the stream ended");
}

#[test]
fn a_rule_remembered_through_the_api_is_told_as_a_notice() {
    // Slack's "remember" posts a notice in the session's thread; the same
    // rule made from the console or the API must reach every operator side
    // too (the stream here, and through it the console and Slack).
    let layout = Layout::new(&permission_setup());
    let server = Served::on(&layout);
    let http = &server.http;
    let session = http.start("write notes");
    let id = session["id"].as_str().expect("id").to_owned();
    // From the first event on: the request may be out before the stream is.
    let stream = Stream::open(&http.base, &format!("/api/events?session={id}"), Some(0));
    stream.until("the request", |e| kind(e) == "request_opened");
    let decided = http.post(
        &format!("/api/approvals/{id}:req-1"),
        &json!({"option_id": "allow-always"}),
    );
    assert_eq!(decided.status, 200, "{}", decided.text);
    let made = http.post(
        &format!("/api/approvals/{id}:req-1/remember"),
        &json!({"scope": "session"}),
    );
    assert_eq!(made.status, 201, "{}", made.text);
    let rule_id = made.body["rule"]["id"]
        .as_str()
        .expect("rule id")
        .to_owned();
    let seen = stream.until("the notice", |e| {
        kind(e) == "notice" && e["text"].as_str().is_some_and(|t| t.contains(&rule_id))
    });
    let (_, notice) = seen.last().expect("notice");
    assert_eq!(notice["session_id"], id.as_str(), "{notice}");
}

/// Deletes the events up to `through` from the database under the running
/// server, as the journal's own pruning does under a flood.
fn prune(db: &std::path::Path, through: i64) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let url = format!("sqlite://{}", db.display());
        let pool = sqlx::SqlitePool::connect(&url).await.expect("open");
        sqlx::query("DELETE FROM events WHERE id <= ?")
            .bind(through)
            .execute(&pool)
            .await
            .expect("prune");
        pool.close().await;
    });
}

/// The journal keeps the newest events only: a client resuming after an id
/// that is no longer kept is first told which ids it lost (a probe's flood
/// pruned a waiting request's event, and a resumed stream went on as if
/// nothing had happened); one resuming within what is kept is not.
#[test]
fn resuming_after_pruned_events_is_told_what_was_lost() {
    let layout = Layout::new(&permission_setup());
    let server = Served::on(&layout);
    let base = server.http.base.clone();
    let first = Stream::open(&base, "/api/events", None);
    let start = first.marker();
    server.http.start("write notes");
    let seen = first.until("the request", |e| kind(e) == "request_opened");
    let last_seen = seen.last().expect("events").0;
    drop(first);
    prune(&layout.database, last_seen - 1);

    let again = Stream::open(&base, "/api/events", Some(start));
    let told = again.until("the loss", |e| kind(e) == "events_lost");
    assert_eq!(told.len(), 1, "told first: {told:?}");
    assert_eq!(told[0].1["first_lost"], start + 1);
    assert_eq!(told[0].1["last_lost"], last_seen - 1);
    // Then what is kept, from where the loss ends.
    let rest = again.until("the request", |e| kind(e) == "request_opened");
    assert_eq!(rest.first().map(|(id, _)| *id), Some(last_seen));

    let within = Stream::open(&base, "/api/events", Some(last_seen - 1));
    assert_eq!(within.marker(), last_seen - 1);
}
