//! The gateway's tests: ordering, retries, restarts, steering reactions, and
//! (with a pacing policy) priority, coalescing and staying under the limits.

use super::*;
use crate::memory::MemoryStore;
use crate::model::SessionStatus;
use crate::model::{Decision, OptionKind, PermissionOption, RequestKind, RequestStatus};
use crate::ports::NoticeLevel;
use crate::slack_port::MemoryOutbox;
use crate::slack_port::{OutboxEntry, Snippet};
use std::sync::Mutex;

/// Records calls; answers from a script of failures, then success.
#[derive(Default)]
struct FakeApi {
    calls: Mutex<Vec<String>>,
    script: Mutex<VecDeque<SlackApiError>>,
    next_ts: Mutex<u64>,
}

impl FakeApi {
    fn answer(&self, what: String) -> Result<String, SlackApiError> {
        if let Some(e) = self.script.lock().expect("lock").pop_front() {
            self.calls
                .lock()
                .expect("lock")
                .push(format!("FAIL {what}"));
            return Err(e);
        }
        self.calls.lock().expect("lock").push(what);
        let mut n = self.next_ts.lock().expect("lock");
        *n += 1;
        Ok(format!("{}.000", *n))
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().expect("lock").clone()
    }
    fn fail_next(&self, errors: Vec<SlackApiError>) {
        self.script.lock().expect("lock").extend(errors);
    }
}

#[async_trait::async_trait]
impl SlackApi for FakeApi {
    async fn post_message(
        &self,
        channel: &str,
        thread_ts: Option<&str>,
        body: &MessageBody,
    ) -> Result<String, SlackApiError> {
        self.answer(format!("post {channel} {thread_ts:?} {}", body.text))
    }
    async fn update_message(
        &self,
        channel: &str,
        ts: &str,
        body: &MessageBody,
    ) -> Result<(), SlackApiError> {
        self.answer(format!("update {channel} {ts} {}", body.text))
            .map(|_| ())
    }
    async fn add_reaction(&self, _c: &str, ts: &str, name: &str) -> Result<(), SlackApiError> {
        self.answer(format!("react {ts} {name}")).map(|_| ())
    }
    async fn remove_reaction(&self, _c: &str, ts: &str, name: &str) -> Result<(), SlackApiError> {
        self.answer(format!("unreact {ts} {name}")).map(|_| ())
    }
    async fn upload_snippet(
        &self,
        _c: &str,
        thread_ts: Option<&str>,
        snippet: &Snippet,
    ) -> Result<(), SlackApiError> {
        self.answer(format!("upload {thread_ts:?} {}", snippet.filename))
            .map(|_| ())
    }
    async fn post_ephemeral(
        &self,
        _c: &str,
        user: &str,
        _t: Option<&str>,
        body: &MessageBody,
    ) -> Result<(), SlackApiError> {
        self.answer(format!("ephemeral {user} {}", body.text))
            .map(|_| ())
    }
    async fn open_view(&self, trigger_id: &str, _v: &Value) -> Result<(), SlackApiError> {
        self.answer(format!("view {trigger_id}")).map(|_| ())
    }
}

struct TextRender;

/// Characters of agent text that fit one message in [`TextRender`].
const TEXT_LIMIT: usize = 100;

impl Render for TextRender {
    fn root(&self, s: &SessionRecord, line: &StatusLine) -> MessageBody {
        let usage = line.usage.as_deref().unwrap_or_default();
        MessageBody::text(format!("root {} [{}]{usage}", s.title, line.activity))
    }
    fn request(&self, r: &PendingRequest) -> (MessageBody, Option<Snippet>) {
        let snippet = r.diff.as_ref().filter(|d| d.len() > 10).map(|d| Snippet {
            filename: "x.diff".into(),
            title: "diff".into(),
            content: d.clone(),
        });
        (
            MessageBody {
                text: format!("ask {}", r.title),
                blocks: vec![serde_json::json!({"type": "actions"})],
            },
            snippet,
        )
    }
    fn request_closed(
        &self,
        r: &PendingRequest,
        status: RequestStatus,
        d: Option<&Decision>,
    ) -> MessageBody {
        MessageBody::text(format!(
            "closed {} {} {}",
            r.title,
            status.as_str(),
            d.map(|d| d.decided_by.as_str()).unwrap_or("-")
        ))
    }
    /// Splits like the real renderer does at Slack's limits, here at
    /// [`TEXT_LIMIT`] characters.
    fn agent_text(&self, text: &str) -> Vec<MessageBody> {
        let chars: Vec<char> = text.chars().collect();
        chars
            .chunks(TEXT_LIMIT)
            .map(|c| MessageBody::text(format!("text {}", c.iter().collect::<String>())))
            .collect()
    }
    fn tool_call(&self, title: &str, status: &str) -> MessageBody {
        MessageBody::text(format!("tool {title} {status}"))
    }
    fn plan(&self, entries: &[(String, String)]) -> MessageBody {
        MessageBody::text(format!("plan {}", entries.len()))
    }
    fn notice(&self, _l: NoticeLevel, text: &str) -> MessageBody {
        MessageBody::text(format!("notice {text}"))
    }
    fn stalled(&self, _s: &SessionId, _r: Option<&str>) -> MessageBody {
        MessageBody::text("stalled")
    }
    fn ended(&self, status: SessionStatus, _r: Option<&str>) -> MessageBody {
        MessageBody::text(format!("ended {status}"))
    }
}

