//! `train lda`: latent Dirichlet allocation by collapsed Gibbs sampling (Griffiths and
//! Steyvers; the PyPI `lda` package's sampler and log-likelihood), model-parallel over the
//! word–topic table as LightLDA and Petuum's STRADS run it.
//!
//! The documents are cut into `blocks` row strata (document `d` in stratum `d mod blocks`)
//! and the vocabulary into `blocks` column strata (by a hash of the word id), so the tokens
//! fall into a `blocks × blocks` grid; row stratum `r`'s documents, their topic assignments
//! and document–topic counts stay on worker `r mod W` for the whole run. Every round the
//! coordinator's block rounds (round-robin: every block once per sweep; the call that asks
//! for the next round is also the round's barrier) give each row a distinct column, so each vocabulary block's word–topic counts are changed by one worker at a time:
//! the worker pulls its block's rows from the servers, resamples the topic of every token of
//! its documents whose word is in the block, and pushes the change of the counts (rule
//! `add`). Only the topic totals (one dense row of `K` counts that every token touches) are
//! shared within a round: each worker reads them at the start of the round and sees the
//! others' changes at the next, a staleness of at most one round, which the job measures
//! (`totals_drift`). `blocks` rounds make a sweep, after which every token was resampled
//! exactly once.
//!
//! Every `ll_every` sweeps the complete log-likelihood `log p(w, z)` is computed exactly as
//! the `lda` package does (its per-document part by the worker holding the document, the
//! word part by worker 0 from the servers' table) and reported per token.

use crate::report::Report;
use crate::rounds::Rounds;
use anyhow::{ensure, Context, Result};
use downpour_core::blocks::{BlockPlan, Policy};
use downpour_core::consistency::Consistency;
use downpour_core::init::{splitmix64, Init, SplitMix};
use downpour_core::keys::scramble;
use downpour_core::proto;
use downpour_core::table::{Storage, TableDef};
use downpour_data::ldac::{read_corpus, read_vocab, Corpus};
use downpour_worker::WorkerSession;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `train lda`'s settings.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct LdaConfig {
    /// The corpus: LDA-C (`N id:count …`, one document per line) or a UCI bag-of-words
    /// `docword` file (three header lines, then `docID wordID count`); gzip read
    /// transparently.
    #[cfg_attr(feature = "cli", arg(long))]
    pub train: PathBuf,
    /// The vocabulary, one word per line (line i is word id i): its length is the
    /// vocabulary's size, and the top words are printed by name.
    #[cfg_attr(feature = "cli", arg(long))]
    pub vocab: Option<PathBuf>,
    /// Topics (K).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 20))]
    pub topics: usize,
    /// Gibbs sweeps over the corpus (the `lda` package's `n_iter`).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 200))]
    pub sweeps: usize,
    /// Dirichlet prior of the document–topic distributions.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.1))]
    pub alpha: f64,
    /// Dirichlet prior of the topic–word distributions.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.01))]
    pub eta: f64,
    /// Strata of documents and of the vocabulary (default: the number of workers; at least
    /// that).
    #[cfg_attr(feature = "cli", arg(long))]
    pub blocks: Option<usize>,
    /// Compute the log-likelihood every N sweeps (and after the last).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10))]
    pub ll_every: usize,
    /// Words printed per topic at the end (0: none).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10))]
    pub top_words: usize,
    /// Seed of the initial topics and the sampler.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// Write the metrics as JSON here.
    #[cfg_attr(feature = "cli", arg(long))]
    pub out: Option<PathBuf>,
    /// Export the model as safetensors: `word_topic` (F32 [vocabulary, K], counts) and
    /// `topic_totals` (F32 \[K\]); alpha and eta in the metadata.
    #[cfg_attr(feature = "cli", arg(long))]
    pub model_out: Option<PathBuf>,
    /// Only the final line.
    #[cfg_attr(feature = "cli", arg(long))]
    pub quiet: bool,
}

impl Default for LdaConfig {
    fn default() -> Self {
        LdaConfig {
            train: PathBuf::new(),
            vocab: None,
            topics: 20,
            sweeps: 200,
            alpha: 0.1,
            eta: 0.01,
            blocks: None,
            ll_every: 10,
            top_words: 10,
            seed: 1,
            out: None,
            model_out: None,
            quiet: false,
        }
    }
}

