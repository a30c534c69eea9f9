//! Domain vocabulary shared by the actors and the edges.
//!
//! These are plain data types: what a session is, what state it is in, what an
//! operator decided. They carry no behaviour beyond (de)serialisation so that
//! storage, the HTTP API and Slack can all speak about the same things.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The server's own identifier of a session (not the agent's ACP session id).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionId(pub String);

impl SessionId {
    /// A fresh, unguessable-enough id: `s-` followed by 16 hex digits.
    pub fn generate() -> Self {
        SessionId(format!("s-{:016x}", crate::ids::random_u64()))
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for SessionId {
    fn from(s: &str) -> Self {
        SessionId(s.to_owned())
    }
}

/// Where a session is in its life. Stored as the lower-case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// Spawning the agent and running the handshake.
    Starting,
    /// Handshake done; the agent is working or waiting for a prompt.
    Active,
    /// No stream activity after nudges; waiting for a human.
    Stalled,
    /// Ended normally (idle timeout, agent finished).
    Completed,
    /// Stopped by an operator or by shutdown.
    Cancelled,
    /// The agent failed in a way that restarting did not fix.
    Crashed,
    /// Ended by an error that is not a crash (startup failure, broken pipe).
    Error,
    /// The server stopped while the session was live and could not resume it.
    Interrupted,
}

impl SessionStatus {
    /// The stored / wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Starting => "starting",
            SessionStatus::Active => "active",
            SessionStatus::Stalled => "stalled",
            SessionStatus::Completed => "completed",
            SessionStatus::Cancelled => "cancelled",
            SessionStatus::Crashed => "crashed",
            SessionStatus::Error => "error",
            SessionStatus::Interrupted => "interrupted",
        }
    }

    /// Parses the stored name; unknown names are `None`.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "starting" => SessionStatus::Starting,
            "active" => SessionStatus::Active,
            "stalled" => SessionStatus::Stalled,
            "completed" => SessionStatus::Completed,
            "cancelled" => SessionStatus::Cancelled,
            "crashed" => SessionStatus::Crashed,
            "error" => SessionStatus::Error,
            "interrupted" => SessionStatus::Interrupted,
            _ => return None,
        })
    }

    /// True while an agent process may be attached to the session.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            SessionStatus::Starting | SessionStatus::Active | SessionStatus::Stalled
        )
    }
}

impl fmt::Display for SessionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which wire protocol a session's agent speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// Standard Agent Client Protocol (JSON-RPC 2.0).
    #[default]
    Acp,
    /// The older agent-intercom NDJSON dialect.
    Intercom,
    /// No child process: an IDE agent connected over MCP.
    Mcp,
}

impl Protocol {
    /// The stored / config name.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Acp => "acp",
            Protocol::Intercom => "intercom",
            Protocol::Mcp => "mcp",
        }
    }
}

/// How messages are delimited on the agent's stdio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Framing {
    /// One JSON object per line.
    #[default]
    Ndjson,
    /// LSP-style `Content-Length:` headers.
    Lsp,
}

/// Who wrote a transcript entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The operator (prompts, steering).
    User,
    /// The agent (message text).
    Agent,
    /// The server (tool calls, plans, errors, lifecycle notes).
    System,
}

impl Role {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Agent => "agent",
            Role::System => "system",
        }
    }
}

/// What kind of transcript entry it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageKind {
    /// Plain text (prompt, agent reply, note).
    Text,
    /// The agent's plan, as a JSON array of entries.
    Plan,
    /// A tool call with its status and content, as JSON.
    Tool,
    /// An error or lifecycle failure.
    Error,
    /// The agent's reasoning (`agent_thought_chunk`s, aggregated).
    Thought,
}

impl MessageKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageKind::Text => "text",
            MessageKind::Plan => "plan",
            MessageKind::Tool => "tool",
            MessageKind::Error => "error",
            MessageKind::Thought => "thought",
        }
    }
}

/// The kind of an ACP permission option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptionKind {
    /// Allow this one time.
    AllowOnce,
    /// Allow and remember.
    AllowAlways,
    /// Reject this one time.
    RejectOnce,
    /// Reject and remember.
    RejectAlways,
}