#[derive(Default)]
struct Threads(Mutex<Vec<(SessionId, String, String)>>);

impl ThreadIndex for Threads {
    fn thread_posted(&self, s: &SessionId, c: &str, ts: &str) {
        self.0
            .lock()
            .expect("lock")
            .push((s.clone(), c.to_owned(), ts.to_owned()));
    }
}

fn record(id: &str, channel: Option<&str>) -> SessionRecord {
    SessionRecord {
        id: SessionId::from(id),
        status: SessionStatus::Starting,
        title: format!("title {id}"),
        channel_id: channel.map(str::to_owned),
        ..SessionRecord::sample("a")
    }
}

struct Rig {
    gw: ActorRef<GatewayMsg>,
    api: Arc<FakeApi>,
    outbox: Arc<MemoryOutbox>,
    store: Arc<MemoryStore>,
    threads: Arc<Threads>,
}

async fn rig_with(outbox: Arc<MemoryOutbox>, store: Arc<MemoryStore>) -> Rig {
    rig_paced(outbox, store, PacingPolicy::unpaced()).await
}

async fn rig_paced(
    outbox: Arc<MemoryOutbox>,
    store: Arc<MemoryStore>,
    pacing: PacingPolicy,
) -> Rig {
    rig_over(outbox.clone(), outbox, store, pacing, Handoff::default()).await
}

/// A gateway writing through `through` (a wrapper of `outbox`, or it);
/// `handoff` is shared with an earlier incarnation, if any.
async fn rig_over(
    through: Arc<dyn Outbox>,
    outbox: Arc<MemoryOutbox>,
    store: Arc<MemoryStore>,
    pacing: PacingPolicy,
    handoff: Handoff,
) -> Rig {
    let api = Arc::new(FakeApi::default());
    let threads = Arc::new(Threads::default());
    let args = GatewayArgs {
        api: api.clone(),
        outbox: through,
        store: store.clone(),
        render: Arc::new(TextRender),
        threads: Some(threads.clone()),
        retry: RetryPolicy {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(40),
        },
        pacing,
        handoff,
    };
    let (gw, _) = Actor::spawn(None, SlackGateway, args).await.expect("spawn");
    Rig {
        gw,
        api,
        outbox,
        store,
        threads,
    }
}

async fn rig() -> Rig {
    rig_with(Arc::new(MemoryOutbox::new()), Arc::new(MemoryStore::new())).await
}

