//! The stream contract (`seeds/acp-stream-contract.md`, tests 1-7).
//!
//! 1-5 run at the codec level: bytes go through a `tokio::io::duplex` pipe
//! into `FramedRead<_, FrameCodec>` exactly as the child's stdout does, and
//! each frame is taken through `RpcMessage::parse` and
//! `DialectIn::from_message`, the same steps the session actor takes. A bad
//! frame is an error value for that frame only; the stream goes on. 6 runs a
//! real session whose agent exits, 7 checks what we write. The end-to-end
//! tests at the bottom run the dialect over LSP framing and feed a live
//! session garbage.

mod support;

use bytes::{Bytes, BytesMut};
use futures::{FutureExt, StreamExt};
use intercom_actors::model::{Framing, RequestStatus, SessionId, SessionStatus};
use intercom_actors::ports::{NoticeLevel, OperatorEvent, SessionStore};
use intercom_actors::protocol::framing::{Frame, FrameCodec, FramingError, NdjsonCodec};
use intercom_actors::protocol::intercom::{DialectError, DialectIn, DialectWriter};
use intercom_actors::protocol::jsonrpc::{ParseError, RpcMessage};
use intercom_actors::session::{Caller, Choice, SessionMsg};
use intercom_actors::settings::SupervisionPolicy;
use intercom_actors::supervisor::SupervisorMsg;
use serde_json::{Value, json};
use support::{Harness, Knobs, WAIT, decide_as};
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio_util::codec::{Decoder, Encoder, FramedRead};

// ---------------------------------------------------------------------------
// Codec-level helpers
// ---------------------------------------------------------------------------

const MAX: usize = 1 << 20;

/// What the reader makes of one frame.
#[derive(Debug, PartialEq)]
enum Event {
    /// A dialect message.
    In(DialectIn),
    /// Not JSON / not an envelope: logged and skipped.
    Malformed(ParseError),
    /// A valid envelope the dialect does not accept: logged and skipped.
    Skipped(DialectError),
    /// Longer than the limit: skipped.
    Oversized(usize),
}

fn interpret(frame: Frame) -> Event {
    match frame {
        Frame::Oversized { len, .. } => Event::Oversized(len),
        Frame::Message(body) => match RpcMessage::parse(&body) {
            Err(e) => Event::Malformed(e),
            Ok(msg) => match DialectIn::from_message(&msg) {
                Ok(m) => Event::In(m),
                Err(e) => Event::Skipped(e),
            },
        },
    }
}

type Frames = FramedRead<DuplexStream, FrameCodec>;

/// A pipe whose read end is framed like an agent's stdout.
fn pipe() -> (DuplexStream, Frames) {
    let (tx, rx) = tokio::io::duplex(64 * 1024);
    (
        tx,
        FramedRead::new(rx, FrameCodec::new(Framing::Ndjson, MAX)),
    )
}

async fn next(frames: &mut Frames) -> Event {
    let item = tokio::time::timeout(WAIT, frames.next())
        .await
        .expect("a frame in time")
        .expect("stream still open")
        .expect("no framing error");
    interpret(item)
}

/// Asserts nothing is decodable right now (without waiting).
fn assert_nothing_yet(frames: &mut Frames) {
    if let Some(item) = frames.next().now_or_never() {
        panic!("expected no frame yet, got {item:?}");
    }
}

fn line(v: &Value) -> String {
    format!("{v}\n")
}

fn clearance_json() -> Value {
    json!({
        "method": "clearance/request",
        "id": "req-001",
        "params": {
            "title": "Create new module",
            "description": "Adding src/driver/mod.rs",
            "diff": "--- /dev/null\n+++ b/src/driver/mod.rs\n@@ ...",
            "file_path": "src/driver/mod.rs",
            "risk_level": "low"
        }
    })
}

fn status_json(text: &str) -> Value {
    json!({"method": "status/update", "params": {"message": text}})
}

fn status(text: &str) -> Event {
    Event::In(DialectIn::Status {
        message: text.into(),
    })
}

