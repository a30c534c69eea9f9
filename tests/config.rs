//! The configuration file: defaults, the shipped example, path resolution and
//! validation errors that name their key.

use agent_intercom::config::{
    ApprovalMode, Config, ConfigError, DiscoverySection, MAX_DISCOVERY_DEPTH, check_config,
};
use intercom_actors::model::{Framing, Protocol, SessionId};
use intercom_actors::rules::{RequestFacts, Rule, RuleAction, RuleMatch, Scope, Verdict, evaluate};
use std::fs;
use std::path::{Path, PathBuf};

fn canon(p: &Path) -> PathBuf {
    fs::canonicalize(p).unwrap()
}

/// A temp dir holding `config.toml` with `text`.
fn write_config(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    fs::write(&path, text).unwrap();
    (dir, path)
}

const AGENT: &str = "[[agent]]\nid = \"a\"\ncommand = \"a\"\n";

#[test]
fn minimal_file_gets_all_documented_defaults() {
    let (dir, path) = write_config("");
    let cfg = Config::load(&path).unwrap();
    let base = canon(dir.path());

    assert_eq!(cfg.workspace_root, base);
    assert_eq!(cfg.server.bind.to_string(), "127.0.0.1:3000");
    assert_eq!(cfg.database.path, base.join("data/agent-intercom.db"));
    assert_eq!(cfg.slack.api_url, None);
    assert!(cfg.slack.operators.is_empty());
    assert!(cfg.agents.is_empty());
    assert!(cfg.workspaces.is_empty());
    assert_eq!(cfg.default_agent, None);
    assert_eq!(cfg.source.as_deref(), Some(path.as_path()));
    assert!(cfg.workspace_modes.is_empty());
    assert_eq!(
        cfg.discovery,
        DiscoverySection {
            enabled: false,
            depth: 2
        }
    );
    assert!(cfg.discovered.is_empty());
    assert!(cfg.rules.is_empty());

    let l = &cfg.limits;
    assert_eq!(
        (
            l.max_sessions,
            l.startup_timeout_secs,
            l.prompt_timeout_secs,
            l.idle_timeout_secs,
            l.shutdown_grace_secs,
            l.max_line_bytes,
            l.inbound_messages_per_sec
        ),
        (5, 30, 60, 1800, 10, 1_048_576, 1000)
    );
    let s = &cfg.stall;
    assert_eq!(
        (s.inactivity_secs, s.escalation_secs, s.max_nudges),
        (300, 120, 3)
    );
    assert_eq!(
        s.nudge_text,
        "Continue working on the current task. Pick up where you left off."
    );
    let sup = &cfg.supervision;
    assert_eq!(
        (
            sup.max_restarts,
            sup.restart_window_secs,
            sup.backoff_initial_secs,
            sup.backoff_max_secs
        ),
        (3, 600, 1, 60)
    );

    let mut expected = Config::default_for_dir(dir.path());
    expected.source = Some(path.clone());
    assert_eq!(cfg, expected);
}

#[test]
fn agent_and_workspace_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::from_toml_str(
        "[[agent]]\nid = \"x\"\ncommand = \"x\"\n[[workspace]]\nid = \"w\"\npath = \".\"\n",
        dir.path(),
    )
    .unwrap();
    let a = &cfg.agents[0];
    assert!(a.args.is_empty() && a.env.is_empty() && a.auth_method.is_none());
    assert_eq!((a.protocol, a.framing), (Protocol::Acp, Framing::Ndjson));
    let w = &cfg.workspaces[0];
    assert_eq!(w.channel_id, "");
    assert_eq!(
        (w.label.as_deref(), w.default_agent.as_deref()),
        (None, None)
    );
    assert_eq!(w.path, canon(dir.path()));
    assert_eq!(
        cfg.default_agent.as_deref(),
        Some("x"),
        "first agent is the default"
    );
    assert_eq!(cfg.source, None);
}

#[test]
fn example_config_parses_and_validates() {
    let path = manifest_dir().join("config.toml.example");
    let cfg = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let repo = canon(&manifest_dir());

    assert_eq!(cfg.workspace_root, repo);
    assert_eq!(cfg.database.path, repo.join("data/agent-intercom.db"));
    assert_eq!(cfg.agents.len(), 1);
    let agent = cfg.agent("scripted").unwrap();
    assert_eq!(
        PathBuf::from(&agent.command),
        repo.join("target/debug/scripted-agent")
    );
    assert_eq!(agent.protocol, Protocol::Acp);
    let ws = cfg.workspace("demo").unwrap();
    assert_eq!(ws.path, repo.join("demo"));
    // The shipped layout keeps the data directory and the config out of it.
    assert!(
        cfg.exposure_warnings().is_empty(),
        "{:?}",
        cfg.exposure_warnings()
    );
    assert_eq!(ws.channel_id, "");
    assert_eq!(cfg.default_agent_for(Some(ws)).unwrap().id, "scripted");
    assert_eq!(cfg.default_agent.as_deref(), Some("scripted"));
    assert_eq!(cfg.approval_mode_for("demo"), ApprovalMode::Ask);
    assert!(
        cfg.rules.is_empty(),
        "the example's rules are commented out"
    );

    // The example spells out every default.
    let defaults = Config::from_toml_str("", &repo).unwrap();
    assert_eq!(cfg.server, defaults.server);
    assert_eq!(cfg.slack, defaults.slack);
    assert_eq!(cfg.limits, defaults.limits);
    assert_eq!(cfg.stall, defaults.stall);
    assert_eq!(cfg.supervision, defaults.supervision);
    assert_eq!(cfg.discovery, defaults.discovery);

    let summary = check_config(&path).unwrap();
    assert!(
        summary.starts_with(&format!(
            "config OK: 1 agent, 1 workspace, database {}, bind 127.0.0.1:3000",
            repo.join("data/agent-intercom.db").display()
        )),
        "{summary}"
    );
}

