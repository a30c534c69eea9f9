//! Reading an agent's pipes without holding buffers while they are idle.
//!
//! Most sessions sit idle most of the time, and with hundreds of them the
//! buffers their pipe tasks keep between messages add up: a `FramedRead`
//! reserves 8 KiB before it waits for the pipe, keeps whatever a 100 KiB line
//! grew it to, and a stderr drain keeps its read buffer for the life of the
//! agent. Here a reader waits for the pipe to become readable *before* it
//! takes a buffer, reads what is there, hands out the complete frames, and
//! lets go of the buffer when no partial frame is left (or shrinks it when a
//! short partial frame sits in an allocation an earlier huge line grew).
//!
//! A read into an empty buffer lands in the thread's scratch chunk first and
//! only what arrived is copied out: an agent's lines are a few hundred bytes,
//! and asking the allocator for 8 KiB per read made glibc sweep its free
//! lists (`malloc_consolidate`) on every line under load. A read that adds
//! to a partial frame goes straight into its (already grown) buffer.

use std::cell::RefCell;
use std::future::Future;
use std::io;

use bytes::BytesMut;
use tokio::net::unix::pipe;
use tokio_util::codec::Decoder;

/// Bytes asked of the source per read (a Linux pipe holds 64 KiB).
pub const READ_CHUNK: usize = 8 * 1024;

/// A buffer kept for a partial frame is replaced by a right-sized copy when
/// its allocation is more than this many times what it holds (and over
/// [`READ_CHUNK`]).
const SHRINK_FACTOR: usize = 4;

thread_local! {
    /// Where a read into an empty buffer lands; one per runtime thread,
    /// never shared (its bytes are copied out before the next read).
    static SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// A byte source that can be waited on without lending it a buffer.
pub trait ReadySource {
    /// Resolves when a read may find data or end of file.
    fn ready(&mut self) -> impl Future<Output = io::Result<()>> + Send;
    /// Appends what is available to `buf` without waiting (`Ok(0)`: end of
    /// file; `WouldBlock`: nothing yet).
    fn try_read_into(&mut self, buf: &mut BytesMut) -> io::Result<usize>;
}

impl ReadySource for pipe::Receiver {
    fn ready(&mut self) -> impl Future<Output = io::Result<()>> + Send {
        self.readable()
    }

    fn try_read_into(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        self.try_read_buf(buf)
    }
}

/// An in-memory source (tests and benchmarks): always ready, hands out at
/// most the buffer's spare capacity per read, like a pipe.
impl ReadySource for &[u8] {
    fn ready(&mut self) -> impl Future<Output = io::Result<()>> + Send {
        std::future::ready(Ok(()))
    }

    fn try_read_into(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        let n = (buf.capacity() - buf.len()).min(self.len());
        buf.extend_from_slice(&self[..n]);
        *self = &self[n..];
        Ok(n)
    }
}

/// Frames decoded from a [`ReadySource`]; the buffer exists only while a
/// read is being decoded or a partial frame waits for its rest.
#[derive(Debug)]
pub struct FrameReader<S, D> {
    source: S,
    codec: D,
    buf: BytesMut,
    eof: bool,
}

impl<S: ReadySource, D: Decoder> FrameReader<S, D> {
    /// A reader of `source` framed by `codec`.
    pub fn new(source: S, codec: D) -> Self {
        FrameReader {
            source,
            codec,
            buf: BytesMut::new(),
            eof: false,
        }
    }

    /// The next frame; `Ok(None)` once the source ended and every frame in
    /// it was returned.
    pub async fn next_frame(&mut self) -> Result<Option<D::Item>, D::Error> {
        loop {
            let decoded = if self.eof {
                self.codec.decode_eof(&mut self.buf)?
            } else {
                self.codec.decode(&mut self.buf)?
            };
            if decoded.is_some() {
                return Ok(decoded);
            }
            if self.eof {
                self.release_idle();
                return Ok(None);
            }
            self.release_idle();
            self.fill().await?;
        }
    }

    /// Bytes the reader's buffer holds allocated (0 while nothing is pending).
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Reads once into the buffer (waiting for the source without holding
    /// a buffer when none is needed); marks end of file.
    async fn fill(&mut self) -> io::Result<()> {
        loop {
            self.source.ready().await?;
            match self.read_once() {
                Ok(0) => {
                    self.eof = true;
                    return Ok(());
                }
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.release_idle(),
                Err(e) => return Err(e),
            }
        }
    }

    /// One read without waiting: into the scratch chunk when the buffer is
    /// empty (the buffer then takes only what arrived), else straight into
    /// the buffer.
    fn read_once(&mut self) -> io::Result<usize> {
        if !self.buf.is_empty() {
            self.buf.reserve(READ_CHUNK);
            return self.source.try_read_into(&mut self.buf);
        }
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.clear();
            scratch.reserve(READ_CHUNK);
            let n = self.source.try_read_into(scratch)?;
            self.buf.extend_from_slice(scratch);
            Ok(n)
        })
    }

    /// Lets go of the buffer when it holds nothing, and right-sizes it when
    /// a short partial frame sits in a large allocation.
    fn release_idle(&mut self) {
        let (len, cap) = (self.buf.len(), self.buf.capacity());
        if len == 0 {
            self.buf = BytesMut::new();
        } else if cap > READ_CHUNK && cap > len.saturating_mul(SHRINK_FACTOR) {
            self.buf = BytesMut::from(&self.buf[..]);
        }
    }
}

