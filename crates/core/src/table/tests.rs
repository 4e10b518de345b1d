//! Tests of [`Table`](super::Table): storage, update rules, exports and copies.

use super::batch::{piece_cuts, PARALLEL_MIN, PIECES};
use super::*;
use crate::hashstore::Slot;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// A table of id 1 (sparse unless `dense`), for the tests of this crate.
pub(crate) fn def(dense: Option<KeyRange>, vl: usize, rule: &str) -> TableDef {
    TableDef {
        value_len: vl,
        storage: dense.map(Storage::Dense).unwrap_or(Storage::Sparse),
        rule: proto::Rule { name: rule.into(), lr: 0.1, ..Default::default() },
        ..TableDef::new(1, "t")
    }
}

/// A request large enough for two threads: the keys without a row are collected from
/// every piece, in key order, and admitted at their second push.
#[test]
fn large_admitting_pushes_admit_every_key_at_its_second_push() {
    let d = TableDef { admit: Admission::Count { n: 2, sketch_mib: 16.0 }, ..def(None, 1, "add") };
    let mut t = Table::new(d, KeyRange::FULL, &RuleRegistry::new()).unwrap();
    let keys = crate::keys::random_sorted_keys(4 * PARALLEL_MIN, 5);
    let n = keys.len();
    let mut out = vec![9f32; n];
    t.push_pull(&keys, &vec![1.0; n], &mut out).unwrap();
    assert!(out.iter().all(|&v| v == 0.0) && t.is_empty(), "{} rows after one push", t.len());
    t.push(&keys, &vec![2.0; n]).unwrap();
    assert_eq!(t.len(), n);
    t.push_pull(&keys, &vec![3.0; n], &mut out).unwrap();
    assert!(out.iter().all(|&v| v == 5.0));
    assert_eq!(t.admission().unwrap(), AdmissionStats { admitted: n as u64, refused: n as u64 });
}

#[test]
fn admission_travels_in_the_wire_form_and_is_refused_on_dense_tables() {
    let d = TableDef { admit: "count:3:0.5".parse().unwrap(), ..def(None, 1, "add") };
    assert_eq!(TableDef::from_proto(&d.to_proto()).unwrap().admit, d.admit);
    assert_eq!(TableDef::from_proto(&def(None, 1, "add").to_proto()).unwrap().admit, Admission::Always);
    let dense = TableDef { admit: Admission::Probability(0.5), ..def(Some(KeyRange::new(0, 10)), 1, "add") };
    let e = TableDef::from_proto(&dense.to_proto()).unwrap_err();
    assert!(e.to_string().contains("sparse"), "{e}");
}

/// A large request (cut into pieces of whole shards that two threads take in turn, where
/// the machine has two cores) gives what one thread gives, key by key: on uniform keys
/// (ordered store), on sequential ids (mixed store, one thread), and on uniform keys with a
/// cluster of sequential ids in one shard (the piece that meets it stops, the store moves
/// to the mixed hash, the rest of that piece is done under it), each with adagrad's state.
#[test]
fn large_requests_split_over_two_threads_give_what_one_thread_gives() {
    let reg = RuleRegistry::new();
    let uniform: Vec<u64> = {
        let mut k: Vec<u64> = (0..80_000u64).map(crate::keys::scramble).collect();
        k.sort_unstable();
        k
    };
    let sequential: Vec<u64> = (1..80_001).collect();
    let clustered: Vec<u64> = {
        let base = 40u64 << 58;
        let mut k: Vec<u64> = uniform.iter().copied().chain(base..base + 5_000).collect();
        k.sort_unstable();
        k.dedup();
        k
    };
    assert!(piece_cuts(&uniform).len() >= PIECES / 2, "{:?}", piece_cuts(&uniform));
    for keys in [uniform, sequential, clustered] {
        let cuts = piece_cuts(&keys);
        for w in cuts.windows(2) {
            assert!(w[0].0 < w[1].0 && w[0].1 < w[1].1, "{cuts:?}");
        }
        for &(at, shard) in &cuts {
            // (a cut's first key is in its first shard, or a later one when that shard has none)
            assert!(HashStore::ordered_shard(keys[at - 1]) < shard && HashStore::ordered_shard(keys[at]) >= shard, "{cuts:?}");
        }
        let g: Vec<f32> = (0..keys.len() * 2).map(|i| ((i % 13) as f32 - 6.0) / 5.0).collect();
        let mut split = Table::new(def(None, 2, "adagrad"), KeyRange::FULL, &reg).unwrap();
        let mut one = Table::new(def(None, 2, "adagrad"), KeyRange::FULL, &reg).unwrap();
        one.parallel = false;
        for _ in 0..2 {
            split.push(&keys, &g).unwrap();
        }
        // one thread: the same pushes in small requests
        for _ in 0..2 {
            for (kc, gc) in keys.chunks(1000).zip(g.chunks(2000)) {
                one.push(kc, gc).unwrap();
            }
        }
        let (mut a, mut b) = (vec![0f32; keys.len() * 2], vec![0f32; keys.len() * 2]);
        split.pull(&keys, &mut a).unwrap();
        one.pull(&keys, &mut b).unwrap();
        assert!(a == b, "the split request differs");
        assert_eq!(split.len(), keys.len());
        let (mut ka, mut ra, mut kb, mut rb) = (vec![], vec![], vec![], vec![]);
        split.export_rows(KeyRange::FULL, &mut ka, &mut ra);
        one.export_rows(KeyRange::FULL, &mut kb, &mut rb);
        assert!(ka == kb && ra == rb, "rule state differs");
        let ordered = |t: &Table| matches!(&t.store, Store::Sparse(h) if h.is_ordered());
        // (the cluster moved both stores to the mixed hash; uniform keys moved neither)
        assert_eq!(ordered(&split), ordered(&one));
    }
}

