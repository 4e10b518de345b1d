//! The worker client against real servers over every transport (no coordinator needed):
//! the same calls must behave the same over framed TCP, gRPC and in-process channels.
//! Chunks are kept tiny so every multi-chunk and reply-window path is exercised.

use downpour_core::consistency::Consistency;
use downpour_core::init::Init;
use downpour_core::proto;
use downpour_core::rounds::Aggregate;
use downpour_core::table::{Storage, TableDef};
use downpour_core::tensor::TensorMap;
use downpour_core::KeyRange;
use downpour_server::{Server, ServerConfig, ServerHandle};
use downpour_transport::faulty::{FaultConfig, FaultyTransport, Partitions};
use downpour_transport::inproc::InProcTransport;
use downpour_transport::{network_transport, NetConfig, Transport, TransportKind};
use downpour_worker::{After, ClientError, KvClient, KvConfig};
use std::sync::Arc;
use std::time::Duration;

fn transports() -> Vec<(&'static str, Arc<dyn Transport>)> {
    let tls = NetConfig { tls: Some(downpour_transport::security::throwaway_tls()), ..NetConfig::default() };
    vec![
        ("inproc", Arc::new(InProcTransport::new())),
        ("tcp", network_transport(TransportKind::Tcp, NetConfig::default()).unwrap()),
        ("grpc", network_transport(TransportKind::Grpc, NetConfig::default()).unwrap()),
        // the same suite over mutual TLS on framed TCP
        ("tcp+tls", network_transport(TransportKind::Tcp, tls).unwrap()),
        // and through shared-memory rings (small ones: big requests wrap and wait for room)
        ("shm", network_transport(TransportKind::Shm, NetConfig { shm_ring_bytes: 256 << 10, ..NetConfig::default() }).unwrap()),
    ]
}

fn listen_addr(t: &dyn Transport) -> &'static str {
    if t.name() == "inproc" {
        "inproc://0"
    } else {
        "127.0.0.1:0"
    }
}

struct Cluster {
    servers: Vec<ServerHandle>,
    kv: KvClient,
    routing: proto::Routing,
    cfg: KvConfig,
}

fn cluster(t: &dyn Transport, n: usize, chunk_bytes: usize) -> Cluster {
    cluster_of(t, n, chunk_bytes, 2)
}

/// `n` servers for a job of `workers` workers; the returned client is worker 0.
fn cluster_of(t: &dyn Transport, n: usize, chunk_bytes: usize, workers: u32) -> Cluster {
    let mut servers = Vec::new();
    let mut routing = proto::Routing { epoch: 1, servers: vec![], ..Default::default() };
    for i in 0..n {
        let s = Server::bind(t, listen_addr(t), ServerConfig { chunk_bytes, ..Default::default() }).unwrap();
        s.state().set_placement(10 + i as u32, i as u32, n as u32, workers, 1);
        routing.servers.push(proto::ServerEntry { node_id: 10 + i as u32, addr: s.addr(), ..Default::default() });
        servers.push(s.spawn().unwrap());
    }
    let cfg = KvConfig { chunk_bytes, request_timeout: Duration::from_secs(20), reply_window: 2, max_outstanding: 16 };
    let mut kv = KvClient::connect(t, &routing, 1, cfg).unwrap();
    kv.set_worker_rank(0);
    Cluster { servers, kv, routing, cfg }
}

fn table(id: u32, vl: usize, storage: Storage, rule: &str) -> TableDef {
    TableDef {
        id,
        name: format!("t{id}"),
        value_len: vl,
        storage,
        init: Init::Zeros,
        rule: proto::Rule { name: rule.into(), lr: 0.5, ..Default::default() },
        consistency: Consistency::Async,
        aggregate: Default::default(),
        backup_workers: 0,
        filters: Default::default(),
        admit: Default::default(),
        evict: Default::default(),
        changes: false,
    }
}

fn spread_keys(n: u64) -> Vec<u64> {
    let stride = (u64::MAX - 1) / n;
    (0..n).map(|i| i * stride + 7).collect()
}

#[test]
fn per_key_vectors_push_pull_and_fused_across_servers_and_chunks() {
    for (name, t) in transports() {
        let mut c = cluster(t.as_ref(), 3, 4096);
        c.kv.create_table(table(1, 4, Storage::Sparse, "add")).unwrap();
        let keys = spread_keys(2000);
        let vals: Vec<f32> = (0..keys.len() * 4).map(|i| i as f32).collect();
        // many pushes pipelined, one wait
        let mut last = None;
        for _ in 0..5 {
            last = Some(c.kv.push(1, &keys, &vals).unwrap());
        }
        c.kv.wait(last.unwrap()).unwrap();
        let ts = c.kv.pull(1, &keys).unwrap();
        let got = c.kv.wait_values(ts).unwrap();
        let expect: Vec<f32> = vals.iter().map(|v| v * 5.0).collect();
        assert_eq!(got, expect, "{name}");
        let mut out = vec![0f32; vals.len()];
        c.kv.push_pull_into(1, &keys, &vals, &mut out).unwrap();
        let expect6: Vec<f32> = vals.iter().map(|v| v * 6.0).collect();
        assert_eq!(out, expect6, "{name}");
        let ts = c.kv.push_pull(1, &keys[..10], &vals[..40]).unwrap();
        assert_eq!(c.kv.wait_values(ts).unwrap(), vals[..40].iter().map(|v| v * 7.0).collect::<Vec<_>>(), "{name}");
        // each server holds a share
        for s in &c.servers {
            let n = s.state.table_len(1).unwrap();
            assert!(n > 500 && n < 800, "{name}: uneven share {n}");
        }
    }
}

