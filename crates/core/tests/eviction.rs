//! Eviction on a table, on a clock the test controls (no sleeps): each policy drops exactly
//! the rows it names, pushes and pulls keep a row alive and peeks do not, the rows left are
//! untouched, and `memory:MIB` keeps the arrays under the cap.

use downpour_core::eviction::{EvictClock, Eviction, Histogram};
use downpour_core::hashstore::SHARDS;
use downpour_core::proto;
use downpour_core::rule::RuleRegistry;
use downpour_core::table::{Table, TableDef};
use downpour_core::KeyRange;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

fn table(evict: &str, rule: &str) -> (Table, Arc<AtomicU64>) {
    let def = TableDef {
        evict: evict.parse().unwrap(),
        rule: proto::Rule { name: rule.into(), lr: 0.1, ..Default::default() },
        ..TableDef::new(1, "t")
    };
    let mut t = Table::new(def, KeyRange::FULL, &RuleRegistry::new()).unwrap();
    let (clock, hand) = EvictClock::manual();
    t.set_evict_clock(clock);
    (t, hand)
}

/// Keys spread over the whole space (every storage shard), sorted.
fn spread(ids: impl IntoIterator<Item = u64>) -> Vec<u64> {
    let mut k: Vec<u64> = ids.into_iter().map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 1).collect();
    k.sort_unstable();
    k
}

fn push(t: &mut Table, keys: &[u64], v: f32) {
    t.push(keys, &vec![v; keys.len()]).unwrap();
}

fn stored(t: &mut Table, keys: &[u64]) -> Vec<bool> {
    // a peek reads without creating or marking: stored keys read as what was pushed
    let mut out = vec![0f32; keys.len()];
    t.peek(keys, &mut out).unwrap();
    out.iter().map(|&v| v != 0.0).collect()
}

#[test]
fn ttl_drops_exactly_the_rows_not_pushed_or_pulled_for_the_ttl_and_peeks_do_not_count() {
    let (mut t, clock) = table("ttl:1s", "add");
    let keys = spread(0..3000);
    let (a, rest) = keys.split_at(1000);
    let (b, c) = rest.split_at(1000);
    clock.store(0, Ordering::Relaxed);
    push(&mut t, a, 1.0);
    push(&mut t, b, 1.0);
    push(&mut t, c, 1.0);
    clock.store(500, Ordering::Relaxed);
    let mut out = vec![0f32; b.len()];
    t.pull(b, &mut out).unwrap(); // b used at 50
    t.peek(c, &mut vec![0f32; c.len()]).unwrap(); // c only peeked
    clock.store(999, Ordering::Relaxed);
    assert_eq!(t.evict(), 0, "nothing is 1000 ms old at 999");
    clock.store(1000, Ordering::Relaxed);
    assert_eq!(t.evict(), 2000, "a and c were last used at 0 ms");
    assert_eq!(t.len(), 1000);
    assert!(stored(&mut t, b).iter().all(|&s| s) && !stored(&mut t, a).iter().any(|&s| s));
    clock.store(1500, Ordering::Relaxed);
    assert_eq!(t.evict(), 1000);
    assert!(t.is_empty());
    assert_eq!(t.eviction().unwrap().evicted, 3000);
    // an evicted key comes back as new
    push(&mut t, &a[..10], 2.0);
    let mut out = vec![0f32; 10];
    t.pull(&a[..10], &mut out).unwrap();
    assert!(out.iter().all(|&v| v == 2.0));
}

#[test]
fn lru_keeps_exactly_the_most_recently_used_rows() {
    let (mut t, clock) = table("lru:1000", "add");
    let keys = spread(0..4000);
    // four groups used at ticks 1..=4, then the oldest group used again at 5
    for (g, part) in keys.chunks(1000).enumerate() {
        clock.store(g as u64 + 1, Ordering::Relaxed);
        push(&mut t, part, 1.0);
    }
    clock.store(5, Ordering::Relaxed);
    let mut out = vec![0f32; 1000];
    t.pull(&keys[..1000], &mut out).unwrap();
    assert!(t.eviction_due());
    assert_eq!(t.evict(), 3000);
    assert_eq!(t.len(), 1000);
    assert!(stored(&mut t, &keys[..1000]).iter().all(|&s| s), "the group used last stays");
    assert!(!t.eviction_due());
}

#[test]
fn lfu_keeps_exactly_the_most_often_used_rows() {
    let (mut t, _clock) = table("lfu:500", "add");
    let keys = spread(0..2000);
    // key i is pushed 1 + i / 500 times: the last 500 most often
    for (g, _) in keys.chunks(500).enumerate() {
        for _ in 0..=g {
            push(&mut t, &keys[g * 500..], 1.0);
        }
    }
    assert_eq!(t.evict(), 1500);
    assert!(stored(&mut t, &keys[1500..]).iter().all(|&s| s));
    let mut out = vec![0f32; 500];
    t.peek(&keys[1500..], &mut out).unwrap();
    assert!(out.iter().all(|&v| v == 10.0), "rows kept are untouched: {:?}", &out[..3]);
}