impl OptionKind {
    /// True for the two allow kinds.
    pub fn is_allow(self) -> bool {
        matches!(self, OptionKind::AllowOnce | OptionKind::AllowAlways)
    }

    /// What choosing an option of this kind does, in the operator's words.
    pub fn verb(self) -> &'static str {
        match self {
            OptionKind::AllowOnce => "Allow once",
            OptionKind::AllowAlways => "Always allow",
            OptionKind::RejectOnce => "Reject",
            OptionKind::RejectAlways => "Always reject",
        }
    }

    /// Names that say what this kind does, as lowercase letters only
    /// ("Allow once" is `allowonce`): shown as the agent wrote them.
    fn plain_names(self) -> &'static [&'static str] {
        match self {
            OptionKind::AllowOnce => &[
                "allow",
                "allowonce",
                "approve",
                "yes",
                "accept",
                "continue",
                "refine",
                "write",
                "proceed",
            ],
            OptionKind::AllowAlways => &[
                "allowalways",
                "alwaysallow",
                "approvealways",
                "alwaysapprove",
                "yesalways",
            ],
            OptionKind::RejectOnce => &["reject", "rejectonce", "deny", "no", "decline", "stop"],
            OptionKind::RejectAlways => &[
                "rejectalways",
                "alwaysreject",
                "denyalways",
                "alwaysdeny",
                "never",
            ],
        }
    }
}

/// The longest piece of an agent's option name a label carries.
const LABEL_NAME_CHARS: usize = 40;

/// One button the operator can press on a permission request.
///
/// Serialized with a `label` too ([`PermissionOption::label`]): what a
/// button for it should say. Reading ignores the label.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PermissionOption {
    /// The agent's option id, echoed back verbatim.
    pub id: String,
    /// Human label, as the agent (or the server, for its own options) wrote it.
    pub name: String,
    /// What choosing it means.
    pub kind: OptionKind,
}

impl PermissionOption {
    /// What a button for this option says. The agent picks an option's
    /// name, and its kind decides what choosing it does, so a name alone
    /// could say "Reject" on an option that allows. A name that plainly
    /// says what the kind does is shown as written; any other name follows
    /// the kind's own words: `Always allow: Reject`.
    pub fn label(&self) -> String {
        let name = self.name.trim();
        let plain_chars = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || " ,'-".contains(c));
        let letters: String = name
            .chars()
            .filter(char::is_ascii_alphabetic)
            .map(|c| c.to_ascii_lowercase())
            .collect();
        if plain_chars && self.kind.plain_names().contains(&letters.as_str()) {
            return name.to_owned();
        }
        let shown: String = name
            .chars()
            .filter(|c| shows_plainly(*c))
            .take(LABEL_NAME_CHARS)
            .collect();
        match (shown.is_empty(), name.chars().count() > LABEL_NAME_CHARS) {
            (true, _) => self.kind.verb().to_owned(),
            (false, false) => format!("{}: {shown}", self.kind.verb()),
            (false, true) => format!("{}: {shown}…", self.kind.verb()),
        }
    }
}

/// False for characters that move, hide or reorder text (controls and
/// [`crate::text::disguises`]), and for the zero-width (non-)joiners, which
/// a button label has no use for: a label leaves them out.
fn shows_plainly(c: char) -> bool {
    !(c.is_control() || crate::text::disguises(c) || matches!(c, '\u{200c}' | '\u{200d}'))
}

impl Serialize for PermissionOption {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = s.serialize_struct("PermissionOption", 4)?;
        out.serialize_field("id", &self.id)?;
        out.serialize_field("name", &self.name)?;
        out.serialize_field("kind", &self.kind)?;
        out.serialize_field("label", &self.label())?;
        out.end()
    }
}

/// What a pending request is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    /// ACP `session/request_permission` or dialect `clearance/request`.
    Permission,
    /// ACP `fs/write_text_file`: a write gated by the operator, with a diff.
    FileWrite,
    /// Dialect `prompt/forward`: continue / refine / stop.
    ForwardedPrompt,
}

