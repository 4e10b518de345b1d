//! TLS on framed TCP: the same frames, encrypted, with mutual authentication against the
//! cluster CA as on gRPC.
//!
//! rustls (ring provider) runs the TLS 1.3 handshake through its unbuffered API, over this
//! module's own receive buffer, and then hands over the negotiated traffic keys
//! (`dangerous_into_kernel_connection`, the hand-over kernel TLS uses). The records after the
//! handshake are sealed and opened here with ring's AEAD, as kernel TLS would do them:
//!
//! * sending, a frame's bytes are copied once into an outgoing buffer of records and sealed
//!   there in place, 64 KiB written per system call;
//! * receiving, up to 64 KiB of records are read per system call into the receive buffer,
//!   each record is opened in place and its plaintext copied once to the reader.
//!
//! rustls's buffered API copies each received record three more times (socket buffer →
//! deframer → a fresh plaintext `Vec` → reader) and allocates per record; on 16 MiB frames
//! that cost four times the AES-GCM itself (docs/benchmarks.md, issue 27).
//!
//! Key updates follow RFC 8446 §4.6.3: a side replaces its sending key after
//! [`KEY_UPDATE_AFTER`] records (a `KeyUpdate` under the old key, then the new one from
//! rustls), answers a peer's update request, and takes the peer's new key on its `KeyUpdate`.
//! Servers send no session tickets; a ticket a client receives anyway is ignored.
//!
//! A connection's stream is one [`Half`] for reading (behind the connection's `BufReader`)
//! and one for writing. Plain TCP halves are two handles of the socket; TLS halves share one
//! [`TlsStream`] behind a per-connection mutex, which only the connection's own thread takes
//! (a connection is used by one thread at a time), so it is never contended.

use crate::security::TlsConfig;
use parking_lot::Mutex;
use ring::aead;
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{ClientConfig, ConnectionTrafficSecrets, ExtractedSecrets, RootCertStore, ServerConfig};
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

/// The largest plaintext of one record (RFC 8446 §5.1).
const MAX_PLAIN: usize = 1 << 14;
/// A record's header: content type, legacy version, length.
const HEADER: usize = 5;
/// The AEAD tag at the end of each record.
const TAG: usize = 16;
/// The largest record body a peer may send (§5.2: plaintext, content type, padding, tag).
const MAX_BODY: usize = MAX_PLAIN + 256;
/// Bytes received per system call at most, and bytes of records written per system call
/// (about four full records). Smaller than the 256 KiB it was: the reader opens the first records
/// while the writer seals the next ones, instead of waiting for a quarter MiB at a time
/// (16 MiB push-then-pull 1.08× as fast in 8 alternated rounds; docs/benchmarks.md).
const IO_BUF: usize = 64 << 10;
/// The receive buffer: room for the largest handshake message rustls takes (2^16 − 1 bytes,
/// which rustls joins in place from up to five records, so they must all be in the buffer at
/// once) with its records' framing, and a read of [`IO_BUF`] behind an incomplete record.
const IN_BUF: usize = 2 * IO_BUF + HEADER + MAX_BODY;
/// Records sealed under one key before it is replaced. AES-GCM's limit under TLS 1.3 is
/// 2^24.5 records (§5.5); this is well inside it (128 GiB of 16 KiB records).
pub(crate) const KEY_UPDATE_AFTER: u64 = 1 << 23;

const CONTENT_ALERT: u8 = 21;
const CONTENT_HANDSHAKE: u8 = 22;
const CONTENT_APPLICATION_DATA: u8 = 23;
const HANDSHAKE_NEW_SESSION_TICKET: u8 = 4;
const HANDSHAKE_KEY_UPDATE: u8 = 24;

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

