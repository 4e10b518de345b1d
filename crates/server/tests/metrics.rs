//! The metrics endpoint: a scrape parsed by a Prometheus text parser shows what the server
//! did (rows, requests and keys by op, admissions, evictions), `/healthz` answers, other paths
//! are refused, and a port in use is a clear error.

use downpour_core::table::TableDef;
use downpour_server::{serve_metrics, Server, ServerConfig};
use downpour_transport::{network_transport, NetConfig, TransportKind};
use downpour_worker::{KvClient, KvConfig};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// GET `path` from `addr`: (status line, body).
fn get(addr: &str, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

fn scrape(addr: &str) -> prometheus_parse::Scrape {
    let (status, body) = get(addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap()
}

/// The value of `metric` whose labels include every pair of `want`.
fn value(s: &prometheus_parse::Scrape, metric: &str, want: &[(&str, &str)]) -> Option<f64> {
    s.samples.iter().find(|x| x.metric == metric && want.iter().all(|(k, v)| x.labels.get(k) == Some(*v))).map(|x| match x.value {
        prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
        _ => f64::NAN,
    })
}

#[test]
fn a_scrape_shows_rows_requests_admissions_and_evictions_and_health_answers() {
    let t = network_transport(TransportKind::Tcp, NetConfig::default()).unwrap();
    let server = Server::bind(t.as_ref(), "127.0.0.1:0", ServerConfig::default()).unwrap();
    server.state().set_placement(10, 0, 1, 1, 1);
    let metrics = serve_metrics("127.0.0.1:0", server.state().clone()).unwrap();
    let h = server.spawn().unwrap();
    let routing = downpour_core::proto::Routing {
        epoch: 1,
        servers: vec![downpour_core::proto::ServerEntry { node_id: 10, addr: h.addr.clone(), ..Default::default() }],
        ..Default::default()
    };
    let mut kv = KvClient::connect(t.as_ref(), &routing, 1, KvConfig::default()).unwrap();
    kv.set_worker_rank(0);
    kv.create_table(TableDef { admit: "count:2".parse().unwrap(), evict: "lru:100".parse().unwrap(), ..TableDef::new(7, "ctr") }).unwrap();
    let keys: Vec<u64> = (0..1000u64).map(|i| i * 1_000_003).collect();
    for _ in 0..2 {
        let ts = kv.push(7, &keys, &vec![1.0; keys.len()]).unwrap();
        kv.wait(ts).unwrap();
    }
    let mut out = vec![0f32; keys.len()];
    kv.peek_into(7, &keys, &mut out).unwrap();
    let t7 = [("table", "7"), ("name", "ctr")];
    // the evictor trims the 1000 admitted rows to 100 in the background
    let deadline = Instant::now() + Duration::from_secs(20);
    let s = loop {
        let s = scrape(&metrics);
        if value(&s, "downpour_table_rows", &t7) == Some(100.0) || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(value(&s, "downpour_table_rows", &t7), Some(100.0));
    assert_eq!(value(&s, "downpour_table_requests_total", &[("table", "7"), ("op", "push")]), Some(2.0));
    assert_eq!(value(&s, "downpour_table_keys_total", &[("table", "7"), ("op", "push")]), Some(2000.0));
    assert_eq!(value(&s, "downpour_table_keys_total", &[("table", "7"), ("op", "peek")]), Some(1000.0));
    assert_eq!(value(&s, "downpour_table_keys_total", &[("table", "7"), ("op", "pull")]), Some(0.0));
    assert_eq!(value(&s, "downpour_table_admitted_keys_total", &t7), Some(1000.0));
    assert_eq!(value(&s, "downpour_table_admission_refused_pushes_total", &t7), Some(1000.0));
    assert_eq!(value(&s, "downpour_table_evicted_rows_total", &t7), Some(900.0));
    assert!(value(&s, "downpour_table_eviction_passes_total", &t7).unwrap() >= 1.0);
    assert_eq!(value(&s, "downpour_routing_epoch", &[]), Some(1.0));
    assert_eq!(value(&s, "downpour_server", &[("node", "10"), ("rank", "0")]), Some(1.0));
    assert!(value(&s, "downpour_tables_peak_bytes", &[]).unwrap() >= value(&s, "downpour_tables_bytes", &[]).unwrap());
    assert!(s.docs.contains_key("downpour_table_evicted_rows"), "every family is documented: {:?}", s.docs.keys());
    // the two pushes' frames were timed (the +Inf bucket counts every one)
    let push_latency = s.samples.iter().find(|x| x.metric == "downpour_request_seconds" && x.labels.get("op") == Some("push"));
    match push_latency.map(|x| &x.value) {
        Some(prometheus_parse::Value::Histogram(b)) => {
            assert!(b.last().is_some_and(|c| c.less_than.is_infinite() && c.count >= 2.0), "{b:?}")
        }
        other => panic!("no push latency histogram: {other:?}"),
    }
    assert_eq!(get(&metrics, "/healthz"), ("HTTP/1.1 200 OK".to_string(), "ok\n".to_string()));
    assert!(get(&metrics, "/nothing").0.contains("404"));
    // a port in use: the error names the address
    let e = serve_metrics(&metrics, h.state.clone()).unwrap_err().to_string();
    assert!(e.contains(&metrics) && e.contains("metrics"), "{e}");
    h.shutdown();
}
