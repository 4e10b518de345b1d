//! Fencing of replaced workers ([`fence_worker`]): pushes and clocks under a worker rank
//! are admitted only from the newest node that held it. The rule is
//! [`downpour_core::fence::WorkerFence`]; this file maps its refusal to the wire.

use crate::conn::ReqResult;
use crate::state::ServerState;
use downpour_core::proto::FrameHeader;

/// Replicated jobs: admits a worker's push or clock under its rank only from the newest
/// node that used the rank here (see [`ServerState::holders`]); an older one was replaced
/// and is refused for good. Forwarded pushes are checked at their head. Admits everything
/// in unreplicated jobs (no fence).
pub(crate) fn fence_worker(st: &ServerState, h: &FrameHeader) -> ReqResult {
    let Some(fence) = st.holders.get() else { return Ok(()) };
    Ok(fence.admit(h.worker, h.sender)?)
}
