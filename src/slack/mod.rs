//! Slack: one thread per session, buttons for decisions, steering by reply,
//! `/intercom` slash commands, over Socket Mode.
//!
//! Why this exists: it is the edge between Slack and the core. Outbound, the
//! core's [`SlackGateway`] actor is the only writer to Slack; this module
//! gives it a slack-morphism client ([`api::MorphismApi`]), a Block Kit
//! renderer ([`render::BlockKit`]) and the SQLite outbox. Inbound, a Socket
//! Mode connection ([`socket`]) with reconnect and backoff hands slash
//! commands, button clicks, modal submissions and thread replies to the
//! router ([`inbound`], [`commands`]), which talks to the supervisor and the
//! session actors.
//!
//! Wiring (what the server's `main` does):
//!
//! ```text
//! let tokens = slack::SlackTokens::from_env()?;           // None: no Slack
//! let (slack_sink, slack_events) = slack::event_channel(); // before the supervisor
//! // slack_sink goes into the supervisor's fan-out (AppOptions::extra_sinks)
//! let opts = SlackOptions {
//!     tokens, api_url: config.slack.api_url.clone(),
//!     operators: slack::operators(&config.slack.operators),   // + SLACK_MEMBER_IDS
//!     supervisor, registry: app.registry().clone(),
//!     root: Some(app.root().clone()),      // the gateway is spawned under Root
//!     store: store.clone(), outbox: store.clone(),
//!     tuning: SlackTuning::default(),
//! };
//! // rules: the App (rules in SQLite + config, refreshed for every session)
//! let handle = slack::spawn_slack_with_rules(opts, Arc::new(app.clone()), slack_events).await?;
//! // /healthz: mirror handle.status() (get() / changed()) into the app
//! // shutdown: after the supervisor's, handle.shutdown().await
//! ```

pub mod agent_mode;
pub mod api;
pub mod commands;
pub mod dropped;
pub mod inbound;
pub mod render;
pub mod revivals;
pub mod rules;
pub mod socket;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use intercom_actors::gateway::pacing::PacingPolicy;
use intercom_actors::gateway::{GatewayArgs, GatewayMsg, RetryPolicy, SlackGateway};
use intercom_actors::ports::{OperatorEvent, OperatorSink, SessionStore};
use intercom_actors::registry::RegistryMsg;

use crate::root::{Current, RootMsg};
use intercom_actors::slack_port::{Outbox, SlackApiError};
use intercom_actors::supervisor::SupervisorMsg;
use ractor::{Actor, ActorRef};
use tokio::sync::{mpsc, watch};

pub use rules::{NoRules, RulesAdmin};
pub use socket::ConnectionState;

/// Environment variable with the bot token (`xoxb-...`).
pub const BOT_TOKEN_ENV: &str = "SLACK_BOT_TOKEN";
/// Environment variable with the app-level token (`xapp-...`, Socket Mode).
pub const APP_TOKEN_ENV: &str = "SLACK_APP_TOKEN";
/// Environment variable with extra operator user ids, comma separated.
pub const MEMBER_IDS_ENV: &str = "SLACK_MEMBER_IDS";

/// Why Slack could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SlackError {
    /// Only one of the two tokens is set.
    #[error("{0} is set but {1} is not; Slack needs both (see docs/slack.md)")]
    HalfConfigured(&'static str, &'static str),
    /// The TLS setup failed (no CA certificates).
    #[error(
        "cannot set up TLS for Slack: {0}; install the system CA certificates (ca-certificates)"
    )]
    Tls(String),
    /// Slack refused the bot token.
    #[error("Slack refused SLACK_BOT_TOKEN: {0}; check the token and the app's installation")]
    Auth(String),
    /// An actor could not be spawned.
    #[error("cannot start the Slack gateway: {0}")]
    Spawn(String),
}

/// The two Slack tokens.
#[derive(Clone)]
pub struct SlackTokens {
    /// Bot token for the Web API.
    pub bot: String,
    /// App-level token for Socket Mode.
    pub app: String,
}

