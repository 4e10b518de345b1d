//! Who gets in, and what a node survives: auth tokens on both network transports, TLS
//! (mutual) on gRPC, and the server's limits. Real sockets on 127.0.0.1; every load loop is
//! bounded.

use downpour_core::proto;
use downpour_core::table::TableDef;
use downpour_server::{Limits, Server, ServerConfig, ServerHandle};
use downpour_transport::{network_transport, AuthToken, NetConfig, TlsConfig, Transport, TransportKind};
use downpour_worker::{KvClient, KvConfig};
use std::sync::Arc;
use std::time::Duration;

const GOOD: &str = "the-right-cluster-secret";
const BAD: &str = "some-other-cluster-secret";

fn net(token: Option<&str>, tls: Option<TlsConfig>) -> NetConfig {
    NetConfig { auth: token.map(|t| AuthToken::new(t).unwrap()), tls, ..Default::default() }
}

fn server(t: &dyn Transport, cfg: ServerConfig) -> ServerHandle {
    let s = Server::bind(t, "127.0.0.1:0", cfg).unwrap();
    s.state().set_placement(10, 0, 1, 1, 1);
    s.spawn().unwrap()
}

fn routing(h: &ServerHandle) -> proto::Routing {
    proto::Routing {
        epoch: 1,
        servers: vec![proto::ServerEntry { node_id: 10, addr: h.addr.clone(), ..Default::default() }],
        ..Default::default()
    }
}

fn kv_cfg() -> KvConfig {
    KvConfig { request_timeout: Duration::from_secs(10), ..Default::default() }
}

fn connect(t: &dyn Transport, h: &ServerHandle) -> Result<KvClient, String> {
    let mut kv = KvClient::connect(t, &routing(h), 1, kv_cfg()).map_err(|e| e.to_string())?;
    kv.set_worker_rank(0);
    Ok(kv)
}

fn table(id: u32, vl: usize) -> TableDef {
    TableDef { value_len: vl, ..TableDef::new(id, format!("t{id}")) }
}

fn peek(kv: &mut KvClient, keys: &[u64]) -> Vec<f32> {
    let mut out = vec![0f32; keys.len()];
    kv.peek_into(1, keys, &mut out).unwrap();
    out
}

