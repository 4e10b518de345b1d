//! Core hot-path costs without any network: sparse push/pull of 1M sorted random keys into
//! a table that already holds them, requests of the linear job's shape (minibatches of
//! scattered keys; with its default rule, over more rows than the L3 holds), and a dense
//! 16 MiB range push.
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use downpour_core::rule::RuleRegistry;
use downpour_core::table::{Storage, Table, TableDef};
use downpour_core::KeyRange;

fn def(storage: Storage) -> TableDef {
    TableDef { storage, ..TableDef::new(1, "b") }
}

fn bench(c: &mut Criterion) {
    let k = downpour_core::keys::random_sorted_keys(1_000_000, 88172645463325252);
    let v = vec![1f32; k.len()];
    let mut out = vec![0f32; k.len()];
    let mut t = Table::new(def(Storage::Sparse), KeyRange::FULL, &RuleRegistry::new()).unwrap();
    t.push(&k, &v).unwrap();
    let mut g = c.benchmark_group("sparse_1m_keys");
    g.throughput(Throughput::Elements(k.len() as u64));
    g.bench_function("push", |b| b.iter(|| t.push(&k, &v).unwrap()));
    g.bench_function("pull", |b| b.iter(|| t.pull(&k, &mut out).unwrap()));
    // as a server applies a 1M-key push: in chunks of the client's 2 MiB frames
    let per = (2 << 20) / 12;
    g.bench_function("push_in_2mib_chunks", |b| {
        b.iter(|| {
            for (kc, vc) in k.chunks(per).zip(v.chunks(per)) {
                t.push(kc, vc).unwrap();
            }
        })
    });
    g.finish();
    // the linear job's request shape: minibatches of ~2,300 distinct keys scattered over a
    // table of 4M rows (each key's row a cache miss, though 64 requests' rows fit in the L3)
    let big = downpour_core::keys::random_sorted_keys(4_000_000, 7);
    minibatches(c, "sparse_minibatches_of_4m_rows", def(Storage::Sparse), &big, 64);
    // the same shape with `train linear`'s default rule (ftrl-norm: rows of two values and
    // two words of state, 24 bytes with the key) and requests that touch more rows than the
    // L3 holds, as an epoch over 5M keys does
    let lin = TableDef {
        value_len: 2,
        rule: downpour_core::proto::Rule { name: "ftrl-norm".into(), lr: 0.1, ftrl_beta: 1.0, ..Default::default() },
        ..def(Storage::Sparse)
    };
    minibatches(c, "ftrl_norm_minibatches_of_4m_rows", lin, &big, 1024);
    let n = 4 << 20;
    let mut d = Table::new(def(Storage::Dense(KeyRange::new(0, n))), KeyRange::FULL, &RuleRegistry::new()).unwrap();
    let dv = vec![0.5f32; n as usize];
    let mut g = c.benchmark_group("dense_16mib");
    g.throughput(Throughput::Bytes(n * 4));
    g.bench_function("push_range", |b| b.iter(|| d.push_range(0, &dv).unwrap()));
    g.finish();
}

/// The group `name`: pushes and pulls of `n` requests of the linear job's shape (2,300 keys
/// drawn from `big`, sorted and distinct) on a table of `def` that holds every key of `big`.
fn minibatches(c: &mut Criterion, name: &str, def: TableDef, big: &[u64], n: u64) {
    let len = def.value_len;
    let mut t = Table::new(def, KeyRange::FULL, &RuleRegistry::new()).unwrap();
    for ch in big.chunks(1 << 18) {
        t.push(ch, &vec![0.5f32; ch.len() * len]).unwrap();
    }
    let reqs: Vec<Vec<u64>> = (0..n)
        .map(|r| {
            let mut k: Vec<u64> =
                (0..2300u64).map(|i| big[(downpour_core::keys::scramble(r << 32 | i) % big.len() as u64) as usize]).collect();
            k.sort_unstable();
            k.dedup();
            k
        })
        .collect();
    let keys: usize = reqs.iter().map(|r| r.len()).sum();
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(keys as u64));
    let v = vec![0.01f32; 2300 * len];
    let mut out = vec![0f32; 2300 * len];
    g.bench_function("push", |b| b.iter(|| reqs.iter().for_each(|k| t.push(k, &v[..k.len() * len]).unwrap())));
    g.bench_function("pull", |b| b.iter(|| reqs.iter().for_each(|k| t.pull(k, &mut out[..k.len() * len]).unwrap())));
    // as a server meets a worker's minibatches: the pull of minibatch r + 1 comes before the
    // push of minibatch r (whose keys it pulled a minibatch earlier)
    g.bench_function("pull_next_then_push", |b| {
        b.iter(|| {
            for r in 0..reqs.len() - 1 {
                t.pull(&reqs[r + 1], &mut out[..reqs[r + 1].len() * len]).unwrap();
                t.push(&reqs[r], &v[..reqs[r].len() * len]).unwrap();
            }
        })
    });
    // the same with each push at the rows its pull noted (Table::push_at)
    let mut noted = [Vec::new(), Vec::new()];
    g.bench_function("pull_next_then_push_at_noted_rows", |b| {
        b.iter(|| {
            t.pull_noting(&reqs[0], &mut out[..reqs[0].len() * len], &mut noted[0]).unwrap();
            for r in 0..reqs.len() - 1 {
                let (a, b) = noted.split_at_mut(1);
                let (next, cur) = if r % 2 == 0 { (&mut b[0], &a[0]) } else { (&mut a[0], &b[0]) };
                t.pull_noting(&reqs[r + 1], &mut out[..reqs[r + 1].len() * len], next).unwrap();
                t.push_at(&reqs[r], &v[..reqs[r].len() * len], cur).unwrap();
            }
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);
