//! Configuration and approval rules at run time: a reloaded `config.toml`
//! applied to the running tree (workspaces, agents, rules), a broken edit
//! reported without dropping the last good config, and the rules an
//! operator adds or removes (from the API or Slack), persisted and shared
//! with every session.

use super::in_force::InForce;
use super::*;
use intercom_actors::model::Protocol;
use intercom_actors::ports::NoticeLevel;
use intercom_actors::registry::WorkspaceMap;
use intercom_actors::rules::{RuleAction, Scope};

impl App {
    /// The rules `config.toml` holds now.
    fn config_rules(&self) -> Vec<Rule> {
        self.inner.in_force.now().rules.clone()
    }

    /// Applies a reloaded config: the workspace map (whole), the config
    /// rules and workspace modes. Live sessions keep their channel; pending
    /// requests are re-evaluated against the new rules.
    ///
    /// An error says the reload was not applied (the server is stopping):
    /// the caller keeps the previous config as the one in force.
    pub async fn apply_config(&self, config: &Config) -> Result<(), AppError> {
        let map = Box::new(config.workspace_map());
        if let Err(e) = self.inner.root.send_message(RootMsg::ConfigReloaded(map)) {
            return Err(AppError::Unavailable(format!(
                "the reloaded config was not applied: the workspace registry does not answer ({e}); the server is probably stopping"
            )));
        }
        if let Err(e) = self
            .inner
            .supervisor
            .send_message(SupervisorMsg::AgentsChanged(config.agents.clone()))
        {
            tracing::error!("live sessions keep their previous agent profiles: {e}");
        }
        for w in self.inner.fixed.changed_by(config) {
            tracing::warn!("{w}");
        }
        let (warnings, restart_needed) = (
            super::logged_warnings(config),
            self.inner.fixed.keys_changed_by(config),
        );
        let before = self.inner.in_force.now().modes.clone();
        self.inner.in_force.change(|c| {
            *c = InForce {
                rules: config.rules.clone(),
                modes: config.workspace_modes.clone(),
                warnings,
                restart_needed,
                error: None,
                held: None,
            }
        });
        if let Err(e) = self.refresh_rules().await {
            // The file's rules are kept: the next refresh (a rule added or
            // removed, the next reload) publishes them.
            tracing::error!("the reloaded config's rules are not in force yet: {e}");
            self.config_stale(&e);
        }
        tracing::info!(
            rules = config.rules.len(),
            "config reloaded: {}",
            config.summary()
        );
        self.tighten_live_modes(&before, config).await;
        Ok(())
    }

    /// A workspace whose `approval_mode` now asks more: its live sessions
    /// that ask less are brought to it (each session says so in its
    /// transcript). One that asks less is left to new sessions: a live
    /// session keeps what the operator saw it start with or set.
    async fn tighten_live_modes(&self, before: &BTreeMap<String, ApprovalMode>, config: &Config) {
        let tightened: Vec<(&str, ApprovalMode)> = config
            .workspaces
            .iter()
            .chain(&config.discovered)
            .map(|w| (w.id.as_str(), config.approval_mode_for(&w.id)))
            .filter(|(id, now)| {
                let was = before.get(*id).copied().unwrap_or_default();
                now.asks_more_than(was)
            })
            .collect();
        if tightened.is_empty() {
            return;
        }
        let live = match self.inner.store.list_sessions(true).await {
            Ok(live) => live,
            Err(e) => {
                tracing::error!(
                    "cannot list the live sessions a stricter approval mode applies to: {e}"
                );
                return;
            }
        };
        let config_caller = Caller {
            id: "config".into(),
            operator: true,
        };
        for session in live {
            let Some((_, mode)) = tightened.iter().find(|(id, _)| *id == session.workspace) else {
                continue;
            };
            let current = match self.session_detail(&session.id).await {
                Ok(detail) => detail.mode,
                Err(_) => continue,
            };
            if !mode.asks_more_than(current) {
                continue;
            }
            match self
                .set_mode(&session.id, *mode, config_caller.clone())
                .await
            {
                Ok(()) => tracing::info!(
                    session = %session.id,
                    "the config's approval_mode for {} now asks more: session set to {}",
                    session.workspace,
                    mode.as_str()
                ),
                Err(e) => tracing::warn!(
                    session = %session.id,
                    "session keeps approval mode {}, looser than its workspace's new {}: {e}",
                    current.as_str(),
                    mode.as_str()
                ),
            }
        }
    }

