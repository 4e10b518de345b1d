use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

fn spec(n: usize, q: usize, cache: f64) -> ShuffleSpec {
    ShuffleSpec { learners: n, rows: q, cache, seed: 7 }
}

/// Row `r`'s bytes: a length that varies by row, bytes that vary by position.
fn row_bytes(r: u32) -> Vec<u8> {
    let len = 3 + (r as usize * 7919) % 23;
    (0..len).map(|i| (r as usize * 31 + i * 17) as u8 ^ 0xa5).collect()
}

/// One learner's storage, kept the way a learner keeps it (rows and bytes), from its own
/// view only: the epoch-0 draw, then `retains` after every shuffle.
struct Learner {
    k: usize,
    store: HashMap<u32, Vec<u8>>,
}

impl Learner {
    fn start(s: &ShuffleSpec, owner: &[u32], k: usize) -> Learner {
        let store =
            (0..s.rows as u32).filter(|&r| owner[r as usize] as usize == k || keeps(s, 0, k, r)).map(|r| (r, row_bytes(r))).collect();
        Learner { k, store }
    }

    /// Reads the messages naming it, then keeps what `retains` says.
    fn shuffle(&mut self, s: &ShuffleSpec, epoch: u64, msgs: &[Message], old: &[u32], new: &[u32]) -> usize {
        let all: Vec<Vec<u8>> = (0..s.rows as u32).map(row_bytes).collect();
        let mut got = Vec::new();
        let mut payload = Vec::new();
        let mut read = 0;
        for m in msgs.iter().filter(|m| m.parts.iter().any(|p| p.learner as usize == self.k)) {
            encode(&m.parts, |r| all.get(r as usize).map(Vec::as_slice), &mut payload).unwrap();
            let mine = m.parts.iter().find(|p| p.learner as usize == self.k).unwrap();
            let len = row_bytes(mine.row).len();
            let bytes = decode(&m.parts, &payload, self.k as u32, len, |r| self.store.get(&r).map(Vec::as_slice)).unwrap();
            got.push((mine.row, bytes));
            read += 1;
        }
        for (r, b) in got {
            assert!(self.store.insert(r, b).is_none(), "row {r} delivered to learner {} twice or while stored", self.k);
        }
        let k = self.k;
        self.store.retain(|&r, _| retains(s, epoch, k, r, true, old[r as usize] as usize == k, new[r as usize] as usize == k));
        read
    }
}

/// Runs `epochs` shuffles and checks that every learner decodes exactly its missing rows,
/// byte for byte, and that its own storage stays equal to the master's record.
fn run(s: &ShuffleSpec, delivery: Delivery, epochs: u64) -> Vec<(usize, usize)> {
    let mut owner = assignment(s, 0);
    let mut caches = Caches::initial(s, &owner);
    let mut learners: Vec<Learner> = (0..s.learners).map(|k| Learner::start(s, &owner, k)).collect();
    let mut counts = Vec::new();
    for epoch in 1..=epochs {
        let new = assignment(s, epoch);
        let msgs = plan(s, &caches, &new, delivery).unwrap();
        let missing: usize = (0..s.learners).map(|k| caches.missing(&new, k).len()).sum();
        for l in &mut learners {
            let want = caches.missing(&new, l.k).len();
            assert_eq!(l.shuffle(s, epoch, &msgs, &owner, &new), want, "learner {} reads one message per missing row", l.k);
        }
        caches.advance(s, epoch, &owner, &new);
        for l in &learners {
            for r in 0..s.rows as u32 {
                assert_eq!(l.store.contains_key(&r), caches.holds(l.k, r), "learner {} row {r} after epoch {epoch}", l.k);
                if new[r as usize] as usize == l.k {
                    assert_eq!(l.store.get(&r), Some(&row_bytes(r)), "learner {} holds its row {r} exactly", l.k);
                }
            }
        }
        counts.push((msgs.len(), missing));
        owner = new;
    }
    counts
}

#[test]
fn every_learner_decodes_exactly_its_missing_rows() {
    for (n, q, a) in [(1, 5, 1.0), (2, 9, 0.5), (3, 40, 0.6), (4, 101, 0.25), (5, 200, 0.5), (8, 300, 0.4), (4, 120, 1.0)] {
        for d in [Delivery::Uncoded, Delivery::Coded] {
            let counts = run(&spec(n, q, a), d, 3);
            for (msgs, missing) in counts {
                match d {
                    Delivery::Uncoded => assert_eq!(msgs, missing),
                    Delivery::Coded => assert!(msgs <= missing, "coded {msgs} > uncoded {missing}"),
                }
            }
        }
    }
}

