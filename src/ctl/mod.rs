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
pub mod render;
pub mod watch;

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::app::choose_config;
use crate::config::{Config, DEFAULT_BIND};
use crate::http::auth::{TOKEN_ENV, read_token_file, token_path};
use crate::http::views::{
    ApprovalView, MessageView, PromptAccepted, SessionDetailView, SessionView,
};
use client::{Client, CtlError, segment};

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
    /// Start a session in a workspace (or, with --path, a directory under workspace_root)
    Start {
        /// Workspace id (a directory with --path)
        workspace: String,
        /// The first prompt
        prompt: String,
        /// Agent profile [default: the workspace's]
        #[arg(long)]
        agent: Option<String>,
        /// Treat WORKSPACE as a directory under workspace_root
        #[arg(long)]
        path: bool,
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
    #[command(alias = "stop")]
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
        out.push(format!(
            "the address came from [server] bind in {}; a server started before that was last changed listens on its old address until restarted: give --url",
            config.display()
        ));
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
            if named || path.exists() {
                return Err(CtlError::Usage(format!(
                    "{e}\nctl cannot read where the server listens from it; fix the file, or give --url and --token (the server keeps running on its last good config)"
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
            "no API token: {} does not exist; start the server once (it creates it), or set {TOKEN_ENV} / pass --token",
            path.display()
        ))),
        Err(e) => Err(CtlError::NoToken(e.to_string())),
    }
}

fn execute(client: &Client, args: &CtlArgs) -> Result<(), CtlError> {
    let json = args.json;
    match &args.command {
        CtlCommand::Sessions { all } => {
            let path = if *all {
                "/api/sessions?all=true"
            } else {
                "/api/sessions"
            };
            let (raw, list) = client.get_as::<Vec<SessionView>>(path)?;
            emit(json, &raw, || render::sessions(&list));
        }
        CtlCommand::Start {
            workspace,
            prompt,
            agent,
            path,
        } => start(client, json, workspace, prompt, agent.as_deref(), *path)?,
        CtlCommand::Show { id } => {
            let url = format!("/api/sessions/{}", segment(id));
            let (raw, detail) = client.get_as::<SessionDetailView>(&url)?;
            emit(json, &raw, || render::session_detail(&detail));
        }
        CtlCommand::Log { id, follow, before } => log(client, json, id, *follow, *before)?,
        CtlCommand::Watch { id } => watch::follow(
            client,
            id.as_deref(),
            // One session's events: none come once it ended, so say so
            // and stop (it waited in silence for ever).
            || match id {
                Some(id) => still_live(client, json, id),
                None => Ok(true),
            },
            |e| {
                print_event(e, json, id.is_none());
                id.is_none() || e["event"] != "session_ended"
            },
        )?,
        CtlCommand::Prompt {
            id,
            text,
            interrupt,
        } => prompt(client, json, id, text, *interrupt)?,
        CtlCommand::Cancel { id } => {
            let url = format!("/api/sessions/{}/cancel", segment(id));
            // The answer waits for the agent (up to the shutdown grace, then
            // a kill): say so, rather than seconds of silence; not for a
            // session that has already ended (its answer comes at once).
            let live = || {
                client
                    .get_as::<SessionView>(&format!("/api/sessions/{}", segment(id)))
                    .map_or(true, |(_, s)| s.status.is_live())
            };
            if !json && live() {
                eprintln!(
                    "stopping {}; waiting for its agent to exit…",
                    render::one_line(id)
                );
            }
            let (raw, answer) = client.post_as::<Value>(&url, &json!({}))?;
            emit(json, &raw, || render::cancelled(&answer));
        }
        CtlCommand::Pause { id } => control(client, json, id, "pause")?,
        CtlCommand::Resume { id } => control(client, json, id, "resume")?,
        CtlCommand::Nudge { id } => control(client, json, id, "nudge")?,
        CtlCommand::Mode { id, mode } => set_mode(client, json, id, mode)?,
        CtlCommand::Restart { id } => bring_back(client, json, id, "restart")?,
        CtlCommand::Revive { id } => bring_back(client, json, id, "revive")?,
        CtlCommand::AgentMode {
            id,
            mode,
            model,
            option,
            value,
        } => {
            let choice = (
                mode.as_deref(),
                model.as_deref(),
                option.as_deref(),
                value.as_deref(),
            );
            agent_mode(client, json, id, choice)?
        }
        CtlCommand::Pending => {
            let list = all_pending(client)?;
            let raw = serde_json::to_string(&list).unwrap_or_default();
            emit(json, &raw, || render::approvals(&list));
        }
        CtlCommand::Approve { id, option, reason } => {
            let choice = match option {
                Some(o) => json!({"option_id": o}),
                None => json!({"decision": "approve"}),
            };
            decide(client, json, id, &with_reason(choice, reason.as_deref()))?;
        }
        CtlCommand::Reject { id, reason } => {
            let choice = json!({"decision": "reject"});
            decide(client, json, id, &with_reason(choice, reason.as_deref()))?;
        }
    }
    Ok(())
}

