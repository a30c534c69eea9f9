//! Inbound routing: what arrives over Socket Mode, turned into messages to
//! the supervisor and the session actors.
//!
//! Why this exists: one place decides who may do what and which session a
//! Slack action concerns. Button clicks carry the global request id
//! (`<session>:<req-N>`) and are routed by it; modal submissions carry it in
//! their private metadata; thread replies are routed by `(channel,
//! thread_ts)` through the supervisor's thread index. Authorization is the
//! session actor's (owner or operator; it audits refusals); this file only
//! turns a refusal into an ephemeral message. Events are handled one at a
//! time, in arrival order, so two replies in a thread steer in order; button
//! clicks run aside (each waits for its session to commit the decision, and
//! clicks on different requests need no order; two on one request are
//! ordered by its session, the first wins); `/intercom start` (which waits
//! for the agent's handshake) runs aside, and
//! so does reviving a session that ended by idle timeout: replies that
//! arrive in its thread meanwhile are held (by the [`super::revivals`]
//! actor) and delivered in order after it. Thread replies (steering,
//! `reject:`, reviving) are in [`thread_replies`].

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use intercom_actors::gateway::GatewayMsg;
use intercom_actors::model::{AuditEntry, RequestStatus, SessionId, SessionRecord, SessionStatus};
use intercom_actors::ports::{NoticeLevel, OperatorEvent, SessionStore};
use intercom_actors::registry::RegistryMsg;
use intercom_actors::rules::ApprovalMode;
use intercom_actors::session::calls::{self, Answer};
use intercom_actors::session::{Caller, Choice, SessionError, SessionMsg, SteerOutcome};
use intercom_actors::slack_port::MessageBody;
use intercom_actors::supervisor::{
    SupervisorError, SupervisorMsg, directory, steer_session, threads,
};
use ractor::ActorRef;
use serde::{Deserialize, Serialize};
use slack_morphism::prelude::*;
use tokio::sync::{Semaphore, mpsc};

use super::api::BotIdentity;
use super::commands::{self, CALL_TIMEOUT_MS};
use super::render;
use super::revivals::{Revivals, Thread};
use super::rules::{self, RememberScope, RulesAdmin};
use crate::root::Current;
use intercom_actors::text::one_line;

/// Button clicks handled at once. A click waits for its session to commit
/// the decision; handled one after another, every click waited for all
/// earlier ones (hundreds of milliseconds under load).
mod thread_replies;

use thread_replies::on_event;
pub use thread_replies::reject_reason;

const CLICKS_IN_FLIGHT: usize = 64;

/// How long a revive waits for the ended session's actor to be gone.
const REVIVE_SETTLE: Duration = Duration::from_secs(5);

/// One payload from Socket Mode.
#[derive(Debug)]
pub enum Inbound {
    /// A slash command.
    Command(Box<SlackCommandEvent>),
    /// A button click or modal submission.
    Interaction(Box<SlackInteractionEvent>),
    /// An Events API event (thread replies).
    Event(Box<SlackPushEventCallback>),
}

/// What inbound handlers share.
pub struct Ctx {
    /// The session supervisor.
    pub supervisor: ActorRef<SupervisorMsg>,
    /// The workspace registry (following Root's restarts).
    pub registry: Current<RegistryMsg>,
    /// Session storage (reads, audit).
    pub store: Arc<dyn SessionStore>,
    /// The only writer to Slack (following Root's restarts).
    pub gateway: Current<GatewayMsg>,
    /// Operator user ids.
    pub operators: HashSet<String>,
    /// Who the bot is (to ignore its own messages); set once known.
    pub bot: RwLock<Option<BotIdentity>>,
    /// The server's approval rules and workspace modes.
    pub rules: Arc<dyn RulesAdmin>,
    /// Threads whose session is being revived: replies held until it is
    /// back, in arrival order (an actor: [`super::revivals`]).
    pub reviving: Revivals,
}

