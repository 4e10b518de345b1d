//! `downpour plan`: predicts the examples/s of a `train linear` job (async SGD) on W workers
//! and S servers of a given CPU and link speed, names the bottleneck, and recommends S for
//! a W: a bound-and-bottleneck model (the slowest of the workers' compute, the servers'
//! compute, and the links) whose costs are measured once on a real run (a [`Calibration`],
//! e.g. from `scripts/scaling.sh`, which takes the per-node CPU seconds from cgroups).
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

/// What one real run measured, per training example.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    /// Worker CPU seconds per example.
    pub worker_cpu_s: f64,
    /// Server CPU seconds per example, all servers together.
    pub server_cpu_s: f64,
    /// Bytes on the wire per example (both directions, at the workers).
    pub wire_bytes: f64,
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
}

/// Predicts `m` from `c`.
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
        bounds,
    })
}

/// The fewest servers for `workers` workers whose prediction is within 5 % of the best over
/// 1..=`workers` servers (more servers past the point where the workers or their links
/// bound the job buy nothing).
pub fn recommend_servers(c: &Calibration, m: &Machines) -> Result<usize> {
    let best = predict(c, &Machines { servers: m.workers.max(1), ..*m })?.examples_per_s;
    for s in 1..=m.workers.max(1) {
        if predict(c, &Machines { servers: s, ..*m })?.examples_per_s >= 0.95 * best {
            return Ok(s);
        }
    }
    Ok(m.workers.max(1))
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
        Calibration { worker_cpu_s: 1e-5, server_cpu_s: 4e-6, wire_bytes: 800.0 }
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
        assert_eq!(recommend_servers(&cal(), &m).unwrap(), 7);
    }

    #[test]
    fn links_parse_in_bits_and_bad_ones_are_named() {
        assert_eq!(parse_link("10gbit").unwrap(), 1.25e9);
        assert_eq!(parse_link("100Mbit").unwrap(), 12.5e6);
        assert!(parse_link("fast").unwrap_err().to_string().contains("10gbit"));
        assert!(parse_link("0gbit").is_err());
    }
}
