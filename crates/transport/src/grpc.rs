//! gRPC transport (tonic): each connection is one `DataPlane/Exchange` bidirectional
//! stream of [`Frame`]s whose `keys`/`values` are `bytes` fields holding the same
//! little-endian payloads as the framed-TCP transport.
//!
//! The blocking [`Connection`] calls run the async stream on a small tokio runtime owned by
//! the transport. HTTP/2 windows are raised (16 MiB by default) and message limits follow
//! the frame limits, so chunks of several MiB pass in one message.

use crate::security::{check_token, RefusalLog, TOKEN_METADATA_KEY};
use crate::{ConnSlot, ConnSlots, Connection, Listener, NetConfig, Result, TrafficStats, Transport, TransportError};
use bytes::Bytes;
use downpour_core::codec;
use downpour_core::proto::{Frame, FrameHeader};
use std::pin::Pin;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
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

    fn max_msg(&self) -> usize {
        (self.cfg.limits.max_payload_bytes as usize).saturating_add(codec::MAX_HEADER_BYTES + 1024)
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
    current: Option<(Bytes, Bytes)>,
    /// What [`Connection::readable`] took off the stream, returned by the next receive.
    peeked: Option<std::result::Result<Option<Frame>, Status>>,
    timeout: Option<Duration>,
    stats: TrafficStats,
    /// (Accepted connections) the slot counted against the connection limit.
    _slot: Option<ConnSlot>,
}

impl Connection for GrpcConnection {
    fn send(&mut self, header: &mut FrameHeader, keys: &[u8], values: &[u8]) -> Result<()> {
        header.keys_len = keys.len() as u64;
        header.values_len = values.len() as u64;
        let frame = Frame { header: Some(header.clone()), keys: Bytes::copy_from_slice(keys), values: Bytes::copy_from_slice(values) };
        let ok = match &self.tx {
            Outbound::Client(t) => self.handle.block_on(t.send(frame)).is_ok(),
            Outbound::Server(t) => self.handle.block_on(t.send(Ok(frame))).is_ok(),
        };
        if !ok {
            return Err(TransportError::Closed { peer: self.peer.clone() });
        }
        self.stats.bytes_sent += (keys.len() + values.len()) as u64;
        self.stats.frames_sent += 1;
        Ok(())
    }

    fn recv_header(&mut self) -> Result<Option<FrameHeader>> {
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
        let frame = match next {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(None),
            Err(s) if s.code() == tonic::Code::Cancelled || s.code() == tonic::Code::Unavailable => return Ok(None),
            // The peer's process ended without closing its stream (the TCP connection went
            // away under HTTP/2): a close, like a reset TCP connection, not a protocol error.
            Err(s) if s.code() == tonic::Code::Unknown && s.message().contains("error reading a body from connection") => return Ok(None),
            Err(s) => {
                return Err(TransportError::Io {
                    peer: self.peer.clone(),
                    source: std::io::Error::other(format!("gRPC status {:?}: {}", s.code(), s.message())),
                })
            }
        };
        let mut h = frame.header.ok_or_else(|| TransportError::Protocol {
            peer: self.peer.clone(),
            source: downpour_wire::WireError::Malformed("frame without header".into()),
        })?;
        h.keys_len = frame.keys.len() as u64;
        h.values_len = frame.values.len() as u64;
        codec::check_payload(&h, &downpour_core::codec::FrameLimits { max_payload_bytes: u64::MAX })
            .map_err(|e| TransportError::Protocol { peer: self.peer.clone(), source: e })?;
        self.stats.bytes_received += h.keys_len + h.values_len;
        self.stats.frames_received += 1;
        self.current = Some((frame.keys, frame.values));
        Ok(Some(h))
    }

    fn recv_payload(&mut self, keys: &mut [u8], values: &mut [u8]) -> Result<()> {
        let (k, v) = self.current.take().unwrap_or_default();
        crate::fill_payload(&self.peer, &k, &v, keys, values)
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
