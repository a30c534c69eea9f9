//! Message framing on an agent's stdio.
//!
//! Agents write one JSON object per line (NDJSON, the ACP default) or, when a
//! profile says `framing = "lsp"`, LSP-style `Content-Length` frames. Both
//! codecs enforce a maximum frame size. An over-long frame is not an error
//! that ends the stream: it is reported as [`Frame::Oversized`] and skipped,
//! so one runaway message cannot take a session down. We deliberately do not
//! use `LinesCodec`, whose over-long-line handling yields a spurious `None`
//! that a reader would mistake for end of stream.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::model::Framing;

/// One decoded unit from the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A complete message body (without delimiter or headers).
    Message(Bytes),
    /// A frame longer than the limit was skipped; `len` is its size in bytes.
    Oversized {
        /// Bytes skipped.
        len: usize,
        /// Its first [`HEAD_BYTES`] bytes (or fewer, when they did not
        /// arrive before the limit was passed): enough to find the id of a
        /// request, whose answer the agent would otherwise wait for.
        head: Bytes,
    },
}

/// How much of an oversized frame is kept in [`Frame::Oversized`].
pub const HEAD_BYTES: usize = 512;

/// The first [`HEAD_BYTES`] of `bytes`.
fn head_of(bytes: &[u8]) -> Bytes {
    Bytes::copy_from_slice(&bytes[..bytes.len().min(HEAD_BYTES)])
}

/// A framing failure the stream cannot recover from.
#[derive(Debug, thiserror::Error)]
pub enum FramingError {
    /// Reading or writing the pipe failed.
    #[error("agent pipe I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// An LSP header block was unparseable, so frame boundaries are lost.
    #[error("bad LSP frame header: {0}")]
    BadHeader(String),
    /// The stream ended inside an LSP frame.
    #[error("the agent's output ended inside a frame: only {0} arrived")]
    Truncated(String),
}

/// Newline-delimited JSON with a maximum line length.
#[derive(Debug, Clone)]
pub struct NdjsonCodec {
    max: usize,
    /// Where to resume the newline search in the buffer.
    scanned: usize,
    /// Bytes of an over-long line dropped so far; `Some` while discarding.
    discarding: Option<usize>,
    /// The start of the line being discarded.
    discarded_head: Bytes,
    /// Whether the last dropped byte was `\r` (not part of the line's length).
    dropped_cr: bool,
}

impl NdjsonCodec {
    /// A codec that accepts lines of at most `max` bytes (excluding `\n`).
    pub fn new(max: usize) -> Self {
        NdjsonCodec {
            max,
            scanned: 0,
            discarding: None,
            discarded_head: Bytes::new(),
            dropped_cr: false,
        }
    }
}

