//! The ports the Slack gateway needs: the Slack Web API, a durable outbox,
//! a renderer and the thread index.
//!
//! The core never names slack-morphism or SQLite. The gateway
//! ([`crate::gateway`]) decides *what* goes to Slack and in which order; it
//! reaches Slack through [`SlackApi`], persists every outbound operation in an
//! [`Outbox`] before trying it, turns operator events into Block Kit through a
//! [`Render`] implementation, and reports thread roots through
//! [`ThreadIndex`]. Message bodies are plain JSON Block Kit so that they can
//! be stored and replayed after a restart.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::{
    Decision, PendingRequest, RequestStatus, SessionId, SessionRecord, SessionStatus,
};
use crate::ports::{NoticeLevel, StoreError};

/// One Slack message: fallback text (notifications, screen readers) plus
/// optional Block Kit blocks as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct MessageBody {
    /// Plain fallback text; shown when blocks cannot be.
    pub text: String,
    /// Block Kit blocks (JSON objects); empty for a text-only message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<Value>,
}

impl MessageBody {
    /// A text-only message.
    pub fn text(text: impl Into<String>) -> Self {
        MessageBody {
            text: text.into(),
            blocks: Vec::new(),
        }
    }
}

/// A file snippet (a long diff) uploaded into a thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snippet {
    /// File name shown in Slack, e.g. `req-1.diff`.
    pub filename: String,
    /// Title shown above the snippet.
    pub title: String,
    /// The content.
    pub content: String,
}

/// Why a Slack call failed, as far as retrying is concerned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlackApiError {
    /// HTTP 429: wait `retry_after`, then try again.
    #[error("rate limited by Slack; retry after {} ms", retry_after.as_millis())]
    RateLimited {
        /// Slack's `Retry-After`.
        retry_after: Duration,
    },
    /// Network trouble or a 5xx: retry with backoff.
    #[error("transient Slack failure: {0}")]
    Transient(String),
    /// Slack refuses until someone acts: the bot is not in the channel (or
    /// cannot see a private one), the channel is archived, the token was
    /// revoked, the app lacks a scope. Kept and retried slowly, never
    /// dropped: one `not_in_channel` lost a request's buttons for good.
    #[error("Slack refuses the call until someone acts: {0}")]
    Blocked(String),
    /// Slack refused the call for good (invalid blocks, a message too long,
    /// ...): the same call would be refused again.
    #[error("Slack refused the call: {0}")]
    Permanent(String),
}

impl SlackApiError {
    /// What the operator can do about a [`SlackApiError::Blocked`] code.
    pub fn blocked_advice(code: &str) -> &'static str {
        match code {
            "not_in_channel" => "invite the bot to the channel (/invite @your-bot)",
            "channel_not_found" => {
                "check the workspace's channel_id, and invite the bot if the channel is private"
            }
            "is_archived" => "unarchive the channel, or give the workspace another channel_id",
            "missing_scope" | "no_permission" | "access_denied" => {
                "add the scopes docs/slack.md lists to the Slack app and reinstall it"
            }
            _ => "give the server a working SLACK_BOT_TOKEN and restart it",
        }
    }
}