// ---------------------------------------------------------------------------
// 1. single message
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_01_single_message_parses() {
    let (mut tx, mut frames) = pipe();
    tx.write_all(line(&clearance_json()).as_bytes())
        .await
        .expect("write");
    match next(&mut frames).await {
        Event::In(DialectIn::Clearance { id, req }) => {
            assert_eq!(id, "req-001");
            assert_eq!(req.title, "Create new module");
            assert_eq!(req.description, "Adding src/driver/mod.rs");
            assert_eq!(
                req.diff.as_deref(),
                Some("--- /dev/null\n+++ b/src/driver/mod.rs\n@@ ...")
            );
            assert_eq!(req.file_path, "src/driver/mod.rs");
            assert_eq!(req.risk_level, "low");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_nothing_yet(&mut frames);
}

#[tokio::test]
async fn contract_01_every_inbound_message_parses() {
    let (mut tx, mut frames) = pipe();
    let wire = [
        status_json("Running cargo test..."),
        json!({"method": "prompt/forward", "id": "prompt-001",
               "params": {"text": "Should I refactor the error handling?", "type": "continuation"}}),
        json!({"method": "heartbeat", "params": {"progress": [
            {"label": "Writing tests", "status": "in_progress"},
            {"label": "Implementation", "status": "pending"}
        ]}}),
        json!({"method": "heartbeat", "params": {}}),
    ];
    for v in &wire {
        tx.write_all(line(v).as_bytes()).await.expect("write");
    }
    assert_eq!(next(&mut frames).await, status("Running cargo test..."));
    assert_eq!(
        next(&mut frames).await,
        Event::In(DialectIn::PromptForward {
            id: "prompt-001".into(),
            text: "Should I refactor the error handling?".into(),
            kind: "continuation".into(),
        })
    );
    assert_eq!(
        next(&mut frames).await,
        Event::In(DialectIn::Heartbeat {
            progress: vec![
                ("Writing tests".into(), "in_progress".into()),
                ("Implementation".into(), "pending".into()),
            ]
        })
    );
    assert_eq!(
        next(&mut frames).await,
        Event::In(DialectIn::Heartbeat { progress: vec![] })
    );
}

// ---------------------------------------------------------------------------
// 2. batched messages
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_02_batched_messages_are_separate_events() {
    let (mut tx, mut frames) = pipe();
    let batch = format!("{}{}", line(&status_json("one")), line(&clearance_json()));
    tx.write_all(batch.as_bytes()).await.expect("one write");
    assert_eq!(next(&mut frames).await, status("one"));
    assert!(matches!(
        next(&mut frames).await,
        Event::In(DialectIn::Clearance { ref id, .. }) if *id == "req-001"
    ));
    assert_nothing_yet(&mut frames);

    // CRLF endings and blank keep-alive lines inside a batch are fine too.
    tx.write_all(b"\n{\"method\":\"status/update\",\"params\":{\"message\":\"two\"}}\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(next(&mut frames).await, status("two"));
    assert_nothing_yet(&mut frames);
}

#[test]
fn contract_02_many_messages_in_one_buffer() {
    let mut buf = BytesMut::new();
    for i in 0..100 {
        buf.extend_from_slice(line(&status_json(&format!("m{i}"))).as_bytes());
    }
    let mut codec = FrameCodec::new(Framing::Ndjson, MAX);
    let mut got = Vec::new();
    while let Some(frame) = codec.decode(&mut buf).expect("decode") {
        got.push(interpret(frame));
    }
    let want: Vec<Event> = (0..100).map(|i| status(&format!("m{i}"))).collect();
    assert_eq!(got, want);
    assert!(buf.is_empty());
}

// ---------------------------------------------------------------------------
// 3. partial delivery
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_03_partial_delivery_is_reassembled() {
    let (mut tx, mut frames) = pipe();
    let wire = line(&clearance_json());
    let (a, b) = wire.as_bytes().split_at(wire.len() / 2);
    tx.write_all(a).await.expect("first half");
    assert_nothing_yet(&mut frames);
    tx.write_all(b).await.expect("second half");
    assert!(matches!(
        next(&mut frames).await,
        Event::In(DialectIn::Clearance { ref id, .. }) if *id == "req-001"
    ));
    assert_nothing_yet(&mut frames);

    // A message split three ways, with the end of one message and the start
    // of the next in the same write.
    let one = line(&status_json("first"));
    let two = line(&status_json("second"));
    tx.write_all(&one.as_bytes()[..5]).await.expect("write");
    assert_nothing_yet(&mut frames);
    tx.write_all(&one.as_bytes()[5..20]).await.expect("write");
    assert_nothing_yet(&mut frames);
    let rest = format!("{}{}", &one[20..], &two[..10]);
    tx.write_all(rest.as_bytes()).await.expect("write");
    assert_eq!(next(&mut frames).await, status("first"));
    assert_nothing_yet(&mut frames);
    tx.write_all(&two.as_bytes()[10..]).await.expect("write");
    assert_eq!(next(&mut frames).await, status("second"));
}

#[test]
fn contract_03_every_split_point_gives_one_message() {
    // Multi-byte UTF-8 in the text, so some splits fall inside a character.
    let wire = line(&status_json("héllo wörld ✓ — done"));
    let bytes = wire.as_bytes();
    for k in 1..bytes.len() {
        let mut codec = NdjsonCodec::new(MAX);
        let mut buf = BytesMut::from(&bytes[..k]);
        assert_eq!(codec.decode(&mut buf).expect("decode"), None, "split {k}");
        buf.extend_from_slice(&bytes[k..]);
        let frame = codec.decode(&mut buf).expect("decode").expect("a frame");
        assert_eq!(
            interpret(frame),
            status("héllo wörld ✓ — done"),
            "split {k}"
        );
        assert_eq!(codec.decode(&mut buf).expect("decode"), None);
    }
}

#[tokio::test]
async fn contract_03_final_line_without_newline_counts_at_eof() {
    let (mut tx, mut frames) = pipe();
    let wire = status_json("last words").to_string();
    tx.write_all(wire.as_bytes()).await.expect("write");
    assert_nothing_yet(&mut frames);
    drop(tx);
    assert_eq!(next(&mut frames).await, status("last words"));
    assert!(frames.next().await.is_none(), "then end of stream");
}

// ---------------------------------------------------------------------------
// 4. malformed line
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_04_malformed_lines_are_skipped_and_the_stream_continues() {
    let (mut tx, mut frames) = pipe();
    let mut wire = String::new();
    wire.push_str("{\"method\": \"status/update\", \"params\": {\n"); // truncated JSON
    wire.push_str("not json at all\n");
    wire.push_str("[1, 2, 3]\n"); // JSON, but not an envelope
    wire.push_str("{\"id\": 1}\n"); // neither method nor result
    wire.push_str("{\"method\": 42, \"params\": {}}\n");
    wire.push_str(&line(&status_json("after the garbage")));
    tx.write_all(wire.as_bytes()).await.expect("write");
    tx.write_all(b"\xff\xfe\xfd\n").await.expect("write"); // not UTF-8
    tx.write_all(line(&status_json("still here")).as_bytes())
        .await
        .expect("write");

    assert!(matches!(
        next(&mut frames).await,
        Event::Malformed(ParseError::Json(_))
    ));
    assert!(matches!(
        next(&mut frames).await,
        Event::Malformed(ParseError::Json(_))
    ));
    // An array is a JSON-RPC batch: not taken; no request in it to answer.
    assert_eq!(
        next(&mut frames).await,
        Event::Malformed(ParseError::Batch {
            len: 3,
            requests: Vec::new()
        })
    );
    assert!(matches!(
        next(&mut frames).await,
        Event::Malformed(ParseError::Shape(_))
    ));
    // A request the agent got wrong is answered (-32600, null id); a
    // malformed response is not.
    assert_eq!(
        next(&mut frames).await,
        Event::Malformed(ParseError::Invalid("method is not a string"))
    );
    assert_eq!(next(&mut frames).await, status("after the garbage"));
    assert!(matches!(
        next(&mut frames).await,
        Event::Malformed(ParseError::Json(_))
    ));
    assert_eq!(next(&mut frames).await, status("still here"));
}

#[tokio::test]
async fn contract_04_missing_required_fields_name_the_field() {
    let (mut tx, mut frames) = pipe();
    let wire = [
        json!({"method": "clearance/request", "id": "r1", "params": {"title": "t"}}),
        json!({"method": "clearance/request", "params": {"title": "t", "file_path": "a"}}),
        json!({"method": "status/update", "params": {}}),
        json!({"method": "prompt/forward", "id": "p1", "params": {}}),
        status_json("ok"),
    ];
    for v in &wire {
        tx.write_all(line(v).as_bytes()).await.expect("write");
    }
    for field in ["file_path", "id", "message", "text"] {
        match next(&mut frames).await {
            Event::Skipped(e @ DialectError::BadParams { .. }) => {
                assert!(e.to_string().contains(field), "{e} should name {field}");
            }
            other => panic!("expected BadParams naming {field}, got {other:?}"),
        }
    }
    assert_eq!(next(&mut frames).await, status("ok"));
}

#[tokio::test]
async fn contract_04_an_over_long_line_is_skipped_and_the_stream_continues() {
    let (tx, rx) = tokio::io::duplex(64 * 1024);
    let mut frames = FramedRead::new(rx, FrameCodec::new(Framing::Ndjson, 1024));
    let mut tx = tx;
    let big = status_json(&"x".repeat(5000)).to_string();
    let writer = tokio::spawn(async move {
        tx.write_all(format!("{big}\n").as_bytes())
            .await
            .expect("write");
        tx.write_all(line(&status_json("small")).as_bytes())
            .await
            .expect("write");
        tx
    });
    let first = next(&mut frames).await;
    assert!(
        matches!(first, Event::Oversized(n) if n > 5000),
        "{first:?}"
    );
    assert_eq!(next(&mut frames).await, status("small"));
    drop(writer.await.expect("writer"));
}

// ---------------------------------------------------------------------------
// 5. unknown method
// ---------------------------------------------------------------------------

#[tokio::test]
async fn contract_05_unknown_methods_are_skipped_and_the_stream_continues() {
    let (mut tx, mut frames) = pipe();
    let wire = [
        json!({"method": "bogus/thing", "params": {}}),
        json!({"method": "session/update", "id": "x", "params": {"a": 1}}),
        json!({"id": "req-001", "result": {}}), // a response: not a dialect message
        status_json("after unknown"),
    ];
    for v in &wire {
        tx.write_all(line(v).as_bytes()).await.expect("write");
    }
    assert_eq!(
        next(&mut frames).await,
        Event::Skipped(DialectError::UnknownMethod("bogus/thing".into()))
    );
    assert_eq!(
        next(&mut frames).await,
        Event::Skipped(DialectError::UnknownMethod("session/update".into()))
    );
    assert_eq!(
        next(&mut frames).await,
        Event::Skipped(DialectError::UnknownMethod("<response>".into()))
    );
    assert_eq!(next(&mut frames).await, status("after unknown"));
}

// ---------------------------------------------------------------------------
// 6. stream EOF (the agent exits)
// ---------------------------------------------------------------------------

fn no_restarts() -> Knobs {
    Knobs {
        policy: SupervisionPolicy {
            max_restarts: 0,
            backoff_initial_secs: 0,
            backoff_max_secs: 0,
            ..SupervisionPolicy::default()
        },
        ..Knobs::default()
    }
}

async fn until_ended(h: &Harness, id: &SessionId) -> (SessionStatus, Option<String>) {
    match h
        .until(
            &format!("{id} ended"),
            |e| matches!(e, OperatorEvent::SessionEnded { session_id, .. } if session_id == id),
        )
        .await
    {
        OperatorEvent::SessionEnded { status, reason, .. } => (status, reason),
        _ => unreachable!(),
    }
}

async fn shutdown(h: &Harness) {
    let done = tokio::time::timeout(WAIT, async {
        ractor::call!(h.sup, SupervisorMsg::Shutdown).expect("shutdown call")
    })
    .await;
    assert!(done.is_ok(), "shutdown did not finish");
}

#[tokio::test]
async fn contract_06_stream_eof_ends_the_session_crashed() {
    let h = Harness::new(no_restarts()).await;
    // A failing exit (exit 0 would be a clean finish: `completed`).
    let scenario = json!({"protocol": "intercom", "turns": [[
        {"status": "about to exit"},
        {"exit": 2}
    ]]});
    let rec = h.start(scenario, "go").await;
    // The agent's stdout closed under us: the session is terminated.
    let (status, reason) = until_ended(&h, &rec.id).await;
    assert_eq!(status, SessionStatus::Crashed);
    let reason = reason.expect("a reason");
    assert!(
        reason.contains("agent exited unexpectedly (exit code 2)"),
        "{reason}"
    );
    // The stored reason says why it was not restarted, not only the crash.
    assert!(
        reason.contains("(not restarted: supervision.max_restarts is 0)"),
        "{reason}"
    );
    let notice = h
        .until("budget notice", |e| {
            matches!(e, OperatorEvent::Notice { session_id, level: NoticeLevel::Error, text }
                if session_id == &rec.id && text.contains("Restart budget spent"))
        })
        .await;
    assert!(matches!(notice, OperatorEvent::Notice { .. }));
    let stored = h
        .until_record(&rec.id, "crashed", |r| r.status == SessionStatus::Crashed)
        .await;
    assert_eq!(stored.status_reason.as_deref(), Some(reason.as_str()));
    let text = h
        .until_transcript(&rec.id, "[system:error] agent exited unexpectedly")
        .await;
    assert!(text.contains("[user:text] go"), "{text}");
    let audit = h.store.audit_entries();
    assert!(audit.iter().any(|a| a.action == "session.agent_exited"));
    assert!(
        audit
            .iter()
            .any(|a| a.action == "session.ended" && a.detail["status"] == json!("crashed"))
    );
    assert_eq!(h.live_count().await, 0);
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_06_stream_eof_acp_mid_turn() {
    let h = Harness::new(no_restarts()).await;
    let scenario = json!({"turns": [[{"chunk": "working..."}, {"exit": 3}]]});
    let rec = h.start(scenario, "go").await;
    let (status, reason) = until_ended(&h, &rec.id).await;
    assert_eq!(status, SessionStatus::Crashed);
    assert!(
        reason.as_deref().unwrap_or("").contains("exit code 3"),
        "{reason:?}"
    );
    assert_eq!(h.live_count().await, 0);
    shutdown(&h).await;
}

#[tokio::test]
async fn contract_06_stream_eof_schedules_a_restart_within_budget() {
    let h = Harness::new(Knobs::default()).await;
    // Exits in its first turn; a restarted intercom agent gets no prompt,
    // so it stays up after the restart.
    let scenario = json!({"protocol": "intercom", "turns": [[{"exit": 1}]]});
    let rec = h.start(scenario, "go").await;
    h.until("restart notice", |e| {
        matches!(e, OperatorEvent::Notice { session_id, level: NoticeLevel::Warning, text }
            if session_id == &rec.id
                && text.contains("agent exited unexpectedly (exit code 1)")
                && text.contains("attempt 1 of 3"))
    })
    .await;
    h.until("restarted notice", |e| {
        matches!(e, OperatorEvent::Notice { session_id, level: NoticeLevel::Info, text }
            if session_id == &rec.id && text.contains("Agent restarted"))
    })
    .await;
    let stored = h
        .until_record(&rec.id, "active again", |r| {
            r.status == SessionStatus::Active && r.restart_count == 1
        })
        .await;
    assert_eq!(stored.restart_count, 1);
    assert!(
        h.store
            .audit_entries()
            .iter()
            .any(|a| a.action == "session.restart_scheduled" && a.detail["attempt"] == json!(1))
    );
    assert!(
        !h.sink.events().iter().any(
            |e| matches!(e, OperatorEvent::SessionEnded { session_id, .. } if session_id == &rec.id)
        ),
        "not ended while the budget lasts"
    );
    // The restarted session is live and answers.
    let actor = ractor::call!(h.sup, |reply| SupervisorMsg::Lookup {
        id: rec.id.clone(),
        reply
    })
    .expect("lookup")
    .expect("live after restart");
    let snap = ractor::call!(actor, SessionMsg::Snapshot).expect("snapshot");
    assert_eq!(snap.status, SessionStatus::Active);
    shutdown(&h).await;
    let (status, _) = until_ended(&h, &rec.id).await;
    assert_eq!(status, SessionStatus::Cancelled);
}

/// The agent's last lines before it exits must reach the transcript.
///
/// Ignored: the child's reaper reports `ChildEvent::Exited` independently of
/// the stdout reader, so on a multi-thread runtime the exit can overtake the
/// final frames and the session actor stops before handling them (observed:
/// ~5-25% of stops lose the agent's last line). See the report for the fix
/// (emit `Exited` only after the stdout reader reached EOF).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_06_last_lines_before_exit_are_kept() {
    let h = Harness::new(Knobs::default()).await;
    for i in 0..100 {
        let scenario = json!({"protocol": "intercom", "turns": [[
            {"clearance": {"id": "req-001", "title": "t", "file_path": "a"}}
        ]]});
        let rec = h.start(scenario, "go").await;
        h.until("opened", |e| {
            matches!(e, OperatorEvent::RequestOpened { request } if request.session_id == rec.id)
        })
        .await;
        let actor = ractor::call!(h.sup, |reply| SupervisorMsg::Lookup {
            id: rec.id.clone(),
            reply
        })
        .expect("lookup")
        .expect("live");
        ractor::call!(actor, |reply| SessionMsg::Stop {
            cause: intercom_actors::session::StopCause::Operator,
            caller: Caller::local(),
            reply: Some(reply)
        })
        .expect("stop call")
        .expect("stop");
        until_ended(&h, &rec.id).await;
        let text = h.transcript_text(&rec.id).await;
        assert!(
            text.contains("[agent:text] interrupted"),
            "iteration {i}: {text}"
        );
    }
}

// ---------------------------------------------------------------------------
// 7. write serialisation
// ---------------------------------------------------------------------------

fn encode(codec: &mut impl Encoder<Bytes, Error = FramingError>, body: Bytes) -> BytesMut {
    let mut dst = BytesMut::new();
    codec.encode(body, &mut dst).expect("encode");
    dst
}

fn one_line(dst: &[u8]) -> Value {
    assert_eq!(dst.last(), Some(&b'\n'), "ends with LF");
    assert_eq!(
        dst.iter().filter(|b| **b == b'\n').count(),
        1,
        "exactly one line: {:?}",
        String::from_utf8_lossy(dst)
    );
    assert!(!dst.contains(&b'\r'));
    serde_json::from_slice(&dst[..dst.len() - 1]).expect("valid JSON")
}

#[test]
fn contract_07_clearance_response_is_one_ndjson_line() {
    let mut w = DialectWriter::default();
    let mut codec = NdjsonCodec::new(MAX);

    let dst = encode(
        &mut codec,
        w.clearance_response(&"req-001".into(), true, None),
    );
    let v = one_line(&dst);
    assert_eq!(v["method"], "clearance/response");
    assert_eq!(v["id"], "req-001");
    assert_eq!(v["params"]["status"], "approved");
    assert_eq!(v["params"]["reason"], Value::Null);
    assert_eq!(v["seq"], 1);
    assert!(
        v.get("jsonrpc").is_none(),
        "the dialect has no jsonrpc member"
    );

    // A reason with a newline and quotes stays on one line.
    let dst = encode(
        &mut codec,
        w.clearance_response(&"req-002".into(), false, Some("no:\n\"not now\"")),
    );
    let v = one_line(&dst);
    assert_eq!(v["id"], "req-002");
    assert_eq!(v["params"]["status"], "rejected");
    assert_eq!(v["params"]["reason"], "no:\n\"not now\"");
    assert_eq!(v["seq"], 2);

    // What we write is what an NDJSON reader reads back.
    let body = w.clearance_response(&"req-003".into(), true, None);
    let mut wire = encode(&mut FrameCodec::new(Framing::Ndjson, MAX), body.clone());
    let frame = NdjsonCodec::new(MAX)
        .decode(&mut wire)
        .expect("decode")
        .expect("frame");
    assert_eq!(frame, Frame::Message(body));
    assert!(wire.is_empty());
}

#[test]
fn contract_07_every_outbound_message_is_one_line_with_increasing_seq() {
    let mut w = DialectWriter::default();
    let mut codec = NdjsonCodec::new(MAX);
    let bodies = [
        w.clearance_response(&"req-001".into(), true, None),
        w.prompt_send("Focus on the error handling module next."),
        w.prompt_response(&"prompt-001".into(), "refine", Some("only the parser")),
        w.interrupt("Operator requested termination"),
        w.nudge("Continue working on the current task."),
    ];
    let mut all = BytesMut::new();
    for body in bodies {
        all.extend_from_slice(&encode(&mut codec, body));
    }
    let lines: Vec<Value> = all[..]
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("json"))
        .collect();
    let methods: Vec<&str> = lines
        .iter()
        .map(|v| v["method"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        methods,
        [
            "clearance/response",
            "prompt/send",
            "prompt/response",
            "session/interrupt",
            "nudge"
        ]
    );
    let seqs: Vec<u64> = lines
        .iter()
        .map(|v| v["seq"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    assert_eq!(
        lines[1]["params"]["text"],
        "Focus on the error handling module next."
    );
    assert_eq!(lines[2]["id"], "prompt-001");
    assert_eq!(lines[2]["params"]["decision"], "refine");
    assert_eq!(lines[2]["params"]["instruction"], "only the parser");
    assert_eq!(
        lines[3]["params"]["reason"],
        "Operator requested termination"
    );
    assert!(lines[1].get("id").is_none());
}

// ---------------------------------------------------------------------------
// End to end
// ---------------------------------------------------------------------------

fn owner() -> Caller {
    Caller {
        id: "U_OWNER".into(),
        operator: false,
    }
}

async fn decide_approve(h: &Harness, id: &SessionId) {
    decide_as(h, id, "req-1", Choice::Approve, None, owner())
        .await
        .expect("decided");
}

async fn until_opened(h: &Harness, id: &SessionId) -> intercom_actors::model::PendingRequest {
    match h
        .until(
            "request opened",
            |e| matches!(e, OperatorEvent::RequestOpened { request } if &request.session_id == id),
        )
        .await
    {
        OperatorEvent::RequestOpened { request } => request,
        _ => unreachable!(),
    }
}

#[tokio::test]
async fn lsp_framing_intercom_clearance_round_trip() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"protocol": "intercom", "framing": "lsp", "turns": [[
        {"status": "over lsp"},
        {"clearance": {"id": "req-001", "title": "Edit", "description": "d",
                       "file_path": "src/lib.rs", "risk_level": "medium"}},
        {"heartbeat": [{"label": "Edit", "status": "in_progress"}]},
        {"status": "lsp turn done"}
    ]]});
    let profile = h.profile(scenario);
    assert_eq!(profile.framing, Framing::Lsp);
    let rec = h
        .start_req(h.request(profile, "lsp please"))
        .await
        .expect("starts");
    let req = until_opened(&h, &rec.id).await;
    assert_eq!(req.request_id, "req-1");
    assert!(req.title.contains("medium risk"), "{}", req.title);
    // prompt/send reached the agent in Content-Length frames...
    h.until_transcript(&rec.id, "prompt: lsp please").await;
    h.until_transcript(&rec.id, "over lsp").await;
    decide_approve(&h, &rec.id).await;
    // ...and so did clearance/response.
    h.until_transcript(&rec.id, "clearance req-001: approved")
        .await;
    h.until("heartbeat progress as a plan", |e| {
        matches!(e, OperatorEvent::Plan { session_id, entries }
            if session_id == &rec.id && entries == &[("Edit".to_owned(), "in_progress".to_owned())])
    })
    .await;
    h.until_transcript(&rec.id, "lsp turn done").await;
    let (stored, _) = h
        .store
        .get_request(&req.id)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(stored.status, RequestStatus::Decided);
    shutdown(&h).await;
}

#[tokio::test]
async fn lsp_framing_acp_permission_round_trip() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"framing": "lsp", "turns": [[
        {"permission": {"tool_call_id": "t1", "title": "Write a", "kind": "edit"}},
        {"chunk": " done."}
    ]]});
    let rec = h.start(scenario, "lsp acp").await;
    until_opened(&h, &rec.id).await;
    decide_approve(&h, &rec.id).await;
    h.until_transcript(&rec.id, "permission t1: selected allow-once")
        .await;
    h.until_transcript(&rec.id, "done.").await;
    shutdown(&h).await;
}

