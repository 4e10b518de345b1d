//! `train mf`: biased matrix factorisation `r̂ = μ + b_u + b_i + p_u · q_i` (L2-regularised,
//! plain SGD as scikit-surprise's SVD), trained model-parallel by a block schedule
//! (Petuum STRADS / DSGD; [`downpour_core::blocks`]), or data-parallel as a baseline.
//!
//! Users are cut into `strata` strata and items into `item_strata` (by a hash of the id), so
//! the ratings fall into a `strata × item_strata` grid of blocks; block `(r, c)` updates only
//! the factors and biases of user stratum `r` and item stratum `c`. Every round the
//! coordinator's block rounds ([`downpour_core::blocks::BlockRounds`], policy round-robin,
//! random or priority) hand each worker blocks no two of which share a stratum, so the
//! workers' updates never touch the same parameters and no update is lost or locked; a
//! worker runs SGD over its blocks' ratings, pushes the change (rule `add`), and reports
//! each block's update magnitude (the RMS change of its parameters) with its call for the
//! next round, which is also the round's barrier. `item_strata` rounds make an epoch; worker
//! 0 then measures the test RMSE. Which rows a worker keeps between rounds, when it reads
//! them again (`--refresh`) and reads ahead, is [`grid`]'s business; `--data-parallel`
//! (`data_parallel`) drops the schedule for Downpour-style asynchronous SGD over each
//! worker's share of the ratings.
//!
//! The factors and biases live on the servers (sparse tables keyed by the scrambled ids);
//! every worker reads the whole training file (ratings files are small beside the model
//! they train) and keeps the ratings of its own blocks.

mod data_parallel;
pub mod grid;
mod model;
mod sgd;

use crate::report::Report;
use crate::rounds::Rounds;
use anyhow::{ensure, Context, Result};
use downpour_core::blocks::{BlockPlan, Policy, Refresh};
use downpour_core::consistency::Consistency;
use downpour_core::init::Init;
use downpour_core::proto;
use downpour_core::table::{Storage, TableDef};
use downpour_data::ratings::read_ratings;
use downpour_worker::WorkerSession;
use std::path::PathBuf;
use std::time::{Duration, Instant};

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
    /// User strata: rows of the block grid (default: the number of workers; at least that).
    #[cfg_attr(feature = "cli", arg(long))]
    pub strata: Option<usize>,
    /// Item strata: columns of the block grid, rounds per epoch (default: --strata; at least
    /// that). With at least twice --strata under round-robin and --refresh every-round, a
    /// worker reads its next block's item rows while it trains on this one.
    #[cfg_attr(feature = "cli", arg(long))]
    pub item_strata: Option<usize>,
    /// When a worker reads again the item rows it keeps a copy of: every-round (whenever
    /// another worker changed them: no read is stale), every:N (a stale copy is kept up to
    /// N-1 rounds) or magnitude (once the others' changes since the copy add up to more than
    /// an average block's update).
    #[cfg_attr(feature = "cli", arg(long, default_value = "every-round", value_parser = parse_refresh))]
    pub refresh: Refresh,
    /// No schedule: each worker runs SGD over its own share of the ratings (every W-th) in
    /// minibatches of --batch, pushing changes asynchronously (the baseline of `experiment
    /// model-parallel`).
    #[cfg_attr(feature = "cli", arg(long))]
    pub data_parallel: bool,
    /// Ratings per minibatch under --data-parallel.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1000))]
    pub batch: usize,
    /// Make worker ID a straggler: its computation takes FACTOR times as long (ID:FACTOR).
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::linear::parse_straggler))]
    pub straggler: Option<(usize, f64)>,
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
            item_strata: None,
            refresh: Refresh::EveryRound,
            data_parallel: false,
            batch: 1000,
            straggler: None,
            seed: 1,
            out: None,
            model_out: None,
            quiet: false,
        }
    }
}

