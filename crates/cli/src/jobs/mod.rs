//! Jobs a worker runs. Each job gets a [`WorkerSession`] (client, rank, barriers) and a
//! sink for the lines it reports on standard output.

pub mod bench;
pub mod counter;
pub mod dnn;
pub mod dnn_lbfgs;
pub mod l1lr;
pub mod linear;

use anyhow::Result;
use clap::Subcommand;
use downpour_worker::WorkerSession;
use std::sync::Arc;

/// Where a job writes its report lines (stdout in a worker process, a collector in tests
/// and in the embedded benchmark).
pub type Sink = Arc<dyn Fn(&str) + Send + Sync>;

/// A job run by every worker.
#[derive(Subcommand, Debug, Clone)]
pub enum JobCmd {
    /// Every worker adds 1 to the same K keys R times; then every worker checks that each
    /// key equals workers × rounds exactly (the no-lost-update check).
    Counter(counter::CounterArgs),
    /// Train a model (see `train linear --help`).
    #[command(subcommand)]
    Train(TrainModel),
    /// The benchmark's worker side (started by `downpour bench`).
    #[command(hide = true)]
    BenchJob(bench::BenchJobArgs),
}

/// Models `train` knows.
#[derive(Subcommand, Debug, Clone)]
pub enum TrainModel {
    /// Sparse logistic regression by asynchronous minibatch SGD (FTRL/AdaGrad/SGD on the servers).
    Linear(Box<linear::LinearArgs>),
    /// L1-regularised logistic regression by the delayed block proximal gradient method.
    L1lr(Box<l1lr::L1lrArgs>),
    /// Neural networks (MLP, CNN) on MNIST-format data: downpour, sync, model-avg or lbfgs.
    Dnn(Box<dnn::DnnArgs>),
}

impl JobCmd {
    /// Whether worker `rank` of this job reads the model beside training (and needs
    /// [`WorkerSession::reader`]).
    pub fn wants_reader(&self, rank: usize) -> bool {
        match self {
            JobCmd::Train(TrainModel::Linear(a)) => rank == 0 && a.eval_every > 0 && a.test.is_some(),
            _ => false,
        }
    }

    /// An error unless this job can take checkpoints and resume from them.
    pub fn check_checkpoints(&self) -> Result<()> {
        match self {
            JobCmd::Counter(_) | JobCmd::Train(TrainModel::Linear(_)) => Ok(()),
            _ => anyhow::bail!("checkpoints (--checkpoint-dir, --resume) are supported by the counter and train linear jobs only so far"),
        }
    }

    /// Whether the job records its progress (`WorkerSession::start_progress`), so that a lost
    /// worker of a replicated job can be replaced: the jobs that take checkpoints.
    pub fn records_progress(&self) -> bool {
        self.check_checkpoints().is_ok()
    }

    /// Runs the job on this worker.
    pub fn run(&self, session: &mut WorkerSession, num_servers: usize, sink: &Sink) -> Result<()> {
        match self {
            JobCmd::Counter(a) => counter::run(a, session, num_servers, sink),
            JobCmd::BenchJob(a) => bench::run_worker(a, session, sink),
            JobCmd::Train(TrainModel::Linear(a)) => linear::run(a, session, sink),
            JobCmd::Train(TrainModel::L1lr(a)) => l1lr::run(a, session, sink),
            JobCmd::Train(TrainModel::Dnn(a)) => dnn::run(a, session, sink),
        }
    }
}

/// Parses a job command line (`counter --keys 10 …`) as given after `--` to `launch`.
pub fn parse_job(args: &[String]) -> Result<JobCmd, clap::Error> {
    #[derive(clap::Parser)]
    #[command(name = "downpour launch … --", no_binary_name = false)]
    struct JobCli {
        #[command(subcommand)]
        job: JobCmd,
    }
    use clap::Parser;
    let argv = std::iter::once("job".to_string()).chain(args.iter().cloned());
    JobCli::try_parse_from(argv).map(|c| c.job)
}