/// A decision's body with the operator's reason, when given.
fn with_reason(mut body: Value, reason: Option<&str>) -> Value {
    if let Some(r) = reason {
        body["reason"] = Value::from(r);
    }
    body
}

/// `ctl mode`: sets a session's approval mode.
fn set_mode(client: &Client, json: bool, id: &str, mode: &str) -> Result<(), CtlError> {
    let url = format!("/api/sessions/{}/mode", segment(id));
    let (raw, answer) = client.post_as::<Value>(&url, &json!({"mode": mode}))?;
    emit(json, &raw, || {
        let mode = answer["mode"].as_str().unwrap_or("?");
        let mode = render::bounded(mode, render::FIELD_MAX);
        format!("{id}: approval mode {mode}\n")
    });
    Ok(())
}

/// `ctl restart` / `ctl revive`: brings a session's agent back.
fn bring_back(client: &Client, json: bool, id: &str, action: &str) -> Result<(), CtlError> {
    let url = format!("/api/sessions/{}/{action}", segment(id));
    let (raw, session) = client.post_as::<SessionView>(&url, &json!({}))?;
    emit(json, &raw, || render::session_line(&session));
    Ok(())
}

/// `ctl prompt`: steers a session; says whether it was delivered or queued.
fn prompt(
    client: &Client,
    json: bool,
    id: &str,
    text: &str,
    interrupt: bool,
) -> Result<(), CtlError> {
    let url = format!("/api/sessions/{}/prompt", segment(id));
    let body = json!({"text": text, "interrupt": interrupt});
    let (raw, answer) = client.post_as::<PromptAccepted>(&url, &body)?;
    emit(json, &raw, || {
        if answer.paused {
            format!("held: the session is paused; it is delivered after `ctl resume {id}`\n")
        } else if answer.queued && interrupt {
            "queued: the running turn is being interrupted; it is delivered once the turn has ended\n"
                .to_owned()
        } else if answer.queued {
            "queued: it is delivered when the running turn ends\n".to_owned()
        } else {
            "delivered\n".to_owned()
        }
    });
    Ok(())
}

/// `ctl agent-mode`: switches the agent's own mode, model or a config
/// option; with nothing to switch, lists what the agent offers.
fn agent_mode(
    client: &Client,
    json: bool,
    id: &str,
    (mode, model, option, value): (Option<&str>, Option<&str>, Option<&str>, Option<&str>),
) -> Result<(), CtlError> {
    let body = match (mode, model, option, value) {
        (Some(m), _, _, _) => json!({"mode": m}),
        (_, Some(m), _, _) => json!({"model": m}),
        (_, _, Some(o), Some(v)) => json!({"option": o, "value": v}),
        _ => {
            let url = format!("/api/sessions/{}", segment(id));
            let (raw, detail) = client.get_as::<SessionDetailView>(&url)?;
            let options = detail.live.map(|l| l.agent_options).unwrap_or_default();
            emit(json, &raw, || render::agent_options(&options));
            return Ok(());
        }
    };
    let url = format!("/api/sessions/{}/agent-mode", segment(id));
    let (raw, answer) = client.post_as::<Value>(&url, &body)?;
    let options = serde_json::from_value(answer["agent_options"].clone()).unwrap_or_default();
    emit(json, &raw, || render::agent_options(&options));
    Ok(())
}

