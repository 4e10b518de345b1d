//! # downpour-transport
//!
//! One [`Transport`] trait (ps-lite's `Van` idea) with three implementations that every
//! layer above uses through the same calls:
//!
//! * [`tcp::TcpTransport`] — framed TCP (the default data path): blocking sockets, the
//!   caller's thread does the I/O (no hand-off between threads, which costs ~80 µs per
//!   wake-up across cores on small VMs), payloads written straight from the caller's
//!   slices with vectored writes and read straight into the destination buffers.
//! * [`grpc::GrpcTransport`] — gRPC over tonic/HTTP/2: one bidirectional stream of
//!   [`Frame`](downpour_core::proto::Frame)s per connection, `bytes` fields carrying the
//!   same little-endian payloads; large HTTP/2 windows and message limits for big chunks.
//! * [`tcp::TcpTransport::shm`] — framed TCP's frames through shared-memory rings between
//!   processes on one host ([`shm`]), the TCP connection kept beside them as doorbell and
//!   lifeline: co-located servers and workers without the kernel's TCP stack in between.
//! * [`inproc::InProcTransport`] — channels inside one process, for the embedded mode and
//!   tests.
//! * [`faulty::FaultyTransport`] — wraps any of them for tests: seeded drop, duplicate,
//!   reorder and delay of sent frames, and partitions between nodes at run time.
//!
//! A connection carries *frames* (a header plus a keys and a values payload) in both
//! directions; replies come back in request order.

#![warn(missing_docs)]

pub mod faulty;
pub mod grpc;
pub mod http;
pub mod inproc;
pub mod security;
pub mod shm;
mod spin;
pub mod tcp;
mod tls;
mod wait;

pub use security::{AuthToken, TlsConfig};

use downpour_core::proto::FrameHeader;
use downpour_wire::WireError;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// A transport failure; every variant names the peer or address involved.
#[derive(Debug, Error)]
pub enum TransportError {
    /// Could not connect.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        /// Address tried.
        addr: String,
        /// Why.
        reason: String,
    },
    /// Could not listen (e.g. the port is in use).
    #[error("cannot listen on {addr}: {reason}")]
    Bind {
        /// Address tried.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The peer closed the connection.
    #[error("connection to {peer} was closed by the peer")]
    Closed {
        /// The peer.
        peer: String,
    },
    /// No answer within the timeout.
    #[error("no answer from {peer} within {after:?}")]
    Timeout {
        /// The peer.
        peer: String,
        /// The timeout.
        after: Duration,
    },
    /// Another I/O error.
    #[error("I/O error talking to {peer}: {source}")]
    Io {
        /// The peer.
        peer: String,
        /// The error.
        source: std::io::Error,
    },
    /// The peer was refused (no or the wrong auth token, or too many connections).
    #[error("connection from {peer} refused: {reason}")]
    Refused {
        /// The peer.
        peer: String,
        /// Why.
        reason: String,
    },
    /// The peer sent bytes that are not a valid frame.
    #[error("malformed frame from {peer}: {source}")]
    Protocol {
        /// The peer.
        peer: String,
        /// What was wrong.
        source: WireError,
    },
}

/// Result with a [`TransportError`].
pub type Result<T> = std::result::Result<T, TransportError>;

/// Bytes and frames a connection has moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficStats {
    /// Bytes sent (headers and payloads).
    pub bytes_sent: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Frames sent.
    pub frames_sent: u64,
    /// Frames received.
    pub frames_received: u64,
}

