//! The eight MCP tools: names, argument schemas, and argument checking.
//!
//! Each tool's arguments are declared once in a table ([`SPECS`]); the JSON
//! schema `tools/list` advertises and the validation `tools/call` runs are
//! both derived from it, so they cannot drift apart. Validation errors name
//! the argument and say why, and become MCP invalid-params errors.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool};
use serde_json::{Map, Value, json};

/// Longest `standby` wait a client may ask for (1 h; clients call again).
pub const MAX_STANDBY_SECS: u64 = 3_600;

/// The type an argument must have.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A non-empty string (after trimming).
    Text,
    /// Any string, possibly empty.
    Str,
    /// true / false.
    Bool,
    /// Whole seconds, 1 ..= [`MAX_STANDBY_SECS`].
    Seconds,
    /// One of the listed strings.
    OneOf(&'static [&'static str]),
    /// `[{label, status}]` progress items.
    Progress,
    /// Any JSON value.
    Any,
}

/// One argument of a tool.
#[derive(Debug)]
pub struct Param {
    /// Its name.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Whether it must be given.
    pub required: bool,
    /// What it means.
    pub description: &'static str,
}

/// One tool.
#[derive(Debug)]
pub struct Spec {
    /// Tool name.
    pub name: &'static str,
    /// What it does (shown to the model).
    pub description: &'static str,
    /// Its arguments.
    pub params: &'static [Param],
}

const fn req(name: &'static str, kind: Kind, description: &'static str) -> Param {
    Param {
        name,
        kind,
        required: true,
        description,
    }
}

const fn opt(name: &'static str, kind: Kind, description: &'static str) -> Param {
    Param {
        name,
        kind,
        required: false,
        description,
    }
}

/// Risk levels `check_clearance` accepts.
pub const RISK_LEVELS: &[&str] = &["low", "medium", "high", "critical"];
/// Levels `broadcast` accepts.
pub const LEVELS: &[&str] = &["info", "warning", "error"];

/// Every tool, in the order `tools/list` gives them.
pub static SPECS: &[Spec] = &[
    Spec {
        name: "check_clearance",
        description: "Ask the operator to approve a file change before making it. Blocks until the operator approves or rejects, or until the approval timeout; returns {status: approved|rejected|timeout, request_id, reason?}. After approval call check_diff with the request_id to apply the change.",
        params: &[
            req("title", Kind::Text, "One-line summary of the change."),
            opt("description", Kind::Str, "Why the change is needed."),
            req(
                "diff",
                Kind::Text,
                "A unified diff, or the complete new content of file_path.",
            ),
            req(
                "file_path",
                Kind::Text,
                "The file to change, relative to the workspace.",
            ),
            opt(
                "risk_level",
                Kind::OneOf(RISK_LEVELS),
                "low (default), medium, high or critical.",
            ),
        ],
    },
    Spec {
        name: "check_diff",
        description: "Apply a change the operator approved through check_clearance: writes the diff or whole file inside the workspace atomically. Refuses when the file changed since approval unless force is true. Returns {files_written: [...]}.",
        params: &[
            req(
                "request_id",
                Kind::Text,
                "The request_id check_clearance returned.",
            ),
            opt(
                "force",
                Kind::Bool,
                "Apply even though the file changed since approval (or the server restarted and cannot tell).",
            ),
        ],
    },
    Spec {
        name: "auto_check",
        description: "Ask whether an action is pre-approved by the approval policy, without asking the operator. Returns {auto_approved, matched_rule}.",
        params: &[
            req(
                "tool_name",
                Kind::Text,
                "The tool or command the agent wants to run.",
            ),
            opt(
                "kind",
                Kind::Str,
                "What kind of action it is (e.g. terminal_command, file_operation).",
            ),
            opt(
                "context",
                Kind::Any,
                "Details of the action, an object: path, file_path, paths, command.",
            ),
        ],
    },
    Spec {
        name: "transmit",
        description: "Forward a continuation prompt to the operator and wait for the answer. Returns {decision: continue|refine|stop, instruction?}; continues automatically when the operator does not answer in time (then auto: true and a reason).",
        params: &[
            req(
                "prompt_text",
                Kind::Text,
                "The question or prompt to forward.",
            ),
            opt(
                "prompt_type",
                Kind::Str,
                "continuation (default), clarification, error_recovery, resource_warning, ...",
            ),
        ],
    },
    Spec {
        name: "standby",
        description: "Wait for an instruction from the operator. Returns {status: resumed, instruction} or {status: timeout}.",
        params: &[
            opt(
                "message",
                Kind::Str,
                "What the agent tells the operator while it waits.",
            ),
            opt(
                "timeout_seconds",
                Kind::Seconds,
                "How long to wait (1 to 3600; default: the approval timeout).",
            ),
        ],
    },
    Spec {
        name: "ping",
        description: "Report liveness and progress (resets stall detection). Returns {queued_steering: [...]}: operator instructions queued for the agent, each handed over once.",
        params: &[
            opt("status_message", Kind::Str, "A short status line."),
            opt(
                "progress_snapshot",
                Kind::Progress,
                "Progress items: [{label, status}] (status e.g. done, in_progress, pending).",
            ),
        ],
    },
    Spec {
        name: "broadcast",
        description: "Post a status line to the operator (the session's Slack thread). Does not wait.",
        params: &[
            req("message", Kind::Text, "The message."),
            opt(
                "level",
                Kind::OneOf(LEVELS),
                "info (default), warning or error.",
            ),
        ],
    },
    Spec {
        name: "reboot",
        description: "Recover after a crash or restart: pending requests, queued steering and the last progress of this session (or of session_id).",
        params: &[opt(
            "session_id",
            Kind::Text,
            "A previous session of the same workspace to recover (default: this connection's session). With a bridge token only the token's own session.",
        )],
    },
];

