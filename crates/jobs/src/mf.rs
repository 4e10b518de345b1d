//! `train mf`: biased matrix factorisation `r̂ = μ + b_u + b_i + p_u · q_i` (L2-regularised,
//! plain SGD as scikit-surprise's SVD), trained model-parallel by a block schedule
//! (Petuum STRADS / DSGD; [`downpour_core::blocks`]).
//!
//! Users and items are cut into `strata` strata each (by a hash of the id), so the ratings
//! fall into a `strata × strata` grid of blocks; block `(r, c)` updates only the factors and
//! biases of user stratum `r` and item stratum `c`. Every round the block scheduler hands
//! each worker blocks no two of which share a stratum, so the workers' updates never touch
//! the same parameters and no update is lost or locked: a worker pulls its block's rows from
//! the servers, runs SGD over the block's ratings, pushes the change (rule `add`) and records
//! the block's update magnitude (the RMS change of its parameters) in a small table on the
//! servers; a barrier ends the round. Every worker runs the same scheduler on the same
//! magnitudes (read back after the barrier) with the same seed, so all agree on the next
//! round without asking anyone. `strata` rounds make an epoch; worker 0 then measures the
//! test RMSE.
//!
//! The factors and biases live on the servers (sparse tables keyed by the scrambled ids);
//! every worker reads the whole training file (ratings files are small beside the model
//! they train; the block a worker gets changes every round).

use crate::report::Report;
use anyhow::{ensure, Context, Result};
use downpour_core::blocks::{BlockScheduler, Policy};
use downpour_core::consistency::Consistency;
use downpour_core::init::{splitmix64, Init};
use downpour_core::keys::{scramble, unscramble};
use downpour_core::proto;
use downpour_core::table::{Storage, TableDef};
use downpour_data::ratings::{read_ratings, Ratings};
use downpour_worker::WorkerSession;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `train mf`'s settings.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct MfConfig {
    /// Training ratings: MovieLens `.inter`, CSV/TSV `user,item,rating[,…]` (header
    /// optional) or `user::item::rating::…`; gzip read transparently.
    #[cfg_attr(feature = "cli", arg(long))]
    pub train: PathBuf,
    /// Test ratings, same formats: test RMSE after every epoch.
    #[cfg_attr(feature = "cli", arg(long))]
    pub test: Option<PathBuf>,
    /// Latent factors per user and item.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 100))]
    pub factors: usize,
    /// Passes over the training ratings.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 20))]
    pub epochs: usize,
    /// SGD step size.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.005))]
    pub lr: f32,
    /// L2 strength on factors and biases.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.02))]
    pub reg: f32,
    /// Standard deviation of the factors' normal initialisation (biases start at 0).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.1))]
    pub init_std: f32,
    /// How each round's blocks are chosen: round-robin (DSGD's strata), random or priority
    /// (by the blocks' last update magnitude).
    #[cfg_attr(feature = "cli", arg(long, default_value = "round-robin", value_parser = parse_policy))]
    pub policy: Policy,
    /// Strata per side of the block grid (default: the number of workers; at least that).
    #[cfg_attr(feature = "cli", arg(long))]
    pub strata: Option<usize>,
    /// Seed of the initialisation, the strata, the schedule and the rating order.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// Write the metrics as JSON here.
    #[cfg_attr(feature = "cli", arg(long))]
    pub out: Option<PathBuf>,
    /// Export the model as safetensors: `user_ids`, `user_factors`, `user_bias`, `item_ids`,
    /// `item_factors`, `item_bias`, `global_mean`.
    #[cfg_attr(feature = "cli", arg(long))]
    pub model_out: Option<PathBuf>,
    /// Only the final line.
    #[cfg_attr(feature = "cli", arg(long))]
    pub quiet: bool,
}

