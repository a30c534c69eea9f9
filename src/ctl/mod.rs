//! `agent-intercom ctl`: the terminal client of the HTTP API.
//!
//! It finds the server and its token the way an operator would expect: the
//! URL from `--url`, `AGENT_INTERCOM_URL`, or the config's `[server] bind`;
//! the token from `--token`, `AGENT_INTERCOM_TOKEN`, or the `api-token` file
//! beside the config's database. Output is an aligned table by default and
//! the server's raw JSON with `--json`. Exit codes are in [`client::exit`]:
//! 0 ok, 1 other, 2 usage, 3 not found, 4 conflict, 5 unauthorized,
//! 6 server unreachable.
//!
//! What the server sends may come from the agent, which is not trusted: the
//! renderers ([`render`], [`watch::event_line`]) show every string through
//! [`render::printable`] or its one-line forms, and all output leaves by
//! `write_out` (text, through [`render::printable`] once more) or
//! `write_json` ([`render::json_safe`]), so no control sequence from the
//! agent reaches the terminal.

pub mod client;
mod commands;
pub mod render;
pub mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::app::choose_config;
use crate::config::{Config, DEFAULT_BIND};
use crate::http::auth::{TOKEN_ENV, read_token_file, token_path};
use client::{Client, CtlError};
use commands::execute;

