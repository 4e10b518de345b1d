//! gRPC transport (tonic): each connection is one `DataPlane/Exchange` bidirectional
//! stream of [`Frame`](downpour_core::proto::Frame)s whose `keys`/`values` are `bytes`
//! fields holding the same little-endian payloads as the framed-TCP transport.
//!
//! Each connection, on either side, runs on a tokio runtime of its own (current-thread)
//! that only the connection's thread drives, inside its blocking calls: the HTTP/2 reads,
//! writes and window updates happen on the thread that asked for them, with no hand-off to
//! another thread per message ([`connection`]). The accepting side serves each socket with
//! hyper and tonic's generated service on that runtime ([`accept`]). HTTP/2 windows are
//! raised ([`NetConfig::grpc_window`]). A frame's payload travels in messages of at most
//! `CHUNK` (1 MiB) bytes (the proto's `Frame` says how), so the receiver copies a large frame
//! out while the rest is on the way instead of waiting for all of it; the codec sizes its
//! buffers for whole chunks (no growth copies).

mod accept;
mod codec;
mod connection;
mod tracked;

pub(crate) use codec::FrameCodec;

use crate::security::{RefusalLog, TOKEN_METADATA_KEY};
use crate::tls::TlsSetup;
use crate::{ConnSlots, Connection, Listener, NetConfig, Result, Transport, TransportError};
use accept::{GrpcListener, Serving};
use connection::GrpcConnection;
use downpour_core::codec as frame_codec;
use downpour_core::proto::Frame;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};
use tonic::Request;
use tracked::{Tracked, Writes};

#[allow(missing_docs, clippy::all)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/downpour.v1.rs"));
}
use generated::data_plane_client::DataPlaneClient;

/// HTTP/2 frame size: 1 MiB frames instead of the default 16 KiB, so a chunk of a few MiB
/// is a handful of frames rather than hundreds.
const MAX_H2_FRAME: u32 = 1 << 20;

/// Payload bytes per gRPC message at most: a larger frame is sent as several messages.
pub(crate) const CHUNK: usize = 1 << 20;

/// gRPC transport.
pub struct GrpcTransport {
    cfg: NetConfig,
    /// The accepting side's TLS settings (HTTP/2 by ALPN), built once.
    tls_acceptor: Option<tokio_rustls::TlsAcceptor>,
}

impl GrpcTransport {
    /// Checks the TLS material (when given); connections make their runtimes as they open.
    pub fn new(cfg: NetConfig) -> Result<Self> {
        let tls_acceptor = match &cfg.tls {
            Some(t) => {
                let setup = TlsSetup::new(t).map_err(|reason| TransportError::Bind { addr: "grpc transport".into(), reason })?;
                Some(tokio_rustls::TlsAcceptor::from(setup.h2_server()))
            }
            None => None,
        };
        Ok(GrpcTransport { cfg, tls_acceptor })
    }

    /// The largest message either side sends or accepts: one chunk and a header. A frame's
    /// whole size is checked against the frame limit from its header, before any buffer for
    /// it is allocated.
    fn max_msg(&self) -> usize {
        CHUNK + frame_codec::MAX_HEADER_BYTES + 1024
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
        let writes = Arc::new(Writes::default());
        let dial_writes = writes.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| TransportError::Io { peer: addr.to_string(), source: e })?;
        let inbound = rt.block_on(async move {
            let channel = endpoint
                .connect_with_connector(Dial { writes: dial_writes })
                .await
                .map_err(|e| err(format!("{e} ({:?})", std::error::Error::source(&e))))?;
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
        Ok(Box::new(GrpcConnection::connected(rt, tx, inbound, writes, addr.to_string(), self.cfg.limits.max_payload_bytes)))
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
        let serving = Serving {
            auth: self.cfg.auth.clone(),
            slots: ConnSlots::new(self.cfg.max_connections),
            refusals: RefusalLog::default(),
            max_payload: self.cfg.limits.max_payload_bytes,
            max_msg: self.max_msg(),
            window: self.cfg.grpc_window,
            tls: self.tls_acceptor.clone(),
        };
        Ok(Box::new(GrpcListener { l: std_listener, local, serving: Arc::new(serving) }))
    }
}

/// The connecting side's socket: a TCP connection to the endpoint's host and port (tonic
/// adds TLS over it when configured), its writes tracked for [`GrpcConnection`]'s sends.
struct Dial {
    writes: Arc<Writes>,
}

impl tower_service::Service<http::Uri> for Dial {
    type Response = hyper_util::rt::TokioIo<Tracked<tokio::net::TcpStream>>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let writes = self.writes.clone();
        Box::pin(async move {
            let bad = || std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no host and port in {uri}"));
            let host = uri.host().ok_or_else(bad)?.trim_start_matches('[').trim_end_matches(']').to_string();
            let port = uri.port_u16().ok_or_else(bad)?;
            let sock = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            sock.set_nodelay(true)?;
            Ok(hyper_util::rt::TokioIo::new(Tracked::new(sock, writes)))
        })
    }
}
