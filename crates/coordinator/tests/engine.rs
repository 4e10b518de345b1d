//! The coordinator's engine driven directly, with the time given (no threads, no sleeps):
//! every timeout is tested at its edge, and the rules the runtime and the simulation share
//! are pinned here. The last test checks that the engine's sources do no I/O.

use downpour_coordinator::engine::{BarrierStep, Engine, EpochReadyOutcome, Gate, JoinStep, Lost, Tick, Written};
use downpour_coordinator::{CoordError, CoordinatorConfig};
use downpour_core::proto;
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

fn cfg(servers: usize, workers: usize, replication: usize) -> CoordinatorConfig {
    CoordinatorConfig {
        servers,
        workers,
        replication,
        heartbeat: 100 * MS,
        node_timeout: 1000 * MS,
        worker_rejoin: 5000 * MS,
        reassign_after: 2000 * MS,
        ..Default::default()
    }
}

fn server(e: &mut Engine, port: u32, now: Duration) -> u32 {
    let req = proto::RegisterRequest { role: "server".into(), addr: format!("127.0.0.1:{port}"), ..Default::default() };
    e.register(&req, now).unwrap().id
}

fn worker(e: &mut Engine, now: Duration) -> (u32, u32, Option<proto::WorkerCheckpoint>) {
    let req = proto::RegisterRequest { role: "worker".into(), records_progress: true, ..Default::default() };
    let r = e.register(&req, now).unwrap();
    (r.id, r.rank, r.restart)
}

/// A started job: its servers and workers registered at time 0, every node heartbeating.
fn job(servers: usize, workers: usize, replication: usize) -> (Engine, Vec<u32>, Vec<u32>) {
    let mut e = Engine::new(cfg(servers, workers, replication));
    let s: Vec<u32> = (0..servers).map(|i| server(&mut e, 7000 + i as u32, Duration::ZERO)).collect();
    let w: Vec<u32> = (0..workers).map(|_| worker(&mut e, Duration::ZERO).0).collect();
    for id in s.iter().chain(&w) {
        assert!(e.heartbeat_seen(*id, Duration::ZERO).is_none());
    }
    (e, s, w)
}

#[test]
fn a_silent_node_is_declared_dead_after_the_node_timeout_and_not_before() {
    let (mut e, s, _) = job(2, 1, 1);
    assert!(e.tick(1000 * MS).is_empty(), "at the timeout exactly, nobody is silent for longer");
    for id in e.worker_holders().to_vec().into_iter().chain([s[1]]) {
        e.heartbeat_reply(id, 900 * MS);
    }
    let ticks = e.tick(1001 * MS);
    assert_eq!(ticks.len(), 1, "{ticks:?}");
    let Tick::Silent { node, reason } = &ticks[0] else { panic!("{ticks:?}") };
    assert_eq!(*node, s[0]);
    assert!(reason.contains("server 0") && reason.contains("declared dead"), "{reason}");
    // an unreplicated job fails with the reason
    assert_eq!(e.lose(s[0], reason.clone(), 1001 * MS), Lost::Failed(reason.clone()));
    assert_eq!(e.failed(), Some(reason.as_str()));
    assert!(e.tick(5000 * MS).is_empty(), "an ended job is not looked at");
}

#[test]
fn a_drained_server_that_went_quiet_does_not_hide_a_silent_one() {
    // found by the simulation: a drained server stays in the monitor's view after it
    // exits; each look found it silent and lost() ignored it, so a server cut off later
    // (whose connection did not close) was never declared dead
    let (mut e, s, w) = job(4, 1, 2);
    e.drain(0, 10 * MS).unwrap();
    for t in [500, 1200] {
        for id in [s[1], s[2], w[0]] {
            e.heartbeat_reply(id, t * MS);
        }
    }
    // server 0 (drained, exited) and server 3 (cut off) are both silent since 0
    let ticks = e.tick(1200 * MS);
    assert_eq!(ticks.len(), 1, "{ticks:?}");
    assert!(matches!(&ticks[0], Tick::Silent { node, .. } if *node == s[3]), "{ticks:?}");
    assert!(matches!(e.lose(s[3], "cut off".into(), 1200 * MS), Lost::Removed { .. }));
}