impl RequestKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestKind::Permission => "permission",
            RequestKind::FileWrite => "file_write",
            RequestKind::ForwardedPrompt => "forwarded_prompt",
        }
    }
}

/// The state of a pending request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestStatus {
    /// Waiting for a human.
    Pending,
    /// Answered by an operator (or a rule).
    Decided,
    /// The turn was cancelled or the agent went away before a decision.
    Cancelled,
    /// The server restarted and could not re-attach it.
    Expired,
}

impl RequestStatus {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestStatus::Pending => "pending",
            RequestStatus::Decided => "decided",
            RequestStatus::Cancelled => "cancelled",
            RequestStatus::Expired => "expired",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => RequestStatus::Pending,
            "decided" => RequestStatus::Decided,
            "cancelled" => RequestStatus::Cancelled,
            "expired" => RequestStatus::Expired,
            _ => return None,
        })
    }
}

/// A request from the agent that waits for a human.
///
/// `id` is global (`<session>/<n>`); `request_id` is the session-scoped id
/// (`req-1`, `req-2`, ...) so two sessions may both have a `req-1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRequest {
    /// Global id: `<session_id>:<request_id>`.
    pub id: String,
    /// Owning session.
    pub session_id: SessionId,
    /// Session-scoped id, unique within the session.
    pub request_id: String,
    /// What it is.
    pub kind: RequestKind,
    /// The ACP tool kind it was judged and shown as (`edit`, `execute`,
    /// ...), when known: an operator's "Remember" makes its rule for this
    /// kind, never for one the agent announces later.
    #[serde(default)]
    pub tool_kind: Option<String>,
    /// One-line summary for the operator.
    pub title: String,
    /// The command an execute permission runs (from its `rawInput`), whole:
    /// what rules judge. Surfaces show it apart from the title, which they
    /// cut, and say so when they cannot show all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// A unified diff when the request changes a file.
    pub diff: Option<String>,
    /// Files touched, when known.
    pub paths: Vec<String>,
    /// Buttons; for forwarded prompts: continue / refine / stop.
    pub options: Vec<PermissionOption>,
    /// Pending, decided, ...
    pub status: RequestStatus,
    /// Raw agent JSON-RPC id (as JSON) so a restarted server can answer it.
    pub wire_id: Option<String>,
    /// Unix milliseconds.
    pub created_at: i64,
}

impl PendingRequest {
    /// Builds the global id from its parts.
    pub fn global_id(session: &SessionId, request_id: &str) -> String {
        format!("{session}:{request_id}")
    }
}

/// What the operator chose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The option id chosen (an ACP option id, or continue/refine/stop).
    pub option_id: String,
    /// Whether that option allows the action.
    pub approved: bool,
    /// Free-text reason or refine instruction.
    pub reason: Option<String>,
    /// Who decided (Slack user id, `local`, `rule:<id>`).
    pub decided_by: String,
    /// Unix milliseconds.
    pub decided_at: i64,
}

/// A decision as the session recorded it, with the request it closed (as
/// stored: status `decided`), so a front end can show both without reading
/// the row back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The request, now decided.
    pub request: PendingRequest,
    /// What was decided.
    pub decision: Decision,
}

/// A steering message waiting for (or already given to) the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Steering {
    /// Storage id; increasing, so delivery order is id order.
    pub id: i64,
    /// Owning session.
    pub session_id: SessionId,
    /// The instruction.
    pub text: String,
    /// Who sent it.
    pub author: String,
    /// Unix milliseconds.
    pub created_at: i64,
}

/// Everything the store keeps about a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// Server id.
    pub id: SessionId,
    /// Workspace id (or the path, for ad-hoc path sessions).
    pub workspace: String,
    /// Directory the agent runs in.
    pub cwd: String,
    /// Agent profile id.
    pub agent: String,
    /// Wire protocol.
    pub protocol: Protocol,
    /// Lifecycle status.
    pub status: SessionStatus,
    /// Why it is in that status (idle_timeout, stderr tail, ...).
    pub status_reason: Option<String>,
    /// First 80 characters of the first prompt.
    pub title: String,
    /// The user who started it.
    pub owner: String,
    /// The agent's own session id (ACP), once known.
    pub acp_session_id: Option<String>,
    /// Slack channel, when the workspace has one.
    pub channel_id: Option<String>,
    /// Slack thread root ts, once posted (immutable after that).
    pub thread_ts: Option<String>,
    /// How many times the supervisor restarted the agent.
    pub restart_count: u32,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Unix milliseconds.
    pub updated_at: i64,
    /// Unix milliseconds of the last stream activity.
    pub last_activity_at: i64,
}

