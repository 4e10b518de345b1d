//! Chain replication against real servers over the in-process transport, with the routing
//! changes driven by hand (no coordinator): every acknowledged push is on K servers, a
//! repeated request id is applied once, and a server left behind in an old epoch can no
//! longer acknowledge a write; a replacement worker continuing the lost one's request ids
//! applies exactly what was not applied, and the worker it replaced, if still running, can
//! no longer push under the rank.

use downpour_core::consistency::Consistency;
use downpour_core::msg::{self, Op, Status};
use downpour_core::proto;
use downpour_core::ring::Ring;
use downpour_core::shards::{copies, ShardMap};
use downpour_core::table::TableDef;
use downpour_core::KeyRange;
use downpour_server::{move_to_epoch, Server, ServerConfig, ServerHandle};
use downpour_transport::inproc::InProcTransport;
use downpour_transport::{key_bytes, value_bytes, Transport};
use downpour_worker::{ClientError, KvClient, KvConfig};
use std::sync::Arc;
use std::time::Duration;

const SHARDS: u32 = 16;
const VNODES: u32 = 4;

fn routing(epoch: u64, servers: &[(u32, String)]) -> proto::Routing {
    proto::Routing {
        epoch,
        servers: servers.iter().map(|(id, addr)| proto::ServerEntry { node_id: *id, addr: addr.clone(), ..Default::default() }).collect(),
        replication: 2,
        vnodes: VNODES,
        shards: SHARDS,
        active: true,
        served: Vec::new(),
    }
}

fn counter_table() -> TableDef {
    TableDef::new(1, "c")
}

/// Three servers (nodes 1, 2, 3) of a job of one worker, replicated twice, at epoch 1.
fn cluster(t: &Arc<InProcTransport>) -> (Vec<ServerHandle>, Vec<(u32, String)>) {
    let mut bound = Vec::new();
    let mut members = Vec::new();
    for i in 0..3u32 {
        let peer: Arc<dyn Transport> = t.clone();
        let s = Server::bind(t.as_ref(), "inproc://0", ServerConfig { peer_transport: Some(peer), ..Default::default() }).unwrap();
        members.push((i + 1, s.addr()));
        bound.push(s);
    }
    let r = routing(1, &members);
    let handles = bound
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.state().set_placement(i as u32 + 1, i as u32, 3, 1, 1);
            s.state().set_replicated(r.clone());
            s.spawn().unwrap()
        })
        .collect();
    (handles, members)
}

fn client(t: &Arc<InProcTransport>, r: &proto::Routing) -> KvClient {
    client_as(t, r, 100)
}

/// A client of worker rank 0 as node `node`.
fn client_as(t: &Arc<InProcTransport>, r: &proto::Routing, node: u32) -> KvClient {
    let cfg = KvConfig { chunk_bytes: 4096, request_timeout: Duration::from_secs(10), reply_window: 2, max_outstanding: 64 };
    let mut kv = KvClient::connect(t.as_ref(), r, node, cfg).unwrap();
    kv.set_worker_rank(0);
    kv
}

/// `n` keys spread over the whole key space (so every shard gets some).
fn spread_keys(n: u64) -> Vec<u64> {
    (0..n).map(|i| i * (u64::MAX / n)).collect()
}

/// `kv`'s next push is refused because rank 0 went to `node`.
fn assert_push_refused_as_taken_over_by(kv: &mut KvClient, keys: &[u64], values: &[f32], node: u32) {
    let late = kv.push(1, keys, values).and_then(|ts| kv.wait(ts));
    let e = late.expect_err("a replaced worker's push must be refused").to_string();
    assert!(e.contains(&format!("taken over by node {node}")), "{e}");
}

/// The placement of a job of these servers (as the servers compute it).
fn shard_map(members: &[u32]) -> ShardMap {
    ShardMap::new(&Ring::with_members(VNODES, members.iter().copied(), 1), KeyRange::FULL, SHARDS as usize, 2)
}

fn head_of(members: &[u32], key: u64) -> Vec<u32> {
    let map = shard_map(members);
    map.chain(map.shard_of(key).unwrap()).to_vec()
}

