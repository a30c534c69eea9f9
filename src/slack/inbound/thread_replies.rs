//! Replies in a session's thread: steering, `reject: <reason>` on a
//! pending request, and reviving a session that ended by idle timeout
//! (replies that arrive meanwhile are held by [`crate::slack::revivals`]
//! and delivered in order after it).
//!
//! Routed by `(channel, thread_ts)` through the supervisor's thread index;
//! a reply in a thread no session owns is ignored, one from a user who may
//! not act is refused by the session and told so ephemerally.

use super::*;

/// A reply in a thread that may be an instruction: who wrote what, where.
struct ThreadReply {
    user: String,
    channel: String,
    thread_ts: String,
    ts: String,
    text: String,
}

/// The reply an event carries, when it is one a person wrote in a thread
/// (not the thread's first message, not a bot's, not an edit or a join).
fn thread_reply(ctx: &Ctx, e: SlackPushEventCallback) -> Option<ThreadReply> {
    let SlackEventCallbackBody::Message(m) = e.event else {
        return None;
    };
    // Edits, joins, bot posts and the like are not instructions; a reply
    // also sent to the channel (`thread_broadcast`) or with a file attached
    // (`file_share`) is one, with its text.
    let instruction = matches!(
        m.subtype,
        None | Some(SlackMessageEventType::ThreadBroadcast | SlackMessageEventType::FileShare)
    );
    if !instruction || m.sender.bot_id.is_some() {
        return None;
    }
    let user = m.sender.user.as_ref().map(|u| u.0.clone())?;
    if ctx.bot_identity().is_some_and(|b| b.user_id == user) {
        return None;
    }
    let channel = m.origin.channel.as_ref().map(|c| c.0.clone())?;
    let thread_ts = m.origin.thread_ts.as_ref().map(|t| t.0.clone())?;
    let ts = m.origin.ts.0.clone();
    if ts == thread_ts {
        return None;
    }
    let text = m
        .content
        .as_ref()
        .and_then(|c| c.text.clone())
        .map(|t| render::unescape(&t))
        .unwrap_or_default();
    if text.trim().is_empty() {
        return None;
    }
    Some(ThreadReply {
        user,
        channel,
        thread_ts,
        ts,
        text,
    })
}

pub(super) async fn on_event(ctx: &Arc<Ctx>, e: SlackPushEventCallback) {
    let Some(ThreadReply {
        user,
        channel,
        thread_ts,
        ts,
        text,
    }) = thread_reply(ctx, e)
    else {
        return;
    };
    let reply = Reply::to(channel.clone(), user.clone(), Some(thread_ts.clone()));
    let held = HeldReply {
        user: user.clone(),
        text: text.trim().to_owned(),
        ts: ts.clone(),
    };
    let thread = (channel.clone(), thread_ts.clone());
    if ctx.reviving.hold_if_reviving(&thread, &held).await {
        return;
    }
    // The supervisor's index keeps ended sessions' threads: check liveness.
    // A live session without an actor is restarting: the reply is stored
    // for the restarted agent (⏳, then ✅ once delivered).
    let session = match ctx.session_of_thread(&channel, &thread_ts).await {
        Some(s) if ctx.actor(&s).await.is_some() || ctx.is_live(&s).await => s,
        _ => {
            not_live(ctx, &reply, &thread_ts, held).await;
            return;
        }
    };
    tracing::info!(
        user = %intercom_actors::text::one_line(&user, 40),
        %session,
        "thread reply"
    );
    if let Some(reason) = reject_reason(&text) {
        match ctx.live_actor(&session).await {
            Ok(actor) => reject_pending(ctx, &actor, &reply, reason).await,
            Err(e) => reply.send(ctx, render::problem(&e)),
        }
        return;
    }
    match ctx.steer(&session, text.trim(), &user).await {
        Ok(o) => {
            crate::slack::dropped::send(
                &ctx.gateway,
                GatewayMsg::SteeringAck {
                    session_id: session,
                    steering_id: o.steering_id,
                    channel,
                    ts,
                    queued: o.queued,
                },
                "a steering acknowledgement",
            );
        }
        Err(e) => reply.send(ctx, render::problem(&e)),
    }
}