#[test]
fn commented_out_example_agents_are_valid_too() {
    // Uncomment every `# key = value` / `# [[table]]` line in the example's
    // agent and workspace sections and check the result still validates.
    let text = fs::read_to_string(manifest_dir().join("config.toml.example")).unwrap();
    let uncommented: String = text
        .lines()
        .map(|line| {
            let rest = line.strip_prefix("# ").unwrap_or(line);
            let is_setting = rest.starts_with("[[")
                || [
                    "id",
                    "command",
                    "args",
                    "env",
                    "protocol",
                    "framing",
                    "auth_method",
                    "path",
                    "channel_id",
                    "label",
                    "default_agent",
                    "approval_mode",
                    "scope",
                    "workspace",
                    "action",
                    "kind",
                    "paths",
                    "command_prefix",
                    "command_regex",
                    "agent",
                ]
                .iter()
                .any(|k| rest.starts_with(&format!("{k} = ")));
            if line.starts_with("# ") && is_setting {
                rest
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let repo = manifest_dir();
    let cfg = Config::from_toml_str(&uncommented, &repo).unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<&str> = cfg.agents.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, ["scripted", "claude", "gemini", "copilot", "legacy"]);
    assert_eq!(cfg.agent("legacy").unwrap().framing, Framing::Lsp);
    assert_eq!(cfg.agent("legacy").unwrap().protocol, Protocol::Intercom);
    assert_eq!(cfg.agent("claude").unwrap().command, "npx");
    assert_eq!(cfg.workspaces.len(), 2);
    assert_eq!(cfg.approval_mode_for("api"), ApprovalMode::AutoEdits);
    let ids: Vec<&str> = cfg.rules.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["no-rm-rf", "cfg-1", "cfg-2", "ask-migrations"]);

    // The example rules do what their comments say.
    let facts = |kind: &str, paths: &[&str], command: Option<&str>, agent: &str| RequestFacts {
        kind: Some(kind.into()),
        paths: paths.iter().map(|p| p.to_string()).collect(),
        paths_inside: true,
        server_file: false,
        command: command.map(str::to_owned),
        agent: agent.into(),
        workspace: "api".into(),
        session: SessionId::from("s-1"),
        root: None,
        written: Vec::new(),
    };
    let decide = |f: &RequestFacts, mode| {
        let Verdict { action, rule, .. } = evaluate(&cfg.rules, mode, f);
        (action, rule)
    };
    let rule = |id: &str| Some(id.to_owned());
    // Every spelling of a recursive delete, not only `-rf` (a probe had
    // `rm -fr build` allowed by mode auto with this rule loaded).
    for command in [
        "rm -rf /",
        "rm -fr build",
        "rm -Rf x",
        "rm -r -f x",
        "rm --recursive --force x",
        "rm -v -r x",
        "ls && rm -fr /",
    ] {
        assert_eq!(
            decide(
                &facts("execute", &[], Some(command), "claude"),
                ApprovalMode::Auto
            ),
            (RuleAction::Deny, rule("no-rm-rf")),
            "{command}"
        );
    }
    for command in ["rm -f notes.txt", "rm file-r", "rm --force x"] {
        assert_ne!(
            decide(
                &facts("execute", &[], Some(command), "claude"),
                ApprovalMode::Auto
            )
            .1,
            rule("no-rm-rf"),
            "{command}"
        );
    }
    assert_eq!(
        decide(
            &facts("read", &["src/main.rs"], None, "claude"),
            ApprovalMode::Ask
        ),
        (RuleAction::Allow, rule("cfg-1"))
    );
    assert_eq!(
        decide(
            &facts("execute", &[], Some("git diff HEAD"), "claude"),
            ApprovalMode::Ask
        ),
        (RuleAction::Allow, rule("cfg-2"))
    );
    assert_eq!(
        decide(
            &facts("execute", &[], Some("git push"), "claude"),
            ApprovalMode::Ask
        ),
        (RuleAction::Ask, None)
    );
    assert_eq!(
        decide(
            &facts("edit", &["migrations/1.sql"], None, "claude"),
            ApprovalMode::Auto
        ),
        (RuleAction::Ask, rule("ask-migrations"))
    );
    assert_eq!(
        decide(
            &facts("edit", &["migrations/1.sql"], None, "gemini"),
            ApprovalMode::Auto
        ),
        (RuleAction::Allow, None)
    );
}

#[test]
fn relative_paths_resolve_against_the_config_files_directory() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("etc");
    fs::create_dir_all(sub.join("proj")).unwrap();
    let path = sub.join("config.toml");
    fs::write(
        &path,
        "workspace_root = \".\"\n[database]\npath = \"../var/./db.sqlite\"\n\
         [[workspace]]\nid = \"p\"\npath = \"proj/../proj\"\n",
    )
    .unwrap();
    let cfg = Config::load(&path).unwrap();
    let base = canon(dir.path());
    assert_eq!(cfg.database.path, base.join("var/db.sqlite"));
    assert_eq!(cfg.workspace_root, base.join("etc"));
    assert_eq!(cfg.workspaces[0].path, base.join("etc/proj"));
}

#[test]
fn absolute_database_path_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let db = canon(dir.path()).join("x/y.db");
    let cfg = Config::from_toml_str(
        &format!("[database]\npath = {:?}\n", db.to_str().unwrap()),
        Path::new("/somewhere/else"),
    )
    .unwrap();
    assert_eq!(cfg.database.path, db);
}

