//! Where a live session's actor is, without asking the supervisor.
//!
//! Why this exists: deciding, steering and looking a session up must not
//! wait behind session starts in the supervisor's mailbox (a burst of starts
//! queues one agent handshake after another there). The supervisor spawns
//! every session actor under [`actor_name`] in ractor's named registry;
//! ractor removes the name as soon as the actor begins to stop, so [`find`]
//! answers at once from the registry, with no mailbox in the way. The name
//! carries the supervisor's actor id, so two servers in one process (tests)
//! never share a name even with the same session ids.

use std::time::Duration;

use ractor::ActorRef;

use super::SupervisorMsg;
use crate::model::SessionId;
use crate::session::SessionMsg;

/// How long a respawn waits for the previous actor of the same session to
/// finish stopping (it reported its exit just before stopping).
const PREVIOUS_GONE: Duration = Duration::from_secs(5);

/// The registry name of session `id`'s actor under supervisor `sup`.
pub fn actor_name(sup: &ActorRef<SupervisorMsg>, id: &SessionId) -> String {
    format!("intercom.{}.session.{id}", sup.get_id())
}

/// The running actor of session `id`, if there is one (none between a
/// crash and its restart, or once the session ended).
pub fn find(sup: &ActorRef<SupervisorMsg>, id: &SessionId) -> Option<ActorRef<SessionMsg>> {
    ActorRef::where_is(actor_name(sup, id))
}

/// Waits until the previous actor of session `id` (if any is still
/// registered: it reports its exit just before it stops) is gone, so its
/// successor can take the name.
pub(super) async fn wait_previous_gone(sup: &ActorRef<SupervisorMsg>, id: &SessionId) {
    if let Some(previous) = find(sup, id)
        && let Err(e) = previous.wait(Some(PREVIOUS_GONE)).await
    {
        tracing::warn!(session = %id, "previous session actor still stopping: {e}");
    }
}

#[cfg(test)]
mod tests {
    use ractor::{Actor, ActorProcessingErr};

    use super::*;

    /// A supervisor stand-in that is stuck in its first message forever.
    struct StuckSupervisor;

    impl Actor for StuckSupervisor {
        type Msg = SupervisorMsg;
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            _: ActorRef<SupervisorMsg>,
            _: (),
        ) -> Result<(), ActorProcessingErr> {
            Ok(())
        }

        async fn handle(
            &self,
            _: ActorRef<SupervisorMsg>,
            _: SupervisorMsg,
            _: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            std::future::pending::<()>().await;
            Ok(())
        }
    }

    /// A session actor stand-in that ignores its messages.
    struct QuietSession;

    impl Actor for QuietSession {
        type Msg = SessionMsg;
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            _: ActorRef<SessionMsg>,
            _: (),
        ) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn sessions_are_found_while_the_supervisor_is_stuck() {
        let (sup, _) = Actor::spawn(None, StuckSupervisor, ()).await.expect("sup");
        let (other_sup, _) = Actor::spawn(None, StuckSupervisor, ()).await.expect("sup");
        // Busy for good: anything asked of its mailbox would never be answered.
        sup.send_message(SupervisorMsg::RulesChanged).expect("send");
        let id = SessionId::from("s-1");
        assert!(find(&sup, &id).is_none());

        let (session, _) = Actor::spawn(Some(actor_name(&sup, &id)), QuietSession, ())
            .await
            .expect("session");
        let found = find(&sup, &id).expect("found without the supervisor");
        assert_eq!(found.get_id(), session.get_id());
        // Another server in the same process has its own names.
        assert!(find(&other_sup, &id).is_none());

        // A stopped session is gone, and its successor may take the name.
        session.stop(None);
        wait_previous_gone(&sup, &id).await;
        assert!(find(&sup, &id).is_none());
        let (successor, _) = Actor::spawn(Some(actor_name(&sup, &id)), QuietSession, ())
            .await
            .expect("successor takes the name");
        assert_eq!(
            find(&sup, &id).map(|a| a.get_id()),
            Some(successor.get_id())
        );
        successor.stop(None);
        sup.kill();
        other_sup.kill();
    }
}