/// A thread reply waiting for its session to be revived.
#[derive(Debug, Clone)]
pub struct HeldReply {
    /// Who wrote it.
    pub user: String,
    /// What they wrote.
    pub text: String,
    /// Its ts (for the delivered / queued reaction).
    pub ts: String,
}

/// Where an ephemeral answer goes.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Channel.
    pub channel: String,
    /// The user who acted.
    pub user: String,
    /// The thread they acted in, if any.
    pub thread_ts: Option<String>,
    /// A slash command's `response_url`: answers go there first (it reaches
    /// a DM, or a channel without the bot, where an ephemeral post is
    /// refused and a command typed there was answered with nothing).
    pub response_url: Option<String>,
}

impl Reply {
    /// An answer to `user` in `channel` (and `thread_ts`), by ephemeral post.
    pub fn to(channel: String, user: String, thread_ts: Option<String>) -> Self {
        Reply {
            channel,
            user,
            thread_ts,
            response_url: None,
        }
    }

    /// Sends an ephemeral message to the user.
    pub fn send(&self, ctx: &Ctx, body: MessageBody) {
        super::dropped::send(
            &ctx.gateway,
            GatewayMsg::Ephemeral {
                channel: self.channel.clone(),
                user: self.user.clone(),
                thread_ts: self.thread_ts.clone(),
                response_url: self.response_url.clone(),
                body,
            },
            "an ephemeral answer",
        );
    }
}

/// What the feedback modal carries through Slack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedbackMeta {
    /// Global request id.
    pub request: String,
    /// The option chosen with the feedback.
    pub option: String,
    /// Where to answer.
    pub channel: String,
    /// The thread, if known.
    #[serde(default)]
    pub thread_ts: Option<String>,
}

/// An operator-facing sentence for a refusal.
pub fn session_error_text(e: &SessionError) -> String {
    match e {
        SessionError::Unauthorized { owner, .. } => format!(
            "You may not do that: only the session's owner ({}) and operators may act on it.",
            render::who(owner)
        ),
        SessionError::AlreadyResolved { status, .. } => {
            format!("That request is already {status}; nothing changed.")
        }
        SessionError::NotLive(
            status @ (SessionStatus::Crashed | SessionStatus::Error | SessionStatus::Interrupted),
        ) => format!(
            "The session is {status}; fix what ended it, then reply in its thread to revive it, or start a new one with `/intercom start <prompt>`."
        ),
        SessionError::NotLive(status) if status.is_live() => {
            "The session is stopping; once it has ended, start a new one with `/intercom start <prompt>`.".to_owned()
        }
        SessionError::NotLive(status) => {
            format!("The session is {status}; start a new one with `/intercom start <prompt>`.")
        }
        other => format!("{other}."),
    }
}

impl Ctx {
    /// The bot's identity, when known.
    pub fn bot_identity(&self) -> Option<BotIdentity> {
        self.bot.read().ok().and_then(|b| b.clone())
    }

    /// Records the bot's identity.
    pub fn set_bot_identity(&self, id: BotIdentity) {
        if let Ok(mut b) = self.bot.write() {
            *b = Some(id);
        }
    }

    /// Whether `user` is a configured operator.
    pub fn is_operator(&self, user: &str) -> bool {
        self.operators.contains(user)
    }

    /// The caller for a Slack user.
    pub fn caller(&self, user: &str) -> Caller {
        Caller {
            id: user.to_owned(),
            operator: self.is_operator(user),
        }
    }

    /// The actor of a live session.
    pub async fn actor(&self, id: &SessionId) -> Option<ActorRef<SessionMsg>> {
        // The named registry, not the supervisor's mailbox: a click never
        // waits behind session starts.
        directory::find(&self.supervisor, id)
    }

    /// Whether the stored session is live (running, or between restarts).
    pub async fn is_live(&self, id: &SessionId) -> bool {
        matches!(self.store.get_session(id).await, Ok(Some(r)) if r.status.is_live())
    }

    /// The live session whose thread this is.
    pub async fn session_of_thread(&self, channel: &str, ts: &str) -> Option<SessionId> {
        // The thread directory beside the supervisor, not its mailbox: a
        // steering reply never waits behind session starts.
        threads::lookup(&self.supervisor, channel, ts).await
    }

