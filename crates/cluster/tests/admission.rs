//! Feature admission on a live cluster: the table's `admit` travels to every server, a key's
//! row appears at its N-th push there, pulls of keys without a row read the initial value
//! and create nothing.

use downpour_cluster::{EmbeddedCluster, Settings};
use downpour_core::table::TableDef;

#[test]
fn a_key_gets_its_row_at_its_second_push_on_every_server() {
    let cluster = EmbeddedCluster::start(&Settings::default(), 2, 1).unwrap();
    let mut s = cluster.join().unwrap();
    s.kv.create_table(TableDef { admit: "count:2".parse().unwrap(), ..TableDef::new(1, "admitted") }).unwrap();
    // keys spread over both servers' ranges
    let keys: Vec<u64> = (1..=2000u64).map(|i| i * (u64::MAX / 2001)).collect();
    let ones = vec![1f32; keys.len()];
    let mut out = vec![9f32; keys.len()];
    let t = s.kv.push(1, &keys, &ones).unwrap();
    s.kv.wait(t).unwrap();
    s.kv.pull_into(1, &keys, &mut out).unwrap();
    assert!(out.iter().all(|&v| v == 0.0), "a key pushed once has no row: {:?}", &out[..4]);
    let t = s.kv.push(1, &keys, &vec![2f32; keys.len()]).unwrap();
    s.kv.wait(t).unwrap();
    s.kv.pull_into(1, &keys, &mut out).unwrap();
    assert!(out.iter().all(|&v| v == 2.0), "the second push is the first applied: {:?}", &out[..4]);
    // a pull of keys never pushed creates nothing, and they stay out until pushed twice
    let fresh: Vec<u64> = keys.iter().map(|k| k + 1).collect();
    s.kv.pull_into(1, &fresh, &mut out).unwrap();
    let t = s.kv.push(1, &fresh, &ones).unwrap();
    s.kv.wait(t).unwrap();
    s.kv.pull_into(1, &fresh, &mut out).unwrap();
    assert!(out.iter().all(|&v| v == 0.0), "pulls count for nothing: {:?}", &out[..4]);
    s.finish(true, "").unwrap();
}
