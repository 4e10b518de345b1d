//! gRPC transport (tonic): each connection is one `DataPlane/Exchange` bidirectional
//! stream of [`Frame`]s whose `keys`/`values` are `bytes` fields holding the same
//! little-endian payloads as the framed-TCP transport.
//!
//! The blocking [`Connection`] calls run the async stream on a small tokio runtime owned by
//! the transport. HTTP/2 windows are raised (16 MiB by default). A frame's payload travels
//! in messages of at most `CHUNK` (1 MiB) bytes (the proto's `Frame` says how), so the receiver
//! copies a large frame out while the rest is on the way instead of waiting for all of it;
//! the codec sizes its buffers for whole chunks (no growth copies).

use crate::security::{check_token, RefusalLog, TOKEN_METADATA_KEY};
use crate::{ConnSlot, ConnSlots, Connection, Listener, NetConfig, Result, TrafficStats, Transport, TransportError};
use bytes::Bytes;
use downpour_core::codec;
use downpour_core::proto::{Frame, FrameHeader};
use prost::Message;
use std::pin::Pin;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::codec::BufferSettings;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

#[allow(missing_docs, clippy::all)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/downpour.v1.rs"));
}
use generated::data_plane_client::DataPlaneClient;
use generated::data_plane_server::{DataPlane, DataPlaneServer};

/// HTTP/2 frame size: 1 MiB frames instead of the default 16 KiB, so a chunk of a few MiB
/// is a handful of frames rather than hundreds.
const MAX_H2_FRAME: u32 = 1 << 20;

/// Payload bytes per gRPC message at most: a larger frame is sent as several messages.
pub(crate) const CHUNK: usize = 1 << 20;

/// Room for one chunk's message (payload, header, protobuf tags).
const CHUNK_BUF: usize = CHUNK + (64 << 10);

/// prost's encoding of [`Frame`]s into a buffer reserved for the whole message, and its
/// decoding (the payload fields come out as slices of the receive buffer, no copy), with
/// buffers sized for whole chunks. Named by the generated code (`build.rs`).
#[derive(Default)]
pub(crate) struct FrameCodec;

impl tonic::codec::Codec for FrameCodec {
    type Encode = Frame;
    type Decode = Frame;
    type Encoder = FrameEncoder;
    type Decoder = tonic_prost::ProstDecoder<Frame>;

    fn encoder(&mut self) -> FrameEncoder {
        FrameEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(BufferSettings::new(CHUNK_BUF, 32 << 10))
    }
}

/// [`FrameCodec`]'s encoder.
pub(crate) struct FrameEncoder;

impl tonic::codec::Encoder for FrameEncoder {
    type Item = Frame;
    type Error = Status;

