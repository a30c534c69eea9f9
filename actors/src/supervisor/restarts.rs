//! Bringing a session back after its agent went away: what the exit means
//! (finished, failed first start, crash, operator's restart), the restart
//! budget and its backoff, and the respawn that resumes the agent's session
//! where it can.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{PriorEnd, SupervisorMsg, SupervisorState, Undelivered};
use crate::model::{Protocol, SessionId, SessionStatus};
use crate::ports::{NoticeLevel, OperatorEvent};
use crate::session::{SessionExit, StartError, StartMode};
use crate::settings::AgentProfile;

/// What a restart needs to know (the default: start fresh, nothing to
/// resume or re-send).
#[derive(Debug, Clone, Default)]
pub(super) struct RestartPlan {
    pub(super) resume: Option<String>,
    pub(super) reprompt: Option<String>,
    pub(super) mid_turn: bool,
    pub(super) require_resume: bool,
    /// What the agent wrote since the last prompt, carried to the restarted
    /// one when nobody asked for the restart.
    pub(super) budget: Option<crate::session::TurnBudget>,
}

impl RestartPlan {
    /// How to bring back an agent that went away (crash or operator restart):
    /// resume its ACP session when it had one, else re-send the cut turn;
    /// `budget` is what it wrote since the last prompt, when nobody asked
    /// for the restart.
    pub(super) fn after_exit(
        acp_session: Option<String>,
        prompt: Option<String>,
        mid_turn: bool,
        budget: Option<crate::session::TurnBudget>,
    ) -> Self {
        RestartPlan {
            resume: acp_session,
            reprompt: prompt,
            mid_turn,
            require_resume: false,
            budget,
        }
    }
}

/// Why a session's agent is being started again: the operator is told
/// which, since "after a crash" sends them looking for a crash that did
/// not happen when it was the start (a restart's, say) that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cause {
    /// The running agent went away.
    Crashed,
    /// Starting it again (a restart, the operator's or the supervisor's)
    /// failed before it ran: a missing binary, a failed handshake.
    StartFailed,
}

impl Cause {
    fn retrying(self) -> &'static str {
        match self {
            Cause::Crashed => "restarting after a crash",
            Cause::StartFailed => "retrying a restart whose agent did not start",
        }
    }

    fn activity(self) -> &'static str {
        match self {
            Cause::Crashed => "crashed, restarting",
            Cause::StartFailed => "restart failed, retrying",
        }
    }
}

impl SupervisorState {
    /// Takes a reloaded config's agent profiles for the next restart of each
    /// live session that uses one. A probe fixed a profile's `command` while
    /// its session ran: every crash restart (and an operator's restart)
    /// still ran the old one, and the error said to fix what was fixed.
    /// A profile removed from the config, or one now speaking another
    /// protocol (the session's state belongs to the old one), is kept.
    pub(super) fn agents_changed(&mut self, profiles: &[AgentProfile]) {
        for (id, entry) in &mut self.sessions {
            let Some(new) = profiles.iter().find(|p| p.id == entry.profile.id) else {
                continue;
            };
            if *new == entry.profile || entry.profile.protocol == Protocol::Mcp {
                continue;
            }
            if new.protocol != entry.profile.protocol {
                tracing::warn!(session = %id, profile = %new.id, "the agent profile now speaks another protocol; the session keeps the one it started with");
                continue;
            }
            tracing::info!(session = %id, profile = %new.id, "the agent profile changed; the session's next restart uses it");
            entry.profile = new.clone();
        }
    }

    /// A revive's start failed. Not a crash of a running session: it ends
    /// as it had ended before, and can be revived once the cause is fixed.
    async fn revive_failed(&mut self, id: &SessionId, prior: PriorEnd, err: &StartError) {
        tracing::info!(session = %id, "revive failed: {}", crate::text::log_safe(&err.to_string()));
        self.end_session_with(id, prior.status, &prior.reason, Undelivered::Untold)
            .await;
        self.notice(
            id,
            NoticeLevel::Warning,
            format!(
                "Could not revive this session: {err}. It stays {}; fix the cause and revive it again, or start a new one.",
                prior.describe()
            ),
        );
    }

    pub(super) async fn on_exit(&mut self, id: SessionId, exit: SessionExit) {
        let Some(entry) = self.sessions.get_mut(&id) else {
            return;
        };
        if entry.profile.protocol == Protocol::Mcp {
            // MCP clients are not restarted: they reconnect on their own.
            self.sessions.remove(&id);
            self.bridge_tokens.retain(|_, s| s != &id);
            self.check_shutdown_done();
            return;
        }
        entry.actor = None;
        // A revive's start is over whichever way this went.
        let reviving = entry.reviving.take();
        match exit {
            SessionExit::Finished(_) => {
                self.sessions.remove(&id);
                self.bridge_tokens.retain(|_, s| s != &id);
            }
            SessionExit::StartFailed(err) if entry.first_start => {
                tracing::info!(session = %id, "first start failed: {}", crate::text::log_safe(&err.to_string()));
                self.sessions.remove(&id);
            }
            SessionExit::StartFailed(err) if entry.recovering => {
                self.not_resumed(&id, &err).await;
            }
            SessionExit::StartFailed(err) => match reviving {
                Some(prior) => self.revive_failed(&id, prior, &err).await,
                None => {
                    let plan = entry.plan.clone().unwrap_or_default();
                    self.maybe_restart(id, err.to_string(), plan, Cause::StartFailed)
                        .await;
                }
            },
            SessionExit::RestartRequested {
                by,
                acp_session,
                interrupted_prompt,
                mid_turn,
                budget,
            } => {
                // It ran: what follows is a restart, not a first start, a
                // revive or a recovery.
                entry.first_start = false;
                entry.recovering = false;
                let plan =
                    RestartPlan::after_exit(acp_session, interrupted_prompt, mid_turn, budget);
                self.restart_on_request(id, by, plan).await;
            }
            SessionExit::Crashed {
                reason,
                acp_session,
                interrupted_prompt,
                mid_turn,
                budget,
            } => {
                entry.first_start = false;
                entry.recovering = false;
                let plan = RestartPlan::after_exit(
                    acp_session,
                    interrupted_prompt,
                    mid_turn,
                    Some(budget),
                );
                self.maybe_restart(id, reason, plan, Cause::Crashed).await;
            }
        }
        self.check_shutdown_done();
    }