impl Decoder for NdjsonCodec {
    type Item = Frame;
    type Error = FramingError;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FramingError> {
        loop {
            let newline = memchr::memchr(b'\n', &buf[self.scanned..]);
            let Some(offset) = newline else {
                self.scanned = buf.len();
                // +1: a line of exactly `max` bytes may still get its `\r`.
                if buf.len() > self.max + 1 {
                    // Drop what we have; remember how much for the report,
                    // and how the line began.
                    if self.discarding.is_none() {
                        self.discarded_head = head_of(buf);
                    }
                    *self.discarding.get_or_insert(0) += buf.len();
                    self.dropped_cr = buf.last() == Some(&b'\r');
                    buf.clear();
                    self.scanned = 0;
                }
                return Ok(None);
            };
            let end = self.scanned + offset;
            self.scanned = 0;
            if let Some(dropped) = self.discarding.take() {
                let cr = if end > 0 {
                    buf[end - 1] == b'\r'
                } else {
                    self.dropped_cr
                };
                buf.advance(end + 1);
                return Ok(Some(Frame::Oversized {
                    len: dropped + end - usize::from(cr),
                    head: std::mem::take(&mut self.discarded_head),
                }));
            }
            let mut line = buf.split_to(end + 1);
            line.truncate(end);
            if line.last() == Some(&b'\r') {
                line.truncate(end - 1);
            }
            if line.len() > self.max {
                return Ok(Some(Frame::Oversized {
                    len: line.len(),
                    head: head_of(&line),
                }));
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue; // blank lines carry nothing
            }
            return Ok(Some(Frame::Message(line.freeze())));
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FramingError> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        self.scanned = 0;
        if let Some(dropped) = self.discarding.take() {
            let len = dropped + buf.len();
            buf.clear();
            return Ok(Some(Frame::Oversized {
                len,
                head: std::mem::take(&mut self.discarded_head),
            }));
        }
        if buf.is_empty() {
            return Ok(None);
        }
        // A final line without a trailing newline is still a message.
        let line = buf.split();
        if line.len() > self.max {
            return Ok(Some(Frame::Oversized {
                len: line.len(),
                head: head_of(&line),
            }));
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        Ok(Some(Frame::Message(line.freeze())))
    }
}

impl Encoder<Bytes> for NdjsonCodec {
    type Error = FramingError;

    fn encode(&mut self, item: Bytes, dst: &mut BytesMut) -> Result<(), FramingError> {
        dst.reserve(item.len() + 1);
        dst.extend_from_slice(&item);
        dst.extend_from_slice(b"\n");
        Ok(())
    }
}

/// Longest header block we accept before declaring the stream corrupt.
const MAX_HEADER_BYTES: usize = 8 * 1024;

/// LSP `Content-Length` framing with a maximum body size.
#[derive(Debug, Clone)]
pub struct LspCodec {
    max: usize,
    /// Body length of the frame whose headers were parsed.
    body_len: Option<usize>,
    /// Bytes still to skip of an over-long body.
    skipping: usize,
    /// Total size of the body being skipped (for the report).
    skipped_total: usize,
    /// The start of the body being skipped.
    skipped_head: Bytes,
}

impl LspCodec {
    /// A codec that accepts bodies of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        LspCodec {
            max,
            body_len: None,
            skipping: 0,
            skipped_total: 0,
            skipped_head: Bytes::new(),
        }
    }

    fn parse_headers(block: &[u8]) -> Result<usize, FramingError> {
        let text = std::str::from_utf8(block)
            .map_err(|_| FramingError::BadHeader("headers are not UTF-8".into()))?;
        let mut length = None;
        for line in text.split("\r\n").filter(|l| !l.is_empty()) {
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| FramingError::BadHeader(format!("no colon in {line:?}")))?;
            if name.trim().eq_ignore_ascii_case("content-length") {
                let n = value.trim().parse::<usize>().map_err(|_| {
                    FramingError::BadHeader(format!("Content-Length {value:?} is not a number"))
                })?;
                // Two lengths: which one the sender meant cannot be told,
                // and taking the last one put the stream out of step.
                if length.is_some_and(|first| first != n) {
                    return Err(FramingError::BadHeader(
                        "two different Content-Length headers in one frame".into(),
                    ));
                }
                length = Some(n);
            }
        }
        length.ok_or_else(|| FramingError::BadHeader("missing Content-Length".into()))
    }
}

/// A `Content-Length` this many times the limit is not an oversized
/// message to skip but a broken stream.
const ABSURD_FACTOR: usize = 64;

