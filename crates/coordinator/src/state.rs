//! The coordinator's state, behind [`crate::Coordinator`]'s lock: one struct, its fields
//! grouped by the concept (and module) that owns them. What a restarted coordinator needs of
//! it is written to the state directory by [`crate::persist`].

use crate::barriers::Barrier;
use crate::checkpoints::Checkpoints;
use crate::epochs::Recovery;
use downpour_core::epochs::Epochs;
use downpour_core::pieces::PieceBoard;
use downpour_core::proto;
use downpour_core::ring::Ring;
use downpour_core::schedule::BpgScheduler;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

#[derive(Default)]
pub(crate) struct State {
    // ---- membership (membership.rs)
    /// The node id the next registration gets.
    pub(crate) next_id: u32,
    /// Servers by rank: node id and data address.
    pub(crate) servers: Vec<(u32, String)>,
    /// Workers by rank: the node id holding the rank.
    pub(crate) workers: Vec<u32>,
    /// Every registered node's role and rank.
    pub(crate) roles: HashMap<u32, (&'static str, u32)>,
    /// Registrations by the node's token: node id and the record a replacement got.
    pub(crate) registrations: HashMap<u64, (u32, Option<proto::WorkerCheckpoint>)>,
    /// When each node was last heard from (the monitor declares a silent one dead).
    pub(crate) last_seen: HashMap<u32, Instant>,
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
    pub(crate) epochs: Epochs<Instant>,
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
    pub(crate) vacant: std::collections::BTreeMap<u32, (Instant, String)>,
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

    // ---- the task scheduler (scheduler.rs)
    /// The BPG task scheduler, built from the first worker's plan.
    pub(crate) schedule: Option<BpgScheduler>,
    /// Sandblaster's piece board, made at the first `Pieces` call.
    pub(crate) pieces: Option<PieceBoard>,
    /// The job used the BPG scheduler or the piece board (whose state is not kept on disk).
    pub(crate) scheduled: bool,

    // ---- the state directory (persist.rs)
    /// Taken back from a state directory after a restart.
    pub(crate) restored: bool,
    /// Why the state could not be written last time (logged once).
    pub(crate) persist_error: bool,
}
