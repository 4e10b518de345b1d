//! Framed TCP: the frame layout of [`downpour_core::codec`] over blocking sockets, in the
//! clear or over TLS (the crate's `tls` module) when the [`NetConfig`] carries TLS material;
//! and, as `--transport shm`, the same frames through shared-memory rings between processes
//! on one host, the socket beside them kept as doorbell and lifeline ([`crate::shm`]).

use crate::security::{check_token, AuthToken, RefusalLog};
use crate::shm::{Link, ShmStream};
use crate::spin::{self, Backoff, Spin};
use crate::tls::{Half, TlsSetup};
use crate::{ConnSlot, ConnSlots, Connection, Listener, NetConfig, Result, TrafficStats, Transport, TransportError};
use downpour_core::codec::{self, FrameLimits};
use downpour_core::msg::{self, Op, Status};
use downpour_core::proto::FrameHeader;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

/// Framed TCP transport (or, made with [`TcpTransport::shm`], framed shared memory).
pub struct TcpTransport {
    cfg: NetConfig,
    tls: Option<Arc<TlsSetup>>,
    /// Frames through shared-memory rings of [`NetConfig::shm_ring_bytes`] ([`crate::shm`]).
    shm: bool,
}

impl TcpTransport {
    /// A transport enforcing `cfg.limits` on receive, over TLS when `cfg.tls` is set (every
    /// connection, both ways: mutual authentication against the CA when
    /// `require_client_cert`). Fails when the TLS material is unusable, saying why.
    pub fn new(cfg: NetConfig) -> Result<Self> {
        let tls = match &cfg.tls {
            Some(t) => Some(Arc::new(TlsSetup::new(t).map_err(|reason| TransportError::Bind { addr: "tcp transport".into(), reason })?)),
            None => None,
        };
        Ok(TcpTransport { cfg, tls, shm: false })
    }

    /// The same frames through shared memory between processes on one host
    /// (`--transport shm`): addresses, listening and the token handshake as over TCP; every
    /// peer must use this transport too. `cfg.tls` is refused (there is no network to protect
    /// on one host; use framed TCP with TLS between hosts), as is a ring size that is not a
    /// power of two from 256 KiB ([`crate::shm::MIN_RING_BYTES`]) to 1 GiB.
    pub fn shm(cfg: NetConfig) -> Result<Self> {
        let bad = |reason: String| TransportError::Bind { addr: "shm transport".into(), reason };
        if cfg.tls.is_some() {
            return Err(bad("--transport shm carries frames between processes on one host and has no TLS; \
                 between hosts use --transport tcp with --tls-*"
                .into()));
        }
        let r = cfg.shm_ring_bytes;
        if !r.is_power_of_two() || !(crate::shm::MIN_RING_BYTES..=crate::shm::MAX_RING_BYTES).contains(&r) {
            return Err(bad(format!("shared-memory rings of {r} bytes: give a power of two from 256 KiB to 1 GiB")));
        }
        Ok(TcpTransport { cfg, tls: None, shm: true })
    }
}

/// What carries a connection's bytes beside (or over) its socket.
enum Carrier {
    Plain,
    Tls(crate::tls::TlsStream),
    Shm(Arc<Link>),
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        if self.shm {
            "shm"
        } else {
            "tcp"
        }
    }

    fn connect(&self, addr: &str, timeout: Duration) -> Result<Box<dyn Connection>> {
        let err = |reason: String| TransportError::Connect { addr: addr.to_string(), reason };
        let sa = addr
            .to_socket_addrs()
            .map_err(|e| err(format!("bad address: {e}")))?
            .next()
            .ok_or_else(|| err("address resolves to nothing".into()))?;
        let stream = TcpStream::connect_timeout(&sa, timeout).map_err(|e| err(e.to_string()))?;
        let carrier = match &self.tls {
            Some(setup) => {
                let mut t = setup.client(stream.try_clone().map_err(|e| err(e.to_string()))?, addr).map_err(err)?;
                stream.set_read_timeout(Some(timeout)).map_err(|e| err(e.to_string()))?;
                t.handshake().map_err(|e| err(format!("TLS handshake: {e}")))?;
                stream.set_read_timeout(None).map_err(|e| err(e.to_string()))?;
                Carrier::Tls(t)
            }
            None if self.shm => {
                let sock = stream.try_clone().map_err(|e| err(e.to_string()))?;
                Carrier::Shm(Arc::new(Link::connect(sock, self.cfg.shm_ring_bytes, timeout).map_err(err)?))
            }
            None => Carrier::Plain,
        };
        let mut c =
            TcpConnection::new(stream, carrier, addr.to_string(), self.cfg.limits, self.cfg.poll, None).map_err(|e| err(e.to_string()))?;
        if let Some(token) = &self.cfg.auth {
            c.client_hello(token, timeout).map_err(err)?;
        }
        Ok(Box::new(c))
    }

    fn listen(&self, addr: &str) -> Result<Box<dyn Listener>> {
        let (l, local) = crate::wait::bind(addr)?;
        Ok(Box::new(TcpListenerBox {
            l,
            local,
            tls: self.tls.clone(),
            limits: self.cfg.limits,
            auth: self.cfg.auth.clone(),
            shm: self.shm,
            slots: ConnSlots::new(self.cfg.max_connections),
            refusals: RefusalLog::default(),
            handshake_timeout: self.cfg.handshake_timeout,
            poll: self.cfg.poll,
        }))
    }
}