/// `ctl` options and subcommand.
#[derive(Debug, clap::Args)]
pub struct CtlArgs {
    /// Server URL [default: from the config's [server] bind, else http://127.0.0.1:3000]
    #[arg(long, global = true, env = "AGENT_INTERCOM_URL")]
    pub url: Option<String>,
    /// API token [default: the api-token file beside the config's database]
    #[arg(long, global = true, env = TOKEN_ENV, hide_env_values = true)]
    pub token: Option<String>,
    /// Config file used to find the URL and the token file [default:
    /// ./config.toml, else ./config.toml.example]
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// Print the server's JSON instead of tables
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// `ctl` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum CtlCommand {
    /// List live sessions (all with --all)
    Sessions {
        /// Include ended sessions
        #[arg(long)]
        all: bool,
    },
    /// List the workspaces a session can start in (ids for `start`)
    Workspaces,
    /// List the agent profiles a start can name (`start --agent`)
    Agents,
    /// Start a session in a workspace (or, with --path, a directory under workspace_root)
    Start {
        /// Workspace id (a directory with --path; `ctl workspaces` lists them)
        workspace: String,
        /// The first prompt
        prompt: String,
        /// Agent profile [default: the workspace's]
        #[arg(long)]
        agent: Option<String>,
        /// Treat WORKSPACE as a directory under workspace_root
        #[arg(long)]
        path: bool,
        /// Approval mode to start in: ask, auto-edits or auto [default: the workspace's]
        #[arg(long)]
        mode: Option<String>,
    },
    /// Show a session and its pending approvals
    Show {
        /// Session id
        id: String,
    },
    /// Print a session's transcript
    Log {
        /// Session id
        id: String,
        /// Keep printing what happens (from the event stream) until the session ends
        #[arg(long, short)]
        follow: bool,
        /// Print the entries older than this entry id (the page before;
        /// a long transcript is printed one page at a time, newest first)
        #[arg(long, conflicts_with = "follow")]
        before: Option<i64>,
    },
    /// Print events live as they happen (every session's, or one's)
    Watch {
        /// Only this session
        id: Option<String>,
    },
    /// Send a prompt (steering) to a session
    Prompt {
        /// Session id
        id: String,
        /// The text
        text: String,
        /// Cancel the running turn first
        #[arg(long)]
        interrupt: bool,
    },
    /// Stop a session
    #[command(visible_alias = "stop")]
    Cancel {
        /// Session id
        id: String,
    },
    /// Pause a session: its running turn is cancelled and steering is held
    /// until resumed (an agent that ignores the cancel is restarted)
    Pause {
        /// Session id
        id: String,
    },
    /// Resume a paused session: held steering goes out in order, or the
    /// cut turn is continued
    Resume {
        /// Session id
        id: String,
    },
    /// Nudge a stalled agent: a reminder prompt (a hung turn is cancelled
    /// first; an agent that ignores that is restarted)
    Nudge {
        /// Session id
        id: String,
    },
    /// Set a session's approval mode (ask, auto-edits, auto)
    Mode {
        /// Session id
        id: String,
        /// The approval mode
        mode: String,
    },
    /// Restart a session's agent (kill it, respawn it in the same session,
    /// resumed with session/load where the agent supports it)
    Restart {
        /// Session id
        id: String,
    },
    /// Bring back a session that ended without being stopped: idle timeout,
    /// server shutdown, crashed, error, interrupted (its agent respawned in the same session,
    /// resumed where the agent supports it)
    Revive {
        /// Session id
        id: String,
    },
    /// Show or switch the agent's own mode, model or config option
    /// (what the agent offered in session/new; `ctl show` lists them)
    AgentMode {
        /// Session id
        id: String,
        /// The mode to switch to (e.g. plan, acceptEdits)
        mode: Option<String>,
        /// Switch the model instead
        #[arg(long, conflicts_with = "mode")]
        model: Option<String>,
        /// Set a config option instead: --option <id> --value <value>
        #[arg(long, requires = "value", conflicts_with_all = ["mode", "model"])]
        option: Option<String>,
        /// The config option's new value
        #[arg(long, requires = "option")]
        value: Option<String>,
    },
    /// List pending approvals
    Pending,
    /// Approve a pending request
    Approve {
        /// Approval id (`<session>:req-N`)
        id: String,
        /// Option id to choose [default: the first allow option]
        #[arg(long)]
        option: Option<String>,
        /// A note recorded with the decision
        #[arg(long)]
        reason: Option<String>,
    },
    /// Reject a pending request
    Reject {
        /// Approval id (`<session>:req-N`)
        id: String,
        /// Why (recorded, and told to the agent where it listens)
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Longest an error message gets on stderr (it may quote the server).
const ERROR_MAX: usize = 1000;

/// Runs a `ctl` command; returns the process exit code.
pub fn run(args: &CtlArgs) -> i32 {
    let result = connect(args).and_then(|client| execute(&client, args));
    match result {
        Ok(()) => client::exit::OK,
        Err(e) => {
            let text = e.to_string();
            match e {
                // The operator's own input (a config file's parse error
                // points at its line): shown on the lines it spans.
                CtlError::Usage(_) => {
                    for (i, line) in text.lines().enumerate() {
                        let lead = if i == 0 { "error: " } else { "  " };
                        eprintln!("{lead}{}", render::bounded(line, ERROR_MAX));
                    }
                }
                // Anything else may quote the server or an agent: one line.
                _ => eprintln!("error: {}", render::bounded(&text, ERROR_MAX)),
            }
            for hint in hints(&e, args) {
                eprintln!("  ({hint})");
            }
            e.exit_code()
        }
    }
}

/// What an error's cause likely is, told under it, from where ctl took
/// what it used.
fn hints(e: &CtlError, args: &CtlArgs) -> Vec<String> {
    let config = choose_config(args.config.as_deref()).path;
    let from_file = config.is_file();
    let mut out = Vec::new();
    // A probe changed [server] bind: the running server still listened on
    // its old address (a restart applies it), and ctl, following the file,
    // said the server was down. The same for [database] path and the token.
    if matches!(e, CtlError::Unreachable { .. }) && args.url.is_none() && from_file {
        out.push(if Config::sets_bind(&config) {
            format!(
                "the address came from [server] bind in {}; a server started before that was last changed listens on its old address until restarted: give --url",
                config.display()
            )
        } else {
            format!(
                "{} sets no [server] bind, so ctl tried the default address; a server started with another config listens elsewhere: give --url (or --config)",
                config.display()
            )
        });
    }
    if matches!(e, CtlError::NoToken(_)) && args.token.is_none() && from_file {
        out.push(format!(
            "the token file's place came from [database] path in {}; a server started before that was last changed keeps its old one until restarted: give --token",
            config.display()
        ));
    }
    if matches!(e, CtlError::Api { status: 401, .. }) && args.token.is_some() {
        // A stale token in the environment is the likely cause at 2 a.m.,
        // and the message alone did not say where it came from.
        out.push(format!(
            "the token came from --token or {TOKEN_ENV}; without either, ctl reads the server's api-token file"
        ));
    }
    out
}

/// Where the server and its token are, absent flags.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Defaults {
    url: String,
    token_file: PathBuf,
}

fn defaults(explicit: Option<&Path>) -> Result<Defaults, CtlError> {
    defaults_at(&choose_config(explicit).path, explicit.is_some())
}

/// [`defaults`] from the config at `path` (`named`: given with `--config`).
fn defaults_at(path: &Path, named: bool) -> Result<Defaults, CtlError> {
    match Config::load(path) {
        Ok(config) => Ok(Defaults {
            url: url_for(config.server.bind),
            token_file: token_path(&config.database.path),
        }),
        Err(e) => {
            // A bad edit must not lock the operator out of the terminal: the
            // server keeps running on its last good config, and ctl needs
            // only where it listens and where its token is.
            if let Some((bind, database)) = Config::bind_and_database(path) {
                eprintln!(
                    "warning: {} has an error, so only its [server] bind and [database] path were read: {}",
                    path.display(),
                    one_line(&e.to_string())
                );
                return Ok(Defaults {
                    url: url_for(bind),
                    token_file: token_path(&database),
                });
            }
            // A file that is there but unreadable is as good as named: the
            // built-in address would be another server's, or nobody's (a
            // walk-through's ctl said "server down" after a bad save).
            if path.exists() {
                return Err(CtlError::Usage(format!(
                    "{e}\nctl cannot read where the server listens from it; fix the file, or give --url and --token (the server keeps running on its last good config)"
                )));
            }
            if named {
                return Err(CtlError::Usage(format!(
                    "{e}\nctl cannot learn where the server listens from it: give the config the server was started with, or --url and --token"
                )));
            }
            Ok(Defaults {
                url: format!("http://{DEFAULT_BIND}"),
                token_file: PathBuf::from("data").join(crate::http::auth::TOKEN_FILE_NAME),
            })
        }
    }
}

/// An error's lines joined into one (a TOML error's reason is on its last
/// lines, under a caret).
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '^' || c == '|' || c.is_whitespace()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The URL a client uses for a bind address (wildcards become loopback).
fn url_for(bind: SocketAddr) -> String {
    let ip = match bind.ip() {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, bind.port()))
}