    /// While a reload is held (it also loosens: see `config::confirm`), the
    /// deny and ask rules it adds are put in force at once, on top of the
    /// config in force: only stricter than either file, and replaced by the
    /// next reload applied. A deny rule saved with a looser change waited
    /// the whole hold.
    pub async fn hold_stricter(&self, added: &[Rule]) {
        let mut rules = self.config_rules();
        let mut changed = false;
        for rule in added.iter().filter(|r| r.action != RuleAction::Allow) {
            if !rules.contains(rule) {
                rules.push(rule.clone());
                changed = true;
            }
        }
        if !changed {
            return;
        }
        self.inner.in_force.change(|c| c.rules = rules);
        if let Err(e) = self.refresh_rules().await {
            tracing::error!("the held reload's new deny and ask rules are not in force yet: {e}");
        }
    }

    /// What the config file now says that the running server does not do
    /// until it restarts (`[server] bind`, `[limits]`, ...). The server
    /// logged it at the reload; `/healthz` shows it, since `ctl` already
    /// follows the file (a probe's `ctl` said the server was down).
    pub fn restart_needed(&self) -> Vec<&'static str> {
        self.inner.in_force.now().restart_needed.clone()
    }

    /// What the config in force warns about (each also logged when it was
    /// loaded): a config can be valid and still name a missing binary.
    pub fn config_warnings(&self) -> Vec<String> {
        self.inner.in_force.now().warnings.clone()
    }

    /// Marks the config stale after a bad edit (the previous map stays);
    /// a reload that was held is no longer waited for. The watcher has
    /// logged why, naming the file and the key.
    pub fn config_stale(&self, error: &dyn std::fmt::Display) {
        let error = error.to_string();
        self.inner.in_force.change(|c| {
            c.error = Some(error);
            c.held = None;
        });
    }

    /// `None` when the config is fresh, else the last reload error.
    pub fn config_error(&self) -> Option<String> {
        self.inner.in_force.now().error.clone()
    }

    /// Notes that a reload is held until the file settles (see
    /// `config::confirm`), and what it waits for: `/healthz` says `held`.
    pub fn config_held(&self, waiting_for: String) {
        self.inner.in_force.change(|c| c.held = Some(waiting_for));
    }

    /// What a held reload waits for; `None` when nothing is held.
    pub fn config_held_for(&self) -> Option<String> {
        self.inner.in_force.now().held.clone()
    }

    /// Publishes the config's rules and the operator's (as stored) to every
    /// session. One refresh at a time: two that overlapped could publish in
    /// the wrong order, the later one a list read before the other's rule
    /// was stored (an added deny rule was then answered 201 and not in
    /// force).
    pub(super) async fn refresh_rules(&self) -> Result<(), AppError> {
        let _one_at_a_time = self.inner.rules_refresh.lock().await;
        let operator = self.inner.store.list_rules().await.map_err(|e| {
            AppError::Storage(format!(
                "cannot read the operator rules to put them in force: {e}"
            ))
        })?;
        let config = self.config_rules();
        self.inner
            .rules
            .set(config.into_iter().chain(operator).collect());
        if let Err(e) = self
            .inner
            .supervisor
            .send_message(SupervisorMsg::RulesChanged)
        {
            tracing::error!("live sessions were not told about the changed rules: {e}");
        }
        Ok(())
    }

    /// Every rule in force, with where it comes from (`config` or the creator).
    pub async fn rules(&self) -> Result<Vec<(Rule, String)>, AppError> {
        let config = self.config_rules();
        let stored = self.inner.store.list_stored_rules().await?;
        Ok(config
            .into_iter()
            .map(|r| (r, "config".to_owned()))
            .chain(stored.into_iter().map(|s| (s.rule, s.created_by)))
            .collect())
    }

    /// Adds an operator rule (persisted) and applies it at once, also to
    /// requests that are already pending.
    pub async fn add_rule(&self, mut rule: Rule, created_by: &str) -> Result<Rule, AppError> {
        if rule.id.is_empty() {
            rule.id = crate::storage::rules::new_rule_id();
        }
        // The reason alone: the id was just made up and is not stored.
        rule.validate()
            .map_err(|e| AppError::BadRequest(e.reason))?;
        self.inner.store.insert_rule(&rule, created_by).await?;
        self.audit(created_by, "rule.added", serde_json::json!({"rule": rule}))
            .await;
        self.refresh_rules()
            .await
            .map_err(|e| not_in_force(&format!("rule {} is stored", rule.id), e))?;
        Ok(rule)
    }

    /// Tells each live session whose standing a reload changed: one the
    /// config in force (`before`) could resume after a server restart and
    /// revive once it ends, and the new one (`after`) cannot (its
    /// workspace or agent profile removed, its workspace moved to another
    /// directory, its agent now speaking another protocol), and one the
    /// reload allows again. It runs on either way. Logged and kept in the
    /// transcript: an operator who was not watching learnt of it only once
    /// the session could not be resumed (a probe's reload said only "config
    /// reloaded").
    pub async fn tell_revivability(&self, before: &WorkspaceMap, after: &WorkspaceMap) {
        // A reload of rules or modes alone changes no session's way back:
        // no listing, no directory checks.
        if before == after {
            return;
        }
        let live = match self.inner.store.list_sessions(true).await {
            Ok(live) => live,
            Err(e) => {
                tracing::warn!("cannot list the live sessions a reload affects: {e}");
                return;
            }
        };
        let lost = |why: String| {
            format!(
                "After this config change, this session cannot be resumed after a server restart, nor revived once it ends: {why}. It runs on; put the config back as it was to keep both."
            )
        };
        for s in live.iter().filter(|s| s.protocol != Protocol::Mcp) {
            let (level, text) = match (before.revivable(s), after.revivable(s)) {
                (Ok(_), Err(why)) => (NoticeLevel::Warning, lost(why)),
                // Still without a way back, for another reason now (one
                // reload moved the workspace and changed the agent's
                // protocol; putting the directory back said nothing of the
                // protocol).
                (Err(was), Err(why)) if was != why => (NoticeLevel::Warning, lost(why)),
                (Err(_), Ok(_)) => (
                    NoticeLevel::Info,
                    "The config allows this session again: it can be resumed after a server restart and revived once it ends, as before.".to_owned(),
                ),
                _ => continue,
            };
            match level {
                NoticeLevel::Warning => tracing::warn!(session = %s.id, "{text}"),
                _ => tracing::info!(session = %s.id, "{text}"),
            }
            intercom_actors::supervisor::keep_notice(
                &*self.inner.store,
                &*self.inner.sink,
                &s.id,
                level,
                text,
            )
            .await;
        }
    }

    /// Removes an operator rule; config rules are removed by editing the file.
    pub async fn delete_rule(&self, id: &str, by: &str) -> Result<(), AppError> {
        if !self.inner.store.delete_rule(id).await? {
            let in_config = self.config_rules().iter().any(|x| x.id == id);
            return Err(if in_config {
                AppError::BadRequest(format!(
                    "rule {id} comes from the config file; remove it there"
                ))
            } else {
                AppError::NotFound(format!("no rule {id}"))
            });
        }
        self.audit(by, "rule.removed", serde_json::json!({"rule": id}))
            .await;
        self.refresh_rules()
            .await
            .map_err(|e| not_in_force(&format!("rule {id} is removed from storage"), e))?;
        Ok(())
    }

    /// Refuses a rule scope that can never match: a workspace that is not
    /// configured (nor the directory of a path session under
    /// `workspace_root`), or a session that does not exist. A typo in the
    /// scope of a `deny` rule would otherwise give silent false safety; the
    /// config loader refuses the same for rules in the file.
    pub async fn check_rule_scope(&self, scope: &Scope) -> Result<(), AppError> {
        match scope {
            Scope::Global => Ok(()),
            Scope::Workspace(id) => {
                let map = self.workspace_map().await?;
                let path = std::path::Path::new(id);
                let path_session =
                    path.is_absolute() && path.starts_with(&map.workspace_root) && path.is_dir();
                if map.workspaces.iter().any(|w| &w.id == id) || path_session {
                    return Ok(());
                }
                let known: Vec<&str> = map.workspaces.iter().map(|w| w.id.as_str()).collect();
                Err(AppError::BadRequest(format!(
                    "unknown workspace {id:?}; configured: {} (or the directory of a path session under workspace_root)",
                    known.join(", ")
                )))
            }
            Scope::Session(id) => match self.inner.store.get_session(id).await? {
                // An ended session asks nothing more, unless it is revived
                // (a stopped one cannot be).
                Some(r) if !r.status.is_live() && !r.revivable() => {
                    Err(AppError::BadRequest(format!(
                        "session {id} has ended ({}) and asks nothing more; a rule for it could never apply",
                        r.status.as_str()
                    )))
                }
                Some(_) => Ok(()),
                None => Err(AppError::BadRequest(format!("no session {id}"))),
            },
        }
    }

    /// Refuses a rule naming an agent profile that is not configured (nor
    /// `mcp`, what MCP clients' requests are judged as): it could never
    /// match, as the config's own rules are refused for it.
    pub async fn check_rule_agent(&self, agent: Option<&str>) -> Result<(), AppError> {
        let Some(agent) = agent else {
            return Ok(());
        };
        let map = self.workspace_map().await?;
        if agent == "mcp" || map.agents.iter().any(|a| a.id == agent) {
            return Ok(());
        }
        let known: Vec<&str> = map.agents.iter().map(|a| a.id.as_str()).collect();
        Err(AppError::BadRequest(format!(
            "unknown agent {agent:?}; configured: {} (or \"mcp\" for MCP clients)",
            known.join(", ")
        )))
    }

    /// The configured approval mode of a workspace (`None` = ask).
    pub(crate) fn workspace_mode(&self, workspace: &str) -> Option<ApprovalMode> {
        self.inner
            .in_force
            .now()
            .modes
            .get(workspace)
            .copied()
            .filter(|m| *m != ApprovalMode::Ask)
    }
}