/// Each invalid file yields `ConfigError::Invalid` naming this key.
#[test]
fn validation_errors_name_their_key() {
    let cases: &[(&str, String, &str, &str)] = &[
        (
            "duplicate workspace id",
            "[[workspace]]\nid = \"api\"\npath = \".\"\n[[workspace]]\nid = \"api\"\npath = \".\"\n".into(),
            "workspace[1].id",
            "config error at `workspace[1].id`: duplicate workspace id \"api\" (also used by workspace[0])",
        ),
        (
            "empty workspace id",
            "[[workspace]]\nid = \"\"\npath = \".\"\n".into(),
            "workspace[0].id",
            "must not be empty",
        ),
        (
            "blank workspace id",
            "[[workspace]]\nid = \"  \"\npath = \".\"\n".into(),
            "workspace[0].id",
            "must not be empty",
        ),
        (
            "duplicate channel",
            "[[workspace]]\nid = \"a\"\npath = \"a\"\nchannel_id = \"C1\"\n\
             [[workspace]]\nid = \"b\"\npath = \"b\"\nchannel_id = \"\"\n\
             [[workspace]]\nid = \"c\"\npath = \"c\"\nchannel_id = \"C1\"\n"
                .into(),
            "workspace[2].channel_id",
            "duplicate channel id \"C1\" (also used by workspace[0])",
        ),
        (
            "empty workspace path",
            "[[workspace]]\nid = \"a\"\npath = \"\"\n".into(),
            "workspace[0].path",
            "must not be empty",
        ),
        (
            "workspace path via ..",
            "workspace_root = \"root\"\n[[workspace]]\nid = \"a\"\npath = \"root/../elsewhere\"\n".into(),
            "workspace[0].path",
            "outside workspace_root",
        ),
        (
            "workspace default_agent unknown",
            format!("{AGENT}[[workspace]]\nid = \"w\"\npath = \".\"\ndefault_agent = \"nope\"\n"),
            "workspace[0].default_agent",
            "unknown agent \"nope\" (known: a)",
        ),
        (
            "top-level default_agent unknown",
            format!("default_agent = \"nope\"\n{AGENT}"),
            "default_agent",
            "unknown agent \"nope\"",
        ),
        (
            "default_agent with no agents",
            "default_agent = \"x\"\n".into(),
            "default_agent",
            "no [[agent]] profiles are defined",
        ),
        (
            "empty agent id",
            "[[agent]]\nid = \"\"\ncommand = \"x\"\n".into(),
            "agent[0].id",
            "must not be empty",
        ),
        (
            "duplicate agent id",
            format!("{AGENT}{AGENT}"),
            "agent[1].id",
            "duplicate agent id \"a\" (also used by agent[0])",
        ),
        (
            "empty command",
            "[[agent]]\nid = \"a\"\ncommand = \" \"\n".into(),
            "agent[0].command",
            "must not be empty",
        ),
        (
            "bad env name",
            "[[agent]]\nid = \"a\"\ncommand = \"a\"\nenv = [\"OK\", \"NOT-OK\"]\n".into(),
            "agent[0].env[1]",
            "not an environment variable name",
        ),
        (
            "slack secret passed to agent",
            "[[agent]]\nid = \"a\"\ncommand = \"a\"\nenv = [\"SLACK_BOT_TOKEN\"]\n".into(),
            "agent[0].env[0]",
            "never passed to agents",
        ),
        (
            "the operator's API token passed to agent",
            "[[agent]]\nid = \"a\"\ncommand = \"a\"\nenv = [\"HOME\", \"AGENT_INTERCOM_TOKEN\"]\n".into(),
            "agent[0].env[1]",
            "the operator's API token",
        ),
        (
            "an MCP workspace token passed to agent",
            "[[agent]]\nid = \"a\"\ncommand = \"a\"\nenv = [\"DEMO_MCP_TOKEN\"]\n\
             [[workspace]]\nid = \"demo\"\npath = \".\"\n\
             [mcp.workspace_token_env]\ndemo = \"DEMO_MCP_TOKEN\"\n".into(),
            "agent[0].env[0]",
            "an MCP workspace token",
        ),
        (
            "mcp is not a child-process protocol",
            "[[agent]]\nid = \"a\"\ncommand = \"a\"\nprotocol = \"mcp\"\n".into(),
            "agent[0].protocol",
            "\"acp\" or \"intercom\"",
        ),
        (
            "max_sessions 0",
            "[limits]\nmax_sessions = 0\n".into(),
            "limits.max_sessions",
            "at least 1",
        ),
        (
            "max_concurrent_starts 0",
            "[limits]\nmax_concurrent_starts = 0\n".into(),
            "limits.max_concurrent_starts",
            "at least 1",
        ),
        (
            "max_line_bytes too small",
            "[limits]\nmax_line_bytes = 1023\n".into(),
            "limits.max_line_bytes",
            "at least 1024 (got 1023)",
        ),
        (
            "backoff max below initial",
            "[supervision]\nbackoff_initial_secs = 10\nbackoff_max_secs = 5\n".into(),
            "supervision.backoff_max_secs",
            "at least supervision.backoff_initial_secs (10), got 5",
        ),
        (
            "escalation 0 with stall detection on",
            "[stall]\nescalation_secs = 0\n".into(),
            "stall.escalation_secs",
            "at least 1",
        ),
        (
            "bad bind",
            "[server]\nbind = \"localhost\"\n".into(),
            "server.bind",
            "\"localhost\" is not a socket address",
        ),
        (
            "bind without port",
            "[server]\nbind = \"127.0.0.1\"\n".into(),
            "server.bind",
            "not a socket address",
        ),
        (
            "token in file",
            "[slack]\nbot_token = \"xoxb-1\"\n".into(),
            "slack.bot_token",
            "set the SLACK_BOT_TOKEN environment variable",
        ),
        (
            "api_url not http",
            "[slack]\napi_url = \"slack.com/api\"\n".into(),
            "slack.api_url",
            "not an http(s) URL",
        ),
        (
            "empty operator",
            "[slack]\noperators = [\"U1\", \"\"]\n".into(),
            "slack.operators[1]",
            "not empty",
        ),
        (
            "bad workspace approval mode",
            "[[workspace]]\nid = \"a\"\npath = \".\"\napproval_mode = \"yolo\"\n".into(),
            "workspace[0].approval_mode",
            "\"yolo\" is not an approval mode; use \"ask\", \"auto-edits\" or \"auto\"",
        ),
        (
            "discovery depth 0",
            "[discovery]\nenabled = true\ndepth = 0\n".into(),
            "discovery.depth",
            "must be between 1",
        ),
        (
            "discovery depth too deep",
            format!("[discovery]\ndepth = {}\n", MAX_DISCOVERY_DEPTH + 1),
            "discovery.depth",
            "must be between 1",
        ),
    ];
    for (name, text, key, fragment) in cases {
        let dir = tempfile::tempdir().unwrap();
        let err = Config::from_toml_str(text, dir.path()).expect_err(name);
        assert!(
            matches!(&err, ConfigError::Invalid { key: k, .. } if k == key),
            "{name}: expected Invalid at `{key}`, got {err:?}"
        );
        let shown = err.to_string();
        assert!(
            shown.starts_with(&format!("config error at `{key}`: ")),
            "{name}: {shown}"
        );
        assert!(
            shown.contains(fragment),
            "{name}: {shown:?} lacks {fragment:?}"
        );
    }
}

#[test]
fn first_error_wins_in_a_fixed_order() {
    // Both agent and workspace problems: agents are checked first.
    let text = "[[agent]]\nid = \"\"\ncommand = \"x\"\n[[workspace]]\nid = \"\"\npath = \".\"\n";
    for _ in 0..3 {
        let err = Config::from_toml_str(text, Path::new("/")).unwrap_err();
        assert_eq!(err.key(), Some("agent[0].id"));
    }
}

