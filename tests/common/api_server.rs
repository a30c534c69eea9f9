//! The real app (store, registry, supervisor, HTTP API) served in-process
//! on 127.0.0.1:0 in a thread of its own, for the API test files.

use std::sync::mpsc;
use std::thread::JoinHandle;

use agent_intercom::app::{App, AppOptions};
use agent_intercom::config::Config;
use agent_intercom::http::auth::ApiToken;
use agent_intercom::http::{router, serve_on};
use agent_intercom::storage::SqliteStore;
use serde_json::Value;

use super::{Http, Layout, Setup, TOKEN};

/// A server running in its own thread and runtime; stopped on drop.
pub struct Server {
    pub http: Http,
    pub layout: Layout,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start(setup: Setup) -> Server {
        let layout = Layout::new(&setup);
        let config = Config::load(&layout.config).expect("config loads");
        let (addr_tx, addr_rx) = mpsc::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(run(config, addr_tx, stop_rx));
        });
        let addr: std::net::SocketAddr = addr_rx.recv().expect("server address");
        Server {
            http: Http::new(&format!("http://{addr}"), Some(TOKEN)),
            layout,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

async fn run(
    config: Config,
    addr_tx: mpsc::Sender<std::net::SocketAddr>,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    let store = SqliteStore::open(&config.database.path)
        .await
        .expect("store");
    let app = App::start(&config, store, AppOptions::default())
        .await
        .expect("app");
    app.recover().await.expect("recover");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    addr_tx
        .send(listener.local_addr().expect("addr"))
        .expect("send addr");
    let routes = router(app.clone(), ApiToken::new(TOKEN));
    serve_on(listener, routes, async {
        let _ = stop.await;
    })
    .await
    .expect("serve");
    app.shutdown().await;
    app.close().await;
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

pub fn permission_scenario() -> Value {
    serde_json::json!({"turns": [[
        {"chunk": "working. "},
        {"permission": {"tool_call_id": "t1", "title": "Write notes.txt", "kind": "edit", "locations": ["notes.txt"]}},
        {"chunk": "done."}
    ]]})
}

pub fn with_permission() -> Setup {
    Setup {
        scenario: permission_scenario(),
        ..Setup::default()
    }
}

pub fn sid(session: &Value) -> String {
    session["id"].as_str().expect("id").to_owned()
}