#[test]
fn range_pull_returns_existing_keys_in_order_across_servers() {
    for (name, t) in transports() {
        let mut c = cluster(t.as_ref(), 2, 4096);
        c.kv.create_table(table(2, 1, Storage::Sparse, "assign")).unwrap();
        let keys = spread_keys(1000);
        let vals: Vec<f32> = (0..keys.len()).map(|i| i as f32 + 0.5).collect();
        let ts = c.kv.push(2, &keys, &vals).unwrap();
        c.kv.wait(ts).unwrap();
        let lo = keys[100];
        let hi = keys[900];
        let (k, v) = c.kv.pull_range(2, KeyRange::new(lo, hi)).unwrap();
        assert_eq!(k, keys[100..900].to_vec(), "{name}");
        assert_eq!(v, vals[100..900].to_vec(), "{name}");
    }
}

#[test]
fn summarize_gives_every_servers_column_norms_and_non_zero_counts() {
    for (name, t) in transports() {
        let mut c = cluster(t.as_ref(), 3, 4096);
        c.kv.create_table(table(1, 2, Storage::Sparse, "add")).unwrap();
        c.kv.create_table(table(2, 1, Storage::Dense(KeyRange::new(0, 1000)), "add")).unwrap();
        let keys = spread_keys(500);
        // column 0: -k/7 (k = 0 gives an exact zero), column 1: 0.5
        let vals: Vec<f32> = (0..500).flat_map(|i| [-(i as f32) / 7.0, 0.5]).collect();
        let ts = c.kv.push(1, &keys, &vals).unwrap();
        c.kv.wait(ts).unwrap();
        let ts = c.kv.push_range(2, 0, &(0..1000).map(|i| if i % 3 == 0 { 0.0 } else { 2.0 }).collect::<Vec<f32>>()).unwrap();
        c.kv.wait(ts).unwrap();
        let s = c.kv.summarize(1).unwrap();
        let (_, rows) = c.kv.pull_range(1, KeyRange::FULL).unwrap();
        let l1: f64 = rows.chunks_exact(2).map(|r| r[0].abs() as f64).sum();
        assert!((s[0].0 - l1).abs() < 1e-9 * l1, "{name}: {} vs {l1}", s[0].0);
        assert_eq!(s[0].1, 499, "{name}");
        assert_eq!(s[1], (250.0, 500), "{name}");
        assert_eq!(c.kv.summarize(2).unwrap(), vec![(2.0 * 666.0, 666)], "{name}");
        assert!(matches!(c.kv.summarize(9), Err(ClientError::UnknownTable(9))), "{name}");
    }
}

#[test]
fn dense_tensors_span_servers_and_round_trip() {
    for (name, t) in transports() {
        let mut c = cluster(t.as_ref(), 3, 4096);
        let mut map = TensorMap::new(0);
        let w1 = map.add("w1", &[100, 30]).unwrap().clone();
        let b1 = map.add("b1", &[30]).unwrap().clone();
        let mut def = table(3, 1, Storage::Dense(map.domain()), "sgd");
        def.init = Init::Uniform { lo: -1.0, hi: 1.0, seed: 5 };
        c.kv.create_table(def.clone()).unwrap();
        let mut w = vec![0f32; w1.len()];
        c.kv.pull_tensor(3, &w1, &mut w).unwrap();
        // seeded init is the same wherever the key lives
        let mut e = [0f32];
        def.init.fill(w1.keys.begin + 1234, &mut e);
        assert_eq!(w[1234], e[0], "{name}");
        let g = vec![1.0f32; w1.len()];
        let ts = c.kv.push_tensor(3, &w1, &g).unwrap();
        c.kv.wait(ts).unwrap();
        let mut w2 = vec![0f32; w1.len()];
        c.kv.pull_tensor(3, &w1, &mut w2).unwrap();
        for (a, b) in w.iter().zip(&w2) {
            assert!((a - 0.5 - b).abs() < 1e-6, "{name}");
        }
        let mut bb = vec![0f32; b1.len()];
        c.kv.pull_tensor(3, &b1, &mut bb).unwrap();
        let mut out = vec![0f32; w1.len()];
        c.kv.push_pull_range_into(3, w1.keys.begin, &g, &mut out).unwrap();
        for (a, b) in w2.iter().zip(&out) {
            assert!((a - 0.5 - b).abs() < 1e-6, "{name}");
        }
        // dense range pull of the whole table through pull_range (keys implied)
        let (k, v) = c.kv.pull_range(3, KeyRange::new(0, u64::MAX)).unwrap();
        assert_eq!(k.len(), map.domain().len() as usize);
        assert_eq!(&v[..w1.len()], &out[..], "{name}");
    }
}

