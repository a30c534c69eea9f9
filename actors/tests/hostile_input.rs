//! Hostile and malformed input for the protocol layers: arbitrary bytes at
//! random split points, invalid UTF-8, deep nesting, huge numbers and 10 MiB
//! lines. Properties: no panic, bounded memory, and the codecs agree with a
//! simple reference model of what the frames should be.

use bytes::{Bytes, BytesMut};
use intercom_actors::protocol::framing::{self, Frame, FramingError, LspCodec, NdjsonCodec};
use intercom_actors::protocol::intercom::DialectIn;
use intercom_actors::protocol::jsonrpc::RpcMessage;
use proptest::prelude::*;
use tokio_util::codec::{Decoder, Encoder};

/// What NDJSON framing should yield for `input` with limit `max`.
fn reference_ndjson(input: &[u8], max: usize) -> Vec<Frame> {
    let mut out = Vec::new();
    let mut parts: Vec<&[u8]> = input.split(|b| *b == b'\n').collect();
    let last = parts.pop().unwrap_or_default();
    let mut push = |line: &[u8], terminated: bool| {
        let line = if terminated && line.last() == Some(&b'\r') {
            &line[..line.len() - 1]
        } else {
            line
        };
        if line.len() > max {
            out.push(Frame::Oversized {
                len: line.len(),
                head: Bytes::new(),
            });
        } else if !line.iter().all(u8::is_ascii_whitespace) {
            out.push(Frame::Message(Bytes::copy_from_slice(line)));
        }
    };
    for p in parts {
        push(p, true);
    }
    push(last, false);
    out
}

fn decode_in_chunks(
    codec: &mut impl Decoder<Item = Frame, Error = FramingError>,
    input: &[u8],
    cuts: &[usize],
) -> Result<Vec<Frame>, FramingError> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    points.sort_unstable();
    points.push(input.len());
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut at = 0;
    for p in points {
        buf.extend_from_slice(&input[at..p]);
        at = p;
        while let Some(f) = codec.decode(&mut buf)? {
            out.push(f);
        }
    }
    while let Some(f) = codec.decode_eof(&mut buf)? {
        out.push(f);
    }
    Ok(out)
}

/// Merges what the codec reports for one over-long line split into pieces.
fn lengths(frames: &[Frame]) -> Vec<(bool, usize)> {
    frames
        .iter()
        .map(|f| match f {
            Frame::Message(b) => (true, b.len()),
            Frame::Oversized { len, .. } => (false, *len),
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn ndjson_matches_the_reference_at_any_split(
        input in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), Just(b' '), any::<u8>()], 0..600),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
        max in 1usize..64,
    ) {
        let got = decode_in_chunks(&mut NdjsonCodec::new(max), &input, &cuts).expect("ndjson never errors");
        let want = reference_ndjson(&input, max);
        // Over-long lines are only reported by length; messages must match exactly.
        prop_assert_eq!(lengths(&got), lengths(&want));
        let msgs = |v: &[Frame]| v.iter().filter(|f| matches!(f, Frame::Message(_))).cloned().collect::<Vec<_>>();
        prop_assert_eq!(msgs(&got), msgs(&want));
    }

    #[test]
    fn lsp_round_trips_at_any_split(
        bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..6),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let mut wire = BytesMut::new();
        let mut enc = LspCodec::new(1 << 20);
        for b in &bodies {
            enc.encode(Bytes::copy_from_slice(b), &mut wire).expect("encode");
        }
        let got = decode_in_chunks(&mut LspCodec::new(1 << 20), &wire, &cuts).expect("decode");
        let want: Vec<Frame> = bodies.iter().map(|b| Frame::Message(Bytes::copy_from_slice(b))).collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn lsp_garbage_never_panics(input in proptest::collection::vec(any::<u8>(), 0..2000), cuts in proptest::collection::vec(any::<usize>(), 0..6)) {
        let _ = decode_in_chunks(&mut LspCodec::new(512), &input, &cuts);
    }

    #[test]
    fn jsonrpc_and_dialect_parsing_never_panic(input in proptest::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(msg) = RpcMessage::parse(&input) {
            let _ = DialectIn::from_message(&msg);
            let _ = RpcMessage::parse(&msg.to_bytes()).expect("our own output parses");
        }
    }

    #[test]
    fn arbitrary_json_values_never_panic_the_dialect(v in arb_json()) {
        let line = serde_json::json!({"method": "clearance/request", "id": "r", "params": v}).to_string();
        if let Ok(msg) = RpcMessage::parse(line.as_bytes()) {
            let _ = DialectIn::from_message(&msg);
        }
        let line = serde_json::json!({"jsonrpc": "2.0", "id": v, "result": null}).to_string();
        let _ = RpcMessage::parse(line.as_bytes());
    }
}

fn arb_json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| serde_json::json!(f)),
        ".{0,20}".prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            proptest::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let depth = 100_000;
    let mut line = "[".repeat(depth);
    line.push_str(&"]".repeat(depth));
    assert!(RpcMessage::parse(line.as_bytes()).is_err());
    let obj = format!(
        "{{\"method\":\"x\",\"params\":{}}}",
        "{\"a\":".repeat(depth) + "1" + &"}".repeat(depth)
    );
    assert!(RpcMessage::parse(obj.as_bytes()).is_err());
}

#[test]
fn huge_numbers_are_handled() {
    let line = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":1}}",
        "9".repeat(400)
    );
    assert!(
        RpcMessage::parse(line.as_bytes()).is_err(),
        "a non-integer id is refused"
    );
    let line = format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":{{\"n\":{}}}}}",
        "9".repeat(400)
    );
    let err = RpcMessage::parse(line.as_bytes()).expect_err("out of range");
    assert!(err.to_string().contains("number out of range"), "{err}");
    let line = "{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":{\"n\":1e308,\"m\":18446744073709551615}}";
    assert!(RpcMessage::parse(line.as_bytes()).is_ok());
}

#[test]
fn a_ten_mib_line_is_skipped_with_bounded_memory() {
    let max = 1 << 20;
    let mut codec = NdjsonCodec::new(max);
    let mut buf = BytesMut::new();
    let chunk = vec![b'x'; 64 * 1024];
    let mut peak = 0;
    for _ in 0..160 {
        buf.extend_from_slice(&chunk);
        assert!(codec.decode(&mut buf).expect("decode").is_none());
        peak = peak.max(buf.len());
    }
    buf.extend_from_slice(b"\n{\"ok\":1}\n");
    assert_eq!(
        codec.decode(&mut buf).expect("decode"),
        Some(Frame::Oversized {
            len: 160 * 64 * 1024,
            head: Bytes::from(vec![b'x'; framing::HEAD_BYTES]),
        })
    );
    assert_eq!(
        codec.decode(&mut buf).expect("decode"),
        Some(Frame::Message(Bytes::from_static(b"{\"ok\":1}")))
    );
    assert!(peak <= max + chunk.len(), "buffer grew to {peak} bytes");
}

#[test]
fn invalid_utf8_is_a_parse_error() {
    assert!(RpcMessage::parse(b"{\"method\":\"\xff\xfe\"}").is_err());
}
