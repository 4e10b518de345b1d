//! A socket that tells whether a write is waiting for room in the kernel's buffer, so a
//! connection's `send` can return once its frame is in the kernel, as framed TCP's does:
//! with a runtime that only the connection's thread drives, data still queued in HTTP/2's
//! buffers when the call returns would wait for that thread's next call.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// Whether the socket's last write is waiting for room, and a signal once it is not.
#[derive(Default)]
pub(super) struct Writes {
    blocked: AtomicBool,
    unblocked: Notify,
}

impl Writes {
    /// Waits until the socket's writes are not waiting for room (at once when they are not).
    pub(super) async fn unblocked(&self) {
        loop {
            let wait = self.unblocked.notified();
            tokio::pin!(wait);
            wait.as_mut().enable();
            if !self.blocked.load(Ordering::Acquire) {
                return;
            }
            wait.await;
        }
    }

    /// A write waits for room in the socket's buffer.
    pub(super) fn is_blocked(&self) -> bool {
        self.blocked.load(Ordering::Acquire)
    }

    fn note<T>(&self, r: &Poll<io::Result<T>>) {
        if r.is_pending() {
            self.blocked.store(true, Ordering::Release);
        } else if self.blocked.swap(false, Ordering::AcqRel) {
            self.unblocked.notify_waiters();
        }
    }
}

/// `S` with its writes tracked in a shared [`Writes`].
pub(super) struct Tracked<S> {
    inner: S,
    writes: Arc<Writes>,
}

impl<S> Tracked<S> {
    pub(super) fn new(inner: S, writes: Arc<Writes>) -> Self {
        Tracked { inner, writes }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.writes.note(&r);
        r
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.writes.note(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.writes.note(&r);
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
