//! The coordinator's rules without I/O: membership (registration, replacement, loss,
//! heartbeats, workers done), vacant worker ranks, routing epochs, barriers, checkpoints and
//! the monitor's timeouts, as one state machine, [`Engine`], whose calls take the event and
//! the time (`now`, a [`Duration`] since the coordinator started) and return what happened.
//!
//! The runtime ([`crate::Coordinator`]) holds the engine behind one lock, and does what
//! the engine cannot: it waits (a call held at a barrier, a registration waiting for the
//! routing table), wakes the waiters after a change, writes the state directory
//! ([`crate::persist`]) and logs. The simulation (`downpour-sim`) drives the same engine
//! with its virtual clock. Nothing here reads a clock, sleeps, locks, or touches a file or
//! the network (a test of this crate checks the sources for it); log lines are allowed.

mod barriers;
mod checkpoints;
mod epochs;
mod membership;
mod monitor;
mod snapshot;
mod vacancies;

pub use barriers::BarrierStep;
pub use checkpoints::{JoinStep, Written};
pub use epochs::{EpochReadyOutcome, Recovery};
pub use membership::{Done, Gate, Lost, Registered, Told};
pub use monitor::Tick;

pub(crate) use barriers::Barrier;
pub(crate) use checkpoints::Checkpoints;

use crate::config::CoordinatorConfig;
use crate::error::NodeDesc;
use downpour_core::blocks::BlockRounds;
use downpour_core::chunks::ChunkBoard;
use downpour_core::epochs::Epochs;
use downpour_core::pieces::PieceBoard;
use downpour_core::proto;
use downpour_core::ring::Ring;
use downpour_core::schedule::BpgScheduler;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

/// The coordinator's state and rules for one job (see the module's doc). Times are
/// [`Duration`]s since the coordinator started; a caller passes them non-decreasing.
pub struct Engine {
    pub(crate) cfg: CoordinatorConfig,

