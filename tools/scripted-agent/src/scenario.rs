//! Scenario file model.
//!
//! This file exists so that the whole behaviour of the scripted agent is
//! described by plain data: the JSON scenario format (top-level settings,
//! turns and the step vocabulary) and the built-in demo scenario used when no
//! `--scenario` is given.

use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value, json};

/// Which dialect the agent speaks on stdio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Agent Client Protocol (JSON-RPC 2.0).
    #[default]
    Acp,
    /// The older intercom NDJSON dialect (no `jsonrpc` field, no handshake).
    Intercom,
}

/// How messages are delimited on stdin/stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Framing {
    /// One JSON object per line.
    #[default]
    Ndjson,
    /// `Content-Length: N\r\n\r\n<body>` frames.
    Lsp,
}

/// A whole scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub protocol: Protocol,
    #[serde(default)]
    pub framing: Framing,
    #[serde(default = "default_agent_name")]
    pub agent_name: String,
    #[serde(default = "default_true")]
    pub load_session: bool,
    #[serde(default)]
    pub mcp_http: bool,
    #[serde(default)]
    pub auth_methods: Vec<Value>,
    #[serde(default)]
    pub require_auth: bool,
    #[serde(default)]
    pub handshake_delay_ms: u64,
    /// Extra fields of the `session/new` result (`modes`, `models`,
    /// `configOptions`); their switches (`session/set_mode`, ...) are
    /// accepted and reported as agent text.
    #[serde(default)]
    pub session_options: Option<Value>,
    #[serde(default)]
    pub on_start: Vec<Step>,
    #[serde(default)]
    pub turns: Vec<Vec<Step>>,
    #[serde(default)]
    pub on_load: Vec<Step>,
    /// Steps run right after answering `session/load`: history replayed
    /// late, as Gemini CLI does (the spec has it before the answer).
    #[serde(default)]
    pub after_load: Vec<Step>,
    /// Advertise `loadSession` but answer every `session/load` with this
    /// error, as real agents do for a session they lost with their process
    /// (Gemini CLI: "Invalid session identifier").
    #[serde(default)]
    pub load_error: Option<String>,
    /// Benchmarks: append each permission round trip (microseconds, from
    /// writing the request to reading the answer) to this file.
    #[serde(default)]
    pub rtt_log: Option<std::path::PathBuf>,
}

fn default_agent_name() -> String {
    "scripted-agent".to_owned()
}

fn default_true() -> bool {
    true
}

/// One scripted action. Each step is a JSON object with exactly one key.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Chunk(String),
    UserChunk(String),
    Thought(String),
    ToolCall(ToolCall),
    ToolUpdate(ToolUpdate),
    Plan(Vec<Value>),
    Permission(Permission),
    WriteFile(WriteFile),
    ReadFile(ReadFile),
    Raw(String),
    /// Bytes written to stdout with no framing (a broken LSP header, say).
    Unframed(String),
    BigLine(usize),
    /// Writes this many one-character agent chunks as fast as possible.
    Flood(usize),
    SleepMs(u64),
    Hang(bool),
    Exit(i32),
    ExitOnce(ExitOnce),
    /// The first time (no marker file yet): close stdin for good and say
    /// "stdin closed"; the agent then stays up without stdin (a broken pipe
    /// for the server's next write). Later runs skip it.
    CloseStdinOnce(String),
    /// Like `hang`, but only the first time (no marker file yet).
    HangOnce(String),
    /// Ignore SIGTERM from now on (only SIGKILL ends the agent).
    IgnoreSigterm(bool),
    /// Start a `sleep <secs>` in a process group of its own that inherits
    /// stdout and stderr (a descendant escaping the agent's group and
    /// holding its pipes open); its pid is written to `pid_file`. With
    /// `detach`, through a shell that exits at once (a double fork).
    EscapeGroup(EscapeGroup),
    /// Exit with this code right after the turn's answer was sent (an
    /// agent that finished its work; ACP).
    ExitAfterTurn(i32),
    Stderr(String),
    EchoEnv(Vec<String>),
    EchoCwd(bool),
    EchoMcp(bool),
    StopReason(String),
    WaitCancel(bool),
    /// Extension: branch on the outcome of the most recent `permission` step.
    IfAllowed(IfAllowed),
    Clearance(Clearance),
    Status(String),
    Heartbeat(Vec<Value>),
    ForwardPrompt(ForwardPrompt),
}

