//! Row shapes as SQLite returns them, and their conversion into model types.
//!
//! Why this exists: the model enums are stored as their lower-case names and
//! lists as JSON text, so every read goes through a `FromRow` struct of plain
//! columns and then a checked conversion. A value the code does not recognise
//! (a newer binary wrote it, or someone edited the file) becomes a
//! [`StoreError::Backend`] naming the column, never a panic.

use intercom_actors::model::{
    AuditEntry, Decision, MessageKind, PendingRequest, PermissionOption, Protocol, RequestKind,
    RequestStatus, Role, SessionId, SessionRecord, SessionStatus, Steering, TranscriptEntry,
};
use intercom_actors::ports::StoreError;

/// A decode failure for operation `op`.
fn bad(op: &'static str, message: String) -> StoreError {
    StoreError::Backend { op, message }
}

pub(crate) fn parse_protocol(s: &str) -> Option<Protocol> {
    Some(match s {
        "acp" => Protocol::Acp,
        "intercom" => Protocol::Intercom,
        "mcp" => Protocol::Mcp,
        _ => return None,
    })
}

pub(crate) fn parse_role(s: &str) -> Option<Role> {
    Some(match s {
        "user" => Role::User,
        "agent" => Role::Agent,
        "system" => Role::System,
        _ => return None,
    })
}

pub(crate) fn parse_message_kind(s: &str) -> Option<MessageKind> {
    Some(match s {
        "text" => MessageKind::Text,
        "plan" => MessageKind::Plan,
        "tool" => MessageKind::Tool,
        "error" => MessageKind::Error,
        "thought" => MessageKind::Thought,
        _ => return None,
    })
}

pub(crate) fn parse_request_kind(s: &str) -> Option<RequestKind> {
    Some(match s {
        "permission" => RequestKind::Permission,
        "file_write" => RequestKind::FileWrite,
        "forwarded_prompt" => RequestKind::ForwardedPrompt,
        _ => return None,
    })
}

/// `sessions` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SessionRow {
    pub id: String,
    pub workspace: String,
    pub cwd: String,
    pub agent: String,
    pub protocol: String,
    pub status: String,
    pub status_reason: Option<String>,
    pub title: String,
    pub owner: String,
    pub acp_session_id: Option<String>,
    pub channel_id: Option<String>,
    pub thread_ts: Option<String>,
    pub restart_count: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub last_activity_at: i64,
}

/// The column list matching [`SessionRow`], as a literal for `concat!`.
macro_rules! session_columns {
    () => {
        "id, workspace, cwd, agent, protocol, status, status_reason, title, owner, \
         acp_session_id, channel_id, thread_ts, restart_count, created_at, updated_at, \
         last_activity_at"
    };
}
pub(crate) use session_columns;

impl TryFrom<SessionRow> for SessionRecord {
    type Error = StoreError;

    fn try_from(r: SessionRow) -> Result<Self, StoreError> {
        const OP: &str = "decode session";
        let protocol = parse_protocol(&r.protocol).ok_or_else(|| {
            bad(
                OP,
                format!("session {} has unknown protocol {:?}", r.id, r.protocol),
            )
        })?;
        let status = SessionStatus::parse(&r.status).ok_or_else(|| {
            bad(
                OP,
                format!("session {} has unknown status {:?}", r.id, r.status),
            )
        })?;
        let restart_count = u32::try_from(r.restart_count).map_err(|_| {
            bad(
                OP,
                format!(
                    "session {} has invalid restart_count {}",
                    r.id, r.restart_count
                ),
            )
        })?;
        Ok(SessionRecord {
            id: SessionId(r.id),
            workspace: r.workspace,
            cwd: r.cwd,
            agent: r.agent,
            protocol,
            status,
            status_reason: r.status_reason,
            title: r.title,
            owner: r.owner,
            acp_session_id: r.acp_session_id,
            channel_id: r.channel_id,
            thread_ts: r.thread_ts,
            restart_count,
            created_at: r.created_at,
            updated_at: r.updated_at,
            last_activity_at: r.last_activity_at,
        })
    }
}

/// `messages` row (the columns a transcript needs).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct MessageRow {
    pub id: i64,
    pub role: String,
    pub kind: String,
    pub content: String,
    pub created_at: i64,
}

impl TryFrom<MessageRow> for TranscriptEntry {
    type Error = StoreError;

    fn try_from(r: MessageRow) -> Result<Self, StoreError> {
        const OP: &str = "decode transcript entry";
        let role = parse_role(&r.role).ok_or_else(|| {
            bad(
                OP,
                format!("message {} has unknown role {:?}", r.id, r.role),
            )
        })?;
        let kind = parse_message_kind(&r.kind).ok_or_else(|| {
            bad(
                OP,
                format!("message {} has unknown kind {:?}", r.id, r.kind),
            )
        })?;
        Ok(TranscriptEntry {
            id: r.id,
            role,
            kind,
            content: r.content,
            created_at: r.created_at,
        })
    }
}

/// `requests` row, decision columns included.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RequestRow {
    pub id: String,
    pub session_id: String,
    pub request_id: String,
    pub kind: String,
    pub title: String,
    pub diff: Option<String>,
    pub paths: String,
    pub options: String,
    pub status: String,
    pub wire_id: Option<String>,
    pub created_at: i64,
    pub option_id: Option<String>,
    pub approved: Option<bool>,
    pub reason: Option<String>,
    pub decided_by: Option<String>,
    pub decided_at: Option<i64>,
    pub tool_kind: Option<String>,
    pub command: Option<String>,
}