/// A range push whose values wait whole in a shared-memory ring is applied from it piece by
/// piece; one larger than the ring, or over another transport, is read whole first. Under
/// stateful rules and rows of several values, every way gives the same model, bit for bit.
#[test]
fn dense_range_pushes_give_the_same_model_applied_from_the_ring_in_pieces_or_read_whole() {
    let shm = |ring| network_transport(TransportKind::Shm, NetConfig { shm_ring_bytes: ring, ..NetConfig::default() }).unwrap();
    let ways: Vec<(&str, Arc<dyn Transport>)> = vec![
        ("inproc", Arc::new(InProcTransport::new())),
        ("tcp", network_transport(TransportKind::Tcp, NetConfig::default()).unwrap()),
        // 1 MiB chunks in a 4 MiB ring: in pieces; in a 256 KiB ring: whole
        ("shm, pieces", shm(4 << 20)),
        ("shm, whole", shm(256 << 10)),
    ];
    // (rule, value length, rows): 300,000 rows of one value are 600 KB a server, five 128
    // KiB pieces over the large ring, more than the small ring holds; 5 rows fit both rings;
    // rows of 40,000 values are longer than a piece (a piece is then one row)
    let cases = [("adagrad", 1usize, 300_000u64), ("ftrl", 1, 70_001), ("bpg", 3, 100_003), ("add", 1, 5), ("sgd", 40_000, 4)];
    // whether each way takes a case's frames from the ring in pieces (None: some frames fit
    // the small ring, some do not)
    let expect_from_ring = |way: &str, rule: &str| match (way, rule) {
        ("shm, pieces", _) => Some(true),
        // one 600 KB frame a server, more than the small ring
        ("shm, whole", "adagrad") => Some(false),
        ("shm, whole", "add") => Some(true),
        ("shm, whole", _) => None,
        _ => Some(false),
    };
    let mut models: Vec<Vec<Vec<f32>>> = Vec::new();
    for (name, t) in &ways {
        let mut c = cluster(t.as_ref(), 2, 1 << 20);
        let mut got = Vec::new();
        for (id, &(rule, vl, rows)) in cases.iter().enumerate() {
            let id = 20 + id as u32;
            let mut def = table(id, vl, Storage::Dense(KeyRange::new(0, rows)), rule);
            def.rule.l1 = 0.01;
            c.kv.create_table(def).unwrap();
            let n = rows as usize * vl;
            for round in 0..2 {
                let g: Vec<f32> = (0..n).map(|i| ((i * 7 + round * 3) % 11) as f32 * 0.25 - 1.0).collect();
                let ts = c.kv.push_range(id, 0, &g).unwrap();
                c.kv.wait(ts).unwrap();
            }
            let mut w = vec![0f32; n];
            c.kv.pull_range_into(id, 0, &mut w).unwrap();
            assert!(w.iter().any(|&x| x != 0.0), "{name}: {rule} moved the model");
            got.push(w);
        }
        // the frames each table's servers took from the ring in pieces, as they count them
        let metrics: Vec<String> = c.servers.iter().map(|s| downpour_server::render_metrics(&s.state)).collect();
        for (case, &(rule, _, _)) in cases.iter().enumerate() {
            let label = format!("downpour_table_push_frames_from_ring_total{{table=\"{}\"", 20 + case);
            let from_ring: f64 = metrics
                .iter()
                .flat_map(|m| m.lines())
                .filter(|l| l.starts_with(&label))
                .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
                .sum();
            if let Some(expect) = expect_from_ring(name, rule) {
                assert_eq!(from_ring > 0.0, expect, "{name}: {rule}: {from_ring} frames from the ring");
            }
        }
        models.push(got);
    }
    for (i, (name, _)) in ways.iter().enumerate().skip(1) {
        for (j, &(rule, _, _)) in cases.iter().enumerate() {
            assert!(models[i][j] == models[0][j], "{name}: {rule}'s model differs from in-process");
        }
    }
}

#[test]
fn invalid_requests_fail_with_clear_errors_and_servers_keep_serving() {
    for (name, t) in transports() {
        let mut c = cluster(t.as_ref(), 2, 4096);
        c.kv.create_table(table(4, 2, Storage::Sparse, "add")).unwrap();
        let e = c.kv.push(4, &[5, 3], &[1.0; 4]).unwrap_err();
        assert!(e.to_string().contains("sorted and unique"), "{name}: {e}");
        let e = c.kv.push(4, &[3, 5], &[1.0; 3]).unwrap_err();
        assert!(e.to_string().contains("length mismatch"), "{name}: {e}");
        assert!(matches!(c.kv.pull(99, &[1]), Err(ClientError::UnknownTable(99))), "{name}");
        // a table the servers do not have: the server answers with an error...
        c.kv.use_table(table(77, 1, Storage::Sparse, "add"));
        let many = spread_keys(3000);
        let ts = c.kv.push(77, &many, &vec![1.0; many.len()]).unwrap();
        let e = c.kv.wait(ts).unwrap_err();
        assert!(e.to_string().contains("table 77 does not exist"), "{name}: {e}");
        let mut out = vec![0f32; many.len()];
        let e = c.kv.pull_into(77, &many, &mut out).unwrap_err();
        assert!(e.to_string().contains("UnknownTable"), "{name}: {e}");
        // ...and keeps serving the same connection
        let ts = c.kv.push(4, &[3, 5], &[1.0; 4]).unwrap();
        c.kv.wait(ts).unwrap();
        let mut out = [0f32; 4];
        c.kv.pull_into(4, &[3, 5], &mut out).unwrap();
        assert_eq!(out, [1.0; 4], "{name}");
        // a conflicting definition of an existing table is refused
        let e = c.kv.create_table(table(4, 3, Storage::Sparse, "add")).unwrap_err();
        assert!(e.to_string().contains("different definition"), "{name}: {e}");
        // an unknown rule is refused with the list of rules
        let e = c.kv.create_table(table(5, 1, Storage::Sparse, "nesterov")).unwrap_err();
        assert!(e.to_string().contains("unknown rule"), "{name}: {e}");
    }
}

