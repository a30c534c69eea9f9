//! The `/intercom` slash command: parsing (pure) and execution.
//!
//! Why this exists: the operator can do from Slack what the local API does.
//! `parse` turns the command text into a [`Command`]; `execute` resolves the
//! session it concerns (explicit id, else the most recently active live
//! session in the channel, with a hint listing the others), checks who may
//! do it, and talks to the supervisor, the registry and the session actor.
//! Every reply is ephemeral; errors say what to do.

use std::collections::HashSet;
use std::time::Duration;

use intercom_actors::gateway::GatewayMsg;
use intercom_actors::model::{RequestStatus, SessionId, SessionRecord, SessionStatus, now_ms};
use intercom_actors::ports::OperatorEvent;
use intercom_actors::registry::{RegistryMsg, Target};
use intercom_actors::rules::ApprovalMode;
use intercom_actors::session::{SessionMsg, SessionSnapshot};
use intercom_actors::supervisor::{StartRequest, SupervisorMsg};

use super::inbound::{Ctx, Reply};
use super::render;
use intercom_actors::slack_port::MessageBody;

/// How long an RPC to an actor may take before the operator is told.
pub const CALL_TIMEOUT_MS: u64 = 10_000;

/// A start or revive answers after the agent's handshake, which the session
/// bounds by `limits.startup_timeout_secs`; this only guards against a
/// supervisor that never answers.
pub const START_TIMEOUT_MS: u64 = 600_000;
/// Sessions stored as live but without an agent for this long are cleaned up.
const CLEANUP_AGE: Duration = Duration::from_secs(600);

mod session_ids;
pub use session_ids::{looks_like_id, pick_session};
use session_ids::{named_id, optional_id};

/// A parsed `/intercom` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `help` (also: empty text, unknown words).
    Help(Option<String>),
    /// `start [workspace] [--agent A] [--mode M] <prompt>`; the first word
    /// of `text` may turn out to be a workspace id (see [`split_workspace`]).
    Start {
        /// `--agent`.
        agent: Option<String>,
        /// `--mode` (checked when executed).
        mode: Option<String>,
        /// The rest, split on whitespace boundaries kept verbatim.
        text: String,
    },
    /// `sessions [--all]`.
    Sessions {
        /// Include ended sessions.
        all: bool,
    },
    /// `status [id]`.
    Status(Option<String>),
    /// `stop [id]`.
    Stop(Option<String>),
    /// `pause [id]`.
    Pause(Option<String>),
    /// `resume [id]`.
    Resume(Option<String>),
    /// `steer [id] <text>`.
    Steer {
        /// Session id.
        id: Option<String>,
        /// The instruction.
        text: String,
    },
    /// `nudge [id]`.
    Nudge(Option<String>),
    /// `restart [id]`: kill the agent and respawn it in the same thread.
    Restart(Option<String>),
    /// `mode [<ask|auto-edits|auto>] [id]`: set (or show) the approval mode.
    Mode {
        /// The mode (checked when executed); `None` shows the current one.
        mode: Option<String>,
        /// Session id.
        id: Option<String>,
    },
    /// `agent-mode [id] [<mode> | model <m> | <option> <value>]`: the
    /// agent's own modes, models and options.
    AgentMode(super::agent_mode::AgentModeCommand),
    /// `rules`.
    Rules,
    /// `rule rm <id>`.
    RuleRm(Option<String>),
    /// `cleanup`.
    Cleanup,
}

/// Splits off the first whitespace-separated word.
pub(super) fn first_word(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    match text.find(char::is_whitespace) {
        Some(i) => (&text[..i], text[i..].trim_start()),
        None => (text, ""),
    }
}

/// Parses the text after `/intercom`.
pub fn parse(text: &str) -> Command {
    let (verb, rest) = first_word(text);
    let id_only = named_id;
    match verb.to_ascii_lowercase().as_str() {
        "" | "help" => Command::Help(None),
        "start" => parse_start(rest),
        "sessions" | "list" | "ls" => Command::Sessions {
            all: rest.split_whitespace().any(|w| w == "--all" || w == "all"),
        },
        "status" => Command::Status(id_only(rest)),
        "stop" => Command::Stop(id_only(rest)),
        "pause" => Command::Pause(id_only(rest)),
        "resume" => Command::Resume(id_only(rest)),
        "nudge" => Command::Nudge(id_only(rest)),
        "restart" => Command::Restart(id_only(rest)),
        "steer" => {
            let (id, text) = optional_id(rest);
            Command::Steer {
                id,
                text: text.trim().to_owned(),
            }
        }
        "mode" => parse_mode_command(rest),
        "agent-mode" | "agentmode" | "agent_mode" => {
            Command::AgentMode(super::agent_mode::parse(rest))
        }
        "rules" => Command::Rules,
        "rule" => parse_rule(rest),
        "cleanup" => Command::Cleanup,
        other => Command::Help(Some(other.to_owned())),
    }
}