    pub(super) async fn maybe_restart(
        &mut self,
        id: SessionId,
        reason: String,
        plan: RestartPlan,
        cause: Cause,
    ) {
        if self.shutdown.is_some() {
            self.end_session(&id, SessionStatus::Cancelled, crate::model::SERVER_SHUTDOWN)
                .await;
            return;
        }
        let policy = self.args.policy.clone();
        let window = Duration::from_secs(policy.restart_window_secs);
        let Some(entry) = self.sessions.get_mut(&id) else {
            return;
        };
        let now = Instant::now();
        entry.restarts.retain(|t| now.duration_since(*t) < window);
        if entry.restarts.len() as u32 >= policy.max_restarts {
            let text = format!(
                "{reason}. Restart budget spent ({} restarts within {} s); the session is marked crashed.",
                policy.max_restarts, policy.restart_window_secs
            );
            tracing::error!(session = %id, "{}", crate::text::log_safe(&text));
            // Kept: whoever reads the transcript later needs it most.
            self.notice_kept(&id, NoticeLevel::Error, text).await;
            let reason = if policy.max_restarts == 0 {
                format!("{reason} (not restarted: supervision.max_restarts is 0)")
            } else {
                format!(
                    "{reason} (gave up after {} restarts within {} s)",
                    policy.max_restarts, policy.restart_window_secs
                )
            };
            self.end_session(&id, SessionStatus::Crashed, &reason).await;
            return;
        }
        entry.restarts.push(now);
        entry.total_restarts += 1;
        entry.plan = Some(plan);
        let attempt = entry.restarts.len() as u32;
        let total = entry.total_restarts;
        let delay = policy.backoff(attempt);
        let why = format!(
            "{} (attempt {attempt} of {})",
            cause.retrying(),
            policy.max_restarts
        );
        self.mark_restarting(&id, total, cause.activity(), why)
            .await;
        self.notice(
            &id,
            NoticeLevel::Warning,
            format!(
                "{reason}. Restarting in {} s (attempt {attempt} of {}).",
                delay.as_secs(),
                policy.max_restarts
            ),
        );
        self.audit(
            &id,
            "session.restart_scheduled",
            json!({"attempt": attempt, "delay_secs": delay.as_secs()}),
        )
        .await;
        let id2 = id.clone();
        self.myself
            .send_after(delay, move || SupervisorMsg::RestartDue(id2.clone()));
    }

    /// Stores the session as `starting` again (with its restart count) and
    /// tells the operator why.
    pub(super) async fn mark_restarting(
        &self,
        id: &SessionId,
        total: u32,
        activity: &str,
        why: String,
    ) {
        let store = &self.args.store;
        let _ = store.set_restart_count(id, total).await;
        let _ = store
            .set_status(id, SessionStatus::Starting, Some(&why))
            .await;
        self.args.sink.emit(OperatorEvent::StatusChanged {
            session_id: id.clone(),
            status: SessionStatus::Starting,
            activity: activity.into(),
            reason: Some(why),
        });
    }

    /// A session the previous server left live could not be brought back:
    /// it ends `interrupted`, saying why.
    async fn not_resumed(&mut self, id: &SessionId, err: &StartError) {
        let reason = format!("could not resume after a server restart: {err}");
        self.end_session(id, SessionStatus::Interrupted, &reason)
            .await;
    }

    pub(super) async fn restart(&mut self, id: SessionId) {
        if self.shutdown.is_some() {
            self.end_session(&id, SessionStatus::Cancelled, crate::model::SERVER_SHUTDOWN)
                .await;
            self.check_shutdown_done();
            return;
        }
        let Some(entry) = self.sessions.get(&id) else {
            return;
        };
        if entry.actor.is_some() {
            // Already restarted (an operator's restart beat the backoff).
            return;
        }
        let profile = entry.profile.clone();
        let plan = entry.plan.clone().unwrap_or_default();
        let record = match self.args.store.get_session(&id).await {
            Ok(Some(r)) if r.status.is_live() => r,
            _ => {
                self.sessions.remove(&id);
                return;
            }
        };
        let start = StartMode::Restart {
            resume: plan.resume.clone(),
            reprompt: plan.reprompt.clone(),
            was_mid_turn: plan.mid_turn,
            require_resume: plan.require_resume,
            revived: false,
            budget: plan.budget,
        };
        match self.spawn_session(record, profile, start, None).await {
            Ok(actor) => {
                if let Some(e) = self.sessions.get_mut(&id) {
                    e.actor = Some(actor);
                }
            }
            Err(err) => {
                let recovering = self.sessions.get(&id).is_some_and(|e| e.recovering);
                if recovering {
                    self.not_resumed(&id, &err).await;
                } else {
                    self.maybe_restart(id, err.to_string(), plan, Cause::StartFailed)
                        .await;
                }
            }
        }
    }
}
