//! `agent-intercom serve`: from a config file to a running server.
//!
//! Order matters for clear failures: the config is validated, the database
//! lock taken (a second instance stops here), the API token found or
//! generated, the port bound (a taken port stops here), and only then are
//! the actors started and stored live sessions recovered. SIGINT/SIGTERM
//! shut down gracefully; a second signal exits at once with status 130.

use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::auth::{self, TokenError, TokenSource};
use crate::app::{App, AppError, AppOptions, AppStartError, choose_config};
use crate::config::{CONFIRM_QUIET, Config, ConfigError, Next};
use crate::storage::{SqliteStore, StorageOpenError};

/// Why `serve` could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database could not be opened (or another instance holds it).
    #[error(transparent)]
    Storage(#[from] StorageOpenError),
    /// The API token could not be read or created.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The port could not be bound.
    #[error("cannot listen on {addr}: {reason}; change [server] bind")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What went wrong, in words.
        reason: String,
    },
    /// The actors did not start.
    #[error(transparent)]
    Start(#[from] AppStartError),
    /// Recovering stored sessions failed.
    #[error("recovering stored sessions failed: {0}")]
    Recover(AppError),
    /// The HTTP server failed.
    #[error("HTTP server failed: {0}")]
    Http(std::io::Error),
    #[error(transparent)]
    Slack(#[from] crate::slack::SlackError),
    /// An actor Root does not restart failed (or one failed too often).
    #[error(transparent)]
    ActorTree(#[from] crate::root::TreeFailure),
    /// The OS random number generator failed (ids and tokens need it).
    #[error(transparent)]
    Entropy(#[from] intercom_actors::ids::EntropyError),
}

/// Options of the `serve` subcommand.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// `--config`, when given.
    pub config: Option<PathBuf>,
}

/// Runs the server until a signal stops it.
pub async fn serve(options: ServeOptions) -> Result<(), ServeError> {
    intercom_actors::ids::self_test()?;
    let config = load_config(&options)?;
    let slack_tokens = crate::slack::SlackTokens::from_env()?;
    // The database first (a second instance on it is told so), then the
    // port, then the token: a server that cannot listen shows no token (a
    // walk-through's second server, on a taken port, printed a "shown once"
    // token that the next start, the one that ran, did not show).
    let store = SqliteStore::open(&config.database.path).await?;
    let listener = bind(config.server.bind).await?;
    let token = load_token(&config)?;
    let mut options = AppOptions {
        bridge_url: Some(bridge_url(config.server.bind)),
        ..AppOptions::default()
    };
    let slack_events = match &slack_tokens {
        Some(_) => {
            let (sink, events) = crate::slack::event_channel();
            options.extra_sinks.push(sink);
            Some(events)
        }
        None => {
            tracing::info!("Slack disabled: local operator mode");
            None
        }
    };
    let app = App::start(&config, store, options).await?;
    let slack = match (slack_tokens, slack_events) {
        (Some(tokens), Some(events)) => match start_slack(&app, &config, tokens, events).await {
            Ok(handle) => Some(handle),
            Err(e) => {
                app.shutdown().await;
                return Err(e.into());
            }
        },
        _ => None,
    };
    let (resumed, interrupted) = match app.recover().await {
        Ok(counts) => counts,
        Err(e) => {
            app.shutdown().await;
            return Err(ServeError::Recover(e));
        }
    };
    // Resumes finish in the background (each agent's handshake); one that
    // fails is logged and its session ends `interrupted` with the reason.
    tracing::info!(
        resuming = resumed,
        interrupted,
        "recovered stored sessions ({resumed} resuming, {interrupted} interrupted)"
    );
    tracing::info!(addr = %config.server.bind, "listening on http://{}", config.server.bind);
    let mcp_shutdown = tokio_util::sync::CancellationToken::new();
    let mcp = mcp_router(&app, &config, &token, &mcp_shutdown);
    let console = crate::web::Console::new(app.clone(), token.clone());
    // On stdout, never through the log: the code logs a browser in (once).
    println!(
        "Web console: open {} (a one-time login link; afterwards log in with the API token)",
        crate::web::login_url(config.server.bind, &console)
    );
    let router = super::router_with_console(app.clone(), token, console).merge(mcp);
    let notify = slack.as_ref().map(|h| StaleNotice {
        gateway: h.gateway(),
        recipients: stale_recipients(&config),
    });
    let _watch = watch_config(&config, &app, notify);
    let result = run_until_signal(listener, router, &app, mcp_shutdown).await;
    if let Some(slack) = slack {
        drain_slack(slack).await;
    }
    app.close().await;
    tracing::info!("stopped");
    result
}

fn load_config(options: &ServeOptions) -> Result<Config, ConfigError> {
    let choice = choose_config(options.config.as_deref());
    if choice.fallback {
        tracing::info!(
            "no config.toml; using config.toml.example (copy it to config.toml to customise: the server reads config.toml as soon as it appears, as it reads a save)"
        );
    }
    let mut config = Config::load(&choice.path)?;
    if choice.fallback {
        config.successor = config
            .source
            .as_deref()
            .map(|example| example.with_file_name(crate::app::DEFAULT_CONFIG));
    }
    tracing::info!("{}", config.summary());
    // Its warnings are logged by `App::start`, which keeps them for /healthz.
    Ok(config)
}

/// Connects Slack (Socket Mode + Web API) and mirrors its connection state
/// into the app for `/healthz`.
async fn start_slack(
    app: &App,
    config: &Config,
    tokens: crate::slack::SlackTokens,
    events: crate::slack::SlackEvents,
) -> Result<crate::slack::SlackHandle, crate::slack::SlackError> {
    let opts = crate::slack::SlackOptions {
        tokens,
        api_url: config.slack.api_url.clone(),
        operators: crate::slack::operators(&config.slack.operators),
        supervisor: app.supervisor().clone(),
        registry: app.registry().clone(),
        root: Some(app.root().clone()),
        store: app.store_port(),
        outbox: app.outbox_port(),
        tuning: crate::slack::SlackTuning::default(),
    };
    let rules: std::sync::Arc<dyn crate::slack::RulesAdmin> = std::sync::Arc::new(app.clone());
    let handle = crate::slack::spawn_slack_with_rules(opts, rules, events).await?;
    let mut status = handle.status();
    let app2 = app.clone();
    app.set_slack(slack_state(status.get()));
    tokio::spawn(async move {
        while let Some(state) = status.changed().await {
            app2.set_slack(slack_state(state));
        }
    });
    tracing::info!("Slack enabled (Socket Mode)");
    Ok(handle)
}

fn slack_state(state: crate::slack::ConnectionState) -> crate::app::SlackState {
    match state {
        crate::slack::ConnectionState::Connected => crate::app::SlackState::Connected,
        _ => crate::app::SlackState::Reconnecting,
    }
}

/// Gives queued Slack messages a moment to go out; what remains stays in the
/// durable outbox for the next start.
async fn drain_slack(slack: crate::slack::SlackHandle) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while slack.backlog().await > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    slack.shutdown().await;
}

fn load_token(config: &Config) -> Result<auth::ApiToken, TokenError> {
    let path = auth::token_path(&config.database.path);
    let env = std::env::var(auth::TOKEN_ENV).ok();
    let (token, source) = auth::load_or_create(env, &path)?;
    match source {
        TokenSource::Env => tracing::info!("API token from {}", auth::TOKEN_ENV),
        TokenSource::File(p) => tracing::info!(file = %p.display(), "API token from file"),
        TokenSource::Generated(p) => {
            // Once, on stdout, never through the log.
            println!(
                "API token (shown once; saved to {}, mode 0600):\n    {}\n`agent-intercom ctl` reads that file; other clients send `Authorization: Bearer <token>`.",
                p.display(),
                token.expose()
            );
        }
    }
    Ok(token)
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr).await.map_err(|e| ServeError::Bind {
        addr,
        reason: match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                "address in use; is another agent-intercom running?".to_owned()
            }
            _ => e.to_string(),
        },
    })
}

