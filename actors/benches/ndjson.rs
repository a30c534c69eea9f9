//! NDJSON read throughput: our agent-stdout reader against a parse-only ceiling.
//!
//! Builds a realistic ACP stream in memory (about 70% `agent_message_chunk`
//! updates of 20-200 characters, 20% `tool_call` / `tool_call_update` with a
//! small diff, 10% `tool_call_update` carrying a 100 KiB diff) and measures
//!
//! * **reader**: `FrameReader<_, NdjsonCodec>` (the agent-stdout reader of
//!   `intercom_actors::pipes`) over an in-memory source that, like a pipe,
//!   hands out at most the buffer's spare capacity per read, then
//!   `RpcMessage::parse` on every frame (what the session actor gets);
//! * **ceiling**: `serde_json::from_slice::<Value>` on every line of the same
//!   buffer split on `\n` with `memchr` (no framing, no envelope handling).
//!
//! Each is run several times; best and median MB/s and messages/s are printed
//! with the reader/ceiling ratio. Run with
//! `cargo bench -p intercom-actors --bench ndjson`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use intercom_actors::pipes::FrameReader;
use intercom_actors::protocol::framing::{Frame, NdjsonCodec};
use intercom_actors::protocol::jsonrpc::RpcMessage;
use serde_json::{Value, json};

const MESSAGES: usize = 20_000;
const RUNS: usize = 5;
const BIG_DIFF: usize = 100 * 1024;
const MAX_LINE: usize = 1 << 20;

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below((hi - lo + 1) as u64) as usize
    }
}

const WORDS: &[&str] = &[
    "the",
    "session",
    "agent",
    "returns",
    "error",
    "handling",
    "module",
    "parser",
    "fn",
    "let",
    "match",
    "Result",
    "Ok(())",
    "self",
    "struct",
    "impl",
    "async",
    "await",
    "é",
    "✓",
    "\"quoted\"",
    "path/to/file.rs",
    "\\n",
    "tab\t",
    "and",
    "then",
    "we",
    "refactor",
    "test",
];

fn prose(rng: &mut Rng, len: usize) -> String {
    let mut s = String::with_capacity(len + 16);
    while s.chars().count() < len {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
    }
    s.chars().take(len).collect()
}

/// Code-like text of about `bytes` bytes, many short lines.
fn code(rng: &mut Rng, bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 128);
    let mut n = 0;
    while s.len() < bytes {
        n += 1;
        let indent = "    ".repeat(rng.range(0, 3));
        let len = rng.range(10, 70);
        let body = prose(rng, len);
        s.push_str(&format!("{indent}let v{n} = {body};\n"));
    }
    let mut cut = bytes;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s
}

fn update(session: &str, update: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": "session/update",
           "params": {"sessionId": session, "update": update}})
}

fn diff_content(path: &str, old: Option<&str>, new: &str) -> Value {
    json!([{"type": "diff", "path": path, "oldText": old, "newText": new}])
}

#[derive(Default, Clone, Copy)]
struct Mix {
    chunks: usize,
    small_tools: usize,
    big_tools: usize,
}

/// The whole stream, one JSON object per line.
fn build_stream() -> (Vec<u8>, Mix) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let session = "sess-4242-1";
    let mut out = Vec::new();
    let mut mix = Mix::default();
    for i in 0..MESSAGES {
        let roll = rng.below(100);
        let msg = if roll < 70 {
            mix.chunks += 1;
            let len = rng.range(20, 200);
            update(
                session,
                json!({"sessionUpdate": "agent_message_chunk",
                       "content": {"type": "text", "text": prose(&mut rng, len)}}),
            )
        } else if roll < 90 {
            mix.small_tools += 1;
            let id = format!("call_{i}");
            let path = format!("/work/ws/src/mod{}.rs", rng.below(50));
            if rng.below(2) == 0 {
                update(
                    session,
                    json!({"sessionUpdate": "tool_call", "toolCallId": id,
                           "title": format!("Edit {path}"), "kind": "edit", "status": "pending",
                           "locations": [{"path": path}]}),
                )
            } else {
                let (old_len, new_len) = (rng.range(80, 400), rng.range(80, 400));
                let old = code(&mut rng, old_len);
                let new = code(&mut rng, new_len);
                update(
                    session,
                    json!({"sessionUpdate": "tool_call_update", "toolCallId": id,
                           "status": "completed",
                           "content": diff_content(&path, Some(&old), &new)}),
                )
            }
        } else {
            mix.big_tools += 1;
            let path = format!("/work/ws/src/generated{}.rs", rng.below(10));
            let new = code(&mut rng, BIG_DIFF);
            update(
                session,
                json!({"sessionUpdate": "tool_call_update", "toolCallId": format!("call_{i}"),
                       "status": "completed", "content": diff_content(&path, None, &new)}),
            )
        };
        serde_json::to_writer(&mut out, &msg).expect("serialise");
        out.push(b'\n');
    }
    (out, mix)
}

