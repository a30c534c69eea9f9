//! Sessions that outlive a process: after a server restart, the ones
//! stored as live are resumed (or marked interrupted, saying why), and a
//! session that ended without anyone stopping it (idle timeout, a server
//! shutdown, a crash the restarts did not fix, an interruption) can be
//! revived on request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::RpcReplyPort;
use serde_json::json;
use tokio::sync::oneshot;

use super::restarts::RestartPlan;
use super::{Entry, PriorEnd, SupervisorError, SupervisorState, threads};
use crate::model::{
    AuditEntry, MessageKind, Protocol, Role, SessionId, SessionRecord, SessionStatus,
};
use crate::ports::{NoticeLevel, SessionStore};
use crate::registry::WorkspaceMap;
use crate::session::{Caller, StartError, StartMode};
use crate::settings::AgentProfile;
use crate::transcript::{Anchor, TranscriptPage};

/// The notice of a revive that brought a paused session back working.
const REVIVE_LIFTS_PAUSE: &str =
    "It was paused when it ended; the revive lifted the pause, so steering is delivered again";

/// The longest recovery waits for the previous server's agents to die.
const ORPHANS_GONE: Duration = Duration::from_secs(2);

/// The agent profile a session stored as live resumes with, or why it
/// cannot resume. The current config decides, as for a revive: the
/// session's workspace must still be configured and its directory still in
/// it (under the current `workspace_root`), and its agent profile still
/// exist; an agent is never started where the operator no longer allows.
fn resumable_with(rec: &SessionRecord, map: &WorkspaceMap) -> Result<AgentProfile, String> {
    if rec.protocol == Protocol::Mcp {
        return Err(
            "its MCP client's connection ended with the old server; the client reconnects on its own, as a new session"
                .to_owned(),
        );
    }
    // `starting` is also the status between crash restarts; a session that
    // never started has neither restarts nor an agent session id.
    let never_started = rec.status == SessionStatus::Starting
        && rec.restart_count == 0
        && rec.acp_session_id.is_none();
    if never_started {
        return Err(
            "the server stopped before its agent was ready; the session never started".to_owned(),
        );
    }
    let profile = map.revivable(rec)?;
    if rec.protocol == Protocol::Acp && rec.acp_session_id.is_none() {
        return Err("the agent had not given it a session id to load".to_owned());
    }
    Ok(profile)
}

/// Transcript pages read back for an intercom session's last prompt.
const PROMPT_PAGES: usize = 50;