#[test]
fn assignment_deals_blocks_contiguous_first_then_permuted() {
    let s = spec(3, 10, 0.5);
    assert_eq!(assignment(&s, 0), vec![0, 0, 0, 0, 1, 1, 1, 2, 2, 2]);
    for e in 1..5 {
        let a = assignment(&s, e);
        for k in 0..3 {
            assert_eq!(rows_of(&a, k).len(), s.block_len(k));
        }
        assert_eq!(a, assignment(&s, e), "seeded");
    }
    assert_ne!(assignment(&s, 1), assignment(&s, 2));
}

#[test]
fn storage_stays_near_the_cache_fraction() {
    let s = spec(4, 20_000, 0.5);
    let mut owner = assignment(&s, 0);
    let mut caches = Caches::initial(&s, &owner);
    for epoch in 1..=4 {
        let new = assignment(&s, epoch);
        caches.advance(&s, epoch, &owner, &new);
        owner = new;
        for k in 0..4 {
            let f = caches.count(k) as f64 / s.rows as f64;
            assert!((f - 0.5).abs() < 0.01, "learner {k} stores {f} of the data after epoch {epoch}");
        }
    }
}

#[test]
fn message_counts_match_the_formula_for_many_rows() {
    for (n, a) in [(4, 0.25), (4, 0.5), (6, 0.5), (8, 0.75)] {
        let s = spec(n, 40_000, a);
        let mut owner = assignment(&s, 0);
        let mut caches = Caches::initial(&s, &owner);
        for epoch in 1..=2 {
            let new = assignment(&s, epoch);
            let unc = plan(&s, &caches, &new, Delivery::Uncoded).unwrap().len() as f64;
            let cod = plan(&s, &caches, &new, Delivery::Coded).unwrap().len() as f64;
            let (fu, fc, fl) = (formula::uncoded(&s), formula::coded(&s), formula::coded_limit(&s));
            println!("n={n} α={a}: uncoded {unc} ({fu:.0}), coded {cod} ({fc:.0}, limit {fl:.0})");
            assert!((unc / fu - 1.0).abs() < 0.02, "n={n} α={a}: uncoded {unc} against {fu}");
            assert!((cod / fc - 1.0).abs() < 0.03, "n={n} α={a}: coded {cod} against {fc}");
            assert!(fc >= fl);
            caches.advance(&s, epoch, &owner, &new);
            owner = new;
        }
    }
}

#[test]
fn coding_halves_a_shuffle_without_spare_storage() {
    let s = spec(4, 4000, 0.25);
    assert_eq!(s.excess(), 0.0);
    assert!((formula::coded_limit(&s) / formula::uncoded(&s) - 0.5).abs() < 1e-12);
}

#[test]
fn bad_shapes_and_foreign_rows_are_refused() {
    assert!(spec(0, 10, 1.0).validate().is_err());
    assert!(spec(4, 3, 1.0).validate().is_err());
    assert!(spec(4, 10, 0.2).validate().is_err());
    assert!(spec(4, 10, 1.5).validate().is_err());
    assert!(spec(65, 100, 1.0).validate().is_err());
    let s = spec(2, 10, 0.5);
    let c = Caches::initial(&s, &assignment(&s, 0));
    assert!(plan(&s, &c, &[0; 9], Delivery::Coded).is_err());
    assert!(plan(&s, &c, &[5; 10], Delivery::Coded).is_err());
    let parts = [Part { learner: 0, row: 1 }, Part { learner: 1, row: 2 }];
    let e = decode(&parts, &[1, 2, 3], 0, 3, |_| None).unwrap_err();
    assert!(e.to_string().contains("cannot cancel row 2"), "{e}");
    assert!(decode(&parts, &[1, 2, 3], 5, 3, |_| None).is_err());
    assert!(decode(&parts[..1], &[1, 2, 3], 0, 4, |_| None).is_err());
    assert!("broadcast".parse::<Delivery>().is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn any_shape_delivers_every_row(n in 1usize..7, extra in 0usize..60, a in 0.0f64..1.0, seed in any::<u64>()) {
        let q = n + extra;
        let cache = 1.0 / n as f64 + a * (1.0 - 1.0 / n as f64);
        let s = ShuffleSpec { learners: n, rows: q, cache, seed };
        run(&s, Delivery::Coded, 2);
        run(&s, Delivery::Uncoded, 1);
    }
}
