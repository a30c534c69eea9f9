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
//! stopped answering until it let go. So a full house sheds: the connection
//! that has been silent longest (at least [`SHED_AFTER`]) is closed to make
//! room for the new one. Whoever is talking keeps their place; a flood of
//! silent sockets only ever displaces itself (or a client's idle keep-alive
//! connection, which it opens again).
//!
//! Silence is not the only way to hold a place: a probe's slowloris (8,400
//! connections each sending one header byte every 0.7 s) was never silent
//! for a second, so nothing was shed and `/healthz` timed out for as long
//! as it ran. So when nobody has been silent long enough, a full house
//! sheds the connection that has been sending a request longest without
//! being answered (at least [`TRICKLE_AFTER`]): a real client's request
//! arrives in milliseconds, and one waiting for its answer is silent.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// How long a connection may pass no bytes either way before it is closed.
pub const IDLE: std::time::Duration = std::time::Duration::from_secs(300);

/// A connection silent for less than this is never shed to make room (it
/// may be in the middle of a request).
pub const SHED_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// A connection that has been sending for this long without an answer may
/// be shed to make room when nobody is silent (a trickled request).
pub const TRICKLE_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// `Place::unanswered_since` when the client has sent nothing since the
/// server last wrote.
const ANSWERED: u64 = u64::MAX;

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
/// byte, since when it has been sending without an answer, and how to close
/// it to make room.
#[derive(Debug)]
struct Place {
    /// Milliseconds since the listener started, at the last byte.
    last_active: AtomicU64,
    /// Milliseconds since the listener started, at the first byte read
    /// after the server last wrote ([`ANSWERED`]: none since).
    unanswered_since: AtomicU64,
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

    /// Closes one open connection to make room: the one silent longest (at
    /// least `shed_after`), else the one sending a request longest without
    /// an answer (at least `trickle_after`).
    fn shed_one(&mut self) {
        self.places.retain(|w| w.strong_count() > 0);
        let now = self.started.elapsed().as_millis() as u64;
        let silent = self.longest(now, self.shed_after, |p| &p.last_active);
        let (why, found) = match silent {
            Some(found) => ("silent longest", found),
            None => match self.longest(now, self.trickle_after, |p| &p.unanswered_since) {
                Some(found) => ("sending a request longest without finishing it", found),
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

    /// The open connection whose `since` is oldest, when it is at least
    /// `at_least` ago.
    fn longest(
        &self,
        now: u64,
        at_least: std::time::Duration,
        since: impl Fn(&Place) -> &AtomicU64,
    ) -> Option<(u64, Arc<Place>)> {
        let limit = at_least.as_millis() as u64;
        self.places
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|p| !p.shed.is_cancelled())
            .map(|p| (since(&p).load(Ordering::Relaxed), p))
            .filter(|(at, _)| *at != ANSWERED && now.saturating_sub(*at) >= limit)
            .min_by_key(|(at, _)| *at)
    }
}

impl Listener for BoundedListener {
    type Io = Bounded;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Bounded, SocketAddr) {
        let permit = self.place().await;
        let (io, addr) = Listener::accept(&mut self.inner).await;
        let place = Arc::new(Place {
            last_active: AtomicU64::new(self.started.elapsed().as_millis() as u64),
            unanswered_since: AtomicU64::new(ANSWERED),
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

    /// Bytes read: the client is sending (a request begins, if it was
    /// answered).
    fn read_some(&mut self) {
        let at = self.touch();
        let since = &self.clock.place.unanswered_since;
        if since.load(Ordering::Relaxed) == ANSWERED {
            since.store(at, Ordering::Relaxed);
        }
    }

    /// Bytes written: the client is being answered.
    fn wrote_some(&mut self) {
        self.touch();
        self.clock
            .place
            .unanswered_since
            .store(ANSWERED, Ordering::Relaxed);
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
                    self.read_some();
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

    /// A full house where nobody is silent sheds the connection that has
    /// been sending a request longest without an answer (a slowloris kept
    /// `/healthz` from answering); one that was answered keeps its place.
    #[tokio::test]
    async fn a_full_house_of_talkers_sheds_the_longest_unanswered_request() {
        use tokio::io::AsyncReadExt;
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let mut listener = BoundedListener::new(tcp, 2);
        // Nobody counts as silent; any unanswered request may be shed.
        listener.shed_after = std::time::Duration::from_secs(3600);
        listener.trickle_after = std::time::Duration::ZERO;
        let mut c1 = TcpStream::connect(addr).await.expect("c1");
        let (mut s1, _) = listener.accept().await;
        let mut c2 = TcpStream::connect(addr).await.expect("c2");
        let (mut s2, _) = listener.accept().await;
        let mut one = [0u8; 1];
        // c1 trickles a request that is never answered...
        c1.write_all(b"G").await.expect("a byte");
        s1.read_exact(&mut one).await.expect("read");
        // ...c2 sent one and was answered.
        c2.write_all(b"G").await.expect("a byte");
        s2.read_exact(&mut one).await.expect("read");
        s2.write_all(b"H").await.expect("answer");
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
        assert!(!second.is_finished(), "the answered one keeps its place");
        second.abort();
    }

    /// A full house sheds the connection silent longest to let a new one
    /// in: an agent holding thousands of silent sockets made `/healthz`
    /// stop answering. The one that spoke last keeps its place.
    #[tokio::test]
    async fn a_full_house_sheds_the_connection_silent_longest() {
        use tokio::io::AsyncReadExt;
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let mut listener = BoundedListener::new(tcp, 2);
        listener.shed_after = std::time::Duration::ZERO;
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