/// Serves until SIGINT/SIGTERM, then stops accepting and shuts the
/// sessions down (both at once, so a slow request does not delay the agents).
/// The URL ACP agents get for this server's MCP endpoint (the bridge).
fn bridge_url(bind: SocketAddr) -> String {
    let host = if bind.ip().is_unspecified() {
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        bind.ip()
    };
    format!("http://{}/mcp", SocketAddr::new(host, bind.port()))
}

/// `/mcp` for IDE agents (and bridged ACP agents).
fn mcp_router(
    app: &App,
    config: &Config,
    token: &auth::ApiToken,
    shutdown: &tokio_util::sync::CancellationToken,
) -> axum::Router {
    let mut deps = crate::mcp::McpDeps::new(
        app.supervisor().clone(),
        app.registry().clone(),
        app.store_port(),
    );
    deps.approval_timeout = std::time::Duration::from_secs(config.mcp.approval_timeout_secs);
    deps.transmit_timeout = std::time::Duration::from_secs(config.mcp.transmit_timeout_secs);
    deps.allowed_hosts = config.mcp.allowed_hosts.clone();
    deps.server_files = config.server_files();
    deps.credentials = mcp_credentials(config, token);
    deps.shutdown = shutdown.clone();
    deps.rules = app.shared_rules();
    crate::mcp::router(deps)
}

