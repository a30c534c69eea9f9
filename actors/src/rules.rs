//! Server-owned approval rules and approval modes.
//!
//! Agents' own "allow always" is per call and inconsistent, so agent-intercom
//! keeps its own rules. A rule has a scope (global, workspace, session), a
//! match (ACP tool kind, path globs inside the workspace, a command prefix or
//! regex for `execute`, an agent id) and an action (allow, ask, deny).
//!
//! Evaluation order (documented in ARCHITECTURE.md, tested table-driven):
//! 1. Only rules whose scope covers the request and whose match fits count.
//! 2. Any matching `deny` wins, whatever its scope (deny beats allow).
//! 3. Otherwise the most specific scope wins (session > workspace > global);
//!    within one scope `ask` beats `allow`.
//! 4. With no matching rule the session's mode decides: `ask` asks,
//!    `auto-edits` allows `read`/`edit`/`search` kinds whose paths are all
//!    inside the workspace, `auto` allows everything.

use std::path::{Path, PathBuf};
use std::sync::PoisonError;

use serde::{Deserialize, Serialize};

use crate::model::SessionId;

pub mod gitconfig;

/// The current rule set, shared by every session; replaced as a whole.
#[derive(Debug, Clone, Default)]
pub struct SharedRules(std::sync::Arc<std::sync::RwLock<std::sync::Arc<Vec<Rule>>>>);

impl SharedRules {
    /// A rule set holding `rules`.
    pub fn new(rules: Vec<Rule>) -> Self {
        let shared = Self::default();
        shared.set(rules);
        shared
    }

    /// Replaces the rules.
    pub fn set(&self, rules: Vec<Rule>) {
        // A poisoned lock still holds a whole list (it is only ever
        // replaced): a new deny rule is never skipped for it.
        let mut guard = self.0.write().unwrap_or_else(PoisonError::into_inner);
        *guard = std::sync::Arc::new(rules);
    }

    /// The rules now.
    pub fn current(&self) -> std::sync::Arc<Vec<Rule>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Who a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "scope", content = "scope_id", rename_all = "snake_case")]
pub enum Scope {
    /// Every session.
    Global,
    /// Sessions of one workspace.
    Workspace(String),
    /// One session.
    Session(SessionId),
}

impl Scope {
    fn rank(&self) -> u8 {
        match self {
            Scope::Global => 0,
            Scope::Workspace(_) => 1,
            Scope::Session(_) => 2,
        }
    }

    fn covers(&self, facts: &RequestFacts) -> bool {
        match self {
            Scope::Global => true,
            Scope::Workspace(w) => w == &facts.workspace,
            Scope::Session(s) => s == &facts.session,
        }
    }
}

/// What a rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// Answer with the first allow option.
    Allow,
    /// Ask the operator.
    Ask,
    /// Answer with the first reject option.
    Deny,
}

impl RuleAction {
    /// Stored / wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleAction::Allow => "allow",
            RuleAction::Ask => "ask",
            RuleAction::Deny => "deny",
        }
    }
}

/// Kinds of action that work on named files, reads and searches included:
/// an allow rule for one of them names its files (a remembered rule, a
/// rule in `config.toml`). (The modes' own list, `FILE_KINDS`, is the kinds
/// that change files.)
pub const KINDS_ON_FILES: &[&str] = &["read", "edit", "delete", "move", "search"];

/// Whether `command_regex` matches an empty command, and so any command
/// (an unanchored `.*`, `x?`, the empty pattern).
pub fn matches_every_command(command_regex: &str) -> bool {
    regex::Regex::new(command_regex).is_ok_and(|re| re.is_match(""))
}

/// The conditions of a rule; empty conditions match anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuleMatch {
    /// ACP tool kind: read, edit, delete, move, search, execute, fetch, think, other.
    pub kind: Option<String>,
    /// Globs over workspace-relative paths; every path of the request must match one.
    pub paths: Vec<String>,
    /// For execute: the command must start with this.
    pub command_prefix: Option<String>,
    /// For execute: the command must match this regex.
    pub command_regex: Option<String>,
    /// Agent profile id.
    pub agent: Option<String>,
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// Stable id (`cfg-3` for config rules, `r-...` for operator rules).
    pub id: String,
    /// Who it applies to.
    #[serde(flatten)]
    pub scope: Scope,
    /// When it applies.
    #[serde(rename = "match")]
    pub matcher: RuleMatch,
    /// What it does.
    pub action: RuleAction,
}