/// `start [--agent A] [--mode M] [workspace] prompt`: the flags may come
/// before the workspace or before the prompt.
fn parse_start(rest: &str) -> Command {
    let (mut agent, mut mode) = (None, None);
    let mut rest = rest;
    let mut kept = String::new();
    loop {
        let (w, tail) = first_word(rest);
        if let Some((flag, value, tail)) = start_flag(w, tail) {
            let value = Some(value.to_owned()).filter(|v| !v.is_empty());
            match flag {
                "agent" => agent = value,
                _ => mode = value,
            }
            rest = tail;
            continue;
        }
        if kept.is_empty() && !w.is_empty() && !tail.is_empty() {
            // Maybe a workspace; keep it and look for flags once more.
            let (w2, tail2) = first_word(tail);
            if start_flag(w2, tail2).is_some() {
                kept = w.to_owned();
                rest = tail;
                continue;
            }
        }
        break;
    }
    let text = if kept.is_empty() {
        rest.trim().to_owned()
    } else {
        format!("{kept} {}", rest.trim())
    };
    Command::Start { agent, mode, text }
}

/// `mode <mode> [session]`, in either order; any other word is taken as
/// the session (and named if it is none).
fn parse_mode_command(rest: &str) -> Command {
    let (mut id, mut mode, mut extra) = (None, None, Vec::new());
    for w in rest.split_whitespace() {
        if mode.is_none() && ApprovalMode::parse(&w.to_ascii_lowercase()).is_some() {
            mode = Some(w.to_ascii_lowercase());
        } else if id.is_none()
            && !looks_like_id(w)
            && mode.is_none()
            && rest.split_whitespace().count() == 1
        {
            // `mode foo`: an unknown mode, said so when executed.
            mode = Some(w.to_ascii_lowercase());
        } else if id.is_none() {
            id = named_id(w);
        } else {
            extra.push(w);
        }
    }
    if !extra.is_empty() {
        return Command::Help(Some(format!("mode {}", rest.trim())));
    }
    Command::Mode { mode, id }
}

/// `rule rm <id>` (or `rule list`).
fn parse_rule(rest: &str) -> Command {
    let (sub, tail) = first_word(rest);
    match sub.to_ascii_lowercase().as_str() {
        "rm" | "remove" | "delete" | "del" => {
            let (id, _) = first_word(tail);
            Command::RuleRm(Some(id.to_owned()).filter(|i| !i.is_empty()))
        }
        "" | "list" | "ls" => Command::Rules,
        _ => Command::Help(Some(format!("rule {sub}"))),
    }
}

/// `--agent A`, `--agent=A`, `--mode M`, `--mode=M`: (flag, value, rest).
fn start_flag<'a>(word: &'a str, tail: &'a str) -> Option<(&'static str, &'a str, &'a str)> {
    for (flag, long) in [("agent", "--agent"), ("mode", "--mode")] {
        if word == long {
            let (value, tail) = first_word(tail);
            return Some((flag, value, tail));
        }
        if let Some(value) = word.strip_prefix(long).and_then(|v| v.strip_prefix('=')) {
            return Some((flag, value, tail));
        }
    }
    None
}

/// Parses a mode name, or says which exist.
fn parse_mode(name: &str) -> Result<ApprovalMode, String> {
    ApprovalMode::parse(name).ok_or_else(|| {
        format!(
            "Unknown mode `{}`; use `ask` (ask for everything no rule decides), `auto-edits` (allow reads and edits inside the workspace) or `auto` (allow everything no deny rule forbids).",
            render::escape(name)
        )
    })
}

fn mode_meaning(mode: ApprovalMode) -> &'static str {
    match mode {
        ApprovalMode::Ask => "every request no rule decides is asked",
        ApprovalMode::AutoEdits => {
            "reads, searches and edits inside the workspace are allowed without asking; the rest is asked"
        }
        ApprovalMode::Auto => "everything no deny rule forbids is allowed without asking",
    }
}

