//! Eviction for sparse tables, without I/O: which rows a server drops so that a table of ids
//! seen once (most of a click-through model's) does not grow until the server runs out of
//! memory. The policies of Monolith (expiring features), PERSIA (LRU-bounded tables),
//! TorchRec's zero-collision tables and HierarchicalKV (LRU, LFU, TTL, memory):
//!
//! * `ttl:DURATION`: a row not pushed or pulled for that long is dropped;
//! * `lru:MAX_ROWS`: beyond that many rows, the least recently used go;
//! * `lfu:MAX_ROWS`: beyond that many rows, the least often used go;
//! * `memory:MIB`: the table's arrays are kept under that many MiB: when they would pass
//!   [`MEMORY_HIGH`] of it once the shards near their growth threshold grew (uniform keys
//!   fill the shards evenly, so they grow together: half the table at once), the least
//!   recently used rows go until the rows left fit in [`MEMORY_LOW`] of it at the load a
//!   shrunk shard is rebuilt at. The arrays stay under the cap as long as a pass ends before
//!   the rows grow by a fifteenth (from 3/4 to 4/5 of the shards' slots).
//!
//! A table under eviction keeps one more 32-bit word per row (its *mark*): under `ttl`,
//! `lru` and `memory` the [`Tick`] of the row's last push or pull (a peek, which serving and
//! evaluation use, leaves it), under `lfu` the number of pushes and pulls (saturating).
//! Time comes in milliseconds from an [`EvictClock`] (the wall clock in a server, a clock
//! the caller sets in tests) and is marked in ticks of [`Eviction::tick_ms`]: 1 ms under
//! `lru` and `memory`, a 2^20th of the time to live under `ttl` (at least 1 ms). Ticks wrap
//! at 2^32; an age is read modulo that, and a mark less than 2^31 ticks ahead of the pass
//! (a row used after the pass began) reads as age 0. So ages are exact up to 24 days under
//! `lru`/`memory` (a row unused for longer than that, in a table that stayed under its
//! bound all that time, may read as younger than it is) and up to 2048 times the TTL.
//!
//! A pass ([`Eviction::plan`]) is decided from a [`Histogram`] of the rows' coldness (age,
//! or the inverse of the count, in buckets [`BUCKET_PRECISION`] apart), gathered one shard
//! at a time, and applied one shard at a time ([`Victims`]), so the server never holds a
//! table for more than one shard's worth of work. A pass takes from each bucket at most the
//! rows the survey counted there, coldest buckets first, in storage order within a bucket:
//! it takes exactly the excess it planned, never a row that came after the survey in place
//! of one it counted beyond that (new rows are the coldest under `lfu`), and is approximate
//! (within a bucket) only in which rows of similar coldness go.

use crate::{CoreError, Result};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a server asks a table whether a pass is due.
pub const CHECK_EVERY: Duration = Duration::from_millis(10);
/// A `memory:MIB` table is trimmed when its arrays would pass this fraction of the cap at
/// its shards' next growth (`HashStore::projected_bytes`).
pub const MEMORY_HIGH: f64 = 0.95;
/// ... down to rows that fit this fraction of it once their shards are rebuilt.
pub const MEMORY_LOW: f64 = 0.70;
/// Load factor of a shard rebuilt after an eviction (rows / slots): room to grow by a fifth
/// before the shard grows again.
pub const REBUILT_LOAD: f64 = 2.0 / 3.0;
/// Under `ttl`, `lru` and `lfu`, a shard is rebuilt smaller (at [`REBUILT_LOAD`]) only once
/// an eviction leaves it loaded below this: rows dropped here and there are deleted in place,
/// with no copy of the shard. (`memory` shrinks any shard that falls below [`REBUILT_LOAD`]:
/// its bound is on the arrays' size.)
pub const SHRINK_LOAD: f64 = 0.25;
/// Number of coldness buckets of a [`Histogram`].
pub const BUCKETS: usize = 464;
/// Relative width of a coldness bucket above 16: 1/16.
pub const BUCKET_PRECISION: f64 = 1.0 / 16.0;