/// ACP tool kinds a rule may name.
pub const RULE_KINDS: [&str; 10] = [
    "read",
    "edit",
    "delete",
    "move",
    "search",
    "execute",
    "think",
    "fetch",
    "switch_mode",
    "other",
];

/// A rule that cannot be used, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rule {id}: {reason}")]
pub struct RuleError {
    /// The rule.
    pub id: String,
    /// What is wrong.
    pub reason: String,
}

impl Rule {
    /// Checks the kind is a tool kind and globs and regexes compile: a rule
    /// that could never match would look like it guards something.
    pub fn validate(&self) -> Result<(), RuleError> {
        let err = |reason: String| RuleError {
            id: self.id.clone(),
            reason,
        };
        // An allow rule with no condition is approval mode `auto` for its
        // scope. Refused, so that a config file read half-written (a
        // `[[rule]]` saved before its conditions: a probe's slow write
        // approved a pending edit that way) fails to load instead.
        if self.action == RuleAction::Allow && self.matcher == RuleMatch::default() {
            return Err(err(
                "an allow rule with no condition would allow every request in its scope: give it \
                 one (kind, paths, command_prefix, command_regex or agent), or set approval mode \
                 `auto` (a workspace's `approval_mode`, or the session's mode) if that is what you mean"
                    .to_owned(),
            ));
        }
        if let Some(kind) = &self.matcher.kind
            && !RULE_KINDS.contains(&kind.as_str())
        {
            return Err(err(format!(
                "{kind:?} is not a tool kind; use one of {}",
                RULE_KINDS.join(", ")
            )));
        }
        for g in &self.matcher.paths {
            globset::Glob::new(g).map_err(|e| err(format!("bad path glob {g:?}: {e}")))?;
        }
        if let Some(r) = &self.matcher.command_regex {
            regex::Regex::new(r).map_err(|e| err(format!("bad command_regex {r:?}: {e}")))?;
        }
        Ok(())
    }

    fn matches(&self, facts: &RequestFacts) -> bool {
        let m = &self.matcher;
        if !self.scope.covers(facts) {
            return false;
        }
        if m.kind
            .as_deref()
            .is_some_and(|k| Some(k) != facts.kind.as_deref())
        {
            return false;
        }
        if m.agent.as_deref().is_some_and(|a| a != facts.agent) {
            return false;
        }
        if !m.paths.is_empty() && !paths_match(&m.paths, facts) {
            return false;
        }
        if let Some(prefix) = &m.command_prefix
            && !self.command_matches(facts, |c| self.starts_with_command(c, prefix))
        {
            return false;
        }
        if let Some(re) = &m.command_regex {
            let Ok(re) = regex::Regex::new(re) else {
                return false;
            };
            if !self.command_matches(facts, |c| re.is_match(c)) {
                return false;
            }
        }
        true
    }

    /// Whether `command` starts with `prefix`. For an allow rule the
    /// prefix must end at a word boundary (`git status` allows
    /// `git status -s`, not `git statusx`) unless it ends in a space; a deny
    /// or ask rule matches any command that starts with it (`rm` also holds
    /// `rmdir`).
    fn starts_with_command(&self, command: &str, prefix: &str) -> bool {
        let Some(rest) = command.trim_start().strip_prefix(prefix) else {
            return false;
        };
        self.action != RuleAction::Allow
            || rest.is_empty()
            || prefix.ends_with(char::is_whitespace)
            || rest.starts_with(char::is_whitespace)
    }

    /// Whether the request's command passes `test`. An allow rule vouches
    /// for one command: a command line that chains, pipes, substitutes or
    /// redirects ([`SHELL_CONTROL`]) never matches it, or a remembered
    /// `git status` would allow `git status && rm -rf ~`. A deny or ask rule
    /// matches the whole line or any command in it.
    fn command_matches(&self, facts: &RequestFacts, test: impl Fn(&str) -> bool) -> bool {
        let Some(command) = facts.command.as_deref() else {
            return false;
        };
        if self.action == RuleAction::Allow {
            // `2>&1` only joins the command's own error output to its
            // output: agents add it to nearly every command they run.
            let plain = command.replace(" 2>&1", "");
            return !plain.contains(SHELL_CONTROL) && test(&plain);
        }
        test(command) || command_segments(command).any(|c| test(c) || test(&command_words(c)))
    }
}

