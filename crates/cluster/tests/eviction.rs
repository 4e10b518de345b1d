//! Eviction on a live cluster: the table's `evict` travels to every server, whose background
//! thread drops rows while the worker keeps pushing; dropped keys read as new, the rows kept
//! are the ones the policy names; a replicated cluster drops rows too, and refuses with the
//! reason what it cannot replicate (admission, eviction on `bsp` tables).

use downpour_cluster::{EmbeddedCluster, Settings};
use downpour_core::table::TableDef;
use std::time::{Duration, Instant};

/// `n` keys (even), half on each server's range (the even split of two servers), sorted;
/// `from` picks a set (sets from far apart `from`s are disjoint).
fn keys(from: u64, n: u64) -> Vec<u64> {
    let spread = (from..).map(|i| downpour_core::keys::scramble(i).min(u64::MAX - 1));
    let mut k: Vec<u64> = spread.clone().filter(|&k| k < 1 << 63).take(n as usize / 2).collect();
    k.extend(spread.filter(|&k| k >= 1 << 63).take(n as usize / 2));
    k.sort_unstable();
    k
}

/// How many of `keys` have a row (a peek creates none and reads a missing key as 0).
fn stored(s: &mut downpour_worker::WorkerSession, keys: &[u64]) -> usize {
    let mut out = vec![0f32; keys.len()];
    s.kv.peek_into(1, keys, &mut out).unwrap();
    out.iter().filter(|&&v| v != 0.0).count()
}

/// Peeks until `done(rows stored of each key set)` holds, for 20 s at most.
fn wait_until(s: &mut downpour_worker::WorkerSession, sets: &[&[u64]], done: impl Fn(&[usize]) -> bool) -> Vec<usize> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n: Vec<usize> = sets.iter().map(|k| stored(s, k)).collect();
        if done(&n) || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_lru_table_keeps_the_newest_rows_on_every_server_while_pushes_go_on() {
    let cluster = EmbeddedCluster::start(&Settings::default(), 2, 1).unwrap();
    let mut s = cluster.join().unwrap();
    // at most 500 rows per server
    s.kv.create_table(TableDef { evict: "lru:500".parse().unwrap(), ..TableDef::new(1, "lru") }).unwrap();
    let old = keys(1, 4000);
    let new = keys(1_000_001, 1000);
    let t = s.kv.push(1, &old, &vec![1.0; old.len()]).unwrap();
    s.kv.wait(t).unwrap();
    // a few ticks later, the keys that will stay
    std::thread::sleep(Duration::from_millis(60));
    let t = s.kv.push(1, &new, &vec![2.0; new.len()]).unwrap();
    s.kv.wait(t).unwrap();
    let n = wait_until(&mut s, &[&old, &new], |n| n[0] == 0);
    assert_eq!(n, vec![0, 1000], "rows of the old and new keys left");
    // a dropped key starts again from its initial value (a few ms on: rows used within the
    // same millisecond are equally recent, and these must be newer than the others)
    std::thread::sleep(Duration::from_millis(5));
    let t = s.kv.push(1, &old[..10], &[5.0; 10]).unwrap();
    s.kv.wait(t).unwrap();
    let mut out = [0f32; 10];
    s.kv.pull_into(1, &old[..10], &mut out).unwrap();
    assert_eq!(out, [5.0; 10]);
    s.finish(true, "").unwrap();
    cluster.wait().unwrap();
}

#[test]
fn a_ttl_table_drops_what_was_not_used_within_the_ttl_and_keeps_what_was() {
    let cluster = EmbeddedCluster::start(&Settings::default(), 2, 1).unwrap();
    let mut s = cluster.join().unwrap();
    s.kv.create_table(TableDef { evict: "ttl:300ms".parse().unwrap(), ..TableDef::new(1, "ttl") }).unwrap();
    let idle = keys(1, 2000);
    let busy = keys(1_000_001, 2000);
    let t = s.kv.push(1, &idle, &vec![1.0; idle.len()]).unwrap();
    s.kv.wait(t).unwrap();
    // the busy keys are pulled every 50 ms; the idle ones only peeked at, which does not count
    let started = Instant::now();
    let mut out = vec![0f32; busy.len()];
    let mut n = vec![];
    while started.elapsed() < Duration::from_secs(20) {
        s.kv.pull_into(1, &busy, &mut out).unwrap();
        n = vec![stored(&mut s, &idle)];
        if n[0] == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(n, vec![0], "idle rows left");
    assert!(started.elapsed() >= Duration::from_millis(300), "dropped before the ttl: {:?}", started.elapsed());
    let t = s.kv.push(1, &busy, &vec![3.0; busy.len()]).unwrap();
    s.kv.wait(t).unwrap();
    assert_eq!(stored(&mut s, &busy), busy.len());
    s.finish(true, "").unwrap();
    cluster.wait().unwrap();
}

#[test]
fn a_replicated_cluster_drops_rows_of_an_lfu_table_and_refuses_what_it_cannot_replicate_with_the_reason() {
    let settings = Settings { replication: 2, ..Settings::default() };
    let cluster = EmbeddedCluster::start(&settings, 2, 1).unwrap();
    let mut s = cluster.join().unwrap();
    // two servers, two copies: each holds every row and heads about half, kept under 500/2
    s.kv.create_table(TableDef { evict: "lfu:500".parse().unwrap(), ..TableDef::new(1, "lfu") }).unwrap();
    let k = keys(1, 4000);
    let t = s.kv.push(1, &k, &vec![1.0; k.len()]).unwrap();
    s.kv.wait(t).unwrap();
    let n = wait_until(&mut s, &[&k], |n| n[0] <= 600);
    assert!(n[0] <= 600, "{} rows of 4000 left on the heads", n[0]);
    let e = s.kv.create_table(TableDef { admit: "count:2".parse().unwrap(), ..TableDef::new(2, "admit") }).unwrap_err().to_string();
    assert!(e.contains("replicated") && e.contains("count:2"), "{e}");
    let e =
        s.kv.create_table(TableDef {
            evict: "ttl:1h".parse().unwrap(),
            consistency: downpour_core::consistency::Consistency::Bsp,
            ..TableDef::new(3, "bsp")
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("bsp") && e.contains("ttl:"), "{e}");
    s.finish(true, "").unwrap();
    cluster.wait().unwrap();
}