/// Slack reaches the server's rule management (and workspace modes) through
/// the App, so a rule created from a button is stored, applied to every
/// session and re-evaluated against pending requests exactly like one from
/// the API.
#[async_trait::async_trait]
impl crate::slack::RulesAdmin for App {
    async fn rules(&self) -> Result<Vec<(Rule, String)>, String> {
        App::rules(self).await.map_err(|e| e.to_string())
    }

    async fn add_rule(&self, rule: Rule, created_by: &str) -> Result<Rule, String> {
        App::add_rule(self, rule, created_by)
            .await
            .map_err(|e| e.to_string())
    }

    async fn delete_rule(&self, id: &str, by: &str) -> Result<(), String> {
        App::delete_rule(self, id, by)
            .await
            .map_err(|e| e.to_string())
    }

    fn workspace_mode(&self, workspace: &str) -> Option<ApprovalMode> {
        App::workspace_mode(self, workspace)
    }

    fn tell(&self, session: &SessionId, text: &str) -> bool {
        self.notice(session, text.to_owned());
        true
    }
}

/// What the server started with and a reload cannot change: the database
/// (and so the data directory and the files agents are kept from), the
/// listening address, and the sections read once at start (`[slack]`,
/// `[mcp]`, `[limits]`, `[stall]`, `[supervision]`). A reload that changes
/// them is told so, instead of a summary that reads as if they took effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Fixed {
    /// The config the server started with.
    started: Config,
}

