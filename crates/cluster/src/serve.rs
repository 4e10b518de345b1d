//! `downpour serve`: a read-only serving node for an export directory. It loads the newest
//! model (the newest full export and the deltas after it), answers pulls over the same
//! wire protocol as a training server (any [`downpour_worker::KvClient`] reads it, see
//! [`connect`]), refuses writes, and follows the directory: new deltas are folded in as
//! they land, a new full export replaces the tables. Pulls are answered throughout.

use anyhow::{Context, Result};
use downpour_core::proto;
use downpour_jobs::export::{dir, Entry, Kind};
use downpour_server::serving::{apply_delta, install_table, serving_def};
use downpour_server::{Server, ServerConfig, ServerHandle, ServerState};
use downpour_transport::Transport;
use downpour_worker::{KvClient, KvConfig};
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The node id a serving node answers as.
pub const SERVING_NODE: u32 = 1;

/// Settings of a serving node.
#[derive(Clone)]
pub struct ServeConfig {
    /// The export directory to serve (`train linear --export-dir`, [`downpour_jobs::export`]).
    pub model: PathBuf,
    /// Address to listen on (`host:0` picks a free port).
    pub listen: String,
    /// How often to look for new exports in the directory.
    pub follow_every: Duration,
    /// Where to serve Prometheus metrics (`None`: nowhere).
    pub metrics_listen: Option<String>,
    /// Server limits and settings (`read_only` is set whatever it says).
    pub server: ServerConfig,
}

impl ServeConfig {
    /// Serves `model` on `listen`, looking for new exports every second.
    pub fn new(model: impl Into<PathBuf>, listen: impl Into<String>) -> ServeConfig {
        ServeConfig {
            model: model.into(),
            listen: listen.into(),
            follow_every: Duration::from_secs(1),
            metrics_listen: None,
            server: ServerConfig::default(),
        }
    }
}

/// What a serving node has loaded.
#[derive(Clone, Debug, Default)]
pub struct Served {
    /// The full export the tables were built from.
    pub base: String,
    /// The exports applied, the base included.
    pub applied: Vec<Entry>,
    /// Exports loaded since the start (a full one replacing the tables counts).
    pub loads: u64,
    /// The last error following the directory (cleared by the next load that works).
    pub error: Option<String>,
}

impl Served {
    /// The cut of the newest export applied (ms since the UNIX epoch; 0 before any).
    pub fn cut_ms(&self) -> u64 {
        self.applied.last().map_or(0, |e| e.cut_ms)
    }
}

/// A running serving node.
pub struct Serving {
    handle: Option<ServerHandle>,
    state: Arc<ServerState>,
    addr: String,
    served: Arc<Mutex<Served>>,
    stop: Arc<AtomicBool>,
    follower: Option<std::thread::JoinHandle<()>>,
}

impl Serving {
    /// The address clients connect to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// What is loaded now.
    pub fn served(&self) -> Served {
        self.served.lock().clone()
    }

    /// The server's shared state (metrics, tables).
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// Looks at the directory now and loads what is new (the follower does so every
    /// `follow_every`). Returns how many exports were applied.
    pub fn refresh(&self, model: &Path) -> Result<usize> {
        refresh(&self.state, model, &self.served)
    }

    /// Stops following and serving.
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(f) = self.follower.take() {
            let _ = f.join();
        }
        if let Some(h) = self.handle.take() {
            h.shutdown();
        }
    }

    /// Serves until the process is stopped.
    pub fn wait(mut self) {
        if let Some(f) = self.follower.take() {
            let _ = f.join();
        }
    }
}

