//! Message framing on stdin/stdout.
//!
//! This file exists to keep byte-level concerns (NDJSON lines vs LSP
//! `Content-Length` frames, flushing, broken pipes) away from the protocol
//! logic. Incoming messages are parsed on a dedicated reader thread and handed
//! to the logic thread over an `mpsc` channel; outgoing messages go through
//! [`Writer`], which flushes after every frame.

use std::io::{self, BufRead, BufReader, StdoutLock, Write};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;

use serde_json::Value;

use crate::scenario::Framing;

/// What the reader thread delivers to the logic thread.
#[derive(Debug)]
pub enum Inbound {
    /// A well-formed JSON value.
    Message(Value),
    /// Something that could not be parsed; the text describes it.
    Malformed(String),
    /// stdin reached end of file (or failed); nothing more will arrive.
    Eof,
}

/// Starts the stdin reader thread and returns the receiving end.
pub fn spawn_reader(framing: Framing) -> Receiver<Inbound> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut input = BufReader::new(io::stdin().lock());
        match framing {
            Framing::Ndjson => read_lines(&mut input, &tx),
            Framing::Lsp => read_frames(&mut input, &tx),
        }
        // The receiver may already be gone when the agent is exiting.
        let _ = tx.send(Inbound::Eof);
    });
    rx
}

fn read_lines(input: &mut impl BufRead, tx: &Sender<Inbound>) {
    let mut line = Vec::new();
    loop {
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => return eprintln!("scripted-agent: stdin read failed: {e}"),
        }
        let body = trim_line_end(&line);
        if body.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if tx.send(parse(body)).is_err() {
            return;
        }
    }
}

fn trim_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn read_frames(input: &mut impl BufRead, tx: &Sender<Inbound>) {
    loop {
        let inbound = match read_headers(input) {
            Ok(None) => return,
            Ok(Some(Some(len))) => read_body(input, len),
            Ok(Some(None)) => Inbound::Malformed("LSP frame without Content-Length".to_owned()),
            Err(e) => return eprintln!("scripted-agent: stdin read failed: {e}"),
        };
        let stop = matches!(inbound, Inbound::Eof);
        if tx.send(inbound).is_err() || stop {
            return;
        }
    }
}

/// Reads one header block. `Ok(None)` = clean EOF; `Ok(Some(len))` otherwise.
fn read_headers(input: &mut impl BufRead) -> io::Result<Option<Option<usize>>> {
    let mut length = None;
    let mut seen_any = false;
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(trim_line_end(&line)).into_owned();
        if text.is_empty() {
            if seen_any {
                return Ok(Some(length));
            }
            continue; // tolerate stray blank lines between frames
        }
        seen_any = true;
        if let Some((name, value)) = text.split_once(':')
            && name.trim().eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok();
        }
    }
}

fn read_body(input: &mut impl BufRead, len: usize) -> Inbound {
    let mut body = vec![0; len];
    match input.read_exact(&mut body) {
        Ok(()) => parse(&body),
        Err(_) => Inbound::Eof,
    }
}

fn parse(body: &[u8]) -> Inbound {
    match serde_json::from_slice(body) {
        Ok(value) => Inbound::Message(value),
        Err(e) => Inbound::Malformed(format!(
            "{e}: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        )),
    }
}

/// Writes framed messages to stdout, flushing after each one.
pub struct Writer {
    framing: Framing,
    out: StdoutLock<'static>,
}

impl Writer {
    pub fn new(framing: Framing) -> Self {
        Self {
            framing,
            out: io::stdout().lock(),
        }
    }

    /// Serialises and sends one JSON message.
    pub fn send(&mut self, message: &Value) {
        self.frame(message.to_string().as_bytes());
    }

    /// Sends `body` verbatim as one frame (line + `\n`, or LSP frame).
    pub fn frame(&mut self, body: &[u8]) {
        let mut buf = Vec::with_capacity(body.len() + 32);
        match self.framing {
            Framing::Ndjson => {
                buf.extend_from_slice(body);
                buf.push(b'\n');
            }
            Framing::Lsp => {
                buf.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
                buf.extend_from_slice(body);
            }
        }
        if let Err(e) = self.out.write_all(&buf).and_then(|()| self.out.flush()) {
            write_failed(&e);
        }
    }
}

/// stdout is gone: a broken pipe means the server went away (exit 0).
fn write_failed(e: &io::Error) -> ! {
    eprintln!("scripted-agent: stdout write failed: {e}");
    let code = if e.kind() == io::ErrorKind::BrokenPipe {
        0
    } else {
        2
    };
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(framing: Framing, input: &[u8]) -> Vec<Inbound> {
        let (tx, rx) = mpsc::channel();
        let mut reader = BufReader::new(input);
        match framing {
            Framing::Ndjson => read_lines(&mut reader, &tx),
            Framing::Lsp => read_frames(&mut reader, &tx),
        }
        drop(tx);
        rx.iter().collect()
    }

    #[test]
    fn ndjson_skips_blank_lines_and_reports_malformed() {
        let got = collect(Framing::Ndjson, b"{\"a\":1}\r\n\n not json\n{\"b\":2}");
        assert_eq!(got.len(), 3);
        assert!(matches!(&got[0], Inbound::Message(v) if v["a"] == 1));
        assert!(matches!(&got[1], Inbound::Malformed(_)));
        assert!(matches!(&got[2], Inbound::Message(v) if v["b"] == 2));
    }

    #[test]
    fn lsp_frames_parse_back_to_back() {
        let input =
            b"Content-Length: 7\r\n\r\n{\"a\":1}content-length:7\r\nX-Other: y\r\n\r\n{\"b\":2}";
        let got = collect(Framing::Lsp, input);
        assert_eq!(got.len(), 2);
        assert!(matches!(&got[1], Inbound::Message(v) if v["b"] == 2));
    }

    #[test]
    fn lsp_truncated_body_is_eof() {
        let got = collect(Framing::Lsp, b"Content-Length: 70\r\n\r\n{\"a\"");
        assert!(matches!(got.as_slice(), [Inbound::Eof]));
    }
}