/// See [`Step::EscapeGroup`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EscapeGroup {
    pub pid_file: String,
    pub secs: u64,
    /// Double fork: the `sleep` is re-parented (its parent exits at once),
    /// so it is no longer the agent's descendant when the server kills it.
    #[serde(default)]
    pub detach: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    pub id: String,
    pub title: Option<String>,
    pub kind: Option<String>,
    pub status: Option<String>,
    /// `diff` content blocks; relative paths are sent joined onto the
    /// session's cwd (absolute, as Claude Code sends them), and each file is
    /// also sent as a location.
    #[serde(default)]
    pub diffs: Vec<Diff>,
    /// Sent verbatim as `rawInput`.
    #[serde(default)]
    pub raw_input: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolUpdate {
    pub id: String,
    pub status: Option<String>,
    pub title: Option<String>,
    pub diff: Option<Diff>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Diff {
    pub path: String,
    pub old_text: Option<String>,
    pub new_text: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Permission {
    pub tool_call_id: String,
    pub title: Option<String>,
    pub kind: Option<String>,
    pub options: Option<Vec<Value>>,
    /// Paths sent as the tool call's `locations`.
    #[serde(default)]
    pub locations: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteFile {
    pub path: String,
    pub content: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadFile {
    pub path: String,
    /// ACP `line` (1-based), when given.
    #[serde(default)]
    pub line: Option<u32>,
    /// ACP `limit` (lines), when given.
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExitOnce {
    pub code: i32,
    pub marker: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IfAllowed {
    #[serde(default)]
    pub then: Vec<Step>,
    #[serde(default, rename = "else")]
    pub otherwise: Vec<Step>,
}

/// Intercom `clearance/request`; every field besides `id` goes into params.
#[derive(Debug, Clone, Deserialize)]
pub struct Clearance {
    pub id: String,
    #[serde(flatten)]
    pub params: Map<String, Value>,
}

/// Intercom `prompt/forward`; every field besides `id` goes into params.
#[derive(Debug, Clone, Deserialize)]
pub struct ForwardPrompt {
    pub id: String,
    #[serde(flatten)]
    pub params: Map<String, Value>,
}

impl Scenario {
    /// Reads and parses a scenario file; the error names the file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read scenario {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("invalid scenario {}: {e}", path.display()))
    }

    /// Steps for the `index`-th prompt: the last turn repeats; none => empty.
    pub fn turn(&self, index: usize) -> &[Step] {
        match self.turns.get(index).or_else(|| self.turns.last()) {
            Some(steps) => steps,
            None => &[],
        }
    }

    /// The built-in demo: ask permission to write hello.txt, then do it.
    pub fn demo() -> Self {
        let turn = vec![
            Step::Chunk("Looking at the workspace…".to_owned()),
            Step::Plan(demo_plan()),
            Step::ToolCall(ToolCall {
                id: "t1".to_owned(),
                title: Some("Write hello.txt".to_owned()),
                kind: Some("edit".to_owned()),
                status: Some("pending".to_owned()),
                diffs: vec![Diff {
                    path: "hello.txt".to_owned(),
                    old_text: None,
                    new_text: DEMO_CONTENT.to_owned(),
                }],
                raw_input: None,
            }),
            // Like Claude Code: the permission names only the tool call.
            Step::Permission(Permission {
                tool_call_id: "t1".to_owned(),
                title: None,
                kind: None,
                options: None,
                locations: vec!["hello.txt".to_owned()],
            }),
            Step::IfAllowed(IfAllowed {
                then: vec![
                    Step::WriteFile(WriteFile {
                        path: "hello.txt".to_owned(),
                        content: DEMO_CONTENT.to_owned(),
                    }),
                    tool_status("t1", "completed"),
                ],
                otherwise: vec![tool_status("t1", "failed")],
            }),
            Step::Chunk("Done.".to_owned()),
            Step::StopReason("end_turn".to_owned()),
        ];
        Self {
            protocol: Protocol::Acp,
            framing: Framing::Ndjson,
            agent_name: default_agent_name(),
            load_session: true,
            mcp_http: false,
            auth_methods: Vec::new(),
            require_auth: false,
            handshake_delay_ms: 0,
            session_options: None,
            on_start: Vec::new(),
            turns: vec![turn],
            on_load: Vec::new(),
            after_load: Vec::new(),
            load_error: None,
            rtt_log: None,
        }
    }
}

const DEMO_CONTENT: &str = "hello from scripted-agent\n";

fn demo_plan() -> Vec<Value> {
    vec![
        json!({"content": "Inspect the workspace", "status": "in_progress", "priority": "high"}),
        json!({"content": "Write hello.txt", "status": "pending", "priority": "medium"}),
    ]
}

fn tool_status(id: &str, status: &str) -> Step {
    Step::ToolUpdate(ToolUpdate {
        id: id.to_owned(),
        status: Some(status.to_owned()),
        title: None,
        diff: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_scenario() {
        let text = r#"{
            "protocol": "intercom", "framing": "lsp", "require_auth": true,
            "turns": [[{"chunk": "a"}, {"sleep_ms": 5}], [{"exit": 3}]],
            "on_load": [{"user_chunk": "u"}],
            "on_start": [{"exit_once": {"code": 1, "marker": "/tmp/m"}}]
        }"#;
        let s: Scenario = serde_json::from_str(text).unwrap();
        assert_eq!(s.protocol, Protocol::Intercom);
        assert_eq!(s.framing, Framing::Lsp);
        assert!(s.load_session);
        assert_eq!(s.turn(0).len(), 2);
        assert!(matches!(s.turn(5)[0], Step::Exit(3)));
    }

    #[test]
    fn empty_turns_yield_no_steps() {
        let s: Scenario = serde_json::from_str("{}").unwrap();
        assert!(s.turn(0).is_empty());
    }

    #[test]
    fn rejects_step_with_two_keys_and_unknown_fields() {
        let two = r#"{"turns": [[{"chunk": "a", "thought": "b"}]]}"#;
        assert!(serde_json::from_str::<Scenario>(two).is_err());
        let unknown = r#"{"protcol": "acp"}"#;
        assert!(serde_json::from_str::<Scenario>(unknown).is_err());
    }

    #[test]
    fn clearance_keeps_extra_fields_as_params() {
        let step: Step = serde_json::from_str(
            r#"{"clearance": {"id": "r1", "title": "T", "risk_level": "low"}}"#,
        )
        .unwrap();
        let Step::Clearance(c) = step else {
            panic!("not a clearance")
        };
        assert_eq!(c.id, "r1");
        assert_eq!(c.params["risk_level"], "low");
    }
}