impl Decoder for LspCodec {
    type Item = Frame;
    type Error = FramingError;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FramingError> {
        if self.skipping > 0 {
            let n = self.skipping.min(buf.len());
            buf.advance(n);
            self.skipping -= n;
            if self.skipping > 0 {
                return Ok(None);
            }
            return Ok(Some(Frame::Oversized {
                len: std::mem::take(&mut self.skipped_total),
                head: std::mem::take(&mut self.skipped_head),
            }));
        }
        let body_len = match self.body_len {
            Some(n) => n,
            None => {
                let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                    if let Some(why) = not_lsp(buf) {
                        return Err(FramingError::BadHeader(why.into()));
                    }
                    if buf.len() > MAX_HEADER_BYTES {
                        return Err(FramingError::BadHeader(format!(
                            "no header terminator within {MAX_HEADER_BYTES} bytes"
                        )));
                    }
                    return Ok(None);
                };
                let n = Self::parse_headers(&buf[..end])?;
                if n > self.max.saturating_mul(ABSURD_FACTOR) {
                    // Skipping a terabyte would swallow the stream for good,
                    // silently: a length like that is a stream out of step.
                    return Err(FramingError::BadHeader(format!(
                        "Content-Length {n} is far past any message this server takes ({} bytes, limits.max_line_bytes); the stream is out of step",
                        self.max
                    )));
                }
                buf.advance(end + 4);
                if n > self.max {
                    self.skipping = n;
                    self.skipped_total = n;
                    self.skipped_head = head_of(&buf[..buf.len().min(n)]);
                    return self.decode(buf);
                }
                self.body_len = Some(n);
                n
            }
        };
        if buf.len() < body_len {
            buf.reserve(body_len - buf.len());
            return Ok(None);
        }
        self.body_len = None;
        Ok(Some(Frame::Message(buf.split_to(body_len).freeze())))
    }

    /// At the end of the stream a frame cut short is said to be, with how
    /// much of it came: it was "bytes remaining on stream", and the operator
    /// saw only an exit.
    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FramingError> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        let cut = match (self.body_len, self.skipping) {
            (Some(want), _) => Some(format!("{} of its {want}-byte body", buf.len())),
            (None, left) if left > 0 => Some(format!(
                "{} of its {}-byte body",
                self.skipped_total - left,
                self.skipped_total
            )),
            (None, _) if !buf.iter().all(u8::is_ascii_whitespace) => {
                Some(format!("{} bytes of its headers", buf.len()))
            }
            _ => None,
        };
        buf.clear();
        match cut {
            Some(what) => Err(FramingError::Truncated(what)),
            None => Ok(None),
        }
    }
}

impl Encoder<Bytes> for LspCodec {
    type Error = FramingError;

    fn encode(&mut self, item: Bytes, dst: &mut BytesMut) -> Result<(), FramingError> {
        let header = format!("Content-Length: {}\r\n\r\n", item.len());
        dst.reserve(header.len() + item.len());
        dst.extend_from_slice(header.as_bytes());
        dst.extend_from_slice(&item);
        Ok(())
    }
}

/// Either framing, chosen per agent profile.
#[derive(Debug, Clone)]
pub enum FrameCodec {
    /// One JSON object per line.
    Ndjson(NdjsonCodec),
    /// `Content-Length` frames.
    Lsp(LspCodec),
}