#[test]
fn an_acknowledged_push_is_stored_on_k_servers() {
    let t = Arc::new(InProcTransport::new());
    let (servers, members) = cluster(&t);
    let mut kv = client(&t, &routing(1, &members));
    kv.create_table(counter_table()).unwrap();
    let keys: Vec<u64> = (0..5000u64).map(|i| i * (u64::MAX / 5000)).collect();
    let ones = vec![1f32; keys.len()];
    for _ in 0..3 {
        let ts = kv.push(1, &keys, &ones).unwrap();
        kv.wait(ts).unwrap();
    }
    let stored: usize = servers.iter().map(|s| s.state.table_len(1).unwrap()).sum();
    assert_eq!(stored, 2 * keys.len(), "every key on exactly two servers");
    let mut out = vec![0f32; keys.len()];
    kv.pull_into(1, &keys, &mut out).unwrap();
    let bad: Vec<(usize, f32)> = out.iter().copied().enumerate().filter(|&(_, v)| v != 3.0).take(10).collect();
    assert!(bad.is_empty(), "{} wrong: {bad:?}", out.iter().filter(|&&v| v != 3.0).count());
}

#[test]
fn a_repeated_request_id_is_applied_once_down_the_whole_chain() {
    let t = Arc::new(InProcTransport::new());
    let (servers, members) = cluster(&t);
    let r = routing(1, &members);
    let mut kv = client(&t, &r);
    kv.create_table(counter_table()).unwrap();
    let key = 0x1234_5678_9abc_def0u64;
    let chain = head_of(&[1, 2, 3], key);
    let head = members.iter().find(|m| m.0 == chain[0]).unwrap().1.clone();
    let mut c = t.connect(&head, Duration::from_secs(5)).unwrap();
    // the same push (worker 0, request 7) three times, as a retry or a network duplicate would
    for _ in 0..3 {
        let mut h = msg::request(Op::Push, 100, 7, 1, 1);
        c.send(&mut h, key_bytes(&[key]), value_bytes(&[1.0])).unwrap();
        let a = c.recv_header().unwrap().unwrap();
        assert_eq!(a.status, 0, "{}", a.error);
    }
    // a worker cannot pass itself off as a chain member
    let tail = members.iter().find(|m| m.0 == chain[1]).unwrap().1.clone();
    let mut w = t.connect(&tail, Duration::from_secs(5)).unwrap();
    let mut h = msg::request(Op::Push, 100, 99, 1, 1);
    h.forwarded = true;
    w.send(&mut h, key_bytes(&[key]), value_bytes(&[50.0])).unwrap();
    let a = w.recv_header().unwrap().unwrap();
    assert_eq!(Status::from_u32(a.status), Status::PermissionDenied, "{}", a.error);
    let mut out = [0f32];
    kv.pull_into(1, &[key], &mut out).unwrap();
    assert_eq!(out[0], 1.0, "applied once at the head");
    // and once at the tail: make the tail the head by removing the head, then read there
    let rest: Vec<(u32, String)> = members.iter().filter(|m| m.0 != chain[0]).cloned().collect();
    let r2 = routing(2, &rest);
    for s in servers.iter().filter(|s| rest.iter().any(|m| m.1 == s.addr)) {
        move_to_epoch(&s.state, r2.clone()).unwrap();
    }
    let mut kv2 = client(&t, &r2);
    kv2.use_table(counter_table());
    kv2.pull_into(1, &[key], &mut out).unwrap();
    assert_eq!(out[0], 1.0, "applied once at the replica that took over");
}

