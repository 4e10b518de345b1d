//! The coordinator's metrics endpoint (`coordinator --metrics-listen ADDR`): the job's
//! membership, routing epoch, checkpoints and barriers read from the engine at each scrape,
//! and the routing epochs served since the coordinator started (recoveries from failures and
//! reconfigurations, with the time each took from detection to serving).

use crate::engine::Recovery;
use crate::service::Coordinator;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

type Labels = Vec<(String, String)>;
type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;
type Counters = Family<Labels, Counter<f64, AtomicU64>>;

/// Routing epochs served since the coordinator started.
#[derive(Clone, Debug, Default)]
pub struct EpochStats {
    /// Epochs served after a failure: (count, seconds from detection to serving in all,
    /// the last one's seconds, rows copied in all).
    pub recoveries: (u64, f64, f64, u64),
    /// Epochs served after a join or a drain: the same.
    pub reconfigurations: (u64, f64, f64, u64),
}

impl EpochStats {
    /// Counts an epoch served.
    pub fn served(&mut self, r: &Recovery) {
        let s = if r.failure { &mut self.recoveries } else { &mut self.reconfigurations };
        let took = r.took.as_secs_f64();
        s.0 += 1;
        s.1 += took;
        s.2 = took;
        s.3 += r.keys_copied;
    }
}

fn l(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The coordinator's metrics in Prometheus text format, read now.
pub fn render(c: &Coordinator) -> String {
    let mut reg = Registry::with_prefix("downpour");
    let gauge = |reg: &mut Registry, name: &str, help: &str| {
        let g = Gauges::default();
        reg.register(name, help, g.clone());
        g
    };
    let counter = |reg: &mut Registry, name: &str, help: &str| {
        let g = Counters::default();
        reg.register(name, help, g.clone());
        g
    };
    let epoch = gauge(&mut reg, "routing_epoch", "The newest routing epoch (1 until a server fails, joins or drains)");
    let serving = gauge(&mut reg, "routing_active", "1 while the newest routing epoch is served (0 while new replicas are built)");
    let servers =
        gauge(&mut reg, "coordinator_servers", "Servers by state: registered, live (on the routing), removed (failed or drained)");
    let workers =
        gauge(&mut reg, "coordinator_workers", "Workers by state: registered, done, vacant (lost, waiting for a replacement), lost");
    let held = gauge(&mut reg, "coordinator_held_calls", "Calls parked waiting for other nodes (barriers, checkpoints, the scheduler)");
    let ckpts = counter(&mut reg, "checkpoints", "Checkpoints written in this job");
    let passes = counter(&mut reg, "barrier_passes", "Passes of each barrier");
    let epochs =
        counter(&mut reg, "routing_epochs_served", "Routing epochs served since this coordinator started, by cause (failure, change)");
    let took = counter(
        &mut reg,
        "routing_epoch_seconds",
        "Seconds from a failure's detection (or a join's or drain's request) to the new epoch being served, in all",
    );
    let last = gauge(&mut reg, "routing_epoch_last_seconds", "The last such time, by cause");
    let copied = counter(&mut reg, "routing_epoch_rows_copied", "Rows copied to build new replicas, by cause");
    let ended = gauge(&mut reg, "job_ended", "1 once the job ended (shut down or failed)");
    {
        let st = c.state.lock();
        epoch.get_or_create(&vec![]).set(st.epochs.epoch() as f64);
        serving.get_or_create(&vec![]).set(if st.epochs.active() { 1.0 } else { 0.0 });
        let live = st.routing().servers.len();
        servers.get_or_create(&l(&[("state", "registered")])).set(st.servers.len() as f64);
        servers.get_or_create(&l(&[("state", "live")])).set(live as f64);
        servers
            .get_or_create(&l(&[("state", "removed")]))
            .set(st.removed.iter().filter(|id| st.servers.iter().any(|s| s.0 == **id)).count() as f64);
        workers.get_or_create(&l(&[("state", "registered")])).set(st.workers.len() as f64);
        workers.get_or_create(&l(&[("state", "done")])).set(st.done.len() as f64);
        workers.get_or_create(&l(&[("state", "vacant")])).set(st.vacant.len() as f64);
        workers.get_or_create(&l(&[("state", "lost")])).set(st.lost_workers.len() as f64);
        ckpts.get_or_create(&vec![]).inc_by(st.ckpt.done as f64);
        let mut names: Vec<(&String, u64)> = st.barriers.iter().map(|(n, b)| (n, b.passed)).collect();
        names.sort();
        for (name, n) in names {
            passes.get_or_create(&l(&[("barrier", name)])).inc_by(n as f64);
        }
        ended.get_or_create(&vec![]).set(if st.ended() { 1.0 } else { 0.0 });
    }
    held.get_or_create(&vec![]).set(c.held_calls() as f64);
    let r = c.recoveries.lock().clone();
    for (cause, s) in [("failure", r.recoveries), ("change", r.reconfigurations)] {
        let lb = l(&[("cause", cause)]);
        epochs.get_or_create(&lb).inc_by(s.0 as f64);
        took.get_or_create(&lb).inc_by(s.1);
        last.get_or_create(&lb).set(s.2);
        copied.get_or_create(&lb).inc_by(s.3 as f64);
    }
    let mut out = String::new();
    if let Err(e) = encode(&mut out, &reg) {
        tracing::warn!("metrics: cannot encode: {e}");
    }
    out
}

impl Coordinator {
    /// Serves `GET /metrics` ([`render`]) and `GET /healthz` (`ok` until the job ends) on
    /// `listen` from a thread of its own; returns the bound address. Fails, naming the
    /// address, when it cannot bind.
    pub fn serve_metrics(self: &Arc<Self>, listen: &str) -> std::io::Result<String> {
        let me = self.clone();
        downpour_transport::http::serve_http(
            listen,
            "coord-metrics",
            move |path| match path {
                "/metrics" => Some(("200 OK", downpour_transport::http::PROMETHEUS_TEXT, render(&me))),
                "/healthz" if !me.state.lock().ended() => Some(("200 OK", "text/plain", "ok\n".into())),
                "/healthz" => Some(("503 Service Unavailable", "text/plain", "the job ended\n".into())),
                _ => None,
            },
            // (the process ends with the job; the endpoint answers until then)
            || false,
        )
    }
}
