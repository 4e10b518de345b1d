//! Embedding-table features of `train linear` end to end: feature admission, eviction, and
//! incremental export to a served model.

mod linear_data;
use linear_data::{downpour, metrics, train_logged, write_data};
use std::path::Path;

/// Rows of table 10 ("linear") on every server, from an info-level log.
fn linear_rows(log: &str) -> u64 {
    log.match_indices("table 10 \"linear\": ").map(|(i, m)| log[i + m.len()..].split(' ').next().unwrap().parse::<u64>().unwrap()).sum()
}

/// 6,000 training examples in `tr`, each also carrying 4 ids no other example has (24,000
/// rows a table holds without admission or eviction), and 2,000 test examples in `te`
/// (without them), from `seed`.
fn write_data_with_ids_seen_once(tr: &Path, te: &Path, seed: u64) {
    write_data(tr, 6_000, seed);
    write_data(te, 2_000, seed + 1);
    let text = std::fs::read_to_string(tr).unwrap();
    let once: String = text
        .lines()
        .enumerate()
        .map(|(i, l)| format!("{l} {}:1 {}:1 {}:1 {}:1\n", 1000 + 4 * i, 1001 + 4 * i, 1002 + 4 * i, 1003 + 4 * i))
        .collect();
    std::fs::write(tr, once).unwrap();
}

#[test]
fn admission_keeps_features_seen_once_out_of_the_servers_and_still_learns() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out, model) = (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("m.json"), d.path().join("m.st"));
    write_data_with_ids_seen_once(&tr, &te, 31);
    let all = train_logged(&tr, &te, &out, &model, 2, &["--epochs", "1"]);
    let auc_all = metrics(&out)["test_auc"].as_f64().unwrap();
    let admitted = train_logged(&tr, &te, &out, &model, 2, &["--epochs", "1", "--admit", "count:2"]);
    let auc_admitted = metrics(&out)["test_auc"].as_f64().unwrap();
    let (rows_all, rows_admitted) = (linear_rows(&all), linear_rows(&admitted));
    assert!(rows_all >= 24_000 && rows_admitted <= 600, "rows: {rows_all} without admission, {rows_admitted} with");
    assert!(admitted.contains("admission count:2"), "{admitted}");
    assert!((auc_all - auc_admitted).abs() < 0.02, "AUC {auc_all} without admission, {auc_admitted} with");
    for (flags, said) in [(&["--admit", "count:0"][..], "count:N"), (&["--admit", "count:2", "--replication", "2"][..], "replicated")] {
        let o = downpour().args(["train", "linear", "--train", tr.to_str().unwrap(), "--quiet"]).args(flags).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(said), "{flags:?}: {err}");
    }
}