/// Splits `start`'s text into (workspace, prompt) given the known workspaces.
pub fn split_workspace<'a>(text: &'a str, known: &HashSet<String>) -> (Option<&'a str>, &'a str) {
    let (w, rest) = first_word(text);
    if known.contains(w) && !rest.is_empty() {
        (Some(w), rest)
    } else {
        (None, text.trim())
    }
}

/// Runs one slash command. Long-running ones (start) are spawned.
pub async fn execute(ctx: &std::sync::Arc<Ctx>, reply: Reply, command: Command) {
    match command {
        Command::Help(None) => reply.send(ctx, render::help()),
        Command::Help(Some(word)) => reply.send(
            ctx,
            render::problem(&format!(
                "Unknown command `{}`. `/intercom help` lists the commands.",
                render::escape(&word)
            )),
        ),
        Command::Start { agent, mode, text } => {
            let mode = match mode.as_deref().map(parse_mode).transpose() {
                Ok(m) => m,
                Err(e) => return reply.send(ctx, render::problem(&e)),
            };
            let ctx = ctx.clone();
            tokio::spawn(async move { start(&ctx, reply, agent, mode, text).await });
        }
        Command::Sessions { all } => {
            let body = match ctx.store.list_sessions(!all).await {
                Ok(mut list) => {
                    list.retain(|s| visible_to(ctx, &reply, s));
                    let paused = paused_among(ctx, &list).await;
                    render::session_list(&list, all, &paused)
                }
                Err(e) => render::problem(&format!("Cannot list sessions: {e}")),
            };
            reply.send(ctx, body);
        }
        Command::AgentMode(cmd) => super::agent_mode::run(ctx, reply, cmd).await,
        Command::Rules => super::rules::list(ctx, &reply).await,
        Command::RuleRm(id) => super::rules::remove(ctx, &reply, id).await,
        Command::Cleanup => cleanup(ctx, reply).await,
        Command::Mode { mode, id } => match mode.as_deref().map(parse_mode).transpose() {
            Ok(mode) => {
                on_session(ctx, &reply, id, |rec| {
                    mode_body(ctx, rec, mode, &reply.user)
                })
                .await
            }
            Err(e) => reply.send(ctx, render::problem(&e)),
        },
        Command::Steer { text, .. } if text.is_empty() => reply.send(
            ctx,
            render::problem("Say what to tell the agent: `/intercom steer [id] <text>`."),
        ),
        Command::Steer { id, text } => {
            // Slack sends `&`, `<` and `>` escaped; the agent gets the text
            // as typed (as `start` and thread replies do).
            let text = render::unescape(&text);
            on_session(ctx, &reply, id, |rec| {
                steer_body(ctx, rec, &text, &reply.user)
            })
            .await
        }
        Command::Status(id) => on_session(ctx, &reply, id, |rec| status_body(ctx, rec)).await,
        Command::Stop(id) => {
            on_session(ctx, &reply, id, |rec| stop_body(ctx, rec, &reply.user)).await
        }
        Command::Pause(id) => {
            on_session(ctx, &reply, id, |rec| {
                pause_body(ctx, rec, true, &reply.user)
            })
            .await
        }
        Command::Resume(id) => {
            on_session(ctx, &reply, id, |rec| {
                pause_body(ctx, rec, false, &reply.user)
            })
            .await
        }
        Command::Nudge(id) => {
            on_session(ctx, &reply, id, |rec| nudge_body(ctx, rec, &reply.user)).await
        }
        Command::Restart(id) => {
            on_session(ctx, &reply, id, |rec| restart_body(ctx, rec, &reply.user)).await
        }
    }
}

/// Resolves the session a command concerns (`id`, else the channel's most
/// recently active one), runs `act` on it and replies with what it says,
/// plus the hint naming the channel's other sessions.
async fn on_session<F, Fut>(ctx: &Ctx, reply: &Reply, id: Option<String>, act: F)
where
    F: FnOnce(SessionRecord) -> Fut,
    Fut: std::future::Future<Output = MessageBody>,
{
    let Some((rec, hint)) = resolve(ctx, reply, id.as_deref()).await else {
        return;
    };
    let mut body = act(rec).await;
    append_hint(&mut body, hint);
    reply.send(ctx, body);
}

/// `/intercom status`.
async fn status_body(ctx: &Ctx, rec: SessionRecord) -> MessageBody {
    let snapshot = snapshot(ctx, &rec.id).await;
    render::session_status(&rec, snapshot.as_ref())
}

