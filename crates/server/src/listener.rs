//! A server bound to its listener ([`Server`]) and the running server ([`ServerHandle`]):
//! the accept loop, one thread per connection.

use crate::config::ServerConfig;
use crate::conn::serve_connection;
use crate::evict::run_evictor;
use crate::state::ServerState;
use downpour_transport::{Listener, Transport, TransportError};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A server bound to its listener, not yet serving.
pub struct Server {
    state: Arc<ServerState>,
    listener: Box<dyn Listener>,
}

/// A running server.
pub struct ServerHandle {
    /// The server's shared state.
    pub state: Arc<ServerState>,
    /// Its data-plane address.
    pub addr: String,
    thread: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// Stops accepting and waits for the accept loop to end (open connections end when
    /// their peers close them).
    pub fn shutdown(mut self) {
        self.state.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Server {
    /// Listens on `addr` with `transport`. Fails with a clear message when the address is in use.
    pub fn bind(transport: &dyn Transport, addr: &str, cfg: ServerConfig) -> Result<Server, TransportError> {
        let listener = transport.listen(addr)?;
        let state = Arc::new(ServerState {
            cfg,
            node_id: AtomicU32::new(0),
            rank: AtomicU32::new(0),
            num_servers: AtomicU32::new(1),
            num_workers: AtomicU32::new(1),
            epoch: AtomicU64::new(0),
            tables: RwLock::new(HashMap::new()),
            stop: AtomicBool::new(false),
            used_bytes: AtomicU64::new(0),
            peak_used_bytes: AtomicU64::new(0),
            repl: RwLock::new(None),
            holders: std::sync::OnceLock::new(),
            evict_wake: parking_lot::Condvar::new(),
            latency: Default::default(),
        });
        Ok(Server { state, listener })
    }

    /// The address peers connect to.
    pub fn addr(&self) -> String {
        self.listener.local_addr()
    }

    /// The shared state (to set the placement before serving).
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// Serves on a background thread.
    pub fn spawn(self) -> std::io::Result<ServerHandle> {
        let addr = self.addr();
        let state = self.state.clone();
        let thread = std::thread::Builder::new().name("server-accept".into()).spawn(move || self.serve())?;
        Ok(ServerHandle { state, addr, thread: Some(thread) })
    }

    /// Accepts connections until stopped, serving each on its own thread; meanwhile a thread
    /// of its own drops rows of the tables with an eviction policy.
    pub fn serve(mut self) {
        let evicting = self.state.clone();
        // (not joined: it ends within a tick of the server's stop)
        let evictor = std::thread::Builder::new().name("server-evict".into()).spawn(move || run_evictor(evicting));
        if let Err(e) = evictor {
            tracing::error!("cannot start the eviction thread (tables with an eviction policy will keep every row): {e}");
        }
        while !self.state.stop.load(Ordering::Relaxed) {
            match self.listener.accept(Duration::from_millis(50)) {
                Ok(Some(conn)) => {
                    let st = self.state.clone();
                    let spawned = std::thread::Builder::new().name("server-conn".into()).spawn(move || serve_connection(&st, conn));
                    if let Err(e) = spawned {
                        tracing::error!("cannot start a connection thread: {e}");
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!("server listener failed: {e}");
                    break;
                }
            }
        }
    }
}