    /// Nudges a session on behalf of `user`.
    pub async fn nudge(&self, id: &SessionId, user: &str) -> Result<(), String> {
        let actor = self.live_actor(id).await?;
        let caller = self.caller(user);
        ractor::call_t!(
            actor,
            |reply| SessionMsg::Nudge { caller, reply },
            CALL_TIMEOUT_MS
        )
        .map_err(|e| e.to_string())?
        .map_err(|e| session_error_text(&e))
    }

    /// Stops a session on behalf of `user`.
    pub async fn stop(&self, id: &SessionId, user: &str) -> Result<(), String> {
        let actor = self.live_actor(id).await?;
        let caller = self.caller(user);
        calls::stop(&actor, caller, CALL_TIMEOUT_MS)
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| session_error_text(&e))
    }

    /// Pauses (`true`) or resumes (`false`) a session on behalf of `user`.
    pub async fn pause(&self, id: &SessionId, pause: bool, user: &str) -> Result<(), String> {
        let actor = self.live_actor(id).await?;
        let caller = self.caller(user);
        calls::pause(&actor, pause, caller, CALL_TIMEOUT_MS)
            .await
            .map_err(|e| format!("The session did not answer: {e}"))?
            .map_err(|e| session_error_text(&e))
    }

    /// Sets a session's approval mode on behalf of `user`.
    pub async fn set_mode(
        &self,
        id: &SessionId,
        mode: ApprovalMode,
        user: &str,
    ) -> Result<(), String> {
        let actor = self.live_actor(id).await?;
        let caller = self.caller(user);
        calls::set_mode(&actor, mode, caller, CALL_TIMEOUT_MS)
            .await
            .map_err(|e| format!("The session did not answer: {e}"))?
            .map_err(|e| session_error_text(&e))
    }

    /// Steers a session on behalf of `user` (stored for the restarted agent
    /// while the session is between restarts).
    pub async fn steer(
        &self,
        id: &SessionId,
        text: &str,
        user: &str,
    ) -> Result<SteerOutcome, String> {
        let caller = self.caller(user);
        steer_session(&self.supervisor, id, text, false, &caller)
            .await
            .map_err(|e| format!("The session did not answer: {e}"))?
            .map_err(|e| session_error_text(&e))
    }

    /// Restarts a session's agent on behalf of `user`.
    pub async fn restart(&self, id: &SessionId, user: &str) -> Result<(), String> {
        let caller = self.caller(user);
        ractor::call_t!(
            self.supervisor,
            |reply| SupervisorMsg::Restart {
                id: id.clone(),
                caller,
                reply
            },
            CALL_TIMEOUT_MS
        )
        .map_err(|e| format!("The session supervisor did not answer: {e}"))?
        .map_err(|e| session_error_text(&e))
    }

    /// The actor of a live session, or what to tell the operator.
    async fn live_actor(&self, id: &SessionId) -> Result<ActorRef<SessionMsg>, String> {
        self.actor(id).await.ok_or_else(|| {
            // The id comes from a click's value: shown inert, one line, cut.
            let shown = render::code_span(&id.0, 80);
            format!(
                "Session {shown} has no running agent right now (it may have ended or be restarting). `/intercom status` with that id tells which."
            )
        })
    }

    /// Decides a request on behalf of `user`.
    async fn decide(
        &self,
        global: &str,
        choice: Choice,
        reason: Option<String>,
        user: &str,
    ) -> Result<(), String> {
        let Some((session, request_id)) = render::split_global(global) else {
            return Err(format!(
                "{} is not a request id.",
                render::code_span(global, 80)
            ));
        };
        let Some(actor) = self.actor(&session).await else {
            return Err(format!(
                "Session {} is not running any more, so this request cannot be answered.",
                render::code_span(&session.0, 80)
            ));
        };
        let answer = Answer {
            request_id,
            choice,
            reason,
            caller: self.caller(user),
        };
        calls::decide(&actor, answer, CALL_TIMEOUT_MS)
            .await
            .map_err(|e| e.to_string())?
            .map(|_| ())
            .map_err(|e| session_error_text(&e))
    }

    /// Refuses `user` on `session` unless owner or operator, auditing the
    /// attempt (used where no actor call happens yet: modals, revive, rules).
    pub async fn may_act(
        &self,
        session: &SessionId,
        user: &str,
        action: &str,
    ) -> Result<(), String> {
        if self.is_operator(user) {
            return Ok(());
        }
        let owner = match self.store.get_session(session).await {
            Ok(Some(rec)) => rec.owner,
            Ok(None) => {
                return Err(format!(
                    "Session {} does not exist.",
                    render::code_span(&session.0, 80)
                ));
            }
            Err(e) => {
                return Err(format!(
                    "Cannot read session {}: {e}",
                    render::code_span(&session.0, 80)
                ));
            }
        };
        if owner == user {
            return Ok(());
        }
        let _ = self
            .store
            .audit(&AuditEntry {
                session_id: Some(session.clone()),
                actor: user.to_owned(),
                action: "action.denied".into(),
                detail: serde_json::json!({"action": action, "owner": owner}),
            })
            .await;
        Err(session_error_text(&SessionError::Unauthorized {
            user: user.to_owned(),
            session: session.clone(),
            owner,
        }))
    }
}

