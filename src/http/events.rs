//! `GET /api/events`: the operator event journal as Server-Sent Events.
//!
//! Each event is one SSE message whose `id:` is the journal id and whose
//! `data:` is the event as JSON (`{"event_id", "emitted_at", "session_id",
//! "event", ...}`; the event's own fields, such as a request's `id`, stay).
//! A client that reconnects with `Last-Event-ID` (browsers do it on their own)
//! or `?after=N` gets every stored event after that id, then the live ones,
//! with no gap and no duplicate: the stream subscribes to the live feed
//! before it reads the table and drops what it has already sent by id.
//! Without either it starts with the events emitted from now on.
//!
//! The journal keeps the newest events only. A client resuming after an
//! id older than that gets, first, one `events_lost` message naming the
//! ids it missed, so that it reads the current state again (a probe's
//! flood pruned a waiting request's event, and a resumed stream went on
//! as if nothing had happened).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::error::{ApiError, ApiQuery};
use crate::app::App;
use crate::journal::EventJournal;
use crate::storage::events::StoredEvent;
use crate::web::login::ConsoleLoginRef;
use intercom_actors::model::SessionId;

/// Rows read from the table per page while catching up.
const PAGE: u32 = 500;
/// How soon a browser reconnects after the stream dropped.
const RECONNECT: std::time::Duration = std::time::Duration::from_secs(1);

/// `GET /api/events` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only this session's events.
    session: Option<String>,
    /// Resume after this id (when no `Last-Event-ID` header is sent).
    after: Option<i64>,
}

