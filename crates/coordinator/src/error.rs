//! The coordinator's errors: why a control call is refused (each maps to the wire status it
//! is answered with, [`CoordError::status`], and its message is the reply's error text), and
//! why a state directory cannot be taken back ([`crate::Coordinator::open`]).

use downpour_core::blocks::BlockError;
use downpour_core::msg::Status;
use downpour_core::schedule::ScheduleError;
use downpour_core::CoreError;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use thiserror::Error;

/// A node as the coordinator names it in messages: `worker 2 (node 7)` once it registered,
/// `node 7` before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeDesc {
    /// The node id.
    pub id: u32,
    /// Its role (`"server"` or `"worker"`) and rank, once it registered.
    pub role: Option<(&'static str, u32)>,
}

impl fmt::Display for NodeDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.role {
            Some((role, rank)) => write!(f, "{role} {rank} (node {})", self.id),
            None => write!(f, "node {}", self.id),
        }
    }
}

/// An error of the coordinator. A refused control call is answered with
/// [`CoordError::status`] and the error's message.
#[derive(Debug, Clone, Error)]
pub enum CoordError {
    // ---- the job's end
    /// The job failed: every call is refused with why.
    #[error("job failed: {reason}")]
    JobFailed {
        /// Why the job failed.
        reason: String,
    },
    /// Every worker is done and the job is shutting down.
    #[error("the job is shutting down")]
    ShuttingDown,

    // ---- membership
    /// A worker declared lost (its rank went to a replacement) called again.
    #[error("node {node} was declared lost; its rank went to a replacement")]
    LostNode {
        /// The lost worker's node id.
        node: u32,
    },
    /// A call only a worker of the job may make came from another node (a server, an
    /// unregistered node, or a worker whose rank is held by another node).
    #[error("node {node} is not a worker of this job")]
    NotAWorker {
        /// The caller's node id.
        node: u32,
    },
    /// A task scheduler call from a node that is not a registered worker.
    #[error("{node} is not a registered worker")]
    NotRegisteredWorker {
        /// The caller.
        node: NodeDesc,
    },
    /// A worker registering was waiting for a silent worker's rank, and that worker was just
    /// declared lost: registering again takes its rank.
    #[error("a silent worker was declared lost: try again for its rank")]
    SilentWorkerLost,
    /// A worker registering while every rank is taken and one worker is silent: it may be
    /// declared lost, and its rank freed, soon.
    #[error("the job has its {workers} workers, and one of them is silent: try again while it may be declared lost")]
    WorkerSilent {
        /// The workers the job has.
        workers: usize,
    },
    /// A server registered without its data address.
    #[error("a server must register its data address")]
    ServerWithoutAddress,
    /// A server registering when the job has all its servers, and is not replicated (only a
    /// replicated job takes servers while it runs).
    #[error("the job already has its {servers} servers (a server can join a running job only with --replication 2 or more)")]
    ServersFull {
        /// The servers the job has.
        servers: usize,
    },
    /// A worker registering when the job has all its workers and no rank is vacant.
    #[error("the job already has its {workers} workers")]
    WorkersFull {
        /// The workers the job has.
        workers: usize,
    },
    /// A registration with a role other than `server` or `worker`.
    #[error("unknown role {role:?}")]
    UnknownRole {
        /// The role asked for.
        role: String,
    },
    /// A registration seen before (by its token) whose node has no role (a bug).
    #[error("registration of node {node} without a role")]
    NoRole {
        /// The node id the registration got.
        node: u32,
    },

    // ---- routing epochs and the ring
    /// `admin drain` of an unreplicated job.
    #[error("draining a server needs a replicated job (--replication 2 or more): without copies its keys would be lost")]
    DrainUnreplicated,
    /// `admin drain` of a server rank the job never had.
    #[error("no server {rank}: the job has had {servers} servers (0..{servers})")]
    NoSuchServer {
        /// The rank asked for.
        rank: u32,
        /// The server ranks the job has had.
        servers: usize,
    },
    /// `admin drain --addr` of an address no server on the ring registered.
    #[error("no server on the ring registered at {addr}")]
    NoServerAt {
        /// The address asked for.
        addr: String,
    },
    /// `admin drain` before every server registered (there is no ring yet).
    #[error("the servers are still registering; drain once the job runs")]
    StillRegistering,
    /// `admin drain` of a server no longer on the ring.
    #[error("server {rank} (node {node}) is not on the ring (drained or failed already)")]
    NotOnRing {
        /// The server's rank.
        rank: u32,
        /// Its node id.
        node: u32,
    },
    /// `admin drain` that would leave fewer servers than copies of every shard.
    #[error("draining server {rank} would leave {left} servers for {copies} copies of every shard")]
    DrainTooFew {
        /// The server's rank.
        rank: u32,
        /// The servers that would be left on the ring.
        left: usize,
        /// Copies of every shard (the job's replication).
        copies: usize,
    },
    /// The ring refused a change (a bug: the coordinator checks the change first).
    #[error(transparent)]
    Ring(CoreError),

