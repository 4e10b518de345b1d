//! `downpour plan`: predicts the examples/s of a `train linear` job (async SGD) or a `train
//! dnn` job (Downpour SGD) on W workers and S servers of a given CPU and link speed, names the
//! bottleneck, and recommends S for a W: a bound-and-bottleneck model (the slowest of the
//! workers' compute, the servers' compute, and the links) whose costs are measured once on
//! real runs of that job (a [`Calibration`]: from `plan calibrate`, [`crate::calibrate`], on
//! local processes, or from `scripts/scaling.sh` on emulated machines, which takes the
//! per-node CPU seconds from cgroups).
//!
//! With q cores per machine, R bytes/s per link (each way), and per example c_w worker CPU
//! seconds, c_s server CPU seconds (all servers together) and B bytes on the wire (both
//! ways, all links of the workers together):
//!
//! * workers: W · q / c_w examples/s;
//! * servers: S · q / c_s (the keys spread evenly over the servers);
//! * worker links: W · R / (B / 2) (each worker's link carries its examples' pushes and
//!   pulls, half each way: the busier direction bounds it);
//! * server links: S · R / (B / 2) (the same bytes, spread over the servers).
//!
//! The prediction is the smallest bound; async SGD has no synchronisation loss to add (a
//! `bsp` or `ssp` job would, which this model does not cover).

use anyhow::{bail, Context, Result};

/// What real runs measured, per training example: the workers' costs from a run the
/// workers bound (one worker), the servers' from a run that loads them (a lightly loaded
/// server pays a wake-up per request, so its cost per example at low load overstates what it
/// can do; `scripts/scaling.sh` takes the run with as many workers as servers).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    /// Worker CPU seconds per example.
    pub worker_cpu_s: f64,
    /// Server CPU seconds per example, all servers together.
    pub server_cpu_s: f64,
    /// Bytes on the wire per example (both directions, at the workers).
    pub wire_bytes: f64,
    /// The servers of the run (its requests split over them: each adds per-request costs).
    #[serde(default)]
    pub servers: Option<usize>,
    /// The job measured (`linear` when absent).
    #[serde(default)]
    pub job: Option<PlannedJob>,
    /// Training examples (all workers together) the job needed to reach its target quality
    /// (e.g. a test log loss), when measured: the prediction then gives the time to target
    /// as these examples at the predicted rate. Async SGD's examples to a target grow with
    /// the workers' staleness; this is the measurement's, at its workers.
    #[serde(default)]
    pub examples_to_target: Option<f64>,
}

/// The jobs the planner covers: their costs come from calibrations of that job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlannedJob {
    /// `train linear`, async SGD.
    #[default]
    Linear,
    /// `train dnn`, Downpour SGD (asynchronous).
    Dnn,
}

impl PlannedJob {
    /// `linear` or `dnn`.
    pub fn name(self) -> &'static str {
        match self {
            PlannedJob::Linear => "linear",
            PlannedJob::Dnn => "dnn",
        }
    }
}

impl Calibration {
    /// The job measured (`linear` when the calibration does not say).
    pub fn job_name(&self) -> &'static str {
        self.job.unwrap_or_default().name()
    }

    /// The costs at `servers` servers from calibrations taken at different server counts:
    /// each cost a line in S through the two runs furthest apart in S (a request per server
    /// per minibatch: more servers, more per-request work per example), kept positive; one
    /// calibration (or all at one S) is taken as it is.
    pub fn at(cals: &[Calibration], servers: usize) -> Result<Calibration> {
        let Some(first) = cals.first() else { bail!("no calibration") };
        if cals.iter().any(|c| c.job_name() != first.job_name()) {
            bail!("the calibrations measure different jobs ({} and others): give those of one job", first.job_name());
        }
        let with_s: Vec<(f64, &Calibration)> = cals.iter().filter_map(|c| c.servers.map(|s| (s as f64, c))).collect();
        let lo = with_s.iter().min_by(|a, b| a.0.total_cmp(&b.0));
        let hi = with_s.iter().max_by(|a, b| a.0.total_cmp(&b.0));
        let (Some(&(s0, a)), Some(&(s1, b))) = (lo, hi) else { return Ok(*first) };
        if s1 <= s0 {
            return Ok(*a);
        }
        let x = servers as f64;
        let line = |ya: f64, yb: f64| {
            let y = ya + (yb - ya) * (x - s0) / (s1 - s0);
            // (a cost never falls below a tenth of the smaller measurement)
            y.max(ya.min(yb) / 10.0)
        };
        Ok(Calibration {
            worker_cpu_s: line(a.worker_cpu_s, b.worker_cpu_s),
            server_cpu_s: line(a.server_cpu_s, b.server_cpu_s),
            wire_bytes: line(a.wire_bytes, b.wire_bytes),
            servers: Some(servers),
            job: a.job,
            examples_to_target: a.examples_to_target.or(b.examples_to_target),
        })
    }
}