/// `GET /api/events[?session=ID][&after=N]`.
pub async fn events(
    State(app): State<App>,
    login: Option<Extension<ConsoleLoginRef>>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let session = query.session.filter(|s| !s.is_empty());
    if let Some(id) = &session {
        // A stream for a session that does not exist would stay silent for
        // ever, which looks like calm: say so instead.
        app.session(&SessionId::from(id.as_str())).await?;
    }
    let journal = app.journal().clone();
    let live = journal.subscribe();
    let resume = match last_event_id(&headers)? {
        Some(id) => Some(id),
        None => query.after,
    };
    if let Some(id) = resume.filter(|id| *id < 0) {
        return Err(ApiError::bad_request(format!(
            "an event id is 0 or more (0: from the first event), not {id}"
        )));
    }
    let newest = journal
        .last_id()
        .await
        .map_err(crate::app::AppError::from)?;
    let lost = match resume {
        Some(id) if id <= newest => lost_after(&journal, id).await?,
        _ => None,
    };
    let (last, catch_up) = match resume {
        // No client saw an id the journal has not given yet: its id is
        // from another history (a database that was reset) or made up. It
        // gets everything kept, from the first event, with the real ids,
        // rather than a silence that would look like calm.
        Some(id) if id > newest => (0, true),
        Some(id) => (id, true),
        None => (newest, false),
    };
    // A stream opened with a console login ends when the login does: a
    // probe's stream went on delivering prompts after its logout.
    let end = journal.streams_end().child_token();
    let login_watch = login.map(|Extension(login)| {
        let alive = CancellationToken::new();
        tokio::spawn(end_with_login(
            app.clone(),
            login,
            end.clone(),
            alive.clone(),
        ));
        alive.drop_guard()
    });
    let cursor = Cursor {
        end,
        _login_watch: login_watch,
        journal,
        live,
        last,
        session,
        backlog: VecDeque::new(),
        catch_up,
        started: false,
        lost,
    };
    let stream = futures::stream::unfold(cursor, Cursor::next);
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// How often a stream opened with a console login checks it is still live.
const LOGIN_CHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// Ends `end` once `login` is logged out or expired; returns when `alive`
/// is cancelled (the stream went).
async fn end_with_login(
    app: App,
    login: ConsoleLoginRef,
    end: CancellationToken,
    alive: CancellationToken,
) {
    loop {
        tokio::select! {
            () = alive.cancelled() => return,
            () = tokio::time::sleep(LOGIN_CHECK) => {}
        }
        if !login.is_live(app.store()).await {
            end.cancel();
            return;
        }
    }
}

fn last_event_id(headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("").trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<i64>().map(Some).map_err(|_| {
        ApiError::bad_request(format!(
            "Last-Event-ID must be an event id (an integer), not {text:?}"
        ))
    })
}

/// Where one stream is: the last id sent, what is read but not sent yet,
/// and whether the table must be read before the live feed.
struct Cursor {
    journal: Arc<EventJournal>,
    live: broadcast::Receiver<Arc<StoredEvent>>,
    end: CancellationToken,
    /// Stops the watch on the stream's console login when the stream goes.
    _login_watch: Option<tokio_util::sync::DropGuard>,
    last: i64,
    session: Option<String>,
    backlog: VecDeque<StoredEvent>,
    catch_up: bool,
    started: bool,
    /// Ids the client missed that are no longer kept, told first.
    lost: Option<(i64, i64)>,
}

impl Cursor {
    async fn next(mut self) -> Option<(Result<Event, Infallible>, Cursor)> {
        if let Some((first, last)) = self.lost.take() {
            self.last = last;
            return Some((Ok(lost_message(first, last)), self));
        }
        if !self.started {
            // A position marker: no data, so nothing is dispatched, but a
            // client that reconnects before any event resumes from here.
            self.started = true;
            let marker = Event::default().id(self.last.to_string()).retry(RECONNECT);
            return Some((Ok(marker), self));
        }
        loop {
            if let Some(e) = self.backlog.pop_front() {
                if e.id <= self.last {
                    continue;
                }
                self.last = e.id;
                return Some((Ok(render(&e)), self));
            }
            if self.catch_up {
                let page = self
                    .journal
                    .after(self.last, self.session.as_deref(), PAGE)
                    .await;
                match page {
                    Ok(page) => {
                        // A page may stop short of PAGE at its byte
                        // bound: only an empty page means caught up.
                        self.catch_up = !page.is_empty();
                        self.backlog.extend(page);
                        continue;
                    }
                    Err(e) => {
                        // The client reconnects with its Last-Event-ID.
                        tracing::warn!("event stream cannot read the journal: {e}");
                        return None;
                    }
                }
            }
            let received = tokio::select! {
                r = self.live.recv() => r,
                () = self.end.cancelled() => return None,
            };
            match received {
                Ok(e) if e.id > self.last && self.wants(&e) => {
                    self.last = e.id;
                    return Some((Ok(render(&e)), self));
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => self.catch_up = true,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    fn wants(&self, e: &StoredEvent) -> bool {
        self.session.as_deref().is_none_or(|s| s == e.session_id)
    }
}

/// The ids after `seen` that the journal no longer keeps, if any.
async fn lost_after(journal: &EventJournal, seen: i64) -> Result<Option<(i64, i64)>, ApiError> {
    let first = journal
        .first_id()
        .await
        .map_err(crate::app::AppError::from)?;
    Ok(first.filter(|f| *f > seen + 1).map(|f| (seen + 1, f - 1)))
}

/// The `events_lost` message: ids `first..=last` are gone; its `id:` is
/// `last`, so a client reconnecting after it is not told again.
fn lost_message(first: i64, last: i64) -> Event {
    let data = serde_json::json!({
        "event": "events_lost",
        "event_id": last,
        "first_lost": first,
        "last_lost": last,
        "hint": "events were pruned from the journal before this stream read them; read the current state again (GET /api/sessions, GET /api/approvals?status=pending)",
    });
    Event::default().id(last.to_string()).data(data.to_string())
}

/// The SSE message: `id:` the journal id, `data:` the event with its
/// journal id (`event_id`), time (`emitted_at`) and session added.
pub fn render(e: &StoredEvent) -> Event {
    Event::default().id(e.id.to_string()).data(data(e))
}

/// The JSON `data:` of a stored event.
pub fn data(e: &StoredEvent) -> String {
    let mut value: serde_json::Value =
        serde_json::from_str(&e.payload).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(map) = value.as_object_mut() {
        map.insert("event_id".into(), e.id.into());
        map.insert("emitted_at".into(), e.at.into());
        map.entry("session_id")
            .or_insert_with(|| e.session_id.clone().into());
        map.entry("event").or_insert_with(|| e.kind.clone().into());
    }
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_carries_id_time_session_and_kind() {
        let e = StoredEvent {
            id: 7,
            at: 1000,
            session_id: "s-1".into(),
            kind: "notice".into(),
            payload: r#"{"event":"notice","id":"s-1:req-1","text":"<b>hi</b>"}"#.into(),
        };
        let v: serde_json::Value = serde_json::from_str(&data(&e)).expect("json");
        assert_eq!(v["event_id"], 7);
        assert_eq!(v["emitted_at"], 1000);
        assert_eq!(v["id"], "s-1:req-1", "the event's own fields stay");
        assert_eq!(v["session_id"], "s-1");
        assert_eq!(v["event"], "notice");
        assert_eq!(v["text"], "<b>hi</b>");
    }

    /// A replay page stops at its byte bound short of PAGE events; the
    /// stream must read on, not take the short page for the end.
    #[tokio::test]
    async fn a_replay_of_big_events_reaches_the_last_one() {
        use intercom_actors::model::SessionId;
        use intercom_actors::ports::{NoticeLevel, OperatorEvent, OperatorSink};
        let store = Arc::new(
            crate::storage::SqliteStore::open_in_memory()
                .await
                .expect("store"),
        );
        let journal = EventJournal::start(store);
        for i in 0..5 {
            journal.emit(OperatorEvent::Notice {
                session_id: SessionId::from("s-1"),
                level: NoticeLevel::Info,
                text: format!("{i} {}", "x".repeat(3 << 20)),
            });
        }
        journal.close().await;
        let mut cursor = Cursor {
            live: journal.subscribe(),
            journal,
            end: CancellationToken::new(),
            _login_watch: None,
            last: 0,
            session: None,
            backlog: VecDeque::new(),
            catch_up: true,
            started: true,
            lost: None,
        };
        for _ in 0..5 {
            let next = tokio::time::timeout(std::time::Duration::from_secs(10), cursor.next())
                .await
                .expect("the replay goes on past a short page");
            cursor = next.expect("an event").1;
        }
        assert_eq!(cursor.last, 5);
    }

    #[test]
    fn last_event_id_must_be_a_number() {
        let mut h = HeaderMap::new();
        assert!(matches!(last_event_id(&h), Ok(None)));
        h.insert("last-event-id", "42".parse().expect("header"));
        assert!(matches!(last_event_id(&h), Ok(Some(42))));
        h.insert("last-event-id", "x".parse().expect("header"));
        assert!(last_event_id(&h).is_err());
    }
}
