//! Framed TCP: the frame layout of [`downpour_core::codec`] over blocking sockets.

use crate::{Connection, Listener, NetConfig, Result, TrafficStats, Transport, TransportError};
use downpour_core::codec::{self, FrameLimits};
use downpour_core::proto::FrameHeader;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Framed TCP transport.
pub struct TcpTransport {
    cfg: NetConfig,
}

impl TcpTransport {
    /// A transport enforcing `cfg.limits` on receive.
    pub fn new(cfg: NetConfig) -> Self {
        TcpTransport { cfg }
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn connect(&self, addr: &str, timeout: Duration) -> Result<Box<dyn Connection>> {
        let err = |reason: String| TransportError::Connect { addr: addr.to_string(), reason };
        let sa = addr
            .to_socket_addrs()
            .map_err(|e| err(format!("bad address: {e}")))?
            .next()
            .ok_or_else(|| err("address resolves to nothing".into()))?;
        let stream = TcpStream::connect_timeout(&sa, timeout).map_err(|e| err(e.to_string()))?;
        Ok(Box::new(TcpConnection::new(stream, addr.to_string(), self.cfg.limits).map_err(|e| err(e.to_string()))?))
    }

    fn listen(&self, addr: &str) -> Result<Box<dyn Listener>> {
        let l = TcpListener::bind(addr).map_err(|e| TransportError::Bind {
            addr: addr.to_string(),
            reason: if e.kind() == io::ErrorKind::AddrInUse {
                "the address is already in use (is another node running on this port?)".into()
            } else {
                e.to_string()
            },
        })?;
        l.set_nonblocking(true).map_err(|e| TransportError::Bind { addr: addr.to_string(), reason: e.to_string() })?;
        let local = l.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| addr.to_string());
        Ok(Box::new(TcpListenerBox { l, local, limits: self.cfg.limits }))
    }
}

struct TcpListenerBox {
    l: TcpListener,
    local: String,
    limits: FrameLimits,
}

impl Listener for TcpListenerBox {
    fn local_addr(&self) -> String {
        self.local.clone()
    }
    fn accept(&mut self, timeout: Duration) -> Result<Option<Box<dyn Connection>>> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.l.accept() {
                Ok((s, peer)) => {
                    let c = TcpConnection::new(s, peer.to_string(), self.limits)
                        .map_err(|e| TransportError::Io { peer: peer.to_string(), source: e })?;
                    return Ok(Some(Box::new(c)));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Ok(None);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                // A connection reset before we accepted it is the peer's problem, not ours.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(TransportError::Io { peer: self.local.clone(), source: e }),
            }
        }
    }
}

/// One framed TCP connection.
pub struct TcpConnection {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    peer: String,
    limits: FrameLimits,
    hbuf: Vec<u8>,
    pending: Option<(u64, u64)>,
    timeout: Option<Duration>,
    stats: TrafficStats,
}

impl TcpConnection {
    fn new(stream: TcpStream, peer: String, limits: FrameLimits) -> io::Result<Self> {
        stream.set_nonblocking(false)?;
        // Small frames must not wait for Nagle (44 ms stalls otherwise).
        stream.set_nodelay(true)?;
        let reader = BufReader::with_capacity(64 << 10, stream.try_clone()?);
        Ok(TcpConnection {
            reader,
            writer: stream,
            peer,
            limits,
            hbuf: Vec::with_capacity(256),
            pending: None,
            timeout: None,
            stats: Default::default(),
        })
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
        while !bufs.is_empty() {
            match self.writer.write_vectored(bufs) {
                Ok(0) => return Err(TransportError::Closed { peer: self.peer.clone() }),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let peer = self.peer.clone();
                    return Err(match e.kind() {
                        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => TransportError::Closed { peer },
                        _ => TransportError::Io { peer, source: e },
                    });
                }
            }
        }
        self.stats.bytes_sent += total as u64;
        self.stats.frames_sent += 1;
        Ok(())
    }

    fn recv_header(&mut self) -> Result<Option<FrameHeader>> {
        if let Some((k, v)) = self.pending.take() {
            // The caller skipped a payload: drain it to stay in sync.
            let mut sink = io::sink();
            io::copy(&mut (&mut self.reader).take(k + v), &mut sink).map_err(|e| self.io_err(e))?;
        }
        let mut len = [0u8; 4];
        // A clean close between frames is not an error.
        match self.reader.read(&mut len[..1]) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(None),
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

    fn recv_payload(&mut self, keys: &mut [u8], values: &mut [u8]) -> Result<()> {
        let (k, v) = self.pending.take().unwrap_or((0, 0));
        if keys.len() as u64 != k || values.len() as u64 != v {
            return Err(TransportError::Protocol {
                peer: self.peer.clone(),
                source: downpour_core::CoreError::Malformed(format!(
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

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.timeout = timeout;
        self.reader.get_ref().set_read_timeout(timeout).map_err(|e| TransportError::Io { peer: self.peer.clone(), source: e })
    }

    fn peer(&self) -> &str {
        &self.peer
    }

    fn stats(&self) -> TrafficStats {
        self.stats
    }
}