#[test]
fn server_survives_garbage_bytes_and_huge_length_prefixes() {
    use std::io::Write;
    let t = network_transport(TransportKind::Tcp, NetConfig::default()).unwrap();
    let mut c = cluster(t.as_ref(), 1, 1 << 20);
    c.kv.create_table(table(1, 1, Storage::Sparse, "add")).unwrap();
    let addr = c.servers[0].addr.clone();
    for junk in [vec![0xffu8; 64], 0x8000_0000u32.to_le_bytes().to_vec(), vec![3, 0, 0, 0, 1, 2], {
        // valid header prefix announcing a 2 GiB payload
        let h = proto::FrameHeader { values_len: 2 << 30, ..Default::default() };
        let mut b = Vec::new();
        downpour_core::codec::encode_header(&h, &mut b);
        b
    }] {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        let _ = s.write_all(&junk);
        drop(s);
    }
    // a bounded flood of connections that send nothing
    let idle: Vec<_> = (0..50).map(|_| std::net::TcpStream::connect(&addr).unwrap()).collect();
    let ts = c.kv.push(1, &[1, 2], &[1.0, 2.0]).unwrap();
    c.kv.wait(ts).unwrap();
    let mut out = [0f32; 2];
    c.kv.pull_into(1, &[1, 2], &mut out).unwrap();
    assert_eq!(out, [1.0, 2.0]);
    drop(idle);
}

#[test]
fn connecting_to_an_address_nobody_listens_on_is_a_clear_error() {
    let t = network_transport(TransportKind::Tcp, NetConfig::default()).unwrap();
    // nothing listens here any more once the listener is gone: connect fails fast
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = l.local_addr().unwrap().to_string();
    drop(l);
    let routing = proto::Routing {
        epoch: 1,
        servers: vec![proto::ServerEntry { node_id: 1, addr: dead.clone(), ..Default::default() }],
        ..Default::default()
    };
    let e = KvClient::connect(t.as_ref(), &routing, 1, KvConfig::default()).err().expect("must fail");
    assert!(e.to_string().contains(&dead), "{e}");
}

/// A server that goes away under a connected worker (its links cut by `FaultyTransport`, as
/// a crashed host looks from the worker: sends and receives on the open connection fail)
/// fails the worker's next push and pull with an error naming it, long before the request
/// timeout.
#[test]
fn a_server_that_goes_away_under_a_connected_worker_is_a_clear_error_not_a_hang() {
    let parts = Partitions::new();
    let t = FaultyTransport::new(Arc::new(InProcTransport::new()), "worker", FaultConfig::default(), parts.clone());
    let mut c = cluster(&t, 2, 4096);
    c.kv.create_table(table(1, 1, Storage::Sparse, "add")).unwrap();
    let keys = spread_keys(64);
    let ts = c.kv.push(1, &keys, &[1.0; 64]).unwrap();
    c.kv.wait(ts).unwrap();
    let gone = c.routing.servers[1].addr.clone();
    parts.cut("worker", &gone);
    let t0 = std::time::Instant::now();
    let e = c.kv.push(1, &keys, &[1.0; 64]).and_then(|ts| c.kv.wait(ts)).expect_err("a push to a server that went away must fail");
    assert!(e.to_string().contains(&gone), "the error names the server that went away: {e}");
    let mut out = vec![0f32; 64];
    assert!(c.kv.pull_into(1, &keys, &mut out).is_err(), "a pull from it fails too");
    assert!(t0.elapsed() < Duration::from_secs(5), "failing took {:?} (the request timeout is 20 s)", t0.elapsed());
}

#[test]
fn port_in_use_is_a_clear_error() {
    let t = network_transport(TransportKind::Tcp, NetConfig::default()).unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let e = Server::bind(t.as_ref(), &addr, ServerConfig::default()).err().expect("must fail");
    assert!(e.to_string().contains("already in use"), "{e}");
    let g = network_transport(TransportKind::Grpc, NetConfig::default()).unwrap();
    let e = Server::bind(g.as_ref(), &addr, ServerConfig::default()).err().expect("must fail");
    assert!(e.to_string().contains("already in use"), "{e}");
}

