//! Root supervises the actor tree by policy (ARCHITECTURE.md, "Actor tree"):
//! a failed WorkspaceRegistry is restarted from the current config, a failed
//! SlackGateway is restarted and re-sends its SQLite outbox, a failed
//! SessionSupervisor stops the server (non-zero exit signalled), and a child
//! that keeps failing exhausts the restart budget and stops the server too.
//! Each child is made to panic with a test-only message (feature
//! `test-hooks`). Everything waits on conditions with deadlines.

mod common;
mod emulator;

use std::sync::Arc;
use std::time::Duration;

use agent_intercom::app::{App, AppOptions};
use agent_intercom::config::Config;
use agent_intercom::root::TreeFailure;
use agent_intercom::slack::{self, ConnectionState, SlackOptions, SlackTokens, SlackTuning};
use agent_intercom::storage::SqliteStore;
use common::{Layout, Setup, WAIT};
use emulator::Emulator;
use intercom_actors::gateway::{GatewayMsg, RetryPolicy};
use intercom_actors::registry::{RegistryMsg, WorkspaceMap};
use intercom_actors::slack_port::{MessageBody, OutboundOp};
use intercom_actors::supervisor::SupervisorMsg;
use ractor::{ActorId, ActorRef};

async fn start_app(layout: &Layout, options: AppOptions) -> (Config, App) {
    let config = Config::load(&layout.config).expect("config loads");
    let store = SqliteStore::open(&config.database.path)
        .await
        .expect("store");
    let app = App::start(&config, store, options).await.expect("app");
    (config, app)
}

/// Polls `f` every 20 ms until it returns `Some`, or panics after [`WAIT`].
async fn until<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The registry's map once a registry other than `dead` answers.
async fn map_from_a_new_registry(app: &App, dead: ActorId) -> WorkspaceMap {
    until("a restarted registry that answers", || async {
        let registry = app.registry().get();
        if registry.get_id() == dead {
            return None;
        }
        ractor::call_t!(registry, RegistryMsg::Get, 1000).ok()
    })
    .await
}

fn workspace_ids(map: &WorkspaceMap) -> Vec<String> {
    map.workspaces.iter().map(|w| w.id.clone()).collect()
}

#[tokio::test]
async fn a_panicked_registry_is_restarted_with_the_current_config() {
    let layout = Layout::new(&Setup::default());
    let (_, app) = start_app(&layout, AppOptions::default()).await;
    // A reload adds a workspace: the restarted registry must have it too.
    let second = layout.root.join("ws2");
    std::fs::create_dir_all(&second).expect("mkdir ws2");
    let mut text = std::fs::read_to_string(&layout.config).expect("read config");
    text.push_str(&format!(
        "\n[[workspace]]\nid = \"second\"\npath = {:?}\n",
        second.display().to_string()
    ));
    std::fs::write(&layout.config, text).expect("write config");
    let reloaded = Config::load(&layout.config).expect("reloaded config");
    app.apply_config(&reloaded).await.expect("reload applied");
    let registry: ActorRef<RegistryMsg> = app.registry().get();
    until("the reload in the registry", || async {
        let map = ractor::call_t!(registry, RegistryMsg::Get, 5000).expect("map");
        (workspace_ids(&map) == ["demo", "second"]).then_some(())
    })
    .await;

    registry
        .send_message(RegistryMsg::PanicForTest)
        .expect("panic the registry");
    let after = map_from_a_new_registry(&app, registry.get_id()).await;
    assert_eq!(workspace_ids(&after), ["demo", "second"]);
    // Starts resolve through the new registry.
    let started = app
        .start_session(
            intercom_actors::registry::Target {
                workspace: Some("second".into()),
                path: None,
                agent: None,
            },
            "hello",
            "local",
        )
        .await
        .expect("a start resolves through the restarted registry");
    assert_eq!(started.workspace, "second");
    app.shutdown().await;
}