#[test]
fn eviction_bounds_every_servers_rows_and_still_learns() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out, model) = (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("m.json"), d.path().join("m.st"));
    write_data_with_ids_seen_once(&tr, &te, 41);
    let all = train_logged(&tr, &te, &out, &model, 2, &["--epochs", "1"]);
    let auc_all = metrics(&out)["test_auc"].as_f64().unwrap();
    let bounded = train_logged(&tr, &te, &out, &model, 2, &["--epochs", "1", "--evict", "lru:4000"]);
    let auc_bounded = metrics(&out)["test_auc"].as_f64().unwrap();
    let (rows_all, rows_bounded) = (linear_rows(&all), linear_rows(&bounded));
    let servers = bounded.matches("table 10 \"linear\": ").count();
    assert!(servers >= 1 && rows_all >= 24_000, "{servers} servers, {rows_all} rows unbounded");
    // every server dropped rows in the background while the job ran (how close to the bound
    // each stays is measured in docs/benchmarks.md, not timed here)
    let dropped: Vec<u64> = bounded
        .match_indices("eviction lru:4000: ")
        .map(|(i, m)| bounded[i + m.len()..].split(' ').next().unwrap().parse::<u64>().unwrap())
        .collect();
    assert!(dropped.len() == servers && dropped.iter().all(|&n| n > 0), "rows dropped per server: {dropped:?}");
    assert!(rows_bounded < rows_all, "{rows_bounded} rows left of {rows_all}");
    // the 500 ids every example draws from stay: they are the recently used ones (async runs
    // differ by about ±0.005 in AUC between runs alike, and with rows dropped in the
    // background by up to 0.043 on a loaded 2-CPU machine: 0.836 against 0.879 once in 19
    // runs, 0.859 against 0.891 once in 6 with a reader thread; a bound that cost the model
    // its shared ids would fall far lower)
    assert!((auc_all - auc_bounded).abs() < 0.05, "AUC {auc_all} unbounded, {auc_bounded} with lru:4000");
    // two copies of every row on three servers: each head drops rows of the shards it heads
    // and its chain drops them too (the copies compared in downpour-server's tests)
    let replicated =
        train_logged(&tr, &te, &out, &model, 2, &["--epochs", "1", "--evict", "lru:4000", "--servers", "3", "--replication", "2"]);
    let auc_replicated = metrics(&out)["test_auc"].as_f64().unwrap();
    let dropped: Vec<u64> = replicated
        .match_indices("eviction lru:4000: ")
        .map(|(i, m)| replicated[i + m.len()..].split(' ').next().unwrap().parse::<u64>().unwrap())
        .collect();
    assert!(dropped.len() == 3 && dropped.iter().all(|&n| n > 0), "rows dropped per server: {dropped:?}");
    assert!((auc_all - auc_replicated).abs() < 0.03, "AUC {auc_all} unbounded, {auc_replicated} with lru:4000 on two copies");
    for (flags, said) in [
        (&["--evict", "lru:0"][..], "MAX_ROWS"),
        (&["--evict", "ttl:30"][..], "unit"),
        (&["--evict", "ttl:1h", "--replication", "2", "--consistency", "bsp"][..], "bsp"),
        (&["--evict", "memory:64", "--ssp-cache", "1000", "--consistency", "ssp:2"][..], "--ssp-cache"),
    ] {
        let o = downpour().args(["train", "linear", "--train", tr.to_str().unwrap(), "--quiet"]).args(flags).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(said), "{flags:?}: {err}");
    }
}

/// Rows dropped by `policy` on each server, from an info-level log.
fn dropped_rows(log: &str, policy: &str) -> Vec<u64> {
    let tag = format!("eviction {policy}: ");
    log.match_indices(&tag).map(|(i, m)| log[i + m.len()..].split(' ').next().unwrap().parse::<u64>().unwrap()).collect()
}

#[test]
fn eviction_on_two_copies_through_a_server_killed_mid_run_learns_as_well_as_an_undisturbed_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spamassassin");
    let d = tempfile::tempdir().unwrap();
    let run = |fault: Option<&str>, name: &str| -> (f64, String) {
        let out = d.path().join(name);
        let mut c = downpour();
        c.env("DOWNPOUR_LOG", "info").args(["launch", "--servers", "3", "--workers", "2", "--replication", "2"]);
        if let Some(f) = fault {
            c.args(["--fault", f]);
        }
        // rows unused for 150 ms go (an epoch takes about 200 ms here, the text parsed again
        // every epoch: --data-cache-mib 0 keeps the run as long as this timing was set for):
        // hundreds of thousands of drops down the chains while the workers push
        let o = c
            .args(["--", "train", "linear", "--format", "text-jsonl", "--evict", "ttl:150ms", "--data-cache-mib", "0"])
            .args(["--train", root.join("train.jsonl.gz").to_str().unwrap(), "--test", root.join("test.jsonl.gz").to_str().unwrap()])
            .args(["--epochs", "20", "--lr", "1", "--quiet", "--out", out.to_str().unwrap()])
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{fault:?}: {log}");
        (metrics(&out)["test_auc"].as_f64().unwrap(), log)
    };
    let (calm, log) = run(None, "calm.json");
    let dropped = dropped_rows(&log, "ttl:150ms");
    assert!(dropped.len() == 3 && dropped.iter().all(|&n| n > 1000), "rows dropped per server: {dropped:?}");
    let (killed, log) = run(Some("kill server:1 at 1200ms"), "killed.json");
    assert!(log.contains("killed server 1") && log.contains("routing epoch 2 served"), "the fault did not land mid-run: {log}");
    let dropped = dropped_rows(&log, "ttl:150ms");
    assert!(dropped.len() == 2 && dropped.iter().all(|&n| n > 1000), "rows dropped per surviving server: {dropped:?}");
    assert!(calm >= 0.99, "undisturbed test AUC {calm}");
    assert!((calm - killed).abs() <= 0.005, "AUC {killed} with a server killed against {calm}");
}

