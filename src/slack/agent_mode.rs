//! `/intercom agent-mode`: shows and switches the agent's own modes, models
//! and config options (what it offered in `session/new`, e.g. Claude Code's
//! default / acceptEdits / plan / bypassPermissions), as opposed to
//! agent-intercom's approval `mode`.

use intercom_actors::protocol::agent_options::{AgentOptions, AgentSetting, Offered};
use intercom_actors::session::SessionMsg;
use intercom_actors::slack_port::MessageBody;

use super::commands::{looks_like_id, resolve, snapshot};
use super::inbound::{Ctx, Reply, session_error_text};
use super::render;

/// How long the agent may take to accept a switch.
const SWITCH_TIMEOUT_MS: u64 = 15_000;

/// What `agent-mode` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentModeCommand {
    /// Session id, when given.
    pub id: Option<String>,
    /// The switch; `None` shows what the agent offers.
    pub setting: Option<AgentSetting>,
}

/// `agent-mode [id] [<mode> | model <model> | <option> <value>]`.
pub fn parse(rest: &str) -> AgentModeCommand {
    let mut id = None;
    let mut words = Vec::new();
    for w in rest.split_whitespace() {
        if id.is_none() && looks_like_id(w) {
            id = Some(w.to_owned());
        } else {
            words.push(w.to_owned());
        }
    }
    let setting = match words.as_slice() {
        [] => None,
        [m] => Some(AgentSetting::Mode(m.clone())),
        [k, m] if k.eq_ignore_ascii_case("model") => Some(AgentSetting::Model(m.clone())),
        [k, v, ..] => Some(AgentSetting::Config {
            id: k.clone(),
            value: v.clone(),
        }),
    };
    AgentModeCommand { id, setting }
}

/// Runs the command and answers ephemerally.
pub async fn run(ctx: &Ctx, reply: Reply, cmd: AgentModeCommand) {
    let Some((rec, _hint)) = resolve(ctx, &reply, cmd.id.as_deref()).await else {
        return;
    };
    let Some(actor) = ctx.actor(&rec.id).await else {
        reply.send(
            ctx,
            render::problem(&format!(
                "Session `{}` has no running agent right now.",
                rec.id
            )),
        );
        return;
    };
    let Some(setting) = cmd.setting else {
        let body = match snapshot(ctx, &rec.id).await {
            Some(s) => MessageBody::text(describe(&rec.id.0, &s.agent_options)),
            None => render::problem("The session did not answer."),
        };
        reply.send(ctx, body);
        return;
    };
    let caller = ctx.caller(&reply.user);
    let what = setting.describe();
    let outcome = ractor::call_t!(
        actor,
        |r| SessionMsg::SetAgentOption {
            setting,
            caller,
            reply: r
        },
        SWITCH_TIMEOUT_MS
    );
    let body = match outcome {
        Ok(Ok(())) => MessageBody::text(format!(
            ":gear: The agent of `{}` switched to {}.",
            rec.id,
            render::escape(&what)
        )),
        Ok(Err(e)) => render::problem(&session_error_text(&e)),
        Err(e) => render::problem(&format!("The session did not answer: {e}")),
    };
    reply.send(ctx, body);
}

/// Most choices listed per mode, model or option (the current one first).
const LISTED: usize = 10;
/// Most options listed.
const OPTIONS_LISTED: usize = 10;
/// Longest id or name shown, in characters.
const ID_SHOWN: usize = 40;

