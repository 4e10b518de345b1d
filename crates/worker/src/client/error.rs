//! Why a client call fails: [`ClientError`].

use downpour_core::msg::Status;
use downpour_core::CoreError;
use downpour_transport::TransportError;
use thiserror::Error;

use super::Timestamp;

/// Why a client call failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The request was invalid; nothing was sent.
    #[error("invalid request: {0}")]
    Invalid(#[from] CoreError),
    /// The table is not known to this client (create or declare it first).
    #[error("table {0} is not known to this client: create it with create_table or declare it with use_table")]
    UnknownTable(u32),
    /// A server refused the request.
    #[error("server {server} ({addr}) refused the request: {status:?}: {message}")]
    Server {
        /// Server rank.
        server: usize,
        /// Its address.
        addr: String,
        /// Status code.
        status: Status,
        /// Its message.
        message: String,
    },
    /// A server could not be reached or went away.
    #[error("server {server}: {cause}")]
    Transport {
        /// Server rank.
        server: usize,
        /// What happened (in the message, not a separate error source, so it prints once).
        cause: TransportError,
    },
    /// A replicated job could not recover from a server failure (no working routing table in
    /// time, or the coordinator could not be asked for one).
    #[error("fail-over: {0}")]
    Failover(String),
    /// A request that is not kept for a fail-over (a summary, a vector program, a table
    /// creation) was under way when a server failed; the routing has changed since.
    #[error("the request was interrupted by a server failure (the routing changed); it was not sent again")]
    Interrupted,
    /// A replacement worker could not go on from the lost worker's progress record.
    #[error("cannot go on from the lost worker's progress record: {0}")]
    Resume(String),
    /// A timestamp that was never issued or was already consumed.
    #[error("timestamp {0:?} is unknown (never issued, or its result was already taken)")]
    UnknownTimestamp(Timestamp),
    /// A server sent a reply that does not match the request.
    #[error("server {server} sent a bad reply: {message}")]
    BadReply {
        /// Server rank.
        server: usize,
        /// What was wrong.
        message: String,
    },
}
