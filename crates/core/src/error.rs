//! Errors of the core: every one names what was wrong with the input.

use thiserror::Error;

/// An error found by the core while checking or applying a request.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CoreError {
    /// Keys of a request must be strictly increasing (sorted and unique).
    #[error("keys must be sorted and unique: key #{index} ({key}) is not greater than the one before ({prev})")]
    UnsortedKeys {
        /// Position of the offending key.
        index: usize,
        /// The offending key.
        key: u64,
        /// The key before it.
        prev: u64,
    },
    /// The number of values does not match keys × value length.
    #[error("length mismatch: {keys} keys with value length {value_len} need {expected} values, got {got}")]
    LengthMismatch {
        /// Number of keys.
        keys: usize,
        /// Values per key of the table.
        value_len: usize,
        /// keys × value_len.
        expected: usize,
        /// Values supplied.
        got: usize,
    },
    /// A key outside the table's domain (dense tables hold a fixed range).
    #[error("key {key} is outside table {table}'s key range {range}")]
    KeyOutOfRange {
        /// Table id.
        table: u32,
        /// Offending key.
        key: u64,
        /// The table's domain.
        range: crate::KeyRange,
    },
    /// A table definition is not valid.
    #[error("invalid table definition: {0}")]
    InvalidTable(String),
    /// An update rule name or its parameters are not valid.
    #[error("invalid update rule: {0}")]
    InvalidRule(String),
    /// A malformed frame or message.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// A consistency model or clock event that makes no sense.
    #[error("invalid consistency setting: {0}")]
    Consistency(String),
    /// Replication: data whose every copy was lost, or an update that does not fit the
    /// table's shards and workers.
    #[error("replication: {0}")]
    Replication(String),
    /// A checkpoint could not be read or written (the message names the file).
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A size limit was exceeded.
    #[error("limit exceeded: {0}")]
    Limit(String),
    /// A filter could not decode a payload (corrupt, or encoded by a different filter setup).
    #[error("cannot decode the payload: {0}")]
    Codec(String),
    /// A key list sent as its signature is not in the receiver's cache: the sender must send
    /// the keys again.
    #[error("key cache miss: slot {slot} does not hold the signed key list")]
    KeyCacheMiss {
        /// The cache slot the sender named.
        slot: u32,
    },
}

/// Result with a [`CoreError`].
pub type Result<T> = std::result::Result<T, CoreError>;

impl From<downpour_wire::WireError> for CoreError {
    fn from(e: downpour_wire::WireError) -> Self {
        match e {
            downpour_wire::WireError::Malformed(m) => CoreError::Malformed(m),
            downpour_wire::WireError::Limit(m) => CoreError::Limit(m),
        }
    }
}