fn start(
    client: &Client,
    json: bool,
    target: &str,
    prompt: &str,
    agent: Option<&str>,
    is_path: bool,
) -> Result<(), CtlError> {
    let key = if is_path { "path" } else { "workspace" };
    let mut body = json!({ key: target, "prompt": prompt });
    if let Some(a) = agent {
        body["agent"] = Value::from(a);
    }
    let (raw, session) = client.post_as::<SessionView>("/api/sessions", &body)?;
    emit(json, &raw, || render::session_line(&session));
    Ok(())
}

/// `POST /api/sessions/{id}/<what>` for pause, resume and nudge.
fn control(client: &Client, json: bool, id: &str, what: &str) -> Result<(), CtlError> {
    let url = format!("/api/sessions/{}/{what}", segment(id));
    let (raw, answer) = client.post_as::<Value>(&url, &json!({}))?;
    emit(json, &raw, || {
        let done = answer["done"].as_str().unwrap_or(what);
        format!("{id}: {}\n", render::bounded(done, render::FIELD_MAX))
    });
    Ok(())
}

/// Every pending approval, following the list's pages (one session's big
/// diffs must not push another's requests out of view).
fn all_pending(client: &Client) -> Result<Vec<ApprovalView>, CtlError> {
    /// Pages followed at most (a page holds up to 500).
    const MAX_PAGES: usize = 100;
    let mut all = Vec::new();
    let mut path = "/api/approvals?status=pending".to_owned();
    for _ in 0..MAX_PAGES {
        let (raw, earlier) = client.get_page(&path)?;
        all.extend(client::parse::<Vec<ApprovalView>>(&raw)?);
        let Some(before) = earlier else { break };
        path = format!("/api/approvals?status=pending&before={before}");
    }
    Ok(all)
}

fn decide(client: &Client, json: bool, id: &str, body: &Value) -> Result<(), CtlError> {
    let url = format!("/api/approvals/{}", segment(id));
    let (raw, approval) = client.post_as::<ApprovalView>(&url, body)?;
    emit(json, &raw, || render::decided(&approval));
    Ok(())
}

fn log(
    client: &Client,
    json: bool,
    id: &str,
    follow: bool,
    before: Option<i64>,
) -> Result<(), CtlError> {
    let messages_url = format!("/api/sessions/{}/messages", segment(id));
    let session_url = format!("/api/sessions/{}", segment(id));
    if !follow {
        let page_url = match before {
            Some(b) => format!("{messages_url}?before={b}"),
            None => messages_url,
        };
        let (raw, earlier) = client.get_page(&page_url)?;
        let list: Vec<MessageView> = client::parse(&raw)?;
        emit(json, &raw, || list.iter().map(render::message).collect());
        if let Some(first) = earlier {
            // On stderr: stdout stays the page alone (pure JSON with --json).
            eprint!(
                "{}",
                render::printable(&format!(
                    "-- earlier entries not shown: ctl log {} --before {first}\n",
                    render::one_line(id)
                ))
            );
        }
        return Ok(());
    }
    // The stream is open before the transcript is read, so nothing falls
    // between the two; it ends with the session.
    let print_transcript = || {
        let (_, session) = client.get_as::<SessionView>(&session_url)?;
        let (_, list) = client.get_as::<Vec<MessageView>>(&messages_url)?;
        print_new(&list, &mut HashMap::new(), json);
        if session.status.is_live() {
            return Ok(true);
        }
        if !json {
            write_out(&format!(
                "-- session {}{}\n",
                session.status,
                reason_suffix(&session)
            ));
        }
        Ok(false)
    };
    watch::follow(client, Some(id), print_transcript, |e| {
        print_event(e, json, false);
        e["event"] != "session_ended"
    })
}

