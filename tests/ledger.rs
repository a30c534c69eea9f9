//! Queued chatter writes are still committed before anyone is told.
//!
//! The session queues its chatter writes (agent text, tool call lines, the
//! plan) without waiting for them (`actors/src/session/ledger.rs`), so they
//! share a transaction with the request that follows. These tests run a
//! real session over the real SQLite store and, at the very moment each
//! operator event is emitted, read the database through the store's read
//! pool (which sees committed rows only): whatever an event announces must
//! already be there.

#[path = "shared/scripted_agent.rs"]
mod scripted_agent;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_intercom::storage::SqliteStore;
use intercom_actors::model::{Framing, Protocol, RequestStatus, SessionId};
use intercom_actors::ports::{OperatorEvent, OperatorSink, SessionStore};
use intercom_actors::session::{Caller, Choice, SessionMsg, SessionSettings};
use intercom_actors::settings::{AgentProfile, StallPolicy, SupervisionPolicy};
use intercom_actors::supervisor::{
    SessionSupervisor, StartRequest, SupervisorArgs, SupervisorMsg, directory,
};
use ractor::{Actor, ActorRef};
use serde_json::json;

/// What the database held, committed, when an event went out.
#[derive(Debug, Clone)]
struct Seen {
    event: String,
    transcript: String,
    request: Option<RequestStatus>,
}

/// A sink that reads the committed state at each event.
struct Probe {
    store: Arc<SqliteStore>,
    seen: Mutex<Vec<Seen>>,
}

impl Probe {
    fn look(&self, event: String, session: &SessionId) {
        let store = Arc::clone(&self.store);
        let id = session.clone();
        let (transcript, request) = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async move {
                let transcript = store
                    .transcript(&id)
                    .await
                    .expect("transcript")
                    .into_iter()
                    .map(|m| m.content)
                    .collect::<Vec<_>>()
                    .join("\n");
                let request = store
                    .get_request(&format!("{id}:req-1"))
                    .await
                    .ok()
                    .flatten()
                    .map(|(r, _)| r.status);
                (transcript, request)
            })
        });
        self.seen.lock().expect("seen").push(Seen {
            event,
            transcript,
            request,
        });
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }
}

impl OperatorSink for Probe {
    fn emit(&self, event: OperatorEvent) {
        match &event {
            OperatorEvent::AgentText { session_id, text } => {
                self.look(format!("text {text}"), session_id)
            }
            OperatorEvent::ToolCall {
                session_id,
                title,
                status,
                ..
            } => self.look(format!("tool {title} {status}"), session_id),
            OperatorEvent::RequestOpened { request } => {
                self.look("request opened".into(), &request.session_id)
            }
            OperatorEvent::RequestClosed { session_id, .. } => {
                self.look("request closed".into(), session_id)
            }
            _ => {}
        }
    }
}

async fn until(what: &str, probe: &Probe, pred: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let seen = probe.seen();
        if pred(&seen) {
            return seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never saw {what}: {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_event_announces_is_committed_before_it_goes_out() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = dir.path().canonicalize().expect("canon");
    let workspace = root.join("ws");
    std::fs::create_dir_all(&workspace).expect("ws");
    let scenario = json!({"turns": [[
        {"chunk": "reading the code. "},
        {"chunk": "about to edit notes.txt. "},
        {"tool_call": {"id": "t1", "title": "Edit notes.txt", "kind": "edit", "status": "pending"}},
        {"permission": {"tool_call_id": "t1", "title": "Edit notes.txt", "kind": "edit"}},
        {"tool_update": {"id": "t1", "status": "completed"}},
        {"chunk": "all done."}
    ]]});
    let scenario_path = root.join("scenario.json");
    std::fs::write(&scenario_path, scenario.to_string()).expect("scenario");
    let store = Arc::new(
        SqliteStore::open(&root.join("db.sqlite"))
            .await
            .expect("db"),
    );
    let probe = Arc::new(Probe {
        store: Arc::clone(&store),
        seen: Mutex::new(Vec::new()),
    });
    let settings = Arc::new(SessionSettings {
        stall: StallPolicy {
            inactivity_secs: 0,
            ..StallPolicy::default()
        },
        ..Default::default()
    });
    let (sup, _) = Actor::spawn(
        None,
        SessionSupervisor,
        SupervisorArgs {
            policy: SupervisionPolicy::default(),
            settings,
            store: store.clone(),
            sink: probe.clone(),
            bridge_url: None,
        },
    )
    .await
    .expect("supervisor");
    let profile = AgentProfile {
        id: "scripted".into(),
        command: scripted_agent::agent_bin().display().to_string(),
        args: vec!["--scenario".into(), scenario_path.display().to_string()],
        env: vec![],
        protocol: Protocol::Acp,
        framing: Framing::Ndjson,
        auth_method: None,
    };
    let req = StartRequest {
        workspace: "ws".into(),
        cwd: workspace.clone(),
        channel_id: None,
        profile,
        prompt: "edit notes".into(),
        owner: "tester".into(),
        mode: None,
    };
    let rec = ractor::call!(sup, |reply| SupervisorMsg::Start { req, reply })
        .expect("call")
        .expect("started");

    let seen = until("the request", &probe, |s| {
        s.iter().any(|e| e.event == "request opened")
    })
    .await;
    let opened = seen
        .iter()
        .find(|e| e.event == "request opened")
        .expect("opened");
    // The text and the tool call line the agent sent before its request
    // were queued, not awaited: they must be committed by now all the same.
    assert!(
        opened.transcript.contains("about to edit notes.txt."),
        "{opened:#?}"
    );
    assert!(opened.transcript.contains("Edit notes.txt"), "{opened:#?}");
    assert_eq!(opened.request, Some(RequestStatus::Pending), "{opened:#?}");

    let session: ActorRef<SessionMsg> = directory::find(&sup, &rec.id).expect("session is live");
    let decided = ractor::call!(session, |reply| SessionMsg::Decide {
        request_id: "req-1".into(),
        choice: Choice::Approve,
        reason: None,
        caller: Caller::local(),
        reply,
    })
    .expect("call");
    assert!(decided.is_ok(), "{decided:?}");

    let seen = until("the closing text", &probe, |s| {
        s.iter()
            .any(|e| e.event.starts_with("text ") && e.event.ends_with("all done."))
    })
    .await;
    for e in &seen {
        if let Some(text) = e.event.strip_prefix("text ") {
            assert!(e.transcript.contains(text.trim()), "{e:#?}");
        }
        if e.event == "request closed" {
            assert_eq!(e.request, Some(RequestStatus::Decided), "{e:#?}");
        }
    }
    let completed = seen
        .iter()
        .find(|e| e.event == "tool Edit notes.txt completed")
        .expect("the tool call completed");
    assert!(completed.transcript.contains("completed"), "{completed:#?}");
    let stored = store
        .get_request(&format!("{}:req-1", rec.id))
        .await
        .expect("read")
        .expect("the request row");
    assert_eq!(stored.0.status, RequestStatus::Decided);
    sup.stop(None);
}
