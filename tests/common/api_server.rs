//! The real app served in-process (`tests/shared/in_process.rs`) on a
//! [`Layout`], with the small client pointed at it, for the API test files.

use agent_intercom::config::Config;
use serde_json::Value;

use super::{Http, Layout, Setup, TOKEN};

// One harness per test crate may include this alongside another.
#[allow(clippy::duplicate_mod)]
#[path = "../shared/in_process.rs"]
pub mod in_process;

/// A server on an existing layout's database (a restart is a new one on the
/// same layout); stopped gracefully on drop.
pub struct Served {
    pub http: Http,
    _running: in_process::Running,
}

impl Served {
    pub fn on(layout: &Layout) -> Served {
        let config = Config::load(&layout.config).expect("config loads");
        let (running, started) = in_process::Running::start(config, TOKEN);
        Served {
            http: Http::new(&format!("http://{}", started.addr), Some(TOKEN)),
            _running: running,
        }
    }
}

/// A server on a layout of its own; stopped on drop (before the layout's
/// directory goes: fields drop in order).
pub struct Server {
    _running: in_process::Running,
    pub http: Http,
    pub layout: Layout,
}

impl Server {
    pub fn start(setup: Setup) -> Server {
        let layout = Layout::new(&setup);
        let Served { http, _running } = Served::on(&layout);
        Server {
            _running,
            http,
            layout,
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

/// Starts a session (the server's `limits.idle_timeout_secs` set short) and
/// waits until it ended by idle timeout; its id.
pub fn idle_ended(http: &Http, prompt: &str) -> String {
    let id = sid(&http.start(prompt));
    let ended = http.until_status(&id, "completed");
    assert_eq!(ended["status_reason"], "idle_timeout", "{ended}");
    id
}