fn connect(args: &CtlArgs) -> Result<Client, CtlError> {
    let need_defaults = args.url.is_none() || args.token.is_none();
    let defaults = if need_defaults {
        Some(defaults(args.config.as_deref())?)
    } else {
        None
    };
    let url = match (&args.url, &defaults) {
        (Some(u), _) => u.clone(),
        (None, Some(d)) => d.url.clone(),
        (None, None) => format!("http://{DEFAULT_BIND}"),
    };
    // ctl speaks plain HTTP (the server serves it on loopback); anything
    // else would fail later with a transport error that reads like the
    // server's answer.
    let host = url.strip_prefix("http://").unwrap_or_default();
    if host.is_empty() || host.starts_with('/') {
        return Err(CtlError::Usage(format!(
            "--url {url:?} is not a server address; give http://HOST:PORT, e.g. http://127.0.0.1:3000 (ctl speaks plain HTTP)"
        )));
    }
    let token = match (&args.token, &defaults) {
        (Some(t), _) if !t.trim().is_empty() => t.trim().to_owned(),
        (_, Some(d)) => read_token(&d.token_file)?,
        _ => return Err(CtlError::NoToken("the --token given is empty".into())),
    };
    Ok(Client::new(&url, &token))
}

fn read_token(path: &Path) -> Result<String, CtlError> {
    match read_token_file(path) {
        Ok(Some(token)) => Ok(token),
        Ok(None) if path.is_relative() => Err(CtlError::NoToken(format!(
            "no API token: {} does not exist here ({}); run ctl in the server's directory or give --config, or set {TOKEN_ENV} / pass --token",
            path.display(),
            std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default()
        ))),
        Ok(None) => Err(CtlError::NoToken(format!(
            "no API token: {} does not exist; a server started without {TOKEN_ENV} creates it at its first start, one started with it creates none: set {TOKEN_ENV} here too, or pass --token",
            path.display()
        ))),
        Err(e) => Err(CtlError::NoToken(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_binds_become_loopback_urls() {
        let url = |s: &str| url_for(s.parse().expect("addr"));
        assert_eq!(url("0.0.0.0:3000"), "http://127.0.0.1:3000");
        assert_eq!(url("[::]:8080"), "http://[::1]:8080");
        assert_eq!(url("127.0.0.1:3001"), "http://127.0.0.1:3001");
    }

    #[test]
    fn defaults_come_from_the_config() {
        let dir = tempfile::tempdir().expect("tmp");
        let cfg = dir.path().join("c.toml");
        std::fs::write(
            &cfg,
            "[server]\nbind = \"127.0.0.1:4123\"\n[database]\npath = \"db/x.db\"\n",
        )
        .expect("write");
        let d = defaults(Some(&cfg)).expect("defaults");
        assert_eq!(d.url, "http://127.0.0.1:4123");
        assert!(d.token_file.ends_with("db/api-token"), "{:?}", d.token_file);
        let missing = defaults(Some(&dir.path().join("nope.toml")));
        assert!(matches!(missing, Err(CtlError::Usage(_))));
        // The default file (not named) that is there but is not TOML: a
        // usage error too, not the built-in address (a walk-through's ctl
        // said "server down" after a bad save).
        let broken = dir.path().join("config.toml");
        std::fs::write(&broken, "[limits]\nmax_sessions = 5 ]]\n").expect("write");
        match defaults_at(&broken, false) {
            Err(CtlError::Usage(why)) => assert!(why.contains("--url"), "{why}"),
            other => panic!("{other:?}"),
        }
        // No config file at all: the built-in address, as the server's.
        let none = defaults_at(&dir.path().join("absent.toml"), false).expect("defaults");
        assert_eq!(none.url, format!("http://{DEFAULT_BIND}"));
    }

    /// An unreachable server or a missing token, when ctl followed the
    /// config file, says the file may have moved on from the running server
    /// (a probe changed `[server] bind`, and ctl said the server was down).
    #[test]
    fn a_failure_after_following_the_config_says_where_it_came_from() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            ctl: CtlArgs,
        }
        use clap::Parser as _;
        let dir = tempfile::tempdir().expect("tmp");
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, "[server]\nbind = \"127.0.0.1:4123\"\n").expect("write");
        let args = |extra: &[&str]| {
            let mut argv = vec!["ctl", "--config", cfg.to_str().expect("utf-8")];
            argv.extend_from_slice(extra);
            argv.push("sessions");
            Cli::parse_from(argv).ctl
        };
        let down = CtlError::Unreachable {
            url: "http://127.0.0.1:4123".into(),
            reason: "refused".into(),
        };
        let told = hints(&down, &args(&[]));
        assert!(
            told.len() == 1 && told[0].contains("[server] bind in") && told[0].contains("--url"),
            "{told:?}"
        );
        assert!(hints(&down, &args(&["--url", "http://127.0.0.1:9"])).is_empty());
        let no_token = CtlError::NoToken("no API token".into());
        assert!(hints(&no_token, &args(&[]))[0].contains("[database] path"));
        // A file that sets no bind: the default address was tried, which
        // no line of the file chose.
        std::fs::write(&cfg, "[limits]\nmax_sessions = 3\n").expect("write");
        let told = hints(&down, &args(&[]));
        assert!(
            told.len() == 1 && told[0].contains("sets no [server] bind"),
            "{told:?}"
        );
    }

    #[test]
    fn a_named_config_that_is_not_there_is_not_said_to_run_the_server() {
        let dir = tempfile::tempdir().expect("tmp");
        let Err(CtlError::Usage(told)) = defaults_at(&dir.path().join("nope.toml"), true) else {
            panic!("a usage error");
        };
        assert!(
            told.contains("give the config the server was started with"),
            "{told}"
        );
        assert!(!told.contains("last good config"), "{told}");
    }

    #[test]
    fn a_config_error_is_told_on_one_line_with_its_reason() {
        let toml_error = "TOML parse error at line 3, column 1\n  |\n3 | approval_mod = 1\n  | ^^^^^^^^^^^^\nunknown field `approval_mod`\n";
        let line = one_line(toml_error);
        assert!(
            line.contains("line 3") && line.contains("unknown field `approval_mod`"),
            "{line}"
        );
        assert!(!line.contains('\n'), "{line}");
    }
}
