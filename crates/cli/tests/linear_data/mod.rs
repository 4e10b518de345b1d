//! The generated LIBSVM data and the `train linear` runs the binary's linear-model tests
//! share (`train.rs`; `tables.rs`: admission, eviction, export and serving).

use std::io::Write;
use std::path::Path;
use std::process::Command;

/// The binary, logging warnings only.
pub fn downpour() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_downpour"));
    c.env("DOWNPOUR_LOG", "warn");
    c
}

/// Writes `n` examples: 15 of 500 features each, label drawn from σ(w·x) with a fixed w.
pub fn write_data(path: &Path, n: usize, seed: u64) {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let w: Vec<f64> = (0..500u64).map(|k| if k % 3 == 0 { ((k * 7919 % 200) as f64 / 100.0) - 1.0 } else { 0.0 } * 2.5).collect();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for _ in 0..n {
        let mut ks: Vec<u64> = (0..15).map(|_| next() % 500).collect();
        ks.sort_unstable();
        ks.dedup();
        let z: f64 = ks.iter().map(|&k| w[k as usize]).sum();
        let p = 1.0 / (1.0 + (-z).exp());
        let y = (next() % 1_000_000) as f64 / 1e6 < p;
        write!(f, "{}", if y { "+1" } else { "-1" }).unwrap();
        for k in ks {
            write!(f, " {k}:1").unwrap();
        }
        writeln!(f).unwrap();
    }
}

/// Runs embedded `train linear` on `tr` / `te` with `workers` workers, metrics to `out`, the
/// model to `model`, plus `extra`; returns its info-level log (the run must succeed).
pub fn train_logged(tr: &Path, te: &Path, out: &Path, model: &Path, workers: usize, extra: &[&str]) -> String {
    let o = downpour()
        .env("DOWNPOUR_LOG", "info")
        .args(["train", "linear", "--train", tr.to_str().unwrap(), "--test", te.to_str().unwrap()])
        .args(["--workers", &workers.to_string(), "--out", out.to_str().unwrap(), "--model-out", model.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{log}");
    log
}

/// The metrics JSON a run wrote to `path`.
pub fn metrics(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}