#[test]
fn a_server_left_in_an_old_epoch_cannot_acknowledge_a_write() {
    let t = Arc::new(InProcTransport::new());
    let (servers, members) = cluster(&t);
    let r1 = routing(1, &members);
    let mut stale_worker = client(&t, &r1);
    stale_worker.create_table(counter_table()).unwrap();
    // a key whose epoch-1 chain starts at node 1; nodes 2 and 3 move on without node 1
    let key = (0..10_000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).find(|&k| head_of(&[1, 2, 3], k)[0] == 1).unwrap();
    let rest: Vec<(u32, String)> = members.iter().filter(|m| m.0 != 1).cloned().collect();
    let r2 = routing(2, &rest);
    for s in &servers[1..] {
        move_to_epoch(&s.state, r2.clone()).unwrap();
    }
    // the stale worker still sends to node 1, which still believes it is the head
    let ts = stale_worker.push(1, &[key], &[5.0]).unwrap();
    match stale_worker.wait(ts) {
        Err(ClientError::Server { status: Status::StaleEpoch, message, .. }) => {
            assert!(message.contains("replica node"), "{message}")
        }
        other => panic!("a fenced head acknowledged a write: {other:?}"),
    }
    // the new epoch's head never saw it
    let mut fresh = client(&t, &r2);
    fresh.use_table(counter_table());
    let mut out = [0f32];
    fresh.pull_into(1, &[key], &mut out).unwrap();
    assert_eq!(out[0], 0.0);
    // and a request of the old epoch to a server that moved is refused outright
    let moved = (0..10_000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).find(|&k| head_of(&[1, 2, 3], k)[0] == 2).unwrap();
    let ts = stale_worker.push(1, &[moved], &[1.0]).unwrap();
    match stale_worker.wait(ts) {
        Err(ClientError::Server { status: Status::StaleEpoch, message, .. }) => assert!(message.contains("epoch 2"), "{message}"),
        other => panic!("an old-epoch push was accepted: {other:?}"),
    }
}

/// A worker pipelines its pushes. If a server refused request k in a way the worker retries
/// (here: the worker is at a newer epoch than the server) but went on to apply request k + 1
/// from the same connection, its watermarks would pass k and the retried k would be taken as
/// a duplicate: lost. So the connection is closed after the refusal
/// (`core::chain_push::after_failure`) and nothing behind k is read; sent again in order on
/// a new connection, both are applied.
#[test]
fn a_push_refused_for_its_epoch_closes_the_connection_so_nothing_pipelined_behind_it_is_applied() {
    let t = Arc::new(InProcTransport::new());
    let (_servers, members) = cluster(&t);
    let mut kv = client(&t, &routing(1, &members));
    kv.create_table(counter_table()).unwrap();
    let key = (0..10_000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).find(|&k| head_of(&[1, 2, 3], k)[0] == 1).unwrap();
    let push = |c: &mut Box<dyn downpour_transport::Connection>, request: u64, epoch: u64| {
        let mut h = msg::request(Op::Push, 100, request, epoch, 1);
        c.send(&mut h, key_bytes(&[key]), value_bytes(&[1.0])).unwrap();
    };
    let mut c = t.connect(&members[0].1, Duration::from_secs(5)).unwrap();
    c.set_recv_timeout(Some(Duration::from_secs(10))).unwrap();
    push(&mut c, 5, 2); // the worker already heard of epoch 2: refused, and retried later
    push(&mut c, 6, 1); // pipelined behind it
    let refused = c.recv_header().unwrap().unwrap();
    assert_eq!(Status::from_u32(refused.status), Status::StaleEpoch, "{}", refused.error);
    assert_eq!(refused.request_id, 5);
    // closed: no answer to request 6
    if let Ok(Some(h)) = c.recv_header() {
        panic!("request {} was read after a refusal the worker retries (status {})", h.request_id, h.status);
    }
    let mut out = [0f32];
    kv.pull_into(1, &[key], &mut out).unwrap();
    assert_eq!(out[0], 0.0, "nothing behind the refused request was applied");
    // the worker reconnects and sends both again, in order
    let mut again = t.connect(&members[0].1, Duration::from_secs(5)).unwrap();
    for request in [5, 6] {
        push(&mut again, request, 1);
        let a = again.recv_header().unwrap().unwrap();
        assert_eq!(a.status, 0, "{}", a.error);
    }
    kv.pull_into(1, &[key], &mut out).unwrap();
    assert_eq!(out[0], 2.0, "both applied once");
}