/// A [`RequestRow`] with its `rowid` (the approvals list's page key).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct KeyedRequestRow {
    pub seq: i64,
    #[sqlx(flatten)]
    pub row: RequestRow,
}

impl KeyedRequestRow {
    /// What the row weighs in a page: its agent-sized columns.
    pub(crate) fn size(&self) -> usize {
        let r = &self.row;
        r.title.len()
            + r.command.as_ref().map_or(0, String::len)
            + r.diff.as_ref().map_or(0, String::len)
            + r.paths.len()
            + r.options.len()
    }
}

/// The column list matching [`RequestRow`], as a literal for `concat!`.
macro_rules! request_columns {
    () => {
        "id, session_id, request_id, kind, title, diff, paths, options, status, wire_id, \
         created_at, option_id, approved, reason, decided_by, decided_at, tool_kind, command"
    };
}
pub(crate) use request_columns;

impl RequestRow {
    /// Splits the row into the request and, when one was recorded, its decision.
    pub(crate) fn into_parts(self) -> Result<(PendingRequest, Option<Decision>), StoreError> {
        const OP: &str = "decode request";
        let kind = parse_request_kind(&self.kind).ok_or_else(|| {
            bad(
                OP,
                format!("request {} has unknown kind {:?}", self.id, self.kind),
            )
        })?;
        let status = RequestStatus::parse(&self.status).ok_or_else(|| {
            bad(
                OP,
                format!("request {} has unknown status {:?}", self.id, self.status),
            )
        })?;
        let paths: Vec<String> = serde_json::from_str(&self.paths).map_err(|e| {
            bad(
                OP,
                format!("request {} has invalid paths JSON: {e}", self.id),
            )
        })?;
        let options: Vec<PermissionOption> = serde_json::from_str(&self.options).map_err(|e| {
            bad(
                OP,
                format!("request {} has invalid options JSON: {e}", self.id),
            )
        })?;
        let decision = match (
            self.option_id,
            self.approved,
            self.decided_by,
            self.decided_at,
        ) {
            (Some(option_id), Some(approved), Some(decided_by), Some(decided_at)) => {
                Some(Decision {
                    option_id,
                    approved,
                    reason: self.reason,
                    decided_by,
                    decided_at,
                })
            }
            _ => None,
        };
        Ok((
            PendingRequest {
                id: self.id,
                session_id: SessionId(self.session_id),
                request_id: self.request_id,
                kind,
                tool_kind: self.tool_kind,
                title: self.title,
                command: self.command,
                diff: self.diff,
                paths,
                options,
                status,
                wire_id: self.wire_id,
                created_at: self.created_at,
            },
            decision,
        ))
    }
}

/// `steering` row (the columns a [`Steering`] needs).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SteeringRow {
    pub id: i64,
    pub session_id: String,
    pub text: String,
    pub author: String,
    pub created_at: i64,
}

impl From<SteeringRow> for Steering {
    fn from(r: SteeringRow) -> Self {
        Steering {
            id: r.id,
            session_id: SessionId(r.session_id),
            text: r.text,
            author: r.author,
            created_at: r.created_at,
        }
    }
}

/// `audit` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct AuditRow {
    pub id: i64,
    pub at: i64,
    pub session_id: Option<String>,
    pub actor: String,
    pub action: String,
    pub detail: String,
}

impl AuditRow {
    /// The timestamp and the entry.
    pub(crate) fn into_entry(self) -> Result<(i64, AuditEntry), StoreError> {
        let detail = serde_json::from_str(&self.detail).map_err(|e| {
            bad(
                "decode audit entry",
                format!("audit entry {} has invalid detail JSON: {e}", self.id),
            )
        })?;
        Ok((
            self.at,
            AuditEntry {
                session_id: self.session_id.map(SessionId),
                actor: self.actor,
                action: self.action,
                detail,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_parse_back() {
        for p in [Protocol::Acp, Protocol::Intercom, Protocol::Mcp] {
            assert_eq!(parse_protocol(p.as_str()), Some(p));
        }
        for r in [Role::User, Role::Agent, Role::System] {
            assert_eq!(parse_role(r.as_str()), Some(r));
        }
        for k in [
            MessageKind::Text,
            MessageKind::Plan,
            MessageKind::Tool,
            MessageKind::Error,
            MessageKind::Thought,
        ] {
            assert_eq!(parse_message_kind(k.as_str()), Some(k));
        }
        for k in [
            RequestKind::Permission,
            RequestKind::FileWrite,
            RequestKind::ForwardedPrompt,
        ] {
            assert_eq!(parse_request_kind(k.as_str()), Some(k));
        }
        assert_eq!(parse_protocol("bogus"), None);
    }

    #[test]
    fn unknown_status_is_a_backend_error_not_a_panic() {
        let row = SessionRow {
            id: "s-1".into(),
            workspace: "w".into(),
            cwd: "/".into(),
            agent: "a".into(),
            protocol: "acp".into(),
            status: "exploded".into(),
            status_reason: None,
            title: String::new(),
            owner: "u".into(),
            acp_session_id: None,
            channel_id: None,
            thread_ts: None,
            restart_count: 0,
            created_at: 0,
            updated_at: 0,
            last_activity_at: 0,
        };
        let err = SessionRecord::try_from(row).expect_err("must fail");
        assert!(matches!(
            err,
            StoreError::Backend {
                op: "decode session",
                ..
            }
        ));
    }
}
