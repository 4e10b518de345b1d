//! One gRPC connection as a blocking [`Connection`]: its own current-thread tokio runtime,
//! driven only by the thread that calls it, while that thread waits in a call. The HTTP/2
//! connection's reads, writes and window updates run on that thread too: no hand-off to
//! another thread per message (a wake-up across cores costs tens of µs on small VMs), which
//! a runtime shared by all connections needed twice per message on each side.

use super::accept::Serving;
use super::tracked::Writes;
use super::CHUNK;
use crate::spin::{self, Backoff};
use crate::{ConnSlot, Connection, Result, TrafficStats, TransportError};
use bytes::Bytes;
use downpour_core::codec;
use downpour_core::proto::{Frame, FrameHeader};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;
use tonic::{Status, Streaming};

/// How long a closed connection's runtime keeps running, on a thread of its own, to write
/// what is still queued before it is dropped: a refusal, the stream's end (every frame
/// sent is in the kernel already). The accepting side's HTTP/2 connection would wait for
/// the peer's acknowledgement of its shutdown, which only comes while the peer's thread is
/// in a call, so it gets the short one.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_ACCEPTED: Duration = Duration::from_millis(100);

/// gRPC's prefix of each message in the HTTP/2 body: a compression flag and a 32-bit length.
const GRPC_PREFIX: u64 = 5;

/// The accepted side's stream, once the peer has opened it: what it sends, and the sender
/// of the replies.
pub(super) type Opened = (Streaming<Frame>, mpsc::Sender<std::result::Result<Frame, Status>>);

/// Where the connection's stream stands.
enum Io {
    /// Accepted; the peer's TLS handshake, HTTP/2 handshake and `Exchange` call are still to
    /// come (they run on the connection's thread, at its first call). The sender is dropped
    /// when the peer is refused or goes away first.
    Pending(oneshot::Receiver<Opened>),
    /// The exchange is open.
    Open { tx: Outbound, inbound: Box<Streaming<Frame>> },
    /// Ended before it opened (refused, or the peer went away), or dropped.
    Closed,
}

impl Io {
    /// An accepted connection's state once its wait for the stream is over: open, or closed
    /// (`None`: refused, gone, or too late).
    fn opened(got: Option<Opened>) -> Io {
        match got {
            Some((inbound, tx)) => Io::Open { tx: Outbound::Server(tx), inbound: Box::new(inbound) },
            None => Io::Closed,
        }
    }
}

enum Outbound {
    Client(mpsc::Sender<Frame>),
    Server(mpsc::Sender<std::result::Result<Frame, Status>>),
}

/// One look at the stream: its next message (or end) if one is there, without waiting.
fn look(inbound: &mut Streaming<Frame>) -> impl Future<Output = Poll<std::result::Result<Option<Frame>, Status>>> + '_ {
    std::future::poll_fn(move |cx| Poll::Ready(Pin::new(&mut *inbound).poll_next(cx).map(|got| got.transpose())))
}

/// A gRPC connection (either side).
pub(super) struct GrpcConnection {
    /// The connection's runtime; `None` only while being dropped.
    rt: Option<Runtime>,
    io: Io,
    /// (Accepted side) dropping it asks the HTTP/2 connection to shut down once its stream
    /// is done.
    close: Option<oneshot::Sender<()>>,
    /// What the connection has written.
    writes: Arc<Writes>,
    /// (Accepted side) when the peer's stream must be open by, and the timeout it is from.
    handshake_by: Instant,
    handshake_timeout: Duration,
    /// The gRPC body bytes of the messages sent so far (each message's encoding and its
    /// 5-byte prefix): what HTTP/2 has to have written once a send returns.
    body_sent: u64,
    peer: String,
    /// The received frame's first message's payload, and what is still to come.
    current: Option<Part>,
    /// Largest payload of a frame accepted (the transport's frame limit).
    max_payload: u64,
    /// How a wait for the next message polls the stream first, if it does: for twice
    /// [`crate::NetConfig::poll`] (a reply through HTTP/2 takes 40–60 µs on loopback, against
    /// framed TCP's 15–30); and whether this one does.
    poll: Option<spin::Spin>,
    spin: Backoff,
    /// What [`Connection::readable`] took off the stream, returned by the next receive.
    peeked: Option<std::result::Result<Option<Frame>, Status>>,
    timeout: Option<Duration>,
    /// The receive timeout's timer, kept from one receive to the next and moved later each
    /// time (made at the first receive that has a timeout). A timer made anew for each
    /// receive is a new entry in the runtime's timer wheel sooner than any it holds, and
    /// tokio wakes its own driver for that (an eventfd write and one more `epoll_wait` per
    /// round trip); moving a registered timer later touches nothing.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    stats: TrafficStats,
    /// (Accepted connections) the slot counted against the connection limit.
    _slot: Option<ConnSlot>,
}

