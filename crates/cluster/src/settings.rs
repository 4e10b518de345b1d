//! The settings of a cluster and its nodes, typed and resolved: what the command-line tool
//! parses once at its edge (flags, environment, a TOML file) and what a program fills in
//! itself (start from [`Settings::default`]). Nothing below reads the environment.

use anyhow::Result;
use downpour_core::codec::FrameLimits;
use downpour_server::Limits;
use downpour_transport::{AuthToken, NetConfig, TlsConfig, TransportKind};
use downpour_worker::{CheckpointConfig, CheckpointEvery};
use std::path::PathBuf;
use std::time::Duration;

/// Ring points per server of a replicated job unless `--vnodes` says otherwise. With 4, the
/// servers of a 3-server job held 47, 45 and 36 of 128 shard copies and K = 2 pushes reached
/// 0.60-0.68x of K = 1 on an emulated network; with 16, 40, 46 and 42, and 0.66-0.72x; the
/// price is more key ranges per dense request (docs/benchmarks.md, "16 ring points per
/// server by default"). Cassandra 4.0 lowered its default from 256 tokens to 16 likewise.
pub const DEFAULT_VNODES: u32 = 16;

/// Resolved settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub transport: TransportKind,
    pub chunk_bytes: usize,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub heartbeat: Duration,
    pub node_timeout: Duration,
    pub log: String,
    /// The cluster secret, if any.
    pub auth: Option<AuthToken>,
    /// Where it was read from (passed on to child processes; `None` when it came from the
    /// environment, which children inherit).
    pub auth_token_file: Option<PathBuf>,
    /// TLS material and the files it came from (cert, key, CA).
    pub tls: Option<(TlsConfig, [PathBuf; 3])>,
    /// Transport limits.
    pub max_message_bytes: u64,
    pub max_connections: usize,
    /// HTTP/2 window of the gRPC transport, bytes ([`NetConfig::grpc_window`]): a whole
    /// number of MiB from 1 to 2047 (children are handed it in MiB).
    pub grpc_window: u32,
    /// Bytes of each ring of a shared-memory connection ([`NetConfig::shm_ring_bytes`]): a
    /// power of two from 256 KiB to 1 GiB (children are handed it in KiB).
    pub shm_ring_bytes: usize,
    /// How long a read for the next frame polls before it sleeps ([`NetConfig::poll`]);
    /// `None`: the default ([`downpour_transport::DEFAULT_POLL`]), which a local launch
    /// turns to zero for its children when it starts more servers and workers than the
    /// machine has cores ([`crate::launch_local`]).
    pub poll: Option<Duration>,
    /// Server limits.
    pub limits: Limits,
    /// Chain replication: copies of every key, ring points per server, shards per table.
    pub replication: usize,
    pub vnodes: u32,
    pub shards: u32,
    /// Checkpoints to take.
    pub checkpoint: Option<CheckpointConfig>,
    /// The complete checkpoint to resume from (resolved from `--resume`).
    pub resume: Option<PathBuf>,
    /// How long a lost worker's rank waits for a replacement (zero: fail at once).
    pub worker_rejoin: Duration,
    /// When a live worker takes a vacant rank's share over (zero: never).
    pub reassign_after: Duration,
}

impl Default for Settings {
    /// The defaults of the command-line flags: framed TCP, 2 MiB chunks, 60 s request and
    /// 10 s connect timeouts, 500 ms heartbeats, nodes declared dead after 10 s, no
    /// security, 256 MiB frames, 1,024 connections, 128 MiB gRPC windows, the server
    /// limits' defaults with 80 % of the machine's memory as quota, no replication (16 ring
    /// points, 64 shards if it is turned on), no checkpoints, lost workers' ranks kept 60 s
    /// and reassigned after 5 s.
    fn default() -> Self {
        Settings {
            transport: TransportKind::Tcp,
            chunk_bytes: 2 << 20,
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            heartbeat: Duration::from_millis(500),
            node_timeout: Duration::from_secs(10),
            log: "info".into(),
            auth: None,
            auth_token_file: None,
            tls: None,
            max_message_bytes: 256 << 20,
            max_connections: 1024,
            grpc_window: downpour_transport::DEFAULT_GRPC_WINDOW,
            shm_ring_bytes: downpour_transport::shm::DEFAULT_RING_BYTES,
            poll: None,
            limits: Limits { memory_quota_bytes: default_memory_quota(), ..Limits::default() },
            replication: 1,
            vnodes: DEFAULT_VNODES,
            shards: 64,
            checkpoint: None,
            resume: None,
            worker_rejoin: Duration::from_secs(60),
            reassign_after: Duration::from_secs(5),
        }
    }
}

