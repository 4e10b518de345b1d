//! Eviction on replicated tables against real servers over the in-process transport
//! (`core::chain_evict`): the heads drop rows while two workers push over one another's
//! keys, the chains carry the drops, and every copy ends with the same rows and values,
//! through an epoch move that takes a server out mid-run.

use downpour_core::proto;
use downpour_core::table::TableDef;
use downpour_core::KeyRange;
use downpour_server::{move_to_epoch, Server, ServerConfig, ServerHandle};
use downpour_transport::inproc::InProcTransport;
use downpour_transport::Transport;
use downpour_worker::{KvClient, KvConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn routing(epoch: u64, servers: &[(u32, String)], replication: u32) -> proto::Routing {
    proto::Routing {
        epoch,
        servers: servers.iter().map(|(id, addr)| proto::ServerEntry { node_id: *id, addr: addr.clone(), ..Default::default() }).collect(),
        replication,
        vnodes: 4,
        shards: 16,
        active: true,
        served: Vec::new(),
    }
}

/// `n` servers (nodes 1..=n) of a job of two workers, every row on `replication` of them.
fn cluster(t: &Arc<InProcTransport>, n: u32, replication: u32) -> (Vec<ServerHandle>, Vec<(u32, String)>) {
    let mut bound = Vec::new();
    let mut members = Vec::new();
    for i in 0..n {
        let peer: Arc<dyn Transport> = t.clone();
        let s = Server::bind(t.as_ref(), "inproc://0", ServerConfig { peer_transport: Some(peer), ..Default::default() }).unwrap();
        members.push((i + 1, s.addr()));
        bound.push(s);
    }
    let r = routing(1, &members, replication);
    let handles = bound
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.state().set_placement(i as u32 + 1, i as u32, n, 2, 1);
            s.state().set_replicated(r.clone());
            s.spawn().unwrap()
        })
        .collect();
    (handles, members)
}

fn client(t: &Arc<InProcTransport>, r: &proto::Routing, rank: u32) -> KvClient {
    let cfg = KvConfig { chunk_bytes: 16 << 10, request_timeout: Duration::from_secs(20), reply_window: 4, max_outstanding: 64 };
    let mut kv = KvClient::connect(t.as_ref(), r, 100 + rank, cfg).unwrap();
    kv.set_worker_rank(rank);
    kv
}

/// Keys spread over the key space: set `set`, `n` of them (sets overlap by half with the next).
fn keys(set: u64, n: u64) -> Vec<u64> {
    let mut k: Vec<u64> = (set * n / 2..set * n / 2 + n).map(downpour_core::keys::scramble).collect();
    k.sort_unstable();
    k.dedup();
    k
}

/// Each server's rows once no server holds a drop its successor has not acknowledged and
/// the copies agree, or as they stand after 30 s (an evictor's pass may be under way when
/// they are read: read again).
fn settled(servers: &[&ServerHandle]) -> Vec<(Vec<u64>, Vec<f32>)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pending = servers.iter().any(|s| s.state.pending_drops(1) > 0);
        let rows: Vec<(Vec<u64>, Vec<f32>)> = servers.iter().map(|s| s.state.table_rows(1, KeyRange::FULL).unwrap()).collect();
        if (!pending && rows.iter().all(|r| *r == rows[0])) || Instant::now() > deadline {
            return rows;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Two workers push rounds of keys (each round half new, half the last round's) from two
/// threads, so their pushes reach each copy in different orders, while the heads drop rows.
fn push_rounds(kvs: &mut [KvClient], rounds: std::ops::Range<u64>) {
    std::thread::scope(|sc| {
        for (w, kv) in kvs.iter_mut().enumerate() {
            let rounds = rounds.clone();
            sc.spawn(move || {
                for round in rounds {
                    let k = keys(round + w as u64, 1500);
                    let ts = kv.push(1, &k, &vec![1.0; k.len()]).unwrap();
                    kv.wait(ts).unwrap();
                }
            });
        }
    });
}

fn assert_same_rows(rows: &[(Vec<u64>, Vec<f32>)]) {
    for (i, r) in rows.iter().enumerate().skip(1) {
        assert_eq!(r.0.len(), rows[0].0.len(), "copy {i} holds {} rows, copy 0 {}", r.0.len(), rows[0].0.len());
        assert!(r.0 == rows[0].0, "copy {i} holds other keys than copy 0");
        let diff = r.1.iter().zip(&rows[0].1).filter(|(a, b)| a != b).count();
        assert_eq!(diff, 0, "copy {i} differs from copy 0 in {diff} values");
    }
}

#[test]
fn every_copy_of_a_chain_drops_the_same_rows_while_two_workers_push() {
    let t = Arc::new(InProcTransport::new());
    let (servers, members) = cluster(&t, 3, 3);
    let r = routing(1, &members, 3);
    let mut kvs = vec![client(&t, &r, 0), client(&t, &r, 1)];
    // every server holds every row; each heads about a third and keeps under 2000/3 of them
    kvs[0].create_table(TableDef { evict: "lru:2000".parse().unwrap(), ..TableDef::new(1, "lru") }).unwrap();
    kvs[1].use_table(TableDef { evict: "lru:2000".parse().unwrap(), ..TableDef::new(1, "lru") });
    push_rounds(&mut kvs, 0..30);
    // the last pushes' rows go in the evictors' next passes
    let deadline = Instant::now() + Duration::from_secs(20);
    while servers.iter().any(|s| s.state.table_len(1).unwrap() > 2100) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let rows = settled(&servers.iter().collect::<Vec<_>>());
    assert_same_rows(&rows);
    let evicted: u64 = servers.iter().map(|s| s.state.eviction(1).unwrap().evicted).sum();
    assert!(evicted > 0, "nothing was dropped");
    assert!(rows[0].0.len() <= 2100, "{} rows kept: the bound was not applied", rows[0].0.len());
}

#[test]
fn the_copies_left_after_a_server_is_taken_out_mid_run_drop_the_same_rows() {
    let t = Arc::new(InProcTransport::new());
    let (servers, members) = cluster(&t, 3, 2);
    let r1 = routing(1, &members, 2);
    let def = TableDef { evict: "lru:2000".parse().unwrap(), ..TableDef::new(1, "lru") };
    let mut kvs = vec![client(&t, &r1, 0), client(&t, &r1, 1)];
    kvs[0].create_table(def.clone()).unwrap();
    kvs[1].use_table(def.clone());
    push_rounds(&mut kvs, 0..6);
    // node 1 leaves (as when declared dead): the others move on with every row on both
    let rest: Vec<(u32, String)> = members.iter().filter(|m| m.0 != 1).cloned().collect();
    let mut r2 = routing(2, &rest, 2);
    r2.served = vec![1, 2, 3];
    for s in &servers[1..] {
        move_to_epoch(&s.state, r2.clone()).unwrap();
    }
    let mut next: Vec<KvClient> = kvs
        .iter()
        .enumerate()
        .map(|(w, old)| {
            let mut kv = client(&t, &r2, w as u32);
            kv.use_table(def.clone());
            kv.resume_requests(old.next_request_id(), old.current_clock()).unwrap();
            kv
        })
        .collect();
    push_rounds(&mut next, 6..12);
    let rows = settled(&servers[1..].iter().collect::<Vec<_>>());
    assert_same_rows(&rows);
    assert!(servers[1..].iter().all(|s| s.state.eviction(1).unwrap().evicted > 0), "a survivor dropped nothing");
}
