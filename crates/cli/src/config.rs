//! Configuration, parsed once at the edge: command-line flags, then `DOWNPOUR_*`
//! environment variables (clap reads both), then a TOML file (`--config`), then defaults.
//! The result is a typed [`Settings`] passed down; nothing below reads the environment.

use anyhow::{Context, Result};
use clap::Args;
use downpour_cluster::settings::{parse_every, Settings};
use downpour_server::Limits;
use downpour_transport::{AuthToken, TlsConfig, TransportKind};
use downpour_worker::{CheckpointConfig, CheckpointEvery};
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// Flags shared by every command.
#[derive(Args, Debug, Clone, Default)]
pub struct CommonArgs {
    /// TOML configuration file (keys as in docs/usage.md, "Configuration").
    #[arg(long, global = true, env = "DOWNPOUR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Network transport between nodes: tcp (framed TCP: the default, fastest between
    /// hosts, TLS with --tls-*), grpc (HTTP/2, for networks that pass nothing else; about
    /// three quarters of framed TCP's bulk throughput) or shm (framed TCP's frames through
    /// shared memory in /dev/shm: every node on one host; 2-3x framed TCP there, no TLS).
    #[arg(long, global = true, env = "DOWNPOUR_TRANSPORT")]
    pub transport: Option<TransportKind>,
    /// Largest request chunk in bytes; bigger requests are streamed in chunks.
    #[arg(long, global = true, env = "DOWNPOUR_CHUNK_BYTES")]
    pub chunk_bytes: Option<usize>,
    /// Seconds a worker waits for a server's reply before failing.
    #[arg(long, global = true, env = "DOWNPOUR_REQUEST_TIMEOUT_S")]
    pub request_timeout_s: Option<f64>,
    /// Seconds to keep trying to reach the coordinator.
    #[arg(long, global = true, env = "DOWNPOUR_CONNECT_TIMEOUT_S")]
    pub connect_timeout_s: Option<f64>,
    /// Heartbeat interval in milliseconds (coordinator side; nodes follow it).
    #[arg(long, global = true, env = "DOWNPOUR_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<u64>,
    /// Seconds without a heartbeat after which a node is declared dead.
    #[arg(long, global = true, env = "DOWNPOUR_NODE_TIMEOUT_S")]
    pub node_timeout_s: Option<f64>,
    /// Log filter (error, warn, info, debug, or a tracing filter).
    #[arg(long, global = true, env = "DOWNPOUR_LOG")]
    pub log: Option<String>,
    /// File holding the cluster's auth token (at least 16 printable characters): every
    /// connection must present it. The token itself may instead be given in the environment
    /// as DOWNPOUR_AUTH_TOKEN.
    #[arg(long, global = true, env = "DOWNPOUR_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// The auth token itself: environment only (a flag would show in `ps`).
    #[arg(long = "auth-token-from-env", global = true, env = "DOWNPOUR_AUTH_TOKEN", hide = true, hide_env_values = true)]
    pub auth_token_env: Option<String>,
    /// This node's TLS certificate (PEM); with --tls-key and --tls-ca, every connection is
    /// TLS with mutual authentication, on either transport (framed TCP or gRPC).
    #[arg(long, global = true, env = "DOWNPOUR_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// This node's TLS private key (PEM).
    #[arg(long, global = true, env = "DOWNPOUR_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// The cluster CA certificate (PEM): peers must present certificates it signed.
    #[arg(long, global = true, env = "DOWNPOUR_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Servers do not ask clients for a certificate (TLS without mutual authentication).
    #[arg(long, global = true, env = "DOWNPOUR_TLS_NO_CLIENT_AUTH")]
    pub tls_no_client_auth: bool,
    /// Name to check servers' certificates against (default: the host connected to).
    #[arg(long, global = true, env = "DOWNPOUR_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
    /// Largest frame payload accepted, in MiB.
    #[arg(long, global = true, env = "DOWNPOUR_MAX_MESSAGE_MIB")]
    pub max_message_mib: Option<u64>,
    /// Accepted connections open at once per node, at most.
    #[arg(long, global = true, env = "DOWNPOUR_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// gRPC transport: HTTP/2 window in MiB, what a sender may have in flight unread (and a
    /// receiver that falls behind may buffer per connection); 1..=2047, default 128.
    #[arg(long, global = true, env = "DOWNPOUR_GRPC_WINDOW_MIB")]
    pub grpc_window_mib: Option<u32>,
    /// Shared-memory transport: KiB of each of a connection's two rings in /dev/shm, a power
    /// of two from 256 to 1048576; default 4096 (4 MiB each way: 8 MiB of /dev/shm per
    /// connection, held while it lasts).
    #[arg(long, global = true, env = "DOWNPOUR_SHM_RING_KIB")]
    pub shm_ring_kib: Option<usize>,
    /// Microseconds a read for the next frame polls before it sleeps (framed TCP; gRPC twice
    /// as long), 0..=10000, 0: never. Default 50; `launch` and `bench` hand their children 0
    /// when they start more servers and workers than this machine has cores.
    #[arg(long, global = true, env = "DOWNPOUR_POLL_US")]
    pub poll_us: Option<u64>,
    /// Keys in one request frame, at most (servers).
    #[arg(long, global = true, env = "DOWNPOUR_MAX_KEYS_PER_REQUEST")]
    pub max_keys_per_request: Option<usize>,
    /// Value length of a table, at most (servers).
    #[arg(long, global = true, env = "DOWNPOUR_MAX_VALUE_LEN")]
    pub max_value_len: Option<usize>,
    /// Tables per server, at most.
    #[arg(long, global = true, env = "DOWNPOUR_MAX_TABLES")]
    pub max_tables: Option<usize>,
    /// Memory the tables of one server may hold, in MiB (default: 80 % of the machine's memory).
    #[arg(long, global = true, env = "DOWNPOUR_MEMORY_QUOTA_MIB")]
    pub memory_quota_mib: Option<u64>,
    /// Copies of every key (chain replication, 1..=8). With 2 or more, tables are cut into
    /// shards placed on a consistent-hashing ring, and a failed server is replaced by its
    /// chain's survivors while the job goes on; with 1 (the default) a server failure fails
    /// the job. Replicated tables cannot have filters; replicated `bsp` tables cannot have
    /// backup workers or gradient coding.
    #[arg(long, global = true, env = "DOWNPOUR_REPLICATION")]
    pub replication: Option<usize>,
    /// Ring points per server (replication ≥ 2; default 16): more spread the shards more
    /// evenly (a replicated push is bounded by the busiest server's link), but cut a dense
    /// request into more key ranges, each one acknowledgement down the chain.
    #[arg(long, global = true, env = "DOWNPOUR_VNODES")]
    pub vnodes: Option<u32>,
    /// Fixed shards per table (replication ≥ 2): the unit of placement and of copying.
    #[arg(long, global = true, env = "DOWNPOUR_SHARDS")]
    pub shards: Option<u32>,
    /// Take checkpoints into this directory (every node must reach it: local, or a shared
    /// mount): a consistent snapshot of every table at a clock boundary, `ckpt-N`, written
    /// atomically. Supported by the counter and `train linear` jobs.
    #[arg(long, global = true, env = "DOWNPOUR_CHECKPOINT_DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// How often: N clocks of every worker (`500`), or a time after the last checkpoint
    /// (`30s`, `1.5s`, `800ms`). Default 60s.
    #[arg(long, global = true, env = "DOWNPOUR_CHECKPOINT_EVERY")]
    pub checkpoint_every: Option<String>,
    /// Restart the job from a checkpoint: a `ckpt-N` directory, or a checkpoint directory
    /// (its newest complete checkpoint). Tables start from their checkpointed rows and
    /// workers go on from where they stood; the job needs the same workers count and flags.
    #[arg(long, global = true, env = "DOWNPOUR_RESUME")]
    pub resume: Option<PathBuf>,
    /// Replicated jobs: seconds a lost worker's rank waits for a replacement (the next worker
    /// to register takes it over and goes on from the lost worker's last progress record)
    /// before the job fails; 0 fails the job at once. Default 60. Supported by the counter
    /// and `train linear` jobs.
    #[arg(long, global = true, env = "DOWNPOUR_WORKER_REJOIN_S")]
    pub worker_rejoin_s: Option<f64>,
    /// Replicated jobs: seconds after which a lost worker's rank with no replacement is
    /// handed to a live worker, whose process takes the share over (default 5; 0: never).
    #[arg(long, global = true, env = "DOWNPOUR_REASSIGN_AFTER_S")]
    pub reassign_after_s: Option<f64>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    transport: Option<String>,
    chunk_bytes: Option<usize>,
    request_timeout_s: Option<f64>,
    connect_timeout_s: Option<f64>,
    heartbeat_ms: Option<u64>,
    node_timeout_s: Option<f64>,
    log: Option<String>,
    auth_token_file: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    tls_no_client_auth: Option<bool>,
    tls_server_name: Option<String>,
    max_message_mib: Option<u64>,
    max_connections: Option<usize>,
    grpc_window_mib: Option<u32>,
    shm_ring_kib: Option<usize>,
    poll_us: Option<u64>,
    max_keys_per_request: Option<usize>,
    max_value_len: Option<usize>,
    max_tables: Option<usize>,
    memory_quota_mib: Option<u64>,
    replication: Option<usize>,
    vnodes: Option<u32>,
    shards: Option<u32>,
    checkpoint_dir: Option<PathBuf>,
    checkpoint_every: Option<String>,
    resume: Option<PathBuf>,
    worker_rejoin_s: Option<f64>,
    reassign_after_s: Option<f64>,
}

