//! In-process transport: frames travel over channels between threads of one process.
//! Addresses look like `inproc://N`; `listen("inproc://0")` (or any `…:0`) picks a new one.

use crate::spin::Spin;
use crate::{Connection, Listener, Result, TrafficStats, Transport, TransportError};
use downpour_core::proto::FrameHeader;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

type Frame = (FrameHeader, Vec<u8>, Vec<u8>);

/// How long a receive polls before it sleeps ([`InProcConnection::poll_briefly`]). 150 µs
/// rather than the 30 it was: `train linear` embedded on 2 vCPUs (a worker and a server
/// thread that hand each minibatch to each other) still slept in a fifth of its waits at
/// 30 µs, and ran 1.035× as fast at 150 with the new build first in each pair, 1.06–1.08×
/// with it second (500 measured no better; docs/benchmarks.md).
const SPIN: Duration = Duration::from_micros(150);
/// Polls with the pause hint before each later poll yields the core: a thread that waits for
/// another on the same core (more threads than cores) lets it run (`train linear` with 1
/// server and 2 workers embedded on 2 vCPUs: 1.36× as fast with this and the 150 µs budget as
/// with 30 µs that never yielded; the two changed together).
const PAUSES: u32 = 64;

enum Tx {
    Bounded(SyncSender<Frame>),
    Unbounded(Sender<Frame>),
}

/// The "network" of one process: a name → listener registry. Clone it to share.
#[derive(Clone, Default)]
pub struct InProcTransport {
    listeners: Arc<Mutex<HashMap<String, Sender<InProcConnection>>>>,
    next: Arc<AtomicU64>,
}

impl InProcTransport {
    /// A new, empty in-process network.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Transport for InProcTransport {
    fn name(&self) -> &'static str {
        "inproc"
    }

    fn connect(&self, addr: &str, _timeout: Duration) -> Result<Box<dyn Connection>> {
        let accept = self.listeners.lock().get(addr).cloned();
        let accept =
            accept.ok_or_else(|| TransportError::Connect { addr: addr.into(), reason: "no in-process listener at this address".into() })?;
        // Requests are bounded (back-pressure on a fast sender); replies are not, so a
        // server never blocks on a client that is busy sending.
        let (req_tx, req_rx) = mpsc::sync_channel(64);
        let (rep_tx, rep_rx) = mpsc::channel();
        let server_end = InProcConnection::new(Tx::Unbounded(rep_tx), req_rx, format!("{addr}/client"));
        accept.send(server_end).map_err(|_| TransportError::Connect { addr: addr.into(), reason: "the listener has shut down".into() })?;
        Ok(Box::new(InProcConnection::new(Tx::Bounded(req_tx), rep_rx, addr.to_string())))
    }

    fn listen(&self, addr: &str) -> Result<Box<dyn Listener>> {
        let name = if addr.ends_with(":0") || addr == "inproc://0" || addr.is_empty() {
            format!("inproc://{}", self.next.fetch_add(1, Ordering::Relaxed) + 1)
        } else {
            addr.to_string()
        };
        let mut map = self.listeners.lock();
        if map.contains_key(&name) {
            return Err(TransportError::Bind { addr: name, reason: "the address is already in use".into() });
        }
        let (tx, rx) = mpsc::channel();
        map.insert(name.clone(), tx);
        Ok(Box::new(InProcListener { name, rx, registry: self.listeners.clone() }))
    }
}

struct InProcListener {
    name: String,
    rx: Receiver<InProcConnection>,
    registry: Arc<Mutex<HashMap<String, Sender<InProcConnection>>>>,
}

impl Drop for InProcListener {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.name);
    }
}

impl Listener for InProcListener {
    fn local_addr(&self) -> String {
        self.name.clone()
    }
    fn accept(&mut self, timeout: Duration) -> Result<Option<Box<dyn Connection>>> {
        match self.rx.recv_timeout(timeout) {
            Ok(c) => Ok(Some(Box::new(c))),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(TransportError::Closed { peer: self.name.clone() }),
        }
    }
}

