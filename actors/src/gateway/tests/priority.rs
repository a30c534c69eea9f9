//! Pacing, priority and coalescing: a request overtakes chatter queued
//! before it, an approval decided within the settle time costs two calls,
//! status lines and texts coalesce without growing past one message.

use super::*;

pub(super) fn permission(id: &str, title: &str) -> PendingRequest {
    PendingRequest {
        command: None,
        id: format!("{id}:req-1"),
        session_id: SessionId::from(id),
        request_id: "req-1".into(),
        kind: RequestKind::Permission,
        tool_kind: None,
        title: title.into(),
        diff: None,
        paths: vec![],
        options: vec![],
        status: RequestStatus::Pending,
        wire_id: None,
        created_at: 0,
    }
}

impl Rig {
    /// Polls the recorded calls until `pred` holds (10 s at most).
    pub(super) async fn until_call(&self, what: &str, pred: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.api.calls().iter().any(|c| pred(c)) {
            assert!(
                Instant::now() < deadline,
                "never saw {what}: {:?}",
                self.api.calls()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A gateway on fresh memory ports, paced by `policy`.
async fn paced(policy: PacingPolicy) -> Rig {
    rig_paced(
        Arc::new(MemoryOutbox::new()),
        Arc::new(MemoryStore::new()),
        policy,
    )
    .await
}

/// Posts paced to one per `ms` per channel with no burst; nothing else paced.
fn slow_posts(ms: u64) -> PacingPolicy {
    PacingPolicy {
        post_message: Some(pacing::Rate {
            period: Duration::from_millis(ms),
            burst: 1,
        }),
        ..PacingPolicy::unpaced()
    }
}

#[tokio::test]
async fn a_request_is_posted_before_chatter_queued_ahead_of_it() {
    let r = paced(slow_posts(40)).await;
    for i in 0..6 {
        r.start(&format!("s-{i}"), Some("C1")).await;
    }
    r.drained().await;
    let before = r.api.calls().len();
    // Five sessions chatter, then the sixth asks a human.
    for i in 0..5 {
        r.text(&format!("s-{i}"), &format!("chatter {i}"));
    }
    r.emit(OperatorEvent::RequestOpened {
        request: permission("s-5", "Write x"),
    });
    r.drained().await;
    let after: Vec<String> = r.api.calls()[before..].to_vec();
    assert_eq!(after.len(), 6, "nothing lost: {after:?}");
    let ask = after
        .iter()
        .position(|c| c.ends_with("ask Write x"))
        .expect("request posted");
    // At most the one text that had the channel's token when it came.
    assert!(ask <= 1, "the request waited behind chatter: {after:?}");
}

#[tokio::test]
async fn an_approval_decided_within_the_settle_time_costs_two_calls() {
    let policy = PacingPolicy {
        status_settle: Duration::from_millis(300),
        status_hold_max: Duration::from_secs(2),
        ..PacingPolicy::unpaced()
    };
    let r = paced(policy).await;
    r.start("s-1", Some("C1")).await;
    r.drained().await;
    r.emit(activity("s-1", "working"));
    r.until_call("the root saying working", |c| c.ends_with("[working]"))
        .await;
    r.drained().await;
    let before = r.api.calls().len();
    let req = permission("s-1", "Run ls");
    r.emit(OperatorEvent::RequestOpened {
        request: req.clone(),
    });
    r.emit(activity("s-1", "needs input"));
    r.until_call("the buttons", |c| c.ends_with("ask Run ls"))
        .await;
    // The operator clicks at once; the session goes back to work.
    r.emit(decided(&req));
    r.emit(activity("s-1", "working"));
    r.drained().await;
    let after: Vec<String> = r.api.calls()[before..].to_vec();
    assert_eq!(
        after,
        vec![
            "post C1 Some(\"1.000\") ask Run ls",
            "update C1 3.000 closed Run ls decided U1",
        ]
    );
}

#[tokio::test]
async fn status_lines_coalesce_to_the_last_one() {
    let policy = PacingPolicy {
        status_settle: Duration::from_millis(200),
        status_hold_max: Duration::from_secs(2),
        ..PacingPolicy::unpaced()
    };
    let r = paced(policy).await;
    r.start("s-1", Some("C1")).await;
    r.drained().await;
    for what in ["working", "reading", "writing", "testing", "idle"] {
        r.emit(activity("s-1", what));
    }
    r.drained().await;
    let updates: Vec<String> = r
        .api
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("update C1 1.000 root"))
        .collect();
    assert_eq!(updates, vec!["update C1 1.000 root title s-1 [idle]"]);
    assert!(r.outbox.pending().await.expect("pending").is_empty());
}

#[tokio::test]
async fn an_outcome_that_comes_before_its_buttons_were_posted_replaces_them() {
    let r = paced(slow_posts(200)).await;
    r.start("s-1", Some("C1")).await;
    r.text("s-1", "first");
    let req = permission("s-1", "Run ls");
    r.emit(OperatorEvent::RequestOpened {
        request: req.clone(),
    });
    r.emit(decided(&req));
    r.drained().await;
    let calls = r.api.calls();
    assert!(
        calls
            .iter()
            .any(|c| c.ends_with("closed Run ls decided U1")),
        "{calls:?}"
    );
    assert!(
        !calls.iter().any(|c| c.ends_with("ask Run ls")),
        "{calls:?}"
    );
    assert!(calls.iter().any(|c| c.ends_with("text first")), "{calls:?}");
}

#[tokio::test]
async fn a_chatty_agent_cannot_grow_a_waiting_message_past_one_message() {
    // Every post waits behind a slow channel, so texts pile up.
    let r = paced(slow_posts(30)).await;
    r.start("s-1", Some("C1")).await;
    let chunk = "x".repeat(40);
    for _ in 0..10 {
        r.text("s-1", &chunk);
    }
    r.drained().await;
    let texts: Vec<String> = r
        .api
        .calls()
        .into_iter()
        .filter_map(|c| {
            c.strip_prefix("post C1 Some(\"1.000\") text ")
                .map(str::to_owned)
        })
        .collect();
    // Merged while waiting, but never past what fits one message ...
    assert!(
        texts.iter().all(|t| t.chars().count() <= TEXT_LIMIT),
        "{texts:?}"
    );
    assert!(texts.len() < 10, "nothing was merged: {texts:?}");
    // ... and every chunk arrived.
    let total: usize = texts.iter().map(|t| t.matches('x').count()).sum();
    assert_eq!(total, 400);
}

#[tokio::test]
async fn one_users_flood_of_answers_does_not_hold_another_users_answer() {
    // Ephemeral answers paced to one per 50 ms, workspace-wide as in Slack.
    let policy = PacingPolicy {
        ephemeral: Some(pacing::Rate {
            period: Duration::from_millis(50),
            burst: 1,
        }),
        ..PacingPolicy::unpaced()
    };
    let r = paced(policy).await;
    let answer = |user: &str, text: &str| GatewayMsg::Ephemeral {
        channel: "C1".into(),
        user: user.into(),
        thread_ts: None,
        response_url: None,
        body: MessageBody::text(text),
    };
    for i in 0..10 {
        r.gw.send_message(answer("U_FLOOD", &format!("status {i}")))
            .expect("send");
    }
    r.gw.send_message(answer("U_OTHER", "your status"))
        .expect("send");
    r.until_call("the other user's answer", |c| {
        c == "ephemeral U_OTHER your status"
    })
    .await;
    r.until_call("the flood's last answer", |c| {
        c == "ephemeral U_FLOOD status 9"
    })
    .await;
    let calls = r.api.calls();
    let other = calls
        .iter()
        .position(|c| c.contains("U_OTHER"))
        .expect("answered");
    // Only the flood's answers already on their way when it came go first.
    assert!(other <= 2, "waited behind the flood: {calls:?}");
    // Nothing lost, and the flood's answers keep their order.
    let flood: Vec<&String> = calls.iter().filter(|c| c.contains("U_FLOOD")).collect();
    let expected: Vec<String> = (0..10)
        .map(|i| format!("ephemeral U_FLOOD status {i}"))
        .collect();
    assert_eq!(flood, expected.iter().collect::<Vec<_>>());
}
