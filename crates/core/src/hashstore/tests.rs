//! Tests of [`HashStore`](super::HashStore).

#[test]
fn removing_a_range_keeps_every_other_key_and_its_row() {
    let mut h = HashStore::new(1, 0);
    let keys: Vec<u64> = (0..5000u64).map(|i| i * 7919).collect();
    let mut slots = Vec::new();
    h.resolve(&keys, true, &mut slots, |k, w| w[0] = k as f32);
    let (lo, hi) = (1000 * 7919, 3000 * 7919);
    assert_eq!(h.remove_range(lo, hi), 2000);
    assert_eq!(h.len(), 3000);
    for &k in &keys {
        assert_eq!(h.contains(k), !(lo..hi).contains(&k), "key {k}");
    }
    h.resolve(&keys[..10], false, &mut slots, |_, _| {});
    for (i, t) in slots.iter().enumerate() {
        assert_eq!(h.w(*t)[0], keys[i] as f32);
    }
    assert_eq!(h.remove_range(lo, hi), 0);
}

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

proptest! {
    // Inserting and reading back through growth of many shards behaves like a HashMap.
    #[test]
    fn behaves_like_a_hashmap_across_growth(batches in proptest::collection::vec(proptest::collection::vec(0u64..5_000, 1..400), 1..20)) {
        let mut st = HashStore::new(2, 1);
        let mut model: HashMap<u64, (f32, f32)> = HashMap::new();
        let mut slots = Vec::new();
        for (bi, b) in batches.iter().enumerate() {
            let create = bi % 4 != 3;
            st.resolve(b, create, &mut slots, |k, w| { w[0] = k as f32; w[1] = 0.0; });
            for (&k, &t) in b.iter().zip(&slots) {
                if !create && !model.contains_key(&k) {
                    prop_assert_eq!(t, MISSING);
                    continue;
                }
                let e = model.entry(k).or_insert((k as f32, 0.0));
                let (w, s) = st.row_mut(t);
                prop_assert_eq!(w[0], e.0);
                prop_assert_eq!(w[1], e.1);
                w[1] += 1.0;
                s[0] += 1.0;
                e.1 += 1.0;
            }
        }
        prop_assert_eq!(st.len(), model.len());
        let (mut k, mut v) = (vec![], vec![]);
        st.range(100, 4_000, &mut k, &mut v);
        let mut expect: Vec<u64> = model.keys().copied().filter(|&x| (100..4_000).contains(&x)).collect();
        expect.sort_unstable();
        prop_assert_eq!(&k, &expect);
        for (i, key) in k.iter().enumerate() {
            prop_assert_eq!(v[2 * i + 1], model[key].1);
        }
    }
}

proptest! {
    // Uniform keys (as the applications scramble them) keep the order-preserving
    // placement through growth and read back like a HashMap.
    #[test]
    fn uniform_keys_stay_in_key_order_and_behave_like_a_hashmap(batches in proptest::collection::vec(proptest::collection::vec(0u64..20_000, 1..600), 1..12)) {
        let mut st = HashStore::new(1, 1);
        let mut model: HashMap<u64, f32> = HashMap::new();
        let mut slots = Vec::new();
        for b in &batches {
            let keys: Vec<u64> = b.iter().map(|&x| crate::keys::scramble(x)).collect();
            st.resolve(&keys, true, &mut slots, |k, w| w[0] = (k % 1000) as f32);
            for (&k, &t) in keys.iter().zip(&slots) {
                let e = model.entry(k).or_insert((k % 1000) as f32);
                let (w, _) = st.row_mut(t);
                prop_assert_eq!(w[0], *e);
                w[0] += 1.0;
                *e += 1.0;
            }
        }
        prop_assert!(st.is_ordered(), "uniform keys keep the ordered placement");
        prop_assert_eq!(st.len(), model.len());
        let mut all: Vec<u64> = model.keys().copied().collect();
        all.sort_unstable();
        st.resolve(&all, false, &mut slots, |_, _| {});
        for (k, t) in all.iter().zip(&slots) {
            prop_assert_eq!(st.w(*t)[0], model[k]);
        }
    }
}

