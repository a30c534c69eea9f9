//! `[[rule]]` entries: approval rules owned by the config file.
//!
//! Why this exists: operators want "stop asking me about this" to hold across
//! agents and restarts; rules in the file are reloaded with it. Each entry
//! becomes an [`intercom_actors::rules::Rule`] with scope `global` or
//! `workspace` (session rules are created by operators at run time and live
//! in SQLite, never here). Every value is kept as text while parsing so that
//! a bad one is reported against its exact key (`rule[2].command_regex`);
//! globs and regexes are checked with [`Rule::validate`], the same check the
//! core relies on.
//!
//! Ids: an entry without `id` gets `cfg-<index>` (its position in the file,
//! from 0, as in `rule[<index>]`). Explicit ids must be unique and must not
//! start with the reserved `cfg-` or `r-` (operator rules) prefixes, so they
//! can never collide with generated ones.

use std::collections::HashMap;

use intercom_actors::rules::{KINDS_ON_FILES, Rule, RuleAction, RuleMatch, Scope};
use serde::Deserialize;

use super::{AgentProfile, ConfigError};

type Result<T> = std::result::Result<T, ConfigError>;

pub use intercom_actors::rules::RULE_KINDS;

/// Prefix of generated config rule ids.
const CONFIG_PREFIX: &str = "cfg-";
/// Prefix of operator rule ids (stored in SQLite).
const OPERATOR_PREFIX: &str = "r-";

/// One `[[rule]]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawRule {
    id: Option<String>,
    scope: Option<String>,
    workspace: Option<String>,
    action: Option<String>,
    kind: Option<String>,
    paths: Vec<String>,
    command_prefix: Option<String>,
    command_regex: Option<String>,
    agent: Option<String>,
}

/// Validates every entry (file order; the first problem is returned) and
/// converts it. `workspaces` are the ids a workspace rule may name
/// (configured and discovered).
pub(super) fn rules(
    raw: Vec<RawRule>,
    workspaces: &[&str],
    agents: &[AgentProfile],
) -> Result<Vec<Rule>> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        let rule = rule(i, r, workspaces, agents)?;
        if let Some(first) = seen.insert(rule.id.clone(), i) {
            return Err(ConfigError::invalid(
                format!("rule[{i}].id"),
                format!(
                    "duplicate rule id {:?} (also used by rule[{first}])",
                    rule.id
                ),
            ));
        }
        out.push(rule);
    }
    Ok(out)
}

fn rule(i: usize, r: RawRule, workspaces: &[&str], agents: &[AgentProfile]) -> Result<Rule> {
    let key = |field: &str| format!("rule[{i}].{field}");
    let id = match r.id {
        None => format!("{CONFIG_PREFIX}{i}"),
        Some(id) => {
            check_rule_id(&id, &key("id"))?;
            id
        }
    };
    let scope = scope(i, r.scope.as_deref(), r.workspace, workspaces)?;
    let action = action(r.action.as_deref(), &key("action"))?;
    if let Some(kind) = &r.kind
        && !RULE_KINDS.contains(&kind.as_str())
    {
        return Err(ConfigError::invalid(
            key("kind"),
            format!(
                "{kind:?} is not a tool kind; use one of {}",
                RULE_KINDS.join(", ")
            ),
        ));
    }
    for (k, glob) in r.paths.iter().enumerate() {
        check_glob(&id, glob, format!("rule[{i}].paths[{k}]"))?;
    }
    let command = (&r.command_prefix, &r.command_regex);
    check_command(&id, r.kind.as_deref(), command, &key)?;
    if let Some(agent) = &r.agent
        && !agents.iter().any(|a| &a.id == agent)
    {
        return Err(ConfigError::invalid(
            key("agent"),
            super::validate::unknown_agent(agent, agents),
        ));
    }
    let rule = Rule {
        id,
        scope,
        matcher: RuleMatch {
            kind: r.kind,
            paths: r.paths,
            command_prefix: r.command_prefix,
            command_regex: r.command_regex,
            agent: r.agent,
        },
        action,
    };
    if action == RuleAction::Allow {
        names_what_it_allows(&rule.matcher, &key)?;
    }
    // Everything was checked piecewise above; this is the core's own check on
    // the whole rule, so the two can never disagree silently.
    rule.validate()
        .map_err(|e| ConfigError::invalid(format!("rule[{i}]"), e.reason))?;
    Ok(rule)
}