#[test]
fn update_rules_apply_on_the_server_path() {
    let t = InProcTransport::new();
    let mut c = cluster(&t, 2, 4096);
    let mut def = table(9, 1, Storage::Sparse, "ftrl");
    def.rule = proto::Rule { name: "ftrl".into(), lr: 0.5, l1: 1.0, ftrl_beta: 1.0, ..Default::default() };
    c.kv.create_table(def).unwrap();
    let keys = spread_keys(10);
    for g in [0.5f32, 2.0] {
        let ts = c.kv.push(9, &keys, &[g; 10]).unwrap();
        c.kv.wait(ts).unwrap();
    }
    let mut out = vec![0f32; 10];
    c.kv.pull_into(9, &keys, &mut out).unwrap();
    let expect = -(1.5f32) / ((1.0 + 4.25f32.sqrt()) / 0.5);
    assert!(out.iter().all(|w| (w - expect).abs() < 1e-6), "{out:?}");
}

#[test]
fn peek_reads_without_creating_keys_across_servers_and_chunks() {
    for (name, t) in transports() {
        let servers = 3;
        let mut c = cluster(t.as_ref(), servers, 4096);
        c.kv.create_table(table(3, 2, Storage::Sparse, "add")).unwrap();
        let keys = spread_keys(3000);
        let pushed: Vec<u64> = keys.iter().copied().step_by(2).collect();
        let ts = c.kv.push(3, &pushed, &vec![1.5; pushed.len() * 2]).unwrap();
        c.kv.wait(ts).unwrap();
        let mut out = vec![-1.0; keys.len() * 2];
        c.kv.peek_into(3, &keys, &mut out).unwrap();
        for (i, v) in out.chunks(2).enumerate() {
            let expect = if i % 2 == 0 { 1.5 } else { 0.0 };
            assert_eq!(v, [expect, expect], "{name}: key #{i}");
        }
        let stored: usize = c.servers.iter().map(|s| s.state.table_len(3).unwrap()).sum();
        assert_eq!(stored, pushed.len(), "{name}: a peek must not create keys");
        // A pull, by contrast, creates them.
        c.kv.pull_into(3, &keys, &mut out).unwrap();
        let stored: usize = c.servers.iter().map(|s| s.state.table_len(3).unwrap()).sum();
        assert_eq!(stored, keys.len(), "{name}");
    }
}

#[test]
fn bsp_pull_waits_for_every_workers_clock_and_reports_its_staleness() {
    for (name, t) in transports() {
        // two servers, two workers (the cluster's client is worker 0)
        let mut c = cluster(t.as_ref(), 2, 4096);
        let mut def = table(4, 1, Storage::Sparse, "add");
        def.consistency = Consistency::Bsp;
        c.kv.create_table(def.clone()).unwrap();
        let mut w1 = KvClient::connect(t.as_ref(), &c.routing, 2, c.cfg).unwrap();
        w1.set_worker_rank(1);
        w1.use_table(def);
        let keys = spread_keys(100);
        // iteration 1: both push; worker 0 clocks, worker 1 has not yet
        let a = c.kv.push(4, &keys, &vec![1.0; keys.len()]).unwrap();
        let b = w1.push(4, &keys, &vec![2.0; keys.len()]).unwrap();
        c.kv.wait(a).unwrap();
        w1.wait(b).unwrap();
        assert_eq!(c.kv.clock().unwrap(), 1);
        // worker 0's pull at clock 1 must see all of clock 1: it waits for worker 1
        let (tx, rx) = std::sync::mpsc::channel();
        let mut kv0 = c.kv;
        let k2 = keys.clone();
        let puller = std::thread::spawn(move || {
            let mut out = vec![0f32; k2.len()];
            kv0.pull_into(4, &k2, &mut out).unwrap();
            tx.send(out).unwrap();
            kv0
        });
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "{name}: a bsp pull was answered before every worker clocked");
        assert_eq!(w1.clock().unwrap(), 1);
        let out = rx.recv_timeout(Duration::from_secs(10)).expect("the pull is released by the slow worker's clock");
        assert!(out.iter().all(|&v| v == 3.0), "{name}: the pull sees both workers' pushes");
        let kv0 = puller.join().unwrap();
        // both servers answered with staleness 0
        assert_eq!(kv0.staleness_histogram(), &[2], "{name}");
        // the servers report how long they held it (at least the 300 ms above)
        assert!(kv0.held() >= Duration::from_millis(250), "{name}: held {:?}", kv0.held());
        drop(w1);
        drop(c.servers);
    }
}

