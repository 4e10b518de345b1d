//! Fencing of replaced workers ([`fence_worker`]): pushes and clocks under a worker rank
//! are admitted only from the newest node that held it.

use crate::conn::ReqResult;
use crate::state::ServerState;
use downpour_core::msg::Status;
use downpour_core::proto::FrameHeader;
use std::sync::atomic::Ordering;

/// Replicated jobs: admits a worker's push or clock under its rank only from the newest
/// node that used the rank here (see [`ServerState::holders`]); an older one was replaced
/// and is refused for good. Forwarded pushes are checked at their head. Admits everything
/// in unreplicated jobs (no holders).
pub(crate) fn fence_worker(st: &ServerState, h: &FrameHeader) -> ReqResult {
    let Some(slot) = st.holders.get().and_then(|hs| hs.get(h.worker as usize)) else { return Ok(()) };
    let mut cur = slot.load(Ordering::Acquire);
    loop {
        if h.sender == cur {
            return Ok(());
        }
        if h.sender < cur {
            return Err((
                Status::PermissionDenied,
                format!(
                    "worker rank {} was taken over by node {cur}: this worker (node {}) was declared lost and may no longer push",
                    h.worker, h.sender
                ),
            ));
        }
        match slot.compare_exchange(cur, h.sender, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(()),
            Err(now) => cur = now,
        }
    }
}
