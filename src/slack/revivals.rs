//! Replies held while a session is revived, in one small actor.
//!
//! Why this exists: a reply in the thread of a session that ended by idle
//! timeout revives it, which takes the agent's handshake; replies that arrive
//! in that thread meanwhile must wait and then be delivered in arrival
//! order. Which threads are being revived and what waits for them is state
//! owned by this actor and changed only by its messages (no shared map), so
//! two replies racing to revive the same thread start one revive, and the
//! second is held behind it.

use std::collections::HashMap;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::inbound::HeldReply;

/// A Slack thread: (channel, thread ts).
pub type Thread = (String, String);

/// How long a call to the desk may take (it answers from memory).
const CALL_MS: u64 = 5000;

/// Messages the desk handles.
pub enum RevivalMsg {
    /// A reply arrived in `thread`: held (answered true) when a revive of its
    /// session is under way, else left to the normal path (false).
    ReplyArrived(Thread, HeldReply, RpcReplyPort<bool>),
    /// A reply asks to revive `thread`'s session: answered true when this
    /// begins the revive, false when one was under way (the reply is held
    /// behind it).
    ReviveRequested(Thread, HeldReply, RpcReplyPort<bool>),
    /// The revive succeeded: the replies held so far, in order. An empty
    /// answer ends the revive (later replies take the normal path).
    NextHeld(Thread, RpcReplyPort<Vec<HeldReply>>),
    /// The revive failed: every reply held, in order; the revive ends.
    ReviveFailed(Thread, RpcReplyPort<Vec<HeldReply>>),
}

/// The desk's actor.
pub struct RevivalDesk;

impl Actor for RevivalDesk {
    type Msg = RevivalMsg;
    type State = HashMap<Thread, Vec<HeldReply>>;
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<RevivalMsg>,
        _: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(HashMap::new())
    }

    async fn handle(
        &self,
        _myself: ActorRef<RevivalMsg>,
        msg: RevivalMsg,
        held: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RevivalMsg::ReplyArrived(thread, reply, answer) => {
                let queue = held.get_mut(&thread);
                let waiting = queue.is_some();
                if let Some(q) = queue {
                    q.push(reply);
                }
                let _ = answer.send(waiting);
            }
            RevivalMsg::ReviveRequested(thread, reply, answer) => {
                let begins = !held.contains_key(&thread);
                held.entry(thread).or_default().push(reply);
                let _ = answer.send(begins);
            }
            RevivalMsg::NextHeld(thread, answer) => {
                let batch = held.get_mut(&thread).map(std::mem::take);
                let batch = batch.unwrap_or_default();
                if batch.is_empty() {
                    held.remove(&thread);
                }
                let _ = answer.send(batch);
            }
            RevivalMsg::ReviveFailed(thread, answer) => {
                let _ = answer.send(held.remove(&thread).unwrap_or_default());
            }
        }
        Ok(())
    }
}

/// The inbound handlers' handle on the desk. A desk that does not answer
/// is logged; the reply then takes the normal path (it is never lost
/// silently: the operator gets an answer either way).
#[derive(Clone)]
pub struct Revivals(pub ActorRef<RevivalMsg>);

impl Revivals {
    /// Spawns a desk.
    pub async fn start() -> Result<Revivals, ractor::SpawnErr> {
        let (desk, _) = Actor::spawn(None, RevivalDesk, ()).await?;
        Ok(Revivals(desk))
    }

    /// Holds `reply` when `thread`'s session is being revived.
    pub async fn hold_if_reviving(&self, thread: &Thread, reply: &HeldReply) -> bool {
        let t = thread.clone();
        let r = reply.clone();
        ractor::call_t!(self.0, |p| RevivalMsg::ReplyArrived(t, r, p), CALL_MS)
            .map_err(|e| tracing::error!("the revival desk did not answer: {e}"))
            .unwrap_or(false)
    }

    /// True when `reply` begins a revive of `thread`'s session.
    pub async fn begin(&self, thread: &Thread, reply: HeldReply) -> bool {
        let t = thread.clone();
        ractor::call_t!(
            self.0,
            |p| RevivalMsg::ReviveRequested(t, reply, p),
            CALL_MS
        )
        .map_err(|e| tracing::error!("the revival desk did not answer: {e}"))
        .unwrap_or(false)
    }

    /// The replies held for `thread` so far (empty: the revive is over).
    pub async fn next_held(&self, thread: &Thread) -> Vec<HeldReply> {
        let t = thread.clone();
        ractor::call_t!(self.0, |p| RevivalMsg::NextHeld(t, p), CALL_MS)
            .map_err(|e| tracing::error!("the revival desk did not answer: {e}"))
            .unwrap_or_default()
    }

    /// Every reply held for `thread`; the revive failed.
    pub async fn failed(&self, thread: &Thread) -> Vec<HeldReply> {
        let t = thread.clone();
        ractor::call_t!(self.0, |p| RevivalMsg::ReviveFailed(t, p), CALL_MS)
            .map_err(|e| tracing::error!("the revival desk did not answer: {e}"))
            .unwrap_or_default()
    }

    /// Stops the desk (Slack shutdown).
    pub fn stop(&self) {
        self.0.stop(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(text: &str) -> HeldReply {
        HeldReply {
            user: "U1".into(),
            text: text.into(),
            ts: format!("ts-{text}"),
        }
    }

    fn texts(batch: &[HeldReply]) -> Vec<&str> {
        batch.iter().map(|h| h.text.as_str()).collect()
    }

    #[tokio::test]
    async fn replies_during_a_revive_are_held_in_order_and_one_revive_begins() {
        let desk = Revivals::start().await.expect("desk");
        let thread: Thread = ("C1".into(), "1.0".into());
        let other: Thread = ("C1".into(), "2.0".into());
        assert!(!desk.hold_if_reviving(&thread, &reply("early")).await);
        assert!(desk.begin(&thread, reply("a")).await);
        // A second reply racing to revive the same thread is held instead.
        assert!(!desk.begin(&thread, reply("b")).await);
        assert!(desk.hold_if_reviving(&thread, &reply("c")).await);
        assert!(!desk.hold_if_reviving(&other, &reply("x")).await);
        assert_eq!(texts(&desk.next_held(&thread).await), ["a", "b", "c"]);
        assert!(desk.hold_if_reviving(&thread, &reply("d")).await);
        assert_eq!(texts(&desk.next_held(&thread).await), ["d"]);
        // Nothing left: the revive is over and replies take the normal path.
        assert!(desk.next_held(&thread).await.is_empty());
        assert!(!desk.hold_if_reviving(&thread, &reply("e")).await);
        desk.stop();
    }

    #[tokio::test]
    async fn a_failed_revive_hands_back_every_held_reply() {
        let desk = Revivals::start().await.expect("desk");
        let thread: Thread = ("C1".into(), "1.0".into());
        assert!(desk.begin(&thread, reply("a")).await);
        assert!(desk.hold_if_reviving(&thread, &reply("b")).await);
        assert_eq!(texts(&desk.failed(&thread).await), ["a", "b"]);
        assert!(!desk.hold_if_reviving(&thread, &reply("c")).await);
        desk.stop();
    }
}
