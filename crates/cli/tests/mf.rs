//! `train mf` end to end on generated ratings of a hidden low-rank model.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

fn downpour() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_downpour"));
    c.env("DOWNPOUR_LOG", "warn");
    c
}

/// Writes ratings `3 + u·v` (rank 3, clipped to 1..5, plus noise) of 200 users × 150 items,
/// about a third of the pairs; every tenth pair to the test file. Returns the test RMSE of
/// predicting the training mean.
fn write_ratings(train: &Path, test: &Path) -> f64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut unit = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let users: Vec<[f64; 3]> = (0..200).map(|_| [unit() * 2.0 - 1.0, unit() * 2.0 - 1.0, unit() * 2.0 - 1.0]).collect();
    let items: Vec<[f64; 3]> = (0..150).map(|_| [unit() * 2.0 - 1.0, unit() * 2.0 - 1.0, unit() * 2.0 - 1.0]).collect();
    let (mut tr, mut te) = (String::from("user,item,rating\n"), String::new());
    let (mut tr_vals, mut te_vals) = (Vec::new(), Vec::new());
    let mut n = 0;
    for (u, pu) in users.iter().enumerate() {
        for (i, qi) in items.iter().enumerate() {
            if unit() > 0.33 {
                continue;
            }
            let r = (3.0 + 1.5 * (pu[0] * qi[0] + pu[1] * qi[1] + pu[2] * qi[2]) + 0.1 * (unit() - 0.5)).clamp(1.0, 5.0);
            n += 1;
            if n % 10 == 0 {
                writeln!(te, "{u},{i},{r:.3}").unwrap();
                te_vals.push(r);
            } else {
                writeln!(tr, "{u},{i},{r:.3}").unwrap();
                tr_vals.push(r);
            }
        }
    }
    std::fs::write(train, tr).unwrap();
    std::fs::write(test, te).unwrap();
    let mean = tr_vals.iter().sum::<f64>() / tr_vals.len() as f64;
    (te_vals.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / te_vals.len() as f64).sqrt()
}

#[test]
fn block_scheduled_mf_learns_a_low_rank_model_under_every_policy_and_exports_it() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out, model) = (d.path().join("tr.csv"), d.path().join("te.csv"), d.path().join("m.json"), d.path().join("mf.safetensors"));
    let baseline = write_ratings(&tr, &te);
    for policy in ["round-robin", "random", "priority"] {
        let o = downpour()
            .args(["train", "mf", "--train", tr.to_str().unwrap(), "--test", te.to_str().unwrap(), "--workers", "2", "--strata", "3"])
            .args(["--factors", "8", "--epochs", "40", "--lr", "0.02", "--policy", policy])
            .args(["--out", out.to_str().unwrap(), "--model-out", model.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let rmse = m["test_rmse"].as_f64().unwrap();
        assert_eq!((m["policy"].as_str(), m["strata"].as_u64()), (Some(policy), Some(3)), "{m}");
        assert_eq!(m["epochs"].as_array().unwrap().len(), 40, "{m}");
        assert!(rmse < 0.5 * baseline, "{policy}: test RMSE {rmse} against the mean's {baseline}");
        // the export holds both sides' ids, factors and biases
        let bytes = std::fs::read(&model).unwrap();
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
        assert_eq!(header["user_factors"]["shape"], serde_json::json!([200, 8]), "{header}");
        assert_eq!(header["item_ids"]["dtype"], "U64", "{header}");
        for t in ["user_bias", "item_factors", "item_bias", "global_mean"] {
            assert!(header.get(t).is_some(), "{t} missing: {header}");
        }
    }
}

fn train_json(args: &[&str], tr: &Path, te: &Path, out: &Path) -> serde_json::Value {
    let o = downpour()
        .args(["train", "mf", "--train", tr.to_str().unwrap(), "--test", te.to_str().unwrap(), "--factors", "8", "--lr", "0.02"])
        .args(args)
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

#[test]
fn stale_copies_under_a_refresh_rule_are_counted_and_every_round_reads_none_stale() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out) = (d.path().join("tr.csv"), d.path().join("te.csv"), d.path().join("m.json"));
    let baseline = write_ratings(&tr, &te);
    let common = ["--workers", "2", "--strata", "4", "--epochs", "30"];
    let fresh = train_json(&[&common[..], &["--refresh", "every-round"]].concat(), &tr, &te, &out);
    assert_eq!((fresh["staleness_max"].as_u64(), fresh["refresh"].as_str()), (Some(0), Some("every-round")), "{fresh}");
    // 30 epochs x 4 rounds x 2 blocks a worker: worker 0 updated 240 blocks
    assert_eq!(fresh["item_reads"].as_u64(), Some(240), "{fresh}");
    for rule in ["every:4", "magnitude"] {
        let m = train_json(&[&common[..], &["--refresh", rule]].concat(), &tr, &te, &out);
        let (reads, pulls) = (m["item_reads"].as_u64().unwrap(), m["item_pulls"].as_u64().unwrap());
        assert!(pulls < fresh["item_pulls"].as_u64().unwrap() && reads == 240, "{rule}: {m}");
        assert!(m["staleness_max"].as_u64().unwrap() >= 1 && m["staleness_mean"].as_f64().unwrap() > 0.0, "{rule}: {m}");
        let rmse = m["test_rmse"].as_f64().unwrap();
        assert!(rmse < 0.5 * baseline, "{rule}: test RMSE {rmse} against the mean's {baseline}");
    }
}

