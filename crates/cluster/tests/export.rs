//! Incremental export on a live cluster: a full export, then deltas of what pushes and
//! eviction changed on two servers, folded together, equal the tables read whole at the end,
//! bit for bit; a delta holds the rows written since the export before and no others.

use downpour_cluster::{EmbeddedCluster, Settings};
use downpour_core::table::{Storage, TableDef};
use downpour_core::KeyRange;
use downpour_jobs::export::{self, ExportConfig, Exporter, Kind};
use std::time::{Duration, Instant};

/// `n` sorted keys spread over the whole key space (both servers' ranges); `from` picks a set.
fn keys(from: u64, n: usize) -> Vec<u64> {
    let mut k: Vec<u64> = (from..).map(|i| downpour_core::keys::scramble(i).min(u64::MAX - 1)).take(n).collect();
    k.sort_unstable();
    k
}

fn push(s: &mut downpour_worker::WorkerSession, table: u32, keys: &[u64], vl: usize, v: f32) {
    let vals: Vec<f32> = keys.iter().enumerate().flat_map(|(i, _)| std::iter::repeat_n(v + i as f32 * 1e-3, vl)).collect();
    let t = s.kv.push(table, keys, &vals).unwrap();
    s.kv.wait(t).unwrap();
}

/// Waits until the lru table's servers trimmed it to its bound (rows read whole stop changing).
fn settled(s: &mut downpour_worker::WorkerSession) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = usize::MAX;
    loop {
        let n = s.kv.pull_range(1, KeyRange::FULL).unwrap().0.len();
        if (n == last && n <= 2 * 150) || Instant::now() > deadline {
            return n;
        }
        last = n;
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_full_export_and_its_deltas_fold_into_the_tables_as_they_stand() {
    let cluster = EmbeddedCluster::start(&Settings::default(), 2, 1).unwrap();
    let mut s = cluster.join().unwrap();
    let sparse = TableDef {
        value_len: 2,
        evict: "lru:150".parse().unwrap(),
        changes: true,
        rule: downpour_core::proto::Rule { name: "sgd".into(), lr: 0.5, ..Default::default() },
        ..TableDef::new(1, "emb")
    };
    let dense = TableDef { storage: Storage::Dense(KeyRange::new(0, 10)), changes: true, ..TableDef::new(2, "bias") };
    s.kv.create_table(sparse.clone()).unwrap();
    s.kv.create_table(dense.clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = ExportConfig { skew: Duration::ZERO, ..ExportConfig::new(dir.path(), Duration::from_secs(3600)) };
    let mut ex = Exporter::open(cfg, &[sparse.clone(), dense.clone()]).unwrap();

    let first = keys(1, 200);
    push(&mut s, 1, &first, 2, 1.0);
    push(&mut s, 2, &[3], 1, 1.0);
    settled(&mut s);
    let e1 = ex.export(&mut s.kv).unwrap();
    assert_eq!(e1.kind, Kind::Full);

    // a later tick: new keys push the coldest rows out
    std::thread::sleep(Duration::from_millis(30));
    let second = keys(10_000, 120);
    push(&mut s, 1, &second, 2, 2.0);
    push(&mut s, 1, &first[..20], 2, 3.0);
    settled(&mut s);
    let e2 = ex.export(&mut s.kv).unwrap();
    assert_eq!(e2.kind, Kind::Delta);
    assert!(e2.evicted > 0, "no evictions exported: {e2:?}");

    // a quiet table exports nothing; a few rows export those rows only
    std::thread::sleep(Duration::from_millis(30));
    push(&mut s, 1, &second[..7], 2, 4.0);
    settled(&mut s);
    let e3 = ex.export(&mut s.kv).unwrap();
    assert_eq!(e3.rows, 7, "{e3:?}");

    let model = export::load(dir.path()).unwrap();
    for (t, vl) in [(1u32, 2usize), (2, 1)] {
        let (k, v) = s.kv.pull_range(t, KeyRange::FULL).unwrap();
        let got = model.tables.iter().find(|x| x.meta.id == t).unwrap();
        assert_eq!(got.meta.value_len, vl);
        assert_eq!(got.rows.keys, k, "table {t}'s keys");
        assert_eq!(
            got.rows.values.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "table {t}'s values"
        );
    }
    // merge writes the same model as one full export
    let out = dir.path().join("merged.safetensors");
    export::merge(dir.path(), &out).unwrap();
    let merged = export::file::read(&out).unwrap();
    assert_eq!(merged.kind, Kind::Full);
    assert_eq!(merged.tables, model.tables);
    s.finish(true, "").unwrap();
    cluster.wait().unwrap();
}

#[test]
fn a_served_model_reads_a_key_it_lacks_as_the_tables_initial_value() {
    use downpour_cluster::serve::{self, ServeConfig};
    use downpour_core::init::Init;
    let cluster = EmbeddedCluster::start(&Settings::default(), 1, 1).unwrap();
    let mut s = cluster.join().unwrap();
    let init = Init::Normal { mean: 0.0, std: 0.05, seed: 42 };
    let def = TableDef { value_len: 3, changes: true, init, ..TableDef::new(7, "emb") };
    s.kv.create_table(def.clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut ex = Exporter::open(ExportConfig::new(dir.path(), Duration::from_secs(3600)), std::slice::from_ref(&def)).unwrap();
    push(&mut s, 7, &keys(1, 50), 3, 1.0);
    ex.export(&mut s.kv).unwrap();
    assert_eq!(export::load(dir.path()).unwrap().tables[0].meta.init.as_deref(), Some("normal:0:0.05:42"));

    let transport = downpour_transport::tcp::TcpTransport::new(Default::default()).unwrap();
    let node = serve::serve(&transport, ServeConfig::new(dir.path(), "127.0.0.1:0")).unwrap();
    let mut c = serve::connect(&transport, node.addr(), Default::default()).unwrap();
    c.use_table(downpour_server::serving::serving_def(7, "emb", 3));
    let absent = u64::MAX - 7;
    let (mut got, mut want) = ([0f32; 3], [0f32; 3]);
    c.pull_into(7, &[absent], &mut got).unwrap();
    init.fill(absent, &mut want);
    assert_eq!(got, want, "the table's initial row, as a training server would create it");
    assert!(want.iter().any(|&x| x != 0.0));
    // and the training cluster agrees
    s.kv.pull_into(7, &[absent], &mut got).unwrap();
    assert_eq!(got, want);
    node.shutdown();
    s.finish(true, "").unwrap();
    cluster.wait().unwrap();
}

#[test]
fn exporting_a_table_that_does_not_track_changes_says_how_to_fix_it() {
    let dir = tempfile::tempdir().unwrap();
    let err = Exporter::open(ExportConfig::new(dir.path(), Duration::from_secs(1)), &[TableDef::new(1, "w")]).err().unwrap().to_string();
    assert!(err.contains("does not track changes"), "{err}");
}

#[test]
fn a_serving_node_answers_the_exported_model_refuses_writes_and_follows_new_deltas() {
    use downpour_cluster::serve::{self, ServeConfig};
    use downpour_server::serving::serving_def;
    let cluster = EmbeddedCluster::start(&Settings::default(), 2, 1).unwrap();
    let mut s = cluster.join().unwrap();
    let def = TableDef { value_len: 4, changes: true, evict: "lru:200".parse().unwrap(), ..TableDef::new(7, "emb") };
    s.kv.create_table(def.clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = ExportConfig { skew: Duration::ZERO, ..ExportConfig::new(dir.path(), Duration::from_secs(3600)) };
    let mut ex = Exporter::open(cfg, std::slice::from_ref(&def)).unwrap();
    let a = keys(1, 300);
    push(&mut s, 7, &a, 4, 1.0);
    ex.export(&mut s.kv).unwrap();

    let transport = downpour_transport::tcp::TcpTransport::new(Default::default()).unwrap();
    let node =
        serve::serve(&transport, ServeConfig { follow_every: Duration::from_millis(50), ..ServeConfig::new(dir.path(), "127.0.0.1:0") })
            .unwrap();
    let mut c = serve::connect(&transport, node.addr(), Default::default()).unwrap();
    c.use_table(serving_def(7, "emb", 4));
    let same = |c: &mut downpour_worker::KvClient| {
        let want = export::load(dir.path()).unwrap();
        let (k, v) = c.pull_range(7, KeyRange::FULL).unwrap();
        assert_eq!(k, want.tables[0].rows.keys);
        assert_eq!(
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.tables[0].rows.values.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        k.len()
    };
    assert_eq!(same(&mut c), 300);
    // a pull of a key not in the model reads 0 and creates nothing; writes are refused
    let mut out = [9f32; 4];
    c.pull_into(7, &[u64::MAX - 5], &mut out).unwrap();
    assert_eq!(out, [0.0; 4]);
    assert_eq!(c.pull_range(7, KeyRange::FULL).unwrap().0.len(), 300);
    let err = c.push(7, &[1], &[1.0; 4]).and_then(|t| c.wait(t)).unwrap_err().to_string();
    assert!(err.contains("read-only serving node"), "{err}");
    let err = c.create_table(TableDef::new(8, "other")).unwrap_err().to_string();
    assert!(err.contains('8'), "{err}");

    // training goes on: new rows and evictions reach the serving node with the next delta
    std::thread::sleep(Duration::from_millis(30));
    let b = keys(50_000, 250);
    push(&mut s, 7, &b, 4, 2.0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.kv.pull_range(7, KeyRange::FULL).unwrap().0.len() > 400 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let e = ex.export(&mut s.kv).unwrap();
    assert!(e.evicted > 0 && e.rows >= 250, "{e:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while node.served().applied.len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(node.served().applied.len(), 2);
    let n = same(&mut c);
    assert_eq!(n, s.kv.pull_range(7, KeyRange::FULL).unwrap().0.len());
    node.shutdown();
    s.finish(true, "").unwrap();
    cluster.wait().unwrap();
}

#[test]
fn an_exporter_beside_the_job_learns_its_tables_and_writes_full_and_delta_exports() {
    use downpour_cluster::exporter::{connect_to_job, export_once};
    let cluster = EmbeddedCluster::start(&Settings::default(), 2, 1).unwrap();
    let mut s = cluster.join().unwrap();
    let tracked = TableDef { value_len: 3, changes: true, ..TableDef::new(4, "emb") };
    s.kv.create_table(tracked.clone()).unwrap();
    s.kv.create_table(TableDef::new(5, "plain")).unwrap();
    let a = keys(1, 100);
    push(&mut s, 4, &a, 3, 1.0);
    push(&mut s, 5, &a, 1, 1.0);

    let t = cluster.transport();
    let (mut kv, defs) = connect_to_job(t.as_ref(), &Settings::default(), cluster.coordinator(), &[]).unwrap();
    assert_eq!(defs.iter().map(|d| (d.id, d.value_len, d.changes)).collect::<Vec<_>>(), vec![(4, 3, true), (5, 1, false)]);
    let dir = tempfile::tempdir().unwrap();
    // a full export reads every table, tracked or not
    let full = export_once(&mut kv, &defs, 0, &dir.path().join("full.st")).unwrap();
    assert_eq!(full.tables.iter().map(|t| t.rows.keys.len()).collect::<Vec<_>>(), vec![100, 100]);
    // a delta reads the tracked one: what changed since
    std::thread::sleep(Duration::from_millis(30));
    let since = downpour_core::changes::wall_ms();
    push(&mut s, 4, &a[..9], 3, 2.0);
    let (mut kv, defs) = connect_to_job(t.as_ref(), &Settings::default(), cluster.coordinator(), &[4]).unwrap();
    let delta = export_once(&mut kv, &defs, since, &dir.path().join("delta.st")).unwrap();
    assert_eq!(delta.tables.len(), 1);
    assert_eq!(delta.tables[0].rows.keys, a[..9].to_vec());
    assert_eq!(export::file::read(&dir.path().join("delta.st")).unwrap(), delta);
    // a delta of a table that does not track changes, and a table that is not there, are named
    let (mut kv, defs) = connect_to_job(t.as_ref(), &Settings::default(), cluster.coordinator(), &[5]).unwrap();
    let err = export_once(&mut kv, &defs, since, &dir.path().join("x.st")).unwrap_err().to_string();
    assert!(err.contains("does not track changes"), "{err}");
    let err = connect_to_job(t.as_ref(), &Settings::default(), cluster.coordinator(), &[9]).err().unwrap().to_string();
    assert!(err.contains("table 9"), "{err}");
    s.finish(true, "").unwrap();
    cluster.wait().unwrap();
}

#[test]
fn full_exports_every_few_deltas_prune_the_old_chain_and_never_reuse_a_file_name() {
    let cluster = EmbeddedCluster::start(&Settings::default(), 1, 1).unwrap();
    let mut s = cluster.join().unwrap();
    let def = TableDef { changes: true, ..TableDef::new(3, "w") };
    s.kv.create_table(def.clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = ExportConfig { skew: Duration::ZERO, full_every: 2, ..ExportConfig::new(dir.path(), Duration::from_secs(3600)) };
    let mut ex = Exporter::open(cfg, std::slice::from_ref(&def)).unwrap();
    let mut kinds = Vec::new();
    for i in 0..8u64 {
        push(&mut s, 3, &keys(100 * i + 1, 10), 1, i as f32);
        kinds.push(ex.export(&mut s.kv).unwrap().kind);
    }
    // full, delta, delta, full, delta, delta, full, delta
    assert_eq!(kinds.iter().filter(|k| **k == Kind::Full).count(), 3, "{kinds:?}");
    let m = ex.manifest().clone();
    // the chain before the previous full export is gone, files and entries
    assert_eq!(m.exports.first().unwrap().kind, Kind::Full);
    assert_eq!(m.exports.len(), 5, "{:?}", m.exports.iter().map(|e| &e.file).collect::<Vec<_>>());
    let mut names: Vec<&String> = m.exports.iter().map(|e| &e.file).collect();
    names.dedup();
    assert_eq!(names.len(), 5);
    assert_eq!(m.exports.last().unwrap().file, "000008-delta.safetensors");
    let on_disk = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "safetensors"))
        .count();
    assert_eq!(on_disk, 5);
    let model = export::load(dir.path()).unwrap();
    assert_eq!(model.tables[0].rows.keys, s.kv.pull_range(3, KeyRange::FULL).unwrap().0);
    s.finish(true, "").unwrap();
    cluster.wait().unwrap();
}
