//! Which credential opened each MCP session, so that no other one can use it.
//!
//! rmcp finds an MCP session by its `Mcp-Session-Id` header alone. That id
//! is a random UUID but not a credential: it travels in every request,
//! shows up in client logs and debug output, and an agent running beside an
//! IDE can learn it. Whoever presents it would act on that session: its
//! workspace, its steering, its in-flight calls, its end (`DELETE`). So the
//! auth layer (`auth.rs`) records, when an `initialize` response hands out a
//! new id, which credential asked for it ([`Owner`]), and answers a request
//! that presents the id with any other credential, or an id it never handed
//! out, with 404: what the MCP spec says a server answers for an unknown
//! session, so a stranger learns nothing about the session either.
//!
//! Why a small owned type behind a `std::sync::Mutex` rather than an actor:
//! each use is one hash-map operation on the request path, never held across
//! an `.await`; an actor would add a mailbox round trip to every MCP request
//! and isolate nothing more. Every change goes through [`SessionOwners`]'
//! methods; nothing else touches the map.
//!
//! Entries are forgotten when the session ends. rmcp calls
//! `SessionManager::close_session` on a `DELETE`, when the session expires
//! idle, and at shutdown; [`OwnedSessions`] wraps rmcp's session manager and
//! forgets the owner there. As a backstop (a session that ended before its
//! owner was recorded, say), the map holds at most [`CAP`] entries and
//! evicts the oldest beyond that: that session's client then gets 404 and
//! opens a new session, the MCP spec's recovery. Failing closed is the point:
//! an id without a recorded owner is refused, never waved through.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::Stream;
use intercom_actors::model::SessionId as CoreSessionId;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::{
    EventStore, RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};

/// The most owners remembered at once (see the module doc).
pub(crate) const CAP: usize = 10_000;

/// The most MCP sessions one credential may hold open at once. An IDE
/// opens one or two; without a bound, one token opened thousands (each
/// holding memory until its keep-alive ran out), filled the server's core
/// sessions for every other client, and churned the owner table until it
/// evicted other clients' sessions. A credential at the bound is answered
/// 429 until it closes one (`DELETE`) or one expires.
pub(crate) const PER_OWNER: usize = 32;

/// A credential at [`PER_OWNER`] that opens one more MCP session has its
/// session idle longest closed to make room, when that one has had nothing
/// in flight (no call, no open stream) for this long. An IDE that reloads
/// without `DELETE` leaves its old sessions behind, and they expire only
/// after the longest blocking wait (an hour, for `standby`): 32 reloads
/// locked its workspace out of `/mcp` for 65 minutes.
pub(crate) const REPLACEABLE_AFTER: Duration = Duration::from_secs(60);

/// The identity of a credential on `/mcp`; never the token itself, so the
/// map holds no secret and logging an [`Owner`] leaks none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Owner {
    /// The operator API token.
    Operator,
    /// The MCP token of this workspace.
    Workspace(String),
    /// A bridge token: the ACP session it was issued to.
    Bridge(CoreSessionId),
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Operator => f.write_str("the operator token"),
            Owner::Workspace(ws) => write!(f, "the MCP token of workspace `{ws}`"),
            Owner::Bridge(id) => write!(f, "the bridge token of session {id}"),
        }
    }
}

/// Why a request may not use the MCP session it named. Both are answered
/// 404 (an unknown session); the difference is only logged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotYours {
    /// No owner is recorded: the session ended, never existed, or was
    /// evicted.
    #[error("unknown MCP session; open a new one with `initialize`")]
    Unknown,
    /// Another credential opened it.
    #[error(
        "this MCP session was opened with {owner}, not {presented}; open your own with `initialize`"
    )]
    Other {
        /// Who opened it.
        owner: Owner,
        /// Who presented its id.
        presented: Owner,
    },
}

/// A place held for an MCP session being opened; given back when dropped,
/// whether or not a session was claimed with it.
#[derive(Debug)]
pub(crate) struct Reservation {
    owners: Arc<SessionOwners>,
    number: u64,
}

