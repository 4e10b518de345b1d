//! The metrics endpoint ([`serve_metrics`]): Prometheus text on `GET /metrics` and a health
//! probe on `GET /healthz`, over plain HTTP/1.1 on a listener of its own (`--metrics-listen`).
//!
//! A scrape reads the server's state as it is ([`render`]): per table the rows, bytes,
//! keyed requests and keys served, admissions and evictions, filter traffic and `bsp`
//! rounds; per server the routing epoch, the tables' bytes now and at their peak, and the
//! process's peak RSS. Nothing is kept for the scraper between scrapes, and the request path
//! pays only the relaxed counter adds it makes anyway (`state::Traffic`), so a scraper costs
//! the server one read of each table's counts per scrape.

use crate::state::ServerState;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

type Labels = Vec<(String, String)>;

/// The kinds of request timed: index into `ServerState::latency`.
pub(crate) const OP_KINDS: [&str; 5] = ["push", "pull", "peek", "push_pull", "pull_range"];

/// The kind of a timed op (`None` for the control ops).
pub(crate) fn op_kind(op: downpour_core::msg::Op) -> Option<usize> {
    use downpour_core::msg::Op;
    match op {
        Op::Push | Op::PushRange => Some(0),
        Op::Pull => Some(1),
        Op::Peek => Some(2),
        Op::PushPull | Op::PushPullRange => Some(3),
        Op::PullRange => Some(4),
        _ => None,
    }
}

/// Upper bounds of the latency buckets, seconds (10 µs to 1 s, then +Inf).
const BOUNDS: [f64; 16] = [1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0];

/// A latency histogram kept with relaxed atomic adds (no lock on the request path; a scrape
/// may see one request's count and sum a moment apart).
#[derive(Default)]
pub(crate) struct Latency {
    /// Per bucket (the last is +Inf), not cumulative.
    counts: [AtomicU64; BOUNDS.len() + 1],
    sum_ns: AtomicU64,
}

