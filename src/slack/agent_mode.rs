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

/// What the agent offers, the current choices in bold.
fn describe(id: &str, o: &AgentOptions) -> String {
    if o.is_empty() {
        return format!("The agent of `{id}` offers no modes, models or options.");
    }
    let list = |items: &[Offered], current: Option<&str>| {
        items
            .iter()
            .map(|c| {
                let code = format!("`{}`", render::escape(&c.id));
                if Some(c.id.as_str()) == current {
                    format!("*{code}* (current)")
                } else {
                    code
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
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
    for c in &o.config {
        lines.push(format!(
            "• {}: {} — `/intercom agent-mode {} <value>`",
            render::escape(&c.name),
            list(&c.values, c.current.as_deref()),
            render::escape(&c.id)
        ));
    }
    lines.join("\n")
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
        assert!(text.contains("`default`, *`plan`* (current)"), "{text}");
        assert!(describe("s-1", &AgentOptions::default()).contains("offers no modes"));
    }
}