#[test]
fn workspace_path_outside_root() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    fs::create_dir_all(root.join("inside")).unwrap();
    fs::create_dir_all(&outside).unwrap();

    let try_path = |p: &str| {
        Config::from_toml_str(
            &format!("workspace_root = \"root\"\n[[workspace]]\nid = \"w\"\npath = {p:?}\n"),
            tmp.path(),
        )
    };
    assert!(try_path("root/inside").is_ok());
    assert!(try_path("root").is_ok(), "the root itself is allowed");
    assert!(try_path("root/not-yet-created").is_ok());
    for bad in ["outside", "root/../outside", "/", "rootx"] {
        let err = try_path(bad).expect_err(bad);
        assert_eq!(err.key(), Some("workspace[0].path"), "{bad}: {err}");
    }
    // Absolute path inside is fine.
    assert!(try_path(root.join("inside").to_str().unwrap()).is_ok());
}

#[cfg(unix)]
#[test]
fn symlink_pointing_outside_root_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let outside = tempfile::tempdir().unwrap();
    fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("escape")).unwrap();
    std::os::unix::fs::symlink(root.join("."), root.join("self")).unwrap();

    let try_path = |p: &str| {
        Config::from_toml_str(
            &format!("workspace_root = \"root\"\n[[workspace]]\nid = \"w\"\npath = {p:?}\n"),
            tmp.path(),
        )
    };
    for bad in ["root/escape", "root/escape/sub", "root/escape/missing/dir"] {
        let err = try_path(bad).expect_err(bad);
        assert_eq!(err.key(), Some("workspace[0].path"), "{bad}: {err}");
        assert!(err.to_string().contains("outside workspace_root"), "{err}");
    }
    let ok = try_path("root/self").unwrap();
    assert_eq!(ok.workspaces[0].path, canon(&root));

    let cfg = Config::from_toml_str("workspace_root = \"root\"\n", tmp.path()).unwrap();
    assert!(cfg.is_under_root(&root));
    assert!(
        cfg.is_under_root(Path::new("sub/dir")),
        "relative to the root"
    );
    assert!(cfg.is_under_root(Path::new("self/x")));
    assert!(!cfg.is_under_root(Path::new("escape")));
    assert!(!cfg.is_under_root(&root.join("escape/new")));
    assert!(!cfg.is_under_root(Path::new("..")));
    assert!(!cfg.is_under_root(&root.join("../root2")));
    assert!(!cfg.is_under_root(outside.path()));
}

#[cfg(unix)]
#[test]
fn workspace_root_through_a_symlink_is_canonicalised() {
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    fs::create_dir_all(real.join("ws")).unwrap();
    std::os::unix::fs::symlink(&real, tmp.path().join("alias")).unwrap();
    let cfg = Config::from_toml_str(
        "workspace_root = \"alias\"\n[[workspace]]\nid = \"w\"\npath = \"real/ws\"\n",
        tmp.path(),
    )
    .unwrap();
    assert_eq!(cfg.workspace_root, canon(&real));
    assert_eq!(cfg.workspaces[0].path, canon(&real.join("ws")));
}

/// Unknown keys are parse errors naming the key, with a line number.
#[test]
fn unknown_keys_are_errors() {
    let cases = [
        (
            "top level",
            "workspace_roots = \".\"\n",
            "workspace_roots",
            1,
        ),
        (
            "in [limits]",
            "[limits]\nmax_session = 3\n",
            "max_session",
            2,
        ),
        (
            "in [[agent]]",
            "[[agent]]\nid = \"a\"\ncommand = \"a\"\nprotocl = \"acp\"\n",
            "protocl",
            4,
        ),
        ("in [server]", "[server]\nport = 3000\n", "port", 2),
        ("in [slack]", "[slack]\n\ntoken = \"x\"\n", "token", 3),
        (
            "unknown section",
            "[logging]\nlevel = \"x\"\n",
            "logging",
            1,
        ),
        (
            "agents spelled as plural",
            "[[agents]]\nid = \"a\"\n",
            "agents",
            1,
        ),
    ];
    for (name, text, key, line) in cases {
        let err = Config::from_toml_str(text, Path::new("/")).expect_err(name);
        let ConfigError::Parse { path, message } = &err else {
            panic!("{name}: expected Parse, got {err:?}");
        };
        assert_eq!(path, &None);
        assert!(
            message.contains(&format!("unknown field `{key}`")),
            "{name}: {message}"
        );
        assert!(
            message.contains(&format!("line {line}")),
            "{name}: {message}"
        );
        assert!(
            err.to_string().starts_with("cannot parse config: "),
            "{err}"
        );
    }
}

#[test]
fn bad_values_are_parse_errors_with_the_file_name() {
    let (_dir, path) = write_config("[limits]\nmax_sessions = \"five\"\n");
    let err = Config::load(&path).unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("cannot parse config file {}: ", path.display())),
        "{shown}"
    );
    assert!(shown.contains("line 2"), "{shown}");

    let err = Config::from_toml_str(
        "[[agent]]\nid = \"a\"\ncommand = \"a\"\nprotocol = \"ssh\"\n",
        Path::new("/"),
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
    assert!(err.to_string().contains("ssh"), "{err}");

    let err = Config::from_toml_str("not toml at all", Path::new("/")).unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
}

#[test]
fn check_config_on_a_missing_file_gives_the_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.toml");
    let err = check_config(&path).unwrap_err();
    assert!(matches!(err, ConfigError::Io { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("cannot read config file {}: ", path.display())),
        "{shown}"
    );
    assert!(
        shown.ends_with("; create one (config.toml.example in the repository has every setting, commented), or name another with --config"),
        "{shown}"
    );
}

/// A config that is a link to a missing file names the file to restore
/// (it said "create one from config.toml.example" of the link).
#[test]
fn a_dangling_config_link_names_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::os::unix::fs::symlink("etc/gone.toml", &path).unwrap();
    let shown = check_config(&path).unwrap_err().to_string();
    assert!(
        shown.ends_with(
            "; it is a symbolic link to etc/gone.toml, which does not exist: restore that file or point the link at one"
        ),
        "{shown}"
    );
}

/// `check-config` and `serve` agree: a time past a year is refused (a
/// probe's `shutdown_grace_secs = 18446744073709551615` passed and then
/// made `serve` panic), and an empty file, which `serve` starts on but a
/// running server refuses to reload, is warned about.
#[test]
fn check_config_refuses_what_serve_cannot_take_and_warns_of_an_empty_file() {
    let (_dir, path) = write_config("[limits]\nshutdown_grace_secs = 18446744073709551615\n");
    let err = check_config(&path).unwrap_err().to_string();
    assert!(err.contains("limits.shutdown_grace_secs"), "{err}");
    assert!(err.contains("must be at most"), "{err}");
    let (_dir, path) = write_config("# nothing yet\n");
    let summary = check_config(&path).unwrap();
    assert!(summary.contains("warning: the file is empty"), "{summary}");
}

