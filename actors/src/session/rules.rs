//! Approval rules and modes applied to a session's pending requests.
//!
//! A new permission or write request is evaluated against the shared rule
//! set and the session's mode; `allow` and `deny` verdicts are answered at
//! once, exactly like a human decision (committed, answered, audited with the
//! deciding rule, shown to the operator). A rule change or a mode change
//! re-evaluates what is still pending.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;

use super::noise::Verdict;
use super::{Caller, Choice, SessionError, SessionState};
use crate::fsjail;
use crate::ports::NoticeLevel;
use crate::rules::{ApprovalMode, RequestFacts, RuleAction, evaluate, evaluate_changes};

/// The longest request title quoted in a notice about an automatic
/// decision, in bytes.
const NOTICE_TITLE_BYTES: usize = 300;

impl SessionState {
    fn facts(
        &self,
        paths: &[String],
        kind: Option<String>,
        command: Option<String>,
    ) -> RequestFacts {
        let guard = self.settings.server_files.checker();
        let root = Path::new(&self.record.cwd);
        let judged = fsjail::judge_paths(root, paths, |p| guard.covers(p));
        let written = paths
            .iter()
            .map(|p| super::toolcalls::relative(root, Path::new(p)))
            .filter(|w| !judged.relative.contains(w))
            .collect();
        let named = command
            .as_deref()
            .is_some_and(|c| guard.named_in_command(c, root));
        RequestFacts {
            kind,
            paths: judged.relative,
            paths_inside: judged.inside,
            server_file: judged.server_file || named,
            command,
            agent: self.record.agent.clone(),
            workspace: self.record.workspace.clone(),
            session: self.record.id.clone(),
            root: Some(PathBuf::from(&self.record.cwd)),
            written,
        }
    }

    /// Evaluates rules for pending request `n`, answering it when they decide.
    pub(super) async fn apply_rules(
        &mut self,
        n: u64,
        kind: Option<String>,
        command: Option<String>,
    ) {
        let Some(pending) = self.pending.get_mut(&n) else {
            return;
        };
        pending.governed = Some((kind.clone(), command.clone()));
        let (request, paths) = (
            pending.record.request_id.clone(),
            pending.record.paths.clone(),
        );
        let facts = self.facts(&paths, kind, command);
        self.tell_where_it_reaches(&request, &facts).await;
        self.evaluate_with(n, facts).await;
    }

    /// Says so when a request reaches past the workspace, or one of the
    /// server's own files: the request alone showed such a path like any
    /// other (a write to `/tmp/x` read as a workspace file until it was
    /// refused, after its approval).
    async fn tell_where_it_reaches(&mut self, request: &str, facts: &RequestFacts) {
        let text = if facts.server_file {
            format!(
                "{request} names one of agent-intercom's own files (its database, data directory, API token or config): no rule or mode decides it, and the server refuses the agent's own file access to it."
            )
        } else if !facts.paths_inside {
            let outside: Vec<String> = facts
                .paths
                .iter()
                .filter(|p| std::path::Path::new(p).is_absolute() || p.starts_with(".."))
                .take(3)
                .map(|p| crate::text::one_line(p, 200))
                .collect();
            format!(
                "{request} reaches outside the workspace{}: the agent's own writes there are refused, but a command it runs is not.",
                if outside.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", outside.join(", "))
                }
            )
        } else {
            return;
        };
        if self.agent_may_write(text.len()).await {
            self.emit_notice(NoticeLevel::Warning, &text).await;
        }
    }

    async fn evaluate_pending(&mut self, n: u64) {
        let Some(pending) = self.pending.get(&n) else {
            return;
        };
        let Some((kind, command)) = pending.governed.clone() else {
            return;
        };
        let facts = self.facts(&pending.record.paths, kind, command);
        self.evaluate_with(n, facts).await;
    }

    /// Evaluates pending request `n` on `facts` (its paths as resolved now).
    async fn evaluate_with(&mut self, n: u64, facts: RequestFacts) {
        let Some(pending) = self.pending.get(&n) else {
            return;
        };
        // A permission that announced diffs is also judged as the edit it
        // lets the agent make: its grant covers those writes.
        let changes = pending
            .announced
            .as_ref()
            .is_some_and(|a| !a.edits.is_empty());
        let judge = if changes { evaluate_changes } else { evaluate };
        let verdict = judge(&self.settings.rules.current(), self.mode, &facts);
        let choice = match verdict.action {
            RuleAction::Ask => return,
            RuleAction::Allow => Choice::Approve,
            RuleAction::Deny => Choice::Reject,
        };
        let by = match &verdict.rule {
            Some(id) => format!("rule:{id}"),
            None => format!("mode:{}", self.mode.as_str()),
        };
        let title = pending.record.title.clone();
        match self
            .resolve(n, &choice, Some(verdict.why.clone()), &by)
            .await
        {
            Ok(_) => {
                // The agent decides how many requests it makes and how long
                // their titles are: the operator is told of the first few of
                // each window (the audit log has every decision).
                let left_out = match self.auto_notices.admit(Instant::now()) {
                    Verdict::Suppress => return,
                    Verdict::Log { left_out } => left_out,
                };
                let mut text = format!(
                    "{}: {} automatically ({}).",
                    crate::text::shorten(&title, NOTICE_TITLE_BYTES),
                    if verdict.action == RuleAction::Allow {
                        "allowed"
                    } else {
                        "denied"
                    },
                    verdict.why
                );
                if left_out > 0 {
                    text.push_str(&format!(
                        " {left_out} more automatic decisions were not shown; the audit log has them."
                    ));
                }
                self.emit_notice(NoticeLevel::Info, &text).await;
            }
            Err(e) => tracing::warn!(session = %self.record.id, "automatic decision failed: {e}"),
        }
    }

    /// Re-evaluates every pending request (rules or mode changed).
    pub(super) async fn reapply_rules(&mut self) {
        let numbers: Vec<u64> = self.pending.keys().copied().collect();
        for n in numbers {
            self.evaluate_pending(n).await;
        }
    }

    pub(super) async fn set_mode(
        &mut self,
        mode: ApprovalMode,
        caller: &Caller,
    ) -> Result<(), SessionError> {
        self.authorize(caller, "set mode").await?;
        self.store.set_approval_mode(self.id(), mode).await?;
        self.mode = mode;
        self.audit(
            &caller.id,
            "session.mode_set",
            json!({"mode": mode.as_str()}),
        )
        .await;
        self.emit_notice(
            NoticeLevel::Info,
            &format!(
                "Approval mode is now {} (set by {}).",
                mode.as_str(),
                crate::text::one_line(&caller.id, 100)
            ),
        )
        .await;
        self.reapply_rules().await;
        Ok(())
    }
}