impl std::fmt::Debug for SlackTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SlackTokens { .. }")
    }
}

impl SlackTokens {
    /// Reads `SLACK_BOT_TOKEN` / `SLACK_APP_TOKEN`: `None` when neither is
    /// set (Slack disabled), an error when only one is.
    pub fn from_env() -> Result<Option<SlackTokens>, SlackError> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        match (get(BOT_TOKEN_ENV), get(APP_TOKEN_ENV)) {
            (Some(bot), Some(app)) => Ok(Some(SlackTokens { bot, app })),
            (None, None) => Ok(None),
            (Some(_), None) => Err(SlackError::HalfConfigured(BOT_TOKEN_ENV, APP_TOKEN_ENV)),
            (None, Some(_)) => Err(SlackError::HalfConfigured(APP_TOKEN_ENV, BOT_TOKEN_ENV)),
        }
    }
}

/// Operators: `[slack] operators` plus `SLACK_MEMBER_IDS` (comma separated).
pub fn operators(configured: &[String]) -> Vec<String> {
    let from_env = std::env::var(MEMBER_IDS_ENV).unwrap_or_default();
    merge_operators(configured, &from_env)
}

fn merge_operators(configured: &[String], env: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    configured
        .iter()
        .map(|s| s.trim().to_owned())
        .chain(env.split(',').map(|s| s.trim().to_owned()))
        .filter(|s| !s.is_empty() && seen.insert(s.clone()))
        .collect()
}

/// Timing knobs (defaults suit real Slack; tests shorten them).
#[derive(Debug, Clone)]
pub struct SlackTuning {
    /// Backoff for transient Web API failures.
    pub retry: RetryPolicy,
    /// First Socket Mode reconnect delay.
    pub reconnect_initial: Duration,
    /// Reconnect delay ceiling.
    pub reconnect_max: Duration,
    /// WebSocket ping interval; no frame for three intervals means dead.
    pub ping_interval: Duration,
    /// How long to wait for `hello` after connecting.
    pub hello_timeout: Duration,
    /// Slack's rate limits the gateway stays under (Slack's published
    /// limits by default; tests and benches use a faster copy).
    pub pacing: PacingPolicy,
}

impl Default for SlackTuning {
    fn default() -> Self {
        SlackTuning {
            retry: RetryPolicy::default(),
            reconnect_initial: Duration::from_secs(1),
            reconnect_max: Duration::from_secs(60),
            ping_interval: Duration::from_secs(10),
            hello_timeout: Duration::from_secs(15),
            pacing: PacingPolicy::slack(),
        }
    }
}

/// Everything Slack needs from the server.
pub struct SlackOptions {
    /// Tokens.
    pub tokens: SlackTokens,
    /// `[slack] api_url` (an emulator); `None` for Slack's.
    pub api_url: Option<String>,
    /// User ids that may act on any session and start sessions.
    pub operators: Vec<String>,
    /// The session supervisor.
    pub supervisor: ActorRef<SupervisorMsg>,
    /// The workspace registry (following Root's restarts).
    pub registry: Current<RegistryMsg>,
    /// The Root actor the gateway is spawned under (restarted by it when it
    /// fails); `None` spawns an unsupervised gateway (tools, benches).
    pub root: Option<ActorRef<RootMsg>>,
    /// Session storage.
    pub store: Arc<dyn SessionStore>,
    /// The durable outbox (the same SQLite store).
    pub outbox: Arc<dyn Outbox>,
    /// Timing.
    pub tuning: SlackTuning,
}

/// Operator events waiting for Slack (the receiving half of [`event_channel`]).
pub struct SlackEvents(mpsc::UnboundedReceiver<OperatorEvent>);

struct ChannelSink(mpsc::UnboundedSender<OperatorEvent>);

impl OperatorSink for ChannelSink {
    fn emit(&self, event: OperatorEvent) {
        // A closed channel means Slack was shut down; the store has it all.
        if let Err(e) = self.0.send(event) {
            dropped::note("an operator event", &e);
        }
    }
}