struct TcpListenerBox {
    l: TcpListener,
    local: String,
    tls: Option<Arc<TlsSetup>>,
    limits: FrameLimits,
    auth: Option<AuthToken>,
    shm: bool,
    slots: ConnSlots,
    refusals: RefusalLog,
    handshake_timeout: Duration,
    poll: Duration,
}

impl Listener for TcpListenerBox {
    fn local_addr(&self) -> String {
        self.local.clone()
    }
    fn accept(&mut self, timeout: Duration) -> Result<Option<Box<dyn Connection>>> {
        let TcpListenerBox { l, local, tls, limits, auth, shm, slots, refusals, handshake_timeout, poll } = self;
        crate::wait::accept_within(l, local, timeout, slots, refusals, |s, peer, slot| {
            let side = Accepted {
                auth: auth.clone(),
                refusals: refusals.clone(),
                _slot: slot,
                handshake: true,
                handshake_timeout: *handshake_timeout,
            };
            // the TLS (or shared-memory) handshake runs in the connection's thread, on its
            // first read
            let carrier = match tls {
                Some(setup) => match s.try_clone().map_err(|e| e.to_string()).and_then(|c| setup.server(c)) {
                    Ok(t) => Carrier::Tls(t),
                    Err(why) => {
                        refusals.refused(&peer.to_string(), &why);
                        return None;
                    }
                },
                // an error here: the peer went away before we set the socket up (its problem)
                None if *shm => Carrier::Shm(Arc::new(Link::pending(s.try_clone().ok()?))),
                None => Carrier::Plain,
            };
            let c: Box<dyn Connection> = Box::new(TcpConnection::new(s, carrier, peer.to_string(), *limits, *poll, Some(side)).ok()?);
            Some(c)
        })
    }
}

/// The accepting side of a connection: the token it must present, and its slot.
struct Accepted {
    auth: Option<AuthToken>,
    refusals: RefusalLog,
    _slot: ConnSlot,
    /// The first frame has not been read yet.
    handshake: bool,
    /// How long the handshake may take ([`NetConfig::handshake_timeout`]).
    handshake_timeout: Duration,
}

/// One framed TCP connection.
pub struct TcpConnection {
    reader: BufReader<Half>,
    writer: Half,
    /// The socket itself: timeouts, and peeking for [`Connection::readable`].
    sock: TcpStream,
    tls: bool,
    /// The shared-memory rings, when the frames go through them.
    shm: Option<Arc<Link>>,
    peer: String,
    limits: FrameLimits,
    hbuf: Vec<u8>,
    pending: Option<(u64, u64)>,
    timeout: Option<Duration>,
    stats: TrafficStats,
    accepted: Option<Accepted>,
    /// How a wait for the next frame polls the socket first, if it does ([`NetConfig::poll`]),
    /// and whether this one does.
    poll: Option<Spin>,
    spin: Backoff,
}