/// A replacement worker goes on from the lost worker's progress record with the same request
/// ids (`KvClient::resume_requests`): rounds the lost worker had applied past the record, and a
/// round it had applied on one server only, are dropped by the watermarks; the rest is applied.
#[test]
fn a_replacement_resuming_the_request_ids_applies_exactly_what_the_lost_worker_had_not() {
    let t = Arc::new(InProcTransport::new());
    let (_servers, members) = cluster(&t);
    let r = routing(1, &members);
    let keys = spread_keys(2000);
    let ones = vec![1f32; keys.len()];
    let mut lost = client(&t, &r);
    lost.create_table(counter_table()).unwrap();
    for _ in 0..3 {
        lost.push(1, &keys, &ones).unwrap();
    }
    lost.wait_all().unwrap();
    // the progress record after round 3: every request before it acknowledged
    let (record, clock) = (lost.next_request_id(), lost.current_clock());
    assert_eq!(lost.first_unfinished(), record);
    for _ in 3..6 {
        lost.push(1, &keys, &ones).unwrap();
    }
    lost.wait_all().unwrap();
    drop(lost);
    // round 7 (request record + 3) reached server 1 only, for the keys it heads, then the
    // worker died
    let on_1: Vec<u64> = keys.iter().copied().filter(|&k| head_of(&[1, 2, 3], k)[0] == 1).collect();
    assert!(!on_1.is_empty() && on_1.len() < keys.len());
    let mut c = t.connect(&members[0].1, Duration::from_secs(5)).unwrap();
    let mut h = msg::request(Op::Push, 100, record + 3, 1, 1);
    c.send(&mut h, key_bytes(&on_1), value_bytes(&vec![1f32; on_1.len()])).unwrap();
    let a = c.recv_header().unwrap().unwrap();
    assert_eq!(a.status, 0, "{}", a.error);

    // the replacement: same rank, ids and clock from the record; it replays rounds 4..=10
    let mut kv = client(&t, &r);
    kv.create_table(counter_table()).unwrap();
    kv.resume_requests(record, clock).unwrap();
    for _ in 3..10 {
        kv.push(1, &keys, &ones).unwrap();
    }
    kv.wait_all().unwrap();
    let mut out = vec![0f32; keys.len()];
    kv.pull_into(1, &keys, &mut out).unwrap();
    let wrong = out.iter().filter(|&&v| v != 10.0).count();
    assert_eq!(wrong, 0, "ten rounds exactly on every key; e.g. {:?}", out.iter().find(|&&v| v != 10.0));
    // ids never go back
    assert!(matches!(kv.resume_requests(record, clock), Err(ClientError::Resume(_))));
}

#[test]
fn a_worker_replaced_while_still_running_is_fenced_and_its_late_pushes_change_nothing() {
    let t = Arc::new(InProcTransport::new());
    let (_servers, members) = cluster(&t);
    let r = routing(1, &members);
    let keys = spread_keys(2000);
    let ones = vec![1f32; keys.len()];
    // node 100 holds rank 0, pushes two rounds, then hangs (declared lost, not dead)
    let mut old = client_as(&t, &r, 100);
    old.create_table(counter_table()).unwrap();
    for _ in 0..2 {
        old.push(1, &keys, &ones).unwrap();
    }
    old.wait_all().unwrap();
    let (record, clock) = (old.next_request_id(), old.current_clock());
    // its replacement, node 101 (the coordinator's ids only grow), goes on from the record
    let mut new = client_as(&t, &r, 101);
    new.use_table(counter_table());
    new.resume_requests(record, clock).unwrap();
    new.push(1, &keys, &ones).unwrap();
    new.wait_all().unwrap();
    // the old worker wakes up and pushes its third round (the same request id) and a fourth
    assert_push_refused_as_taken_over_by(&mut old, &keys, &ones, 101);
    let later = old.push(1, &keys, &ones).and_then(|ts| old.wait(ts));
    assert!(later.is_err(), "still fenced");
    let mut out = vec![0f32; keys.len()];
    new.pull_into(1, &keys, &mut out).unwrap();
    let wrong = out.iter().filter(|&&v| v != 3.0).count();
    assert_eq!(wrong, 0, "three rounds exactly on every key; e.g. {:?}", out.iter().find(|&&v| v != 3.0));
    // the replacement itself keeps pushing
    new.push(1, &keys, &ones).unwrap();
    new.wait_all().unwrap();
    new.pull_into(1, &keys, &mut out).unwrap();
    assert!(out.iter().all(|&v| v == 4.0));
}

