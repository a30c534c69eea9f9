//! The older "intercom" NDJSON dialect (`seeds/acp-stream-contract.md`).
//!
//! Four inbound messages (`clearance/request`, `status/update`,
//! `prompt/forward`, `heartbeat`) and five outbound ones
//! (`clearance/response`, `prompt/send`, `prompt/response`,
//! `session/interrupt`, `nudge`). The envelope is JSON-RPC-like without the
//! `jsonrpc` member; outbound messages carry an increasing `seq`.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use super::jsonrpc::{RpcId, RpcMessage};

/// One inbound dialect message.
#[derive(Debug, Clone, PartialEq)]
pub enum DialectIn {
    /// The agent asks to change a file.
    Clearance {
        /// Correlation id, kept as the agent sent it (number or string).
        id: RpcId,
        /// Payload.
        req: ClearanceRequest,
    },
    /// A status line.
    Status {
        /// The message.
        message: String,
    },
    /// A continuation prompt for the operator.
    PromptForward {
        /// Correlation id, kept as the agent sent it (number or string).
        id: RpcId,
        /// Prompt text.
        text: String,
        /// Prompt type (continuation, clarification, ...).
        kind: String,
    },
    /// Liveness, with optional progress.
    Heartbeat {
        /// Progress items as (label, status).
        progress: Vec<(String, String)>,
    },
}

/// `clearance/request` params.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ClearanceRequest {
    /// Title.
    pub title: String,
    /// Description.
    #[serde(default)]
    pub description: String,
    /// Unified diff.
    #[serde(default)]
    pub diff: Option<String>,
    /// The file.
    pub file_path: String,
    /// low / medium / high.
    #[serde(default = "default_risk")]
    pub risk_level: String,
}

impl ClearanceRequest {
    /// Every file the request changes: `file_path`, then each file its diff
    /// names ([`super::diff_paths::named_in`]: git's and patch's headers).
    /// Rules and modes judge them all: a diff can change other files than
    /// the one the agent names.
    pub fn paths(&self) -> Vec<String> {
        let mut paths = vec![self.file_path.clone()];
        for named in self
            .diff
            .iter()
            .flat_map(|d| super::diff_paths::named_in(d))
        {
            if !paths.contains(&named) {
                paths.push(named);
            }
        }
        paths
    }
}

fn default_risk() -> String {
    "low".to_owned()
}

#[derive(Deserialize)]
struct ProgressItem {
    label: String,
    #[serde(default)]
    status: String,
}

/// Why a dialect message was skipped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DialectError {
    /// A method this dialect does not have.
    #[error("unknown intercom method {0:?}")]
    UnknownMethod(String),
    /// A required field is missing or mistyped.
    #[error("intercom {method}: {problem}")]
    BadParams {
        /// Method.
        method: String,
        /// What is wrong (names the field).
        problem: String,
    },
}

fn bad(method: &str, problem: impl ToString) -> DialectError {
    DialectError::BadParams {
        method: method.to_owned(),
        problem: problem.to_string(),
    }
}

/// The request's id, which its answer must carry back unchanged (a number
/// stays a number: an agent matching answers by `===` would wait for ever).
fn required_id(id: Option<&RpcId>, method: &str) -> Result<RpcId, DialectError> {
    id.cloned().ok_or_else(|| bad(method, "missing field `id`"))
}

impl DialectIn {
    /// Interprets a parsed envelope.
    pub fn from_message(msg: &RpcMessage) -> Result<DialectIn, DialectError> {
        let (id, method, params) = match msg {
            RpcMessage::Request { id, method, params } => (Some(id), method, params),
            RpcMessage::Notification { method, params } => (None, method, params),
            RpcMessage::Response { .. } => {
                return Err(DialectError::UnknownMethod("<response>".to_owned()));
            }
        };
        match method.as_str() {
            "clearance/request" => Ok(DialectIn::Clearance {
                id: required_id(id, method)?,
                req: Deserialize::deserialize(params).map_err(|e| bad(method, e))?,
            }),
            "status/update" => Ok(DialectIn::Status {
                message: params
                    .get("message")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(method, "missing field `message`"))?
                    .to_owned(),
            }),
            "prompt/forward" => Ok(DialectIn::PromptForward {
                id: required_id(id, method)?,
                text: params
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(method, "missing field `text`"))?
                    .to_owned(),
                kind: params
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("continuation")
                    .to_owned(),
            }),
            "heartbeat" => {
                let items: Vec<ProgressItem> = match params.get("progress") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(p) => Deserialize::deserialize(p).map_err(|e| bad(method, e))?,
                };
                Ok(DialectIn::Heartbeat {
                    progress: items.into_iter().map(|i| (i.label, i.status)).collect(),
                })
            }
            other => Err(DialectError::UnknownMethod(other.to_owned())),
        }
    }
}

/// Builds outbound dialect messages, numbering them with `seq`.
#[derive(Debug, Default, Clone)]
pub struct DialectWriter {
    seq: u64,
}

impl DialectWriter {
    fn envelope(&mut self, method: &str, id: Option<&RpcId>, params: Value) -> Bytes {
        self.seq += 1;
        let mut v = json!({"method": method, "params": params, "seq": self.seq});
        if let Some(id) = id {
            v["id"] = json!(id);
        }
        Bytes::from(v.to_string())
    }

    /// `clearance/response`.
    pub fn clearance_response(
        &mut self,
        id: &RpcId,
        approved: bool,
        reason: Option<&str>,
    ) -> Bytes {
        let status = if approved { "approved" } else { "rejected" };
        self.envelope(
            "clearance/response",
            Some(id),
            json!({"status": status, "reason": reason}),
        )
    }

