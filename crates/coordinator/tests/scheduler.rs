//! The BPG task scheduler through the coordinator's `Schedule` calls (in-process transport):
//! plans must agree, only registered workers are scheduled, a held call is answered when
//! another worker's report frees an iteration, and a failed job releases held calls.

use downpour_coordinator::client::ControlClient;
use downpour_coordinator::{Coordinator, CoordinatorConfig, JobOutcome};
use downpour_core::proto;
use downpour_core::schedule::{wire, BpgPlan, Task};
use downpour_transport::inproc::InProcTransport;
use downpour_transport::Transport;
use std::sync::Arc;
use std::time::Duration;

fn plan() -> BpgPlan {
    BpgPlan { workers: 2, blocks: 4, tau: 0, seed: 1, max_passes: 3, epsilon: 1e-6, lambda: 1.0, kkt: true }
}

/// A coordinator for 1 server and 2 workers, the server registered; two registered workers.
fn setup() -> (Arc<Coordinator>, std::thread::JoinHandle<JobOutcome>, ControlClient, ControlClient, Arc<InProcTransport>) {
    let t = Arc::new(InProcTransport::new());
    let listener = t.listen("inproc://coordinator").unwrap();
    let addr = listener.local_addr();
    let c = Coordinator::new(CoordinatorConfig { servers: 1, workers: 2, ..Default::default() });
    let serving = {
        let c = c.clone();
        std::thread::spawn(move || c.serve(listener))
    };
    let mut server = ControlClient::connect(t.as_ref(), &addr, Duration::from_secs(5)).unwrap();
    server.register("server", "inproc://server").unwrap();
    let mut w0 = ControlClient::connect(t.as_ref(), &addr, Duration::from_secs(5)).unwrap();
    w0.register("worker", "").unwrap();
    let mut w1 = ControlClient::connect(t.as_ref(), &addr, Duration::from_secs(5)).unwrap();
    w1.register("worker", "").unwrap();
    (c, serving, w0, w1, t)
}

fn tasks(r: &proto::ScheduleReply) -> Vec<Task> {
    r.tasks.iter().map(|t| wire::task_from_proto(t).unwrap()).collect()
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
fn plans_must_agree_and_a_held_call_is_answered_when_the_slow_worker_reports() {
    let (c, _serving, mut w0, mut w1, _t) = setup();
    let first = proto::ScheduleRequest { plan: Some(wire::plan_to_proto(&plan())), wait: true, ..Default::default() };
    let r0 = w0.schedule(&first).unwrap();
    assert!(matches!(tasks(&r0)[..], [Task::Iterate(ref it)] if it.t == 0), "tau 0: one iteration at a time");
    // another plan is refused
    let other = BpgPlan { tau: 1, ..plan() };
    let e = w1.schedule(&proto::ScheduleRequest { plan: Some(wire::plan_to_proto(&other)), ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("differs"), "{e}");
    let r1 = w1.schedule(&first).unwrap();
    assert_eq!(tasks(&r1), tasks(&r0), "both workers run iteration 0");
    // worker 0 finished iteration 0; its call for more is held until worker 1 finishes too
    let held = std::thread::spawn(move || {
        let r = w0.schedule(&proto::ScheduleRequest { finished: 1, wait: true, ..Default::default() }).unwrap();
        (r, w0)
    });
    until_held(&c, 1);
    assert!(!held.is_finished(), "iteration 1 must wait for worker 1");
    w1.schedule(&proto::ScheduleRequest { finished: 1, ..Default::default() }).unwrap();
    let (r, _w0) = held.join().unwrap();
    assert!(matches!(tasks(&r)[..], [Task::Iterate(ref it)] if it.t == 1));
}

#[test]
fn out_of_order_reports_are_refused_and_a_failed_job_releases_held_calls() {
    let (c, serving, mut w0, mut w1, _t) = setup();
    let first = proto::ScheduleRequest { plan: Some(wire::plan_to_proto(&plan())), wait: true, ..Default::default() };
    w0.schedule(&first).unwrap();
    let e = w1.schedule(&proto::ScheduleRequest { finished: 3, plan: first.plan, ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("3 iterations finished"), "{e}");
    let held = std::thread::spawn(move || w0.schedule(&proto::ScheduleRequest { finished: 1, wait: true, ..Default::default() }));
    until_held(&c, 1);
    w1.done(false, "worker 1 gave up").unwrap();
    let r = held.join().unwrap();
    assert!(r.unwrap_err().to_string().contains("job failed"), "the held call is answered with the failure");
    drop(c);
    assert!(matches!(serving.join().unwrap(), JobOutcome::Failed(_)));
}