/// Handles inbound payloads in order until the channel closes; button
/// clicks run aside (at most [`CLICKS_IN_FLIGHT`] at once).
pub async fn run(ctx: Arc<Ctx>, mut rx: mpsc::Receiver<Inbound>) {
    let clicks = Arc::new(Semaphore::new(CLICKS_IN_FLIGHT));
    while let Some(item) = rx.recv().await {
        match item {
            Inbound::Command(c) => on_command(&ctx, *c).await,
            Inbound::Interaction(i) if matches!(*i, SlackInteractionEvent::BlockActions(_)) => {
                let Ok(permit) = Arc::clone(&clicks).acquire_owned().await else {
                    return;
                };
                let ctx = Arc::clone(&ctx);
                tokio::spawn(async move {
                    on_interaction(&ctx, *i).await;
                    drop(permit);
                });
            }
            Inbound::Interaction(i) => on_interaction(&ctx, *i).await,
            Inbound::Event(e) => on_event(&ctx, *e).await,
        }
    }
}

async fn on_command(ctx: &Arc<Ctx>, c: SlackCommandEvent) {
    let reply = Reply {
        response_url: Some(c.response_url.0.to_string()),
        ..Reply::to(c.channel_id.0.clone(), c.user_id.0.clone(), None)
    };
    let text = c.text.unwrap_or_default();
    // What a Slack user typed, on one escaped line: a newline in it wrote a
    // whole forged line into the server log.
    tracing::info!(
        user = %one_line(&reply.user, 40),
        channel = %one_line(&reply.channel, 40),
        command = %one_line(&text, 80),
        "slash command"
    );
    commands::execute(ctx, reply, commands::parse(&text)).await;
}

async fn on_interaction(ctx: &Arc<Ctx>, event: SlackInteractionEvent) {
    match event {
        SlackInteractionEvent::BlockActions(e) => on_block_actions(ctx, e).await,
        SlackInteractionEvent::ViewSubmission(e) => on_view_submission(ctx, e).await,
        other => tracing::debug!("ignoring interaction {other:?}"),
    }
}