#[test]
fn backup_workers_finish_rounds_with_one_worker_stalled_and_its_late_pushes_are_dropped() {
    for (name, t) in transports() {
        // three workers, one backup: rounds complete with any two of them
        let mut c = cluster_of(t.as_ref(), 2, 4096, 3);
        let mut def = table(5, 1, Storage::Sparse, "add");
        def.consistency = Consistency::Bsp;
        def.aggregate = Aggregate::Avg;
        def.backup_workers = 1;
        c.kv.create_table(def.clone()).unwrap();
        let connect = |rank: u32| {
            let mut w = KvClient::connect(t.as_ref(), &c.routing, 20 + rank, c.cfg).unwrap();
            w.set_worker_rank(rank);
            w.use_table(def.clone());
            w
        };
        let (w1, mut w2) = (connect(1), connect(2));
        let keys = spread_keys(100);
        let rounds = 10;
        // worker r pushes r+1 every round; worker 2 is stalled and sends nothing
        let run = |mut kv: KvClient, v: f32| {
            let keys = keys.clone();
            std::thread::spawn(move || {
                let mut out = vec![0f32; keys.len()];
                for _ in 0..rounds {
                    kv.push(5, &keys, &vec![v; keys.len()]).unwrap();
                    kv.clock().unwrap();
                    // the round's pull waits for the round to be applied
                    kv.pull_into(5, &keys, &mut out).unwrap();
                }
                (kv, out)
            })
        };
        let (a, b) = (run(c.kv, 1.0), run(w1, 2.0));
        let (kv0, out0) = a.join().unwrap();
        let (_kv1, out1) = b.join().unwrap();
        // each round adds the average of the two pushes
        assert!(out0.iter().chain(&out1).all(|&v| v == 1.5 * rounds as f32), "{name}: {:?}", &out0[..3]);
        for s in &c.servers {
            assert_eq!(s.state.rounds(5), Some((rounds as u64, 0)), "{name}");
        }
        assert_eq!(kv0.staleness_histogram().iter().skip(1).sum::<u64>(), 0, "{name}: bsp pulls saw staleness 0");
        // the stalled worker wakes up with its round-0 push: too late, dropped on both servers
        let ts = w2.push(5, &keys, &vec![100.0; keys.len()]).unwrap();
        w2.wait(ts).unwrap();
        assert_eq!(w2.dropped_pushes(), 2, "{name}");
        // its next pull moves its clock up to the servers' rounds, so it can contribute again
        let mut out = vec![0f32; keys.len()];
        w2.pull_into(5, &keys, &mut out).unwrap();
        assert!(out.iter().all(|&v| v == 1.5 * rounds as f32), "{name}: the dropped push was not applied");
        assert_eq!(w2.current_clock(), rounds as u64, "{name}");
        assert_eq!(w2.fast_forwards(), 1, "{name}");
        for s in &c.servers {
            assert_eq!(s.state.rounds(5), Some((rounds as u64, 1)), "{name}");
        }
        drop(c.servers);
    }
}

#[test]
fn a_request_issued_after_a_task_is_held_until_that_task_finishes() {
    for (name, t) in transports() {
        let mut c = cluster(t.as_ref(), 2, 4096);
        let mut bsp = table(6, 1, Storage::Sparse, "add");
        bsp.consistency = Consistency::Bsp;
        c.kv.create_table(bsp.clone()).unwrap();
        c.kv.create_table(table(7, 1, Storage::Sparse, "add")).unwrap();
        let mut w1 = KvClient::connect(t.as_ref(), &c.routing, 2, c.cfg).unwrap();
        w1.set_worker_rank(1);
        w1.use_table(bsp);
        let keys = spread_keys(50);
        // worker 0 completes round 0; its pull of round 1's state waits for worker 1
        c.kv.clock().unwrap();
        let p = c.kv.pull_after(6, &keys, &After::clock(1)).unwrap();
        // a push that must run after that pull: held by the client, not sent
        let q = c.kv.push_after(7, &keys, &vec![4.0; keys.len()], &After::tasks(&[p])).unwrap();
        assert!(q > p);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(c.servers.iter().map(|s| s.state.table_len(7).unwrap()).sum::<usize>(), 0, "{name}: the push ran before its task");
        // an unknown task is refused at issue
        assert!(matches!(
            c.kv.push_after(7, &keys, &vec![1.0; keys.len()], &After::tasks(&[downpour_worker::Timestamp(10_000)])),
            Err(ClientError::UnknownTimestamp(_))
        ));
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            w1.clock().unwrap();
            w1
        });
        // waiting on the held push reads the pull's reply, then sends the push
        c.kv.wait(q).unwrap();
        assert_eq!(c.servers.iter().map(|s| s.state.table_len(7).unwrap()).sum::<usize>(), keys.len(), "{name}");
        assert_eq!(c.kv.wait_values(p).unwrap().len(), keys.len(), "{name}");
        let mut out = vec![0f32; keys.len()];
        c.kv.peek_into(7, &keys, &mut out).unwrap();
        assert!(out.iter().all(|&v| v == 4.0), "{name}");
        drop(releaser.join().unwrap());
        drop(c.servers);
    }
}