/// The payload of a frame's first message, and how many bytes of keys and values follow in
/// continuation messages.
struct Part {
    keys: Bytes,
    values: Bytes,
    rest_keys: u64,
    rest_values: u64,
}

impl GrpcConnection {
    /// The connecting side: the exchange is open.
    pub(super) fn connected(
        rt: Runtime,
        tx: mpsc::Sender<Frame>,
        inbound: Streaming<Frame>,
        writes: Arc<Writes>,
        peer: String,
        max_payload: u64,
        poll: Duration,
    ) -> GrpcConnection {
        let io = Io::Open { tx: Outbound::Client(tx), inbound: Box::new(inbound) };
        GrpcConnection::new(rt, io, None, writes, peer, (max_payload, poll), None)
    }

    /// The accepted side: `opened` brings the stream once the peer has opened it (within
    /// `serving`'s handshake timeout); dropping `close` shuts the HTTP/2 connection down.
    pub(super) fn accepted(
        rt: Runtime,
        opened: oneshot::Receiver<Opened>,
        close: oneshot::Sender<()>,
        writes: Arc<Writes>,
        peer: String,
        serving: &Serving,
        slot: ConnSlot,
    ) -> GrpcConnection {
        let mut c =
            GrpcConnection::new(rt, Io::Pending(opened), Some(close), writes, peer, (serving.max_payload, serving.poll), Some(slot));
        c.handshake_by = Instant::now() + serving.handshake_timeout;
        c.handshake_timeout = serving.handshake_timeout;
        c
    }

    fn new(
        rt: Runtime,
        io: Io,
        close: Option<oneshot::Sender<()>>,
        writes: Arc<Writes>,
        peer: String,
        (max_payload, poll): (u64, Duration),
        slot: Option<ConnSlot>,
    ) -> Self {
        GrpcConnection {
            rt: Some(rt),
            io,
            close,
            writes,
            handshake_by: Instant::now(),
            handshake_timeout: Duration::ZERO,
            body_sent: 0,
            peer,
            current: None,
            max_payload,
            poll: spin::network(poll.saturating_mul(2)),
            spin: Backoff::default(),
            peeked: None,
            timeout: None,
            deadline: None,
            stats: Default::default(),
            _slot: slot,
        }
    }

    fn malformed(&self, why: String) -> TransportError {
        TransportError::Protocol { peer: self.peer.clone(), source: downpour_wire::WireError::Malformed(why) }
    }

    fn closed(&self) -> TransportError {
        TransportError::Closed { peer: self.peer.clone() }
    }

    /// Runs `f` on the connection's runtime.
    fn run<F: Future>(&self, f: F) -> Result<F::Output> {
        let Some(rt) = &self.rt else { return Err(self.closed()) };
        Ok(rt.block_on(f))
    }