/// One duplex connection carrying frames.
///
/// Protocol for receiving: call [`Connection::recv_header`], then — if the header
/// announces payloads (`keys_len`/`values_len` > 0) — exactly one
/// [`Connection::recv_payload`] with buffers of exactly those sizes, before the next header.
pub trait Connection: Send {
    /// Sends one frame. The transport sets `keys_len`/`values_len` in `header`.
    /// `keys` must be a whole number of u64 and `values` of f32 (little-endian bytes).
    fn send(&mut self, header: &mut FrameHeader, keys: &[u8], values: &[u8]) -> Result<()>;
    /// Receives the next frame's header. `Ok(None)` when the peer closed the connection
    /// cleanly between frames.
    fn recv_header(&mut self) -> Result<Option<FrameHeader>>;
    /// Receives the payloads the last header announced.
    fn recv_payload(&mut self, keys: &mut [u8], values: &mut [u8]) -> Result<()>;
    /// Whether the last header's payload (values only: a frame with keys answers false) is
    /// whole in memory that this process reads without waiting on the peer, so that it can
    /// be taken in pieces ([`Connection::recv_values_piece`]) under a lock that must not wait
    /// on a peer. Waits for it as a receive does where the transport can tell (shared-memory
    /// rings: until the writer's last byte of the frame is in the ring); answers false at
    /// once where it cannot (the default) or where the payload is more than the ring holds.
    /// Consumes nothing: after false, the payload is received as usual.
    fn payload_here(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// Receives the next `values.len()` bytes of the last header's values, after
    /// [`Connection::payload_here`] said true (the pieces add up to the payload, each a
    /// whole number of f32). Fails on a transport that never says true (the default).
    fn recv_values_piece(&mut self, values: &mut [u8]) -> Result<()> {
        let _ = values;
        Err(TransportError::Io {
            peer: self.peer().to_string(),
            source: std::io::Error::other("this transport does not hand out payloads in pieces"),
        })
    }
    /// Bounds how long a receive may wait (`None`: forever).
    fn set_recv_timeout(&mut self, timeout: Option<Duration>) -> Result<()>;
    /// Whether [`Connection::recv_header`] would start without waiting: part of a frame,
    /// the peer's close or an error is there to read. Never blocks and consumes nothing.
    /// Call only between frames (not after a header whose payload is unread). Lets a
    /// client read replies that already came instead of letting them queue; a transport
    /// that cannot tell answers `false` (the default), which only delays such reads.
    fn readable(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// The peer's address, for messages.
    fn peer(&self) -> &str;
    /// Traffic so far.
    fn stats(&self) -> TrafficStats;
}

/// Accepts connections.
pub trait Listener: Send {
    /// The address peers connect to (the actual port when `:0` was asked for).
    fn local_addr(&self) -> String;
    /// Waits up to `timeout` for a connection; `Ok(None)` on timeout.
    fn accept(&mut self, timeout: Duration) -> Result<Option<Box<dyn Connection>>>;
}

/// A way of connecting nodes.
pub trait Transport: Send + Sync {
    /// Short name: `tcp`, `grpc`, `shm` or `inproc`.
    fn name(&self) -> &'static str;
    /// Connects to `addr`, failing after `timeout`.
    fn connect(&self, addr: &str, timeout: Duration) -> Result<Box<dyn Connection>>;
    /// Listens on `addr` (`host:0` picks a free port).
    fn listen(&self, addr: &str) -> Result<Box<dyn Listener>>;
}

/// Which transport to use, as chosen on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TransportKind {
    /// Framed TCP.
    #[default]
    Tcp,
    /// gRPC (tonic).
    Grpc,
    /// Framed TCP's frames through shared memory; every node on one host.
    Shm,
}

impl std::str::FromStr for TransportKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "tcp" => Ok(TransportKind::Tcp),
            "grpc" => Ok(TransportKind::Grpc),
            "shm" => Ok(TransportKind::Shm),
            other => Err(format!("unknown transport {other:?} (expected tcp, grpc or shm)")),
        }
    }
}

/// [`NetConfig::grpc_window`]'s default: 128 MiB.
pub const DEFAULT_GRPC_WINDOW: u32 = 128 << 20;

