//! # downpour-worker
//!
//! [`KvClient`] is a worker's view of the parameter server: push, pull, fused push-pull
//! and range variants over (key, value) tables, and named dense tensors mapped onto key
//! ranges. A request is split by key range across servers and the parts are sent to all of
//! them before any reply is awaited; calls return a [`Timestamp`] at once and the caller
//! waits only when it needs the result ([`KvClient::wait`], [`KvClient::wait_values`]).
//!
//! The client is single-threaded by design: the calling thread does the socket I/O itself
//! (no hand-off to an I/O thread), keys and values are sent straight from the caller's
//! slices, and replies are read straight into the destination. Large requests go out in
//! chunks; per-chunk replies are read while later chunks are sent, so neither side can
//! block the other.
//!
//! [`WorkerSession`] joins a job through the coordinator (registration, routing table,
//! heartbeats, barriers, done).

#![warn(missing_docs)]

mod cache;
mod client;
mod failover;
pub mod metrics;
mod session;

pub use cache::{CacheStats, PendingRead, ReadCache};
pub use client::{After, ClientError, FeedAnswer, FeedQuestion, KvClient, KvConfig, TableChanges, Timestamp};
pub use session::{join_job, AdoptHook, CheckpointConfig, CheckpointEvery, SessionConfig, WorkerSession};