/// A file that declares no workspace or no rule is loaded by `serve`, but a
/// running server that has some does not take that from a reload:
/// `check-config` says so, and only of what the file lacks.
#[test]
fn check_config_warns_of_what_a_reload_would_refuse_to_empty() {
    let agent = "[[agent]]\nid = \"a\"\ncommand = \"sh\"\n";
    let (_dir, path) = write_config(agent);
    let summary = check_config(&path).unwrap();
    assert!(
        summary.contains("note: the file declares no workspaces: `serve` starts on it, but a running server that has some refuses to reload it"),
        "{summary}"
    );
    assert!(
        summary.contains("note: the file declares no [[rule]]: `serve` starts on it; a running server that has rules reloads it and drops its allow rules, but keeps its deny and ask rules"),
        "{summary}"
    );
    assert!(!summary.contains("[[agent]]"), "{summary}");
    let rule =
        "[[rule]]\nid = \"r\"\naction = \"deny\"\nkind = \"execute\"\ncommand_prefix = \"rm \"\n";
    let (_dir, path) = write_config(&format!("{agent}{rule}"));
    let summary = check_config(&path).unwrap();
    assert!(!summary.contains("[[rule]]"), "{summary}");
}

/// An unreadable file is not told to be created.
#[cfg(unix)]
#[test]
fn an_unreadable_config_says_to_make_it_readable() {
    let e = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
    let err = ConfigError::Io {
        path: "/etc/x.toml".into(),
        source: e,
    }
    .to_string();
    assert!(err.contains("make it readable"), "{err}");
    assert!(!err.contains("create one"), "{err}");
}

#[test]
fn check_config_summarises() {
    let (dir, path) = write_config(
        "[server]\nbind = \"0.0.0.0:8080\"\n[slack]\napi_url = \"http://localhost:9999/api\"\noperators = [\"U1\"]\n\
         [[agent]]\nid = \"a\"\ncommand = \"a\"\n[[agent]]\nid = \"b\"\ncommand = \"b\"\n\
         [[workspace]]\nid = \"x\"\npath = \".\"\nchannel_id = \"C1\"\n\
         [[workspace]]\nid = \"y\"\npath = \".\"\n[[workspace]]\nid = \"z\"\npath = \".\"\n",
    );
    let summary = check_config(&path).unwrap();
    let db = canon(dir.path()).join("data/agent-intercom.db");
    assert!(
        summary.starts_with(&format!(
            "config OK: 2 agents, 3 workspaces, database {}, bind 0.0.0.0:8080",
            db.display()
        )),
        "{summary}"
    );
    assert!(summary.contains("default agent \"a\""), "{summary}");
    assert!(
        summary.contains("1 workspace bound to Slack channels, 1 Slack operator"),
        "{summary}"
    );
    assert!(
        summary.contains("Slack API http://localhost:9999/api/"),
        "{summary}"
    );
}

#[test]
fn slack_section() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::from_toml_str(
        "[slack]\napi_url = \"https://slack.example/api\"\noperators = [\"U1\", \"W2\"]\n",
        dir.path(),
    )
    .unwrap();
    assert_eq!(
        cfg.slack.api_url.as_deref(),
        Some("https://slack.example/api/")
    );
    assert_eq!(cfg.slack.operators, ["U1", "W2"]);
}

#[test]
fn lookups() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::from_toml_str(
        &format!(
            "default_agent = \"b\"\n{AGENT}[[agent]]\nid = \"b\"\ncommand = \"./bin/b\"\n\
             [[workspace]]\nid = \"w\"\npath = \".\"\ndefault_agent = \"a\"\n\
             [[workspace]]\nid = \"v\"\npath = \".\"\n"
        ),
        dir.path(),
    )
    .unwrap();
    assert_eq!(
        cfg.agent("a").unwrap().command,
        "a",
        "bare names stay for PATH lookup"
    );
    assert_eq!(
        PathBuf::from(&cfg.agent("b").unwrap().command),
        canon(dir.path()).join("bin/b")
    );
    assert!(cfg.agent("c").is_none());
    assert!(cfg.workspace("nope").is_none());
    assert_eq!(cfg.default_agent_for(cfg.workspace("w")).unwrap().id, "a");
    assert_eq!(cfg.default_agent_for(cfg.workspace("v")).unwrap().id, "b");
    assert_eq!(cfg.default_agent_for(None).unwrap().id, "b");
    assert!(
        Config::default_for_dir(dir.path())
            .default_agent_for(None)
            .is_none()
    );
}

