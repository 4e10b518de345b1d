//! Lost workers through the coordinator's control calls (in-process transport, no data
//! servers): in a replicated job a lost worker that recorded its progress leaves its rank to
//! the next worker registering, which gets the record; barriers count ranks, not arrivals,
//! so a replacement neither passes a barrier alone nor waits at one the lost worker passed.
//! Whatever cannot be replaced fails the job with the reason.

use downpour_coordinator::client::ControlClient;
use downpour_coordinator::{Coordinator, CoordinatorConfig, JobOutcome};
use downpour_core::proto;
use downpour_transport::inproc::InProcTransport;
use downpour_transport::Transport;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

struct Job {
    serving: Option<std::thread::JoinHandle<JobOutcome>>,
    t: Arc<InProcTransport>,
    addr: String,
    /// The rank holders the coordinator last told server 0 (`HeartbeatReply.worker_nodes`).
    told_server: Arc<std::sync::Mutex<Vec<u32>>>,
    coord: Arc<Coordinator>,
}

impl Job {
    /// A job of two servers (registered) and two workers, `replication` copies.
    fn start(replication: usize, worker_rejoin: Duration) -> Job {
        Self::start_with(replication, worker_rejoin, Duration::ZERO)
    }

    /// As [`Job::start`], handing a vacant rank to a live worker after `reassign_after`.
    fn start_with(replication: usize, worker_rejoin: Duration, reassign_after: Duration) -> Job {
        let t = Arc::new(InProcTransport::new());
        let listener = t.listen("inproc://coordinator").unwrap();
        let addr = listener.local_addr();
        let coord = Coordinator::new(CoordinatorConfig {
            servers: 2,
            workers: 2,
            replication,
            worker_rejoin,
            reassign_after,
            heartbeat: Duration::from_millis(50),
            node_timeout: Duration::from_secs(1),
            ..Default::default()
        });
        let serving = {
            let coord = coord.clone();
            Some(std::thread::spawn(move || coord.serve(listener)))
        };
        let job = Job { serving, t, addr, told_server: Default::default(), coord };
        for i in 0..2 {
            let mut c = job.client();
            c.register("server", &format!("inproc://s{i}")).unwrap();
            let told = job.told_server.clone();
            // the servers heartbeat until the job ends (the node timeout is short here)
            std::thread::spawn(move || {
                while let Ok(r) = c.heartbeat(None) {
                    if i == 0 {
                        *told.lock().unwrap() = r.worker_nodes.clone();
                    }
                    if r.shutdown || r.job_failed {
                        break;
                    }
                }
            });
        }
        job
    }

    fn client(&self) -> ControlClient {
        ControlClient::connect(self.t.as_ref(), &self.addr, Duration::from_secs(5)).unwrap()
    }

    /// Registers a worker; returns its job connection, its heartbeat (drop it to lose the
    /// worker) and the reply.
    fn worker(&self, records_progress: bool) -> (ControlClient, Heart, proto::RegisterReply) {
        let mut c = self.client();
        let r = c.register_as(&proto::RegisterRequest { role: "worker".into(), records_progress, ..Default::default() }).unwrap();
        let mut hb = self.client();
        hb.set_node_id(r.node_id);
        hb.heartbeat(None).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match hb.heartbeat(None) {
                    Ok(r) if !r.shutdown && !r.job_failed => std::thread::sleep(Duration::from_millis(20)),
                    _ => break,
                }
            }
        });
        (c, Heart { stop, thread: Some(thread) }, r)
    }

    fn outcome(mut self) -> JobOutcome {
        self.serving.take().unwrap().join().unwrap()
    }
}

