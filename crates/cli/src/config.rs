//! Configuration, parsed once at the edge: command-line flags, then `DOWNPOUR_*`
//! environment variables (clap reads both), then a TOML file (`--config`), then defaults.
//! The result is a typed [`Settings`] passed down; nothing below reads the environment.

use anyhow::{Context, Result};
use clap::Args;
use downpour_transport::TransportKind;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// Flags shared by every command.
#[derive(Args, Debug, Clone, Default)]
pub struct CommonArgs {
    /// TOML configuration file (keys as in `docs/configuration` of the README).
    #[arg(long, global = true, env = "DOWNPOUR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Network transport between nodes: tcp (framed TCP, fastest) or grpc.
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
}

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
}

fn secs(what: &str, v: f64) -> Result<Duration> {
    anyhow::ensure!(v.is_finite() && v > 0.0 && v < 1e9, "{what} must be a positive number of seconds, got {v}");
    Ok(Duration::from_secs_f64(v))
}

impl CommonArgs {
    /// Merges flags/env, the config file and defaults into [`Settings`].
    pub fn resolve(&self) -> Result<Settings> {
        let file = match &self.config {
            None => FileConfig::default(),
            Some(p) => {
                let text = std::fs::read_to_string(p).with_context(|| format!("cannot read config file {}", p.display()))?;
                toml::from_str(&text).with_context(|| format!("config file {} is not valid", p.display()))?
            }
        };
        let transport = match (&self.transport, &file.transport) {
            (Some(t), _) => *t,
            (None, Some(t)) => t.parse().map_err(anyhow::Error::msg).context("config file: transport")?,
            (None, None) => TransportKind::Tcp,
        };
        let chunk_bytes = self.chunk_bytes.or(file.chunk_bytes).unwrap_or(2 << 20);
        anyhow::ensure!((4096..=(256 << 20)).contains(&chunk_bytes), "chunk size must be between 4 KiB and 256 MiB, got {chunk_bytes}");
        let heartbeat_ms = self.heartbeat_ms.or(file.heartbeat_ms).unwrap_or(500);
        anyhow::ensure!((10..=60_000).contains(&heartbeat_ms), "heartbeat must be 10..=60000 ms, got {heartbeat_ms}");
        Ok(Settings {
            transport,
            chunk_bytes,
            request_timeout: secs("request timeout", self.request_timeout_s.or(file.request_timeout_s).unwrap_or(60.0))?,
            connect_timeout: secs("connect timeout", self.connect_timeout_s.or(file.connect_timeout_s).unwrap_or(10.0))?,
            heartbeat: Duration::from_millis(heartbeat_ms),
            node_timeout: secs("node timeout", self.node_timeout_s.or(file.node_timeout_s).unwrap_or(10.0))?,
            log: self.log.clone().or(file.log).unwrap_or_else(|| "info".into()),
        })
    }

    /// The flags to hand to child processes so they resolve the same settings.
    pub fn to_child_args(&self, s: &Settings) -> Vec<String> {
        let t = match s.transport {
            TransportKind::Tcp => "tcp",
            TransportKind::Grpc => "grpc",
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
            "--log".into(),
            s.log.clone(),
        ]
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