impl Default for MfConfig {
    fn default() -> Self {
        MfConfig {
            train: PathBuf::new(),
            test: None,
            factors: 100,
            epochs: 20,
            lr: 0.005,
            reg: 0.02,
            init_std: 0.1,
            policy: Policy::RoundRobin,
            strata: None,
            seed: 1,
            out: None,
            model_out: None,
            quiet: false,
        }
    }
}

/// Parses `--policy`.
pub fn parse_policy(s: &str) -> Result<Policy, String> {
    s.parse().map_err(|e: downpour_core::blocks::BlockError| e.to_string())
}

/// Table ids: user factors, item factors, user biases, item biases, block magnitudes.
const USERS: u32 = 30;
const ITEMS: u32 = 31;
const USER_BIAS: u32 = 32;
const ITEM_BIAS: u32 = 33;
const MAGNITUDES: u32 = 34;

/// One block's ratings: indices into the training set, and its distinct (scrambled) user and
/// item keys, sorted.
#[derive(Default)]
struct Block {
    ratings: Vec<u32>,
    users: Vec<u64>,
    items: Vec<u64>,
}

/// The stratum of an id.
fn stratum(id: u64, strata: usize, salt: u64) -> usize {
    (splitmix64(id ^ salt) % strata as u64) as usize
}

fn tables(a: &MfConfig) -> Vec<TableDef> {
    let add = proto::Rule { name: "add".into(), ..Default::default() };
    let sparse = |id, name: &str, len, init| TableDef {
        storage: Storage::Sparse,
        value_len: len,
        init,
        rule: add.clone(),
        consistency: Consistency::Async,
        ..TableDef::new(id, name)
    };
    let normal = |salt| Init::Normal { mean: 0.0, std: a.init_std, seed: a.seed ^ salt };
    vec![
        sparse(USERS, "mf-users", a.factors, normal(0x55)),
        sparse(ITEMS, "mf-items", a.factors, normal(0x17)),
        sparse(USER_BIAS, "mf-user-bias", 1, Init::Zeros),
        sparse(ITEM_BIAS, "mf-item-bias", 1, Init::Zeros),
    ]
}

