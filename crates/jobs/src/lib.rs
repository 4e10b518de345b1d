//! Downpour's jobs as a library. A job is a plain config struct ([`Job`]) that every worker
//! of a cluster runs on its [`WorkerSession`] (client, rank, barriers), reporting result
//! lines, final metrics and progress through a [`Reporter`]. `downpour-cluster` runs a job
//! on an embedded cluster or on processes; the command-line tool maps its flags onto these
//! same structs (feature `cli`) and does nothing else.
//!
//! | job | module | what it does |
//! |---|---|---|
//! | `counter` | [`counter`] | the exact no-lost-update check every fault test reuses |
//! | `train linear` | [`linear`] | sparse logistic regression, asynchronous minibatch SGD (FTRL/AdaGrad/SGD on the servers) |
//! | `train l1lr` | [`l1lr`] | L1 logistic regression, delayed block proximal gradient |
//! | `train mf` | [`mf`] | matrix factorisation, model-parallel by a block schedule (DSGD / STRADS) |
//! | `train lda` | [`lda`] | topic models by collapsed Gibbs sampling, model-parallel over the vocabulary (LightLDA / STRADS) |
//! | `train dnn` | [`dnn`] | MLP/CNN: Downpour SGD, synchronous SGD, model averaging, Sandblaster L-BFGS |
//! | `train lsq`, `train linear --coded` | [`coded`] | full-batch gradient descent with coded partitioning (MDS), uncoded or gradient-coded |
//! | `train shuffle` | [`shuffle`] | logistic regression by local SGD and model averaging, the data dealt anew every epoch by uncoded or coded shuffling |
//! | `bench-job` | [`mod@bench`] | the benchmark's worker side |

pub mod bench;
pub mod coded;
pub mod counter;
pub mod dnn;
mod dnn_lbfgs;
pub mod export;
pub mod l1lr;
pub mod lda;
pub mod linear;
pub mod mf;
pub mod model;
pub mod report;
mod rounds;
pub mod shuffle;
mod straggle;

pub use report::{Collector, Lines, Phase, Progress, Report, Reporter};

use anyhow::Result;
use downpour_worker::WorkerSession;

/// A job run by every worker.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Subcommand))]
pub enum Job {
    /// Every worker adds 1 to the same K keys R times; then every worker checks that each
    /// key equals workers × rounds exactly (the no-lost-update check).
    Counter(counter::CounterConfig),
    /// Train a model (see `train linear --help`).
    #[cfg_attr(feature = "cli", command(subcommand))]
    Train(TrainModel),
    /// The benchmark's worker side (started by `downpour bench`).
    #[cfg_attr(feature = "cli", command(hide = true))]
    BenchJob(bench::BenchJobConfig),
}

/// Models `train` knows.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Subcommand))]
pub enum TrainModel {
    /// Sparse logistic regression by asynchronous minibatch SGD (FTRL/AdaGrad/SGD on the servers).
    Linear(Box<linear::LinearConfig>),
    /// L1-regularised logistic regression by the delayed block proximal gradient method.
    L1lr(Box<l1lr::L1lrConfig>),
    /// Neural networks (MLP, CNN) on MNIST-format data: downpour, sync, model-avg or lbfgs.
    Dnn(Box<dnn::DnnConfig>),
    /// Matrix factorisation of ratings, model-parallel by a conflict-free block schedule.
    Mf(Box<mf::MfConfig>),
    /// Topic model (LDA) of a bag-of-words corpus by collapsed Gibbs sampling, model-parallel over the vocabulary.
    Lda(Box<lda::LdaConfig>),
    /// Least squares by full-batch gradient descent, its matrix products split across the
    /// workers: uncoded, by coded partitioning (`--coded mds:W,K`) or by gradient coding.
    Lsq(Box<coded::CodedConfig>),
    /// Logistic regression by local SGD and model averaging, worker 0 holding the data and
    /// dealing it anew to the other workers every epoch: `--shuffle none|uncoded|coded`.
    Shuffle(Box<shuffle::ShuffleConfig>),
}

impl Job {
    /// Whether worker `rank` of this job reads the model beside training (and needs
    /// [`WorkerSession::reader`]).
    pub fn wants_reader(&self, rank: usize) -> bool {
        match self {
            Job::Train(TrainModel::Linear(a)) => rank == 0 && a.eval_every > 0 && a.test.is_some(),
            _ => false,
        }
    }

    /// An error unless this job can take checkpoints and resume from them.
    pub fn check_checkpoints(&self) -> Result<()> {
        match self {
            Job::Counter(_) | Job::Train(TrainModel::Linear(_)) => Ok(()),
            _ => anyhow::bail!("checkpoints (--checkpoint-dir, --resume) are supported by the counter and train linear jobs only so far"),
        }
    }

    /// Whether the job records its progress (`WorkerSession::start_progress`), so that a lost
    /// worker of a replicated job can be replaced: the jobs that take checkpoints.
    pub fn records_progress(&self) -> bool {
        self.check_checkpoints().is_ok()
    }

    /// This job as an embedded cluster of `workers` workers runs it (the workers and the
    /// servers all threads of this process): what its configuration leaves to `auto` and
    /// depends on that is settled here. `train linear --reader auto` reads inline when the
    /// process has fewer CPUs than three per worker and the workers read static shares
    /// (docs/benchmarks.md, "the reader on the training thread").
    pub fn embedded(&self, workers: usize) -> Job {
        match self {
            Job::Train(TrainModel::Linear(a))
                if a.reader == linear::ReaderMode::Auto && a.data_assignment == linear::DataAssignment::Static =>
            {
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                let reader = a.reader.settled(cpus, workers);
                Job::Train(TrainModel::Linear(Box::new(linear::LinearConfig { reader, ..(**a).clone() })))
            }
            _ => self.clone(),
        }
    }

    /// Runs the job on this worker.
    pub fn run(&self, session: &mut WorkerSession, num_servers: usize, report: &Report) -> Result<()> {
        match self {
            Job::Counter(a) => counter::run(a, session, num_servers, report),
            Job::BenchJob(a) => bench::run_worker(a, session, report),
            Job::Train(TrainModel::Linear(a)) => linear::run(a, session, report),
            Job::Train(TrainModel::L1lr(a)) => l1lr::run(a, session, report),
            Job::Train(TrainModel::Dnn(a)) => dnn::run(a, session, report),
            Job::Train(TrainModel::Mf(a)) => mf::run(a, session, report),
            Job::Train(TrainModel::Lda(a)) => lda::run(a, session, report),
            Job::Train(TrainModel::Lsq(a)) => coded::run(a, session, report),
            Job::Train(TrainModel::Shuffle(a)) => shuffle::run(a, session, report),
        }
    }
}
