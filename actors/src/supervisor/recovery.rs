//! Sessions that outlive a process: after a server restart, the ones
//! stored as live are resumed (or marked interrupted, saying why), and a
//! session ended by idle timeout can be revived on request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::RpcReplyPort;
use serde_json::json;
use tokio::sync::oneshot;

use super::restarts::RestartPlan;
use super::{Entry, SupervisorError, SupervisorState, threads};
use crate::model::{AuditEntry, Protocol, SessionId, SessionRecord, SessionStatus};
use crate::ports::{NoticeLevel, SessionStore};
use crate::session::{Caller, StartError, StartMode};
use crate::settings::AgentProfile;

/// The longest recovery waits for the previous server's agents to die.
const ORPHANS_GONE: Duration = Duration::from_secs(2);

/// The agent profile a session stored as live resumes with, or why it
/// cannot resume.
fn resumable_with(rec: &SessionRecord, profiles: &[AgentProfile]) -> Result<AgentProfile, String> {
    if rec.protocol == Protocol::Mcp {
        return Err(
            "its MCP client's connection ended with the old server; the client reconnects on its own, as a new session"
                .to_owned(),
        );
    }
    let profile = profiles
        .iter()
        .find(|p| p.id == rec.agent)
        .cloned()
        .ok_or_else(|| format!("its agent profile `{}` is no longer configured", rec.agent))?;
    match rec.protocol {
        Protocol::Acp if rec.acp_session_id.is_none() => {
            Err("the agent had not given it a session id to load".to_owned())
        }
        Protocol::Acp | Protocol::Intercom | Protocol::Mcp => Ok(profile),
    }
}

