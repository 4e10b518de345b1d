//! The coordinator's settings ([`CoordinatorConfig`], with their defaults) and how a job
//! ended ([`JobOutcome`]).

use std::time::Duration;

/// Coordinator settings.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Servers the job needs.
    pub servers: usize,
    /// Workers the job needs.
    pub workers: usize,
    /// How often nodes send heartbeats.
    pub heartbeat: Duration,
    /// A node silent for this long is declared dead.
    pub node_timeout: Duration,
    /// How long registration may take before the job is failed.
    pub register_timeout: Duration,
    /// The cluster secret: registered workers get a credential derived from it
    /// (`msg::worker_credential`) to identify with to the servers.
    pub secret: Option<String>,
    /// Copies of every key (chain replication). 1: the fixed even partition, a server
    /// failure fails the job; 2 or more: shards on a consistent-hashing ring, a failed
    /// server is removed in a new epoch and the job goes on.
    pub replication: usize,
    /// Ring points per server (replication ≥ 2).
    pub vnodes: u32,
    /// Fixed shards per table domain (replication ≥ 2).
    pub shards: u32,
    /// Time-driven checkpoints: ask the workers for one this long after the last (they join
    /// it at their next clock). Clock-driven checkpoints need nothing here.
    pub checkpoint_every: Option<Duration>,
    /// Replicated jobs: how long a lost worker's rank waits for a replacement (a worker
    /// registering once every rank is taken) before the job fails. Zero: a lost worker
    /// fails the job at once. Only workers that recorded their progress (`Op::Progress`)
    /// can be replaced; unreplicated jobs always fail (their servers keep no watermarks to
    /// recognise the requests a replacement sends again).
    pub worker_rejoin: Duration,
    /// Keep the coordinator's state in this directory ([`persist`](crate::persist)): a coordinator
    /// restarted with it ([`Coordinator::open`](crate::Coordinator::open)) takes the job back, and nodes told so at
    /// registration reconnect instead of failing when the coordinator goes away.
    pub state_dir: Option<std::path::PathBuf>,
    /// A vacant rank with no replacement after this long is handed to a live worker: its
    /// process takes the lost worker's share over (heartbeat answer `adopt`). Zero: never
    /// (only a replacement takes it).
    pub reassign_after: Duration,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            servers: 1,
            workers: 1,
            heartbeat: Duration::from_millis(500),
            node_timeout: Duration::from_secs(10),
            register_timeout: Duration::from_secs(60),
            secret: None,
            replication: 1,
            vnodes: 16,
            shards: 64,
            checkpoint_every: None,
            worker_rejoin: Duration::from_secs(60),
            state_dir: None,
            reassign_after: Duration::from_secs(5),
        }
    }
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// Every worker finished successfully.
    Succeeded,
    /// The job failed; the reason names the node and what happened.
    Failed(String),
}