/// `reject: <why>` (any case) in a thread rejects the waiting request (when
/// exactly one waits).
pub fn reject_reason(text: &str) -> Option<&str> {
    let t = text.trim_start();
    let head = t.get(..7)?;
    head.eq_ignore_ascii_case("reject:").then(|| t[7..].trim())
}

async fn reject_pending(ctx: &Ctx, actor: &ActorRef<SessionMsg>, reply: &Reply, reason: &str) {
    let snapshot = match ractor::call_t!(actor, SessionMsg::Snapshot, CALL_TIMEOUT_MS) {
        Ok(s) => s,
        Err(e) => {
            reply.send(
                ctx,
                render::problem(&format!("The session did not answer: {e}")),
            );
            return;
        }
    };
    // Only an unambiguous reply decides: with two requests waiting, the
    // oldest may not be the one the operator was reading.
    let waiting = match snapshot.pending.as_slice() {
        [] => {
            reply.send(
                ctx,
                render::problem("No request is waiting for a decision. To give the agent an instruction, reply without `reject:`."),
            );
            return;
        }
        [one] => one,
        many => {
            reply.send(
                ctx,
                render::problem(&format!(
                    "{} requests are waiting, so `reject:` did not pick one. Use the *Reject* button on the one you mean; nothing was decided.",
                    many.len()
                )),
            );
            return;
        }
    };
    let reason = Some(reason.to_owned()).filter(|r| !r.is_empty());
    if let Err(text) = ctx
        .decide(&waiting.id, Choice::Reject, reason, &reply.user)
        .await
    {
        reply.send(ctx, render::problem(&text));
    }
}

/// A reply in the thread of a session without a running agent: revives it
/// when it ended without anyone stopping it (idle timeout, a server
/// shutdown, a crash the restarts did not fix, an interruption), else says
/// why nothing happened.
async fn not_live(ctx: &Arc<Ctx>, reply: &Reply, thread_ts: &str, held: HeldReply) {
    let Ok(Some(rec)) = ctx.store.session_by_thread(&reply.channel, thread_ts).await else {
        return; // Not one of ours (or the store failed: nothing to act on).
    };
    if rec.revivable() && reject_reason(&held.text).is_none() {
        if let Err(e) = ctx.may_act(&rec.id, &reply.user, "revive").await {
            reply.send(ctx, render::problem(&e));
            return;
        }
        let key = (reply.channel.clone(), thread_ts.to_owned());
        let first = held.user.clone();
        if ctx.reviving.begin(&key, held).await {
            let ctx = ctx.clone();
            tokio::spawn(async move { revive(&ctx, rec, key, first).await });
        }
        return;
    }
    not_live_hint(ctx, reply, &rec);
}

/// Brings `rec` back, then delivers the replies held for its thread in
/// order; tells the thread how it went.
async fn revive(ctx: &Ctx, rec: SessionRecord, key: Thread, first: String) {
    let id = rec.id.clone();
    let why = if rec.ended_by_idle_timeout() {
        "it ended by idle timeout".to_owned()
    } else {
        format!("it had {}", ended_as(rec.status))
    };
    rules::notice(
        ctx,
        &id,
        &format!("Reviving this session ({why}) to deliver a reply from {first}…"),
    );
    match revive_session(ctx, &rec, &first).await {
        Ok(revived) => {
            let how = if revived.acp_session_id.is_some()
                && revived.acp_session_id == rec.acp_session_id
            {
                "Revived: the agent resumed its session and remembers the conversation."
            } else {
                "Revived with a fresh agent session: the agent could not resume, so it does not remember the earlier conversation."
            };
            rules::notice(ctx, &id, how);
            deliver_held(ctx, &id, &key).await;
        }
        Err(e) => {
            let text = format!(
                "Could not revive this session: {e} Start a new one with `/intercom start <prompt>`."
            );
            crate::slack::dropped::send(
                &ctx.gateway,
                GatewayMsg::Event(OperatorEvent::Notice {
                    session_id: id.clone(),
                    level: NoticeLevel::Warning,
                    text,
                }),
                "a revive failure notice",
            );
            let held = ctx.reviving.failed(&key).await;
            for h in held {
                let reply = Reply::to(key.0.clone(), h.user, Some(key.1.clone()));
                reply.send(
                    ctx,
                    render::problem(&format!(
                        "Your reply was not delivered: the session could not be revived ({e})"
                    )),
                );
            }
        }
    }
}