/// Starts a serving node: loads the newest model of `cfg.model` (which must hold a full
/// export), listens, and follows the directory on a thread of its own.
pub fn serve(transport: &dyn Transport, cfg: ServeConfig) -> Result<Serving> {
    let server_cfg = ServerConfig { read_only: true, ..cfg.server.clone() };
    let server = Server::bind(transport, &cfg.listen, server_cfg).with_context(|| format!("cannot listen on {}", cfg.listen))?;
    let state = server.state().clone();
    state.set_placement(SERVING_NODE, 0, 1, 0, 1);
    let served = Arc::new(Mutex::new(Served::default()));
    refresh(&state, &cfg.model, &served)?;
    if served.lock().applied.is_empty() {
        anyhow::bail!("{}: no full export yet to serve", cfg.model.display());
    }
    if let Some(listen) = &cfg.metrics_listen {
        let at = downpour_server::serve_metrics(listen, state.clone()).with_context(|| format!("--metrics-listen {listen}"))?;
        tracing::info!("metrics on http://{at}/metrics (health: /healthz)");
    }
    let addr = server.addr();
    let handle = server.spawn().context("cannot start the server thread")?;
    let stop = Arc::new(AtomicBool::new(false));
    let follower = {
        let (state, served, stop, model, every) = (state.clone(), served.clone(), stop.clone(), cfg.model.clone(), cfg.follow_every);
        std::thread::Builder::new()
            .name("serve-follow".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let until = Instant::now() + every;
                    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(20).min(every));
                    }
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if let Err(e) = refresh(&state, &model, &served) {
                        let msg = format!("{e:#}");
                        let mut s = served.lock();
                        if s.error.as_deref() != Some(msg.as_str()) {
                            tracing::warn!("serve: {msg}; serving the model at cut {} until the next export loads", s.cut_ms());
                        }
                        s.error = Some(msg);
                    }
                }
            })
            .context("cannot start the follower thread")?
    };
    Ok(Serving { handle: Some(handle), state, addr, served, stop, follower: Some(follower) })
}

/// Loads what `model`'s manifest holds beyond what `served` says is loaded.
fn refresh(state: &ServerState, model: &Path, served: &Mutex<Served>) -> Result<usize> {
    let Some(m) = dir::read_manifest(model)? else {
        anyhow::bail!("{} holds no {}: not an export directory", model.display(), dir::MANIFEST)
    };
    let chain = m.chain();
    let Some(base) = chain.first() else { return Ok(0) };
    let (same_base, done) = {
        let s = served.lock();
        (s.base == base.file, s.applied.len())
    };
    let mut n = 0;
    let todo: &[Entry] = if same_base { chain.get(done..).unwrap_or(&[]) } else { chain };
    for e in todo {
        let started = Instant::now();
        let f = dir::read_entry(model, e)?;
        for t in &f.tables {
            let mut def = serving_def(t.meta.id, &t.meta.name, t.meta.value_len);
            // a key the model lacks reads as the table's initial value, as in training
            if let Some(init) = &t.meta.init {
                def.init = init.parse().with_context(|| format!("table {} of {}: its initializer", t.meta.id, e.file))?;
            }
            match f.kind {
                Kind::Full => install_table(state, def, &t.rows.keys, &t.rows.values)?,
                Kind::Delta => apply_delta(state, t.meta.id, &t.evicted, &t.rows.keys, &t.rows.values)?,
            }
        }
        let mut s = served.lock();
        if e.kind == Kind::Full {
            s.base = e.file.clone();
            s.applied.clear();
        }
        s.applied.push(e.clone());
        s.loads += 1;
        s.error = None;
        n += 1;
        tracing::info!(
            "serve: loaded {} ({} rows, {} evicted) in {:.1} ms; model at cut {} ({:.1} s ago)",
            e.file,
            f.rows(),
            f.evicted(),
            started.elapsed().as_secs_f64() * 1e3,
            e.cut_ms,
            downpour_core::changes::wall_ms().saturating_sub(e.cut_ms) as f64 / 1e3
        );
    }
    Ok(n)
}

/// A client of serving node `addr` (any [`KvClient`] call that reads: pulls, peeks, range
/// pulls). Declare each table it reads with [`KvClient::use_table`] (or `create_table`,
/// which the node accepts for a table it holds identically):
/// `downpour_server::serving::serving_def(id, name, value_len)`.
pub fn connect(transport: &dyn Transport, addr: &str, cfg: KvConfig) -> Result<KvClient> {
    let routing = proto::Routing {
        epoch: 1,
        servers: vec![proto::ServerEntry { node_id: SERVING_NODE, addr: addr.to_string(), ..Default::default() }],
        active: true,
        ..Default::default()
    };
    KvClient::connect(transport, &routing, 1_000_000 + std::process::id(), cfg)
        .with_context(|| format!("cannot connect to the serving node at {addr}"))
}
