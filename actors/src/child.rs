//! An agent CLI as a child process.
//!
//! Spawning puts the agent in its own process group with a cleared
//! environment plus an allowlist, so secrets in the server's environment (the
//! Slack tokens, the API token) never reach it, and so the whole tree can be
//! signalled at once. Three tasks serve the pipes: a reader that frames
//! stdout, a writer that is the only writer to stdin, and a stderr drain that
//! keeps the last 64 KiB for crash reports (an unread pipe would block the
//! child). None of them keeps a buffer while its pipe is idle (see
//! [`crate::pipes`]): hundreds of idle sessions would otherwise hold tens of
//! KiB each. A fourth task reaps the process. Everything they observe is handed
//! to the owner through a callback as [`ChildEvent`]s, so this module knows
//! nothing about actors.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::process::{ChildStdin, Command};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::codec::Encoder;

use crate::model::Framing;
use crate::pipes::{self, FrameReader};
use crate::protocol::framing::{Frame, FrameCodec, FramingError};

/// Variables every agent gets (when the server has them).
pub const BASE_ENV_ALLOWLIST: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR", "TZ",
    "SHELL",
];

/// How long the reaper waits for stdout/stderr to drain after an exit.
const PIPE_DRAIN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Bytes of stderr kept for crash reports.
pub const STDERR_TAIL_BYTES: usize = 64 * 1024;

/// What to start.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// Profile id (for messages).
    pub profile: String,
    /// Executable.
    pub command: String,
    /// Static arguments.
    pub args: Vec<String>,
    /// Working directory (the workspace).
    pub cwd: PathBuf,
    /// Extra variable names to pass through.
    pub env_passthrough: Vec<String>,
    /// Framing on stdio.
    pub framing: Framing,
    /// Largest accepted frame.
    pub max_frame: usize,
    /// Most bytes waiting to be written to its stdin
    /// ([`stdin_backlog_for`]).
    pub max_backlog: usize,
}

/// Frames read from the agent but not yet handled by the session. When the
/// session falls behind, the reader stops reading, the pipe fills and the
/// agent blocks on its own writes: nothing is dropped and memory stays
/// bounded (at most this many frames of `max_line_bytes` each).
pub const INBOUND_FRAMES_IN_FLIGHT: usize = 64;

/// Most bytes queued for an agent's stdin and not yet written, each
/// message counted with [`QUEUED_MESSAGE_COST`]. An agent that stops
/// reading while it keeps asking (a probe's 400 file reads a second) had
/// every answer queued: the server grew by 40 MB a second. Past this, a
/// send is refused with [`SendRefused::NotReading`]. An agent that reads
/// has at most 8 file reads of `limits.max_read_bytes` in flight; 16 MiB
/// waiting is one that does not.
pub const STDIN_BACKLOG_BYTES: usize = 16 * 1024 * 1024;

/// The stdin backlog for an agent whose file reads answer up to
/// `max_read_bytes` each: [`STDIN_BACKLOG_BYTES`], or twice its eight reads
/// in flight when the operator allows bigger reads.
pub fn stdin_backlog_for(max_read_bytes: usize) -> usize {
    STDIN_BACKLOG_BYTES.max(max_read_bytes.saturating_mul(16))
}

/// What one queued message costs besides its bytes (its queue node, its
/// buffer's header): a probe's 356,000 small refusals held 130 MB while
/// their payloads counted 61 MiB.
pub const QUEUED_MESSAGE_COST: usize = 128;

/// Why a message could not be queued for the agent's stdin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendRefused {
    /// The writer has stopped (the pipe broke, or stdin was closed).
    #[error("the agent's stdin is closed (it exited or stopped reading); restart the session")]
    Closed,
    /// The agent is not reading: too much already waits to be written.
    #[error(
        "the agent is not reading its input: {} MiB of messages wait to be written to it",
        queued / (1024 * 1024)
    )]
    NotReading {
        /// Bytes waiting.
        queued: usize,
    },
}

