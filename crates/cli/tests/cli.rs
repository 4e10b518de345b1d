//! The `downpour` binary end to end: embedded and local multi-process jobs, launcher
//! failure handling, and clear errors for a dead coordinator, a busy port and bad flags.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn downpour() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_downpour"));
    c.env("DOWNPOUR_LOG", "warn");
    c
}

fn run(c: &mut Command) -> Output {
    c.output().expect("downpour runs")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn embedded_counter_is_exact_with_2_servers_and_3_workers() {
    let o = run(downpour().args(["counter", "--servers", "2", "--workers", "3", "--keys", "5000", "--rounds", "7", "--value-len", "3"]));
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert_eq!(out.matches("counter: OK keys=5000 expected=21").count(), 3, "{out}");
}

#[test]
fn local_multi_process_counter_is_exact_over_tcp_grpc_and_shm() {
    for transport in ["tcp", "grpc", "shm"] {
        let o = run(downpour().args([
            "--transport",
            transport,
            "launch",
            "--servers",
            "2",
            "--workers",
            "3",
            "--",
            "counter",
            "--keys",
            "20000",
            "--rounds",
            "10",
        ]));
        let (out, err) = text(&o);
        assert!(o.status.success(), "{transport}: {out}\n{err}");
        assert_eq!(out.matches("counter: OK keys=20000 expected=30").count(), 3, "{transport}: {out}");
        // every line is prefixed with its role and id
        assert!(out.lines().all(|l| l.starts_with("[worker ") || l.starts_with("[server ") || l.starts_with("[coordinator]")), "{out}");
    }
}

#[test]
fn launch_kills_every_child_when_one_fails() {
    let marker = format!("downpour-test-{}-{:?}", std::process::id(), Instant::now());
    let t0 = Instant::now();
    // --keys 0 makes every worker fail at once; the servers and coordinator would wait.
    let o = run(downpour().env("DOWNPOUR_TEST_MARKER", &marker).args([
        "launch",
        "--servers",
        "2",
        "--workers",
        "2",
        "--",
        "counter",
        "--keys",
        "0",
    ]));
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}\n{err}");
    assert!(err.contains("failed"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(30));
    // no process of that run is left
    std::thread::sleep(Duration::from_millis(200));
    let mut left = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(env) = std::fs::read(e.path().join("environ")) {
            if String::from_utf8_lossy(&env).contains(&marker) {
                left.push(e.file_name());
            }
        }
    }
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

#[test]
fn launch_rejects_bad_job_flags_before_starting_anything() {
    let o = run(downpour().args(["launch", "--servers", "1", "--workers", "1", "--", "counter", "--nope"]));
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("--nope"), "{err}");
}

#[test]
fn worker_with_a_dead_coordinator_fails_clearly_within_the_timeout() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let t0 = Instant::now();
    let o = run(downpour().args(["--connect-timeout-s", "2", "worker", "--coordinator", &addr, "counter"]));
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains(&addr) && err.contains("cannot connect"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn worker_whose_coordinator_never_answers_times_out() {
    // a listener that accepts but never speaks
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t0 = Instant::now();
    let o = run(downpour().args(["--connect-timeout-s", "1", "worker", "--coordinator", &addr, "counter"]));
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("no answer"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    drop(l);
}

#[test]
fn coordinator_on_a_busy_port_is_a_clear_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let o = run(downpour().args(["coordinator", "--listen", &addr, "--servers", "1", "--workers", "1"]));
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("already in use") && err.contains(&addr), "{err}");
}

#[test]
fn wrong_flag_is_a_usage_error() {
    let o = run(downpour().args(["counter", "--kees", "3"]));
    assert_eq!(o.status.code(), Some(2));
    let o = run(downpour().args(["--transport", "carrier-pigeon", "demo"]));
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("carrier-pigeon"), "{err}");
}

#[test]
fn bench_json_reports_every_case() {
    let o = run(downpour().args([
        "bench",
        "--embedded",
        "--json",
        "--sizes",
        "4KiB,64KiB",
        "--iters",
        "3",
        "--latency-iters",
        "20",
        "--sparse-keys",
        "1000",
    ]));
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let rows: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for op in ["push", "pull", "push_then_pull", "push_pull"] {
        assert!(
            rows.iter().any(|r| r["case"] == "dense" && r["op"] == op && r["bytes"] == 65536 && r["gbps"].as_f64().unwrap() > 0.0),
            "{op}: {out}"
        );
    }
    assert!(rows.iter().any(|r| r["latency"] == true && r["p50_us"].as_f64().is_some() && r["p99_us"].as_f64().is_some()), "{out}");
    assert!(rows.iter().any(|r| r["case"] == "sparse" && r["op"] == "pull" && r["keys_per_s"].as_f64().unwrap() > 0.0), "{out}");
    for r in &rows {
        for k in ["case", "servers", "workers", "bytes", "op", "gbps", "keys_per_s", "p50_us", "p99_us"] {
            assert!(r.get(k).is_some(), "missing {k} in {r}");
        }
    }
}