    /// `prompt/send`.
    pub fn prompt_send(&mut self, text: &str) -> Bytes {
        self.envelope("prompt/send", None, json!({"text": text}))
    }

    /// `prompt/response`.
    pub fn prompt_response(
        &mut self,
        id: &RpcId,
        decision: &str,
        instruction: Option<&str>,
    ) -> Bytes {
        self.envelope(
            "prompt/response",
            Some(id),
            json!({"decision": decision, "instruction": instruction}),
        )
    }

    /// `session/interrupt`.
    pub fn interrupt(&mut self, reason: &str) -> Bytes {
        self.envelope("session/interrupt", None, json!({"reason": reason}))
    }

    /// `nudge`.
    pub fn nudge(&mut self, message: &str) -> Bytes {
        self.envelope("nudge", None, json!({"message": message}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<DialectIn, DialectError> {
        DialectIn::from_message(&RpcMessage::parse(line.as_bytes()).expect("envelope"))
    }

    #[test]
    fn all_four_inbound_messages_parse() {
        let c = parse(
            r#"{"method":"clearance/request","id":"req-001","params":{"title":"Create","description":"d","diff":"--- a","file_path":"src/a.rs","risk_level":"low"}}"#,
        );
        assert!(matches!(c, Ok(DialectIn::Clearance { ref id, .. }) if *id == "req-001"));
        assert_eq!(
            parse(r#"{"method":"status/update","params":{"message":"Running"}}"#),
            Ok(DialectIn::Status {
                message: "Running".into()
            })
        );
        assert!(matches!(
            parse(
                r#"{"method":"prompt/forward","id":"prompt-001","params":{"text":"Refactor?","type":"continuation"}}"#
            ),
            Ok(DialectIn::PromptForward { .. })
        ));
        assert_eq!(
            parse(
                r#"{"method":"heartbeat","params":{"progress":[{"label":"Tests","status":"in_progress"}]}}"#
            ),
            Ok(DialectIn::Heartbeat {
                progress: vec![("Tests".into(), "in_progress".into())]
            })
        );
    }

    #[test]
    fn unknown_methods_and_missing_fields_are_named() {
        assert_eq!(
            parse(r#"{"method":"bogus","params":{}}"#),
            Err(DialectError::UnknownMethod("bogus".into()))
        );
        let e = parse(r#"{"method":"clearance/request","id":"r","params":{"title":"t"}}"#)
            .expect_err("missing");
        assert!(e.to_string().contains("file_path"), "{e}");
        let e = parse(r#"{"method":"status/update","params":{}}"#).expect_err("missing");
        assert!(e.to_string().contains("message"), "{e}");
    }

    #[test]
    fn outbound_messages_carry_ids_and_increasing_seq() {
        let mut w = DialectWriter::default();
        let a: Value = serde_json::from_slice(&w.clearance_response(&"req-001".into(), true, None))
            .expect("json");
        assert_eq!(a["method"], "clearance/response");
        assert_eq!(a["id"], "req-001");
        assert_eq!(a["params"]["status"], "approved");
        assert_eq!(a["seq"], 1);
        let b: Value =
            serde_json::from_slice(&w.prompt_response(&"prompt-001".into(), "refine", Some("x")))
                .expect("json");
        assert_eq!(
            (
                b["id"].clone(),
                b["params"]["decision"].clone(),
                b["seq"].clone()
            ),
            (json!("prompt-001"), json!("refine"), json!(2))
        );
        for bytes in [
            w.prompt_send("go"),
            w.interrupt("stop"),
            w.nudge("continue"),
        ] {
            let v: Value = serde_json::from_slice(&bytes).expect("json");
            assert!(v.get("id").is_none());
        }
    }

    /// An answer carries its request's id as the agent sent it: a number
    /// came back as a string, which an agent comparing ids strictly never
    /// matches.
    #[test]
    fn a_numeric_id_is_answered_as_a_number() {
        let Ok(DialectIn::Clearance { id, .. }) = parse(
            r#"{"method":"clearance/request","id":7,"params":{"title":"t","file_path":"a.rs"}}"#,
        ) else {
            panic!("a clearance with a numeric id parses");
        };
        let mut w = DialectWriter::default();
        let a: Value =
            serde_json::from_slice(&w.clearance_response(&id, false, Some("no"))).expect("json");
        assert_eq!(a["id"], json!(7));
        let b: Value = serde_json::from_slice(&w.prompt_response(&id, "stop", None)).expect("json");
        assert_eq!(b["id"], json!(7));
    }

    /// A clearance is judged by every file its diff changes, not only the
    /// one it names: a probe had `../../data/api-token` and `.git/hooks`
    /// approved by mode auto behind an innocent `file_path`.
    #[test]
    fn a_clearance_names_every_file_its_diff_changes() {
        let req = ClearanceRequest {
            title: "tidy".into(),
            description: String::new(),
            diff: Some(
                "--- a/../../data/api-token\n+++ b/../../data/api-token\n@@ -1 +1 @@\n-x\n+y\n\
                 --- /dev/null\n+++ b/.git/hooks/post-checkout\t2026-01-01\n@@ -0,0 +1 @@\n+sh\n\
                 --- sql comment removed, not a header\n"
                    .into(),
            ),
            file_path: "src/ok.rs".into(),
            risk_level: "low".into(),
        };
        assert_eq!(
            req.paths(),
            vec![
                "src/ok.rs",
                "../../data/api-token",
                ".git/hooks/post-checkout"
            ]
        );
    }
}
