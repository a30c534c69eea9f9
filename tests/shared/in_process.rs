//! The real app (store, registry, supervisor, HTTP API, optionally the web
//! console) served in-process on 127.0.0.1:0, in a thread and runtime of its
//! own. One implementation for every harness that needs a server without the
//! binary (`tests/common`, `tests/chaos_common`), so they start, serve and
//! stop the app the same way.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread::JoinHandle;

use agent_intercom::app::{App, AppOptions};
use agent_intercom::config::Config;
use agent_intercom::http::auth::ApiToken;
use agent_intercom::http::{router_with_console, serve_on};
use agent_intercom::storage::SqliteStore;
use agent_intercom::web::Console;

/// What the started server hands its test: where it listens (bound before
/// this is sent, so the first request is queued, never refused), the app, its
/// runtime, and the console's one-time login path.
pub struct Started {
    pub addr: SocketAddr,
    pub app: App,
    pub rt: tokio::runtime::Handle,
    pub login_path: String,
}

/// The server's thread; stopped gracefully on drop.
pub struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    /// Opens the store of `config`, starts and recovers the app, binds, and
    /// returns once the listener is bound.
    pub fn start(config: Config, token: &'static str) -> (Running, Started) {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(serve(config, token, ready_tx, stop_rx));
        });
        let started = ready_rx.recv().expect("server started");
        let running = Running {
            stop: Some(stop),
            thread: Some(thread),
        };
        (running, started)
    }
}

/// The store on the configured database and the app on it (not recovered).
pub async fn open_app(config: &Config) -> App {
    let store = SqliteStore::open(&config.database.path)
        .await
        .expect("store");
    App::start(config, store, AppOptions::default())
        .await
        .expect("app")
}

async fn serve(
    config: Config,
    token: &'static str,
    ready: mpsc::Sender<Started>,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    let app = open_app(&config).await;
    app.recover().await.expect("recover");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let console = Console::new(app.clone(), ApiToken::new(token));
    ready
        .send(Started {
            addr: listener.local_addr().expect("addr"),
            app: app.clone(),
            rt: tokio::runtime::Handle::current(),
            login_path: console.login_path(),
        })
        .expect("send address");
    let routes = router_with_console(app.clone(), ApiToken::new(token), console);
    let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_on(listener, routes, async {
        let _ = stopped_rx.await;
    }));
    let _ = stop.await;
    // As `serve` does: stop accepting and shut the sessions down at once;
    // shutting down ends the open event streams (which graceful shutdown
    // would otherwise wait on).
    let _ = stopped_tx.send(());
    app.shutdown().await;
    let _ = server.await;
    app.close().await;
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