#[test]
fn the_data_parallel_baseline_learns_the_same_model_without_a_schedule() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out) = (d.path().join("tr.csv"), d.path().join("te.csv"), d.path().join("m.json"));
    let baseline = write_ratings(&tr, &te);
    let m = train_json(&["--workers", "2", "--epochs", "40", "--data-parallel", "--batch", "200", "--straggler", "1:2"], &tr, &te, &out);
    assert_eq!((m["schedule"].as_str(), m["straggler"].as_str()), (Some("data-parallel"), Some("1:2")), "{m}");
    let rmse = m["test_rmse"].as_f64().unwrap();
    assert!(rmse < 0.5 * baseline, "test RMSE {rmse} against the mean's {baseline}");
}

#[test]
fn a_bad_ratings_line_is_named_and_a_grid_smaller_than_the_workers_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let tr = d.path().join("r.csv");
    std::fs::write(&tr, "1,2,3\n2,3,4\n3,4,five\n").unwrap();
    let o = downpour().args(["train", "mf", "--train", tr.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("r.csv:3") && err.contains("rating \"five\" is not a number"), "{err}");
    std::fs::write(&tr, "1,2,3\n2,3,4\n").unwrap();
    let o = downpour().args(["train", "mf", "--train", tr.to_str().unwrap(), "--workers", "2", "--strata", "1"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--strata 1") && err.contains("at least one stratum per worker"), "{err}");
    for bad in [["--policy", "fastest"], ["--refresh", "every:0"], ["--straggler", "1"]] {
        let o = downpour().args(["train", "mf", "--train", tr.to_str().unwrap()]).args(bad).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let o = downpour().args(["train", "mf", "--train", tr.to_str().unwrap(), "--straggler", "5:2"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--straggler 5: there are only 2 workers"), "{err}");
}

#[test]
fn a_server_killed_mid_run_of_a_replicated_mf_job_loses_no_update() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te) = (d.path().join("tr.csv"), d.path().join("te.csv"));
    write_ratings(&tr, &te);
    // the schedule is conflict-free and the rating order seeded: with no update lost, the
    // model (and its test RMSE) is the same whatever happened to the servers
    let run = |fault: Option<&str>| {
        let out = d.path().join("m.json");
        let mut c = downpour();
        c.args(["launch", "--servers", "3", "--workers", "2", "--replication", "2"]);
        if let Some(f) = fault {
            c.args(["--fault", f]);
        }
        let o = c
            .args(["--", "train", "mf", "--train", tr.to_str().unwrap(), "--test", te.to_str().unwrap(), "--factors", "8"])
            .args(["--epochs", "300", "--lr", "0.02", "--quiet", "--out", out.to_str().unwrap()])
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&o.stderr).to_string() + &String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{log}");
        let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        (m["test_rmse"].as_f64().unwrap(), m["wall_s"].as_f64().unwrap(), log)
    };
    let (undisturbed, wall, _) = run(None);
    let (killed, _, log) = run(Some("kill server:1 at 1500ms"));
    assert!(log.contains("killed server 1"), "{log}");
    assert!(wall > 2.0, "the run ({wall} s) must outlast the kill");
    assert!((killed - undisturbed).abs() < 1e-6, "test RMSE {killed} with a server killed, {undisturbed} without");
}

#[test]
fn the_model_parallel_experiment_compares_schedules_and_writes_its_results() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out) = (d.path().join("tr.csv"), d.path().join("te.csv"), d.path().join("exp"));
    write_ratings(&tr, &te);
    let o = downpour()
        .args(["experiment", "model-parallel", "--train", tr.to_str().unwrap(), "--test", te.to_str().unwrap(), "--servers", "1"])
        .args(["--schedules", "priority,data-parallel,round-robin@1", "--seeds", "1,2", "--epochs", "8", "--straggler", "1:2"])
        .args(["--out", out.to_str().unwrap(), "--", "--factors", "8", "--lr", "0.02"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let rows = r["schedules"].as_array().unwrap();
    let names: Vec<(&str, u64)> = rows.iter().map(|s| (s["schedule"].as_str().unwrap(), s["workers"].as_u64().unwrap())).collect();
    assert_eq!(names, [("priority", 2), ("data-parallel", 2), ("round-robin", 1)], "{r}");
    let target = r["target_rmse"].as_f64().unwrap();
    for s in rows {
        assert_eq!(s["seeds"].as_array().unwrap().len(), 2, "{s}");
        assert_eq!(s["seeds"][0]["curve"].as_array().unwrap().len(), 8, "{s}");
        // the default target is the median of the runs' best RMSEs: a run whose best is
        // at or below it has a time to it
        for seed in s["seeds"].as_array().unwrap() {
            let best = seed["curve"].as_array().unwrap().iter().map(|p| p[1].as_f64().unwrap()).fold(f64::INFINITY, f64::min);
            assert_eq!(seed["time_to_target_s"].is_number(), best <= target, "{seed} against {target}");
        }
    }
    let md = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert!(md.contains("| priority | 2 |") && md.contains("straggler 1:2"), "{md}");
    assert!(std::fs::read_to_string(out.join("rmse.svg")).unwrap().contains("<svg"));
}

#[test]
fn reading_the_next_block_ahead_gives_the_same_model_as_reading_it_at_use() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out) = (d.path().join("tr.csv"), d.path().join("te.csv"), d.path().join("m.json"));
    write_ratings(&tr, &te);
    // round-robin on twice as many item strata as user strata: with --refresh every-round
    // a worker reads its next block's items during this round; every:1 reads them at use
    let grid = ["--workers", "2", "--strata", "2", "--item-strata", "4", "--epochs", "10"];
    let ahead = train_json(&[&grid[..], &["--refresh", "every-round"]].concat(), &tr, &te, &out);
    let at_use = train_json(&[&grid[..], &["--refresh", "every:1"]].concat(), &tr, &te, &out);
    assert_eq!(ahead["item_strata"].as_u64(), Some(4), "{ahead}");
    assert_eq!((ahead["staleness_max"].as_u64(), at_use["staleness_max"].as_u64()), (Some(0), Some(0)));
    assert_eq!(ahead["test_rmse"], at_use["test_rmse"], "the same model either way: {ahead} {at_use}");
    // the same reads, and one more: the last round reads ahead for a round that never comes
    let pulls = |m: &serde_json::Value| m["item_pulls"].as_u64().unwrap();
    assert_eq!(pulls(&ahead), pulls(&at_use) + 1, "{ahead} {at_use}");
}