/// `/intercom stop`.
async fn stop_body(ctx: &Ctx, rec: SessionRecord, user: &str) -> MessageBody {
    match ctx.stop(&rec.id, user).await {
        Ok(()) => MessageBody::text(format!("Stopping `{}`.", rec.id)),
        Err(e) => render::problem(&e),
    }
}

/// `/intercom pause` (`pause`) and `/intercom resume`.
async fn pause_body(ctx: &Ctx, rec: SessionRecord, pause: bool, user: &str) -> MessageBody {
    match ctx.pause(&rec.id, pause, user).await {
        Ok(()) if pause => MessageBody::text(format!(
            ":double_vertical_bar: Paused `{}`: its running turn was cancelled, and replies and `steer` are held until `/intercom resume {}`.",
            rec.id, rec.id
        )),
        Ok(()) => MessageBody::text(format!(
            ":arrow_forward: Resumed `{}`: held instructions are delivered in order (or the agent continues where the pause cut it off).",
            rec.id
        )),
        Err(e) => render::problem(&e),
    }
}

/// `/intercom mode [mode]`: shows the session's mode, or sets it.
async fn mode_body(
    ctx: &Ctx,
    rec: SessionRecord,
    mode: Option<ApprovalMode>,
    user: &str,
) -> MessageBody {
    match mode {
        None => match snapshot(ctx, &rec.id).await {
            Some(s) => MessageBody::text(format!(
                "`{}` is in mode `{}`: {}. Change it with `/intercom mode <ask|auto-edits|auto>`.",
                rec.id,
                s.mode.as_str(),
                mode_meaning(s.mode)
            )),
            None => render::problem(&format!(
                "Session `{}` has no running agent right now.",
                rec.id
            )),
        },
        Some(m) => match ctx.set_mode(&rec.id, m, user).await {
            Ok(()) => MessageBody::text(format!(
                ":gear: `{}` is now in mode `{}`: {}.",
                rec.id,
                m.as_str(),
                mode_meaning(m)
            )),
            Err(e) => render::problem(&e),
        },
    }
}

/// `/intercom steer`: delivered, queued behind the turn, or held by a pause.
async fn steer_body(ctx: &Ctx, rec: SessionRecord, text: &str, user: &str) -> MessageBody {
    let r = ctx.steer(&rec.id, text, user).await;
    let paused = match &r {
        Ok(o) if o.queued => snapshot(ctx, &rec.id).await.is_some_and(|s| s.paused),
        _ => false,
    };
    match r {
        Ok(_) if paused => MessageBody::text(format!(
            ":double_vertical_bar: Held for `{}`: the session is paused; `/intercom resume` delivers it.",
            rec.id
        )),
        Ok(o) if o.queued => MessageBody::text(format!(
            ":hourglass_flowing_sand: Queued for `{}`: the agent gets it when its current turn ends.",
            rec.id
        )),
        Ok(_) => MessageBody::text(format!(":white_check_mark: Delivered to `{}`.", rec.id)),
        Err(e) => render::problem(&e),
    }
}

/// `/intercom nudge`.
async fn nudge_body(ctx: &Ctx, rec: SessionRecord, user: &str) -> MessageBody {
    match ctx.nudge(&rec.id, user).await {
        Ok(()) => MessageBody::text(format!("Nudged `{}`.", rec.id)),
        Err(e) => render::problem(&e),
    }
}

/// `/intercom restart`.
async fn restart_body(ctx: &Ctx, rec: SessionRecord, user: &str) -> MessageBody {
    match ctx.restart(&rec.id, user).await {
        Ok(()) => MessageBody::text(format!(
            ":arrows_counterclockwise: Restarting the agent of `{}`: it resumes in its thread.",
            rec.id
        )),
        Err(e) => render::problem(&e),
    }
}

/// The live sessions among `list` (as far as it is shown) that are paused.
async fn paused_among(ctx: &Ctx, list: &[SessionRecord]) -> HashSet<SessionId> {
    let mut paused = HashSet::new();
    for rec in list.iter().filter(|r| r.status.is_live()).take(25) {
        if snapshot(ctx, &rec.id).await.is_some_and(|s| s.paused) {
            paused.insert(rec.id.clone());
        }
    }
    paused
}

