//! gRPC transport (tonic): each connection is one `DataPlane/Exchange` bidirectional
//! stream of [`Frame`]s whose `keys`/`values` are `bytes`
//! fields holding the same little-endian payloads as the framed-TCP transport.
//!
//! Each connection, on either side, runs on a tokio runtime of its own (current-thread)
//! that only the connection's thread drives, inside its blocking calls: the HTTP/2 reads,
//! writes and window updates happen on the thread that asked for them, with no hand-off to
//! another thread per message (`connection`). So a `send` returns only once its frame is in
//! the kernel, as on framed TCP (`tracked` counts what HTTP/2 writes). The accepting side
//! serves each socket with hyper and tonic's generated service on that runtime (`accept`);
//! a peer has [`NetConfig::handshake_timeout`] to open its stream. HTTP/2 windows are
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
use tonic::Request;
use tracked::{Blocked, Counted, Writes};

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
    /// Both sides' TLS settings, built once.
    tls: Option<Arc<TlsSetup>>,
}

impl GrpcTransport {
    /// Checks the TLS material (when given); connections make their runtimes as they open.
    pub fn new(cfg: NetConfig) -> Result<Self> {
        let tls = match &cfg.tls {
            Some(t) => Some(Arc::new(TlsSetup::new(t).map_err(|reason| TransportError::Bind { addr: "grpc transport".into(), reason })?)),
            None => None,
        };
        Ok(GrpcTransport { cfg, tls })
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
        // TLS is the dialer's (`Dial`), below HTTP/2, so that what HTTP/2 writes can be
        // counted; the URI's scheme is only the request's `:scheme`
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).map_err(|e| err(e.to_string()))?;
        let tls = match &self.tls {
            Some(setup) => {
                let (cfg, name) = setup.h2_client(addr).map_err(err)?;
                Some((tokio_rustls::TlsConnector::from(cfg), name))
            }
            None => None,
        };
        let token = match &self.cfg.auth {
            Some(t) => Some(MetadataValue::try_from(t.secret()).map_err(|e| err(format!("auth token: {e}")))?),
            None => None,
        };
        let endpoint = endpoint
            .connect_timeout(timeout)
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
                .connect_with_connector(Dial { writes: dial_writes, tls })
                .await
                .map_err(|e| err(format!("{e} ({:?})", std::error::Error::source(&e))))?;
            let mut client = DataPlaneClient::new(channel).max_decoding_message_size(max).max_encoding_message_size(max);
            let mut req = Request::new(ReceiverStream::new(rx));
            if let Some(t) = token {
                req.metadata_mut().insert(TOKEN_METADATA_KEY, t);
            }
            // the accepted side answers from its connection's thread, at that thread's
            // first call: a peer that never gets there must not hold this one
            let answer = tokio::time::timeout(timeout, client.exchange(req))
                .await
                .map_err(|_| err(format!("no answer to opening the stream within {timeout:?}")))?;
            let resp = answer.map_err(|e| match e.code() {
                tonic::Code::Unauthenticated | tonic::Code::ResourceExhausted => err(format!("refused by the server: {}", e.message())),
                _ => err(e.message().to_string()),
            })?;
            Ok::<_, TransportError>(resp.into_inner())
        })?;
        Ok(Box::new(GrpcConnection::connected(rt, tx, inbound, writes, addr.to_string(), self.cfg.limits.max_payload_bytes, self.cfg.poll)))
    }

    fn listen(&self, addr: &str) -> Result<Box<dyn Listener>> {
        let (l, local) = crate::wait::bind(addr)?;
        let serving = Serving {
            auth: self.cfg.auth.clone(),
            slots: ConnSlots::new(self.cfg.max_connections),
            refusals: RefusalLog::default(),
            max_payload: self.cfg.limits.max_payload_bytes,
            max_msg: self.max_msg(),
            window: self.cfg.grpc_window,
            tls: self.tls.as_ref().map(|setup| tokio_rustls::TlsAcceptor::from(setup.h2_server())),
            handshake_timeout: self.cfg.handshake_timeout,
            poll: self.cfg.poll,
        };
        Ok(Box::new(GrpcListener { l, local, serving: Arc::new(serving) }))
    }
}

/// A socket HTTP/2 runs over: TCP, or TLS over TCP.
trait Socket: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Socket for S {}