impl Latency {
    pub(crate) fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BOUNDS.iter().position(|&b| s <= b).unwrap_or(BOUNDS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// One op's histogram as read: labels, sum (s), count, (upper bound, count) per bucket.
type HistogramRead = (Labels, f64, u64, Vec<(f64, u64)>);

/// The latency histograms, one per kind of op, read at a scrape.
#[derive(Debug)]
struct Latencies(Vec<HistogramRead>);

impl Latencies {
    fn read(all: &[Latency]) -> Latencies {
        Latencies(
            all.iter()
                .zip(OP_KINDS)
                .map(|(l, op)| {
                    let counts: Vec<u64> = l.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
                    let buckets = BOUNDS.iter().copied().chain([f64::INFINITY]).zip(counts.iter().copied()).collect();
                    (labels(&[("op", op)]), l.sum_ns.load(Ordering::Relaxed) as f64 * 1e-9, counts.iter().sum(), buckets)
                })
                .collect(),
        )
    }
}

impl EncodeMetric for Latencies {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (l, sum, count, buckets) in &self.0 {
            let mut e = encoder.encode_family(l)?;
            e.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None::<&std::collections::HashMap<usize, Exemplar<NoLabelSet, f64>>>)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}
type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;
type Counters = Family<Labels, Counter>;

/// Binds `listen` and answers scrapes on a thread of its own until the server stops;
/// returns the bound address. Fails with the address in the message when it cannot bind.
/// `GET /metrics` is [`render`]; `GET /healthz` is `ok` while the server serves.
pub fn serve_metrics(listen: &str, st: Arc<ServerState>) -> std::io::Result<String> {
    let (st2, st3) = (st.clone(), st);
    downpour_transport::http::serve_http(
        listen,
        "server-metrics",
        move |path| match path {
            "/metrics" => Some(("200 OK", downpour_transport::http::PROMETHEUS_TEXT, render(&st2))),
            "/healthz" if !st2.stop.load(Ordering::Relaxed) => Some(("200 OK", "text/plain", "ok\n".into())),
            "/healthz" => Some(("503 Service Unavailable", "text/plain", "stopping\n".into())),
            _ => None,
        },
        move || st3.stop.load(Ordering::Relaxed),
    )
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The server's metrics in Prometheus text format, read now.
pub fn render(st: &ServerState) -> String {
    let mut reg = Registry::with_prefix("downpour");
    let gauge = |reg: &mut Registry, name: &str, help: &str| {
        let g = Gauges::default();
        reg.register(name, help, g.clone());
        g
    };
    let counter = |reg: &mut Registry, name: &str, help: &str| {
        let c = Counters::default();
        reg.register(name, help, c.clone());
        c
    };
    let server = gauge(&mut reg, "server", "This server's node id and rank (value 1)");
    let epoch = gauge(&mut reg, "routing_epoch", "The routing epoch this server serves");
    let used = gauge(&mut reg, "tables_bytes", "Bytes the tables' arrays hold now (capacity)");
    let peak = gauge(&mut reg, "tables_peak_bytes", "The most bytes the tables' arrays held");
    let rss = gauge(&mut reg, "process_peak_rss_bytes", "The process's peak resident memory (VmHWM)");
    let rows = gauge(&mut reg, "table_rows", "Rows (keys) a table holds on this server");
    let bytes = gauge(&mut reg, "table_bytes", "Bytes a table's arrays hold on this server (capacity, and an admission sketch)");
    let requests = counter(&mut reg, "table_requests", "Keyed requests served, by op (push, pull, peek; a push-pull is both)");
    let keys = counter(&mut reg, "table_keys", "Keys served, by op");
    let admitted = counter(&mut reg, "table_admitted_keys", "Keys admitted (given a row) under feature admission");
    let refused = counter(&mut reg, "table_admission_refused_pushes", "Pushes of keys without a row dropped by admission");
    let evicted = counter(&mut reg, "table_evicted_rows", "Rows dropped by the table's eviction policy");
    let passes = counter(&mut reg, "table_eviction_passes", "Eviction passes made");
    let filtered = counter(&mut reg, "table_filter_bytes", "Bytes through each filter, decoded and on the wire");
    let rounds = counter(&mut reg, "table_rounds_applied", "Synchronous (bsp) rounds applied");
    let from_ring = counter(
        &mut reg,
        "table_push_frames_from_ring",
        "Range push frames applied straight from a shared-memory ring, in pieces (--transport shm)",
    );
    let at_noted = counter(
        &mut reg,
        "table_push_keys_at_noted_rows",
        "Keys of pushes updated at the rows the connection's pull of the same keys found, without a second lookup",
    );
    reg.register(
        "request_seconds",
        "Time to handle a request frame, by op (a large request is several frames; includes waits for consistency)",
        Latencies::read(&st.latency),
    );

    let node = st.node_id.load(Ordering::Relaxed).to_string();
    let rank = st.rank.load(Ordering::Relaxed).to_string();
    server.get_or_create(&labels(&[("node", &node), ("rank", &rank)])).set(1.0);
    epoch.get_or_create(&vec![]).set(st.epoch.load(Ordering::Relaxed) as f64);
    used.get_or_create(&vec![]).set(st.used_bytes.load(Ordering::Relaxed) as f64);
    peak.get_or_create(&vec![]).set(st.peak_used_bytes.load(Ordering::Relaxed) as f64);
    if let Some(b) = crate::node::peak_rss_bytes() {
        rss.get_or_create(&vec![]).set(b as f64);
    }
    let tables: Vec<_> = st.tables.read().iter().map(|(id, s)| (*id, s.clone())).collect();
    for (id, slot) in tables {
        let id = id.to_string();
        let t = labels(&[("table", &id), ("name", &slot.spec.name)]);
        let with = |k: &str, v: &str| {
            let mut l = t.clone();
            l.push((k.into(), v.into()));
            l
        };
        {
            let table = slot.table.read();
            rows.get_or_create(&t).set(table.len() as f64);
            bytes.get_or_create(&t).set(table.bytes() as f64);
            if let Some(a) = table.admission() {
                admitted.get_or_create(&t).inc_by(a.admitted);
                refused.get_or_create(&t).inc_by(a.refused);
            }
            if let Some(e) = table.eviction() {
                evicted.get_or_create(&t).inc_by(e.evicted);
                passes.get_or_create(&t).inc_by(e.passes);
            }
        }
        from_ring.get_or_create(&t).inc_by(slot.traffic.ring_pushes.load(Ordering::Relaxed));
        at_noted.get_or_create(&t).inc_by(slot.traffic.keys_at_noted_rows.load(Ordering::Relaxed));
        for (i, op) in ["push", "pull", "peek"].iter().enumerate() {
            requests.get_or_create(&with("op", op)).inc_by(slot.traffic.requests[i].load(Ordering::Relaxed));
            keys.get_or_create(&with("op", op)).inc_by(slot.traffic.keys[i].load(Ordering::Relaxed));
        }
        for (dir, f) in slot.filter_stats.report() {
            let mut l = with("direction", dir);
            l.push(("filter".into(), f.name.into()));
            let mut wire = l.clone();
            l.push(("side".into(), "decoded".into()));
            wire.push(("side".into(), "wire".into()));
            filtered.get_or_create(&l).inc_by(f.bytes_in);
            filtered.get_or_create(&wire).inc_by(f.bytes_out);
        }
        if let Some(g) = &slot.gate {
            if let Some(r) = g.gate.lock().rounds() {
                rounds.get_or_create(&t).inc_by(r.applied());
            }
        }
    }
    let mut out = String::new();
    // (writing into a String cannot fail)
    let _ = encode(&mut out, &reg);
    out
}