/// Each invalid `[[rule]]` yields `ConfigError::Invalid` naming its exact key.
#[test]
fn invalid_rules_name_their_key() {
    // Two valid rules first, so the failing one is rule[2].
    let prefix = format!(
        "{AGENT}[[workspace]]\nid = \"api\"\npath = \".\"\n\
         [[rule]]\naction = \"allow\"\nkind = \"read\"\npaths = [\"**\"]\n\
         [[rule]]\nid = \"named\"\nworkspace = \"api\"\naction = \"deny\"\n"
    );
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "bad regex",
            "action = \"deny\"\nkind = \"execute\"\ncommand_regex = \"(unclosed\"\n",
            "rule[2].command_regex",
            "bad command_regex \"(unclosed\"",
        ),
        (
            "bad glob",
            "action = \"allow\"\npaths = [\"docs/**\", \"src/[\"]\n",
            "rule[2].paths[1]",
            "bad path glob \"src/[\"",
        ),
        (
            "absolute glob",
            "action = \"allow\"\npaths = [\"/etc/**\"]\n",
            "rule[2].paths[0]",
            "globs match paths relative to the workspace",
        ),
        (
            "empty glob",
            "action = \"allow\"\npaths = [\"\"]\n",
            "rule[2].paths[0]",
            "must not be empty",
        ),
        (
            "unknown kind",
            "action = \"allow\"\nkind = \"write\"\n",
            "rule[2].kind",
            "\"write\" is not a tool kind; use one of read, edit, delete, move, search, execute, think, fetch, switch_mode, other",
        ),
        (
            "unknown workspace",
            "workspace = \"web\"\naction = \"allow\"\n",
            "rule[2].workspace",
            "unknown workspace \"web\" (known: api)",
        ),
        (
            "workspace scope without a workspace",
            "scope = \"workspace\"\naction = \"allow\"\n",
            "rule[2].workspace",
            "is required with scope = \"workspace\"",
        ),
        (
            "global scope with a workspace",
            "scope = \"global\"\nworkspace = \"api\"\naction = \"allow\"\n",
            "rule[2].workspace",
            "only allowed with scope = \"workspace\"",
        ),
        (
            "session scope",
            "scope = \"session\"\naction = \"allow\"\n",
            "rule[2].scope",
            "session rules are created by operators",
        ),
        (
            "unknown scope",
            "scope = \"team\"\naction = \"allow\"\n",
            "rule[2].scope",
            "\"team\" is not a scope",
        ),
        (
            "missing action",
            "kind = \"read\"\n",
            "rule[2].action",
            "is required",
        ),
        (
            "unknown action",
            "action = \"permit\"\n",
            "rule[2].action",
            "\"permit\" is not an action",
        ),
        (
            "unknown agent",
            "action = \"allow\"\nagent = \"gemini\"\n",
            "rule[2].agent",
            "unknown agent \"gemini\" (known: a)",
        ),
        (
            "command prefix on a non-execute kind",
            "action = \"allow\"\nkind = \"edit\"\ncommand_prefix = \"git \"\n",
            "rule[2].command_prefix",
            "only execute requests have a command",
        ),
        (
            "command regex on a non-execute kind",
            "action = \"allow\"\nkind = \"read\"\ncommand_regex = \"x\"\n",
            "rule[2].command_regex",
            "only execute requests have a command",
        ),
        (
            "empty command prefix",
            "action = \"allow\"\ncommand_prefix = \"\"\n",
            "rule[2].command_prefix",
            "must not be empty",
        ),
        (
            "an allow rule for execute without its command (a file cut after `kind`)",
            "action = \"allow\"\nkind = \"execute\"\n",
            "rule[2].command_prefix",
            "without, it allows every command",
        ),
        (
            "an allow rule for reads without paths",
            "action = \"allow\"\nkind = \"read\"\n",
            "rule[2].paths",
            "needs `paths`",
        ),
        (
            "an allow rule for an agent only",
            "action = \"allow\"\nagent = \"a\"\n",
            "rule[2].kind",
            "says what it allows",
        ),
        (
            "an allow rule whose regex matches any command",
            "action = \"allow\"\nkind = \"execute\"\ncommand_regex = \".*\"\n",
            "rule[2].command_regex",
            "must not match an empty command",
        ),
        (
            "an allow rule with no condition (a file read half-written)",
            "scope = \"global\"\naction = \"allow\"\n",
            "rule[2].kind",
            "an allow rule says what it allows",
        ),
        (
            "duplicate id",
            "id = \"named\"\naction = \"allow\"\nkind = \"think\"\n",
            "rule[2].id",
            "duplicate rule id \"named\" (also used by rule[1])",
        ),
        (
            "reserved config prefix",
            "id = \"cfg-0\"\naction = \"allow\"\n",
            "rule[2].id",
            "reserved prefix \"cfg-\"",
        ),
        (
            "reserved operator prefix",
            "id = \"r-12345678\"\naction = \"allow\"\n",
            "rule[2].id",
            "reserved prefix \"r-\"",
        ),
        (
            "id with spaces",
            "id = \"my rule\"\naction = \"allow\"\n",
            "rule[2].id",
            "may only contain",
        ),
    ];
    for (name, rule, key, fragment) in cases {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("{prefix}[[rule]]\n{rule}");
        let err = Config::from_toml_str(&text, dir.path()).expect_err(name);
        assert_eq!(err.key(), Some(*key), "{name}: {err}");
        let shown = err.to_string();
        assert!(
            shown.starts_with(&format!("config error at `{key}`: ")),
            "{name}: {shown}"
        );
        assert!(
            shown.contains(fragment),
            "{name}: {shown:?} lacks {fragment:?}"
        );
    }
    // The prefix alone is valid.
    let dir = tempfile::tempdir().unwrap();
    Config::from_toml_str(&prefix, dir.path()).unwrap();
}

#[test]
fn unknown_keys_in_new_sections_are_errors() {
    for (text, key) in [
        ("[[rule]]\naction = \"allow\"\nkinds = \"read\"\n", "kinds"),
        ("[discovery]\nenable = true\n", "enable"),
        (
            "[[workspace]]\nid = \"a\"\npath = \".\"\nmode = \"auto\"\n",
            "mode",
        ),
    ] {
        let err = Config::from_toml_str(text, Path::new("/")).expect_err(key);
        assert!(
            matches!(&err, ConfigError::Parse { message, .. } if message.contains(&format!("unknown field `{key}`"))),
            "{key}: {err}"
        );
    }
}

#[test]
fn rules_become_core_rules() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::from_toml_str(
        &format!(
            "{AGENT}[[workspace]]\nid = \"api\"\npath = \".\"\napproval_mode = \"auto\"\n\
             [[workspace]]\nid = \"web\"\npath = \".\"\n\
             [[rule]]\naction = \"allow\"\nkind = \"read\"\npaths = [\"docs/**\", \"*.md\"]\n\
             [[rule]]\nid = \"git\"\nworkspace = \"api\"\naction = \"ask\"\nkind = \"execute\"\n\
             command_prefix = \"git \"\ncommand_regex = '^git\\s'\nagent = \"a\"\n\
             [[rule]]\nscope = \"global\"\naction = \"deny\"\n"
        ),
        dir.path(),
    )
    .unwrap();
    assert_eq!(
        cfg.rules,
        vec![
            Rule {
                id: "cfg-0".into(),
                scope: Scope::Global,
                matcher: RuleMatch {
                    kind: Some("read".into()),
                    paths: vec!["docs/**".into(), "*.md".into()],
                    ..Default::default()
                },
                action: RuleAction::Allow,
            },
            Rule {
                id: "git".into(),
                scope: Scope::Workspace("api".into()),
                matcher: RuleMatch {
                    kind: Some("execute".into()),
                    command_prefix: Some("git ".into()),
                    command_regex: Some(r"^git\s".into()),
                    agent: Some("a".into()),
                    ..Default::default()
                },
                action: RuleAction::Ask,
            },
            Rule {
                id: "cfg-2".into(),
                scope: Scope::Global,
                matcher: RuleMatch::default(),
                action: RuleAction::Deny,
            },
        ]
    );
    assert_eq!(cfg.approval_mode_for("api"), ApprovalMode::Auto);
    assert_eq!(cfg.approval_mode_for("web"), ApprovalMode::Ask);
    assert_eq!(cfg.approval_mode_for("unknown"), ApprovalMode::Ask);
    assert_eq!(
        cfg.workspace_modes.get("api").copied(),
        Some(ApprovalMode::Auto)
    );
    // Both spellings of auto-edits are accepted.
    for spelling in ["auto-edits", "auto_edits"] {
        let cfg = Config::from_toml_str(
            &format!("[[workspace]]\nid = \"w\"\npath = \".\"\napproval_mode = \"{spelling}\"\n"),
            dir.path(),
        )
        .unwrap();
        assert_eq!(cfg.approval_mode_for("w"), ApprovalMode::AutoEdits);
    }
}