#[test]
fn filtered_tables_round_trip_and_a_key_cache_miss_is_cured_by_resending() {
    for (name, t) in transports() {
        let mut c = cluster(t.as_ref(), 2, 4096);
        let keys = spread_keys(3000);
        let vals: Vec<f32> = (0..keys.len()).map(|i| (i % 17) as f32 * 0.25).collect();
        // lossless filters: exact values; repeated key lists travel as signatures
        let mut def = table(8, 1, Storage::Sparse, "add");
        def.filters = "keycache:8,zstd".parse().unwrap();
        c.kv.create_table(def).unwrap();
        for _ in 0..3 {
            let ts = c.kv.push(8, &keys, &vals).unwrap();
            c.kv.wait(ts).unwrap();
        }
        let mut out = vec![0f32; keys.len()];
        c.kv.pull_into(8, &keys, &mut out).unwrap();
        assert_eq!(out, vals.iter().map(|v| v * 3.0).collect::<Vec<_>>(), "{name}");
        let traffic = c.kv.filter_traffic(8);
        let kc = traffic.iter().find(|(d, f)| *d == "push/pull requests" && f.name == "key-cache").unwrap().1.clone();
        assert_eq!(kc.messages, 8, "{name}: 4 requests × 2 servers");
        assert_eq!(kc.bytes_in - kc.bytes_out, 3 * keys.len() as u64 * 8, "{name}: three of four key lists went as signatures: {kc:?}");
        // the servers count the same on their side
        let server_kc: Vec<_> = c
            .servers
            .iter()
            .flat_map(|s| s.state.filter_traffic(8))
            .filter(|(d, f)| *d == "requests received" && f.name == "key-cache")
            .collect();
        assert_eq!(server_kc.iter().map(|(_, f)| f.messages).sum::<u64>(), 8, "{name}");
        assert_eq!(server_kc.iter().map(|(_, f)| f.bytes_in - f.bytes_out).sum::<u64>(), 3 * keys.len() as u64 * 8, "{name}");
        // low precision: within its error; the server's reply goes back in 8 bits too
        let mut def = table(9, 1, Storage::Sparse, "add");
        def.filters = "q8,lz4".parse().unwrap();
        c.kv.create_table(def).unwrap();
        let ts = c.kv.push(9, &keys, &vals).unwrap();
        c.kv.wait(ts).unwrap();
        let ts = c.kv.pull(9, &keys).unwrap();
        let got = c.kv.wait_values(ts).unwrap();
        let max = 4.0f32;
        assert!(got.iter().zip(&vals).all(|(g, v)| (g - v).abs() <= 2.0 * max / 254.0 + 1e-6), "{name}");
        // a key list the server never stored: this client thinks the first request put it
        // in the cache, but the table did not exist yet, so nothing was decoded
        let mut late = table(10, 1, Storage::Sparse, "add");
        late.filters = "keycache:2".parse().unwrap();
        c.kv.use_table(late.clone());
        let ts = c.kv.push(10, &keys, &vals).unwrap();
        assert!(matches!(c.kv.wait(ts), Err(ClientError::Server { status: downpour_core::msg::Status::UnknownTable, .. })), "{name}");
        let mut other = KvClient::connect(t.as_ref(), &c.routing, 5, c.cfg).unwrap();
        other.create_table(late).unwrap();
        // the same keys again: sent as a signature, missed, resent whole, applied once
        let ts = c.kv.push(10, &keys, &vals).unwrap();
        c.kv.wait(ts).unwrap();
        let mut out = vec![0f32; keys.len()];
        other.pull_into(10, &keys, &mut out).unwrap();
        assert_eq!(out, vals, "{name}");
        // a filtered frame to a table without filters is refused, the server keeps serving
        let mut wrong = table(1, 1, Storage::Sparse, "add");
        other.create_table(wrong.clone()).unwrap();
        wrong.filters = "lz4".parse().unwrap();
        c.kv.use_table(wrong);
        let ts = c.kv.push(1, &keys, &vals).unwrap();
        assert!(c.kv.wait(ts).is_err(), "{name}");
        c.kv.pull_into(8, &keys, &mut out).unwrap();
        drop(c.servers);
    }
}

/// A user filter for the test: values travel negated (and come back as they were).
struct Negate;

impl downpour_core::filter::Filter for Negate {
    fn name(&self) -> &'static str {
        "negate"
    }
    fn encode(&mut self, m: &mut downpour_core::filter::Message) -> downpour_core::Result<()> {
        m.values.iter_mut().for_each(|v| *v = -*v);
        Ok(())
    }
    fn decode(&mut self, m: &mut downpour_core::filter::Message) -> downpour_core::Result<()> {
        m.to_typed()?;
        m.values.iter_mut().for_each(|v| *v = -*v);
        Ok(())
    }
}