/// The operator token plus the per-workspace MCP tokens found in the
/// environment (a missing or empty variable disables that token, loudly).
fn mcp_credentials(config: &Config, token: &auth::ApiToken) -> crate::mcp::McpCredentials {
    let mut workspace_tokens = Vec::new();
    for (ws, var) in &config.mcp.workspace_token_env {
        match std::env::var(var) {
            Ok(v) if v.trim().len() >= 16 => {
                workspace_tokens.push((ws.clone(), auth::ApiToken::new(&v)));
            }
            Ok(_) => tracing::warn!(
                workspace = %ws,
                "MCP token variable {var} is shorter than 16 characters; that workspace token is disabled"
            ),
            Err(_) => tracing::warn!(
                workspace = %ws,
                "MCP token variable {var} is not set; that workspace token is disabled"
            ),
        }
    }
    crate::mcp::McpCredentials {
        api_token: Some(token.clone()),
        workspace_tokens,
    }
}

/// Watches the config file; a valid edit is applied whole, a broken one is
/// reported (`/healthz` says `stale`) and the previous config stays.
/// Who hears about a broken config edit in Slack: the operators (a direct
/// message each), or every configured channel when there are none.
struct StaleNotice {
    gateway: crate::root::Current<intercom_actors::gateway::GatewayMsg>,
    recipients: Vec<String>,
}

fn stale_recipients(config: &Config) -> Vec<String> {
    let operators = crate::slack::operators(&config.slack.operators);
    if !operators.is_empty() {
        return operators;
    }
    let mut channels: Vec<String> = config
        .workspaces
        .iter()
        .map(|w| w.channel_id.clone())
        .filter(|c| !c.is_empty())
        .collect();
    channels.sort();
    channels.dedup();
    channels
}

impl StaleNotice {
    fn post(&self, error: &crate::config::ConfigError) {
        let text = match error {
            crate::config::ConfigError::RulesKept { .. } => format!(
                ":warning: agent-intercom applied the edit to its config file in part.\n{error}"
            ),
            _ => format!(
                ":warning: agent-intercom kept its previous configuration: the edit to the config file is invalid.\n{error}\nFix the file; it reloads on save."
            ),
        };
        for to in &self.recipients {
            crate::slack::dropped::send(
                &self.gateway,
                intercom_actors::gateway::GatewayMsg::ChannelPost {
                    channel: to.clone(),
                    body: intercom_actors::slack_port::MessageBody::text(text.clone()),
                },
                "a stale-config notice",
            );
        }
    }
}

fn watch_config(
    config: &Config,
    app: &App,
    notice: Option<StaleNotice>,
) -> Option<crate::config::WatchHandle> {
    let path = config.successor.clone().or_else(|| config.source.clone())?;
    let handle = tokio::runtime::Handle::current();
    let app = app.clone();
    // The configuration in force, which a reload must not empty at once.
    let running = std::sync::Mutex::new(config.clone());
    let watched = crate::config::watch(path.clone(), move |result, unchanged_for| {
        let mut in_force = running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let checked = result.and_then(|c| {
            c.reload_over(&in_force).inspect_err(|e| {
                tracing::error!("config change rejected: {e}");
            })
        });
        let stale = match checked {
            Ok((config, kept)) => {
                let to_confirm = config.changes_to_confirm(&in_force);
                if !to_confirm.is_empty() && unchanged_for < CONFIRM_QUIET {
                    // What it adds that only forbids or asks holds at once.
                    handle.block_on(app.hold_stricter(&config.rules));
                    let waiting_for = to_confirm.join("; ");
                    tracing::info!(
                        "config change held until the file has gone unchanged for {} s (a file still being written can read as looser than it is; its new deny and ask rules hold already): {waiting_for}",
                        CONFIRM_QUIET.as_secs(),
                    );
                    app.config_held(waiting_for);
                    return Next::ReadAgainOnceQuietFor(CONFIRM_QUIET);
                }
                apply_reload(&handle, &app, config, kept, &mut in_force)
            }
            Err(e) => Some(e),
        };
        if let Some(e) = stale {
            app.config_stale(&e);
            if let Some(n) = &notice {
                n.post(&e);
            }
        }
        Next::Done
    });
    match watched {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(
                "config changes need a restart: cannot watch {}: {e}",
                path.display()
            );
            None
        }
    }
}