/// Settings shared by the network transports.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// Frame size limits enforced on receive.
    pub limits: downpour_core::codec::FrameLimits,
    /// HTTP/2 stream and connection window (gRPC only), bytes: what a sender may have in
    /// flight unread, and so what a receiver that falls behind may buffer per connection.
    /// At most 2^31 − 1 (HTTP/2's limit). Windows below a few frames' worth stall the
    /// sender on every window update (16 MiB: 0.88 GB/s on 16 MiB push-then-pull, 128 MiB:
    /// 1.56, docs/benchmarks.md).
    pub grpc_window: u32,
    /// The cluster secret: sent on every connection made, required of every connection
    /// accepted (`None`: none sent, none required).
    pub auth: Option<AuthToken>,
    /// TLS on every connection, either transport (mutual when `require_client_cert`).
    pub tls: Option<TlsConfig>,
    /// Accepted connections open at once, at most; more are closed at once (a flood of
    /// connections cannot exhaust the node's threads).
    pub max_connections: usize,
    /// How long an accepted peer has to finish its handshake (TLS, the token; over gRPC
    /// also HTTP/2 and opening its stream) before the connection is dropped and its slot
    /// freed. Framed TCP applies it when a token or TLS is required; gRPC always.
    pub handshake_timeout: Duration,
    /// Bytes of each of a connection's two rings under `--transport shm` (a power of two
    /// from 256 KiB to 1 GiB; [`shm::DEFAULT_RING_BYTES`]). The connecting side chooses; the
    /// file holds both rings, reserved in `/dev/shm` for as long as the connection lasts.
    pub shm_ring_bytes: usize,
    /// How long a read for the next frame polls before it sleeps in the kernel (framed TCP;
    /// gRPC polls twice as long; zero: never polls): waking a sleeping thread costs tens of
    /// µs on small VMs, more than a reply to a small request takes. Polls back off on a
    /// connection whose frames come further apart ([`DEFAULT_POLL`]).
    pub poll: Duration,
}

/// [`NetConfig::poll`]'s default: long enough for the reply to a small request from a
/// co-located or nearby peer (15–30 µs on loopback).
pub const DEFAULT_POLL: Duration = Duration::from_micros(50);

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            limits: Default::default(),
            grpc_window: DEFAULT_GRPC_WINDOW,
            auth: None,
            tls: None,
            max_connections: 1024,
            handshake_timeout: security::HANDSHAKE_TIMEOUT,
            shm_ring_bytes: shm::DEFAULT_RING_BYTES,
            poll: DEFAULT_POLL,
        }
    }
}

/// Builds the network transport `kind`, over TLS on every connection when `cfg.tls` is set
/// (tcp or grpc). Unusable TLS material is an error, never a plaintext cluster; so is TLS
/// asked of `shm`, which has none.
pub fn network_transport(kind: TransportKind, cfg: NetConfig) -> Result<Arc<dyn Transport>> {
    Ok(match kind {
        TransportKind::Tcp => Arc::new(tcp::TcpTransport::new(cfg)?),
        TransportKind::Grpc => Arc::new(grpc::GrpcTransport::new(cfg)?),
        TransportKind::Shm => Arc::new(tcp::TcpTransport::shm(cfg)?),
    })
}

/// Counts a listener's open accepted connections against [`NetConfig::max_connections`].
#[derive(Clone)]
pub(crate) struct ConnSlots {
    open: Arc<std::sync::atomic::AtomicUsize>,
    max: usize,
}

/// One open accepted connection; frees its slot when dropped.
pub(crate) struct ConnSlot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl ConnSlots {
    pub(crate) fn new(max: usize) -> Self {
        ConnSlots { open: Default::default(), max: max.max(1) }
    }
    /// A slot, or `None` when `max` connections are open.
    pub(crate) fn take(&self) -> Option<ConnSlot> {
        use std::sync::atomic::Ordering;
        let mut cur = self.open.load(Ordering::Acquire);
        loop {
            if cur >= self.max {
                return None;
            }
            match self.open.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(ConnSlot(self.open.clone())),
                Err(c) => cur = c,
            }
        }
    }
}

/// Copies a received frame's owned payloads `(k, v)` into the caller's buffers, which must
/// have exactly their sizes (the transports that receive whole messages use this).
pub(crate) fn fill_payload(peer: &str, k: &[u8], v: &[u8], keys: &mut [u8], values: &mut [u8]) -> Result<()> {
    if k.len() != keys.len() || v.len() != values.len() {
        return Err(TransportError::Protocol {
            peer: peer.to_string(),
            source: WireError::Malformed(format!(
                "payload buffers of {}+{} bytes for a frame of {}+{} bytes",
                keys.len(),
                values.len(),
                k.len(),
                v.len()
            )),
        });
    }
    keys.copy_from_slice(k);
    values.copy_from_slice(v);
    Ok(())
}