#[test]
fn registration_that_takes_longer_than_the_timeout_fails_the_job() {
    let mut e = Engine::new(CoordinatorConfig { register_timeout: 500 * MS, ..cfg(2, 1, 1) });
    server(&mut e, 7000, Duration::ZERO);
    assert!(e.tick(500 * MS).is_empty());
    let ticks = e.tick(501 * MS);
    assert!(matches!(&ticks[..], [Tick::Failed(r)] if r.contains("only 1 of 2 servers and 0 of 1 workers")), "{ticks:?}");
}

#[test]
fn a_lost_server_s_epoch_is_served_once_every_member_reported_and_times_the_recovery() {
    let (mut e, s, _) = job(3, 1, 2);
    assert_eq!(e.epochs().epoch(), 1);
    let Lost::Removed { epoch } = e.lose(s[1], "server 1 disconnected".into(), 100 * MS) else { panic!() };
    assert_eq!(epoch, 2);
    let routing = e.routing();
    assert!(!routing.active && routing.servers.iter().all(|x| x.node_id != s[1]), "{routing:?}");
    assert_eq!(routing.served, vec![s[0], s[1], s[2]], "the data is still where epoch 1 put it");
    let ready = |epoch| proto::EpochReady { epoch, keys_copied: 10, error: String::new() };
    assert_eq!(e.epoch_ready(s[0], &ready(1), 150 * MS), EpochReadyOutcome::Ignored, "a superseded epoch");
    assert_eq!(e.epoch_ready(s[0], &ready(2), 150 * MS), EpochReadyOutcome::Waiting);
    let EpochReadyOutcome::Served(r) = e.epoch_ready(s[2], &ready(2), 175 * MS) else { panic!() };
    assert_eq!((r.epoch, r.took, r.keys_copied, r.failure), (2, 75 * MS, 20, true));
    assert!(e.routing_ready(2) && e.routing().active);
    // the lost server calling again is ignored; a drain that would leave fewer servers than
    // copies is refused
    assert_eq!(e.lose(s[1], "again".into(), 200 * MS), Lost::Ignored);
    assert!(matches!(e.drain(0, 200 * MS), Err(CoordError::DrainTooFew { .. })));
}

#[test]
fn a_lost_worker_s_rank_goes_to_the_next_registration_with_its_progress_record() {
    let (mut e, _, w) = job(2, 2, 2);
    let record = proto::WorkerCheckpoint { rank: 1, clock: 7, next_request: 42, ..Default::default() };
    e.progress(w[1], record.clone()).unwrap();
    assert!(matches!(e.progress(w[0], record.clone()), Err(CoordError::ProgressRank { rank: 0, sent: 1 })));
    // a replacement before the loss is noticed waits (the runtime retries it)
    assert!(e.awaits_vacancy("worker"));
    assert_eq!(e.lose(w[1], "worker 1 disconnected".into(), 10 * MS), Lost::Vacant { rank: 1 });
    assert!(e.has_vacancy());
    assert!(matches!(e.gate(20 * MS), Gate::Proceed));
    let (id, rank, restart) = worker(&mut e, 20 * MS);
    assert_eq!((rank, restart), (1, Some(record)));
    assert_eq!(e.worker_holders(), &[w[0], id]);
    // the lost worker is told to stop, and refused as a worker
    assert!(e.heartbeat_seen(w[1], 30 * MS).is_some_and(|r| r.job_failed));
    assert!(matches!(e.current_worker(w[1]), Err(CoordError::LostNode { .. })));
    // a third worker finds no vacant rank
    let req = proto::RegisterRequest { role: "worker".into(), ..Default::default() };
    assert!(matches!(e.register(&req, 40 * MS), Err(CoordError::WorkersFull { workers: 2 })));
}

#[test]
fn a_vacant_rank_is_handed_to_a_live_worker_after_reassign_after_and_fails_the_job_after_the_rejoin_time() {
    let (mut e, s, w) = job(2, 2, 2);
    assert_eq!(e.lose(w[0], "worker 0 lost".into(), 1000 * MS), Lost::Vacant { rank: 0 });
    let live = |e: &mut Engine, t: Duration| {
        for id in [s[0], s[1], w[1]] {
            e.heartbeat_reply(id, t);
        }
    };
    live(&mut e, 3000 * MS);
    assert!(e.tick(3000 * MS).is_empty(), "2 s after the loss exactly: not yet");
    live(&mut e, 3001 * MS);
    assert_eq!(e.tick(3001 * MS), vec![Tick::Adopted { rank: 0, node: w[1] }]);
    assert_eq!(e.heartbeat_reply(w[1], 3001 * MS).adopt, 1, "told as rank + 1");
    live(&mut e, 6000 * MS);
    assert!(e.tick(6000 * MS).is_empty());
    live(&mut e, 6001 * MS);
    let ticks = e.tick(6001 * MS);
    assert!(matches!(&ticks[..], [Tick::Failed(r)] if r.contains("no worker replaced it")), "{ticks:?}");
}