/// Characters with which a shell runs more than one command, or more than
/// the command written: separators, pipes, background, substitutions,
/// redirections, subshells and line breaks.
pub const SHELL_CONTROL: &[char] = &[';', '&', '|', '`', '$', '<', '>', '(', ')', '\n', '\r'];

/// The pieces of a command line between [`SHELL_CONTROL`] characters and
/// braces, trimmed: what a deny rule is also held against.
fn command_segments(command: &str) -> impl Iterator<Item = &str> {
    command
        .split(|c| SHELL_CONTROL.contains(&c) || c == '{' || c == '}')
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// Words that run the command after them (or start a clause whose command
/// follows): `then rm -rf /` runs `rm -rf /`.
const COMMAND_PREFIXES: &[&str] = &[
    "then", "do", "else", "elif", "if", "while", "until", "!", "time", "command", "builtin",
    "exec", "nohup", "env", "sudo", "nice", "xargs",
];

/// The command a piece of a command line runs, as a deny rule should see
/// it: runs of blanks made one space, leading clause words, wrappers
/// ([`COMMAND_PREFIXES`]) and `NAME=value` assignments dropped, and a
/// leading `\` (which only skips aliases) removed. A deny rule is a
/// seatbelt, not a sandbox: a shell can always spell a command another way.
fn command_words(segment: &str) -> String {
    let words: Vec<&str> = segment.split_whitespace().collect();
    let first = words
        .iter()
        .position(|w| !COMMAND_PREFIXES.contains(w) && !is_assignment(w))
        .unwrap_or(words.len());
    let line = words[first..].join(" ");
    match line.strip_prefix('\\') {
        Some(rest) => rest.to_owned(),
        None => line,
    }
}

/// `NAME=value`, as before a command.
fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

fn paths_match(globs: &[String], facts: &RequestFacts) -> bool {
    if facts.paths.is_empty() || !facts.paths_inside {
        return false;
    }
    let mut builder = globset::GlobSetBuilder::new();
    for g in globs {
        match globset::Glob::new(g) {
            Ok(glob) => {
                builder.add(glob);
            }
            Err(_) => return false,
        }
    }
    let Ok(set) = builder.build() else {
        return false;
    };
    facts.paths.iter().all(|p| set.is_match(Path::new(p)))
}

/// The most paths one request may name: each is resolved on the
/// filesystem when rules judge it.
pub const MAX_REQUEST_PATHS: usize = 256;

/// What is known about a request when rules are evaluated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// ACP tool kind, when known.
    pub kind: Option<String>,
    /// Paths relative to the workspace.
    pub paths: Vec<String>,
    /// True when every path resolved inside the workspace.
    pub paths_inside: bool,
    /// True when a path is one of the server's own files (database, data
    /// directory, token, config, log): never decided by an allow rule or a mode.
    pub server_file: bool,
    /// The command of an execute request.
    pub command: Option<String>,
    /// Agent profile id.
    pub agent: String,
    /// Workspace id.
    pub workspace: String,
    /// Session id.
    pub session: SessionId,
    /// The workspace's directory, when known: `auto-edits` reads its git
    /// configuration for where hooks run ([`gitconfig`]).
    pub root: Option<PathBuf>,
    /// The paths as the agent named them (workspace-relative, tidied as
    /// text), when they differ from where they lead (`paths`): a protected
    /// name reached through a link (`.vscode` linked to `editor/vscode`)
    /// counts under either name.
    pub written: Vec<String>,
}

/// Per-session approval mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalMode {
    /// Ask for everything no rule decides.
    #[default]
    Ask,
    /// Allow reads and edits inside the workspace; ask for the rest.
    AutoEdits,
    /// Allow everything no deny rule forbids.
    Auto,
}

