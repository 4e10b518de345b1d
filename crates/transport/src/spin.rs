//! Polling before sleeping, the receive paths' first step ([`poll_for`]): a thread that
//! sleeps leaves its core idle, and waking it costs a small virtual machine tens of
//! microseconds (its vCPU halted, then woken by an interrupt through the hypervisor) on
//! both sides of every hand-off — longer than the next frame of a request–reply exchange
//! usually takes to come. The in-process channels, the shared-memory rings and framed TCP's
//! socket each poll their own way ([`Spin`]) through this one loop.

use std::time::{Duration, Instant};

/// How a receive polls before it sleeps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spin {
    /// Polls no longer than this (measured from the first poll).
    pub(crate) budget: Duration,
    /// Polls with the CPU's pause hint between them; every later poll yields the core first
    /// (so that another runnable thread, perhaps the one this waits for, gets it). `u32::MAX`:
    /// never yields.
    pub(crate) pauses: u32,
}

/// Polls `poll` until it gives `Some` (returned) or `spin.budget` has passed since the first
/// poll (`None`: the caller sleeps its own way). `poll` is called at least once.
#[inline]
pub(crate) fn poll_for<R>(spin: Spin, mut poll: impl FnMut() -> Option<R>) -> Option<R> {
    let start = Instant::now();
    let mut polls = 0u32;
    loop {
        if let Some(r) = poll() {
            return Some(r);
        }
        if start.elapsed() >= spin.budget {
            return None;
        }
        polls = polls.saturating_add(1);
        if polls < spin.pauses {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_poll_returns_at_once_and_a_never_ready_one_gives_up_after_the_budget() {
        let spin = Spin { budget: Duration::from_millis(5), pauses: 4 };
        let mut calls = 0;
        assert_eq!(
            poll_for(spin, || {
                calls += 1;
                Some(7)
            }),
            Some(7)
        );
        assert_eq!(calls, 1);
        let t = Instant::now();
        let mut calls = 0u32;
        assert_eq!(
            poll_for(spin, || {
                calls += 1;
                None::<()>
            }),
            None
        );
        assert!(t.elapsed() >= spin.budget);
        assert!(calls > 4, "polled {calls} times, past the pauses too");
    }

    #[test]
    fn a_poll_that_becomes_ready_within_the_budget_is_returned() {
        let spin = Spin { budget: Duration::from_secs(10), pauses: u32::MAX };
        let mut calls = 0;
        assert_eq!(
            poll_for(spin, || {
                calls += 1;
                (calls == 100).then_some(calls)
            }),
            Some(100)
        );
    }
}
