//! A worker's metrics endpoint (`worker --metrics-listen ADDR`): what its client counts
//! ([`ClientMetrics`]: its clock, the staleness its pulls were answered with, the time
//! servers held them for a consistency bound) as Prometheus text, served while the session
//! runs.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Upper bounds of the staleness histogram's buckets, in clocks (then +Inf).
pub const STALENESS_BOUNDS: [u64; 8] = [0, 1, 2, 4, 8, 16, 32, 64];

/// What a worker's client counts for its metrics, in relaxed atomics (one add per pull
/// reply, one store per clock): shared with the endpoint's thread.
#[derive(Debug, Default)]
pub struct ClientMetrics {
    clock: AtomicU64,
    /// Pulls answered with staleness in each bucket of [`STALENESS_BOUNDS`] (and above).
    staleness: [AtomicU64; STALENESS_BOUNDS.len() + 1],
    staleness_sum: AtomicU64,
    held_us: AtomicU64,
}

impl ClientMetrics {
    /// Counts a pull answered with staleness `st`.
    #[inline]
    pub(crate) fn staleness(&self, st: u64) {
        let i = STALENESS_BOUNDS.partition_point(|&b| b < st);
        self.staleness[i].fetch_add(1, Ordering::Relaxed);
        self.staleness_sum.fetch_add(st, Ordering::Relaxed);
    }

    /// The worker's clock is now `c`.
    #[inline]
    pub(crate) fn clock(&self, c: u64) {
        self.clock.store(c, Ordering::Relaxed);
    }

    /// Servers held a request `us` microseconds for a consistency bound.
    #[inline]
    pub(crate) fn held(&self, us: u64) {
        self.held_us.fetch_add(us, Ordering::Relaxed);
    }
}

/// The staleness histogram, encoded from the counts at a scrape.
#[derive(Debug)]
struct Staleness(Vec<u64>, u64);

impl EncodeMetric for Staleness {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // (per-bucket counts: the encoder writes them cumulatively)
        let buckets: Vec<(f64, u64)> =
            self.0.iter().enumerate().map(|(i, &n)| (STALENESS_BOUNDS.get(i).map_or(f64::INFINITY, |&b| b as f64), n)).collect();
        encoder.encode_histogram::<NoLabelSet>(self.1 as f64, self.0.iter().sum(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The worker's metrics in Prometheus text format, read now.
pub fn render(rank: usize, node: u32, m: &ClientMetrics) -> String {
    type Labels = Vec<(String, String)>;
    let mut reg = Registry::with_prefix("downpour");
    let worker = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    reg.register("worker", "This worker's rank and node id (value 1)", worker.clone());
    worker.get_or_create(&vec![("rank".into(), rank.to_string()), ("node".into(), node.to_string())]).set(1.0);
    let clock = Gauge::<f64, AtomicU64>::default();
    reg.register("worker_clock", "The worker's clock (iterations completed)", clock.clone());
    clock.set(m.clock.load(Ordering::Relaxed) as f64);
    let held = Counter::<f64, AtomicU64>::default();
    reg.register("worker_held_seconds", "Time servers held this worker's requests for a consistency bound", held.clone());
    held.inc_by(m.held_us.load(Ordering::Relaxed) as f64 / 1e6);
    let counts: Vec<u64> = m.staleness.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    reg.register(
        "worker_pull_staleness",
        "Staleness (clocks) the worker's pulls were answered with, on tables that track clocks",
        Staleness(counts, m.staleness_sum.load(Ordering::Relaxed)),
    );
    let mut out = String::new();
    if let Err(e) = encode(&mut out, &reg) {
        tracing::warn!("metrics: cannot encode: {e}");
    }
    out
}

/// Serves `GET /metrics` ([`render`]) and `GET /healthz` on `listen` until `stop` is set;
/// returns the bound address.
pub fn serve_worker_metrics(listen: &str, rank: usize, node: u32, m: Arc<ClientMetrics>, stop: Arc<AtomicBool>) -> std::io::Result<String> {
    let stopped = stop.clone();
    downpour_transport::http::serve_http(
        listen,
        "worker-metrics",
        move |path| match path {
            "/metrics" => Some(("200 OK", downpour_transport::http::PROMETHEUS_TEXT, render(rank, node, &m))),
            "/healthz" => Some(("200 OK", "text/plain", "ok\n".into())),
            _ => None,
        },
        move || stopped.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_staleness_histogram_counts_each_pull_in_its_bucket_cumulatively() {
        let m = ClientMetrics::default();
        for st in [0, 0, 3, 100] {
            m.staleness(st);
        }
        m.clock(7);
        m.held(1_500_000);
        let text = render(2, 9, &m);
        for line in [
            "downpour_worker{rank=\"2\",node=\"9\"} 1",
            "downpour_worker_clock 7",
            "downpour_worker_held_seconds_total 1.5",
            "downpour_worker_pull_staleness_bucket{le=\"0.0\"} 2",
            "downpour_worker_pull_staleness_bucket{le=\"4.0\"} 3",
            "downpour_worker_pull_staleness_bucket{le=\"64.0\"} 3",
            "downpour_worker_pull_staleness_bucket{le=\"+Inf\"} 4",
            "downpour_worker_pull_staleness_sum 103",
            "downpour_worker_pull_staleness_count 4",
        ] {
            assert!(text.lines().any(|l| l.starts_with(line)), "{line} not in\n{text}");
        }
    }
}