    /// Waits (within `timeout`) for an accepted connection's peer to open its stream. A
    /// peer that has not opened it within the handshake timeout of the accept (TLS,
    /// HTTP/2, the `Exchange` call and its token) is dropped: the connection reads as
    /// closed, and its slot is free again.
    fn open(&mut self, timeout: Option<Duration>) -> Result<()> {
        let Io::Pending(rx) = &mut self.io else { return Ok(()) };
        let Some(rt) = &self.rt else { return Err(self.closed()) };
        let left = self.handshake_by.saturating_duration_since(Instant::now());
        let (wait, ours) = match timeout {
            Some(t) if t < left => (t, false),
            _ => (left, true),
        };
        let got = match rt.block_on(async { tokio::time::timeout(wait, &mut *rx).await }) {
            Ok(r) => r.ok(),
            Err(_) if ours => {
                tracing::warn!("dropped a gRPC connection from {}: no stream opened within {:?}", self.peer, self.handshake_timeout);
                None
            }
            Err(_) => return Err(TransportError::Timeout { peer: self.peer.clone(), after: wait }),
        };
        self.io = Io::opened(got);
        Ok(())
    }

    fn push(&mut self, frame: Frame) -> Result<()> {
        self.open(self.timeout)?;
        self.body_sent += GRPC_PREFIX + prost::Message::encoded_len(&frame) as u64;
        let ok = match &self.io {
            Io::Open { tx: Outbound::Client(t), .. } => self.run(t.send(frame))?.is_ok(),
            Io::Open { tx: Outbound::Server(t), .. } => self.run(t.send(Ok(frame)))?.is_ok(),
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(self.closed())
        }
    }

    /// Returns once every message sent is in the kernel's socket buffer (as a framed-TCP
    /// send does): HTTP/2 has written all of their bytes in DATA frames (waiting, as long
    /// as it takes, for the peer's flow-control window) and no write waits for room in the
    /// socket. Nothing that was sent then depends on this thread's next call.
    fn flush(&mut self) -> Result<()> {
        let Io::Open { tx, .. } = &self.io else { return Err(self.closed()) };
        let (writes, body) = (&self.writes, self.body_sent);
        // the stream's end (its HTTP/2 connection failed or was reset) ends the wait
        let written = self.run(async {
            tokio::select! {
                biased;
                _ = writes.written(body) => true,
                _ = async {
                    match tx {
                        Outbound::Client(t) => t.closed().await,
                        Outbound::Server(t) => t.closed().await,
                    }
                } => false,
            }
        })?;
        if written {
            Ok(())
        } else {
            Err(self.closed())
        }
    }

    /// The next message of the stream (None at its end), within the receive timeout.
    fn next_message(&mut self) -> Result<Option<Frame>> {
        let next = match self.peeked.take() {
            Some(p) => p,
            None => {
                let started = Instant::now();
                self.open(self.timeout)?;
                let left = self.timeout.map(|t| t.saturating_sub(started.elapsed()));
                let Some(rt) = &self.rt else { return Err(self.closed()) };
                let Io::Open { inbound, .. } = &mut self.io else { return Ok(None) };
                // poll briefly before the runtime sleeps in epoll (`crate::spin`): a yield to
                // the runtime between two looks at the stream lets it take what the socket
                // holds, without blocking
                let polled = self.spin.poll_for(self.poll, || {
                    rt.block_on(async {
                        if let Poll::Ready(got) = look(inbound).await {
                            return Some(got);
                        }
                        tokio::task::yield_now().await;
                        match look(inbound).await {
                            Poll::Ready(got) => Some(got),
                            Poll::Pending => None,
                        }
                    })
                });
                if let Some(got) = polled {
                    return self.message_or_end(got);
                }
                match left {
                    None => rt.block_on(inbound.message()),
                    Some(t) => {
                        let deadline = &mut self.deadline;
                        let got = rt.block_on(async {
                            // (a timeout past what an instant can hold: a deadline a century away)
                            let now = tokio::time::Instant::now();
                            let until = now.checked_add(t).unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400));
                            let timer = deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                            timer.as_mut().reset(until);
                            tokio::select! {
                                biased;
                                got = inbound.message() => Some(got),
                                _ = timer.as_mut() => None,
                            }
                        });
                        match got {
                            Some(r) => r,
                            None => return Err(TransportError::Timeout { peer: self.peer.clone(), after: self.timeout.unwrap_or(t) }),
                        }
                    }
                }
            }
        };
        self.message_or_end(next)
    }

    /// A message taken off the stream as the receive returns it: a cancelled or vanished
    /// stream is its end (None), any other status an error.
    fn message_or_end(&self, next: std::result::Result<Option<Frame>, Status>) -> Result<Option<Frame>> {
        match next {
            Ok(f) => Ok(f),
            Err(s) if s.code() == tonic::Code::Cancelled || s.code() == tonic::Code::Unavailable => Ok(None),
            // The peer's process ended without closing its stream (the TCP connection went
            // away under HTTP/2): a close, like a reset TCP connection, not a protocol error.
            Err(s) if s.code() == tonic::Code::Unknown && s.message().contains("error reading a body from connection") => Ok(None),
            Err(s) => Err(TransportError::Io {
                peer: self.peer.clone(),
                source: std::io::Error::other(format!("gRPC status {:?}: {}", s.code(), s.message())),
            }),
        }
    }

    /// The next continuation message of the frame being received.
    fn continuation(&mut self) -> Result<Frame> {
        match self.next_message()? {
            Some(f) if f.header.is_none() => Ok(f),
            Some(_) => Err(self.malformed("a new frame began inside a frame's payload".into())),
            None => Err(self.closed()),
        }
    }
}