/// An intercom request the server cannot read but can answer (it has an
/// id) is refused with the reason: the agent waited for ever for an answer
/// that never came, and the operator saw nothing.
#[tokio::test]
async fn a_malformed_intercom_request_is_answered_with_the_reason() {
    const AGENT: &str = r#"
import json, sys
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    if m.get("method") == "prompt/send":
        send({"method": "clearance/request", "id": "bf1", "params": {"title": "no path"}})
        send({"method": "prompt/forward", "id": "pf1", "params": {"type": "continuation"}})
        send({"method": "clearance/request", "id": 42, "params": {"title": "numbered"}})
    elif m.get("method", "").endswith("/response"):
        p = m.get("params", {})
        said = p.get("status") or p.get("decision")
        why = p.get("reason") or p.get("instruction") or ""
        send({"method": "status/update", "params": {"message": "got %r: %s (%s)" % (m["id"], said, why)}})
"#;
    let h = Harness::new(Knobs::default()).await;
    let mut profile = h.profile(json!({"protocol": "intercom"}));
    profile.command = "python3".into();
    profile.args = vec!["-c".into(), AGENT.into()];
    let rec = h.start_req(h.request(profile, "go")).await.expect("start");
    let mut text = String::new();
    for answer in ["got 'pf1'", "got 'bf1'", "got 42:"] {
        if !text.contains(answer) {
            text = h.until_transcript(&rec.id, answer).await;
        }
    }
    assert!(text.contains("got 'bf1': rejected ("), "{text}");
    assert!(
        text.contains("file_path"),
        "the reason names the field: {text}"
    );
    assert!(text.contains("got 'pf1': stop ("), "{text}");
    // A numeric id comes back a number (Python shows a string quoted).
    assert!(text.contains("got 42: rejected ("), "{text}");
    h.until("a notice for the operator", |e| {
        matches!(e, OperatorEvent::Notice { level: NoticeLevel::Warning, text, .. } if text.contains("could not read"))
    })
    .await;
    shutdown(&h).await;
}