/// Runs `train mf` on one worker.
pub fn run(a: &MfConfig, s: &mut WorkerSession, report: &Report) -> Result<()> {
    ensure!(a.factors >= 1, "--factors must be at least 1");
    ensure!(a.epochs >= 1, "--epochs must be at least 1");
    ensure!(a.lr.is_finite() && a.lr > 0.0, "--lr must be a positive number");
    ensure!(a.reg.is_finite() && a.reg >= 0.0, "--reg must be a non-negative number");
    ensure!(a.init_std.is_finite() && a.init_std >= 0.0, "--init-std must be a non-negative number");
    let strata = a.strata.unwrap_or(s.num_workers);
    let mut sched = BlockScheduler::new(strata, s.num_workers, a.policy, a.seed).map_err(|e| anyhow::anyhow!("--strata {strata}: {e}"))?;
    let train = read_ratings(&a.train)?;
    ensure!(!train.is_empty(), "{}: no rating", a.train.display());
    // only worker 0 evaluates
    let test = if s.rank == 0 { a.test.as_deref().map(read_ratings).transpose()? } else { None };
    let mu = train.mean() as f32;
    let (lo, hi) = train.range();
    let blocks = cut(&train, strata, a.seed);
    let k = a.factors;
    for t in tables(a) {
        s.kv.create_table(t)?;
    }
    s.kv.create_table(crate::dnn::table(
        MAGNITUDES,
        "mf-magnitudes",
        strata * strata,
        proto::Rule { name: "assign".into(), ..Default::default() },
        Consistency::Async,
    ))?;
    s.barrier("mf-start")?;
    if s.rank == 0 && !a.quiet {
        tracing::info!(
            "train mf: {} ratings ({} users, {} items), {k} factors, {strata}x{strata} blocks, policy {}, {} workers",
            train.len(),
            distinct(&train.users),
            distinct(&train.items),
            a.policy,
            s.num_workers
        );
    }
    let t0 = Instant::now();
    let mut epochs = Vec::new();
    let mut rows = Rows::default();
    let mut mags = vec![0f32; strata * strata];
    let mut updates = 0u64;
    for epoch in 1..=a.epochs {
        for _ in 0..strata {
            let mine = sched.next_round().swap_remove(s.rank);
            for &b in &mine {
                let blk = &blocks[b];
                if blk.ratings.is_empty() {
                    continue;
                }
                let m = rows.update(s, a, blk, &train, mu)?;
                updates += blk.ratings.len() as u64;
                let t = s.kv.push_range(MAGNITUDES, b as u64, &[m as f32])?;
                s.kv.wait(t)?;
            }
            s.barrier("mf-round")?;
            s.kv.pull_range_into(MAGNITUDES, 0, &mut mags)?;
            for (b, &m) in mags.iter().enumerate() {
                if m > 0.0 {
                    sched.report(b, m as f64);
                }
            }
        }
        let rmse = match (&test, s.rank) {
            (Some(t), 0) => Some(test_rmse(s, t, &train, k, mu, (lo, hi))?),
            _ => None,
        };
        let wall = t0.elapsed().as_secs_f64();
        if s.rank == 0 && !a.quiet {
            let r = rmse.map(|r| format!(" test_rmse={r:.5}")).unwrap_or_default();
            tracing::info!("train mf epoch {epoch}/{}:{r} wall_s={wall:.2}", a.epochs);
        }
        epochs.push((epoch, rmse, wall));
        s.barrier("mf-epoch")?;
    }
    let wall = t0.elapsed().as_secs_f64();
    if s.rank == 0 {
        if let Some(path) = &a.model_out {
            export(s, path, &train, k, mu)?;
        }
        let last = epochs.last().and_then(|e| e.1);
        let json = serde_json::json!({
            "algorithm": "mf",
            "policy": a.policy.to_string(),
            "strata": strata,
            "factors": k,
            "workers": s.num_workers,
            "train_ratings": train.len(),
            "test_rmse": last,
            "wall_s": wall,
            "updates_per_s": updates as f64 / wall,
            "epochs": epochs.iter().map(|(e, r, w)| serde_json::json!({"epoch": e, "test_rmse": r, "wall_s": w})).collect::<Vec<_>>(),
        });
        report.metrics("mf", &json);
        if let Some(out) = &a.out {
            std::fs::write(out, serde_json::to_string_pretty(&json)?).with_context(|| format!("cannot write {}", out.display()))?;
        }
        report.line(&format!(
            "train mf: test_rmse={} epochs={} wall_s={wall:.2}",
            last.map(|r| format!("{r:.5}")).unwrap_or_else(|| "n/a".into()),
            a.epochs
        ));
    }
    s.barrier("mf-done")?;
    Ok(())
}

fn distinct(ids: &[u64]) -> usize {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len()
}

/// The ratings grouped into the `strata × strata` blocks (each block's ratings in a seeded
/// shuffled order).
fn cut(r: &Ratings, strata: usize, seed: u64) -> Vec<Block> {
    let mut blocks: Vec<Block> = (0..strata * strata).map(|_| Block::default()).collect();
    for i in 0..r.len() {
        let b = stratum(r.users[i], strata, seed ^ 0xA5) * strata + stratum(r.items[i], strata, seed ^ 0x5A);
        blocks[b].ratings.push(i as u32);
    }
    for (n, b) in blocks.iter_mut().enumerate() {
        let mut rng = splitmix64(seed ^ n as u64) | 1;
        for i in (1..b.ratings.len()).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            b.ratings.swap(i, (rng % (i as u64 + 1)) as usize);
        }
        b.users = b.ratings.iter().map(|&i| scramble(r.users[i as usize])).collect();
        b.users.sort_unstable();
        b.users.dedup();
        b.items = b.ratings.iter().map(|&i| scramble(r.items[i as usize])).collect();
        b.items.sort_unstable();
        b.items.dedup();
    }
    blocks
}

