//! Accepting HTTP connections within a bound.
//!
//! Why this exists: every open connection holds a file descriptor, and the
//! server's descriptors are shared with what it must never lose: agents'
//! pipes, SQLite's files, the listener itself. A probe that opened 20,000
//! idle connections (or held 19,950 blocking MCP calls) took every
//! descriptor: `/healthz` stopped answering and new agents could not start.
//! So at most [`limit`] connections are open at once; past that the server
//! stops accepting, and new connections wait in the kernel's backlog until
//! one closes, instead of failing with "too many open files" wherever a
//! descriptor was needed next. A connection with no bytes in either
//! direction for [`IDLE`] is closed (axum's `serve` sets no hyper timer, so
//! nothing else would close a client that connects and never speaks). Event
//! streams are not idle: they send a keep-alive every 15 s.
//!
//! The bound alone let anyone who can connect hold every place: an agent (it
//! runs on this machine) opened 8,321 silent connections and `/healthz`
//! stopped answering until it let go. So a full house sheds: it closes one
//! connection to make room for the new one (which one, below), and a flood
//! of sockets only ever displaces itself, or a client's idle keep-alive
//! connection, which it opens again.
//!
//! Silence is not the only way to hold a place: a probe's slowloris (8,400
//! connections each sending one header byte every 0.7 s) was never silent
//! for a second, so nothing was shed and `/healthz` timed out for as long
//! as it ran. And silence is not always waste: a request waiting for its
//! answer (a start waits for its agent's handshake) is silent, and shedding
//! it first failed a request that had worked. So the listener follows each
//! connection's request heads (it looks for the blank line that ends one;
//! it parses nothing else) and a full house sheds, in this order:
//! - the connection that has been owing a complete request head longest,
//!   for at least [`TRICKLE_AFTER`] (a real client's head arrives in
//!   milliseconds; one that connects and never speaks owes one too);
//! - else the answered connection silent longest, for at least
//!   [`SHED_AFTER`] (an idle keep-alive connection, which its client opens
//!   again; a quiet event stream, which reconnects);
//! - never one whose request head is complete: it is sending its body or
//!   waiting for the server. A body that never ends is bounded elsewhere
//!   (`body.rs`: [`crate::http::body::BODY_DEADLINE`]).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// How long a connection may pass no bytes either way before it is closed.
pub const IDLE: std::time::Duration = std::time::Duration::from_secs(300);

/// An answered connection silent for less than this is never shed to make
/// room (its client may be about to send its next request).
pub const SHED_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// A connection that has owed a complete request head for less than this
/// is never shed to make room (its head may be on its way).
pub const TRICKLE_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// Where a connection is in its current request, as far as bytes tell.
const OWES_HEAD: u8 = 0;
/// Its request head is complete: it sends its body or waits for the server.
const HEAD_DONE: u8 = 1;
/// The server wrote (an answer, or a stream) and the client sent nothing
/// since.
const ANSWERED: u8 = 2;

/// The shortest list of places that is swept of closed connections.
const SWEEP_MIN: usize = 64;

/// How often a full listener that found nobody to shed looks again.
const RECHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// The fewest connections allowed, whatever the descriptor limit.
const MIN_CONNECTIONS: usize = 256;
/// The most connections allowed, whatever the descriptor limit.
const MAX_CONNECTIONS: usize = 8192;

/// How many connections may be open at once: half the process's descriptor
/// limit (the other half stays for agents and storage), within
/// [`MIN_CONNECTIONS`]..=[`MAX_CONNECTIONS`].
pub fn limit() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
    } else {
        1024
    };
    (soft / 2).clamp(MIN_CONNECTIONS, MAX_CONNECTIONS)
}