impl Reservation {
    /// The `initialize` answer named MCP session `id`: it is `owner`'s now
    /// (the reservation becomes the claim in one step).
    pub(crate) fn claim(self, id: &str) {
        // One lock: the place is never free between the reservation and
        // the claim, so no other initialize can take it meanwhile.
        let mut t = self.owners.table();
        if let Some(owner) = t.reserved.remove(&self.number) {
            SessionOwners::record(&mut t, id, owner, CAP);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.owners.table().reserved.remove(&self.number);
    }
}

/// The owner of each live MCP session, by `Mcp-Session-Id`.
#[derive(Debug, Default)]
pub(crate) struct SessionOwners {
    inner: Mutex<Table>,
}

/// The map and its insertion order (for eviction beyond [`CAP`]).
#[derive(Debug, Default)]
struct Table {
    owners: HashMap<String, (u64, Owner)>,
    order: BTreeMap<u64, String>,
    next: u64,
    /// `initialize` requests under way, by reservation number: they count
    /// against [`PER_OWNER`] until their session is claimed or they end.
    reserved: HashMap<u64, Owner>,
    /// What each recorded session is doing, for [`SessionOwners::idlest`].
    activity: HashMap<String, Activity>,
}

/// Requests of one MCP session under way (a blocking call, an open stream)
/// and when one last began or ended.
#[derive(Debug)]
struct Activity {
    in_flight: u32,
    last: Instant,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            in_flight: 0,
            last: Instant::now(),
        }
    }
}

/// One request of an MCP session under way; ends when dropped (with the
/// response's body, for a stream).
#[derive(Debug)]
pub(crate) struct Busy {
    owners: Arc<SessionOwners>,
    id: String,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut t = self.owners.table();
        if let Some(a) = t.activity.get_mut(&self.id) {
            a.in_flight = a.in_flight.saturating_sub(1);
            a.last = Instant::now();
        }
    }
}

impl SessionOwners {
    /// A poisoned lock only means a panic elsewhere mid-operation; each
    /// operation leaves the table usable, so carry on with it.
    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that `owner` opened MCP session `id`, evicting the oldest
    /// entries beyond `cap`.
    pub(crate) fn claim(&self, id: &str, owner: Owner) {
        self.claim_capped(id, owner, CAP);
    }

    fn claim_capped(&self, id: &str, owner: Owner, cap: usize) {
        Self::record(&mut self.table(), id, owner, cap);
    }

    /// Records `owner` for `id` in the table, evicting the oldest beyond
    /// `cap`.
    fn record(t: &mut Table, id: &str, owner: Owner, cap: usize) {
        let seq = t.next;
        t.next += 1;
        if let Some((old, _)) = t.owners.insert(id.to_owned(), (seq, owner)) {
            t.order.remove(&old);
        }
        t.order.insert(seq, id.to_owned());
        t.activity
            .entry(id.to_owned())
            .or_insert_with(Activity::new);
        while t.owners.len() > cap {
            let Some((_, oldest)) = t.order.pop_first() else {
                break;
            };
            t.owners.remove(&oldest);
            t.activity.remove(&oldest);
            tracing::warn!(
                cap,
                "more MCP sessions than remembered owners; the oldest one's client must reconnect"
            );
        }
    }

    /// Whether `presented` may use MCP session `id`.
    pub(crate) fn check(&self, id: &str, presented: &Owner) -> Result<(), NotYours> {
        match self.table().owners.get(id) {
            Some((_, owner)) if owner == presented => Ok(()),
            Some((_, owner)) => Err(NotYours::Other {
                owner: owner.clone(),
                presented: presented.clone(),
            }),
            None => Err(NotYours::Unknown),
        }
    }

    /// How many MCP sessions `owner` holds open or is opening.
    fn held(t: &Table, owner: &Owner) -> usize {
        t.owners.values().filter(|(_, o)| o == owner).count()
            + t.reserved.values().filter(|o| *o == owner).count()
    }

    /// Reserves a place for one more MCP session of `owner`, counted with
    /// its open sessions under the same lock, so concurrent `initialize`
    /// requests cannot all pass the check before any is claimed. `None` at
    /// [`PER_OWNER`].
    pub(crate) fn reserve(self: &Arc<Self>, owner: &Owner) -> Option<Reservation> {
        let mut t = self.table();
        if Self::held(&t, owner) >= PER_OWNER {
            return None;
        }
        let number = t.next;
        t.next += 1;
        t.reserved.insert(number, owner.clone());
        Some(Reservation {
            owners: self.clone(),
            number,
        })
    }

