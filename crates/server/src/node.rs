//! A server node in a cluster ([`run_server_node`]): listen, register with the
//! coordinator, serve, heartbeat, follow routing epochs; its settings ([`NodeConfig`]) and
//! why it stopped ([`NodeError`]).

use crate::config::ServerConfig;
use crate::listener::Server;
use crate::repl::epoch::{epoch_served, move_to_epoch, EpochError};
use downpour_control::{ControlClient, ControlError};
use downpour_transport::{Transport, TransportError};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Settings of a server node in a cluster.
#[derive(Clone)]
pub struct NodeConfig {
    /// Coordinator address.
    pub coordinator: String,
    /// Address to listen on (`host:0` picks a free port).
    pub listen: String,
    /// Host (name or IP) workers reach this server at, when it differs from the listen
    /// address (required when listening on 0.0.0.0 or ::). The port is the one listened on.
    pub advertise: Option<String>,
    /// How long to try reaching the coordinator.
    pub connect_timeout: Duration,
    /// Server settings.
    pub server: ServerConfig,
    /// The server has its process to itself, so the process's peak memory is the server's
    /// and is reported per stored key at the end (false for embedded clusters).
    pub own_process: bool,
    /// Called once the coordinator registered this server, with its rank and node id
    /// (launchers learn which process is which server from it).
    pub on_registered: Option<Arc<dyn Fn(u32, u32) + Send + Sync>>,
    /// How long to keep reconnecting to a coordinator that went away, when it keeps its
    /// state on disk and so may come back (it says so at registration).
    pub coordinator_restart_wait: Duration,
    /// Where to serve Prometheus metrics (`GET /metrics`) and the health probe
    /// (`GET /healthz`) over HTTP (`--metrics-listen`); `None` serves none.
    pub metrics_listen: Option<String>,
}

/// Why a server node stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Listening failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The coordinator could not be reached or refused us.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The coordinator failed the job.
    #[error("the job failed: {0}")]
    JobFailed(String),
    /// Could not start a thread.
    #[error("cannot start a thread: {0}")]
    Thread(#[from] std::io::Error),
    /// The address to register cannot be reached by workers.
    #[error("{0}")]
    Address(String),
    /// The metrics endpoint could not listen (the address is in the message).
    #[error("{0}")]
    Metrics(std::io::Error),
}

/// The address registered with the coordinator: `advertise` with the bound port, or the
/// bound address itself unless it is a wildcard address no worker can connect to.
pub fn advertised_addr(bound: &str, advertise: Option<&str>) -> Result<String, NodeError> {
    let port = bound.rsplit_once(':').map(|(_, p)| p).unwrap_or("");
    match advertise {
        Some(host) if host.contains(':') && !host.starts_with('[') => Ok(format!("[{host}]:{port}")),
        Some(host) => Ok(format!("{host}:{port}")),
        None if bound.starts_with("0.0.0.0:") || bound.starts_with("[::]:") => {
            Err(NodeError::Address(format!("listening on {bound}: give --advertise HOST, the address workers reach this server at")))
        }
        None => Ok(bound.to_string()),
    }
}

