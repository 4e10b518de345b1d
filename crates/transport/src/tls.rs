//! TLS on framed TCP (rustls with the ring provider): the same frames, encrypted, with
//! mutual authentication against the cluster CA as on gRPC.
//!
//! A connection's stream is one [`Half`] for reading (behind the connection's `BufReader`)
//! and one for writing. Plain TCP halves are two handles of the socket; TLS halves share one
//! rustls stream behind a per-connection mutex, which only the connection's own thread
//! takes (a connection is used by one thread at a time), so it is never contended.

use crate::security::TlsConfig;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection, StreamOwned};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

/// The client and server configurations of a node, built once from its [`TlsConfig`].
pub(crate) struct TlsSetup {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    server_name: Option<String>,
}

/// ring's suites with AES-128-GCM first: as safe, and about a third cheaper than AES-256
/// per byte, which on a parameter server's bulk data is the whole cost.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| match s.suite() {
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => 1,
        rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => 2,
        _ => 3,
    });
    Arc::new(p)
}

const SOCK_BUF: usize = 256 << 10;

/// The socket as rustls reads it: through a buffer, since rustls reads 4 KiB at a time and
/// a 16 MiB frame would otherwise cost 4,096 system calls.
pub(crate) struct Sock {
    r: io::BufReader<TcpStream>,
}

impl Sock {
    fn new(s: TcpStream) -> Sock {
        Sock { r: io::BufReader::with_capacity(SOCK_BUF, s) }
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.r.read(buf)
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.r.get_mut().write(buf)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.r.get_mut().write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.r.get_mut().flush()
    }
}

impl TlsSetup {
    /// Parses the PEM material and builds both sides' configurations; errors say what is
    /// wrong with which part.
    pub(crate) fn new(cfg: &TlsConfig) -> Result<TlsSetup, String> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cfg.cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("the TLS certificate is not valid PEM: {e}"))?;
        if certs.is_empty() {
            return Err("the TLS certificate file holds no certificate".into());
        }
        let key = |what| {
            PrivateKeyDer::from_pem_slice(&cfg.key_pem).map_err(|e| format!("the TLS key is not a valid PEM private key ({what}): {e}"))
        };
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&cfg.ca_pem) {
            let ca = ca.map_err(|e| format!("the TLS CA certificate is not valid PEM: {e}"))?;
            roots.add(ca).map_err(|e| format!("the TLS CA certificate cannot be used: {e}"))?;
        }
        if roots.is_empty() {
            return Err("the TLS CA file holds no certificate".into());
        }
        let roots = Arc::new(roots);
        let client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS client settings: {e}"))?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(certs.clone(), key("client")?)
            .map_err(|e| format!("the TLS certificate and key do not go together: {e}"))?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS server settings: {e}"))?;
        let builder = if cfg.require_client_cert {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| format!("TLS client verification: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let server =
            builder.with_single_cert(certs, key("server")?).map_err(|e| format!("the TLS certificate and key do not go together: {e}"))?;
        Ok(TlsSetup { client: Arc::new(client), server: Arc::new(server), server_name: cfg.server_name.clone() })
    }

    /// The connecting side over `sock` to `addr` (`host:port`): the server's certificate
    /// must name `--tls-server-name`, or else the host. The handshake runs on first use.
    pub(crate) fn client(&self, sock: TcpStream, addr: &str) -> Result<TlsStream, String> {
        let host = match &self.server_name {
            Some(n) => n.clone(),
            None => addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_matches(['[', ']']).to_string(),
        };
        let name = ServerName::try_from(host.clone()).map_err(|e| format!("{host:?} is not a TLS server name: {e}"))?;
        let conn = ClientConnection::new(self.client.clone(), name).map_err(|e| format!("TLS: {e}"))?;
        Ok(TlsStream::Client(StreamOwned::new(conn, Sock::new(sock))))
    }

    /// The accepting side over `sock`. The handshake runs on first use.
    pub(crate) fn server(&self, sock: TcpStream) -> Result<TlsStream, String> {
        let conn = ServerConnection::new(self.server.clone()).map_err(|e| format!("TLS: {e}"))?;
        Ok(TlsStream::Server(StreamOwned::new(conn, Sock::new(sock))))
    }
}

/// A TLS stream over a TCP socket, either side.
pub(crate) enum TlsStream {
    Client(StreamOwned<ClientConnection, Sock>),
    Server(StreamOwned<ServerConnection, Sock>),
}

/// `$body` with `$s` bound to the stream of either side (the two differ only in type).
macro_rules! either {
    ($self:expr, $s:ident => $body:expr) => {
        match $self {
            TlsStream::Client($s) => $body,
            TlsStream::Server($s) => $body,
        }
    };
}

impl TlsStream {
    /// Runs the handshake to its end (or its failure), under the socket's read timeout.
    pub(crate) fn handshake(&mut self) -> io::Result<()> {
        either!(self, s => {
            while s.conn.is_handshaking() {
                s.conn.complete_io(&mut s.sock)?;
            }
        });
        Ok(())
    }

    /// Whether bytes wait to be read without reading the socket: decrypted ones, or records
    /// in the socket buffer.
    fn bytes_waiting(&mut self) -> bool {
        let (state, buffered) = either!(self, s => (s.conn.process_new_packets(), !s.sock.r.buffer().is_empty()));
        // an error is for the next read to report
        buffered || state.map_or(true, |st| st.plaintext_bytes_to_read() > 0 || st.peer_has_closed())
    }

    /// Tells the peer this side closes (best effort: the connection is going away).
    fn close(&mut self) {
        either!(self, s => s.conn.send_close_notify());
        let _ = self.flush();
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        either!(self, s => s.read(buf))
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        either!(self, s => s.write(buf))
    }
    fn flush(&mut self) -> io::Result<()> {
        either!(self, s => s.flush())
    }
}

/// One direction's handle on a connection's stream.
pub(crate) enum Half {
    Plain(TcpStream),
    Tls(Arc<Mutex<TlsStream>>),
}

impl Half {
    /// Whether bytes wait inside the TLS layer or its socket buffer (always false for plain
    /// TCP).
    pub(crate) fn bytes_waiting(&self) -> bool {
        match self {
            Half::Plain(_) => false,
            Half::Tls(t) => t.lock().bytes_waiting(),
        }
    }

    /// Sends TLS's close_notify, so the peer reads a clean end (nothing for plain TCP).
    pub(crate) fn close(&self) {
        if let Half::Tls(t) = self {
            t.lock().close();
        }
    }
}

impl Read for Half {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Half::Plain(s) => s.read(buf),
            Half::Tls(t) => t.lock().read(buf),
        }
    }
}

impl Write for Half {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Half::Plain(s) => s.write(buf),
            Half::Tls(t) => t.lock().write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Half::Plain(s) => s.write_vectored(bufs),
            Half::Tls(t) => t.lock().write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Half::Plain(s) => s.flush(),
            Half::Tls(t) => t.lock().flush(),
        }
    }
}
