//! Message framing on stdin/stdout.
//!
//! This file exists to keep byte-level concerns (NDJSON lines vs LSP
//! `Content-Length` frames, flushing, broken pipes) away from the protocol
//! logic. Incoming messages are parsed on a dedicated reader thread and handed
//! to the logic thread over an `mpsc` channel; outgoing messages go through
//! [`Writer`], which flushes after every frame. The reader waits in `poll` on
//! stdin and a wake pipe, so a scenario can make it close stdin for good
//! ([`close_stdin`]): the server's next write then fails with a broken pipe
//! while the agent stays up. An idle agent does not wake at all.

use std::io::{self, BufRead, BufReader, Read, StdoutLock, Write};
use std::os::fd::RawFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::{Duration, Instant};

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
        let mut input = BufReader::new(PolledStdin);
        match framing {
            Framing::Ndjson => read_lines(&mut input, &tx),
            Framing::Lsp => read_frames(&mut input, &tx),
        }
        if stdin_closed_by_scenario() {
            // No end of input for the logic thread: the agent stays up,
            // waiting for messages that can no longer come.
            loop {
                thread::park();
            }
        }
        // The receiver may already be gone when the agent is exiting.
        let _ = tx.send(Inbound::Eof);
    });
    rx
}

/// Set by [`close_stdin`]; the reader closes fd 0 when it sees it.
static CLOSE_REQUESTED: AtomicBool = AtomicBool::new(false);
/// Set by the reader once fd 0 is closed.
static STDIN_CLOSED: AtomicBool = AtomicBool::new(false);
/// A pipe [`close_stdin`] writes to, so the reader, blocked in `poll` on
/// stdin and this pipe, wakes for a close request. (It used to poll every
/// 20 ms instead: hundreds of idle agents then woke 50 times a second each
/// and took a core from the server the load bench measures.)
static WAKE: OnceLock<Option<(RawFd, RawFd)>> = OnceLock::new();

/// The wake pipe's (read, write) ends, made on first use.
fn wake_pipe() -> Option<(RawFd, RawFd)> {
    *WAKE.get_or_init(|| {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        let made = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
        (made == 0).then_some((fds[0], fds[1]))
    })
}

/// Closes stdin for good (the read end of the pipe), waiting up to a second
/// for the reader thread to do it; true once it is closed.
pub fn close_stdin() -> bool {
    CLOSE_REQUESTED.store(true, Ordering::SeqCst);
    if let Some((_, write_end)) = wake_pipe() {
        // SAFETY: one byte from a valid buffer to our own pipe.
        let _ = unsafe { libc::write(write_end, [1u8].as_ptr().cast(), 1) };
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while !STDIN_CLOSED.load(Ordering::SeqCst) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    STDIN_CLOSED.load(Ordering::SeqCst)
}

/// True once [`close_stdin`] closed stdin (end of input is then expected).
pub fn stdin_closed_by_scenario() -> bool {
    STDIN_CLOSED.load(Ordering::SeqCst)
}

/// fd 0, read only when `poll` says there is data, so a close request is
/// noticed between reads (a thread blocked in `read` would keep the pipe's
/// read end open).
struct PolledStdin;

impl Read for PolledStdin {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let wake = wake_pipe();
        loop {
            if CLOSE_REQUESTED.load(Ordering::SeqCst) {
                // SAFETY: closing fd 0, which only this thread reads.
                unsafe { libc::close(0) };
                STDIN_CLOSED.store(true, Ordering::SeqCst);
                return Err(io::Error::other("stdin closed by the scenario"));
            }
            let mut fds = [
                libc::pollfd {
                    fd: 0,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: wake.map_or(-1, |(read_end, _)| read_end),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // Without a wake pipe (pipe2 failed), look for a close request
            // every 20 ms as before.
            let timeout = if wake.is_some() { -1 } else { 20 };
            // SAFETY: two valid pollfds (a negative fd is ignored by poll).
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
            if ready < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if fds[0].revents == 0 {
                continue;
            }
            // SAFETY: `buf` is valid for `buf.len()` bytes.
            let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
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

    /// Writes `bytes` with no framing at all (to break the framing).
    pub fn unframed(&mut self, bytes: &[u8]) {
        if let Err(e) = self.out.write_all(bytes).and_then(|()| self.out.flush()) {
            write_failed(&e);
        }
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