/// Whether session `id` is live; when it ended, says how (unless `json`).
fn still_live(client: &Client, json: bool, id: &str) -> Result<bool, CtlError> {
    let url = format!("/api/sessions/{}", segment(id));
    let (_, session) = client.get_as::<SessionView>(&url)?;
    if session.status.is_live() {
        return Ok(true);
    }
    if !json {
        write_out(&format!(
            "-- session {} ended: {}{}; nothing more will happen in it\n",
            render::one_line(id),
            session.status,
            reason_suffix(&session)
        ));
    }
    Ok(false)
}

/// ` (why)` of an ended session, bounded; empty without a reason.
fn reason_suffix(session: &SessionView) -> String {
    session
        .status_reason
        .as_deref()
        .map(|r| format!(" ({})", render::bounded(r, render::FIELD_MAX)))
        .unwrap_or_default()
}

fn print_event(e: &Value, json: bool, with_session: bool) {
    if json {
        write_json(&e.to_string());
    } else {
        write_out(&watch::event_line(e, with_session));
    }
}

/// Prints entries not printed yet, and the growth of entries that grew.
fn print_new(list: &[MessageView], seen: &mut HashMap<i64, String>, json: bool) {
    for m in list {
        let shown = match seen.get(&m.id) {
            Some(old) if old == &m.content => None,
            Some(old) if m.kind == "text" && m.content.starts_with(old.as_str()) => {
                let mut more = m.clone();
                more.content = format!("…{}", &m.content[old.len()..]);
                Some(more)
            }
            _ => Some(m.clone()),
        };
        if let Some(entry) = shown {
            if json {
                write_json(&serde_json::to_string(m).unwrap_or_default());
            } else {
                write_out(&render::message(&entry));
            }
        }
        seen.insert(m.id, m.content.clone());
    }
}

/// The raw JSON with `--json`, else the rendered text.
fn emit(json: bool, raw: &str, render: impl FnOnce() -> String) {
    if json {
        write_json(raw);
    } else {
        write_out(&render());
    }
}

/// Writes rendered text to stdout. The renderers already showed every
/// server string through [`render::printable`] or its one-line forms; this
/// is the one door all text leaves by, so it applies [`render::printable`]
/// once more (a no-op on their output), and a string a renderer forgot
/// still cannot carry a control sequence to the terminal.
fn write_out(text: &str) {
    write_raw(&render::printable(text));
}

/// Writes one JSON value from the server and a newline to stdout, with
/// control and bidi characters as JSON escapes ([`render::json_safe`]): the
/// same JSON, inert on a terminal.
fn write_json(raw: &str) {
    write_raw(&format!("{}\n", render::json_safe(raw.trim_end())));
}

/// Writes to stdout; a closed pipe (`ctl log | head`) ends the process quietly.
fn write_raw(text: &str) {
    let mut out = std::io::stdout().lock();
    if out
        .write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(client::exit::OK);
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

    #[test]
    fn growing_text_prints_only_the_new_part() {
        let mut seen = HashMap::new();
        let m = |content: &str| MessageView {
            id: 7,
            role: "agent".into(),
            kind: "text".into(),
            content: content.into(),
            created_at: 0,
        };
        print_new(&[m("Hello")], &mut seen, false);
        assert_eq!(seen.get(&7).map(String::as_str), Some("Hello"));
        print_new(&[m("Hello world")], &mut seen, false);
        assert_eq!(seen.get(&7).map(String::as_str), Some("Hello world"));
    }
}