impl TcpConnection {
    fn new(
        stream: TcpStream,
        carrier: Carrier,
        peer: String,
        limits: FrameLimits,
        poll: Duration,
        accepted: Option<Accepted>,
    ) -> io::Result<Self> {
        stream.set_nonblocking(false)?;
        // Small frames must not wait for Nagle (44 ms stalls otherwise).
        stream.set_nodelay(true)?;
        let plain = matches!(carrier, Carrier::Plain);
        if accepted.as_ref().is_some_and(|a| a.auth.is_some()) || (accepted.is_some() && !plain) {
            // a peer that connects and says nothing (or never finishes the TLS or
            // shared-memory handshake) does not hold the connection for long
            stream.set_read_timeout(accepted.as_ref().map(|a| a.handshake_timeout))?;
        }
        let is_tls = matches!(carrier, Carrier::Tls(_));
        let mut shm = None;
        let (read_half, write_half) = match carrier {
            Carrier::Tls(t) => {
                let t = Arc::new(parking_lot::Mutex::new(t));
                (Half::Tls(t.clone()), Half::Tls(t))
            }
            Carrier::Shm(link) => {
                shm = Some(link.clone());
                (Half::Shm(ShmStream(link.clone())), Half::Shm(ShmStream(link)))
            }
            Carrier::Plain => (Half::Plain(stream.try_clone()?), Half::Plain(stream.try_clone()?)),
        };
        Ok(TcpConnection {
            reader: BufReader::with_capacity(64 << 10, read_half),
            writer: write_half,
            sock: stream,
            tls: is_tls,
            shm,
            peer,
            limits,
            hbuf: Vec::with_capacity(256),
            pending: None,
            timeout: None,
            stats: Default::default(),
            accepted,
            poll: spin::network(poll),
            spin: Backoff::default(),
        })
    }

    /// (Connecting side.) Presents `token` and waits up to `timeout` for the verdict; the
    /// error is the server's reason.
    fn client_hello(&mut self, token: &AuthToken, timeout: Duration) -> std::result::Result<(), String> {
        let mut h = msg::request(Op::Hello, 0, 0, 0, 0);
        h.meta = token.secret().as_bytes().to_vec().into();
        self.send(&mut h, &[], &[]).map_err(|e| e.to_string())?;
        self.set_recv_timeout(Some(timeout)).map_err(|e| e.to_string())?;
        let r = match self.recv_header() {
            Ok(Some(r)) => r,
            Ok(None) => return Err("the server closed the connection during the handshake".into()),
            Err(e) => return Err(format!("handshake: {e}")),
        };
        if r.keys_len + r.values_len > 0 || r.op != Op::Hello as u32 {
            return Err("the server answered the handshake with something else".into());
        }
        if r.status != 0 {
            return Err(format!("refused by the server ({:?}): {}", Status::from_u32(r.status), r.error));
        }
        self.set_recv_timeout(None).map_err(|e| e.to_string())
    }

    /// (Accepting side.) Checks the connection's first frame: a `Hello` with the token when
    /// one is required (answered here, then the next frame is returned); any other first
    /// frame is returned as is when no token is required.
    fn accept_first(&mut self, first: FrameHeader) -> Result<Option<FrameHeader>> {
        let Some(acc) = &self.accepted else { return Ok(Some(first)) };
        let hello = first.op == Op::Hello as u32;
        let verdict = match &acc.auth {
            None => Ok(()),
            Some(t) => check_token(t, hello.then_some(first.meta.as_ref())),
        };
        let refusals = acc.refusals.clone();
        // back to the caller's timeout (the handshake had its own)
        self.sock.set_read_timeout(self.timeout).map_err(|e| self.io_err(e))?;
        if hello {
            if let Some((k, v)) = self.pending.take() {
                io::copy(&mut (&mut self.reader).take(k + v), &mut io::sink()).map_err(|e| self.io_err(e))?;
            }
        }
        match verdict {
            Ok(()) if hello => {
                let mut ok = msg::reply_to(&first, 0);
                self.send(&mut ok, &[], &[])?;
                self.read_header()
            }
            Ok(()) => Ok(Some(first)),
            Err(why) => {
                refusals.refused(&self.peer, why);
                let mut no = msg::error_reply(&first, 0, Status::Unauthenticated, why);
                no.op = Op::Hello as u32;
                // best effort: the peer may not wait for the answer
                let _ = self.send(&mut no, &[], &[]);
                Err(TransportError::Refused { peer: self.peer.clone(), reason: why.to_string() })
            }
        }
    }

    fn io_err(&self, e: io::Error) -> TransportError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                TransportError::Timeout { peer: self.peer.clone(), after: self.timeout.unwrap_or_default() }
            }
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted => TransportError::Closed { peer: self.peer.clone() },
            _ => TransportError::Io { peer: self.peer.clone(), source: e },
        }
    }
}