impl Fixed {
    pub(super) fn of(config: &Config) -> Self {
        Fixed {
            started: config.clone(),
        }
    }

    /// The sections read once at start that `config` changes.
    fn sections_changed_by(&self, config: &Config) -> Vec<&'static str> {
        let was = &self.started;
        [
            ("[slack]", was.slack != config.slack),
            ("[mcp]", was.mcp != config.mcp),
            ("[limits]", was.limits != config.limits),
            ("[stall]", was.stall != config.stall),
            ("[supervision]", was.supervision != config.supervision),
        ]
        .into_iter()
        .filter_map(|(name, changed)| changed.then_some(name))
        .collect()
    }

    /// The names of the fixed settings `config` changes.
    pub(super) fn keys_changed_by(&self, config: &Config) -> Vec<&'static str> {
        let was = &self.started;
        let mut out = Vec::new();
        if config.database.path != was.database.path {
            out.push("[database] path");
        }
        if config.server.bind != was.server.bind {
            out.push("[server] bind");
        }
        out.extend(self.sections_changed_by(config));
        out
    }

    /// Warnings for each fixed setting `config` changes.
    pub(super) fn changed_by(&self, config: &Config) -> Vec<String> {
        let mut out = Vec::new();
        let was = &self.started;
        if config.database.path != was.database.path {
            out.push(format!(
                "[database] path changed to {}; that takes a restart: the server still uses {} (and agent file access still guards its directory)",
                config.database.path.display(),
                was.database.path.display()
            ));
        }
        if config.server.bind != was.server.bind {
            out.push(format!(
                "[server] bind changed to {}; that takes a restart: the server still listens on {}",
                config.server.bind, was.server.bind
            ));
        }
        for section in self.sections_changed_by(config) {
            out.push(format!(
                "{section} changed; that takes a restart: the server keeps the values it started with until then"
            ));
        }
        out
    }
}

