//! What the real-agent interop tests share: where the pinned agents are
//! installed, their process environment, the fake model APIs, and a
//! `/proc` scan for leftover processes.

#![allow(dead_code)]

pub mod fake_anthropic;
pub mod fake_gemini;
pub mod loopback_http;
pub mod turns;

use std::path::{Path, PathBuf};

use intercom_actors::settings::AgentProfile;

/// An installed agent binary (`tests/interop/install.sh` puts them there).
pub fn bin(name: &str) -> PathBuf {
    let root = manifest_dir().join("../tests/interop/node_modules/.bin");
    let path = root.join(name);
    assert!(
        path.exists(),
        "{} missing: run tests/interop/install.sh",
        path.display()
    );
    path
}

/// A profile for a real agent; `env` names the variables passed through.
pub fn profile(id: &str, command: PathBuf, args: &[&str], env: &[&str]) -> AgentProfile {
    AgentProfile {
        id: id.into(),
        command: command.display().to_string(),
        args: args.iter().map(|s| s.to_string()).collect(),
        env: env.iter().map(|s| s.to_string()).collect(),
        protocol: Default::default(),
        framing: Default::default(),
        auth_method: None,
    }
}

/// Sets process environment variables for the agents spawned next.
///
/// Callers hold the test file's serial lock, and the interop tests run with
/// `--test-threads=1`, so no other test reads the environment meanwhile.
pub fn set_env(vars: &[(&str, &str)]) {
    for (k, v) in vars {
        // SAFETY: see above; only agents spawned by this test read them.
        unsafe { std::env::set_var(k, v) };
    }
}

/// A fresh writable HOME under `dir` (agents write their state there); as
/// root claude-code-acp needs `IS_SANDBOX=1`.
pub fn fresh_home(dir: &Path) {
    let home = dir.join("home");
    std::fs::create_dir_all(&home).expect("home");
    set_env(&[
        ("HOME", home.to_str().expect("utf-8 path")),
        ("IS_SANDBOX", "1"),
    ]);
}

/// Live (non-zombie) processes whose command line contains every word.
pub fn processes_with(words: &[&str]) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            !zombie && words.iter().all(|w| cmdline.contains(w))
        })
        .collect()
}

/// Waits until no live process has every word in its command line.
pub async fn until_no_process(words: &[&str], wait: std::time::Duration) {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let left = processes_with(words);
        if left.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "processes left running {words:?}: {left:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The package's directory: cargo's `CARGO_MANIFEST_DIR` when it runs this
/// test, else the one it was compiled in (a build cache shared between two
/// clones must not read the other clone's files).
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        Into::into,
    )
}