/// What the listener knows of one open connection: when it last passed a
/// byte, where it is in its request and since when it owes a head, and how
/// to close it to make room. Written only by the connection's I/O.
#[derive(Debug)]
struct Place {
    /// Milliseconds since the listener started, at the last byte.
    last_active: AtomicU64,
    /// [`OWES_HEAD`], [`HEAD_DONE`] or [`ANSWERED`].
    phase: AtomicU8,
    /// Milliseconds since the listener started, when it began to owe a
    /// request head (accepted, or its first byte after an answer).
    head_since: AtomicU64,
    /// Cancelled to shed the connection.
    shed: CancellationToken,
}

/// A TCP listener that holds one permit per open connection.
#[derive(Debug)]
pub struct BoundedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    idle: std::time::Duration,
    shed_after: std::time::Duration,
    trickle_after: std::time::Duration,
    /// The open connections, oldest first (dropped ones are swept out).
    places: Vec<Weak<Place>>,
    started: tokio::time::Instant,
    shed_count: u64,
    /// `places` is swept of closed connections when it reaches this length.
    sweep_at: usize,
}

impl BoundedListener {
    /// At most `max` connections of `inner` open at once.
    pub fn new(inner: TcpListener, max: usize) -> Self {
        BoundedListener {
            inner,
            permits: Arc::new(Semaphore::new(max.max(1))),
            idle: IDLE,
            shed_after: SHED_AFTER,
            trickle_after: TRICKLE_AFTER,
            places: Vec::new(),
            started: tokio::time::Instant::now(),
            shed_count: 0,
            sweep_at: SWEEP_MIN,
        }
    }

    /// A permit for one more connection: at once when there is room, else
    /// after shedding one ([`Self::shed_one`]), else when one closes.
    async fn place(&mut self) -> OwnedSemaphorePermit {
        loop {
            if let Ok(p) = self.permits.clone().try_acquire_owned() {
                return p;
            }
            self.shed_one();
            tokio::select! {
                p = self.permits.clone().acquire_owned() => {
                    // The semaphore is never closed.
                    if let Ok(p) = p {
                        return p;
                    }
                }
                () = tokio::time::sleep(RECHECK) => {}
            }
        }
    }

    /// Closes one open connection to make room (the order is in the module
    /// doc): the one owing a request head longest, else the answered one
    /// silent longest; never one whose request head is complete.
    fn shed_one(&mut self) {
        self.places.retain(|w| w.strong_count() > 0);
        let now = self.started.elapsed().as_millis() as u64;
        let owing = self.longest(now, OWES_HEAD, self.trickle_after, |p| &p.head_since);
        let (why, found) = match owing {
            Some(found) => ("owing a request head longest", found),
            None => match self.longest(now, ANSWERED, self.shed_after, |p| &p.last_active) {
                Some(found) => ("answered and silent longest", found),
                None => return,
            },
        };
        let (at, place) = found;
        place.shed.cancel();
        self.shed_count += 1;
        if self.shed_count == 1 || self.shed_count.is_multiple_of(1000) {
            tracing::warn!(
                shed = self.shed_count,
                for_ms = now.saturating_sub(at),
                "every connection place is taken: closing the connection {why} to let a new one in"
            );
        }
    }

    /// The open connection in `phase` whose `since` is oldest, when it is
    /// at least `at_least` ago.
    fn longest(
        &self,
        now: u64,
        phase: u8,
        at_least: std::time::Duration,
        since: impl Fn(&Place) -> &AtomicU64,
    ) -> Option<(u64, Arc<Place>)> {
        let limit = at_least.as_millis() as u64;
        self.places
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|p| !p.shed.is_cancelled() && p.phase.load(Ordering::Relaxed) == phase)
            .map(|p| (since(&p).load(Ordering::Relaxed), p))
            .filter(|(at, _)| now.saturating_sub(*at) >= limit)
            .min_by_key(|(at, _)| *at)
    }
}