    // ---- barriers, progress, checkpoints
    /// A worker at a barrier for a pass beyond the next one.
    #[error("worker {rank} at barrier {name:?} for the {count}th time, while {passed} passes were made")]
    BarrierAhead {
        /// The worker's rank.
        rank: u32,
        /// The barrier.
        name: String,
        /// The pass it asked for (1-based).
        count: u64,
        /// The passes made.
        passed: u64,
    },
    /// A worker's progress record names another rank.
    #[error("worker {rank} sent progress for worker {sent}")]
    ProgressRank {
        /// The caller's rank.
        rank: u32,
        /// The rank its record names.
        sent: u32,
    },
    /// A worker joining a checkpoint round other than the one being taken.
    #[error("worker at checkpoint {seq} while checkpoint {taking} is being taken (do all workers use one --checkpoint-every?)")]
    CheckpointMismatch {
        /// The round it joined.
        seq: u64,
        /// The round being taken.
        taking: u64,
    },
    /// A checkpoint reported written by a node that is not writing it.
    #[error("node {node} is not writing checkpoint {seq}")]
    NotCheckpointWriter {
        /// The caller's node id.
        node: u32,
        /// The round it reported.
        seq: u64,
    },

    // ---- the task scheduler
    /// The first BPG scheduler call came without the plan.
    #[error("the first schedule call must carry the plan")]
    NoPlan,
    /// A BPG plan for another number of workers than the job's.
    #[error("the plan is for {plan} workers, the job has {job}")]
    PlanWorkers {
        /// The workers of the plan.
        plan: usize,
        /// The workers of the job.
        job: usize,
    },
    /// A worker sent a BPG plan other than the one the scheduler was built from.
    #[error("{node} sent a plan that differs from the job's")]
    PlanDiffers {
        /// The caller.
        node: NodeDesc,
    },
    /// The BPG scheduler refused a plan or report.
    #[error(transparent)]
    Schedule(ScheduleError),
    /// The block rounds refused a plan or report.
    #[error(transparent)]
    Blocks(BlockError),
    /// A call only worker 0 may make: what it does (`"evaluates passes"`, `"opens rounds and
    /// ends the job"`).
    #[error("only worker 0 {0}")]
    OnlyWorkerZero(&'static str),
    /// The piece board refused a call.
    #[error(transparent)]
    Pieces(CoreError),
    /// The chunk board refused a call.
    #[error(transparent)]
    Chunks(CoreError),
    /// Workers of one job sent different numbers of chunks per epoch.
    #[error("chunk request for {sent} chunks per epoch, the job's board has {board}: every worker must cut the same files alike")]
    ChunksDiffer {
        /// What the call said.
        sent: u32,
        /// What the board has.
        board: u32,
    },
    /// A piece board call wanting something unknown.
    #[error("unknown piece request want={want}")]
    UnknownPieceWant {
        /// The `want` asked for.
        want: u32,
    },
    /// A scheduler call after a coordinator restart: the scheduler's state is not kept on
    /// disk, so the job cannot go on.
    #[error(
        "the coordinator restarted, and the {what}'s state is not kept on disk: this job cannot go on (run it again, or --resume a checkpoint)"
    )]
    SchedulerRestarted {
        /// Which scheduler (`"BPG task scheduler"`, `"piece board"`).
        what: &'static str,
    },

    // ---- requests
    /// A control message that does not decode.
    #[error("bad control message: {0}")]
    BadRequest(prost::DecodeError),
    /// An op the coordinator does not serve.
    #[error("op {op} is not served by the coordinator")]
    Unsupported {
        /// The op code.
        op: u32,
    },
    /// A part of the coordinator's state that should be there is not (a bug): what is
    /// missing (`"no scheduler"`, `"a replicated job without a ring"`...).
    #[error("{0}")]
    Invariant(&'static str),

    // ---- the state directory
    /// A file or directory could not be read, written or made (the message includes `error`).
    #[error("cannot {action} {}: {error}", .path.display())]
    Io {
        /// What was done (`"read"`, `"create the state directory"`, `"write the
        /// coordinator state to"`).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error (shared: the error is cloneable).
        error: Arc<std::io::Error>,
    },
    /// The state file does not decode (the message includes `error`).
    #[error("{} is not a coordinator state: {error}", .path.display())]
    CorruptState {
        /// The state file.
        path: PathBuf,
        /// Why it does not decode.
        error: prost::DecodeError,
    },
    /// The state directory holds the state of a job of another shape.
    #[error(
        "the state in {}: it was written for a job of {servers} servers, {workers} workers and {copies} copies; this one has {job_servers}, {job_workers} and {job_copies}",
        .dir.display()
    )]
    OtherJob {
        /// The state directory.
        dir: PathBuf,
        /// The servers of the job it was written for.
        servers: u32,
        /// Its workers.
        workers: u32,
        /// Its copies of every key.
        copies: u32,
        /// The servers of this job.
        job_servers: usize,
        /// Its workers.
        job_workers: usize,
        /// Its copies of every key.
        job_copies: usize,
    },
    /// The state's worker list does not fit the job (more workers than the job has, or a
    /// vacant rank out of range).
    #[error("the state in {}: its worker list does not fit the job", .dir.display())]
    MisfitState {
        /// The state directory.
        dir: PathBuf,
    },
}