#[test]
fn a_client_without_the_token_or_with_the_wrong_one_is_refused_and_nothing_reaches_the_tables() {
    for kind in [TransportKind::Tcp, TransportKind::Grpc, TransportKind::Shm] {
        let st = network_transport(kind, net(Some(GOOD), None)).unwrap();
        let h = server(st.as_ref(), ServerConfig::default());
        let good = network_transport(kind, net(Some(GOOD), None)).unwrap();
        let mut kv = connect(good.as_ref(), &h).unwrap();
        kv.create_table(table(1, 1)).unwrap();
        let ts = kv.push(1, &[1, 2], &[1.0, 2.0]).unwrap();
        kv.wait(ts).unwrap();

        // framed TCP learns of the refusal at its first request, gRPC when it opens the stream
        let none = network_transport(kind, net(None, None)).unwrap();
        let e = match connect(none.as_ref(), &h) {
            Err(e) => e,
            Ok(mut kv) => kv.create_table(table(1, 1)).expect_err("no token must be refused").to_string(),
        };
        assert!(e.contains("authentication required"), "{kind:?}: {e}");
        let wrong = network_transport(kind, net(Some(BAD), None)).unwrap();
        let e = connect(wrong.as_ref(), &h).err().expect("a wrong token must be refused");
        assert!(e.contains("wrong auth token"), "{kind:?}: {e}");

        if kind == TransportKind::Tcp {
            // a raw push frame with no Hello first: refused before it is applied
            use std::io::{Read, Write};
            let mut hdr = downpour_core::msg::request(downpour_core::msg::Op::Push, 1, 1, 0, 1);
            hdr.keys_len = 8;
            hdr.values_len = 4;
            let mut b = Vec::new();
            downpour_core::codec::encode_header(&hdr, &mut b);
            b.extend_from_slice(&1u64.to_le_bytes());
            b.extend_from_slice(&100f32.to_le_bytes());
            let mut s = std::net::TcpStream::connect(&h.addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(&b).unwrap();
            let mut sink = Vec::new();
            // the server answers with a refusal and closes
            let _ = s.read_to_end(&mut sink);
        }
        assert_eq!(peek(&mut kv, &[1, 2]), vec![1.0, 2.0], "{kind:?}: only the authenticated push is in the table");
    }
}

/// A CA and one node certificate signed by it: (cert, key, ca) PEM.
#[test]
fn a_tls_server_refuses_plaintext_and_certificates_of_another_ca_on_either_transport() {
    for kind in [TransportKind::Tcp, TransportKind::Grpc] {
        let cluster = downpour_transport::security::throwaway_tls();
        let st = network_transport(kind, net(Some(GOOD), Some(cluster.clone()))).unwrap();
        let h = server(st.as_ref(), ServerConfig::default());

        // a node of the cluster: works
        let ok = network_transport(kind, net(Some(GOOD), Some(cluster.clone()))).unwrap();
        let mut kv = connect(ok.as_ref(), &h).unwrap();
        kv.create_table(table(1, 1)).unwrap();
        let ts = kv.push(1, &[7], &[3.0]).unwrap();
        kv.wait(ts).unwrap();

        // plaintext with the right token: no TLS handshake, no connection
        let plain = network_transport(kind, net(Some(GOOD), None)).unwrap();
        assert!(connect(plain.as_ref(), &h).is_err(), "{kind:?}: a plaintext client must not get in");
        // a certificate from another CA, right token: refused in the handshake
        let mut stranger = downpour_transport::security::throwaway_tls();
        stranger.ca_pem = cluster.ca_pem.clone();
        let other = network_transport(kind, net(Some(GOOD), Some(stranger))).unwrap();
        assert!(connect(other.as_ref(), &h).is_err(), "{kind:?}: a certificate of another CA must be refused");
        // a client that trusts another CA: the server's certificate is refused by the client
        let mut wrong_ca = cluster.clone();
        wrong_ca.ca_pem = downpour_transport::security::throwaway_tls().ca_pem;
        let doubter = network_transport(kind, net(Some(GOOD), Some(wrong_ca))).unwrap();
        let e = connect(doubter.as_ref(), &h).err().expect("a server certificate of an unknown CA must be refused");
        if kind == TransportKind::Tcp {
            assert!(e.contains("TLS handshake"), "{e}");
        }
        // raw bytes at the TLS port
        {
            use std::io::Write;
            let mut s = std::net::TcpStream::connect(&h.addr).unwrap();
            let _ = s.write_all(&[0xff; 256]);
        }
        assert_eq!(peek(&mut kv, &[7]), vec![3.0], "{kind:?}: the server kept serving, and only the cluster's push landed");
    }
}

#[test]
fn an_oversized_request_is_refused_and_the_server_keeps_serving() {
    for kind in [TransportKind::Tcp, TransportKind::Grpc, TransportKind::Shm] {
        let st = network_transport(kind, net(None, None)).unwrap();
        let limits = Limits { max_keys_per_request: 100, max_value_len: 4, max_tables: 2, ..Default::default() };
        let h = server(st.as_ref(), ServerConfig { limits, ..Default::default() });
        let t = network_transport(kind, net(None, None)).unwrap();
        let mut kv = connect(t.as_ref(), &h).unwrap();
        kv.create_table(table(1, 1)).unwrap();
        // 1,000 keys in one frame (the default chunk is 2 MiB)
        let keys: Vec<u64> = (0..1000).collect();
        let e = kv.push(1, &keys, &vec![1.0; 1000]).and_then(|ts| kv.wait(ts)).unwrap_err();
        assert!(e.to_string().contains("over the limit of 100"), "{kind:?}: {e}");
        let e = kv.create_table(table(2, 5)).unwrap_err();
        assert!(e.to_string().contains("value length 5 exceeds the limit of 4"), "{kind:?}: {e}");
        kv.create_table(table(3, 1)).unwrap();
        let e = kv.create_table(table(4, 1)).unwrap_err();
        assert!(e.to_string().contains("limit of 2 tables"), "{kind:?}: {e}");
        // a request whose every chunk is over the limit gets one refusal, and the
        // connection stays in step
        let mut chunked = KvClient::connect(t.as_ref(), &routing(&h), 1, KvConfig { chunk_bytes: 4096, ..kv_cfg() }).unwrap();
        chunked.create_table(table(1, 1)).unwrap();
        let e = chunked.push(1, &keys, &vec![1.0; 1000]).and_then(|ts| chunked.wait(ts)).unwrap_err();
        assert!(e.to_string().contains("over the limit of 100"), "{kind:?}: {e}");
        let ts = chunked.push(1, &[3], &[3.0]).unwrap();
        chunked.wait(ts).unwrap();
        // still serving, and the refused push left nothing
        let ts = kv.push(1, &[1, 2], &[1.0, 2.0]).unwrap();
        kv.wait(ts).unwrap();
        assert_eq!(peek(&mut kv, &[0, 1, 2, 3, 999]), vec![0.0, 1.0, 2.0, 3.0, 0.0], "{kind:?}");
    }
    // a frame over the transport's size limit closes that connection only
    let small = NetConfig { limits: downpour_core::codec::FrameLimits { max_payload_bytes: 64 << 10 }, ..Default::default() };
    let st = network_transport(TransportKind::Tcp, small).unwrap();
    let h = server(st.as_ref(), ServerConfig::default());
    let t = network_transport(TransportKind::Tcp, NetConfig::default()).unwrap();
    let mut big = connect(t.as_ref(), &h).unwrap();
    big.create_table(table(1, 1)).unwrap();
    let keys: Vec<u64> = (0..20_000).collect();
    assert!(big.push(1, &keys, &vec![1.0; 20_000]).and_then(|ts| big.wait(ts)).is_err(), "a 240 KB frame over a 64 KB limit");
    let mut kv = connect(t.as_ref(), &h).unwrap();
    kv.create_table(table(1, 1)).unwrap();
    let ts = kv.push(1, &[5], &[5.0]).unwrap();
    kv.wait(ts).unwrap();
    assert_eq!(peek(&mut kv, &[5, 6]), vec![5.0, 0.0]);
}

#[test]
fn the_memory_quota_refuses_a_push_that_would_exceed_it_and_loses_nothing() {
    let st: Arc<dyn Transport> = network_transport(TransportKind::Tcp, net(None, None)).unwrap();
    let limits = Limits { memory_quota_bytes: 1 << 20, ..Default::default() };
    let h = server(st.as_ref(), ServerConfig { limits, ..Default::default() });
    let mut kv = connect(st.as_ref(), &h).unwrap();
    kv.create_table(table(1, 1)).unwrap();
    // rows of 16 bytes (key and value), counted at twice that: the quota holds about 32k
    // keys; push batches of 4,096 new keys until one is refused (bounded)
    let mut stored = Vec::new();
    let mut refused = None;
    for batch in 0..64u64 {
        let keys: Vec<u64> = (batch * 4096..(batch + 1) * 4096).collect();
        match kv.push(1, &keys, &vec![1.0; keys.len()]).and_then(|ts| kv.wait(ts)) {
            Ok(()) => stored.extend(keys),
            Err(e) => {
                refused = Some((keys, e.to_string()));
                break;
            }
        }
    }
    let (keys, msg) = refused.expect("the quota must refuse a push before 64 batches");
    assert!(msg.contains("memory quota"), "{msg}");
    assert!(stored.len() >= 8192, "the quota refused too early: {} keys stored", stored.len());
    // keys already stored may still be updated; the refused batch left nothing
    let ts = kv.push(1, &stored[..10], &[1.0; 10]).unwrap();
    kv.wait(ts).unwrap();
    assert_eq!(peek(&mut kv, &stored[..2]), vec![2.0, 2.0]);
    assert_eq!(peek(&mut kv, &keys[..2]), vec![0.0, 0.0]);
}

#[test]
fn a_flood_of_connections_leaves_the_server_serving_its_clients() {
    for kind in [TransportKind::Tcp, TransportKind::Grpc, TransportKind::Shm] {
        let cfg = NetConfig { max_connections: 16, ..Default::default() };
        let st = network_transport(kind, cfg).unwrap();
        let h = server(st.as_ref(), ServerConfig::default());
        let t = network_transport(kind, NetConfig::default()).unwrap();
        let mut kv = connect(t.as_ref(), &h).unwrap();
        kv.create_table(table(1, 1)).unwrap();
        // 200 connections that say nothing (bounded); past the cap they are closed at once
        let flood: Vec<std::net::TcpStream> = (0..200).filter_map(|_| std::net::TcpStream::connect(&h.addr).ok()).collect();
        let ts = kv.push(1, &[1], &[1.0]).unwrap();
        kv.wait(ts).unwrap();
        assert_eq!(peek(&mut kv, &[1]), vec![1.0], "{kind:?}: an established client is served during the flood");
        // the cap holds: a new client during the flood is turned away, not given a thread
        let turned_away = match connect(t.as_ref(), &h) {
            Err(_) => true,
            Ok(mut c) => c.create_table(table(1, 1)).is_err(),
        };
        assert!(turned_away, "{kind:?}: the 18th connection must be closed at once");
        drop(flood);
        // once the flood is gone its slots free up (within seconds) and new clients get in
        let t0 = std::time::Instant::now();
        let mut late = loop {
            if let Ok(mut c) = connect(t.as_ref(), &h) {
                if c.create_table(table(1, 1)).is_ok() {
                    break c;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{kind:?}: the server never took new clients again");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(peek(&mut late, &[1]), vec![1.0], "{kind:?}");
    }
}

#[test]
fn only_connections_identified_as_registered_workers_are_served_data_calls() {
    let st = network_transport(TransportKind::Tcp, net(Some(GOOD), None)).unwrap();
    let h = server(st.as_ref(), ServerConfig { secret: Some(GOOD.into()), ..Default::default() });
    let t = network_transport(TransportKind::Tcp, net(Some(GOOD), None)).unwrap();
    // a cluster member (right token) that did not register as a worker: no data calls
    let mut anon = connect(t.as_ref(), &h).unwrap();
    let e = anon.create_table(table(1, 1)).unwrap_err().to_string();
    assert!(e.contains("only registered workers"), "{e}");
    // a credential made for another node id does not pass
    let other = downpour_core::msg::worker_credential(GOOD, 2);
    let e = KvClient::connect_as(t.as_ref(), &routing(&h), 1, kv_cfg(), Some(&other)).err().expect("must be refused");
    assert!(e.to_string().contains("no valid worker credential"), "{e}");
    // the coordinator's credential for node 1: served
    let mine = downpour_core::msg::worker_credential(GOOD, 1);
    let mut kv = KvClient::connect_as(t.as_ref(), &routing(&h), 1, kv_cfg(), Some(&mine)).unwrap();
    kv.set_worker_rank(0);
    kv.create_table(table(1, 1)).unwrap();
    let ts = kv.push(1, &[4], &[4.0]).unwrap();
    kv.wait(ts).unwrap();
    assert_eq!(peek(&mut kv, &[4]), vec![4.0]);
    let e = anon.push(1, &[4], &[100.0]).and_then(|ts| anon.wait(ts));
    assert!(e.is_err(), "an unidentified push is refused");
    assert_eq!(peek(&mut kv, &[4]), vec![4.0], "and changed nothing");
}
