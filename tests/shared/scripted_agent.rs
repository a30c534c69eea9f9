//! Where the repository's scripted agent binary is, for every test harness
//! and benchmark (included with `#[path]`; test crates cannot share a module
//! otherwise). Builds it on demand when a run did not.

use std::path::{Path, PathBuf};

/// `target/<profile>/scripted-agent`, next to the running test or bench
/// (`target/<profile>/deps/<exe>`); built with `cargo build` in the same
/// profile when missing.
pub fn agent_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("scripted-agent");
    if !bin.exists() {
        let release = dir.ends_with("release").then_some("--release");
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", "scripted-agent"])
            .args(release)
            .status()
            .expect("cargo build scripted-agent");
        assert!(status.success(), "building scripted-agent failed");
    }
    bin
}