impl TlsSetup {
    /// Parses the PEM material and builds both sides' configurations (TLS 1.3 only: every
    /// peer is a Downpour node); errors say what is wrong with which part.
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
        let mut client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| format!("TLS client settings: {e}"))?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(certs.clone(), key("client")?)
            .map_err(|e| format!("the TLS certificate and key do not go together: {e}"))?;
        client.enable_secret_extraction = true;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| format!("TLS server settings: {e}"))?;
        let builder = if cfg.require_client_cert {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| format!("TLS client verification: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut server =
            builder.with_single_cert(certs, key("server")?).map_err(|e| format!("the TLS certificate and key do not go together: {e}"))?;
        server.enable_secret_extraction = true;
        server.send_tls13_tickets = 0;
        Ok(TlsSetup { client: Arc::new(client), server: Arc::new(server), server_name: cfg.server_name.clone() })
    }

    /// The accepting side's settings for HTTP/2 (the gRPC transport): the same
    /// certificates and client verification, offering `h2` by ALPN.
    pub(crate) fn h2_server(&self) -> Arc<ServerConfig> {
        let mut c = (*self.server).clone();
        c.enable_secret_extraction = false;
        c.alpn_protocols = vec![b"h2".to_vec()];
        Arc::new(c)
    }

    /// The connecting side's settings for HTTP/2 (the gRPC transport), offering `h2` by
    /// ALPN, and the name the server's certificate must have for `addr` (`host:port`).
    pub(crate) fn h2_client(&self, addr: &str) -> Result<(Arc<ClientConfig>, ServerName<'static>), String> {
        let mut c = (*self.client).clone();
        c.enable_secret_extraction = false;
        c.alpn_protocols = vec![b"h2".to_vec()];
        Ok((Arc::new(c), self.server_name(addr)?))
    }

    /// `--tls-server-name`, or else the host of `addr`.
    fn server_name(&self, addr: &str) -> Result<ServerName<'static>, String> {
        let host = match &self.server_name {
            Some(n) => n.clone(),
            None => addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_matches(['[', ']']).to_string(),
        };
        ServerName::try_from(host.clone()).map_err(|e| format!("{host:?} is not a TLS server name: {e}"))
    }

    /// The connecting side over `sock` to `addr` (`host:port`): the server's certificate
    /// must name `--tls-server-name`, or else the host. The handshake runs on first use (or
    /// [`TlsStream::handshake`]).
    pub(crate) fn client(&self, sock: TcpStream, addr: &str) -> Result<TlsStream, String> {
        let name = self.server_name(addr)?;
        let conn = UnbufferedClientConnection::new(self.client.clone(), name).map_err(|e| format!("TLS: {e}"))?;
        Ok(TlsStream::new(sock, Phase::Client(Box::new(conn))))
    }

    /// The accepting side over `sock`. The handshake runs on first use.
    pub(crate) fn server(&self, sock: TcpStream) -> Result<TlsStream, String> {
        let conn = UnbufferedServerConnection::new(self.server.clone()).map_err(|e| format!("TLS: {e}"))?;
        Ok(TlsStream::new(sock, Phase::Server(Box::new(conn))))
    }
}

/// Where a stream is in its life.
enum Phase {
    Client(Box<UnbufferedClientConnection>),
    Server(Box<UnbufferedServerConnection>),
    Open(Box<Records>),
    /// The handshake failed (or was under way when an I/O error broke it): every later use
    /// answers this.
    Failed(String),
}

/// The two sides' handshake, as the code that drives it sees them.
trait HandshakeSide {
    type Data: 'static;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn handshaking(&self) -> bool;
    fn into_kernel(self) -> Result<(ExtractedSecrets, KernelConnection<Self::Data>), rustls::Error>;
}

/// The two sides' connections have the same inherent methods under different types.
macro_rules! handshake_side {
    ($conn:ty, $data:ty) => {
        impl HandshakeSide for $conn {
            type Data = $data;
            fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
                self.process_tls_records(incoming)
            }
            fn handshaking(&self) -> bool {
                self.is_handshaking()
            }
            fn into_kernel(self) -> Result<(ExtractedSecrets, KernelConnection<Self::Data>), rustls::Error> {
                self.dangerous_into_kernel_connection()
            }
        }
    };
}
handshake_side!(UnbufferedClientConnection, ClientConnectionData);
handshake_side!(UnbufferedServerConnection, ServerConnectionData);

/// What the record layer needs of rustls after the handshake: the next traffic keys of
/// either direction (RFC 8446 §7.2).
trait Rekey: Send + Sync {
    fn next_tx(&mut self) -> Result<ConnectionTrafficSecrets, rustls::Error>;
    fn next_rx(&mut self) -> Result<ConnectionTrafficSecrets, rustls::Error>;
}