#[test]
fn memory_eviction_brings_the_arrays_under_the_cap() {
    let (mut t, clock) = table("memory:2", "adagrad");
    let keys = spread(0..200_000);
    for (i, part) in keys.chunks(10_000).enumerate() {
        clock.store(i as u64, Ordering::Relaxed);
        push(&mut t, part, 1.0);
    }
    let before = t.bytes();
    assert!(before > 4 << 20, "{before}");
    assert!(t.eviction_due());
    let n = t.evict();
    assert!(t.bytes() <= 2 << 20, "{} bytes after dropping {n} rows", t.bytes());
    assert!(t.bytes() as f64 >= 0.6 * (2 << 20) as f64, "only as much as needed goes: {} bytes", t.bytes());
    // the newest rows are the ones kept
    let last = &keys[keys.len() - 10_000..];
    assert!(stored(&mut t, last).iter().all(|&s| s));
    assert!(!t.eviction_due());
}

#[test]
fn a_pass_made_shard_by_shard_equals_one_made_at_once() {
    let (mut a, ca) = table("lru:700", "add");
    let (mut b, cb) = table("lru:700", "add");
    let keys = spread(0..3000);
    for (i, part) in keys.chunks(300).enumerate() {
        for (t, c) in [(&mut a, &ca), (&mut b, &cb)] {
            c.store(i as u64 * 3, Ordering::Relaxed);
            push(t, part, i as f32 + 1.0);
        }
    }
    a.evict();
    let now = b.evict_now();
    let mut hist = Histogram::default();
    for s in 0..SHARDS {
        b.eviction_survey(s, now, &mut hist);
    }
    assert_eq!(hist.total(), 3000);
    let mut pass = b.eviction_plan(&hist, now).unwrap();
    let mut gone = Vec::new();
    for s in 0..SHARDS {
        b.evict_shard(s, &mut pass, |k| gone.push(k));
    }
    assert_eq!(gone.len(), 2300);
    assert_eq!(stored(&mut a, &keys), stored(&mut b, &keys));
    gone.sort_unstable();
    let kept: Vec<u64> = keys.iter().copied().filter(|k| gone.binary_search(k).is_err()).collect();
    assert!(stored(&mut b, &kept).iter().all(|&s| s));
}

#[test]
fn eviction_is_refused_on_dense_tables_and_travels_in_the_wire_form() {
    let d = TableDef { evict: "ttl:30s".parse().unwrap(), ..TableDef::new(1, "t") };
    assert_eq!(TableDef::from_proto(&d.to_proto()).unwrap().evict, Eviction::Ttl { ms: 30_000 });
    assert_eq!(TableDef::from_proto(&TableDef::new(1, "t").to_proto()).unwrap().evict, Eviction::Never);
    let dense = TableDef { storage: downpour_core::table::Storage::Dense(KeyRange::new(0, 10)), ..d };
    let e = TableDef::from_proto(&dense.to_proto()).unwrap_err().to_string();
    assert!(e.contains("sparse"), "{e}");
}

proptest! {
    /// Random pushes, pulls, peeks and passes under `lru` with adagrad's state: the rows left
    /// are exactly those of a map from which every key a pass reported gone was removed
    /// (values and state), and a pass never keeps more than the bound.
    #[test]
    fn rows_left_after_random_evictions_match_a_map_without_the_evicted_keys(
        ops in proptest::collection::vec((proptest::collection::vec(0u64..3000, 1..800), 0u8..4), 1..30),
        max in 1u64..2000,
    ) {
        let (mut t, clock) = table(&format!("lru:{max}"), "adagrad");
        let (mut r, _) = table("never", "adagrad");
        let mut present: BTreeMap<u64, ()> = BTreeMap::new();
        for (step, (ids, kind)) in ops.iter().enumerate() {
            clock.store(step as u64, Ordering::Relaxed);
            let keys = spread(ids.iter().copied().collect::<std::collections::BTreeSet<u64>>());
            let vals: Vec<f32> = keys.iter().map(|k| (k % 7) as f32 - 3.0).collect();
            let mut out = vec![0f32; keys.len()];
            match kind {
                0 => {
                    t.push(&keys, &vals).unwrap();
                    r.push(&keys, &vals).unwrap();
                    keys.iter().for_each(|&k| { present.insert(k, ()); });
                }
                1 => {
                    t.pull(&keys, &mut out).unwrap();
                    r.pull(&keys, &mut out).unwrap();
                    keys.iter().for_each(|&k| { present.insert(k, ()); });
                }
                2 => t.peek(&keys, &mut out).unwrap(),
                _ => {
                    let now = t.evict_now();
                    let mut hist = Histogram::default();
                    for s in 0..SHARDS { t.eviction_survey(s, now, &mut hist); }
                    if let Some(mut pass) = t.eviction_plan(&hist, now) {
                        let mut gone = Vec::new();
                        for s in 0..SHARDS { t.evict_shard(s, &mut pass, |k| gone.push(k)); }
                        gone.sort_unstable();
                        // the reference without them: its rows copied into a fresh table
                        let (mut kr, mut rr) = (Vec::new(), Vec::new());
                        r.export_rows(KeyRange::FULL, &mut kr, &mut rr);
                        let w = rr.len() / kr.len().max(1);
                        let (keep_k, keep_r): (Vec<u64>, Vec<&[f32]>) =
                            kr.iter().zip(rr.chunks_exact(w.max(1))).filter(|(k, _)| gone.binary_search(k).is_err()).map(|(k, row)| (*k, row)).unzip();
                        r = table("never", "adagrad").0;
                        r.import_rows(&keep_k, &keep_r.concat()).unwrap();
                        gone.iter().for_each(|k| { present.remove(k); });
                    }
                    prop_assert!(t.len() as u64 <= max);
                }
            }
            prop_assert_eq!(t.len(), present.len());
        }
        let keys: Vec<u64> = present.keys().copied().collect();
        let (mut kt, mut rt, mut kr, mut rr) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        t.export_rows(KeyRange::FULL, &mut kt, &mut rt);
        r.export_rows(KeyRange::FULL, &mut kr, &mut rr);
        prop_assert_eq!(&kt, &keys);
        prop_assert_eq!(kt, kr);
        prop_assert_eq!(rt, rr);
    }
}

