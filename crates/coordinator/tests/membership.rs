//! Ring membership through the coordinator's control calls (in-process transport, no data
//! servers): a server joining a running replicated job and a drained server each start a
//! new epoch that is served only once every member reported ready; drains that would lose
//! data, and joins of unreplicated jobs, are refused with a clear reason.

use downpour_coordinator::client::ControlClient;
use downpour_coordinator::{Coordinator, CoordinatorConfig, JobOutcome};
use downpour_core::proto;
use downpour_transport::inproc::InProcTransport;
use downpour_transport::Transport;
use std::sync::Arc;
use std::time::Duration;

struct Job {
    coord: Arc<Coordinator>,
    serving: Option<std::thread::JoinHandle<JobOutcome>>,
    t: Arc<InProcTransport>,
    addr: String,
}

impl Job {
    fn start(servers: usize, replication: usize) -> Job {
        let t = Arc::new(InProcTransport::new());
        let listener = t.listen("inproc://coordinator").unwrap();
        let addr = listener.local_addr();
        let coord = Coordinator::new(CoordinatorConfig {
            servers,
            workers: 1,
            replication,
            heartbeat: Duration::from_millis(50),
            ..Default::default()
        });
        let serving = {
            let c = coord.clone();
            Some(std::thread::spawn(move || c.serve(listener)))
        };
        Job { coord, serving, t, addr }
    }

    fn client(&self) -> ControlClient {
        ControlClient::connect(self.t.as_ref(), &self.addr, Duration::from_secs(5)).unwrap()
    }

    fn server(&self, addr: &str) -> (ControlClient, proto::RegisterReply) {
        let mut c = self.client();
        let r = c.register("server", addr).unwrap();
        (c, r)
    }

    fn routing(&self) -> proto::Routing {
        self.client().routing(0, Duration::ZERO).unwrap()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let mut w = self.client();
        if w.register("worker", "").is_ok() {
            let _ = w.done(true, "");
        }
        if let Some(h) = self.serving.take() {
            let _ = h.join();
        }
    }
}

fn members(r: &proto::Routing) -> Vec<u32> {
    let mut m: Vec<u32> = r.servers.iter().map(|s| s.node_id).collect();
    m.sort_unstable();
    m
}

#[test]
fn a_server_joining_a_running_replicated_job_is_served_once_every_member_is_ready() {
    let job = Job::start(2, 2);
    let (mut s0, r0) = job.server("inproc://s0");
    let (mut s1, r1) = job.server("inproc://s1");
    let before = job.routing();
    assert_eq!((before.epoch, before.active), (1, true));

    let (mut s2, r2) = job.server("inproc://s2");
    assert_eq!(r2.rank, 2, "the joining server is numbered after the job's own");
    let joining = r2.routing.expect("a joining server gets the routing");
    assert_eq!(joining.epoch, 2);
    assert!(!joining.active, "the new epoch waits for its copies");
    assert_eq!(members(&joining), vec![r0.node_id, r1.node_id, r2.node_id]);
    assert_eq!(joining.served, vec![r0.node_id, r1.node_id], "the data is still where epoch 1 put it");

    // served only after all three reported
    s0.epoch_ready(2, 10, "").unwrap();
    s2.epoch_ready(2, 0, "").unwrap();
    assert!(!job.routing().active);
    s1.epoch_ready(2, 5, "").unwrap();
    let after = job.routing();
    assert!(after.active);
    assert_eq!(members(&after), vec![r0.node_id, r1.node_id, r2.node_id]);
    let rec = job.coord.recoveries();
    assert_eq!(rec.len(), 1);
    assert!(!rec[0].failure && rec[0].cause.contains("joined") && rec[0].keys_copied == 15, "{rec:?}");
}