/// Ticks since some start.
pub type Tick = u32;

/// When rows of a sparse table are dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Eviction {
    /// Never (the default).
    #[default]
    Never,
    /// Rows not pushed or pulled for `ms` milliseconds.
    Ttl {
        /// The time to live, ms (≥ 1).
        ms: u64,
    },
    /// The least recently used rows beyond `max_rows`.
    Lru {
        /// Rows kept (≥ 1).
        max_rows: u64,
    },
    /// The least often used rows beyond `max_rows`.
    Lfu {
        /// Rows kept (≥ 1).
        max_rows: u64,
    },
    /// The least recently used rows, keeping the table's arrays under `mib` MiB.
    Memory {
        /// The cap, MiB (> 0).
        mib: f64,
    },
}

impl Eviction {
    /// Whether rows are never dropped.
    pub fn is_never(&self) -> bool {
        matches!(self, Eviction::Never)
    }

    /// What a row's mark holds under this policy (`None` for [`Eviction::Never`]).
    pub fn mark(&self) -> Option<Mark> {
        match self {
            Eviction::Never => None,
            Eviction::Lfu { .. } => Some(Mark::Count),
            _ => Some(Mark::Stamp),
        }
    }

    /// Milliseconds per tick of a row's mark: a 2^20th of the time to live under `ttl` (at
    /// least 1), 1 otherwise.
    pub fn tick_ms(&self) -> u64 {
        match *self {
            Eviction::Ttl { ms } => ms.div_ceil(1 << 20).max(1),
            _ => 1,
        }
    }

    /// Whether a pass is due for a table of `len` rows and `bytes` bytes (projected to the
    /// shards' next growth: `HashStore::projected_bytes`) at `now_ms`, its last pass at
    /// `last_ms` (a cheap check a server makes every [`CHECK_EVERY`]): `lru`/`lfu` when the
    /// rows pass the maximum, `memory` when the bytes pass [`MEMORY_HIGH`] of the cap, `ttl` every quarter of the time to live (at most every second), so a row outlives
    /// its TTL by at most that.
    pub fn due(&self, len: u64, bytes: u64, now_ms: u64, last_ms: u64) -> bool {
        match *self {
            Eviction::Never => false,
            Eviction::Ttl { ms } => now_ms.saturating_sub(last_ms) >= (ms / 4).clamp(1, 1000) && len > 0,
            Eviction::Lru { max_rows } | Eviction::Lfu { max_rows } => len > max_rows,
            Eviction::Memory { mib } => bytes as f64 > mib * MEMORY_HIGH * (1u64 << 20) as f64,
        }
    }

    /// Under `memory:MIB`, the rows a pass keeps: those that fit [`MEMORY_LOW`] of the cap
    /// (less `fixed_bytes`) at the load shrunk shards are rebuilt at (`None` for the other
    /// policies). A table holding no more rows than this has nothing to drop, whatever its
    /// arrays' size (a server checks this too before a pass, so it never surveys in vain).
    pub fn memory_keep(&self, row_bytes: usize, fixed_bytes: usize) -> Option<u64> {
        let Eviction::Memory { mib } = *self else { return None };
        let room = (mib * MEMORY_LOW * (1u64 << 20) as f64 - fixed_bytes as f64).max(0.0);
        Some((room * REBUILT_LOAD / row_bytes.max(1) as f64) as u64)
    }