/// A configuration to predict.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Machines {
    /// Workers.
    pub workers: usize,
    /// Servers.
    pub servers: usize,
    /// CPU cores per machine.
    pub cpu: f64,
    /// Link speed per machine, each way, bytes/s.
    pub link_bytes_per_s: f64,
}

/// A prediction: examples/s, the bound that sets it, and each resource's utilisation.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Prediction {
    /// Workers.
    pub workers: usize,
    /// Servers.
    pub servers: usize,
    /// Predicted examples/s.
    pub examples_per_s: f64,
    /// What bounds it: `workers`, `servers`, `worker links` or `server links`.
    pub bottleneck: &'static str,
    /// Each bound, examples/s.
    pub bounds: Vec<(&'static str, f64)>,
    /// Utilisation of the workers' CPUs at the predicted rate (0..1).
    pub worker_cpu_util: f64,
    /// Utilisation of the servers' CPUs.
    pub server_cpu_util: f64,
    /// Utilisation of the busiest link.
    pub link_util: f64,
    /// Seconds to the target quality: the calibration's examples to target at the
    /// predicted rate (when it has them).
    pub time_to_target_s: Option<f64>,
}

/// Predicts `m` from calibrations `cals` (their costs at `m.servers`, [`Calibration::at`]).
pub fn predict_from(cals: &[Calibration], m: &Machines) -> Result<Prediction> {
    predict(&Calibration::at(cals, m.servers)?, m)
}