/// One unit of the reader's window: dropping it (when the frame has been
/// handled) lets the reader take the next frame from the pipe.
#[derive(Debug)]
pub struct Credit(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

impl Credit {
    /// A credit that bounds nothing (frames built by hand, tests).
    pub fn none() -> Self {
        Credit(None)
    }
}

/// Something the child's pipes or the reaper observed.
#[derive(Debug)]
pub enum ChildEvent {
    /// A frame from stdout, with the credit that bounds the reader.
    Frame(Frame, Credit),
    /// stdout reached end of file.
    StdoutClosed,
    /// stdout failed (or framing was lost).
    ReadFailed(String),
    /// Writing to stdin failed (broken pipe).
    WriteFailed(String),
    /// A message sent with [`AgentChild::send_tracked`] was written to
    /// stdin and flushed (the agent can read it now).
    Written(u64),
    /// The process exited.
    Exited {
        /// Exit code, when it exited normally.
        code: Option<i32>,
        /// Signal, when it was killed.
        signal: Option<i32>,
    },
}

/// Why an agent could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The executable does not exist.
    #[error(
        "agent command `{command}` (profile `{profile}`) was not found; install it or fix `command` in its [[agent]] profile"
    )]
    NotFound {
        /// Profile.
        profile: String,
        /// Command.
        command: String,
    },
    /// The OS refused to start it.
    #[error("cannot start agent `{profile}` (`{command}`): {reason}")]
    Failed {
        /// Profile.
        profile: String,
        /// Command.
        command: String,
        /// OS error.
        reason: String,
    },
}

/// The last bytes the child wrote to stderr.
///
/// A lock, not a message: the stderr drain task appends and the session
/// reads it once, when the agent failed, to quote it. A bounded ring of
/// bytes with one writer needs no actor of its own.
#[derive(Debug, Default, Clone)]
pub struct StderrTail(Arc<Mutex<VecDeque<u8>>>);

impl StderrTail {
    fn push(&self, chunk: &[u8]) {
        if let Ok(mut buf) = self.0.lock() {
            buf.extend(chunk);
            let excess = buf.len().saturating_sub(STDERR_TAIL_BYTES);
            buf.drain(..excess);
        }
    }

    /// The tail as text (lossy), trimmed to at most `max` trailing bytes.
    pub fn text(&self, max: usize) -> String {
        let Ok(buf) = self.0.lock() else {
            return String::new();
        };
        let skip = buf.len().saturating_sub(max);
        let bytes: Vec<u8> = buf.iter().skip(skip).copied().collect();
        plain_text(&String::from_utf8_lossy(&bytes))
            .trim()
            .to_owned()
    }
}

/// Agent stderr as the operator should see it: terminal escape sequences
/// (colours, cursor moves) removed, other control characters dropped.
pub fn plain_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // CSI: parameters, then one final byte in @..~.
                for f in chars.by_ref() {
                    if ('@'..='~').contains(&f) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else if !c.is_control() || c == '\n' || c == '\t' {
            out.push(c);
        }
    }
    out
}

enum WriterCmd {
    /// Bytes to write, with the token to confirm once they are written.
    Send(Bytes, Option<u64>),
    Close,
}

/// A running agent process.
pub struct AgentChild {
    pid: i32,
    /// Its start time, to tell it from a later process with the same pid.
    started: Option<u64>,
    writer: mpsc::UnboundedSender<WriterCmd>,
    /// Bytes queued for the writer and not yet written.
    backlog: Arc<AtomicUsize>,
    /// Past this, sends are refused ([`ChildSpec::max_backlog`]).
    max_backlog: usize,
    /// Its stderr tail.
    pub stderr: StderrTail,
}

impl std::fmt::Debug for AgentChild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentChild")
            .field("pid", &self.pid)
            .finish()
    }
}

fn resolve_command(command: &str) -> PathBuf {
    let path = Path::new(command);
    if command.contains('/') && path.is_relative() {
        // Relative to the server, not to the agent's working directory.
        if let Ok(cwd) = std::env::current_dir() {
            return cwd.join(path);
        }
    }
    path.to_path_buf()
}