    /// The pass to make over a table of `len` rows of `row_bytes` bytes each (`fixed_bytes`
    /// more held whatever the rows, e.g. an admission sketch), whose rows' coldness at `now`
    /// is `hist`, keeping `share` (in (0, 1]) of the rows the bound allows (1 but on a
    /// replicated table's head: [`crate::table::Table::eviction_plan_share`]); `None` when
    /// nothing is to go.
    pub fn plan(&self, len: u64, row_bytes: usize, fixed_bytes: usize, hist: &Histogram, share: f64) -> Option<Victims> {
        let keep = match *self {
            Eviction::Never => return None,
            Eviction::Ttl { ms } => return Some(Victims::OlderThan((ms / self.tick_ms()) as Tick)),
            Eviction::Lru { max_rows } | Eviction::Lfu { max_rows } => max_rows,
            Eviction::Memory { .. } => self.memory_keep(row_bytes, fixed_bytes).unwrap_or(u64::MAX),
        };
        let keep = if share < 1.0 { (keep as f64 * share.max(0.0)) as u64 } else { keep };
        // Never more than the rows surveyed: rows that came since are the newest, and the
        // next pass sees them (a burst of new rows must not empty the table).
        let excess = len.saturating_sub(keep).min(hist.total());
        if excess == 0 {
            return None;
        }
        // the coldest buckets first, each at most the rows counted there, until the excess is met
        let mut quota = vec![0u64; BUCKETS];
        let mut left = excess;
        for b in (0..BUCKETS).rev() {
            let n = hist.counts[b].min(left);
            quota[b] = n;
            left -= n;
            if left == 0 {
                break;
            }
        }
        Some(Victims::Coldest { quota })
    }
}

impl fmt::Display for Eviction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Eviction::Never => f.write_str("never"),
            Eviction::Ttl { ms } => {
                let ms = *ms;
                if ms.is_multiple_of(1000) {
                    write!(f, "ttl:{}s", ms / 1000)
                } else {
                    write!(f, "ttl:{ms}ms")
                }
            }
            Eviction::Lru { max_rows } => write!(f, "lru:{max_rows}"),
            Eviction::Lfu { max_rows } => write!(f, "lfu:{max_rows}"),
            Eviction::Memory { mib } => write!(f, "memory:{mib}"),
        }
    }
}

/// Parses a duration with a unit: `500ms`, `30s`, `10m`, `2h`, `7d` (`None` for anything
/// else, zero included).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = s.split_at(split);
    let x: f64 = num.parse().ok().filter(|x: &f64| x.is_finite() && *x > 0.0)?;
    let secs = match unit {
        "ms" => x / 1000.0,
        "s" => x,
        "m" => x * 60.0,
        "h" => x * 3600.0,
        "d" => x * 86400.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}

impl FromStr for Eviction {
    type Err = CoreError;
    /// `never` (or empty), `ttl:DURATION` (`500ms`, `30s`, `10m`, `2h`, `7d`; at least one
    /// tick, at most 400 days), `lru:MAX_ROWS`, `lfu:MAX_ROWS` or `memory:MIB`.
    fn from_str(s: &str) -> Result<Eviction> {
        let s = s.trim();
        let bad = |why: &str| {
            CoreError::InvalidTable(format!(
                "eviction {s:?}: {why}; expected never, ttl:DURATION (e.g. 500ms, 30s, 10m, 2h, 7d), lru:MAX_ROWS, lfu:MAX_ROWS or memory:MIB"
            ))
        };
        if s.is_empty() || s == "never" {
            return Ok(Eviction::Never);
        }
        let Some((kind, arg)) = s.split_once(':') else { return Err(bad("no policy argument")) };
        let rows = || arg.trim().parse::<u64>().ok().filter(|&n| n >= 1).ok_or_else(|| bad("MAX_ROWS must be a whole number ≥ 1"));
        match kind.trim() {
            "ttl" => {
                let d = parse_duration(arg).ok_or_else(|| bad("the duration needs a number and a unit"))?;
                let ms = d.as_millis();
                if ms == 0 || d > Duration::from_secs(400 * 86400) {
                    return Err(bad("the time to live must lie between 1ms and 400d"));
                }
                Ok(Eviction::Ttl { ms: ms as u64 })
            }
            "lru" => Ok(Eviction::Lru { max_rows: rows()? }),
            "lfu" => Ok(Eviction::Lfu { max_rows: rows()? }),
            "memory" => {
                let mib = arg.trim().parse::<f64>().ok().filter(|m| m.is_finite() && *m > 0.0).ok_or_else(|| bad("MIB must be > 0"))?;
                Ok(Eviction::Memory { mib })
            }
            _ => Err(bad("unknown policy")),
        }
    }
}