/// Reads a small text file, refusing one longer than `max` bytes (a path such as /dev/zero
/// must not hang or exhaust memory).
pub fn read_bounded(path: &std::path::Path, max: u64, what: &str) -> Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(path).with_context(|| format!("cannot read the {what} {}", path.display()))?;
    let mut buf = Vec::new();
    f.take(max + 1).read_to_end(&mut buf).with_context(|| format!("cannot read the {what} {}", path.display()))?;
    anyhow::ensure!(buf.len() as u64 <= max, "the {what} {} is longer than {max} bytes", path.display());
    String::from_utf8(buf).with_context(|| format!("the {what} {} is not UTF-8 text", path.display()))
}

/// The settings that the global flags `flags` (as `downpour` takes them, without the
/// program's name), then `DOWNPOUR_*` variables, then a `--config` file give: how a program
/// other than the binary (the Python binding's `connect`) parses its settings at its edge, as
/// the command line would. A bad flag or value is an error naming it.
pub fn settings_from_flags(flags: &[String]) -> Result<Settings> {
    #[derive(clap::Parser)]
    #[command(name = "downpour")]
    struct Flags {
        #[command(flatten)]
        common: CommonArgs,
    }
    let argv = std::iter::once("downpour".to_string()).chain(flags.iter().cloned());
    let f = <Flags as clap::Parser>::try_parse_from(argv).map_err(|e| anyhow::anyhow!("{}", e.render().to_string().trim_end()))?;
    f.common.resolve()
}

