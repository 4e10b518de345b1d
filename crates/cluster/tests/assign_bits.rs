//! A dense `assign` table returns every 32-bit pattern it was given, NaN payloads and
//! signalling NaNs included: `train shuffle` carries bytes through one as the bits of `f32`s.

use downpour_cluster::{EmbeddedCluster, Settings};
use downpour_core::proto;
use downpour_core::table::{Storage, TableDef};
use downpour_core::KeyRange;

#[test]
fn an_assign_table_returns_every_bit_pattern_exactly() {
    let n = 1 << 16;
    let cluster = EmbeddedCluster::start(&Settings::default(), 2, 1).unwrap();
    let mut s = cluster.join().unwrap();
    s.kv.create_table(TableDef {
        storage: Storage::Dense(KeyRange::new(0, n as u64)),
        rule: proto::Rule { name: "assign".into(), ..Default::default() },
        ..TableDef::new(1, "bits")
    })
    .unwrap();
    // every high half-word (all exponents, signs, NaN and infinity classes) with varied low bits
    let words: Vec<u32> = (0..n as u32).map(|i| i << 16 | (i.wrapping_mul(40503) & 0xffff)).collect();
    assert!(words.iter().any(|&w| f32::from_bits(w).is_nan() && w & 0x0040_0000 == 0), "signalling NaNs are in the set");
    let values: Vec<f32> = words.iter().map(|&w| f32::from_bits(w)).collect();
    let t = s.kv.push_range(1, 0, &values).unwrap();
    s.kv.wait(t).unwrap();
    let mut back = vec![0f32; n];
    s.kv.pull_range_into(1, 0, &mut back).unwrap();
    let bad = words.iter().zip(&back).filter(|(w, b)| **w != b.to_bits()).count();
    assert_eq!(bad, 0, "{bad} words changed on the way");
    s.finish(true, "").unwrap();
}
