//! Shared memory between processes on one host (`--transport shm`): framed TCP's frames —
//! the same [`crate::tcp::TcpConnection`], token handshake and all — carried through two
//! byte rings in a file under `/dev/shm` that both processes map, instead of through the
//! kernel's TCP stack. Loopback TCP on a small VM moves ~2 GB/s however many streams share
//! it (it is the kernel's per-byte work, not the copies); a ring moves what `memcpy` moves,
//! and a ring smaller than the last-level cache keeps the bytes in it between the writer's
//! copy and the reader's (BytePS puts co-located servers on shared memory for this reason).
//!
//! The TCP connection stays open beside the rings, as a doorbell and a lifeline. A side that
//! finds its ring empty (reading) or full (writing) polls the ring for [`SPIN`], yielding its
//! core to other runnable threads, then raises its flag in the shared header and sleeps in
//! poll(2) on the socket; the other side, after it moves the ring's position, sees the flag
//! and writes one byte to the socket. A peer that exits or dies closes the socket, which
//! wakes the sleeper with the end of the stream: a reader then takes what is left in the
//! ring and sees a clean close; a writer fails with [`io::ErrorKind::BrokenPipe`]. Receive
//! timeouts are the socket's (`SO_RCVTIMEO`), so `set_recv_timeout` works as on TCP.
//!
//! Setting up (the connecting side, [`Link::connect`]): make the file
//! (`/dev/shm/downpour-<pid>-<nanos>-<n>`, mode 0600, its pages reserved at once so a full
//! `/dev/shm` is an error here, not a `SIGBUS` later), write a random 128-bit nonce into its
//! header, map it, send its path and the nonce as the connection's first bytes, wait for the
//! verdict, remove the name (the mapping lives on until both sides unmap it); before making
//! it, remove the names this user's dead processes left (a process killed before its peer
//! answered: [`sweep_orphans`]). The accepting
//! side ([`Link::accept`], in the connection's own thread on its first read) opens only a
//! regular file under that prefix, owned by its own user and readable by no one else, checks
//! the header's magic, sizes and nonce, claims it (a header word set once: no second
//! connection can take the same rings), removes the name, and answers. A process that only
//! sees the name in `/dev/shm` cannot attach to the rings (it cannot read the nonce); a peer
//! on another host cannot name a file here; a plain framed-TCP peer is refused with a
//! message saying that every node needs `--transport shm`.
//!
//! Positions in the shared header come from another process: each side keeps its own
//! position in its own memory and only publishes it; the peer's is checked (at most a ring
//! apart) before any copy, and every copy stays inside the mapping whatever it says. The
//! peers are processes of one user, which trust each other as far as this: one that
//! truncated the file under the other would kill it with `SIGBUS` (as it could with `kill`).

use crate::spin::Spin;
use memmap2::{MmapOptions, MmapRaw};
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where the rings' files are made (Linux's shared-memory tmpfs).
const DIR: &str = "/dev/shm";
/// Every ring file's name starts with this (under [`DIR`]); the accepting side opens nothing else.
const PREFIX: &str = "downpour-";
/// The connecting side's first bytes on the socket (then the nonce, the path's length and
/// the path).
const HELLO: [u8; 8] = *b"DPSHM\x02\r\n";
/// The file header's first word.
const MAGIC: u64 = u64::from_le_bytes(*b"DPSHMv02");
/// The file's header: the magic, the ring size, per direction four words (tail, head, the
/// reader's and the writer's sleep flags), the nonce and the claim, each on a cache line of
/// its own.
const HEADER_BYTES: usize = 4096;
const LINE: usize = 64;
const MAGIC_LINE: usize = 0;
const SIZE_LINE: usize = 1;
const NONCE_LINES: [usize; 2] = [10, 11];
const CLAIM_LINE: usize = 12;
/// The smallest ring the file format allows (the module's tests use it, to wrap often).
const SMALLEST_RING: usize = 4 << 10;
/// The smallest ring a transport accepts: a worker leaves up to 32 KiB of value replies and
/// up to 1,024 acknowledgements unread while it writes (`KvClient`), which TCP's socket
/// buffers absorb; a ring must too, or a server blocked on a full reply ring and a worker
/// blocked on a full request ring would wait for each other for ever.
pub const MIN_RING_BYTES: usize = 256 << 10;
/// The largest ring.
pub const MAX_RING_BYTES: usize = 1 << 30;
/// [`crate::NetConfig::shm_ring_bytes`]'s default: 4 MiB each way (inside the last-level
/// cache of most machines, and about what loopback TCP buffers).
pub const DEFAULT_RING_BYTES: usize = 4 << 20;
/// How long a side polls its ring before it sleeps on the socket (waking a sleeping
/// thread costs tens of µs on small VMs, on both sides of every hand-off).
const SPIN: Duration = Duration::from_micros(50);
/// Polls with the CPU's pause hint before each poll yields the core instead.
const PAUSES: u32 = 64;
/// The longest single sleep on the socket: a safety net under the doorbells (a sleeper
/// looks at its ring at least this often whatever happens).
const NAP: Duration = Duration::from_millis(100);
/// Bytes copied between two publications of a position, so that the reader copies out
/// while the writer still copies in (one big copy would make them take turns).
const STEP: usize = 128 << 10;