fn secs(what: &str, v: f64) -> Result<Duration> {
    anyhow::ensure!(v.is_finite() && v > 0.0 && v < 1e9, "{what} must be a positive number of seconds, got {v}");
    Ok(Duration::from_secs_f64(v))
}

impl CommonArgs {
    /// Merges flags/env, the config file and defaults into [`Settings`].
    pub fn resolve(&self) -> Result<Settings> {
        match &self.config {
            None => self.resolve_with(FileConfig::default()),
            Some(p) => {
                let text = read_bounded(p, 1 << 20, "config file")?;
                self.resolve_text(p, &text)
            }
        }
    }

    /// As [`CommonArgs::resolve`], with the config file's `text` given (read from `name`).
    pub fn resolve_text(&self, name: &std::path::Path, text: &str) -> Result<Settings> {
        let file: FileConfig = toml::from_str(text).with_context(|| format!("config file {} is not valid", name.display()))?;
        self.resolve_with(file)
    }

    fn resolve_with(&self, file: FileConfig) -> Result<Settings> {
        let d = Settings::default();
        let transport = match (&self.transport, &file.transport) {
            (Some(t), _) => *t,
            (None, Some(t)) => t.parse().map_err(anyhow::Error::msg).context("config file: transport")?,
            (None, None) => d.transport,
        };
        let chunk_bytes = self.chunk_bytes.or(file.chunk_bytes).unwrap_or(d.chunk_bytes);
        anyhow::ensure!((4096..=(256 << 20)).contains(&chunk_bytes), "chunk size must be between 4 KiB and 256 MiB, got {chunk_bytes}");
        let heartbeat_ms = self.heartbeat_ms.or(file.heartbeat_ms).unwrap_or(d.heartbeat.as_millis() as u64);
        anyhow::ensure!((10..=60_000).contains(&heartbeat_ms), "heartbeat must be 10..=60000 ms, got {heartbeat_ms}");
        let auth_token_file = self.auth_token_file.clone().or(file.auth_token_file);
        let auth = match (&auth_token_file, &self.auth_token_env) {
            (Some(p), _) => {
                let text = read_bounded(p, 4096, "auth token file")?;
                Some(AuthToken::new(&text).map_err(anyhow::Error::msg).with_context(|| format!("auth token file {}", p.display()))?)
            }
            (None, Some(t)) => Some(AuthToken::new(t).map_err(anyhow::Error::msg).context("DOWNPOUR_AUTH_TOKEN")?),
            (None, None) => None,
        };
        let tls_paths =
            (self.tls_cert.clone().or(file.tls_cert), self.tls_key.clone().or(file.tls_key), self.tls_ca.clone().or(file.tls_ca));
        let tls = match tls_paths {
            (None, None, None) => None,
            (Some(c), Some(k), Some(a)) => {
                let no_client_auth = self.tls_no_client_auth || file.tls_no_client_auth.unwrap_or(false);
                let server_name = self.tls_server_name.clone().or(file.tls_server_name);
                let cfg = TlsConfig::from_files(&c, &k, &a, !no_client_auth, server_name).map_err(anyhow::Error::msg)?;
                Some((cfg, [c, k, a]))
            }
            _ => anyhow::bail!("TLS needs all of --tls-cert, --tls-key and --tls-ca"),
        };
        let max_message_mib = self.max_message_mib.or(file.max_message_mib).unwrap_or(d.max_message_bytes >> 20);
        anyhow::ensure!((1..=4096).contains(&max_message_mib), "--max-message-mib must be 1..=4096, got {max_message_mib}");
        anyhow::ensure!(
            (max_message_mib << 20) as usize >= chunk_bytes,
            "--max-message-mib ({max_message_mib}) is smaller than the chunk size ({chunk_bytes} bytes)"
        );
        let max_connections = self.max_connections.or(file.max_connections).unwrap_or(d.max_connections);
        anyhow::ensure!(max_connections >= 1, "--max-connections must be at least 1");
        let grpc_window_mib = self.grpc_window_mib.or(file.grpc_window_mib).unwrap_or(d.grpc_window >> 20);
        anyhow::ensure!(
            (1..=2047).contains(&grpc_window_mib),
            "--grpc-window-mib must be 1..=2047 (HTTP/2 windows stop below 2 GiB), got {grpc_window_mib}"
        );
        let shm_ring_kib = self.shm_ring_kib.or(file.shm_ring_kib).unwrap_or(d.shm_ring_bytes >> 10);
        anyhow::ensure!(
            shm_ring_kib.is_power_of_two() && (256..=1 << 20).contains(&shm_ring_kib),
            "--shm-ring-kib must be a power of two from 256 to 1048576 (256 KiB to 1 GiB), got {shm_ring_kib}"
        );
        let poll_us = self.poll_us.or(file.poll_us);
        if let Some(p) = poll_us {
            anyhow::ensure!(p <= 10_000, "--poll-us must be 0..=10000 (up to 10 ms; 0: never poll), got {p}");
        }
        let limits = Limits {
            max_keys_per_request: self.max_keys_per_request.or(file.max_keys_per_request).unwrap_or(d.limits.max_keys_per_request),
            max_value_len: self.max_value_len.or(file.max_value_len).unwrap_or(d.limits.max_value_len),
            max_tables: self.max_tables.or(file.max_tables).unwrap_or(d.limits.max_tables),
            memory_quota_bytes: match self.memory_quota_mib.or(file.memory_quota_mib) {
                Some(m) => m.saturating_mul(1 << 20),
                None => d.limits.memory_quota_bytes,
            },
        };
        anyhow::ensure!(
            limits.max_keys_per_request >= 1 && limits.max_value_len >= 1 && limits.max_tables >= 1,
            "limits must be at least 1"
        );
        let replication = self.replication.or(file.replication).unwrap_or(d.replication);
        anyhow::ensure!((1..=8).contains(&replication), "--replication must be 1..=8, got {replication}");
        let vnodes = self.vnodes.or(file.vnodes).unwrap_or(d.vnodes);
        anyhow::ensure!((1..=1024).contains(&vnodes), "--vnodes must be 1..=1024, got {vnodes}");
        let shards = self.shards.or(file.shards).unwrap_or(d.shards);
        anyhow::ensure!((1..=65_536).contains(&shards), "--shards must be 1..=65536, got {shards}");
        let every = match self.checkpoint_every.clone().or(file.checkpoint_every) {
            Some(v) => Some(parse_every(&v)?),
            None => None,
        };
        let checkpoint = match self.checkpoint_dir.clone().or(file.checkpoint_dir) {
            Some(dir) => {
                std::fs::create_dir_all(&dir).with_context(|| format!("cannot create the checkpoint directory {}", dir.display()))?;
                Some(CheckpointConfig { dir, every: every.unwrap_or(CheckpointEvery::Time(Duration::from_secs(60))) })
            }
            None => {
                anyhow::ensure!(every.is_none(), "--checkpoint-every needs --checkpoint-dir");
                None
            }
        };
        let resume = match self.resume.clone().or(file.resume) {
            Some(p) => Some(downpour_core::checkpoint::resolve(&p).with_context(|| format!("--resume {}", p.display()))?),
            None => None,
        };
        let worker_rejoin = match self.worker_rejoin_s.or(file.worker_rejoin_s).unwrap_or(d.worker_rejoin.as_secs_f64()) {
            0.0 => Duration::ZERO,
            v => secs("worker rejoin time", v)?,
        };
        let reassign_after = match self.reassign_after_s.or(file.reassign_after_s).unwrap_or(d.reassign_after.as_secs_f64()) {
            0.0 => Duration::ZERO,
            v => secs("reassign time", v)?,
        };
        Ok(Settings {
            worker_rejoin,
            reassign_after,
            checkpoint,
            resume,
            replication,
            vnodes,
            shards,
            auth,
            auth_token_file,
            tls,
            max_message_bytes: max_message_mib << 20,
            max_connections,
            grpc_window: grpc_window_mib << 20,
            shm_ring_bytes: shm_ring_kib << 10,
            poll: poll_us.map(Duration::from_micros),
            limits,
            transport,
            chunk_bytes,
            request_timeout: secs(
                "request timeout",
                self.request_timeout_s.or(file.request_timeout_s).unwrap_or(d.request_timeout.as_secs_f64()),
            )?,
            connect_timeout: secs(
                "connect timeout",
                self.connect_timeout_s.or(file.connect_timeout_s).unwrap_or(d.connect_timeout.as_secs_f64()),
            )?,
            heartbeat: Duration::from_millis(heartbeat_ms),
            node_timeout: secs("node timeout", self.node_timeout_s.or(file.node_timeout_s).unwrap_or(d.node_timeout.as_secs_f64()))?,
            log: self.log.clone().or(file.log).unwrap_or(d.log),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_and_file_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "transport = \"grpc\"\nchunk_bytes = 65536\nheartbeat_ms = 100\n").unwrap();
        let a = CommonArgs { config: Some(p.clone()), chunk_bytes: Some(8192), ..Default::default() };
        let s = a.resolve().unwrap();
        assert_eq!(s.transport, TransportKind::Grpc);
        assert_eq!(s.chunk_bytes, 8192);
        assert_eq!(s.heartbeat, Duration::from_millis(100));
        assert_eq!(s.request_timeout, Duration::from_secs(60));
        assert_eq!(s.grpc_window, 128 << 20);
        assert_eq!(s.net_config().grpc_window, 128 << 20);
    }

    #[test]
    fn the_grpc_window_comes_from_its_flag_or_file_and_stays_below_two_gib() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "grpc_window_mib = 64\n").unwrap();
        let s = CommonArgs { config: Some(p.clone()), ..Default::default() }.resolve().unwrap();
        assert_eq!(s.net_config().grpc_window, 64 << 20);
        let s = CommonArgs { config: Some(p), grpc_window_mib: Some(512), ..Default::default() }.resolve().unwrap();
        assert_eq!(s.net_config().grpc_window, 512 << 20);
        for bad in [0, 2048] {
            let e = CommonArgs { grpc_window_mib: Some(bad), ..Default::default() }.resolve().unwrap_err().to_string();
            assert!(e.contains("--grpc-window-mib") && e.contains(&bad.to_string()), "{e}");
        }
    }

    #[test]
    fn the_shm_ring_comes_from_its_flag_or_file_and_must_be_a_power_of_two() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "transport = \"shm\"\nshm_ring_kib = 1024\n").unwrap();
        let s = CommonArgs { config: Some(p.clone()), ..Default::default() }.resolve().unwrap();
        assert_eq!((s.transport, s.net_config().shm_ring_bytes), (TransportKind::Shm, 1 << 20));
        let s = CommonArgs { config: Some(p), shm_ring_kib: Some(512), ..Default::default() }.resolve().unwrap();
        assert_eq!(s.net_config().shm_ring_bytes, 512 << 10);
        assert_eq!(CommonArgs::default().resolve().unwrap().shm_ring_bytes, downpour_transport::shm::DEFAULT_RING_BYTES);
        for bad in [0, 4, 128, 300, 2 << 20] {
            let e = CommonArgs { shm_ring_kib: Some(bad), ..Default::default() }.resolve().unwrap_err().to_string();
            assert!(e.contains("--shm-ring-kib") && e.contains(&bad.to_string()), "{e}");
        }
    }

    #[test]
    fn the_poll_comes_from_its_flag_or_file_and_is_at_most_10_ms() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "poll_us = 0\n").unwrap();
        let s = CommonArgs { config: Some(p.clone()), ..Default::default() }.resolve().unwrap();
        assert_eq!((s.poll, s.net_config().poll), (Some(Duration::ZERO), Duration::ZERO));
        let s = CommonArgs { config: Some(p), poll_us: Some(80), ..Default::default() }.resolve().unwrap();
        assert_eq!(s.net_config().poll, Duration::from_micros(80));
        // not given: the default, which a launcher may still turn off for its children
        let s = CommonArgs::default().resolve().unwrap();
        assert_eq!((s.poll, s.net_config().poll), (None, downpour_transport::DEFAULT_POLL));
        assert!(!s.to_child_args().iter().any(|a| a == "--poll-us"));
        let e = CommonArgs { poll_us: Some(10_001), ..Default::default() }.resolve().unwrap_err().to_string();
        assert!(e.contains("--poll-us") && e.contains("10001"), "{e}");
    }

    #[test]
    fn the_flags_a_launcher_hands_its_children_give_back_the_same_settings() {
        let dir = tempfile::tempdir().unwrap();
        let s = Settings {
            transport: TransportKind::Grpc,
            chunk_bytes: 1 << 16,
            grpc_window: 32 << 20,
            shm_ring_bytes: 256 << 10,
            poll: Some(Duration::from_micros(120)),
            request_timeout: Duration::from_millis(2500),
            replication: 2,
            vnodes: 4,
            worker_rejoin: Duration::from_secs(7),
            checkpoint: Some(CheckpointConfig { dir: dir.path().to_path_buf(), every: CheckpointEvery::Clocks(3) }),
            log: "warn".into(),
            // flags carry the quota in MiB
            limits: Limits { memory_quota_bytes: 3 << 30, ..Limits::default() },
            ..Settings::default()
        };
        let back = settings_from_flags(&s.to_child_args()).unwrap();
        assert_eq!(format!("{back:?}"), format!("{s:?}"));
        let e = settings_from_flags(&["--replication".into(), "two".into()]).unwrap_err().to_string();
        assert!(e.contains("--replication") && e.contains("two"), "{e}");
    }

    #[test]
    fn bad_config_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "chunk_bytez = 1\n").unwrap();
        let e = CommonArgs { config: Some(p.clone()), ..Default::default() }.resolve().unwrap_err();
        assert!(format!("{e:#}").contains("c.toml"), "{e:#}");
        let e = CommonArgs { chunk_bytes: Some(1), ..Default::default() }.resolve().unwrap_err();
        assert!(e.to_string().contains("chunk size"), "{e}");
    }
}