fn wait_timeout(c: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    None
}

#[test]
fn a_killed_server_fails_the_job_on_every_node_with_a_clear_message() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let addr_file = dir.path().join("coord.addr");
    let spawn = |args: &[&str]| {
        downpour()
            .args(["--heartbeat-ms", "100", "--node-timeout-s", "2", "--request-timeout-s", "5"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let af = addr_file.display().to_string();
    let mut coord = spawn(&["coordinator", "--listen", "127.0.0.1:0", "--servers", "1", "--workers", "1", "--addr-file", &af]);
    let addr = common::wait_for_addr(&addr_file);
    let mut server = spawn(&["server", "--coordinator", &addr, "--listen", "127.0.0.1:0"]);
    // long enough to be still running when the server dies
    let mut worker = spawn(&["worker", "--coordinator", &addr, "counter", "--keys", "1000", "--rounds", "5000000"]);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(worker.try_wait().unwrap().is_none(), "the job ended before the server was killed");
    server.kill().unwrap();
    let _ = server.wait();
    let w = wait_timeout(&mut worker, Duration::from_secs(20)).expect("worker must exit, not hang");
    let c = wait_timeout(&mut coord, Duration::from_secs(20)).expect("coordinator must exit, not hang");
    assert!(!w.success() && !c.success());
    let werr = String::from_utf8_lossy(&worker.wait_with_output().unwrap().stderr).into_owned();
    let cerr = String::from_utf8_lossy(&coord.wait_with_output().unwrap().stderr).into_owned();
    assert!(werr.contains("server 0"), "worker said: {werr}");
    assert!(cerr.contains("server 0"), "coordinator said: {cerr}");
}

/// A node runs without transparent huge pages (`process.rs`: mimalloc's arenas on them cost a
/// training node up to two fifths of its CPU in page zeroing), as the kernel reports it.
#[cfg(target_os = "linux")]
#[test]
fn a_node_runs_without_transparent_huge_pages() {
    use std::process::Stdio;
    let thp = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status.lines().find_map(|l| l.strip_prefix("THP_enabled:").map(|v| v.trim().to_string()))
    };
    // (a kernel that does not report it: nothing to check)
    let Some(ours) = thp(std::process::id()) else { return };
    let dir = tempfile::tempdir().unwrap();
    let af = dir.path().join("addr");
    let mut coord = downpour()
        .args(["coordinator", "--listen", "127.0.0.1:0", "--servers", "1", "--workers", "1", "--addr-file", &af.display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    common::wait_for_addr(&af);
    let node = thp(coord.id());
    coord.kill().unwrap();
    let _ = coord.wait();
    assert_eq!(node.as_deref(), Some("0"), "the test process itself has THP_enabled {ours}");
}

#[test]
fn launch_kills_every_child_on_ctrl_c() {
    use std::process::Stdio;
    let marker = format!("downpour-sigint-{}-{:?}", std::process::id(), Instant::now());
    let mut launcher = downpour()
        .env("DOWNPOUR_TEST_MARKER", &marker)
        .args(["launch", "--servers", "1", "--workers", "1", "--", "counter", "--keys", "100", "--rounds", "5000000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(launcher.try_wait().unwrap().is_none(), "the job ended too early");
    // SIGINT to the launcher alone, as `kill -INT` would (a terminal would signal the whole group)
    let st = Command::new("kill").args(["-INT", &launcher.id().to_string()]).status().unwrap();
    assert!(st.success());
    let status = wait_timeout(&mut launcher, Duration::from_secs(20)).expect("launcher must exit");
    assert!(!status.success());
    let err = String::from_utf8_lossy(&launcher.wait_with_output().unwrap().stderr).into_owned();
    assert!(err.contains("interrupted"), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    let left: Vec<_> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read(e.path().join("environ")).map(|b| String::from_utf8_lossy(&b).contains(&marker)).unwrap_or(false))
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

#[test]
fn an_injected_server_kill_without_replication_fails_the_job_promptly_and_names_the_fault() {
    // with one copy there is nothing to fail over to: the job must fail fast with a message, not hang
    let t0 = std::time::Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_downpour"))
        .env("DOWNPOUR_LOG", "warn")
        .args(["launch", "--servers", "2", "--workers", "2", "--fault", "kill server:1 at 500ms", "--"])
        .args(["counter", "--keys", "100000", "--rounds", "1000000"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("killed server 1") && err.contains("after the injected faults (kill server 1 at 500ms)"), "{err}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(60));
    let o = Command::new(env!("CARGO_BIN_EXE_downpour"))
        .args(["launch", "--servers", "1", "--workers", "1", "--fault", "kill server:3 at 1s", "--", "counter"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--fault names server 3, but there are 1 servers"));
    let o =
        Command::new(env!("CARGO_BIN_EXE_downpour")).args(["launch", "--fault", "kill server:1 soon", "--", "counter"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "a malformed fault is a usage error");
}

/// The issue's check: with two copies, a server SIGKILLed mid-job is replaced by its chains'
/// survivors and the counter ends exact (no lost or doubled increment) on every worker.
#[test]
fn a_server_killed_mid_job_with_two_copies_loses_and_doubles_no_update() {
    for (server, at) in [(1, "900ms"), (0, "1500ms"), (2, "400ms")] {
        let fault = format!("kill server:{server} at {at}");
        let o = Command::new(env!("CARGO_BIN_EXE_downpour"))
            .args(["launch", "--servers", "3", "--workers", "2", "--replication", "2", "--fault", &fault, "--"])
            .args(["counter", "--keys", "20000", "--rounds", "2000"])
            .output()
            .unwrap();
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{fault}: {out}\n{err}");
        assert_eq!(out.matches("counter: OK").count() + err.matches("counter: OK").count(), 2, "{fault}: {out}\n{err}");
        assert!(err.contains(&format!("killed server {server}")), "{err}");
    }
}

/// A SIGKILLed worker of a replicated job is started again by the launcher; the new process
/// takes the lost worker's rank, goes on from its last acknowledged progress record with the
/// same request ids, and the counter ends exact (the servers' watermarks drop what the lost
/// worker had applied after that record). Once alone, once with a server killed as well.
#[test]
fn a_worker_killed_mid_job_is_replaced_and_the_counter_loses_and_doubles_no_update() {
    for faults in [&["kill worker:0 at 1200ms"][..], &["kill worker:1 at 900ms", "kill server:2 at 1400ms"][..]] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_downpour"));
        c.args(["launch", "--servers", "3", "--workers", "2", "--replication", "2"]);
        for f in faults {
            c.args(["--fault", f]);
        }
        let o = c.args(["--", "counter", "--keys", "20000", "--rounds", "1500"]).output().unwrap();
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{faults:?}: {out}\n{err}");
        assert_eq!(out.matches("counter: OK").count() + err.matches("counter: OK").count(), 2, "{faults:?}: {out}\n{err}");
        assert!(err.contains("started a replacement for worker") && err.contains("replaced by node"), "{faults:?}: {err}");
    }
}

/// A SIGKILLed coordinator is started again by the launcher on its address and state
/// directory; it takes the job back, every node reconnects, and the counter ends exact —
/// with and without copies (the coordinator's restart needs none), and once together with a
/// worker's and a server's death.
#[test]
fn a_coordinator_killed_mid_job_takes_the_job_back_and_the_counter_ends_exact() {
    let runs: [&[&str]; 3] = [
        &["--replication", "2", "--fault", "kill coordinator at 1s"],
        &["--fault", "kill coordinator at 300ms"],
        &[
            "--replication",
            "2",
            "--fault",
            "kill worker:0 at 700ms",
            "--fault",
            "kill coordinator at 1300ms",
            "--fault",
            "kill server:1 at 1800ms",
        ],
    ];
    for flags in runs {
        let o = Command::new(env!("CARGO_BIN_EXE_downpour"))
            .args(["launch", "--servers", "3", "--workers", "2"])
            .args(flags)
            .args(["--", "counter", "--keys", "20000", "--rounds", "1500"])
            .output()
            .unwrap();
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{flags:?}: {out}\n{err}");
        assert_eq!(out.matches("counter: OK").count() + err.matches("counter: OK").count(), 2, "{flags:?}: {out}\n{err}");
        assert!(err.contains("coordinator restarted: took back the job"), "{flags:?}: {err}");
    }
}

/// A worker SIGKILLed with no replacement started: after --reassign-after-s the other
/// worker's process takes its share over (it registers once more, gets the lost rank and
/// goes on from its progress record) and the counter ends exact.
#[test]
fn a_lost_worker_s_share_is_taken_over_by_another_worker_and_the_counter_ends_exact() {
    let o = Command::new(env!("CARGO_BIN_EXE_downpour"))
        .args(["launch", "--servers", "3", "--workers", "2", "--replication", "2", "--reassign-after-s", "0.5"])
        .args(["--fault", "lose worker:0 at 1s", "--", "counter", "--keys", "20000", "--rounds", "1500"])
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    assert_eq!(out.matches("counter: OK").count() + err.matches("counter: OK").count(), 2, "{out}\n{err}");
    assert!(err.contains("no replacement is started") && err.contains("takes its share over"), "{err}");
    let o = Command::new(env!("CARGO_BIN_EXE_downpour"))
        .args(["launch", "--servers", "2", "--workers", "2", "--fault", "lose worker:0 at 1s", "--", "counter"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs a replicated job"), "refused up front without copies");
}

/// Without copies a lost worker cannot be replaced exactly: the job fails and says why.
#[test]
fn a_worker_killed_in_an_unreplicated_job_fails_it_with_the_reason() {
    let o = Command::new(env!("CARGO_BIN_EXE_downpour"))
        .args(["launch", "--servers", "2", "--workers", "2", "--fault", "kill worker:1 at 700ms", "--"])
        .args(["counter", "--keys", "20000", "--rounds", "1000000"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("killed worker 1") && err.contains("a worker can be replaced only in a replicated job"), "{err}");
}

/// The issue's elasticity check: one server joins and another is drained while two workers
/// push; every increment lands exactly once, and both changes were served mid-job.
#[test]
fn a_server_joining_and_another_draining_mid_job_lose_and_double_no_update() {
    let o = Command::new(env!("CARGO_BIN_EXE_downpour"))
        .args(["launch", "--servers", "3", "--workers", "2", "--replication", "2"])
        .args(["--fault", "start server at 600ms", "--fault", "drain server:0 at 1500ms", "--"])
        .args(["counter", "--keys", "20000", "--rounds", "1500"])
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    assert_eq!(out.matches("counter: OK").count() + err.matches("counter: OK").count(), 2, "{out}\n{err}");
    assert!(err.contains("served: reconfiguration took") && err.contains("joined at"), "the join was served: {err}");
    assert!(err.contains("server 0 (node 1): drained in routing epoch"), "the drained server left: {err}");
    assert!(err.matches("served: reconfiguration took").count() >= 2, "both changes were served: {err}");
}

/// Runs the counter with `counter_args` on 3 servers, 2 workers and two copies under each
/// fault set of `cases` (`--fault` pairs); every run must end exact on both workers with
/// every routing change served mid-job. Returns each run's stderr.
fn exact_through_faults(cases: &[&[&str]], counter_args: &[&str]) -> Vec<String> {
    let mut logs = Vec::new();
    for faults in cases {
        let o = Command::new(env!("CARGO_BIN_EXE_downpour"))
            .args(["launch", "--servers", "3", "--workers", "2", "--replication", "2"])
            .args(*faults)
            .args(["--", "counter", "--keys", "20000"])
            .args(counter_args)
            .output()
            .unwrap();
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{faults:?}: {out}\n{err}");
        assert_eq!(out.matches("counter: OK").count() + err.matches("counter: OK").count(), 2, "{faults:?}: {out}\n{err}");
        assert_eq!(err.matches(" served: ").count(), faults.len() / 2, "every routing change came mid-job: {err}");
        logs.push(err.into_owned());
    }
    logs
}

/// Synchronous rounds on two copies (`counter --sync`: a bsp table whose heads sum the
/// workers' increments and replicate each round's sum once): a server SIGKILLed mid-job
/// (its buffered rounds die with it and are pushed again by the workers), and a server
/// joining then another drained within one heartbeat of it (some servers move to the third
/// routing epoch without having heard that the second was served), leave every key exact.
#[test]
fn synchronous_rounds_on_two_copies_lose_and_double_no_update_through_a_kill_a_join_and_a_drain() {
    let cases: [&[&str]; 3] = [
        &["--fault", "kill server:1 at 400ms"],
        &["--fault", "kill server:0 at 900ms"],
        &["--fault", "start server at 300ms", "--fault", "drain server:0 at 700ms"],
    ];
    for err in exact_through_faults(&cases, &["--rounds", "1000", "--sync"]) {
        assert!(err.contains("rounds applied on the shards it heads"), "the table was a replicated bsp table: {err}");
    }
}

/// The same for a dense bsp table pushed whole-range: the heads buffer each round's pushes
/// as ranges, sum them without keys and forward the sums by range.
#[test]
fn synchronous_dense_range_rounds_on_two_copies_lose_and_double_no_update_through_a_kill_a_join_and_a_drain() {
    let cases: [&[&str]; 2] =
        [&["--fault", "kill server:1 at 400ms"], &["--fault", "start server at 300ms", "--fault", "drain server:0 at 700ms"]];
    for err in exact_through_faults(&cases, &["--rounds", "1000", "--sync", "--dense"]) {
        assert!(err.contains("rounds applied on the shards it heads"), "the table was a replicated bsp table: {err}");
    }
}

/// Dense tables pushed whole-range (as dense models are: each push one contiguous run per
/// head, forwarded down the chains by range), through a server SIGKILLed mid-job and through
/// a join followed by a drain: every key ends exact.
#[test]
fn dense_range_pushes_on_two_copies_lose_and_double_no_update_through_a_kill_a_join_and_a_drain() {
    let cases: [&[&str]; 2] =
        [&["--fault", "kill server:1 at 400ms"], &["--fault", "start server at 300ms", "--fault", "drain server:0 at 700ms"]];
    exact_through_faults(&cases, &["--rounds", "6000", "--dense"]);
}

#[test]
fn joining_or_draining_an_unreplicated_job_is_refused_before_anything_starts() {
    for fault in ["start server at 1s", "drain server:0 at 1s"] {
        let o = Command::new(env!("CARGO_BIN_EXE_downpour"))
            .args(["launch", "--servers", "2", "--workers", "1", "--fault", fault, "--", "counter"])
            .output()
            .unwrap();
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("needs a replicated job (--replication 2 or more)"), "{fault}: {err}");
        assert!(!err.contains("registered"), "nothing was started: {err}");
    }
}

#[test]
fn a_job_fails_with_a_clear_message_when_every_copy_of_a_shard_is_lost() {
    // two of three servers killed at once with two copies, once the table holds data: some
    // shard lost both copies
    let o = Command::new(env!("CARGO_BIN_EXE_downpour"))
        .args(["launch", "--servers", "3", "--workers", "1", "--replication", "2"])
        .args(["--fault", "kill server:0 at 2s", "--fault", "kill server:1 at 2s", "--"])
        .args(["counter", "--keys", "20000", "--rounds", "100000"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("its updates are lost") || err.contains("no server is left"), "{err}");
}

#[test]
fn an_embedded_replicated_counter_is_exact_and_a_bad_replication_flag_is_refused() {
    let o = Command::new(env!("CARGO_BIN_EXE_downpour"))
        .args(["counter", "--servers", "3", "--workers", "2", "--replication", "2", "--keys", "1000", "--rounds", "20"])
        .output()
        .unwrap();
    assert!(o.status.success(), "an embedded replicated counter runs: {}", String::from_utf8_lossy(&o.stderr));
    let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(all.matches("counter: OK").count(), 2, "{all}");

    let bad = Command::new(env!("CARGO_BIN_EXE_downpour")).args(["launch", "--replication", "9", "--", "counter"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--replication must be 1..=8"));
}

/// The issue's checkpoint check: a job checkpointing every 50 clocks is killed whole (the
/// coordinator's death takes every process down), then restarted with --resume: tables come
/// back from the newest complete checkpoint, workers go on from its round, and the counter
/// ends exact. Old checkpoints are pruned, and the export holds the checkpointed counts.
#[test]
fn a_job_killed_whole_resumes_from_its_newest_checkpoint_and_ends_exact() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let ck_arg = ck.display().to_string();
    let o = run(downpour()
        .args(["launch", "--servers", "2", "--workers", "2", "--checkpoint-dir", &ck_arg, "--checkpoint-every", "50"])
        .args(["--fault", "kill all at 2s", "--", "counter", "--keys", "20000", "--rounds", "1000000"]));
    let (_, err) = text(&o);
    assert!(!o.status.success(), "the killed job fails: {err}");
    let complete: Vec<_> = std::fs::read_dir(&ck)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("manifest.pb").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    // three are kept; a kill landing between a new one's completion and the oldest one's
    // removal leaves a fourth
    assert!((1..=4).contains(&complete.len()), "at most 3 complete checkpoints are kept (4 mid-pruning): {complete:?}");

    let show = run(downpour().args(["checkpoint", "show", &ck_arg]));
    let (out, err) = text(&show);
    assert!(show.status.success(), "{err}");
    let clock: u64 = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("worker 0: clock ").and_then(|r| r.split(',').next()).and_then(|n| n.parse().ok()))
        .unwrap_or_else(|| panic!("no worker clock in {out}"));
    assert!(clock >= 50 && clock.is_multiple_of(50), "{out}");
    assert!(out.contains("table 1 \"counter\": 20000 rows"), "{out}");

    // the export holds 2 × clock for every key
    let st = dir.path().join("c.safetensors");
    let ex = run(downpour().args(["checkpoint", "export", &ck_arg, "--out", &st.display().to_string()]));
    assert!(ex.status.success(), "{}", text(&ex).1);
    let bytes = std::fs::read(&st).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8_lossy(&bytes[8..8 + n]);
    assert!(header.contains("\"table1.values\":{\"dtype\":\"F32\",\"shape\":[20000,1]"), "{header}");
    let values = &bytes[8 + n + 20000 * 8..];
    assert!(values.chunks_exact(4).all(|c| f32::from_le_bytes(c.try_into().unwrap()) == 2.0 * clock as f32));

    // resumed with 300 more rounds: exact, and the workers said where they went on from
    let rounds = (clock + 300).to_string();
    let o = run(downpour()
        .env("DOWNPOUR_LOG", "info")
        .args(["launch", "--servers", "2", "--workers", "2", "--checkpoint-dir", &ck_arg, "--checkpoint-every", "50"])
        .args(["--resume", &ck_arg, "--", "counter", "--keys", "20000", "--rounds", &rounds]));
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert_eq!(out.matches("counter: OK").count() + err.matches("counter: OK").count(), 2, "{out}\n{err}");
    assert!(err.contains(&format!("resumes after round {clock}")), "{err}");
    assert!(err.contains("rows restored from the checkpoint"), "{err}");

    // a different number of workers cannot take over the workers' states
    let o = run(downpour().args(["counter", "--servers", "1", "--workers", "3", "--resume", &ck_arg, "--rounds", &rounds]));
    assert!(!o.status.success());
    assert!(text(&o).1.contains("taken with 2 workers; this job has 3"), "{}", text(&o).1);
}

#[test]
fn checkpoint_flags_are_checked_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    for (args, why) in [
        (vec!["--checkpoint-dir", d.as_str(), "--checkpoint-every", "soon"], "give a number of clocks"),
        (vec!["--checkpoint-every", "100"], "--checkpoint-every needs --checkpoint-dir"),
        (vec!["--resume", d.as_str()], "holds no complete checkpoint"),
    ] {
        let o = run(downpour().args(&args).args(["counter", "--rounds", "1"]));
        assert!(!o.status.success(), "{args:?}");
        assert!(text(&o).1.contains(why), "{args:?}: {}", text(&o).1);
    }
    let o = run(downpour().args(["--checkpoint-dir", &d, "launch", "--", "train", "dnn", "--data", "x"]));
    assert!(!o.status.success());
    assert!(text(&o).1.contains("supported by the counter and train linear jobs only"), "{}", text(&o).1);
}

#[test]
fn top_finds_the_servers_through_the_coordinator_shows_their_tables_and_rates_and_says_when_none_answers() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let addr_file = dir.path().join("coord.addr");
    let af = addr_file.display().to_string();
    let spawn = |args: &[&str]| downpour().args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    // free ports for the metrics endpoints
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let coord_metrics = format!("127.0.0.1:{}", free());
    let mut coord = spawn(&[
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--servers",
        "1",
        "--workers",
        "1",
        "--addr-file",
        &af,
        "--metrics-listen",
        &coord_metrics,
    ]);
    let addr = common::wait_for_addr(&addr_file);
    let metrics = format!("127.0.0.1:{}", free());
    let mut server = spawn(&["server", "--coordinator", &addr, "--listen", "127.0.0.1:0", "--metrics-listen", &metrics]);
    // a worker that keeps pushing to table "counter" until killed
    let worker_metrics = format!("127.0.0.1:{}", free());
    let mut worker =
        spawn(&["worker", "--coordinator", &addr, "--metrics-listen", &worker_metrics, "counter", "--keys", "1000", "--rounds", "5000000"]);
    // the push rate of the counter table's row ("-" until both of a view's scrapes hold the table)
    let push_rate = |view: &str| -> String {
        let row = view.lines().find(|l| l.contains("counter")).unwrap_or_default();
        row.split_whitespace().nth(4).unwrap_or("-").to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let view = loop {
        // the endpoints from the coordinator (the server registered its metrics address)
        let o = downpour().args(["top", "--coordinator", &addr, "--once", "--interval", "0.3"]).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        if (o.status.success() && push_rate(&out) != "-") || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // the coordinator's and the worker's endpoints, parsed as Prometheus text
    let get = |at: &str| {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(at).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut text = String::new();
        c.read_to_string(&mut text).unwrap();
        let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
        prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap()
    };
    let of_worker = get(&worker_metrics);
    assert!(
        of_worker.samples.iter().any(|x| x.metric == "downpour_worker" && x.labels.get("rank") == Some("0")),
        "{:?}",
        of_worker.samples
    );
    assert!(of_worker.samples.iter().any(|x| x.metric == "downpour_worker_pull_staleness_count"), "{:?}", of_worker.samples);
    let scrape = get(&coord_metrics);
    let value = |name: &str, label: Option<(&str, &str)>| {
        scrape.samples.iter().find(|x| x.metric == name && label.is_none_or(|(k, v)| x.labels.get(k) == Some(v))).map(|x| match x.value {
            prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
    };
    assert_eq!(value("downpour_routing_epoch", None), Some(1.0));
    assert_eq!(value("downpour_coordinator_servers", Some(("state", "live"))), Some(1.0));
    assert_eq!(value("downpour_coordinator_workers", Some(("state", "registered"))), Some(1.0));
    assert_eq!(value("downpour_routing_epochs_served_total", Some(("cause", "failure"))), Some(0.0));
    for p in [&mut worker, &mut server, &mut coord] {
        p.kill().unwrap();
        p.wait().unwrap();
    }
    assert!(view.contains(&metrics) && view.contains("rank 0") && view.contains("push keys/s"), "{view}");
    // the counter table's row: a push rate above zero
    let rate = push_rate(&view);
    assert!(rate != "-" && rate != "0", "push keys/s of the counter table: {view}");
    let o = downpour().args(["top", "--metrics", "127.0.0.1:1", "--once"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("no server answered") && err.contains("127.0.0.1:1"), "{err}");
}

#[test]
fn plan_predicts_from_a_calibration_names_the_bound_and_recommends_servers() {
    let dir = tempfile::tempdir().unwrap();
    let cal = dir.path().join("calibration.json");
    std::fs::write(&cal, r#"{"worker_cpu_s": 1e-5, "server_cpu_s": 4e-6, "wire_bytes": 800}"#).unwrap();
    let c = cal.display().to_string();
    let o = run(downpour().args(["plan", "--workers", "16", "--servers", "2", "--cpu", "0.1", "--calibration", &c, "--json"]));
    assert!(o.status.success(), "{}", text(&o).1);
    let p: serde_json::Value = serde_json::from_str(text(&o).0.trim()).unwrap();
    assert_eq!(p["bottleneck"], "servers");
    assert!((p["examples_per_s"].as_f64().unwrap() - 50_000.0).abs() < 1e-6, "{p}");
    // without --servers: the fewest within 5 % of the best
    let o = run(downpour().args(["plan", "--workers", "16", "--cpu", "0.1", "--calibration", &c]));
    assert!(text(&o).0.contains("16 workers, 7 servers"), "{}", text(&o).0);
    // the time to a target: the examples it takes at the predicted rate (50,000 examples/s)
    let o = run(downpour().args(["plan", "--workers", "16", "--servers", "2", "--cpu", "0.1", "--calibration", &c]).args([
        "--examples-to-target",
        "200000",
        "--json",
    ]));
    let p: serde_json::Value = serde_json::from_str(text(&o).0.trim()).unwrap();
    assert!((p["time_to_target_s"].as_f64().unwrap() - 4.0).abs() < 1e-9, "{p}");
    let o = run(downpour().args(["plan", "--workers", "16", "--calibration", &c, "--examples-to-target", "0"]));
    assert!(!o.status.success() && text(&o).1.contains("--examples-to-target"), "{}", text(&o).1);
    std::fs::write(&cal, "{}").unwrap();
    let o = run(downpour().args(["plan", "--workers", "2", "--calibration", &c]));
    assert!(!o.status.success() && text(&o).1.contains("not a calibration"), "{}", text(&o).1);
    let o = run(downpour().args(["plan", "--workers", "2", "--link", "fast", "--calibration", &c]));
    assert!(!o.status.success());
}

#[test]
fn plan_calibrate_measures_each_roles_costs_and_plan_takes_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("cal");
    let o = run(downpour()
        .args(["--log", "warn", "plan", "calibrate", "--dir", d.to_str().unwrap(), "--servers", "1,2"])
        .args(["--examples-per-worker", "60000"]));
    assert!(o.status.success(), "{}", text(&o).1);
    let mut flags = Vec::new();
    for s in [1u64, 2] {
        let f = d.join(format!("calibration-S{s}.json"));
        let c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        assert_eq!(c["servers"].as_u64(), Some(s), "{c}");
        // CPU seconds per example in the range this job costs (µs), ~300 bytes each
        for k in ["worker_cpu_s", "server_cpu_s"] {
            let x = c[k].as_f64().unwrap();
            assert!(x > 1e-8 && x < 1e-4, "{k}: {c}");
        }
        let b = c["wire_bytes"].as_f64().unwrap();
        assert!(b > 100.0 && b < 2000.0, "{c}");
        // the runs behind it: W = 1, and W = S to load the servers
        let ws: Vec<u64> = c["runs"].as_array().unwrap().iter().map(|r| r["workers"].as_u64().unwrap()).collect();
        assert_eq!(ws, if s == 1 { vec![1] } else { vec![1, 2] }, "{c}");
        flags.extend(["--calibration".to_string(), f.display().to_string()]);
    }
    let o = run(downpour().args(["plan", "--workers", "4", "--servers", "2", "--json"]).args(&flags));
    assert!(o.status.success(), "{}", text(&o).1);
    let p: serde_json::Value = serde_json::from_str(text(&o).0.trim()).unwrap();
    assert!(p["examples_per_s"].as_f64().unwrap() > 0.0, "{p}");
    let o = run(downpour().args(["plan", "calibrate", "--dir", d.to_str().unwrap(), "--servers", "0"]));
    assert!(!o.status.success() && text(&o).1.contains("--servers"), "{}", text(&o).1);
    // train dnn, on the MNIST sample: its calibration is refused for --job linear
    let mnist = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/mnist-sample");
    let dd = dir.path().join("dnn");
    let o = run(downpour().args(["--log", "warn", "plan", "calibrate", "--job", "dnn", "--epochs", "2", "--servers", "1"]).args([
        "--data",
        mnist.to_str().unwrap(),
        "--dir",
        dd.to_str().unwrap(),
    ]));
    assert!(o.status.success(), "{}", text(&o).1);
    let f = dd.join("calibration-S1.json");
    let c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    assert_eq!(c["job"], "dnn", "{c}");
    // a dense model's pull and push per step: far more bytes per example than the linear job
    assert!(c["wire_bytes"].as_f64().unwrap() > 2000.0, "{c}");
    let cal = ["--calibration".to_string(), f.display().to_string()];
    let o = run(downpour().args(["plan", "--workers", "2", "--job", "dnn"]).args(&cal));
    assert!(o.status.success() && text(&o).0.contains("train dnn"), "{}", text(&o).1);
    let o = run(downpour().args(["plan", "--workers", "2"]).args(&cal));
    assert!(!o.status.success() && text(&o).1.contains("measures `train dnn`"), "{}", text(&o).1);
}

/// `downpour plan … | head -0`: a reader that closed the pipe ends a printing command as it
/// ends any filter (SIGPIPE), not with a panic in `println!`.
#[cfg(unix)]
#[test]
fn a_printing_command_whose_reader_closed_the_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let cal = dir.path().join("calibration.json");
    std::fs::write(&cal, r#"{"worker_cpu_s": 1e-5, "server_cpu_s": 4e-6, "wire_bytes": 800}"#).unwrap();
    // the read end closed before the command starts, so its first line meets a closed pipe
    // whatever the timing (closing it after the spawn raced a fast command that had already
    // written everything into the pipe's buffer)
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = downpour()
        .args(["plan", "--workers", "16", "--cpu", "0.1", "--calibration", &cal.display().to_string()])
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    // (13: SIGPIPE on Linux and macOS)
    assert_eq!(o.status.signal(), Some(13), "{:?} {err}", o.status);
}
