//! The zero-copy relay of framed TCP: bytes go from one socket's receive queue to another
//! socket's send queue by reference (Linux `splice` into a pipe, `tee` to a second pipe,
//! `splice` out to the other socket), while the first pipe is read into the process's buffer.
//! A chain member forwarding a push thus copies it once (into its own buffer, to apply it)
//! instead of twice. Elsewhere than on Linux there are no pipes and the relay copies.

use std::io;
use std::os::fd::RawFd;

/// What one [`Pipes::relay`] step did.
pub(crate) struct Step {
    /// Bytes received into the caller's buffer (at least 1).
    pub read: usize,
    /// Of them, the first `teed` went to the target; the caller sends the rest itself.
    pub teed: usize,
    /// The target failed (the pipes must then be dropped: the second may hold bytes).
    pub target_error: Option<io::Error>,
}

/// Two pipes: received bytes land in the first, the second carries their copy out.
pub(crate) struct Pipes {
    #[cfg(target_os = "linux")]
    a: [std::os::fd::OwnedFd; 2],
    #[cfg(target_os = "linux")]
    b: [std::os::fd::OwnedFd; 2],
    cap: usize,
}

/// Pipe size asked for (Linux's default limit for unprivileged processes).
#[cfg(target_os = "linux")]
const PIPE_BYTES: libc::c_int = 1 << 20;

#[cfg(target_os = "linux")]
fn retry<T: PartialOrd + Default>(mut f: impl FnMut() -> T) -> io::Result<T> {
    loop {
        let n = f();
        if n >= T::default() {
            return Ok(n);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl Pipes {
    /// Two pipes of up to 1 MiB, or `None` when they cannot be made (or not on Linux).
    #[cfg(target_os = "linux")]
    pub fn new() -> Option<Pipes> {
        use std::os::fd::{FromRawFd, OwnedFd};
        let pipe = || -> Option<[OwnedFd; 2]> {
            let mut fds = [0 as libc::c_int; 2];
            // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return None;
            }
            // SAFETY: pipe2 succeeded, so both are open descriptors owned by nobody else.
            Some(unsafe { [OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])] })
        };
        let (a, b) = (pipe()?, pipe()?);
        let mut cap = usize::MAX;
        for p in [&a, &b] {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&p[1]);
            // SAFETY: fcntl on an open pipe descriptor; a refused size keeps the default.
            let got = unsafe {
                libc::fcntl(fd, libc::F_SETPIPE_SZ, PIPE_BYTES);
                libc::fcntl(fd, libc::F_GETPIPE_SZ)
            };
            if got <= 0 {
                return None;
            }
            cap = cap.min(got as usize);
        }
        Some(Pipes { a, b, cap })
    }

    /// No pipes elsewhere than on Linux: the relay copies.
    #[cfg(not(target_os = "linux"))]
    pub fn new() -> Option<Pipes> {
        None
    }

    /// Receives up to `min(dst.len(), capacity)` bytes (at least one; waits for them under
    /// the socket's receive timeout) from socket `from` into `dst`, and sends what it can
    /// of them to socket `to` without copying. Precondition: both pipes are empty (they
    /// are after every step that returns `Ok` without a `target_error`).
    #[cfg(target_os = "linux")]
    pub fn relay(&self, from: RawFd, to: RawFd, dst: &mut [u8]) -> io::Result<Step> {
        use std::os::fd::AsRawFd;
        let (ar, aw) = (self.a[0].as_raw_fd(), self.a[1].as_raw_fd());
        let (br, bw) = (self.b[0].as_raw_fd(), self.b[1].as_raw_fd());
        let want = dst.len().min(self.cap);
        // SAFETY: splice between open descriptors with no offsets (sockets and pipes).
        let k = retry(|| unsafe { libc::splice(from, std::ptr::null_mut(), aw, std::ptr::null_mut(), want, libc::SPLICE_F_MOVE) })?;
        if k == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let k = k as usize;
        // SAFETY: tee between two open pipes.
        let teed = retry(|| unsafe { libc::tee(ar, bw, k, 0) }).map(|t| t as usize).unwrap_or(0);
        let mut sent = 0;
        let mut target_error = None;
        let more = if k < dst.len() { libc::SPLICE_F_MORE } else { 0 };
        while sent < teed {
            // SAFETY: as above.
            let n = retry(|| unsafe {
                libc::splice(br, std::ptr::null_mut(), to, std::ptr::null_mut(), teed - sent, libc::SPLICE_F_MOVE | more)
            });
            match n {
                Ok(0) => {
                    target_error = Some(io::ErrorKind::WriteZero.into());
                    break;
                }
                Ok(n) => sent += n as usize,
                Err(e) => {
                    target_error = Some(e);
                    break;
                }
            }
        }
        let mut got = 0;
        while got < k {
            let rest = &mut dst[got..k];
            // SAFETY: reading into a valid, exclusively borrowed buffer from an open pipe.
            let n = retry(|| unsafe { libc::read(ar, rest.as_mut_ptr().cast(), rest.len()) })?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            got += n as usize;
        }
        Ok(Step { read: k, teed, target_error })
    }

    /// Never called: [`Pipes::new`] gives none elsewhere than on Linux.
    #[cfg(not(target_os = "linux"))]
    pub fn relay(&self, _from: RawFd, _to: RawFd, _dst: &mut [u8]) -> io::Result<Step> {
        Err(io::ErrorKind::Unsupported.into())
    }
}
