//! A range push applied straight from the connection's shared-memory ring, piece by piece
//! (`--transport shm`): the connection loop leaves a range push's values in the ring once
//! they are whole there ([`downpour_transport::Connection::payload_here`] waits for the
//! frame's last byte; a frame larger than the ring is read out whole), and the push's
//! handler copies them out one piece at a time into a buffer that stays in cache, applying
//! each piece as it comes, for a dense table under a built-in rule that is neither
//! replicated nor `bsp` (any other push takes its values whole first). A push chunk (2 MiB
//! by default) otherwise went out to a buffer of its own size and back in before its rule
//! read it.

use crate::conn::ConnCtx;
use crate::error::ServerError;
use downpour_core::proto::FrameHeader;
use downpour_core::table::Table;
use downpour_transport::{value_bytes_mut, Connection, TransportError};

/// Values per piece (more for a row longer than that: a piece is whole rows): 128 KiB,
/// inside a core's L2 cache, and at least the framed-TCP connection's read-ahead buffer, so
/// that a piece is copied from the ring straight into the buffer (all but the part the
/// read-ahead already holds and a short last piece, which pass through it).
const PIECE_VALUES: usize = 32 << 10;

/// Applies a range push of `n` values (`h.range_begin` on) that wait in `conn`'s ring,
/// under the table's lock `t` ([`Table::push_range_pieces`]: the whole range checked first,
/// so no piece is refused after another was applied). Preconditions:
/// [`Table::pieces_apply_alike`], and `conn` said the payload is here, so no piece waits on
/// the peer. A transport error between two pieces (the ring's shared positions found
/// corrupt: the peer process broke the mapping) leaves the pieces before it applied, and
/// closes the connection.
pub(crate) fn push_range_in_pieces(
    t: &mut Table,
    h: &FrameHeader,
    n: usize,
    ctx: &mut ConnCtx,
    conn: &mut dyn Connection,
) -> Result<Result<(), ServerError>, TransportError> {
    // at least one row
    let want = PIECE_VALUES.max(t.def().value_len);
    if ctx.piece.len() < want {
        ctx.piece.resize(want, 0.0);
    }
    t.set_feed_writer(h.sender);
    let applied = t.push_range_pieces(h.range_begin, n, &mut ctx.piece, |piece| conn.recv_values_piece(value_bytes_mut(piece)))?;
    Ok(applied.map(|_| ()).map_err(ServerError::Core))
}
