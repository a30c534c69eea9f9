//! Root: the top of the actor tree, supervising the server's long-lived actors.
//!
//! Why this exists: the WorkspaceRegistry, the SlackGateway and the
//! SessionSupervisor are spawned *linked* to Root, so a panic or an
//! unexpected stop of any of them reaches Root as a supervision event and is
//! handled by a written policy instead of leaving a dead mailbox behind:
//!
//! | child | when it fails | why |
//! |---|---|---|
//! | WorkspaceRegistry | restarted with the map of the current config (the last reload) | its state is derived from the config |
//! | SlackGateway | restarted with the same arguments; its `pre_start` re-reads the SQLite outbox, so pending posts are re-driven | everything it sends is in the outbox first |
//! | SessionSupervisor | the server stops: one error line naming it, `serve` shuts down and exits non-zero; the next start recovers the sessions from SQLite | ractor kills its session actors with it (their agents' process groups are SIGKILLed), and its routing index, MCP bindings, restart timers and in-flight operator calls die too; only a server start rebuilds all of that consistently |
//!
//! A restarted child is published through [`Current`], so every edge
//! reaches the new actor. Restarts are budgeted ([`RestartBudget`]: at most
//! `max` within `window` per child); past the budget the server stops like
//! for a failed supervisor, so a crash loop never spins.

pub mod current;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use intercom_actors::gateway::{GatewayArgs, GatewayMsg, SlackGateway};
use intercom_actors::registry::{RegistryMsg, WorkspaceMap, WorkspaceRegistry};
use intercom_actors::supervisor::{SessionSupervisor, SupervisorArgs, SupervisorMsg};
use ractor::{
    Actor, ActorCell, ActorProcessingErr, ActorRef, Message, RpcReplyPort, SupervisionEvent,
};
use tokio::sync::watch;

pub use current::Current;

/// How many restarts of one child Root allows within a window.
#[derive(Debug, Clone, Copy)]
pub struct RestartBudget {
    /// Restarts allowed within `window`.
    pub max: usize,
    /// The window.
    pub window: Duration,
}

impl Default for RestartBudget {
    fn default() -> Self {
        RestartBudget {
            max: 5,
            window: Duration::from_secs(60),
        }
    }
}

/// Why the server must stop: a child Root will not (or may not) restart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {actor} actor failed ({reason}); stopping the server")]
pub struct TreeFailure {
    /// Which actor.
    pub actor: &'static str,
    /// What happened, and why it is not restarted.
    pub reason: String,
}

/// What Root is started with.
pub struct RootArgs {
    /// The workspace map of the config (the registry's state).
    pub map: WorkspaceMap,
    /// The session supervisor's arguments.
    pub supervisor: SupervisorArgs,
    /// Restarts allowed per child.
    pub budget: RestartBudget,
}

/// Handles on Root's children, for the App.
pub struct Children {
    /// The workspace registry (follows restarts).
    pub registry: Current<RegistryMsg>,
    /// The session supervisor (never restarted: its failure stops the server).
    pub supervisor: ActorRef<SupervisorMsg>,
    /// Set once the server must stop.
    pub failure: watch::Receiver<Option<TreeFailure>>,
}

/// Messages Root handles.
pub enum RootMsg {
    /// Handles on the children.
    Children(RpcReplyPort<Children>),
    /// The config was reloaded: the registry gets the new map, and a
    /// restarted registry starts from it.
    ConfigReloaded(Box<WorkspaceMap>),
    /// Spawn the Slack gateway under Root (once Slack is configured).
    StartGateway(
        Box<GatewayArgs>,
        RpcReplyPort<Result<Current<GatewayMsg>, String>>,
    ),
    /// The server is shutting down: children stopping from now on are expected.
    ShuttingDown(RpcReplyPort<()>),
}

/// One restartable child: its publisher and its recent restarts.
struct Supervised<M: Message> {
    publisher: watch::Sender<ActorRef<M>>,
    restarts: VecDeque<Instant>,
}

impl<M: Message> Supervised<M> {
    fn new(publisher: watch::Sender<ActorRef<M>>) -> Self {
        Supervised {
            publisher,
            restarts: VecDeque::new(),
        }
    }

    fn is(&self, cell: &ActorCell) -> bool {
        self.publisher.borrow().get_id() == cell.get_id()
    }

    /// Counts a restart; false when the budget is spent.
    fn may_restart(&mut self, budget: RestartBudget, now: Instant) -> bool {
        while self
            .restarts
            .front()
            .is_some_and(|t| now.duration_since(*t) > budget.window)
        {
            self.restarts.pop_front();
        }
        if self.restarts.len() >= budget.max {
            return false;
        }
        self.restarts.push_back(now);
        true
    }
}

/// Root's state: its children and the current config's map.
pub struct RootState {
    map: WorkspaceMap,
    registry: Supervised<RegistryMsg>,
    gateway: Option<(Supervised<GatewayMsg>, GatewayArgs)>,
    supervisor: ActorRef<SupervisorMsg>,
    budget: RestartBudget,
    failure: watch::Sender<Option<TreeFailure>>,
    stopping: bool,
}

/// The Root actor.
pub struct Root;

const REGISTRY: &str = "workspace registry";
const GATEWAY: &str = "Slack gateway";
const SUPERVISOR: &str = "session supervisor";

