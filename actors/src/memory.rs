//! In-memory implementations of the ports, for tests and examples.
//!
//! [`MemoryStore`] behaves like the SQLite store (same errors, same ordering)
//! without a database; [`RecordingSink`] keeps every operator event and lets a
//! test wait for one without sleeping; [`MemoryOutbox`] is the Slack
//! gateway's outbox. Built for tests only (`cfg(test)` or the `test-hooks`
//! feature the test crates turn on): the server never ships them.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::model::{
    AuditEntry, Decision, MessageKind, PendingRequest, RequestStatus, Role, SessionId,
    SessionRecord, SessionStatus, Steering, TranscriptEntry, now_ms,
};
use crate::ports::{Clearance, OperatorEvent, OperatorSink, SessionStore, StoreError};
use crate::slack_port::{OutboundOp, Outbox, OutboxEntry, OutboxWrite};
use crate::transcript::{PageFill, TranscriptPage, TranscriptSlice};
use std::collections::HashMap;

#[derive(Default)]
struct Tables {
    sessions: Vec<SessionRecord>,
    messages: Vec<(SessionId, TranscriptEntry)>,
    requests: Vec<(PendingRequest, Option<Decision>)>,
    steering: Vec<(Steering, bool)>,
    audit: Vec<AuditEntry>,
    modes: std::collections::HashMap<SessionId, crate::rules::ApprovalMode>,
    processes: std::collections::HashMap<SessionId, (i32, u64)>,
    paused: std::collections::HashSet<SessionId>,
    in_turn: std::collections::HashSet<SessionId>,
    clearances: std::collections::HashMap<String, Clearance>,
    next_id: i64,
    /// Tests: how many delivery marks fail before they succeed again (a
    /// full disk, say).
    failing_marks: usize,
    /// Tests: how many session and request reads fail before they succeed
    /// again (a locked or unreadable database, say).
    failing_reads: usize,
}

/// A store that lives in memory.
#[derive(Default)]
pub struct MemoryStore {
    tables: Mutex<Tables>,
}

fn poisoned() -> StoreError {
    StoreError::Backend {
        op: "lock memory store",
        message: "a previous holder panicked".into(),
    }
}

/// Fails while the test asked reads to fail ([`MemoryStore::fail_reads`]).
fn failing_read(t: &mut Tables, op: &'static str) -> Result<(), StoreError> {
    if t.failing_reads == 0 {
        return Ok(());
    }
    t.failing_reads -= 1;
    Err(StoreError::Backend {
        op,
        message: "failing on purpose (a test)".into(),
    })
}