async fn on_block_actions(ctx: &Arc<Ctx>, e: SlackInteractionBlockActionsEvent) {
    let Some(user) = e.user.as_ref().map(|u| u.id.0.clone()) else {
        return;
    };
    let (message_ts, container_channel) = match &e.container {
        SlackInteractionActionContainer::Message(m) => (
            Some(m.message_ts.0.clone()),
            m.channel_id.as_ref().map(|c| c.0.clone()),
        ),
        _ => (None, None),
    };
    let channel = e
        .channel
        .as_ref()
        .map(|c| c.id.0.clone())
        .or(container_channel)
        .unwrap_or_default();
    let thread_ts = e
        .message
        .as_ref()
        .and_then(|m| m.origin.thread_ts.as_ref().map(|t| t.0.clone()))
        .or(message_ts);
    let reply = Reply::to(channel.clone(), user.clone(), thread_ts.clone());
    for action in e.actions.unwrap_or_default() {
        let id = action.action_id.0.as_str();
        let value = action.value.clone().unwrap_or_default();
        tracing::info!(
            user = %one_line(&user, 40),
            action = %one_line(id, 80),
            value = %one_line(&value, 200),
            "button"
        );
        let result = if id.starts_with("decide:") {
            match render::parse_choice(&value) {
                Some((global, option)) => {
                    ctx.decide(&global, Choice::Option(option), None, &user)
                        .await
                }
                None => Err("This button is malformed.".into()),
            }
        } else if id == "feedback" {
            open_feedback(ctx, &value, &e.trigger_id.0, &reply).await
        } else if id == "nudge" {
            ctx.nudge(&SessionId::from(value.as_str()), &user).await
        } else if id == "restart" {
            ctx.restart(&SessionId::from(value.as_str()), &user).await
        } else if id == "stop" {
            ctx.stop(&SessionId::from(value.as_str()), &user).await
        } else if let Some(scope) = RememberScope::from_action_id(id) {
            rules::remember(ctx, &reply, &value, scope).await
        } else {
            tracing::debug!(action = %one_line(id, 80), "ignoring unknown action");
            Ok(())
        };
        if let Err(text) = result {
            reply.send(ctx, render::problem(&text));
        }
    }
}

async fn open_feedback(
    ctx: &Arc<Ctx>,
    value: &str,
    trigger_id: &str,
    reply: &Reply,
) -> Result<(), String> {
    let Some((global, option)) = render::parse_choice(value) else {
        return Err("This button is malformed.".into());
    };
    let Some((session, _)) = render::split_global(&global) else {
        return Err("This button is malformed.".into());
    };
    ctx.may_act(&session, &reply.user, "decide").await?;
    let request = match ctx.store.get_request(&global).await {
        Ok(Some((r, _))) if r.status == RequestStatus::Pending => r,
        Ok(Some((r, _))) => {
            return Err(format!(
                "That request is already {}; nothing changed.",
                r.status.as_str()
            ));
        }
        Ok(None) => return Err(format!("No request {}.", render::code_span(&global, 80))),
        Err(e) => {
            return Err(format!(
                "Cannot read request {}: {e}",
                render::code_span(&global, 80)
            ));
        }
    };
    let meta = FeedbackMeta {
        request: global,
        option,
        channel: reply.channel.clone(),
        thread_ts: reply.thread_ts.clone(),
    };
    let meta = serde_json::to_string(&meta).map_err(|e| e.to_string())?;
    let (told, opened) = ractor::concurrency::oneshot();
    super::dropped::send(
        &ctx.gateway,
        GatewayMsg::OpenView {
            trigger_id: trigger_id.to_owned(),
            view: render::feedback_modal(&request, &meta),
            reply: Some(told.into()),
        },
        "a feedback modal",
    );
    // A form that does not open (its trigger expires in about 3 s, and a
    // slow Slack takes longer) left the clicker with nothing: say what else
    // decides the request. Awaited apart, so other events are not held.
    let (ctx, reply) = (Arc::clone(ctx), reply.clone());
    tokio::spawn(async move {
        if let Ok(Err(e)) = opened.await {
            let text = format!(
                "The feedback form did not open ({}). Reply `reject: <your reason>` in the request's thread instead.",
                render::escape(&one_line(&e.to_string(), 200))
            );
            reply.send(&ctx, render::problem(&text));
        }
    });
    Ok(())
}