/// Table ids: word–topic counts (sparse, a row of K per word), topic totals (dense K),
/// log-likelihood parts (dense, one slot per evaluation).
const WORD_TOPIC: u32 = 40;
const TOTALS: u32 = 41;
const LL: u32 = 42;

/// The tokens of one block of this worker: its distinct words (sorted scrambled keys) and,
/// per token, the local document, the word's index in `keys` and the current topic.
#[derive(Default)]
struct Block {
    keys: Vec<u64>,
    doc: Vec<u32>,
    word: Vec<u32>,
    z: Vec<u16>,
}

/// This worker's documents and their tokens.
struct Shard {
    /// Blocks by id (`row · blocks + column`); empty for other workers' rows.
    blocks: Vec<Block>,
    /// Document–topic counts of the local documents (`docs × K`).
    ndz: Vec<i32>,
    /// Tokens per local document.
    nd: Vec<i32>,
}

/// The column stratum of a word.
fn column(word: u32, blocks: usize, seed: u64) -> usize {
    (splitmix64(word as u64 ^ seed.rotate_left(17) ^ 0xC0) % blocks as u64) as usize
}

/// Cuts this worker's documents into blocks and draws every token's initial topic.
fn shard(c: &Corpus, blocks: usize, rank: usize, workers: usize, k: usize, seed: u64) -> Shard {
    let mut out: Vec<Block> = (0..blocks * blocks).map(|_| Block::default()).collect();
    let mine: Vec<usize> = (0..c.docs()).filter(|d| (d % blocks) % workers == rank).collect();
    let mut ndz = vec![0i32; mine.len() * k];
    let mut nd = vec![0i32; mine.len()];
    let mut rng = SplitMix::new(splitmix64(seed ^ 0x1DA) ^ rank as u64);
    // words of each block, as ids, before sorting into keys
    let mut ids: Vec<Vec<u32>> = vec![Vec::new(); blocks * blocks];
    for (local, &d) in mine.iter().enumerate() {
        let row = d % blocks;
        let (words, counts) = c.doc(d);
        for (&w, &n) in words.iter().zip(counts) {
            let b = row * blocks + column(w, blocks, seed);
            for _ in 0..n {
                let z = rng.below(k as u64) as usize;
                out[b].doc.push(local as u32);
                ids[b].push(w);
                out[b].z.push(z as u16);
                ndz[local * k + z] += 1;
                nd[local] += 1;
            }
        }
    }
    for (b, ids) in out.iter_mut().zip(ids) {
        b.keys = ids.iter().map(|&w| scramble(w as u64)).collect();
        b.keys.sort_unstable();
        b.keys.dedup();
        b.word = ids.iter().map(|&w| b.keys.binary_search(&scramble(w as u64)).unwrap_or(0) as u32).collect();
    }
    Shard { blocks: out, ndz, nd }
}

fn check(a: &LdaConfig) -> Result<()> {
    ensure!((1..=u16::MAX as usize).contains(&a.topics), "--topics must be between 1 and 65,535");
    ensure!(a.sweeps >= 1, "--sweeps must be at least 1");
    ensure!(a.ll_every >= 1, "--ll-every must be at least 1");
    ensure!(a.alpha.is_finite() && a.alpha > 0.0, "--alpha must be a positive number");
    ensure!(a.eta.is_finite() && a.eta > 0.0, "--eta must be a positive number");
    Ok(())
}

