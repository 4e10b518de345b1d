//! The worker-side read cache of `ssp` tables on a live embedded cluster: a read answered
//! from memory is never staler than the bound allows (checked against the values, not
//! against the cache's own bookkeeping), and the worker's own pushes show in its reads; with
//! the servers' update feeds keeping rows fresh (dense and sparse tables) and without.

use downpour_cluster::{EmbeddedCluster, Settings};
use downpour_core::consistency::Consistency;
use downpour_core::proto;
use downpour_core::table::{Storage, TableDef};
use downpour_core::KeyRange;
use downpour_worker::ReadCache;
use std::time::Duration;

const TAU: u64 = 3;
const CLOCKS: u64 = 60;

#[test]
fn cached_reads_hold_every_update_older_than_the_bound_and_the_readers_own_pushes() {
    cached_reads(Storage::Dense(KeyRange::new(0, 8)), false);
}

#[test]
fn reads_kept_fresh_by_the_update_feed_hold_every_update_older_than_the_bound_dense() {
    cached_reads(Storage::Dense(KeyRange::new(0, 8)), true);
}

#[test]
fn reads_kept_fresh_by_the_update_feed_hold_every_update_older_than_the_bound_sparse() {
    cached_reads(Storage::Sparse, true);
}

fn cached_reads(storage: Storage, feed: bool) {
    let cluster = EmbeddedCluster::start(&Settings::default(), 2, 2).unwrap();
    let def = TableDef {
        storage,
        rule: proto::Rule { name: "add".into(), ..Default::default() },
        consistency: Consistency::Ssp(TAU),
        ..TableDef::new(1, "t")
    };
    std::thread::scope(|scope| {
        for _ in 0..2 {
            let (cluster, def) = (&cluster, def.clone());
            scope.spawn(move || {
                let mut s = cluster.join().unwrap();
                s.kv.create_table(def).unwrap();
                s.barrier("created").unwrap();
                if s.rank == 1 {
                    // the writer: adds 1 to key 0 in every clock, at an uneven pace
                    for c in 0..CLOCKS {
                        let t = s.kv.push(1, &[0], &[1.0]).unwrap();
                        s.kv.wait(t).unwrap();
                        std::thread::sleep(Duration::from_micros(300 * (c % 5)));
                        s.kv.clock().unwrap();
                    }
                } else {
                    // the reader: reads keys 0 and 1 through the cache every clock and adds 1 to
                    // key 1; like train linear, the read for clock c + 1 is sent before the push of
                    // clock c, so the rows it brings back must get that push replayed
                    let cache = ReadCache::new(&s.kv, 1, 100).unwrap();
                    let mut cache = if feed { cache.with_feed(&s.kv).unwrap() } else { cache };
                    let mut next = Some((0, cache.pull(&mut s.kv, &[0, 1]).unwrap()));
                    for c in 0..CLOCKS {
                        assert_eq!(s.kv.current_clock(), c);
                        let (issued, r) = next.take().unwrap();
                        if c + 1 < CLOCKS {
                            next = Some((c, cache.pull(&mut s.kv, &[0, 1]).unwrap()));
                        }
                        let v = cache.wait(&mut s.kv, r).unwrap();
                        // ssp: every update of clocks below (issue clock) − τ is in; the writer
                        // made one per clock
                        assert!(v[0] >= issued.saturating_sub(TAU) as f32, "clock {c}: read {} of the writer's updates", v[0]);
                        // the reader's own pushes: every one made before the read was sent
                        // (one per clock before its issue clock), whatever the cache held, and
                        // none made after it was waited for; a row taken from the answer of
                        // the read before it (still in flight when this one was sent) shows
                        // the push made in between too
                        assert!(v[1] >= issued as f32 && v[1] <= c as f32, "clock {c} (read issued at {issued}): {} own pushes", v[1]);
                        let t = s.kv.push(1, &[1], &[1.0]).unwrap();
                        cache.pushed(&[1], &[1.0]);
                        s.kv.wait(t).unwrap();
                        std::thread::sleep(Duration::from_micros(200 * (c % 3)));
                        s.kv.clock().unwrap();
                    }
                    cache.settle(&mut s.kv).unwrap();
                    let st = cache.stats();
                    assert!(st.reads_local > 0 && st.reads_local < st.reads, "{st:?}");
                    // the feed answers carry the writer's rows (never the reader's own: it
                    // applies those itself)
                    if feed {
                        assert!(st.feed_answers > 0 && st.feed_rows > 0 && st.feed_rows <= st.feed_answers, "{st:?}");
                    } else {
                        assert_eq!(st.feed_answers, 0, "{st:?}");
                    }
                    assert!(s.kv.staleness_max().unwrap() <= TAU, "{:?}", s.kv.staleness_max());
                }
                s.kv.pause_clock().unwrap();
                s.kv.wait_all().unwrap();
                s.barrier("done").unwrap();
                s.finish(true, "").unwrap();
            });
        }
    });
    cluster.wait().unwrap();
}
