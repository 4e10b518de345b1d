//! Message kinds, status codes and header constructors.
//!
//! Every frame carries a [`FrameHeader`]: who sent it
//! (`sender`), its sequence number (`request_id`, unique and increasing per sender), the
//! routing epoch it was addressed under, the sender's clock, and, for large requests, the
//! chunk index and a `last` flag. Replies echo the request id. These identities are what
//! later let servers drop duplicated pushes and fence stale epochs.
//!
//! Reply rules: `Push` and `PushRange` get one reply after their last chunk; `Pull`,
//! `PushPull` and `PushPullRange` get one reply per request chunk; `PullRange` is one
//! request frame answered by one or more chunks. In every case the reply flagged `last`
//! ends the request, and an error reply is always flagged `last` (later chunks of a failed
//! request are dropped by the server).

use crate::proto::FrameHeader;

/// What a frame asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Op {
    /// Create a table (idempotent for an identical definition). Body: `TableSpec` in `meta`.
    CreateTable = 1,
    /// Apply values to the given sorted keys with the table's update rule.
    Push = 2,
    /// Read the values of the given sorted keys (sparse tables create missing keys).
    Pull = 3,
    /// Push, then return the values after the update, in one round trip.
    PushPull = 4,
    /// Push values for every key of `[range_begin, range_end)` (no key list on the wire).
    PushRange = 5,
    /// Read all existing keys of `[range_begin, range_end)`; dense replies omit the keys.
    PullRange = 6,
    /// PushRange then return the updated values of the range.
    PushPullRange = 7,
    /// Liveness check on the data plane.
    Ping = 8,
    /// Like `Pull`, but never creates a key: missing keys read as their initial value
    /// (evaluation and serving must not grow the model).
    Peek = 9,
    /// The sender (worker rank in `worker`) has completed `clock` iterations: every push it
    /// sent before this frame belongs to clocks up to `clock`. Answered with an ack.
    Clock = 10,
    /// Register a node with the coordinator. Body: `RegisterRequest`.
    Register = 20,
    /// Wait until every worker has reached the barrier. Body: `BarrierRequest`.
    Barrier = 21,
    /// Heartbeat to the coordinator (body: `HeartbeatRequest`, may be empty); the reply
    /// (`HeartbeatReply`) may order a shutdown.
    Heartbeat = 22,
    /// A worker has finished its job. Body: `DoneRequest`.
    Done = 23,
    /// The current routing table. Reply body: `Routing`.
    GetRouting = 24,
    /// A worker's reports to the BPG task scheduler and its request for the next tasks.
    /// Body: `ScheduleRequest`; reply body: `ScheduleReply`.
    Schedule = 25,
    /// The first frame of a framed-TCP connection: the cluster's auth token in `meta`.
    /// Answered by the transport before anything else is read; never seen by a node.
    Hello = 26,
    /// A worker's first frame on a server connection when the cluster has a secret: its
    /// credential ([`worker_credential`]) in `meta`, its node id in `sender`. Without it, a
    /// server of such a cluster serves no data call on the connection.
    Identify = 27,
    /// Per value column of the table, over the keys this server stores: Σ|x| (f64) and the
    /// number of non-zero x (u64), 16 bytes a column, little-endian, sent as the values
    /// payload (4 f32 slots a column). For norms and sparsity without reading the model.
    Summarize = 28,
    /// Run a vector program (`VecProgram` in `meta`, see `downpour_core::vecops`) on this
    /// server's part of the named dense tables; the reply's values payload holds one f64
    /// (2 f32 slots, little-endian) per `dot`, in program order.
    VecOps = 29,
    /// Sandblaster's piece hand-out on the coordinator. Body: `PieceRequest`; reply body:
    /// `PieceReply` (see `downpour_core::pieces`).
    Pieces = 30,
    /// Server to server (replicated tables): the rows of one table in
    /// `[range_begin, range_end)` — keys, then per key its values and update-rule state in
    /// the values payload — and, in `meta`, the exactly-once watermarks of the range's
    /// shards (`downpour_core::shards::Watermarks`). Sent by a shard's surviving holder to a new
    /// chain member while an epoch is being prepared; the receiver replaces its rows of the
    /// range. `last` ends the copy, which is then acknowledged.
    ShardCopy = 31,
    /// A server tells the coordinator it has moved to an epoch and built its new replicas.
    /// Body: `EpochReady`.
    EpochReady = 32,
    /// Admin to coordinator: drain a server of a replicated job (its shards move to the
    /// other servers in a new epoch, then it exits). Body: `DrainRequest`; reply body:
    /// `DrainReply`.
    Drain = 33,
    /// Worker to coordinator: at a checkpoint point. Body: `CheckpointJoin`; reply body:
    /// `CheckpointJoinReply` (held until every worker joined and the checkpoint is written).
    CheckpointJoin = 34,
    /// The checkpoint's writer to the coordinator. Body: `CheckpointWritten`.
    CheckpointWritten = 35,
    /// Worker to server: write this server's part of a checkpoint. Body: `CheckpointRequest`.
    Checkpoint = 36,
    /// Worker to coordinator: where it stands with every request acknowledged (answered at
    /// once). Body: `WorkerCheckpoint`. Later records ride on heartbeats.
    Progress = 37,
    /// Worker to coordinator: a model-parallel job's round finished and the next one's
    /// blocks (held until every worker finished the round). Body: `BlocksRequest`; reply
    /// body: `BlocksReply` (see `downpour_core::blocks::BlockRounds`).
    Blocks = 38,
    /// Worker to coordinator: data handed out by the scheduler, a chunk completed and the
    /// next one asked for. Body: `ChunkRequest`; reply body: `ChunkReply` (see
    /// `downpour_core::chunks::ChunkBoard`).
    Chunks = 39,
    /// Incremental export: the rows of a change-tracking table in
    /// `[range_begin, range_end)` written since a moment (keys, then their values), or, with
    /// `evicted`, the keys this server's eviction dropped since then (keys only, whatever
    /// the range). Body: `ChangesRequest`. One request frame answered by one or more
    /// chunks, like `PullRange`.
    Changes = 40,
    /// The definitions of the tables this server holds: reply meta `TableList`. Answered
    /// to clients that identified like any data call (tools that join a running job).
    Tables = 41,
    /// Server to server (replicated tables with eviction): rows of one shard dropped by the
    /// shard's head, passed down the chain like an update (`downpour_core::chain_evict`).
    /// Keys: the rows, sorted; `meta`: the drop's identity, shard and the head's
    /// watermarks of the shard (`RowDrop::meta`). Applied once the receiver has every
    /// update those watermarks name, forwarded, and acknowledged once the tail has it.
    RowDrop = 42,
    /// Worker to server (a read cache, `ssp` tables): the rows of the table written since a
    /// position in its update feed (`downpour_core::feed`). Body: `FeedRequest`. Answered
    /// like `PullRange` (keys, then their values, in chunks), never held for clocks; the last
    /// chunk's `meta` is a `FeedReply`. Not for replicated tables.
    Feed = 43,
}