/// What a row's mark word holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// The tick of its last push or pull.
    Stamp,
    /// How many pushes and pulls it had (saturating).
    Count,
}

impl Mark {
    /// The coldness bucket of a row with mark `m` at `now`: its age (log-scaled), or for
    /// counts the inverse of the count's bucket, so higher is always colder.
    #[inline]
    pub fn bucket(self, m: u32, now: Tick) -> usize {
        match self {
            Mark::Stamp => bucket(age(m, now)),
            Mark::Count => BUCKETS - 1 - bucket(m),
        }
    }
}

/// The age at `now` of a row marked at `m`, in ticks: modulo 2^32, and 0 for a mark up to
/// 2^31 ticks ahead of `now` (a row used after `now` was read).
#[inline]
pub fn age(m: Tick, now: Tick) -> Tick {
    let a = now.wrapping_sub(m);
    if a > i32::MAX as u32 {
        0
    } else {
        a
    }
}

/// The bucket of `x`: `x` itself below 16, above that 16 buckets per power of two.
#[inline]
pub fn bucket(x: u32) -> usize {
    if x < 16 {
        return x as usize;
    }
    let e = 31 - x.leading_zeros(); // ≥ 4
    16 + (e as usize - 4) * 16 + ((x >> (e - 4)) & 15) as usize
}

/// Rows per coldness bucket, over a table or part of it.
#[derive(Clone, Debug)]
pub struct Histogram {
    /// Rows in each bucket (higher is colder).
    pub counts: Vec<u64>,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram { counts: vec![0; BUCKETS] }
    }
}

impl Histogram {
    /// Counts one row of bucket `b`.
    #[inline]
    pub fn add(&mut self, b: usize) {
        self.counts[b] += 1;
    }

    /// Rows counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// The rows a pass takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Victims {
    /// Rows whose last push or pull is this many ticks ago or more (`ttl`).
    OlderThan(Tick),
    /// Per coldness bucket, how many of its rows still go (the first found).
    Coldest {
        /// Rows still to take, per bucket.
        quota: Vec<u64>,
    },
}

