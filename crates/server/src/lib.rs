//! # downpour-server
//!
//! A server node holds its key range of every table and answers pushes and pulls. Each
//! connection is served by its own thread with blocking I/O: the frame is read straight
//! into reused buffers, applied to the table under that table's lock, and answered on the
//! same thread (no queue hand-off). Large requests arrive in chunks and are applied chunk
//! by chunk, so a 64 MiB push needs no 64 MiB buffer; dense pulls are written to the
//! connection straight from the table's array.
//!
//! [`run_server_node`] registers with a coordinator, serves, heartbeats, and returns when
//! the coordinator ends the job.
//!
//! ## Layout
//!
//! - `config`: [`ServerConfig`] and [`Limits`].
//! - `state`: [`ServerState`], the shared state of a node, and its tables' slots.
//! - `listener`: [`Server`] and [`ServerHandle`], the accept loop.
//! - `conn`: [`serve_connection`], one connection's loop and its reusable state.
//! - `dispatch`: `handle_frame`, the per-op dispatch of one request frame.
//! - `error`: [`ServerError`], why a request was refused (each variant one wire status).
//! - `gate`: consistency gating of unreplicated tables (clock waits, `bsp` round buffering).
//! - `ops`: the table operations (creation and memory quota, range pulls, filtered frames,
//!   vector programs).
//! - `repl`: replicated jobs: chain pushes, `bsp` rounds down the chains, epoch moves and
//!   replica copies ([`move_to_epoch`]), worker fencing, connections to peer servers.
//! - `evict`: the background thread that drops rows of tables with an eviction policy.
//! - `metrics`: the Prometheus endpoint (`/metrics`, `/healthz`) on `--metrics-listen`.
//! - `checkpoint`: writing this server's checkpoint part and restoring from one.
//! - `node`: [`run_server_node`], a server node in a cluster.

#![warn(missing_docs)]

mod checkpoint;
mod config;
mod conn;
mod dispatch;
mod error;
mod evict;
mod gate;
mod listener;
mod metrics;
mod node;
mod ops;
mod repl;
pub mod serving;
mod state;

pub use config::{Limits, ServerConfig};
pub use conn::serve_connection;
pub use error::ServerError;
pub use listener::{Server, ServerHandle};
pub use metrics::{render as render_metrics, serve_metrics};
pub use node::{advertised_addr, peak_rss_bytes, run_server_node, NodeConfig, NodeError};
pub use repl::epoch::{epoch_served, move_to_epoch, EpochError};
pub use state::ServerState;