    fn encode(&mut self, item: Frame, dst: &mut tonic::codec::EncodeBuf<'_>) -> std::result::Result<(), Status> {
        dst.reserve(item.encoded_len());
        item.encode(dst).map_err(|e| Status::internal(format!("encoding a frame: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(CHUNK_BUF, 32 << 10)
    }
}

/// gRPC transport.
pub struct GrpcTransport {
    rt: Runtime,
    cfg: NetConfig,
}

impl GrpcTransport {
    /// Starts the transport's runtime (two threads).
    pub fn new(cfg: NetConfig) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("downpour-grpc")
            .enable_all()
            .build()
            .map_err(|e| TransportError::Io { peer: "grpc runtime".into(), source: e })?;
        Ok(GrpcTransport { rt, cfg })
    }

    /// The largest message either side sends or accepts: one chunk and a header. A frame's
    /// whole size is checked against the frame limit from its header, before any buffer for
    /// it is allocated.
    fn max_msg(&self) -> usize {
        CHUNK + codec::MAX_HEADER_BYTES + 1024
    }
}

impl Transport for GrpcTransport {
    fn name(&self) -> &'static str {
        "grpc"
    }

    fn connect(&self, addr: &str, timeout: Duration) -> Result<Box<dyn Connection>> {
        let err = |reason: String| TransportError::Connect { addr: addr.to_string(), reason };
        let scheme = if self.cfg.tls.is_some() { "https" } else { "http" };
        let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}")).map_err(|e| err(e.to_string()))?;
        if let Some(tls) = &self.cfg.tls {
            let host = match addr.rsplit_once(':') {
                Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']').to_string(),
                None => addr.to_string(),
            };
            let cfg = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&tls.ca_pem))
                .identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem))
                .domain_name(tls.server_name.clone().unwrap_or(host));
            endpoint = endpoint.tls_config(cfg).map_err(|e| err(format!("TLS settings: {e}")))?;
        }
        let token = match &self.cfg.auth {
            Some(t) => Some(MetadataValue::try_from(t.secret()).map_err(|e| err(format!("auth token: {e}")))?),
            None => None,
        };
        let endpoint = endpoint
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            .initial_stream_window_size(self.cfg.grpc_window)
            .initial_connection_window_size(self.cfg.grpc_window)
            .http2_adaptive_window(false)
            .max_frame_size(MAX_H2_FRAME);
        let max = self.max_msg();
        let (tx, rx) = mpsc::channel::<Frame>(4);
        let inbound = self.rt.block_on(async move {
            let channel = endpoint.connect().await.map_err(|e| err(format!("{e} ({:?})", std::error::Error::source(&e))))?;
            let mut client = DataPlaneClient::new(channel).max_decoding_message_size(max).max_encoding_message_size(max);
            let mut req = Request::new(ReceiverStream::new(rx));
            if let Some(t) = token {
                req.metadata_mut().insert(TOKEN_METADATA_KEY, t);
            }
            let resp = client.exchange(req).await.map_err(|e| match e.code() {
                tonic::Code::Unauthenticated | tonic::Code::ResourceExhausted => err(format!("refused by the server: {}", e.message())),
                _ => err(e.message().to_string()),
            })?;
            Ok::<_, TransportError>(resp.into_inner())
        })?;
        Ok(Box::new(GrpcConnection {
            handle: self.rt.handle().clone(),
            tx: Outbound::Client(tx),
            inbound: Inbound::Client(inbound),
            peer: addr.to_string(),
            current: None,
            max_payload: self.cfg.limits.max_payload_bytes,
            peeked: None,
            timeout: None,
            stats: Default::default(),
            _slot: None,
        }))
    }

    fn listen(&self, addr: &str) -> Result<Box<dyn Listener>> {
        let berr = |reason: String| TransportError::Bind { addr: addr.to_string(), reason };
        let std_listener = std::net::TcpListener::bind(addr).map_err(|e| {
            berr(if e.kind() == std::io::ErrorKind::AddrInUse {
                "the address is already in use (is another node running on this port?)".into()
            } else {
                e.to_string()
            })
        })?;
        std_listener.set_nonblocking(true).map_err(|e| berr(e.to_string()))?;
        let local = std_listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| addr.to_string());
        let (accept_tx, accept_rx) = std_mpsc::channel();
        let svc = Service {
            accept: accept_tx,
            handle: self.rt.handle().clone(),
            auth: self.cfg.auth.clone(),
            slots: ConnSlots::new(self.cfg.max_connections),
            refusals: RefusalLog::default(),
            max_payload: self.cfg.limits.max_payload_bytes,
        };
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &self.cfg.tls {
            let mut cfg = ServerTlsConfig::new().identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem));
            if tls.require_client_cert {
                cfg = cfg.client_ca_root(Certificate::from_pem(&tls.ca_pem));
            }
            builder = builder.tls_config(cfg).map_err(|e| berr(format!("TLS settings: {e}")))?;
        }
        let max = self.max_msg();
        let window = self.cfg.grpc_window;
        let listener = {
            let _g = self.rt.enter();
            tokio::net::TcpListener::from_std(std_listener).map_err(|e| berr(e.to_string()))?
        };
        self.rt.spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let res = builder
                .tcp_nodelay(true)
                .initial_stream_window_size(window)
                .initial_connection_window_size(window)
                .http2_adaptive_window(Some(false))
                .max_frame_size(MAX_H2_FRAME)
                .add_service(DataPlaneServer::new(svc).max_decoding_message_size(max).max_encoding_message_size(max))
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = res {
                tracing::error!("gRPC server stopped: {e}");
            }
        });
        Ok(Box::new(GrpcListener { local, rx: accept_rx }))
    }
}

struct Service {
    accept: std_mpsc::Sender<GrpcConnection>,
    handle: Handle,
    auth: Option<crate::AuthToken>,
    slots: ConnSlots,
    refusals: RefusalLog,
    max_payload: u64,
}

type ReplyStream = Pin<Box<dyn Stream<Item = std::result::Result<Frame, Status>> + Send>>;

#[tonic::async_trait]
impl DataPlane for Service {
    type ExchangeStream = ReplyStream;