/// The `status_reason` of a session ended by idle timeout (`completed`).
pub const IDLE_TIMEOUT: &str = "idle_timeout";

/// The `status_reason` of a session a server shutdown stopped (`cancelled`).
pub const SERVER_SHUTDOWN: &str = "server_shutdown";

/// Whether a session that ended with `status` for `reason` ended without
/// anyone deciding it should: by idle timeout, a server shutdown, a crash
/// the restarts did not fix, an error, or a server restart it could not be
/// resumed from. The operator (or its owner) may bring such a session back
/// once the cause is fixed. A session someone stopped (`cancelled` by an
/// operator) stays stopped: that was a decision.
pub fn revivable_end(status: SessionStatus, reason: Option<&str>) -> bool {
    match status {
        SessionStatus::Completed => reason == Some(IDLE_TIMEOUT),
        SessionStatus::Cancelled => reason == Some(SERVER_SHUTDOWN),
        SessionStatus::Crashed | SessionStatus::Error | SessionStatus::Interrupted => true,
        SessionStatus::Starting | SessionStatus::Active | SessionStatus::Stalled => false,
    }
}

impl SessionRecord {
    /// Ended by idle timeout: a reply to it is a reason to bring it back.
    pub fn ended_by_idle_timeout(&self) -> bool {
        self.status == SessionStatus::Completed
            && self.status_reason.as_deref() == Some(IDLE_TIMEOUT)
    }

    /// Ended without anyone deciding it should ([`revivable_end`]), and run
    /// by an agent the server starts (an MCP client reconnects on its own).
    pub fn revivable(&self) -> bool {
        self.protocol != Protocol::Mcp && revivable_end(self.status, self.status_reason.as_deref())
    }
}

#[cfg(test)]
impl SessionRecord {
    /// A stored session for tests: `s-1`, ACP, active, owned by `U1`, in
    /// `/tmp`, run by `agent`.
    pub(crate) fn sample(agent: &str) -> SessionRecord {
        SessionRecord {
            id: SessionId::from("s-1"),
            workspace: "ws".into(),
            cwd: "/tmp".into(),
            agent: agent.into(),
            protocol: Protocol::Acp,
            status: SessionStatus::Active,
            status_reason: None,
            title: "t".into(),
            owner: "U1".into(),
            acp_session_id: None,
            channel_id: None,
            thread_ts: None,
            restart_count: 0,
            created_at: 0,
            updated_at: 0,
            last_activity_at: 0,
        }
    }
}

/// One transcript line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranscriptEntry {
    /// Storage id.
    pub id: i64,
    /// Who wrote it.
    pub role: Role,
    /// What it is.
    pub kind: MessageKind,
    /// Text, or JSON for plans and tool calls.
    pub content: String,
    /// Unix milliseconds.
    pub created_at: i64,
}

/// One audit line: who did what to which session, and what came of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// The session concerned, if any.
    pub session_id: Option<SessionId>,
    /// Who (user id, `local`, `system`, `rule:<id>`).
    pub actor: String,
    /// What happened, a short verb phrase: `permission.decided`, `session.crashed`, ...
    pub action: String,
    /// Details as JSON.
    pub detail: serde_json::Value,
}

