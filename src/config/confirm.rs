//! What a reload must see twice: changes a file caught mid-save can fake.
//!
//! The watcher reads the file once it has gone unchanged for
//! [`super::watch::QUIET`]. A writer that stalls longer than that (a slow
//! copy, a script appending in steps) leaves a prefix of the new file, and
//! a prefix is still valid TOML: a rule cut before its `command_regex`
//! line allows more than the finished one, a deny rule further down is
//! missing, a workspace further down is gone. A probe's `git push --force`
//! was allowed in such a window. A prefix can only lose lines, so what it
//! can fake is what loosens, removes or cuts short: a deny or ask rule gone
//! or changed, an allow rule new or changed, an approval mode that asks
//! less, a workspace or agent gone or changed (a profile cut before its
//! `args`). Such a reload is applied only once the file has gone unchanged
//! for [`CONFIRM_QUIET`]; everything else at once.

use std::time::Duration;

use intercom_actors::rules::RuleAction;

use super::Config;

/// How long a file whose change loosens or removes must have gone
/// unchanged before it is applied.
pub const CONFIRM_QUIET: Duration = Duration::from_secs(10);

impl Config {
    /// What this config changes, against `running`, that a file cut
    /// mid-save could also read as: one phrase each, empty when nothing.
    pub fn changes_to_confirm(&self, running: &Config) -> Vec<String> {
        let mut changes = Vec::new();
        for rule in running
            .rules
            .iter()
            .filter(|r| r.action != RuleAction::Allow)
        {
            if !self.rules.contains(rule) {
                changes.push(format!(
                    "{} rule {} removed or changed",
                    rule.action.as_str(),
                    rule.id
                ));
            }
        }
        for rule in self.rules.iter().filter(|r| r.action == RuleAction::Allow) {
            if !running.rules.contains(rule) {
                changes.push(format!("allow rule {} added or changed", rule.id));
            }
        }
        for (id, mode) in &self.workspace_modes {
            let was = running.approval_mode_for(id);
            if was.asks_more_than(*mode) {
                changes.push(format!(
                    "workspace {id} asks less ({} -> {})",
                    was.as_str(),
                    mode.as_str()
                ));
            }
        }
        let (workspaces, agents) = self.removed_from(running);
        changes.extend(workspaces.iter().map(|w| format!("workspace {w} removed")));
        changes.extend(agents.iter().map(|a| format!("agent {a} removed")));
        // A profile or a workspace cut before its last keys loses them (an
        // agent's `args = ["--sandbox"]`, a workspace's channel): any
        // change to one already running is held too.
        for agent in &self.agents {
            if running.agent(&agent.id).is_some_and(|was| was != agent) {
                changes.push(format!("agent {} changed", agent.id));
            }
        }
        for ws in &self.workspaces {
            if running.workspace(&ws.id).is_some_and(|was| was != ws) {
                changes.push(format!("workspace {} changed", ws.id));
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
[[workspace]]
id = "w1"
path = "."
approval_mode = "auto-edits"

[[rule]]
id = "git-readonly"
action = "allow"
kind = "execute"
command_prefix = "git "
command_regex = '^git (status|diff|log)\b'

[[rule]]
id = "no-force-push"
action = "deny"
kind = "execute"
command_regex = '^git\s+push'
"#;

    /// Every config of a test in the same directory: a workspace's path is
    /// the same one in each.
    fn config(text: &str) -> Config {
        Config::from_toml_str(text, &std::env::temp_dir()).expect("config")
    }

    /// Every prefix of the file cut at a line that parses is either the
    /// same policy or one of the changes held back.
    #[test]
    fn a_file_cut_before_its_last_lines_has_changes_to_confirm() {
        let full = config(FULL);
        assert!(full.changes_to_confirm(&full).is_empty());
        let cut_at = FULL.find("command_regex = '^git (").expect("line");
        let cut = config(&FULL[..cut_at]);
        let changes = cut.changes_to_confirm(&full);
        assert!(
            changes.contains(&"allow rule git-readonly added or changed".to_owned()),
            "{changes:?}"
        );
        assert!(
            changes.contains(&"deny rule no-force-push removed or changed".to_owned()),
            "{changes:?}"
        );
    }

    /// A profile cut before its `args` would run the agent without them
    /// (a probe's `--sandbox` was lost for a new session).
    #[test]
    fn an_agent_cut_before_its_args_is_held() {
        let whole = "[[agent]]\nid = \"safe\"\ncommand = \"sh\"\nargs = [\"--sandbox\"]\n";
        let full = config(whole);
        let cut = config(&whole[..whole.find("args").expect("args")]);
        assert_eq!(
            cut.changes_to_confirm(&full),
            vec!["agent safe changed".to_owned()]
        );
    }

    #[test]
    fn tightening_is_applied_at_once_and_loosening_is_confirmed() {
        let full = config(FULL);
        // A new deny rule, a stricter mode: nothing to confirm.
        let stricter = config(&format!(
            "{}\n[[rule]]\nid = \"no-rm\"\naction = \"deny\"\nkind = \"delete\"\n",
            FULL.replace("auto-edits", "ask")
        ));
        assert!(
            stricter.changes_to_confirm(&full).is_empty(),
            "{:?}",
            stricter.changes_to_confirm(&full)
        );
        // The other way round: the deny rule is gone and the mode asks less.
        let changes = full.changes_to_confirm(&stricter);
        assert!(
            changes.contains(&"deny rule no-rm removed or changed".to_owned()),
            "{changes:?}"
        );
        assert!(
            changes.contains(&"workspace w1 asks less (ask -> auto-edits)".to_owned()),
            "{changes:?}"
        );
        // A workspace gone.
        let two = config(&FULL.replace(
            "[[rule]]\nid = \"git-readonly\"",
            "[[workspace]]\nid = \"w2\"\npath = \"sub\"\n\n[[rule]]\nid = \"git-readonly\"",
        ));
        assert_eq!(
            full.changes_to_confirm(&two),
            vec!["workspace w2 removed".to_owned()]
        );
    }
}
