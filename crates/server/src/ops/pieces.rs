//! A range push applied straight from the connection's shared-memory ring, piece by piece
//! (`--transport shm`): the connection loop leaves a range push's values in the ring when
//! they are whole there already ([`downpour_transport::Connection::payload_here`]), and the
//! push's handler copies them out one piece at a time into a buffer that stays in cache,
//! applying each piece as it comes. A push chunk (2 MiB by default) otherwise went out to a
//! buffer of its own size and back in before its rule read it.

use crate::conn::ConnCtx;
use crate::error::ServerError;
use downpour_core::proto::FrameHeader;
use downpour_core::table::Table;
use downpour_transport::{value_bytes_mut, Connection, TransportError};

/// Values per piece: 128 KiB, inside a core's L2 cache, and at least the framed-TCP
/// connection's read-ahead buffer, so that each piece is copied from the ring straight into
/// the buffer (not through the read-ahead).
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
    if ctx.piece.len() < PIECE_VALUES {
        ctx.piece.resize(PIECE_VALUES, 0.0);
    }
    t.set_feed_writer(h.sender);
    let applied = t.push_range_pieces(h.range_begin, n, &mut ctx.piece, |piece| conn.recv_values_piece(value_bytes_mut(piece)))?;
    Ok(applied.map(|_| ()).map_err(ServerError::Core))
}
