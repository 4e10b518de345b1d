//! The simulation's seeds: every one must keep every invariant. `SIM_SEEDS=N` runs N seeds
//! (default 10,000, about 40 s: the soak mode is `SIM_SEEDS=1000000`, with `-- --nocapture` for
//! a progress line every 30 s), `SIM_SEED=S` runs seed S alone
//! (what a failure prints), `SIM_FIRST=F` starts at seed F.

use std::time::Instant;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().replace('_', "").parse().ok())
}

#[test]
fn every_seed_keeps_every_replica_equal_to_the_sequential_run() {
    let (first, count) = match env_u64("SIM_SEED") {
        Some(s) => (s, 1),
        None => (env_u64("SIM_FIRST").unwrap_or(0), env_u64("SIM_SEEDS").unwrap_or(10_000)),
    };
    let window = env_u64("SIM_WINDOW").map(|w| w as usize);
    let t0 = Instant::now();
    let mut totals = downpour_sim::Outcome::default();
    let mut by_k = [0u64; 4];
    let mut pipelined = 0u64;
    let mut bsp = 0u64;
    let mut evicting = 0u64;
    let mut reported = Instant::now();
    for seed in first..first + count {
        // the soak runs for many minutes: a line every 30 s (shown with `-- --nocapture`)
        if reported.elapsed().as_secs() >= 30 {
            reported = Instant::now();
            let done = seed - first;
            let eta = t0.elapsed().as_secs_f64() / done.max(1) as f64 * (count - done) as f64;
            eprintln!("{done}/{count} seeds passed in {:.0} s, about {eta:.0} s to go", t0.elapsed().as_secs_f64());
        }
        let mut cfg = downpour_sim::SimConfig::from_seed(seed);
        if let Some(w) = window {
            cfg.window = w;
        }
        match downpour_sim::run_with(seed, cfg.clone()) {
            Ok(o) => {
                totals.delivered += o.delivered;
                totals.lost += o.lost;
                totals.duplicated += o.duplicated;
                totals.epochs += o.epochs;
                totals.retries += o.retries;
                totals.replaced += o.replaced;
                totals.drained += o.drained;
                totals.fenced += o.fenced;
                totals.coordinator_restarts += o.coordinator_restarts;
                totals.drops += o.drops;
                by_k[cfg.k] += 1;
                pipelined += u64::from(cfg.window > 1);
                bsp += u64::from(cfg.bsp);
                evicting += u64::from(cfg.evict);
            }
            Err(v) => panic!(
                "seed {seed} broke the protocol: {v}\n  configuration: {cfg:?}\n  reproduce: SIM_SEED={seed}{} cargo test --release -p downpour-sim --test seeds",
                window.map(|w| format!(" SIM_WINDOW={w}")).unwrap_or_default()
            ),
        }
    }
    eprintln!(
        "{count} seeds from {first} in {:.1}s: K=1/2/3 {}/{}/{}, {pipelined} with pipelined workers, {bsp} with a replicated bsp table, {evicting} with eviction ({} row drops), {} frames delivered, {} lost, {} duplicated, {} epochs, {} retried pushes, {} workers replaced while running, {} pushes of replaced workers fenced, {} servers drained, {} coordinator restarts",
        t0.elapsed().as_secs_f64(),
        by_k[1],
        by_k[2],
        by_k[3],
        totals.drops,
        totals.delivered,
        totals.lost,
        totals.duplicated,
        totals.epochs,
        totals.retries,
        totals.replaced,
        totals.fenced,
        totals.drained,
        totals.coordinator_restarts
    );
    // the runs must have exercised what they claim to
    if count >= 500 {
        assert!(by_k[1] > 0 && by_k[2] > 0 && by_k[3] > 0, "every K was drawn");
        assert!(pipelined > 0 && pipelined < count || window.is_some(), "workers with one push and with several in flight");
        assert!(totals.lost > 0 && totals.duplicated > 0 && totals.retries > 0, "faults were injected");
        assert!(totals.epochs > count, "epochs changed");
        assert!(totals.replaced > 0 && totals.fenced > 0, "running workers were replaced and fenced");
        assert!(totals.coordinator_restarts > 0, "the coordinator restarted from its snapshot");
        assert!(bsp > 0 && bsp < count, "async and bsp tables");
        assert!(totals.drained > 0, "servers were drained");
        assert!(evicting > 0 && evicting < count && totals.drops > 0, "heads dropped rows in some runs");
    }
}

/// `SIM_TRACE=S` prints every frame of seed S (for reading a failure; `SIM_WINDOW=N` as in
/// the run that failed); nothing otherwise.
#[test]
fn a_seed_traced_on_request() {
    let Some(seed) = env_u64("SIM_TRACE") else { return };
    let mut cfg = downpour_sim::SimConfig::from_seed(seed);
    if let Some(w) = env_u64("SIM_WINDOW") {
        cfg.window = w as usize;
    }
    let (r, lines) = downpour_sim::trace_with(seed, cfg.clone());
    for l in lines {
        eprintln!("{l}");
    }
    eprintln!("seed {seed}: {r:?}\n{cfg:?}");
}