#[test]
fn a_copied_range_with_rule_state_continues_exactly_like_the_original() {
    // adagrad keeps per-element state: a replica must carry it to apply the next update alike
    for dense in [None, Some(KeyRange::new(0, 100))] {
        let reg = RuleRegistry::new();
        let mut a = Table::new(def(dense, 2, "adagrad"), KeyRange::FULL, &reg).unwrap();
        let keys: Vec<u64> = (10..30).collect();
        let g: Vec<f32> = (0..40).map(|i| (i as f32 - 20.0) / 7.0).collect();
        a.push(&keys, &g).unwrap();
        let (mut k, mut rows) = (Vec::new(), Vec::new());
        a.export_rows(KeyRange::new(15, 25), &mut k, &mut rows);
        assert_eq!(k, (15..25).collect::<Vec<u64>>());
        assert_eq!(rows.len(), k.len() * a.row_len());
        let mut b = Table::new(def(dense, 2, "adagrad"), KeyRange::FULL, &reg).unwrap();
        b.import_rows(&k, &rows).unwrap();
        a.push(&k, &g[..20]).unwrap();
        b.push(&k, &g[..20]).unwrap();
        let (mut wa, mut wb) = (vec![0f32; 20], vec![0f32; 20]);
        a.pull(&k, &mut wa).unwrap();
        b.pull(&k, &mut wb).unwrap();
        assert_eq!(wa, wb);
        assert!(b.import_rows(&k, &rows[1..]).is_err());
    }
}

#[test]
fn sparse_table_creates_keys_on_pull_with_initializer() {
    let mut d = def(None, 2, "add");
    d.init = Init::Uniform { lo: 1.0, hi: 2.0, seed: 9 };
    let mut t = Table::new(d.clone(), KeyRange::FULL, &RuleRegistry::new()).unwrap();
    let mut out = [0f32; 4];
    t.pull(&[5, 9], &mut out).unwrap();
    let mut expect = [0f32; 2];
    d.init.fill(9, &mut expect);
    assert_eq!(&out[2..], &expect);
    assert_eq!(t.len(), 2);
}

#[test]
fn peek_reads_missing_keys_as_their_initial_value_without_creating_them() {
    let mut d = def(None, 1, "add");
    d.init = Init::Uniform { lo: 1.0, hi: 2.0, seed: 3 };
    let mut t = Table::new(d.clone(), KeyRange::FULL, &RuleRegistry::new()).unwrap();
    t.push(&[4], &[10.0]).unwrap();
    let mut out = [0f32; 2];
    t.peek(&[4, 7], &mut out).unwrap();
    let mut init7 = [0f32; 1];
    d.init.fill(7, &mut init7);
    let mut init4 = [0f32; 1];
    d.init.fill(4, &mut init4);
    assert_eq!(out, [init4[0] + 10.0, init7[0]]);
    assert_eq!(t.len(), 1, "peek must not create keys");
}