/// `dir/rel/.git` as a directory.
fn git_repo(root: &Path, rel: &str) {
    fs::create_dir_all(root.join(rel).join(".git")).unwrap();
}

#[test]
fn discovery_finds_nested_repositories_within_depth() {
    let dir = tempfile::tempdir().unwrap();
    let root = canon(dir.path());
    git_repo(&root, "api");
    git_repo(&root, "team/web");
    git_repo(&root, "team/deep/tool");
    git_repo(&root, "api/vendored"); // inside a repository: not separate
    git_repo(&root, ".cache/r"); // hidden
    git_repo(&root, "node_modules/r");
    git_repo(&root, "target/r");
    let load = |depth: usize| {
        Config::from_toml_str(
            &format!("{AGENT}[discovery]\nenabled = true\ndepth = {depth}\n"),
            &root,
        )
        .unwrap()
    };
    let ids =
        |cfg: &Config| -> Vec<String> { cfg.discovered.iter().map(|w| w.id.clone()).collect() };

    let cfg = load(2);
    assert_eq!(ids(&cfg), ["api", "team/web"]);
    let web = cfg.workspace("team/web").unwrap();
    assert_eq!(web.path, root.join("team/web"));
    assert_eq!(web.channel_id, "");
    assert_eq!(web.default_agent, None);
    assert_eq!(cfg.default_agent_for(Some(web)).unwrap().id, "a");
    assert_eq!(cfg.approval_mode_for("team/web"), ApprovalMode::Ask);
    assert_eq!(ids(&load(1)), ["api"]);
    assert_eq!(ids(&load(3)), ["api", "team/deep/tool", "team/web"]);

    // Off by default, even with repositories present.
    let off = Config::from_toml_str(AGENT, &root).unwrap();
    assert!(off.discovered.is_empty());
    assert!(off.workspace("api").is_none());

    // The registry's map holds configured entries first, then discovered ones.
    let map = cfg.workspace_map();
    assert_eq!(map.workspace_root, root);
    let map_ids: Vec<&str> = map.workspaces.iter().map(|w| w.id.as_str()).collect();
    assert_eq!(map_ids, ["api", "team/web"]);
    assert_eq!(map.agents, cfg.agents);
    assert_eq!(map.default_agent.as_deref(), Some("a"));
}

#[test]
fn a_configured_workspace_wins_over_a_discovered_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = canon(dir.path());
    git_repo(&root, "api");
    git_repo(&root, "web");
    git_repo(&root, "tools");
    let cfg = Config::from_toml_str(
        &format!(
            "{AGENT}[[workspace]]\nid = \"api\"\npath = \"tools\"\nchannel_id = \"C1\"\n\
             [[workspace]]\nid = \"frontend\"\npath = \"web\"\napproval_mode = \"auto\"\n\
             [discovery]\nenabled = true\n"
        ),
        &root,
    )
    .unwrap();
    // "api" (same id) and "web" (same directory as "frontend") are configured;
    // "tools" is the configured "api"'s directory.
    assert!(cfg.discovered.is_empty(), "{:?}", cfg.discovered);
    assert_eq!(cfg.workspace("api").unwrap().path, root.join("tools"));
    assert_eq!(cfg.workspace("api").unwrap().channel_id, "C1");
    assert_eq!(cfg.approval_mode_for("frontend"), ApprovalMode::Auto);
    let map = cfg.workspace_map();
    let ids: Vec<&str> = map.workspaces.iter().map(|w| w.id.as_str()).collect();
    assert_eq!(ids, ["api", "frontend"]);
}

/// A repository inside a configured workspace is that workspace's, not one
/// of its own: a probe started a session in `team/api` and the `team`
/// workspace's deny rule no longer held there. A repository holding a
/// configured workspace is left out for the same reason.
#[test]
fn a_repository_inside_or_around_a_configured_workspace_is_not_discovered() {
    let dir = tempfile::tempdir().unwrap();
    let root = canon(dir.path());
    git_repo(&root, "team/api");
    git_repo(&root, "mono");
    fs::create_dir_all(root.join("mono/services/svc")).unwrap();
    git_repo(&root, "other");
    let cfg = Config::from_toml_str(
        &format!(
            "{AGENT}[[workspace]]\nid = \"team\"\npath = \"team\"\n\
             [[workspace]]\nid = \"svc\"\npath = \"mono/services/svc\"\n\
             [discovery]\nenabled = true\ndepth = 3\n"
        ),
        &root,
    )
    .unwrap();
    let ids: Vec<&str> = cfg.discovered.iter().map(|w| w.id.as_str()).collect();
    assert_eq!(ids, ["other"]);
    assert!(cfg.workspace("team/api").is_none());
    assert!(cfg.workspace("mono").is_none());
}

#[test]
fn discovery_runs_again_on_every_load_and_rules_may_name_discovered_workspaces() {
    let (dir, path) = write_config(&format!(
        "{AGENT}[discovery]\nenabled = true\n\
         [[rule]]\nworkspace = \"later\"\naction = \"allow\"\nkind = \"read\"\npaths = [\"**\"]\n"
    ));
    let root = canon(dir.path());
    let err = Config::load(&path).unwrap_err();
    assert_eq!(err.key(), Some("rule[0].workspace"), "{err}");
    git_repo(&root, "later");
    let cfg = Config::load(&path).unwrap();
    assert_eq!(cfg.discovered.len(), 1);
    assert_eq!(cfg.rules[0].scope, Scope::Workspace("later".into()));
    let summary = cfg.summary();
    assert!(
        summary.contains("discovery (depth 2) found 1 git repository"),
        "{summary}"
    );
    assert!(summary.contains("1 approval rule"), "{summary}");
}

