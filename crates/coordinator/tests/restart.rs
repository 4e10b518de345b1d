//! A coordinator keeping its state on disk (`state_dir`): a second coordinator opened on the
//! same directory — a restart — takes the job back as it was (node ids and ranks, routing
//! epoch, barrier passes, workers' progress records), and finishes it when the nodes call
//! again; a directory holding another job's state is refused, an ended job's is not reused.

use downpour_coordinator::client::ControlClient;
use downpour_coordinator::{Coordinator, CoordinatorConfig, JobOutcome};
use downpour_core::proto;
use downpour_transport::inproc::InProcTransport;
use downpour_transport::Transport;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn config(dir: &Path) -> CoordinatorConfig {
    CoordinatorConfig {
        servers: 2,
        workers: 2,
        replication: 2,
        heartbeat: Duration::from_millis(50),
        state_dir: Some(dir.to_path_buf()),
        ..Default::default()
    }
}

/// Serves `coord` on a fresh in-process address.
fn serve(t: &Arc<InProcTransport>, coord: Arc<Coordinator>, name: &str) -> (String, std::thread::JoinHandle<JobOutcome>) {
    let listener = t.listen(&format!("inproc://{name}")).unwrap();
    let addr = listener.local_addr();
    (addr, std::thread::spawn(move || coord.serve(listener)))
}

fn client(t: &Arc<InProcTransport>, addr: &str, node: u32) -> ControlClient {
    let mut c = ControlClient::connect(t.as_ref(), addr, Duration::from_secs(5)).unwrap();
    c.set_node_id(node);
    c
}

#[test]
fn a_coordinator_opened_on_the_state_directory_takes_the_job_back() {
    let dir = tempfile::tempdir().unwrap();
    let t = Arc::new(InProcTransport::new());
    let (addr, first) = serve(&t, Coordinator::open(config(dir.path())).unwrap(), "first");
    let mut servers = Vec::new();
    for i in 0..2 {
        let mut c = client(&t, &addr, 0);
        let r = c.register("server", &format!("inproc://s{i}")).unwrap();
        assert!(r.coordinator_restartable, "nodes are told the coordinator keeps its state");
        servers.push((c, r.node_id));
    }
    let mut w0 = client(&t, &addr, 0);
    let r0 = w0.register_as(&proto::RegisterRequest { role: "worker".into(), records_progress: true, ..Default::default() }).unwrap();
    let mut w1 = client(&t, &addr, 0);
    let r1 = w1.register_as(&proto::RegisterRequest { role: "worker".into(), records_progress: true, ..Default::default() }).unwrap();
    let pass = std::thread::spawn(move || {
        w1.barrier("start", 1).unwrap();
        w1
    });
    w0.barrier("start", 1).unwrap();
    pass.join().unwrap();
    let record = proto::WorkerCheckpoint { rank: 0, clock: 12, state: "12".into(), next_request: 30, kv_clock: 12 };
    w0.progress(&record).unwrap();
    let epoch_before = client(&t, &addr, r0.node_id).routing(0, Duration::ZERO).unwrap();

    // "restart": a second coordinator on the same directory (the first one's state is on
    // disk; it is left serving nobody)
    let (addr2, second) = serve(&t, Coordinator::open(config(dir.path())).unwrap(), "second");
    let routing = client(&t, &addr2, r0.node_id).routing(0, Duration::ZERO).unwrap();
    assert_eq!(routing, epoch_before, "the routing epoch and its members are taken back");
    // a barrier passed before the restart passes at once; a new one needs both ranks
    let mut w0 = client(&t, &addr2, r0.node_id);
    let mut w1 = client(&t, &addr2, r1.node_id);
    w0.barrier("start", 1).unwrap();
    let both = std::thread::spawn(move || {
        w1.barrier("end", 1).unwrap();
        w1
    });
    w0.barrier("end", 1).unwrap();
    let mut w1 = both.join().unwrap();
    // worker 0's record survived: its replacement gets it
    let mut hb0 = client(&t, &addr2, r0.node_id);
    hb0.heartbeat(None).unwrap();
    drop(hb0);
    let mut w = client(&t, &addr2, 0);
    let r = w.register_as(&proto::RegisterRequest { role: "worker".into(), records_progress: true, ..Default::default() }).unwrap();
    assert_eq!((r.rank, r.restart), (0, Some(record)));
    assert!(r.node_id > r1.node_id, "node ids go on from where they were");
    w.done(true, "").unwrap();
    w1.done(true, "").unwrap();
    assert_eq!(second.join().unwrap(), JobOutcome::Succeeded);
    drop(servers);
    drop(first);
    // the job ended: a third coordinator on the directory starts a new job
    let third = Coordinator::open(config(dir.path())).unwrap();
    let (addr3, _third) = serve(&t, third, "third");
    let r = client(&t, &addr3, 0).register("server", "inproc://s9").unwrap();
    assert_eq!((r.node_id, r.rank), (1, 0), "a new job numbers its nodes afresh");
}

