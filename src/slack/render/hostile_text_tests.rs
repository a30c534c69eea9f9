//! Agent text that tries to ping a channel or disguise a link must reach
//! Slack inert everywhere: blocks, the fallback `text`, and the plain-text
//! re-post the gateway makes when Slack refuses the blocks (which sends the
//! fallback `text` alone).

use intercom_actors::model::{
    OptionKind, PendingRequest, PermissionOption, Protocol, RequestKind, RequestStatus, SessionId,
    SessionRecord, SessionStatus,
};
use intercom_actors::ports::NoticeLevel;
use intercom_actors::slack_port::{MessageBody, Render, StatusLine};

use super::BlockKit;

const HOSTILE: &str = "<!channel> look <https://evil.example|docs.rs> & <@U0ADMIN>";

/// No Slack control sequence survives: every `<` and `>` is an entity.
fn inert(what: &str, body: &MessageBody) {
    let blocks = serde_json::to_string(&body.blocks).unwrap_or_default();
    for (part, text) in [("text", body.text.as_str()), ("blocks", blocks.as_str())] {
        assert!(!text.contains("<!"), "{what} {part} pings: {text}");
        assert!(!text.contains("<http"), "{what} {part} links: {text}");
        // (The server's own `<@owner>` mention is fine; the agent's is not.)
        assert!(
            !text.contains("<@U0ADMIN"),
            "{what} {part} mentions: {text}"
        );
    }
}

fn session() -> SessionRecord {
    SessionRecord {
        id: SessionId::from("s-1"),
        workspace: "ws".into(),
        cwd: "/w".into(),
        agent: "a".into(),
        protocol: Protocol::Acp,
        status: SessionStatus::Active,
        status_reason: None,
        title: HOSTILE.into(),
        owner: "U1".into(),
        acp_session_id: None,
        channel_id: Some("C1".into()),
        thread_ts: None,
        restart_count: 0,
        created_at: 0,
        updated_at: 0,
        last_activity_at: 0,
    }
}

fn request(kind: RequestKind) -> PendingRequest {
    PendingRequest {
        command: None,
        id: "s-1:req-1".into(),
        session_id: SessionId::from("s-1"),
        request_id: "req-1".into(),
        kind,
        tool_kind: None,
        title: HOSTILE.into(),
        diff: Some(format!("+{HOSTILE}\n")),
        paths: vec![HOSTILE.into()],
        options: vec![PermissionOption {
            id: "allow".into(),
            // Button labels are plain_text: Slack never parses them.
            name: "Allow".into(),
            kind: OptionKind::AllowOnce,
        }],
        status: RequestStatus::Pending,
        wire_id: None,
        created_at: 0,
    }
}

#[test]
fn agent_text_is_inert_in_every_message_and_its_fallback() {
    let r = BlockKit;
    let line = StatusLine {
        status: SessionStatus::Active,
        activity: "working".into(),
        reason: Some(HOSTILE.into()),
        usage: None,
    };
    inert("root", &r.root(&session(), &line));
    // Bidi overrides and zero-width characters are shown as escapes in the
    // notification text and the blocks alike (a probe's title kept U+202E).
    let disguised = SessionRecord {
        title: "invoice\u{202e}gpj.exe\u{200b}".into(),
        ..session()
    };
    let root = r.root(&disguised, &line);
    for text in [
        root.text.clone(),
        serde_json::to_string(&root.blocks).unwrap_or_default(),
    ] {
        assert!(
            !text.contains('\u{202e}') && !text.contains('\u{200b}'),
            "{text}"
        );
    }
    let (body, _) = r.request(&PendingRequest {
        title: "ok\u{202e}".into(),
        ..request(RequestKind::Permission)
    });
    assert!(!body.text.contains('\u{202e}'), "{}", body.text);
    // A thought's line and agent text too (probe Z: the thought's blocks
    // kept U+202E and a live *bold*).
    let disguising = "exe\u{202e}gnp.txt zero\u{200b}width";
    let mut bodies = r.agent_text(disguising);
    bodies.push(r.thinking(&format!("{disguising} *bold*")));
    for body in bodies {
        for text in [
            body.text.clone(),
            serde_json::to_string(&body.blocks).unwrap_or_default(),
        ] {
            assert!(
                !text.contains('\u{202e}') && !text.contains('\u{200b}'),
                "{text}"
            );
        }
    }
    let thought = serde_json::to_string(&r.thinking("a *bold* claim").blocks).unwrap_or_default();
    assert!(!thought.contains("*bold*"), "{thought}");
    for kind in [
        RequestKind::Permission,
        RequestKind::FileWrite,
        RequestKind::ForwardedPrompt,
    ] {
        let (body, _) = r.request(&request(kind));
        inert("request", &body);
        // A diff too big to show inline goes out as a snippet: its title
        // carries the agent's title too.
        let big = PendingRequest {
            diff: Some(format!("+{}\n", "x".repeat(10_000))),
            ..request(kind)
        };
        // Slack shows a snippet's title as plain text (it parses nothing
        // in it): one line, not escaped.
        let (_, snippet) = r.request(&big);
        let title = snippet.map(|s| s.title).unwrap_or_default();
        assert_eq!(title, format!("Diff: {}", super::truncate(HOSTILE, 100)));
        let closed = r.request_closed(&request(kind), RequestStatus::Cancelled, None);
        inert("request closed", &closed);
    }
    for body in r.agent_text(HOSTILE) {
        inert("agent text", &body);
    }
    inert("tool call", &r.tool_call(HOSTILE, HOSTILE));
    // A probe's thought put a live `<!channel>` in the notification text.
    inert("thinking", &r.thinking(HOSTILE));
    inert("plan", &r.plan(&[(HOSTILE.into(), "pending".into())]));
    inert("notice", &r.notice(NoticeLevel::Warning, HOSTILE));
    inert(
        "stalled",
        &r.stalled(&SessionId::from("s-1"), Some(HOSTILE)),
    );
    inert("ended", &r.ended(SessionStatus::Completed, Some(HOSTILE)));
}
