//! `downpour bench --export ROWS`: what incremental export and serving cost, in one run.
//!
//! On an embedded cluster, a sparse table of ROWS rows that tracks changes is filled; then
//! a full export and, after pushes to 1 % of the rows, a delta export are timed (both read
//! from the servers and written to an export directory, as `train linear --export-dir` does).
//! A serving node (`downpour serve`, over TCP) then loads the directory and is timed
//! answering 4 KiB pulls (p50, p99), large pulls (keys/s), and 4 KiB pulls while it folds in
//! another delta of 1 % of the rows.

use crate::embedded::EmbeddedCluster;
use crate::serve::{self, ServeConfig};
use crate::settings::Settings;
use anyhow::{Context, Result};
use downpour_core::table::TableDef;
use downpour_jobs::export::{ExportConfig, Exporter};
use downpour_jobs::Report;
use downpour_server::serving::serving_def;
use std::time::{Duration, Instant};

/// What `bench --export` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExportBenchResult {
    /// Rows in the table.
    pub rows: u64,
    /// Values a row.
    pub value_len: usize,
    /// Seconds to fill the table.
    pub fill_s: f64,
    /// The full export: seconds, rows, file bytes.
    pub full_s: f64,
    /// Bytes of the full export's file.
    pub full_bytes: u64,
    /// The delta after pushes to 1 % of the rows: seconds, rows.
    pub delta_s: f64,
    /// Rows in the delta.
    pub delta_rows: u64,
    /// `delta_s / full_s`.
    pub delta_ratio: f64,
    /// Seconds for the serving node to load the full export and the delta.
    pub serve_load_s: f64,
    /// Latency of a 4 KiB pull (1,024 keys of 1 value, or fewer keys of more) from the serving
    /// node, idle: median and 99th percentile, microseconds.
    pub pull_4k_p50_us: f64,
    /// 99th percentile of the same.
    pub pull_4k_p99_us: f64,
    /// Keys a second the serving node answers in pulls of 65,536 keys, one client.
    pub serve_keys_per_s: f64,
    /// 4 KiB pulls while the serving node folds in another 1 % delta: median, µs.
    pub loading_p50_us: f64,
    /// 99th percentile of the same.
    pub loading_p99_us: f64,
    /// The slowest of those pulls, µs.
    pub loading_max_us: f64,
    /// 4 KiB pulls answered while that delta loaded.
    pub loading_pulls: u64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Key `i` of the table (spread over the key space, as hashed ids are).
fn key(i: u64) -> u64 {
    downpour_core::keys::scramble(i).min(u64::MAX - 1)
}

/// `n` keys of the table's first `rows`, picked by a seeded walk, sorted and unique.
fn some_keys(rows: u64, n: usize, seed: u64) -> Vec<u64> {
    let mut x = seed | 1;
    let mut k: Vec<u64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            key(x % rows)
        })
        .collect();
    k.sort_unstable();
    k.dedup();
    k
}

