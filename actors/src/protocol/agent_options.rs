//! The modes, models and configuration options an agent offers for its
//! session (ACP `session/new` / `session/load` results, `current_mode_update`
//! and `config_option_update` notifications), and the requests that switch
//! them (`session/set_mode`, `session/set_model`,
//! `session/set_config_option`).
//!
//! Claude Code offers modes (default, acceptEdits, plan, bypassPermissions,
//! ...) and models; other agents offer config options. What the agent sent
//! is untrusted: lists are bounded, names clipped, and a switch is only sent
//! for a value the agent itself offered.

use agent_client_protocol_schema::v1 as acp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// At most this many modes, models, options or values are kept.
const MAX_ENTRIES: usize = 64;
/// Ids and names are clipped to this many characters.
const MAX_TEXT: usize = 200;

/// One offered choice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offered {
    /// What to send back.
    pub id: String,
    /// What to show.
    pub name: String,
}

/// A select-type configuration option.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigOption {
    /// Option id (`configId`).
    pub id: String,
    /// Display name.
    pub name: String,
    /// Current value.
    pub current: Option<String>,
    /// Allowed values.
    pub values: Vec<Offered>,
}

/// Everything the agent offers for its session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentOptions {
    /// The current mode.
    pub current_mode: Option<String>,
    /// Offered modes.
    pub modes: Vec<Offered>,
    /// The current model.
    pub current_model: Option<String>,
    /// Offered models.
    pub models: Vec<Offered>,
    /// Select-type configuration options.
    pub config: Vec<ConfigOption>,
}

fn clip(s: &str) -> String {
    s.chars().take(MAX_TEXT).collect()
}

fn offered(list: Option<&Value>, id_key: &str) -> Vec<Offered> {
    list.and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|m| {
                    let id = m.get(id_key)?.as_str()?;
                    let name = m.get("name").and_then(Value::as_str).unwrap_or(id);
                    Some(Offered {
                        id: clip(id),
                        name: clip(name),
                    })
                })
                .take(MAX_ENTRIES)
                .collect()
        })
        .unwrap_or_default()
}

fn config_options(list: Option<&Value>) -> Vec<ConfigOption> {
    let Some(items) = list.and_then(Value::as_array) else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|v| serde_json::from_value::<acp::SessionConfigOption>(v.clone()).ok())
        .filter_map(|o| match o.kind {
            acp::SessionConfigKind::Select(select) => {
                let values = match select.options {
                    acp::SessionConfigSelectOptions::Ungrouped(values) => values,
                    acp::SessionConfigSelectOptions::Grouped(groups) => {
                        groups.into_iter().flat_map(|g| g.options).collect()
                    }
                    _ => Vec::new(),
                };
                Some(ConfigOption {
                    id: clip(&o.id.to_string()),
                    name: clip(&o.name),
                    current: Some(clip(&select.current_value.to_string())),
                    values: values
                        .iter()
                        .take(MAX_ENTRIES)
                        .map(|v| Offered {
                            id: clip(&v.value.to_string()),
                            name: clip(&v.name),
                        })
                        .collect(),
                })
            }
            _ => None,
        })
        .take(MAX_ENTRIES)
        .collect()
}

impl AgentOptions {
    /// Reads what a `session/new` / `session/load` result offers; anything
    /// malformed is ignored.
    pub fn from_session_result(result: &Value) -> AgentOptions {
        let text = |p: &str| result.pointer(p).and_then(Value::as_str).map(clip);
        AgentOptions {
            current_mode: text("/modes/currentModeId"),
            modes: offered(result.pointer("/modes/availableModes"), "id"),
            current_model: text("/models/currentModelId"),
            models: offered(result.pointer("/models/availableModels"), "modelId"),
            config: config_options(result.get("configOptions")),
        }
    }

    /// True when the agent offers anything to switch.
    pub fn is_empty(&self) -> bool {
        self.modes.is_empty() && self.models.is_empty() && self.config.is_empty()
    }