/// The Slack Web API methods the gateway uses.
#[async_trait]
pub trait SlackApi: Send + Sync + 'static {
    /// `chat.postMessage`; returns the new message's `ts`.
    async fn post_message(
        &self,
        channel: &str,
        thread_ts: Option<&str>,
        body: &MessageBody,
    ) -> Result<String, SlackApiError>;
    /// `chat.update`.
    async fn update_message(
        &self,
        channel: &str,
        ts: &str,
        body: &MessageBody,
    ) -> Result<(), SlackApiError>;
    /// `reactions.add`; an existing reaction counts as success.
    async fn add_reaction(&self, channel: &str, ts: &str, name: &str) -> Result<(), SlackApiError>;
    /// `reactions.remove`; a missing reaction counts as success.
    async fn remove_reaction(
        &self,
        channel: &str,
        ts: &str,
        name: &str,
    ) -> Result<(), SlackApiError>;
    /// Uploads a snippet into a channel or thread (external upload flow).
    async fn upload_snippet(
        &self,
        channel: &str,
        thread_ts: Option<&str>,
        snippet: &Snippet,
    ) -> Result<(), SlackApiError>;
    /// `chat.postEphemeral`.
    async fn post_ephemeral(
        &self,
        channel: &str,
        user: &str,
        thread_ts: Option<&str>,
        body: &MessageBody,
    ) -> Result<(), SlackApiError>;
    /// `views.open` with a modal view (JSON).
    async fn open_view(&self, trigger_id: &str, view: &Value) -> Result<(), SlackApiError>;
    /// Answers a slash command through the `response_url` Slack gave with
    /// it: seen by the user who typed it only, and it works where the bot
    /// is not a member (a DM, another channel), which `chat.postEphemeral`
    /// does not. An API without it refuses, and the answer goes by
    /// `chat.postEphemeral`.
    async fn respond(&self, response_url: &str, body: &MessageBody) -> Result<(), SlackApiError> {
        let _ = (response_url, body);
        Err(SlackApiError::Permanent(
            "this Slack API does not answer through response_url".into(),
        ))
    }
}

/// One durable outbound operation. Stored as JSON in the outbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum OutboundOp {
    /// Post a message; into the lane's session thread when `in_thread`.
    /// With a `key`, its `ts` is remembered so later updates can find it.
    Post {
        /// Channel id.
        channel: String,
        /// Reply in the session's thread.
        in_thread: bool,
        /// Name for later updates: `root`, `req:<id>`, `plan`, `tool:<id>`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        /// The message.
        body: MessageBody,
    },
    /// Replace the message posted under `key` (posted anew when unknown).
    Update {
        /// Channel id.
        channel: String,
        /// The key given when it was posted.
        key: String,
        /// The new content.
        body: MessageBody,
    },
    /// Add a reaction to a message.
    React {
        /// Channel id.
        channel: String,
        /// The message.
        ts: String,
        /// Emoji name without colons.
        name: String,
    },
    /// Remove a reaction the bot added.
    Unreact {
        /// Channel id.
        channel: String,
        /// The message.
        ts: String,
        /// Emoji name without colons.
        name: String,
    },
    /// Upload a snippet, into the session's thread when `in_thread`.
    Upload {
        /// Channel id.
        channel: String,
        /// Into the session's thread.
        in_thread: bool,
        /// The file.
        snippet: Snippet,
    },
}

impl OutboundOp {
    /// The Slack channel the operation goes to.
    pub fn channel(&self) -> &str {
        match self {
            OutboundOp::Post { channel, .. }
            | OutboundOp::Update { channel, .. }
            | OutboundOp::React { channel, .. }
            | OutboundOp::Unreact { channel, .. }
            | OutboundOp::Upload { channel, .. } => channel,
        }
    }

    /// What the operation is, for a log line: its kind, channel and key,
    /// never its body (agent text, up to a whole message of it). A key can
    /// hold the agent's tool call id: shown on one escaped line, cut.
    pub fn brief(&self) -> String {
        let safe =
            |text: &str| crate::text::log_safe(&crate::text::shorten(text, 120)).into_owned();
        match self {
            OutboundOp::Post { channel, key, .. } => format!(
                "post to {} ({})",
                safe(channel),
                safe(key.as_deref().unwrap_or("no key"))
            ),
            OutboundOp::Update { channel, key, .. } => {
                format!("update in {} ({})", safe(channel), safe(key))
            }
            OutboundOp::React { channel, name, .. } => {
                format!("reaction {} in {}", safe(name), safe(channel))
            }
            OutboundOp::Unreact { channel, name, .. } => {
                format!("reaction {} removed in {}", safe(name), safe(channel))
            }
            OutboundOp::Upload { channel, .. } => format!("snippet upload to {}", safe(channel)),
        }
    }
}

/// A stored, not yet delivered operation.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEntry {
    /// Storage id; increasing, so send order is id order within a lane.
    pub id: i64,
    /// The ordering lane: a session id, or `#<channel>` for channel notices.
    pub lane: String,
    /// What to do.
    pub op: OutboundOp,
}