fn build_command(spec: &ChildSpec) -> Command {
    let mut cmd = Command::new(resolve_command(&spec.command));
    cmd.args(&spec.args)
        .current_dir(&spec.cwd)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let extra = spec.env_passthrough.iter().map(String::as_str);
    for name in BASE_ENV_ALLOWLIST.iter().copied().chain(extra) {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
    cmd
}

/// A child's pipe end as a tokio pipe, which can be waited on without a
/// buffer (see [`crate::pipes`]).
/// Why `spec` could not be spawned, said for the operator.
fn spawn_error(spec: &ChildSpec, e: &std::io::Error) -> SpawnError {
    match e.kind() {
        // The kernel says "not found" for a missing working directory too.
        std::io::ErrorKind::NotFound if !spec.cwd.is_dir() => SpawnError::Failed {
            profile: spec.profile.clone(),
            command: spec.command.clone(),
            reason: format!(
                "its working directory {} does not exist",
                spec.cwd.display()
            ),
        },
        std::io::ErrorKind::NotFound => SpawnError::NotFound {
            profile: spec.profile.clone(),
            command: spec.command.clone(),
        },
        _ => SpawnError::Failed {
            profile: spec.profile.clone(),
            command: spec.command.clone(),
            reason: e.to_string(),
        },
    }
}

/// Waits for the child's exit and reports it, only after its last output
/// was handled, so a final message or stderr line is never lost to the race
/// between the reaper and the readers (grandchildren may hold the pipes
/// open, hence the bound).
async fn reap(
    mut child: tokio::process::Child,
    reader: tokio::task::JoinHandle<()>,
    drain: tokio::task::JoinHandle<()>,
    events: Arc<dyn Fn(ChildEvent) + Send + Sync>,
) {
    let status = child.wait().await;
    let readers = [reader.abort_handle(), drain.abort_handle()];
    let drained = tokio::time::timeout(PIPE_DRAIN_GRACE, async {
        let _ = reader.await;
        let _ = drain.await;
    })
    .await;
    // A descendant that left the group still holds the pipes: stop reading
    // them, which closes our ends (the reader went on reading and
    // discarding for the server's lifetime).
    if drained.is_err() {
        readers.iter().for_each(tokio::task::AbortHandle::abort);
    }
    let (code, signal) = match status {
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            (s.code(), s.signal())
        }
        Err(_) => (None, None),
    };
    events(ChildEvent::Exited { code, signal });
}

fn pipe_receiver(fd: std::io::Result<OwnedFd>) -> std::io::Result<pipe::Receiver> {
    pipe::Receiver::from_owned_fd(fd?)
}

/// The reader task: hands each frame to the owner with a credit, and stops
/// reading while [`INBOUND_FRAMES_IN_FLIGHT`] frames are unhandled.
async fn read_frames(
    mut frames: FrameReader<pipe::Receiver, FrameCodec>,
    events: Arc<dyn Fn(ChildEvent) + Send + Sync>,
) {
    let window = Arc::new(Semaphore::new(INBOUND_FRAMES_IN_FLIGHT));
    loop {
        // Wait for the session to catch up before reading more.
        let Ok(credit) = window.clone().acquire_owned().await else {
            break;
        };
        match frames.next_frame().await {
            Ok(Some(frame)) => events(ChildEvent::Frame(frame, Credit(Some(credit)))),
            Err(e) => {
                events(ChildEvent::ReadFailed(e.to_string()));
                break;
            }
            Ok(None) => {
                events(ChildEvent::StdoutClosed);
                break;
            }
        }
    }
}

