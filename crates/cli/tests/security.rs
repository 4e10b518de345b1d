//! TLS and auth tokens from the command line: `certs generate` output runs a launched job
//! over mutual TLS with a token, and a worker with the wrong token never joins.

mod common;

use std::process::{Command, Stdio};

fn downpour() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_downpour"));
    c.env("DOWNPOUR_LOG", "warn").env_remove("DOWNPOUR_AUTH_TOKEN");
    c
}

#[test]
fn certs_generate_output_runs_a_tls_cluster_with_a_token_under_launch() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let o = downpour().args(["certs", "generate", "--out", certs.to_str().unwrap(), "--nodes", "4"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let token = dir.path().join("token");
    std::fs::write(&token, "a-test-cluster-secret-0123\n").unwrap();
    // framed TCP (the default) and gRPC, both over mutual TLS
    for transport in ["tcp", "grpc"] {
        let o = downpour()
            .args(["--auth-token-file", token.to_str().unwrap(), "--transport", transport, "launch", "--tls-dir", certs.to_str().unwrap()])
            .args(["--servers", "1", "--workers", "2", "--", "counter", "--keys", "300", "--rounds", "3"])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{transport}: {out}\n{err}");
        assert_eq!(out.matches("counter: OK keys=300").count(), 2, "{transport}: {out}");
        assert!(!err.contains("WARN"), "{transport}: a clean TLS run warns of nothing:\n{err}");
    }
    // four certificates do not cover 1 + 2 + 2 processes: a clear error before anything starts
    let o = downpour()
        .args(["launch", "--tls-dir", certs.to_str().unwrap(), "--servers", "2", "--workers", "2", "--", "counter"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("node-4.pem is missing"), "{}", String::from_utf8_lossy(&o.stderr));
    // certificates are not overwritten
    let o = downpour().args(["certs", "generate", "--out", certs.to_str().unwrap(), "--nodes", "1"]).output().unwrap();
    assert!(!o.status.success());
}

#[test]
fn a_worker_with_the_wrong_token_is_refused_by_the_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let addr_file = dir.path().join("coord.addr");
    let mut coord = downpour()
        .env("DOWNPOUR_AUTH_TOKEN", "the-coordinators-secret")
        .args(["coordinator", "--listen", "127.0.0.1:0", "--servers", "1", "--workers", "1"])
        .args(["--addr-file", addr_file.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = common::wait_for_addr(&addr_file);
    for (token, why) in [(Some("not-the-coordinators-secret"), "wrong auth token"), (None, "authentication required")] {
        let mut w = downpour();
        if let Some(t) = token {
            w.env("DOWNPOUR_AUTH_TOKEN", t);
        }
        let o = w.args(["--connect-timeout-s", "5", "worker", "--coordinator", &addr, "counter"]).output().unwrap();
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(why), "{err}");
    }
    let _ = coord.kill();
    let out = coord.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(log.matches("refused a connection from 127.0.0.1").count(), 1, "one line per peer: {log}");
}
