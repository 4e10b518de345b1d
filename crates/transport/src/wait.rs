//! Waiting for a listener without spinning: [`until_acceptable`] blocks in poll(2) until a
//! connection is there to accept or the time is up, so an idle node's accept threads do not
//! wake every few milliseconds to ask (on a server of 0.1 core, with its evictor's wake-ups,
//! that asking was 8 % of its CPU: docs/benchmarks.md, "An idle node"). [`accept_within`] is
//! both network transports' accept loop around it.

use crate::security::RefusalLog;
use crate::{ConnSlot, ConnSlots, Result, TransportError};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Binds `addr` for a listener, non-blocking (for [`accept_within`]), and its actual
/// address (the port when `:0` was asked for). A port in use says so.
pub(crate) fn bind(addr: &str) -> Result<(TcpListener, String)> {
    let err = |reason: String| TransportError::Bind { addr: addr.to_string(), reason };
    let l = TcpListener::bind(addr).map_err(|e| {
        err(if e.kind() == io::ErrorKind::AddrInUse {
            "the address is already in use (is another node running on this port?)".into()
        } else {
            e.to_string()
        })
    })?;
    l.set_nonblocking(true).map_err(|e| err(e.to_string()))?;
    let local = l.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| addr.to_string());
    Ok((l, local))
}

/// Accepts from `l` (non-blocking) until a connection is set up or `timeout` passes (then
/// `None`). Each accepted socket takes a slot of `slots`; past the cap it is closed at once
/// (said once per host in `refusals`). `set_up` makes the connection of a socket and its
/// slot, or `None` when it could not (it says why itself), and the loop goes on. A
/// connection reset before it was accepted is the peer's problem; any other accept error
/// is returned, naming `local`.
pub(crate) fn accept_within<C>(
    l: &TcpListener,
    local: &str,
    timeout: Duration,
    slots: &ConnSlots,
    refusals: &RefusalLog,
    mut set_up: impl FnMut(TcpStream, SocketAddr, ConnSlot) -> Option<C>,
) -> Result<Option<C>> {
    let deadline = Instant::now() + timeout;
    loop {
        match l.accept() {
            Ok((s, peer)) => {
                match slots.take() {
                    Some(slot) => {
                        if let Some(c) = set_up(s, peer, slot) {
                            return Ok(Some(c));
                        }
                    }
                    None => {
                        // Too many open connections: close this one at once.
                        refusals.refused(&peer.to_string(), "too many open connections");
                        drop(s);
                    }
                }
                // a never-ending flood must not keep the caller from its stop checks
                if Instant::now() >= deadline {
                    return Ok(None);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let now = Instant::now();
                if now >= deadline {
                    return Ok(None);
                }
                until_acceptable(l, deadline - now);
            }
            Err(e)
                if matches!(e.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::Interrupted) => {}
            Err(e) => return Err(TransportError::Io { peer: local.to_string(), source: e }),
        }
    }
}

/// Blocks until `l` (non-blocking) has a connection to accept, or `timeout` passes, or a
/// signal interrupts the wait; the caller then tries `accept` again and checks its own
/// deadline and stop flag. Waits at least a millisecond.
pub(crate) fn until_acceptable(l: &TcpListener, timeout: Duration) {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd, owned by this frame, for the length of the call; the
        // listener's descriptor stays open while `l` is borrowed.
        unsafe { libc::poll(&mut p, 1, ms) };
    }
    #[cfg(not(unix))]
    {
        let _ = l;
        std::thread::sleep(timeout.min(Duration::from_millis(2)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_wait_ends_when_a_connection_arrives_not_at_its_timeout() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let t = Instant::now();
        until_acceptable(&l, Duration::from_millis(50));
        assert!(t.elapsed() >= Duration::from_millis(40), "nothing to accept: the wait lasts its timeout");
        let client = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            std::net::TcpStream::connect(addr).unwrap()
        });
        let t = Instant::now();
        until_acceptable(&l, Duration::from_secs(20));
        assert!(t.elapsed() < Duration::from_secs(10), "the connection ends the wait");
        assert!(l.accept().is_ok());
        drop(client.join().unwrap());
    }
}
