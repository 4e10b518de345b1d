//! `train dnn` end to end on the committed MNIST sample (`data/mnist-sample`: 3,000 training
//! and 1,000 test images): every algorithm learns in a short multi-process run, gradient
//! coding gives exactly the uncoded full-gradient result, bad data gets a clear error.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn downpour() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_downpour"));
    c.env("DOWNPOUR_LOG", "warn");
    c
}

fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/mnist-sample")
}

fn metrics(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn run(args: &[&str]) -> Output {
    let o = downpour().args(args).output().unwrap();
    assert!(o.status.success(), "{args:?}\nstdout: {}\nstderr: {}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    o
}

/// Trains under `launch` (2 servers, 2 workers) and returns the metrics.
fn launch(extra: &[&str], dir: &Path) -> serde_json::Value {
    let out = dir.join("m.json");
    let data = sample();
    let mut args = vec!["launch", "--servers", "2", "--workers", "2", "--", "train", "dnn", "--data", data.to_str().unwrap()];
    args.extend(["--out", out.to_str().unwrap(), "--quiet"]);
    args.extend(extra);
    run(&args);
    metrics(&out)
}

fn accuracy(m: &serde_json::Value) -> f64 {
    m["test_accuracy"].as_f64().unwrap()
}

#[test]
fn downpour_learns_across_processes_and_reports_the_documented_metrics() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("mlp.safetensors");
    let m = launch(&["--algorithm", "downpour", "--epochs", "3", "--model-out", model.to_str().unwrap()], d.path());
    assert!(accuracy(&m) > 0.8, "{m}");
    for key in ["test_accuracy", "test_loss", "wall_s", "examples_per_s", "bytes_sent", "bytes_received", "epochs"] {
        assert!(!m[key].is_null(), "metrics lack {key}: {m}");
    }
    let epochs = m["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 3);
    assert!(epochs.iter().all(|e| e["epoch"].is_u64() && e["test_accuracy"].is_f64() && e["wall_s"].is_f64()));
    assert!(m["bytes_sent"].as_u64().unwrap() > 0 && m["bytes_received"].as_u64().unwrap() > 0);
    // the exported model holds the declared tensors under their names and shapes
    let bytes = std::fs::read(&model).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header["fc1.weight"]["shape"], serde_json::json!([256, 784]));
    assert_eq!(header["fc3.bias"]["shape"], serde_json::json!([10]));
    assert_eq!(header["fc2.weight"]["dtype"], "F32");
}

#[test]
fn sync_and_model_averaging_learn_across_processes() {
    for (alg, epochs) in [("sync", "4"), ("model-avg", "3")] {
        let d = tempfile::tempdir().unwrap();
        let m = launch(&["--algorithm", alg, "--epochs", epochs], d.path());
        assert!(accuracy(&m) > 0.75, "{alg}: {m}");
        assert_eq!(m["algorithm"], alg);
    }
}

#[test]
fn sandblaster_lbfgs_learns_with_pieces_handed_out_dynamically() {
    let d = tempfile::tempdir().unwrap();
    let m = launch(&["--algorithm", "lbfgs", "--epochs", "12", "--piece", "250", "--hidden", "64"], d.path());
    assert!(accuracy(&m) > 0.6, "{m}");
    // the accepted iterations each report an evaluation, and the loss falls
    let e = m["epochs"].as_array().unwrap();
    assert!(e.len() >= 6, "{m}");
    assert!(e.last().unwrap()["test_loss"].as_f64().unwrap() < e[0]["test_loss"].as_f64().unwrap());
}

#[test]
fn gradient_coding_with_a_dropped_worker_trains_exactly_like_the_uncoded_full_gradient() {
    // 3 workers, cyclic code for 1 straggler: every round decodes from whichever two
    // workers finish first, so the model equals the plain synchronous run's
    let data = sample();
    let mut results = Vec::new();
    for extra in [vec![], vec!["--gradient-coding", "cyclic:1", "--straggler", "2:3"]] {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("m.json");
        let mut args = vec!["train", "dnn", "--data", data.to_str().unwrap(), "--algorithm", "sync", "--epochs", "1", "--hidden", "32"];
        args.extend(["--workers", "3", "--train-limit", "1500", "--quiet", "--out", out.to_str().unwrap()]);
        args.extend(extra);
        run(&args);
        results.push(metrics(&out));
    }
    let (a, b) = (accuracy(&results[0]), accuracy(&results[1]));
    assert!(a > 0.3, "{}", results[0]);
    // the uncoded run waited for every push; in the coded one, rounds closed without the
    // straggler, whose pushes came late and were dropped
    let late =
        |m: &serde_json::Value| -> Vec<u64> { m["late_pushes_dropped"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect() };
    assert_eq!(late(&results[0]), vec![0, 0, 0], "{}", results[0]);
    let l = late(&results[1]);
    assert!(l[2] > 0 && l[2] > l[0] + l[1], "the straggler was not the worker left out: {l:?}");
    let (la, lb) = (results[0]["test_loss"].as_f64().unwrap(), results[1]["test_loss"].as_f64().unwrap());
    assert!((a - b).abs() < 0.005 && (la - lb).abs() < 1e-3 * la, "uncoded {a} / {la}, coded {b} / {lb}");
}

#[test]
fn missing_or_corrupt_data_is_refused_with_the_file_named() {
    let d = tempfile::tempdir().unwrap();
    let o = downpour().args(["train", "dnn", "--data", d.path().join("nope").to_str().unwrap()]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("nope"), "{}", String::from_utf8_lossy(&o.stderr));
    // the four files present, one of them not IDX
    for f in ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"] {
        std::fs::copy(sample().join(f), d.path().join(f)).unwrap();
    }
    std::fs::write(d.path().join("t10k-labels-idx1-ubyte.gz"), b"this is not an idx file").unwrap();
    let o = downpour().args(["train", "dnn", "--data", d.path().to_str().unwrap(), "--quiet"]).output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("t10k-labels-idx1-ubyte.gz") && err.contains("not an IDX file"), "{err}");
}
