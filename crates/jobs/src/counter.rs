//! The `counter` job: the exact no-lost-update check every fault-tolerance test reuses.

use crate::report::Report;
use anyhow::{bail, ensure, Context, Result};
use downpour_core::table::{Storage, TableDef};
use downpour_worker::WorkerSession;

/// Flags of the counter job.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct CounterConfig {
    /// Number of keys every worker increments (spread over the whole key space, so every
    /// server holds some).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1000))]
    pub keys: u64,
    /// Rounds of increments per worker.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10))]
    pub rounds: u64,
    /// Values per key (each element is incremented).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub value_len: usize,
    /// Synchronous rounds: a `bsp` table whose rounds sum the workers' increments and apply
    /// them once (synchronous aggregation; with `--replication` the servers replicate each
    /// round's sum once instead of every push).
    #[cfg_attr(feature = "cli", arg(long))]
    pub sync: bool,
    /// A dense table of the keys `[0, keys)`, incremented by whole-range pushes (as a dense
    /// model's gradients are: each push is one key range per head, forwarded down the chains
    /// by range with `--replication`).
    #[cfg_attr(feature = "cli", arg(long))]
    pub dense: bool,
}

impl Default for CounterConfig {
    /// The flags' defaults: 1,000 keys, 10 rounds, one value per key, asynchronous, sparse.
    fn default() -> Self {
        CounterConfig { keys: 1000, rounds: 10, value_len: 1, sync: false, dense: false }
    }
}

/// Table id the counter job uses.
pub const TABLE: u32 = 1;

/// The keys of the job: `keys` keys spread evenly over `[0, u64::MAX)`.
pub fn counter_keys(n: u64) -> Vec<u64> {
    let stride = (u64::MAX - 1) / n.max(1);
    (0..n).map(|i| i * stride).collect()
}

/// Runs the counter job on one worker.
pub fn run(a: &CounterConfig, s: &mut WorkerSession, num_servers: usize, report: &Report) -> Result<()> {
    ensure!((1..=50_000_000).contains(&a.keys), "--keys must be between 1 and 50,000,000, got {}", a.keys);
    ensure!(a.rounds >= 1, "--rounds must be at least 1");
    ensure!((1..=1024).contains(&a.value_len), "--value-len must be between 1 and 1024, got {}", a.value_len);
    let expected = a.rounds * s.num_workers as u64;
    ensure!(expected <= 1 << 24, "workers × rounds = {expected} exceeds 2^24, past which f32 sums are not exact");
    let def = TableDef {
        value_len: a.value_len,
        storage: if a.dense { Storage::Dense(downpour_core::KeyRange::new(0, a.keys)) } else { Storage::Sparse },
        consistency: if a.sync { downpour_core::consistency::Consistency::Bsp } else { downpour_core::consistency::Consistency::Async },
        aggregate: if a.sync { downpour_core::rounds::Aggregate::Sum } else { Default::default() },
        ..TableDef::new(TABLE, "counter")
    };
    s.kv.create_table(def).context("creating the counter table")?;
    let keys = if a.dense { (0..a.keys).collect() } else { counter_keys(a.keys) };
    let ones = vec![1f32; keys.len() * a.value_len];
    // A resumed job goes on after the rounds its checkpoint holds (one clock per round).
    let done = match s.resumed() {
        None => 0,
        Some(w) => {
            let r: u64 =
                w.state.parse().map_err(|_| anyhow::anyhow!("the checkpoint's counter state {:?} is not a round number", w.state))?;
            ensure!(r <= a.rounds, "the checkpoint is at round {r}, past --rounds {}", a.rounds);
            tracing::info!("counter: worker {} resumes after round {r}", s.rank);
            r
        }
    };
    s.barrier("counter-start")?;
    // From here a replacement of this worker (replicated jobs) goes on from its last record.
    s.start_progress(|| done.to_string())?;
    let mut last = None;
    let t0 = std::time::Instant::now();
    let step = (a.rounds / 10).max(1);
    // the longest round shows how long a fault or a membership change held this worker up
    let mut slowest = (std::time::Duration::ZERO, 0);
    for r in done + 1..=a.rounds {
        let started = std::time::Instant::now();
        last = Some(if a.dense { s.kv.push_range(TABLE, 0, &ones)? } else { s.kv.push(TABLE, &keys, &ones)? });
        s.kv.clock()?;
        s.checkpoint_point(|| r.to_string())?;
        slowest = slowest.max((started.elapsed(), r));
        if s.rank == 0 && r % step == 0 && r < a.rounds {
            let rate = (r - done) as f64 / t0.elapsed().as_secs_f64().max(1e-9);
            tracing::info!("counter: round {r}/{} ({:.0} rounds/s, ETA {:.1}s)", a.rounds, rate, (a.rounds - r) as f64 / rate);
        }
    }
    if let Some(ts) = last {
        s.kv.wait(ts)?;
    }
    s.retire_from_checkpoints(|| a.rounds.to_string())?;
    s.barrier("counter-pushed")?;
    let mut got = vec![0f32; ones.len()];
    if a.dense {
        s.kv.pull_range_into(TABLE, 0, &mut got)?;
    } else {
        s.kv.pull_into(TABLE, &keys, &mut got)?;
    }
    if let Some(i) = got.iter().position(|v| *v != expected as f32) {
        let wrong = got.iter().filter(|v| **v != expected as f32).count();
        bail!(
            "counter: MISMATCH key={} element={} expected={expected} got={} (worker {}; {wrong} of {} values wrong, in {})",
            keys[i / a.value_len],
            i % a.value_len,
            got[i],
            s.rank,
            got.len(),
            wrong_runs(&keys, &got, a.value_len, expected as f32)
        );
    }
    report.line(&format!(
        "counter: OK keys={} expected={expected} workers={} servers={num_servers} rounds={} worker={} slowest_round_ms={:.1} (round {})",
        a.keys,
        s.num_workers,
        a.rounds,
        s.rank,
        slowest.0.as_secs_f64() * 1e3,
        slowest.1
    ));
    s.barrier("counter-done")?;
    Ok(())
}

/// Where the wrong values are: runs of consecutive keys (of `keys`) with a wrong element,
/// as `keys[first]..=keys[last] (n keys, got v)`, the first eight.
fn wrong_runs(keys: &[u64], got: &[f32], value_len: usize, expected: f32) -> String {
    let bad = |k: usize| got[k * value_len..(k + 1) * value_len].iter().find(|v| **v != expected).copied();
    let mut runs: Vec<String> = Vec::new();
    let mut total = 0;
    let mut k = 0;
    while k < keys.len() {
        let Some(v) = bad(k) else {
            k += 1;
            continue;
        };
        let first = k;
        while k < keys.len() && bad(k).is_some() {
            k += 1;
        }
        total += 1;
        if runs.len() < 8 {
            runs.push(format!("{}..={} ({} keys, got {v})", keys[first], keys[k - 1], k - first));
        }
    }
    let more = if total > runs.len() { format!(" and {} more", total - runs.len()) } else { String::new() };
    format!("{total} runs of keys: {}{more}", runs.join(", "))
}