/// A sink for the supervisor's fan-out, usable before Slack is started:
/// events are buffered until [`spawn_slack`] takes the receiver.
pub fn event_channel() -> (Arc<dyn OperatorSink>, SlackEvents) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Arc::new(ChannelSink(tx)), SlackEvents(rx))
}

/// Connection status for `/healthz`.
#[derive(Clone)]
pub struct SlackStatus(watch::Receiver<ConnectionState>);

impl SlackStatus {
    /// The current state.
    pub fn get(&self) -> ConnectionState {
        *self.0.borrow()
    }

    /// `connecting`, `connected`, `reconnecting` or `stopped`.
    pub fn as_str(&self) -> &'static str {
        self.get().as_str()
    }

    /// Waits for the next change and returns the new state; `None` once
    /// Slack has shut down (for mirroring it into `/healthz`).
    pub async fn changed(&mut self) -> Option<ConnectionState> {
        self.0.changed().await.ok()?;
        Some(self.get())
    }

    /// Waits until the state satisfies `pred` (tests, startup logs).
    pub async fn wait_for(&mut self, pred: impl Fn(ConnectionState) -> bool) -> ConnectionState {
        match self.0.wait_for(|s| pred(*s)).await {
            Ok(s) => *s,
            Err(_) => ConnectionState::Stopped,
        }
    }
}

/// A running Slack integration.
pub struct SlackHandle {
    status: SlackStatus,
    gateway: Current<GatewayMsg>,
    revivals: revivals::Revivals,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl SlackHandle {
    /// Connection status for `/healthz`.
    pub fn status(&self) -> SlackStatus {
        self.status.clone()
    }

    /// The gateway actor (the only writer to Slack), following Root's restarts.
    pub fn gateway(&self) -> Current<GatewayMsg> {
        self.gateway.clone()
    }

    /// How many outbound operations wait for Slack.
    pub async fn backlog(&self) -> usize {
        ractor::call_t!(
            self.gateway.get(),
            GatewayMsg::Backlog,
            commands::CALL_TIMEOUT_MS
        )
        .unwrap_or(0)
    }

    /// Stops listening and stops the gateway; undelivered messages stay in
    /// the outbox for the next start.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
        self.revivals.stop();
        self.gateway.get().stop(Some("shutdown".into()));
    }
}

/// Starts Slack without rule management ([`NoRules`]): `/intercom rules`
/// and the "Remember" buttons say it is not available (benches, tools).
/// The server uses [`spawn_slack_with_rules`].
pub async fn spawn_slack(
    opts: SlackOptions,
    events: SlackEvents,
) -> Result<SlackHandle, SlackError> {
    spawn_slack_with_rules(opts, Arc::new(NoRules), events).await
}