#[test]
fn clustered_keys_move_the_store_to_mixed_placement_and_lose_nothing() {
    let mut st = HashStore::new(1, 0);
    let mut slots = Vec::new();
    // sequential ids all fall into the first slots of shard 0 under the identity
    let keys: Vec<u64> = (0..50_000u64).collect();
    for c in keys.chunks(1000) {
        st.resolve(c, true, &mut slots, |k, w| w[0] = k as f32);
    }
    assert!(!st.is_ordered(), "sequential ids cluster");
    assert_eq!(st.len(), keys.len());
    st.resolve(&keys, false, &mut slots, |_, _| {});
    assert!(keys.iter().zip(&slots).all(|(&k, &t)| t != MISSING && st.w(t)[0] == k as f32));
    // and a request in key order walks every shard's rows forwards while ordered
    let mut u = HashStore::new(1, 0);
    let mut ks: Vec<u64> = (0..20_000u64).map(crate::keys::scramble).collect();
    ks.sort_unstable();
    u.resolve(&ks, true, &mut slots, |_, w| w[0] = 0.0);
    assert!(u.is_ordered());
    let in_order = slots.windows(2).filter(|w| w[0].shard() != w[1].shard() || w[0].index() < w[1].index()).count();
    assert!(in_order as f64 > 0.99 * (slots.len() - 1) as f64, "{in_order} of {} steps go forwards", slots.len() - 1);
}

#[test]
fn a_bulk_load_of_sorted_uniform_keys_in_chunks_stays_ordered_within_the_memory_bounds() {
    // as a server receives a 1M-key push: chunks of ~87k keys, tables in blocks of 4096
    let keys = crate::keys::random_sorted_keys(1_000_000, 7);
    let mut st = HashStore::new(1, 0);
    let mut slots = Vec::new();
    for c in keys.chunks(87_000) {
        st.reserve_for(c);
        for b in c.chunks(4096) {
            st.resolve(b, true, &mut slots, |k, w| w[0] = (k % 7) as f32);
        }
    }
    assert!(st.is_ordered(), "the keys were uniform");
    assert_eq!(st.len(), keys.len());
    st.resolve(&keys, false, &mut slots, |_, _| {});
    assert!(keys.iter().zip(&slots).all(|(&k, &t)| t != MISSING && st.w(t)[0] == (k % 7) as f32));
    let per_key = st.bytes() as f64 / st.len() as f64;
    // 12 bytes a slot at 53–80 % load
    assert!((14.0..=23.0).contains(&per_key), "{per_key} bytes per key");
}

#[test]
fn memory_per_key_stays_within_the_load_bounds() {
    let mut st = HashStore::new(1, 2);
    let mut slots = Vec::new();
    let keys: Vec<u64> = (0..1_000_000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % (1 << 40)).collect();
    for c in keys.chunks(10_000) {
        st.resolve(c, true, &mut slots, |_, w| w[0] = 0.0);
    }
    let per_key = st.bytes() as f64 / st.len() as f64;
    // 20 bytes a slot at 53–80 % load: 25–38 bytes a key.
    assert!((24.0..=40.0).contains(&per_key), "{per_key} bytes per key");
}

#[test]
fn probes_that_run_past_the_end_of_a_shard_wrap_to_its_start_and_find_every_key() {
    // Keys of shard 0 whose homes are spread over the last 40 % of its slots (ordered
    // placement: homes follow the bits after the shard's): more keys than those slots, so
    // the cluster runs into the tail after the last homes and, for the larger n (more than
    // the tail's 64 slots beyond), past the array's end to its front, and probes start at
    // every offset from the end (through whole compared groups, the slots after the last
    // one, the wrap).
    for n in [2u64, 3, 5, 8, 13, 21, 40, 100, 333] {
        let mut h = HashStore::new(1, 0);
        let top = (1u64 << SHARD_SHIFT) - 1;
        let step = (top / 5 * 2) / n;
        let mut keys: Vec<u64> = (0..n).map(|i| top - i * step).collect();
        keys.reverse();
        let mut slots = Vec::new();
        h.resolve(&keys, true, &mut slots, |k, w| w[0] = ((top - k) / step) as f32);
        assert!(h.is_ordered(), "n = {n}: not a cluster");
        assert_eq!(h.len(), n as usize);
        // absent keys between them: not found, nothing created (slot by slot, and in a
        // scan of them all, which compares groups of slots)
        let absent: Vec<u64> = keys.iter().map(|k| k - 1).collect();
        h.resolve(&absent, false, &mut slots, |_, _| {});
        assert!(slots.iter().all(|&t| t == MISSING), "n = {n}");
        h.walk(&absent, false, |_, _| {}, |i, row| assert!(row.is_none(), "n = {n}, absent key {}", absent[i]));
        assert_eq!(h.len(), n as usize);
        // every key in a scan (grouped compares), each probe from its own home
        let mut seen = 0;
        h.walk(
            &keys,
            false,
            |_, _| {},
            |i, row| {
                let (w, _) = row.unwrap_or_else(|| panic!("n = {n}: key {} not found", keys[i]));
                assert_eq!(w[0], ((top - keys[i]) / step) as f32, "n = {n}, key {}", keys[i]);
                seen += 1;
            },
        );
        assert_eq!(seen, n);
        // one key at a time (slot by slot), in reverse
        for &k in keys.iter().rev() {
            h.resolve(&[k], false, &mut slots, |_, _| {});
            assert_ne!(slots[0], MISSING, "n = {n}, key {k}");
            assert_eq!(h.w(slots[0])[0], ((top - k) / step) as f32, "n = {n}, key {k}");
        }
    }
}