impl Op {
    /// Decodes an op code; `None` for unknown codes.
    pub fn from_u32(v: u32) -> Option<Op> {
        use Op::*;
        Some(match v {
            1 => CreateTable,
            2 => Push,
            3 => Pull,
            4 => PushPull,
            5 => PushRange,
            6 => PullRange,
            7 => PushPullRange,
            8 => Ping,
            9 => Peek,
            10 => Clock,
            20 => Register,
            21 => Barrier,
            22 => Heartbeat,
            23 => Done,
            24 => GetRouting,
            25 => Schedule,
            26 => Hello,
            27 => Identify,
            28 => Summarize,
            29 => VecOps,
            30 => Pieces,
            31 => ShardCopy,
            32 => EpochReady,
            33 => Drain,
            34 => CheckpointJoin,
            35 => CheckpointWritten,
            36 => Checkpoint,
            37 => Progress,
            38 => Blocks,
            39 => Chunks,
            40 => Changes,
            41 => Tables,
            42 => RowDrop,
            43 => Feed,
            _ => return None,
        })
    }
    /// True for requests whose every chunk is answered (rather than only the last).
    pub fn replies_per_chunk(self) -> bool {
        // (Summarize is one frame each way.)
        matches!(self, Op::Pull | Op::Peek | Op::PushPull | Op::PushPullRange)
    }
}

