//! # downpour-coordinator
//!
//! The paper's *server manager* and *task scheduler* for one job: nodes register and get
//! ids and ranks; once every server has registered it publishes the routing table (the
//! servers in partition order) under an epoch; it runs named barriers over the workers,
//! receives heartbeats (declaring a silent or disconnected node dead and failing the job
//! cleanly), and ends the job when every worker is done by telling the servers to stop.
//!
//! Replicated jobs (`replication >= 2`) keep a consistent-hashing ring of servers instead:
//! a lost server, a server registering while the job runs (a join) and an `admin drain`
//! each change the ring in a new routing epoch, served once every member reported that it
//! moved and built its new copies. A lost worker of a replicated job whose job records its
//! progress leaves its rank vacant: the next worker to register takes the rank over and
//! goes on from the lost worker's last recorded point (see [`CoordinatorConfig::worker_rejoin`]).
//!
//! The node side of this protocol is `downpour-control` (`ControlClient`), re-exported here
//! as [`client`]; servers and workers depend on it alone.

#![warn(missing_docs)]

/// The control-plane client (`downpour-control`).
pub use downpour_control as client;
pub use downpour_control::decode_body;
pub mod persist;

pub mod engine;

mod barriers;
mod checkpoints;
mod config;
mod epochs;
mod error;
mod membership;
mod metrics;
mod monitor;
mod scheduler;
mod service;

pub use config::{CoordinatorConfig, JobOutcome};
pub use engine::Recovery;
pub use error::{CoordError, NodeDesc};
pub use service::Coordinator;
