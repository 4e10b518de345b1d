//! A fault-injecting wrapper around any [`Transport`], for tests and demos (issue 6): frames
//! a node sends are dropped, duplicated, held back and sent after the next one (reordered)
//! or delayed, each with a seeded probability, and pairs of nodes can be partitioned and
//! healed at run time. Every connection draws from its own seeded stream, so a run with the
//! same seed and the same sequence of sends injects the same faults.
//!
//! Faults act on the sending side of connections this node opens or accepts. A partition
//! between this node and an address refuses new connections to it and fails sends and
//! receives on the connections this node opened to it; the far side sees silence.

use crate::{Connection, Listener, Result, TrafficStats, Transport, TransportError};
use downpour_core::init::splitmix64;
use downpour_core::proto::FrameHeader;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What to inject, per frame sent.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultConfig {
    /// Seed of the per-connection random streams.
    pub seed: u64,
    /// Probability that a frame is silently not sent.
    pub drop: f64,
    /// Probability that a frame is sent twice.
    pub duplicate: f64,
    /// Probability that a frame is held back and sent right after the next one.
    pub reorder: f64,
    /// A delay drawn uniformly from `[min, max]` before every send.
    pub delay: Option<(Duration, Duration)>,
}

/// Partitions between nodes (by name or address), shared by the wrappers of all nodes of a
/// test. Symmetric: cutting `(a, b)` also cuts `(b, a)`.
#[derive(Clone, Debug, Default)]
pub struct Partitions(Arc<Mutex<HashSet<(String, String)>>>);

impl Partitions {
    /// No partition.
    pub fn new() -> Partitions {
        Partitions::default()
    }

    /// Cuts `a` from `b`.
    pub fn cut(&self, a: &str, b: &str) {
        let mut s = self.0.lock();
        s.insert((a.to_string(), b.to_string()));
        s.insert((b.to_string(), a.to_string()));
    }

    /// Heals the cut between `a` and `b`.
    pub fn heal(&self, a: &str, b: &str) {
        let mut s = self.0.lock();
        s.remove(&(a.to_string(), b.to_string()));
        s.remove(&(b.to_string(), a.to_string()));
    }

    /// True while `a` and `b` are cut off from each other.
    pub fn is_cut(&self, a: &str, b: &str) -> bool {
        self.0.lock().contains(&(a.to_string(), b.to_string()))
    }
}

/// A transport that injects faults into another one.
pub struct FaultyTransport(Arc<Shared>);

struct Shared {
    inner: Arc<dyn Transport>,
    /// This node's name in [`Partitions`].
    local: String,
    cfg: FaultConfig,
    partitions: Partitions,
    /// Connections made so far: each gets its own random stream.
    connections: AtomicU64,
}

impl FaultyTransport {
    /// Wraps `inner` for the node called `local`. Probabilities outside `[0, 1]` are clamped.
    pub fn new(inner: Arc<dyn Transport>, local: &str, cfg: FaultConfig, partitions: Partitions) -> FaultyTransport {
        let clamp = |p: f64| if p.is_finite() { p.clamp(0.0, 1.0) } else { 0.0 };
        let cfg = FaultConfig { drop: clamp(cfg.drop), duplicate: clamp(cfg.duplicate), reorder: clamp(cfg.reorder), ..cfg };
        FaultyTransport(Arc::new(Shared { inner, local: local.to_string(), cfg, partitions, connections: AtomicU64::new(0) }))
    }
}

impl Shared {
    fn wrap(&self, inner: Box<dyn Connection>, remote: Option<String>) -> Box<dyn Connection> {
        let n = self.connections.fetch_add(1, Ordering::Relaxed);
        let rng = splitmix64(self.cfg.seed ^ splitmix64(n.wrapping_add(1)));
        Box::new(FaultyConnection {
            inner,
            local: self.local.clone(),
            remote,
            cfg: self.cfg,
            partitions: self.partitions.clone(),
            rng,
            held: None,
        })
    }
}