/// Our reader: framing + JSON-RPC envelope parse. Returns messages seen.
async fn run_reader(buf: &[u8]) -> usize {
    let mut frames = FrameReader::new(buf, NdjsonCodec::new(MAX_LINE));
    let mut n = 0;
    while let Some(frame) = frames.next_frame().await.expect("framing") {
        match frame {
            Frame::Message(body) => {
                let msg = RpcMessage::parse(&body).expect("valid message");
                black_box(&msg);
                n += 1;
            }
            Frame::Oversized { len, .. } => panic!("unexpected oversized frame of {len} bytes"),
        }
    }
    n
}

/// The ceiling: split on LF (the same SIMD search the codec uses) and parse
/// each line into a `Value`.
fn run_ceiling(buf: &[u8]) -> usize {
    let mut n = 0;
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', buf) {
        let line = &buf[start..end];
        start = end + 1;
        if line.is_empty() {
            continue;
        }
        let v: Value = serde_json::from_slice(line).expect("valid JSON");
        black_box(&v);
        n += 1;
    }
    n
}

struct Stats {
    best: Duration,
    median: Duration,
}

fn stats(mut times: Vec<Duration>) -> Stats {
    times.sort();
    Stats {
        best: times[0],
        median: times[times.len() / 2],
    }
}

fn mb_per_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

fn per_s(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn main() {
    let t0 = Instant::now();
    let (buf, mix) = build_stream();
    let bytes = buf.len();
    println!(
        "ndjson stream: {MESSAGES} messages, {:.1} MB ({} text chunks, {} small tool updates, {} x 100 KiB diffs); built in {:.2?}",
        bytes as f64 / 1e6,
        mix.chunks,
        mix.small_tools,
        mix.big_tools,
        t0.elapsed()
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");

    let mut reader = Vec::with_capacity(RUNS);
    let mut ceiling = Vec::with_capacity(RUNS);
    // One warm-up each, then alternate so drift hits both equally.
    assert_eq!(rt.block_on(run_reader(&buf)), MESSAGES);
    assert_eq!(run_ceiling(&buf), MESSAGES);
    for _ in 0..RUNS {
        let t = Instant::now();
        let n = rt.block_on(run_reader(black_box(&buf)));
        reader.push(t.elapsed());
        assert_eq!(n, MESSAGES);

        let t = Instant::now();
        let n = run_ceiling(black_box(&buf));
        ceiling.push(t.elapsed());
        assert_eq!(n, MESSAGES);
    }
    let r = stats(reader);
    let c = stats(ceiling);

    println!();
    println!(
        "{:<40} {:>10} {:>10} {:>12} {:>12}",
        "", "best MB/s", "med MB/s", "best msg/s", "med msg/s"
    );
    for (name, s) in [
        ("reader (FrameReader+NdjsonCodec+parse)", &r),
        ("ceiling (memchr split + from_slice)", &c),
    ] {
        println!(
            "{:<40} {:>10.1} {:>10.1} {:>12.0} {:>12.0}",
            name,
            mb_per_s(bytes, s.best),
            mb_per_s(bytes, s.median),
            per_s(MESSAGES, s.best),
            per_s(MESSAGES, s.median),
        );
    }
    println!(
        "{:<40} {:>10.2} {:>10.2}",
        "ratio reader/ceiling",
        c.best.as_secs_f64() / r.best.as_secs_f64(),
        c.median.as_secs_f64() / r.median.as_secs_f64(),
    );
    println!();
    println!(
        "{RUNS} runs each (after one warm-up); total {:.1?}",
        t0.elapsed()
    );
}