impl Listener for BoundedListener {
    type Io = Bounded;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Bounded, SocketAddr) {
        let permit = self.place().await;
        let (io, addr) = Listener::accept(&mut self.inner).await;
        let at = self.started.elapsed().as_millis() as u64;
        let place = Arc::new(Place {
            last_active: AtomicU64::new(at),
            phase: AtomicU8::new(OWES_HEAD),
            head_since: AtomicU64::new(at),
            shed: CancellationToken::new(),
        });
        if self.places.len() >= self.sweep_at {
            // Amortised: closed connections leave only a dead `Weak` behind.
            self.places.retain(|w| w.strong_count() > 0);
            self.sweep_at = (self.places.len() * 2).max(SWEEP_MIN);
        }
        self.places.push(Arc::downgrade(&place));
        let clock = Clock {
            started: self.started,
            place,
        };
        (Bounded::new(io, permit, self.idle, clock), addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A connection's place as the listener sees it.
#[derive(Debug)]
struct Clock {
    started: tokio::time::Instant,
    place: Arc<Place>,
}

/// A connection; its permit is given back when it closes.
#[derive(Debug)]
pub struct Bounded {
    io: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle: std::time::Duration,
    /// When the connection counts as idle: pushed back by every byte.
    deadline: Pin<Box<tokio::time::Sleep>>,
    clock: Clock,
    /// Ready once the listener sheds this connection to make room.
    shed: Pin<Box<WaitForCancellationFutureOwned>>,
    /// How far the bytes read have got towards the blank line that ends a
    /// request head.
    head_end: HeadEnd,
}

/// Finds the blank line ending an HTTP/1 request head (`\r\n\r\n`, or bare
/// `\n\n`) across reads. The HTTP/2 preface has one too.
#[derive(Debug, Default, Clone, Copy)]
struct HeadEnd {
    /// 0: in a line; 1: just after a `\n`; 2: after `\n\r`.
    after_newline: u8,
}

impl HeadEnd {
    fn reset(&mut self) {
        self.after_newline = 0;
    }

    /// True once `bytes` complete the blank line.
    fn found_in(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            self.after_newline = match (b, self.after_newline) {
                (b'\n', 1 | 2) => {
                    self.after_newline = 0;
                    return true;
                }
                (b'\n', _) => 1,
                (b'\r', 1) => 2,
                (b'\r', n) => n,
                _ => 0,
            };
        }
        false
    }
}

impl Bounded {
    fn new(
        io: TcpStream,
        permit: OwnedSemaphorePermit,
        idle: std::time::Duration,
        clock: Clock,
    ) -> Self {
        let shed = Box::pin(clock.place.shed.clone().cancelled_owned());
        Bounded {
            io,
            _permit: permit,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
            clock,
            shed,
            head_end: HeadEnd::default(),
        }
    }

    /// Bytes passed: the idle clock starts again. Answers when (ms since
    /// the listener started).
    fn touch(&mut self) -> u64 {
        let now = tokio::time::Instant::now();
        self.deadline.as_mut().reset(now + self.idle);
        let at = now.duration_since(self.clock.started).as_millis() as u64;
        self.clock.place.last_active.store(at, Ordering::Relaxed);
        at
    }

    /// Bytes read: after an answer they begin a new request head; while
    /// one is owed, they are looked through for the blank line ending it.
    fn read_some(&mut self, bytes: &[u8]) {
        let at = self.touch();
        let place = &self.clock.place;
        let mut phase = place.phase.load(Ordering::Relaxed);
        if phase == ANSWERED {
            phase = OWES_HEAD;
            self.head_end.reset();
            place.head_since.store(at, Ordering::Relaxed);
            place.phase.store(OWES_HEAD, Ordering::Relaxed);
        }
        if phase == OWES_HEAD && self.head_end.found_in(bytes) {
            place.phase.store(HEAD_DONE, Ordering::Relaxed);
        }
    }

    /// Bytes written: the client is being answered.
    fn wrote_some(&mut self) {
        self.touch();
        self.clock.place.phase.store(ANSWERED, Ordering::Relaxed);
    }

    /// A write's outcome: bytes written restart the idle clock; a write
    /// that would wait is subject to it ([`Bounded::waiting`]).
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match written {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.wrote_some();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending => self.waiting(cx),
            ready => ready,
        }
    }

    /// For an operation that would wait: an error once the connection was
    /// idle too long, else keep waiting (woken by the I/O or the deadline).
    fn waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if self.shed.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room: every connection place was taken and this one was silent longest",
            )));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection idle too long",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Bounded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.read_some(&buf.filled()[before..]);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => self.waiting(cx),
            ready => ready,
        }
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(cx, written)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn the_limit_is_within_its_bounds() {
        let n = limit();
        assert!((MIN_CONNECTIONS..=MAX_CONNECTIONS).contains(&n), "{n}");
    }

    /// A client that connects and never speaks is closed once idle, and
    /// its place freed; bytes keep a connection open.
    #[tokio::test]
    async fn a_silent_connection_is_closed_once_idle() {
        use tokio::io::AsyncReadExt;
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let mut listener = BoundedListener::new(tcp, 1);
        listener.idle = std::time::Duration::from_millis(200);
        let mut client = TcpStream::connect(addr).await.expect("connect");
        let (mut server_side, _) = listener.accept().await;
        client.write_all(b"x").await.expect("a byte");
        let mut one = [0u8; 1];
        server_side.read_exact(&mut one).await.expect("read");
        // Then silence: the next read fails with TimedOut, not waits forever.
        let err = server_side.read(&mut one).await.expect_err("idle");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        drop(server_side);
        assert_eq!(listener.permits.available_permits(), 1);
    }

    /// Past the bound a new connection is not accepted until one closes.
    #[tokio::test]
    async fn past_the_bound_accepting_waits_for_a_connection_to_close() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let mut listener = BoundedListener::new(tcp, 2);
        let _c1 = TcpStream::connect(addr).await.expect("c1");
        let _c2 = TcpStream::connect(addr).await.expect("c2");
        let _c3 = TcpStream::connect(addr).await.expect("c3 (kernel backlog)");
        let (first, _) = listener.accept().await;
        let (_second, _) = listener.accept().await;
        assert_eq!(listener.permits.available_permits(), 0);
        // The third waits: no permit is free.
        let third = tokio::time::timeout(std::time::Duration::from_millis(100), listener.accept());
        assert!(
            third.await.is_err(),
            "a third connection was accepted past the bound"
        );
        // Closing one lets the third in.
        let mut first = first;
        first.shutdown().await.expect("shutdown");
        drop(first);
        let (_third, _) = listener.accept().await;
        assert_eq!(listener.permits.available_permits(), 0);
    }

    /// Connects `n` clients and accepts them, in order.
    async fn connected(
        listener: &mut BoundedListener,
        addr: SocketAddr,
        n: usize,
    ) -> Vec<(TcpStream, Bounded)> {
        let mut pairs = Vec::new();
        for _ in 0..n {
            let client = TcpStream::connect(addr).await.expect("connect");
            let (server_side, _) = listener.accept().await;
            pairs.push((client, server_side));
        }
        pairs
    }

    /// Sends `bytes` from the client and reads them on the server's side.
    async fn send(pair: &mut (TcpStream, Bounded), bytes: &[u8]) {
        use tokio::io::AsyncReadExt;
        pair.0.write_all(bytes).await.expect("send");
        let mut got = vec![0u8; bytes.len()];
        pair.1.read_exact(&mut got).await.expect("read");
    }

    /// Whether the listener chose to shed the server's side of `pair`.
    fn shed(pair: &(TcpStream, Bounded)) -> bool {
        pair.1.clock.place.shed.is_cancelled()
    }

    /// A full house where nobody is silent sheds the connection that has
    /// owed a request head longest (a slowloris kept `/healthz` from
    /// answering), before an answered one that is silent.
    #[tokio::test]
    async fn a_full_house_sheds_the_request_head_owed_longest() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let mut listener = BoundedListener::new(tcp, 3);
        listener.shed_after = std::time::Duration::ZERO;
        listener.trickle_after = std::time::Duration::ZERO;
        let mut pairs = connected(&mut listener, addr, 3).await;
        // The first was answered and has been silent since...
        send(&mut pairs[0], b"GET / HTTP/1.1\r\n\r\n").await;
        pairs[0]
            .1
            .write_all(b"HTTP/1.1 200 OK\r\n\r\n")
            .await
            .expect("answer");
        // ...the second trickles a head it never finishes, and so does the
        // third, which began later.
        send(&mut pairs[1], b"GET / HTTP/1.1\r\nX-Slow: a").await;
        send(&mut pairs[2], b"GET /").await;
        listener.shed_one();
        assert!(shed(&pairs[1]), "the head owed longest goes first");
        assert!(!shed(&pairs[0]) && !shed(&pairs[2]));
        listener.shed_one();
        assert!(shed(&pairs[2]), "then the other owed head");
        assert!(!shed(&pairs[0]), "the answered one goes last");
        listener.shed_one();
        assert!(shed(&pairs[0]));
    }

    /// A connection whose request head is complete is never shed: it is
    /// waiting for its answer (a start waits for its agent's handshake) or
    /// sending its body. Shedding the silent one first failed a request that
    /// had worked.
    #[tokio::test]
    async fn a_request_waiting_for_its_answer_keeps_its_place() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let mut listener = BoundedListener::new(tcp, 2);
        listener.shed_after = std::time::Duration::ZERO;
        listener.trickle_after = std::time::Duration::ZERO;
        let mut pairs = connected(&mut listener, addr, 2).await;
        // Split across reads, and bare LF: complete heads all the same.
        send(&mut pairs[0], b"POST /api/sessions HTTP/1.1\r\n").await;
        send(&mut pairs[0], b"\r\n{\"prompt\"").await;
        send(&mut pairs[1], b"GET /api/events HTTP/1.1\n\n").await;
        listener.shed_one();
        assert!(!shed(&pairs[0]) && !shed(&pairs[1]));
    }

    #[test]
    fn the_end_of_a_head_is_found_across_reads() {
        let mut end = HeadEnd::default();
        assert!(!end.found_in(b"GET / HTTP/1.1\r\nHost: x\r"));
        assert!(!end.found_in(b"\n\r"));
        assert!(end.found_in(b"\nbody"));
        let mut end = HeadEnd::default();
        assert!(!end.found_in(b"a\r\nb\r\nc"));
        assert!(end.found_in(b"\n\n"));
    }

    /// A full house sheds a connection that never spoke to let a new one
    /// in (it owes a request head since it connected): an agent holding
    /// thousands of silent sockets made `/healthz` stop answering. Of two
    /// owing one, the older goes.
    #[tokio::test]
    async fn a_full_house_sheds_the_connection_silent_longest() {
        use tokio::io::AsyncReadExt;
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let mut listener = BoundedListener::new(tcp, 2);
        listener.shed_after = std::time::Duration::ZERO;
        listener.trickle_after = std::time::Duration::ZERO;
        let _c1 = TcpStream::connect(addr).await.expect("c1");
        let (mut s1, _) = listener.accept().await;
        let mut c2 = TcpStream::connect(addr).await.expect("c2");
        let (mut s2, _) = listener.accept().await;
        // c2 speaks; c1 stays silent.
        c2.write_all(b"x").await.expect("a byte");
        let mut one = [0u8; 1];
        s2.read_exact(&mut one).await.expect("read");
        let first = tokio::spawn(async move {
            let mut buf = [0u8; 1];
            s1.read(&mut buf).await
        });
        let second = tokio::spawn(async move {
            let mut buf = [0u8; 1];
            s2.read(&mut buf).await
        });
        let _c3 = TcpStream::connect(addr).await.expect("c3");
        let (_s3, _) = tokio::time::timeout(std::time::Duration::from_secs(5), listener.accept())
            .await
            .expect("the third got a place");
        let shed = first.await.expect("join").expect_err("c1 was shed");
        assert_eq!(shed.kind(), io::ErrorKind::ConnectionAborted);
        assert!(!second.is_finished(), "the one that spoke keeps its place");
        second.abort();
    }
}