/// Predicts `m` from `c` (its costs taken as they are, whatever `m.servers`).
pub fn predict(c: &Calibration, m: &Machines) -> Result<Prediction> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if m.workers == 0 || m.servers == 0 || !positive(m.cpu) || !positive(m.link_bytes_per_s) {
        bail!("workers, servers, cpu and link must be positive");
    }
    if ![c.worker_cpu_s, c.server_cpu_s, c.wire_bytes].into_iter().all(positive) {
        bail!("the calibration's costs must be positive: {c:?}");
    }
    let (w, s) = (m.workers as f64, m.servers as f64);
    let half = c.wire_bytes / 2.0;
    let bounds = vec![
        ("workers", w * m.cpu / c.worker_cpu_s),
        ("servers", s * m.cpu / c.server_cpu_s),
        ("worker links", w * m.link_bytes_per_s / half),
        ("server links", s * m.link_bytes_per_s / half),
    ];
    let (bottleneck, x) = bounds.iter().copied().fold(("", f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
    let link = (x * half / w).max(x * half / s) / m.link_bytes_per_s;
    Ok(Prediction {
        workers: m.workers,
        servers: m.servers,
        examples_per_s: x,
        bottleneck,
        worker_cpu_util: x * c.worker_cpu_s / (w * m.cpu),
        server_cpu_util: x * c.server_cpu_s / (s * m.cpu),
        link_util: link,
        time_to_target_s: c.examples_to_target.filter(|&n| n.is_finite() && n > 0.0).map(|n| n / x),
        bounds,
    })
}

/// The fewest servers for `workers` workers whose prediction is within 5 % of the best over
/// 1..=`workers` servers (more servers past the point where the workers or their links
/// bound the job buy nothing, and with per-request costs they may cost).
pub fn recommend_servers(cals: &[Calibration], m: &Machines) -> Result<usize> {
    let n = m.workers.max(1);
    let mut rates = Vec::with_capacity(n);
    for s in 1..=n {
        rates.push(predict_from(cals, &Machines { servers: s, ..*m })?.examples_per_s);
    }
    let best = rates.iter().copied().fold(0.0, f64::max);
    Ok(rates.iter().position(|&x| x >= 0.95 * best).map_or(n, |i| i + 1))
}

/// Parses a link speed as `tc` writes it: `10gbit`, `1gbit`, `100mbit`, `500kbit` (bits/s),
/// into bytes/s.
pub fn parse_link(s: &str) -> Result<f64> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)]
        .iter()
        .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n, *m)))
        .with_context(|| format!("link {s:?}: a number and a unit (10gbit, 100mbit)"))?;
    let v: f64 = num.trim().parse().with_context(|| format!("link {s:?}: a number and a unit (10gbit, 100mbit)"))?;
    if !(v.is_finite() && v > 0.0) {
        bail!("link {s:?} must be positive");
    }
    Ok(v * mult / 8.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cal() -> Calibration {
        Calibration { worker_cpu_s: 1e-5, server_cpu_s: 4e-6, wire_bytes: 800.0, servers: None, job: None, examples_to_target: None }
    }

    #[test]
    fn the_slowest_resource_sets_the_rate_and_is_named() {
        let m = Machines { workers: 1, servers: 2, cpu: 0.1, link_bytes_per_s: 1.25e9 };
        let p = predict(&cal(), &m).unwrap();
        assert_eq!(p.bottleneck, "workers");
        assert!((p.examples_per_s - 10_000.0).abs() < 1e-6);
        assert!((p.worker_cpu_util - 1.0).abs() < 1e-9);
        // 16 workers on 2 servers: the servers' CPUs bound it (2 × 0.1 / 4e-6 = 50,000)
        let p = predict(&cal(), &Machines { workers: 16, ..m }).unwrap();
        assert_eq!(p.bottleneck, "servers");
        assert!((p.examples_per_s - 50_000.0).abs() < 1e-6);
        // a slow network: 1 Mbit/s links carry 125,000 B/s, 400 B each way per example
        let p = predict(&cal(), &Machines { link_bytes_per_s: 125_000.0, ..m }).unwrap();
        assert_eq!(p.bottleneck, "worker links");
        assert!((p.examples_per_s - 312.5).abs() < 1e-6);
    }

    #[test]
    fn the_recommended_servers_stop_where_more_buy_nothing() {
        let m = Machines { workers: 16, servers: 1, cpu: 0.1, link_bytes_per_s: 1.25e9 };
        // workers bound at 160,000; servers at 25,000 each: 7 reach 95 % of it
        assert_eq!(recommend_servers(&[cal()], &m).unwrap(), 7);
    }

    #[test]
    fn costs_measured_at_two_server_counts_are_drawn_as_lines_in_the_servers() {
        let a = Calibration { servers: Some(2), ..cal() };
        let b = Calibration { worker_cpu_s: 4e-5, server_cpu_s: 1.6e-5, servers: Some(8), ..cal() };
        let at5 = Calibration::at(&[a, b], 5).unwrap();
        assert!((at5.worker_cpu_s - 2.5e-5).abs() < 1e-12 && (at5.server_cpu_s - 1e-5).abs() < 1e-12, "{at5:?}");
        // below the measured range, never under a tenth of the smaller cost
        let at0 = Calibration::at(&[a, b], 0).unwrap();
        assert!(at0.worker_cpu_s >= 1e-6 && at0.server_cpu_s >= 4e-7, "{at0:?}");
        // per-request costs make more servers cost: the recommendation stops early
        let m = Machines { workers: 16, servers: 1, cpu: 0.1, link_bytes_per_s: 1.25e9 };
        assert!(recommend_servers(&[a, b], &m).unwrap() < recommend_servers(&[cal()], &m).unwrap());
        // one calibration is taken as it is
        assert_eq!(Calibration::at(&[a], 8).unwrap(), a);
    }

    #[test]
    fn links_parse_in_bits_and_bad_ones_are_named() {
        assert_eq!(parse_link("10gbit").unwrap(), 1.25e9);
        assert_eq!(parse_link("100Mbit").unwrap(), 12.5e6);
        assert!(parse_link("fast").unwrap_err().to_string().contains("10gbit"));
        assert!(parse_link("0gbit").is_err());
    }
}