impl Connection for GrpcConnection {
    fn send(&mut self, header: &mut FrameHeader, keys: &[u8], values: &[u8]) -> Result<()> {
        header.keys_len = keys.len() as u64;
        header.values_len = values.len() as u64;
        let (mut k, mut v) = (keys, values);
        let mut first = Some(header.clone());
        loop {
            let nk = k.len().min(CHUNK);
            let nv = v.len().min(CHUNK - nk);
            let frame = Frame { header: first.take(), keys: Bytes::copy_from_slice(&k[..nk]), values: Bytes::copy_from_slice(&v[..nv]) };
            (k, v) = (&k[nk..], &v[nv..]);
            self.push(frame)?;
            if k.is_empty() && v.is_empty() {
                break;
            }
        }
        self.flush()?;
        self.stats.bytes_sent += (keys.len() + values.len()) as u64;
        self.stats.frames_sent += 1;
        Ok(())
    }

    fn recv_header(&mut self) -> Result<Option<FrameHeader>> {
        if let Some(p) = self.current.take() {
            // The caller skipped a payload: drain its continuations to stay in sync.
            let mut left = p.rest_keys + p.rest_values;
            while left > 0 {
                let f = self.continuation()?;
                left = left
                    .checked_sub((f.keys.len() + f.values.len()) as u64)
                    .ok_or_else(|| self.malformed("a continuation longer than its frame".into()))?;
            }
        }
        let Some(frame) = self.next_message()? else { return Ok(None) };
        let h = frame.header.ok_or_else(|| self.malformed("frame without header".into()))?;
        let (fk, fv) = (frame.keys.len() as u64, frame.values.len() as u64);
        // the first message begins the payload: keys first, values once the keys are whole
        if fk > h.keys_len || fv > h.values_len || (fv > 0 && fk < h.keys_len) {
            return Err(self.malformed(format!("a frame of {}+{} bytes whose first message carries {fk}+{fv}", h.keys_len, h.values_len)));
        }
        codec::check_payload(&h, &downpour_core::codec::FrameLimits { max_payload_bytes: self.max_payload })
            .map_err(|e| TransportError::Protocol { peer: self.peer.clone(), source: e })?;
        self.stats.bytes_received += h.keys_len + h.values_len;
        self.stats.frames_received += 1;
        self.current = Some(Part { keys: frame.keys, values: frame.values, rest_keys: h.keys_len - fk, rest_values: h.values_len - fv });
        Ok(Some(h))
    }

