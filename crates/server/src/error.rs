//! Why a server refuses a request ([`ServerError`]): one variant per meaning, each sent to
//! the client as one wire [`Status`] ([`ServerError::status`]) with its message.

use downpour_core::fence::Fenced;
use downpour_core::msg::{Op, Status};
use downpour_core::CoreError;

/// A request this server refused. The client receives [`ServerError::status`] and the
/// message (`Display`); nothing of a refused request frame was applied unless the variant
/// says otherwise.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServerError {
    /// The core refused the request's content (unsorted keys, lengths that do not match,
    /// a key outside the table's range, an invalid table or rule).
    #[error(transparent)]
    Core(#[from] CoreError),
    /// A message in the request's metadata that does not decode.
    #[error("bad {what}: {error}")]
    BadMessage {
        /// What the metadata should have been ("table definition", "vector program", ...).
        what: &'static str,
        /// The decoder's error.
        error: String,
    },
    /// A worker rank outside the job.
    #[error("{what} from worker {worker} of a job of {workers} workers")]
    UnknownWorker {
        /// The kind of request ("push", "clock").
        what: &'static str,
        /// The rank the request named.
        worker: u32,
        /// Workers of the job.
        workers: u32,
    },
    /// A request that does not fit this server or table (the message says how).
    #[error("{0}")]
    Invalid(String),
    /// A table this server does not hold.
    #[error("table {0} does not exist on this server")]
    UnknownTable(u32),
    /// A request of another routing epoch than this server's (the sender retries under the
    /// newest routing).
    #[error("request for routing epoch {asked} but this server is at epoch {current}")]
    StaleEpoch {
        /// The request's epoch.
        asked: u64,
        /// This server's.
        current: u64,
    },
    /// A replicated `bsp` table's rounds here are at another epoch than the request's.
    #[error("request for routing epoch {asked}, but table {table}'s rounds on this server are at epoch {current}")]
    StaleRounds {
        /// The table.
        table: u32,
        /// The request's epoch.
        asked: u64,
        /// The epoch of the table's rounds here.
        current: u64,
    },
    /// This server does not have the role in a shard's chain that the request needs (see
    /// `core::chain_push::check_roles`; the message names shard and epoch).
    #[error("{0}")]
    NotInChain(String),
    /// Forwarding down a chain failed (the sender retries).
    #[error("forwarding {what}to replica node {node} failed: {error}")]
    ForwardFailed {
        /// What was forwarded, with a trailing space, or empty for a push.
        what: String,
        /// The successor.
        node: u32,
        /// Why.
        error: String,
    },
    /// A successor did not acknowledge in time, or its connection broke (the sender retries).
    #[error("replica node {node} did not acknowledge: {error}")]
    NoAck {
        /// The successor.
        node: u32,
        /// Why.
        error: String,
    },
    /// A successor refused the forwarded request: its status and message, passed on.
    #[error("replica node {node}: {message}")]
    ReplicaRefused {
        /// The successor.
        node: u32,
        /// The status it answered.
        status: Status,
        /// Its message.
        message: String,
    },
    /// Round watermarks refused because an update of those rounds was not applied here.
    #[error("round watermarks of table {table} refused: an update frame of these rounds was not applied here")]
    RoundsNotApplied {
        /// The table.
        table: u32,
    },
    /// A row drop down a replicated table's chain (`core::chain_evict`) did not complete
    /// in time: a push waiting for the drop of a row it touches, or a drop waiting for the
    /// updates applied before it (the sender retries).
    #[error("{0}")]
    DropWait(String),
    /// A replaced worker's push or clock (see `core::fence`).
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// A server-to-server request from a node that is not a server of this job.
    #[error("{what} from node {node}, which is not a server of this job")]
    NotAPeer {
        /// The kind of request ("a forwarded push", "a replica copy").
        what: &'static str,
        /// The sender.
        node: u32,
    },
    /// Clusters with a secret: a worker credential that does not verify.
    #[error("node {node} presented no valid worker credential")]
    BadCredential {
        /// The sender.
        node: u32,
    },
    /// Clusters with a secret: a request on a connection that did not identify as its sender.
    #[error("{op:?} from node {node}: only registered workers that identified on this connection are served")]
    NotIdentified {
        /// The request's op.
        op: Op,
        /// The sender.
        node: u32,
    },
    /// A limit of this server (memory quota, table count).
    #[error("{0}")]
    OverLimit(String),
    /// More keys in one request than this server takes (`Limits::max_keys_per_request`).
    #[error("{keys} keys in one request, over the limit of {max}")]
    TooManyKeys {
        /// Keys in the request.
        keys: u64,
        /// The limit.
        max: u64,
    },
    /// A filtered request named a key-cache slot that does not hold its key list (the
    /// client sends the keys again).
    #[error("key cache slot {slot} does not hold the signed key list")]
    KeyCacheMiss {
        /// The slot.
        slot: u32,
    },
    /// Something this server does not do (the message says what to do instead).
    #[error("{0}")]
    Unsupported(String),
    /// The server is stopping.
    #[error("the server is stopping")]
    Stopping,
    /// A write sent to a read-only serving node.
    #[error("{0:?} refused: this is a read-only serving node (`downpour serve`); send writes to the training cluster")]
    ReadOnly(Op),
    /// A failure of this server's own (a checkpoint it could not write).
    #[error("{0}")]
    Internal(String),
}