/// Shards whose runs are in key order, as a cursor walk relies on: the shards not marked
/// disordered, each checked (no run wraps past the end of its array, and each occupied slot
/// holds a key above the one in the slot before, if that one is occupied). Panics on a
/// shard that breaks it.
fn sorted_shards(st: &HashStore) -> usize {
    assert!(st.ordered);
    let mut sorted = 0;
    for (si, sh) in st.shards.iter().enumerate().filter(|(_, sh)| !sh.disordered && sh.slots > 0) {
        for i in 0..sh.slots {
            let k = sh.key_at(i, st.stride);
            if k == EMPTY {
                continue;
            }
            assert!(place(k, sh.cap).1 <= i, "shard {si}: the row at {i} wrapped");
            if i > 0 {
                let before = sh.key_at(i - 1, st.stride);
                assert!(before == EMPTY || before < k, "shard {si}: {before} before {k} at {i}");
            }
        }
        sorted += 1;
    }
    sorted
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    // Bulk requests in key order insert keys in order and later ones find them with a
    // cursor; scattered inserts and removals between them keep every shard either in
    // key order or marked, and the store reads back like a HashMap throughout.
    #[test]
    fn bulk_sorted_requests_keep_runs_in_key_order_and_read_back_like_a_hashmap(
        ops in proptest::collection::vec((0u8..4, 0u64..40_000, 1usize..12_000), 1..10),
    ) {
        let mut st = HashStore::new(1, 0);
        let mut model: HashMap<u64, f32> = HashMap::new();
        let mut only_bulk = true;
        for (op, start, n) in ops {
            let mut keys: Vec<u64> = (start..start + n as u64).map(crate::keys::scramble).collect();
            match op {
                // a scattered handful, in key order
                0 => {
                    keys.truncate(50);
                    keys.sort_unstable();
                    only_bulk = false;
                }
                // removals
                1 => {
                    keys.truncate(200);
                    let gone = keys.iter().filter(|k| model.remove(k).is_some()).count();
                    prop_assert_eq!(st.remove_keys(&keys), gone);
                    continue;
                }
                // a bulk request in key order
                _ => {
                    keys.resize(keys.len().max(BULK), 0);
                    for (i, k) in keys.iter_mut().enumerate().skip(n) {
                        *k = crate::keys::scramble(start + 100_000 + i as u64);
                    }
                    keys.sort_unstable();
                    // (a request that covers a small part of the rows inserts as scattered keys do)
                    only_bulk &= keys.len() * 4 >= st.len();
                }
            }
            st.walk(&keys, true, |k, w| w[0] = (k % 1000) as f32, |i, row| {
                if let Some((w, _)) = row {
                    let e = model.entry(keys[i]).or_insert((keys[i] % 1000) as f32);
                    assert_eq!(w[0], *e, "key {}", keys[i]);
                    w[0] += 1.0;
                    *e += 1.0;
                }
            });
            prop_assert_eq!(st.len(), model.len());
            prop_assert!(st.is_ordered());
            let sorted = sorted_shards(&st);
            if only_bulk {
                prop_assert_eq!(sorted, st.shards.iter().filter(|s| s.slots > 0).count(), "only bulk requests: every shard in order");
            }
        }
        let mut all: Vec<u64> = model.keys().copied().collect();
        all.sort_unstable();
        let mut seen = 0;
        st.walk(&all, false, |_, _| {}, |i, row| {
            let (w, _) = row.expect("every stored key is found");
            assert_eq!(w[0], model[&all[i]]);
            seen += 1;
        });
        prop_assert_eq!(seen, all.len());
    }
}