/// The spec of a tool by name.
pub fn spec(name: &str) -> Option<&'static Spec> {
    SPECS.iter().find(|s| s.name == name)
}

fn schema_of(kind: Kind) -> Value {
    match kind {
        Kind::Text => json!({"type": "string", "minLength": 1}),
        Kind::Str => json!({"type": "string"}),
        Kind::Bool => json!({"type": "boolean"}),
        Kind::Seconds => json!({"type": "integer", "minimum": 1, "maximum": MAX_STANDBY_SECS}),
        Kind::OneOf(values) => json!({"type": "string", "enum": values}),
        Kind::Progress => json!({
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"label": {"type": "string"}, "status": {"type": "string"}},
                "required": ["label", "status"]
            }
        }),
        Kind::Any => json!({}),
    }
}

/// The tool definitions for `tools/list`.
pub fn definitions() -> Vec<Tool> {
    SPECS
        .iter()
        .map(|s| {
            let mut props = Map::new();
            for p in s.params {
                let mut schema = schema_of(p.kind);
                if let Value::Object(o) = &mut schema {
                    o.insert("description".into(), Value::String(p.description.into()));
                }
                props.insert(p.name.into(), schema);
            }
            let required: Vec<&str> = s
                .params
                .iter()
                .filter(|p| p.required)
                .map(|p| p.name)
                .collect();
            let mut schema = JsonObject::new();
            schema.insert("type".into(), json!("object"));
            schema.insert("properties".into(), Value::Object(props));
            schema.insert("required".into(), json!(required));
            schema.insert("additionalProperties".into(), json!(false));
            Tool::new(s.name, s.description, Arc::new(schema))
        })
        .collect()
}

/// Checked arguments of one call: every present value has its declared type.
#[derive(Debug, Default)]
pub struct Args(Map<String, Value>);

/// Checks `args` against `spec`; the error names the argument and says why.
pub fn validate(spec: &Spec, args: Option<JsonObject>) -> Result<Args, String> {
    let mut map = args.unwrap_or_default();
    // An explicit null is the same as leaving an optional argument out.
    map.retain(|_, v| !v.is_null());
    for key in map.keys() {
        if !spec.params.iter().any(|p| p.name == key) {
            let known: Vec<&str> = spec.params.iter().map(|p| p.name).collect();
            return Err(format!(
                "unknown argument `{key}` for {}; it takes: {}",
                spec.name,
                known.join(", ")
            ));
        }
    }
    for p in spec.params {
        match map.get(p.name) {
            None if p.required => {
                return Err(format!(
                    "argument `{}` is required ({})",
                    p.name, p.description
                ));
            }
            None => {}
            Some(v) => check(p, v)?,
        }
    }
    Ok(Args(map))
}

