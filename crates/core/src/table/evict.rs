//! A table's eviction ([`crate::eviction`] applied to its sparse store): its state, the
//! marks its walks set, and the passes a server makes over it one storage shard at a time.

use super::{Store, Table};
use crate::admission::Admitter;
use crate::eviction::{EvictClock, Eviction, EvictionStats, Histogram, Mark, Tick, Victims};
use crate::hashstore::Touch;

/// A table's eviction: the policy, what the rows' marks hold, the clock, what it did.
pub(super) struct Evicting {
    pub(super) policy: Eviction,
    pub(super) mark: Mark,
    pub(super) clock: EvictClock,
    /// Milliseconds per tick of the marks.
    pub(super) tick_ms: u64,
    pub(super) stats: EvictionStats,
    /// When the last pass ended, ms.
    pub(super) last_pass: u64,
}

impl Evicting {
    /// The tick now (wrapping at 2^32).
    fn now(&self) -> Tick {
        (self.clock.now_ms() / self.tick_ms) as Tick
    }
}

/// One eviction pass over a table ([`Table::eviction_plan`]): the rows it takes, decided at `now`.
#[derive(Clone, Debug)]
pub struct EvictPass {
    /// The rows to drop.
    pub victims: Victims,
    /// The tick the pass was decided at (ages are counted from it).
    pub now: Tick,
}

impl Table {
    /// Under `memory`, whether the table holds more rows than a pass keeps (true for the
    /// other policies): arrays past the cap with fewer rows have nothing to drop (they are
    /// between a growth and a pass's rebuild), and a pass then would survey in vain.
    fn rows_to_drop(&self, e: &Evicting) -> bool {
        let Store::Sparse(h) = &self.store else { return true };
        let fixed = self.admitter.as_ref().map_or(0, Admitter::bytes);
        e.policy.memory_keep(h.row_bytes(), fixed).is_none_or(|keep| self.len() as u64 > keep)
    }

    /// The bytes a policy bounds: the projected bytes under `memory` (a pass over the
    /// shards), nothing to compute for the others.
    fn bound_bytes(&self, e: &Evicting) -> u64 {
        if matches!(e.policy, Eviction::Memory { .. }) {
            self.projected_bytes() as u64
        } else {
            0
        }
    }

    /// What the eviction of a table with [`super::TableDef::evict`] set did so far (`None` otherwise).
    pub fn eviction(&self) -> Option<EvictionStats> {
        self.evicting.as_ref().map(|e| e.stats)
    }

    /// Sets the clock eviction reads time from (by default the wall clock from the table's
    /// creation; tests set a [`EvictClock::manual`] one). No effect without eviction.
    pub fn set_evict_clock(&mut self, clock: EvictClock) {
        if let Some(e) = self.evicting.as_mut() {
            e.clock = clock;
        }
    }

    /// The eviction clock's tick now (0 without eviction).
    pub fn evict_now(&self) -> Tick {
        self.evicting.as_ref().map_or(0, Evicting::now)
    }

    /// Whether an eviction pass is due now ([`Eviction::due`]): cheap, for a background
    /// thread to ask every tick.
    pub fn eviction_due(&self) -> bool {
        self.evicting
            .as_ref()
            .is_some_and(|e| e.policy.due(self.len() as u64, self.bound_bytes(e), e.clock.now_ms(), e.last_pass) && self.rows_to_drop(e))
    }

    /// Whether the table holds more than its `lru`/`lfu`/`memory` bound allows (a pass is
    /// due at once; `ttl` passes come with time). Cheap: for the request path.
    #[inline]
    pub fn over_eviction_bound(&self) -> bool {
        self.evicting.as_ref().is_some_and(|e| {
            !matches!(e.policy, Eviction::Ttl { .. }) && e.policy.due(self.len() as u64, self.bound_bytes(e), 0, 0) && self.rows_to_drop(e)
        })
    }

    /// Counts the rows of storage shard `shard` (`0..hashstore::SHARDS`) by coldness at
    /// `now` into `hist`, the first step of a pass. No effect without eviction.
    pub fn eviction_survey(&self, shard: usize, now: Tick, hist: &mut Histogram) {
        self.eviction_survey_where(shard, now, hist, |_| true);
    }

    /// [`Table::eviction_survey`] over the rows whose key is `eligible` (a replicated
    /// table's head surveys the rows of the shards it heads: `core::chain_evict`).
    pub fn eviction_survey_where(&self, shard: usize, now: Tick, hist: &mut Histogram, eligible: impl Fn(u64) -> bool) {
        if let (Some(e), Store::Sparse(h)) = (&self.evicting, &self.store) {
            if !matches!(e.policy, Eviction::Ttl { .. }) {
                h.survey_shard(shard, e.mark, now, hist, eligible);
            }
        }
    }