/// Every request the agent makes gets an answer it can match, even one the
/// server cannot read: a null id (taken for a notification, never
/// answered), a method that is not a string (answered on id null though its
/// id was readable), and a line over `max_line_bytes` (a real agent writing
/// a file over the limit waited for ever on its id).
#[tokio::test]
async fn an_unreadable_request_is_answered_on_the_id_it_can_match() {
    const AGENT: &str = r#"
def on(m, method, mid):
    global turn
    if method == "session/prompt":
        turn = mid
        send({"jsonrpc": "2.0", "id": None, "method": "fs/read_text_file", "params": {"sessionId": "s1", "path": "/etc/hostname"}})
        send({"jsonrpc": "2.0", "id": 6, "method": 42})
        send({"jsonrpc": "2.0", "id": "big1", "method": "fs/write_text_file",
              "params": {"sessionId": "s1", "path": "big.txt", "content": "x" * 8000}})
    elif method is None:
        err = m.get("error") or {}
        chunk("answer %r: %s %s\n" % (mid, err.get("code"), err.get("message", "")[:60]))
        if mid == "big1":
            send({"jsonrpc": "2.0", "id": turn, "result": {"stopReason": "end_turn"}})
"#;
    let mut knobs = Knobs::default();
    knobs.limits.max_line_bytes = 4096;
    let h = Harness::new(knobs).await;
    let profile = h.python_agent(AGENT);
    let rec = h.start_req(h.request(profile, "go")).await.expect("start");
    let text = h.until_transcript(&rec.id, "answer 'big1'").await;
    for answer in [
        "answer None: -32600 invalid request: the id is null",
        "answer 6: -32600 invalid request: method is not a string",
        "answer 'big1': -32600 a ",
    ] {
        assert!(text.contains(answer), "no {answer:?} in:\n{text}");
    }
    shutdown(&h).await;
}