/// Reply status codes carried in `FrameHeader::status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The request was invalid (bad keys, lengths, definition...). Nothing was applied.
    InvalidArgument = 1,
    /// The table does not exist on this server.
    UnknownTable = 2,
    /// The request was addressed under another routing epoch: refresh the routing table.
    StaleEpoch = 3,
    /// A resource limit would be exceeded.
    ResourceExhausted = 4,
    /// The job failed or is shutting down.
    Aborted = 5,
    /// The op is not served by this node.
    Unsupported = 6,
    /// An internal error.
    Internal = 7,
    /// A key list sent as its signature is not in the server's cache: send the keys again.
    KeyCacheMiss = 8,
    /// The connection presented no auth token or the wrong one.
    Unauthenticated = 9,
    /// The caller is a cluster member but not allowed this call (e.g. a push from a
    /// connection that did not identify as a registered worker).
    PermissionDenied = 10,
    /// Not possible yet; the same call may succeed shortly (e.g. a worker registering while
    /// every rank is taken and a lost worker's rank may free up).
    Unavailable = 11,
}

impl Status {
    /// Decodes a status code; unknown codes read as `Internal`.
    pub fn from_u32(v: u32) -> Status {
        match v {
            0 => Status::Ok,
            1 => Status::InvalidArgument,
            2 => Status::UnknownTable,
            3 => Status::StaleEpoch,
            4 => Status::ResourceExhausted,
            5 => Status::Aborted,
            6 => Status::Unsupported,
            8 => Status::KeyCacheMiss,
            9 => Status::Unauthenticated,
            10 => Status::PermissionDenied,
            11 => Status::Unavailable,
            _ => Status::Internal,
        }
    }
}

/// The credential the coordinator gives a registered worker (node `node_id`) of a cluster
/// whose secret is `secret`: a keyed BLAKE3 hash, so servers, which know the secret, check it
/// without asking the coordinator, and a worker cannot make one for another node id.
pub fn worker_credential(secret: &str, node_id: u32) -> [u8; 32] {
    let key = blake3::derive_key("downpour 2026 worker credential", secret.as_bytes());
    *blake3::keyed_hash(&key, &node_id.to_le_bytes()).as_bytes()
}

/// A request header for `op` from `sender`.
pub fn request(op: Op, sender: u32, request_id: u64, epoch: u64, table: u32) -> FrameHeader {
    FrameHeader { request_id, op: op as u32, sender, epoch, table, last: true, ..Default::default() }
}

/// The ok reply to `req` (same id, op and table; flagged `last`).
pub fn reply_to(req: &FrameHeader, sender: u32) -> FrameHeader {
    FrameHeader {
        request_id: req.request_id,
        op: req.op,
        sender,
        epoch: req.epoch,
        table: req.table,
        chunk: req.chunk,
        last: true,
        ..Default::default()
    }
}

/// The error reply to `req`: flagged `last`, with a status and a message.
pub fn error_reply(req: &FrameHeader, sender: u32, status: Status, message: impl Into<String>) -> FrameHeader {
    let mut h = reply_to(req, sender);
    h.status = status as u32;
    h.error = message.into();
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn op_codes_round_trip_and_unknown_is_none() {
        for op in [
            Op::CreateTable,
            Op::Push,
            Op::Pull,
            Op::PushPull,
            Op::PushRange,
            Op::PullRange,
            Op::PushPullRange,
            Op::Ping,
            Op::Peek,
            Op::Clock,
            Op::Register,
            Op::Barrier,
            Op::Heartbeat,
            Op::Done,
            Op::GetRouting,
            Op::Schedule,
            Op::Hello,
            Op::Identify,
            Op::Summarize,
            Op::VecOps,
            Op::Pieces,
            Op::ShardCopy,
            Op::EpochReady,
            Op::Drain,
            Op::CheckpointJoin,
            Op::CheckpointWritten,
            Op::Checkpoint,
            Op::Progress,
            Op::Blocks,
            Op::Chunks,
            Op::Changes,
            Op::Tables,
            Op::RowDrop,
            Op::Feed,
        ] {
            assert_eq!(Op::from_u32(op as u32), Some(op));
        }
        assert_eq!(Op::from_u32(0), None);
        assert_eq!(Op::from_u32(999), None);
    }
}