impl SupervisorState {
    /// After a server restart: resumes each session stored as live, or marks
    /// it interrupted when it cannot be; (resumed, interrupted).
    pub(super) async fn recover(&mut self, profiles: Vec<AgentProfile>) -> (usize, usize) {
        let live = match self.args.store.list_sessions(true).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("recovery could not list sessions: {e}");
                return (0, 0);
            }
        };
        self.end_orphan_groups(&live).await;
        let (mut resumed, mut interrupted) = (0, 0);
        for rec in live {
            if self.recover_one(rec, &profiles).await {
                resumed += 1;
            } else {
                interrupted += 1;
            }
        }
        (resumed, interrupted)
    }

    /// One session stored as live: true when its agent runs again.
    async fn recover_one(&mut self, rec: SessionRecord, profiles: &[AgentProfile]) -> bool {
        let id = rec.id.clone();
        // The agent process died with the old server: its open requests
        // cannot be answered any more. Say so explicitly.
        let expired = self.expire_open_requests(&id).await;
        let profile = match resumable_with(&rec, profiles) {
            Ok(profile) => profile,
            Err(why) => {
                let reason = format!("server restarted; the session could not be resumed: {why}");
                tracing::warn!(session = %id, "{reason}");
                self.sessions.insert(id.clone(), placeholder_entry(&rec));
                let mut text =
                    format!("The server restarted; this session could not be resumed: {why}.");
                if !expired.is_empty() {
                    text.push_str(&format!(
                        " Its open request {} expired.",
                        expired.join(", ")
                    ));
                }
                self.notice_kept(&id, NoticeLevel::Warning, text).await;
                self.end_session(&id, SessionStatus::Interrupted, &reason)
                    .await;
                return false;
            }
        };
        // An agent that was waiting on a request was mid-turn: once resumed
        // it is asked to continue (as after a crash), not left idle.
        let plan = RestartPlan {
            resume: rec.acp_session_id.clone(),
            reprompt: None,
            mid_turn: !expired.is_empty(),
            require_resume: rec.protocol == Protocol::Acp,
        };
        let entry = Entry::recovering(profile, rec.restart_count, plan);
        self.sessions.insert(id.clone(), entry);
        if let (Some(ch), Some(ts)) = (&rec.channel_id, &rec.thread_ts) {
            threads::posted(&self.myself, &id, ch, ts);
        }
        let text = if expired.is_empty() {
            "The server restarted; resuming this session.".to_owned()
        } else {
            format!(
                "The server restarted; resuming this session. Its open request {} expired (the agent that asked is gone); the agent is asked to continue its turn.",
                expired.join(", ")
            )
        };
        self.notice_kept(&id, NoticeLevel::Info, text).await;
        self.restart(id.clone()).await;
        self.sessions.get(&id).is_some_and(|e| e.actor.is_some())
    }

    /// The old server died with its agents still running (SIGKILL, or a
    /// second signal): their process groups are orphans now. Kills them all,
    /// then waits (at most [`ORPHANS_GONE`] in all, not per session) until
    /// none has a member left that is not a zombie, before anything is
    /// respawned. Zombies count as gone: they hold nothing, and an init that
    /// does not reap them (some containers') would otherwise hold every
    /// session's wait to the deadline: 50 sessions once kept the restarted
    /// server from answering for 100 s.
    async fn end_orphan_groups(&self, live: &[SessionRecord]) {
        let store = &self.args.store;
        let mut killed = Vec::new();
        for rec in live {
            let Ok(Some((pid, start))) = store.agent_process(&rec.id).await else {
                continue;
            };
            if crate::child::kill_orphan_group(pid, start) {
                tracing::warn!(session = %rec.id, pid, "killed the agent process group left by the previous server");
                killed.push(pid);
            }
            let _ = store.set_agent_process(&rec.id, None).await;
        }
        let deadline = Instant::now() + ORPHANS_GONE;
        while !killed.is_empty() && Instant::now() < deadline {
            let groups = killed.clone();
            killed = tokio::task::spawn_blocking(move || {
                crate::process_tree::groups_with_running_members(&groups)
            })
            .await
            .unwrap_or_default();
            if !killed.is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    /// Brings back a session ended by idle timeout: its agent respawned in
    /// the same session, resumed with `session/load` where supported.
    pub(super) async fn revive(
        &mut self,
        id: SessionId,
        profile: AgentProfile,
        caller: Caller,
        reply: RpcReplyPort<Result<SessionRecord, SupervisorError>>,
    ) {
        let record = match self.revivable(&id, &caller).await {
            Ok(record) => record,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let store = self.args.store.clone();
        let _ = store
            .set_status(&id, SessionStatus::Starting, Some("revived"))
            .await;
        // Brought back on purpose: it comes back working, not paused.
        if let Err(e) = store.set_paused(&id, false).await {
            tracing::warn!(session = %id, "clearing the pause of a revived session: {e}");
        }
        let start = StartMode::Restart {
            resume: record.acp_session_id.clone(),
            reprompt: None,
            was_mid_turn: false,
            require_resume: false,
            revived: true,
        };
        let (tx, rx) = oneshot::channel();
        let mut fresh = record.clone();
        fresh.status = SessionStatus::Starting;
        match self
            .spawn_session(fresh, profile.clone(), start, Some(tx))
            .await
        {
            Ok(actor) => {
                let entry = Entry {
                    reviving: true,
                    ..Entry::revived(actor, profile, record.restart_count)
                };
                self.sessions.insert(id.clone(), entry);
                if let (Some(ch), Some(ts)) = (&record.channel_id, &record.thread_ts) {
                    threads::posted(&self.myself, &id, ch, ts);
                }
                answer_when_revived(store, record, rx, reply, caller.id);
            }
            Err(err) => {
                let _ = store
                    .set_status(
                        &id,
                        SessionStatus::Completed,
                        Some(crate::model::IDLE_TIMEOUT),
                    )
                    .await;
                revive_audit(&*store, &id, &caller.id, Some(&err.to_string())).await;
                let _ = reply.send(Err(SupervisorError::StartFailed(err)));
            }
        }
    }

    /// The stored record of a session `caller` may revive now, or why not.
    async fn revivable(
        &self,
        id: &SessionId,
        caller: &Caller,
    ) -> Result<SessionRecord, SupervisorError> {
        let refuse = |why: String| Err(SupervisorError::NotRevivable(why));
        if self.shutdown.is_some() {
            return Err(SupervisorError::ShuttingDown);
        }
        if self.sessions.contains_key(id) {
            return refuse(format!(
                "session {id} is still live; a session comes back only once it has ended by idle timeout (one ending now can be revived when it has ended)"
            ));
        }
        let record = match self.args.store.get_session(id).await {
            Ok(Some(r)) => r,
            Ok(None) => return refuse(format!("no session {id}")),
            Err(e) => return Err(SupervisorError::Storage(e.to_string())),
        };
        if !record.ended_by_idle_timeout() {
            return refuse(format!(
                "session {id} is {} ({}); only sessions ended by idle timeout come back — start a new one",
                record.status,
                record.status_reason.as_deref().unwrap_or("no reason")
            ));
        }
        let allowed = caller.operator
            || caller.id == record.owner
            || self.args.settings.operators.contains(&caller.id);
        if !allowed {
            return Err(SupervisorError::Unauthorized {
                user: caller.id.clone(),
                session: id.clone(),
                owner: record.owner,
            });
        }
        let max = self.args.settings.limits.max_sessions;
        if self.agent_sessions() >= max {
            return Err(SupervisorError::LimitReached { max });
        }
        Ok(record)
    }
}

/// The entry of a stored session that has no agent profile any more (or
/// cannot be resumed): enough to end it through the usual path.
pub(super) fn placeholder_entry(rec: &SessionRecord) -> Entry {
    Entry {
        actor: None,
        profile: placeholder_profile(rec),
        restarts: Vec::new(),
        total_restarts: rec.restart_count,
        plan: None,
        recovering: true,
        first_start: false,
        reviving: false,
    }
}

/// The profile of a session that runs no configured agent (an MCP client,
/// or a stored session whose agent is gone from the config): its id and
/// protocol, nothing to run.
pub(super) fn placeholder_profile(rec: &SessionRecord) -> AgentProfile {
    AgentProfile {
        id: rec.agent.clone(),
        command: String::new(),
        args: vec![],
        env: vec![],
        protocol: rec.protocol,
        framing: Default::default(),
        auth_method: None,
    }
}

/// Answers a revive once its agent is ready (or why it is not), and audits
/// the outcome in the reviver's name: a revive that failed is not recorded
/// as one that happened.
fn answer_when_revived(
    store: Arc<dyn SessionStore>,
    record: SessionRecord,
    ready: oneshot::Receiver<Result<(), StartError>>,
    reply: RpcReplyPort<Result<SessionRecord, SupervisorError>>,
    by: String,
) {
    tokio::spawn(async move {
        let id = record.id.clone();
        let outcome = super::starting::when_ready(&*store, record, ready).await;
        let failed = outcome.as_ref().err().map(ToString::to_string);
        revive_audit(&*store, &id, &by, failed.as_deref()).await;
        let _ = reply.send(outcome);
    });
}

/// `session.revived`, or `session.revive_failed` with why it `failed`, by
/// `by`.
async fn revive_audit(store: &dyn SessionStore, id: &SessionId, by: &str, failed: Option<&str>) {
    let (action, detail) = match failed {
        None => ("session.revived", json!({})),
        Some(why) => ("session.revive_failed", json!({"error": why})),
    };
    let entry = AuditEntry {
        session_id: Some(id.clone()),
        actor: by.to_owned(),
        action: action.to_owned(),
        detail,
    };
    if let Err(e) = store.audit(&entry).await {
        tracing::error!(session = %id, "audit write failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(agent: &str, protocol: Protocol, acp_session_id: Option<&str>) -> SessionRecord {
        SessionRecord {
            protocol,
            acp_session_id: acp_session_id.map(str::to_owned),
            ..SessionRecord::sample(agent)
        }
    }

    /// An MCP session never had an agent profile: the reason says its client
    /// reconnects, not that a profile `mcp` is missing from the config (a
    /// probe was sent to fix the config for nothing).
    #[test]
    fn each_session_that_cannot_resume_says_why_in_its_own_terms() {
        let why = resumable_with(&stored("mcp", Protocol::Mcp, None), &[]).unwrap_err();
        assert!(why.contains("MCP client"), "{why}");
        assert!(!why.contains("configured"), "{why}");
        let why = resumable_with(&stored("gone", Protocol::Acp, Some("a1")), &[]).unwrap_err();
        assert!(why.contains("`gone` is no longer configured"), "{why}");
    }
}