/// An agent that keeps asking after a pause cancelled its turn is told so
/// as ACP says a cancelled turn's requests end (a permission: outcome
/// `cancelled`; anything else: -32800), not "invalid request", which an SDK
/// reads as its own bug.
#[tokio::test]
async fn requests_after_a_pause_are_answered_as_cancelled() {
    const AGENT: &str = r#"
def gate(i):
    send({"jsonrpc": "2.0", "id": i, "method": "session/request_permission", "params": {"sessionId": "s1",
          "toolCall": {"toolCallId": i, "title": "gate " + i},
          "options": [{"optionId": "ok", "name": "Allow", "kind": "allow_once"}]}})
def on(m, method, mid):
    if method == "session/prompt":
        gate("p1")
    elif method is None:
        got = m.get("result") or m.get("error")
        chunk("answer %s: %s\n" % (mid, json.dumps(got, sort_keys=True)))
        if mid == "p1":
            # Asks again, as if it had not seen the cancel.
            gate("p2")
            send({"jsonrpc": "2.0", "id": "r1", "method": "fs/read_text_file", "params": {"sessionId": "s1", "path": "a.txt"}})
"#;
    let h = Harness::new(Knobs::default()).await;
    let profile = h.python_agent(AGENT);
    let rec = h.start_req(h.request(profile, "go")).await.expect("start");
    h.until("the first request", |e| {
        matches!(e, OperatorEvent::RequestOpened { .. })
    })
    .await;
    let actor = h.actor(&rec.id).await;
    ractor::call!(actor, |reply| SessionMsg::Pause {
        caller: Caller::local(),
        reply
    })
    .expect("call")
    .expect("paused");
    let text = h.until_transcript(&rec.id, "answer r1").await;
    let text = if text.contains("answer p2") {
        text
    } else {
        h.until_transcript(&rec.id, "answer p2").await
    };
    let cancelled = r#"{"outcome": {"outcome": "cancelled"}}"#;
    assert!(text.contains(&format!("answer p1: {cancelled}")), "{text}");
    assert!(text.contains(&format!("answer p2: {cancelled}")), "{text}");
    assert!(text.contains(r#"answer r1: {"code": -32800"#), "{text}");
    shutdown(&h).await;
}

/// `$/cancel_request` withdraws a waiting request: the operator is no
/// longer asked, the agent is answered -32800, and a later request with the
/// same id is a new one, answered by its own decision (the stale approval
/// used to answer it).
#[tokio::test]
async fn an_agent_may_withdraw_a_waiting_request() {
    const AGENT: &str = r#"
def gate(title):
    send({"jsonrpc": "2.0", "id": "p1", "method": "session/request_permission", "params": {"sessionId": "s1",
          "toolCall": {"toolCallId": "t1", "title": title},
          "options": [{"optionId": "ok", "name": "Allow", "kind": "allow_once"},
                      {"optionId": "no", "name": "Reject", "kind": "reject_once"}]}})
def on(m, method, mid):
    if method == "session/prompt":
        gate("first thought")
        send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "p1"}})
    elif method is None:
        got = m.get("result") or m.get("error")
        chunk("answer %s: %s\n" % (mid, json.dumps(got, sort_keys=True)))
        if "error" in m:
            gate("second thought")