/// A block's rows as pulled, and the worker's copy being updated (reused between blocks).
#[derive(Default)]
struct Rows {
    p: Vec<f32>,
    q: Vec<f32>,
    bu: Vec<f32>,
    bi: Vec<f32>,
    p0: Vec<f32>,
    q0: Vec<f32>,
    bu0: Vec<f32>,
    bi0: Vec<f32>,
}

impl Rows {
    /// Pulls block `blk`'s rows, runs one SGD pass over its ratings, pushes the change;
    /// returns the RMS change of its parameters (the block's update magnitude).
    fn update(&mut self, s: &mut WorkerSession, a: &MfConfig, blk: &Block, r: &Ratings, mu: f32) -> Result<f64> {
        let k = a.factors;
        let (nu, ni) = (blk.users.len(), blk.items.len());
        self.p.resize(nu * k, 0.0);
        self.q.resize(ni * k, 0.0);
        self.bu.resize(nu, 0.0);
        self.bi.resize(ni, 0.0);
        s.kv.pull_into(USERS, &blk.users, &mut self.p)?;
        s.kv.pull_into(ITEMS, &blk.items, &mut self.q)?;
        s.kv.pull_into(USER_BIAS, &blk.users, &mut self.bu)?;
        s.kv.pull_into(ITEM_BIAS, &blk.items, &mut self.bi)?;
        self.p0.clone_from(&self.p);
        self.q0.clone_from(&self.q);
        self.bu0.clone_from(&self.bu);
        self.bi0.clone_from(&self.bi);
        let (lr, reg) = (a.lr, a.reg);
        for &i in &blk.ratings {
            let i = i as usize;
            let (Ok(u), Ok(v)) = (blk.users.binary_search(&scramble(r.users[i])), blk.items.binary_search(&scramble(r.items[i]))) else {
                continue;
            };
            let (pu, qi) = (&mut self.p[u * k..(u + 1) * k], &mut self.q[v * k..(v + 1) * k]);
            let dot: f32 = pu.iter().zip(qi.iter()).map(|(x, y)| x * y).sum();
            let err = r.values[i] - (mu + self.bu[u] + self.bi[v] + dot);
            self.bu[u] += lr * (err - reg * self.bu[u]);
            self.bi[v] += lr * (err - reg * self.bi[v]);
            for (x, y) in pu.iter_mut().zip(qi.iter_mut()) {
                let (px, qy) = (*x, *y);
                *x += lr * (err * qy - reg * px);
                *y += lr * (err * px - reg * qy);
            }
        }
        let mut sq = 0f64;
        let mut n = 0usize;
        for (new, old) in [(&mut self.p, &self.p0), (&mut self.q, &self.q0), (&mut self.bu, &self.bu0), (&mut self.bi, &self.bi0)] {
            for (x, o) in new.iter_mut().zip(old.iter()) {
                *x -= o;
                sq += (*x as f64) * (*x as f64);
            }
            n += new.len();
        }
        let ts = [
            s.kv.push(USERS, &blk.users, &self.p)?,
            s.kv.push(ITEMS, &blk.items, &self.q)?,
            s.kv.push(USER_BIAS, &blk.users, &self.bu)?,
            s.kv.push(ITEM_BIAS, &blk.items, &self.bi)?,
        ];
        for t in ts {
            s.kv.wait(t)?;
        }
        Ok((sq / n.max(1) as f64).sqrt())
    }
}

/// The model's rows of the users and items of the training set: sorted scrambled keys and
/// `(factors, bias)` by key.
struct Model {
    users: HashMap<u64, (Vec<f32>, f32)>,
    items: HashMap<u64, (Vec<f32>, f32)>,
}