    fn recv_payload(&mut self, keys: &mut [u8], values: &mut [u8]) -> Result<()> {
        let Some(p) = self.current.take() else { return crate::fill_payload(&self.peer, &[], &[], keys, values) };
        let (fk, fv) = (p.keys.len(), p.values.len());
        if keys.len() as u64 != fk as u64 + p.rest_keys || values.len() as u64 != fv as u64 + p.rest_values {
            return Err(self.malformed(format!(
                "payload buffers of {}+{} bytes for a frame of {}+{} bytes",
                keys.len(),
                values.len(),
                fk as u64 + p.rest_keys,
                fv as u64 + p.rest_values
            )));
        }
        keys[..fk].copy_from_slice(&p.keys);
        values[..fv].copy_from_slice(&p.values);
        drop(p);
        let (mut ka, mut va) = (fk, fv);
        while ka < keys.len() || va < values.len() {
            let f = self.continuation()?;
            let (nk, nv) = (f.keys.len(), f.values.len());
            if ka + nk > keys.len() || va + nv > values.len() || (nv > 0 && ka + nk < keys.len()) {
                return Err(self.malformed("a continuation that does not fit its frame".into()));
            }
            keys[ka..ka + nk].copy_from_slice(&f.keys);
            values[va..va + nv].copy_from_slice(&f.values);
            (ka, va) = (ka + nk, va + nv);
        }
        if keys.len() + values.len() > CHUNK {
            // the flow-control capacity this frame freed goes back to the peer now (a window
            // update), not at this thread's next call on the connection
            if let Some(rt) = &self.rt {
                rt.block_on(tokio::task::yield_now());
            }
        }
        Ok(())
    }

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.timeout = timeout;
        Ok(())
    }

    fn readable(&mut self) -> Result<bool> {
        if self.peeked.is_some() {
            return Ok(true);
        }
        let Some(rt) = &self.rt else { return Ok(true) };
        // Nothing else runs this runtime: let its tasks take what the socket holds (a few
        // rounds: the connection's task, then the stream's), without blocking.
        let io = &mut self.io;
        let polled = rt.block_on(async {
            for _ in 0..4 {
                if let Io::Pending(rx) = io {
                    if let Poll::Ready(got) = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *rx).poll(cx))).await {
                        *io = Io::opened(got.ok());
                    }
                }
                match io {
                    Io::Closed => return Poll::Ready(None),
                    Io::Open { inbound, .. } => {
                        let p = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *inbound).poll_next(cx))).await;
                        if p.is_ready() {
                            return p;
                        }
                    }
                    Io::Pending(_) => {}
                }
                tokio::task::yield_now().await;
            }
            Poll::Pending
        });
        match polled {
            Poll::Ready(next) => {
                self.peeked = Some(next.transpose());
                Ok(true)
            }
            Poll::Pending => Ok(false),
        }
    }

    fn peer(&self) -> &str {
        &self.peer
    }

    fn stats(&self) -> TrafficStats {
        self.stats
    }
}

impl Drop for GrpcConnection {
    fn drop(&mut self) {
        let Some(rt) = self.rt.take() else { return };
        let linger = if self.close.is_some() { LINGER_ACCEPTED } else { LINGER };
        // End this side: the stream ends, an accepted connection's HTTP/2 connection shuts
        // down once its stream is done, a connecting side's closes once nothing uses it.
        self.io = Io::Closed;
        self.close = None;
        self.peeked = None;
        self.current = None;
        self.deadline = None;
        // Its tasks may still have to write what is queued: let them, briefly here, and if
        // that is not enough, on a thread of their own (bounded by LINGER).
        if settle(&rt, Duration::ZERO) {
            return;
        }
        let _ = std::thread::Builder::new().name("downpour-grpc-close".into()).spawn(move || {
            settle(&rt, linger);
        });
    }
}

/// Runs `rt`'s tasks until none is left (true) or `within` has passed (a few rounds at
/// least, without waiting for the socket when `within` is zero).
fn settle(rt: &Runtime, within: Duration) -> bool {
    let metrics = rt.metrics();
    let deadline = Instant::now() + within;
    rt.block_on(async {
        let mut rounds = 0;
        loop {
            if metrics.num_alive_tasks() == 0 {
                return true;
            }
            rounds += 1;
            if rounds > 4 && Instant::now() >= deadline {
                return false;
            }
            if rounds <= 4 {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    })
}