impl Rig {
    async fn start(&self, id: &str, channel: Option<&str>) {
        let rec = record(id, channel);
        self.store.create_session(&rec).await.expect("create");
        self.emit(OperatorEvent::SessionStarted { session: rec });
    }
    fn emit(&self, e: OperatorEvent) {
        GatewaySink(self.gw.clone()).emit(e);
    }
    fn text(&self, id: &str, t: &str) {
        self.emit(OperatorEvent::AgentText {
            session_id: SessionId::from(id),
            text: t.into(),
        });
    }
    async fn drained(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let n = ractor::call!(self.gw, GatewayMsg::Backlog).expect("backlog");
            if n == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "never drained: {:?}",
                self.api.calls()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The agent texts posted into thread `1.000`, split back into the
/// original messages (merged ones are joined by a blank line).
fn texts_in_order(calls: &[String]) -> Vec<String> {
    calls
        .iter()
        .filter_map(|c| c.strip_prefix("post C1 Some(\"1.000\") text "))
        .flat_map(|t| t.split("\n\n").map(str::to_owned).collect::<Vec<_>>())
        .collect()
}

fn ok_calls(calls: &[String]) -> Vec<String> {
    calls
        .iter()
        .filter(|c| !c.starts_with("FAIL"))
        .cloned()
        .collect()
}

#[tokio::test]
async fn root_goes_first_and_replies_thread_under_it_in_order() {
    let r = rig().await;
    r.start("s-1", Some("C1")).await;
    for i in 0..5 {
        r.text("s-1", &format!("m{i}"));
    }
    r.drained().await;
    let calls = r.api.calls();
    assert_eq!(calls[0], "post C1 None root title s-1 [starting]");
    // Texts that waited together were merged; none is lost, order holds.
    assert_eq!(
        texts_in_order(&calls),
        (0..5).map(|i| format!("m{i}")).collect::<Vec<_>>()
    );
    let rec = r
        .store
        .get_session(&SessionId::from("s-1"))
        .await
        .expect("get")
        .expect("row");
    assert_eq!(rec.thread_ts.as_deref(), Some("1.000"));
    assert_eq!(
        r.threads.0.lock().expect("lock").clone(),
        vec![(SessionId::from("s-1"), "C1".into(), "1.000".into())]
    );
    assert!(r.outbox.pending().await.expect("pending").is_empty());
}

/// The gateway learns of a session it has not seen (after a restart of
/// its own) by reading the store. A read that fails is tried again, and
/// one that keeps failing is not remembered: remembered, it silenced the
/// session's thread for the gateway's lifetime.
#[tokio::test]
async fn a_failed_read_of_a_session_does_not_silence_its_thread() {
    let r = rig().await;
    for id in ["s-1", "s-2"] {
        let rec = record(id, Some("C1"));
        r.store.create_session(&rec).await.expect("create");
    }
    // Two failures: the retries get through, nothing is lost.
    r.store.fail_reads(2);
    r.text("s-1", "first");
    r.drained().await;
    assert_eq!(texts_in_order(&r.api.calls()), vec!["first".to_owned()]);
    // Every try of one event fails: that event is not shown, but the
    // session's next one is.
    r.store.fail_reads(events::READ_RETRIES.len() + 1);
    r.text("s-2", "lost while the store fails");
    r.drained().await;
    r.text("s-2", "after");
    r.drained().await;
    let calls = r.api.calls();
    assert!(
        calls.iter().any(|c| c.contains("text after")),
        "the session's thread stayed silent: {calls:?}"
    );
}

#[tokio::test]
async fn thoughts_share_one_thinking_line_and_usage_updates_the_root() {
    let r = rig().await;
    r.start("s-1", Some("C1")).await;
    for t in ["first idea", "second idea"] {
        r.emit(OperatorEvent::AgentThought {
            session_id: SessionId::from("s-1"),
            text: t.into(),
        });
    }
    r.emit(OperatorEvent::Usage {
        session_id: SessionId::from("s-1"),
        usage: crate::protocol::acp::Usage {
            used: 1000,
            size: 2000,
            cost: None,
            currency: None,
        },
    });
    r.drained().await;
    let calls = ok_calls(&r.api.calls());
    let thinking: Vec<&String> = calls.iter().filter(|c| c.contains("thinking:")).collect();
    // One line, posted once, updated in place; a version that waited was
    // replaced by the newer one. It ends on the latest thought.
    assert!((1..=2).contains(&thinking.len()), "{calls:?}");
    assert!(
        thinking[0].starts_with("post C1 Some(\"1.000\")"),
        "{calls:?}"
    );
    assert!(
        thinking[1..].iter().all(|c| c.starts_with("update C1")),
        "{calls:?}"
    );
    assert!(
        thinking
            .last()
            .is_some_and(|c| c.ends_with("thinking: second idea"))
    );
    let usage = crate::protocol::acp::Usage {
        used: 1000,
        size: 2000,
        cost: None,
        currency: None,
    }
    .describe();
    let root_calls: Vec<&String> = calls.iter().filter(|c| c.contains(" root title")).collect();
    assert!(
        root_calls.last().is_some_and(|c| c.ends_with(&usage)),
        "{calls:?}"
    );
}

#[tokio::test]
async fn sessions_without_a_channel_are_skipped() {
    let r = rig().await;
    r.start("s-1", None).await;
    r.text("s-1", "hello");
    r.text("s-unknown", "hello");
    r.drained().await;
    assert!(r.api.calls().is_empty(), "{:?}", r.api.calls());
}

#[tokio::test]
async fn rate_limits_pause_and_nothing_is_lost_or_reordered() {
    let r = rig().await;
    r.api.fail_next(vec![
        SlackApiError::RateLimited {
            retry_after: Duration::from_millis(50),
        },
        SlackApiError::RateLimited {
            retry_after: Duration::from_millis(20),
        },
        SlackApiError::Transient("502".into()),
    ]);
    r.start("s-1", Some("C1")).await;
    for i in 0..10 {
        r.text("s-1", &format!("m{i}"));
    }
    r.drained().await;
    let calls = ok_calls(&r.api.calls());
    assert!(calls[0].starts_with("post C1 None root"));
    assert_eq!(
        texts_in_order(&calls),
        (0..10).map(|i| format!("m{i}")).collect::<Vec<_>>(),
        "{calls:?}"
    );
}

#[tokio::test]
async fn request_lifecycle_updates_the_same_message_and_status_line() {
    let r = rig().await;
    r.start("s-1", Some("C1")).await;
    // The root posted first (else its status update merges into the post).
    r.drained().await;
    let req = PendingRequest {
        command: None,
        id: "s-1:req-1".into(),
        session_id: SessionId::from("s-1"),
        request_id: "req-1".into(),
        kind: RequestKind::Permission,
        tool_kind: None,
        title: "Write x".into(),
        diff: Some("a long diff body".into()),
        paths: vec![],
        options: vec![PermissionOption {
            id: "allow".into(),
            name: "Allow".into(),
            kind: OptionKind::AllowOnce,
        }],
        status: RequestStatus::Pending,
        wire_id: None,
        created_at: 0,
    };
    r.emit(OperatorEvent::RequestOpened {
        request: req.clone(),
    });
    r.emit(activity("s-1", "needs input"));
    r.drained().await;
    r.emit(decided(&req));
    r.drained().await;
    assert_eq!(
        r.api.calls(),
        vec![
            "post C1 None root title s-1 [starting]",
            "upload Some(\"1.000\") x.diff",
            "post C1 Some(\"1.000\") ask Write x",
            "update C1 1.000 root title s-1 [needs input]",
            "update C1 3.000 closed Write x decided U1",
        ]
    );
}

/// A diff uploaded as a snippet that Slack refuses for good: the request
/// message said it was "attached above", so the thread says where it is.
#[tokio::test]
async fn a_refused_snippet_is_told_in_the_thread() {
    let r = rig().await;
    r.start("s-1", Some("C1")).await;
    r.drained().await;
    r.api.fail_next(vec![SlackApiError::Permanent(
        "file_upload_disabled".into(),
    )]);
    let mut req = priority::permission("s-1", "Write x");
    req.diff = Some("a long diff body".into());
    r.emit(OperatorEvent::RequestOpened { request: req });
    r.drained().await;
    let calls = r.api.calls();
    assert!(calls[1].starts_with("FAIL upload"), "{calls:?}");
    assert!(
        calls.iter().any(|c| c
            .starts_with("post C1 Some(\"1.000\") :warning: Slack refused the snippet `x.diff`")
            && c.contains("file_upload_disabled")),
        "{calls:?}"
    );
    assert!(calls.iter().any(|c| c.contains("ask Write x")), "{calls:?}");
}

/// A rig whose first request's post Slack refused for good with `code`,
/// then one text, all sent.
async fn refused_request(code: &str) -> Rig {
    let r = rig().await;
    r.start("s-1", Some("C1")).await;
    r.drained().await;
    r.api.fail_next(vec![SlackApiError::Permanent(code.into())]);
    r.emit(OperatorEvent::RequestOpened {
        request: priority::permission("s-1", "Run ls"),
    });
    r.text("s-1", "after");
    r.drained().await;
    r
}

#[tokio::test]
async fn permanent_failures_fall_back_to_text_and_are_kept_as_failed() {
    let r = refused_request("invalid_blocks").await;
    let calls = r.api.calls();
    assert!(calls[1].starts_with("FAIL post"), "{calls:?}");
    assert!(
        calls[2].contains("ask Run ls") && calls[2].contains("invalid_blocks"),
        "{calls:?}"
    );
    // Its buttons went with the blocks: the copy says how to decide it.
    assert!(calls[2].contains("ctl approve s-1:req-1"), "{calls:?}");
    assert!(calls[3].ends_with("text after"), "{calls:?}");
    assert_eq!(r.outbox.failed().len(), 1);
}

/// Plain text helps only a refusal of the formatting: a refused token
/// refuses the plain text too, and re-posting made a third top-level
/// message for one session.
#[tokio::test]
async fn a_refusal_that_is_not_about_formatting_posts_no_plain_text_copy() {
    let r = refused_request("account_inactive").await;
    let calls = r.api.calls();
    assert!(calls[1].starts_with("FAIL post"), "{calls:?}");
    assert!(
        !calls
            .iter()
            .any(|c| c.contains("account_inactive") && !c.starts_with("FAIL")),
        "{calls:?}"
    );
    assert!(calls[2].ends_with("text after"), "{calls:?}");
    assert_eq!(r.outbox.failed().len(), 1);
}

/// A refusal someone can end (the bot not in the channel, a revoked
/// token) keeps the message: a probe's request lost its buttons for good
/// to one `not_in_channel`. It is tried again, and what follows it waits
/// behind it, in order; nothing is marked failed.
#[tokio::test]
async fn a_refusal_until_someone_acts_keeps_the_message_and_its_order() {
    let r = rig().await;
    r.start("s-1", Some("C1")).await;
    r.drained().await;
    r.api.fail_next(vec![
        SlackApiError::Blocked("not_in_channel".into()),
        SlackApiError::Blocked("not_in_channel".into()),
    ]);
    r.emit(OperatorEvent::RequestOpened {
        request: priority::permission("s-1", "Run ls"),
    });
    r.text("s-1", "after");
    r.drained().await;
    let calls = r.api.calls();
    let request = calls
        .iter()
        .position(|c| c.starts_with("post") && c.contains("ask Run ls"))
        .unwrap_or_else(|| panic!("the request was never posted: {calls:?}"));
    assert_eq!(
        calls[..request]
            .iter()
            .filter(|c| c.starts_with("FAIL"))
            .count(),
        2,
        "{calls:?}"
    );
    let after = calls
        .iter()
        .position(|c| c.ends_with("text after"))
        .unwrap_or_else(|| panic!("the text was never posted: {calls:?}"));
    assert!(request < after, "{calls:?}");
    assert!(r.outbox.failed().is_empty());
}

#[tokio::test]
async fn a_restarted_gateway_resends_the_outbox_in_order() {
    let outbox = Arc::new(MemoryOutbox::new());
    let store = Arc::new(MemoryStore::new());
    let first = rig_with(outbox.clone(), store.clone()).await;
    first.api.fail_next(
        (0..1000)
            .map(|_| SlackApiError::Transient("503".into()))
            .collect(),
    );
    first.start("s-1", Some("C1")).await;
    for i in 0..3 {
        first.text("s-1", &format!("m{i}"));
    }
    // Wait until everything is stored (texts that wait together are merged
    // into one row), then "crash".
    let deadline = Instant::now() + Duration::from_secs(5);
    let stored = |rows: &[OutboxEntry]| {
        rows.iter()
            .any(|e| matches!(&e.op, OutboundOp::Post { body, .. } if body.text.contains("m2")))
    };
    while !stored(&outbox.pending().await.expect("pending")) {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.gw.stop(None);
    tokio::time::sleep(Duration::from_millis(20)).await;

    let second = rig_with(outbox.clone(), store.clone()).await;
    second.drained().await;
    let calls = second.api.calls();
    assert_eq!(calls[0], "post C1 None root title s-1 [starting]");
    assert_eq!(texts_in_order(&calls), vec!["m0", "m1", "m2"], "{calls:?}");
    assert!(outbox.pending().await.expect("pending").is_empty());
}

/// Tool call ids and plans are per turn: a new turn's `t1` and plan go to
/// new messages at the bottom of the thread (they updated the first
/// turn's, far up, where nobody looked); within a turn they update theirs.
#[tokio::test]
async fn a_new_turns_tool_calls_and_plan_are_new_messages() {
    let r = rig().await;
    r.start("s-1", Some("C1")).await;
    let sid = SessionId::from("s-1");
    let tool = |status: &str| OperatorEvent::ToolCall {
        session_id: sid.clone(),
        tool_call_id: "t1".into(),
        title: "Read".into(),
        status: status.into(),
    };
    let plan = || OperatorEvent::Plan {
        session_id: sid.clone(),
        entries: vec![("edit".into(), "pending".into())],
    };
    for turn in 1..=2 {
        r.emit(OperatorEvent::SteeringDelivered {
            session_id: sid.clone(),
            steering_id: turn,
        });
        r.emit(tool("pending"));
        r.emit(plan());
        r.drained().await;
        r.emit(tool("completed"));
        r.drained().await;
    }
    let calls = r.api.calls();
    let posts = |needle: &str| {
        calls
            .iter()
            .filter(|c| c.starts_with("post") && c.contains(needle))
            .count()
    };
    assert_eq!(posts("tool Read"), 2, "{calls:?}");
    assert_eq!(posts("plan 1"), 2, "{calls:?}");
    let updates = calls
        .iter()
        .filter(|c| c.starts_with("update") && c.contains("tool Read completed"))
        .count();
    assert_eq!(updates, 2, "{calls:?}");
}

#[tokio::test]
async fn steering_reactions_follow_delivery_in_either_order() {
    let r = rig().await;
    r.start("s-1", Some("C1")).await;
    let sid = SessionId::from("s-1");
    // Queued, delivered later.
    r.gw.send_message(GatewayMsg::SteeringAck {
        session_id: sid.clone(),
        steering_id: 1,
        channel: "C1".into(),
        ts: "9.1".into(),
        queued: true,
    })
    .expect("send");
    r.emit(OperatorEvent::SteeringDelivered {
        session_id: sid.clone(),
        steering_id: 1,
    });
    // Delivered before the gateway heard about the reply.
    r.emit(OperatorEvent::SteeringDelivered {
        session_id: sid.clone(),
        steering_id: 2,
    });
    r.gw.send_message(GatewayMsg::SteeringAck {
        session_id: sid,
        steering_id: 2,
        channel: "C1".into(),
        ts: "9.2".into(),
        queued: true,
    })
    .expect("send");
    r.drained().await;
    assert_eq!(
        &r.api.calls()[1..],
        &[
            "react 9.1 hourglass_flowing_sand",
            "unreact 9.1 hourglass_flowing_sand",
            "react 9.1 white_check_mark",
            "react 9.2 white_check_mark",
        ]
    );
}

#[tokio::test]
async fn a_reply_queued_before_a_restart_loses_its_hourglass_when_delivered_after() {
    let outbox = Arc::new(MemoryOutbox::new());
    let store = Arc::new(MemoryStore::new());
    let first = rig_with(outbox.clone(), store.clone()).await;
    first.start("s-1", Some("C1")).await;
    let sid = SessionId::from("s-1");
    first
        .gw
        .send_message(GatewayMsg::SteeringAck {
            session_id: sid.clone(),
            steering_id: 7,
            channel: "C1".into(),
            ts: "9.7".into(),
            queued: true,
        })
        .expect("send");
    first
        .until_call("the hourglass", |c| c == "react 9.7 hourglass_flowing_sand")
        .await;
    first.drained().await;
    first.gw.stop(None);
    tokio::time::sleep(Duration::from_millis(20)).await;

    // The server came back; the restarted agent takes the queued reply.
    let second = rig_with(outbox.clone(), store.clone()).await;
    second.emit(OperatorEvent::SteeringDelivered {
        session_id: sid,
        steering_id: 7,
    });
    second.drained().await;
    let calls = second.api.calls();
    assert_eq!(
        calls,
        [
            "unreact 9.7 hourglass_flowing_sand",
            "react 9.7 white_check_mark"
        ],
        "{calls:?}"
    );
}

#[test]
fn backoff_doubles_and_caps() {
    let p = RetryPolicy {
        initial: Duration::from_millis(100),
        max: Duration::from_millis(500),
    };
    let got: Vec<u128> = (1..=5).map(|n| p.delay(n).as_millis()).collect();
    assert_eq!(got, vec![100, 200, 400, 500, 500]);
}

/// `req` decided (allow) by U1.
fn decided(req: &PendingRequest) -> OperatorEvent {
    OperatorEvent::RequestClosed {
        session_id: req.session_id.clone(),
        id: req.id.clone(),
        status: RequestStatus::Decided,
        decision: Some(Decision {
            option_id: "allow".into(),
            approved: true,
            reason: None,
            decided_by: "U1".into(),
            decided_at: 0,
        }),
    }
}

/// Session `id`'s status line says `what`.
fn activity(id: &str, what: &str) -> OperatorEvent {
    OperatorEvent::StatusChanged {
        session_id: SessionId::from(id),
        status: SessionStatus::Active,
        activity: what.into(),
        reason: None,
    }
}

mod bookkeeping;
mod priority;
