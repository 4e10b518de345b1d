//! `train lsq` and `train linear --coded`: coded partitioning decodes from the first K
//! workers and reaches the uncoded objective, the straggler's results are the ones dropped,
//! gradient coding does the same, bad codes and bad data get clear errors.

use std::path::Path;
use std::process::{Command, Output};

fn downpour() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_downpour"));
    c.env("DOWNPOUR_LOG", "warn");
    c
}

fn run(args: &[&str]) -> Output {
    let o = downpour().args(args).output().unwrap();
    assert!(o.status.success(), "{args:?}\nstdout: {}\nstderr: {}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    o
}

fn fails(args: &[&str]) -> String {
    let o = downpour().args(args).output().unwrap();
    assert!(!o.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `args` with `--out` and returns the metrics.
fn metrics(args: &[&str], dir: &Path, name: &str) -> serde_json::Value {
    let out = dir.join(name);
    let mut all = args.to_vec();
    all.extend(["--quiet", "--out", out.to_str().unwrap()]);
    run(&all);
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

fn objective(m: &serde_json::Value) -> f64 {
    m["objective"].as_f64().unwrap()
}

fn dropped(m: &serde_json::Value) -> Vec<u64> {
    m["results_dropped"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect()
}

const LSQ: [&str; 8] = ["train", "lsq", "--workers", "4", "--synthetic", "3000:30", "--iterations", "25"];

#[test]
fn coded_partitioning_drops_the_stragglers_results_and_reaches_the_uncoded_objective() {
    let d = tempfile::tempdir().unwrap();
    let plain = metrics(&[&LSQ[..], &["--coded", "none"]].concat(), d.path(), "none.json");
    // worker 3 (the parity block) is 30 times slower: rounds close on workers 0-2
    let coded = metrics(&[&LSQ[..], &["--coded", "mds:4,3", "--straggler", "3:30"]].concat(), d.path(), "mds.json");
    let (a, b) = (objective(&plain), objective(&coded));
    assert!((a - b).abs() <= 1e-6 * a.abs(), "uncoded {a}, coded {b}");
    // the objective fell from f(0) = mean(y²)/2
    let first = plain["trace"][0][2].as_f64().unwrap();
    assert!(a < 0.2 * first, "{first} -> {a}");
    assert_eq!(dropped(&plain), vec![0, 0, 0, 0], "{plain}");
    let rounds = 2 * 25;
    let dr = dropped(&coded);
    assert!(dr[3] as usize >= rounds / 2, "the straggler's results were not the ones dropped: {dr:?}");
    assert!(dr[..3].iter().all(|&d| (d as usize) < rounds / 4), "the fast workers' results were dropped: {dr:?}");
    assert!(coded["decode_error"].as_f64().unwrap() < 1e-5, "{coded}");
    assert_eq!(coded["results_needed"], 3);
}

#[test]
fn gradient_coding_drops_the_stragglers_results_and_reaches_the_uncoded_objective() {
    let d = tempfile::tempdir().unwrap();
    let plain = metrics(&[&LSQ[..], &["--coded", "none"]].concat(), d.path(), "none.json");
    for code in ["gradient:frac:1", "gradient:cyclic:1"] {
        let m = metrics(&[&LSQ[..], &["--coded", code, "--straggler", "1:30"]].concat(), d.path(), "gc.json");
        let (a, b) = (objective(&plain), objective(&m));
        assert!((a - b).abs() <= 1e-6 * a.abs(), "{code}: uncoded {a}, coded {b}");
        let dr = dropped(&m);
        assert!(dr[1] >= 12, "{code}: the straggler's results were not the ones dropped: {dr:?}");
        assert!([dr[0], dr[2], dr[3]].iter().all(|&d| d < 6), "{code}: the fast workers' results were dropped: {dr:?}");
    }
}

/// A LIBSVM file of `n` examples of two classes (a seeded linear rule), 6 features.
fn write_classes(path: &Path, n: usize) {
    let mut s = String::new();
    let mut x: u64 = 7;
    let mut next = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((x >> 33) as f64 / (1u64 << 31) as f64) * 2.0 - 1.0
    };
    for _ in 0..n {
        let f: Vec<f64> = (0..6).map(|_| next()).collect();
        let z = 2.0 * f[0] - 1.5 * f[2] + f[5] + 0.3 * next();
        s.push_str(if z > 0.0 { "+1" } else { "-1" });
        for (i, v) in f.iter().enumerate() {
            s.push_str(&format!(" {}:{v:.4}", i + 1));
        }
        s.push('\n');
    }
    std::fs::write(path, s).unwrap();
}

#[test]
fn train_linear_coded_fits_logistic_regression_on_a_libsvm_file() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("train.svm");
    write_classes(&f, 600);
    let base = ["train", "linear", "--train", f.to_str().unwrap(), "--workers", "3", "--epochs", "40"];
    let plain = metrics(&[&base[..], &["--coded", "none"]].concat(), d.path(), "none.json");
    let coded = metrics(&[&base[..], &["--coded", "mds:3,2", "--straggler-tail", "0.3:5"]].concat(), d.path(), "mds.json");
    assert_eq!(plain["loss"], "logistic");
    let (a, b) = (objective(&plain), objective(&coded));
    assert!(a < 0.5 * std::f64::consts::LN_2, "logistic loss {a} (ln 2 at w = 0)");
    assert!((a - b).abs() <= 1e-6 * a, "uncoded {a}, coded {b}");
}

#[test]
fn codes_that_do_not_fit_the_workers_and_options_coded_runs_ignore_are_refused() {
    let e = fails(&["train", "lsq", "--workers", "3", "--synthetic", "100:5", "--coded", "mds:4,3", "--quiet"]);
    assert!(e.contains("mds:4,3") && e.contains("3 workers"), "{e}");
    let e = fails(&["train", "lsq", "--synthetic", "100:5", "--coded", "mds:3"]);
    assert!(e.contains("mds:N,K"), "{e}");
    let e = fails(&["train", "lsq", "--synthetic", "100:5", "--coded", "rs:3,2"]);
    assert!(e.contains("none, mds:N,K or gradient"), "{e}");
    let e =
        fails(&["train", "lsq", "--workers", "2", "--synthetic", "100:5", "--coded", "gradient:frac:1", "--straggler", "2:3", "--quiet"]);
    assert!(e.contains("--straggler 2"), "{e}");
    let e = fails(&["train", "linear", "--train", "x.svm", "--coded", "none", "--test", "y.svm", "--l1", "1"]);
    assert!(e.contains("--test") && e.contains("--l1"), "{e}");
}

#[test]
fn a_corrupt_line_is_named_by_file_and_line() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("bad.svm");
    std::fs::write(&f, "1.5 1:0.5 2:1\n0.5 1:x\n").unwrap();
    let e = fails(&["train", "lsq", "--train", f.to_str().unwrap(), "--quiet"]);
    assert!(e.contains("bad.svm:2") && e.contains("\"x\""), "{e}");
    let e = fails(&["train", "lsq", "--train", d.path().join("missing.svm").to_str().unwrap(), "--quiet"]);
    assert!(e.contains("missing.svm"), "{e}");
}