impl Transport for FaultyTransport {
    fn name(&self) -> &'static str {
        self.0.inner.name()
    }

    fn connect(&self, addr: &str, timeout: Duration) -> Result<Box<dyn Connection>> {
        if self.0.partitions.is_cut(&self.0.local, addr) {
            return Err(TransportError::Connect { addr: addr.to_string(), reason: format!("partitioned from {}", self.0.local) });
        }
        let c = self.0.inner.connect(addr, timeout)?;
        Ok(self.0.wrap(c, Some(addr.to_string())))
    }

    fn listen(&self, addr: &str) -> Result<Box<dyn Listener>> {
        let l = self.0.inner.listen(addr)?;
        Ok(Box::new(FaultyListener { inner: l, owner: self.0.clone() }))
    }
}

struct FaultyListener {
    inner: Box<dyn Listener>,
    owner: Arc<Shared>,
}

impl Listener for FaultyListener {
    fn local_addr(&self) -> String {
        self.inner.local_addr()
    }

    fn accept(&mut self, timeout: Duration) -> Result<Option<Box<dyn Connection>>> {
        Ok(self.inner.accept(timeout)?.map(|c| self.owner.wrap(c, None)))
    }
}

/// A frame held back for reordering.
struct Held {
    header: FrameHeader,
    keys: Vec<u8>,
    values: Vec<u8>,
}

struct FaultyConnection {
    inner: Box<dyn Connection>,
    local: String,
    /// The address this node connected to (`None` for accepted connections).
    remote: Option<String>,
    cfg: FaultConfig,
    partitions: Partitions,
    rng: u64,
    held: Option<Held>,
}