/// Changes the content of transcript entry `message_id` in place.
fn edit_message(
    t: &mut Tables,
    message_id: i64,
    edit: impl FnOnce(&mut String),
) -> Result<(), StoreError> {
    let m = t
        .messages
        .iter_mut()
        .find(|(_, m)| m.id == message_id)
        .ok_or_else(|| StoreError::NotFound {
            what: format!("message {message_id}"),
        })?;
    edit(&mut m.1.content);
    Ok(())
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tests: the next `n` calls to mark steering delivered fail.
    pub fn fail_delivery_marks(&self, n: usize) {
        let _ = self.with(|t| {
            t.failing_marks = n;
            Ok(())
        });
    }

    /// Tests: the next `n` reads of a session or a request fail.
    pub fn fail_reads(&self, n: usize) {
        let _ = self.with(|t| {
            t.failing_reads = n;
            Ok(())
        });
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Tables) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut t = self.tables.lock().map_err(|_| poisoned())?;
        f(&mut t)
    }

    /// The audit log so far (tests).
    pub fn audit_entries(&self) -> Vec<AuditEntry> {
        self.tables
            .lock()
            .map(|t| t.audit.clone())
            .unwrap_or_default()
    }

    fn session_mut<'a>(
        t: &'a mut Tables,
        id: &SessionId,
    ) -> Result<&'a mut SessionRecord, StoreError> {
        t.sessions
            .iter_mut()
            .find(|s| &s.id == id)
            .ok_or_else(|| StoreError::NotFound {
                what: format!("session {id}"),
            })
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn create_session(&self, rec: &SessionRecord) -> Result<(), StoreError> {
        self.with(|t| {
            t.sessions.push(rec.clone());
            Ok(())
        })
    }
    async fn delete_session(&self, id: &SessionId) -> Result<(), StoreError> {
        self.with(|t| {
            t.sessions.retain(|s| &s.id != id);
            t.messages.retain(|(s, _)| s != id);
            t.requests.retain(|(r, _)| &r.session_id != id);
            Ok(())
        })
    }
    async fn get_session(&self, id: &SessionId) -> Result<Option<SessionRecord>, StoreError> {
        self.with(|t| {
            failing_read(t, "read session")?;
            Ok(t.sessions.iter().find(|s| &s.id == id).cloned())
        })
    }
    async fn list_sessions(&self, live_only: bool) -> Result<Vec<SessionRecord>, StoreError> {
        self.with(|t| {
            Ok(t.sessions
                .iter()
                .rev()
                .filter(|s| !live_only || s.status.is_live())
                .cloned()
                .collect())
        })
    }
    async fn set_status(
        &self,
        id: &SessionId,
        status: SessionStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        self.with(|t| {
            let s = Self::session_mut(t, id)?;
            s.status = status;
            s.status_reason = reason.map(str::to_owned);
            s.updated_at = now_ms();
            Ok(())
        })
    }
    async fn set_acp_session_id(&self, id: &SessionId, acp_id: &str) -> Result<(), StoreError> {
        self.with(|t| {
            Self::session_mut(t, id)?.acp_session_id = Some(acp_id.to_owned());
            Ok(())
        })
    }
    async fn set_thread(&self, id: &SessionId, channel: &str, ts: &str) -> Result<(), StoreError> {
        self.with(|t| {
            let s = Self::session_mut(t, id)?;
            if s.thread_ts.is_none() {
                s.channel_id = Some(channel.to_owned());
                s.thread_ts = Some(ts.to_owned());
            }
            Ok(())
        })
    }
    async fn set_restart_count(&self, id: &SessionId, count: u32) -> Result<(), StoreError> {
        self.with(|t| {
            Self::session_mut(t, id)?.restart_count = count;
            Ok(())
        })
    }
    async fn touch(&self, id: &SessionId) -> Result<(), StoreError> {
        self.with(|t| {
            Self::session_mut(t, id)?.last_activity_at = now_ms();
            Ok(())
        })
    }
    async fn append_message(
        &self,
        id: &SessionId,
        role: Role,
        kind: MessageKind,
        content: &str,
    ) -> Result<i64, StoreError> {
        self.with(|t| {
            t.next_id += 1;
            let entry = TranscriptEntry {
                id: t.next_id,
                role,
                kind,
                content: content.to_owned(),
                created_at: now_ms(),
            };
            t.messages.push((id.clone(), entry));
            Ok(t.next_id)
        })
    }
    async fn append_to_message(&self, message_id: i64, tail: &str) -> Result<(), StoreError> {
        self.with(|t| edit_message(t, message_id, |c| c.push_str(tail)))
    }
    async fn update_message(&self, message_id: i64, content: &str) -> Result<(), StoreError> {
        self.with(|t| edit_message(t, message_id, |c| *c = content.to_owned()))
    }
    async fn transcript_page(
        &self,
        id: &SessionId,
        page: TranscriptPage,
    ) -> Result<TranscriptSlice, StoreError> {
        self.with(|t| {
            let mut fill = PageFill::new(page);
            let mine = t
                .messages
                .iter()
                .filter(|(s, m)| s == id && page.admits(m))
                .map(|(_, m)| m);
            let in_order: Box<dyn Iterator<Item = &TranscriptEntry>> = if page.newest_first() {
                Box::new(mine.rev())
            } else {
                Box::new(mine)
            };
            for m in in_order {
                if !fill.offer(m.clone()) {
                    break;
                }
            }
            Ok(fill.finish())
        })
    }
    async fn insert_request(&self, req: &PendingRequest) -> Result<(), StoreError> {
        self.with(|t| {
            t.requests.push((req.clone(), None));
            Ok(())
        })
    }
    async fn decide_request(&self, id: &str, decision: &Decision) -> Result<(), StoreError> {
        self.with(|t| {
            let (req, d) = t
                .requests
                .iter_mut()
                .find(|(r, _)| r.id == id)
                .ok_or_else(|| StoreError::NotFound {
                    what: format!("request {id}"),
                })?;
            if req.status != RequestStatus::Pending {
                return Err(StoreError::AlreadyResolved {
                    id: id.to_owned(),
                    status: req.status.as_str().to_owned(),
                });
            }
            req.status = RequestStatus::Decided;
            *d = Some(decision.clone());
            Ok(())
        })
    }
    async fn close_request(&self, id: &str, status: RequestStatus) -> Result<(), StoreError> {
        self.with(|t| {
            if let Some((req, _)) = t.requests.iter_mut().find(|(r, _)| r.id == id)
                && req.status == RequestStatus::Pending
            {
                req.status = status;
            }
            Ok(())
        })
    }
    async fn get_request(
        &self,
        id: &str,
    ) -> Result<Option<(PendingRequest, Option<Decision>)>, StoreError> {
        self.with(|t| {
            failing_read(t, "read request")?;
            Ok(t.requests.iter().find(|(r, _)| r.id == id).cloned())
        })
    }
    async fn list_requests(
        &self,
        session: Option<&SessionId>,
        pending_only: bool,
    ) -> Result<Vec<PendingRequest>, StoreError> {
        self.with(|t| {
            Ok(t.requests
                .iter()
                .rev()
                .map(|(r, _)| r)
                .filter(|r| session.is_none_or(|s| &r.session_id == s))
                .filter(|r| !pending_only || r.status == RequestStatus::Pending)
                .cloned()
                .collect())
        })
    }
    async fn enqueue_steering(
        &self,
        id: &SessionId,
        text: &str,
        author: &str,
    ) -> Result<Steering, StoreError> {
        self.with(|t| {
            t.next_id += 1;
            let s = Steering {
                id: t.next_id,
                session_id: id.clone(),
                text: text.to_owned(),
                author: author.to_owned(),
                created_at: now_ms(),
            };
            t.steering.push((s.clone(), false));
            Ok(s)
        })
    }
    async fn set_paused(&self, id: &SessionId, paused: bool) -> Result<(), StoreError> {
        self.with(|t| {
            Self::session_mut(t, id)?;
            if paused {
                t.paused.insert(id.clone());
            } else {
                t.paused.remove(id);
            }
            Ok(())
        })
    }
    async fn is_paused(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.with(|t| Ok(t.paused.contains(id)))
    }
    async fn set_turn_running(&self, id: &SessionId, running: bool) -> Result<(), StoreError> {
        self.with(|t| {
            Self::session_mut(t, id)?;
            if running {
                t.in_turn.insert(id.clone());
            } else {
                t.in_turn.remove(id);
            }
            Ok(())
        })
    }
    async fn turn_was_running(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.with(|t| Ok(t.in_turn.contains(id)))
    }
    async fn undelivered_steering(&self, id: &SessionId) -> Result<Vec<Steering>, StoreError> {
        self.with(|t| {
            Ok(t.steering
                .iter()
                .filter(|(s, done)| &s.session_id == id && !done)
                .map(|(s, _)| s.clone())
                .collect())
        })
    }
    async fn mark_steering_delivered(&self, steering_id: i64) -> Result<(), StoreError> {
        self.with(|t| {
            if t.failing_marks > 0 {
                t.failing_marks -= 1;
                return Err(StoreError::Backend {
                    op: "mark steering delivered",
                    message: "failing on purpose (a test)".into(),
                });
            }
            if let Some(s) = t.steering.iter_mut().find(|(s, _)| s.id == steering_id) {
                s.1 = true;
            }
            Ok(())
        })
    }
    async fn audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        self.with(|t| {
            t.audit.push(entry.clone());
            Ok(())
        })
    }
    async fn set_agent_process(
        &self,
        id: &SessionId,
        process: Option<(i32, u64)>,
    ) -> Result<(), StoreError> {
        self.with(|t| {
            match process {
                Some(p) => t.processes.insert(id.clone(), p),
                None => t.processes.remove(id),
            };
            Ok(())
        })
    }
    async fn agent_process(&self, id: &SessionId) -> Result<Option<(i32, u64)>, StoreError> {
        self.with(|t| Ok(t.processes.get(id).copied()))
    }
    async fn approval_mode(
        &self,
        id: &SessionId,
    ) -> Result<crate::rules::ApprovalMode, StoreError> {
        self.with(|t| Ok(t.modes.get(id).copied().unwrap_or_default()))
    }
    async fn set_approval_mode(
        &self,
        id: &SessionId,
        mode: crate::rules::ApprovalMode,
    ) -> Result<(), StoreError> {
        self.with(|t| {
            t.modes.insert(id.clone(), mode);
            Ok(())
        })
    }

    async fn record_clearance(&self, clearance: &Clearance) -> Result<(), StoreError> {
        self.with(|t| {
            let applied_at = t
                .clearances
                .get(&clearance.request_id)
                .and_then(|c| c.applied_at);
            let mut c = clearance.clone();
            c.applied_at = applied_at;
            t.clearances.insert(c.request_id.clone(), c);
            Ok(())
        })
    }

    async fn clearance(&self, request_id: &str) -> Result<Option<Clearance>, StoreError> {
        self.with(|t| Ok(t.clearances.get(request_id).cloned()))
    }

    async fn claim_clearance(
        &self,
        request_id: &str,
        session_id: &SessionId,
        at: i64,
    ) -> Result<bool, StoreError> {
        self.with(|t| {
            let c = t
                .clearances
                .entry(request_id.to_owned())
                .or_insert_with(|| Clearance {
                    request_id: request_id.to_owned(),
                    session_id: session_id.clone(),
                    files: Vec::new(),
                    applied_at: None,
                });
            if c.applied_at.is_some() {
                return Ok(false);
            }
            c.applied_at = Some(at);
            Ok(true)
        })
    }

    async fn release_clearance(&self, request_id: &str) -> Result<(), StoreError> {
        self.with(|t| {
            if let Some(c) = t.clearances.get_mut(request_id) {
                c.applied_at = None;
            }
            Ok(())
        })
    }
}