/// The actor's view of a live session.
pub(super) async fn snapshot(ctx: &Ctx, id: &SessionId) -> Option<SessionSnapshot> {
    let actor = ctx.actor(id).await?;
    ractor::call_t!(actor, SessionMsg::Snapshot, CALL_TIMEOUT_MS).ok()
}

fn append_hint(body: &mut MessageBody, hint: Option<String>) {
    if let Some(h) = hint {
        body.text.push_str(&format!("\n_{h}_"));
    }
}

/// Whether `reply.user` may see session `s` from where they typed: an
/// operator sees every session; anyone else the sessions they own and those
/// of the channel they are in (whose threads they can read anyway), not a
/// private channel's prompts from a DM.
fn visible_to(ctx: &Ctx, reply: &Reply, s: &SessionRecord) -> bool {
    ctx.is_operator(&reply.user)
        || s.owner == reply.user
        || s.channel_id.as_deref() == Some(reply.channel.as_str())
}

/// The session a command concerns, or an ephemeral error (returns None).
pub(super) async fn resolve(
    ctx: &Ctx,
    reply: &Reply,
    id: Option<&str>,
) -> Option<(SessionRecord, Option<String>)> {
    let live = match ctx.store.list_sessions(true).await {
        Ok(mut l) => {
            l.retain(|s| visible_to(ctx, reply, s));
            l
        }
        Err(e) => {
            reply.send(ctx, render::problem(&format!("Cannot list sessions: {e}")));
            return None;
        }
    };
    // A command typed inside a session's thread concerns that session.
    let from_thread = match (&reply.thread_ts, id) {
        (Some(ts), None) => ctx.session_of_thread(&reply.channel, ts).await,
        _ => None,
    };
    let explicit = from_thread.as_ref().map(|s| s.0.as_str()).or(id);
    match pick_session(&live, &reply.channel, explicit) {
        Ok(found) => Some(found),
        Err(e) => {
            reply.send(ctx, render::problem(&e));
            None
        }
    }
}

async fn start(
    ctx: &Ctx,
    reply: Reply,
    agent: Option<String>,
    mode: Option<ApprovalMode>,
    text: String,
) {
    let body = match start_request(ctx, &reply, agent, mode, &text).await {
        Ok((req, channel)) => {
            let mode = req.mode;
            let outcome = ractor::call_t!(
                ctx.supervisor,
                |r| SupervisorMsg::Start { req, reply: r },
                START_TIMEOUT_MS
            );
            match outcome {
                Ok(Ok(rec)) => started(&rec, mode, channel, &reply.channel),
                Ok(Err(e)) => render::problem(&format!("Could not start the session: {e}")),
                Err(e) => render::problem(&format!("The supervisor did not answer: {e}")),
            }
        }
        Err(problem) => problem,
    };
    reply.send(ctx, body);
}

/// What `/intercom start` asks the supervisor for (and the session's Slack
/// channel), or the problem to show: only operators start sessions, in the
/// workspace named first in `text` or the one this channel is bound to.
async fn start_request(
    ctx: &Ctx,
    reply: &Reply,
    agent: Option<String>,
    mode: Option<ApprovalMode>,
    text: &str,
) -> Result<(StartRequest, Option<String>), MessageBody> {
    if !ctx.is_operator(&reply.user) {
        return Err(render::problem(
            "Only operators may start sessions. Ask an operator to add your Slack user id to SLACK_MEMBER_IDS or `[slack] operators`.",
        ));
    }
    let no_answer = |e: &dyn std::fmt::Display| {
        render::problem(&format!("The workspace registry did not answer: {e}"))
    };
    let map = ractor::call_t!(ctx.registry.get(), RegistryMsg::Get, CALL_TIMEOUT_MS)
        .map_err(|e| no_answer(&e))?;
    let known: HashSet<String> = map.workspaces.iter().map(|w| w.id.clone()).collect();
    let (named, prompt) = split_workspace(text, &known);
    let workspace = match named {
        Some(w) => w.to_owned(),
        None => match map.by_channel(&reply.channel) {
            Some(w) => w.id.clone(),
            None => {
                let ids: Vec<&str> = map.workspaces.iter().map(|w| w.id.as_str()).collect();
                return Err(render::problem(&format!(
                    "This channel is not bound to a workspace; name one: `/intercom start <workspace> <prompt>` (configured: {}).",
                    if ids.is_empty() {
                        "none".to_owned()
                    } else {
                        ids.join(", ")
                    }
                )));
            }
        },
    };
    if intercom_actors::model::is_blank_prompt(prompt) {
        return Err(render::problem(
            "Say what the agent should do: `/intercom start [workspace] [--agent A] [--mode M] <prompt>`.",
        ));
    }
    let target = Target {
        workspace: Some(workspace),
        path: None,
        agent,
    };
    let resolved = ractor::call_t!(
        ctx.registry.get(),
        RegistryMsg::Resolve,
        CALL_TIMEOUT_MS,
        target
    )
    .map_err(|e| no_answer(&e))?
    .map_err(|e| render::problem(&format!("{e}.")))?;
    let channel = resolved.channel_id.clone();
    let mode = mode.or_else(|| ctx.rules.workspace_mode(&resolved.workspace));
    let req = StartRequest {
        workspace: resolved.workspace,
        cwd: resolved.cwd,
        channel_id: resolved.channel_id,
        profile: resolved.profile,
        prompt: render::unescape(prompt),
        owner: reply.user.clone(),
        mode,
    };
    Ok((req, channel))
}

