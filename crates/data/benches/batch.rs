//! Building minibatches (`Batch::from_examples`) of the linear job's shape: 100 examples of
//! 40 features, keys drawn Zipf-like from 2^24 and scrambled as the reader scrambles them
//! (about 2,300 distinct keys a batch); and parsing LIBSVM lines of that shape (synth-ctr's:
//! 40 ids of up to eight digits, no values) and with values.
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use downpour_core::keys::scramble;
use downpour_data::batch::Batch;
use downpour_data::libsvm::parse_bytes;
use downpour_data::Example;

fn bench(c: &mut Criterion) {
    // a deterministic heavy-tailed draw: rank = 2^24 ^ u^4 (many small ranks, a long tail)
    let mut x = 88172645463325252u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let batches: Vec<Vec<Example>> = (0..64)
        .map(|_| {
            (0..100)
                .map(|_| {
                    let keys: Vec<u64> = (0..40)
                        .map(|_| {
                            let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
                            scramble((u.powi(4) * (1u64 << 24) as f64) as u64)
                        })
                        .collect();
                    Example { label: 1.0, values: vec![1.0; keys.len()], keys }
                })
                .collect()
        })
        .collect();
    let mut g = c.benchmark_group("batch");
    g.throughput(Throughput::Elements(64 * 100));
    g.bench_function("from_examples_100x40", |b| b.iter(|| batches.iter().map(|e| Batch::from_examples(e).keys.len()).sum::<usize>()));
    g.finish();
    let line = |e: &Example, values: bool| {
        let mut l = String::from("1");
        for &k in &e.keys {
            // synth-ctr's ids: below 2^24
            let id = k >> 40;
            l += &if values { format!(" {id}:0.25") } else { format!(" {id}") };
        }
        l.into_bytes()
    };
    let mut g = c.benchmark_group("libsvm");
    g.throughput(Throughput::Elements(64 * 100));
    for (name, values) in [("parse_lines_of_40_ids", false), ("parse_lines_of_40_ids_with_values", true)] {
        let lines: Vec<Vec<u8>> = batches.iter().flatten().map(|e| line(e, values)).collect();
        let mut ex = Example::default();
        g.bench_function(name, |b| b.iter(|| lines.iter().map(|l| parse_bytes(l, &mut ex).map_or(0, |_| ex.keys.len())).sum::<usize>()));
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);