/// Runs `train lda` on one worker.
pub fn run(a: &LdaConfig, s: &mut WorkerSession, report: &Report) -> Result<()> {
    check(a)?;
    let k = a.topics;
    let blocks = a.blocks.unwrap_or(s.num_workers);
    let mut rounds = Rounds::new(
        BlockPlan { rows: blocks, cols: blocks, workers: s.num_workers, policy: Policy::RoundRobin, seed: a.seed },
        "--blocks",
    )?;
    let corpus = read_corpus(&a.train)?;
    let tokens = corpus.tokens();
    ensure!(tokens > 0, "{}: no token", a.train.display());
    let vocab = a.vocab.as_deref().map(read_vocab).transpose()?;
    let v = match &vocab {
        Some(words) => {
            let bound = corpus.vocab_bound();
            ensure!(
                bound <= words.len(),
                "{}: word id {} is beyond the vocabulary's {} words ({})",
                a.train.display(),
                bound - 1,
                words.len(),
                a.vocab.as_deref().map(Path::display).map(|d| d.to_string()).unwrap_or_default()
            );
            words.len()
        }
        None => corpus.vocab_bound(),
    };
    let evals = a.sweeps.div_ceil(a.ll_every) + 1;
    let add = proto::Rule { name: "add".into(), ..Default::default() };
    s.kv.create_table(TableDef {
        storage: Storage::Sparse,
        value_len: k,
        init: Init::Zeros,
        rule: add.clone(),
        consistency: Consistency::Async,
        ..TableDef::new(WORD_TOPIC, "lda-word-topic")
    })?;
    s.kv.create_table(crate::dnn::table(TOTALS, "lda-topic-totals", k, add.clone(), Consistency::Async))?;
    s.kv.create_table(crate::dnn::table(LL, "lda-loglikelihood", evals, add, Consistency::Async))?;
    s.barrier("lda-start")?;
    let mut sh = shard(&corpus, blocks, s.rank, s.num_workers, k, a.seed);
    // the initial counts
    let mut totals = vec![0f32; k];
    let mut rows = Vec::new();
    for b in &sh.blocks {
        if b.keys.is_empty() {
            continue;
        }
        rows.clear();
        rows.resize(b.keys.len() * k, 0f32);
        for (&w, &z) in b.word.iter().zip(&b.z) {
            rows[w as usize * k + z as usize] += 1.0;
            totals[z as usize] += 1.0;
        }
        let t = s.kv.push(WORD_TOPIC, &b.keys, &rows)?;
        s.kv.wait(t)?;
    }
    let t = s.kv.push_range(TOTALS, 0, &totals)?;
    s.kv.wait(t)?;
    s.barrier("lda-init")?;
    if s.rank == 0 && !a.quiet {
        tracing::info!(
            "train lda: {} documents, {tokens} tokens, {v} words, {k} topics, {blocks}x{blocks} blocks, {} workers",
            corpus.docs(),
            s.num_workers
        );
    }
    let t0 = Instant::now();
    let mut sampler = Sampler::new(k, a.alpha, a.eta * v as f64, a.eta, splitmix64(a.seed ^ 0x5A) ^ s.rank as u64);
    let mut nk = vec![0i32; k];
    let mut local_end = vec![0i32; k];
    let (mut drift, mut rounds_done) = (0f64, 0u64);
    let mut sampling_s = 0f64;
    let mut curve = Vec::new();
    let mut eval = 0usize;
    for sweep in 1..=a.sweeps {
        let ts = Instant::now();
        for _ in 0..blocks {
            let mine = rounds.next(s, &[])?.mine;
            s.kv.pull_range_into(TOTALS, 0, &mut totals)?;
            for (n, &t) in nk.iter_mut().zip(&totals) {
                *n = t as i32;
            }
            if rounds_done > 0 {
                // how far the totals this worker ended the last round with were from the
                // servers' (the other workers' changes of that round)
                drift += nk.iter().zip(&local_end).map(|(a, b)| (a - b).unsigned_abs() as f64).sum::<f64>() / tokens as f64;
            }
            let before = nk.clone();
            for &b in &mine {
                let blk = &mut sh.blocks[b];
                if blk.keys.is_empty() {
                    continue;
                }
                rows.resize(blk.keys.len() * k, 0f32);
                s.kv.pull_into(WORD_TOPIC, &blk.keys, &mut rows)?;
                let delta = sampler.sweep_block(blk, &rows, &mut nk, &mut sh.ndz);
                let t = s.kv.push(WORD_TOPIC, &blk.keys, delta)?;
                s.kv.wait(t)?;
            }
            for (i, t) in totals.iter_mut().enumerate() {
                *t = (nk[i] - before[i]) as f32;
            }
            let t = s.kv.push_range(TOTALS, 0, &totals)?;
            s.kv.wait(t)?;
            local_end.copy_from_slice(&nk);
            rounds_done += 1;
        }
        sampling_s += ts.elapsed().as_secs_f64();
        if sweep % a.ll_every == 0 || sweep == a.sweeps {
            let ll = loglikelihood(s, a, &sh, v, eval)?;
            eval += 1;
            let wall = t0.elapsed().as_secs_f64();
            if let Some(ll) = ll {
                let per_token = ll / tokens as f64;
                if !a.quiet {
                    tracing::info!(
                        "train lda sweep {sweep}/{}: ll_per_token={per_token:.5} s_per_sweep={:.4} wall_s={wall:.2}",
                        a.sweeps,
                        sampling_s / sweep as f64
                    );
                }
                curve.push((sweep, per_token, wall));
            }
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    if s.rank == 0 {
        let (word_topic, totals) = whole_table(s, v, k)?;
        let names = |w: usize| vocab.as_ref().and_then(|v| v.get(w).cloned()).unwrap_or_else(|| w.to_string());
        let top: Vec<Vec<String>> = (0..k)
            .map(|t| {
                let mut order: Vec<usize> = (0..v).filter(|&w| word_topic[w * k + t] > 0.0).collect();
                order.sort_by(|&x, &y| word_topic[y * k + t].total_cmp(&word_topic[x * k + t]).then(x.cmp(&y)));
                order.into_iter().take(a.top_words).map(names).collect()
            })
            .collect();
        if let Some(path) = &a.model_out {
            export(path, &word_topic, &totals, v, a)?;
        }
        let last = curve.last().map(|c| c.1);
        let json = serde_json::json!({
            "algorithm": "lda",
            "topics": k,
            "sweeps": a.sweeps,
            "alpha": a.alpha,
            "eta": a.eta,
            "workers": s.num_workers,
            "blocks": blocks,
            "documents": corpus.docs(),
            "tokens": tokens,
            "vocabulary": v,
            "ll_per_token": last,
            "s_per_sweep": sampling_s / a.sweeps as f64,
            "tokens_per_s": tokens as f64 * a.sweeps as f64 / sampling_s.max(1e-9),
            "totals_drift_mean": if rounds_done > 1 { drift / (rounds_done - 1) as f64 } else { 0.0 },
            "round_wait_s": rounds.waited.as_secs_f64(),
            "wall_s": wall,
            "evals": curve.iter().map(|(sw, l, w)| serde_json::json!({"sweep": sw, "ll_per_token": l, "wall_s": w})).collect::<Vec<_>>(),
            "top_words": top,
        });
        report.metrics("lda", &json);
        if let Some(out) = &a.out {
            std::fs::write(out, serde_json::to_string_pretty(&json)?).with_context(|| format!("cannot write {}", out.display()))?;
        }
        if !a.quiet {
            for (t, words) in top.iter().enumerate().filter(|(_, w)| !w.is_empty()) {
                report.line(&format!("topic {t}: {}", words.join(" ")));
            }
        }
        report.line(&format!(
            "train lda: ll_per_token={} sweeps={} s_per_sweep={:.4} wall_s={wall:.2}",
            last.map(|l| format!("{l:.5}")).unwrap_or_else(|| "n/a".into()),
            a.sweeps,
            sampling_s / a.sweeps as f64
        ));
    }
    s.barrier("lda-done")?;
    Ok(())
}

/// The collapsed Gibbs sampler of one worker: the scratch it reuses between blocks.
struct Sampler {
    k: usize,
    alpha: f64,
    /// `eta · V`.
    eta_sum: f64,
    eta: f64,
    rng: SplitMix,
    /// The block's word–topic counts as integers while sampling.
    nzw: Vec<i32>,
    /// The change of the block's counts, as pushed.
    delta: Vec<f32>,
    /// Cumulative unnormalised topic probabilities of one token.
    cum: Vec<f64>,
}

impl Sampler {
    fn new(k: usize, alpha: f64, eta_sum: f64, eta: f64, seed: u64) -> Self {
        Sampler { k, alpha, eta_sum, eta, rng: SplitMix::new(seed), nzw: Vec::new(), delta: Vec::new(), cum: vec![0.0; k] }
    }

    /// Resamples every token of `blk` given the block's pulled counts `rows`, the topic
    /// totals `nk` and the document–topic counts `ndz` (both updated in place); returns the
    /// change of the block's rows.
    fn sweep_block(&mut self, blk: &mut Block, rows: &[f32], nk: &mut [i32], ndz: &mut [i32]) -> &[f32] {
        let k = self.k;
        self.nzw.clear();
        self.nzw.extend(rows.iter().map(|&x| x as i32));
        for i in 0..blk.z.len() {
            let (d, w, old) = (blk.doc[i] as usize * k, blk.word[i] as usize * k, blk.z[i] as usize);
            self.nzw[w + old] -= 1;
            ndz[d + old] -= 1;
            nk[old] -= 1;
            let mut acc = 0f64;
            for t in 0..k {
                acc += (self.nzw[w + t] as f64 + self.eta) / (nk[t] as f64 + self.eta_sum) * (ndz[d + t] as f64 + self.alpha);
                self.cum[t] = acc;
            }
            let u = self.rng.unit() * acc;
            let new = self.cum.partition_point(|&c| c < u).min(k - 1);
            blk.z[i] = new as u16;
            self.nzw[w + new] += 1;
            ndz[d + new] += 1;
            nk[new] += 1;
        }
        self.delta.clear();
        self.delta.extend(self.nzw.iter().zip(rows).map(|(&n, &r)| n as f32 - r));
        &self.delta
    }
}

/// `ln Γ(x)`.
fn lgamma(x: f64) -> f64 {
    libm::lgamma(x)
}

/// Every worker adds its documents' part of `log p(z)` to slot `eval` of the
/// log-likelihood table; worker 0 adds `log p(w | z)` from the servers' counts and returns
/// the whole (`None` on the other workers).
fn loglikelihood(s: &mut WorkerSession, a: &LdaConfig, sh: &Shard, v: usize, eval: usize) -> Result<Option<f64>> {
    let k = a.topics;
    let (alpha, eta) = (a.alpha, a.eta);
    // every worker's last round of the sweep is pushed
    s.barrier("lda-sweep")?;
    let mut ll = 0f64;
    let (lg_alpha, lg_kalpha) = (lgamma(alpha), lgamma(alpha * k as f64));
    for (d, &n) in sh.nd.iter().enumerate() {
        ll += lg_kalpha - lgamma(alpha * k as f64 + n as f64);
        ll += sh.ndz[d * k..(d + 1) * k].iter().filter(|&&c| c > 0).map(|&c| lgamma(alpha + c as f64) - lg_alpha).sum::<f64>();
    }
    if s.rank == 0 {
        let (word_topic, totals) = whole_table(s, v, k)?;
        let lg_eta = lgamma(eta);
        ll += k as f64 * lgamma(eta * v as f64);
        ll -= totals.iter().map(|&n| lgamma(eta * v as f64 + n as f64)).sum::<f64>();
        ll += word_topic.iter().filter(|&&c| c > 0.0).map(|&c| lgamma(eta + c as f64) - lg_eta).sum::<f64>();
    }
    let t = s.kv.push_range(LL, eval as u64, &[ll as f32])?;
    s.kv.wait(t)?;
    s.barrier("lda-ll")?;
    if s.rank != 0 {
        return Ok(None);
    }
    let mut sum = [0f32];
    s.kv.pull_range_into(LL, eval as u64, &mut sum)?;
    Ok(Some(sum[0] as f64))
}

/// The servers' word–topic counts in word order (`v × k`) and the topic totals.
fn whole_table(s: &mut WorkerSession, v: usize, k: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut keys: Vec<(u64, usize)> = (0..v).map(|w| (scramble(w as u64), w)).collect();
    keys.sort_unstable();
    let sorted: Vec<u64> = keys.iter().map(|p| p.0).collect();
    let mut rows = vec![0f32; v * k];
    s.kv.pull_into(WORD_TOPIC, &sorted, &mut rows)?;
    let mut out = vec![0f32; v * k];
    for (i, &(_, w)) in keys.iter().enumerate() {
        out[w * k..(w + 1) * k].copy_from_slice(&rows[i * k..(i + 1) * k]);
    }
    let mut totals = vec![0f32; k];
    s.kv.pull_range_into(TOTALS, 0, &mut totals)?;
    Ok((out, totals))
}

/// Writes the counts as safetensors.
fn export(path: &Path, word_topic: &[f32], totals: &[f32], v: usize, a: &LdaConfig) -> Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let bytes = |x: &[f32]| x.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let (wt, tt) = (bytes(word_topic), bytes(totals));
    let views = vec![
        ("word_topic", TensorView::new(Dtype::F32, vec![v, a.topics], &wt).context("internal error: the word-topic tensor's shape")?),
        ("topic_totals", TensorView::new(Dtype::F32, vec![a.topics], &tt).context("internal error: the totals tensor's shape")?),
    ];
    let meta = std::collections::HashMap::from([
        ("format".to_string(), "downpour-lda".to_string()),
        ("alpha".to_string(), a.alpha.to_string()),
        ("eta".to_string(), a.eta.to_string()),
    ]);
    safetensors::serialize_to_file(views, Some(meta), path).with_context(|| format!("cannot write {}", path.display()))
}