fn check(p: &Param, v: &Value) -> Result<(), String> {
    let name = p.name;
    let got = || match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    match p.kind {
        Kind::Text => match v.as_str() {
            Some(s) if !s.trim().is_empty() => Ok(()),
            Some(_) => Err(format!("argument `{name}` must not be empty")),
            None => Err(format!("argument `{name}` must be a string, got {}", got())),
        },
        Kind::Str => v
            .is_string()
            .then_some(())
            .ok_or_else(|| format!("argument `{name}` must be a string, got {}", got())),
        Kind::Bool => v
            .is_boolean()
            .then_some(())
            .ok_or_else(|| format!("argument `{name}` must be true or false, got {}", got())),
        Kind::Seconds => match v.as_u64() {
            Some(n) if (1..=MAX_STANDBY_SECS).contains(&n) => Ok(()),
            _ => Err(format!(
                "argument `{name}` must be a whole number of seconds from 1 to {MAX_STANDBY_SECS}, got {v}"
            )),
        },
        Kind::OneOf(values) => match v.as_str() {
            Some(s) if values.contains(&s) => Ok(()),
            _ => Err(format!(
                "argument `{name}` must be one of {}, got {v}",
                values.join(", ")
            )),
        },
        Kind::Progress => {
            let Some(items) = v.as_array() else {
                return Err(format!(
                    "argument `{name}` must be an array of {{label, status}} objects, got {}",
                    got()
                ));
            };
            for (i, item) in items.iter().enumerate() {
                let ok = item.get("label").is_some_and(Value::is_string)
                    && item.get("status").is_some_and(Value::is_string);
                if !ok {
                    return Err(format!(
                        "argument `{name}`: item {i} must be an object with string `label` and `status`, got {item}"
                    ));
                }
            }
            Ok(())
        }
        Kind::Any => Ok(()),
    }
}

impl Args {
    /// Any argument as JSON.
    pub fn value(&self, name: &str) -> Option<&Value> {
        self.0.get(name)
    }

    /// A string argument (absent: None).
    pub fn str(&self, name: &str) -> Option<&str> {
        self.0.get(name).and_then(Value::as_str)
    }

    /// A string argument with a default.
    pub fn str_or<'a>(&'a self, name: &str, default: &'a str) -> &'a str {
        self.str(name).unwrap_or(default)
    }

    /// A boolean argument (absent: false).
    pub fn flag(&self, name: &str) -> bool {
        self.0.get(name).and_then(Value::as_bool).unwrap_or(false)
    }

    /// A whole-number argument.
    pub fn u64(&self, name: &str) -> Option<u64> {
        self.0.get(name).and_then(Value::as_u64)
    }

    /// `[{label, status}]` as pairs.
    pub fn progress(&self, name: &str) -> Vec<(String, String)> {
        self.0
            .get(name)
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(|i| {
                        Some((
                            i.get("label")?.as_str()?.to_owned(),
                            i.get("status")?.as_str()?.to_owned(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Option<JsonObject> {
        match v {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    #[test]
    fn every_tool_has_a_schema_matching_its_table() {
        let defs = definitions();
        let names: Vec<&str> = defs.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(
            names,
            vec![
                "check_clearance",
                "check_diff",
                "auto_check",
                "transmit",
                "standby",
                "ping",
                "broadcast",
                "reboot"
            ]
        );
        let clearance = &defs[0].input_schema;
        assert_eq!(
            clearance.get("required"),
            Some(&json!(["title", "diff", "file_path"]))
        );
    }

    #[test]
    fn errors_name_the_argument_and_the_reason() {
        let s = spec("check_clearance").expect("spec");
        let err = validate(s, obj(json!({"title": "t", "diff": "d"}))).expect_err("missing");
        assert!(err.contains("`file_path` is required"), "{err}");
        let err =
            validate(s, obj(json!({"title": "t", "diff": "d", "file_path": 3}))).expect_err("type");
        assert!(
            err.contains("`file_path` must be a string, got a number"),
            "{err}"
        );
        let err = validate(
            s,
            obj(json!({"title": "t", "diff": "d", "file_path": "x", "risk_level": "huge"})),
        )
        .expect_err("enum");
        assert!(
            err.contains("`risk_level` must be one of low, medium"),
            "{err}"
        );
        let err = validate(
            s,
            obj(json!({"title": "t", "diff": "d", "file_path": "x", "filePath": "x"})),
        )
        .expect_err("unknown");
        assert!(err.contains("unknown argument `filePath`"), "{err}");
        let ok = validate(
            s,
            obj(json!({"title": "t", "diff": "d", "file_path": "x", "description": null})),
        )
        .expect("null is absent");
        assert_eq!(ok.str("description"), None);
        let standby = spec("standby").expect("spec");
        let err = validate(standby, obj(json!({"timeout_seconds": 0}))).expect_err("range");
        assert!(err.contains("`timeout_seconds`"), "{err}");
        let ping = spec("ping").expect("spec");
        let err =
            validate(ping, obj(json!({"progress_snapshot": [{"label": 1}]}))).expect_err("items");
        assert!(err.contains("item 0"), "{err}");
        let ok = validate(
            ping,
            obj(json!({"progress_snapshot": [{"label": "a", "status": "done"}]})),
        )
        .expect("ok");
        assert_eq!(
            ok.progress("progress_snapshot"),
            vec![("a".into(), "done".into())]
        );
    }
}
