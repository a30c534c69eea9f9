//! What each `ctl` subcommand does: the API calls it makes and how their
//! answers are printed (every string through `render`, every byte out
//! through `write_out` / `write_json`).

use std::collections::HashMap;
use std::io::Write;

use serde_json::{Value, json};

use super::client::{self, Client, CtlError, segment};
use super::{CtlArgs, CtlCommand, render, watch};
use crate::http::views::{
    ApprovalView, MessageView, PromptAccepted, SessionDetailView, SessionView,
};
use crate::http::workspaces::{AgentView, WorkspaceView};

pub(super) fn execute(client: &Client, args: &CtlArgs) -> Result<(), CtlError> {
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
        CtlCommand::Workspaces => {
            let (raw, list) = client.get_as::<Vec<WorkspaceView>>("/api/workspaces")?;
            emit(json, &raw, || render::workspaces(&list));
        }
        CtlCommand::Agents => {
            let (raw, list) = client.get_as::<Vec<AgentView>>("/api/agents")?;
            emit(json, &raw, || render::agents(&list));
        }
        CtlCommand::Start {
            workspace,
            prompt,
            agent,
            path,
            mode,
        } => {
            let key = if *path { "path" } else { "workspace" };
            let target = (key, workspace.as_str());
            start(
                client,
                json,
                target,
                prompt,
                agent.as_deref(),
                mode.as_deref(),
            )?
        }
        CtlCommand::Show { id } => {
            let url = format!("/api/sessions/{}", segment(id));
            let (raw, detail) = client.get_as::<SessionDetailView>(&url)?;
            emit(json, &raw, || render::session_detail(&detail));
        }
        CtlCommand::Log { id, follow, before } => log(client, json, id, *follow, *before)?,
        CtlCommand::Watch { id } => watch_events(client, json, id.as_deref())?,
        CtlCommand::Prompt {
            id,
            text,
            interrupt,
        } => prompt(client, json, id, text, *interrupt)?,
        CtlCommand::Cancel { id } => cancel(client, json, id)?,
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

/// `ctl watch [ID]`: every event live, or one session's until it ends.
fn watch_events(client: &Client, json: bool, id: Option<&str>) -> Result<(), CtlError> {
    watch::follow(
        client,
        id,
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
    )
}

/// `ctl cancel ID`: stops the session's agent.
fn cancel(client: &Client, json: bool, id: &str) -> Result<(), CtlError> {
    let url = format!("/api/sessions/{}/cancel", segment(id));
    // The answer waits for the agent (up to the shutdown grace, then
    // a kill): say so, rather than seconds of silence; not for a
    // session that has already ended (its answer comes at once).
    // A session that is not found (or not live) gets its error at once,
    // without "stopping" printed first.
    let live = || {
        client
            .get_as::<SessionView>(&format!("/api/sessions/{}", segment(id)))
            .is_ok_and(|(_, s)| s.status.is_live())
    };
    if !json && live() {
        eprintln!(
            "stopping {}; waiting for its agent to exit…",
            render::one_line(id)
        );
    }
    let (raw, answer) = client.post_as::<Value>(&url, &json!({}))?;
    emit(json, &raw, || render::cancelled(&answer));
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
            // An ended session has no agent to offer anything: a conflict,
            // as every other control on it (it read "offers no modes").
            let Some(live) = detail.live else {
                return Err(ended_conflict(id, &detail.session));
            };
            emit(json, &raw, || render::agent_options(&live.agent_options));
            return Ok(());
        }
    };
    let url = format!("/api/sessions/{}/agent-mode", segment(id));
    let (raw, answer) = client.post_as::<Value>(&url, &body)?;
    let options = serde_json::from_value(answer["agent_options"].clone()).unwrap_or_default();
    emit(json, &raw, || render::agent_options(&options));
    Ok(())
}

/// The error every control on an ended session gets (409, exit 4).
fn ended_conflict(id: &str, session: &SessionView) -> CtlError {
    CtlError::Api {
        status: 409,
        body: crate::http::views::ErrorBody {
            error: format!(
                "session {} is {}{}: it has no running agent",
                render::one_line(id),
                session.status,
                reason_suffix(session)
            ),
            code: "conflict".into(),
            status: Some(session.status),
        },
    }
}

/// `POST /api/sessions`; `target` is `("workspace", id)` or `("path", dir)`.
fn start(
    client: &Client,
    json: bool,
    (key, target): (&str, &str),
    prompt: &str,
    agent: Option<&str>,
    mode: Option<&str>,
) -> Result<(), CtlError> {
    let mut body = json!({ key: target, "prompt": prompt });
    if let Some(a) = agent {
        body["agent"] = Value::from(a);
    }
    if let Some(m) = mode {
        body["mode"] = Value::from(m);
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
pub(super) fn print_new(list: &[MessageView], seen: &mut HashMap<i64, String>, json: bool) {
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