/// Runs the export and serving benchmark on `servers` embedded servers.
pub fn run(s: &Settings, servers: usize, rows: u64, value_len: usize, report: &Report) -> Result<ExportBenchResult> {
    let vl = value_len.max(1);
    let cluster = EmbeddedCluster::start(s, servers, 1)?;
    let mut w = cluster.join()?;
    let def = TableDef { value_len: vl, changes: true, ..TableDef::new(1, "bench-export") };
    w.kv.create_table(def.clone())?;
    let dir = tempfile_dir()?;
    let cfg = ExportConfig { skew: Duration::ZERO, full_every: 0, ..ExportConfig::new(&dir, Duration::from_secs(3600)) };
    let mut ex = Exporter::open(cfg, std::slice::from_ref(&def))?;

    // fill
    let started = Instant::now();
    const BATCH: u64 = 1 << 17;
    let mut keys = Vec::with_capacity(BATCH as usize);
    let values = vec![0.5f32; BATCH as usize * vl];
    let mut b = 0;
    while b < rows {
        let e = (b + BATCH).min(rows);
        keys.clear();
        keys.extend((b..e).map(key));
        keys.sort_unstable();
        let ts = w.kv.push(1, &keys, &values[..keys.len() * vl])?;
        if (b / BATCH) % 8 == 7 {
            w.kv.wait(ts)?;
            report.line(&format!("bench --export: {e} of {rows} rows"));
        }
        b = e;
    }
    w.kv.wait_all()?;
    let fill_s = started.elapsed().as_secs_f64();

    // the full export, then 1 % of the rows pushed, then the delta
    let full = ex.export(&mut w.kv).context("the full export")?;
    // rows written in the tick of the full export's cut are in the delta too: start later
    std::thread::sleep(Duration::from_millis(50));
    let changed = some_keys(rows, (rows / 100) as usize, 7);
    let ts = w.kv.push(1, &changed, &vec![0.25f32; changed.len() * vl])?;
    w.kv.wait(ts)?;
    let delta = ex.export(&mut w.kv).context("the delta export")?;
    report.line(&format!(
        "bench --export: full export of {} rows in {:.2} s, delta of {} rows in {:.3} s",
        full.rows, full.seconds, delta.rows, delta.seconds
    ));

    // a serving node on the directory
    let transport = downpour_transport::tcp::TcpTransport::new(Default::default())?;
    let loading = Instant::now();
    let node = serve::serve(&transport, ServeConfig { follow_every: Duration::from_millis(20), ..ServeConfig::new(&dir, "127.0.0.1:0") })?;
    let serve_load_s = loading.elapsed().as_secs_f64();
    let mut c = serve::connect(&transport, node.addr(), Default::default())?;
    c.use_table(serving_def(1, "bench-export", vl));
    let per_4k = (1024 / vl).max(1);
    let mut small = vec![0f32; per_4k * vl];
    let mut timed = |c: &mut downpour_worker::KvClient, n: usize, seed: u64| -> Result<f64> {
        let k = some_keys(rows, n, seed);
        let t = Instant::now();
        c.pull_into(1, &k, &mut small[..k.len() * vl])?;
        Ok(t.elapsed().as_secs_f64() * 1e6)
    };
    let mut out = vec![0f32; 65_536 * vl];
    let mut lat: Vec<f64> = (0..2000u64).map(|i| timed(&mut c, per_4k, 100 + i)).collect::<Result<_>>()?;
    lat.sort_by(f64::total_cmp);
    let big = Instant::now();
    let mut served_keys = 0usize;
    for i in 0..40u64 {
        let k = some_keys(rows, 65_536, 10_000 + i);
        c.pull_into(1, &k, &mut out[..k.len() * vl])?;
        served_keys += k.len();
    }
    let serve_keys_per_s = served_keys as f64 / big.elapsed().as_secs_f64();

    // another 1 % delta lands while pulls go on
    let changed = some_keys(rows, (rows / 100) as usize, 8);
    let ts = w.kv.push(1, &changed, &vec![0.75f32; changed.len() * vl])?;
    w.kv.wait(ts)?;
    let before = node.served().applied.len();
    ex.export(&mut w.kv).context("the second delta export")?;
    let mut during = Vec::new();
    let t_wait = Instant::now();
    while node.served().applied.len() <= before && t_wait.elapsed() < Duration::from_secs(120) {
        during.push(timed(&mut c, per_4k, 50_000 + during.len() as u64)?);
    }
    during.sort_by(f64::total_cmp);

    node.shutdown();
    w.finish(true, "")?;
    cluster.wait()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ExportBenchResult {
        rows,
        value_len: vl,
        fill_s,
        full_s: full.seconds,
        full_bytes: full.bytes,
        delta_s: delta.seconds,
        delta_rows: delta.rows,
        delta_ratio: delta.seconds / full.seconds.max(1e-9),
        serve_load_s,
        pull_4k_p50_us: percentile(&lat, 0.5),
        pull_4k_p99_us: percentile(&lat, 0.99),
        serve_keys_per_s,
        loading_p50_us: percentile(&during, 0.5),
        loading_p99_us: percentile(&during, 0.99),
        loading_max_us: during.last().copied().unwrap_or(0.0),
        loading_pulls: during.len() as u64,
    })
}

/// A fresh directory for the benchmark's exports under the system's temporary directory.
fn tempfile_dir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("downpour-bench-export-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
    Ok(d)
}