impl Connection for TcpConnection {
    fn send(&mut self, header: &mut FrameHeader, keys: &[u8], values: &[u8]) -> Result<()> {
        header.keys_len = keys.len() as u64;
        header.values_len = values.len() as u64;
        self.hbuf.clear();
        codec::encode_header(header, &mut self.hbuf);
        // Small frames go out in one write (one segment, one wake-up at the peer).
        let inline = keys.len() + values.len() <= 16 << 10;
        if inline {
            self.hbuf.extend_from_slice(keys);
            self.hbuf.extend_from_slice(values);
        }
        let total = self.hbuf.len() + if inline { 0 } else { keys.len() + values.len() };
        // At most three slices, on the stack: no allocation per frame.
        let mut slices = [IoSlice::new(&self.hbuf), IoSlice::new(&[]), IoSlice::new(&[])];
        let mut n = 1;
        if !inline {
            for p in [keys, values] {
                if !p.is_empty() {
                    slices[n] = IoSlice::new(p);
                    n += 1;
                }
            }
        }
        let mut bufs = &mut slices[..n];
        let closed_or = |peer: String, e: io::Error| match e.kind() {
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => TransportError::Closed { peer },
            _ => TransportError::Io { peer, source: e },
        };
        while !bufs.is_empty() {
            match self.writer.write_vectored(bufs) {
                Ok(0) => return Err(TransportError::Closed { peer: self.peer.clone() }),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(closed_or(self.peer.clone(), e)),
            }
        }
        self.stats.bytes_sent += total as u64;
        self.stats.frames_sent += 1;
        Ok(())
    }

    fn recv_header(&mut self) -> Result<Option<FrameHeader>> {
        if (self.tls && self.accepted.as_ref().is_some_and(|a| a.handshake)) || self.shm.as_ref().is_some_and(|l| !l.is_open()) {
            self.carrier_handshake()?;
        }
        let h = self.read_header()?;
        match (h, &mut self.accepted) {
            (Some(h), Some(acc)) if acc.handshake => {
                acc.handshake = false;
                self.accept_first(h)
            }
            (h, _) => Ok(h),
        }
    }

    fn recv_payload(&mut self, keys: &mut [u8], values: &mut [u8]) -> Result<()> {
        self.read_payload(keys, values)
    }

    fn payload_here(&mut self) -> Result<bool> {
        let (Some((0, v)), Some(link)) = (self.pending, self.shm.as_ref().filter(|l| l.is_open())) else { return Ok(false) };
        // what the read-ahead buffer holds of it already, and the rest, in the ring
        let buffered = (self.reader.buffer().len() as u64).min(v);
        let Ok(rest) = usize::try_from(v - buffered) else { return Ok(false) };
        link.wait_filled(rest).map_err(|e| self.io_err(e))
    }

    fn recv_values_piece(&mut self, values: &mut [u8]) -> Result<()> {
        let n = values.len() as u64;
        match self.pending {
            Some((0, v)) if n <= v => {
                self.pending = (v > n).then_some((0, v - n));
                self.reader.read_exact(values).map_err(|e| self.io_err(e))
            }
            _ => Err(TransportError::Protocol {
                peer: self.peer.clone(),
                source: downpour_wire::WireError::Malformed(format!("a piece of {n} bytes beyond the frame's values")),
            }),
        }
    }

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.timeout = timeout;
        self.sock.set_read_timeout(timeout).map_err(|e| TransportError::Io { peer: self.peer.clone(), source: e })
    }

    fn readable(&mut self) -> Result<bool> {
        if !self.reader.buffer().is_empty() || self.writer.bytes_waiting() {
            return Ok(true);
        }
        if let Some(link) = self.shm.as_ref().filter(|l| l.is_open()) {
            // the socket carries only doorbells now: ask the ring
            return link.readable().map_err(|e| TransportError::Io { peer: self.peer.clone(), source: e });
        }
        Ok(socket_readable(&self.sock))
    }

    fn peer(&self) -> &str {
        &self.peer
    }

    fn stats(&self) -> TrafficStats {
        self.stats
    }
}