/// Reads a stderr pipe until end of file, handing each chunk to `sink`; the
/// read buffer lives on the stack only while a read is being handled.
pub async fn drain(source: pipe::Receiver, mut sink: impl FnMut(&[u8])) {
    loop {
        if source.readable().await.is_err() {
            return;
        }
        let mut chunk = [0u8; 4096];
        match source.try_read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => sink(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::framing::{Frame, FrameCodec, NdjsonCodec};

    fn line(len: usize) -> Vec<u8> {
        let mut l = vec![b'x'; len];
        l.push(b'\n');
        l
    }

    #[tokio::test]
    async fn frames_come_out_whole_and_the_buffer_is_released_between_them() {
        let mut input = b"{\"a\":1}\n".to_vec();
        input.extend(line(100 * 1024));
        input.extend_from_slice(b"{\"b\":2}");
        let mut reader = FrameReader::new(&input[..], NdjsonCodec::new(1024 * 1024));
        let first = reader.next_frame().await.unwrap();
        assert_eq!(first, Some(Frame::Message("{\"a\":1}".into())));
        match reader.next_frame().await.unwrap() {
            Some(Frame::Message(body)) => assert_eq!(body.len(), 100 * 1024),
            other => panic!("expected the long line, got {other:?}"),
        }
        let last = reader.next_frame().await.unwrap();
        assert_eq!(last, Some(Frame::Message("{\"b\":2}".into())));
        assert_eq!(reader.next_frame().await.unwrap(), None);
        assert_eq!(reader.buffer_capacity(), 0);
    }

    /// Hands out its bytes, then never becomes ready again (an agent that
    /// went quiet).
    struct Stalling<'a>(&'a [u8]);

    impl ReadySource for Stalling<'_> {
        fn ready(&mut self) -> impl Future<Output = io::Result<()>> + Send {
            let empty = self.0.is_empty();
            async move {
                if empty {
                    std::future::pending::<()>().await;
                }
                Ok(())
            }
        }

        fn try_read_into(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
            self.0.try_read_into(buf)
        }
    }

    #[tokio::test]
    async fn a_huge_line_does_not_leave_a_huge_buffer_behind() {
        use futures::FutureExt;
        // A hostile agent sends one 1 MiB line, then goes quiet mid-line.
        let mut input = line(1024 * 1024);
        input.extend_from_slice(b"{\"partial\":");
        let codec = FrameCodec::new(crate::model::Framing::Ndjson, 2 * 1024 * 1024);
        let mut reader = FrameReader::new(Stalling(&input), codec);
        match reader.next_frame().await.unwrap() {
            Some(Frame::Message(body)) => assert_eq!(body.len(), 1024 * 1024),
            other => panic!("expected the huge line, got {other:?}"),
        }
        // Waiting for the rest of the partial line: only it is kept.
        assert!(reader.next_frame().now_or_never().is_none());
        assert_eq!(&reader.buf[..], b"{\"partial\":");
        assert!(
            reader.buffer_capacity() <= 2 * READ_CHUNK,
            "{} bytes kept for an 11-byte partial line",
            reader.buffer_capacity()
        );
    }

    #[tokio::test]
    async fn an_idle_reader_holds_no_buffer() {
        use futures::FutureExt;
        let input = b"{\"a\":1}\n".to_vec();
        let mut reader = FrameReader::new(Stalling(&input), NdjsonCodec::new(1024));
        assert_eq!(
            reader.next_frame().await.unwrap(),
            Some(Frame::Message("{\"a\":1}".into()))
        );
        assert!(reader.next_frame().now_or_never().is_none());
        assert_eq!(reader.buffer_capacity(), 0);
    }

    #[tokio::test]
    async fn a_short_partial_line_holds_only_about_its_own_bytes() {
        use futures::FutureExt;
        // Reads into an empty buffer land in the scratch chunk: waiting for the rest of a short line
        // keeps a buffer of about its size, never a whole read chunk.
        let input = b"{\"a\":1}\n{\"b\":".to_vec();
        let mut reader = FrameReader::new(Stalling(&input), NdjsonCodec::new(1024));
        assert_eq!(
            reader.next_frame().await.unwrap(),
            Some(Frame::Message("{\"a\":1}".into()))
        );
        assert!(reader.next_frame().now_or_never().is_none());
        assert_eq!(&reader.buf[..], b"{\"b\":");
        assert!(
            reader.buffer_capacity() < 256,
            "{} bytes held for a 5-byte partial line",
            reader.buffer_capacity()
        );
    }

    #[tokio::test]
    async fn an_oversized_line_is_skipped_and_reading_goes_on() {
        let mut input = line(64 * 1024);
        input.extend_from_slice(b"{}\n");
        let mut reader = FrameReader::new(&input[..], NdjsonCodec::new(1024));
        assert!(matches!(
            reader.next_frame().await.unwrap(),
            Some(Frame::Oversized { len, .. }) if len == 64 * 1024
        ));
        assert_eq!(
            reader.next_frame().await.unwrap(),
            Some(Frame::Message("{}".into()))
        );
        assert_eq!(reader.next_frame().await.unwrap(), None);
        assert_eq!(reader.buffer_capacity(), 0);
    }
}