impl FrameCodec {
    /// The codec for a framing with the given size limit.
    pub fn new(framing: Framing, max: usize) -> Self {
        match framing {
            Framing::Ndjson => FrameCodec::Ndjson(NdjsonCodec::new(max)),
            Framing::Lsp => FrameCodec::Lsp(LspCodec::new(max)),
        }
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FramingError;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FramingError> {
        match self {
            FrameCodec::Ndjson(c) => c.decode(buf),
            FrameCodec::Lsp(c) => c.decode(buf),
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FramingError> {
        match self {
            FrameCodec::Ndjson(c) => c.decode_eof(buf),
            FrameCodec::Lsp(c) => c.decode_eof(buf),
        }
    }
}

impl Encoder<Bytes> for FrameCodec {
    type Error = FramingError;

    fn encode(&mut self, item: Bytes, dst: &mut BytesMut) -> Result<(), FramingError> {
        match self {
            FrameCodec::Ndjson(c) => c.encode(item, dst),
            FrameCodec::Lsp(c) => c.encode(item, dst),
        }
    }
}

/// Why what an agent wrote where LSP headers go is plainly no LSP frame:
/// said at once, with what to do, instead of waiting for 8 KiB of headers
/// that never end (an agent ending headers with a bare LF hung, then was
/// killed with no hint).
fn not_lsp(buf: &[u8]) -> Option<&'static str> {
    match buf.first() {
        Some(b'{' | b'[') => Some(
            "a frame starts with JSON, not a Content-Length header: the agent writes NDJSON; set framing = \"ndjson\" in its [[agent]] profile",
        ),
        _ if buf.windows(2).any(|w| w == b"\n\n") => {
            Some("headers end with a bare LF: LSP framing needs \\r\\n\\r\\n after the headers")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(
        codec: &mut impl Decoder<Item = Frame, Error = FramingError>,
        chunks: &[&[u8]],
    ) -> Vec<Frame> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            while let Some(f) = codec.decode(&mut buf).expect("decode") {
                out.push(f);
            }
        }
        while let Some(f) = codec.decode_eof(&mut buf).expect("eof") {
            out.push(f);
        }
        out
    }

    fn msg(s: &str) -> Frame {
        Frame::Message(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn batched_lines_in_one_read_are_separate_frames() {
        let got = decode_all(&mut NdjsonCodec::new(100), &[b"{\"a\":1}\n{\"b\":2}\n"]);
        assert_eq!(got, vec![msg("{\"a\":1}"), msg("{\"b\":2}")]);
    }

    #[test]
    fn a_line_split_across_reads_is_reassembled() {
        let got = decode_all(&mut NdjsonCodec::new(100), &[b"{\"a\"", b":1", b"}\r\n"]);
        assert_eq!(got, vec![msg("{\"a\":1}")]);
    }

    #[test]
    fn an_over_long_line_is_reported_and_the_next_line_survives() {
        let long = [b'x'; 50];
        let got = decode_all(
            &mut NdjsonCodec::new(10),
            &[&long[..20], &long[20..], b"\nok\n"],
        );
        // The report keeps how the line began (what had arrived when the
        // limit was passed).
        let head = Bytes::from_static(&[b'x'; 20]);
        assert_eq!(got, vec![Frame::Oversized { len: 50, head }, msg("ok")]);
    }

    /// An oversized LSP frame is skipped; a length no message could have
    /// is a broken stream, said at once (a probe's terabyte header
    /// swallowed everything after it, silently).
    #[test]
    fn an_absurd_content_length_is_a_broken_stream() {
        let mut codec = LspCodec::new(10);
        let mut buf = BytesMut::from(&b"Content-Length: 1000000000000\r\n\r\n{}"[..]);
        let err = codec.decode(&mut buf).expect_err("broken");
        assert!(err.to_string().contains("out of step"), "{err}");
        let mut codec = LspCodec::new(10);
        let mut buf = BytesMut::from(&b"Content-Length: 20\r\n\r\n01234567890123456789"[..]);
        assert_eq!(
            codec.decode(&mut buf).expect("skip"),
            Some(Frame::Oversized {
                len: 20,
                head: Bytes::from_static(b"01234567890123456789")
            })
        );
    }

    #[test]
    fn an_over_long_line_in_one_read_is_skipped() {
        let got = decode_all(&mut NdjsonCodec::new(4), &[b"123456789\nab\n"]);
        let head = Bytes::from_static(b"123456789");
        assert_eq!(got, vec![Frame::Oversized { len: 9, head }, msg("ab")]);
    }

    #[test]
    fn blank_lines_are_ignored_and_a_final_unterminated_line_counts() {
        let got = decode_all(&mut NdjsonCodec::new(100), &[b"\n\n  \nlast"]);
        assert_eq!(got, vec![msg("last")]);
    }

    #[test]
    fn lsp_frames_split_and_batched() {
        let body = b"{\"x\":1}";
        let mut wire = Vec::new();
        for _ in 0..2 {
            wire.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
            wire.extend_from_slice(body);
        }
        let (a, b) = wire.split_at(13);
        let got = decode_all(&mut LspCodec::new(100), &[a, b]);
        assert_eq!(got, vec![msg("{\"x\":1}"), msg("{\"x\":1}")]);
    }

    #[test]
    fn lsp_oversized_body_is_skipped() {
        let mut wire = b"Content-Length: 20\r\n\r\n".to_vec();
        wire.extend_from_slice(&[b'y'; 20]);
        wire.extend_from_slice(b"Content-Length: 2\r\n\r\n{}");
        let got = decode_all(&mut LspCodec::new(10), &[&wire[..30], &wire[30..]]);
        let head = Bytes::from_static(&[b'y'; 8]);
        assert_eq!(got, vec![Frame::Oversized { len: 20, head }, msg("{}")]);
    }

    #[test]
    fn an_lsp_frame_cut_by_the_end_of_the_stream_says_how_much_came() {
        let mut c = LspCodec::new(100);
        let mut buf = BytesMut::from(&b"Content-Length: 20\r\n\r\n{\"a\":"[..]);
        assert_eq!(c.decode(&mut buf).expect("decode"), None);
        let err = c.decode_eof(&mut buf).expect_err("cut short");
        assert_eq!(
            err.to_string(),
            "the agent's output ended inside a frame: only 5 of its 20-byte body arrived"
        );
        let mut c = LspCodec::new(100);
        let mut buf = BytesMut::from(&b"Content-Len"[..]);
        let err = c.decode_eof(&mut buf).expect_err("headers cut");
        assert!(err.to_string().contains("11 bytes of its headers"), "{err}");
        // A whole frame, then the end: nothing is wrong.
        let got = decode_all(&mut LspCodec::new(100), &[b"Content-Length: 2\r\n\r\n{}"]);
        assert_eq!(got, vec![msg("{}")]);
    }

    #[test]
    fn lsp_missing_length_is_an_error() {
        let mut buf = BytesMut::from(&b"Content-Type: x\r\n\r\n{}"[..]);
        assert!(matches!(
            LspCodec::new(10).decode(&mut buf),
            Err(FramingError::BadHeader(_))
        ));
    }

    #[test]
    fn lsp_two_different_lengths_are_an_error() {
        let mut buf = BytesMut::from(&b"Content-Length: 2\r\nContent-Length: 9\r\n\r\n{}"[..]);
        assert!(matches!(
            LspCodec::new(100).decode(&mut buf),
            Err(FramingError::BadHeader(why)) if why.contains("two different")
        ));
        // The same length twice is only redundant.
        let mut buf = BytesMut::from(&b"Content-Length: 2\r\ncontent-length: 2\r\n\r\n{}"[..]);
        assert!(matches!(LspCodec::new(100).decode(&mut buf), Ok(Some(_))));
    }

    #[test]
    fn what_is_plainly_not_lsp_is_said_at_once() {
        for (wire, says) in [
            (&b"{\"jsonrpc\":\"2.0\"}\n"[..], "NDJSON"),
            (&b"Content-Length: 2\n\n{}"[..], "bare LF"),
        ] {
            let mut buf = BytesMut::from(wire);
            match LspCodec::new(100).decode(&mut buf) {
                Err(FramingError::BadHeader(why)) => assert!(why.contains(says), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn encoders_frame_messages() {
        let mut dst = BytesMut::new();
        NdjsonCodec::new(10)
            .encode(Bytes::from_static(b"{}"), &mut dst)
            .expect("enc");
        assert_eq!(&dst[..], b"{}\n");
        let mut dst = BytesMut::new();
        LspCodec::new(10)
            .encode(Bytes::from_static(b"{}"), &mut dst)
            .expect("enc");
        assert_eq!(&dst[..], b"Content-Length: 2\r\n\r\n{}");
    }
}
