//! The worker-side read cache of `ssp` tables on a live embedded cluster: a read answered
//! from memory is never staler than the bound allows (checked against the values, not
//! against the cache's own bookkeeping), and the worker's own pushes show in its reads; with
//! the servers' update feeds keeping rows fresh (dense and sparse tables) and without.

use downpour_cluster::{EmbeddedCluster, Settings};
use downpour_core::consistency::Consistency;
use downpour_core::proto;
use downpour_core::subscription::Subscription;
use downpour_core::table::{Storage, TableDef};
use downpour_core::KeyRange;
use downpour_worker::{FeedQuestion, ReadCache};
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

#[test]
fn reads_kept_fresh_by_the_update_feed_hold_every_update_older_than_a_bound_of_one() {
    cached_reads_with(Storage::Sparse, true, 1, 100);
}

/// A cache of 3 rows, reading 2: it is dropped for room at almost every insert, pulled
/// rows and answered rows alike, and every row dropped must be subscribed again.
#[test]
fn reads_kept_fresh_by_the_update_feed_hold_the_bound_when_the_cache_is_dropped_for_room() {
    cached_reads_with(Storage::Sparse, true, 1, 3);
}

fn cached_reads(storage: Storage, feed: bool) {
    cached_reads_with(storage, feed, TAU, 100)
}