    /// The pass to make, from the survey of every shard at `now` (`hist`; a `ttl` pass needs
    /// none); `None` when nothing is to go.
    pub fn eviction_plan(&self, hist: &Histogram, now: Tick) -> Option<EvictPass> {
        let (e, Store::Sparse(h)) = (self.evicting.as_ref()?, &self.store) else { return None };
        let fixed = self.admitter.as_ref().map_or(0, Admitter::bytes);
        e.policy.plan(self.len() as u64, h.row_bytes(), fixed, hist, 1.0).map(|victims| EvictPass { victims, now })
    }

    /// The pass to make over a `share` (in (0, 1]) of the table's bound, from the survey of
    /// the rows it applies to (`hist`, which also counts them): a replicated table's head
    /// keeps the rows it heads under its bound divided by the copies of each row, so that
    /// with every server heading a like part each one's rows stay near the bound.
    pub fn eviction_plan_share(&self, hist: &Histogram, now: Tick, share: f64) -> Option<EvictPass> {
        let (e, Store::Sparse(h)) = (self.evicting.as_ref()?, &self.store) else { return None };
        let fixed = self.admitter.as_ref().map_or(0, Admitter::bytes);
        e.policy.plan(hist.total(), h.row_bytes(), fixed, hist, share).map(|victims| EvictPass { victims, now })
    }

    /// Drops the rows of storage shard `shard` that `pass` takes, calling `gone(key)` for
    /// each; returns how many. A server calls it one shard at a time under the table's lock,
    /// so pushes wait for one shard's work at most.
    /// Under change tracking, each key dropped is recorded as a tombstone for incremental export.
    pub fn evict_shard(&mut self, shard: usize, pass: &mut EvictPass, gone: impl FnMut(u64)) -> usize {
        self.evict_shard_where(shard, pass, |_| true, gone)
    }

    /// [`Table::evict_shard`] among the rows whose key is `eligible` (those
    /// [`Table::eviction_survey_where`] surveyed).
    pub fn evict_shard_where(
        &mut self,
        shard: usize,
        pass: &mut EvictPass,
        eligible: impl Fn(u64) -> bool,
        mut gone: impl FnMut(u64),
    ) -> usize {
        let (Some(e), Store::Sparse(h)) = (self.evicting.as_mut(), &mut self.store) else { return 0 };
        let changes = &mut self.changes;
        let shrink = if matches!(e.policy, Eviction::Memory { .. }) { crate::eviction::REBUILT_LOAD } else { crate::eviction::SHRINK_LOAD };
        let n = h.evict_shard(shard, e.mark, pass.now, &mut pass.victims, shrink, eligible, |k| {
            if let Some(c) = changes.as_mut() {
                c.evicted(k);
            }
            gone(k)
        });
        e.stats.evicted += n as u64;
        if n > 0 {
            self.feed_lost();
        }
        n
    }

    /// Drops the rows of `keys` (any order; keys without a row are skipped) as this
    /// table's eviction would: each one counted as evicted and, under change tracking,
    /// recorded as a tombstone. A replica applying its chain head's drop
    /// (`core::chain_evict`). Returns the rows dropped.
    pub fn drop_rows(&mut self, keys: &[u64]) -> usize {
        let Store::Sparse(h) = &mut self.store else { return 0 };
        let mut n = 0;
        for &k in keys {
            if h.remove_keys(std::slice::from_ref(&k)) == 1 {
                if let Some(c) = self.changes.as_mut() {
                    c.evicted(k);
                }
                n += 1;
            }
        }
        if let Some(e) = self.evicting.as_mut() {
            e.stats.evicted += n as u64;
        }
        if n > 0 {
            self.feed_lost();
        }
        n
    }

    /// Records the end of a pass (the next `ttl` pass is due a quarter of the TTL later).
    pub fn eviction_pass_done(&mut self) {
        if let Some(e) = self.evicting.as_mut() {
            e.stats.passes += 1;
            e.last_pass = e.clock.now_ms();
        }
    }

    /// A whole eviction pass at once, under the caller's hold of the table: survey, plan,
    /// drop. Returns the rows dropped (0 without eviction or when nothing is due to go).
    pub fn evict(&mut self) -> usize {
        let now = self.evict_now();
        let mut hist = Histogram::default();
        for s in 0..crate::hashstore::SHARDS {
            self.eviction_survey(s, now, &mut hist);
        }
        let mut n = 0;
        if let Some(mut pass) = self.eviction_plan(&hist, now) {
            for s in 0..crate::hashstore::SHARDS {
                n += self.evict_shard(s, &mut pass, |_| {});
            }
        }
        self.eviction_pass_done();
        n
    }

    /// How the next walks mark rows for eviction: as used (`reaching`: a push, a pull, rows
    /// installed) or not at all (a peek).
    pub(super) fn touch(&mut self, reaching: bool) {
        if let (Some(e), Store::Sparse(h)) = (&self.evicting, &mut self.store) {
            h.set_touch(match (reaching, e.mark) {
                (false, _) => Touch::Off,
                (true, Mark::Stamp) => Touch::Stamp(e.now()),
                (true, Mark::Count) => Touch::Count,
            });
        }
    }
}