#[test]
fn invalid_requests_are_errors_not_panics() {
    let mut t = Table::new(def(Some(KeyRange::new(10, 20)), 1, "add"), KeyRange::new(10, 20), &RuleRegistry::new()).unwrap();
    assert!(matches!(t.push(&[12, 11], &[1.0, 1.0]), Err(CoreError::UnsortedKeys { .. })));
    assert!(matches!(t.push(&[12], &[1.0, 1.0]), Err(CoreError::LengthMismatch { .. })));
    assert!(matches!(t.push(&[25], &[1.0]), Err(CoreError::KeyOutOfRange { .. })));
    assert!(matches!(t.push_range(18, &[1.0, 1.0, 1.0]), Err(CoreError::KeyOutOfRange { .. })));
    assert!(matches!(t.dense_values(KeyRange::new(5, 12)), Err(CoreError::KeyOutOfRange { .. })));
    assert!(TableDef::from_proto(&proto::TableSpec { value_len: 0, ..Default::default() }).is_err());
    assert!(
        TableDef::from_proto(&proto::TableSpec { value_len: 1, dense: true, dense_begin: 5, dense_end: 5, ..Default::default() }).is_err()
    );
}

/// A range push given in pieces leaves the table as one push of the whole range does: the
/// values under every built-in rule (rows of 1, 2 and 3 values, with and without state,
/// pieces that end mid-table), and what the update feed tells a reader; a range outside
/// the table is refused before any piece is asked for.
#[test]
fn a_range_push_in_pieces_leaves_the_table_as_one_push_of_the_whole_range() {
    let reg = RuleRegistry::new();
    for (rule, vl) in [
        ("assign", 1),
        ("add", 1),
        ("sgd", 1),
        ("momentum", 2),
        ("adagrad", 2),
        ("adam", 1),
        ("ftrl", 1),
        ("bpg", 3),
        ("ftrl-norm", 2),
        ("adagrad-norm", 2),
    ] {
        let rows = 1000u64;
        let make = || {
            let mut d = def(Some(KeyRange::new(0, rows)), vl, rule);
            d.rule.l1 = 0.01;
            Table::new(d, KeyRange::FULL, &reg).unwrap()
        };
        let (mut whole, mut pieces) = (make(), make());
        let mut keys = Vec::new();
        let (start_w, _) = whole.feed_since(None, None, &mut keys);
        let (start_p, _) = pieces.feed_since(None, None, &mut keys);
        let n = 700 * vl;
        for round in 0..2 {
            let g: Vec<f32> = (0..n).map(|i| ((i * 7 + round * 5) % 13) as f32 * 0.2 - 1.2).collect();
            whole.push_range(100, &g).unwrap();
            // pieces of 64 rows: the last one shorter
            let mut buf = vec![0f32; 64 * vl];
            let mut at = 0;
            let r = pieces.push_range_pieces(100, n, &mut buf, |p: &mut [f32]| -> std::result::Result<(), ()> {
                p.copy_from_slice(&g[at..at + p.len()]);
                at += p.len();
                Ok(())
            });
            assert_eq!(r, Ok(Ok(KeyRange::new(100, 800))), "{rule}");
            assert_eq!(at, n, "{rule}: every value asked for");
        }
        let all = KeyRange::new(0, rows);
        assert_eq!(whole.dense_values(all).unwrap(), pieces.dense_values(all).unwrap(), "{rule}");
        let (mut kw, mut kp) = (Vec::new(), Vec::new());
        let (_, rw) = whole.feed_since(Some(start_w), None, &mut kw);
        let (_, rp) = pieces.feed_since(Some(start_p), None, &mut kp);
        assert_eq!((rw, &kw), (rp, &kp), "{rule}: the feed");
        // refused whole, nothing asked for
        let mut asked = false;
        let r = pieces.push_range_pieces(900, 200 * vl, &mut vec![0f32; 64 * vl], |_: &mut [f32]| -> std::result::Result<(), ()> {
            asked = true;
            Ok(())
        });
        assert!(matches!(r, Ok(Err(_))) && !asked, "{rule}: a range past the table's end");
    }
}