/// The connecting side's socket: a TCP connection to the endpoint's host and port, TLS over
/// it when configured, its writes tracked for [`GrpcConnection`]'s sends.
struct Dial {
    writes: Arc<Writes>,
    tls: Option<(tokio_rustls::TlsConnector, rustls::pki_types::ServerName<'static>)>,
}

impl tower_service::Service<http::Uri> for Dial {
    type Response = hyper_util::rt::TokioIo<Counted<Box<dyn Socket>>>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let writes = self.writes.clone();
        let tls = self.tls.clone();
        Box::pin(async move {
            let bad = || std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no host and port in {uri}"));
            let host = uri.host().ok_or_else(bad)?.trim_start_matches('[').trim_end_matches(']').to_string();
            let port = uri.port_u16().ok_or_else(bad)?;
            let sock = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            sock.set_nodelay(true)?;
            let sock = Blocked::new(sock, writes.clone());
            let io: Box<dyn Socket> = match tls {
                Some((connector, name)) => {
                    Box::new(connector.connect(name, sock).await.map_err(|e| std::io::Error::new(e.kind(), format!("TLS handshake: {e}")))?)
                }
                None => Box::new(sock),
            };
            Ok(hyper_util::rt::TokioIo::new(Counted::new(io, writes, true)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use downpour_core::msg::{self, Op};

    /// A send returns only once its frame is in the kernel: here the frame is 8× the peer's
    /// HTTP/2 window, so its tail waits for window updates, and the sending thread makes no
    /// further call on the connection while the receiver reads (a tail left in HTTP/2's
    /// buffers would never arrive, and the receive would time out).
    fn a_sent_frame_arrives_without_another_call_from_the_sender(cfg: NetConfig) {
        let t = GrpcTransport::new(NetConfig { grpc_window: 1 << 20, ..cfg }).unwrap();
        let mut l = t.listen("127.0.0.1:0").unwrap();
        let local = l.local_addr();
        let payload: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
        std::thread::scope(|sc| {
            let rx = sc.spawn(|| {
                let mut s = l.accept(Duration::from_secs(5)).unwrap().unwrap();
                s.set_recv_timeout(Some(Duration::from_secs(10))).unwrap();
                let h = s.recv_header().unwrap().unwrap();
                let mut v = vec![0; h.values_len as usize];
                s.recv_payload(&mut [], &mut v).unwrap();
                v == payload
            });
            let mut c = t.connect(&local, Duration::from_secs(5)).unwrap();
            let mut h = msg::request(Op::Push, 1, 1, 0, 1);
            c.send(&mut h, &[], &payload).unwrap();
            // no further call on `c` until the receiver is done
            assert!(rx.join().unwrap(), "the frame arrived whole");
            drop(c);
        });
    }

    /// A peer that connects and never opens its stream is dropped after the handshake
    /// timeout (its connection reads as closed), and its slot serves the next peer.
    #[test]
    fn a_silent_peer_is_dropped_after_the_handshake_timeout_and_frees_its_slot() {
        let cfg = NetConfig { max_connections: 1, handshake_timeout: Duration::from_millis(300), ..NetConfig::default() };
        let t = GrpcTransport::new(cfg).unwrap();
        let mut l = t.listen("127.0.0.1:0").unwrap();
        let local = l.local_addr();
        let silent = std::net::TcpStream::connect(&local).unwrap();
        let mut s = l.accept(Duration::from_secs(5)).unwrap().unwrap();
        let t0 = std::time::Instant::now();
        assert!(s.recv_header().unwrap().is_none(), "the silent connection reads as closed");
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(5), "dropped after {waited:?}");
        drop(s);
        // the one slot is free again: a real peer gets in and is heard
        std::thread::scope(|sc| {
            let rx = sc.spawn(|| {
                let mut s = l.accept(Duration::from_secs(5)).unwrap().expect("the slot was freed");
                s.set_recv_timeout(Some(Duration::from_secs(5))).unwrap();
                let h = s.recv_header().unwrap().unwrap();
                s.recv_payload(&mut [], &mut [0; 4]).unwrap();
                h.request_id
            });
            let mut c = t.connect(&local, Duration::from_secs(5)).unwrap();
            c.send(&mut msg::request(Op::Push, 1, 9, 0, 1), &[], &[0; 4]).unwrap();
            assert_eq!(rx.join().unwrap(), 9);
        });
        drop(silent);
    }

    #[test]
    fn a_sent_frame_arrives_without_another_call_from_the_sender_over_a_small_window() {
        a_sent_frame_arrives_without_another_call_from_the_sender(NetConfig::default());
    }

    #[cfg(feature = "test-tls")]
    #[test]
    fn a_sent_frame_arrives_without_another_call_from_the_sender_over_tls() {
        a_sent_frame_arrives_without_another_call_from_the_sender(NetConfig {
            tls: Some(crate::security::throwaway_tls()),
            ..NetConfig::default()
        });
    }
}