    /// Applies a `current_mode_update` or `config_option_update`; true when
    /// it was one.
    pub fn apply_update(&mut self, update: &Value) -> bool {
        match update.get("sessionUpdate").and_then(Value::as_str) {
            Some("current_mode_update") => {
                self.current_mode = update
                    .get("currentModeId")
                    .and_then(Value::as_str)
                    .map(clip);
                true
            }
            Some("config_option_update") => {
                self.config = config_options(update.get("configOptions"));
                true
            }
            _ => false,
        }
    }
}

/// An operator's switch of what the agent offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSetting {
    /// `session/set_mode`.
    Mode(String),
    /// `session/set_model` (offered as `models`).
    Model(String),
    /// `session/set_config_option`.
    Config {
        /// Option id.
        id: String,
        /// New value.
        value: String,
    },
}

/// True for an agent mode in which the agent acts without asking the
/// client (Claude Code's `bypassPermissions`, Gemini CLI's `yolo`): the
/// server's approval mode then sees none of its actions.
pub fn asks_nothing(mode: &str) -> bool {
    let m = mode.to_ascii_lowercase();
    m.contains("bypass") || m == "yolo"
}

/// What the operator is told when the agent's mode becomes `mode`, on top
/// of the switch itself, when the agent stops asking in it.
pub fn no_asking_warning(mode: &str) -> Option<String> {
    asks_nothing(mode).then(|| {
        format!(
            "In mode `{}` the agent runs its tools without asking: no permission request reaches the server, so its approval mode and rules no longer apply to this session. Switch the agent back to a mode that asks (`agent-mode`) to be asked again.",
            crate::text::log_safe(mode)
        )
    })
}

impl AgentSetting {
    /// Refuses values the agent did not offer; the error lists what it did.
    pub fn validate(&self, offered: &AgentOptions) -> Result<(), String> {
        let check = |what: &str, list: &[Offered], id: &str| {
            if list.iter().any(|o| o.id == id) {
                return Ok(());
            }
            if list.is_empty() {
                return Err(format!("the agent offers no {what}s"));
            }
            let ids: Vec<&str> = list.iter().map(|o| o.id.as_str()).collect();
            Err(format!(
                "{what} {id:?} is not offered; the agent offers: {}",
                ids.join(", ")
            ))
        };
        match self {
            AgentSetting::Mode(id) => check("mode", &offered.modes, id),
            AgentSetting::Model(id) => check("model", &offered.models, id),
            AgentSetting::Config { id, value } => {
                let Some(option) = offered.config.iter().find(|o| &o.id == id) else {
                    let ids: Vec<&str> = offered.config.iter().map(|o| o.id.as_str()).collect();
                    return Err(format!(
                        "config option {id:?} is not offered; the agent offers: {}",
                        if ids.is_empty() {
                            "none".to_owned()
                        } else {
                            ids.join(", ")
                        }
                    ));
                };
                check(&format!("value of {id}"), &option.values, value)
            }
        }
    }

    /// The method and params to send.
    pub fn request(&self, session_id: &str) -> (&'static str, Value) {
        match self {
            AgentSetting::Mode(id) => (
                "session/set_mode",
                json!({"sessionId": session_id, "modeId": id}),
            ),
            AgentSetting::Model(id) => (
                "session/set_model",
                json!({"sessionId": session_id, "modelId": id}),
            ),
            AgentSetting::Config { id, value } => (
                "session/set_config_option",
                json!({"sessionId": session_id, "configId": id, "value": value}),
            ),
        }
    }

    /// Records the switch once the agent accepted it.
    pub fn apply(&self, options: &mut AgentOptions) {
        match self {
            AgentSetting::Mode(id) => options.current_mode = Some(id.clone()),
            AgentSetting::Model(id) => options.current_model = Some(id.clone()),
            AgentSetting::Config { id, value } => {
                if let Some(o) = options.config.iter_mut().find(|o| &o.id == id) {
                    o.current = Some(value.clone());
                }
            }
        }
    }