#[tokio::test]
async fn a_registry_that_keeps_failing_stops_the_server() {
    let layout = Layout::new(&Setup::default());
    let (_, app) = start_app(&layout, AppOptions::default()).await;
    let budget = agent_intercom::root::RestartBudget::default();
    for _ in 0..budget.max {
        let registry = app.registry().get();
        registry
            .send_message(RegistryMsg::PanicForTest)
            .expect("panic the registry");
        map_from_a_new_registry(&app, registry.get_id()).await;
    }
    app.registry()
        .get()
        .send_message(RegistryMsg::PanicForTest)
        .expect("panic the registry once more");
    let failure: TreeFailure = tokio::time::timeout(WAIT, app.failed())
        .await
        .expect("the server is told to stop");
    assert_eq!(failure.actor, "workspace registry");
    assert!(failure.reason.contains("restarted"), "{failure}");
    app.shutdown().await;
}

#[tokio::test]
async fn a_panicked_supervisor_stops_the_server_with_a_failure() {
    let layout = Layout::new(&Setup::default());
    let (_, app) = start_app(&layout, AppOptions::default()).await;
    app.supervisor()
        .send_message(SupervisorMsg::PanicForTest)
        .expect("panic the supervisor");
    let failure = tokio::time::timeout(WAIT, app.failed())
        .await
        .expect("the server is told to stop");
    assert_eq!(failure.actor, "session supervisor");
    assert!(
        failure.to_string().contains("stopping the server"),
        "{failure}"
    );
    // serve maps this to ServeError::ActorTree: a non-zero exit.
    let exit: agent_intercom::http::server::ServeError = failure.into();
    assert!(exit.to_string().contains("session supervisor"), "{exit}");
    app.shutdown().await;
}

#[tokio::test]
async fn a_panicked_gateway_is_restarted_and_resends_its_outbox() {
    let layout = Layout::new(&Setup::default());
    let (sink, events) = slack::event_channel();
    let options = AppOptions {
        extra_sinks: vec![sink],
        ..AppOptions::default()
    };
    let (_, app) = start_app(&layout, options).await;
    let emu = Emulator::start().await;
    let opts = SlackOptions {
        tokens: SlackTokens {
            bot: "xoxb-test".into(),
            app: "xapp-test".into(),
        },
        api_url: Some(emu.api_url.clone()),
        operators: vec!["UOP".into()],
        supervisor: app.supervisor().clone(),
        registry: app.registry().clone(),
        root: Some(app.root().clone()),
        store: app.store_port(),
        outbox: app.outbox_port(),
        tuning: SlackTuning {
            retry: RetryPolicy {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(400),
            },
            ..SlackTuning::default()
        },
    };
    let handle = slack::spawn_slack_with_rules(opts, Arc::new(app.clone()), events)
        .await
        .expect("slack");
    let mut status = handle.status();
    tokio::time::timeout(WAIT, status.wait_for(|s| s == ConnectionState::Connected))
        .await
        .expect("Socket Mode connects");

    // A post the gateway had stored but not sent when it failed: only the
    // outbox knows about it.
    let op = OutboundOp::Post {
        channel: "C9".into(),
        in_thread: false,
        key: None,
        body: MessageBody::text("stored before the crash"),
    };
    app.outbox_port()
        .push("#C9", &op)
        .await
        .expect("outbox row");
    let gateway = handle.gateway().get();
    gateway
        .send_message(GatewayMsg::PanicForTest)
        .expect("panic the gateway");
    emu.until("the outbox row re-sent by the new gateway", WAIT, |e| {
        e.channel("C9")
            .iter()
            .any(|m| m.text.contains("stored before the crash"))
            .then_some(())
    })
    .await;
    assert_ne!(handle.gateway().get().get_id(), gateway.get_id());
    // Edges reach the new gateway through their handle.
    slack::dropped::send(
        &handle.gateway(),
        GatewayMsg::ChannelPost {
            channel: "C9".into(),
            body: MessageBody::text("after the restart"),
        },
        "a test post",
    );
    emu.until("a post through the new gateway", WAIT, |e| {
        e.channel("C9")
            .iter()
            .any(|m| m.text.contains("after the restart"))
            .then_some(())
    })
    .await;
    assert!(app.failure().is_none());
    app.shutdown().await;
    handle.shutdown().await;
}
