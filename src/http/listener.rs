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

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a connection may pass no bytes either way before it is closed.
pub const IDLE: std::time::Duration = std::time::Duration::from_secs(300);

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

/// A TCP listener that holds one permit per open connection.
#[derive(Debug)]
pub struct BoundedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    idle: std::time::Duration,
}

impl BoundedListener {
    /// At most `max` connections of `inner` open at once.
    pub fn new(inner: TcpListener, max: usize) -> Self {
        BoundedListener {
            inner,
            permits: Arc::new(Semaphore::new(max.max(1))),
            idle: IDLE,
        }
    }
}

impl Listener for BoundedListener {
    type Io = Bounded;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Bounded, SocketAddr) {
        // The semaphore is never closed, so acquiring only waits.
        let permit = loop {
            if let Ok(p) = self.permits.clone().acquire_owned().await {
                break p;
            }
        };
        let (io, addr) = Listener::accept(&mut self.inner).await;
        (Bounded::new(io, permit, self.idle), addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A connection; its permit is given back when it closes.
#[derive(Debug)]
pub struct Bounded {
    io: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle: std::time::Duration,
    /// When the connection counts as idle: pushed back by every byte.
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl Bounded {
    fn new(io: TcpStream, permit: OwnedSemaphorePermit, idle: std::time::Duration) -> Self {
        Bounded {
            io,
            _permit: permit,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
        }
    }

    /// Bytes passed: the idle clock starts again.
    fn touch(&mut self) {
        let next = tokio::time::Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
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
                    self.touch();
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
                    self.touch();
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
}