#[test]
fn an_export_directory_written_while_training_merges_to_the_trained_model_and_is_served() {
    let d = tempfile::tempdir().unwrap();
    let (tr, te, out, model) = (d.path().join("tr.svm"), d.path().join("te.svm"), d.path().join("m.json"), d.path().join("m.st"));
    let (dir, merged) = (d.path().join("exp"), d.path().join("merged.st"));
    write_data_with_ids_seen_once(&tr, &te, 51);
    let log = train_logged(&tr, &te, &out, &model, 2, &["--epochs", "2", "--export-dir", dir.to_str().unwrap(), "--export-every", "50ms"]);
    assert!(log.contains("exported 000001-full.safetensors"), "{log}");
    let o = downpour().args(["export", "show", dir.to_str().unwrap()]).output().unwrap();
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && shown.contains("delta") && shown.contains("table 10 \"linear\""), "{shown}");
    let o = downpour().args(["export", "merge", dir.to_str().unwrap(), "--out", merged.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // the last export is cut after training ended: folded, it is the trained model (the
    // servers' keys are scrambled ids, rows carry w first; --model-out keeps the non-zero w).
    // (Without eviction: a pass may still drop rows between the last export and
    // --model-out; deltas with evictions are checked bit for bit in downpour-cluster.)
    let f = downpour_jobs::export::file::read(&merged).unwrap();
    let t = &f.tables[0];
    let vl = t.meta.value_len;
    let mut got: Vec<(u64, f32)> = t
        .rows
        .keys
        .iter()
        .zip(t.rows.values.chunks_exact(vl))
        .map(|(&k, v)| (downpour_core::keys::unscramble(k), v[0]))
        .filter(|p| p.1 != 0.0)
        .collect();
    got.sort_unstable_by_key(|p| p.0);
    let want = downpour_jobs::model::load(&model).unwrap();
    let got_keys: Vec<u64> = got.iter().map(|p| p.0).collect();
    let first_diff = got_keys.iter().zip(&want.keys).position(|(a, b)| a != b);
    assert!(got_keys == want.keys, "{} keys merged, {} in the model; first difference at {first_diff:?}", got_keys.len(), want.keys.len());
    assert_eq!(got.iter().map(|p| p.1.to_bits()).collect::<Vec<_>>(), want.weights.iter().map(|w| w.to_bits()).collect::<Vec<_>>());
    // `serve` answers the same rows over the wire and refuses pushes
    let mut node = downpour()
        .env("DOWNPOUR_LOG", "info")
        .args(["serve", "--model", dir.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(node.stderr.take().unwrap()));
    let addr = lines.by_ref().map_while(Result::ok).find_map(|l| l.strip_prefix("serving on ").map(str::to_string)).unwrap();
    let transport = downpour_transport::tcp::TcpTransport::new(Default::default()).unwrap();
    let mut c = downpour_cluster::serve::connect(&transport, &addr, Default::default()).unwrap();
    c.use_table(downpour_server::serving::serving_def(t.meta.id, &t.meta.name, vl));
    let some: Vec<u64> = t.rows.keys.iter().step_by(7).copied().collect();
    let mut out = vec![0f32; some.len() * vl];
    c.pull_into(t.meta.id, &some, &mut out).unwrap();
    let want_rows: Vec<f32> = t.rows.keys.iter().zip(t.rows.values.chunks_exact(vl)).step_by(7).flat_map(|(_, v)| v.to_vec()).collect();
    assert_eq!(out, want_rows);
    let refused = c.push(t.meta.id, &some[..1], &vec![1.0; vl]).and_then(|ts| c.wait(ts));
    assert!(refused.unwrap_err().to_string().contains("read-only"));
    let _ = node.kill();
    let _ = node.wait();
    // an export directory that is not one, and a bad period, are named
    let o = downpour().args(["export", "merge", d.path().to_str().unwrap(), "--out", merged.to_str().unwrap()]).output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("manifest.json"));
    let o =
        downpour().args(["train", "linear", "--train", tr.to_str().unwrap(), "--export-dir", "x", "--export-every", "5"]).output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("not a duration"));
}