/// What the agent offers, the current choices first and in bold. The agent
/// names every mode, model and option, so each list is bounded: a probe's
/// 64 mode ids of 200 characters put the current mode (`bypassPermissions`)
/// past the 40,000 characters Slack shows.
fn describe(id: &str, o: &AgentOptions) -> String {
    if o.is_empty() {
        return format!("The agent of `{id}` offers no modes, models or options.");
    }
    let code = |text: &str| format!("`{}`", shown_id(text));
    let list = |items: &[Offered], current: Option<&str>| {
        let mut shown: Vec<String> = current
            .map(|c| format!("*{}* (current)", code(c)))
            .into_iter()
            .collect();
        let others = items.iter().filter(|c| Some(c.id.as_str()) != current);
        let total = others.clone().count();
        shown.extend(others.take(LISTED).map(|c| code(&c.id)));
        if total > LISTED {
            shown.push(format!("and {} more", total - LISTED));
        }
        shown.join(", ")
    };
    let mut lines = vec![format!("*What the agent of `{id}` offers*")];
    if !o.modes.is_empty() {
        lines.push(format!(
            "• modes: {} — `/intercom agent-mode <mode>`",
            list(&o.modes, o.current_mode.as_deref())
        ));
    }
    if !o.models.is_empty() {
        lines.push(format!(
            "• models: {} — `/intercom agent-mode model <model>`",
            list(&o.models, o.current_model.as_deref())
        ));
    }
    for c in o.config.iter().take(OPTIONS_LISTED) {
        lines.push(format!(
            "• {}: {} — `/intercom agent-mode {} <value>`",
            shown_id(&c.name),
            list(&c.values, c.current.as_deref()),
            shown_id(&c.id)
        ));
    }
    if o.config.len() > OPTIONS_LISTED {
        lines.push(format!(
            "• and {} more options (all of them: `live.agent_options` in `GET /api/sessions/{id}`)",
            o.config.len() - OPTIONS_LISTED
        ));
    }
    lines.join("\n")
}

/// An id or a name the agent chose, for a code span: one line, no
/// backticks (one would close the span), at most [`ID_SHOWN`] characters.
fn shown_id(text: &str) -> String {
    render::one_line(&text.replace('`', "ˋ"), ID_SHOWN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_modes_models_and_options() {
        assert_eq!(parse("").setting, None);
        assert_eq!(
            parse("s-ab acceptEdits"),
            AgentModeCommand {
                id: Some("s-ab".into()),
                setting: Some(AgentSetting::Mode("acceptEdits".into()))
            }
        );
        assert_eq!(
            parse("model opus").setting,
            Some(AgentSetting::Model("opus".into()))
        );
        assert_eq!(
            parse("effort high").setting,
            Some(AgentSetting::Config {
                id: "effort".into(),
                value: "high".into()
            })
        );
    }

    #[test]
    fn offers_are_listed_with_the_current_choice() {
        let o = AgentOptions {
            current_mode: Some("plan".into()),
            modes: vec![
                Offered {
                    id: "default".into(),
                    name: "Default".into(),
                },
                Offered {
                    id: "plan".into(),
                    name: "Plan".into(),
                },
            ],
            ..Default::default()
        };
        let text = describe("s-1", &o);
        assert!(text.contains("*`plan`* (current), `default`"), "{text}");
        assert!(describe("s-1", &AgentOptions::default()).contains("offers no modes"));
    }

    /// The agent names its modes: 64 of 200 characters put the current one
    /// (last) past what Slack shows. The current one now comes first and
    /// the rest are counted past a bound.
    #[test]
    fn many_long_modes_keep_the_current_one_in_view() {
        let mut modes: Vec<Offered> = (0..64)
            .map(|i| Offered {
                id: format!("{i}{}", "&`".repeat(100)),
                name: String::new(),
            })
            .collect();
        modes.push(Offered {
            id: "bypassPermissions".into(),
            name: String::new(),
        });
        let o = AgentOptions {
            current_mode: Some("bypassPermissions".into()),
            modes,
            ..Default::default()
        };
        let text = describe("s-1", &o);
        assert!(text.len() < 3000, "{}", text.len());
        assert!(text.contains("*`bypassPermissions`* (current)"), "{text}");
        assert!(text.contains("and 54 more"), "{text}");
        assert_eq!(text.matches('`').count() % 2, 0, "{text}");
    }
}