impl Victims {
    /// Whether a row of mark `m` goes at `now` under `mark`; counts a row taken at the cut.
    #[inline]
    pub fn take(&mut self, mark: Mark, m: u32, now: Tick) -> bool {
        match self {
            Victims::OlderThan(ttl) => age(m, now) >= *ttl,
            Victims::Coldest { quota } => {
                let q = &mut quota[mark.bucket(m, now)];
                if *q > 0 {
                    *q -= 1;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Whether a row of mark `m` would go, without counting it.
    #[inline]
    pub fn would_take(&self, mark: Mark, m: u32, now: Tick) -> bool {
        match self {
            Victims::OlderThan(ttl) => age(m, now) >= *ttl,
            Victims::Coldest { quota } => quota[mark.bucket(m, now)] > 0,
        }
    }
}

/// Where time comes from, in milliseconds.
#[derive(Clone, Debug)]
pub enum EvictClock {
    /// Milliseconds since this instant.
    Wall(Instant),
    /// Whatever the holder of the other handle set (tests: eviction on a clock you control).
    Manual(Arc<AtomicU64>),
}

impl Default for EvictClock {
    fn default() -> EvictClock {
        EvictClock::Wall(Instant::now())
    }
}

impl EvictClock {
    /// A clock at 0 ms that moves only when the returned handle is set (to milliseconds).
    pub fn manual() -> (EvictClock, Arc<AtomicU64>) {
        let h = Arc::new(AtomicU64::new(0));
        (EvictClock::Manual(h.clone()), h)
    }

    /// Milliseconds now.
    #[inline]
    pub fn now_ms(&self) -> u64 {
        match self {
            EvictClock::Wall(start) => start.elapsed().as_millis() as u64,
            EvictClock::Manual(t) => t.load(Ordering::Relaxed),
        }
    }
}

/// What a table's eviction did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvictionStats {
    /// Rows dropped.
    pub evicted: u64,
    /// Passes made.
    pub passes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn policies_parse_print_and_refuse_what_they_cannot_mean() {
        for (s, e) in [
            ("", Eviction::Never),
            ("never", Eviction::Never),
            ("ttl:30s", Eviction::Ttl { ms: 30_000 }),
            ("ttl:500ms", Eviction::Ttl { ms: 500 }),
            ("ttl:2h", Eviction::Ttl { ms: 7_200_000 }),
            ("ttl:0.5s", Eviction::Ttl { ms: 500 }),
            ("lru:1000", Eviction::Lru { max_rows: 1000 }),
            ("lfu:5", Eviction::Lfu { max_rows: 5 }),
            ("memory:256", Eviction::Memory { mib: 256.0 }),
        ] {
            assert_eq!(s.parse::<Eviction>().unwrap(), e, "{s}");
            assert_eq!(e.to_string().parse::<Eviction>().unwrap(), e);
        }
        for (s, why) in [
            ("ttl:0.1ms", "between"),
            ("ttl:30", "unit"),
            ("ttl:401d", "between"),
            ("lru:0", "≥ 1"),
            ("lfu:x", "≥ 1"),
            ("memory:0", "> 0"),
            ("lru", "argument"),
            ("fifo:3", "unknown"),
        ] {
            let e = s.parse::<Eviction>().unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("lru:MAX_ROWS"), "{s}: {e}");
        }
    }

    #[test]
    fn buckets_are_monotonic_and_within_a_sixteenth() {
        let mut last = 0;
        for x in (0..100_000u32).chain([u32::MAX - 1, u32::MAX]) {
            let b = bucket(x);
            assert!(b >= last && b < BUCKETS, "{x}: {b}");
            last = b;
        }
        // two values in one bucket differ by less than a sixteenth of the smaller
        for x in [16u32, 100, 1000, 123_456, 1 << 30] {
            let mut y = x;
            while bucket(y + 1) == bucket(x) {
                y += 1;
            }
            assert!((y - x) as f64 <= x as f64 * BUCKET_PRECISION, "{x}..{y}");
        }
        assert_eq!(Mark::Count.bucket(1, 0), BUCKETS - 2);
        assert!(Mark::Count.bucket(1, 0) > Mark::Count.bucket(2, 0), "fewer uses is colder");
        assert!(Mark::Stamp.bucket(0, 100) > Mark::Stamp.bucket(50, 100), "older is colder");
    }

    #[test]
    fn ages_wrap_and_a_mark_ahead_of_the_pass_reads_as_new() {
        assert_eq!(age(5, 105), 100);
        assert_eq!(age(u32::MAX - 4, 5), 10, "across the wrap");
        assert_eq!(age(110, 100), 0, "used after the pass began");
        assert!(!Victims::OlderThan(50).would_take(Mark::Stamp, 110, 100));
    }

    #[test]
    fn a_pass_is_due_past_the_bound_and_ttl_passes_come_every_quarter_ttl_at_most_each_second() {
        let lru = Eviction::Lru { max_rows: 10 };
        assert!(!lru.due(10, 0, 0, 0) && lru.due(11, 0, 0, 0));
        let mem = Eviction::Memory { mib: 1.0 };
        assert!(!mem.due(0, 990_000, 0, 0) && mem.due(0, 1_000_000, 0, 0));
        let ttl = Eviction::Ttl { ms: 40 };
        assert!(!ttl.due(5, 0, 109, 100) && ttl.due(5, 0, 110, 100) && !ttl.due(0, 0, 110, 100));
        let long = Eviction::Ttl { ms: 100_000 };
        assert!(!long.due(5, 0, 999, 0) && long.due(5, 0, 1000, 0));
        assert_eq!((ttl.tick_ms(), long.tick_ms(), Eviction::Ttl { ms: 7 * 86_400_000 }.tick_ms()), (1, 1, 577));
        assert!(!Eviction::Never.due(u64::MAX, u64::MAX, 9, 0));
    }

    #[test]
    fn memory_plans_keep_what_fits_the_low_mark_at_the_rebuilt_load() {
        let mut h = Histogram::default();
        h.counts[3] = 1_000_000;
        // 1 MiB cap, 32-byte rows: 0.7 MiB · 2/3 / 32 = 15291 rows kept
        let v = Eviction::Memory { mib: 1.0 }.plan(1_000_000, 32, 0, &h, 1.0).unwrap();
        let Victims::Coldest { quota } = v else { panic!("{v:?}") };
        assert_eq!((quota[3], quota.iter().sum::<u64>()), (1_000_000 - 15_291, 1_000_000 - 15_291));
        assert_eq!(Eviction::Lru { max_rows: 2_000_000 }.plan(1_000_000, 32, 0, &h, 1.0), None);
    }

    #[test]
    fn a_plan_never_takes_more_rows_than_it_surveyed() {
        // 150 rows surveyed, then a burst took the table to 1150: keep 100 means 1050 too
        // many, but only the 150 surveyed (older than the burst) go now
        let mut h = Histogram::default();
        h.counts[0] = 50;
        h.counts[20] = 100;
        let mut v = Eviction::Lru { max_rows: 100 }.plan(1150, 16, 0, &h, 1.0).unwrap();
        let taken = (0..1100).filter(|_| v.take(Mark::Stamp, 1000, 1000)).count();
        assert_eq!(taken, 50, "of the rows of age 0, only as many as were surveyed");
        // under lfu new rows (count 1) are the coldest: rows that came after the survey do
        // not add to what a pass takes
        let mut h = Histogram::default();
        h.counts[Mark::Count.bucket(5, 0)] = 1001;
        let mut v = Eviction::Lfu { max_rows: 1000 }.plan(1501, 16, 0, &h, 1.0).unwrap();
        let new = (0..500).filter(|_| v.take(Mark::Count, 1, 0)).count();
        let warm = (0..1001).filter(|_| v.take(Mark::Count, 5, 0)).count();
        assert_eq!((new, warm), (0, 501), "the 500 new rows were not surveyed: the excess comes from the 1001 that were");
    }

    proptest! {
        /// A plan takes exactly the excess, and only rows at least as cold as any row kept.
        #[test]
        fn a_plan_takes_exactly_the_excess_and_never_a_warmer_row_than_one_kept(
            marks in proptest::collection::vec(0u32..5000, 1..400),
            keep in 1u64..400,
            now in 5000u32..6000,
            lfu in any::<bool>(),
        ) {
            let mark = if lfu { Mark::Count } else { Mark::Stamp };
            let mut h = Histogram::default();
            for &m in &marks {
                h.add(mark.bucket(m, now));
            }
            let policy = if lfu { Eviction::Lfu { max_rows: keep } } else { Eviction::Lru { max_rows: keep } };
            let len = marks.len() as u64;
            match policy.plan(len, 24, 0, &h, 1.0) {
                None => prop_assert!(len <= keep),
                Some(mut v) => {
                    let taken: Vec<bool> = marks.iter().map(|&m| v.take(mark, m, now)).collect();
                    prop_assert_eq!(taken.iter().filter(|&&t| t).count() as u64, len - keep);
                    let coldest_kept = marks.iter().zip(&taken).filter(|p| !*p.1).map(|p| mark.bucket(*p.0, now)).max();
                    let warmest_taken = marks.iter().zip(&taken).filter(|p| *p.1).map(|p| mark.bucket(*p.0, now)).min();
                    if let (Some(k), Some(t)) = (coldest_kept, warmest_taken) {
                        prop_assert!(t >= k, "took bucket {} and kept {}", t, k);
                    }
                }
            }
        }
    }
}