impl FaultyConnection {
    fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        self.rng = splitmix64(self.rng);
        ((self.rng >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn check_cut(&self) -> Result<()> {
        match &self.remote {
            Some(r) if self.partitions.is_cut(&self.local, r) => Err(TransportError::Closed { peer: r.clone() }),
            _ => Ok(()),
        }
    }
}

impl Connection for FaultyConnection {
    fn send(&mut self, header: &mut FrameHeader, keys: &[u8], values: &[u8]) -> Result<()> {
        self.check_cut()?;
        if let Some((lo, hi)) = self.cfg.delay {
            self.rng = splitmix64(self.rng);
            let span = hi.saturating_sub(lo).as_nanos() as u64;
            let extra = if span == 0 { 0 } else { self.rng % (span + 1) };
            std::thread::sleep(lo + Duration::from_nanos(extra));
        }
        if self.chance(self.cfg.drop) {
            return Ok(());
        }
        if self.held.is_none() && self.chance(self.cfg.reorder) {
            self.held = Some(Held { header: header.clone(), keys: keys.to_vec(), values: values.to_vec() });
            return Ok(());
        }
        let copies = if self.chance(self.cfg.duplicate) { 2 } else { 1 };
        for _ in 0..copies {
            let mut h = header.clone();
            self.inner.send(&mut h, keys, values)?;
        }
        if let Some(mut held) = self.held.take() {
            self.inner.send(&mut held.header, &held.keys, &held.values)?;
        }
        Ok(())
    }

    fn recv_header(&mut self) -> Result<Option<FrameHeader>> {
        self.check_cut()?;
        self.inner.recv_header()
    }

    fn recv_payload(&mut self, keys: &mut [u8], values: &mut [u8]) -> Result<()> {
        self.check_cut()?;
        self.inner.recv_payload(keys, values)
    }

    fn payload_here(&mut self) -> Result<bool> {
        self.check_cut()?;
        self.inner.payload_here()
    }

    fn recv_values_piece(&mut self, values: &mut [u8]) -> Result<()> {
        // (no cut between two pieces: a frame whose payload is here is applied whole, as
        // over the real rings once `payload_here` said so)
        self.inner.recv_values_piece(values)
    }

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.inner.set_recv_timeout(timeout)
    }

    fn readable(&mut self) -> Result<bool> {
        // a cut link fails the next read at once
        Ok(self.check_cut().is_err() || self.inner.readable()?)
    }

    fn peer(&self) -> &str {
        self.inner.peer()
    }

    fn stats(&self) -> TrafficStats {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inproc::InProcTransport;
    use std::time::Instant;

    /// A server-side listener and a client connection to it, through fault wrappers.
    fn pair(cfg: FaultConfig, parts: &Partitions) -> (Box<dyn Connection>, Box<dyn Connection>) {
        let base: Arc<dyn Transport> = Arc::new(InProcTransport::new());
        let server = FaultyTransport::new(base.clone(), "server", FaultConfig::default(), parts.clone());
        let client = FaultyTransport::new(base, "client", cfg, parts.clone());
        let mut l = server.listen("inproc://0").unwrap();
        let addr = l.local_addr();
        let c = client.connect(&addr, Duration::from_secs(1)).unwrap();
        let s = l.accept(Duration::from_secs(1)).unwrap().unwrap();
        (c, s)
    }

    fn frame(id: u64) -> FrameHeader {
        FrameHeader { request_id: id, ..Default::default() }
    }

    /// Request ids the server receives within `wait`.
    fn received(s: &mut Box<dyn Connection>, wait: Duration) -> Vec<u64> {
        s.set_recv_timeout(Some(wait)).unwrap();
        let mut out = Vec::new();
        while let Ok(Some(h)) = s.recv_header() {
            s.recv_payload(&mut [], &mut []).unwrap();
            out.push(h.request_id);
        }
        out
    }

    fn send_all(c: &mut Box<dyn Connection>, n: u64) {
        for i in 0..n {
            c.send(&mut frame(i), &[], &[]).unwrap();
        }
    }

    #[test]
    fn drop_duplicate_and_reorder_act_on_the_frames_sent() {
        let parts = Partitions::new();
        let (mut c, mut s) = pair(FaultConfig { drop: 1.0, ..Default::default() }, &parts);
        send_all(&mut c, 5);
        assert!(received(&mut s, Duration::from_millis(50)).is_empty(), "every frame dropped");
        let (mut c, mut s) = pair(FaultConfig { duplicate: 1.0, ..Default::default() }, &parts);
        send_all(&mut c, 3);
        assert_eq!(received(&mut s, Duration::from_millis(50)), vec![0, 0, 1, 1, 2, 2]);
        let (mut c, mut s) = pair(FaultConfig { reorder: 1.0, ..Default::default() }, &parts);
        send_all(&mut c, 4);
        assert_eq!(received(&mut s, Duration::from_millis(50)), vec![1, 0, 3, 2]);
    }

    #[test]
    fn the_same_seed_drops_the_same_frames() {
        let parts = Partitions::new();
        let run = |seed| {
            let (mut c, mut s) = pair(FaultConfig { seed, drop: 0.5, ..Default::default() }, &parts);
            send_all(&mut c, 64);
            received(&mut s, Duration::from_millis(50))
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert_ne!(a, run(8));
        assert!(a.len() > 10 && a.len() < 54, "about half of 64 kept: {}", a.len());
    }

    #[test]
    fn a_partition_refuses_connections_and_fails_open_ones_until_healed() {
        let parts = Partitions::new();
        let base: Arc<dyn Transport> = Arc::new(InProcTransport::new());
        let server = FaultyTransport::new(base.clone(), "server", FaultConfig::default(), parts.clone());
        let client = FaultyTransport::new(base, "client", FaultConfig::default(), parts.clone());
        let mut l = server.listen("inproc://0").unwrap();
        let addr = l.local_addr();
        let mut c = client.connect(&addr, Duration::from_secs(1)).unwrap();
        let _s = l.accept(Duration::from_secs(1)).unwrap().unwrap();
        parts.cut("client", &addr);
        assert!(parts.is_cut(&addr, "client"), "cuts are symmetric");
        assert!(c.send(&mut frame(1), &[], &[]).is_err());
        assert!(c.recv_header().is_err());
        assert!(client.connect(&addr, Duration::from_secs(1)).is_err());
        parts.heal("client", &addr);
        assert!(c.send(&mut frame(2), &[], &[]).is_ok());
        assert!(client.connect(&addr, Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn delays_hold_every_send_for_at_least_the_minimum() {
        let parts = Partitions::new();
        let d = Duration::from_millis(5);
        let (mut c, mut s) = pair(FaultConfig { delay: Some((d, d * 2)), ..Default::default() }, &parts);
        let t = Instant::now();
        send_all(&mut c, 4);
        assert!(t.elapsed() >= d * 4);
        assert_eq!(received(&mut s, Duration::from_millis(50)), vec![0, 1, 2, 3]);
    }
}