#[test]
fn dense_range_push_and_pull() {
    let mut t = Table::new(def(Some(KeyRange::new(100, 110)), 2, "add"), KeyRange::new(104, 200), &RuleRegistry::new()).unwrap();
    assert_eq!(t.owned(), KeyRange::new(104, 110));
    t.push_range(105, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    t.push(&[106, 109], &[10.0, 10.0, 5.0, 5.0]).unwrap();
    assert_eq!(t.dense_values(KeyRange::new(105, 107)).unwrap(), &[1.0, 2.0, 13.0, 14.0]);
    let (mut k, mut v) = (vec![], vec![]);
    t.pull_range(KeyRange::new(108, 1000), &mut k, &mut v).unwrap();
    assert_eq!(k, vec![108, 109]);
    assert_eq!(v, vec![0.0, 0.0, 5.0, 5.0]);
}

#[test]
fn a_keyed_push_of_one_run_on_a_dense_table_matches_pushing_its_keys_in_two_sparse_halves() {
    for (rule, vl) in [("add", 1), ("adagrad", 1), ("ftrl", 1), ("sgd", 2), ("bpg", 3)] {
        let reg = RuleRegistry::new();
        let mut whole = Table::new(def(Some(KeyRange::new(100, 140)), vl, rule), KeyRange::FULL, &reg).unwrap();
        let mut single = Table::new(def(Some(KeyRange::new(100, 140)), vl, rule), KeyRange::FULL, &reg).unwrap();
        let keys: Vec<u64> = (105..131).collect();
        for step in 0..3 {
            let vals: Vec<f32> = (0..keys.len() * vl).map(|i| ((i * 7 + step * 13) % 11) as f32 / 3.0 - 1.5).collect();
            whole.push(&keys, &vals).unwrap();
            // every other key: not one run, so the per-key path
            for parity in [0, 1] {
                let idx: Vec<usize> = (0..keys.len()).filter(|i| i % 2 == parity).collect();
                let ks: Vec<u64> = idx.iter().map(|&i| keys[i]).collect();
                let vs: Vec<f32> = idx.iter().flat_map(|&i| vals[i * vl..(i + 1) * vl].to_vec()).collect();
                single.push(&ks, &vs).unwrap();
            }
        }
        let (mut ka, mut ra, mut kb, mut rb) = (vec![], vec![], vec![], vec![]);
        whole.export_rows(KeyRange::new(100, 140), &mut ka, &mut ra);
        single.export_rows(KeyRange::new(100, 140), &mut kb, &mut rb);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        assert_eq!((ka, bits(&ra)), (kb, bits(&rb)), "{rule}");
    }
}

/// A user rule for the tests: `w = (w + g) / 2`, with a per-element counter as state.
struct HalveCounting;
impl crate::rule::UpdateRule for HalveCounting {
    fn state_per_element(&self) -> usize {
        1
    }
    fn apply(&self, w: &mut [f32], s: &mut [f32], g: &[f32]) {
        for ((w, g), s) in w.iter_mut().zip(g).zip(s) {
            *w = (*w + g) / 2.0;
            *s += 1.0;
        }
    }
}

/// Case `i` of [`every_rule`] for the property tests: a registry that knows the custom
/// rule, a sparse table of that rule (random initialiser, an L1 term), its name and value
/// length.
fn rule_case(i: usize) -> (RuleRegistry, TableDef, &'static str, usize) {
    let mut reg = RuleRegistry::new();
    reg.register("halve-counting", std::sync::Arc::new(HalveCounting)).unwrap();
    let (name, vl) = every_rule()[i];
    let mut d = def(None, vl, name);
    d.init = Init::Uniform { lo: -0.5, hi: 0.5, seed: 7 };
    d.rule.l1 = 0.05;
    (reg, d, name, vl)
}

/// Every rule with the value length its rows have.
fn every_rule() -> Vec<(&'static str, usize)> {
    vec![
        ("assign", 2),
        ("add", 1),
        ("sgd", 3),
        ("momentum", 1),
        ("adagrad", 2),
        ("adam", 1),
        ("ftrl", 1),
        ("bpg", 3),
        ("adagrad-norm", 2),
        ("ftrl-norm", 2),
        ("halve-counting", 2),
    ]
}

proptest! {
    // The sparse store, on every rule, on keys spread over the whole domain (ordered
    // placement) and on small ids (the mixed hash), with a random initialiser: each push,
    // pull, fused push-pull and peek gives what a map of rows gives with the rule's
    // contiguous step applied row by row, and the rows (values and rule state) agree at
    // the end.
    #[test]
    fn every_rule_on_the_sparse_store_matches_a_map_of_rows(
        rule in 0..11usize,
        spread in any::<bool>(),
        ops in proptest::collection::vec((0..4u8, proptest::collection::vec((any::<u64>(), -4.0f32..4.0, 0.1f32..3.0), 1..300)), 1..12),
    ) {
        let (reg, d, name, vl) = rule_case(rule);
        let mut t = Table::new(d.clone(), KeyRange::FULL, &reg).unwrap();
        let r = reg.resolve(&d.rule).unwrap();
        let sl = vl * r.state_per_element();
        let mut model: BTreeMap<u64, (Vec<f32>, Vec<f32>)> = BTreeMap::new();
        let row = |model: &mut BTreeMap<u64, (Vec<f32>, Vec<f32>)>, k: u64| -> (Vec<f32>, Vec<f32>) {
            model.entry(k).or_insert_with(|| {
                let mut w = vec![0.0; vl];
                d.init.fill(k, &mut w);
                (w, vec![0.0; sl])
            }).clone()
        };
        for (op, batch) in ops {
            let m: BTreeMap<u64, (f32, f32)> = batch.iter().map(|&(k, g, x)| (if spread { k % (u64::MAX - 1) } else { k % 5000 }, (g, x))).collect();
            let keys: Vec<u64> = m.keys().copied().collect();
            // pushed rows: (g, |x|) pairs for the normalised rules, (g, u, thr) for bpg
            let vals: Vec<f32> = m.values().flat_map(|&(g, x)| (0..vl).map(move |e| if e == 0 { g } else { x * e as f32 })).collect();
            let mut out = vec![f32::NAN; keys.len() * vl];
            match op {
                0 => t.push(&keys, &vals).unwrap(),
                1 => t.pull(&keys, &mut out).unwrap(),
                2 => t.push_pull(&keys, &vals, &mut out).unwrap(),
                _ => t.peek(&keys, &mut out).unwrap(),
            }
            for (i, &k) in keys.iter().enumerate() {
                let expect = match op {
                    0 | 2 => {
                        let (mut w, mut s) = row(&mut model, k);
                        r.apply(&mut w, &mut s, &vals[i * vl..(i + 1) * vl]);
                        model.insert(k, (w.clone(), s));
                        w
                    }
                    1 => row(&mut model, k).0,
                    _ => match model.get(&k) {
                        Some((w, _)) => w.clone(),
                        None => {
                            let mut w = vec![0.0; vl];
                            d.init.fill(k, &mut w);
                            w
                        }
                    },
                };
                if op != 0 {
                    prop_assert_eq!(&out[i * vl..(i + 1) * vl], &expect[..], "{} key {} op {}", name, k, op);
                }
            }
        }
        prop_assert_eq!(t.len(), model.len());
        let (mut k, mut rows) = (vec![], vec![]);
        t.export_rows(KeyRange::FULL, &mut k, &mut rows);
        let expect_rows: Vec<f32> = model.values().flat_map(|(w, s)| w.iter().chain(s).copied().collect::<Vec<_>>()).collect();
        prop_assert_eq!(k, model.keys().copied().collect::<Vec<_>>());
        prop_assert!(rows.iter().zip(&expect_rows).all(|(a, b)| a.to_bits() == b.to_bits()) && rows.len() == expect_rows.len(), "rows differ");
    }
}

proptest! {
    // The sorted-array + delta store behaves exactly like a map, across compactions.
    /// Under `count:N` a key's row appears at its N-th push, which is the first applied;
    /// pulls and peeks never create rows; push-pull reads a refused key as new; the rows
    /// are those of a map that counts pushes. Batches are large enough at times to take
    /// the two-thread path and the bulk reservation.
    #[test]
    fn admission_matches_a_map_that_counts_pushes(
        batches in proptest::collection::vec((proptest::collection::vec((0u64..3000, -5i32..5), 1..2500), 0u8..3), 1..20),
        n in 1u8..4,
    ) {
        let def = TableDef { admit: Admission::Count { n, sketch_mib: 1.0 }, ..def(None, 1, "add") };
        let mut t = Table::new(def, KeyRange::FULL, &RuleRegistry::new()).unwrap();
        // key → (pushes so far, the row if admitted)
        let mut model: BTreeMap<u64, (u8, Option<f32>)> = BTreeMap::new();
        for (batch, kind) in &batches {
            // spread keys over the whole space (shards), sorted
            let m: BTreeMap<u64, f32> = batch.iter().map(|&(k, v)| (k.wrapping_mul(0x9e37_79b9_7f4a_7c15), v as f32)).collect();
            let keys: Vec<u64> = m.keys().copied().collect();
            let vals: Vec<f32> = m.values().copied().collect();
            let mut out = vec![9.0; keys.len()];
            match kind {
                0 => t.pull(&keys, &mut out).unwrap(),
                1 => t.push_pull(&keys, &vals, &mut out).unwrap(),
                _ => t.push(&keys, &vals).unwrap(),
            }
            for ((k, v), o) in keys.iter().zip(&vals).zip(&out) {
                let e = model.entry(*k).or_insert((0, None));
                if *kind != 0 {
                    e.0 = e.0.saturating_add(1);
                    if e.0 >= n {
                        e.1 = Some(e.1.unwrap_or(0.0) + v);
                    }
                }
                if *kind != 2 {
                    prop_assert_eq!(*o, e.1.unwrap_or(0.0), "key {} after {} pushes", k, e.0);
                }
            }
        }
        let admitted = model.values().filter(|e| e.1.is_some()).count();
        prop_assert_eq!(t.len(), admitted);
        let st = t.admission().unwrap();
        prop_assert_eq!(st.admitted as usize, admitted);
        let refused: u64 = model.values().map(|e| e.0.min(n - 1) as u64).sum();
        prop_assert_eq!(st.refused, refused);
    }

    #[test]
    fn sparse_store_matches_a_btreemap(batches in proptest::collection::vec(proptest::collection::vec((0u64..20_000, -5i32..5), 1..600), 1..25)) {
        let mut t = Table::new(def(None, 1, "add"), KeyRange::FULL, &RuleRegistry::new()).unwrap();
        let mut model: BTreeMap<u64, f32> = BTreeMap::new();
        for (bi, batch) in batches.iter().enumerate() {
            let m: BTreeMap<u64, f32> = batch.iter().map(|&(k, v)| (k, v as f32)).collect();
            let keys: Vec<u64> = m.keys().copied().collect();
            let vals: Vec<f32> = m.values().copied().collect();
            if bi % 3 == 2 {
                let mut out = vec![0.0; keys.len()];
                t.pull(&keys, &mut out).unwrap();
                for (k, o) in keys.iter().zip(&out) { prop_assert_eq!(*model.entry(*k).or_insert(0.0), *o); }
            } else {
                let mut out = vec![0.0; keys.len()];
                t.push_pull(&keys, &vals, &mut out).unwrap();
                for ((k, v), o) in keys.iter().zip(&vals).zip(&out) { let e = model.entry(*k).or_insert(0.0); *e += v; prop_assert_eq!(*e, *o); }
            }
        }
        let (mut k, mut v) = (vec![], vec![]);
        t.pull_range(KeyRange::new(0, 10_000), &mut k, &mut v).unwrap();
        let expect: Vec<(u64, f32)> = model.range(0..10_000).map(|(a, b)| (*a, *b)).collect();
        prop_assert_eq!(k.into_iter().zip(v).collect::<Vec<_>>(), expect);
    }
}

proptest! {
    // Pushes at the rows a pull noted (`Table::push_at`), on every rule, give the table a
    // plain push gives: the hints fresh, stale (rows removed, shards grown or rebuilt under
    // the mixed hash since) or another request's. Twin tables take the same requests; their
    // pulls read the same values, and their rows (values and rule state) and update feeds
    // agree at the end.
    #[test]
    fn pushes_at_noted_rows_leave_the_table_a_plain_push_leaves(
        rule in 0..11usize,
        spread in any::<bool>(),
        ops in proptest::collection::vec((0..5u8, 0..3usize, proptest::collection::vec((any::<u64>(), -4.0f32..4.0, 0.1f32..3.0), 1..300)), 1..16),
    ) {
        let (reg, d, name, vl) = rule_case(rule);
        let (mut plain, mut noting) = (Table::new(d.clone(), KeyRange::FULL, &reg).unwrap(), Table::new(d, KeyRange::FULL, &reg).unwrap());
        let mut fk = Vec::new();
        let (start_p, _) = plain.feed_since(None, None, &mut fk);
        let (start_n, _) = noting.feed_since(None, None, &mut fk);
        // the last pulls' keys and the slots they noted
        let mut pulled: Vec<(Vec<u64>, Vec<Slot>)> = Vec::new();
        // the last request was a pull (the newest in `pulled`) that created no row: its
        // slots are all fresh (a pull that creates rows may grow a shard, moving the rows
        // it noted before)
        let mut just_pulled = false;
        let key = |k: u64| if spread { k % (u64::MAX - 1) } else { k % 5000 };
        for (op, pick, batch) in ops {
            let m: BTreeMap<u64, (f32, f32)> = batch.iter().map(|&(k, g, x)| (key(k), (g, x))).collect();
            let fresh: Vec<u64> = m.keys().copied().collect();
            let vals_for = |n: usize| -> Vec<f32> { m.values().cycle().take(n).flat_map(|&(g, x)| (0..vl).map(move |e| if e == 0 { g } else { x * e as f32 })).collect() };
            match op {
                0 => {
                    let (mut a, mut b) = (vec![f32::NAN; fresh.len() * vl], vec![f32::NAN; fresh.len() * vl]);
                    let mut noted = Vec::new();
                    plain.pull(&fresh, &mut a).unwrap();
                    let rows = noting.len();
                    noting.pull_noting(&fresh, &mut b, &mut noted).unwrap();
                    prop_assert_eq!(noted.len(), fresh.len());
                    prop_assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{} pulls differ", name);
                    pulled.push((fresh, noted));
                    if pulled.len() > 3 {
                        pulled.remove(0);
                    }
                    just_pulled = noting.len() == rows;
                    continue;
                }
                // a push of a pull's keys with the hints of that pull, or of another one (its
                // slots repeated to one a key, and some that name no row at all)
                1 | 2 if !pulled.is_empty() => {
                    let (keys, own) = &pulled[pick % pulled.len()];
                    let hints: Vec<Slot> = if op == 1 {
                        own.clone()
                    } else {
                        let other = &pulled[(pick + 1) % pulled.len()].1;
                        let odd = [Slot(u64::MAX - 1), Slot(70 << 32), Slot(0xFFFF_FFFF), Slot(3 << 32 | 5)];
                        other.iter().chain(&odd).cycle().take(keys.len()).copied().collect()
                    };
                    let vals = vals_for(keys.len());
                    plain.push(keys, &vals).unwrap();
                    let at = noting.push_at(keys, &vals, &hints).unwrap();
                    if op == 1 && just_pulled && pick % pulled.len() == pulled.len() - 1 {
                        prop_assert_eq!(at, keys.len(), "{}: the slots of the pull just before", name);
                    }
                }
                // rows removed: hints into the range go stale
                3 => {
                    let (a, b) = (key(batch[0].0), key(batch[batch.len() - 1].0));
                    let r = KeyRange::new(a.min(b), a.max(b).saturating_add(1));
                    plain.remove_range(r);
                    noting.remove_range(r);
                }
                // new keys (shards grow, or the store moves to the mixed hash)
                _ => {
                    let vals = vals_for(fresh.len());
                    plain.push(&fresh, &vals).unwrap();
                    noting.push(&fresh, &vals).unwrap();
                }
            }
            just_pulled = false;
        }
        prop_assert_eq!(plain.len(), noting.len());
        let (mut kp, mut rp, mut kn, mut rn) = (vec![], vec![], vec![], vec![]);
        plain.export_rows(KeyRange::FULL, &mut kp, &mut rp);
        noting.export_rows(KeyRange::FULL, &mut kn, &mut rn);
        prop_assert_eq!(kp, kn);
        prop_assert!(rp.len() == rn.len() && rp.iter().zip(&rn).all(|(a, b)| a.to_bits() == b.to_bits()), "{}: rows differ", name);
        let (mut fp, mut fnn) = (Vec::new(), Vec::new());
        let (_, ep) = plain.feed_since(Some(start_p), None, &mut fp);
        let (_, en) = noting.feed_since(Some(start_n), None, &mut fnn);
        prop_assert_eq!((ep, fp), (en, fnn), "the feed");
    }
}

#[test]
fn a_push_at_fresh_hints_reaches_every_row_there_and_stale_ones_by_a_walk() {
    let reg = RuleRegistry::new();
    let mut t = Table::new(def(None, 1, "ftrl"), KeyRange::FULL, &reg).unwrap();
    let mut twin = Table::new(def(None, 1, "ftrl"), KeyRange::FULL, &reg).unwrap();
    let keys: Vec<u64> =
        (0..2000u64).map(|i| crate::keys::scramble(i) >> 1).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let g = vec![0.25f32; keys.len()];
    let (mut out, mut noted) = (vec![0f32; keys.len()], Vec::new());
    t.pull_noting(&keys, &mut out, &mut noted).unwrap();
    twin.pull(&keys, &mut out).unwrap();
    assert_eq!(t.push_at(&keys, &g, &noted).unwrap(), keys.len(), "every hint fresh");
    twin.push(&keys, &g).unwrap();
    // every shard grows: the rows move, the hints go stale, the push walks to each row
    let more: Vec<u64> =
        (5000..200_000u64).map(|i| crate::keys::scramble(i) >> 1).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    t.push(&more, &vec![0.5; more.len()]).unwrap();
    twin.push(&more, &vec![0.5; more.len()]).unwrap();
    assert!(t.push_at(&keys, &g, &noted).unwrap() < keys.len() / 2, "stale hints after growth");
    twin.push(&keys, &g).unwrap();
    // hints of another length: a plain push
    assert_eq!(t.push_at(&keys, &g, &noted[1..]).unwrap(), 0);
    twin.push(&keys, &g).unwrap();
    let (mut k1, mut r1, mut k2, mut r2) = (vec![], vec![], vec![], vec![]);
    t.export_rows(KeyRange::FULL, &mut k1, &mut r1);
    twin.export_rows(KeyRange::FULL, &mut k2, &mut r2);
    assert_eq!((k1, r1), (k2, r2));
}

#[test]
fn a_push_at_noted_rows_stamps_changes_and_eviction_marks_as_a_plain_push() {
    use crate::changes::ChangeClock;
    use crate::eviction::{EvictClock, Eviction};
    use std::sync::atomic::Ordering;
    let mut d = def(None, 1, "sgd");
    d.changes = true;
    d.evict = Eviction::Lru { max_rows: 300 };
    let reg = RuleRegistry::new();
    let keys: Vec<u64> = (0..600u64).map(|i| i * 1_000_003).collect();
    let g = vec![1.0f32; 200];
    let mut tables = Vec::new();
    for noting in [false, true] {
        let mut t = Table::new(d.clone(), KeyRange::FULL, &reg).unwrap();
        let (cc, ct) = ChangeClock::manual(1_000_000);
        let (ec, et) = EvictClock::manual();
        t.set_change_clock(cc);
        t.set_evict_clock(ec);
        let mut out = vec![0f32; 600];
        t.pull(&keys, &mut out).unwrap();
        // later, a pull of 200 keys and the push of every other one of them
        ct.fetch_add(10_000, Ordering::Relaxed);
        et.fetch_add(10_000, Ordering::Relaxed);
        let mut noted = Vec::new();
        let pulled: Vec<u64> = keys[100..500].to_vec();
        t.pull_noting(&pulled, &mut out[..400], &mut noted).unwrap();
        ct.fetch_add(10_000, Ordering::Relaxed);
        et.fetch_add(10_000, Ordering::Relaxed);
        let (pushed, hints): (Vec<u64>, Vec<Slot>) = pulled.iter().zip(&noted).step_by(2).map(|(&k, &t)| (k, t)).unzip();
        if noting {
            assert_eq!(t.push_at(&pushed, &g, &hints).unwrap(), 200);
        } else {
            t.push(&pushed, &g).unwrap();
        }
        let mut changed = Vec::new();
        for s in 0..crate::hashstore::SHARDS {
            t.changed_rows(s, 1_020_000, KeyRange::FULL, &mut changed, &mut Vec::new()).unwrap();
        }
        changed.sort_unstable();
        assert_eq!(changed, pushed, "the push's rows and no others changed since it");
        t.evict();
        let (mut k, mut r) = (vec![], vec![]);
        t.export_rows(KeyRange::FULL, &mut k, &mut r);
        tables.push((k, r));
    }
    assert_eq!(tables[0].0.len(), 300, "eviction kept the most recently used rows");
    assert_eq!(tables[0], tables[1], "the same rows survive eviction");
}

#[test]
fn hints_past_the_end_of_a_shard_that_eviction_shrank_are_walked_to() {
    use crate::eviction::Eviction;
    let mut d = def(None, 1, "adagrad");
    d.evict = Eviction::Lru { max_rows: 100 };
    let reg = RuleRegistry::new();
    let keys: Vec<u64> =
        (0..5000u64).map(|i| crate::keys::scramble(i) >> 1).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let (mut plain, mut noting) = (Table::new(d.clone(), KeyRange::FULL, &reg).unwrap(), Table::new(d, KeyRange::FULL, &reg).unwrap());
    let mut out = vec![0f32; keys.len()];
    let mut noted = Vec::new();
    plain.pull(&keys, &mut out).unwrap();
    noting.pull_noting(&keys, &mut out, &mut noted).unwrap();
    let before = noting.bytes();
    plain.evict();
    noting.evict();
    assert!(noting.bytes() < before / 4, "eviction shrank the arrays: {} of {before} bytes", noting.bytes());
    let g: Vec<f32> = (0..keys.len()).map(|i| (i % 7) as f32 - 3.0).collect();
    plain.push(&keys, &g).unwrap();
    let at = noting.push_at(&keys, &g, &noted).unwrap();
    assert!(at < 200, "the survivors moved: {at} keys at their old slots");
    let (mut k1, mut r1, mut k2, mut r2) = (vec![], vec![], vec![], vec![]);
    plain.export_rows(KeyRange::FULL, &mut k1, &mut r1);
    noting.export_rows(KeyRange::FULL, &mut k2, &mut r2);
    assert_eq!((k1, r1), (k2, r2));
}
