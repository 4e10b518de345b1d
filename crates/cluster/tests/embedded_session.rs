//! A program drives the workers of an embedded cluster itself (as notebooks and the Python
//! binding do): join, push, pull, barrier, finish.

use downpour_cluster::{EmbeddedCluster, Settings};
use downpour_core::proto;
use downpour_core::table::{Storage, TableDef};

#[test]
fn two_threads_join_an_embedded_cluster_and_see_each_others_pushes() {
    let cluster = EmbeddedCluster::start(&Settings::default(), 2, 2).unwrap();
    let keys: Vec<u64> = (0..1000).map(|k| k * 7919).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (cluster, keys) = (&cluster, &keys);
                scope.spawn(move || {
                    let mut s = cluster.join().unwrap();
                    let def = TableDef {
                        storage: Storage::Sparse,
                        value_len: 2,
                        rule: proto::Rule { name: "add".into(), ..Default::default() },
                        ..TableDef::new(1, "t")
                    };
                    s.kv.create_table(def).unwrap();
                    let ones = vec![1f32; keys.len() * 2];
                    let t = s.kv.push(1, keys, &ones).unwrap();
                    s.kv.wait(t).unwrap();
                    s.barrier("pushed").unwrap();
                    let mut out = vec![0f32; keys.len() * 2];
                    s.kv.pull_into(1, keys, &mut out).unwrap();
                    assert!(out.iter().all(|&x| x == 2.0), "both workers' pushes are in");
                    s.finish(true, "").unwrap();
                    s.rank
                })
            })
            .collect();
        let mut ranks: Vec<usize> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        ranks.sort_unstable();
        assert_eq!(ranks, [0, 1]);
    });
    cluster.wait().unwrap();
}
