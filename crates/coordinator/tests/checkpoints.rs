//! The checkpoint round through the coordinator's control calls (in-process transport):
//! workers joining a round are held until every worker joined, retired or finished; exactly
//! one of them is told to write, with every worker's state; the others go on only once it
//! reported the checkpoint written; a failed write fails the job.

use downpour_coordinator::client::ControlClient;
use downpour_coordinator::{Coordinator, CoordinatorConfig, JobOutcome};
use downpour_core::proto;
use downpour_transport::inproc::InProcTransport;
use downpour_transport::Transport;
use std::sync::Arc;
use std::time::Duration;

fn job(workers: usize) -> (Arc<Coordinator>, std::thread::JoinHandle<JobOutcome>, Vec<ControlClient>) {
    let t = Arc::new(InProcTransport::new());
    let listener = t.listen("inproc://coordinator").unwrap();
    let addr = listener.local_addr();
    let c = Coordinator::new(CoordinatorConfig { servers: 1, workers, heartbeat: Duration::from_millis(50), ..Default::default() });
    let serving = {
        let c = c.clone();
        std::thread::spawn(move || c.serve(listener))
    };
    // (never heartbeats: only a heartbeat connection's close counts as a lost node)
    ControlClient::connect(t.as_ref(), &addr, Duration::from_secs(5)).unwrap().register("server", "inproc://s").unwrap();
    let ws = (0..workers)
        .map(|_| {
            let mut w = ControlClient::connect(t.as_ref(), &addr, Duration::from_secs(5)).unwrap();
            w.register("worker", "").unwrap();
            w
        })
        .collect();
    (c, serving, ws)
}

fn join(seq: u64, rank: u32, clock: u64, state: &str) -> proto::CheckpointJoin {
    proto::CheckpointJoin {
        seq,
        worker: Some(proto::WorkerCheckpoint { rank, clock, state: state.into(), ..Default::default() }),
        retiring: false,
    }
}

/// Waits until `n` calls are held at the coordinator (an event, not a sleep): fails the test
/// if they never are.
fn until_held(c: &Coordinator, n: usize) {
    let t0 = std::time::Instant::now();
    while c.held_calls() < n {
        assert!(t0.elapsed() < Duration::from_secs(10), "{n} call(s) were never held at the coordinator (held: {})", c.held_calls());
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn the_last_worker_to_join_writes_with_every_state_and_the_held_ones_go_on_after_it() {
    let (c, serving, mut ws) = job(3);
    let mut w2 = ws.pop().unwrap();
    let mut w1 = ws.pop().unwrap();
    let mut w0 = ws.pop().unwrap();
    // worker 2's share is done: it retires with its final state
    w2.checkpoint_join(&proto::CheckpointJoin {
        seq: 0,
        worker: Some(proto::WorkerCheckpoint { rank: 2, clock: 40, state: "done".into(), ..Default::default() }),
        retiring: true,
    })
    .unwrap();
    let held = std::thread::spawn(move || {
        let r = w0.checkpoint_join(&join(1, 0, 50, "a")).unwrap();
        (w0, r)
    });
    until_held(&c, 1);
    assert!(!held.is_finished(), "worker 0 is held until worker 1 joins");
    let r1 = w1.checkpoint_join(&join(1, 1, 50, "b")).unwrap();
    assert!(r1.write, "the last to join writes");
    let states: Vec<(u32, u64, &str)> = r1.workers.iter().map(|w| (w.rank, w.clock, w.state.as_str())).collect();
    assert_eq!(states, vec![(0, 50, "a"), (1, 50, "b"), (2, 40, "done")]);
    until_held(&c, 1);
    assert!(!held.is_finished(), "worker 0 stays held while the checkpoint is written");
    w1.checkpoint_written(1, "/ck/ckpt-000001", "").unwrap();
    let (mut w0, r0) = held.join().unwrap();
    assert!(!r0.write);
    // a round already written is not taken again
    assert!(!w0.checkpoint_join(&join(1, 0, 50, "a")).unwrap().write);
    // a failed write fails the job with its reason
    let held = std::thread::spawn(move || w0.checkpoint_join(&join(2, 0, 100, "a")));
    until_held(&c, 1);
    assert!(w1.checkpoint_join(&join(2, 1, 100, "b")).unwrap().write);
    w1.checkpoint_written(2, "", "disk full").unwrap();
    let e = held.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("checkpoint 2 could not be written: disk full"), "{e}");
    match serving.join().unwrap() {
        JobOutcome::Failed(r) => assert!(r.contains("disk full"), "{r}"),
        o => panic!("{o:?}"),
    }
}

#[test]
fn only_the_writer_can_complete_a_checkpoint_and_rounds_cannot_mix() {
    let (c, _serving, mut ws) = job(2);
    let mut w1 = ws.pop().unwrap();
    let mut w0 = ws.pop().unwrap();
    let held = std::thread::spawn(move || {
        let r = w0.checkpoint_join(&join(3, 0, 30, "")).unwrap();
        (w0, r)
    });
    until_held(&c, 1);
    let e = w1.checkpoint_join(&join(4, 1, 40, "")).unwrap_err().to_string();
    assert!(e.contains("while checkpoint 3 is being taken"), "{e}");
    let e = w1.checkpoint_written(3, "x", "").unwrap_err().to_string();
    assert!(e.contains("is not writing checkpoint 3"), "{e}");
    assert!(w1.checkpoint_join(&join(3, 1, 30, "")).unwrap().write);
    w1.checkpoint_written(3, "x", "").unwrap();
    assert!(!held.join().unwrap().1.write);
}