/// The process's peak resident set size (`VmHWM`), where the OS reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Runs a server node: listen, register with the coordinator, serve, heartbeat; returns
/// `Ok` when the coordinator ends the job, an error when the job fails or the
/// coordinator is lost.
pub fn run_server_node(transport: &dyn Transport, cfg: NodeConfig) -> Result<(), NodeError> {
    let server = Server::bind(transport, &cfg.listen, cfg.server.clone())?;
    // (registered with the coordinator, for `downpour top --coordinator`: the advertised host
    // when listening on a wildcard address)
    let mut metrics_addr = String::new();
    if let Some(listen) = &cfg.metrics_listen {
        let at = crate::metrics::serve_metrics(listen, server.state().clone()).map_err(NodeError::Metrics)?;
        tracing::info!("metrics on http://{at}/metrics (health: /healthz)");
        metrics_addr = advertised_addr(&at, cfg.advertise.as_deref()).unwrap_or_default();
    }
    let addr = advertised_addr(&server.addr(), cfg.advertise.as_deref())?;
    let mut control = ControlClient::connect(transport, &cfg.coordinator, cfg.connect_timeout)?;
    control.set_timeout(Some(cfg.connect_timeout))?;
    // A registration whose reply is lost to a coordinator restart is sent again (same token).
    if let Some(t) = cfg.server.peer_transport.clone() {
        control.enable_reconnect(t, cfg.connect_timeout);
    }
    let reg = control.register_as(&downpour_core::proto::RegisterRequest {
        role: "server".into(),
        addr: addr.clone(),
        metrics_addr,
        token: ControlClient::new_token(),
        ..Default::default()
    })?;
    control.disable_reconnect();
    if reg.coordinator_restartable {
        if let Some(t) = cfg.server.peer_transport.clone() {
            control.enable_reconnect(t, cfg.coordinator_restart_wait);
        }
    }
    if let Some(f) = &cfg.on_registered {
        f(reg.rank, reg.node_id);
    }
    let epoch = reg.routing.as_ref().map(|r| r.epoch).unwrap_or(0).max(1);
    server.state().set_placement(reg.node_id, reg.rank, reg.num_servers, reg.num_workers, epoch);
    if reg.routing.as_ref().is_some_and(|r| r.replication >= 2) {
        if cfg.server.peer_transport.is_none() {
            return Err(NodeError::Address("a replicated job needs the server's peer transport".into()));
        }
        // The ring is known once every server has registered: heartbeat until then.
        control.set_timeout(Some(Duration::from_millis(reg.heartbeat_ms.max(10)) * 4 + cfg.connect_timeout))?;
        loop {
            let r = control.heartbeat(None)?;
            if r.job_failed {
                return Err(NodeError::JobFailed(r.reason));
            }
            if let Some(routing) = r.routing.filter(|r| r.epoch >= 1) {
                server.state().set_placement(reg.node_id, reg.rank, reg.num_servers, reg.num_workers, routing.epoch);
                let (epoch, active) = (routing.epoch, routing.active);
                server.state().set_replicated(routing);
                if !active {
                    // a server failed before this one started serving: it holds nothing to
                    // copy, and the epoch being prepared waits for it too
                    control.epoch_ready(epoch, 0, "")?;
                }
                break;
            }
        }
    }
    tracing::info!("server {} (node {}) serving on {addr}", reg.rank, reg.node_id);
    let server_state = server.state().clone();
    let handle = server.spawn()?;
    let hb = Duration::from_millis(reg.heartbeat_ms.max(10));
    control.set_timeout(Some(hb * 4 + cfg.connect_timeout))?;
    let mut reported = server_state.epoch();
    // (epoch, wait) of the last failed move: a copy's receiver that died too is removed in a
    // newer epoch within milliseconds, so retries start quick and back off to 100 ms
    let mut retry = (0u64, Duration::ZERO);
    let result = loop {
        match control.heartbeat(None) {
            Ok(r) if r.job_failed => break Err(NodeError::JobFailed(r.reason)),
            Ok(r) if r.shutdown => break Ok(()),
            Ok(r) => {
                server_state.note_worker_nodes(&r.worker_nodes);
                let Some(routing) = r.routing else { continue };
                if r.drained && !routing.servers.iter().any(|s| s.node_id == reg.node_id) {
                    // `admin drain`: the other servers hold every shard of this one (and
                    // build the missing copies among themselves); nothing is lost by going.
                    server_state.epoch.store(routing.epoch, Ordering::Relaxed);
                    tracing::info!("server {} (node {}): drained in routing epoch {}; exiting", reg.rank, reg.node_id, routing.epoch);
                    break Ok(());
                }
                if routing.epoch > reported {
                    let started = std::time::Instant::now();
                    let epoch = routing.epoch;
                    let (copied, error) = match move_to_epoch(&server_state, routing) {
                        Ok(n) => (n, String::new()),
                        Err(e @ EpochError::Removed(_)) => break Err(NodeError::JobFailed(e.to_string())),
                        Err(EpochError::Failed(e)) => (0, e),
                        Err(EpochError::Copy(e)) => {
                            let wait =
                                if retry.0 == epoch { (retry.1 * 2).min(Duration::from_millis(100)) } else { Duration::from_millis(5) };
                            retry = (epoch, wait);
                            tracing::warn!("server {}: routing epoch {epoch}: {e}; trying again in {} ms", reg.rank, wait.as_millis());
                            std::thread::sleep(wait);
                            continue;
                        }
                    };
                    reported = epoch;
                    tracing::info!(
                        "server {}: moved to routing epoch {epoch} in {:.1} ms, {copied} rows copied to new replicas",
                        reg.rank,
                        started.elapsed().as_secs_f64() * 1e3
                    );
                    if let Err(e) = control.epoch_ready(epoch, copied, &error) {
                        break Err(e.into());
                    }
                } else if routing.active {
                    epoch_served(&server_state, &routing);
                }
            }
            Err(e) => break Err(e.into()),
        }
    };
    if result.is_ok() {
        tracing::info!("server {}: {}", reg.rank, server_state.memory_report(cfg.own_process));
    }
    handle.shutdown();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_listen_address_needs_an_advertised_host() {
        assert_eq!(advertised_addr("127.0.0.1:5000", None).unwrap(), "127.0.0.1:5000");
        assert!(advertised_addr("0.0.0.0:5000", None).unwrap_err().to_string().contains("--advertise"));
        assert_eq!(advertised_addr("0.0.0.0:5000", Some("10.0.0.2")).unwrap(), "10.0.0.2:5000");
        assert_eq!(advertised_addr("[::]:5000", Some("fe80::1")).unwrap(), "[fe80::1]:5000");
    }
}