/// Which direction a side writes: the connecting side writes ring 0 and reads ring 1.
#[derive(Clone, Copy)]
enum Side {
    Connecting,
    Accepting,
}

/// The shared mapping, once set up.
struct Rings {
    map: MmapRaw,
    /// Bytes per ring (a power of two).
    cap: usize,
}

/// A ring's four shared words.
struct Ends<'a> {
    tail: &'a AtomicU64,
    head: &'a AtomicU64,
    reader_sleeps: &'a AtomicU64,
    writer_sleeps: &'a AtomicU64,
    data: *mut u8,
    cap: usize,
}

impl Rings {
    fn word(&self, line: usize) -> &AtomicU64 {
        debug_assert!((line + 1) * LINE <= HEADER_BYTES && self.map.len() >= HEADER_BYTES);
        // SAFETY: the mapping is at least HEADER_BYTES long and page-aligned, so every line's
        // first 8 bytes are an aligned u64 inside it, valid as long as `self` (which owns the
        // mapping); the other process touches them only atomically too.
        unsafe { &*(self.map.as_mut_ptr().add(line * LINE) as *const AtomicU64) }
    }

    fn ends(&self, ring: usize) -> Ends<'_> {
        let l = 2 + 4 * ring;
        Ends {
            tail: self.word(l),
            head: self.word(l + 1),
            reader_sleeps: self.word(l + 2),
            writer_sleeps: self.word(l + 3),
            // SAFETY: the mapping is HEADER_BYTES + 2 * cap long (checked when it was made or
            // opened), so ring `ring` < 2 starts inside it.
            data: unsafe { self.map.as_mut_ptr().add(HEADER_BYTES + ring * self.cap) },
            cap: self.cap,
        }
    }
}

impl Ends<'_> {
    /// Bytes written and not yet read, given the reader's own `head`.
    fn filled(&self, head: u64) -> io::Result<usize> {
        let n = self.tail.load(Ordering::Acquire).wrapping_sub(head);
        if n > self.cap as u64 {
            return Err(corrupt());
        }
        Ok(n as usize)
    }

    /// Room to write, given the writer's own `tail`.
    fn room(&self, tail: u64) -> io::Result<usize> {
        let used = tail.wrapping_sub(self.head.load(Ordering::Acquire));
        if used > self.cap as u64 {
            return Err(corrupt());
        }
        Ok(self.cap - used as usize)
    }

    /// Copies `src` in at position `pos` (the caller checked the room).
    fn copy_in(&self, pos: u64, src: &[u8]) {
        let at = (pos as usize) & (self.cap - 1);
        let first = src.len().min(self.cap - at);
        // SAFETY: `at + first <= cap` and `src.len() <= cap` (the caller's room): both copies
        // stay inside this ring. The reader does not touch these bytes until `tail` moves past
        // them; a peer that broke that protocol could race with this copy (the bytes would be
        // garbage, which the frame codec checks like any other input), as in all shared-memory
        // IPC.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.data.add(at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.data, src.len() - first);
        }
    }

    /// Copies out into `dst` from position `pos` (the caller checked the bytes are there).
    fn copy_out(&self, pos: u64, dst: &mut [u8]) {
        let at = (pos as usize) & (self.cap - 1);
        let first = dst.len().min(self.cap - at);
        // SAFETY: as in `copy_in`; the writer does not touch these bytes until `head` moves
        // past them.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data.add(at), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(self.data, dst.as_mut_ptr().add(first), dst.len() - first);
        }
    }
}

fn corrupt() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "the peer's shared-memory ring positions are inconsistent")
}

/// What a sleep on the socket ended with.
enum Woke {
    /// A doorbell, a signal, or nothing: look at the ring again.
    Look,
    /// The peer closed the connection (or it was reset).
    Closed,
}

/// One connection's shared rings and the socket beside them; the connection's reading and
/// writing halves share it. Used by one thread at a time (the connection's): two threads
/// waiting on one link share its doorbell socket and could take each other's wake-up (then
/// a sleeper would look again only after [`NAP`]).
pub(crate) struct Link {
    sock: TcpStream,
    side: Side,
    rings: OnceLock<Rings>,
    /// This side's own positions (bytes read of the incoming ring, written to the outgoing
    /// one), kept here and only published to the header, so the peer cannot move them.
    read_pos: AtomicU64,
    write_pos: AtomicU64,
    /// The peer closed the socket (seen while draining doorbells).
    closed: AtomicBool,
    /// The ring file's path (the tests check it is gone).
    #[cfg(test)]
    path: String,
}

