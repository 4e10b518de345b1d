//! A minimal HTTP/1.1 endpoint for metrics and health probes ([`serve_http`]): one thread,
//! one connection at a time, `GET` only, bounded in time and size, so a slow or silent
//! client cannot hold it. Servers and the coordinator serve `/metrics` and `/healthz` on it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// An HTTP reply: status line text (`200 OK`), content type, body.
pub type HttpReply = (&'static str, &'static str, String);

/// Binds `listen` and answers `GET PATH` requests with `route(PATH)` on a thread named
/// `name` until `stopped()` holds; returns the bound address. A path `route` does not know
/// gets its `None` as 404. Fails, naming the address, when it cannot bind.
pub fn serve_http<R, S>(listen: &str, name: &str, route: R, stopped: S) -> std::io::Result<String>
where
    R: Fn(&str) -> Option<HttpReply> + Send + 'static,
    S: Fn() -> bool + Send + 'static,
{
    let l = TcpListener::bind(listen).map_err(|e| std::io::Error::new(e.kind(), format!("metrics endpoint on {listen}: {e}")))?;
    l.set_nonblocking(true)?;
    let addr = l.local_addr()?.to_string();
    std::thread::Builder::new().name(name.into()).spawn(move || {
        while !stopped() {
            match l.accept() {
                Ok((s, _)) => {
                    if let Err(e) = answer(s, &route) {
                        tracing::debug!("metrics endpoint: {e}");
                    }
                }
                // (a tenth of a second at most between looks at `stopped`)
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => crate::wait::until_acceptable(&l, Duration::from_millis(100)),
                Err(e) => {
                    tracing::warn!("metrics endpoint: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    })?;
    Ok(addr)
}

/// Answers one HTTP request (a connection each). A client gets 2 s in all to send its
/// request, however it trickles in, and 2 s to take the reply.
fn answer(mut s: TcpStream, route: &dyn Fn(&str) -> Option<HttpReply>) -> std::io::Result<()> {
    const LIMIT: Duration = Duration::from_secs(2);
    let deadline = Instant::now() + LIMIT;
    s.set_nonblocking(false)?;
    s.set_write_timeout(Some(LIMIT))?;
    let mut buf = [0u8; 4096];
    let mut n = 0;
    while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the request took longer than 2 s"));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    let mut parts = head.split_whitespace();
    let (status, kind, body) = match (parts.next(), parts.next()) {
        (Some("GET"), Some(path)) => route(path).unwrap_or(("404 Not Found", "text/plain", "GET /metrics or /healthz\n".into())),
        _ => ("400 Bad Request", "text/plain", "GET /metrics or /healthz\n".into()),
    };
    let reply = format!("HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    s.write_all(reply.as_bytes())
}

/// The content type of Prometheus text.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
