//! Accepting HTTP connections within a bound.
//!
//! Why this exists: every open connection holds a file descriptor, and the
//! server's descriptors are shared with what it must never lose: agents'
//! pipes, SQLite's files, the listener itself. A probe that opened 20,000
//! idle connections (or held 19,950 blocking MCP calls) took every
//! descriptor: `/healthz` stopped answering and new agents could not start.
//! So at most [`limit`] connections are open at once; past that the server
//! stops accepting, and new connections wait in the kernel's backlog until
//! one closes (idle ones are closed by hyper's timeouts), instead of failing
//! with "too many open files" wherever a descriptor was needed next.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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
}

impl BoundedListener {
    /// At most `max` connections of `inner` open at once.
    pub fn new(inner: TcpListener, max: usize) -> Self {
        BoundedListener {
            inner,
            permits: Arc::new(Semaphore::new(max.max(1))),
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
        (
            Bounded {
                io,
                _permit: permit,
            },
            addr,
        )
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
}

impl AsyncRead for Bounded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
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
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
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