/// The reply to a start that worked: where to follow the session.
fn started(
    rec: &SessionRecord,
    mode: Option<ApprovalMode>,
    channel: Option<String>,
    here: &str,
) -> MessageBody {
    let place = match channel {
        Some(c) if c == here => "in its thread in this channel".to_owned(),
        Some(c) => format!("in its thread in <#{c}>"),
        None => "locally only (the workspace has no Slack channel)".to_owned(),
    };
    let mode = match mode {
        Some(m) if m != ApprovalMode::Ask => format!(" (mode `{}`)", m.as_str()),
        _ => String::new(),
    };
    MessageBody::text(format!(
        ":rocket: Started `{}` in workspace `{}`{mode}; follow it {place}.",
        rec.id, rec.workspace
    ))
}

/// Marks sessions stored as live but without a running agent as interrupted.
async fn cleanup(ctx: &Ctx, reply: Reply) {
    if !ctx.is_operator(&reply.user) {
        reply.send(ctx, render::problem("Only operators may run `cleanup`."));
        return;
    }
    let live = match ctx.store.list_sessions(true).await {
        Ok(l) => l,
        Err(e) => {
            reply.send(ctx, render::problem(&format!("Cannot list sessions: {e}")));
            return;
        }
    };
    let cutoff = now_ms() - CLEANUP_AGE.as_millis() as i64;
    let mut cleaned: Vec<SessionId> = Vec::new();
    for rec in live {
        if rec.last_activity_at > cutoff || ctx.actor(&rec.id).await.is_some() {
            continue;
        }
        let reason = "cleaned up: stored as live but no agent was running";
        if let Err(e) = ctx
            .store
            .set_status(&rec.id, SessionStatus::Interrupted, Some(reason))
            .await
        {
            tracing::error!(session = %rec.id, "cleanup: {e}");
            continue;
        }
        let mut events = Vec::new();
        if let Ok(reqs) = ctx.store.list_requests(Some(&rec.id), true).await {
            for r in reqs {
                let _ = ctx.store.close_request(&r.id, RequestStatus::Expired).await;
                events.push(OperatorEvent::RequestClosed {
                    session_id: rec.id.clone(),
                    id: r.id,
                    status: RequestStatus::Expired,
                    decision: None,
                });
            }
        }
        events.push(OperatorEvent::StatusChanged {
            session_id: rec.id.clone(),
            status: SessionStatus::Interrupted,
            activity: "interrupted".into(),
            reason: Some(reason.into()),
        });
        events.push(OperatorEvent::SessionEnded {
            session_id: rec.id.clone(),
            status: SessionStatus::Interrupted,
            reason: Some(reason.into()),
        });
        for e in events {
            super::dropped::send(&ctx.gateway, GatewayMsg::Event(e), "an operator event");
        }
        let _ = ctx
            .store
            .audit(&intercom_actors::model::AuditEntry {
                session_id: Some(rec.id.clone()),
                actor: reply.user.clone(),
                action: "session.cleaned_up".into(),
                detail: serde_json::json!({"reason": reason}),
            })
            .await;
        cleaned.push(rec.id);
    }
    let body = if cleaned.is_empty() {
        MessageBody::text("Nothing to clean up: every live session has a running agent.")
    } else {
        let ids: Vec<String> = cleaned.iter().map(|i| format!("`{i}`")).collect();
        MessageBody::text(format!("Marked interrupted: {}.", ids.join(", ")))
    };
    reply.send(ctx, body);
}

#[cfg(test)]
mod tests;
