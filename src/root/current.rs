//! The current incarnation of a supervised actor.
//!
//! Why this exists: Root restarts the WorkspaceRegistry and the SlackGateway
//! when they fail, and every edge that talks to them (the App, Slack's
//! inbound handlers, the MCP server, the event forwarder) must reach the new
//! actor, not the dead one. Root publishes each child's `ActorRef` on a
//! `tokio::sync::watch` channel; a [`Current`] is the receiving end and
//! [`Current::get`] always answers the latest one, with no lock shared
//! between actors.

use std::time::Duration;

use ractor::{ActorRef, Message};
use tokio::sync::watch;

/// A handle that always reaches the child's latest incarnation.
pub struct Current<M: Message>(watch::Receiver<ActorRef<M>>);

impl<M: Message> Clone for Current<M> {
    fn clone(&self) -> Self {
        Current(self.0.clone())
    }
}

impl<M: Message> Current<M> {
    /// A handle whose actor is never replaced (an actor spawned outside
    /// Root: tools, benches, tests).
    pub fn fixed(actor: ActorRef<M>) -> Self {
        let (_publisher, current) = watch::channel(actor);
        Current(current)
    }

    /// The actor as it is now.
    pub fn get(&self) -> ActorRef<M> {
        self.0.borrow().clone()
    }

    /// Waits up to `limit` for a different actor than `dead` to be
    /// published (Root restarting a failed child); `None` when none came.
    pub async fn replacement(&self, dead: &ActorRef<M>, limit: Duration) -> Option<ActorRef<M>> {
        let mut rx = self.0.clone();
        let dead_id = dead.get_id();
        let changed = rx.wait_for(|a| a.get_id() != dead_id);
        match tokio::time::timeout(limit, changed).await {
            Ok(Ok(actor)) => Some(actor.clone()),
            _ => None,
        }
    }
}

impl<M: Message> From<ActorRef<M>> for Current<M> {
    fn from(actor: ActorRef<M>) -> Self {
        Current::fixed(actor)
    }
}

/// A publisher (kept by Root) and the first handle on it.
pub(crate) fn channel<M: Message>(actor: ActorRef<M>) -> (watch::Sender<ActorRef<M>>, Current<M>) {
    let (tx, rx) = watch::channel(actor);
    (tx, Current(rx))
}

/// Another handle on a publisher's actor.
pub(crate) fn follow<M: Message>(publisher: &watch::Sender<ActorRef<M>>) -> Current<M> {
    Current(publisher.subscribe())
}