/// The writer task, the only writer to stdin: each message is framed into
/// a buffer of its own size, written and flushed (no buffer is kept between
/// messages). Dropping `stdin` at the end closes it.
async fn write_frames(
    mut stdin: ChildStdin,
    mut codec: FrameCodec,
    mut rx: mpsc::UnboundedReceiver<WriterCmd>,
    backlog: Arc<AtomicUsize>,
    events: Arc<dyn Fn(ChildEvent) + Send + Sync>,
) {
    while let Some(cmd) = rx.recv().await {
        match cmd {
            WriterCmd::Send(bytes, token) => {
                backlog.fetch_sub(bytes.len() + QUEUED_MESSAGE_COST, Ordering::Relaxed);
                let mut out = BytesMut::new();
                let written = match codec.encode(bytes, &mut out) {
                    Ok(()) => async {
                        stdin.write_all(&out).await?;
                        stdin.flush().await
                    }
                    .await
                    .map_err(|e| FramingError::Io(e).to_string()),
                    Err(e) => Err(e.to_string()),
                };
                if let Err(e) = written {
                    events(ChildEvent::WriteFailed(e));
                    return;
                }
                if let Some(token) = token {
                    events(ChildEvent::Written(token));
                }
            }
            WriterCmd::Close => break,
        }
    }
}

impl AgentChild {
    /// Starts the agent and its pipe tasks; events go to `on_event`.
    pub fn spawn(
        spec: &ChildSpec,
        on_event: impl Fn(ChildEvent) + Send + Sync + 'static,
    ) -> Result<AgentChild, SpawnError> {
        let mut child = build_command(spec)
            .spawn()
            .map_err(|e| spawn_error(spec, &e))?;
        let failed = |what: &str| SpawnError::Failed {
            profile: spec.profile.clone(),
            command: spec.command.clone(),
            reason: format!("no {what} pipe"),
        };
        let pid = child.id().ok_or_else(|| failed("pid"))? as i32;
        let stdin = child.stdin.take().ok_or_else(|| failed("stdin"))?;
        let stdout = child.stdout.take().ok_or_else(|| failed("stdout"))?;
        let stderr = child.stderr.take().ok_or_else(|| failed("stderr"))?;
        let on_event: Arc<dyn Fn(ChildEvent) + Send + Sync> = Arc::new(on_event);

        let unreadable = |what: &str, e: std::io::Error| SpawnError::Failed {
            profile: spec.profile.clone(),
            command: spec.command.clone(),
            reason: format!("cannot read the agent's {what}: {e}"),
        };
        let stdout = pipe_receiver(stdout.into_owned_fd()).map_err(|e| unreadable("stdout", e))?;
        let stderr = pipe_receiver(stderr.into_owned_fd()).map_err(|e| unreadable("stderr", e))?;
        let codec = FrameCodec::new(spec.framing, spec.max_frame);
        let events = on_event.clone();
        let reader = tokio::spawn(read_frames(FrameReader::new(stdout, codec), events));

        let (tx, rx) = mpsc::unbounded_channel::<WriterCmd>();
        let codec = FrameCodec::new(spec.framing, spec.max_frame);
        let events = on_event.clone();
        let backlog = Arc::new(AtomicUsize::new(0));
        tokio::spawn(write_frames(stdin, codec, rx, backlog.clone(), events));

        let tail = StderrTail::default();
        let sink = tail.clone();
        let drain = tokio::spawn(pipes::drain(stderr, move |chunk| sink.push(chunk)));

        tokio::spawn(reap(child, reader, drain, on_event));

        let started = start_time(pid);
        live_groups().insert(pid, started);
        Ok(AgentChild {
            pid,
            started,
            writer: tx,
            backlog,
            max_backlog: spec.max_backlog,
            stderr: tail,
        })
    }

    /// The process (and process group) id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Queues one message for stdin. Fails when the writer has stopped, or
    /// when its backlog is full (the agent is not reading).
    pub fn send(&self, bytes: Bytes) -> Result<(), SendRefused> {
        self.send_message(bytes, None)
    }

