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

/// How the network transports (framed TCP, gRPC) poll for the next frame before a read
/// sleeps: long enough for the reply to a small request from a co-located or nearby peer
/// (15–30 µs on loopback), yielding the core after the first few polls (each one a system
/// call) to any other thread that wants it.
pub(crate) const NETWORK: Spin = Spin { budget: Duration::from_micros(50), pauses: 16 };

/// After a poll that found nothing within its budget, the waits that go straight to sleep
/// before one polls again ([`Backoff`]).
const SKIPS: u32 = 2;

/// Polling that pauses after it came up empty: a connection whose frames come further apart
/// than the budget (a server between a worker's requests while the worker collects other
/// servers' replies) polls one wait in [`SKIPS`] + 1, and leaves the core to the threads
/// that are working; one whose frames come fast polls every time. (On a 2-vCPU machine
/// running 3 servers and 2 workers, polling every time cost replicated 1 MiB pushes 20 %;
/// docs/benchmarks.md.)
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    skips: u32,
}

impl Backoff {
    /// Whether this wait polls before it sleeps (false: one of the waits after an empty poll).
    pub(crate) fn polls(&mut self) -> bool {
        if self.skips > 0 {
            self.skips -= 1;
            false
        } else {
            true
        }
    }

    /// This wait's poll found nothing: the next [`SKIPS`] waits sleep at once.
    pub(crate) fn came_up_empty(&mut self) {
        self.skips = SKIPS;
    }
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
    fn after_an_empty_poll_the_next_waits_sleep_at_once_then_polling_resumes() {
        let mut b = Backoff::default();
        assert!(b.polls() && b.polls(), "polls while its polls find frames");
        b.came_up_empty();
        for _ in 0..SKIPS {
            assert!(!b.polls());
        }
        assert!(b.polls());
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