"#;
    let h = Harness::new(Knobs::default()).await;
    let profile = h.python_agent(AGENT);
    let rec = h.start_req(h.request(profile, "go")).await.expect("start");
    let text = h
        .until_transcript(&rec.id, "answer p1: {\"code\": -32800")
        .await;
    assert!(text.contains("withdrew"), "{text}");
    h.until_transcript(
        &rec.id,
        "The agent withdrew its request req-1 (first thought); nothing was decided.",
    )
    .await;
    let second = h
        .until("the second request", |e| {
            matches!(e, OperatorEvent::RequestOpened { request } if request.title.contains("second"))
        })
        .await;
    let OperatorEvent::RequestOpened { request } = second else {
        unreachable!()
    };
    assert_eq!(request.request_id, "req-2");
    let (first, _) = h
        .store
        .get_request(&format!("{}:req-1", rec.id.0))
        .await
        .expect("read")
        .expect("the first request");
    assert_eq!(first.status, RequestStatus::Cancelled);
    decide_as(
        &h,
        &rec.id,
        "req-2",
        Choice::Option("no".into()),
        None,
        Caller::local(),
    )
    .await
    .expect("decided");
    h.until_transcript(&rec.id, r#"answer p1: {"outcome": {"optionId": "no""#)
        .await;
    shutdown(&h).await;
}

