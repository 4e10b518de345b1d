//! Who may connect: the cluster secret ([`AuthToken`]) every connection presents before any
//! frame is served, and the TLS material ([`TlsConfig`]) of the gRPC transport.
//!
//! The token is checked by the transport, on the connection's own thread, before the node
//! above sees a single frame: framed TCP opens every connection with a `Hello` frame carrying
//! it (answered before anything else is read), gRPC sends it as request metadata of the one
//! stream a connection is. A peer with no or the wrong token is refused with
//! `Status::Unauthenticated` and a message that says which, logged once per peer address.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Shortest accepted secret, in bytes.
pub const MIN_TOKEN_LEN: usize = 16;

/// The gRPC metadata key that carries the token.
pub const TOKEN_METADATA_KEY: &str = "x-downpour-token";

/// [`crate::NetConfig::handshake_timeout`]'s default: how long an accepted connection may take
/// to finish its handshake (present its token).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The cluster secret. Its `Debug` form never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthToken(Arc<str>);

impl AuthToken {
    /// A token from `secret` (surrounding whitespace, such as a file's final newline, is
    /// removed). It must be at least [`MIN_TOKEN_LEN`] bytes of printable ASCII (it travels as
    /// gRPC metadata).
    pub fn new(secret: &str) -> Result<Self, String> {
        let s = secret.trim();
        if s.len() < MIN_TOKEN_LEN {
            return Err(format!("the auth token must be at least {MIN_TOKEN_LEN} characters long (got {})", s.len()));
        }
        if !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the auth token must be printable ASCII without spaces".into());
        }
        Ok(AuthToken(s.into()))
    }

    /// The secret, to send.
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token, in time that does not depend on where they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let mine = self.0.as_bytes();
        let mut diff = u8::from(mine.len() != presented.len());
        for (i, &b) in mine.iter().enumerate() {
            diff |= b ^ presented.get(i).copied().unwrap_or(0);
        }
        diff == 0
    }
}

impl fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthToken(<redacted>)")
    }
}

/// Why a presented token was refused, as the refusal message says it.
pub(crate) fn check_token(expected: &AuthToken, presented: Option<&[u8]>) -> Result<(), &'static str> {
    match presented {
        None | Some([]) => Err("authentication required: this cluster needs its auth token (--auth-token-file or DOWNPOUR_AUTH_TOKEN)"),
        Some(p) if expected.matches(p) => Ok(()),
        Some(_) => Err("authentication failed: wrong auth token"),
    }
}

/// Logs a refusal once per peer host (a refused peer retrying must not flood the log).
#[derive(Clone, Default)]
pub(crate) struct RefusalLog(Arc<Mutex<HashSet<String>>>);

impl RefusalLog {
    pub(crate) fn refused(&self, peer: &str, why: &str) {
        let host = match peer.rsplit_once(':') {
            Some((h, _)) => h.to_string(),
            None => peer.to_string(),
        };
        let mut seen = self.0.lock();
        // bounded: past 10,000 distinct hosts, stop remembering (and logging) new ones
        if seen.len() < 10_000 && seen.insert(host) {
            tracing::warn!("refused a connection from {peer}: {why}");
        }
    }
}

/// TLS material of a node (PEM), for the gRPC transport.
#[derive(Clone)]
pub struct TlsConfig {
    /// This node's certificate chain.
    pub cert_pem: Vec<u8>,
    /// Its private key.
    pub key_pem: Vec<u8>,
    /// The cluster CA: peers' certificates must be signed by it.
    pub ca_pem: Vec<u8>,
    /// Servers require clients to present a certificate signed by the CA (mutual TLS).
    pub require_client_cert: bool,
    /// The name to check servers' certificates against; `None`: the host of the address
    /// connected to.
    pub server_name: Option<String>,
}

impl TlsConfig {
    /// Reads the three PEM files, with errors that name the file.
    pub fn from_files(
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
        require_client_cert: bool,
        server_name: Option<String>,
    ) -> Result<Self, String> {
        let read = |p: &std::path::Path, what: &str| -> Result<Vec<u8>, String> {
            use std::io::Read;
            const MAX: u64 = 1 << 20;
            let mut b = Vec::new();
            std::fs::File::open(p)
                .and_then(|f| f.take(MAX + 1).read_to_end(&mut b))
                .map_err(|e| format!("cannot read the TLS {what} {}: {e}", p.display()))?;
            if b.len() as u64 > MAX {
                return Err(format!("the TLS {what} {} is larger than 1 MiB", p.display()));
            }
            if !String::from_utf8_lossy(&b).contains("-----BEGIN ") {
                return Err(format!("the TLS {what} {} is not a PEM file", p.display()));
            }
            Ok(b)
        };
        Ok(TlsConfig {
            cert_pem: read(cert, "certificate")?,
            key_pem: read(key, "key")?,
            ca_pem: read(ca, "CA certificate")?,
            require_client_cert,
            server_name,
        })
    }
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("require_client_cert", &self.require_client_cert)
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// A fresh throw-away CA and one node certificate it signed, valid for `localhost` and
/// `127.0.0.1`, as mutual-TLS material (`require_client_cert`): for tests (feature
/// `test-tls`). Every call makes a new CA, so two calls' materials do not trust each other.
#[cfg(feature = "test-tls")]
pub fn throwaway_tls() -> TlsConfig {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("key generation");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let key = KeyPair::generate().expect("key generation");
    let cert = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("node parameters")
        .signed_by(&key, &ca_cert, &ca_key)
        .expect("node certificate");
    TlsConfig {
        cert_pem: cert.pem().into_bytes(),
        key_pem: key.serialize_pem().into_bytes(),
        ca_pem: ca_cert.pem().into_bytes(),
        require_client_cert: true,
        server_name: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_matches_only_itself_and_never_prints() {
        let t = AuthToken::new("  correct-horse-battery-staple\n").unwrap();
        assert!(t.matches(b"correct-horse-battery-staple"));
        assert!(!t.matches(b"correct-horse-battery-stapl"));
        assert!(!t.matches(b"correct-horse-battery-staplee"));
        assert!(!t.matches(b"Correct-horse-battery-staple"));
        assert!(!t.matches(b""));
        assert!(!format!("{t:?}").contains("horse"));
        assert!(AuthToken::new("short").is_err());
        assert!(AuthToken::new("sixteen chars with spaces").is_err());
        assert_eq!(check_token(&t, None).unwrap_err().split(':').next(), Some("authentication required"));
        assert_eq!(check_token(&t, Some(b"nope")).unwrap_err(), "authentication failed: wrong auth token");
        assert!(check_token(&t, Some(b"correct-horse-battery-staple")).is_ok());
    }
}
