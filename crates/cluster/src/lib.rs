//! Running Downpour jobs from a program: an embedded cluster (coordinator, servers and
//! workers as threads of this process over the in-process transport), one worker of a
//! cluster, or a local launch of processes with faults injected, all from typed
//! [`Settings`] and a [`Job`](downpour_jobs::Job). The benchmark driver and the consistency
//! experiment are here too. The command-line tool only maps its flags onto these.
//!
//! Training `linear` (a spam filter, on the SpamAssassin subset the repository ships) on an
//! embedded cluster of 2 servers and 2 workers:
//!
//! ```
//! use downpour_cluster::{run_embedded, Settings};
//! use downpour_jobs::linear::{InputConfig, InputFormat, LinearConfig};
//! use downpour_jobs::{Collector, Job, TrainModel};
//!
//! let data = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/spamassassin");
//! let cfg = LinearConfig {
//!     train: vec![format!("{data}/train.jsonl.gz").into()],
//!     test: Some(format!("{data}/test.jsonl.gz").into()),
//!     input: InputConfig { format: InputFormat::TextJsonl, ..Default::default() },
//!     lr: 1.0,
//!     batch: 10,
//!     quiet: true,
//!     ..Default::default()
//! };
//! let report = Collector::new();
//! run_embedded(&Settings::default(), 2, 2, &Job::Train(TrainModel::Linear(Box::new(cfg))), report.clone())?;
//! let auc = report.metrics_of("linear").and_then(|m| m["test_auc"].as_f64()).unwrap_or(0.0);
//! assert!(auc > 0.99, "test AUC {auc}");
//! # anyhow::Ok(())
//! ```

pub mod bench;
pub mod calibrate;
pub mod certs;
/// The README's and docs' Rust code blocks, compiled (and, unless marked `no_run`, run) by
/// `cargo test` as doctests of this crate, so the docs cannot drift from the API.
#[cfg(doctest)]
pub mod docs {
    #[doc = include_str!("../../../README.md")]
    pub struct Readme;
    #[doc = include_str!("../../../docs/usage.md")]
    pub struct Usage;
    #[doc = include_str!("../../../docs/dnn.md")]
    pub struct Dnn;
}
mod embedded;
pub mod experiment;
pub mod export_bench;
pub mod exporter;
pub mod fault;
mod launch;
pub mod nodes;
pub mod plan;
pub mod serve;
pub mod settings;

pub use embedded::{run_embedded, run_worker, run_worker_serving_metrics, EmbeddedCluster};
pub use fault::{Fault, FaultAction, FaultTarget};
pub use launch::{launch_local, proc_cpu, CpuRecord, LocalRun, Program};
pub use settings::Settings;