    // ---- membership (membership.rs)
    /// The node id the next registration gets.
    pub(crate) next_id: u32,
    /// Servers by rank: node id and data address.
    pub(crate) servers: Vec<(u32, String)>,
    /// Servers' metrics endpoints, by node id (those that serve one).
    pub(crate) metrics: std::collections::BTreeMap<u32, String>,
    /// Workers by rank: the node id holding the rank.
    pub(crate) workers: Vec<u32>,
    /// Every registered node's role and rank.
    pub(crate) roles: HashMap<u32, (&'static str, u32)>,
    /// Registrations by the node's token: node id and the record a replacement got.
    pub(crate) registrations: HashMap<u64, (u32, Option<proto::WorkerCheckpoint>)>,
    /// When each node was last heard from (the monitor declares a silent one dead).
    pub(crate) last_seen: HashMap<u32, Duration>,
    /// Nodes whose heartbeat connection is open.
    pub(crate) heartbeating: HashSet<u32>,
    /// Nodes that reported done.
    pub(crate) done: HashSet<u32>,

    // ---- the job's end
    /// Why the job failed, once it did.
    pub(crate) failed: Option<String>,
    /// Every worker is done: the job is shutting down.
    pub(crate) shutdown: bool,

    // ---- routing epochs (epochs.rs)
    /// The routing epochs (`core::epochs`): the one published (0 until every server
    /// registered), whether it is served, the members of the last served one (where the
    /// data is while an epoch is prepared), and the epoch being prepared.
    pub(crate) epochs: Epochs<Duration>,
    /// Replicated jobs: the ring of live servers (its epoch is the newest).
    pub(crate) ring: Option<Ring>,
    /// Servers removed from the ring (they are fenced: their old epoch is refused).
    pub(crate) removed: HashSet<u32>,
    /// Recoveries: (epoch, what failed, detection to serving).
    pub(crate) recoveries: Vec<Recovery>,
    /// Servers drained by `admin drain` (they exit cleanly once off the ring).
    pub(crate) drained: HashSet<u32>,

    // ---- vacant worker ranks (vacancies.rs)
    /// Per worker rank, the last point it recorded with every request acknowledged.
    pub(crate) progress: HashMap<u32, proto::WorkerCheckpoint>,
    /// Worker ranks whose job records progress (replaceable before their first record).
    pub(crate) records_progress: HashSet<u32>,
    /// Worker ranks whose worker was lost, waiting for a replacement: since when, and why.
    pub(crate) vacant: BTreeMap<u32, (Duration, String)>,
    /// Lost workers' node ids (told so if they still call).
    pub(crate) lost_workers: HashSet<u32>,
    /// Vacant ranks handed to a live worker (node id) to take over, and the ones it was told.
    pub(crate) adoptions: HashMap<u32, u32>,

    // ---- barriers (barriers.rs)
    /// The named barriers.
    pub(crate) barriers: HashMap<String, Barrier>,

    // ---- checkpoints (checkpoints.rs)
    /// Checkpoints being gathered and taken.
    pub(crate) ckpt: Checkpoints,

    // ---- the task scheduler (the runtime's scheduler.rs; its rules are core::schedule
    // and core::pieces)
    /// The BPG task scheduler, built from the first worker's plan.
    pub(crate) schedule: Option<BpgScheduler>,
    /// Sandblaster's piece board, made at the first `Pieces` call.
    pub(crate) pieces: Option<PieceBoard>,
    /// The training data's chunks, handed out as workers ask (made at the first `Chunks`
    /// call).
    pub(crate) chunks: Option<ChunkBoard>,
    /// A model-parallel job's block rounds, built from the first worker's plan.
    pub(crate) blocks: Option<BlockRounds>,
    /// The job used the BPG scheduler, the piece board or block rounds (whose state is not kept on disk).
    pub(crate) scheduled: bool,

    // ---- the state directory (persist.rs)
    /// Taken back from a state directory after a restart.
    pub(crate) restored: bool,
}

impl Engine {
    /// A new job for `cfg`: no node registered yet, epoch 0.
    pub fn new(cfg: CoordinatorConfig) -> Self {
        Engine {
            cfg,
            next_id: 1,
            servers: Vec::new(),
            metrics: Default::default(),
            workers: Vec::new(),
            roles: HashMap::new(),
            registrations: HashMap::new(),
            last_seen: HashMap::new(),
            heartbeating: HashSet::new(),
            done: HashSet::new(),
            failed: None,
            shutdown: false,
            epochs: Epochs::default(),
            ring: None,
            removed: HashSet::new(),
            recoveries: Vec::new(),
            drained: HashSet::new(),
            progress: HashMap::new(),
            records_progress: HashSet::new(),
            vacant: BTreeMap::new(),
            lost_workers: HashSet::new(),
            adoptions: HashMap::new(),
            barriers: HashMap::new(),
            ckpt: Checkpoints::default(),
            schedule: None,
            pieces: None,
            chunks: None,
            blocks: None,
            scheduled: false,
            restored: false,
        }
    }

    /// The job's settings.
    pub fn config(&self) -> &CoordinatorConfig {
        &self.cfg
    }

    /// Node `id` as messages name it (its role and rank once it registered).
    pub fn describe(&self, id: u32) -> NodeDesc {
        NodeDesc { id, role: self.roles.get(&id).copied() }
    }

    /// Why the job failed, once it did.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// The job ended (failed or shutting down): nothing more changes it.
    pub fn ended(&self) -> bool {
        self.shutdown || self.failed.is_some()
    }

    /// Fails the job with `reason`; false (and nothing changes) when it had ended already.
    pub fn fail(&mut self, reason: String) -> bool {
        if self.ended() {
            return false;
        }
        self.failed = Some(reason);
        true
    }

    /// The node ids holding the worker ranks, by rank (what servers are told of replaced
    /// workers).
    pub fn worker_holders(&self) -> &[u32] {
        &self.workers
    }

    /// The servers by rank: node id and data address (drained and lost ones included).
    pub fn servers(&self) -> &[(u32, String)] {
        &self.servers
    }

    /// The routing epochs (published, served, being prepared).
    pub fn epochs(&self) -> &Epochs<Duration> {
        &self.epochs
    }

    /// The recoveries and reconfigurations so far (replicated jobs).
    pub fn recoveries(&self) -> &[Recovery] {
        &self.recoveries
    }
}