/// One end of an in-process connection.
pub struct InProcConnection {
    tx: Tx,
    rx: Receiver<Frame>,
    peer: String,
    current: Option<(Vec<u8>, Vec<u8>)>,
    /// A frame taken off the channel by [`Connection::readable`], returned next.
    peeked: Option<Frame>,
    /// [`Connection::readable`] saw the other end gone.
    closed: bool,
    timeout: Option<Duration>,
    stats: TrafficStats,
}

impl InProcConnection {
    fn new(tx: Tx, rx: Receiver<Frame>, peer: String) -> Self {
        InProcConnection { tx, rx, peer, current: None, peeked: None, closed: false, timeout: None, stats: Default::default() }
    }

    /// The next frame if one comes within `budget` (at most [`SPIN`]), polled without
    /// sleeping (`Err(TryRecvError::Empty)` if none came): a thread that sleeps leaves its
    /// core idle, and waking it takes a virtual machine tens of microseconds (its vCPU
    /// halted), longer than the next message of a pipeline usually takes to come.
    fn poll_briefly(&self, budget: Duration) -> std::result::Result<Frame, TryRecvError> {
        let spin = Spin { budget: budget.min(SPIN), pauses: PAUSES };
        crate::spin::poll_for(spin, || match self.rx.try_recv() {
            Err(TryRecvError::Empty) => None,
            got => Some(got),
        })
        .unwrap_or(Err(TryRecvError::Empty))
    }
}

impl Connection for InProcConnection {
    fn send(&mut self, header: &mut FrameHeader, keys: &[u8], values: &[u8]) -> Result<()> {
        header.keys_len = keys.len() as u64;
        header.values_len = values.len() as u64;
        let f = (header.clone(), keys.to_vec(), values.to_vec());
        let ok = match &self.tx {
            Tx::Bounded(t) => t.send(f).is_ok(),
            Tx::Unbounded(t) => t.send(f).is_ok(),
        };
        if !ok {
            return Err(TransportError::Closed { peer: self.peer.clone() });
        }
        self.stats.bytes_sent += (keys.len() + values.len()) as u64;
        self.stats.frames_sent += 1;
        Ok(())
    }

    fn recv_header(&mut self) -> Result<Option<FrameHeader>> {
        let f = if let Some(f) = self.peeked.take() {
            Some(f)
        } else if self.closed {
            None
        } else {
            // (a receive timeout counts the polling in: the wait after it gets what is left)
            let started = std::time::Instant::now();
            match self.poll_briefly(self.timeout.unwrap_or(SPIN)) {
                Ok(f) => Some(f),
                Err(TryRecvError::Disconnected) => None,
                Err(TryRecvError::Empty) => match self.timeout {
                    None => self.rx.recv().ok(),
                    Some(t) => match self.rx.recv_timeout(t.saturating_sub(started.elapsed())) {
                        Ok(f) => Some(f),
                        Err(RecvTimeoutError::Timeout) => return Err(TransportError::Timeout { peer: self.peer.clone(), after: t }),
                        Err(RecvTimeoutError::Disconnected) => None,
                    },
                },
            }
        };
        let Some((h, k, v)) = f else { return Ok(None) };
        self.stats.bytes_received += (k.len() + v.len()) as u64;
        self.stats.frames_received += 1;
        self.current = Some((k, v));
        Ok(Some(h))
    }

    fn recv_payload(&mut self, keys: &mut [u8], values: &mut [u8]) -> Result<()> {
        let (k, v) = self.current.take().unwrap_or_default();
        crate::fill_payload(&self.peer, &k, &v, keys, values)
    }

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.timeout = timeout;
        Ok(())
    }

    fn readable(&mut self) -> Result<bool> {
        if self.peeked.is_some() || self.closed {
            return Ok(true);
        }
        match self.rx.try_recv() {
            Ok(f) => self.peeked = Some(f),
            Err(mpsc::TryRecvError::Empty) => return Ok(false),
            Err(mpsc::TryRecvError::Disconnected) => self.closed = true,
        }
        Ok(true)
    }

    fn peer(&self) -> &str {
        &self.peer
    }

    fn stats(&self) -> TrafficStats {
        self.stats
    }
}