#[test]
fn a_state_directory_of_another_job_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = Arc::new(InProcTransport::new());
    let (addr, _first) = serve(&t, Coordinator::open(config(dir.path())).unwrap(), "a");
    client(&t, &addr, 0).register("server", "inproc://s0").unwrap();
    let other = CoordinatorConfig { workers: 5, ..config(dir.path()) };
    let e = Coordinator::open(other).err().expect("a different job's state is refused").to_string();
    assert!(e.contains("2 workers") && e.contains("5"), "{e}");
    std::fs::write(dir.path().join("state.pb"), b"\xff\xff\xff not a state").unwrap();
    let e = Coordinator::open(config(dir.path())).err().expect("a corrupt state is refused").to_string();
    assert!(e.contains("not a coordinator state"), "{e}");
}

/// A worker that died while the coordinator was down never reconnects: the restarted
/// coordinator has no connection of it to watch. With its replacement waiting for the rank,
/// it is declared lost once it stayed silent for the restart grace (2 s), not at the node
/// timeout (10 s), while a worker that reconnected keeps its rank.
#[test]
fn a_worker_silent_since_a_restart_gives_its_rank_to_a_waiting_replacement_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let t = Arc::new(InProcTransport::new());
    let (addr, _first) = serve(&t, Coordinator::open(config(dir.path())).unwrap(), "first-grace");
    let mut servers = Vec::new();
    for i in 0..2 {
        let mut c = client(&t, &addr, 0);
        c.register("server", &format!("inproc://g{i}")).unwrap();
        servers.push(c);
    }
    let worker = || proto::RegisterRequest { role: "worker".into(), records_progress: true, ..Default::default() };
    let r0 = client(&t, &addr, 0).register_as(&worker()).unwrap();
    let r1 = client(&t, &addr, 0).register_as(&worker()).unwrap();
    let started = std::time::Instant::now();
    let (addr2, _second) = serve(&t, Coordinator::open(config(dir.path())).unwrap(), "second-grace");
    // rank 0 reconnects (its heartbeat connection stays open); rank 1 died meanwhile
    let mut hb0 = client(&t, &addr2, r0.node_id);
    hb0.heartbeat(None).unwrap();
    let mut replacement = client(&t, &addr2, 0);
    let r = loop {
        match replacement.register_as(&worker()) {
            Ok(r) => break r,
            Err(e) => {
                assert!(started.elapsed() < Duration::from_secs(8), "still refused after the grace: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    let waited = started.elapsed();
    assert_eq!(r.rank, r1.rank, "the silent worker's rank, not the reconnected one's");
    assert!(waited >= Duration::from_secs(2), "declared lost before the grace: {waited:?}");
    hb0.heartbeat(None).unwrap();
    drop(servers);
}