/// Current time in Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// True for a prompt with nothing to say: only whitespace and quote
/// characters (`/intercom start ""` is an empty prompt, not a task of two
/// quote characters).
pub fn is_blank_prompt(text: &str) -> bool {
    text.chars().all(|c| {
        c.is_whitespace()
            || matches!(
                c,
                '"' | '\'' | '`' | '\u{201c}' | '\u{201d}' | '\u{2018}' | '\u{2019}'
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_end_nobody_decided_is_revivable() {
        use SessionStatus::*;
        let revivable = [
            (Completed, Some(IDLE_TIMEOUT)),
            (Cancelled, Some(SERVER_SHUTDOWN)),
            (Crashed, Some("agent exited (exit code 1)")),
            (Error, None),
            (Interrupted, Some("could not resume")),
        ];
        for (status, reason) in revivable {
            assert!(revivable_end(status, reason), "{status} {reason:?}");
        }
        let not = [
            (Cancelled, Some("stopped by operator")),
            (Cancelled, None),
            (Completed, Some("agent finished")),
            (Active, None),
            (Starting, Some("revived")),
            (Stalled, None),
        ];
        for (status, reason) in not {
            assert!(!revivable_end(status, reason), "{status} {reason:?}");
        }
        // An MCP client reconnects on its own: nothing to revive.
        let mcp = SessionRecord {
            protocol: Protocol::Mcp,
            status: Crashed,
            ..SessionRecord::sample("mcp")
        };
        assert!(!mcp.revivable());
    }

    fn option(name: &str, kind: OptionKind) -> PermissionOption {
        PermissionOption {
            id: "x".into(),
            name: name.into(),
            kind,
        }
    }

    #[test]
    fn a_label_shows_a_plain_name_as_written() {
        assert_eq!(
            option("Allow once", OptionKind::AllowOnce).label(),
            "Allow once"
        );
        assert_eq!(
            option("Always Allow", OptionKind::AllowAlways).label(),
            "Always Allow"
        );
        assert_eq!(option("Reject", OptionKind::RejectOnce).label(), "Reject");
        assert_eq!(
            option("Continue", OptionKind::AllowOnce).label(),
            "Continue"
        );
    }

    #[test]
    fn a_label_cannot_say_the_opposite_of_what_the_option_does() {
        assert_eq!(
            option("Reject", OptionKind::AllowAlways).label(),
            "Always allow: Reject"
        );
        assert_eq!(
            option("Allow", OptionKind::RejectOnce).label(),
            "Reject: Allow"
        );
        assert_eq!(
            option("Allow for this session", OptionKind::AllowAlways).label(),
            "Always allow: Allow for this session"
        );
        // Hidden characters do not make a name plain, and do not show.
        assert_eq!(
            option("Re\u{202e}ject\u{1b}", OptionKind::AllowOnce).label(),
            "Allow once: Reject"
        );
        assert_eq!(
            option("\u{200b}", OptionKind::AllowOnce).label(),
            "Allow once"
        );
        let long = option(&"x".repeat(500), OptionKind::RejectOnce).label();
        assert!(
            long.starts_with("Reject: xxx") && long.ends_with('…') && long.len() < 60,
            "{long}"
        );
    }

    #[test]
    fn an_option_is_serialized_with_its_label_and_read_back_without_it() {
        let o = option("Reject", OptionKind::AllowOnce);
        let v = serde_json::to_value(&o).expect("serialize");
        assert_eq!(v["label"], "Allow once: Reject");
        let back: PermissionOption = serde_json::from_value(v).expect("deserialize");
        assert_eq!(back, o);
    }

    #[test]
    fn status_names_round_trip() {
        for s in [
            SessionStatus::Starting,
            SessionStatus::Active,
            SessionStatus::Stalled,
            SessionStatus::Completed,
            SessionStatus::Cancelled,
            SessionStatus::Crashed,
            SessionStatus::Error,
            SessionStatus::Interrupted,
        ] {
            assert_eq!(SessionStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(SessionStatus::parse("bogus"), None);
    }

    #[test]
    fn generated_ids_differ() {
        assert_ne!(SessionId::generate(), SessionId::generate());
    }

    #[test]
    fn quotes_and_whitespace_are_a_blank_prompt() {
        for blank in ["", "  ", "\"\"", "''", " \" \" ", "\u{201c}\u{201d}", "``"] {
            assert!(super::is_blank_prompt(blank), "{blank:?}");
        }
        for real in ["x", "\"fix it\"", "it's"] {
            assert!(!super::is_blank_prompt(real), "{real:?}");
        }
    }
}