/// A permission for a tool call whose announcement (with its diff) was
/// over `max_line_bytes` says its change is not shown: a probe's operator
/// approved a real agent's 40 KB write blind, then was asked again.
#[tokio::test]
async fn a_permission_whose_announcement_was_too_long_says_its_change_is_not_shown() {
    const AGENT: &str = r#"
def on(m, method, mid):
    if method == "session/prompt":
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1", "update": {
              "sessionUpdate": "tool_call", "toolCallId": "t9", "title": "Write big.txt", "kind": "edit",
              "content": [{"type": "diff", "path": "big.txt", "oldText": None, "newText": "x" * 8000}]}}})
        ask_for("p1", "t9")
"#;
    let mut knobs = Knobs::default();
    knobs.limits.max_line_bytes = 4096;
    let h = Harness::new(knobs).await;
    let profile = h.python_agent(AGENT);
    h.start_req(h.request(profile, "go")).await.expect("start");
    let opened = h
        .until("the permission", |e| {
            matches!(e, OperatorEvent::RequestOpened { .. })
        })
        .await;
    let OperatorEvent::RequestOpened { request } = opened else {
        unreachable!()
    };
    assert!(request.diff.is_none(), "{request:?}");
    assert!(
        request.title.contains("its change is not shown")
            && request.title.contains("max_line_bytes"),
        "{}",
        request.title
    );
}