/// Applies a checked reload and makes it the config in force; what it
/// could not apply (or kept of the old) is returned to be reported.
fn apply_reload(
    handle: &tokio::runtime::Handle,
    app: &App,
    config: Config,
    kept: Option<ConfigError>,
    in_force: &mut Config,
) -> Option<ConfigError> {
    match handle.block_on(app.apply_config(&config)) {
        Ok(()) => {
            handle.block_on(
                app.tell_revivability(&in_force.workspace_map(), &config.workspace_map()),
            );
            *in_force = config;
            kept.inspect(|e| tracing::warn!("config change applied in part: {e}"))
        }
        // Not applied: the config in force stays the one to diff the next
        // edit against.
        Err(e) => {
            tracing::error!("{e}");
            Some(ConfigError::NotApplied(e.to_string()))
        }
    }
}

async fn run_until_signal(
    listener: TcpListener,
    router: axum::Router,
    app: &App,
    mcp_shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), ServeError> {
    let (stop_tx, mut stop_rx) = watch::channel(false);
    // Listened to before anything is served: a signal sent once the
    // server answers is never taken by the default action.
    tokio::spawn(watch_signals(Signals::new(), stop_tx.clone()));
    let mut server_stop = stop_rx.clone();
    let server = super::serve_on(listener, router, async move {
        let _ = server_stop.wait_for(|stop| *stop).await;
    });
    tokio::pin!(server);
    let mut failure = None;
    // Biased: the server ends on its own only after the stop signal (its
    // shutdown waits for it), so a stop must win over "the server ended",
    // or a normal SIGTERM would be logged as a failure.
    tokio::select! {
        biased;
        _ = stop_rx.wait_for(|stop| *stop) => {}
        failed = app.failed() => failure = Some(failed),
        served = &mut server => {
            tracing::error!("HTTP server ended unexpectedly; stopping every session");
            app.shutdown().await;
            return served.map_err(ServeError::Http);
        }
    }
    tracing::info!("shutting down: stopping every session");
    if failure.is_some() {
        let _ = stop_tx.send(true);
    }
    // MCP streams end once the sessions have: a blocked `check_clearance`
    // gets its request's end (cancelled) as its answer. Ended first, its
    // client got an empty stream, and the log blamed the client.
    let sessions_then_mcp = async {
        app.shutdown().await;
        mcp_shutdown.cancel();
    };
    let (served, ()) = tokio::join!(server, sessions_then_mcp);
    match failure {
        Some(f) => Err(ServeError::ActorTree(f)),
        None => served.map_err(ServeError::Http),
    }
}

/// First SIGINT/SIGTERM: graceful stop. Second: exit immediately.
///
/// The signal streams are made once, before the first wait: a stream made
/// after the first signal missed a second one sent in between (it was
/// ignored, and a test's second SIGTERM waited out the graceful stop).
async fn watch_signals(signals: std::io::Result<Signals>, stop: watch::Sender<bool>) {
    let mut signals = match signals {
        Ok(signals) => signals,
        Err(e) => {
            tracing::error!("cannot listen for signals: {e}; use SIGKILL to stop");
            return;
        }
    };
    let name = signals.next().await;
    tracing::info!("{name} received; shutting down gracefully (send it again to exit at once)");
    let _ = stop.send(true);
    let name = signals.next().await;
    // No session is stopped on this path, but no agent is left running.
    let killed = intercom_actors::child::kill_every_agent_group();
    eprintln!("second signal ({name}): exiting immediately (killed {killed} agent process groups)");
    std::process::exit(130);
}

/// SIGINT and SIGTERM (and SIGHUP), listened to from the moment this is
/// made.
///
/// SIGHUP is taken and logged: by default it ended the server at once,
/// without the graceful stop (a closed terminal, or a `kill -HUP` meant as
/// "reload"). The config file reloads on its own when it changes.
#[cfg(unix)]
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// Waits for the next SIGINT or SIGTERM; returns which. A SIGHUP
    /// meanwhile is logged.
    async fn next(&mut self) -> &'static str {
        loop {
            tokio::select! {
                _ = self.interrupt.recv() => return "SIGINT",
                _ = self.terminate.recv() => return "SIGTERM",
                _ = self.hangup.recv() => tracing::info!(
                    "SIGHUP received and ignored: the config file is reloaded whenever it changes; send SIGTERM (or Ctrl-C) to stop"
                ),
            }
        }
    }
}

#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals)
    }

    async fn next(&mut self) -> &'static str {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}
