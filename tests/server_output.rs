//! The server's own output: what `serve` prints once on stdout (the API
//! token, the console's login code) is a server file when stdout goes to a
//! file, refused to agents like the log, and warned about at start when it
//! lies inside a workspace. A hostile agent that read it could act as the
//! operator.

mod common;

use std::process::Child;

use common::{Http, Layout, Setup, free_port, serve_command, until};
use serde_json::json;

/// Kills the server when the test ends, whatever happened.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn stdout_redirected_into_a_workspace_is_refused_to_the_agent_and_warned_about() {
    let port = free_port();
    let layout = Layout::new(&Setup {
        scenario: json!({"turns": [[
            {"read_file": {"path": "serve.out"}},
            {"read_file": {"path": "rotated.log"}},
            {"chunk": "\ndone"}
        ]]}),
        bind: format!("127.0.0.1:{port}"),
        ..Setup::default()
    });
    let out = layout.root.join("ws").join("serve.out");
    let log = layout.dir.path().join("serve.log");
    let child = serve_command(&layout.config)
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn agent-intercom serve");
    let _server = Running(child);
    let base = format!("http://127.0.0.1:{port}");
    let anonymous = Http::new(&base, None);
    until("the server to answer /healthz", || {
        anonymous.try_get("/healthz").filter(|r| r.status == 200)
    });
    let token_file = layout
        .database
        .parent()
        .expect("data dir")
        .join("api-token");
    let token = std::fs::read_to_string(token_file)
        .expect("token")
        .trim()
        .to_owned();
    let printed = std::fs::read_to_string(&out).expect("stdout");
    assert!(
        printed.contains(&token),
        "the precondition: the token is printed there"
    );

    let http = Http::new(&base, Some(&token));
    let session = http.start("read the server's output");
    let id = session["id"].as_str().expect("id");
    let text = http.until_transcript(id, "\ndone");
    assert!(text.contains("agent-intercom's own files"), "{text}");
    assert!(!text.contains(&token), "the agent got the token:\n{text}");

    // A log rotation renames the file the server still writes to: the
    // file stays refused under its new name.
    let rotated = layout.root.join("ws").join("rotated.log");
    std::fs::rename(&out, &rotated).expect("rotate");
    let session = http.start("read the rotated output");
    let id = session["id"].as_str().expect("id");
    let text = http.until_transcript(id, "\ndone");
    assert!(text.contains("agent-intercom's own files"), "{text}");
    assert!(!text.contains(&token), "the agent got the token:\n{text}");
    let stderr = std::fs::read_to_string(&log).expect("log");
    assert!(
        stderr.contains("the server's output goes to") && stderr.contains("serve.out"),
        "{stderr}"
    );
}