impl ServerError {
    /// The wire status the client receives.
    pub fn status(&self) -> Status {
        match self {
            ServerError::Core(_) | ServerError::BadMessage { .. } | ServerError::UnknownWorker { .. } | ServerError::Invalid(_) => {
                Status::InvalidArgument
            }
            ServerError::UnknownTable(_) => Status::UnknownTable,
            ServerError::StaleEpoch { .. }
            | ServerError::StaleRounds { .. }
            | ServerError::NotInChain(_)
            | ServerError::ForwardFailed { .. }
            | ServerError::NoAck { .. }
            | ServerError::DropWait(_)
            | ServerError::RoundsNotApplied { .. } => Status::StaleEpoch,
            ServerError::ReplicaRefused { status, .. } => *status,
            ServerError::Fenced(_)
            | ServerError::NotAPeer { .. }
            | ServerError::BadCredential { .. }
            | ServerError::NotIdentified { .. } => Status::PermissionDenied,
            ServerError::OverLimit(_) | ServerError::TooManyKeys { .. } => Status::ResourceExhausted,
            ServerError::KeyCacheMiss { .. } => Status::KeyCacheMiss,
            ServerError::Unsupported(_) | ServerError::ReadOnly(_) => Status::Unsupported,
            ServerError::Stopping => Status::Aborted,
            ServerError::Internal(_) => Status::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_refusal_keeps_the_replicas_status_and_names_the_replica() {
        let e = ServerError::ReplicaRefused { node: 3, status: Status::ResourceExhausted, message: "quota".into() };
        assert_eq!(e.status(), Status::ResourceExhausted);
        assert_eq!(e.to_string(), "replica node 3: quota");
    }

    #[test]
    fn failures_of_the_chain_are_stale_epoch_so_the_worker_retries_them() {
        for e in [
            ServerError::StaleEpoch { asked: 2, current: 3 },
            ServerError::ForwardFailed { what: String::new(), node: 2, error: "closed".into() },
            ServerError::NoAck { node: 2, error: "timed out".into() },
        ] {
            assert_eq!(e.status(), Status::StaleEpoch, "{e}");
        }
        let e = ServerError::ForwardFailed { what: "rounds of table 4 ".into(), node: 2, error: "closed".into() };
        assert_eq!(e.to_string(), "forwarding rounds of table 4 to replica node 2 failed: closed");
    }

    #[test]
    fn a_fenced_worker_is_denied_with_the_fences_message() {
        let e = ServerError::from(Fenced { rank: 0, node: 100, holder: 101 });
        assert_eq!(e.status(), Status::PermissionDenied);
        assert!(e.to_string().contains("taken over by node 101"));
    }
}
