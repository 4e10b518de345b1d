//! `train linear` end to end on generated LIBSVM data with a hidden sparse logistic model.

use std::io::Write;
use std::path::Path;
use std::process::Command;

mod linear_data;
use linear_data::{downpour, metrics, train_logged, write_data};

/// Runs `predict` with `model` on `data` (writing `preds`) and returns the log loss of its
/// probabilities against the file's labels.
fn predict_logloss(model: &Path, data: &Path, preds: &Path) -> f64 {
    let o = downpour()
        .args(["predict", "--model", model.to_str().unwrap(), "--data", data.to_str().unwrap(), "--out", preds.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p: Vec<f64> = std::fs::read_to_string(preds).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    let labels: Vec<bool> = std::fs::read_to_string(data).unwrap().lines().map(|l| l.starts_with('+')).collect();
    assert_eq!(p.len(), labels.len());
    p.iter().zip(&labels).map(|(&p, &y)| -(if y { p } else { 1.0 - p }).clamp(1e-15, 1.0).ln()).sum::<f64>() / p.len() as f64
}

#[test]
fn embedded_training_learns_and_writes_metrics() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out) = (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("m.json"));
    write_data(&tr, 20_000, 1);
    write_data(&te, 4_000, 2);
    let o = downpour()
        .args([
            "train",
            "linear",
            "--train",
            tr.to_str().unwrap(),
            "--test",
            te.to_str().unwrap(),
            "--epochs",
            "2",
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = metrics(&out);
    assert!(m["test_auc"].as_f64().unwrap() > 0.75, "{m}");
    assert!(m["test_logloss"].as_f64().unwrap() < 0.62, "{m}");
    assert_eq!(m["train_examples"], 40_000);
    assert_eq!(m["epochs"].as_array().unwrap().len(), 2);
    for k in ["test_accuracy", "wall_s", "examples_per_s", "bytes_sent", "bytes_received"] {
        assert!(m.get(k).is_some(), "missing {k}");
    }
}

#[test]
fn one_worker_training_is_deterministic() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te) = (d.path().join("tr.svm"), d.path().join("te.svm"));
    write_data(&tr, 5_000, 3);
    write_data(&te, 1_000, 4);
    let run = |out: &Path| {
        let o = downpour()
            .args(["train", "linear", "--workers", "1", "--servers", "2", "--train", tr.to_str().unwrap(), "--test", te.to_str().unwrap()])
            .args(["--out", out.to_str().unwrap(), "--quiet"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        metrics(out)["test_logloss"].as_f64().unwrap()
    };
    assert_eq!(run(&d.path().join("a.json")), run(&d.path().join("b.json")));
}

#[test]
fn multi_process_training_learns() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out) = (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("m.json"));
    write_data(&tr, 20_000, 5);
    write_data(&te, 4_000, 6);
    let o = downpour()
        .args(["launch", "--servers", "2", "--workers", "2", "--", "train", "linear", "--train", tr.to_str().unwrap()])
        .args(["--test", te.to_str().unwrap(), "--epochs", "2", "--out", out.to_str().unwrap(), "--quiet"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = metrics(&out);
    assert!(m["test_auc"].as_f64().unwrap() > 0.75, "{m}");
    // binary features: the scale-free rule would take the plain rule's steps, so the plain
    // rule runs (rows without a maximum)
    assert_eq!(m["rule"], "ftrl", "{m}");
    // The two workers' byte-range shares cover every example exactly once per epoch.
    assert_eq!(m["train_examples"], 40_000, "{m}");
}

#[test]
fn a_corrupt_line_in_the_second_workers_share_is_reported_with_its_exact_line() {
    let d = tempfile::tempdir().unwrap();
    let tr = d.path().join("bad.svm");
    let mut text: String = (0..1000).map(|i| format!("{} {}:1 {}:0.5\n", i % 2, i + 1, i + 2)).collect();
    text.push_str("+1 4:oops\n");
    text.push_str("-1 5:1\n");
    std::fs::write(&tr, text).unwrap();
    let o = downpour()
        .args(["train", "linear", "--workers", "2", "--servers", "1", "--train", tr.to_str().unwrap(), "--quiet"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("{}:1001: feature \"4:oops\"", tr.display())), "{err}");
}

#[test]
fn a_corrupt_training_line_is_reported_with_file_and_line() {
    let d = tempfile::tempdir().unwrap();
    let tr = d.path().join("bad.svm");
    std::fs::write(&tr, "+1 1:1 2:1\n-1 3:1\n+1 4:oops\n").unwrap();
    let o = downpour()
        .args(["train", "linear", "--workers", "1", "--servers", "1", "--train", tr.to_str().unwrap(), "--quiet"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("{}:3:", tr.display())), "{err}");
}

#[test]
fn training_with_a_server_or_a_worker_killed_mid_run_ends_within_0_005_auc_of_an_undisturbed_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spamassassin");
    let d = tempfile::tempdir().unwrap();
    let run = |fault: Option<&str>, name: &str| -> (f64, String) {
        let out = d.path().join(name);
        let mut c = downpour();
        c.args(["launch", "--servers", "3", "--workers", "2", "--replication", "2"]);
        if let Some(f) = fault {
            c.args(["--fault", f]);
        }
        let o = c
            .args(["--", "train", "linear", "--format", "text-jsonl"])
            .args(["--train", root.join("train.jsonl.gz").to_str().unwrap(), "--test", root.join("test.jsonl.gz").to_str().unwrap()])
            // 20 epochs (about 4 s here): with 5 the job could end before the 1.2 s fault
            .args(["--epochs", "20", "--lr", "1", "--quiet", "--out", out.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{fault:?}: {}", String::from_utf8_lossy(&o.stderr));
        (metrics(&out)["test_auc"].as_f64().unwrap(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (calm, _) = run(None, "calm.json");
    let (killed, log) = run(Some("kill server:1 at 1200ms"), "killed.json");
    // the kill landed while the workers were training, and the job recovered from it
    assert!(
        log.contains("killed server 1") && log.contains("removed from the ring: preparing routing epoch 2"),
        "the fault did not land mid-run: {log:?}"
    );
    assert!(calm >= 0.99, "undisturbed test AUC {calm}");
    assert!((calm - killed).abs() <= 0.005, "AUC {killed} with a server killed against {calm}");
    // a killed worker is replaced by a new process that goes on from its last progress record
    let (replaced, log) = run(Some("kill worker:1 at 1200ms"), "worker.json");
    assert!(log.contains("killed worker 1") && log.contains("waits up to 60s for a replacement"), "{log}");
    assert!((calm - replaced).abs() <= 0.005, "AUC {replaced} with a worker killed and replaced against {calm}");
}

/// Replication after aggregation changes where a `bsp` round is applied, not what: a linear
/// run on two copies gives the same model bits as an unreplicated one.
#[test]
fn replicated_bsp_training_gives_the_same_model_bits_as_an_unreplicated_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spamassassin");
    let dir = tempfile::tempdir().unwrap();
    let mut models = Vec::new();
    for k in ["1", "2"] {
        let model = dir.path().join(format!("model-k{k}.bin"));
        let o = downpour()
            .args(["train", "linear", "--replication", k, "--consistency", "bsp", "--format", "text-jsonl", "--quiet"])
            .args(["--train", root.join("train.jsonl.gz").to_str().unwrap(), "--epochs", "1"])
            .args(["--model-out", model.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "K={k}: {err}");
        models.push(std::fs::read(&model).unwrap());
    }
    assert!(!models[0].is_empty());
    assert!(models[0] == models[1], "the replicated bsp run's model differs from the unreplicated one");
}

#[test]
fn multi_process_training_on_the_committed_spam_data_reaches_auc_0_99() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spamassassin");
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m.json");
    let o = downpour()
        .args(["launch", "--servers", "2", "--workers", "2", "--", "train", "linear", "--format", "text-jsonl"])
        .args(["--train", root.join("train.jsonl.gz").to_str().unwrap(), "--test", root.join("test.jsonl.gz").to_str().unwrap()])
        .args(["--epochs", "5", "--lr", "1", "--quiet", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let auc = metrics(&out)["test_auc"].as_f64().unwrap();
    assert!(auc >= 0.99, "test AUC {auc}");
}

#[test]
fn synth_ctr_is_deterministic_and_learnable() {
    let d = tempfile::tempdir().unwrap();
    let gen = |name: &str, n: &str, start: &str| {
        let p = d.path().join(name);
        let o = downpour()
            .args(["data", "synth-ctr", "--examples", n, "--nnz", "20", "--key-space", "20000", "--seed", "9", "--start", start])
            .args(["--out", p.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        p
    };
    let (a, b) = (gen("a.svm", "30000", "0"), gen("b.svm", "30000", "0"));
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let gz = gen("a.svm.gz", "30000", "0");
    assert!(std::fs::metadata(&gz).unwrap().len() < std::fs::metadata(&a).unwrap().len());
    let test = gen("t.svm", "5000", "30000");
    let out = d.path().join("m.json");
    let o = downpour()
        .args(["train", "linear", "--train", gz.to_str().unwrap(), "--test", test.to_str().unwrap(), "--epochs", "2", "--quiet"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // About 0.76 here: 30,000 examples of a 20,000-key space (0.5 is chance).
    assert!(metrics(&out)["test_auc"].as_f64().unwrap() > 0.7);
    let o = downpour()
        .args(["data", "synth-ctr", "--examples", "10", "--nnz", "20", "--key-space", "10", "--out", "/dev/null"])
        .output()
        .unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--key-space"));
}

#[test]
fn predict_with_the_exported_model_equals_training_time_evaluation() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out, model, preds) =
        (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("m.json"), d.path().join("w.safetensors"), d.path().join("p.txt"));
    write_data(&tr, 8_000, 11);
    write_data(&te, 2_000, 12);
    let o = downpour()
        .args(["train", "linear", "--train", tr.to_str().unwrap(), "--test", te.to_str().unwrap(), "--quiet"])
        .args(["--out", out.to_str().unwrap(), "--model-out", model.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // the file is plain safetensors: header length, JSON header naming both tensors
    let bytes = std::fs::read(&model).unwrap();
    let hlen = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + hlen]).unwrap();
    assert_eq!(header["keys"]["dtype"], "U64");
    assert_eq!(header["values"]["dtype"], "F32");
    assert_eq!(header["values"]["shape"][1], 1);
    let ll = predict_logloss(&model, &te, &preds);
    let trained = metrics(&out)["test_logloss"].as_f64().unwrap();
    assert!((ll - trained).abs() < 1e-9, "predict logloss {ll} vs training-time {trained}");
    let o = downpour().args(["predict", "--model", te.to_str().unwrap(), "--data", te.to_str().unwrap()]).output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("not a safetensors file"));
}

#[test]
fn large_feature_values_are_scaled_per_feature_under_a_rule_that_is_not_scale_free_and_the_exported_model_takes_raw_values() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out, model, preds) =
        (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("m.json"), d.path().join("w.safetensors"), d.path().join("p.txt"));
    write_data(&tr, 8_000, 13);
    write_data(&te, 2_000, 14);
    // the same data with every value 200 instead of 1 (raw counts, pixels…)
    for p in [&tr, &te] {
        let s = std::fs::read_to_string(p).unwrap().replace(":1", ":200");
        std::fs::write(p, s).unwrap();
    }
    let o = downpour()
        .env("DOWNPOUR_LOG", "info")
        .args(["train", "linear", "--train", tr.to_str().unwrap(), "--test", te.to_str().unwrap(), "--workers", "1"])
        .args(["--out", out.to_str().unwrap(), "--model-out", model.to_str().unwrap(), "--normalize", "false"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{log}");
    assert!(log.contains("features above 1 are divided by their largest |value|") && log.contains("up to 200"), "{log}");
    let m = metrics(&out);
    assert_eq!(m["algorithm"], "sgd", "{m}");
    assert!(m["test_auc"].as_f64().unwrap() > 0.75, "{m}");
    let ll = predict_logloss(&model, &te, &preds);
    let trained = m["test_logloss"].as_f64().unwrap();
    // w/200 applied to x equals w applied to x/200 up to f32 rounding
    assert!((ll - trained).abs() < 1e-5, "predict logloss {ll} vs training-time {trained}");
    let bad = downpour().args(["train", "linear", "--train", tr.to_str().unwrap(), "--scale", "-3"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2), "{}", String::from_utf8_lossy(&bad.stderr));
}

#[test]
fn mixed_feature_scales_train_well_by_default_and_warn_only_under_a_rule_that_is_not_scale_free() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out, model, preds) =
        (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("m.json"), d.path().join("w.safetensors"), d.path().join("p.txt"));
    write_data(&tr, 8_000, 15);
    write_data(&te, 2_000, 16);
    // tabular columns of very different scales: feature k's values are 1, 40 or 3000
    // depending on k (one step size cannot suit them all)
    for p in [&tr, &te] {
        let s = std::fs::read_to_string(p).unwrap();
        let scaled: String = s
            .lines()
            .map(|l| {
                let mut parts = l.split(' ');
                let mut out = parts.next().unwrap().to_string();
                for kv in parts {
                    let k: u64 = kv.split(':').next().unwrap().parse().unwrap();
                    out.push_str(&format!(" {k}:{}", [1, 40, 3000][(k % 3) as usize]));
                }
                out + "\n"
            })
            .collect();
        std::fs::write(p, scaled).unwrap();
    }
    let train = |extra: &[&str]| train_logged(&tr, &te, &out, &model, 1, extra);
    // the defaults (a file this small: the batch solver, preconditioned) and the streaming
    // learner (scale-free updates on the servers, no scaling) learn it and say nothing
    for (extra, algorithm) in [(&[][..], "lbfgs"), (&["--epochs", "5"][..], "sgd")] {
        let log = train(extra);
        assert!(
            !log.contains("feature scales differ") && !log.contains("worse than predicting") && !log.contains("are divided by"),
            "{log}"
        );
        let m = metrics(&out);
        assert_eq!(m["algorithm"], algorithm, "{m}");
        if algorithm == "sgd" {
            assert_eq!(m["rule"], "ftrl-norm", "{m}");
        }
        assert!(m["test_auc"].as_f64().unwrap() > 0.75, "{m}");
        // the exported weights (and intercept) apply to the raw values
        let ll = predict_logloss(&model, &te, &preds);
        let trained = m["test_logloss"].as_f64().unwrap();
        assert!((ll - trained).abs() < 1e-5, "{algorithm}: predict logloss {ll} vs training-time {trained}");
    }
    // the plain rule on unscaled values: the job warns that the scales differ and that the
    // steps are far too large
    let log = train(&["--normalize", "false", "--scale", "none", "--epochs", "1"]);
    assert!(log.contains("feature scales differ by 3000x") && log.contains("--scale per-feature"), "{log}");
    assert!(log.contains("is worse than predicting the base rate"), "{log}");
    // the plain rule scales each feature by its own largest value (auto), and the exported
    // model divides each weight by its own feature's divisor
    let log = train(&["--normalize", "false"]);
    assert!(!log.contains("feature scales differ") && !log.contains("worse than predicting"), "{log}");
    assert!(log.contains("features above 1 are divided by their largest |value|") && log.contains("up to 3000"), "{log}");
    let m = metrics(&out);
    assert!(m["test_auc"].as_f64().unwrap() > 0.75, "{m}");
    let ll = predict_logloss(&model, &te, &preds);
    let trained = m["test_logloss"].as_f64().unwrap();
    assert!((ll - trained).abs() < 1e-5, "predict logloss {ll} vs training-time {trained}");
}

/// Writes `n` rows of a tabular file: 6 columns, every row fills them all, each column an
/// offset plus a scale times a standard-ish draw (offsets 0 to 5,000, scales 0.01 to 800), the
/// label drawn from σ(Σ w_k z_k) of the draws.
fn write_tabular(path: &Path, n: usize, seed: u64) {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut unit = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let (offset, scale, w) = ([5000.0, 0.5, 30.0, 0.0, 2.0, 100.0], [800.0, 0.01, 5.0, 1.0, 0.3, 60.0], [1.5, -2.0, 1.0, 0.0, -0.5, 0.8]);
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for _ in 0..n {
        // the sum of three uniforms, centred: mean 0, variance 1/4
        let z: Vec<f64> = (0..6).map(|_| (unit() + unit() + unit() - 1.5) * 2.0).collect();
        let p = 1.0 / (1.0 + (-(0..6).map(|k| w[k] * z[k]).sum::<f64>()).exp());
        write!(f, "{}", if unit() < p { "+1" } else { "-1" }).unwrap();
        for k in 0..6 {
            write!(f, " {}:{}", k + 1, offset[k] + scale[k] * z[k]).unwrap();
        }
        writeln!(f).unwrap();
    }
}

#[test]
fn tabular_files_are_standardized_by_default_for_the_batch_solver_and_exported_models_take_raw_values() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out, model, preds) =
        (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("m.json"), d.path().join("w.safetensors"), d.path().join("p.txt"));
    write_tabular(&tr, 3_000, 21);
    write_tabular(&te, 1_000, 22);
    let train = |extra: &[&str]| (train_logged(&tr, &te, &out, &model, 2, extra), metrics(&out));
    let mut auc = std::collections::HashMap::new();
    for (extra, algorithm, scale) in [
        (&[][..], "lbfgs", "standardize"),
        (&["--scale", "none"][..], "lbfgs", "none"),
        (&["--algorithm", "sgd", "--scale", "standardize"][..], "sgd", "standardize"),
    ] {
        let (log, m) = train(extra);
        assert_eq!((m["algorithm"].as_str(), m["scale"].as_str()), (Some(algorithm), Some(scale)), "{m}");
        assert_eq!(log.contains("--scale standardize: 6 dense features centred"), scale == "standardize", "{log}");
        // the exported model, on the raw values (the centring in its intercept), scores the
        // test file as the job did
        let ll = predict_logloss(&model, &te, &preds);
        let trained = m["test_logloss"].as_f64().unwrap();
        assert!((ll - trained).abs() < 2e-4, "{extra:?}: predict logloss {ll} vs training-time {trained}");
        auc.insert(extra.join(" "), m["test_auc"].as_f64().unwrap());
    }
    // standardised, both learn the hidden model; on the raw values the regularised intercept
    // cannot reach the offset of a column in the thousands, and the model is far worse
    assert!(auc[""] > 0.9 && auc["--algorithm sgd --scale standardize"] > 0.9, "{auc:?}");
    assert!(auc["--scale none"] < auc[""] - 0.05, "{auc:?}");
    let bad = downpour().args(["train", "linear", "--train", tr.to_str().unwrap(), "--scale", "zscore"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("standardize"), "{}", String::from_utf8_lossy(&bad.stderr));
}

#[test]
fn bounded_staleness_is_never_exceeded_on_a_live_cluster() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te) = (d.path().join("tr.svm"), d.path().join("te.svm"));
    write_data(&tr, 10_000, 21);
    write_data(&te, 2_000, 22);
    for (model, bound) in [("ssp:2", 2), ("bsp", 0)] {
        let out = d.path().join(format!("{bound}.json"));
        let o = downpour()
            .args(["launch", "--servers", "2", "--workers", "2", "--", "train", "linear", "--train", tr.to_str().unwrap()])
            .args(["--test", te.to_str().unwrap(), "--epochs", "2", "--consistency", model, "--out", out.to_str().unwrap(), "--quiet"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{model}: {}", String::from_utf8_lossy(&o.stderr));
        let m = metrics(&out);
        assert_eq!(m["consistency"], model);
        let hist: Vec<u64> = m["staleness_histogram"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert!(hist.iter().sum::<u64>() > 0, "{model}: no pull reported its staleness");
        assert!(m["staleness_max"].as_u64().unwrap() <= bound, "{model}: {m}");
        assert!(m["test_auc"].as_f64().unwrap() > 0.75, "{model}: {m}");
    }
    let bad = downpour().args(["train", "linear", "--train", tr.to_str().unwrap(), "--consistency", "ssp:x"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("ssp:TAU"), "{}", String::from_utf8_lossy(&bad.stderr));
}

#[test]
fn straggler_flags_are_checked_and_a_straggling_run_still_learns() {
    let d = tempfile::tempdir().unwrap();
    let (tr, out) = (d.path().join("tr.svm"), d.path().join("m.json"));
    write_data(&tr, 4_000, 31);
    let run = |extra: &[&str]| {
        downpour()
            .args(["train", "linear", "--workers", "2", "--servers", "1", "--train", tr.to_str().unwrap(), "--test", tr.to_str().unwrap()])
            .args(["--epochs", "1", "--quiet", "--out", out.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    for bad in [["--straggler", "1"], ["--straggler", "0:0.5"], ["--straggler-tail", "2:3"], ["--straggler-tail", "0.1:x"]] {
        assert_eq!(run(&bad).status.code(), Some(2), "{bad:?}");
    }
    let o = run(&["--straggler", "7:2"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("only 2 workers"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["--straggler", "1:3", "--straggler-tail", "0.05:3", "--consistency", "ssp:1", "--eval-every", "5"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = metrics(&out);
    // worker 0 has about 20 minibatches: evaluations asked for every 5 of them (requests
    // that come while one runs are merged, so at least one runs), and the final one
    let evals = m["evals"].as_array().unwrap();
    assert!(evals.len() >= 2, "{m}");
    assert_eq!(evals.last().unwrap()["test_logloss"], m["test_logloss"], "{m}");
    assert!(evals.windows(2).all(|w| w[0]["wall_s"].as_f64() <= w[1]["wall_s"].as_f64()), "{m}");
    let idle = m["idle_fraction"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&idle), "{m}");
    assert!(m["staleness_max"].as_u64().unwrap() <= 1, "{m}");
}

#[test]
fn epochs_after_the_first_read_the_share_from_memory_and_train_the_same_model() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out) = (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("m.json"));
    write_data(&tr, 20_000, 31);
    write_data(&te, 500, 32);
    // one worker and one server: the run is deterministic, so the two must agree exactly
    let run = |cache: &str| {
        let o = downpour()
            .args(["train", "linear", "--workers", "1", "--servers", "1", "--train", tr.to_str().unwrap(), "--test", te.to_str().unwrap()])
            .args(["--epochs", "3", "--data-cache-mib", cache, "--out", out.to_str().unwrap(), "--quiet"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        metrics(&out)
    };
    let (files, memory, tiny) = (run("0"), run("512"), run("1"));
    assert_eq!(files["epochs_from_memory"], 0, "{files}");
    assert_eq!(memory["epochs_from_memory"], 2, "{memory}");
    // a share over the limit (20,000 examples take about 3 MiB) is read from its files every epoch
    assert_eq!(tiny["epochs_from_memory"], 0, "{tiny}");
    assert_eq!(files["test_logloss"], memory["test_logloss"], "{files} {memory}");
    assert_eq!(files["test_logloss"], tiny["test_logloss"], "{files} {tiny}");
}

#[test]
fn the_ssp_read_cache_answers_rows_locally_and_never_exceeds_the_bound() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out) = (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("m.json"));
    write_data(&tr, 10_000, 23);
    write_data(&te, 2_000, 24);
    // (sgd with a step small enough for reads 3 clocks stale: the cache makes them that stale)
    // (and with the servers' update feeds keeping the rows fresh)
    let feed = ["--optimizer", "sgd", "--normalize", "false", "--lr", "0.02", "--ssp-cache-feed", "true"];
    for rule in [&["--optimizer", "sgd", "--normalize", "false", "--lr", "0.02"][..], &[][..], &feed[..]] {
        let o = downpour()
            .args(["launch", "--servers", "2", "--workers", "2", "--", "train", "linear", "--train", tr.to_str().unwrap()])
            .args(["--test", te.to_str().unwrap(), "--epochs", "2", "--consistency", "ssp:3", "--ssp-cache", "100000"])
            .args(["--out", out.to_str().unwrap(), "--quiet"])
            .args(rule)
            .output()
            .unwrap();
        assert!(o.status.success(), "{rule:?}: {}", String::from_utf8_lossy(&o.stderr));
        let m = metrics(&out);
        let c = &m["ssp_cache"];
        let (read, hit) = (c["rows_read"].as_u64().unwrap(), c["rows_hit"].as_u64().unwrap());
        assert!(hit > 0 && hit < read, "{rule:?}: {m}");
        let fed = rule.contains(&"--ssp-cache-feed");
        assert_eq!(c["feed"].as_bool(), Some(fed), "{rule:?}: {m}");
        assert_eq!(c["feed_answers"].as_u64().unwrap() > 0, fed, "{rule:?}: {m}");
        // every read, local or not, is in the histogram, and none saw more than the bound
        let hist: Vec<u64> = m["staleness_histogram"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert!(hist.iter().sum::<u64>() >= c["reads"].as_u64().unwrap(), "{rule:?}: {m}");
        assert!(m["staleness_max"].as_u64().unwrap() <= 3, "{rule:?}: {m}");
        assert!(m["test_auc"].as_f64().unwrap() > 0.75, "{rule:?}: {m}");
    }
    for (model, said) in [("bsp", "ssp:TAU"), ("ssp:0", "TAU ≥ 1"), ("async", "ssp:TAU")] {
        let o = downpour()
            .args(["train", "linear", "--train", tr.to_str().unwrap(), "--consistency", model, "--ssp-cache", "10", "--quiet"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("--ssp-cache") && err.contains(said), "{model}: {err}");
    }
    let o = downpour()
        .args(["train", "linear", "--train", tr.to_str().unwrap(), "--consistency", "ssp:3", "--ssp-cache-feed", "true", "--quiet"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("give --ssp-cache ROWS"), "{err}");
}

#[test]
fn consistency_experiment_writes_results_that_agree_with_its_plot() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out) = (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("exp"));
    write_data(&tr, 6_000, 41);
    write_data(&te, 1_000, 42);
    let o = downpour()
        .args(["experiment", "consistency", "--train", tr.to_str().unwrap(), "--test", te.to_str().unwrap()])
        .args(["--workers", "2", "--servers", "1", "--models", "bsp,ssp:2,async", "--straggler", "1:3", "--target-logloss", "0.6"])
        .args(["--eval-every", "5", "--out", out.to_str().unwrap(), "--", "--epochs", "2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = metrics(&out.join("results.json"));
    let models = r["models"].as_array().unwrap();
    assert_eq!(models.len(), 3);
    let svg = std::fs::read_to_string(out.join("logloss.svg")).unwrap();
    for (m, bound) in models.iter().zip([Some(0), Some(2), None]) {
        let name = m["model"].as_str().unwrap();
        assert!(svg.contains(name), "the plot has no line labelled {name}");
        match bound {
            Some(b) => assert!(m["staleness_max"].as_u64().unwrap() <= b, "{m}"),
            // async has no bound, but its pulls still report what they saw
            None => assert!(m["staleness_max"].as_u64().is_some(), "{m}"),
        }
        // the time to target is the first point of the curve at or below the target
        let curve = m["curve"].as_array().unwrap();
        let first = curve.iter().find(|p| p[1].as_f64().unwrap() <= 0.6).map(|p| p[0].as_f64().unwrap());
        assert_eq!(m["time_to_target_s"].as_f64(), first, "{m}");
    }
    assert!(std::fs::read_to_string(out.join("results.md")).unwrap().contains("| ssp:2 |"));
    let bad = downpour()
        .args(["experiment", "consistency", "--train", tr.to_str().unwrap(), "--test", te.to_str().unwrap(), "--models", "bsp,sync"])
        .args(["--target-logloss", "0.5", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("sync"), "{}", String::from_utf8_lossy(&bad.stderr));
}

#[test]
fn bsp_training_gives_the_same_model_bits_with_or_without_a_straggler() {
    // Two workers on two servers under bsp: rounds are applied in rank order, so neither the
    // timing nor a straggler changes a single bit of the model (async makes no such promise).
    let d = tempfile::tempdir().unwrap();
    let tr = d.path().join("tr.svm");
    write_data(&tr, 4_000, 51);
    let run = |name: &str, extra: &[&str]| -> Vec<u8> {
        let model = d.path().join(format!("{name}.safetensors"));
        let o = downpour()
            .args(["train", "linear", "--workers", "2", "--servers", "2", "--train", tr.to_str().unwrap(), "--epochs", "2"])
            .args(["--consistency", "bsp", "--batch", "50", "--model-out", model.to_str().unwrap(), "--quiet"])
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(model).unwrap()
    };
    let plain = run("plain", &[]);
    assert!(plain == run("straggler", &["--straggler", "1:3"]), "a straggler changed the bsp model");
    assert!(plain == run("tail", &["--straggler-tail", "0.3:3", "--seed", "1"]), "random slow iterations changed the bsp model");
    // aggregation is deterministic too, and a different computation
    let sum = run("sum", &["--aggregate", "sum"]);
    assert!(sum == run("sum2", &["--straggler", "0:2", "--aggregate", "sum"]), "a straggler changed the aggregated bsp model");
    assert!(sum != plain, "aggregation made no difference");
}

#[test]
fn backup_workers_and_aggregation_need_bsp_and_fewer_backups_than_workers() {
    let d = tempfile::tempdir().unwrap();
    let tr = d.path().join("tr.svm");
    write_data(&tr, 500, 61);
    let run = |extra: &[&str]| {
        downpour().args(["train", "linear", "--workers", "2", "--train", tr.to_str().unwrap(), "--quiet"]).args(extra).output().unwrap()
    };
    for (args, says) in [
        (&["--aggregate", "avg"][..], "--consistency bsp"),
        (&["--backup-workers", "1", "--consistency", "ssp:2"][..], "--consistency bsp"),
        (&["--backup-workers", "2", "--consistency", "bsp"][..], "at least one of the 2 workers"),
        // the scale-free rules' pushed maxima cannot be added up
        (&["--normalize", "true", "--consistency", "bsp", "--aggregate", "sum"][..], "use --normalize false"),
        (&["--algorithm", "lbfgs", "--consistency", "bsp"][..], "--consistency belong to --algorithm sgd"),
        (&["--algorithm", "lbfgs", "--replication", "2", "--servers", "2"][..], "do not run on replicated tables"),
    ] {
        let o = run(args);
        assert!(
            !o.status.success() && String::from_utf8_lossy(&o.stderr).contains(says),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = run(&["--aggregate", "mean"]);
    assert_eq!(o.status.code(), Some(2), "an unknown aggregate is a usage error");
    let out = d.path().join("m.json");
    let o = run(&["--consistency", "bsp", "--aggregate", "avg", "--backup-workers", "1", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = metrics(&out);
    assert_eq!(m["aggregate"], "avg");
    assert_eq!(m["backup_workers"], 1);
    assert!(m["dropped_pushes"].as_u64().is_some(), "{m}");
}

/// The L1 logistic objective λ‖w‖₁ + Σ log(1 + exp(−y⟨w, x⟩)) of `w` (by feature id) on a
/// LIBSVM file.
fn l1_objective(path: &Path, w: &std::collections::HashMap<u64, f64>, lambda: f64) -> f64 {
    let mut loss = 0.0;
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let mut parts = line.split_whitespace();
        let y = if parts.next().unwrap().starts_with('+') { 1.0 } else { -1.0 };
        let m: f64 = parts
            .map(|f| {
                let (k, v) = f.split_once(':').unwrap();
                w.get(&k.parse::<u64>().unwrap()).copied().unwrap_or(0.0) * v.parse::<f64>().unwrap()
            })
            .sum();
        loss += (-y * m).exp().ln_1p();
    }
    loss + lambda * w.values().map(|v| v.abs()).sum::<f64>()
}

/// Reference: accelerated proximal gradient (FISTA) with step 1/L, run to convergence.
fn ista(path: &Path, lambda: f64) -> std::collections::HashMap<u64, f64> {
    let rows: Vec<(f64, Vec<(usize, f64)>)> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut p = l.split_whitespace();
            let y = if p.next().unwrap().starts_with('+') { 1.0 } else { -1.0 };
            (y, p.map(|f| f.split_once(':').map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap())).unwrap()).collect())
        })
        .collect();
    let d = rows.iter().flat_map(|(_, r)| r.iter().map(|(k, _)| *k)).max().unwrap_or(0) + 1;
    let lip: f64 = 0.25 * rows.iter().map(|(_, r)| r.iter().map(|(_, v)| v * v).sum::<f64>()).sum::<f64>();
    let (mut w, mut prev, mut t) = (vec![0f64; d], vec![0f64; d], 1f64);
    for _ in 0..6000 {
        let t_next = (1.0 + (1.0 + 4.0 * t * t).sqrt()) / 2.0;
        let z: Vec<f64> = w.iter().zip(&prev).map(|(a, b)| a + (t - 1.0) / t_next * (a - b)).collect();
        let mut g = vec![0f64; d];
        for (y, r) in &rows {
            let m: f64 = r.iter().map(|(k, v)| z[*k] * v).sum();
            let p = 1.0 / (1.0 + (y * m).exp());
            for (k, v) in r {
                g[*k] -= y * p * v;
            }
        }
        prev = std::mem::take(&mut w);
        w = z
            .iter()
            .zip(&g)
            .map(|(zk, gk)| {
                let x = zk - gk / lip;
                x.signum() * (x.abs() - lambda / lip).max(0.0)
            })
            .collect();
        t = t_next;
    }
    w.into_iter().enumerate().filter(|(_, v)| *v != 0.0).map(|(k, v)| (k as u64, v)).collect()
}

#[test]
fn bpg_reaches_the_l1_logistic_optimum_within_a_tenth_of_a_percent() {
    let d = tempfile::tempdir().unwrap();
    let (tr, out, model) = (d.path().join("tr.svm"), d.path().join("m.json"), d.path().join("w.safetensors"));
    write_data(&tr, 1_500, 71);
    let lambda = 2.0;
    let o = downpour()
        .args(["train", "l1lr", "--algorithm", "bpg", "--train", tr.to_str().unwrap(), "--lambda", "2", "--tau", "2"])
        .args(["--workers", "2", "--servers", "2", "--filters", "keycache,lz4", "--out", out.to_str().unwrap()])
        .args(["--model-out", model.to_str().unwrap(), "--quiet"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = metrics(&out);
    let got = m["objective"].as_f64().unwrap();
    let best = l1_objective(&tr, &ista(&tr, lambda), lambda);
    assert!((got - best).abs() <= 1e-3 * best, "BPG objective {got} vs accelerated proximal gradient {best}");
    // the reported objective is the model's: recompute it from the exported weights
    let st = std::fs::read(&model).unwrap();
    let n = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&st[8..8 + n]).unwrap();
    let data = &st[8 + n..];
    let k_off = header["keys"]["data_offsets"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect::<Vec<_>>();
    let v_off = header["values"]["data_offsets"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect::<Vec<_>>();
    let keys = data[k_off[0]..k_off[1]].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap()));
    let vals = data[v_off[0]..v_off[1]].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64);
    let w: std::collections::HashMap<u64, f64> = keys.zip(vals).collect();
    let again = l1_objective(&tr, &w, lambda);
    assert!((again - got).abs() <= 1e-4 * got, "reported {got}, recomputed {again}");
    assert_eq!(m["nnz"].as_u64().unwrap() as usize, w.len());
    assert!(w.len() < 500, "an L1 solution is sparse: {} weights", w.len());
    // (with TAU > 0 a pass may rise slightly: its gradients used duals up to TAU blocks old;
    // the core test checks the monotone descent at TAU = 0)
    let passes = m["passes"].as_array().unwrap();
    assert!(passes.len() >= 2 && passes.last().unwrap()["objective"].as_f64() < passes[0]["objective"].as_f64(), "{m}");
    let kc = m["filter_traffic"].as_array().unwrap().iter().find(|f| f["filter"] == "key-cache").unwrap();
    assert!(kc["bytes_out"].as_u64() < kc["bytes_in"].as_u64(), "block key lists repeat every pass: {kc}");
}

/// Linear training resumed from a checkpoint taken mid-run goes on from that epoch and
/// minibatch with the checkpointed weights and FTRL state, and ends exactly where an
/// undisturbed run ends (one worker: the same minibatches in the same order, and the
/// checkpoint falls between two epochs, where the pull pipeline restarts anyway).
#[test]
fn linear_training_resumed_from_a_mid_run_checkpoint_ends_like_an_undisturbed_run() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, ck) = (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("ck"));
    write_data(&tr, 5_000, 3);
    write_data(&te, 1_000, 4);
    let run = |out: &Path, resume: Option<&Path>| {
        let mut c = downpour();
        c.env("DOWNPOUR_LOG", "info")
            .args(["--checkpoint-dir", ck.to_str().unwrap(), "--checkpoint-every", "40"])
            .args(["train", "linear", "--workers", "1", "--servers", "2", "--train", tr.to_str().unwrap(), "--test", te.to_str().unwrap()])
            .args(["--epochs", "3", "--batch", "50", "--out", out.to_str().unwrap(), "--quiet"]);
        if let Some(r) = resume {
            c.args(["--resume", r.to_str().unwrap()]);
        }
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{err}");
        (metrics(out)["test_logloss"].as_f64().unwrap(), err)
    };
    let (whole, _) = run(&d.path().join("a.json"), None);
    // 300 minibatches: checkpoints at clocks 40..280, the newest three kept (200, 240, 280)
    let mut kept: Vec<_> = std::fs::read_dir(&ck).unwrap().map(|e| e.unwrap().path()).collect();
    kept.sort();
    assert_eq!(kept.len(), 3, "{kept:?}");
    let (resumed, err) = run(&d.path().join("b.json"), Some(&kept[0]));
    // checkpoint 5 (clock 200) was taken after the last minibatch of epoch 2
    assert!(kept[0].ends_with("ckpt-000005"), "{kept:?}");
    assert!(err.contains("resumes in epoch 2 after 100 minibatches"), "{err}");
    assert!(err.contains("rows restored from the checkpoint"), "{err}");
    assert_eq!(whole, resumed, "test log loss of the undisturbed and the resumed run");
}

#[test]
fn libsvm_files_labelled_1_and_2_train_with_the_larger_label_positive_and_other_labels_are_asked_for() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out, model, preds) =
        (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("m.json"), d.path().join("w.safetensors"), d.path().join("p.txt"));
    write_data(&tr, 3_000, 71);
    write_data(&te, 1_000, 72);
    // the same data labelled as covtype or mushrooms are: 2 for the positive class, 1 else
    for p in [&tr, &te] {
        let s: String = std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| format!("{}\n", l.replacen("+1 ", "2 ", 1).replacen("-1 ", "1 ", 1)))
            .collect();
        std::fs::write(p, s).unwrap();
    }
    let o = downpour()
        .env("DOWNPOUR_LOG", "info")
        .args(["train", "linear", "--train", tr.to_str().unwrap(), "--test", te.to_str().unwrap(), "--workers", "1"])
        .args(["--out", out.to_str().unwrap(), "--model-out", model.to_str().unwrap()])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{log}");
    assert!(log.contains("2 is the positive class"), "{log}");
    let m = metrics(&out);
    assert!(m["test_auc"].as_f64().unwrap() > 0.75, "{m}");
    // predict reads the file too (its probabilities give the training-time log loss, with 2
    // the positive class)
    let o = downpour()
        .args(["predict", "--model", model.to_str().unwrap(), "--data", te.to_str().unwrap(), "--out", preds.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p: Vec<f64> = std::fs::read_to_string(&preds).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    let y: Vec<bool> = std::fs::read_to_string(&te).unwrap().lines().map(|l| l.starts_with("2 ")).collect();
    let ll = p.iter().zip(&y).map(|(&p, &y)| -(if y { p } else { 1.0 - p }).clamp(1e-15, 1.0).ln()).sum::<f64>() / p.len() as f64;
    assert!((ll - m["test_logloss"].as_f64().unwrap()).abs() < 1e-5, "predict logloss {ll} vs {m}");
    // three labels: which one is positive must be said
    let s = std::fs::read_to_string(&tr).unwrap().replacen("\n1 ", "\n3 ", 50);
    std::fs::write(&tr, s).unwrap();
    let o = downpour().args(["train", "linear", "--train", tr.to_str().unwrap(), "--workers", "1", "--quiet"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("the labels 1, 2, 3 are not two classes") && err.contains("--positive-label"), "{err}");
    let o = downpour()
        .args(["train", "linear", "--train", tr.to_str().unwrap(), "--workers", "1", "--quiet", "--positive-label", "2"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Data handed out by the scheduler (`--data-assignment dynamic`): every example is trained
/// exactly once per epoch, the fast worker takes most of the chunks when the other is an
/// 8× straggler, the model is as good as with static shares; and what it cannot do is refused
/// up front with the reason.
#[test]
fn data_handed_out_in_chunks_trains_each_example_once_per_epoch_and_the_fast_worker_takes_more() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (dir.path().join("train.svm"), dir.path().join("test.svm"));
    write_data(&train, 60_000, 1);
    write_data(&test, 5_000, 2);
    let out = dir.path().join("m.json");
    let o = downpour()
        .args(["train", "linear", "--train", train.to_str().unwrap(), "--test", test.to_str().unwrap(), "--algorithm", "sgd"])
        .args(["--epochs", "2", "--servers", "1", "--workers", "2", "--straggler", "1:8", "--data-assignment", "dynamic", "--quiet"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(m["data_assignment"], "dynamic");
    assert_eq!(m["train_examples"], 120_000, "each example once per epoch");
    let (chunks, by0) = (m["chunks"].as_u64().unwrap(), m["chunks_trained_by_worker0"].as_u64().unwrap());
    assert!(chunks >= 8, "{chunks} chunks");
    assert!(by0 > chunks, "worker 0 trained {by0} of the {} chunk trainings: more than half", 2 * chunks);
    assert!(m["test_auc"].as_f64().unwrap() > 0.75, "{m}");
    let refused = |extra: &[&str], why: &str| {
        let o = downpour()
            .args(["train", "linear", "--train", train.to_str().unwrap(), "--algorithm", "sgd", "--data-assignment", "dynamic"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(why), "{extra:?}: {err}");
    };
    refused(&["--consistency", "ssp:2"], "needs --consistency async");
    refused(&["--reader", "inline"], "leave out --reader inline");
    let gz = dir.path().join("train.svm.gz");
    let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
    enc.write_all(&std::fs::read(&train).unwrap()).unwrap();
    enc.finish().unwrap();
    let o = downpour()
        .args(["train", "linear", "--train", gz.to_str().unwrap(), "--algorithm", "sgd", "--data-assignment", "dynamic"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("uncompressed"), "{err}");
}

/// A worker lost in the middle of a chunk (replicated job, no replacement started): its
/// unfinished chunks go back to the board and the other workers train them. The job can
/// only end once the board has every chunk of every epoch trained (the workers' last
/// epoch waits for it); the lost worker's partial chunk is trained again from its start.
#[test]
fn a_lost_workers_unfinished_chunks_go_to_the_other_workers() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (dir.path().join("train.svm"), dir.path().join("test.svm"));
    write_data(&train, 60_000, 3);
    write_data(&test, 5_000, 4);
    let out = dir.path().join("m.json");
    let o = Command::new(env!("CARGO_BIN_EXE_downpour"))
        .args(["launch", "--servers", "2", "--workers", "2", "--replication", "2", "--reassign-after-s", "0.5"])
        .args(["--fault", "lose worker:1 at 1s", "--", "train", "linear", "--train", train.to_str().unwrap(), "--algorithm", "sgd"])
        .args(["--test", test.to_str().unwrap()])
        .args(["--epochs", "6", "--straggler", "1:40", "--data-assignment", "dynamic", "--quiet", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    // launch's second worker process is rank 1 (the straggler, always amid a chunk) unless
    // it registered first; rank 0, fast, spends most of an epoch's end waiting for the
    // straggler's chunk and then holds none to give back
    // (6 epochs: the job runs past the fault at 1 s on a fast day; it takes about 2 s)
    let lost = err.lines().find(|l| l.contains("disconnected before the job finished")).unwrap_or_else(|| panic!("no worker lost: {err}"));
    if lost.contains("worker 1 (node") {
        assert!(err.contains("unfinished chunk(s) of training data go to the other workers"), "{err}");
    } else {
        assert!(lost.contains("worker 0 (node"), "{err}");
    }
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(m["test_auc"].as_f64().unwrap() > 0.75, "{m}");
}
