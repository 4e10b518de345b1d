//! Polling before sleeping, the receive paths' first step ([`poll_for`]): a thread that
//! sleeps leaves its core idle, and waking it costs a small virtual machine tens of
//! microseconds (its vCPU halted, then woken by an interrupt through the hypervisor) on
//! both sides of every hand-off — longer than the next frame of a request–reply exchange
//! usually takes to come. The in-process channels, the shared-memory rings and framed TCP's
//! socket, and gRPC's stream (each poll a look at it and a turn of its runtime), each poll
//! their own way ([`Spin`]) through this one loop; the two network transports back off
//! ([`Backoff::poll_for`]) on connections whose polls come up empty.

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
/// sleeps: for `budget` ([`crate::NetConfig::poll`]; zero: never), yielding the core after
/// the first few polls (each one a system call) to any other thread that wants it.
pub(crate) fn network(budget: Duration) -> Option<Spin> {
    (!budget.is_zero()).then_some(Spin { budget, pauses: 16 })
}

/// After a poll that found nothing within its budget, the waits that go straight to sleep
/// before one polls again: [`FIRST_SKIPS`], doubled after each further empty poll up to
/// [`MAX_SKIPS`] ([`Backoff`]).
const FIRST_SKIPS: u32 = 2;
/// The most waits a [`Backoff`] lets sleep at once between two polls.
const MAX_SKIPS: u32 = 64;

/// Polling that backs off while it comes up empty: a connection whose frames come further
/// apart than the budget (a server between a worker's requests while the worker collects
/// other servers' replies, a replica between forwarded pushes) soon polls one wait in 65 and
/// leaves the core to the threads that are working; one whose frames come fast polls every
/// time, and one poll that finds a frame starts over. (On a 2-vCPU machine running 3
/// servers and 2 workers, polling every time cost replicated 1 MiB pushes 20 %;
/// docs/benchmarks.md.)
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    /// Waits left to sleep at once.
    skips: u32,
    /// How many the last empty poll let sleep (0: the last poll found a frame).
    last: u32,
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

    /// This wait's poll found a frame: the next wait polls too.
    pub(crate) fn found(&mut self) {
        self.last = 0;
    }

    /// This wait's poll found nothing: the next waits sleep at once, twice as many as after
    /// the last empty poll if no poll found a frame since.
    pub(crate) fn came_up_empty(&mut self) {
        self.last = if self.last == 0 { FIRST_SKIPS } else { (self.last * 2).min(MAX_SKIPS) };
        self.skips = self.last;
    }

    /// One wait's polling: [`poll_for`] with `spin` unless there is none (the transport does
    /// not poll) or this wait is one of those that sleep at once; what it found, if anything,
    /// and the backoff updated.
    pub(crate) fn poll_for<R>(&mut self, spin: Option<Spin>, poll: impl FnMut() -> Option<R>) -> Option<R> {
        let spin = spin.filter(|_| self.polls())?;
        let got = poll_for(spin, poll);
        match got {
            Some(_) => self.found(),
            None => self.came_up_empty(),
        }
        got
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
    fn empty_polls_back_off_twice_as_far_each_time_and_a_found_frame_starts_over() {
        let mut b = Backoff::default();
        assert!(b.polls() && b.polls(), "polls while its polls find frames");
        let slept = |b: &mut Backoff| {
            b.came_up_empty();
            let mut n = 0;
            while !b.polls() {
                n += 1;
            }
            n
        };
        assert_eq!(slept(&mut b), FIRST_SKIPS);
        assert_eq!(slept(&mut b), 2 * FIRST_SKIPS);
        for _ in 0..10 {
            slept(&mut b);
        }
        assert_eq!(slept(&mut b), MAX_SKIPS);
        b.found();
        assert_eq!(slept(&mut b), FIRST_SKIPS);
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
