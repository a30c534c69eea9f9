//! Which sessions a call may name besides its own.
//!
//! Two kinds of callers reach `/mcp`. An IDE client (operator token or
//! workspace MCP token) may name the sessions of its workspace: a client
//! that reconnected (a new MCP session) picks up what its earlier session
//! left (`reboot {session_id}`, `check_diff` of an earlier approval). An ACP
//! agent holding its session's bridge token is untrusted and is confined to
//! that one session: naming another session, or another session's request,
//! is refused with [`OtherSession`] and audited as `action.denied`.

use intercom_actors::model::{SessionId, SessionRecord};
use serde_json::json;

use super::{Fail, IntercomMcp, Target};

/// How far a caller reaches beyond the session it acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reach {
    /// An ACP agent's bridge token: its own session only.
    OwnSession,
    /// An IDE client: the sessions of its workspace too (the tools check
    /// the workspace themselves).
    Workspace,
}

/// A bridge token named a session other than its own.
#[derive(Debug, thiserror::Error)]
#[error(
    "this token belongs to session {own}; it cannot act on session {named}. A bridge token reaches only its own session's steering, requests and clearances: omit session_id, or pass a request_id your own check_clearance returned"
)]
pub(super) struct OtherSession {
    /// The session behind the token.
    own: SessionId,
    /// The session the call named.
    named: SessionId,
}

impl From<OtherSession> for Fail {
    fn from(e: OtherSession) -> Self {
        Fail::refused("other_session", e.to_string())
    }
}

impl Reach {
    /// Refuses when a caller acting on session `own` may not name session
    /// `named`: a bridge token may name only its own session. IDE callers
    /// pass (the tool checks their workspace).
    fn allows(self, own: &SessionId, named: &SessionId) -> Result<(), OtherSession> {
        if self == Reach::Workspace || named == own {
            return Ok(());
        }
        Err(OtherSession {
            own: own.clone(),
            named: named.clone(),
        })
    }
}

/// Whether a caller whose session is in workspace `own` may reach a session
/// of workspace `other` (an IDE client picking up what its earlier session
/// left): the same workspace, and a real one. An empty workspace (a
/// local-only session, or one whose workspace a reload removed) matches
/// nothing, not even another empty one, so such callers reach only their
/// own session.
pub(super) fn same_workspace(own: &str, other: &str) -> bool {
    !own.is_empty() && own == other
}

/// Why an IDE client on session `own` may not name session `other`, if it
/// may not: another workspace, an agent's session (not an MCP client's), or
/// one another credential opened. A probe's client on a workspace's MCP
/// token read the steering queued for the operator's own MCP session, and
/// applied an ACP agent's approved clearance before the agent could.
pub(super) fn may_name(own: &SessionRecord, other: &SessionRecord) -> Result<(), &'static str> {
    if !same_workspace(&own.workspace, &other.workspace) {
        return Err("lies in another workspace than this connection's");
    }
    if other.protocol != intercom_actors::model::Protocol::Mcp {
        return Err("is an agent's, not an MCP client's");
    }
    if other.owner != own.owner {
        return Err("was opened with another credential");
    }
    Ok(())
}

impl IntercomMcp {
    /// Refuses a bridge-token call naming session `named` when it is not
    /// the caller's own, auditing the refusal as `action.denied` on the
    /// caller's session.
    pub(super) async fn ensure_reach(
        &self,
        t: &Target,
        tool: &'static str,
        named: &SessionId,
        request_id: Option<&str>,
    ) -> Result<(), Fail> {
        let Err(refusal) = t.reach.allows(&t.id, named) else {
            return Ok(());
        };
        tracing::warn!(session = %t.id, named = %named, tool, "bridge token named another session; refused");
        let detail = json!({
            "action": format!("mcp.{tool}"),
            "named_session": named,
            "request_id": request_id,
            "why": "a bridge token acts on its own session only",
        });
        self.audit_agent(t, "action.denied", detail).await;
        Err(refusal.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bridge_token_names_only_its_own_session() {
        let (own, other) = (SessionId::from("s-own"), SessionId::from("s-other"));
        assert!(Reach::OwnSession.allows(&own, &own).is_ok());
        let text = match Reach::OwnSession.allows(&own, &other) {
            Err(e) => e.to_string(),
            Ok(()) => panic!("another session must be refused"),
        };
        assert!(
            text.starts_with(
                "this token belongs to session s-own; it cannot act on session s-other"
            ),
            "{text}"
        );
        assert!(text.contains("omit session_id"), "{text}");
    }

    #[test]
    fn an_empty_workspace_matches_no_other() {
        assert!(same_workspace("ws", "ws"));
        assert!(!same_workspace("ws", "other"));
        assert!(!same_workspace("", ""));
        assert!(!same_workspace("", "ws"));
        assert!(!same_workspace("ws", ""));
    }

    #[test]
    fn an_ide_client_is_left_to_the_workspace_check() {
        let (own, other) = (SessionId::from("s-own"), SessionId::from("s-other"));
        assert!(Reach::Workspace.allows(&own, &other).is_ok());
        assert!(Reach::Workspace.allows(&own, &own).is_ok());
    }
}