#[test]
fn a_barrier_pass_is_made_by_the_last_rank_and_a_replacement_passes_again_at_once() {
    let (mut e, _, w) = job(2, 2, 2);
    assert_eq!(e.arrive(w[0], "epoch", 1).unwrap(), BarrierStep::Wait { target: 1 });
    assert_eq!(e.arrive(w[0], "epoch", 1).unwrap(), BarrierStep::Wait { target: 1 }, "an arrival counted once");
    assert!(!e.barrier_passed("epoch", 1).unwrap());
    assert_eq!(e.arrive(w[1], "epoch", 1).unwrap(), BarrierStep::Made);
    assert!(e.barrier_passed("epoch", 1).unwrap());
    assert!(matches!(e.arrive(w[1], "epoch", 3), Err(CoordError::BarrierAhead { passed: 1, .. })));
    // worker 1 is replaced: its replacement calling pass 1 again passes at once
    assert_eq!(e.lose(w[1], "lost".into(), MS), Lost::Vacant { rank: 1 });
    let (id, _, _) = worker(&mut e, 2 * MS);
    assert_eq!(e.arrive(id, "epoch", 1).unwrap(), BarrierStep::Passed);
    assert!(matches!(e.arrive(w[1], "epoch", 2), Err(CoordError::LostNode { .. })));
}

#[test]
fn a_checkpoint_is_written_by_the_first_held_worker_to_ask_once_every_rank_joined() {
    let (mut e, _, w) = job(1, 3, 1);
    let join = |rank| proto::CheckpointJoin {
        seq: 1,
        worker: Some(proto::WorkerCheckpoint { rank, clock: 4, ..Default::default() }),
        retiring: false,
    };
    assert_eq!(e.checkpoint_join(w[0], &join(0), 10 * MS).unwrap(), JoinStep::Held { seq: 1 });
    let retire = proto::CheckpointJoin { retiring: true, ..join(2) };
    assert_eq!(e.checkpoint_join(w[2], &retire, 11 * MS).unwrap(), JoinStep::Answered { changed: true });
    assert_eq!(e.checkpoint_poll(w[0], 1).unwrap(), None, "worker 1 has not joined");
    assert_eq!(e.checkpoint_join(w[1], &join(1), 20 * MS).unwrap(), JoinStep::Held { seq: 1 });
    let mut wrong = join(1);
    wrong.seq = 2;
    assert!(matches!(e.checkpoint_join(w[1], &wrong, 20 * MS), Err(CoordError::CheckpointMismatch { seq: 2, taking: 1 })));
    let reply = e.checkpoint_poll(w[1], 1).unwrap().unwrap();
    assert!(reply.write);
    assert_eq!(reply.workers.iter().map(|x| x.rank).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(e.checkpoint_poll(w[0], 1).unwrap(), None, "one writer");
    let written = |seq| proto::CheckpointWritten { seq, path: "ck/1".into(), error: String::new() };
    assert!(matches!(e.checkpoint_written(w[0], &written(1), 30 * MS), Err(CoordError::NotCheckpointWriter { .. })));
    assert_eq!(e.checkpoint_written(w[1], &written(1), 30 * MS).unwrap(), Written::Done { held: 20 * MS });
    assert_eq!(e.checkpoint_poll(w[0], 1).unwrap(), Some(proto::CheckpointJoinReply::default()));
    assert_eq!(e.checkpoint_written(w[1], &written(1), 31 * MS).unwrap(), Written::Already);
}

#[test]
fn the_engine_reads_no_clock_takes_no_lock_and_touches_no_file_or_socket() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine");
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for banned in
            ["Instant", "SystemTime", "parking_lot", "Mutex", "Condvar", "std::fs", "std::thread", "std::net", "std::env", "sleep("]
        {
            assert!(!text.contains(banned), "{} uses {banned}: the engine must do no I/O", path.display());
        }
        files += 1;
    }
    assert!(files >= 7, "the engine's modules are in {}", dir.display());
}
