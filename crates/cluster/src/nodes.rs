//! The node configurations of a job, derived from its [`Settings`]: what the coordinator,
//! a server and a worker's session are started with, embedded or as processes.

use crate::settings::Settings;
use anyhow::Result;
use downpour_coordinator::CoordinatorConfig;
use downpour_core::checkpoint;
use downpour_server::ServerConfig;
use downpour_transport::Transport;
use downpour_worker::{CheckpointEvery, KvConfig, SessionConfig};
use std::sync::Arc;
use std::time::Duration;

/// The client settings a worker uses.
pub fn kv_config(s: &Settings) -> KvConfig {
    KvConfig { chunk_bytes: s.chunk_bytes, request_timeout: s.request_timeout, ..Default::default() }
}

/// The coordinator settings.
pub fn coordinator_config(s: &Settings, servers: usize, workers: usize) -> CoordinatorConfig {
    CoordinatorConfig {
        servers,
        workers,
        heartbeat: s.heartbeat,
        node_timeout: s.node_timeout,
        worker_rejoin: s.worker_rejoin,
        reassign_after: s.reassign_after,
        state_dir: None,
        register_timeout: s.connect_timeout.max(Duration::from_secs(30)),
        secret: s.auth.as_ref().map(|a| a.secret().to_string()),
        replication: s.replication,
        vnodes: s.vnodes,
        shards: s.shards,
        checkpoint_every: match s.checkpoint.as_ref().map(|c| c.every) {
            Some(CheckpointEvery::Time(t)) => Some(t),
            _ => None,
        },
    }
}

/// A server's settings: limits, peers, and the checkpoint directory and the checkpoint to
/// resume from (its parts read here, so a missing or corrupt one fails before the job starts).
pub fn server_config(s: &Settings, peer: Arc<dyn Transport>, secret: Option<String>) -> Result<ServerConfig> {
    let resume = match &s.resume {
        Some(p) => {
            let manifest = checkpoint::read_manifest(p)?;
            Some(Arc::new(checkpoint::read_parts(p, &manifest)?))
        }
        None => None,
    };
    Ok(ServerConfig {
        chunk_bytes: s.chunk_bytes,
        limits: s.limits,
        secret,
        peer_transport: Some(peer),
        checkpoint_dir: s.checkpoint.as_ref().map(|c| c.dir.clone()),
        resume,
        ..Default::default()
    })
}

/// How long nodes keep reconnecting to a coordinator (with a state directory) that went
/// away: as long as a request waits for a fail-over.
pub fn coordinator_restart_wait(s: &Settings) -> Duration {
    s.node_timeout * 3 + Duration::from_secs(10)
}

/// A worker's session settings (with the manifest of the checkpoint to resume from).
pub fn session_config(s: &Settings, coordinator: &str) -> Result<SessionConfig> {
    Ok(SessionConfig {
        coordinator: coordinator.to_string(),
        connect_timeout: s.connect_timeout,
        kv: kv_config(s),
        failover_timeout: coordinator_restart_wait(s),
        checkpoint: s.checkpoint.clone(),
        resume: match &s.resume {
            Some(p) => Some(Arc::new(checkpoint::read_manifest(p)?)),
            None => None,
        },
        records_progress: false,
        on_adopt: None,
        metrics_listen: None,
    })
}