impl Link {
    /// (Connecting side.) Makes the rings (`ring_bytes` each way, a power of two within
    /// [`MIN_RING_BYTES`]..=[`MAX_RING_BYTES`], which the transport checked; the format allows
    /// down to 4 KiB, which the tests use), offers them over `sock` and waits up to
    /// `timeout` for the peer's verdict. The error says why, in words for the user.
    pub(crate) fn connect(sock: TcpStream, ring_bytes: usize, timeout: Duration) -> Result<Link, String> {
        if !ring_bytes.is_power_of_two() || !(SMALLEST_RING..=MAX_RING_BYTES).contains(&ring_bytes) {
            return Err(format!("shared-memory rings of {ring_bytes} bytes: not a power of two from 4 KiB to 1 GiB"));
        }
        let mut nonce = [0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce)
            .map_err(|_| "no randomness for the shared-memory nonce".to_string())?;
        let len = HEADER_BYTES + 2 * ring_bytes;
        let (file, path) = create_file(len)?;
        // the name goes as soon as the peer has answered (or we give up): the mapping lives on
        let removed = RemoveOnDrop(&path);
        let map = MmapOptions::new().len(len).map_raw(&file).map_err(|e| format!("cannot map {path}: {e}"))?;
        let rings = Rings { map, cap: ring_bytes };
        rings.word(SIZE_LINE).store(ring_bytes as u64, Ordering::Relaxed);
        for (i, line) in NONCE_LINES.into_iter().enumerate() {
            rings.word(line).store(u64::from_le_bytes(nonce[8 * i..8 * i + 8].try_into().unwrap_or_default()), Ordering::Relaxed);
        }
        rings.word(MAGIC_LINE).store(MAGIC, Ordering::Release);
        let io = |e: io::Error| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!("shared-memory handshake: no answer within {timeout:?}"),
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => {
                "the server closed the connection during the shared-memory handshake (is it running with \
                 --transport shm? is it at --max-connections?)"
                    .to_string()
            }
            _ => format!("shared-memory handshake: {e}"),
        };
        let mut hello = HELLO.to_vec();
        hello.extend_from_slice(&nonce);
        hello.push(path.len() as u8);
        hello.extend_from_slice(path.as_bytes());
        (&sock).write_all(&hello).map_err(io)?;
        sock.set_read_timeout(Some(timeout)).map_err(io)?;
        let mut verdict = [0u8; 1];
        (&sock).read_exact(&mut verdict).map_err(io)?;
        if verdict[0] != 0 {
            let mut len = [0u8; 1];
            let mut why = vec![0u8; 0];
            if (&sock).read_exact(&mut len).is_ok() {
                why.resize(len[0] as usize, 0);
                let _ = (&sock).read_exact(&mut why);
            }
            return Err(format!("refused shared memory: {}", String::from_utf8_lossy(&why)));
        }
        sock.set_read_timeout(None).map_err(io)?;
        drop(removed);
        let link = Link::new(sock, Side::Connecting);
        #[cfg(test)]
        let link = Link { path: path.clone(), ..link };
        let _ = link.rings.set(rings);
        Ok(link)
    }

    fn new(sock: TcpStream, side: Side) -> Link {
        Link {
            sock,
            side,
            rings: OnceLock::new(),
            read_pos: AtomicU64::new(0),
            write_pos: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            #[cfg(test)]
            path: String::new(),
        }
    }

    /// (Accepting side.) A link whose rings come with the peer's first bytes ([`Link::accept`]).
    pub(crate) fn pending(sock: TcpStream) -> Link {
        Link::new(sock, Side::Accepting)
    }

    /// Whether the rings are set up.
    pub(crate) fn is_open(&self) -> bool {
        self.rings.get().is_some()
    }

    /// (Accepting side.) Reads the peer's offer (under the socket's read timeout, which the
    /// caller set), opens and checks the file, and answers. The error is the refusal's reason.
    pub(crate) fn accept(&self) -> Result<(), String> {
        let r = self.open_offer();
        let mut answer = vec![0u8];
        if let Err(why) = &r {
            let why = &why.as_bytes()[..why.len().min(255)];
            answer = vec![1, why.len() as u8];
            answer.extend_from_slice(why);
        }
        // best effort when refusing: the peer may be gone
        let sent = (&self.sock).write_all(&answer);
        let rings = r?;
        sent.map_err(|e| format!("shared-memory handshake: {e}"))?;
        let _ = self.rings.set(rings);
        Ok(())
    }

    fn open_offer(&self) -> Result<Rings, String> {
        let io = |e: io::Error| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => "no shared-memory handshake in time".to_string(),
            io::ErrorKind::UnexpectedEof => "the peer closed the connection during the shared-memory handshake".to_string(),
            _ => format!("shared-memory handshake: {e}"),
        };
        let mut hello = [0u8; 8 + 16 + 1];
        (&self.sock).read_exact(&mut hello[..8]).map_err(io)?;
        if hello[..8] != HELLO {
            return Err("not a shared-memory peer: every node of a --transport shm cluster needs --transport shm".into());
        }
        (&self.sock).read_exact(&mut hello[8..]).map_err(io)?;
        let nonce = &hello[8..24];
        let mut path = vec![0u8; hello[24] as usize];
        (&self.sock).read_exact(&mut path).map_err(io)?;
        let path = String::from_utf8(path).map_err(|_| "the offered ring file's name is not UTF-8".to_string())?;
        let name = path.strip_prefix(DIR).and_then(|p| p.strip_prefix('/')).unwrap_or("");
        if !name.starts_with(PREFIX) || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(format!("{path:?} is not a ring file of ours ({DIR}/{PREFIX}…)"));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| format!("cannot open the offered ring file {path}: {e} (shared memory needs both processes on one host)"))?;
        let meta = file.metadata().map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if !meta.is_file() || meta.uid() != me || meta.mode() & 0o077 != 0 {
            return Err(format!("{path} is not a regular file of this user that only this user may open"));
        }
        let len = meta.len() as usize;
        if len < HEADER_BYTES {
            return Err(format!("{path} is too short for a ring file"));
        }
        // the header alone first, at its own length: the rings' size comes from it
        let map = MmapOptions::new().len(HEADER_BYTES).map_raw(&file).map_err(|e| format!("cannot map {path}: {e}"))?;
        let head = Rings { map, cap: 0 };
        let (magic, cap) = (head.word(MAGIC_LINE).load(Ordering::Acquire), head.word(SIZE_LINE).load(Ordering::Relaxed) as usize);
        if magic != MAGIC {
            return Err(format!("{path} is not a ring file (bad magic)"));
        }
        if !cap.is_power_of_two() || !(SMALLEST_RING..=MAX_RING_BYTES).contains(&cap) || len != HEADER_BYTES + 2 * cap {
            return Err(format!("{path}: rings of {cap} bytes do not fit its {len} bytes"));
        }
        let mut same = 0u64;
        for (i, line) in NONCE_LINES.into_iter().enumerate() {
            let want = u64::from_le_bytes(nonce[8 * i..8 * i + 8].try_into().unwrap_or_default());
            same |= head.word(line).load(Ordering::Relaxed) ^ want;
        }
        if same != 0 {
            return Err(format!("{path}: the nonce offered is not the file's"));
        }
        if head.word(CLAIM_LINE).compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Err(format!("{path}: these rings belong to another connection already"));
        }
        // ours now: the name can go (the maker removes it too, once answered)
        let _ = std::fs::remove_file(&path);
        let map = MmapOptions::new().len(HEADER_BYTES + 2 * cap).map_raw(&file).map_err(|e| format!("cannot map {path}: {e}"))?;
        if map.len() != HEADER_BYTES + 2 * cap {
            return Err(format!("{path}: mapped {} bytes, not {}", map.len(), HEADER_BYTES + 2 * cap));
        }
        Ok(Rings { map, cap })
    }

    fn rings(&self) -> io::Result<&Rings> {
        self.rings.get().ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "the shared-memory handshake has not run"))
    }

    fn rx(&self) -> usize {
        match self.side {
            Side::Connecting => 1,
            Side::Accepting => 0,
        }
    }

    fn tx(&self) -> usize {
        1 - self.rx()
    }

    /// Whether a read would start without waiting: bytes in the ring, or the peer closed.
    /// Consumes nothing but stale doorbells.
    pub(crate) fn readable(&self) -> io::Result<bool> {
        let r = self.rings()?;
        let ends = r.ends(self.rx());
        let head = self.read_pos.load(Ordering::Relaxed);
        if ends.filled(head)? > 0 {
            return Ok(true);
        }
        match self.drain_bells()? {
            Woke::Closed => Ok(true),
            Woke::Look => Ok(ends.filled(head)? > 0),
        }
    }

    /// Reads every doorbell byte waiting on the socket without blocking; `Closed` when the
    /// peer's close (or a reset) follows them, now or at any earlier drain.
    fn drain_bells(&self) -> io::Result<Woke> {
        if self.closed.load(Ordering::Relaxed) {
            return Ok(Woke::Closed);
        }
        let mut b = [0u8; 64];
        loop {
            // SAFETY: the socket is open while `self` is; `b` is a valid buffer of its length.
            let n = unsafe { libc::recv(self.sock.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
            if n > 0 {
                continue;
            }
            let closed = if n == 0 {
                true
            } else {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(Woke::Look),
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe => true,
                    _ => return Err(e),
                }
            };
            self.closed.store(closed, Ordering::Relaxed);
            return Ok(Woke::Closed);
        }
    }

    /// Sleeps on the socket until a doorbell, the peer's close, `deadline` (an error) or
    /// [`NAP`] (then `Look`: the caller looks at its ring again).
    fn sleep(&self, deadline: Option<Instant>) -> io::Result<Woke> {
        let mut nap = NAP;
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            nap = nap.min(left);
        }
        let ts = libc::timespec { tv_sec: nap.as_secs() as libc::time_t, tv_nsec: nap.subsec_nanos() as libc::c_long };
        let mut p = libc::pollfd { fd: self.sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd and a timespec, both owned by this frame.
        let r = unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(Woke::Look) } else { Err(e) };
        }
        if r == 0 {
            return Ok(Woke::Look);
        }
        self.drain_bells()
    }

    /// Waits until `ready()`: true then; false when the peer closed first. `flag` is this
    /// side's sleep flag for the wait, set to `raise` while it sleeps (1: wake me at the
    /// peer's next move; a reader's flag may instead hold the ring position it waits for,
    /// [`Link::wake_reader`]); `timed`: whether the socket's read timeout bounds it (reads;
    /// writes wait as long as TCP's do).
    fn wait(&self, flag: &AtomicU64, raise: u64, timed: bool, ready: impl Fn() -> io::Result<bool>) -> io::Result<bool> {
        let start = Instant::now();
        let spin = Spin { budget: SPIN, pauses: PAUSES };
        if let Some(r) = crate::spin::poll_for(spin, || match ready() {
            Ok(false) => None,
            r => Some(r),
        }) {
            return r;
        }
        let deadline = if timed { self.sock.read_timeout()?.map(|t| start + t) } else { None };
        loop {
            flag.store(raise, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let now = ready();
            if !matches!(now, Ok(false)) {
                flag.store(0, Ordering::Relaxed);
                return now;
            }
            match self.sleep(deadline) {
                Ok(Woke::Look) => {}
                Ok(Woke::Closed) => {
                    flag.store(0, Ordering::Relaxed);
                    return ready();
                }
                Err(e) => {
                    flag.store(0, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
    }

    /// Wakes the reader sleeping on `flag`, if it sleeps, once the ring's written end `tail`
    /// (just published) has reached what it waits for: the flag holds that position (1 for
    /// any byte: every position after a write is at least 1). A reader waiting for a whole
    /// frame ([`Link::wait_filled`]) then sleeps through the writer's steps until the last.
    /// `Err` only when the peer is gone.
    fn wake_reader(&self, flag: &AtomicU64, tail: u64) -> io::Result<()> {
        fence(Ordering::SeqCst);
        let want = flag.load(Ordering::Relaxed);
        // (positions compared as a wrapping distance)
        if want == 0 || (tail.wrapping_sub(want) as i64) < 0 {
            return Ok(());
        }
        self.wake(flag)
    }

    /// Wakes the peer if it sleeps on `flag`; `Err` only when the peer is gone.
    fn wake(&self, flag: &AtomicU64) -> io::Result<()> {
        fence(Ordering::SeqCst);
        if flag.load(Ordering::Relaxed) == 0 || flag.swap(0, Ordering::AcqRel) == 0 {
            return Ok(());
        }
        let b = [1u8];
        loop {
            // SAFETY: the socket is open while `self` is; `b` is a valid 1-byte buffer.
            let n = unsafe { libc::send(self.sock.as_raw_fd(), b.as_ptr().cast(), 1, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
            if n >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                // bytes already wait there: the peer wakes anyway
                io::ErrorKind::WouldBlock => return Ok(()),
                _ => return Err(e),
            }
        }
    }

    /// Waits, as a read does (the socket's read timeout bounds it), until `n` bytes are in
    /// the ring to read: true then, without reading any; false at once when `n` is more than
    /// the ring holds, or when the peer closed first. The writer's doorbell comes once, when
    /// its last step brings the ring to `n` ([`Link::wake_reader`]).
    pub(crate) fn wait_filled(&self, n: usize) -> io::Result<bool> {
        let r = self.rings()?;
        if n > r.cap {
            return Ok(false);
        }
        let ends = r.ends(self.rx());
        let head = self.read_pos.load(Ordering::Relaxed);
        if ends.filled(head)? >= n {
            return Ok(true);
        }
        // the position the reader waits for (a ring position after this many bytes; never 0)
        let want = head.wrapping_add(n as u64).max(1);
        self.wait(ends.reader_sleeps, want, true, || Ok(ends.filled(head)? >= n))
    }

    fn read_into(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let r = self.rings()?;
        let ends = r.ends(self.rx());
        let head = self.read_pos.load(Ordering::Relaxed);
        let mut filled = ends.filled(head)?;
        if filled == 0 {
            if !self.wait(ends.reader_sleeps, 1, true, || Ok(ends.filled(head)? > 0))? {
                return Ok(0);
            }
            filled = ends.filled(head)?;
        }
        let n = filled.min(buf.len());
        let mut done = 0;
        while done < n {
            let step = (n - done).min(STEP);
            ends.copy_out(head.wrapping_add(done as u64), &mut buf[done..done + step]);
            done += step;
            let at = head.wrapping_add(done as u64);
            self.read_pos.store(at, Ordering::Relaxed);
            ends.head.store(at, Ordering::Release);
            // a writer gone while we read: what it wrote is still ours to read
            let _ = self.wake(ends.writer_sleeps);
        }
        Ok(n)
    }

    fn write_from(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if bufs.iter().all(|b| b.is_empty()) {
            return Ok(0);
        }
        let r = self.rings()?;
        let ends = r.ends(self.tx());
        let tail = self.write_pos.load(Ordering::Relaxed);
        let mut room = ends.room(tail)?;
        if room == 0 {
            if !self.wait(ends.writer_sleeps, 1, false, || Ok(ends.room(tail)? > 0))? {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            room = ends.room(tail)?;
        }
        let mut pos = tail;
        for b in bufs {
            let mut b: &[u8] = b;
            while !b.is_empty() && room > 0 {
                let step = b.len().min(room).min(STEP);
                ends.copy_in(pos, &b[..step]);
                pos = pos.wrapping_add(step as u64);
                room -= step;
                b = &b[step..];
                self.write_pos.store(pos, Ordering::Relaxed);
                ends.tail.store(pos, Ordering::Release);
                self.wake_reader(ends.reader_sleeps, pos)?;
            }
            if room == 0 {
                break;
            }
        }
        Ok(pos.wrapping_sub(tail) as usize)
    }
}

/// Removes a file's name when dropped.
struct RemoveOnDrop<'a>(&'a str);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// Removes the ring files of this user's processes that are gone: a process killed between
/// making its file and its peer's answer cannot remove the name itself, and the file holds
/// its rings' pages in `/dev/shm` until someone does. Only files older than [`ORPHAN_AGE`]
/// go: a name lives only during its connection's handshake, so an older one is left
/// behind whoever made it — even a live process of another pid namespace that shares this
/// `/dev/shm` (a container's `--ipc=host`), whose pids look gone from here. A file whose
/// maker lives here (or whose name does not parse) is left alone; failures are ignored
/// (another node may be sweeping the same files). Called before each connection makes its
/// own file.
fn sweep_orphans() {
    let Ok(dir) = std::fs::read_dir(DIR) else { return };
    let me = std::process::id();
    // SAFETY: geteuid has no preconditions and cannot fail
    let uid = unsafe { libc::geteuid() };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let pid =
            name.to_str().and_then(|n| n.strip_prefix(PREFIX)).and_then(|rest| rest.split('-').next()).and_then(|p| p.parse::<i32>().ok());
        let Some(pid) = pid.filter(|&p| p > 0 && p as u32 != me) else { continue };
        let old = |m: &std::fs::Metadata| m.modified().ok().and_then(|t| t.elapsed().ok()).is_some_and(|age| age > ORPHAN_AGE);
        if !entry.metadata().is_ok_and(|m| m.is_file() && m.uid() == uid && old(&m)) {
            continue;
        }
        // SAFETY: signal 0 sends nothing, it only asks whether the process exists
        let gone = unsafe { libc::kill(pid, 0) } != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// How old a ring file must be before [`sweep_orphans`] may remove it: past any handshake
/// (the transports' handshake and connect timeouts are 10 s by default).
const ORPHAN_AGE: Duration = Duration::from_secs(120);

/// A fresh ring file of `len` bytes under [`DIR`], its pages reserved; and its path.
fn create_file(len: usize) -> Result<(File, String), String> {
    sweep_orphans();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let pid = std::process::id();
    for attempt in 0..16u32 {
        let path = format!("{DIR}/{PREFIX}{pid}-{nanos}-{attempt}");
        match OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path) {
            Ok(file) => {
                // SAFETY: a valid open descriptor; offsets within i64.
                let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
                if r != 0 {
                    let _ = std::fs::remove_file(&path);
                    return Err(format!(
                        "cannot reserve {len} bytes for shared-memory rings in {DIR}: {} (is {DIR} full? \
                         --shm-ring-kib makes each connection's rings smaller)",
                        io::Error::from_raw_os_error(r)
                    ));
                }
                return Ok((file, path));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot make a shared-memory ring file in {DIR}: {e}")),
        }
    }
    Err(format!("cannot make a shared-memory ring file in {DIR}: every name tried exists"))
}

/// A [`Link`] as a byte stream, for the connection's reader and writer.
pub(crate) struct ShmStream(pub(crate) std::sync::Arc<Link>);

impl Read for ShmStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read_into(buf)
    }
}

impl Write for ShmStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_from(&[IoSlice::new(buf)])
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.write_from(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::Arc;

    /// A connected pair of links with rings of `ring` bytes.
    fn pair(ring: usize) -> (ShmStream, ShmStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::scope(|s| {
            let acc = s.spawn(|| {
                let (sock, _) = l.accept().unwrap();
                sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let link = Link::pending(sock.try_clone().unwrap());
                link.accept().unwrap();
                sock.set_read_timeout(None).unwrap();
                link
            });
            let c = Link::connect(TcpStream::connect(addr).unwrap(), ring, Duration::from_secs(5)).unwrap();
            (ShmStream(Arc::new(c)), ShmStream(Arc::new(acc.join().unwrap())))
        })
    }

    fn pattern(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8).collect()
    }

    /// Offers `path` with `nonce` to a fresh accepting link: its verdict.
    fn offer(path: &str, nonce: [u8; 16]) -> Result<(), String> {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let mut hello = HELLO.to_vec();
        hello.extend_from_slice(&nonce);
        hello.push(path.len() as u8);
        hello.extend_from_slice(path.as_bytes());
        sock.write_all(&hello).unwrap();
        let (acc, _) = l.accept().unwrap();
        acc.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let r = Link::pending(acc).accept();
        let mut answer = [0u8; 1];
        sock.read_exact(&mut answer).unwrap();
        assert_eq!(answer[0] == 0, r.is_ok(), "the peer hears the verdict");
        r
    }

    #[test]
    fn bytes_cross_a_small_ring_in_order_through_many_wraps() {
        let (mut c, mut s) = pair(SMALLEST_RING);
        let sent = pattern(1 << 20, 7);
        std::thread::scope(|sc| {
            let w = sc.spawn(|| {
                // writes of awkward sizes, each wrapping or waiting for room
                for chunk in sent.chunks(3001) {
                    c.write_all(chunk).unwrap();
                }
                c
            });
            let mut got = vec![0u8; sent.len()];
            let mut at = 0;
            while at < got.len() {
                let end = (at + 1777).min(got.len());
                let n = s.read(&mut got[at..end]).unwrap();
                assert!(n > 0, "the writer is still there");
                at += n;
            }
            assert!(got == sent, "every byte arrives, in order");
            drop(w.join().unwrap());
        });
    }

    /// A reader waiting for a whole frame sleeps with the position it waits for in its
    /// flag: the writer's steps before it ring no doorbell (the flag stays raised), its last
    /// byte does, and the reader then finds the frame whole, nothing of it read yet.
    #[test]
    fn a_reader_waiting_for_a_whole_frame_is_woken_by_its_last_byte_only() {
        let (mut c, mut s) = pair(1 << 20);
        let n = 600_000;
        let data = pattern(n, 3);
        std::thread::scope(|sc| {
            let link = s.0.clone();
            let reader = sc.spawn(move || link.wait_filled(n).unwrap());
            // the connecting side writes ring 0, which the accepting side reads
            let writer = c.0.clone();
            let flag = writer.rings().unwrap().ends(0).reader_sleeps;
            let t0 = Instant::now();
            while flag.load(Ordering::SeqCst) != n as u64 {
                assert!(t0.elapsed() < Duration::from_secs(10), "the reader never slept waiting for the frame's end");
                std::thread::yield_now();
            }
            c.write_all(&data[..n - 1]).unwrap();
            assert_eq!(flag.load(Ordering::SeqCst), n as u64, "no doorbell before the frame's last byte");
            assert!(!reader.is_finished());
            c.write_all(&data[n - 1..]).unwrap();
            assert!(reader.join().unwrap(), "the frame is whole");
        });
        let mut got = vec![0u8; n];
        s.read_exact(&mut got).unwrap();
        assert!(got == data);
        // more than a ring is never waited for
        assert!(!s.0.wait_filled((1 << 20) + 1).unwrap());
    }

    #[test]
    fn both_directions_carry_at_once() {
        let (mut c, mut s) = pair(64 << 10);
        // each side writes (less than a ring) and then reads, both at the same time
        let (a, b) = (pattern(60_000, 1), pattern(50_000, 2));
        std::thread::scope(|sc| {
            let other = sc.spawn(|| {
                s.write_all(&b).unwrap();
                let mut got = vec![0u8; a.len()];
                s.read_exact(&mut got).unwrap();
                got
            });
            c.write_all(&a).unwrap();
            let mut got = vec![0u8; b.len()];
            c.read_exact(&mut got).unwrap();
            assert!(got == b && other.join().unwrap() == a);
        });
    }

    #[test]
    fn a_close_ends_the_stream_after_what_was_written() {
        let (mut c, mut s) = pair(SMALLEST_RING);
        c.write_all(b"last words").unwrap();
        drop(c);
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"last words", "the bytes, then a clean end");
    }

    #[test]
    fn a_writer_to_a_gone_peer_fails_instead_of_waiting() {
        let (mut c, s) = pair(SMALLEST_RING);
        drop(s);
        let big = vec![0u8; 4 * SMALLEST_RING];
        let e = c.write_all(&big).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn a_read_times_out_under_the_sockets_timeout() {
        let (_c, mut s) = pair(SMALLEST_RING);
        s.0.sock.set_read_timeout(Some(Duration::from_millis(30))).unwrap();
        let t = Instant::now();
        let e = s.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(t.elapsed() >= Duration::from_millis(25) && t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn corrupt_positions_are_an_error_not_a_wild_copy() {
        let (mut c, mut s) = pair(SMALLEST_RING);
        c.write_all(b"x").unwrap();
        // the peer's tail jumps more than a ring ahead
        let link = s.0.clone();
        let tail = || link.rings().unwrap().ends(0).tail;
        tail().store(10 * SMALLEST_RING as u64, Ordering::Release);
        let e = s.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // and one near the end of the u64 range is no overflow either
        tail().store(u64::MAX - 3, Ordering::Release);
        assert_eq!(s.read(&mut [0u8; 8]).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn the_ring_file_is_gone_once_connected() {
        let (c, _s) = pair(SMALLEST_RING);
        assert!(c.0.path.starts_with("/dev/shm/downpour-"), "{}", c.0.path);
        assert!(!std::path::Path::new(&c.0.path).exists(), "{} left behind", c.0.path);
    }

    #[test]
    fn only_the_maker_of_a_ring_file_can_have_it_taken() {
        // a file made as `Link::connect` makes it, whose nonce we know
        let (file, path) = create_file(HEADER_BYTES + 2 * SMALLEST_RING).unwrap();
        let _gone = RemoveOnDrop(&path);
        let map = MmapOptions::new().map_raw(&file).unwrap();
        let rings = Rings { map, cap: SMALLEST_RING };
        rings.word(SIZE_LINE).store(SMALLEST_RING as u64, Ordering::Relaxed);
        rings.word(NONCE_LINES[0]).store(u64::from_le_bytes(*b"12345678"), Ordering::Relaxed);
        rings.word(NONCE_LINES[1]).store(u64::from_le_bytes(*b"abcdefgh"), Ordering::Relaxed);
        rings.word(MAGIC_LINE).store(MAGIC, Ordering::Release);
        // someone who saw the name but not the nonce
        let why = offer(&path, *b"12345678abcdefgX").unwrap_err();
        assert!(why.contains("nonce"), "{why}");
        assert!(std::path::Path::new(&path).exists(), "a refused offer leaves the file alone");
        // the maker's peer: taken, and the name removed
        offer(&path, *b"12345678abcdefgh").unwrap();
        assert!(!std::path::Path::new(&path).exists());
        assert_eq!(rings.word(CLAIM_LINE).load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_second_claim_on_the_same_rings_is_refused() {
        let (file, path) = create_file(HEADER_BYTES + 2 * SMALLEST_RING).unwrap();
        let _gone = RemoveOnDrop(&path);
        let rings = Rings { map: MmapOptions::new().map_raw(&file).unwrap(), cap: SMALLEST_RING };
        rings.word(SIZE_LINE).store(SMALLEST_RING as u64, Ordering::Relaxed);
        rings.word(CLAIM_LINE).store(1, Ordering::Relaxed);
        rings.word(MAGIC_LINE).store(MAGIC, Ordering::Release);
        let why = offer(&path, [0; 16]).unwrap_err();
        assert!(why.contains("another connection"), "{why}");
    }

    #[test]
    fn an_old_ring_file_whose_maker_died_is_swept_and_a_fresh_or_live_makers_is_not() {
        // a pid that no longer exists: a child that has exited and been waited for
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let orphan = format!("{DIR}/{PREFIX}{dead}-1-0");
        let fresh = format!("{DIR}/{PREFIX}{dead}-2-0");
        let mine = format!("{DIR}/{PREFIX}{}-1-0-test", std::process::id());
        let long_ago = std::time::SystemTime::now() - 2 * ORPHAN_AGE;
        for (path, made) in [(&orphan, long_ago), (&fresh, std::time::SystemTime::now()), (&mine, long_ago)] {
            std::fs::write(path, b"rings").unwrap();
            File::options().write(true).open(path).unwrap().set_modified(made).unwrap();
        }
        sweep_orphans();
        let left = |p: &String| std::path::Path::new(p).exists();
        let (orphan_left, fresh_left, mine_left) = (left(&orphan), left(&fresh), left(&mine));
        for p in [&orphan, &fresh, &mine] {
            let _ = std::fs::remove_file(p);
        }
        assert!(!orphan_left, "{orphan} was left behind");
        assert!(fresh_left, "{fresh} was swept during what may be its handshake (another pid namespace's)");
        assert!(mine_left, "{mine} was swept while its maker lives");
    }

    #[test]
    fn offers_of_other_files_are_refused_naming_them() {
        for path in ["/etc/passwd", "/dev/shm/../etc/passwd", "/dev/shm/downpour-nothing-here"] {
            let why = offer(path, [0; 16]).unwrap_err();
            assert!(why.contains(path), "{why}");
        }
    }

    #[test]
    fn a_plain_tcp_peer_is_told_every_node_needs_shm() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        sock.write_all(&[40, 0, 0, 0, 1, 2, 3, 4, 5, 6]).unwrap();
        let (acc, _) = l.accept().unwrap();
        acc.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let why = Link::pending(acc).accept().unwrap_err();
        assert!(why.contains("--transport shm"), "{why}");
    }
}