/// An allow rule in the file says what it allows: a kind or paths; for
/// `execute`, the command; for a kind on files, the files. A file is read
/// while it is being written now and then, and a `[[rule]]` cut after its
/// `kind` line allowed every command to a probe (`rm -rf` included) until
/// the rest arrived. (Rules from the API are posted whole, and may be
/// broad on purpose.)
fn names_what_it_allows(m: &RuleMatch, key: &impl Fn(&str) -> String) -> Result<()> {
    let fail = |field: &str, why: &str| Err(ConfigError::invalid(key(field), why.to_owned()));
    let command = m.command_prefix.is_some() || m.command_regex.is_some();
    match m.kind.as_deref() {
        None if m.paths.is_empty() && !command => fail(
            "kind",
            "an allow rule says what it allows: give `kind` (with its command or paths) or `paths`",
        ),
        Some("execute") if !command => fail(
            "command_prefix",
            "an allow rule for `execute` needs `command_prefix` or `command_regex`; without, it allows every command",
        ),
        Some(k) if KINDS_ON_FILES.contains(&k) && m.paths.is_empty() => fail(
            "paths",
            "an allow rule for a kind on files needs `paths` (`[\"**\"]` for the whole workspace); without, it allows that kind on any file",
        ),
        _ if m
            .command_regex
            .as_deref()
            .is_some_and(intercom_actors::rules::matches_every_command) =>
        {
            fail(
                "command_regex",
                "an allow rule's `command_regex` must not match an empty command: it would match every command",
            )
        }
        _ => Ok(()),
    }
}

/// `action`: required, one of "allow", "ask", "deny".
fn action(action: Option<&str>, key: &str) -> Result<RuleAction> {
    match action {
        None => Err(ConfigError::invalid(
            key,
            "is required: \"allow\", \"ask\" or \"deny\"",
        )),
        Some("allow") => Ok(RuleAction::Allow),
        Some("ask") => Ok(RuleAction::Ask),
        Some("deny") => Ok(RuleAction::Deny),
        Some(other) => Err(ConfigError::invalid(
            key,
            format!("{other:?} is not an action; use \"allow\", \"ask\" or \"deny\""),
        )),
    }
}

/// One `paths` glob: not empty, relative to the workspace, and one the
/// rule engine accepts.
fn check_glob(id: &str, glob: &str, key: String) -> Result<()> {
    if glob.trim().is_empty() {
        return Err(ConfigError::invalid(key, "must not be empty"));
    }
    if glob.starts_with('/') {
        return Err(ConfigError::invalid(
            key,
            format!(
                "{glob:?} is absolute; globs match paths relative to the workspace (e.g. \"src/**\")"
            ),
        ));
    }
    let probe = probe_rule(
        id,
        RuleMatch {
            paths: vec![glob.to_owned()],
            ..RuleMatch::default()
        },
    );
    probe
        .validate()
        .map_err(|e| ConfigError::invalid(key, e.reason))
}

/// `command_prefix` / `command_regex`: not empty, only on execute rules
/// (nothing else has a command), and a regex the rule engine accepts.
fn check_command(
    id: &str,
    kind: Option<&str>,
    (prefix, regex): (&Option<String>, &Option<String>),
    key: &dyn Fn(&str) -> String,
) -> Result<()> {
    let not_execute = kind.filter(|k| *k != "execute");
    for (field, value) in [("command_prefix", prefix), ("command_regex", regex)] {
        let Some(value) = value else { continue };
        if value.is_empty() {
            return Err(ConfigError::invalid(
                key(field),
                "must not be empty (omit it to match any command)",
            ));
        }
        if let Some(kind) = not_execute {
            return Err(ConfigError::invalid(
                key(field),
                format!(
                    "only execute requests have a command, so a rule with kind = {kind:?} and {field} never matches; use kind = \"execute\" or drop {field}"
                ),
            ));
        }
    }
    let Some(re) = regex else {
        return Ok(());
    };
    let probe = probe_rule(
        id,
        RuleMatch {
            command_regex: Some(re.clone()),
            ..RuleMatch::default()
        },
    );
    probe
        .validate()
        .map_err(|e| ConfigError::invalid(key("command_regex"), e.reason))
}