#[test]
fn a_drained_server_leaves_the_ring_and_hears_it_while_refused_drains_change_nothing() {
    let job = Job::start(3, 2);
    let (mut s0, r0) = job.server("inproc://s0");
    let (mut s1, r1) = job.server("inproc://s1");
    let (mut s2, r2) = job.server("inproc://s2");
    let mut admin = job.client();

    for (rank, why) in [(7, "no server 7"), (9, "no server 9")] {
        let e = admin.drain(rank).unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
    }
    let e = admin.drain_addr("inproc://nowhere").unwrap_err().to_string();
    assert!(e.contains("no server on the ring registered at inproc://nowhere"), "{e}");
    // (as a pod's preStop hook drains itself: by the address it registered)
    let d = admin.drain_addr("inproc://s1").unwrap();
    assert_eq!((d.epoch, d.node_id), (2, r1.node_id));
    let routing = job.routing();
    assert_eq!(members(&routing), vec![r0.node_id, r2.node_id]);
    assert!(!routing.active);
    assert!(s1.heartbeat(None).unwrap().drained, "the drained server is told so");
    assert!(!s0.heartbeat(None).unwrap().drained);

    let again = admin.drain(1).unwrap_err().to_string();
    assert!(again.contains("not on the ring"), "{again}");
    let again = admin.drain_addr("inproc://s1").unwrap_err().to_string();
    assert!(again.contains("no server on the ring registered at inproc://s1"), "{again}");
    let too_few = admin.drain(0).unwrap_err().to_string();
    assert!(too_few.contains("would leave 1 servers for 2 copies"), "{too_few}");
    assert_eq!(job.routing().epoch, 2, "refused drains start no epoch");

    s0.epoch_ready(2, 3, "").unwrap();
    s2.epoch_ready(2, 4, "").unwrap();
    assert!(job.routing().active);
    // the drained server's disconnection is not a failure: once the coordinator dealt with
    // it, the job still runs at the served epoch
    drop(s1);
    wait_until(|| !job.coord.heartbeat_open(r1.node_id), "the drained server's disconnection is handled");
    assert!(job.routing().active);
    assert_eq!(job.routing().epoch, 2);
    let hb = s0.heartbeat(None).unwrap();
    assert!(!hb.job_failed, "{}", hb.reason);
    assert_eq!(job.coord.recoveries().len(), 1);
}

#[test]
fn an_unreplicated_job_refuses_a_joining_server_and_a_drain() {
    let job = Job::start(1, 1);
    let (_s0, _) = job.server("inproc://s0");
    let mut extra = job.client();
    let e = extra.register("server", "inproc://s1").unwrap_err().to_string();
    assert!(e.contains("only with --replication 2"), "{e}");
    let e = job.client().drain(0).unwrap_err().to_string();
    assert!(e.contains("needs a replicated job"), "{e}");
}

#[test]
fn a_server_dying_while_its_heartbeat_is_long_polled_is_removed_before_the_answer_is_due() {
    use downpour_core::msg::{self, Op};
    use prost::Message;
    let t = Arc::new(InProcTransport::new());
    let listener = t.listen("inproc://coordinator-watch").unwrap();
    let addr = listener.local_addr();
    // a long heartbeat interval and node timeout: only the closed connection can tell
    let heartbeat = Duration::from_secs(10);
    let coord = Coordinator::new(CoordinatorConfig {
        servers: 3,
        workers: 1,
        replication: 2,
        heartbeat,
        node_timeout: Duration::from_secs(120),
        ..Default::default()
    });
    let serving = {
        let c = coord.clone();
        std::thread::spawn(move || c.serve(listener))
    };
    let connect = || ControlClient::connect(t.as_ref(), &addr, Duration::from_secs(5)).unwrap();
    let mut servers: Vec<(ControlClient, u32)> = (0..3)
        .map(|i| {
            let mut c = connect();
            let r = c.register("server", &format!("inproc://watched{i}")).unwrap();
            (c, r.node_id)
        })
        .collect();
    let dying = servers[2].1;
    // the dying server's heartbeat, on a connection of its own, then the process "dies"
    let mut conn = t.connect(&addr, Duration::from_secs(5)).unwrap();
    let mut h = msg::request(Op::Heartbeat, dying, 1, 0, 0);
    h.meta = proto::HeartbeatRequest::default().encode_to_vec().into();
    conn.send(&mut h, &[], &[]).unwrap();
    wait_until(|| coord.heartbeat_open(dying), "the dying server's heartbeat is heard (and long-polled)");
    let died = std::time::Instant::now();
    drop(conn);
    let mut c = connect();
    let r = loop {
        let r = c.routing(0, Duration::ZERO).unwrap();
        if r.epoch >= 2 {
            break r;
        }
        assert!(died.elapsed() < heartbeat / 2, "not noticed within {:?}: only when the answer is due", died.elapsed());
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(!members(&r).contains(&dying), "removed in the new epoch: {r:?}");
    // the survivors move; the job ends
    for (s, _) in servers.iter_mut().take(2) {
        let _ = s.epoch_ready(r.epoch, 0, "");
    }
    let mut w = connect();
    if w.register("worker", "").is_ok() {
        let _ = w.done(true, "");
    }
    drop(servers);
    let _ = serving.join();
}

/// Waits until `cond` holds (an event, not a sleep): fails the test after 10 s, naming `what`.
fn wait_until(cond: impl Fn() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}
