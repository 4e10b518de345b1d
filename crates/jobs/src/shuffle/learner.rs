//! A learner: receives its rows, trains on its block, takes part in the averaging.

use super::{create_tables, join, mailbox, rounds_per_epoch, split, Examples, ShuffleConfig, META, META_LEN, PARAMS, STATS, STATS_LEN};
use anyhow::{anyhow, Context, Result};
use downpour_core::init::splitmix64;
use downpour_core::shuffle::{assignment, decode, retains, rows_of, ShuffleSpec};
use downpour_data::libsvm::Labels;
use downpour_data::Example;
use downpour_worker::WorkerSession;
use std::collections::HashMap;

/// What a learner received so far.
#[derive(Default)]
struct Counts {
    messages: u64,
    bytes: u64,
}

pub(super) fn run(a: &ShuffleConfig, s: &mut WorkerSession) -> Result<()> {
    let (n, k) = (s.num_workers - 1, s.rank - 1);
    s.barrier("shuffle-meta")?;
    let mut meta = [0f32; META_LEN];
    s.kv.pull_range_into(META, 0, &mut meta)?;
    let (q, cap) = (meta[0].to_bits() as usize, meta[1].to_bits() as usize);
    let labels = match meta[2].to_bits() {
        0 => Labels::Standard,
        _ => Labels::Positive(f64::from_bits(join(&meta[3..5]))),
    };
    let spec = ShuffleSpec { learners: n, rows: q, cache: a.cache_fraction, seed: a.seed };
    spec.validate()?;
    create_tables(s, cap, a.dim, n)?;
    let mut store: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut counts = Counts::default();
    receive(s, "load", n, k, cap, &mut store, &mut counts)?;
    let mut owner = assignment(&spec, 0);
    let rounds = rounds_per_epoch(spec.max_block(), a.batch, a.local_steps);
    let mut w = vec![0f32; a.dim];
    let mut grad = vec![0f32; a.dim];
    let mut touched: Vec<u32> = Vec::new();
    let (mut ex, mut one) = (Examples::default(), Example::default());
    for epoch in 0..a.epochs as u64 {
        if epoch > 0 && a.shuffle.delivery().is_some() {
            receive(s, &epoch.to_string(), n, k, cap, &mut store, &mut counts)?;
            let new = assignment(&spec, epoch);
            store.retain(|&r, _| retains(&spec, epoch, k, r, true, owner[r as usize] as usize == k, new[r as usize] as usize == k));
            owner = new;
        }
        let mut mine = rows_of(&owner, k);
        let mut state = a.seed ^ splitmix64(epoch << 16 ^ k as u64 ^ 0x4c4f_4341);
        for i in (1..mine.len()).rev() {
            state = splitmix64(state);
            mine.swap(i, (state % (i as u64 + 1)) as usize);
        }
        ex.clear();
        for &r in &mine {
            let bytes = store.get(&r).ok_or_else(|| anyhow!("learner {k}: row {r} of its block was never delivered"))?;
            ex.push_line(bytes, labels, a.dim, &mut one).map_err(|e| anyhow!("learner {k}: row {r} as received: {e}"))?;
        }
        let steps = ex.len().div_ceil(a.batch);
        let mut step = 0;
        for _ in 0..rounds {
            // a bsp pull waits until the rounds before this learner's clock are averaged
            s.kv.pull_range_into(PARAMS, 0, &mut w)?;
            for _ in 0..a.local_steps {
                if step >= steps {
                    break;
                }
                let batch = step * a.batch..((step + 1) * a.batch).min(ex.len());
                sgd_step(&ex, batch, &mut w, &mut grad, &mut touched, a.lr, a.l2);
                step += 1;
            }
            let ts = s.kv.push_range(PARAMS, 0, &w)?;
            s.kv.clock()?;
            s.kv.wait(ts)?;
        }
        // the epoch's last average is applied before the master reads it
        s.kv.pull_range_into(PARAMS, 0, &mut w)?;
        let mut row = [0f32; STATS_LEN];
        row[..2].copy_from_slice(&split(counts.messages));
        row[2..].copy_from_slice(&split(counts.bytes));
        let ts = s.kv.push_range(STATS, (k * STATS_LEN) as u64, &row)?;
        s.kv.wait(ts)?;
        s.barrier(&format!("shuffle-trained-{epoch}"))?;
    }
    s.kv.pause_clock()?;
    s.barrier("shuffle-done")?;
    Ok(())
}

/// Receives the rounds of the shuffle `tag` and stores the rows decoded.
fn receive(
    s: &mut WorkerSession,
    tag: &str,
    n: usize,
    k: usize,
    cap: usize,
    store: &mut HashMap<u32, Vec<u8>>,
    counts: &mut Counts,
) -> Result<()> {
    let before = s.kv.traffic().bytes_received;
    for round in 0.. {
        s.barrier(&format!("shuffle-{tag}-{round}-written"))?;
        let (left, msgs) = mailbox::read_round(s, super::MAILBOX, n, k, cap).with_context(|| format!("learner {k}, shuffle {tag}"))?;
        for m in msgs {
            let i = m.parts.iter().position(|p| p.learner as usize == k).unwrap_or(0);
            let row = m.parts[i].row;
            let bytes = decode(&m.parts, &m.payload, k as u32, m.lens[i] as usize, |r| store.get(&r).map(Vec::as_slice))?;
            store.insert(row, bytes);
            counts.messages += 1;
        }
        s.barrier(&format!("shuffle-{tag}-{round}-read"))?;
        if left == 0 {
            break;
        }
    }
    counts.bytes += s.kv.traffic().bytes_received - before;
    Ok(())
}

/// One SGD step of the mean logistic loss over `batch`, L2 on the features it touches.
fn sgd_step(ex: &Examples, batch: std::ops::Range<usize>, w: &mut [f32], grad: &mut [f32], touched: &mut Vec<u32>, lr: f64, l2: f64) {
    let size = batch.len() as f64;
    touched.clear();
    for i in batch {
        let g = (ex.predict(w, i) - ex.labels[i] as f64) as f32;
        for (key, v) in ex.features(i) {
            grad[key] += g * v;
            touched.push(key as u32);
        }
    }
    touched.sort_unstable();
    touched.dedup();
    for &key in touched.iter() {
        let key = key as usize;
        w[key] -= (lr * (grad[key] as f64 / size + l2 * w[key] as f64)) as f32;
        grad[key] = 0.0;
    }
}