    /// Queues one message for stdin; [`ChildEvent::Written`] with `token`
    /// follows once it was written and flushed, [`ChildEvent::WriteFailed`]
    /// if it could not be. What was never confirmed never reached the agent.
    pub fn send_tracked(&self, bytes: Bytes, token: u64) -> Result<(), SendRefused> {
        self.send_message(bytes, Some(token))
    }

    fn send_message(&self, bytes: Bytes, token: Option<u64>) -> Result<(), SendRefused> {
        let len = bytes.len() + QUEUED_MESSAGE_COST;
        let queued = self.backlog.fetch_add(len, Ordering::Relaxed);
        if queued > 0 && queued + len > self.max_backlog {
            self.backlog.fetch_sub(len, Ordering::Relaxed);
            return Err(SendRefused::NotReading { queued });
        }
        self.writer
            .send(WriterCmd::Send(bytes, token))
            .map_err(|_| {
                self.backlog.fetch_sub(len, Ordering::Relaxed);
                SendRefused::Closed
            })
    }

    /// Closes stdin after everything queued so far is written.
    pub fn close_stdin(&self) {
        let _ = self.writer.send(WriterCmd::Close);
    }

    /// Signals the whole process group.
    pub fn signal_group(&self, signal: i32) {
        signal_group(self.pid, signal);
    }

    /// The agent's descendants now, with their start times
    /// ([`crate::process_tree::snapshot`]); empty when the pid no longer
    /// names the agent. Read on a blocking thread: the walk reads all of
    /// `/proc`, which is no work for a runtime worker (and many stops at
    /// once then share their scans).
    pub async fn descendants(&self) -> Vec<(i32, u64)> {
        let (pid, started) = (self.pid, self.started);
        tokio::task::spawn_blocking(move || crate::process_tree::snapshot(pid, started))
            .await
            .unwrap_or_default()
    }

    /// SIGKILLs the process group and every descendant that left it
    /// ([`crate::process_tree`]).
    pub fn kill(&self) {
        crate::process_tree::kill_tree(self.pid, self.started);
    }
}

/// The agent never outlives its handle: whatever path drops it (a normal
/// stop, a failed start, a session actor that panicked and skipped
/// `post_stop`), its process group and its descendants are SIGKILLed.
impl Drop for AgentChild {
    fn drop(&mut self) {
        self.kill();
        live_groups().remove(&self.pid);
    }
}

/// The process groups of the agents this process runs now.
///
/// Why: a server told to exit at once (a second SIGINT/SIGTERM) skips every
/// session's stop, and its agents would run on unsupervised until the next
/// start found them. [`kill_every_agent_group`] is what that exit still
/// does. A plain map behind a lock: the exit path is synchronous and has no
/// actor left to ask. Each group by its leader's pid, with the leader's
/// start time.
static LIVE_GROUPS: Mutex<std::collections::BTreeMap<i32, Option<u64>>> =
    Mutex::new(std::collections::BTreeMap::new());