async fn on_view_submission(ctx: &Arc<Ctx>, e: SlackInteractionViewSubmissionEvent) {
    let user = e.user.id.0.clone();
    let SlackView::Modal(modal) = &e.view.view else {
        return;
    };
    if modal.callback_id.as_ref().map(|c| c.0.as_str()) != Some(render::FEEDBACK_CALLBACK) {
        return;
    }
    let Some(meta) = modal
        .private_metadata
        .as_deref()
        .and_then(|m| serde_json::from_str::<FeedbackMeta>(m).ok())
    else {
        tracing::warn!("feedback modal without readable metadata");
        return;
    };
    let text = e
        .view
        .state_params
        .state
        .as_ref()
        .and_then(|s| s.values.get(&SlackBlockId(render::FEEDBACK_BLOCK.into())))
        .and_then(|b| b.get(&SlackActionId(render::FEEDBACK_ACTION.into())))
        .and_then(|v| v.value.clone())
        .unwrap_or_default();
    let reason = Some(text.trim().to_owned()).filter(|t| !t.is_empty());
    tracing::info!(
        user = %one_line(&user, 40),
        request = %one_line(&meta.request, 200),
        "feedback submitted"
    );
    let reply = Reply::to(meta.channel.clone(), user.clone(), meta.thread_ts.clone());
    // The modal only ever rejects (or refines a forwarded prompt): its
    // metadata comes back from the client, and a forged one chose an allow
    // option through "Reject with feedback".
    if !feedback_option_fits(ctx, &meta).await {
        tracing::warn!(
            user = %one_line(&user, 40),
            option = %one_line(&meta.option, 80),
            "feedback modal naming an option it never offers; ignored"
        );
        return;
    }
    if let Err(text) = ctx
        .decide(
            &meta.request,
            Choice::Option(meta.option.clone()),
            reason,
            &user,
        )
        .await
    {
        reply.send(ctx, render::problem(&text));
    }
}

/// Whether the feedback modal could have offered `meta.option`: a reject
/// option of a permission, or `refine` of a forwarded prompt.
async fn feedback_option_fits(ctx: &Ctx, meta: &FeedbackMeta) -> bool {
    let Ok(Some((request, _))) = ctx.store.get_request(&meta.request).await else {
        // Unknown: `decide` says so.
        return true;
    };
    feedback_may_choose(&request, &meta.option)
}

/// See [`feedback_option_fits`].
fn feedback_may_choose(request: &intercom_actors::model::PendingRequest, option: &str) -> bool {
    if request.kind == intercom_actors::model::RequestKind::ForwardedPrompt {
        return option == "refine";
    }
    request
        .options
        .iter()
        .any(|o| o.id == option && !o.kind.is_allow())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_feedback_modal_can_only_reject_or_refine() {
        use intercom_actors::model::{
            OptionKind, PendingRequest, PermissionOption, RequestKind, RequestStatus,
        };
        let opt = |id: &str, kind| PermissionOption {
            id: id.into(),
            name: id.into(),
            kind,
        };
        let mut r = PendingRequest {
            command: None,
            id: "s-1:req-1".into(),
            session_id: SessionId::from("s-1"),
            request_id: "req-1".into(),
            kind: RequestKind::Permission,
            tool_kind: None,
            title: "t".into(),
            diff: None,
            paths: vec![],
            options: vec![
                opt("allow-once", OptionKind::AllowOnce),
                opt("reject-once", OptionKind::RejectOnce),
            ],
            status: RequestStatus::Pending,
            wire_id: None,
            created_at: 0,
        };
        assert!(feedback_may_choose(&r, "reject-once"));
        assert!(!feedback_may_choose(&r, "allow-once"));
        assert!(!feedback_may_choose(&r, "made-up"));
        r.kind = RequestKind::ForwardedPrompt;
        assert!(feedback_may_choose(&r, "refine"));
        assert!(!feedback_may_choose(&r, "continue"));
    }

    #[test]
    fn feedback_metadata_round_trips() {
        let m = FeedbackMeta {
            request: "s-1:req-1".into(),
            option: "reject-once".into(),
            channel: "C1".into(),
            thread_ts: Some("1.0".into()),
        };
        let text = serde_json::to_string(&m).expect("encode");
        assert_eq!(
            serde_json::from_str::<FeedbackMeta>(&text).expect("decode"),
            m
        );
    }
}