fn cached_reads_with(storage: Storage, feed: bool, tau: u64, capacity: usize) {
    let cluster = EmbeddedCluster::start(&Settings::default(), 2, 2).unwrap();
    let def = TableDef {
        storage,
        rule: proto::Rule { name: "add".into(), ..Default::default() },
        consistency: Consistency::Ssp(tau),
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
                    let cache = ReadCache::new(&s.kv, 1, capacity).unwrap();
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
                        assert!(v[0] >= issued.saturating_sub(tau) as f32, "clock {c}: read {} of the writer's updates", v[0]);
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
                        // (a cache dropped for room at almost every insert may hold no
                        // subscribed row when an answer comes)
                        assert!(st.feed_answers > 0 && (capacity < 4 || st.feed_rows > 0) && st.feed_rows <= st.feed_answers, "{st:?}");
                        // both rows read are subscribed (the answers name them by rank)
                        assert!(st.subscribed <= 2 && (capacity < 4 || st.subscribed == 2), "{st:?}");
                    } else {
                        assert_eq!(st.feed_answers, 0, "{st:?}");
                    }
                    assert!(s.kv.staleness_max().unwrap() <= tau, "{:?}", s.kv.staleness_max());
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

/// The feed protocol by subscription, at the client: the answer names only the changed rows
/// the asker subscribed to, by rank, and a question whose count of subscribed keys differs
/// from the server's copy gets the copy reset (and no rows).
#[test]
fn a_feed_question_by_subscription_answers_the_subscribed_rows_by_rank() {
    let cluster = EmbeddedCluster::start(&Settings::default(), 1, 1).unwrap();
    let mut s = cluster.join().unwrap();
    let def = TableDef { rule: proto::Rule { name: "add".into(), ..Default::default() }, ..TableDef::new(1, "t") };
    s.kv.create_table(def).unwrap();
    let mut mine = Subscription::new();
    let ask = |kv: &mut downpour_worker::KvClient, since, new: &[u64], copy: &Subscription| {
        let ts = kv.feed(1, &[FeedQuestion { since, subscribe: Some((new, copy)) }], false).unwrap();
        kv.wait_feed(ts).unwrap().remove(0)
    };
    // the first question turns the feed on and subscribes 10, 20 and 30
    let a = ask(&mut s.kv, None, &[10, 20, 30], &mine);
    assert!(!a.known && !a.subscription_reset && a.keys.is_empty(), "{a:?}");
    mine.add(&[10, 20, 30]).unwrap();
    let t = s.kv.push(1, &[5, 10, 30, 40], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    s.kv.wait(t).unwrap();
    // 5 and 40 changed too, but only 10 and 30 are subscribed: ranks 0 and 2
    let mut a = ask(&mut s.kv, Some(a.position), &[], &mine);
    assert!(a.known && a.ranked && !a.subscription_reset, "{a:?}");
    assert_eq!(a.keys, vec![0, 2]);
    mine.keys_of(&mut a.keys).unwrap();
    assert_eq!((a.keys, a.values), (vec![10, 30], vec![2.0, 3.0]));
    // a copy of the same count but other keys: reset to this question's keys, nothing known
    let mut other = Subscription::new();
    other.add(&[10, 20, 31]).unwrap();
    let a = ask(&mut s.kv, Some(a.position), &[50], &other);
    assert!(!a.known && a.subscription_reset && a.keys.is_empty(), "{a:?}");
    mine.clear();
    mine.add(&[50]).unwrap();
    let t = s.kv.push(1, &[10, 50], &[1.0, 1.0]).unwrap();
    s.kv.wait(t).unwrap();
    let mut a = ask(&mut s.kv, Some(a.position), &[], &mine);
    assert!(a.known && !a.subscription_reset, "{a:?}");
    mine.keys_of(&mut a.keys).unwrap();
    assert_eq!((a.keys, a.values), (vec![50], vec![1.0]));
    // keys to subscribe out of order are refused with a clear error
    let ts = s.kv.feed(1, &[FeedQuestion { since: Some(a.position), subscribe: Some((&[9, 3], &mine)) }], false).unwrap();
    let e = s.kv.wait_feed(ts).unwrap_err();
    assert!(e.to_string().contains("not sorted"), "{e}");
    // and the server kept its copy: the same question, sorted, is answered
    let a = ask(&mut s.kv, Some(a.position), &[3, 9], &mine);
    assert!(a.known && !a.subscription_reset, "{a:?}");
    s.kv.wait_all().unwrap();
    s.finish(true, "").unwrap();
    cluster.wait().unwrap();
}

/// A row fetched while a feed question is in flight is subscribed only by the question
/// after it, so the answer between misses the changes made to it after its fetch: it must
/// not count as kept up to date by that answer. Driven step by step from one thread (a
/// reader and a writer session), so the order on the server is fixed: the writer's update
/// lands after the reader's fetch and before its next question; the read two clocks later
/// (bound 1) must show it.
#[test]
fn a_row_subscribed_late_is_not_taken_as_kept_up_to_date_before_it_was() {
    let cluster = EmbeddedCluster::start(&Settings::default(), 1, 2).unwrap();
    let (mut r, mut w) = std::thread::scope(|scope| {
        let other = scope.spawn(|| cluster.join().unwrap());
        let one = cluster.join().unwrap();
        (one, other.join().unwrap())
    });
    let def = TableDef {
        storage: Storage::Sparse,
        rule: proto::Rule { name: "add".into(), ..Default::default() },
        consistency: Consistency::Ssp(1),
        ..TableDef::new(1, "t")
    };
    r.kv.create_table(def.clone()).unwrap();
    w.kv.create_table(def).unwrap();
    let mut cache = ReadCache::new(&r.kv, 1, 100).unwrap().with_feed(&r.kv).unwrap();
    // clock 0: question 1 (turns the feed on) and the fetch of row 0 go out
    let r1 = cache.pull(&mut r.kv, &[0]).unwrap();
    // a request after them on the same connection: once answered, both were served
    let t = r.kv.pull(1, &[99]).unwrap();
    r.kv.wait_values(t).unwrap();
    // the writer's update of clock 0, after the fetch
    let t = w.kv.push(1, &[0], &[1.0]).unwrap();
    w.kv.wait(t).unwrap();
    w.kv.clock().unwrap();
    r.kv.clock().unwrap();
    // clock 1: answer 1 is taken, question 2 goes out before the fetched row lands (it is
    // not subscribed by question 2, which therefore misses the update)
    let r2 = cache.pull(&mut r.kv, &[0]).unwrap();
    assert_eq!(cache.wait(&mut r.kv, r1).unwrap(), vec![0.0]);
    assert_eq!(cache.wait(&mut r.kv, r2).unwrap(), vec![0.0]);
    w.kv.clock().unwrap();
    r.kv.clock().unwrap();
    // clock 2 under ssp:1: every update of clock 0 must show, the writer's included
    let r3 = cache.pull(&mut r.kv, &[0]).unwrap();
    assert_eq!(cache.wait(&mut r.kv, r3).unwrap(), vec![1.0]);
    cache.settle(&mut r.kv).unwrap();
    assert!(r.kv.staleness_max().unwrap() <= 1);
    std::thread::scope(|scope| {
        for s in [&mut r, &mut w] {
            scope.spawn(move || {
                s.kv.pause_clock().unwrap();
                s.kv.wait_all().unwrap();
            });
        }
    });
    std::thread::scope(|scope| {
        for mut s in [r, w] {
            scope.spawn(move || s.finish(true, "").unwrap());
        }
    });
    cluster.wait().unwrap();
}