/// An operator sink that records every event and wakes waiters.
#[derive(Default)]
pub struct RecordingSink {
    events: Mutex<Vec<OperatorEvent>>,
    changed: Notify,
}

impl RecordingSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// Everything emitted so far.
    pub fn events(&self) -> Vec<OperatorEvent> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Waits until some event satisfies `pred`, or `timeout` passes.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&OperatorEvent) -> bool,
    ) -> Option<OperatorEvent> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            if let Some(e) = self.events().into_iter().find(|e| pred(e)) {
                return Some(e);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }
}

impl OperatorSink for RecordingSink {
    fn emit(&self, event: OperatorEvent) {
        if let Ok(mut e) = self.events.lock() {
            e.push(event);
        }
        self.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_clearance_is_claimed_once_and_keeps_its_mark_when_recorded_again() {
        let store = MemoryStore::new();
        let sid = SessionId("s-1".into());
        let c = Clearance {
            request_id: "s-1:req-1".into(),
            session_id: sid.clone(),
            files: vec![("a".into(), Some([1; 32]))],
            applied_at: None,
        };
        store.record_clearance(&c).await.expect("record");
        assert!(
            store
                .claim_clearance("s-1:req-1", &sid, 9)
                .await
                .expect("claim")
        );
        assert!(
            !store
                .claim_clearance("s-1:req-1", &sid, 10)
                .await
                .expect("again")
        );
        store.record_clearance(&c).await.expect("record");
        let got = store.clearance("s-1:req-1").await.expect("read");
        assert_eq!(
            got.map(|c| (c.files, c.applied_at)),
            Some((c.files.clone(), Some(9)))
        );
        store.release_clearance("s-1:req-1").await.expect("release");
        assert!(
            store
                .claim_clearance("s-1:req-1", &sid, 11)
                .await
                .expect("claim")
        );
        // A forced apply of an unrecorded request creates the mark.
        assert!(
            store
                .claim_clearance("s-2:req-1", &sid, 12)
                .await
                .expect("new")
        );
    }
}

/// An in-memory [`Outbox`] for tests.
#[derive(Debug, Default)]
pub struct MemoryOutbox {
    inner: Mutex<MemoryOutboxInner>,
}

#[derive(Debug, Default)]
struct MemoryOutboxInner {
    next: i64,
    rows: Vec<(OutboxEntry, Option<String>)>,
    keys: HashMap<(String, String), String>,
}

impl MemoryOutbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// Operations marked failed, with their errors.
    pub fn failed(&self) -> Vec<(OutboxEntry, String)> {
        self.lock()
            .rows
            .iter()
            .filter_map(|(e, err)| err.clone().map(|err| (e.clone(), err)))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryOutboxInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl MemoryOutboxInner {
    fn push(&mut self, lane: &str, op: &OutboundOp) -> i64 {
        self.next += 1;
        let id = self.next;
        self.rows.push((
            OutboxEntry {
                id,
                lane: lane.to_owned(),
                op: op.clone(),
            },
            None,
        ));
        id
    }

    fn replace(&mut self, id: i64, op: &OutboundOp) {
        for (e, err) in &mut self.rows {
            if e.id == id && err.is_none() {
                e.op = op.clone();
            }
        }
    }

    fn fail(&mut self, id: i64, error: &str) {
        for (e, err) in &mut self.rows {
            if e.id == id {
                *err = Some(error.to_owned());
            }
        }
    }

    fn remember(&mut self, lane: &str, key: &str, ts: &str) {
        self.keys
            .insert((lane.to_owned(), key.to_owned()), ts.to_owned());
    }
}

impl MemoryOutboxInner {
    /// One write; the row id a push created.
    fn apply_one(&mut self, w: &OutboxWrite) -> Option<i64> {
        match w {
            OutboxWrite::Push { lane, op } => return Some(self.push(lane, op)),
            OutboxWrite::Replace { id, op } => self.replace(*id, op),
            OutboxWrite::Delete { id } => self.rows.retain(|(e, _)| e.id != *id),
            OutboxWrite::Fail { id, error } => self.fail(*id, error),
            OutboxWrite::Remember { lane, key, ts } => self.remember(lane, key, ts),
        }
        None
    }
}

#[async_trait]
impl Outbox for MemoryOutbox {
    /// Under one lock: atomic like a real store's commit.
    async fn apply(&self, writes: &[OutboxWrite]) -> Result<Vec<Option<i64>>, StoreError> {
        let mut inner = self.lock();
        Ok(writes.iter().map(|w| inner.apply_one(w)).collect())
    }

    async fn pending(&self) -> Result<Vec<OutboxEntry>, StoreError> {
        Ok(self
            .lock()
            .rows
            .iter()
            .filter(|(_, err)| err.is_none())
            .map(|(e, _)| e.clone())
            .collect())
    }

    async fn recall(&self, lane: &str, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .lock()
            .keys
            .get(&(lane.to_owned(), key.to_owned()))
            .cloned())
    }
}