#[test]
fn rows_dropped_in_place_leave_every_other_row_reachable_and_unchanged() {
    // a few victims per shard: the shards keep their arrays and lose the rows in place
    let (mut t, clock) = table("lru:9900", "add");
    let keys = spread(0..10_000);
    let vals: Vec<f32> = (0..keys.len()).map(|i| i as f32 + 1.0).collect();
    let bytes = {
        t.push(&keys, &vals).unwrap();
        t.bytes()
    };
    // the first 100 keys are the oldest
    clock.store(10, Ordering::Relaxed);
    let mut out = vec![0f32; keys.len() - 100];
    t.pull(&keys[100..], &mut out).unwrap();
    assert_eq!(t.evict(), 100);
    assert_eq!((t.len(), t.bytes()), (9900, bytes), "dropped in place: the arrays stay");
    let mut out = vec![0f32; keys.len()];
    t.peek(&keys, &mut out).unwrap();
    assert!(out[..100].iter().all(|&v| v == 0.0));
    assert_eq!(&out[100..], &vals[100..], "every row kept reads as it was");
    // pushing every key again recreates the 100 and adds to the rest: no row is stored twice
    t.push(&keys, &vals).unwrap();
    assert_eq!(t.len(), 10_000);
    t.peek(&keys, &mut out).unwrap();
    assert!(out.iter().zip(&vals).enumerate().all(|(i, (&o, &v))| o == if i < 100 { v } else { 2.0 * v }));
}

#[test]
fn a_memory_cap_that_the_admission_sketch_fills_is_refused() {
    let def = TableDef { admit: "count:2".parse().unwrap(), evict: "memory:4".parse().unwrap(), ..TableDef::new(1, "t") };
    let e = Table::new(def, KeyRange::FULL, &RuleRegistry::new()).err().unwrap().to_string();
    assert!(e.contains("memory:4") && e.contains("sketch"), "{e}");
    let def = TableDef { admit: "count:2:1".parse().unwrap(), evict: "memory:4".parse().unwrap(), ..TableDef::new(1, "t") };
    assert!(Table::new(def, KeyRange::FULL, &RuleRegistry::new()).is_ok());
}

/// What a checkpoint does with an evicting table: the rows there are (after evictions) are
/// exported with their state and restored into a fresh table, which holds exactly them and
/// counts them as used at the restore (a TTL runs from there).
#[test]
fn a_checkpoint_of_an_evicting_table_restores_exactly_the_rows_left_marked_as_used_at_the_restore() {
    let (mut t, clock) = table("ttl:1s", "adagrad");
    let keys = spread(0..2000);
    let vals: Vec<f32> = keys.iter().map(|k| (k % 5) as f32 - 2.0).collect();
    t.push(&keys, &vals).unwrap();
    clock.store(600, Ordering::Relaxed);
    t.push(&keys[..500], &vals[..500]).unwrap();
    clock.store(1200, Ordering::Relaxed);
    assert_eq!(t.evict(), 1500);
    let (mut k, mut rows) = (Vec::new(), Vec::new());
    t.export_rows(KeyRange::FULL, &mut k, &mut rows);
    assert_eq!(k.len(), 500);
    // restored at 5000 ms on the new table's clock
    let (mut r, rclock) = table("ttl:1s", "adagrad");
    rclock.store(5000, Ordering::Relaxed);
    r.import_rows(&k, &rows).unwrap();
    let (mut k2, mut rows2) = (Vec::new(), Vec::new());
    r.export_rows(KeyRange::FULL, &mut k2, &mut rows2);
    assert_eq!((k2, rows2), (k.clone(), rows.clone()), "values and adagrad state restored bit for bit");
    rclock.store(5999, Ordering::Relaxed);
    assert_eq!(r.evict(), 0, "used at the restore: not expired 999 ms later");
    rclock.store(6000, Ordering::Relaxed);
    assert_eq!(r.evict(), 500);
}
