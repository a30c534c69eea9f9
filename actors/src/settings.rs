//! The settings the core runs by, deserialised from `config.toml`.
//!
//! Field names are the public configuration interface (see
//! `config.toml.example`). Durations are integer seconds. Loading, path
//! resolution and cross-field validation live in the binary's `config` module;
//! this file only defines shapes and defaults so the actors can be built and
//! tested without a file.

use crate::model::{Framing, Protocol};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// An agent CLI the server knows how to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentProfile {
    /// Profile id, referenced by workspaces and API calls.
    pub id: String,
    /// Executable (absolute, or looked up on `PATH`).
    pub command: String,
    /// Static arguments; never user text.
    #[serde(default)]
    pub args: Vec<String>,
    /// Names of extra environment variables passed through to the child.
    #[serde(default)]
    pub env: Vec<String>,
    /// Wire protocol.
    #[serde(default)]
    pub protocol: Protocol,
    /// Message framing.
    #[serde(default)]
    pub framing: Framing,
    /// ACP auth method id to use when the agent requires authentication.
    #[serde(default)]
    pub auth_method: Option<String>,
}

/// A workspace: a directory and the Slack channel its sessions live in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceEntry {
    /// Workspace id.
    pub id: String,
    /// Directory (must be under `workspace_root`).
    pub path: PathBuf,
    /// Slack channel id; may be empty for local-only workspaces.
    #[serde(default)]
    pub channel_id: String,
    /// Human label.
    #[serde(default)]
    pub label: Option<String>,
    /// Agent profile used when a start request names none.
    #[serde(default)]
    pub default_agent: Option<String>,
}

/// Resource and time limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Live sessions at once.
    pub max_sessions: usize,
    /// Sessions spawning and handshaking at once; later starts wait their turn.
    pub max_concurrent_starts: usize,
    /// Spawn + handshake must finish within this.
    pub startup_timeout_secs: u64,
    /// A prompt with no answer within this is noted (the session stays active).
    pub prompt_timeout_secs: u64,
    /// No activity for this long ends the session (`completed`, `idle_timeout`).
    pub idle_timeout_secs: u64,
    /// Graceful stop waits this long before killing.
    pub shutdown_grace_secs: u64,
    /// Longest accepted inbound line / frame.
    pub max_line_bytes: usize,
    /// Inbound agent messages per second per session before updates are coalesced.
    pub inbound_messages_per_sec: u32,
    /// Largest `fs/read_text_file` result; past it the agent is told to use `line`/`limit`.
    pub max_read_bytes: usize,
    /// Agent text kept per turn; past it the rest is dropped with a visible note.
    pub max_turn_text_bytes: usize,
    /// Open requests per session; past it the agent gets an error.
    pub max_pending_requests: usize,
}

/// The default of `limits.max_concurrent_starts`: one start per CPU core,
/// at least 2 and at most 4. A start is CPU-bound (an exec, a runtime to
/// boot, a CPU-second for Node-based agents), so more starts at once than
/// cores only take CPU from the sessions already running: on 2 cores, a
/// burst of 500 starts took about as long with 2 at once as with 4, and the
/// running sessions' decisions waited less meanwhile (BENCHMARKS.md, issue
/// 13 session 8).
pub fn default_concurrent_starts() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 4)
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_sessions: 5,
            max_concurrent_starts: default_concurrent_starts(),
            startup_timeout_secs: 30,
            prompt_timeout_secs: 60,
            idle_timeout_secs: 1800,
            shutdown_grace_secs: 10,
            max_line_bytes: 1_048_576,
            inbound_messages_per_sec: 1000,
            max_read_bytes: 1_048_576,
            max_turn_text_bytes: 1_048_576,
            max_pending_requests: 32,
        }
    }
}

impl Limits {
    /// Startup timeout as a duration.
    pub fn startup_timeout(&self) -> Duration {
        Duration::from_secs(self.startup_timeout_secs)
    }
    /// Prompt timeout as a duration.
    pub fn prompt_timeout(&self) -> Duration {
        Duration::from_secs(self.prompt_timeout_secs)
    }
    /// Idle timeout as a duration.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.idle_timeout_secs)
    }
    /// Shutdown grace as a duration.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }
}

/// Stall detection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StallPolicy {
    /// No inbound line for this long raises a stall event. 0 disables.
    pub inactivity_secs: u64,
    /// After a stall event, nudge every this many seconds.
    pub escalation_secs: u64,
    /// After this many nudges without activity the session is `stalled`.
    pub max_nudges: u32,
    /// What a nudge says.
    pub nudge_text: String,
}

impl Default for StallPolicy {
    fn default() -> Self {
        StallPolicy {
            inactivity_secs: 300,
            escalation_secs: 120,
            max_nudges: 3,
            nudge_text: "Continue working on the current task. Pick up where you left off."
                .to_owned(),
        }
    }
}

/// Crash restarts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SupervisionPolicy {
    /// Restarts allowed within the window.
    pub max_restarts: u32,
    /// The window, in seconds.
    pub restart_window_secs: u64,
    /// First backoff.
    pub backoff_initial_secs: u64,
    /// Backoff ceiling.
    pub backoff_max_secs: u64,
}

impl Default for SupervisionPolicy {
    fn default() -> Self {
        SupervisionPolicy {
            max_restarts: 3,
            restart_window_secs: 600,
            backoff_initial_secs: 1,
            backoff_max_secs: 60,
        }
    }
}

impl SupervisionPolicy {
    /// Backoff before restart number `n` (1-based): initial * 2^(n-1), capped.
    pub fn backoff(&self, n: u32) -> Duration {
        let exp = n.saturating_sub(1).min(30);
        let secs = self
            .backoff_initial_secs
            .saturating_mul(1u64 << exp)
            .min(self.backoff_max_secs);
        Duration::from_secs(secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_then_caps() {
        let p = SupervisionPolicy {
            backoff_initial_secs: 1,
            backoff_max_secs: 5,
            ..Default::default()
        };
        let got: Vec<u64> = (1..=5).map(|n| p.backoff(n).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 5, 5]);
    }

    #[test]
    fn limits_defaults_match_the_documented_ones() {
        let l = Limits::default();
        assert_eq!(l.max_sessions, 5);
        assert_eq!(l.startup_timeout_secs, 30);
        assert_eq!(l.prompt_timeout_secs, 60);
        assert_eq!(l.idle_timeout_secs, 1800);
        assert_eq!(l.shutdown_grace_secs, 10);
        assert_eq!(l.max_line_bytes, 1_048_576);
    }
}