impl ApprovalMode {
    /// Stored / wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalMode::Ask => "ask",
            ApprovalMode::AutoEdits => "auto-edits",
            ApprovalMode::Auto => "auto",
        }
    }

    /// Parses a stored / user-given name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ask" => Some(ApprovalMode::Ask),
            "auto-edits" | "auto_edits" => Some(ApprovalMode::AutoEdits),
            "auto" => Some(ApprovalMode::Auto),
            _ => None,
        }
    }

    /// Whether this mode asks the operator for more than `other` (`ask`
    /// more than `auto-edits`, which asks more than `auto`).
    pub fn asks_more_than(self, other: ApprovalMode) -> bool {
        self.strictness() > other.strictness()
    }

    /// Higher asks more.
    fn strictness(self) -> u8 {
        match self {
            ApprovalMode::Auto => 0,
            ApprovalMode::AutoEdits => 1,
            ApprovalMode::Ask => 2,
        }
    }
}

/// The outcome of evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// What to do.
    pub action: RuleAction,
    /// The rule that decided (`None`: the mode or the default).
    pub rule: Option<String>,
    /// A short explanation for the thread / audit.
    pub why: String,
}

/// Evaluates `rules` and `mode` for one request.
pub fn evaluate(rules: &[Rule], mode: ApprovalMode, facts: &RequestFacts) -> Verdict {
    let matching: Vec<&Rule> = rules.iter().filter(|r| r.matches(facts)).collect();
    if let Some(deny) = matching.iter().find(|r| r.action == RuleAction::Deny) {
        return Verdict {
            action: RuleAction::Deny,
            rule: Some(deny.id.clone()),
            why: format!("denied by rule {}", deny.id),
        };
    }
    if facts.server_file {
        return Verdict {
            action: RuleAction::Ask,
            rule: None,
            why: "it names one of agent-intercom's own files, so a human decides".into(),
        };
    }
    let best = matching
        .iter()
        .max_by_key(|r| (r.scope.rank(), r.action == RuleAction::Ask));
    if let Some(rule) = best {
        let verb = if rule.action == RuleAction::Allow {
            "allowed"
        } else {
            "asked"
        };
        return Verdict {
            action: rule.action,
            rule: Some(rule.id.clone()),
            why: format!("{verb} by rule {}", rule.id),
        };
    }
    mode_verdict(mode, facts)
}

/// Evaluates a request that announces file changes (diffs) whatever kind
/// it claims: judged as what it says *and* as an `edit` of the same paths,
/// the stricter verdict wins (deny over ask over allow). The kind is the
/// agent's word; the diffs are what an allowed request lets it write
/// without asking again. A `read` carrying a diff for `.git/hooks/pre-commit`
/// was allowed by auto-edits (and by an "allow read `**`" rule, or an
/// execute rule for `git status`), and the hook was written.
pub fn evaluate_changes(rules: &[Rule], mode: ApprovalMode, facts: &RequestFacts) -> Verdict {
    let claimed = evaluate(rules, mode, facts);
    if facts.kind.as_deref() == Some("edit") {
        return claimed;
    }
    let as_edit = RequestFacts {
        kind: Some("edit".into()),
        command: None,
        ..facts.clone()
    };
    let changes = evaluate(rules, mode, &as_edit);
    let rank = |v: &Verdict| match v.action {
        RuleAction::Allow => 0,
        RuleAction::Ask => 1,
        RuleAction::Deny => 2,
    };
    if rank(&changes) > rank(&claimed) {
        Verdict {
            why: format!("as a change to files: {}", changes.why),
            ..changes
        }
    } else {
        claimed
    }
}

/// Kinds whose requests are about files: without a path they are not
/// automatically allowed (there is nothing to check them against).
const FILE_KINDS: &[&str] = &["edit", "delete", "move"];

