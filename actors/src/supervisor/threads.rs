//! Which session a Slack thread belongs to, without asking the supervisor.
//!
//! Why this exists: a reply in a session's thread (steering) must not wait
//! behind session starts in the supervisor's mailbox, like deciding and
//! looking a session up ([`super::directory`]). The supervisor spawns one
//! small [`ThreadDirectory`] actor, linked to it, under [`name`] in ractor's
//! named registry; it owns the (channel, root ts) -> session map. The Slack
//! gateway reports thread roots to it ([`posted`]), the supervisor reports
//! the roots of sessions it recovers or adopts, and Slack's inbound side asks
//! it ([`lookup`]); none of it goes through the supervisor's mailbox.

use std::collections::HashMap;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::SupervisorMsg;
use crate::model::SessionId;

/// How long a lookup waits for the directory before giving up.
const LOOKUP_TIMEOUT_MS: u64 = 5_000;

/// Messages of the thread directory.
pub enum ThreadsMsg {
    /// A thread root was posted (or recovered) for a session.
    Posted {
        /// Channel id.
        channel: String,
        /// Root ts.
        ts: String,
        /// The session.
        id: SessionId,
    },
    /// Which session owns this thread?
    Lookup {
        /// Channel id.
        channel: String,
        /// Root ts.
        ts: String,
        /// Its session, if known.
        reply: RpcReplyPort<Option<SessionId>>,
    },
}

/// The actor that owns the thread map.
pub struct ThreadDirectory;

impl Actor for ThreadDirectory {
    type Msg = ThreadsMsg;
    type State = HashMap<(String, String), SessionId>;
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<ThreadsMsg>,
        _args: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(HashMap::new())
    }

    async fn handle(
        &self,
        _myself: ActorRef<ThreadsMsg>,
        msg: ThreadsMsg,
        threads: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ThreadsMsg::Posted { channel, ts, id } => {
                threads.insert((channel, ts), id);
            }
            ThreadsMsg::Lookup { channel, ts, reply } => {
                let _ = reply.send(threads.get(&(channel, ts)).cloned());
            }
        }
        Ok(())
    }
}

/// The registry name of supervisor `sup`'s thread directory.
pub fn name(sup: &ActorRef<SupervisorMsg>) -> String {
    format!("intercom.{}.threads", sup.get_id())
}

/// Starts `sup`'s thread directory, linked to it.
pub(super) async fn spawn(sup: &ActorRef<SupervisorMsg>) -> Result<(), ActorProcessingErr> {
    Actor::spawn_linked(Some(name(sup)), ThreadDirectory, (), sup.get_cell()).await?;
    Ok(())
}

fn find(sup: &ActorRef<SupervisorMsg>) -> Option<ActorRef<ThreadsMsg>> {
    ActorRef::where_is(name(sup))
}

/// Records that `id`'s thread root in `channel` is `ts`.
pub fn posted(sup: &ActorRef<SupervisorMsg>, id: &SessionId, channel: &str, ts: &str) {
    let msg = ThreadsMsg::Posted {
        channel: channel.to_owned(),
        ts: ts.to_owned(),
        id: id.clone(),
    };
    match find(sup) {
        Some(dir) => {
            if let Err(e) = dir.send_message(msg) {
                tracing::warn!(session = %id, "thread directory gone: {e}");
            }
        }
        None => tracing::warn!(session = %id, "no thread directory to record a thread in"),
    }
}

/// The session whose thread root in `channel` is `ts`, if known.
pub async fn lookup(sup: &ActorRef<SupervisorMsg>, channel: &str, ts: &str) -> Option<SessionId> {
    let dir = find(sup)?;
    ractor::call_t!(
        dir,
        |reply| ThreadsMsg::Lookup {
            channel: channel.to_owned(),
            ts: ts.to_owned(),
            reply
        },
        LOOKUP_TIMEOUT_MS
    )
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A supervisor stand-in that never answers anything.
    struct Deaf;

    impl Actor for Deaf {
        type Msg = SupervisorMsg;
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            _myself: ActorRef<SupervisorMsg>,
            _args: (),
        ) -> Result<(), ActorProcessingErr> {
            Ok(())
        }

        async fn handle(
            &self,
            _myself: ActorRef<SupervisorMsg>,
            _msg: SupervisorMsg,
            _state: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            std::future::pending::<()>().await;
            Ok(())
        }
    }

    #[tokio::test]
    async fn threads_are_found_without_the_supervisor_and_only_exact_matches() {
        let (sup, _) = Actor::spawn(None, Deaf, ()).await.expect("spawn");
        // The supervisor is stuck in a message forever.
        sup.send_message(SupervisorMsg::RulesChanged).expect("send");
        spawn(&sup).await.expect("directory");
        let id = SessionId::from("s-1");
        posted(&sup, &id, "C1", "1.0");
        assert_eq!(lookup(&sup, "C1", "1.0").await, Some(id));
        // Another channel's identical ts, or a reply's ts, is not the thread.
        assert_eq!(lookup(&sup, "C2", "1.0").await, None);
        assert_eq!(lookup(&sup, "C1", "1.1").await, None);
        sup.stop(None);
    }
}