#[test]
fn a_replaced_worker_is_fenced_where_the_coordinator_named_its_replacement_before_it_pushed_there() {
    let t = Arc::new(InProcTransport::new());
    let (servers, members) = cluster(&t);
    let r = routing(1, &members);
    let keys = spread_keys(2000);
    let ones = vec![1f32; keys.len()];
    let mut old = client_as(&t, &r, 100);
    old.create_table(counter_table()).unwrap();
    let ts = old.push(1, &keys, &ones).unwrap();
    old.wait(ts).unwrap();
    // the coordinator's heartbeat answers tell every server that node 101 holds rank 0 now
    for s in &servers {
        s.state.note_worker_nodes(&[101]);
        s.state.note_worker_nodes(&[100]); // never back to an older node
    }
    assert_push_refused_as_taken_over_by(&mut old, &keys, &ones, 101);
    let mut reader = client_as(&t, &r, 101);
    reader.use_table(counter_table());
    let mut out = vec![0f32; keys.len()];
    reader.pull_into(1, &keys, &mut out).unwrap();
    assert!(out.iter().all(|&v| v == 1.0), "only the round before the replacement");
}

/// A server may move from routing epoch 2 straight to epoch 3 without having heard that
/// epoch 2 was served (its heartbeat answer brought the next change already). It must plan
/// its replica copies from where the data is, epoch 2's placement (the routing's `served`),
/// not from epoch 1's: a plan from epoch 1 sends copies of shards over servers that hold
/// newer data, and the updates since are lost.
#[test]
fn a_server_that_missed_an_epoch_being_served_still_copies_from_where_the_data_is() {
    // a joiner's node id for which some shard leaves a server's chain in epoch 2 (the join)
    // and comes back to it in epoch 3 (node 1 drained): planned from epoch 1, that server
    // would send its copy from before epoch 2 over the current one
    let joiner_id = (4..200u32)
        .find(|&j| {
            let (m1, m2, m3) = (shard_map(&[1, 2, 3]), shard_map(&[1, 2, 3, j]), shard_map(&[2, 3, j]));
            copies(&m1, &m3, &[2, 3, j]).unwrap().iter().any(|c| !m2.chain(c.shard).contains(&c.from))
        })
        .expect("a ring where a shard comes back to a server");
    let t = Arc::new(InProcTransport::new());
    let (mut servers, mut members) = cluster(&t);
    let keys = spread_keys(4000);
    let ones = vec![1f32; keys.len()];
    let mut kv1 = client(&t, &routing(1, &members));
    kv1.create_table(counter_table()).unwrap();
    let ts = kv1.push(1, &keys, &ones).unwrap();
    kv1.wait(ts).unwrap();

    // epoch 2: the joiner comes in (it holds nothing until the copies of epoch 2 arrive)
    let peer: Arc<dyn Transport> = t.clone();
    let joiner = Server::bind(t.as_ref(), "inproc://0", ServerConfig { peer_transport: Some(peer), ..Default::default() }).unwrap();
    members.push((joiner_id, joiner.addr()));
    let mut r2 = routing(2, &members);
    r2.served = vec![1, 2, 3];
    joiner.state().set_placement(joiner_id, 3, 4, 1, 2);
    joiner.state().set_replicated(proto::Routing { active: false, ..r2.clone() });
    servers.push(joiner.spawn().unwrap());
    for s in &servers[..3] {
        move_to_epoch(&s.state, r2.clone()).unwrap();
    }
    // served, but no server hears of it (no `epoch_served`); three rounds under epoch 2
    let mut kv2 = client(&t, &r2);
    kv2.use_table(counter_table());
    // (the same worker: its request ids go on)
    kv2.resume_requests(kv1.next_request_id(), kv1.current_clock()).unwrap();
    for _ in 0..3 {
        kv2.push(1, &keys, &ones).unwrap();
    }
    kv2.wait_all().unwrap();

    // epoch 3: node 1 is drained
    let rest: Vec<(u32, String)> = members.iter().filter(|m| m.0 != 1).cloned().collect();
    let mut r3 = routing(3, &rest);
    r3.served = vec![1, 2, 3, joiner_id];
    for s in &servers[1..] {
        move_to_epoch(&s.state, r3.clone()).unwrap();
    }
    let mut kv3 = client(&t, &r3);
    kv3.use_table(counter_table());
    let mut out = vec![0f32; keys.len()];
    kv3.pull_into(1, &keys, &mut out).unwrap();
    let wrong = out.iter().filter(|&&v| v != 4.0).count();
    assert_eq!(wrong, 0, "four rounds on every head; e.g. {:?}", out.iter().find(|&&v| v != 4.0));

    // and on every replica: epoch 4 without the joiner leaves two servers holding everything
    let last: Vec<(u32, String)> = rest.iter().filter(|m| m.0 != joiner_id).cloned().collect();
    let mut r4 = routing(4, &last);
    r4.served = vec![2, 3, joiner_id];
    for s in &servers[1..3] {
        move_to_epoch(&s.state, r4.clone()).unwrap();
    }
    let mut kv4 = client(&t, &r4);
    kv4.use_table(counter_table());
    kv4.pull_into(1, &keys, &mut out).unwrap();
    let wrong = out.iter().filter(|&&v| v != 4.0).count();
    assert_eq!(wrong, 0, "four rounds on every copy; e.g. {:?}", out.iter().find(|&&v| v != 4.0));
}