fn live_groups() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<i32, Option<u64>>> {
    LIVE_GROUPS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// SIGKILLs the process group of every agent this process runs (for an
/// immediate exit), never a group whose id a recycled pid took over (see
/// [`kill_orphan_group`]); returns how many groups it signalled.
pub fn kill_every_agent_group() -> usize {
    let groups = live_groups();
    groups
        .iter()
        .filter(|&(&pgid, &started)| match started {
            Some(started) => kill_orphan_group(pgid, started),
            None => {
                signal_group(pgid, libc::SIGKILL);
                true
            }
        })
        .count()
}

/// Whether `pid` is the group of an agent this process runs now.
pub fn is_live_agent_group(pid: i32) -> bool {
    live_groups().contains_key(&pid)
}

/// Sends `signal` to process group `pgid` (ignoring "no such process").
pub fn signal_group(pgid: i32, signal: i32) {
    if pgid > 0 {
        // SAFETY: kill(2) with a negative pid signals a process group; it has
        // no memory-safety preconditions.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// When process `pid` started (clock ticks since boot, `/proc/<pid>/stat`
/// field 22); `None` when it does not exist. Pairs with the pid to recognise
/// a process across a server restart without trusting a recycled pid.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may contain spaces and ')'.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Kills the process group of a previous server's agent. The group is
/// recognised by its leader's pid and start time; when the leader is gone but
/// the group still has members, the pgid cannot have been reused (Linux does
/// not hand out a pid that is still some group's id), so it is the same
/// group. A leader with another start time is a recycled pid: left alone.
/// Returns whether it signalled anything.
pub fn kill_orphan_group(pid: i32, start: u64) -> bool {
    if pid <= 0 {
        return false;
    }
    let ours = match start_time(pid) {
        Some(t) => t == start,
        None => group_alive(pid),
    };
    if ours {
        signal_group(pid, SIGKILL);
    }
    ours
}

/// True while any process of group `pgid` exists.
pub fn group_alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    pgid > 0 && unsafe { libc::kill(-pgid, 0) } == 0
}

pub use libc::{SIGKILL, SIGTERM};

#[cfg(test)]
mod tests {

    #[test]
    fn stderr_is_shown_without_terminal_escapes() {
        assert_eq!(
            plain_text("2026 [\u{1b}[32minfo\u{1b}[39m]: Starting\u{7}\n\u{1b}]0;t"),
            "2026 [info]: Starting\n0;t"
        );
    }

    use super::*;
    use std::time::Duration;

    fn spec(command: &str, args: &[&str]) -> ChildSpec {
        ChildSpec {
            profile: "test".into(),
            command: command.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            cwd: std::env::temp_dir(),
            env_passthrough: vec![],
            framing: Framing::Ndjson,
            max_frame: 1024,
            max_backlog: STDIN_BACKLOG_BYTES,
        }
    }

    #[tokio::test]
    async fn missing_binary_is_a_clear_error() {
        let err =
            AgentChild::spawn(&spec("/nonexistent/agent-bin", &[]), |_| {}).expect_err("spawn");
        assert!(matches!(err, SpawnError::NotFound { .. }));
        assert!(err.to_string().contains("/nonexistent/agent-bin"));
    }

    #[tokio::test]
    async fn a_running_agent_is_listed_for_an_immediate_exit_until_dropped() {
        let child = AgentChild::spawn(&spec("sleep", &["30"]), |_| {}).expect("spawn");
        let pid = child.pid();
        assert!(is_live_agent_group(pid));
        drop(child);
        assert!(!is_live_agent_group(pid));
    }

    /// An agent that does not read its stdin: what is sent to it waits in
    /// the server, so past [`STDIN_BACKLOG_BYTES`] a send is refused (the
    /// session then ends the agent), and the wait shrinks once it reads.
    #[tokio::test]
    async fn an_agent_that_does_not_read_its_input_is_refused_more() {
        let child = AgentChild::spawn(&spec("sleep", &["30"]), |_| {}).expect("spawn");
        let mib = Bytes::from(vec![b'x'; 1024 * 1024]);
        let mut sent = 0;
        let refused = loop {
            match child.send(mib.clone()) {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
            assert!(sent <= 200, "never refused after {sent} MiB");
        };
        assert!(
            matches!(refused, SendRefused::NotReading { queued } if queued <= STDIN_BACKLOG_BYTES),
            "{refused:?}"
        );
        assert!(sent >= STDIN_BACKLOG_BYTES / (1024 * 1024) - 1, "{sent}");
        assert!(
            refused.to_string().contains("not reading its input"),
            "{refused}"
        );
    }

    /// Small messages count what they hold besides their bytes: 356,000
    /// small refusals held 130 MB while their payloads counted 61 MiB.
    #[tokio::test]
    async fn small_messages_count_their_overhead() {
        let child = AgentChild::spawn(&spec("sleep", &["30"]), |_| {}).expect("spawn");
        let small = Bytes::from_static(b"{\"id\":1,\"error\":{}}");
        let mut sent = 0usize;
        while child.send(small.clone()).is_ok() {
            sent += 1;
            assert!(sent <= STDIN_BACKLOG_BYTES / 64, "never refused");
        }
        let per = small.len() + QUEUED_MESSAGE_COST;
        assert!(sent <= STDIN_BACKLOG_BYTES / per + 2, "{sent}");
    }

    #[tokio::test]
    async fn a_missing_working_directory_is_not_called_a_missing_binary() {
        let mut s = spec("true", &[]);
        s.cwd = std::env::temp_dir().join("agent-intercom-no-such-dir-4f1e");
        let err = AgentChild::spawn(&s, |_| {}).expect_err("spawn");
        assert!(matches!(err, SpawnError::Failed { .. }), "{err}");
        assert!(err.to_string().contains("working directory"), "{err}");
    }

    #[tokio::test]
    async fn frames_stderr_and_exit_are_reported() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let child = AgentChild::spawn(
            &spec("sh", &["-c", "echo '{\"a\":1}'; echo oops >&2; exit 3"]),
            move |e| {
                let _ = tx.send(e);
            },
        )
        .expect("spawn");
        let mut saw_frame = false;
        let mut exit = None;
        while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            match ev {
                ChildEvent::Frame(Frame::Message(b), _) => saw_frame = &b[..] == b"{\"a\":1}",
                ChildEvent::Exited { code, .. } => {
                    exit = code;
                    break;
                }
                _ => {}
            }
        }
        assert!(saw_frame);
        assert_eq!(exit, Some(3));
        // The drain may lag the reaper by a moment; poll briefly.
        for _ in 0..100 {
            if child.stderr.text(100) == "oops" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(child.stderr.text(100), "oops");
    }

    #[tokio::test]
    async fn environment_is_cleared_except_the_allowlist() {
        // SAFETY: test-only; no other thread reads this variable.
        unsafe { std::env::set_var("SLACK_BOT_TOKEN", "xoxb-secret") };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _child = AgentChild::spawn(
            &spec(
                "sh",
                &[
                    "-c",
                    "echo \"{\\\"t\\\":\\\"${SLACK_BOT_TOKEN:-unset}\\\"}\"",
                ],
            ),
            move |e| {
                let _ = tx.send(e);
            },
        )
        .expect("spawn");
        let mut line = None;
        while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            if let ChildEvent::Frame(Frame::Message(b), _) = ev {
                line = Some(String::from_utf8_lossy(&b).into_owned());
                break;
            }
        }
        assert_eq!(line.as_deref(), Some("{\"t\":\"unset\"}"));
    }

    #[tokio::test]
    async fn a_session_that_falls_behind_stops_the_reader_without_dropping_frames() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _child = AgentChild::spawn(
            &spec(
                "sh",
                &[
                    "-c",
                    "i=0; while [ $i -lt 500 ]; do echo \"{\\\"n\\\":$i}\"; i=$((i+1)); done",
                ],
            ),
            move |e| {
                let _ = tx.send(e);
            },
        )
        .expect("spawn");
        // Hold every credit: the reader may hand out exactly one window.
        let mut held = Vec::new();
        while held.len() < INBOUND_FRAMES_IN_FLIGHT {
            match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
                Ok(Some(ChildEvent::Frame(Frame::Message(_), credit))) => held.push(credit),
                other => panic!("expected a frame, got {other:?}"),
            }
        }
        // While held, nothing more arrives (the agent is blocked on the pipe).
        tokio::task::yield_now().await;
        let more = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await;
        assert!(more.is_err(), "the reader ran past its window: {more:?}");
        // Handling them (dropping the credits) lets every remaining frame through, in order.
        drop(held);
        let mut seen = INBOUND_FRAMES_IN_FLIGHT;
        while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            match ev {
                ChildEvent::Frame(Frame::Message(b), _) => {
                    assert_eq!(String::from_utf8_lossy(&b), format!("{{\"n\":{seen}}}"));
                    seen += 1;
                }
                ChildEvent::Exited { .. } => break,
                _ => {}
            }
        }
        assert_eq!(seen, 500);
    }
}