/// Starts Slack: checks the bot token, starts the gateway (which re-sends
/// the outbox), forwards `events` into it, and connects Socket Mode.
/// `rules` is the server's rule management (the `App`): `/intercom rules`,
/// `/intercom rule rm`, the "Remember" buttons and workspace approval modes.
pub async fn spawn_slack_with_rules(
    opts: SlackOptions,
    rules: Arc<dyn RulesAdmin>,
    events: SlackEvents,
) -> Result<SlackHandle, SlackError> {
    let api = Arc::new(api::MorphismApi::new(
        opts.api_url.as_deref(),
        &opts.tokens.bot,
        &opts.tokens.app,
    )?);
    let identity = match api.identity().await {
        Ok(id) => Some(id),
        // At start a refused token stops the server: nothing is waiting yet,
        // and the operator is there to fix it.
        Err(SlackApiError::Permanent(e) | SlackApiError::Blocked(e)) => {
            return Err(SlackError::Auth(e));
        }
        Err(e) => {
            tracing::warn!("Slack auth.test failed, will retry when connecting: {e}");
            None
        }
    };
    let threads: Arc<dyn intercom_actors::slack_port::ThreadIndex> =
        Arc::new(opts.supervisor.clone());
    let args = GatewayArgs {
        api: api.clone(),
        outbox: opts.outbox.clone(),
        store: opts.store.clone(),
        render: Arc::new(render::BlockKit),
        threads: Some(threads),
        retry: opts.tuning.retry,
        pacing: opts.tuning.pacing.clone(),
        handoff: Default::default(),
    };
    let gateway = start_gateway(opts.root.as_ref(), args).await?;
    let revivals = revivals::Revivals::start()
        .await
        .map_err(|e| SlackError::Spawn(e.to_string()))?;
    let mut tasks = vec![tokio::spawn(forward_events(events, gateway.clone()))];

    let ctx = Arc::new(inbound::Ctx {
        supervisor: opts.supervisor.clone(),
        registry: opts.registry.clone(),
        store: opts.store.clone(),
        gateway: gateway.clone(),
        operators: opts.operators.iter().cloned().collect(),
        bot: std::sync::RwLock::new(identity),
        rules,
        reviving: revivals.clone(),
    });
    let (inbound_tx, inbound_rx) = mpsc::channel(256);
    tasks.push(tokio::spawn(inbound::run(ctx.clone(), inbound_rx)));

    let (status_tx, status_rx) = watch::channel(ConnectionState::Connecting);
    let (stop_tx, stop_rx) = watch::channel(false);
    let socket = socket::SocketLoop {
        api,
        ctx,
        status: status_tx,
        inbound: inbound_tx,
        tuning: opts.tuning.clone(),
        stop: stop_rx,
    };
    tasks.push(tokio::spawn(socket.run()));
    Ok(SlackHandle {
        status: SlackStatus(status_rx),
        gateway,
        revivals,
        stop: stop_tx,
        tasks,
    })
}

/// How long the forwarder waits for Root to restart a failed gateway
/// before it counts an event as dropped.
const GATEWAY_RESTART_WAIT: Duration = Duration::from_secs(5);

/// Spawns the gateway under Root (restarted when it fails), or alone.
async fn start_gateway(
    root: Option<&ActorRef<RootMsg>>,
    args: GatewayArgs,
) -> Result<Current<GatewayMsg>, SlackError> {
    let Some(root) = root else {
        let (gateway, _) = Actor::spawn(None, SlackGateway, args)
            .await
            .map_err(|e| SlackError::Spawn(e.to_string()))?;
        return Ok(Current::fixed(gateway));
    };
    ractor::call_t!(
        root,
        |reply| RootMsg::StartGateway(Box::new(args), reply),
        commands::CALL_TIMEOUT_MS
    )
    .map_err(|e| SlackError::Spawn(e.to_string()))?
    .map_err(SlackError::Spawn)
}

/// Hands operator events to the gateway; when it is gone, waits for Root's
/// restart and hands the event to the new one. Only an event no gateway
/// took is dropped (logged and counted).
async fn forward_events(events: SlackEvents, gateway: Current<GatewayMsg>) {
    let SlackEvents(mut rx) = events;
    while let Some(event) = rx.recv().await {
        let to = gateway.get();
        let Err(e) = to.send_message(GatewayMsg::Event(event)) else {
            continue;
        };
        let retried = match (e, gateway.replacement(&to, GATEWAY_RESTART_WAIT).await) {
            (ractor::MessagingErr::SendErr(GatewayMsg::Event(event)), Some(new)) => new
                .send_message(GatewayMsg::Event(event))
                .map_err(|e| e.to_string()),
            (e, _) => Err(e.to_string()),
        };
        if let Err(e) = retried {
            // Keep draining: every later event is counted too.
            dropped::note("an operator event", &e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_merge_config_and_env_without_duplicates() {
        let got = merge_operators(&["U1".into(), " U2 ".into()], "U2, U3,,");
        assert_eq!(got, vec!["U1", "U2", "U3"]);
    }
}