impl CoordError {
    /// The wire status a refused control call is answered with.
    pub fn status(&self) -> Status {
        use CoordError::*;
        match self {
            JobFailed { .. } | ShuttingDown | LostNode { .. } | StillRegistering | SchedulerRestarted { .. } => Status::Aborted,
            NotAWorker { .. } => Status::PermissionDenied,
            SilentWorkerLost | WorkerSilent { .. } => Status::Unavailable,
            ServersFull { .. } | WorkersFull { .. } => Status::ResourceExhausted,
            NotRegisteredWorker { .. }
            | ServerWithoutAddress
            | UnknownRole { .. }
            | DrainUnreplicated
            | NoSuchServer { .. }
            | NotOnRing { .. }
            | NoServerAt { .. }
            | DrainTooFew { .. }
            | BarrierAhead { .. }
            | ProgressRank { .. }
            | CheckpointMismatch { .. }
            | NotCheckpointWriter { .. }
            | NoPlan
            | PlanWorkers { .. }
            | PlanDiffers { .. }
            | Schedule(_)
            | Blocks(_)
            | OnlyWorkerZero(_)
            | Pieces(_)
            | Chunks(_)
            | ChunksDiffer { .. }
            | UnknownPieceWant { .. }
            | BadRequest(_) => Status::InvalidArgument,
            Unsupported { .. } => Status::Unsupported,
            // the state directory's errors are never answered on the wire
            NoRole { .. } | Ring(_) | Invariant(_) | Io { .. } | CorruptState { .. } | OtherJob { .. } | MisfitState { .. } => {
                Status::Internal
            }
        }
    }

    /// An [`CoordError::Io`] error: `action` on `path` failed with `error`.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        CoordError::Io { action, path: path.into(), error: Arc::new(error) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_statuses_are_those_of_the_wire() {
        let e = CoordError::LostNode { node: 7 };
        assert_eq!(e.to_string(), "node 7 was declared lost; its rank went to a replacement");
        assert_eq!(e.status(), Status::Aborted);
        let e = CoordError::NotRegisteredWorker { node: NodeDesc { id: 3, role: Some(("server", 1)) } };
        assert_eq!(e.to_string(), "server 1 (node 3) is not a registered worker");
        assert_eq!(e.status(), Status::InvalidArgument);
        let e = CoordError::PlanDiffers { node: NodeDesc { id: 4, role: None } };
        assert_eq!(e.to_string(), "node 4 sent a plan that differs from the job's");
        let e = CoordError::NoSuchServer { rank: 5, servers: 3 };
        assert_eq!(e.to_string(), "no server 5: the job has had 3 servers (0..3)");
        let e = CoordError::OnlyWorkerZero("evaluates passes");
        assert_eq!(e.to_string(), "only worker 0 evaluates passes");
        let e = CoordError::io("read", "/x/state.pb", std::io::Error::other("boom"));
        assert_eq!(e.to_string(), "cannot read /x/state.pb: boom");
        let e = CoordError::UnknownRole { role: "judge".into() };
        assert_eq!(e.to_string(), "unknown role \"judge\"");
        assert_eq!(CoordError::Unsupported { op: 99 }.status(), Status::Unsupported);
        assert_eq!(CoordError::WorkerSilent { workers: 2 }.status(), Status::Unavailable);
    }
}
