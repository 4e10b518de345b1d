//! The master: holds the data, deals it, evaluates the averaged model.

use super::{create_tables, join, mailbox, split, Examples, ShuffleConfig, META, META_LEN, PARAMS, STATS, STATS_LEN};
use crate::report::{Progress, Report};
use anyhow::{anyhow, ensure, Context, Result};
use downpour_apps::metrics;
use downpour_core::shuffle::{assignment, formula, plan, Caches, Message, Part, ShuffleSpec};
use downpour_data::libsvm::{label_values, Labels};
use downpour_data::lines::LineSource;
use downpour_data::Example;
use downpour_worker::WorkerSession;
use mailbox::{Rows, Sent};
use serde_json::json;
use std::path::Path;
use std::time::Instant;

/// The training file's rows, parsed, and its label rule.
struct Data {
    rows: Rows,
    train: Examples,
    labels: Labels,
}

/// Reads a LIBSVM file: every example line kept as bytes (`rows`) and parsed into `ex`.
/// A line that does not parse is an error naming the file and line.
fn read(path: &Path, labels: Labels, dim: usize, mut rows: Option<&mut Rows>, ex: &mut Examples) -> Result<()> {
    let mut src = LineSource::open(path)?;
    let mut one = Example::default();
    while let Some(line) = src.next_line()? {
        match ex.push_line(line, labels, dim, &mut one) {
            Ok(true) => {
                if let Some(rows) = rows.as_deref_mut() {
                    rows.push(line);
                }
            }
            Ok(false) => {}
            Err(what) => return Err(src.error(what).into()),
        }
    }
    Ok(())
}

fn load(a: &ShuffleConfig) -> Result<Data> {
    let seen = label_values(&a.train, usize::MAX)?;
    let labels = Labels::detect(&seen).map_err(|e| anyhow!("{}: {e}", a.train.display()))?;
    let (mut rows, mut train) = (Rows::new(), Examples::default());
    read(&a.train, labels, a.dim, Some(&mut rows), &mut train)?;
    Ok(Data { rows, train, labels })
}

/// Per-shuffle figures.
struct Shuffled {
    sent: Sent,
    expected: f64,
    master_bytes: u64,
    learner_messages: u64,
    learner_bytes: u64,
    seconds: f64,
}