#[test]
fn a_bulk_request_with_repeated_and_unsorted_keys_finds_each_key_and_stores_it_once() {
    let mut st = HashStore::new(1, 0);
    let mut a: Vec<u64> = (0..6000u64).map(crate::keys::scramble).collect();
    a.sort_unstable();
    st.walk(&a, true, |_, w| w[0] = 0.0, |_, _| {});
    assert_eq!(sorted_shards(&st), SHARDS, "a bulk load in key order");
    // the same keys twice over, each adjacent pair repeated, then in reverse order
    let mut keys: Vec<u64> = a.iter().flat_map(|&k| [k, k]).collect();
    keys.extend(a.iter().rev());
    let mut found = 0;
    st.walk(
        &keys,
        true,
        |_, w| w[0] = 0.0,
        |_, row| {
            row.expect("stored").0[0] += 1.0;
            found += 1;
        },
    );
    assert_eq!((found, st.len()), (keys.len(), a.len()), "nothing created twice");
    st.walk(&a, false, |_, _| {}, |_, row| assert_eq!(row.expect("stored").0[0], 3.0));
}

#[test]
fn a_bulk_request_whose_keys_crowd_the_end_of_a_shard_loses_nothing() {
    // 6,000 keys just below the start of shard 1: all at the last home slots of shard 0,
    // their run longer than the tail after them
    let mut keys: Vec<u64> = (1..=6000u64).map(|i| HashStore::shard_start(1) - i * 7).collect();
    keys.sort_unstable();
    for first in [0, 100] {
        // a bulk request into an empty store (the run in key order finds no room before the
        // shard's end even after a growth), and after a small request (the run wrapped)
        let mut st = HashStore::new(1, 0);
        st.walk(&keys[..first], true, |k, w| w[0] = k as f32, |_, _| {});
        st.walk(&keys, true, |k, w| w[0] = k as f32, |_, _| {});
        assert_eq!(st.len(), keys.len());
        assert!(!st.is_ordered(), "keys that crowd one shard's end leave ordered placement");
        let mut seen = 0;
        st.walk(
            &keys,
            false,
            |_, _| {},
            |i, row| {
                assert_eq!(row.expect("stored").0[0], keys[i] as f32);
                seen += 1;
            },
        );
        assert_eq!(seen, keys.len());
    }
}

#[test]
fn the_parts_of_a_bulk_request_cut_into_pieces_insert_in_key_order() {
    // two bulk requests of 40,000 keys each (the second's between the first's), each cut at
    // every fourth shard into 16 parts of about 2,500 keys (fewer than a bulk request's
    // 4,096): the parts insert in key order as their request would
    let mut st = HashStore::new(1, 0);
    let cuts: Vec<usize> = (1..16).map(|i| i * 4).collect();
    for round in 0..2u64 {
        let mut keys: Vec<u64> = (round * 40_000..(round + 1) * 40_000).map(crate::keys::scramble).collect();
        keys.sort_unstable();
        st.reserve_for(&keys);
        let mut parts = Vec::new();
        let mut from = 0;
        for (j, mut v) in st.split_views(&cuts, keys.len()).expect("ordered placement").into_iter().enumerate() {
            let to = cuts.get(j).map_or(keys.len(), |&c| from + keys[from..].partition_point(|&k| k < HashStore::shard_start(c)));
            assert_eq!(v.walk(&keys[from..to], true, |_, w| w[0] = 0.0, |_, _| {}), None);
            parts.push(v.into_parts());
            from = to;
        }
        for p in parts {
            st.finish(p);
        }
        assert_eq!(st.len(), 40_000 * (round as usize + 1));
        assert_eq!(sorted_shards(&st), SHARDS, "round {round}");
    }
}