    async fn exchange(&self, request: Request<Streaming<Frame>>) -> std::result::Result<Response<Self::ExchangeStream>, Status> {
        let peer = request.remote_addr().map(|a| a.to_string()).unwrap_or_else(|| "grpc peer".into());
        if let Some(t) = &self.auth {
            if let Err(why) = check_token(t, request.metadata().get(TOKEN_METADATA_KEY).map(|v| v.as_bytes())) {
                self.refusals.refused(&peer, why);
                return Err(Status::unauthenticated(why));
            }
        }
        let Some(slot) = self.slots.take() else {
            self.refusals.refused(&peer, "too many open connections");
            return Err(Status::resource_exhausted("too many open connections"));
        };
        let (tx, rx) = mpsc::channel(16);
        let conn = GrpcConnection {
            handle: self.handle.clone(),
            tx: Outbound::Server(tx),
            inbound: Inbound::Server(request.into_inner()),
            peer,
            current: None,
            max_payload: self.max_payload,
            peeked: None,
            timeout: None,
            stats: Default::default(),
            _slot: Some(slot),
        };
        self.accept.send(conn).map_err(|_| Status::unavailable("node is shutting down"))?;
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

struct GrpcListener {
    local: String,
    rx: std_mpsc::Receiver<GrpcConnection>,
}

impl Listener for GrpcListener {
    fn local_addr(&self) -> String {
        self.local.clone()
    }
    fn accept(&mut self, timeout: Duration) -> Result<Option<Box<dyn Connection>>> {
        match self.rx.recv_timeout(timeout) {
            Ok(c) => Ok(Some(Box::new(c))),
            Err(std_mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(std_mpsc::RecvTimeoutError::Disconnected) => Err(TransportError::Closed { peer: self.local.clone() }),
        }
    }
}

enum Outbound {
    Client(mpsc::Sender<Frame>),
    Server(mpsc::Sender<std::result::Result<Frame, Status>>),
}

enum Inbound {
    Client(Streaming<Frame>),
    Server(Streaming<Frame>),
}

struct GrpcConnection {
    handle: Handle,
    tx: Outbound,
    inbound: Inbound,
    peer: String,
    /// The received frame's first message's payload, and what is still to come.
    current: Option<Part>,
    /// Largest payload of a frame accepted (the transport's frame limit).
    max_payload: u64,
    /// What [`Connection::readable`] took off the stream, returned by the next receive.
    peeked: Option<std::result::Result<Option<Frame>, Status>>,
    timeout: Option<Duration>,
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
    fn malformed(&self, why: String) -> TransportError {
        TransportError::Protocol { peer: self.peer.clone(), source: downpour_wire::WireError::Malformed(why) }
    }

    fn push(&mut self, frame: Frame) -> Result<()> {
        let ok = match &self.tx {
            Outbound::Client(t) => self.handle.block_on(t.send(frame)).is_ok(),
            Outbound::Server(t) => self.handle.block_on(t.send(Ok(frame))).is_ok(),
        };
        if ok {
            Ok(())
        } else {
            Err(TransportError::Closed { peer: self.peer.clone() })
        }
    }

    /// The next message of the stream (None at its end), within the receive timeout.
    fn next_message(&mut self) -> Result<Option<Frame>> {
        let stream = match &mut self.inbound {
            Inbound::Client(s) | Inbound::Server(s) => s,
        };
        let next = match self.timeout {
            _ if self.peeked.is_some() => self.peeked.take().unwrap_or(Ok(None)),
            None => self.handle.block_on(stream.message()),
            Some(t) => match self.handle.block_on(async { tokio::time::timeout(t, stream.message()).await }) {
                Ok(r) => r,
                Err(_) => return Err(TransportError::Timeout { peer: self.peer.clone(), after: t }),
            },
        };
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
            None => Err(TransportError::Closed { peer: self.peer.clone() }),
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
        let stream = match &mut self.inbound {
            Inbound::Client(s) | Inbound::Server(s) => s,
        };
        // One poll of the stream, inside the runtime, with a waker that does nothing: a
        // message already decoded (or the stream's end) is kept for the next receive; a
        // later blocking receive polls again with its own waker.
        let _rt = self.handle.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match Pin::new(stream).poll_next(&mut cx) {
            std::task::Poll::Ready(next) => {
                self.peeked = Some(next.transpose());
                Ok(true)
            }
            std::task::Poll::Pending => Ok(false),
        }
    }

    fn peer(&self) -> &str {
        &self.peer
    }

    fn stats(&self) -> TrafficStats {
        self.stats
    }
}