/// Parses `--refresh`.
pub fn parse_refresh(s: &str) -> Result<Refresh, String> {
    s.parse().map_err(|e: downpour_core::blocks::BlockError| e.to_string())
}

/// Parses `--policy`.
pub fn parse_policy(s: &str) -> Result<Policy, String> {
    s.parse().map_err(|e: downpour_core::blocks::BlockError| e.to_string())
}

/// Table ids: user factors, item factors, user biases, item biases.
const USERS: u32 = 30;
const ITEMS: u32 = 31;
const USER_BIAS: u32 = 32;
const ITEM_BIAS: u32 = 33;

/// Where a worker's time went.
#[derive(Default)]
struct Timing {
    /// SGD passes (a straggler's included).
    compute: Duration,
    /// Pulls and pushes.
    comm: Duration,
}

impl Timing {
    /// Counts a pass that took `took`; a straggler (`factor` > 1) then sleeps as long again
    /// as `factor` says.
    fn straggle(&mut self, took: Duration, factor: f64) {
        if factor > 1.0 {
            std::thread::sleep(took.mul_f64(factor - 1.0));
        }
        self.compute += took.mul_f64(factor.max(1.0));
    }
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

/// The model-parallel grid or the data-parallel share.
enum Trainer {
    Grid(Box<grid::Grid>),
    Share(Box<data_parallel::Share>),
}

/// Runs `train mf` on one worker.
pub fn run(a: &MfConfig, s: &mut WorkerSession, report: &Report) -> Result<()> {
    ensure!(a.factors >= 1, "--factors must be at least 1");
    ensure!(a.epochs >= 1, "--epochs must be at least 1");
    ensure!(a.batch >= 1, "--batch must be at least 1");
    ensure!(a.lr.is_finite() && a.lr > 0.0, "--lr must be a positive number");
    ensure!(a.reg.is_finite() && a.reg >= 0.0, "--reg must be a non-negative number");
    ensure!(a.init_std.is_finite() && a.init_std >= 0.0, "--init-std must be a non-negative number");
    if let Some((id, _)) = a.straggler {
        ensure!(id < s.num_workers, "--straggler {id}: there are only {} workers (ids 0..{})", s.num_workers, s.num_workers);
    }
    let strata = a.strata.unwrap_or(s.num_workers);
    let cols = a.item_strata.unwrap_or(strata);
    ensure!(a.data_parallel || cols >= strata, "--item-strata {cols}: needs at least --strata ({strata})");
    let plan = BlockPlan { rows: strata, cols, workers: s.num_workers, policy: a.policy, seed: a.seed };
    let rounds = if a.data_parallel { None } else { Some(Rounds::new(plan, "--strata")?) };
    let train = read_ratings(&a.train)?;
    ensure!(!train.is_empty(), "{}: no rating", a.train.display());
    // only worker 0 evaluates
    let test = if s.rank == 0 { a.test.as_deref().map(read_ratings).transpose()? } else { None };
    let mu = train.mean() as f32;
    let range = train.range();
    let k = a.factors;
    for t in tables(a) {
        s.kv.create_table(t)?;
    }
    s.barrier("mf-start")?;
    let mut model = (s.rank == 0).then(|| model::Model::new(&train, test.as_ref(), k));
    if let Some(m) = model.as_ref().filter(|_| !a.quiet) {
        let (users, items) = m.sizes();
        let how = if a.data_parallel {
            format!("data-parallel, minibatches of {}", a.batch)
        } else {
            format!("{strata}x{cols} blocks, policy {}, refresh {}", a.policy, a.refresh)
        };
        tracing::info!("train mf: {} ratings ({users} users, {items} items), {k} factors, {how}, {} workers", train.len(), s.num_workers);
    }
    let step = sgd::Step { k, lr: a.lr, reg: a.reg, mu };
    let slow = a.straggler.filter(|x| x.0 == s.rank).map_or(1.0, |x| x.1);
    let mut trainer = match rounds {
        Some(rounds) => Trainer::Grid(Box::new(grid::Grid::new(s, &train, rounds, a, step)?)),
        None => Trainer::Share(Box::new(data_parallel::Share::new(&train, s.rank, s.num_workers, a.batch, a.seed, step, slow))),
    };
    let updates = train.len() as u64 * a.epochs as u64;
    drop(train);
    let t0 = Instant::now();
    let mut timing = Timing::default();
    let mut eval_time = Duration::ZERO;
    let mut epochs = Vec::new();
    for epoch in 1..=a.epochs {
        match &mut trainer {
            Trainer::Grid(g) => g.epoch(s, &mut timing)?,
            Trainer::Share(sh) => sh.epoch(s, &mut timing)?,
        }
        // every worker's changes of the epoch are on the servers
        s.barrier("mf-epoch")?;
        let te = Instant::now();
        let rmse = match (&mut model, &test) {
            (Some(m), Some(_)) => Some(m.test_rmse(s, mu, range)?),
            _ => None,
        };
        if a.test.is_some() {
            // the others wait for the evaluation, which is left out of the training time
            s.barrier("mf-evaluated")?;
        }
        eval_time += te.elapsed();
        let train_s = (t0.elapsed() - eval_time).as_secs_f64();
        if s.rank == 0 && !a.quiet {
            let r = rmse.map(|r| format!(" test_rmse={r:.5}")).unwrap_or_default();
            tracing::info!("train mf epoch {epoch}/{}:{r} train_s={train_s:.2}", a.epochs);
        }
        epochs.push((epoch, rmse, train_s));
    }
    let wall = t0.elapsed().as_secs_f64();
    let train_s = (t0.elapsed() - eval_time).as_secs_f64();
    if let Some(m) = &mut model {
        if let Some(path) = &a.model_out {
            m.export(s, path, mu)?;
        }
        let last = epochs.last().and_then(|e| e.1);
        let (waited, reads) = match &trainer {
            Trainer::Grid(g) => (g.waited().as_secs_f64(), Some(g.reads)),
            Trainer::Share(_) => (0.0, None),
        };
        let json = serde_json::json!({
            "algorithm": "mf",
            "schedule": if a.data_parallel { "data-parallel".to_string() } else { a.policy.to_string() },
            "policy": a.policy.to_string(),
            "refresh": a.refresh.to_string(),
            "strata": strata,
            "item_strata": cols,
            "factors": k,
            "workers": s.num_workers,
            "straggler": a.straggler.map(|(id, f)| format!("{id}:{f}")),
            "updates": updates,
            "test_rmse": last,
            "wall_s": wall,
            "train_s": train_s,
            "updates_per_s": updates as f64 / train_s,
            "compute_s": timing.compute.as_secs_f64(),
            "comm_s": timing.comm.as_secs_f64(),
            "round_wait_s": waited,
            "idle_fraction": waited / train_s.max(1e-9),
            "item_reads": reads.map(|r| r.reads),
            "item_pulls": reads.map(|r| r.pulls),
            "staleness_mean": reads.map(|r| r.staleness_sum as f64 / r.reads.max(1) as f64),
            "staleness_max": reads.map(|r| r.staleness_max),
            "epochs": epochs.iter().map(|(e, r, w)| serde_json::json!({"epoch": e, "test_rmse": r, "train_s": w})).collect::<Vec<_>>(),
        });
        report.metrics("mf", &json);
        if let Some(out) = &a.out {
            std::fs::write(out, serde_json::to_string_pretty(&json)?).with_context(|| format!("cannot write {}", out.display()))?;
        }
        report.line(&format!(
            "train mf: test_rmse={} epochs={} train_s={train_s:.2} wall_s={wall:.2}",
            last.map(|r| format!("{r:.5}")).unwrap_or_else(|| "n/a".into()),
            a.epochs
        ));
    }
    s.barrier("mf-done")?;
    Ok(())
}
