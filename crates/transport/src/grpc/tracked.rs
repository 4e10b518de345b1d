//! What a gRPC connection has written, so that its `send` can return once the frame is in
//! the kernel's socket buffer, as a framed-TCP send does. With a runtime that only the
//! connection's thread drives, bytes still in HTTP/2's buffers when the call returns (the
//! socket was full, or the peer's flow-control window was) would wait for that thread's
//! next call, and a thread that next waits on another connection could wait forever.
//!
//! Two wrappers share one [`Writes`]: [`Counted`] sits where HTTP/2 writes (above TLS when
//! there is TLS) and counts the DATA payload bytes of the HTTP/2 frames that went through;
//! [`Blocked`] sits on the TCP socket and tells whether a write waits for room there.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// The client's connection preface (RFC 9113 §3.4), written before the first frame.
const CLIENT_PREFACE: usize = 24;
/// An HTTP/2 frame header: 24-bit length, type, flags, stream id.
const FRAME_HEADER: usize = 9;
/// The DATA frame type.
const DATA: u8 = 0;

/// A connection's writes so far.
#[derive(Default)]
pub(super) struct Writes {
    /// DATA payload bytes HTTP/2 has handed to the layer below (TLS or the socket).
    data: AtomicU64,
    /// The socket's last write waits for room.
    blocked: AtomicBool,
    /// Woken when either of the two moves.
    moved: Notify,
}

impl Writes {
    /// Waits until HTTP/2 has written at least `data` DATA payload bytes and the socket has
    /// taken them (no write waits for room).
    pub(super) async fn written(&self, data: u64) {
        loop {
            let wait = self.moved.notified();
            tokio::pin!(wait);
            wait.as_mut().enable();
            if self.data.load(Ordering::Acquire) >= data && !self.blocked.load(Ordering::Acquire) {
                return;
            }
            wait.await;
        }
    }

    fn note_blocked<T>(&self, r: &Poll<io::Result<T>>) {
        if r.is_pending() {
            self.blocked.store(true, Ordering::Release);
        } else if self.blocked.swap(false, Ordering::AcqRel) {
            self.moved.notify_waiters();
        }
    }
}

/// The TCP socket, telling [`Writes`] whether a write waits for room.
pub(super) struct Blocked<S> {
    inner: S,
    writes: Arc<Writes>,
}

impl<S> Blocked<S> {
    pub(super) fn new(inner: S, writes: Arc<Writes>) -> Self {
        Blocked { inner, writes }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Blocked<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Blocked<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.writes.note_blocked(&r);
        r
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.writes.note_blocked(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.writes.note_blocked(&r);
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Where HTTP/2 writes: counts the DATA payload bytes of the frames written through it.
pub(super) struct Counted<S> {
    inner: S,
    writes: Arc<Writes>,
    frames: FrameCounter,
}

impl<S> Counted<S> {
    /// `client`: the stream begins with the client's connection preface.
    pub(super) fn new(inner: S, writes: Arc<Writes>, client: bool) -> Self {
        Counted { inner, writes, frames: FrameCounter::new(client) }
    }

    fn wrote<'a>(&mut self, bufs: impl Iterator<Item = &'a [u8]>, mut n: usize) {
        let mut data = 0;
        for b in bufs {
            if n == 0 {
                break;
            }
            let take = n.min(b.len());
            data += self.frames.feed(&b[..take]);
            n -= take;
        }
        if data > 0 {
            self.writes.data.fetch_add(data, Ordering::AcqRel);
            self.writes.moved.notify_waiters();
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.wrote(std::iter::once(buf), n);
        }
        r
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.wrote(bufs.iter().map(|b| &b[..]), n);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Follows the HTTP/2 frames of a written byte stream (only their headers are read) and
/// counts the payload bytes of DATA frames.
struct FrameCounter {
    /// Preface bytes still to skip.
    preface: usize,
    header: [u8; FRAME_HEADER],
    header_len: usize,
    /// Payload bytes of the current frame still to come, and whether it is a DATA frame.
    payload_left: usize,
    data: bool,
}

impl FrameCounter {
    fn new(client: bool) -> Self {
        FrameCounter {
            preface: if client { CLIENT_PREFACE } else { 0 },
            header: [0; FRAME_HEADER],
            header_len: 0,
            payload_left: 0,
            data: false,
        }
    }

    /// The DATA payload bytes in `bytes`, the next bytes of the stream.
    fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        let mut data = 0;
        while !bytes.is_empty() {
            if self.preface > 0 {
                let take = self.preface.min(bytes.len());
                self.preface -= take;
                bytes = &bytes[take..];
            } else if self.payload_left > 0 {
                let take = self.payload_left.min(bytes.len());
                if self.data {
                    data += take as u64;
                }
                self.payload_left -= take;
                bytes = &bytes[take..];
            } else {
                let take = (FRAME_HEADER - self.header_len).min(bytes.len());
                self.header[self.header_len..self.header_len + take].copy_from_slice(&bytes[..take]);
                self.header_len += take;
                bytes = &bytes[take..];
                if self.header_len == FRAME_HEADER {
                    let h = &self.header;
                    self.payload_left = (h[0] as usize) << 16 | (h[1] as usize) << 8 | h[2] as usize;
                    self.data = h[3] == DATA;
                    self.header_len = 0;
                }
            }
        }
        data
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(kind: u8, payload: usize) -> Vec<u8> {
        let mut f = vec![(payload >> 16) as u8, (payload >> 8) as u8, payload as u8, kind, 0, 0, 0, 0, 1];
        f.extend((0..payload).map(|i| i as u8));
        f
    }

    proptest! {
        /// However the writes cut the stream, the DATA payload bytes are counted once each,
        /// and nothing of the preface or of other frames.
        #[test]
        fn data_bytes_are_counted_across_any_cuts(
            frames in prop::collection::vec((0u8..10, 0usize..40_000), 1..12),
            cuts in prop::collection::vec(1usize..20_000, 1..40),
            client in any::<bool>(),
        ) {
            let mut stream = if client { b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec() } else { Vec::new() };
            let mut want = 0u64;
            for &(kind, len) in &frames {
                stream.extend(frame(kind, len));
                if kind == DATA {
                    want += len as u64;
                }
            }
            let mut c = FrameCounter::new(client);
            let (mut got, mut at, mut i) = (0, 0, 0);
            while at < stream.len() {
                let n = cuts[i % cuts.len()].min(stream.len() - at);
                got += c.feed(&stream[at..at + n]);
                at += n;
                i += 1;
            }
            prop_assert_eq!(got, want);
        }
    }
}