/// One outbox write, for [`Outbox::apply`] (the gateway's bookkeeping
/// hands over whatever waits as one batch, so it shares one commit).
#[derive(Debug, Clone, PartialEq)]
pub enum OutboxWrite {
    /// [`Outbox::push`].
    Push {
        /// The ordering lane.
        lane: String,
        /// The operation.
        op: OutboundOp,
    },
    /// [`Outbox::replace`].
    Replace {
        /// The row.
        id: i64,
        /// Its new content.
        op: OutboundOp,
    },
    /// [`Outbox::delete`].
    Delete {
        /// The row.
        id: i64,
    },
    /// [`Outbox::fail`].
    Fail {
        /// The row.
        id: i64,
        /// Why Slack refused it.
        error: String,
    },
    /// [`Outbox::remember`].
    Remember {
        /// The lane.
        lane: String,
        /// The message key.
        key: String,
        /// Its `ts`.
        ts: String,
    },
}

/// Durable storage for outbound Slack operations and the `ts` of keyed
/// messages. A write returns only once it is durable.
#[async_trait]
pub trait Outbox: Send + Sync + 'static {
    /// Applies `writes` in order as one durable unit (one commit: all of
    /// them or none); returns, for each write, the id of the row a push
    /// created (`None` for the others). Every write goes through here.
    async fn apply(&self, writes: &[OutboxWrite]) -> Result<Vec<Option<i64>>, StoreError>;
    /// Stores an operation; returns its id.
    async fn push(&self, lane: &str, op: &OutboundOp) -> Result<i64, StoreError> {
        let push = OutboxWrite::Push {
            lane: lane.to_owned(),
            op: op.clone(),
        };
        self.apply(&[push])
            .await?
            .pop()
            .flatten()
            .ok_or_else(|| StoreError::Backend {
                op: "push outbox",
                message: "the insert returned no row id".into(),
            })
    }
    /// Every pending operation, oldest first.
    async fn pending(&self) -> Result<Vec<OutboxEntry>, StoreError>;
    /// Removes an operation (delivered, or superseded).
    async fn delete(&self, id: i64) -> Result<(), StoreError> {
        self.apply(&[OutboxWrite::Delete { id }]).await.map(drop)
    }
    /// Replaces a pending operation's content (a newer version of the same
    /// message merged into it while it waited); it keeps its id and place.
    async fn replace(&self, id: i64, op: &OutboundOp) -> Result<(), StoreError> {
        let op = op.clone();
        self.apply(&[OutboxWrite::Replace { id, op }])
            .await
            .map(drop)
    }
    /// Marks an operation failed for good; it is kept for inspection, not re-sent.
    async fn fail(&self, id: i64, error: &str) -> Result<(), StoreError> {
        let error = error.to_owned();
        self.apply(&[OutboxWrite::Fail { id, error }])
            .await
            .map(drop)
    }
    /// Remembers the `ts` of a keyed message.
    async fn remember(&self, lane: &str, key: &str, ts: &str) -> Result<(), StoreError> {
        let remember = OutboxWrite::Remember {
            lane: lane.to_owned(),
            key: key.to_owned(),
            ts: ts.to_owned(),
        };
        self.apply(&[remember]).await.map(drop)
    }
    /// The `ts` of a keyed message, if it was posted.
    async fn recall(&self, lane: &str, key: &str) -> Result<Option<String>, StoreError>;
}

/// What the thread root's status line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusLine {
    /// Lifecycle status.
    pub status: SessionStatus,
    /// A short word: starting, working, needs input, idle, stalled, ...
    pub activity: String,
    /// Why, when known.
    pub reason: Option<String>,
    /// Context use and cost, when the agent reports it ("53k/200k tokens").
    pub usage: Option<String>,
}