pub(super) fn run(a: &ShuffleConfig, s: &mut WorkerSession, report: &Report) -> Result<()> {
    let n = s.num_workers - 1;
    let d = load(a).context("loading the training data")?;
    let mut test = Examples::default();
    if let Some(path) = &a.test {
        read(path, d.labels, a.dim, None, &mut test).context("loading the test data")?;
    }
    let q = d.rows.len();
    ensure!(q >= n, "{}: {q} examples for {n} learners: every learner needs at least one", a.train.display());
    let spec = ShuffleSpec { learners: n, rows: q, cache: a.cache_fraction, seed: a.seed };
    spec.validate().map_err(|e| anyhow!("--cache-fraction {}: {e}", a.cache_fraction))?;
    let cap = mailbox::capacity(n, &d.rows);
    ensure!(
        cap < u32::MAX as usize,
        "{}: {} bytes of rows need a mailbox of {cap} words, above the 2^32 a round can address",
        a.train.display(),
        d.rows.bytes()
    );
    let mut meta = [0f32; META_LEN];
    meta[0] = f32::from_bits(q as u32);
    meta[1] = f32::from_bits(cap as u32);
    if let Labels::Positive(v) = d.labels {
        meta[2] = f32::from_bits(1);
        meta[3..5].copy_from_slice(&split(v.to_bits()));
    }
    let ts = s.kv.push_range(META, 0, &meta)?;
    s.kv.wait(ts)?;
    s.barrier("shuffle-meta")?;
    create_tables(s, cap, a.dim, n)?;
    // the averaging rounds are the learners': the master is not waited for
    s.kv.pause_clock()?;

    let t0 = Instant::now();
    let mut owner = assignment(&spec, 0);
    let mut caches = Caches::initial(&spec, &owner);
    let mut load = Vec::new();
    for k in 0..n {
        load.extend((0..q as u32).filter(|&r| caches.holds(k, r)).map(|row| Message { parts: vec![Part { learner: k as u32, row }] }));
    }
    let mut seen = vec![(0u64, 0u64); n];
    let mut first = send(s, &spec, cap, &load, &d.rows, "load", load.len() as f64)?;
    let mut progress = Progress::new(report, !a.quiet, "train shuffle");
    let mut w = vec![0f32; a.dim];
    let mut trace = Vec::new();
    let mut last = (f64::NAN, None, f64::NAN);
    let mut prev = Instant::now();
    for epoch in 0..a.epochs as u64 {
        let mut shuffled = None;
        if let (true, Some(delivery)) = (epoch > 0, a.shuffle.delivery()) {
            let new = assignment(&spec, epoch);
            let msgs = plan(&spec, &caches, &new, delivery)?;
            let expected = match delivery {
                downpour_core::shuffle::Delivery::Uncoded => formula::uncoded(&spec),
                downpour_core::shuffle::Delivery::Coded => formula::coded(&spec),
            };
            shuffled = Some(send(s, &spec, cap, &msgs, &d.rows, &epoch.to_string(), expected)?);
            caches.advance(&spec, epoch, &owner, &new);
            owner = new;
        }
        let shuffle_s = shuffled.as_ref().map_or(0.0, |x| x.seconds);
        s.barrier(&format!("shuffle-trained-{epoch}"))?;
        let train_s = prev.elapsed().as_secs_f64() - shuffle_s;
        // the learners' counts since the last epoch: of the load in epoch 0, else of this shuffle
        let (messages, bytes) = learner_counts(s, &mut seen)?;
        if let Some(x) = shuffled.as_mut().or((epoch == 0).then_some(&mut first)) {
            (x.learner_messages, x.learner_bytes) = (messages, bytes);
        }
        s.kv.pull_range_into(PARAMS, 0, &mut w)?;
        let train_loss = loss(&d.train, &w);
        let (test_loss, test_auc, test_acc) = if test.len() > 0 {
            let p: Vec<f64> = (0..test.len()).map(|i| test.predict(&w, i)).collect();
            (metrics::logloss(&p, &test.labels), metrics::auc(&p, &test.labels), metrics::accuracy(&p, &test.labels))
        } else {
            (f64::NAN, None, f64::NAN)
        };
        last = (test_loss, test_auc, train_loss);
        prev = Instant::now();
        progress.update(Some((epoch + 1) as f64 / a.epochs as f64), || {
            format!(
                "epoch {}: train log loss {train_loss:.4}, test log loss {test_loss:.4}, test AUC {:.4}",
                epoch + 1,
                test_auc.unwrap_or(f64::NAN)
            )
        });
        trace.push(json!({
            "epoch": epoch + 1,
            "train_s": train_s,
            "train_logloss": train_loss,
            "test_logloss": finite(test_loss),
            "test_auc": test_auc,
            "test_accuracy": finite(test_acc),
            "shuffle": shuffled.as_ref().map(figures),
        }));
    }
    progress.finish();
    let wall = t0.elapsed().as_secs_f64();
    let shuffles: Vec<&serde_json::Value> = trace.iter().filter_map(|e| e.get("shuffle").filter(|v| !v.is_null())).collect();
    let sum = |key: &str| shuffles.iter().map(|v| v[key].as_f64().unwrap_or(0.0)).sum::<f64>();
    let per = |key: &str| if shuffles.is_empty() { 0.0 } else { sum(key) / shuffles.len() as f64 };
    let json = json!({
        "shuffle": a.shuffle.to_string(),
        "learners": n,
        "rows": q,
        "data_bytes": d.rows.bytes(),
        "cache_fraction": a.cache_fraction,
        "excess_probability": spec.excess(),
        "epochs": a.epochs,
        "batch": a.batch,
        "local_steps": a.local_steps,
        "lr": a.lr,
        "wall_s": wall,
        "load": figures(&first),
        "per_shuffle": {
            "messages": per("messages"),
            "expected_messages": per("expected_messages"),
            "master_bytes": per("master_bytes"),
            "payload_bytes": per("payload_bytes"),
            "learner_bytes": per("learner_bytes"),
            "seconds": per("seconds"),
        },
        "formula": {
            "uncoded": formula::uncoded(&spec),
            "coded": formula::coded(&spec),
            "coded_limit": formula::coded_limit(&spec),
            "per_learner": formula::per_learner(&spec),
        },
        "final": { "train_logloss": last.2, "test_logloss": finite(last.0), "test_auc": last.1 },
        "trace": trace,
    });
    report.metrics("shuffle", &json);
    if let Some(out) = &a.out {
        std::fs::write(out, serde_json::to_string_pretty(&json)?).with_context(|| format!("cannot write {}", out.display()))?;
    }
    report.line(&format!(
        "train shuffle ({}, {n} learners, cache {}): train_logloss={:.5} test_logloss={:.5} test_auc={:.5} messages_per_shuffle={:.0} expected={:.0} master_bytes_per_shuffle={:.0} wall_s={wall:.3}",
        a.shuffle,
        a.cache_fraction,
        last.2,
        last.0,
        last.1.unwrap_or(f64::NAN),
        per("messages"),
        per("expected_messages"),
        per("master_bytes"),
    ));
    s.barrier("shuffle-done")?;
    Ok(())
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

fn figures(x: &Shuffled) -> serde_json::Value {
    json!({
        "messages": x.sent.messages,
        "expected_messages": x.expected,
        "rounds": x.sent.rounds,
        "words": x.sent.words,
        "payload_bytes": x.sent.payload,
        "master_bytes": x.master_bytes,
        "learner_messages": x.learner_messages,
        "learner_bytes": x.learner_bytes,
        "seconds": x.seconds,
    })
}

/// Mean log loss of the training examples under `w`.
fn loss(ex: &Examples, w: &[f32]) -> f64 {
    let p: Vec<f64> = (0..ex.len()).map(|i| ex.predict(w, i)).collect();
    metrics::logloss(&p, &ex.labels)
}

/// Writes `msgs` through the mailbox, round by round (the learners' counts are filled in
/// later, by [`learner_counts`]).
fn send(
    s: &mut WorkerSession,
    spec: &ShuffleSpec,
    cap: usize,
    msgs: &[Message],
    rows: &Rows,
    tag: &str,
    expected: f64,
) -> Result<Shuffled> {
    let t = Instant::now();
    let before = s.kv.traffic().bytes_sent;
    let (rounds, sent) = mailbox::layout(spec.learners, cap, msgs, rows)?;
    for (i, words) in rounds.iter().enumerate() {
        let ts = s.kv.push_range(super::MAILBOX, 0, words)?;
        s.kv.wait(ts)?;
        s.barrier(&format!("shuffle-{tag}-{i}-written"))?;
        s.barrier(&format!("shuffle-{tag}-{i}-read"))?;
    }
    let master_bytes = s.kv.traffic().bytes_sent - before;
    Ok(Shuffled { sent, expected, master_bytes, learner_messages: 0, learner_bytes: 0, seconds: t.elapsed().as_secs_f64() })
}

/// What the learners received since `seen` (their running totals, which it updates): the
/// messages they decoded and the bytes their connections took in, summed.
fn learner_counts(s: &mut WorkerSession, seen: &mut [(u64, u64)]) -> Result<(u64, u64)> {
    let mut buf = vec![0f32; STATS_LEN * seen.len()];
    s.kv.pull_range_into(STATS, 0, &mut buf)?;
    let (mut messages, mut bytes) = (0, 0);
    for (row, old) in buf.chunks(STATS_LEN).zip(seen.iter_mut()) {
        let now = (join(&row[..2]), join(&row[2..]));
        messages += now.0.saturating_sub(old.0);
        bytes += now.1.saturating_sub(old.1);
        *old = now;
    }
    Ok((messages, bytes))
}