impl Actor for Root {
    type Msg = RootMsg;
    type State = RootState;
    type Arguments = RootArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<RootMsg>,
        args: RootArgs,
    ) -> Result<RootState, ActorProcessingErr> {
        let (registry, _) =
            Actor::spawn_linked(None, WorkspaceRegistry, args.map.clone(), myself.get_cell())
                .await?;
        let (supervisor, _) =
            Actor::spawn_linked(None, SessionSupervisor, args.supervisor, myself.get_cell())
                .await?;
        let (publisher, _) = current::channel(registry);
        Ok(RootState {
            map: args.map,
            registry: Supervised::new(publisher),
            gateway: None,
            supervisor,
            budget: args.budget,
            failure: watch::channel(None).0,
            stopping: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<RootMsg>,
        msg: RootMsg,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RootMsg::Children(reply) => {
                let _ = reply.send(Children {
                    registry: current::follow(&state.registry.publisher),
                    supervisor: state.supervisor.clone(),
                    failure: state.failure.subscribe(),
                });
            }
            RootMsg::ConfigReloaded(map) => {
                state.map = (*map).clone();
                let registry = state.registry.publisher.borrow().clone();
                if let Err(e) = registry.send_message(RegistryMsg::Reload(map)) {
                    // Root restarts it from `state.map` when it reports its end.
                    tracing::warn!("the workspace registry did not take the reload: {e}");
                }
            }
            RootMsg::StartGateway(args, reply) => {
                let _ = reply.send(start_gateway(&myself, state, *args).await);
            }
            RootMsg::ShuttingDown(reply) => {
                state.stopping = true;
                let _ = reply.send(());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<RootMsg>,
        event: SupervisionEvent,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, what) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, format!("failed: {err}")),
            SupervisionEvent::ActorTerminated(cell, _, reason) if !state.stopping => {
                let reason = reason.unwrap_or_else(|| "no reason given".into());
                (cell, format!("stopped unexpectedly: {reason}"))
            }
            _ => return Ok(()),
        };
        child_ended(&myself, state, &cell, what).await;
        Ok(())
    }
}

async fn start_gateway(
    myself: &ActorRef<RootMsg>,
    state: &mut RootState,
    args: GatewayArgs,
) -> Result<Current<GatewayMsg>, String> {
    if state.gateway.is_some() {
        return Err("the Slack gateway is already running".into());
    }
    let (gateway, _) = Actor::spawn_linked(None, SlackGateway, args.clone(), myself.get_cell())
        .await
        .map_err(|e| e.to_string())?;
    let (publisher, current) = current::channel(gateway);
    state.gateway = Some((Supervised::new(publisher), args));
    Ok(current)
}

/// Applies the policy for the child behind `cell` (see the module table).
async fn child_ended(
    myself: &ActorRef<RootMsg>,
    state: &mut RootState,
    cell: &ActorCell,
    what: String,
) {
    let now = Instant::now();
    if state.registry.is(cell) {
        if !state.registry.may_restart(state.budget, now) {
            return fail(state, REGISTRY, budget_spent(state.budget, &what));
        }
        tracing::error!(
            actor = REGISTRY,
            "the workspace registry {what}; restarting it from the current config"
        );
        let spawned = Actor::spawn_linked(
            None,
            WorkspaceRegistry,
            state.map.clone(),
            myself.get_cell(),
        )
        .await;
        match spawned {
            Ok((registry, _)) => {
                state.registry.publisher.send_replace(registry);
            }
            Err(e) => fail(state, REGISTRY, format!("{what}; the restart failed: {e}")),
        }
    } else if let Some((gateway, args)) = state.gateway.as_mut().filter(|(g, _)| g.is(cell)) {
        if !gateway.may_restart(state.budget, now) {
            return fail(state, GATEWAY, budget_spent(state.budget, &what));
        }
        tracing::error!(
            actor = GATEWAY,
            "the Slack gateway {what}; restarting it (pending posts are re-sent from the outbox)"
        );
        match Actor::spawn_linked(None, SlackGateway, args.clone(), myself.get_cell()).await {
            Ok((new, _)) => {
                gateway.publisher.send_replace(new);
            }
            Err(e) => fail(state, GATEWAY, format!("{what}; the restart failed: {e}")),
        }
    } else if state.supervisor.get_id() == cell.get_id() {
        fail(
            state,
            SUPERVISOR,
            format!(
                "{what}; its sessions went with it and only a server start recovers them consistently (from SQLite)"
            ),
        );
    }
}

fn budget_spent(budget: RestartBudget, what: &str) -> String {
    format!(
        "{what}; restarted {} times within {} s already",
        budget.max,
        budget.window.as_secs()
    )
}

/// Logs the one line that says why the server stops, and signals `serve`.
fn fail(state: &mut RootState, actor: &'static str, reason: String) {
    let failure = TreeFailure { actor, reason };
    if state.failure.borrow().is_some() {
        tracing::error!(actor, "{failure} (already stopping)");
        return;
    }
    tracing::error!(actor, "{failure}; exiting with a non-zero status");
    state.failure.send_replace(Some(failure));
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Quiet;

    impl Actor for Quiet {
        type Msg = ();
        type State = ();
        type Arguments = ();

        async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn the_budget_refuses_restarts_past_max_within_the_window() {
        let (actor, _) = Actor::spawn(None, Quiet, ()).await.expect("spawn");
        let (publisher, _) = current::channel(actor.clone());
        let mut child = Supervised::new(publisher);
        let budget = RestartBudget {
            max: 2,
            window: Duration::from_secs(60),
        };
        let t0 = Instant::now();
        assert!(child.may_restart(budget, t0));
        assert!(child.may_restart(budget, t0 + Duration::from_secs(1)));
        assert!(!child.may_restart(budget, t0 + Duration::from_secs(2)));
        // Outside the window the oldest restarts no longer count.
        assert!(child.may_restart(budget, t0 + Duration::from_secs(62)));
        assert!(child.is(&actor.get_cell()));
        actor.stop(None);
    }
}
