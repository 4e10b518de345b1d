//! # downpour-wire
//!
//! The contract between Downpour's nodes, with no I/O: what goes on the wire and how it is
//! framed. A program that speaks this crate's messages over a `downpour-transport`
//! connection is a node.
//!
//! * [`proto`]: the protobuf messages, generated from `proto/downpour.proto` (the frame
//!   header, and the bodies of control, data and replication requests);
//! * [`msg`]: the frame header's operations ([`msg::Op`]) and statuses ([`msg::Status`]),
//!   building requests and replies, and the worker credential;
//! * [`codec`]: the frame codec (header length, header, payload) and the limits a receiver
//!   enforces ([`codec::FrameLimits`]);
//! * [`WireError`]: why a frame is refused (malformed, or over a limit).
//!
//! `downpour-core` re-exports the three modules (`downpour_core::{proto, msg, codec}`).

#![warn(missing_docs)]

pub mod codec;
pub mod msg;

/// Wire messages generated from `proto/downpour.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/downpour.v1.rs"));
}

/// Why a frame is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The frame does not decode or contradicts itself.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The frame exceeds a limit the receiver enforces.
    #[error("limit exceeded: {0}")]
    Limit(String),
}