#[test]
fn check_config_warns_about_agent_commands_that_cannot_be_found() {
    let (_dir, path) = write_config(
        "[[agent]]\nid = \"ghost\"\ncommand = \"no-such-agent-binary-xyz\"\n\n[[agent]]\nid = \"shell\"\ncommand = \"sh\"\n",
    );
    let out = check_config(&path).unwrap();
    assert!(out.starts_with("config OK"), "{out}");
    let warnings: Vec<&str> = out.lines().filter(|l| l.starts_with("warning:")).collect();
    assert_eq!(warnings.len(), 1, "{out}");
    assert!(
        warnings[0].contains("agent profile `ghost`")
            && warnings[0].contains("no-such-agent-binary-xyz")
            && warnings[0].contains("not found on PATH"),
        "{out}"
    );
}

#[test]
fn check_config_warns_about_a_workspace_directory_that_does_not_exist() {
    let (dir, path) = write_config(
        "[[workspace]]\nid = \"here\"\npath = \"ws/here\"\n\n[[workspace]]\nid = \"nowhere\"\npath = \"ws/nowhere\"\n",
    );
    std::fs::create_dir_all(dir.path().join("ws/here")).expect("mkdir");
    let out = check_config(&path).unwrap();
    assert!(out.starts_with("config OK"), "{out}");
    let warnings: Vec<&str> = out.lines().filter(|l| l.starts_with("warning:")).collect();
    assert_eq!(warnings.len(), 1, "{out}");
    assert!(
        warnings[0].contains("workspace `nowhere`") && warnings[0].contains("does not exist"),
        "{out}"
    );
}

/// Two workspaces on one directory (a block pasted with its id changed
/// and its path forgotten, in `auto`): loaded, with a warning naming the
/// workspace a path session there is in.
#[test]
fn check_config_warns_about_two_workspaces_on_one_directory() {
    let (dir, path) = write_config(
        "[[workspace]]\nid = \"w1\"\npath = \"ws\"\n\n[[workspace]]\nid = \"w9\"\npath = \"./ws/\"\napproval_mode = \"auto\"\n",
    );
    std::fs::create_dir_all(dir.path().join("ws")).expect("mkdir");
    let out = check_config(&path).unwrap();
    assert!(out.starts_with("config OK"), "{out}");
    let warnings: Vec<&str> = out.lines().filter(|l| l.starts_with("warning:")).collect();
    assert_eq!(warnings.len(), 1, "{out}");
    assert!(
        warnings[0].contains("workspace `w9`")
            && warnings[0].contains("is also workspace `w1`'s")
            && warnings[0].contains("is in `w1`"),
        "{out}"
    );
}

/// A file caught being written can still parse: cut after its first line,
/// or holding only a byte order mark. Loaded, it would drop every deny rule
/// with the rest (a probe's `rm -rf` was then allowed by mode auto). A
/// reload refuses a BOM-only file as empty, and one that would leave no
/// agent, workspace or rule where the running config has some.
#[test]
fn a_reload_that_would_empty_the_config_is_refused() {
    let (dir, path) = write_config(&format!(
        "workspace_root = \".\"\n{AGENT}[[workspace]]\nid = \"w\"\npath = \".\"\n\
         [[rule]]\naction = \"deny\"\nkind = \"execute\"\ncommand_prefix = \"rm\"\n"
    ));
    let running = Config::load(&path).unwrap();
    fs::write(&path, "\u{feff}").unwrap();
    assert!(matches!(
        Config::reload(&path),
        Err(ConfigError::Empty { .. })
    ));
    fs::write(&path, "workspace_root = \".\"\n").unwrap();
    let cut = Config::reload(&path).expect("parses");
    let err = cut.reload_over(&running).unwrap_err();
    assert!(matches!(err, ConfigError::Emptied { .. }), "{err}");
    assert!(
        err.to_string().contains("now declares no [[agent]]"),
        "{err}"
    );
    // A file that declares no rule keeps the running deny rule, applies
    // the rest, and says so.
    let workspace = |id: &str| {
        format!("workspace_root = \".\"\n{AGENT}[[workspace]]\nid = \"{id}\"\npath = \".\"\n")
    };
    fs::write(&path, workspace("renamed")).unwrap();
    let no_rules = Config::reload(&path).expect("parses");
    let (applied, kept) = no_rules.clone().reload_over(&running).expect("applied");
    assert_eq!(applied.rules, running.rules, "the deny rule stays");
    assert_eq!(applied.workspaces[0].id, "renamed", "the rest is applied");
    let kept = kept.expect("said so").to_string();
    assert!(kept.contains("1 deny/ask rule(s) are kept"), "{kept}");
    // Adding rules is an ordinary edit.
    let (_, note) = running.clone().reload_over(&no_rules).expect("applied");
    assert!(note.is_none());
    drop(dir);
}

/// Deleting the last rule when every running rule allows is an ordinary
/// edit: a probe deleted its only allow rule and the server refused the
/// reload, so the deleted rule kept approving edits. With deny rules too,
/// the allow rules are dropped and the deny rules kept.
#[test]
fn deleting_the_last_allow_rule_stops_it_allowing() {
    let base = format!("workspace_root = \".\"\n{AGENT}[[workspace]]\nid = \"w\"\npath = \".\"\n");
    let allow =
        "[[rule]]\nid = \"allow-edits\"\naction = \"allow\"\nkind = \"edit\"\npaths = [\"**\"]\n";
    let deny = "[[rule]]\nid = \"no-rm\"\naction = \"deny\"\nkind = \"execute\"\ncommand_prefix = \"rm \"\n";
    let (_dir, path) = write_config(&base);
    // Runs `rules`, then reloads the file with none.
    let delete_all_of = |rules: String| {
        fs::write(&path, format!("{base}{rules}")).unwrap();
        let running = Config::load(&path).unwrap();
        fs::write(&path, &base).unwrap();
        Config::reload(&path)
            .expect("parses")
            .reload_over(&running)
            .expect("applied")
    };
    let (applied, note) = delete_all_of(allow.to_owned());
    assert!(applied.rules.is_empty(), "{:?}", applied.rules);
    assert!(note.is_none());
    let (applied, note) = delete_all_of(format!("{allow}{deny}"));
    let ids: Vec<_> = applied.rules.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["no-rm"]);
    assert!(matches!(note, Some(ConfigError::RulesKept { kept: 1, .. })));
}

/// The package's directory: cargo's `CARGO_MANIFEST_DIR` when it runs this
/// test, else the one it was compiled in (a build cache shared between two
/// clones must not read the other clone's files).
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        Into::into,
    )
}