/// Views a slice of u64 keys as their little-endian bytes (no copy).
pub fn key_bytes(keys: &[u64]) -> &[u8] {
    bytemuck::cast_slice(keys)
}
/// Views a slice of f32 values as their little-endian bytes (no copy).
pub fn value_bytes(values: &[f32]) -> &[u8] {
    bytemuck::cast_slice(values)
}
/// Mutable byte view of u64 keys, for receiving into.
pub fn key_bytes_mut(keys: &mut [u64]) -> &mut [u8] {
    bytemuck::cast_slice_mut(keys)
}
/// Mutable byte view of f32 values, for receiving into.
pub fn value_bytes_mut(values: &mut [f32]) -> &mut [u8] {
    bytemuck::cast_slice_mut(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use downpour_core::msg::{self, Op};
    use std::time::Instant;

    /// Waits (bounded) for `c` to become readable.
    fn becomes_readable(c: &mut dyn Connection) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if c.readable().unwrap() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    fn readable_tells_a_waiting_frame_and_a_close_without_consuming(t: &dyn Transport, addr: &str) {
        let mut l = t.listen(addr).unwrap();
        let local = l.local_addr();
        // connecting over TLS, and over gRPC, waits for the handshake, which the accepted
        // side answers
        let (mut c, mut s) = std::thread::scope(|sc| {
            let c = sc.spawn(|| t.connect(&local, Duration::from_secs(5)).unwrap());
            let mut s = l.accept(Duration::from_secs(5)).unwrap().unwrap();
            if t.name() != "inproc" {
                // the server side's handshake runs in its reads; no frame comes (bounded:
                // the connect gives up after 5 s)
                let _ = s.set_recv_timeout(Some(Duration::from_millis(50)));
                while !c.is_finished() {
                    let _ = s.recv_header();
                }
                s.set_recv_timeout(None).unwrap();
            }
            (c.join().unwrap(), s)
        });
        assert!(!s.readable().unwrap(), "{}: nothing sent yet", t.name());
        let mut h = msg::request(Op::Push, 7, 42, 0, 1);
        c.send(&mut h, &[], &[1, 0, 0, 0]).unwrap();
        assert!(becomes_readable(s.as_mut()), "{}: a frame was sent", t.name());
        assert!(s.readable().unwrap(), "{}: asking again consumes nothing", t.name());
        let got = s.recv_header().unwrap().unwrap();
        assert_eq!((got.request_id, got.values_len), (42, 4));
        let mut v = [0u8; 4];
        s.recv_payload(&mut [], &mut v).unwrap();
        assert!(!s.readable().unwrap(), "{}: the frame was read", t.name());
        drop(c);
        assert!(becomes_readable(s.as_mut()), "{}: the peer closed", t.name());
        assert!(s.recv_header().unwrap().is_none());
    }

    #[test]
    fn tcp_readable_tells_a_waiting_frame_and_a_close_without_consuming() {
        readable_tells_a_waiting_frame_and_a_close_without_consuming(&tcp::TcpTransport::new(NetConfig::default()).unwrap(), "127.0.0.1:0");
    }

    #[cfg(feature = "test-tls")]
    #[test]
    fn tls_tcp_readable_tells_a_waiting_frame_and_a_close_without_consuming() {
        let t = tcp::TcpTransport::new(NetConfig { tls: Some(security::throwaway_tls()), ..NetConfig::default() }).unwrap();
        readable_tells_a_waiting_frame_and_a_close_without_consuming(&t, "127.0.0.1:0");
    }

    #[test]
    fn grpc_readable_tells_a_waiting_frame_and_a_close_without_consuming() {
        let t = network_transport(TransportKind::Grpc, NetConfig::default()).unwrap();
        readable_tells_a_waiting_frame_and_a_close_without_consuming(t.as_ref(), "127.0.0.1:0");
    }

    /// A receive with a timeout gives up after it (not before), the frames sent after that
    /// still arrive, receives that are answered in time leave the timeout as it was, and an
    /// idle wait after them times out again after the whole timeout (gRPC keeps one timer and
    /// moves it each receive).
    fn a_receive_times_out_and_later_frames_still_arrive(t: &dyn Transport, addr: &str) {
        const WAIT: Duration = Duration::from_millis(200);
        let mut l = t.listen(addr).unwrap();
        let local = l.local_addr();
        let (mut c, mut s) = std::thread::scope(|sc| {
            let c = sc.spawn(|| t.connect(&local, Duration::from_secs(5)).unwrap());
            let mut s = l.accept(Duration::from_secs(5)).unwrap().unwrap();
            // the accepted side's handshake runs in its reads (bounded by the connect's 5 s)
            let _ = s.set_recv_timeout(Some(Duration::from_millis(50)));
            while !c.is_finished() {
                let _ = s.recv_header();
            }
            (c.join().unwrap(), s)
        });
        c.set_recv_timeout(Some(WAIT)).unwrap();
        let times_out = |c: &mut dyn Connection, when: &str| {
            let t0 = Instant::now();
            let got = c.recv_header();
            let waited = t0.elapsed();
            assert!(matches!(got, Err(TransportError::Timeout { .. })), "{} {when}: {got:?}", t.name());
            assert!(waited >= WAIT.mul_f32(0.9) && waited < Duration::from_secs(3), "{} {when}: timed out after {waited:?}", t.name());
        };
        times_out(c.as_mut(), "before any frame");
        for id in 0..50u64 {
            s.send(&mut msg::request(Op::Push, 1, id, 0, 1), &[], &[1, 2, 3, 4]).unwrap();
            let h = c.recv_header().unwrap().unwrap();
            assert_eq!(h.request_id, id, "{}", t.name());
            c.recv_payload(&mut [], &mut [0; 4]).unwrap();
        }
        times_out(c.as_mut(), "after 50 frames in time");
        // frames that come a few ms apart: each receive waits past any polling, with its
        // timeout armed, and gets its frame
        std::thread::scope(|sc| {
            let sent = sc.spawn(|| {
                for id in 100..110u64 {
                    std::thread::sleep(Duration::from_millis(5));
                    s.send(&mut msg::request(Op::Push, 1, id, 0, 1), &[], &[]).unwrap();
                }
            });
            for id in 100..110u64 {
                assert_eq!(c.recv_header().unwrap().unwrap().request_id, id, "{}: a frame 5 ms after the last", t.name());
            }
            sent.join().unwrap();
        });
        std::thread::sleep(WAIT);
        s.send(&mut msg::request(Op::Push, 1, 99, 0, 1), &[], &[]).unwrap();
        assert_eq!(c.recv_header().unwrap().unwrap().request_id, 99, "{}: a frame after an idle spell", t.name());
        times_out(c.as_mut(), "once more");
        // a timeout shortened after a receive that waited under a long one: the short one holds
        c.set_recv_timeout(Some(Duration::from_secs(10))).unwrap();
        s.send(&mut msg::request(Op::Push, 1, 7, 0, 1), &[], &[]).unwrap();
        assert_eq!(c.recv_header().unwrap().unwrap().request_id, 7, "{}", t.name());
        c.set_recv_timeout(Some(WAIT)).unwrap();
        let t0 = Instant::now();
        assert!(matches!(c.recv_header(), Err(TransportError::Timeout { .. })), "{}: the shortened timeout", t.name());
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{}: timed out after {:?}, not after the shortened {WAIT:?}",
            t.name(),
            t0.elapsed()
        );
    }

    #[test]
    fn tcp_a_receive_times_out_and_later_frames_still_arrive() {
        a_receive_times_out_and_later_frames_still_arrive(&tcp::TcpTransport::new(NetConfig::default()).unwrap(), "127.0.0.1:0");
    }

    #[test]
    fn inproc_a_receive_times_out_and_later_frames_still_arrive() {
        a_receive_times_out_and_later_frames_still_arrive(&inproc::InProcTransport::new(), "inproc://timeouts");
    }

    #[test]
    fn grpc_a_receive_times_out_and_later_frames_still_arrive() {
        let t = network_transport(TransportKind::Grpc, NetConfig::default()).unwrap();
        a_receive_times_out_and_later_frames_still_arrive(t.as_ref(), "127.0.0.1:0");
    }

    #[cfg(feature = "test-tls")]
    #[test]
    fn grpc_tls_a_receive_times_out_and_later_frames_still_arrive() {
        let t = network_transport(TransportKind::Grpc, NetConfig { tls: Some(security::throwaway_tls()), ..NetConfig::default() }).unwrap();
        a_receive_times_out_and_later_frames_still_arrive(t.as_ref(), "127.0.0.1:0");
    }

    /// Frames larger than a gRPC chunk, keys and values across chunk edges, one of them
    /// skipped by the receiver, arrive whole and in order.
    fn large_frames_arrive_whole_and_a_skipped_one_is_drained(t: &dyn Transport, addr: &str) {
        let mut l = t.listen(addr).unwrap();
        let local = l.local_addr();
        let pattern = |n: usize, seed: u8| (0..n).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect::<Vec<u8>>();
        // (keys, values) in bytes: keys end inside a chunk, values span several; keys only;
        // values only; a payload of exactly two chunks
        let sizes = [(8 * 200_000, 4 * 700_000), (8 * 300_000, 0), (0, 4 * 500_001), (0, 2 << 20)];
        std::thread::scope(|sc| {
            // the accepting side reads first (over TLS its first read runs the handshake)
            let rx = sc.spawn(|| {
                let mut s = l.accept(Duration::from_secs(5)).unwrap().unwrap();
                for (i, &(k, v)) in sizes.iter().enumerate() {
                    let h = s.recv_header().unwrap().unwrap();
                    assert_eq!((h.request_id, h.keys_len, h.values_len), (i as u64, k as u64, v as u64), "{}: frame {i}", t.name());
                    if i == 1 {
                        continue; // skipped: the next header must still be frame 2's
                    }
                    let (mut kb, mut vb) = (vec![0; k], vec![0; v]);
                    s.recv_payload(&mut kb, &mut vb).unwrap();
                    assert!(kb == pattern(k, i as u8) && vb == pattern(v, 100 + i as u8), "{}: frame {i}'s payload", t.name());
                }
            });
            let mut c = t.connect(&local, Duration::from_secs(5)).unwrap();
            for (i, &(k, v)) in sizes.iter().enumerate() {
                let mut h = msg::request(Op::Push, 1, i as u64, 0, 1);
                c.send(&mut h, &pattern(k, i as u8), &pattern(v, 100 + i as u8)).unwrap();
            }
            rx.join().unwrap();
        });
    }

    #[test]
    fn grpc_large_frames_arrive_whole_and_a_skipped_one_is_drained() {
        let t = network_transport(TransportKind::Grpc, NetConfig::default()).unwrap();
        large_frames_arrive_whole_and_a_skipped_one_is_drained(t.as_ref(), "127.0.0.1:0");
    }

    fn small_rings() -> tcp::TcpTransport {
        // rings smaller than the frames: every frame wraps and waits for room
        tcp::TcpTransport::shm(NetConfig { shm_ring_bytes: shm::MIN_RING_BYTES, ..NetConfig::default() }).unwrap()
    }

    #[test]
    fn shm_readable_tells_a_waiting_frame_and_a_close_without_consuming() {
        readable_tells_a_waiting_frame_and_a_close_without_consuming(&small_rings(), "127.0.0.1:0");
    }

    #[test]
    fn shm_large_frames_arrive_whole_and_a_skipped_one_is_drained() {
        large_frames_arrive_whole_and_a_skipped_one_is_drained(&small_rings(), "127.0.0.1:0");
    }

    /// A frame of values that fits the ring is handed out in pieces once its last byte is
    /// there (the sender still writing when the receiver first asks); a frame with keys, or
    /// larger than the ring, is not, and arrives whole as usual; a piece past the frame's
    /// end is refused. Over framed TCP nothing is handed out in pieces.
    #[test]
    fn shm_hands_out_a_frame_of_values_in_pieces_once_it_is_whole_in_the_ring() {
        let pattern = |n: usize, seed: u8| (0..n).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect::<Vec<u8>>();
        let rings = tcp::TcpTransport::shm(NetConfig { shm_ring_bytes: 1 << 20, ..NetConfig::default() }).unwrap();
        let plain = tcp::TcpTransport::new(NetConfig::default()).unwrap();
        // (keys, values, handed out in pieces over the rings?)
        let frames = [(0, 4 * 200_001, true), (8 * 10, 4 * 1000, false), (0, 4 << 20, false), (0, 4 * 3, true)];
        for (t, rings) in [(&rings, true), (&plain, false)] {
            let mut l = t.listen("127.0.0.1:0").unwrap();
            let local = l.local_addr();
            std::thread::scope(|sc| {
                let rx = sc.spawn(|| {
                    let mut s = l.accept(Duration::from_secs(5)).unwrap().unwrap();
                    for (i, &(k, v, pieces)) in frames.iter().enumerate() {
                        let h = s.recv_header().unwrap().unwrap();
                        assert_eq!((h.keys_len, h.values_len), (k as u64, v as u64));
                        assert_eq!(s.payload_here().unwrap(), pieces && rings, "frame {i}");
                        let mut vb = vec![0u8; v];
                        if pieces && rings {
                            for part in vb.chunks_mut(4 * 7919) {
                                s.recv_values_piece(part).unwrap();
                            }
                            assert!(s.recv_values_piece(&mut [0; 4]).is_err(), "a piece past the frame's end");
                        } else {
                            let mut kb = vec![0u8; k];
                            s.recv_payload(&mut kb, &mut vb).unwrap();
                            assert_eq!(kb, pattern(k, i as u8));
                        }
                        assert!(vb == pattern(v, 50 + i as u8), "frame {i}'s values");
                    }
                });
                let mut c = t.connect(&local, Duration::from_secs(5)).unwrap();
                for (i, &(k, v, _)) in frames.iter().enumerate() {
                    let mut h = msg::request(Op::PushRange, 1, i as u64, 0, 1);
                    c.send(&mut h, &pattern(k, i as u8), &pattern(v, 50 + i as u8)).unwrap();
                }
                rx.join().unwrap();
            });
        }
    }

    #[test]
    fn shm_refuses_tls_and_odd_ring_sizes_saying_why() {
        let tls = tcp::TcpTransport::shm(NetConfig {
            tls: Some(TlsConfig { cert_pem: vec![], key_pem: vec![], ca_pem: vec![], require_client_cert: true, server_name: None }),
            ..NetConfig::default()
        });
        assert!(tls.is_err_and(|e| e.to_string().contains("--transport tcp with --tls")));
        for bad in [3000, 128 << 10, 300 << 10, 2 << 30] {
            let r = tcp::TcpTransport::shm(NetConfig { shm_ring_bytes: bad, ..NetConfig::default() });
            assert!(r.is_err_and(|e| e.to_string().contains("power of two")), "{bad}");
        }
    }

    #[test]
    fn shm_and_tcp_peers_refuse_each_other_with_a_reason() {
        let shm = small_rings();
        let tcp = tcp::TcpTransport::new(NetConfig::default()).unwrap();
        // a shm client at a tcp server: the server reads garbage and closes
        let mut l = tcp.listen("127.0.0.1:0").unwrap();
        let local = l.local_addr();
        std::thread::scope(|sc| {
            sc.spawn(|| {
                if let Ok(Some(mut s)) = l.accept(Duration::from_secs(5)) {
                    let _ = s.recv_header();
                }
            });
            let e = shm.connect(&local, Duration::from_secs(5)).err().unwrap().to_string();
            assert!(e.contains("--transport shm"), "{e}");
        });
        // a tcp client at a shm server: refused, naming the transport
        let mut l = shm.listen("127.0.0.1:0").unwrap();
        let local = l.local_addr();
        let mut c = tcp.connect(&local, Duration::from_secs(5)).unwrap();
        let mut h = msg::request(Op::Push, 7, 42, 0, 1);
        c.send(&mut h, &[], &[1, 0, 0, 0]).unwrap();
        let mut s = l.accept(Duration::from_secs(5)).unwrap().unwrap();
        let e = s.recv_header().err().unwrap().to_string();
        assert!(e.contains("--transport shm"), "{e}");
    }

    #[test]
    fn tcp_large_frames_arrive_whole_and_a_skipped_one_is_drained() {
        large_frames_arrive_whole_and_a_skipped_one_is_drained(&tcp::TcpTransport::new(NetConfig::default()).unwrap(), "127.0.0.1:0");
    }

    #[cfg(feature = "test-tls")]
    #[test]
    fn tls_tcp_large_frames_arrive_whole_and_a_skipped_one_is_drained() {
        let t = tcp::TcpTransport::new(NetConfig { tls: Some(security::throwaway_tls()), ..NetConfig::default() }).unwrap();
        large_frames_arrive_whole_and_a_skipped_one_is_drained(&t, "127.0.0.1:0");
    }

    #[test]
    fn inproc_readable_tells_a_waiting_frame_and_a_close_without_consuming() {
        readable_tells_a_waiting_frame_and_a_close_without_consuming(&inproc::InProcTransport::new(), "inproc://readable");
    }
}