/// An unreadable request reusing the id of one still waiting is not
/// answered on that id: the agent would take the error for the waiting
/// request's answer, while the operator's decision came later as a second.
#[tokio::test]
async fn an_unreadable_request_is_not_answered_on_a_waiting_id() {
    const AGENT: &str = r#"
def on(m, method, mid):
    if method == "session/prompt":
        ask_for("p9", "t9")
        send({"jsonrpc": "2.0", "id": "p9", "method": "fs/write_text_file",
              "params": {"sessionId": "s1", "path": "big.txt", "content": "x" * 8000}})
        send({"jsonrpc": "2.0", "id": "p9", "method": 5})
    elif method is None:
        got = m.get("result") or m.get("error")
        chunk("answer %s: %s\n" % (mid, json.dumps(got, sort_keys=True)))
"#;
    let mut knobs = Knobs::default();
    knobs.limits.max_line_bytes = 4096;
    let h = Harness::new(knobs).await;
    let profile = h.python_agent(AGENT);
    let rec = h.start_req(h.request(profile, "go")).await.expect("start");
    h.until("the permission", |e| {
        matches!(e, OperatorEvent::RequestOpened { .. })
    })
    .await;
    let text = h.until_transcript(&rec.id, "method is not a string").await;
    decide_as(&h, &rec.id, "req-1", Choice::Reject, None, Caller::local())
        .await
        .expect("decided");
    let text = if text.contains("answer p9") {
        text
    } else {
        h.until_transcript(&rec.id, "answer p9").await
    };
    assert_eq!(text.matches("answer p9").count(), 1, "{text}");
    assert!(text.contains("answer None: {\"code\": -32600"), "{text}");
    assert!(text.contains(r#"answer p9: {"outcome""#), "{text}");
}

/// The transcript keeps the order things happened: agent text after a tool
/// call (or a notice) is an entry below it, not appended to the text block
/// above it (a probe's 40 tool calls all came after one block holding the
/// whole turn's narrative).
#[tokio::test]
async fn agent_text_after_a_tool_call_is_its_own_entry_below_it() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"turns": [[
        {"chunk": "before the tool"},
        {"tool_call": {"id": "t1", "title": "Read notes", "kind": "read", "status": "completed"}},
        {"chunk": "after the tool"}
    ]]});
    let rec = h.start(scenario, "go").await;
    h.until_transcript(&rec.id, "after the tool").await;
    let entries = h.transcript(&rec.id).await;
    let at = |needle: &str| {
        entries
            .iter()
            .position(|m| m.content.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in {entries:?}"))
    };
    let (before, tool, after) = (
        at("before the tool"),
        at("Read notes"),
        at("after the tool"),
    );
    assert!(before < tool && tool < after, "{entries:?}");
    assert!(
        !entries[before].content.contains("after the tool"),
        "{entries:?}"
    );
}

#[tokio::test]
async fn a_live_session_survives_garbage_from_its_agent() {
    let h = Harness::new(Knobs::default()).await;
    let scenario = json!({"protocol": "intercom", "turns": [[
        {"raw": "this is not json"},
        {"raw": "{\"method\": \"status/update\", \"params\": {"},
        {"raw": "[1, 2, 3]"},
        {"raw": "{\"method\": \"bogus/thing\", \"params\": {}}"},
        {"raw": "{\"method\": \"clearance/request\", \"id\": \"bad\", \"params\": {\"title\": \"t\"}}"},
        {"status": "still alive"},
        {"clearance": {"id": "req-002", "title": "Good", "file_path": "a.rs"}},
        {"status": "garbage turn done"}
    ]]});
    let rec = h.start(scenario, "go").await;
    h.until_transcript(&rec.id, "still alive").await;
    let req = until_opened(&h, &rec.id).await;
    // The bad clearance was skipped; the good one is the session's first.
    assert_eq!(req.request_id, "req-1");
    assert_eq!(req.wire_id.as_deref(), Some("\"req-002\""));
    decide_approve(&h, &rec.id).await;
    let text = h.until_transcript(&rec.id, "garbage turn done").await;
    assert!(text.contains("clearance req-002: approved"), "{text}");
    assert!(!text.contains("not json"), "{text}");
    let all = h
        .store
        .list_requests(Some(&rec.id), false)
        .await
        .expect("list");
    assert_eq!(all.len(), 1);
    let actor = ractor::call!(h.sup, |reply| SupervisorMsg::Lookup {
        id: rec.id.clone(),
        reply
    })
    .expect("lookup")
    .expect("live");
    let snap = ractor::call!(actor, SessionMsg::Snapshot).expect("snapshot");
    assert_eq!(snap.status, SessionStatus::Active);
    shutdown(&h).await;
}