/// Turns what happened into Slack messages. Pure: no I/O, no state.
pub trait Render: Send + Sync + 'static {
    /// The thread root: title, workspace, agent, owner and the status line.
    fn root(&self, session: &SessionRecord, line: &StatusLine) -> MessageBody;
    /// A request waiting for a decision, with its buttons; a snippet to
    /// upload before it when the diff is too long to show inline.
    fn request(&self, request: &PendingRequest) -> (MessageBody, Option<Snippet>);
    /// The same request after it was decided, cancelled or expired.
    fn request_closed(
        &self,
        request: &PendingRequest,
        status: RequestStatus,
        decision: Option<&Decision>,
    ) -> MessageBody;
    /// Agent text, split to fit Slack's limits.
    fn agent_text(&self, text: &str) -> Vec<MessageBody>;
    /// One compact tool call line.
    fn tool_call(&self, title: &str, status: &str) -> MessageBody;
    /// The thread's collapsed "thinking" line (the whole thought is in the API).
    fn thinking(&self, text: &str) -> MessageBody {
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        MessageBody::text(format!("thinking: {first}"))
    }
    /// The plan as a checklist.
    fn plan(&self, entries: &[(String, String)]) -> MessageBody;
    /// A notice (restart, crash, timeout, ...).
    fn notice(&self, level: NoticeLevel, text: &str) -> MessageBody;
    /// A stall alert with Nudge / Restart / Stop buttons.
    fn stalled(&self, session: &SessionId, reason: Option<&str>) -> MessageBody;
    /// The closing line of a session.
    fn ended(&self, status: SessionStatus, reason: Option<&str>) -> MessageBody;
}

/// Told when a session's thread root is posted, so thread replies route back.
pub trait ThreadIndex: Send + Sync + 'static {
    /// The root of `session`'s thread is `ts` in `channel`.
    fn thread_posted(&self, session: &SessionId, channel: &str, ts: &str);
}

/// The in-memory [`Outbox`] of the tests ([`crate::memory`]).
#[cfg(any(test, feature = "test-hooks"))]
pub use crate::memory::MemoryOutbox;

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused message is logged by its `brief`, whose key can hold an
    /// agent's tool call id: one escaped line, cut, never the body.
    #[test]
    fn a_brief_is_one_safe_line_without_the_body() {
        let hostile = format!(
            "tool:t1\n2026-11-28T00:00:00Z ERROR forged\u{1b}[2J{}@1",
            "x".repeat(5_000)
        );
        let op = OutboundOp::Update {
            channel: "C1".into(),
            key: hostile,
            body: MessageBody::text("the agent's whole message"),
        };
        let brief = op.brief();
        assert!(
            !brief.contains('\n') && !brief.contains('\u{1b}'),
            "{brief}"
        );
        assert!(brief.len() < 400, "{} bytes", brief.len());
        assert!(!brief.contains("whole message"), "{brief}");
        assert!(
            brief.starts_with("update in C1 (tool:t1\\u{a}2026"),
            "{brief}"
        );
    }

    #[test]
    fn ops_round_trip_through_json() {
        let op = OutboundOp::Post {
            channel: "C1".into(),
            in_thread: true,
            key: Some("req:s-1:req-1".into()),
            body: MessageBody {
                text: "hi".into(),
                blocks: vec![serde_json::json!({"type": "divider"})],
            },
        };
        let text = serde_json::to_string(&op).expect("encode");
        assert!(text.contains("\"op\":\"post\""), "{text}");
        let back: OutboundOp = serde_json::from_str(&text).expect("decode");
        assert_eq!(back, op);
        assert_eq!(back.channel(), "C1");
    }

    #[tokio::test]
    async fn memory_outbox_keeps_order_and_failures_apart() {
        let o = MemoryOutbox::new();
        let a = o
            .push(
                "s-1",
                &OutboundOp::React {
                    channel: "C".into(),
                    ts: "1".into(),
                    name: "x".into(),
                },
            )
            .await
            .expect("push");
        let b = o
            .push(
                "s-1",
                &OutboundOp::React {
                    channel: "C".into(),
                    ts: "2".into(),
                    name: "x".into(),
                },
            )
            .await
            .expect("push");
        o.fail(a, "nope").await.expect("fail");
        let pending = o.pending().await.expect("pending");
        assert_eq!(pending.iter().map(|e| e.id).collect::<Vec<_>>(), vec![b]);
        assert_eq!(o.failed().len(), 1);
        o.remember("s-1", "root", "1.0").await.expect("remember");
        assert_eq!(
            o.recall("s-1", "root").await.expect("recall").as_deref(),
            Some("1.0")
        );
    }
}