    /// Forgets MCP session `id` (it ended).
    pub(crate) fn forget(&self, id: &str) {
        let mut t = self.table();
        if let Some((seq, _)) = t.owners.remove(id) {
            t.order.remove(&seq);
        }
        t.activity.remove(id);
    }

    /// A request of MCP session `id` begins; it ends when the guard drops.
    pub(crate) fn busy(self: &Arc<Self>, id: &str) -> Busy {
        let mut t = self.table();
        let a = t
            .activity
            .entry(id.to_owned())
            .or_insert_with(Activity::new);
        a.in_flight += 1;
        a.last = Instant::now();
        Busy {
            owners: self.clone(),
            id: id.to_owned(),
        }
    }

    /// `owner`'s session with nothing under way for longest, when that is
    /// at least `idle_for`.
    pub(crate) fn idlest(&self, owner: &Owner, idle_for: Duration) -> Option<String> {
        let t = self.table();
        let now = Instant::now();
        t.owners
            .iter()
            .filter(|(_, (_, o))| o == owner)
            .filter_map(|(id, _)| t.activity.get(id).map(|a| (id, a)))
            .filter(|(_, a)| a.in_flight == 0 && now.duration_since(a.last) >= idle_for)
            .min_by_key(|(_, a)| a.last)
            .map(|(id, _)| id.clone())
    }

    /// How many owners are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table().owners.len()
    }
}

/// rmcp's session manager `M`, plus: a session that ends is forgotten in
/// [`SessionOwners`]. Everything else is `M`'s.
pub(crate) struct OwnedSessions<M> {
    inner: M,
    owners: Arc<SessionOwners>,
}

impl<M> OwnedSessions<M> {
    pub(crate) fn new(inner: M, owners: Arc<SessionOwners>) -> Self {
        OwnedSessions { inner, owners }
    }
}

impl<M: SessionManager> SessionManager for OwnedSessions<M> {
    type Error = M::Error;
    type Transport = M::Transport;

    fn create_session(
        &self,
    ) -> impl Future<Output = Result<(SessionId, Self::Transport), Self::Error>> + Send {
        self.inner.create_session()
    }

    fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<ServerJsonRpcMessage, Self::Error>> + Send {
        self.inner.initialize_session(id, message)
    }

    fn has_session(
        &self,
        id: &SessionId,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        self.inner.has_session(id)
    }

    /// Called for a `DELETE`, an idle expiry and at shutdown alike.
    fn close_session(
        &self,
        id: &SessionId,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.owners.forget(id);
        self.inner.close_session(id)
    }

    fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<
        Output = Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>,
    > + Send {
        self.inner.create_stream(id, message)
    }

    fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.accept_message(id, message)
    }

    fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> impl Future<
        Output = Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>,
    > + Send {
        self.inner.create_standalone_stream(id)
    }

    fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> impl Future<
        Output = Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>,
    > + Send {
        self.inner.resume(id, last_event_id)
    }

    fn restore_session(
        &self,
        id: SessionId,
    ) -> impl Future<Output = Result<RestoreOutcome<Self::Transport>, Self::Error>> + Send {
        self.inner.restore_session(id)
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idlest_session_is_one_with_nothing_under_way() {
        let owners = Arc::new(SessionOwners::default());
        let me = Owner::Workspace("a".into());
        let other = Owner::Workspace("b".into());
        owners.claim("old", me.clone());
        owners.claim("streaming", me.clone());
        owners.claim("theirs", other.clone());
        // A session with a call or a stream open is never the idlest.
        let busy = owners.busy("streaming");
        assert_eq!(owners.idlest(&me, Duration::ZERO).as_deref(), Some("old"));
        // Not idle long enough yet: none.
        assert_eq!(owners.idlest(&me, Duration::from_secs(3600)), None);
        // The one used last is not the idlest; nor is another owner's.
        drop(busy);
        let used = owners.busy("old");
        drop(used);
        assert_eq!(
            owners.idlest(&me, Duration::ZERO).as_deref(),
            Some("streaming")
        );
        assert_eq!(
            owners.idlest(&other, Duration::ZERO).as_deref(),
            Some("theirs")
        );
        // A forgotten (closed) session is no longer a candidate.
        owners.forget("streaming");
        owners.forget("old");
        assert_eq!(owners.idlest(&me, Duration::ZERO), None);
    }

    #[test]
    fn reservations_count_against_the_cap_until_claimed_or_dropped() {
        let owners = Arc::new(SessionOwners::default());
        let me = Owner::Workspace("a".into());
        let held: Vec<Reservation> = (0..PER_OWNER)
            .map(|_| owners.reserve(&me).expect("a place"))
            .collect();
        // Every place is reserved before any session exists: the next waits.
        assert!(owners.reserve(&me).is_none());
        assert!(
            owners.reserve(&Owner::Operator).is_some(),
            "others are not affected"
        );
        let mut held = held.into_iter();
        held.next().expect("one").claim("s-1");
        assert!(
            owners.reserve(&me).is_none(),
            "a claimed session still counts"
        );
        drop(held.next());
        let again = owners
            .reserve(&me)
            .expect("a dropped reservation frees its place");
        drop(again);
        owners.forget("s-1");
        assert!(owners.check("s-1", &me).is_err());
    }

    fn ws(id: &str) -> Owner {
        Owner::Workspace(id.into())
    }

    #[test]
    fn only_the_credential_that_opened_a_session_may_use_it() {
        let owners = SessionOwners::default();
        owners.claim("m-1", ws("a"));
        assert_eq!(owners.check("m-1", &ws("a")), Ok(()));
        for stranger in [
            Owner::Operator,
            ws("b"),
            Owner::Bridge(CoreSessionId::from("s-1")),
        ] {
            let err = owners.check("m-1", &stranger).expect_err("refused");
            assert_eq!(
                err,
                NotYours::Other {
                    owner: ws("a"),
                    presented: stranger
                }
            );
        }
        let bridge = Owner::Bridge(CoreSessionId::from("s-1"));
        owners.claim("m-2", bridge.clone());
        assert_eq!(owners.check("m-2", &bridge), Ok(()));
        let other_bridge = Owner::Bridge(CoreSessionId::from("s-2"));
        assert!(owners.check("m-2", &other_bridge).is_err());
    }

    #[test]
    fn an_unrecorded_or_ended_session_is_unknown() {
        let owners = SessionOwners::default();
        assert_eq!(
            owners.check("m-1", &Owner::Operator),
            Err(NotYours::Unknown)
        );
        owners.claim("m-1", Owner::Operator);
        owners.forget("m-1");
        assert_eq!(
            owners.check("m-1", &Owner::Operator),
            Err(NotYours::Unknown)
        );
        assert_eq!(owners.len(), 0);
        owners.forget("never-there");
    }

    #[test]
    fn beyond_the_cap_the_oldest_is_evicted() {
        let owners = SessionOwners::default();
        for i in 0..3 {
            owners.claim_capped(&format!("m-{i}"), Owner::Operator, 2);
        }
        assert_eq!(owners.len(), 2);
        assert_eq!(
            owners.check("m-0", &Owner::Operator),
            Err(NotYours::Unknown)
        );
        assert_eq!(owners.check("m-2", &Owner::Operator), Ok(()));
        // Forgotten entries leave no stale order behind.
        owners.forget("m-1");
        owners.claim_capped("m-3", Owner::Operator, 2);
        owners.claim_capped("m-4", Owner::Operator, 2);
        assert_eq!(owners.len(), 2);
        assert_eq!(owners.check("m-3", &Owner::Operator), Ok(()));
        assert_eq!(owners.check("m-4", &Owner::Operator), Ok(()));
    }

    #[test]
    fn the_message_names_identities_not_tokens() {
        let err = NotYours::Other {
            owner: Owner::Operator,
            presented: ws("demo"),
        };
        assert_eq!(
            err.to_string(),
            "this MCP session was opened with the operator token, not the MCP token of workspace `demo`; open your own with `initialize`"
        );
    }
}