impl<D: Send + Sync> Rekey for KernelConnection<D> {
    fn next_tx(&mut self) -> Result<ConnectionTrafficSecrets, rustls::Error> {
        self.update_tx_secret().map(|(_, s)| s)
    }
    fn next_rx(&mut self) -> Result<ConnectionTrafficSecrets, rustls::Error> {
        self.update_rx_secret().map(|(_, s)| s)
    }
}

/// One direction's key and record count.
struct Direction {
    key: aead::LessSafeKey,
    iv: [u8; aead::NONCE_LEN],
    seq: u64,
}

impl Direction {
    fn new(secrets: ConnectionTrafficSecrets, seq: u64) -> io::Result<Direction> {
        let (alg, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv, .. } => (&aead::AES_128_GCM, key.as_ref(), iv.as_ref()),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv, .. } => (&aead::AES_256_GCM, key.as_ref(), iv.as_ref()),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv, .. } => (&aead::CHACHA20_POLY1305, key.as_ref(), iv.as_ref()),
            _ => return Err(io::Error::other("TLS: the negotiated cipher suite is not one this node seals records with")),
        };
        let key = aead::UnboundKey::new(alg, key).map_err(|_| io::Error::other("TLS: the negotiated traffic key is unusable"))?;
        let iv = iv.try_into().map_err(|_| io::Error::other("TLS: the negotiated IV is not 12 bytes"))?;
        Ok(Direction { key: aead::LessSafeKey::new(key), iv, seq })
    }

    /// The next record's nonce (§5.3: the IV xor the record number), counting the record.
    fn next_nonce(&mut self) -> aead::Nonce {
        let mut n = self.iv;
        for (b, s) in n[aead::NONCE_LEN - 8..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        self.seq += 1;
        aead::Nonce::assume_unique_for_key(n)
    }
}

/// The record layer after the handshake.
struct Records {
    tx: Direction,
    rx: Direction,
    rekey: Box<dyn Rekey>,
    key_update_after: u64,
    sent_close: bool,
}

fn bad_record(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {why}"))
}

/// A record's inner content type and the length of its content (RFC 8446 §5.4: the type
/// is the last non-zero byte; zeros after it are padding).
fn content_type(plain: &[u8]) -> io::Result<(u8, usize)> {
    match plain.iter().rposition(|&b| b != 0) {
        Some(at) => Ok((plain[at], at)),
        None => Err(bad_record("a record without a content type")),
    }
}

/// A TLS stream over a TCP socket, either side.
pub(crate) struct TlsStream {
    sock: TcpStream,
    phase: Phase,
    /// Received bytes: `[start, end)` are records not opened yet; `[plain.0, plain.1)` the
    /// opened plaintext of the last record, not yet read.
    inb: Vec<u8>,
    start: usize,
    end: usize,
    plain: (usize, usize),
    /// Application data that arrived with the handshake's last flight (rare; small).
    early: Vec<u8>,
    /// Records being written (always empty between calls).
    out: Vec<u8>,
    /// The peer sent its close_notify: reads answer the end.
    peer_closed: bool,
}

impl TlsStream {
    fn new(sock: TcpStream, phase: Phase) -> TlsStream {
        TlsStream {
            sock,
            phase,
            inb: vec![0; IN_BUF],
            start: 0,
            end: 0,
            plain: (0, 0),
            early: Vec::new(),
            out: Vec::with_capacity(IO_BUF + HEADER + MAX_BODY),
            peer_closed: false,
        }
    }

    /// Runs the handshake to its end (or its failure), under the socket's read timeout;
    /// nothing once it is done.
    pub(crate) fn handshake(&mut self) -> io::Result<()> {
        let phase = std::mem::replace(&mut self.phase, Phase::Failed("TLS: the handshake was interrupted".into()));
        let done = match phase {
            Phase::Open(_) => {
                self.phase = phase;
                return Ok(());
            }
            Phase::Failed(why) => {
                let e = io::Error::other(why.clone());
                self.phase = Phase::Failed(why);
                return Err(e);
            }
            Phase::Client(c) => self.drive(*c),
            Phase::Server(s) => self.drive(*s),
        };
        match done {
            Ok(records) => {
                self.phase = Phase::Open(Box::new(records));
                Ok(())
            }
            Err(e) => {
                self.phase = Phase::Failed(e.to_string());
                Err(e)
            }
        }
    }