/// Parses `--checkpoint-every`: `N` clocks, or a time (`30s`, `1.5s`, `800ms`).
pub fn parse_every(v: &str) -> Result<CheckpointEvery> {
    let v = v.trim();
    if let Ok(n) = v.parse::<u64>() {
        anyhow::ensure!(n >= 1, "--checkpoint-every must be at least 1 clock");
        return Ok(CheckpointEvery::Clocks(n));
    }
    if !v.ends_with('s') {
        anyhow::bail!("--checkpoint-every {v:?}: give a number of clocks (500) or a time (30s, 1.5s, 800ms)")
    }
    let t = crate::fault::parse_time(v).map_err(|e| anyhow::anyhow!("--checkpoint-every: {e}"))?;
    anyhow::ensure!(t >= Duration::from_millis(10), "--checkpoint-every {v:?}: the time must be at least 10ms");
    Ok(CheckpointEvery::Time(t))
}

impl Settings {
    /// The network transports' settings.
    pub fn net_config(&self) -> NetConfig {
        NetConfig {
            limits: FrameLimits { max_payload_bytes: self.max_message_bytes },
            auth: self.auth.clone(),
            tls: self.tls.as_ref().map(|t| t.0.clone()),
            max_connections: self.max_connections,
            grpc_window: self.grpc_window,
            shm_ring_bytes: self.shm_ring_bytes,
            poll: self.poll.unwrap_or(downpour_transport::DEFAULT_POLL),
            ..NetConfig::default()
        }
    }

    /// The flags to hand to child processes so they resolve the same settings.
    pub fn to_child_args(&self) -> Vec<String> {
        let s = self;
        let t = match s.transport {
            TransportKind::Tcp => "tcp",
            TransportKind::Grpc => "grpc",
            TransportKind::Shm => "shm",
        };
        vec![
            "--transport".into(),
            t.into(),
            "--chunk-bytes".into(),
            s.chunk_bytes.to_string(),
            "--request-timeout-s".into(),
            s.request_timeout.as_secs_f64().to_string(),
            "--connect-timeout-s".into(),
            s.connect_timeout.as_secs_f64().to_string(),
            "--heartbeat-ms".into(),
            s.heartbeat.as_millis().to_string(),
            "--node-timeout-s".into(),
            s.node_timeout.as_secs_f64().to_string(),
            "--worker-rejoin-s".into(),
            s.worker_rejoin.as_secs_f64().to_string(),
            "--reassign-after-s".into(),
            s.reassign_after.as_secs_f64().to_string(),
            "--log".into(),
            s.log.clone(),
            "--max-message-mib".into(),
            (s.max_message_bytes >> 20).to_string(),
            "--max-connections".into(),
            s.max_connections.to_string(),
            "--grpc-window-mib".into(),
            (s.grpc_window >> 20).to_string(),
            "--shm-ring-kib".into(),
            (s.shm_ring_bytes >> 10).to_string(),
            "--max-keys-per-request".into(),
            s.limits.max_keys_per_request.to_string(),
            "--replication".into(),
            s.replication.to_string(),
            "--vnodes".into(),
            s.vnodes.to_string(),
            "--shards".into(),
            s.shards.to_string(),
            "--max-value-len".into(),
            s.limits.max_value_len.to_string(),
            "--max-tables".into(),
            s.limits.max_tables.to_string(),
            "--memory-quota-mib".into(),
            (s.limits.memory_quota_bytes >> 20).to_string(),
        ]
        .into_iter()
        .chain(s.checkpoint.iter().flat_map(|c| {
            let every = match c.every {
                CheckpointEvery::Clocks(n) => n.to_string(),
                CheckpointEvery::Time(t) => format!("{}ms", t.as_millis().max(10)),
            };
            ["--checkpoint-dir".to_string(), c.dir.display().to_string(), "--checkpoint-every".to_string(), every]
        }))
        .chain(s.poll.iter().flat_map(|p| ["--poll-us".to_string(), p.as_micros().to_string()]))
        .chain(s.resume.iter().flat_map(|p| ["--resume".to_string(), p.display().to_string()]))
        .chain(s.auth_token_file.iter().flat_map(|p| ["--auth-token-file".to_string(), p.display().to_string()]))
        .chain(s.tls.iter().flat_map(|(c, files)| {
            let mut v = tls_file_args(files);
            if !c.require_client_cert {
                v.push("--tls-no-client-auth".into());
            }
            if let Some(n) = &c.server_name {
                v.extend(["--tls-server-name".to_string(), n.clone()]);
            }
            v
        }))
        .collect()
    }
}

/// The flags naming a node's TLS files: `[cert, key, ca]`.
pub fn tls_file_args([cert, key, ca]: &[PathBuf; 3]) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        cert.display().to_string(),
        "--tls-key".into(),
        key.display().to_string(),
        "--tls-ca".into(),
        ca.display().to_string(),
    ]
}

/// 80 % of the machine's memory (Linux), or no quota where it cannot be read.
pub fn default_memory_quota() -> u64 {
    let total_kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines().find(|l| l.starts_with("MemTotal:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<u64>().ok())
    });
    match total_kib {
        Some(k) => k * 1024 / 10 * 8,
        None => u64::MAX,
    }
}