/// How a revivable session ended, after "it had".
fn ended_as(status: SessionStatus) -> &'static str {
    match status {
        SessionStatus::Crashed => "crashed",
        SessionStatus::Interrupted => "been interrupted",
        SessionStatus::Cancelled => "been stopped by a server shutdown",
        _ => "ended in an error",
    }
}

/// Asks the supervisor to revive `rec` with its agent profile from the
/// current workspace map.
async fn revive_session(
    ctx: &Ctx,
    rec: &SessionRecord,
    user: &str,
) -> Result<SessionRecord, String> {
    let map = ractor::call_t!(ctx.registry.get(), RegistryMsg::Get, CALL_TIMEOUT_MS)
        .map_err(|e| format!("the workspace registry did not answer: {e}."))?;
    let profile = map.revivable(rec).map_err(|why| format!("{why}."))?;
    // The ended session's actor may still be on its way out.
    let deadline = tokio::time::Instant::now() + REVIVE_SETTLE;
    while ctx.actor(&rec.id).await.is_some() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let caller = ctx.caller(user);
    let id = rec.id.clone();
    let outcome = ractor::call_t!(
        ctx.supervisor,
        |reply| SupervisorMsg::Revive {
            id,
            profile,
            caller,
            reply
        },
        crate::slack::commands::START_TIMEOUT_MS
    )
    .map_err(|e| format!("the supervisor did not answer: {e}."))?;
    outcome.map_err(|e| match e {
        SupervisorError::Unauthorized { owner, .. } => format!(
            "only the session's owner ({}) and operators may revive it.",
            render::who(&owner)
        ),
        other => format!("{other}."),
    })
}

/// Steers the replies held for a revived session's thread, in order, until
/// none is left; then later replies take the normal path.
async fn deliver_held(ctx: &Ctx, id: &SessionId, key: &Thread) {
    loop {
        let batch = ctx.reviving.next_held(key).await;
        if batch.is_empty() {
            return;
        }
        for h in batch {
            match ctx.steer(id, &h.text, &h.user).await {
                Ok(o) => {
                    crate::slack::dropped::send(
                        &ctx.gateway,
                        GatewayMsg::SteeringAck {
                            session_id: id.clone(),
                            steering_id: o.steering_id,
                            channel: key.0.clone(),
                            ts: h.ts,
                            queued: o.queued,
                        },
                        "a steering acknowledgement",
                    );
                }
                Err(e) => {
                    let reply = Reply::to(key.0.clone(), h.user, Some(key.1.clone()));
                    reply.send(ctx, render::problem(&e));
                }
            }
        }
    }
}

/// Why a reply in the thread of a session without a running agent did nothing.
fn not_live_hint(ctx: &Ctx, reply: &Reply, rec: &SessionRecord) {
    let text = if rec.status.is_live() {
        format!(
            "Session `{}` has no running agent right now (it is restarting), so this reply was not delivered; send it again shortly.",
            rec.id
        )
    } else {
        format!(
            "Session `{}` has ended ({}), so this reply was not delivered. Start a new one with `/intercom start <prompt>`.",
            rec.id, rec.status
        )
    };
    reply.send(ctx, render::problem(&text));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reject_prefix_is_case_insensitive() {
        assert_eq!(reject_reason("reject: too risky"), Some("too risky"));
        assert_eq!(reject_reason("  REJECT:no"), Some("no"));
        assert_eq!(reject_reason("rejected it"), None);
        assert_eq!(reject_reason("re"), None);
        assert_eq!(reject_reason("é"), None);
    }
}