/// Names (a file or a directory, at any depth) of workspace files that
/// tools run code from when they next touch the workspace: `.git/config`
/// (`core.fsmonitor`, `core.pager`, aliases) and git hooks, direnv's
/// `.envrc` and mise's config, editor task and settings folders (and vim's
/// local config), hook managers, the coding agents' own project settings
/// (Claude Code's hooks and `.mcp.json` servers, Gemini CLI's and Cursor's
/// MCP servers: the next agent started here runs them), Cargo's config
/// (runners, aliases) and build scripts (rust-analyzer runs them when the
/// project is opened). Changing one is as good as running a command, which
/// auto-edits does not allow.
const RUNS_CODE: &[&str] = &[
    ".git",
    ".envrc",
    "mise.toml",
    ".mise.toml",
    ".mise",
    ".vscode",
    ".idea",
    ".zed",
    ".exrc",
    ".nvimrc",
    ".nvim.lua",
    ".husky",
    ".devcontainer",
    ".pre-commit-config.yaml",
    ".claude",
    ".mcp.json",
    ".gemini",
    ".cursor",
    ".cargo",
    "build.rs",
    // Later additions: more hook managers, toolchain files that name
    // binaries, CI workflows and submodules, and more agents' and editors'
    // project settings (MCP servers, hooks, local Lisp/Lua evaluated on open).
    "lefthook.yml",
    "lefthook.yaml",
    ".lefthook.yml",
    ".overcommit.yml",
    "rust-toolchain",
    "rust-toolchain.toml",
    ".tool-versions",
    ".gitmodules",
    ".github",
    ".roo",
    ".amazonq",
    ".kiro",
    ".continue",
    ".windsurf",
    ".codex",
    ".helix",
    ".dir-locals.el",
    ".lazy.lua",
    "opencode.json",
    // After a re-check: hook managers' other names, other version control
    // systems' configs, more agents' settings, package managers that run
    // what their config names, more CI.
    "lefthook-local.yml",
    "lefthook-local.yaml",
    ".lefthook.yaml",
    "lefthook.toml",
    "lefthook.json",
    ".githooks",
    ".hg",
    ".jj",
    ".qwen",
    ".opencode",
    "opencode.jsonc",
    ".crush.json",
    ".aider.conf.yml",
    "mise.local.toml",
    ".mise.local.toml",
    "rust-analyzer.toml",
    ".yarnrc.yml",
    ".pnpmfile.cjs",
    ".npmrc",
    ".gitlab-ci.yml",
    ".trunk",
    // From a probe: siblings of names above, and configs that editors or
    // their extensions run as code when the workspace is opened.
    ".dir-locals-2.el",
    ".yarnrc",
    ".devcontainer.json",
    ".config",
    "mise",
    ".rtx.toml",
    "mise.dev.toml",
    ".mise.dev.toml",
    "eslint.config.js",
    "eslint.config.mjs",
    "eslint.config.cjs",
    "eslint.config.ts",
    ".eslintrc.js",
    ".eslintrc.cjs",
    "prettier.config.js",
    "prettier.config.mjs",
    "prettier.config.cjs",
    ".prettierrc.js",
    ".prettierrc.mjs",
    ".prettierrc.cjs",
    ".gitattributes",
    ".envrc.local",
    ".vimrc",
    ".gvimrc",
    ".lvimrc",
    // Code an editor's extensions load from the workspace itself: the
    // ESLint extension runs `node_modules/eslint`, the Python extension the
    // `.venv` interpreter (which runs every `.pth` file in it).
    "node_modules",
    ".venv",
    "venv",
];

/// Name endings of files that run code when touched, wherever they lie:
/// a VS Code workspace file carries tasks and settings like `.vscode/`.
const RUNS_CODE_SUFFIXES: &[&str] = &[".code-workspace"];

/// File names that make a directory a git repository, or configure one,
/// wherever they lie: git takes any directory holding `HEAD`, `objects/` and
/// `refs/` for a (bare) repository and obeys its `config` when someone runs
/// git there. A probe's agent wrote `HEAD`, `config` (with a
/// `core.fsmonitor` command), `objects/` and `refs/` into the workspace
/// itself; the next `git status` in it ran the command. As whole names
/// only: `config/routes.rb` is an ordinary edit.
const GIT_DIR_FILES: &[&str] = &["HEAD", "config", "config.worktree"];

