//! The agent's own modes, models and config options: read from
//! `session/new`, shown on the session, switched by an operator only to
//! values the agent offered, and answered once the agent accepted.

mod support;

use intercom_actors::protocol::agent_options::AgentSetting;
use intercom_actors::session::{Caller, SessionError, SessionMsg};
use serde_json::json;
use support::{Harness, Knobs};

#[tokio::test]
async fn offered_modes_and_models_are_shown_and_switched() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({
        "session_options": {
            "modes": {"currentModeId": "default", "availableModes": [
                {"id": "default", "name": "Default"}, {"id": "plan", "name": "Plan Mode"}]},
            "models": {"currentModelId": "default", "availableModels": [
                {"modelId": "default", "name": "Default"}, {"modelId": "opus", "name": "Opus"}]}
        },
        "turns": [[{"chunk": "hi"}]]
    });
    let rec = h.start(scenario, "go").await;
    h.until_transcript(&rec.id, "hi").await;
    let actor = h.actor(&rec.id).await;
    let snap = ractor::call!(actor, SessionMsg::Snapshot).expect("snapshot");
    assert_eq!(snap.agent_options.current_mode.as_deref(), Some("default"));
    assert_eq!(snap.agent_options.modes.len(), 2);
    assert_eq!(snap.agent_options.models[1].id, "opus");

    let set = |setting: AgentSetting| {
        let actor = actor.clone();
        async move {
            ractor::call!(actor, |reply| SessionMsg::SetAgentOption {
                setting,
                caller: Caller::local(),
                reply
            })
            .expect("call")
        }
    };
    set(AgentSetting::Mode("plan".into()))
        .await
        .expect("plan is offered");
    h.until_transcript(&rec.id, r#"session/set_mode {"modeId":"plan"}"#)
        .await;
    let snap = ractor::call!(actor, SessionMsg::Snapshot).expect("snapshot");
    assert_eq!(snap.agent_options.current_mode.as_deref(), Some("plan"));

    set(AgentSetting::Model("opus".into()))
        .await
        .expect("opus is offered");
    h.until_transcript(&rec.id, r#"session/set_model {"modelId":"opus"}"#)
        .await;

    let refused = set(AgentSetting::Mode("bypassPermissions".into())).await;
    let Err(SessionError::NotOffered(why)) = refused else {
        panic!("unexpected {refused:?}")
    };
    assert!(why.contains("default, plan"), "{why}");
    let text = h.transcript_text(&rec.id).await;
    assert!(
        !text.contains("bypassPermissions"),
        "nothing was sent: {text}"
    );
}

#[tokio::test]
async fn an_operator_who_is_not_the_owner_cannot_switch() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({
        "session_options": {"modes": {"currentModeId": "a", "availableModes": [{"id": "a"}, {"id": "b"}]}},
        "turns": [[{"chunk": "hi"}]]
    });
    let rec = h.start(scenario, "go").await;
    let actor = h.actor(&rec.id).await;
    let r = ractor::call!(actor, |reply| SessionMsg::SetAgentOption {
        setting: AgentSetting::Mode("b".into()),
        caller: Caller {
            id: "U_STRANGER".into(),
            operator: false
        },
        reply
    })
    .expect("call");
    assert!(matches!(r, Err(SessionError::Unauthorized { .. })), "{r:?}");
}

/// An agent that switches its own mode does it in the operator's sight: a
/// probe's agent moved itself to a mode it never offered and only the
/// session's snapshot showed it.
#[tokio::test]
async fn an_agent_switching_its_own_mode_is_told() {
    let h = Harness::new(Knobs::default()).await;
    let update = |mode: &str| {
        json!({"raw": json!({"jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": "s", "update": {"sessionUpdate": "current_mode_update", "currentModeId": mode}}})
        .to_string()})
    };
    let scenario = json!({
        "session_options": {
            "modes": {"currentModeId": "default", "availableModes": [
                {"id": "default", "name": "Default"}, {"id": "plan", "name": "Plan Mode"}]}
        },
        "turns": [[update("plan"), update("bypassPermissions"), {"chunk": "switched"}]]
    });
    let rec = h.start(scenario, "go").await;
    let text = h.until_transcript(&rec.id, "switched").await;
    assert!(
        text.contains("The agent switched its own mode to `plan`."),
        "{text}"
    );
    assert!(
        text.contains("switched its own mode to `bypassPermissions` (not a mode it offered)"),
        "{text}"
    );
    // A mode in which the agent asks nothing is said to bypass the server.
    assert!(
        text.contains("In mode `bypassPermissions` the agent runs its tools without asking"),
        "{text}"
    );
    assert_eq!(
        text.matches("runs its tools without asking").count(),
        1,
        "{text}"
    );
}