fn pull_side(s: &mut WorkerSession, ids: &[u64], table: u32, bias: u32, k: usize) -> Result<(Vec<u64>, Vec<f32>, Vec<f32>)> {
    let mut keys: Vec<u64> = ids.iter().map(|&u| scramble(u)).collect();
    keys.sort_unstable();
    keys.dedup();
    let (mut f, mut b) = (vec![0f32; keys.len() * k], vec![0f32; keys.len()]);
    s.kv.pull_into(table, &keys, &mut f)?;
    s.kv.pull_into(bias, &keys, &mut b)?;
    Ok((keys, f, b))
}

fn model(s: &mut WorkerSession, train: &Ratings, k: usize) -> Result<Model> {
    let mut side = |ids: &[u64], t, b| -> Result<HashMap<u64, (Vec<f32>, f32)>> {
        let (keys, f, bias) = pull_side(s, ids, t, b, k)?;
        Ok(keys.iter().enumerate().map(|(j, &key)| (unscramble(key), (f[j * k..(j + 1) * k].to_vec(), bias[j]))).collect())
    };
    Ok(Model { users: side(&train.users, USERS, USER_BIAS)?, items: side(&train.items, ITEMS, ITEM_BIAS)? })
}

/// Test RMSE of the servers' model; predictions clipped to the training ratings' range; a
/// user or item not in the training set contributes nothing (no factors, no bias).
fn test_rmse(s: &mut WorkerSession, test: &Ratings, train: &Ratings, k: usize, mu: f32, (lo, hi): (f32, f32)) -> Result<f64> {
    let m = model(s, train, k)?;
    let mut sq = 0f64;
    for i in 0..test.len() {
        let (u, v) = (m.users.get(&test.users[i]), m.items.get(&test.items[i]));
        let mut pred = mu + u.map_or(0.0, |u| u.1) + v.map_or(0.0, |v| v.1);
        if let (Some(u), Some(v)) = (u, v) {
            pred += u.0.iter().zip(&v.0).map(|(x, y)| x * y).sum::<f32>();
        }
        let e = (pred.clamp(lo, hi) - test.values[i]) as f64;
        sq += e * e;
    }
    Ok((sq / test.len().max(1) as f64).sqrt())
}

/// Writes the model as safetensors (ids sorted).
fn export(s: &mut WorkerSession, path: &Path, train: &Ratings, k: usize, mu: f32) -> Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let m = model(s, train, k)?;
    let side = |h: &HashMap<u64, (Vec<f32>, f32)>| {
        let mut ids: Vec<u64> = h.keys().copied().collect();
        ids.sort_unstable();
        let f: Vec<f32> = ids.iter().flat_map(|i| h[i].0.iter().copied()).collect();
        let b: Vec<f32> = ids.iter().map(|i| h[i].1).collect();
        (ids, f, b)
    };
    let (ui, uf, ub) = side(&m.users);
    let (ii, if_, ib) = side(&m.items);
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let ids = |v: &[u64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let data = [
        ("user_ids", Dtype::U64, vec![ui.len()], ids(&ui)),
        ("user_factors", Dtype::F32, vec![ui.len(), k], bytes(&uf)),
        ("user_bias", Dtype::F32, vec![ui.len()], bytes(&ub)),
        ("item_ids", Dtype::U64, vec![ii.len()], ids(&ii)),
        ("item_factors", Dtype::F32, vec![ii.len(), k], bytes(&if_)),
        ("item_bias", Dtype::F32, vec![ii.len()], bytes(&ib)),
        ("global_mean", Dtype::F32, vec![1], bytes(&[mu])),
    ];
    let mut views = Vec::new();
    for (name, dt, shape, buf) in &data {
        views.push((*name, TensorView::new(*dt, shape.clone(), buf).context("internal error: a model tensor's shape")?));
    }
    let meta = HashMap::from([("format".to_string(), "downpour-mf".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