#[test]
fn a_user_filter_registered_on_both_ends_runs_and_an_unknown_one_is_refused() {
    use downpour_core::filter::FilterRegistry;
    let mut reg = FilterRegistry::new();
    reg.register("negate", std::sync::Arc::new(|| Box::new(Negate) as Box<dyn downpour_core::filter::Filter>)).unwrap();
    assert!(reg.register("bad name", std::sync::Arc::new(|| Box::new(Negate) as Box<dyn downpour_core::filter::Filter>)).is_err());
    let t: Arc<dyn Transport> = Arc::new(InProcTransport::new());
    let cfg = ServerConfig { chunk_bytes: 4096, filters: reg.clone(), ..Default::default() };
    let s = Server::bind(t.as_ref(), "inproc://0", cfg).unwrap();
    s.state().set_placement(10, 0, 1, 1, 1);
    let routing = proto::Routing {
        epoch: 1,
        servers: vec![proto::ServerEntry { node_id: 10, addr: s.addr(), ..Default::default() }],
        ..Default::default()
    };
    let server = s.spawn().unwrap();
    let kcfg = KvConfig { chunk_bytes: 4096, request_timeout: Duration::from_secs(20), reply_window: 2, max_outstanding: 16 };
    let mut kv = KvClient::connect(t.as_ref(), &routing, 1, kcfg).unwrap();
    kv.set_filter_registry(reg);
    let mut def = table(11, 1, Storage::Sparse, "add");
    def.filters = "user:negate,lz4".parse().unwrap();
    kv.create_table(def.clone()).unwrap();
    let keys = spread_keys(100);
    let vals: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let ts = kv.push(11, &keys, &vals).unwrap();
    kv.wait(ts).unwrap();
    let mut out = vec![0f32; 100];
    kv.pull_into(11, &keys, &mut out).unwrap();
    assert_eq!(out, vals, "negated on the way in and out, decoded on both ends");
    assert!(kv.filter_traffic(11).iter().any(|(_, f)| f.name == "negate" && f.messages > 0));
    // a server that does not know the filter refuses the table
    let mut other = def.clone();
    other.id = 12;
    other.filters = "user:missing".parse().unwrap();
    let e = kv.create_table(other).unwrap_err().to_string();
    assert!(e.contains("user:missing") && e.contains("not registered"), "{e}");
    drop(server);
}

/// A worker's minibatch pipeline: the pull of minibatch k + 1, then the push of minibatch
/// k (keys it pulled a minibatch earlier). Each server updates such a push at the rows its
/// pull noted, and the model is the one plain pulls and pushes give a single table, bit for
/// bit, over every transport.
#[test]
fn pushes_of_pulled_keys_are_updated_at_the_rows_their_pull_noted_and_give_the_same_model() {
    use downpour_core::rule::RuleRegistry;
    use downpour_core::table::Table;
    let batches: Vec<Vec<u64>> = (0..12u64)
        .map(|b| {
            let mut k: Vec<u64> = (0..700u64).map(|i| downpour_core::keys::scramble(b * 7 + i * 13 % 2000) % (u64::MAX - 1)).collect();
            k.sort_unstable();
            k.dedup();
            k
        })
        .collect();
    let grad = |b: usize, n: usize| -> Vec<f32> { (0..n).map(|i| ((i * 5 + b) % 9) as f32 * 0.25 - 1.0).collect() };
    let all: Vec<u64> = batches.concat().into_iter().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let mut reference = Table::new(table(31, 1, Storage::Sparse, "ftrl"), KeyRange::FULL, &RuleRegistry::new()).unwrap();
    // every row made first (a shard that grows between a pull and its push moves its rows:
    // those keys are walked to, which is correct but not what this test counts)
    reference.pull(&all, &mut vec![0f32; all.len()]).unwrap();
    let mut expect = Vec::new();
    for b in 0..batches.len() {
        let mut out = vec![0f32; batches[b].len()];
        reference.pull(&batches[b], &mut out).unwrap();
        expect.push(out);
        if b > 0 {
            reference.push(&batches[b - 1], &grad(b - 1, batches[b - 1].len())).unwrap();
        }
    }
    let pushed: usize = batches[..batches.len() - 1].iter().map(|k| k.len()).sum();
    // (4 KiB chunks: a push's part for a server is cut into frames of 341 keys, its pull's
    // into frames of 512, so each push frame meets a run of a pull's keys)
    for ((name, t), chunk) in transports().into_iter().flat_map(|w| [(w.clone(), 1 << 20), (w, 4096)]) {
        let mut c = cluster(t.as_ref(), 2, chunk);
        c.kv.create_table(table(31, 1, Storage::Sparse, "ftrl")).unwrap();
        let ts = c.kv.pull(31, &all).unwrap();
        c.kv.wait_values(ts).unwrap();
        for b in 0..batches.len() {
            let ts = c.kv.pull(31, &batches[b]).unwrap();
            let got = c.kv.wait_values(ts).unwrap();
            assert!(got.iter().zip(&expect[b]).all(|(x, y)| x.to_bits() == y.to_bits()), "{name}: minibatch {b}'s pull");
            if b > 0 {
                let ts = c.kv.push(31, &batches[b - 1], &grad(b - 1, batches[b - 1].len())).unwrap();
                c.kv.wait(ts).unwrap();
            }
        }
        let at_noted: f64 = c
            .servers
            .iter()
            .flat_map(|s| downpour_server::render_metrics(&s.state).lines().map(str::to_owned).collect::<Vec<_>>())
            .filter(|l| l.starts_with("downpour_table_push_keys_at_noted_rows_total{table=\"31\""))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum();
        assert_eq!(at_noted as usize, pushed, "{name}, chunks of {chunk} bytes: every pushed key updated at its noted row");
        let ts = c.kv.pull(31, &all).unwrap();
        let got = c.kv.wait_values(ts).unwrap();
        let mut want = vec![0f32; all.len()];
        reference.peek(&all, &mut want).unwrap();
        assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "{name}, chunks of {chunk} bytes: the model");
    }
}