    /// Drives one side's handshake over the socket until rustls may hand the keys over.
    fn drive<S: HandshakeSide>(&mut self, mut conn: S) -> io::Result<Records>
    where
        KernelConnection<S::Data>: Rekey,
    {
        loop {
            let UnbufferedStatus { discard, state } = conn.process(&mut self.inb[self.start..self.end]);
            let mut need_bytes = false;
            let mut established = false;
            let failure = match state {
                Err(e) => Some(e),
                Ok(ConnectionState::EncodeTlsData(mut enc)) => {
                    encode_into(&mut self.out, |buf| enc.encode(buf))?;
                    None
                }
                Ok(ConnectionState::TransmitTlsData(t)) => {
                    let r = self.sock.write_all(&self.out);
                    self.out.clear();
                    r?;
                    t.done();
                    None
                }
                Ok(ConnectionState::BlockedHandshake) => {
                    need_bytes = true;
                    None
                }
                Ok(ConnectionState::ReadTraffic(mut r)) => {
                    while let Some(rec) = r.next_record() {
                        let rec = rec.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")))?;
                        self.early.extend_from_slice(rec.payload);
                    }
                    None
                }
                // the server may send before the client's last flight is in: keys are handed
                // over only when both directions are established
                Ok(ConnectionState::WriteTraffic(_)) => {
                    established = true;
                    None
                }
                Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection during the TLS handshake"));
                }
                Ok(other) => return Err(io::Error::other(format!("TLS: unexpected handshake state {other:?}"))),
            };
            self.start += discard;
            if let Some(e) = failure {
                // best effort: the alert rustls queued tells the peer why
                let UnbufferedStatus { state, .. } = conn.process(&mut []);
                if let Ok(ConnectionState::EncodeTlsData(mut enc)) = state {
                    if encode_into(&mut self.out, |buf| enc.encode(buf)).is_ok() {
                        let _ = self.sock.write_all(&self.out);
                    }
                }
                self.out.clear();
                return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()));
            }
            if established && !conn.handshaking() {
                let (secrets, kernel) = conn.into_kernel().map_err(|e| io::Error::other(format!("TLS: {e}")))?;
                let ExtractedSecrets { tx, rx } = secrets;
                return Ok(Records {
                    tx: Direction::new(tx.1, tx.0)?,
                    rx: Direction::new(rx.1, rx.0)?,
                    rekey: Box::new(kernel),
                    key_update_after: KEY_UPDATE_AFTER,
                    sent_close: false,
                });
            }
            if (need_bytes || established) && self.fill()? == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection during the TLS handshake"));
            }
        }
    }

    /// Reads what the socket has (one system call, at most [`IO_BUF`] bytes) into the receive
    /// buffer, first moving an incomplete record to its front when a read might not fit
    /// behind it. Fails when what is still unprocessed fills the whole buffer (a handshake
    /// message larger than rustls takes). Precondition: no opened plaintext waits in the
    /// buffer.
    fn fill(&mut self) -> io::Result<usize> {
        debug_assert!(self.plain.0 == self.plain.1);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.inb.len() - self.end < IO_BUF {
            self.inb.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.inb.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("TLS: more than {IN_BUF} bytes of unprocessed records")));
        }
        let to = (self.end + IO_BUF).min(self.inb.len());
        let n = self.sock.read(&mut self.inb[self.end..to])?;
        self.end += n;
        Ok(n)
    }

    fn records(&mut self) -> io::Result<&mut Records> {
        self.handshake()?;
        match &mut self.phase {
            Phase::Open(r) => Ok(r),
            _ => Err(io::Error::other("TLS: the connection is not established")),
        }
    }

    /// The header and body length of the record at the front of the receive buffer, once
    /// its header is in.
    fn next_header(&self) -> io::Result<Option<([u8; HEADER], usize)>> {
        if self.end - self.start < HEADER {
            return Ok(None);
        }
        let mut header = [0u8; HEADER];
        header.copy_from_slice(&self.inb[self.start..self.start + HEADER]);
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        if header[0] != CONTENT_APPLICATION_DATA || header[1] != 3 || len > MAX_BODY || len <= TAG {
            return Err(bad_record("a malformed record (not TLS 1.3 application data)"));
        }
        Ok(Some((header, len)))
    }

    /// Opens the next whole record in the receive buffer: application data becomes
    /// `plain`, anything else is handled. Returns false when no whole record is buffered.
    fn open_record(&mut self) -> io::Result<bool> {
        let Some((header, len)) = self.next_header()? else { return Ok(false) };
        if self.end - self.start < HEADER + len {
            return Ok(false);
        }
        let body_at = self.start + HEADER;
        let Phase::Open(rec) = &mut self.phase else { return Err(io::Error::other("TLS: the connection is not established")) };
        let nonce = rec.rx.next_nonce();
        let plain = rec
            .rx
            .key
            .open_in_place(nonce, aead::Aad::from(header), &mut self.inb[body_at..body_at + len])
            .map_err(|_| bad_record("a record failed authentication"))?;
        let (typ, n) = content_type(plain)?;
        self.start += HEADER + len;
        if typ == CONTENT_APPLICATION_DATA {
            self.plain = (body_at, body_at + n);
        } else {
            let content = self.inb[body_at..body_at + n].to_vec();
            self.control(typ, &content)?;
        }
        Ok(true)
    }

    /// Handles a record that is not application data: the peer's alert, or handshake
    /// messages.
    fn control(&mut self, typ: u8, content: &[u8]) -> io::Result<()> {
        match typ {
            CONTENT_ALERT => match content {
                [_, 0] => {
                    self.peer_closed = true;
                    Ok(())
                }
                [level, desc] => {
                    Err(io::Error::new(io::ErrorKind::ConnectionAborted, format!("TLS: the peer sent alert {desc} (level {level})")))
                }
                _ => Err(bad_record("a malformed alert")),
            },
            CONTENT_HANDSHAKE => self.post_handshake(content),
            _ => Err(bad_record("a record of an unknown content type")),
        }
    }

    /// Handles the handshake messages TLS 1.3 allows after the handshake: KeyUpdate, and a
    /// session ticket (ignored).
    fn post_handshake(&mut self, mut msgs: &[u8]) -> io::Result<()> {
        while !msgs.is_empty() {
            let [typ, a, b, c, ref rest @ ..] = *msgs else { return Err(bad_record("a truncated handshake message")) };
            let len = u32::from_be_bytes([0, a, b, c]) as usize;
            if rest.len() < len {
                return Err(bad_record("a handshake message split across records"));
            }
            match (typ, &rest[..len]) {
                (HANDSHAKE_KEY_UPDATE, &[request]) if request <= 1 => {
                    let rec = self.records()?;
                    let next = rec.rekey.next_rx().map_err(|e| io::Error::other(format!("TLS: {e}")))?;
                    rec.rx = Direction::new(next, 0)?;
                    if request == 1 {
                        self.send_key_update(false)?;
                    }
                }
                (HANDSHAKE_NEW_SESSION_TICKET, _) => {}
                _ => return Err(bad_record("an unexpected handshake message after the handshake")),
            }
            msgs = &rest[len..];
        }
        Ok(())
    }

    /// Sends a KeyUpdate under the current key and moves to the next one.
    fn send_key_update(&mut self, request_peer: bool) -> io::Result<()> {
        self.seal(CONTENT_HANDSHAKE, &[IoSlice::new(&[HANDSHAKE_KEY_UPDATE, 0, 0, 1, request_peer as u8])])?;
        let r = self.sock.write_all(&self.out);
        self.out.clear();
        r?;
        let rec = self.records()?;
        let next = rec.rekey.next_tx().map_err(|e| io::Error::other(format!("TLS: {e}")))?;
        rec.tx = Direction::new(next, 0)?;
        Ok(())
    }

    /// Appends to `out` the records of `bufs`' bytes, as content of type `typ`, sealed with
    /// the sending key; writes `out` whenever it holds [`IO_BUF`] bytes (the rest stays).
    fn seal(&mut self, typ: u8, bufs: &[IoSlice<'_>]) -> io::Result<()> {
        let mut left: usize = bufs.iter().map(|b| b.len()).sum();
        let (mut i, mut off) = (0, 0);
        let Phase::Open(rec) = &mut self.phase else { return Err(io::Error::other("TLS: the connection is not established")) };
        loop {
            let n = left.min(MAX_PLAIN);
            let body = n + 1 + TAG;
            let header = [CONTENT_APPLICATION_DATA, 3, 3, (body >> 8) as u8, body as u8];
            self.out.extend_from_slice(&header);
            let at = self.out.len();
            let mut want = n;
            while want > 0 {
                let b = &bufs[i][off..];
                let take = b.len().min(want);
                self.out.extend_from_slice(&b[..take]);
                want -= take;
                off += take;
                if off == bufs[i].len() {
                    i += 1;
                    off = 0;
                }
            }
            self.out.push(typ);
            let nonce = rec.tx.next_nonce();
            let tag = rec
                .tx
                .key
                .seal_in_place_separate_tag(nonce, aead::Aad::from(header), &mut self.out[at..])
                .map_err(|_| io::Error::other("TLS: sealing a record failed"))?;
            self.out.extend_from_slice(tag.as_ref());
            left -= n;
            if self.out.len() >= IO_BUF {
                let r = self.sock.write_all(&self.out);
                self.out.clear();
                r?;
            }
            if left == 0 {
                return Ok(());
            }
        }
    }

    /// Whether bytes wait to be read without reading the socket: opened ones, or records in
    /// the receive buffer.
    fn bytes_waiting(&self) -> bool {
        !self.early.is_empty() || self.plain.0 < self.plain.1 || self.start < self.end
    }

    /// Tells the peer this side closes (best effort: the connection is going away).
    fn close(&mut self) {
        let Phase::Open(rec) = &mut self.phase else { return };
        if std::mem::replace(&mut rec.sent_close, true) {
            return;
        }
        // alert level "warning", description close_notify
        if self.seal(CONTENT_ALERT, &[IoSlice::new(&[1, 0])]).is_ok() {
            let _ = self.sock.write_all(&self.out);
        }
        self.out.clear();
    }
}