/// True when `path` (workspace-relative) is or lies in one of [`RUNS_CODE`],
/// or names one of [`GIT_DIR_FILES`].
fn runs_code_when_touched(path: &str) -> bool {
    let path = std::path::Path::new(path);
    let named = |list: &[&str], name: &std::ffi::OsStr| {
        name.to_str()
            .is_some_and(|n| list.iter().any(|r| n.eq_ignore_ascii_case(r)))
    };
    let suffixed = |name: &std::ffi::OsStr| {
        name.to_str().is_some_and(|n| {
            let n = n.to_ascii_lowercase();
            RUNS_CODE_SUFFIXES.iter().any(|s| n.ends_with(s))
        })
    };
    path.file_name()
        .is_some_and(|n| named(GIT_DIR_FILES, n) || suffixed(n))
        || path.components().any(|c| match c {
            std::path::Component::Normal(name) => named(RUNS_CODE, name),
            _ => false,
        })
}

/// True when a path, where it leads or as written, lies under one of the
/// places `protected` finds in the workspace: where its git configuration
/// runs hooks from ([`gitconfig::protected`]), or where a protected name at
/// its top links to ([`linked_code`]).
fn touches(facts: &RequestFacts, protected: fn(&Path) -> Vec<PathBuf>) -> bool {
    let Some(root) = &facts.root else {
        return false;
    };
    let protected = protected(root);
    !protected.is_empty()
        && facts
            .paths
            .iter()
            .chain(&facts.written)
            .any(|p| gitconfig::covers(&protected, p))
}

/// The most entries of the workspace's top directory looked at for links.
const TOP_ENTRIES: usize = 4096;

/// Where the protected names at the workspace's top ([`RUNS_CODE`]) lead
/// when they are links (`.vscode` -> `editor/vscode`): an edit of
/// `editor/vscode/tasks.json` is one of `.vscode/tasks.json`.
fn linked_code(root: &Path) -> Vec<PathBuf> {
    let Ok(root) = root.canonicalize() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    let links: Vec<PathBuf> = entries
        .take(TOP_ENTRIES)
        .flatten()
        .filter(|entry| {
            let protected = entry
                .file_name()
                .to_str()
                .is_some_and(|n| RUNS_CODE.iter().any(|r| n.eq_ignore_ascii_case(r)));
            protected && entry.file_type().is_ok_and(|t| t.is_symlink())
        })
        .map(|entry| root.join(entry.file_name()))
        .collect();
    gitconfig::inside(&root, &links)
}

/// What the session's mode says when no rule matched. Modes never leave
/// their scope: a file-kind request naming no path, a path outside the
/// workspace or a server file is always asked; auto-edits also asks before
/// a change to a file that runs code ([`RUNS_CODE`]).
fn mode_verdict(mode: ApprovalMode, facts: &RequestFacts) -> Verdict {
    let ask = |why: &str| Verdict {
        action: RuleAction::Ask,
        rule: None,
        why: why.into(),
    };
    let kind = facts.kind.as_deref().unwrap_or("");
    if mode != ApprovalMode::Ask {
        if facts.server_file {
            return ask("it names one of agent-intercom's own files");
        }
        if !facts.paths_inside {
            return ask("a path lies outside the workspace");
        }
        if FILE_KINDS.contains(&kind) && facts.paths.is_empty() {
            return ask("a file change that names no path");
        }
    }
    match mode {
        ApprovalMode::Auto => Verdict {
            action: RuleAction::Allow,
            rule: None,
            why: "allowed by mode auto".into(),
        },
        ApprovalMode::AutoEdits
            if kind == "edit"
                && (facts
                    .paths
                    .iter()
                    .chain(&facts.written)
                    .any(|p| runs_code_when_touched(p))
                    || touches(facts, linked_code)) =>
        {
            ask(
                "it changes a file that runs code when git or an editor next touches the workspace (.git, .envrc, .vscode, ...)",
            )
        }
        ApprovalMode::AutoEdits if kind == "edit" && touches(facts, gitconfig::protected) => ask(
            "it changes a file under the repository's core.hooksPath, or a git config file it includes",
        ),
        ApprovalMode::AutoEdits if matches!(kind, "read" | "edit" | "search") => Verdict {
            action: RuleAction::Allow,
            rule: None,
            why: "allowed by mode auto-edits".into(),
        },
        _ => ask("no rule matched"),
    }
}

#[cfg(test)]
mod tests;
