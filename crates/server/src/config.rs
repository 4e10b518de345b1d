//! Server settings: [`ServerConfig`] and the resource [`Limits`] a server enforces, with
//! their defaults.

use downpour_core::filter::FilterRegistry;
use downpour_core::proto;
use downpour_core::rule::RuleRegistry;
use downpour_transport::Transport;
use std::sync::Arc;

/// Server settings.
#[derive(Clone)]
pub struct ServerConfig {
    /// Largest reply chunk, in bytes.
    pub chunk_bytes: usize,
    /// What one request, and the server as a whole, may ask for.
    pub limits: Limits,
    /// The cluster secret: data calls are served only on connections that identified as a
    /// registered worker with the credential derived from it (`msg::worker_credential`).
    pub secret: Option<String>,
    /// Update rules the server knows (built-ins plus user rules).
    pub rules: RuleRegistry,
    /// User filters the server knows (tables name them as `user:NAME`).
    pub filters: FilterRegistry,
    /// How this server reaches the other servers (replicated jobs: chain forwarding and
    /// replica copies). Required when the job replicates.
    pub peer_transport: Option<Arc<dyn Transport>>,
    /// The job's checkpoint directory (`--checkpoint-dir`), shared by every node: a worker's
    /// [`Op::Checkpoint`] has this server write its part into a `ckpt-N.tmp` directory under
    /// it. `None` refuses checkpoint requests.
    ///
    /// [`Op::Checkpoint`]: downpour_core::msg::Op::Checkpoint
    pub checkpoint_dir: Option<std::path::PathBuf>,
    /// The checkpoint to start from (`--resume`), read at the edge: a table created with an
    /// id found there starts with that table's rows this server holds (its range, or the
    /// shards it is in the chain of); its definition must be the checkpoint's.
    pub resume: Option<Arc<Vec<proto::CheckpointPart>>>,
    /// A read-only serving node (`downpour serve`): its tables are installed by the process
    /// ([`crate::serving`]); pulls read without creating rows, and pushes, clocks, table
    /// creation (other than of a table it holds, identically) and the other writes are refused.
    pub read_only: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            chunk_bytes: 2 << 20,
            limits: Limits::default(),
            secret: None,
            rules: RuleRegistry::new(),
            filters: FilterRegistry::new(),
            peer_transport: None,
            checkpoint_dir: None,
            resume: None,
            read_only: false,
        }
    }
}

/// Resource limits of a server. A request over a limit is refused with
/// `Status::ResourceExhausted` (or `InvalidArgument` for a table definition) and a message
/// naming the limit; nothing of it is applied, and the server keeps serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Keys in one request frame (a chunk), at most.
    pub max_keys_per_request: usize,
    /// `value_len` of a table, at most.
    pub max_value_len: usize,
    /// Tables on the server, at most.
    pub max_tables: usize,
    /// Bytes the tables' rows may hold in all (capacity included). A request that could
    /// grow them past it (keys not stored yet, counted at twice a row's size) is refused,
    /// as is a dense table that does not fit.
    pub memory_quota_bytes: u64,
}

impl Default for Limits {
    /// 4 Mi keys per request (32 MiB of keys; requests are chunked at 2 MiB by default),
    /// value length 65,536, 1,024 tables, no memory quota (the command line sets one from
    /// the machine's memory).
    fn default() -> Self {
        Limits { max_keys_per_request: 1 << 22, max_value_len: 1 << 16, max_tables: 1024, memory_quota_bytes: u64::MAX }
    }
}