/// A rule change that is stored but could not be put in force: the
/// operator is told to retry, not that it was done.
fn not_in_force(what: &str, e: AppError) -> AppError {
    AppError::Storage(format!(
        "{what}, but sessions do not see the change yet ({e}); retry, or reload the config to put the stored rules in force"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_that_moves_the_database_or_the_address_says_it_takes_a_restart() {
        let dir = tempfile::tempdir().expect("tmp");
        let started = Config::from_toml_str("", dir.path()).expect("config");
        let fixed = Fixed::of(&started);
        assert!(fixed.changed_by(&started).is_empty());
        let moved = Config::from_toml_str(
            "[database]\npath = \"elsewhere/x.db\"\n[server]\nbind = \"127.0.0.1:4000\"\n",
            dir.path(),
        )
        .expect("config");
        let warnings = fixed.changed_by(&moved);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("takes a restart") && warnings[0].contains("still uses"));
        assert!(warnings[1].contains("still listens on"));
    }

    #[test]
    fn a_reload_that_changes_a_section_read_at_start_says_it_takes_a_restart() {
        let dir = tempfile::tempdir().expect("tmp");
        let started =
            Config::from_toml_str("[limits]\nmax_sessions = 20\n", dir.path()).expect("config");
        let fixed = Fixed::of(&started);
        let lowered = Config::from_toml_str(
            "[limits]\nmax_sessions = 3\n[stall]\ninactivity_secs = 0\n",
            dir.path(),
        )
        .expect("config");
        let warnings = fixed.changed_by(&lowered);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with("[limits] changed; that takes a restart"));
        assert!(warnings[1].starts_with("[stall] changed"));
        // Workspaces, agents and rules reload: no warning for them.
        let more = Config::from_toml_str(
            "[limits]\nmax_sessions = 20\n[[rule]]\naction = \"deny\"\nkind = \"execute\"\n",
            dir.path(),
        )
        .expect("config");
        assert_eq!(more.rules.len(), 1);
        assert!(
            fixed.changed_by(&more).is_empty(),
            "{:?}",
            fixed.changed_by(&more)
        );
    }
}