impl SupervisorState {
    /// After a server restart: resumes each session stored as live, or marks
    /// it interrupted when it cannot be; (resumed, interrupted).
    pub(super) async fn recover(&mut self, map: WorkspaceMap) -> (usize, usize) {
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
            if self.recover_one(rec, &map).await {
                resumed += 1;
            } else {
                interrupted += 1;
            }
        }
        (resumed, interrupted)
    }

    /// One session stored as live: true when its agent runs again.
    async fn recover_one(&mut self, rec: SessionRecord, map: &WorkspaceMap) -> bool {
        let id = rec.id.clone();
        // The agent process died with the old server: its open requests
        // cannot be answered any more. Say so explicitly.
        let expired = self.expire_open_requests(&id).await;
        let profile = match resumable_with(&rec, map) {
            Ok(profile) => profile,
            Err(why) => {
                self.end_unresumable(&rec, &why, &expired).await;
                return false;
            }
        };
        let plan = self.restart_plan(&rec, &expired).await;
        let given_again = rec.protocol == Protocol::Intercom && plan.reprompt.is_some();
        let mid_turn = plan.mid_turn;
        let entry = Entry::recovering(profile, rec.restart_count, plan);
        self.sessions.insert(id.clone(), entry);
        if let (Some(ch), Some(ts)) = (&rec.channel_id, &rec.thread_ts) {
            threads::posted(&self.myself, &id, ch, ts);
        }
        let text = if given_again {
            format!(
                "The server restarted; resuming this session: the agent (intercom dialect, which has no session to resume) is given its last prompt again.{}",
                expired_clause(&expired)
            )
        } else {
            self.resume_notice(&id, mid_turn, &expired).await
        };
        self.notice_kept(&id, NoticeLevel::Info, text).await;
        self.restart(id.clone()).await;
        self.sessions.get(&id).is_some_and(|e| e.actor.is_some())
    }

    /// A live session whose workspace or agent is gone (or that cannot be
    /// resumed for another reason): told why, and ended as interrupted.
    async fn end_unresumable(&mut self, rec: &SessionRecord, why: &str, expired: &[String]) {
        let id = &rec.id;
        let reason = format!("server restarted; the session could not be resumed: {why}");
        tracing::warn!(session = %id, "{reason}");
        self.sessions.insert(id.clone(), placeholder_entry(rec));
        let text = format!(
            "The server restarted; this session could not be resumed: {why}.{}",
            expired_clause(expired)
        );
        self.notice_kept(id, NoticeLevel::Warning, text).await;
        self.end_session(id, SessionStatus::Interrupted, &reason)
            .await;
    }

    /// How a recovered session is brought back: resumed where the agent was,
    /// asked to continue a cut turn, or (intercom) given its last prompt.
    async fn restart_plan(&mut self, rec: &SessionRecord, expired: &[String]) -> RestartPlan {
        let id = &rec.id;
        // An agent that was in a turn (waiting on a request, or working
        // after one was answered) was cut: once resumed it is asked to
        // continue (as after a crash), not left idle.
        let turn_cut = self.turn_was_cut(id).await;
        // The intercom dialect has no turns and no session to load: its
        // agent works on its last prompt until stopped, so the fresh agent
        // is given that prompt again, as after a crash. It was given
        // nothing, while the transcript said it was asked to continue.
        // An ACP agent in a turn gets the turn's prompt too, used only when
        // it cannot load its session and starts a fresh one (a resumed one
        // is told to continue): its first task was lost that way. Only a
        // turn stored as running counts: a request the agent made after its
        // turn ended, expired now, gave a finished task again.
        let reprompt = if rec.protocol == Protocol::Intercom || turn_cut {
            self.last_prompt(id).await
        } else {
            None
        };
        let mid_turn = turn_cut || !expired.is_empty() || reprompt.is_some();
        RestartPlan {
            resume: rec.acp_session_id.clone(),
            reprompt,
            mid_turn,
            require_resume: rec.protocol == Protocol::Acp,
            budget: None,
        }
    }

    /// What a resumed ACP session is told: what becomes of its cut turn, its
    /// queued steering and its pause.
    async fn resume_notice(
        &mut self,
        id: &SessionId,
        mid_turn: bool,
        expired: &[String],
    ) -> String {
        // Queued steering goes first once resumed, instead of asking the
        // agent to continue (the session's start delivers it).
        let queued = match self.args.store.undelivered_steering(id).await {
            Ok(q) => q.len(),
            Err(e) => {
                tracing::warn!(session = %id, "cannot read queued steering: {e}");
                0
            }
        };
        // Said before the resume is tried: a resume that fails says so
        // in a notice of its own ("Not delivered: ...").
        let paused = self.args.store.is_paused(id).await.unwrap_or(false);
        let then = if paused && queued > 0 {
            format!(
                "its {queued} queued instruction(s) stay held: it is paused, so they are delivered once someone resumes it"
            )
        } else if paused {
            "it stays paused: its turn is continued once someone resumes it".to_owned()
        } else if queued > 0 {
            format!("its {queued} queued instruction(s) are delivered once it is back")
        } else {
            "once it is back, the agent is asked to continue its turn".to_owned()
        };
        if expired.is_empty() && mid_turn {
            format!(
                "The server restarted during the agent's turn; resuming this session, and {then}. What the agent wrote in its last moment before the restart may be missing above (text is stored within a second)."
            )
        } else if expired.is_empty() && queued > 0 {
            format!("The server restarted; resuming this session, and {then}.")
        } else if expired.is_empty() {
            "The server restarted; resuming this session.".to_owned()
        } else {
            format!(
                "The server restarted; resuming this session. Its open request {} expired (the agent that asked is gone); {then}.",
                expired.join(", ")
            )
        }
    }

    /// The newest prompt the session's transcript holds (the operator's or
    /// a steering message), looked for page by page back from the newest
    /// (a busy agent's 1,100 status lines hid it from the newest page), at
    /// most [`PROMPT_PAGES`] pages.
    async fn last_prompt(&self, id: &SessionId) -> Option<String> {
        let mut page = TranscriptPage::LATEST;
        for _ in 0..PROMPT_PAGES {
            let slice = match self.args.store.transcript_page(id, page).await {
                Ok(slice) => slice,
                Err(e) => {
                    tracing::warn!(session = %id, "cannot read the last prompt to give again: {e}");
                    return None;
                }
            };
            if let Some(found) = slice
                .entries
                .iter()
                .rev()
                .find(|m| m.role == Role::User && m.kind == MessageKind::Text)
            {
                return Some(found.content.clone());
            }
            let oldest = slice.entries.first()?;
            if !slice.more {
                return None;
            }
            page = TranscriptPage {
                anchor: Anchor::Before(oldest.id),
                ..TranscriptPage::LATEST
            };
        }
        None
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

    /// Brings back a session that ended without anyone stopping it: its
    /// agent respawned in the same session with the profile as configured
    /// now, resumed with `session/load` where supported, its queued
    /// steering delivered. A fresh restart budget comes with it.
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
        self.lift_pause(&id, &caller).await;
        // A turn the end cut short (a crash, a shutdown) is continued, or its
        // prompt given again to a fresh agent: it was neither, and the stored
        // "in a turn" made a later recovery resume work nobody had asked for
        // any more.
        let turn_cut = self.turn_was_cut(&id).await;
        let reprompt = if turn_cut {
            self.last_prompt(&id).await
        } else {
            None
        };
        let start = StartMode::Restart {
            resume: record.acp_session_id.clone(),
            reprompt,
            was_mid_turn: turn_cut,
            require_resume: false,
            revived: true,
            // An operator brought it back: a new budget.
            budget: None,
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
                    reviving: Some(PriorEnd::of(&record)),
                    ..Entry::revived(actor, profile, record.restart_count)
                };
                self.sessions.insert(id.clone(), entry);
                if let (Some(ch), Some(ts)) = (&record.channel_id, &record.thread_ts) {
                    threads::posted(&self.myself, &id, ch, ts);
                }
                answer_when_revived(store, record, rx, reply, caller.id);
            }
            Err(err) => {
                // Ends as it had ended: it can be revived once fixed.
                let _ = store
                    .set_status(&id, record.status, record.status_reason.as_deref())
                    .await;
                revive_audit(&*store, &id, &caller.id, Some(&err.to_string())).await;
                let _ = reply.send(Err(SupervisorError::StartFailed(err)));
            }
        }
    }

    /// A session brought back on purpose comes back working, not paused,
    /// and whoever paused it reads that the pause was lifted.
    async fn lift_pause(&self, id: &SessionId, caller: &Caller) {
        let store = &self.args.store;
        if !store.is_paused(id).await.unwrap_or(false) {
            return;
        }
        match store.set_paused(id, false).await {
            Ok(()) => {
                let text = format!("{REVIVE_LIFTS_PAUSE} (by {}).", caller.id);
                self.notice_kept(id, NoticeLevel::Info, text).await;
            }
            Err(e) => {
                tracing::warn!(session = %id, "clearing the pause of a revived session: {e}");
            }
        }
    }

    /// Whether the session's agent was in a turn when it went (stored as
    /// each turn starts and ends); false when the store cannot say.
    async fn turn_was_cut(&self, id: &SessionId) -> bool {
        match self.args.store.turn_was_running(id).await {
            Ok(running) => running,
            Err(e) => {
                tracing::warn!(session = %id, "cannot tell whether a turn was running: {e}");
                false
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
        // A revive's entry stays marked until the session next exits: it is
        // under way only while the stored session is still starting.
        let under_way = self.sessions.get(id).is_some_and(|e| e.reviving.is_some())
            && matches!(
                self.args.store.get_session(id).await,
                Ok(Some(r)) if r.status == SessionStatus::Starting
            );
        if under_way {
            return refuse(format!(
                "a revive of session {id} is already under way; wait for it (GET /api/sessions/{id})"
            ));
        }
        if self.sessions.contains_key(id) {
            return refuse(format!(
                "session {id} is still live; a session comes back only once it has ended (one ending now can be revived when it has ended)"
            ));
        }
        let record = match self.args.store.get_session(id).await {
            Ok(Some(r)) => r,
            Ok(None) => return refuse(format!("no session {id}")),
            Err(e) => return Err(SupervisorError::Storage(e.to_string())),
        };
        if record.protocol == Protocol::Mcp {
            return refuse(format!(
                "session {id} was an MCP client's; it is not revived: its client (the IDE) reconnects on its own, as a new session"
            ));
        }
        if !record.revivable() {
            return refuse(format!(
                "session {id} is {} ({}); a session someone stopped stays stopped (only one that ended by idle timeout or a server shutdown, crashed, failed or was interrupted comes back) — start a new one",
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
        reviving: None,
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

/// " Its open request req-1, req-2 expired." when any did, else nothing.
fn expired_clause(expired: &[String]) -> String {
    if expired.is_empty() {
        String::new()
    } else {
        format!(" Its open request {} expired.", expired.join(", "))
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
    fn map(root: &std::path::Path) -> WorkspaceMap {
        WorkspaceMap {
            workspace_root: root.to_path_buf(),
            workspaces: vec![crate::settings::WorkspaceEntry {
                id: "ws".into(),
                path: root.join("ws"),
                channel_id: String::new(),
                label: None,
                default_agent: None,
            }],
            agents: vec![placeholder_profile(&stored("a", Protocol::Acp, None))],
            default_agent: Some("a".into()),
        }
    }

    #[test]
    fn each_session_that_cannot_resume_says_why_in_its_own_terms() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        std::fs::create_dir(root.join("ws")).expect("ws");
        let m = map(&root);
        let here = |agent: &str, protocol, acp: Option<&str>| SessionRecord {
            cwd: root.join("ws").display().to_string(),
            ..stored(agent, protocol, acp)
        };
        let why = resumable_with(&here("mcp", Protocol::Mcp, None), &m).unwrap_err();
        assert!(why.contains("MCP client"), "{why}");
        assert!(!why.contains("configured"), "{why}");
        let why = resumable_with(&here("gone", Protocol::Acp, Some("a1")), &m).unwrap_err();
        assert!(why.contains("`gone` is no longer configured"), "{why}");
        assert!(resumable_with(&here("a", Protocol::Acp, Some("a1")), &m).is_ok());
        let why = resumable_with(&here("a", Protocol::Acp, None), &m).unwrap_err();
        assert!(why.contains("session id"), "{why}");
        let starting = SessionRecord {
            status: SessionStatus::Starting,
            ..here("a", Protocol::Acp, None)
        };
        let why = resumable_with(&starting, &m).unwrap_err();
        assert!(why.contains("never started"), "{why}");
    }

    /// An agent is never started again where the current config no longer
    /// allows: a workspace removed, or a directory outside it (a probe had
    /// agents resumed under an old `workspace_root`).
    #[test]
    fn a_session_outside_the_current_config_is_not_resumed() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().canonicalize().expect("canon");
        std::fs::create_dir_all(root.join("ws")).expect("ws");
        std::fs::create_dir_all(root.join("old")).expect("old");
        let m = map(&root);
        let removed = SessionRecord {
            workspace: "gone".into(),
            cwd: root.join("old").display().to_string(),
            ..stored("a", Protocol::Acp, Some("a1"))
        };
        let why = resumable_with(&removed, &m).unwrap_err();
        assert!(
            why.contains("workspace `gone` is no longer configured"),
            "{why}"
        );
        let moved = SessionRecord {
            cwd: root.join("old").display().to_string(),
            ..stored("a", Protocol::Acp, Some("a1"))
        };
        let why = resumable_with(&moved, &m).unwrap_err();
        assert!(why.contains("no longer in workspace `ws`"), "{why}");
    }
}