/// The scope: `scope` defaults to `"workspace"` when `workspace` is set and
/// to `"global"` otherwise.
fn scope(
    i: usize,
    scope: Option<&str>,
    workspace: Option<String>,
    workspaces: &[&str],
) -> Result<Scope> {
    let key = |field: &str| format!("rule[{i}].{field}");
    let scope = scope.unwrap_or(if workspace.is_some() {
        "workspace"
    } else {
        "global"
    });
    match scope {
        "global" => match workspace {
            None => Ok(Scope::Global),
            Some(_) => Err(ConfigError::invalid(
                key("workspace"),
                "only allowed with scope = \"workspace\" (a global rule applies to every workspace)",
            )),
        },
        "workspace" => {
            let Some(ws) = workspace else {
                return Err(ConfigError::invalid(
                    key("workspace"),
                    "is required with scope = \"workspace\": name the workspace id",
                ));
            };
            if !workspaces.contains(&ws.as_str()) {
                let known = if workspaces.is_empty() {
                    "no workspaces are configured".to_owned()
                } else {
                    format!("known: {}", workspaces.join(", "))
                };
                return Err(ConfigError::invalid(
                    key("workspace"),
                    format!("unknown workspace {ws:?} ({known})"),
                ));
            }
            Ok(Scope::Workspace(ws))
        }
        "session" => Err(ConfigError::invalid(
            key("scope"),
            "session rules are created by operators at run time (\"allow always\" on a request, or the API), not in the config file; use \"global\" or \"workspace\"",
        )),
        other => Err(ConfigError::invalid(
            key("scope"),
            format!("{other:?} is not a scope; use \"global\" or \"workspace\""),
        )),
    }
}

fn check_rule_id(id: &str, key: &str) -> Result<()> {
    if id.is_empty() {
        return Err(ConfigError::invalid(
            key,
            "must not be empty (omit it to get a generated id)",
        ));
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
    {
        return Err(ConfigError::invalid(
            key,
            format!("{id:?} may only contain letters, digits, '-', '_', '.' and ':'"),
        ));
    }
    for prefix in [CONFIG_PREFIX, OPERATOR_PREFIX] {
        if id.starts_with(prefix) {
            return Err(ConfigError::invalid(
                key,
                format!(
                    "{id:?} starts with the reserved prefix {prefix:?} ({CONFIG_PREFIX} is for rules without an id, {OPERATOR_PREFIX} for operator rules)"
                ),
            ));
        }
    }
    Ok(())
}

/// A throwaway global rule holding one condition, to validate it alone.
fn probe_rule(id: &str, matcher: RuleMatch) -> Rule {
    Rule {
        id: id.to_owned(),
        scope: Scope::Global,
        matcher,
        action: RuleAction::Ask,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Vec<RawRule> {
        #[derive(Deserialize)]
        struct File {
            rule: Vec<RawRule>,
        }
        toml::from_str::<File>(text).expect("toml").rule
    }

    #[test]
    fn defaults_and_conversion() {
        let rules = rules(
            raw(r#"
                [[rule]]
                action = "allow"
                kind = "read"
                paths = ["**"]
                [[rule]]
                id = "git-ok"
                workspace = "api"
                action = "allow"
                kind = "execute"
                command_prefix = "git "
                [[rule]]
                scope = "global"
                action = "deny"
                command_regex = '^rm\s+-rf'
                paths = ["secrets/**"]
            "#),
            &["api"],
            &[],
        )
        .expect("valid");
        assert_eq!(rules[0].id, "cfg-0");
        assert_eq!(rules[0].scope, Scope::Global);
        assert_eq!(rules[0].matcher.kind.as_deref(), Some("read"));
        assert_eq!(rules[1].id, "git-ok");
        assert_eq!(rules[1].scope, Scope::Workspace("api".into()));
        assert_eq!(rules[1].matcher.command_prefix.as_deref(), Some("git "));
        assert_eq!(rules[2].id, "cfg-2");
        assert_eq!(rules[2].action, RuleAction::Deny);
        assert_eq!(rules[2].matcher.paths, ["secrets/**"]);
    }

    #[test]
    fn reserved_and_malformed_ids() {
        for (id, fragment) in [
            ("cfg-1", "reserved prefix"),
            ("r-0000", "reserved prefix"),
            ("", "must not be empty"),
            ("a b", "may only contain"),
        ] {
            let err = check_rule_id(id, "k").expect_err(id);
            assert!(err.to_string().contains(fragment), "{id}: {err}");
        }
        check_rule_id("allow-docs.v2:x_y", "k").expect("ok");
    }
}
