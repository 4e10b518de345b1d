//! # downpour-core
//!
//! The part of Downpour that does no I/O: key ranges and key/value buffers, partitioning
//! of key domains across servers, update rules, initializers, the tables a server holds,
//! dense tensor maps, and the wire message types and frame codec. Everything here is a plain
//! data structure driven by method calls, tested without sockets or threads; the
//! `downpour-transport`, `downpour-server`, `downpour-worker` and `downpour-coordinator`
//! crates execute its decisions over the network.
//!
//! Keys are `u64`, values `f32`. On the wire they travel as contiguous little-endian byte
//! buffers; Downpour therefore only builds for little-endian targets, where those buffers
//! are the in-memory representation and need no per-element conversion.

#[cfg(not(target_endian = "little"))]
compile_error!("Downpour sends keys and values in their in-memory form: little-endian targets only");

pub mod admission;
pub mod blocks;
pub mod chain_epoch;
pub mod chain_evict;
pub mod chain_push;
pub mod chain_rounds;
pub mod changes;
pub mod checkpoint;
pub mod chunks;
pub mod consistency;
pub mod epochs;
pub mod error;
pub mod eviction;
pub mod feed;
pub mod fence;
pub mod filter;
pub mod gradcode;
pub mod hashstore;
pub mod init;
pub mod journal;
pub mod keys;
pub mod mds;
pub mod partition;
pub mod pieces;
pub mod prefetch;
pub mod ring;
pub mod rounds;
pub mod rule;
pub mod schedule;
pub mod shards;
pub mod shuffle;
pub mod subscription;
pub mod table;
pub mod tensor;
pub mod vecops;

/// The wire contract (`downpour-wire`): the protobuf messages, the frame header's
/// operations and statuses, and the frame codec.
pub use downpour_wire::{codec, msg, proto};

pub use error::{CoreError, Result};
pub use keys::KeyRange;