/// A chain member that failed one forwarded update frame of a round (here: a frame for a
/// shard it heads, refused; in the field: its own successor was dead) skips the frames after
/// it with the same request id, which carry other shards' updates of the round. The round
/// watermarks frame that follows must then be refused: raising them would make a new head
/// started from this server drop the workers' replays of updates it never applied (a round
/// lost on whole shards with K = 3 and two servers killed 10 ms apart). The next stream,
/// whole, is taken.
#[test]
fn a_chain_member_that_missed_part_of_a_round_refuses_that_rounds_watermarks() {
    let t = Arc::new(InProcTransport::new());
    let (_servers, members) = cluster(&t);
    let mut kv = client(&t, &routing(1, &members));
    let mut def = counter_table();
    def.consistency = Consistency::Bsp;
    def.aggregate = downpour_core::rounds::Aggregate::Sum;
    kv.create_table(def).unwrap();
    // node 2: heads shard `a`, is the tail (second of two) of shard `b`
    let map = shard_map(&[1, 2, 3]);
    let a = (0..map.len()).find(|&i| map.chain(i)[0] == 2).unwrap();
    let b = (0..map.len()).find(|&i| map.chain(i)[1] == 2).unwrap();
    let sender = map.chain(b)[0];
    let mut c = t.connect(&members[1].1, Duration::from_secs(5)).unwrap();
    // slot of the round watermark: the job has one worker
    let update = |shard: usize| {
        let mut h = msg::request(Op::Push, sender, downpour_core::chain_rounds::round_request(0, 0).unwrap(), 1, 1);
        h.worker = 1;
        h.forwarded = true;
        h.last = false;
        (h, [map.range(shard).begin])
    };
    let marks = |shard: usize| {
        let mut h = msg::request(Op::Push, sender, u64::MAX, 1, 1);
        h.worker = 1;
        h.forwarded = true;
        h.meta = [(shard as u32).to_le_bytes().as_slice(), 1u64.to_le_bytes().as_slice()].concat().into();
        h
    };
    for shard in [a, b] {
        let (mut h, k) = update(shard);
        c.send(&mut h, key_bytes(&k), value_bytes(&[1.0])).unwrap();
    }
    c.send(&mut marks(b), &[], &[]).unwrap();
    let first = c.recv_header().unwrap().unwrap();
    assert_eq!(Status::from_u32(first.status), Status::StaleEpoch, "the update for a headed shard is refused: {}", first.error);
    let wm = c.recv_header().unwrap().unwrap();
    assert_eq!(Status::from_u32(wm.status), Status::StaleEpoch, "the watermarks after a skipped update were taken");
    assert!(wm.error.contains("was not applied here"), "{}", wm.error);
    // the whole stream again: applied, and its watermarks taken
    let (mut h, k) = update(b);
    c.send(&mut h, key_bytes(&k), value_bytes(&[1.0])).unwrap();
    c.send(&mut marks(b), &[], &[]).unwrap();
    let ok = c.recv_header().unwrap().unwrap();
    assert_eq!(ok.status, 0, "{}", ok.error);
    assert_eq!(ok.request_id, u64::MAX);
}