/// Lets rustls encode a handshake flight at the end of `out`, growing it as asked.
fn encode_into(out: &mut Vec<u8>, mut encode: impl FnMut(&mut [u8]) -> Result<usize, EncodeError>) -> io::Result<()> {
    let at = out.len();
    let mut room = HEADER + MAX_BODY;
    loop {
        out.resize(at + room, 0);
        match encode(&mut out[at..]) {
            Ok(n) => {
                out.truncate(at + n);
                return Ok(());
            }
            Err(EncodeError::InsufficientSize(s)) => room = s.required_size,
            Err(EncodeError::AlreadyEncoded) => {
                out.truncate(at);
                return Ok(());
            }
        }
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.handshake()?;
        if buf.is_empty() {
            return Ok(0);
        }
        if !self.early.is_empty() {
            let n = self.early.len().min(buf.len());
            buf[..n].copy_from_slice(&self.early[..n]);
            self.early.drain(..n);
            return Ok(n);
        }
        let mut n = 0;
        loop {
            let (a, b) = self.plain;
            if a < b {
                let c = (b - a).min(buf.len() - n);
                buf[n..n + c].copy_from_slice(&self.inb[a..a + c]);
                self.plain.0 += c;
                n += c;
                if n == buf.len() {
                    return Ok(n);
                }
            }
            if self.open_record()? {
                continue;
            }
            if n > 0 || self.peer_closed {
                return Ok(n);
            }
            if self.fill()? == 0 {
                return if self.start == self.end {
                    Ok(0)
                } else {
                    Err(io::Error::new(io::ErrorKind::UnexpectedEof, "TLS: the connection ended inside a record"))
                };
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// Seals all of `bufs` (records may span them) and writes the records before returning.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Ok(0);
        }
        let rec = self.records()?;
        if rec.tx.seq >= rec.key_update_after {
            self.send_key_update(false)?;
        }
        let r = self.seal(CONTENT_APPLICATION_DATA, bufs).and_then(|()| self.sock.write_all(&self.out));
        self.out.clear();
        r.map(|()| total)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One direction's handle on a connection's stream.
pub(crate) enum Half {
    Plain(TcpStream),
    Tls(Arc<Mutex<TlsStream>>),
    /// Shared-memory rings beside the socket (`--transport shm`, [`crate::shm`]).
    Shm(crate::shm::ShmStream),
}

impl Half {
    /// Whether bytes wait inside the TLS layer (always false for plain TCP).
    pub(crate) fn bytes_waiting(&self) -> bool {
        match self {
            Half::Plain(_) | Half::Shm(_) => false,
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
            Half::Shm(s) => s.read(buf),
        }
    }
}

impl Write for Half {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Half::Plain(s) => s.write(buf),
            Half::Tls(t) => t.lock().write(buf),
            Half::Shm(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Half::Plain(s) => s.write_vectored(bufs),
            Half::Tls(t) => t.lock().write_vectored(bufs),
            Half::Shm(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Half::Plain(s) => s.flush(),
            Half::Tls(t) => t.lock().flush(),
            Half::Shm(s) => s.flush(),
        }
    }
}

#[cfg(all(test, feature = "test-tls"))]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A connected client and server stream of one throwaway cluster, handshake done.
    fn pair(key_update_after: u64) -> (TlsStream, TlsStream) {
        pair_of(&crate::security::throwaway_tls(), key_update_after)
    }

    /// A connected client and server stream with `tls` on both sides, handshake done.
    fn pair_of(tls: &crate::security::TlsConfig, key_update_after: u64) -> (TlsStream, TlsStream) {
        let setup = TlsSetup::new(tls).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::scope(|s| {
            let h = s.spawn(|| {
                let (sock, _) = l.accept().unwrap();
                let mut t = setup.server(sock).unwrap();
                t.handshake().unwrap();
                t
            });
            let sock = TcpStream::connect(addr).unwrap();
            let mut c = setup.client(sock, &format!("localhost:{}", addr.port())).unwrap();
            c.handshake().unwrap();
            (c, h.join().unwrap())
        });
        let (mut c, mut s) = server;
        for t in [&mut c, &mut s] {
            if let Phase::Open(r) = &mut t.phase {
                r.key_update_after = key_update_after;
            }
        }
        (c, s)
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn frames_of_every_size_cross_both_ways_across_record_and_buffer_edges() {
        let (mut c, mut s) = pair(KEY_UPDATE_AFTER);
        for (i, n) in [1, 5, MAX_PLAIN - 1, MAX_PLAIN, MAX_PLAIN + 1, IO_BUF - 3, IO_BUF + 7, 3 * IO_BUF + 11].into_iter().enumerate() {
            let a = pattern(n, i as u8);
            let b = pattern(n / 2 + 1, i as u8 ^ 0x55);
            std::thread::scope(|sc| {
                sc.spawn(|| {
                    // a frame in two slices, a record spanning both
                    let (x, y) = a.split_at(n / 3);
                    assert_eq!(c.write_vectored(&[IoSlice::new(x), IoSlice::new(y)]).unwrap(), n);
                    let mut back = vec![0; b.len()];
                    c.read_exact(&mut back).unwrap();
                    assert_eq!(back, b, "server to client, {n} bytes");
                });
                let mut got = vec![0; n];
                // read in odd pieces, as the frame reader does (header, then payload)
                let k = n.min(7);
                s.read_exact(&mut got[..k]).unwrap();
                s.read_exact(&mut got[k..]).unwrap();
                assert_eq!(got, a, "client to server, {n} bytes");
                s.write_all(&b).unwrap();
            });
        }
    }

    #[test]
    fn keys_are_updated_every_few_records_and_both_sides_follow() {
        let (mut c, mut s) = pair(3);
        let data = pattern(40 * MAX_PLAIN + 123, 9);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                for chunk in data.chunks(2 * MAX_PLAIN + 5) {
                    c.write_all(chunk).unwrap();
                }
                let mut echo = vec![0; data.len()];
                c.read_exact(&mut echo).unwrap();
                assert!(echo == data, "the echo through renewed keys differs");
            });
            let mut got = vec![0; data.len()];
            s.read_exact(&mut got).unwrap();
            assert!(got == data);
            for chunk in got.chunks(MAX_PLAIN + 1) {
                s.write_all(chunk).unwrap();
            }
        });
        let (Phase::Open(rc), Phase::Open(rs)) = (&c.phase, &s.phase) else { panic!("not open") };
        assert!(rc.tx.seq < 4 && rs.tx.seq < 4, "the sending keys were renewed");
    }

    #[test]
    fn close_notify_reads_as_the_end_and_a_cut_record_as_an_error() {
        let (mut c, mut s) = pair(KEY_UPDATE_AFTER);
        c.write_all(b"last").unwrap();
        c.close();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"last");

        let (mut c, mut s) = pair(KEY_UPDATE_AFTER);
        // half a record, then the socket ends
        let Phase::Open(_) = &c.phase else { panic!() };
        c.seal(CONTENT_APPLICATION_DATA, &[IoSlice::new(b"0123456789")]).unwrap();
        let half = c.out.len() / 2;
        c.sock.write_all(&c.out[..half]).unwrap();
        c.sock.shutdown(std::net::Shutdown::Write).unwrap();
        let mut buf = [0u8; 16];
        let e = s.read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }

    /// Mutual-TLS material whose node certificate is `der_len` bytes of DER, give or take a
    /// few (padded with subject alternative names), signed by a fresh CA.
    fn tls_with_certificate_of(der_len: usize) -> crate::security::TlsConfig {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let sign = |n: usize| {
            let names: Vec<String> = ["localhost".to_string()].into_iter().chain((0..n).map(|i| format!("n{i:07}.example.test"))).collect();
            CertificateParams::new(names).unwrap().signed_by(&key, &ca_cert, &ca_key).unwrap()
        };
        // what a name adds, measured (23 bytes), then one step closer from the first try
        let (small, large) = (sign(1000).der().len() as f64, sign(2000).der().len() as f64);
        let per_name = (large - small) / 1000.0;
        let mut n = 1000.0 + (der_len as f64 - small) / per_name;
        n += (der_len as f64 - sign(n as usize).der().len() as f64) / per_name;
        let cert = sign(n as usize);
        let len = cert.der().len();
        assert!(len.abs_diff(der_len) < 40, "a certificate of {len} bytes, not {der_len}");
        crate::security::TlsConfig {
            cert_pem: cert.pem().into_bytes(),
            key_pem: key.serialize_pem().into_bytes(),
            ca_pem: ca_cert.pem().into_bytes(),
            require_client_cert: true,
            server_name: None,
        }
    }

    #[test]
    fn a_handshake_message_near_the_largest_rustls_takes_fits_the_receive_buffer() {
        // Each side's Certificate message body (the certificate's DER and 9 bytes of framing)
        // is just under rustls's 2^16 − 1 limit (and the certificate near the largest webpki
        // parses: 65,560 bytes is refused as a bad encoding). Each side's flight is more than
        // 64 KiB of records (the server's five, the client's four full ones and a fifth), all
        // in the receive buffer at once while rustls joins the message in place. A 64 KiB
        // buffer fails here ("more than 65536 bytes of unprocessed records"); this does not
        // check the further read's room the buffer also has.
        let tls = tls_with_certificate_of(65_450);
        let (mut c, mut s) = pair_of(&tls, KEY_UPDATE_AFTER);
        let a = pattern(3 * MAX_PLAIN + 5, 7);
        c.write_all(&a).unwrap();
        c.flush().unwrap();
        let mut got = vec![0u8; a.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got, a);
    }

    #[test]
    fn a_tampered_record_is_refused() {
        let (mut c, mut s) = pair(KEY_UPDATE_AFTER);
        c.seal(CONTENT_APPLICATION_DATA, &[IoSlice::new(b"pay 100 to alice")]).unwrap();
        let last = c.out.len() - TAG - 3;
        c.out[last] ^= 1;
        c.sock.write_all(&c.out).unwrap();
        let mut buf = [0u8; 32];
        let e = s.read(&mut buf).unwrap_err();
        assert!(e.to_string().contains("authentication"), "{e}");
    }
}
