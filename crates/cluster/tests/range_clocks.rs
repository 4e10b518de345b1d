//! Range clocks at run time: a push that completes a worker's clock on a key range lets
//! pulls on that range go ahead before the worker clocks (ssp gating of partial pushes),
//! while pulls elsewhere still wait; a repeated completing push is dropped as a duplicate;
//! tables where range completion has no meaning refuse it.

use downpour_cluster::{EmbeddedCluster, Settings};
use downpour_core::consistency::Consistency;
use downpour_core::proto;
use downpour_core::table::{Storage, TableDef};
use downpour_core::KeyRange;
use std::time::{Duration, Instant};

fn table(id: u32, consistency: Consistency) -> TableDef {
    TableDef {
        storage: Storage::Dense(KeyRange::new(0, 1000)),
        rule: proto::Rule { name: "add".into(), ..Default::default() },
        consistency,
        ..TableDef::new(id, "t")
    }
}

/// How long the pushing worker waits after the first barrier before it clocks.
const LATE: Duration = Duration::from_millis(800);

#[test]
fn a_completed_range_is_readable_before_the_worker_clocks_and_a_repeat_is_dropped() {
    let cluster = EmbeddedCluster::start(&Settings::default(), 2, 2).unwrap();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            let cluster = &cluster;
            scope.spawn(move || {
                let mut s = cluster.join().unwrap();
                s.kv.create_table(table(1, Consistency::Ssp(0))).unwrap();
                s.barrier("created").unwrap();
                if s.rank == 1 {
                    // completes clock 0 on [0, 500) only, twice: the repeat is a duplicate
                    let ones = vec![1f32; 500];
                    let t = s.kv.push_range_completing(1, 0, &ones).unwrap();
                    s.kv.wait(t).unwrap();
                    let t = s.kv.push_range_completing(1, 0, &ones).unwrap();
                    s.kv.wait(t).unwrap();
                    assert_eq!(s.kv.dropped_pushes(), 1, "the repeated completing push was applied");
                    s.barrier("completed").unwrap();
                    std::thread::sleep(LATE);
                    s.kv.clock().unwrap();
                } else {
                    s.kv.clock().unwrap();
                    s.barrier("completed").unwrap();
                    let t0 = Instant::now();
                    // ssp:0 at clock 1: needs every worker's clock 1 on the keys read
                    let mut out = vec![0f32; 500];
                    s.kv.pull_range_into(1, 0, &mut out).unwrap();
                    let early = t0.elapsed();
                    assert!(out.iter().all(|&v| v == 1.0), "the completed range holds one push: {:?}", &out[..4]);
                    assert!(early < LATE / 2, "the completed range waited {early:?} for a clock");
                    s.kv.pull_range_into(1, 500, &mut out).unwrap();
                    let late = t0.elapsed();
                    assert!(late >= LATE * 3 / 4, "the range not completed was answered after {late:?}, before the clock");
                }
                s.barrier("done").unwrap();
                s.finish(true, "").unwrap();
            });
        }
    });
    cluster.wait().unwrap();
}

#[test]
fn range_completion_is_refused_where_rounds_decide_and_outside_the_range() {
    let cluster = EmbeddedCluster::start(&Settings::default(), 1, 1).unwrap();
    let mut s = cluster.join().unwrap();
    s.kv.create_table(table(1, Consistency::Bsp)).unwrap();
    s.kv.create_table(table(2, Consistency::Ssp(1))).unwrap();
    let t = s.kv.push_range_completing(1, 0, &[1.0; 10]).unwrap();
    let e = s.kv.wait(t).unwrap_err().to_string();
    assert!(e.contains("completes a range clock"), "{e}");
    let e = s.kv.push_completing(2, KeyRange::new(0, 10), &[3, 20], &[1.0, 1.0]).unwrap_err().to_string();
    assert!(e.contains("20"), "{e}");
    drop(s);
}