/// A worker's heartbeat thread; dropping it closes the heartbeat connection (the worker is
/// lost).
struct Heart {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Heart {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn record(rank: u32, clock: u64, next_request: u64) -> proto::WorkerCheckpoint {
    proto::WorkerCheckpoint { rank, clock, state: clock.to_string(), next_request, kv_clock: clock }
}

/// Waits until `f` holds (the coordinator notices a closed connection asynchronously).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_lost_worker_with_progress_is_replaced_by_the_next_worker_which_gets_its_record() {
    let job = Job::start(2, Duration::from_secs(30));
    let (mut w0, hb0, r0) = job.worker(true);
    let (mut w1, _hb1, r1) = job.worker(true);
    assert_eq!((r0.rank, r1.rank), (0, 1));
    assert!(r0.restart.is_none() && r1.restart.is_none(), "first registrations replace nobody");
    let told = job.told_server.clone();
    let holders = move || told.lock().unwrap().clone();
    eventually("the servers told who holds each rank", || holders() == vec![r0.node_id, r1.node_id]);
    // both pass "start"; worker 0 records progress, reaches "end" and is lost there
    let t = std::thread::spawn(move || {
        w1.barrier("start", 1).unwrap();
        w1
    });
    w0.barrier("start", 1).unwrap();
    let mut w1 = t.join().unwrap();
    w0.progress(&record(0, 7, 15)).unwrap();
    w0.progress(&record(0, 9, 19)).unwrap();
    let stuck = std::thread::spawn(move || {
        let _ = w0.barrier("end", 1);
    });
    eventually("rank 0 is held at the barrier", || job.coord.held_calls() == 1);
    drop(hb0);
    // the replacement waits for the vacancy, takes rank 0 and the newest record
    let mut w = job.client();
    let r = w.register_as(&proto::RegisterRequest { role: "worker".into(), records_progress: true, ..Default::default() }).unwrap();
    assert_eq!(r.rank, 0);
    assert_ne!(r.node_id, r0.node_id);
    assert_eq!(r.restart, Some(record(0, 9, 19)));
    // the servers hear of the new holder (and fence the lost worker's pushes)
    eventually("the servers told the replacement holds rank 0", || holders() == vec![r.node_id, r1.node_id]);
    // "start" was passed by rank 0 already: at once
    w.barrier("start", 1).unwrap();
    // rank 0 arrived at "end" before it was lost; arriving again must not pass without rank 1
    let again = std::thread::spawn(move || {
        w.barrier("end", 1).unwrap();
        w
    });
    // (the lost worker's own call is still parked there too)
    eventually("rank 0's second arrival is held at the barrier", || job.coord.held_calls() == 2);
    assert!(!again.is_finished(), "rank 0's second arrival passed the barrier without rank 1");
    w1.barrier("end", 1).unwrap();
    let mut w = again.join().unwrap();
    w.done(true, "").unwrap();
    w1.done(true, "").unwrap();
    drop(stuck);
    assert_eq!(job.outcome(), JobOutcome::Succeeded);
}

#[test]
fn a_lost_worker_still_calling_is_told_its_rank_is_taken() {
    let job = Job::start(2, Duration::from_secs(30));
    let (mut w0, hb0, _) = job.worker(true);
    let (mut w1, _hb1, _) = job.worker(true);
    w0.progress(&record(0, 3, 7)).unwrap();
    drop(hb0);
    eventually("the loss to be noticed", || w0.progress(&record(0, 3, 7)).is_err());
    let e = w0.progress(&record(0, 4, 9)).unwrap_err().to_string();
    assert!(e.contains("declared lost"), "{e}");
    let e = w0.barrier("x", 1).unwrap_err().to_string();
    assert!(e.contains("declared lost"), "{e}");
    let (mut w, _hbw, r) = job.worker(true);
    assert_eq!(r.restart, Some(record(0, 3, 7)), "the lost worker's late record was not taken");
    w.done(true, "").unwrap();
    w1.done(true, "").unwrap();
    assert_eq!(job.outcome(), JobOutcome::Succeeded);
}

#[test]
fn a_worker_lost_before_its_first_record_is_replaced_afresh() {
    let job = Job::start(2, Duration::from_secs(30));
    let (_w0, hb0, _) = job.worker(true);
    let (mut w1, _hb1, _) = job.worker(true);
    drop(hb0);
    let (mut w, _hbw, r) = job.worker(true);
    assert_eq!(r.rank, 0);
    let restart = r.restart.expect("a replacement is told it replaces");
    assert_eq!(restart.next_request, 0, "no record: the replacement starts its share afresh");
    w.done(true, "").unwrap();
    w1.done(true, "").unwrap();
    assert_eq!(job.outcome(), JobOutcome::Succeeded);
}

#[test]
fn a_lost_worker_whose_job_records_no_progress_fails_the_job() {
    let job = Job::start(2, Duration::from_secs(30));
    let (_w0, hb0, _) = job.worker(false);
    let (_w1, _hb1, _) = job.worker(false);
    drop(hb0);
    match job.outcome() {
        JobOutcome::Failed(r) => assert!(r.contains("worker 0") && r.contains("records no progress"), "{r}"),
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_lost_worker_of_an_unreplicated_job_fails_the_job() {
    let job = Job::start(1, Duration::from_secs(30));
    let (mut w0, hb0, _) = job.worker(true);
    let (_w1, _hb1, _) = job.worker(true);
    w0.progress(&record(0, 3, 7)).unwrap();
    drop(hb0);
    match job.outcome() {
        JobOutcome::Failed(r) => assert!(r.contains("--replication 2"), "{r}"),
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_vacant_rank_nobody_takes_fails_the_job_after_the_rejoin_time() {
    let job = Job::start(2, Duration::from_millis(300));
    let (mut w0, hb0, _) = job.worker(true);
    let (_w1, _hb1, _) = job.worker(true);
    w0.progress(&record(0, 3, 7)).unwrap();
    drop(hb0);
    match job.outcome() {
        JobOutcome::Failed(r) => assert!(r.contains("no worker replaced it within 300ms"), "{r}"),
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_worker_beyond_the_job_s_count_is_refused_when_no_rank_is_vacant() {
    let job = Job::start(2, Duration::from_secs(30));
    let (mut w0, _hb0, _) = job.worker(true);
    let (mut w1, _hb1, _) = job.worker(true);
    let e = job.client().register("worker", "").unwrap_err().to_string();
    assert!(e.contains("already has its 2 workers"), "{e}");
    w0.done(true, "").unwrap();
    w1.done(true, "").unwrap();
    assert_eq!(job.outcome(), JobOutcome::Succeeded);
}

#[test]
fn a_vacant_rank_with_no_replacement_is_handed_to_a_live_worker_s_process() {
    let job = Job::start_with(2, Duration::from_secs(30), Duration::from_millis(200));
    let (mut w0, hb0, _) = job.worker(true);
    // worker 1 heartbeats by hand, to read the answers
    let mut w1 = job.client();
    let r1 = w1.register_as(&proto::RegisterRequest { role: "worker".into(), records_progress: true, ..Default::default() }).unwrap();
    let mut hb1 = job.client();
    hb1.set_node_id(r1.node_id);
    w0.progress(&record(0, 3, 7)).unwrap();
    drop(hb0); // worker 0 is lost
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = hb1.heartbeat(None).unwrap();
        if r.adopt != 0 {
            assert_eq!(r.adopt, 1, "worker 1's process is asked to take rank 0 over");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "worker 1 was never asked to take rank 0 over");
        std::thread::sleep(Duration::from_millis(20));
    }
    // its process registers once more and gets the rank and the record
    let r =
        job.client().register_as(&proto::RegisterRequest { role: "worker".into(), records_progress: true, ..Default::default() }).unwrap();
    assert_eq!((r.rank, r.restart), (0, Some(record(0, 3, 7))));
    assert_eq!(hb1.heartbeat(None).unwrap().adopt, 0, "nothing more to take over");
}
