//! A descriptor the server inherited from whoever launched it (a shell, a
//! supervisor, a terminal multiplexer) never reaches an agent: the real
//! binary is started holding an open, inheritable file, and the agent it
//! spawns is checked through `/proc` for any descriptor on that file.
//!
//! Alone in its own test binary: the inheritable descriptor would leak into
//! whatever else a test in the same process spawned meanwhile.

mod chaos_common;

use std::os::fd::AsRawFd;

use chaos_common::{AgentSpec, Api, Deployment, Launch, ServerProcess, Spec, TOKEN, free_port};
use serde_json::json;

/// The files `/proc/<pid>/fd` of process `pid` points at.
fn open_files(pid: i64) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the agent's descriptors")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .collect()
}

#[test]
fn an_inherited_descriptor_does_not_reach_the_agent() {
    let port = free_port();
    let spec = Spec {
        agents: vec![AgentSpec::new(
            "waiting",
            json!({"turns": [[{"chunk": "ready"}, {"hang": true}]]}),
        )],
        bind: format!("127.0.0.1:{port}"),
        ..Spec::default()
    };
    let dep = Deployment::new(&spec);
    let secret = dep.dir.path().join("launcher-secret.txt");
    let file = std::fs::File::create(&secret).expect("secret file");
    // SAFETY: clears FD_CLOEXEC on a descriptor this test owns, so the
    // server inherits it like a launcher's open descriptor.
    unsafe {
        let fd = file.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFD);
        assert!(flags >= 0);
        assert_eq!(libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC), 0);
    }
    let api = Api::new(&format!("http://127.0.0.1:{port}"), Some(TOKEN));
    let launch = Launch {
        env: vec![("AGENT_INTERCOM_TOKEN".into(), TOKEN.into())],
        ..Launch::default()
    };
    let mut server = ServerProcess::spawn(&dep, &launch);
    drop(file);
    server.wait_healthy(&api);
    let secret = secret.canonicalize().expect("canonical");
    assert!(
        open_files(server.pid().into()).contains(&secret),
        "the server did not inherit the descriptor: the test proves nothing"
    );
    let id = api.start("waiting", "go.");
    api.until_transcript(&id, "ready");
    let agent = api.session(&id)["live"]["agent_pid"]
        .as_i64()
        .expect("agent pid");
    let leaked = open_files(agent);
    server.signal(libc::SIGTERM);
    server.wait_exit();
    assert!(
        !leaked.contains(&secret),
        "the agent holds the launcher's descriptor: {leaked:?}"
    );
}
