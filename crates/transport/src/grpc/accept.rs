//! The accepting side: each accepted socket gets a runtime of its own on which its TLS
//! handshake, its HTTP/2 connection (hyper, with tonic's generated `DataPlane` service) and
//! its one `Exchange` stream run, all driven by the connection's own thread from its first
//! call on (so a slow or silent peer holds only its own connection's thread, as on framed
//! TCP).

use super::connection::{GrpcConnection, Opened};
use super::generated::data_plane_server::{DataPlane, DataPlaneServer};
use super::tracked::{Blocked, Counted, Writes};
use super::Socket;
use super::MAX_H2_FRAME;
use crate::security::{check_token, RefusalLog, TOKEN_METADATA_KEY};
use crate::{AuthToken, ConnSlot, ConnSlots, Connection, Listener, Result};
use downpour_core::proto::Frame;
use parking_lot::Mutex;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use tower_service::Service as _;

/// What every connection a listener accepts is served with.
pub(super) struct Serving {
    pub(super) auth: Option<AuthToken>,
    pub(super) slots: ConnSlots,
    pub(super) refusals: RefusalLog,
    /// Largest frame payload accepted.
    pub(super) max_payload: u64,
    /// Largest gRPC message either way.
    pub(super) max_msg: usize,
    /// HTTP/2 stream and connection windows.
    pub(super) window: u32,
    pub(super) tls: Option<tokio_rustls::TlsAcceptor>,
    /// How long a peer has to open its stream ([`crate::NetConfig::handshake_timeout`]).
    pub(super) handshake_timeout: Duration,
    /// How long a receive polls before it sleeps ([`crate::NetConfig::poll`]).
    pub(super) poll: Duration,
}

/// A gRPC listener: a plain (non-blocking) TCP listener whose accepted sockets are served
/// one runtime each.
pub(super) struct GrpcListener {
    pub(super) l: TcpListener,
    pub(super) local: String,
    pub(super) serving: Arc<Serving>,
}

impl Listener for GrpcListener {
    fn local_addr(&self) -> String {
        self.local.clone()
    }

    fn accept(&mut self, timeout: Duration) -> Result<Option<Box<dyn Connection>>> {
        let serving = &self.serving;
        crate::wait::accept_within(&self.l, &self.local, timeout, &serving.slots, &serving.refusals, |s, peer, slot| {
            match accepted(s, peer, slot, serving) {
                Ok(c) => Some(Box::new(c) as Box<dyn Connection>),
                // The peer went away before we set the socket up (its problem), or this
                // node is out of descriptors: said once per host.
                Err(e) => {
                    serving.refusals.refused(&peer.to_string(), &format!("setting the connection up: {e}"));
                    None
                }
            }
        })
    }
}

/// Sets up an accepted socket's runtime and its serving task (which runs once the
/// connection's thread first calls it).
fn accepted(s: std::net::TcpStream, peer: SocketAddr, slot: ConnSlot, serving: &Arc<Serving>) -> io::Result<GrpcConnection> {
    s.set_nonblocking(true)?;
    s.set_nodelay(true)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let writes = Arc::new(Writes::default());
    let sock = {
        let _in = rt.enter();
        Blocked::new(tokio::net::TcpStream::from_std(s)?, writes.clone())
    };
    let (opened_tx, opened_rx) = oneshot::channel();
    let (close_tx, close_rx) = oneshot::channel();
    let exchange = Exchange { serving: serving.clone(), peer: peer.to_string(), opened: Mutex::new(Some(opened_tx)) };
    rt.spawn(serve(sock, writes.clone(), serving.clone(), exchange, close_rx));
    Ok(GrpcConnection::accepted(rt, opened_rx, close_tx, writes, peer.to_string(), serving, slot))
}

/// The TLS handshake (when the listener has TLS), then HTTP/2 until the peer closes or
/// `close` fires (the connection was dropped: a graceful shutdown, so what is queued is
/// still written).
async fn serve(
    sock: Blocked<tokio::net::TcpStream>,
    writes: Arc<Writes>,
    serving: Arc<Serving>,
    exchange: Exchange,
    close: oneshot::Receiver<()>,
) {
    let io: Box<dyn Socket> = match &serving.tls {
        Some(acceptor) => match acceptor.accept(sock).await {
            Ok(tls) => Box::new(tls),
            Err(e) => return serving.refusals.refused(&exchange.peer, &format!("TLS handshake: {e}")),
        },
        None => Box::new(sock),
    };
    serve_h2(Counted::new(io, writes, false), &serving, exchange, close).await
}

async fn serve_h2<IO>(io: IO, serving: &Serving, exchange: Exchange, close: oneshot::Receiver<()>)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let exchange = Arc::new(exchange);
    let svc =
        DataPlaneServer::from_arc(exchange.clone()).max_decoding_message_size(serving.max_msg).max_encoding_message_size(serving.max_msg);
    let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let mut svc = svc.clone();
        async move { svc.call(req.map(tonic::body::Body::new)).await }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .initial_stream_window_size(serving.window)
        .initial_connection_window_size(serving.window)
        .adaptive_window(false)
        .max_frame_size(MAX_H2_FRAME);
    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        r = &mut conn => {
            if let Err(e) = r {
                tracing::debug!("gRPC connection ended: {e}");
                if exchange.opened.lock().is_some() {
                    // it never asked for its stream: e.g. a framed-TCP client dialling a
                    // gRPC node
                    serving.refusals.refused(&exchange.peer, &format!("HTTP/2: {e}"));
                }
            }
        }
        _ = close => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// The `DataPlane` service of one accepted connection: its first `Exchange` call is the
/// connection's stream; the token is checked there.
struct Exchange {
    serving: Arc<Serving>,
    peer: String,
    /// Taken by the first `Exchange` call (a connection whose HTTP/2 fails before it has
    /// been taken never got as far as asking: that is logged as a refusal).
    opened: Mutex<Option<oneshot::Sender<Opened>>>,
}

type ReplyStream = Pin<Box<dyn Stream<Item = std::result::Result<Frame, Status>> + Send>>;

#[tonic::async_trait]
impl DataPlane for Exchange {
    type ExchangeStream = ReplyStream;

    async fn exchange(&self, request: Request<Streaming<Frame>>) -> std::result::Result<Response<Self::ExchangeStream>, Status> {
        // taken whatever happens next: a refused peer's connection ends with this call
        let Some(opened) = self.opened.lock().take() else {
            return Err(Status::resource_exhausted("one exchange per connection"));
        };
        if let Some(t) = &self.serving.auth {
            if let Err(why) = check_token(t, request.metadata().get(TOKEN_METADATA_KEY).map(|v| v.as_bytes())) {
                self.serving.refusals.refused(&self.peer, why);
                return Err(Status::unauthenticated(why));
            }
        }
        let (tx, rx) = mpsc::channel(16);
        opened.send((request.into_inner(), tx)).map_err(|_| Status::unavailable("node is shutting down"))?;
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
