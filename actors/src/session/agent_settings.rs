//! The agent's own modes, models and config options, switched by an
//! operator: validated against what the agent offered, sent as
//! `session/set_mode` / `session/set_model` / `session/set_config_option`,
//! and answered to the operator once the agent accepted or refused.

use ractor::RpcReplyPort;
use serde_json::{Value, json};

use super::{Caller, Outgoing, Phase, SessionError, SessionState};
use crate::ports::NoticeLevel;
use crate::protocol::agent_options::{AgentOptions, AgentSetting};
use crate::protocol::jsonrpc::RpcError;

impl SessionState {
    /// Records what a `session/new` / `session/load` result offers.
    pub(super) fn learn_agent_options(&mut self, result: &Value) {
        let offered = AgentOptions::from_session_result(result);
        if !offered.is_empty() {
            self.agent_options = offered;
        }
    }

    /// Sends the switch; `reply` is answered when the agent answers.
    pub(super) async fn set_agent_option(
        &mut self,
        setting: AgentSetting,
        caller: &Caller,
        reply: RpcReplyPort<Result<(), SessionError>>,
    ) {
        if let Err(e) = self.authorize(caller, "set agent option").await {
            let _ = reply.send(Err(e));
            return;
        }
        if !self.is_acp() || self.phase != Phase::Ready {
            let _ = reply.send(Err(SessionError::NotLive(self.status)));
            return;
        }
        if let Err(e) = setting.validate(&self.agent_options) {
            let _ = reply.send(Err(SessionError::NotOffered(e)));
            return;
        }
        let session = self.acp_session.clone().unwrap_or_default();
        let (method, params) = setting.request(&session);
        self.audit(
            &caller.id,
            "session.agent_option_requested",
            json!({"setting": setting.describe()}),
        )
        .await;
        match self.request_tracked(method, params, Outgoing::SetOption(setting), None) {
            Some(rpc) => {
                self.setting_waiters.insert(rpc, reply);
            }
            None => {
                let _ = reply.send(Err(SessionError::AgentRefused(
                    "the agent's stdin is closed".into(),
                )));
            }
        }
    }

    /// The agent answered a switch.
    pub(super) async fn on_setting_response(
        &mut self,
        rpc: i64,
        setting: AgentSetting,
        outcome: Result<Value, RpcError>,
    ) {
        let waiter = self.setting_waiters.remove(&rpc);
        let result = match outcome {
            Ok(_) => {
                setting.apply(&mut self.agent_options);
                self.emit_notice(
                    NoticeLevel::Info,
                    &format!("The agent's {} is now set.", setting.describe()),
                )
                .await;
                if let AgentSetting::Mode(mode) = &setting
                    && let Some(warning) = crate::protocol::agent_options::no_asking_warning(mode)
                {
                    self.emit_notice(NoticeLevel::Warning, &warning).await;
                }
                Ok(())
            }
            Err(e) => {
                let text = format!("the agent refused {}: {e}", setting.describe());
                self.emit_notice(
                    NoticeLevel::Warning,
                    &format!("The agent refused {}: {e}.", setting.describe()),
                )
                .await;
                Err(SessionError::AgentRefused(text))
            }
        };
        if let Some(waiter) = waiter {
            let _ = waiter.send(result);
        }
    }
}