/// Whether a read of `sock` would start now, asked with one non-blocking peek (no change to
/// the socket's blocking mode): a byte, the peer's close (0) or an error other than "would
/// block" all mean it would.
fn socket_readable(sock: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    let fd = std::os::fd::AsRawFd::as_raw_fd(sock);
    // SAFETY: `fd` is this connection's open socket and `b` a valid 1-byte buffer.
    let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    if n >= 0 {
        return true;
    }
    let e = io::Error::last_os_error();
    !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted)
}

impl Drop for TcpConnection {
    fn drop(&mut self) {
        self.writer.close();
    }
}

impl TcpConnection {
    /// (Accepting side.) Runs the TLS or the shared-memory handshake under the handshake
    /// timeout; a failure (no certificate, one the CA did not sign, a plaintext peer; a plain
    /// TCP peer at a shm node, a file that is not this connection's rings) is a logged refusal.
    fn carrier_handshake(&mut self) -> Result<()> {
        let r = match (&self.writer, &self.shm) {
            (Half::Tls(t), _) => t.lock().handshake().map_err(|e| format!("TLS handshake failed: {e}")),
            (_, Some(link)) if !link.is_open() => link.accept(),
            _ => return Ok(()),
        };
        if let Err(why) = r {
            if let Some(acc) = &mut self.accepted {
                acc.refusals.refused(&self.peer, &why);
                acc.handshake = false;
            }
            return Err(TransportError::Refused { peer: self.peer.clone(), reason: why });
        }
        if self.accepted.as_ref().is_some_and(|a| a.auth.is_none()) {
            // no token to wait for: back to the caller's timeout
            self.sock.set_read_timeout(self.timeout).map_err(|e| self.io_err(e))?;
        }
        Ok(())
    }

    fn read_header(&mut self) -> Result<Option<FrameHeader>> {
        if let Some((k, v)) = self.pending.take() {
            // The caller skipped a payload: drain it to stay in sync.
            let mut sink = io::sink();
            io::copy(&mut (&mut self.reader).take(k + v), &mut sink).map_err(|e| self.io_err(e))?;
        }
        if self.shm.is_none() && self.reader.buffer().is_empty() && !self.writer.bytes_waiting() {
            // Nothing read ahead: poll the socket briefly before the read below sleeps in
            // the kernel (the rings poll their own way, inside their reads) — unless a recent
            // poll came up empty: this peer's frames come further apart than that, and
            // polling would only take a core from the threads that are working.
            let sock = &self.sock;
            self.spin.poll_for(self.poll, || socket_readable(sock).then_some(()));
        }
        let mut len = [0u8; 4];
        // A clean close between frames is not an error (nor, on TLS, a close without the
        // close_notify: a killed peer sends none, as a killed plaintext peer sends no FIN).
        match self.reader.read(&mut len[..1]) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(None),
            Err(e) if self.tls && e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(self.io_err(e)),
        }
        self.reader.read_exact(&mut len[1..]).map_err(|e| self.io_err(e))?;
        let hlen = codec::check_header_len(u32::from_le_bytes(len))
            .map_err(|e| TransportError::Protocol { peer: self.peer.clone(), source: e })?;
        self.hbuf.resize(hlen, 0);
        self.reader.read_exact(&mut self.hbuf).map_err(|e| self.io_err(e))?;
        let h =
            codec::decode_header(&self.hbuf, &self.limits).map_err(|e| TransportError::Protocol { peer: self.peer.clone(), source: e })?;
        if h.keys_len + h.values_len > 0 {
            self.pending = Some((h.keys_len, h.values_len));
        }
        self.stats.bytes_received += 4 + hlen as u64 + h.keys_len + h.values_len;
        self.stats.frames_received += 1;
        Ok(Some(h))
    }

    fn read_payload(&mut self, keys: &mut [u8], values: &mut [u8]) -> Result<()> {
        let (k, v) = self.pending.take().unwrap_or((0, 0));
        if keys.len() as u64 != k || values.len() as u64 != v {
            return Err(TransportError::Protocol {
                peer: self.peer.clone(),
                source: downpour_wire::WireError::Malformed(format!(
                    "payload buffers of {}+{} bytes for a frame of {k}+{v} bytes",
                    keys.len(),
                    values.len()
                )),
            });
        }
        self.reader.read_exact(keys).map_err(|e| self.io_err(e))?;
        self.reader.read_exact(values).map_err(|e| self.io_err(e))?;
        Ok(())
    }
}