    /// "mode plan", "model opus", "thought_level high".
    pub fn describe(&self) -> String {
        match self {
            AgentSetting::Mode(id) => format!("mode {id}"),
            AgentSetting::Model(id) => format!("model {id}"),
            AgentSetting::Config { id, value } => format!("{id} {value}"),
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn modes_that_ask_nothing_are_told() {
        for m in ["bypassPermissions", "yolo", "YOLO"] {
            assert!(no_asking_warning(m).is_some(), "{m}");
        }
        for m in ["default", "acceptEdits", "plan", "auto_edit"] {
            assert!(no_asking_warning(m).is_none(), "{m}");
        }
    }

    use super::*;

    fn claude_new_session() -> Value {
        json!({"sessionId": "s", "models": {"availableModels": [
                {"modelId": "default", "name": "Default (recommended)"}, {"modelId": "opus", "name": "Opus"}],
              "currentModelId": "default"},
            "modes": {"currentModeId": "default", "availableModes": [
                {"id": "default", "name": "Default"}, {"id": "acceptEdits", "name": "Accept Edits"},
                {"id": "plan", "name": "Plan Mode"}]},
            "configOptions": [{"id": "effort", "name": "Effort", "type": "select", "currentValue": "low",
                "options": [{"value": "low", "name": "Low"}, {"value": "high", "name": "High"}]}]})
    }

    #[test]
    fn session_results_are_read() {
        let o = AgentOptions::from_session_result(&claude_new_session());
        assert_eq!(o.current_mode.as_deref(), Some("default"));
        assert_eq!(o.modes.len(), 3);
        assert_eq!(o.current_model.as_deref(), Some("default"));
        assert_eq!(o.models[1].id, "opus");
        assert_eq!(o.config[0].id, "effort");
        assert_eq!(o.config[0].values[1].id, "high");
        assert!(AgentOptions::from_session_result(&json!({"sessionId": "s"})).is_empty());
    }

    #[test]
    fn only_offered_values_are_sent() {
        let o = AgentOptions::from_session_result(&claude_new_session());
        assert!(AgentSetting::Mode("plan".into()).validate(&o).is_ok());
        let err = AgentSetting::Mode("yolo".into())
            .validate(&o)
            .expect_err("not offered");
        assert!(err.contains("default, acceptEdits, plan"), "{err}");
        assert!(AgentSetting::Model("opus".into()).validate(&o).is_ok());
        let cfg = AgentSetting::Config {
            id: "effort".into(),
            value: "high".into(),
        };
        assert!(cfg.validate(&o).is_ok());
        assert_eq!(
            cfg.request("s"),
            (
                "session/set_config_option",
                json!({"sessionId": "s", "configId": "effort", "value": "high"})
            )
        );
        assert!(
            AgentSetting::Config {
                id: "effort".into(),
                value: "max".into()
            }
            .validate(&o)
            .is_err()
        );
    }

    #[test]
    fn updates_change_the_current_mode() {
        let mut o = AgentOptions::from_session_result(&claude_new_session());
        assert!(o.apply_update(
            &json!({"sessionUpdate": "current_mode_update", "currentModeId": "plan"})
        ));
        assert_eq!(o.current_mode.as_deref(), Some("plan"));
        assert!(!o.apply_update(&json!({"sessionUpdate": "plan"})));
    }

    #[test]
    fn hostile_lists_are_bounded() {
        let modes: Vec<Value> = (0..1000)
            .map(|i| json!({"id": format!("m{i}"), "name": "x".repeat(10_000)}))
            .collect();
        let o = AgentOptions::from_session_result(
            &json!({"modes": {"currentModeId": "m0", "availableModes": modes}}),
        );
        assert_eq!(o.modes.len(), MAX_ENTRIES);
        assert_eq!(o.modes[0].name.chars().count(), MAX_TEXT);
    }
}
