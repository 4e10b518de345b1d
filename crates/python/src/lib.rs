//! The Python binding: module `downpour._downpour`, wrapped by the `downpour` package
//! (`python/downpour/`). It drives the same library as the Rust jobs: an embedded cluster
//! ([`downpour_cluster::EmbeddedCluster`]) or a launched one joined over the network
//! ([`downpour_worker::join_job`]), and a worker session's tables.
//!
//! Keys are `numpy.uint64` arrays and values `numpy.float32` arrays (any shape, C-contiguous,
//! `len(keys) * value_len` values): they are read and filled in place, without copies. The
//! GIL is released while a call waits on the cluster, so Python threads can drive several
//! workers of an embedded cluster. Every error is a [`DownpourError`] with the message of its
//! cause (a refused request, an unknown table, a lost cluster).

use downpour_cluster::nodes::session_config;
use downpour_cluster::{EmbeddedCluster, Settings};
use downpour_core::consistency::Consistency;
use downpour_core::init::Init;
use downpour_core::keys::KeyRange;
use downpour_core::proto;
use downpour_core::table::{Storage, TableDef};
use downpour_transport::security::AuthToken;
use downpour_transport::{network_transport, TransportKind};
use downpour_worker::{join_job, Timestamp, WorkerSession};
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArray1, PyReadonlyArrayDyn, PyReadwriteArrayDyn};
use parking_lot::Mutex;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::fmt::Display;
use std::sync::Arc;

// The binary's allocator (crates/cli/src/main.rs): Rust's own allocations in this module
// (message buffers, arrays handed to NumPy with their drop) go through it; NumPy's and
// Python's memory stays with Python's allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

create_exception!(
    _downpour,
    DownpourError,
    PyException,
    "An error from Downpour: a bad argument, a request the cluster refused, a lost cluster."
);

fn err(e: impl Display) -> PyErr {
    DownpourError::new_err(e.to_string())
}

fn anyhow_err(e: anyhow::Error) -> PyErr {
    DownpourError::new_err(format!("{e:#}"))
}

/// A coordinator and servers running inside this process (threads over the in-process
/// transport), waiting for `workers` workers to `join`.
#[pyclass(module = "downpour._downpour")]
struct Cluster {
    /// Shared with the `join` calls in progress (one per worker thread).
    inner: Mutex<Option<Arc<EmbeddedCluster>>>,
    #[pyo3(get)]
    servers: usize,
    #[pyo3(get)]
    workers: usize,
}

/// Starts an embedded cluster of `servers` servers for a job of `workers` workers
/// (`replication` copies of every row: up to `replication - 1` servers may fail).
#[pyfunction]
#[pyo3(signature = (servers = 2, workers = 1, replication = 1))]
fn embedded(py: Python<'_>, servers: usize, workers: usize, replication: usize) -> PyResult<Cluster> {
    if replication < 1 || replication > servers.max(1) {
        return Err(err(format!("replication {replication} needs between 1 and {servers} servers")));
    }
    let s = Settings { replication, ..Settings::default() };
    let cluster = py.detach(|| EmbeddedCluster::start(&s, servers, workers)).map_err(anyhow_err)?;
    Ok(Cluster { inner: Mutex::new(Some(Arc::new(cluster))), servers, workers })
}

#[pymethods]
impl Cluster {
    /// Joins the job as its next worker; returns once every worker joined (so, with several
    /// workers, call it from one thread each).
    fn join(&self, py: Python<'_>) -> PyResult<Session> {
        let cluster = self.inner.lock().clone().ok_or_else(|| err("the cluster was closed"))?;
        let session = py.detach(|| cluster.join()).map_err(anyhow_err)?;
        Ok(Session::new(session))
    }

    /// Waits until every worker finished (`Session.finish`) and the cluster stopped.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        let shared = self.inner.lock().take().ok_or_else(|| err("the cluster was closed"))?;
        let cluster = match Arc::try_unwrap(shared) {
            Ok(c) => c,
            Err(shared) => {
                *self.inner.lock() = Some(shared);
                return Err(err("a join is still in progress"));
            }
        };
        py.detach(|| cluster.wait()).map_err(anyhow_err)
    }
}

/// Joins a running cluster (started with `downpour launch`, or a coordinator and servers of
/// your own) at `coordinator` (`host:port`) as its next worker. `flags` are the command
/// line's global flags (`["--replication", "2", "--transport", "grpc"]`; `DOWNPOUR_*`
/// variables fill what they leave out, as for the binary); `token` (the cluster's shared
/// secret) and `transport` (`tcp`, `grpc` or `shm`) override them.
#[pyfunction]
#[pyo3(signature = (coordinator, token = None, transport = None, flags = Vec::new()))]
fn connect(py: Python<'_>, coordinator: &str, token: Option<&str>, transport: Option<&str>, flags: Vec<String>) -> PyResult<Session> {
    let mut s = downpour::settings_from_flags(&flags).map_err(anyhow_err)?;
    match transport {
        None => {}
        Some("tcp") => s.transport = TransportKind::Tcp,
        Some("grpc") => s.transport = TransportKind::Grpc,
        Some("shm") => s.transport = TransportKind::Shm,
        Some(t) => return Err(err(format!("transport {t:?} is not tcp, grpc or shm"))),
    }
    if let Some(t) = token {
        s.auth = Some(AuthToken::new(t).map_err(err)?);
    }
    let session = py
        .detach(|| -> anyhow::Result<WorkerSession> {
            let t = network_transport(s.transport, s.net_config())?;
            let cfg = session_config(&s, coordinator)?;
            Ok(join_job(t, &cfg)?)
        })
        .map_err(anyhow_err)?;
    Ok(Session::new(session))
}

/// One worker of a job: its rank, its tables, barriers and clocks.
#[pyclass(module = "downpour._downpour")]
struct Session {
    inner: Arc<Mutex<WorkerSession>>,
    /// The export directories this session exports into ([`Session::export`]), by path.
    exporters: Arc<Mutex<std::collections::HashMap<std::path::PathBuf, downpour_jobs::export::Exporter>>>,
    #[pyo3(get)]
    rank: usize,
    #[pyo3(get)]
    num_workers: usize,
}

impl Session {
    fn new(s: WorkerSession) -> Session {
        let (rank, num_workers) = (s.rank, s.num_workers);
        Session { inner: Arc::new(Mutex::new(s)), exporters: Default::default(), rank, num_workers }
    }
}

fn parse_init(init: &str, std: f32, seed: u64) -> PyResult<Init> {
    match init {
        "zeros" => Ok(Init::Zeros),
        "normal" => Ok(Init::Normal { mean: 0.0, std, seed }),
        "uniform" => Ok(Init::Uniform { lo: -std, hi: std, seed }),
        i => Err(err(format!("init {i:?} is not zeros, normal or uniform"))),
    }
}

#[pymethods]
impl Session {
    /// Creates table `id` (or checks that it exists with the same definition) and returns it.
    /// `dense` gives a dense table of keys `0..dense` (else sparse: any u64 key);
    /// `init` is `zeros`, `normal` (standard deviation `init_std`) or `uniform` (in
    /// `[-init_std, init_std)`), seeded by `seed`; `rule` is the servers' update rule
    /// (`add`, `assign`, `sgd`, `momentum`, `adagrad`, `adam`, `ftrl`) with its
    /// hyper-parameters; `consistency` is `async`, `ssp:TAU` or `bsp`; `filters` as for
    /// `train linear --filters` (e.g. `f16,lz4`); `bsp` tables combine a round's pushes by
    /// `aggregate` (`none`: each applied in turn, `sum`, `avg`: the rule applied once to
    /// their sum or mean, `coded:frac|cyclic:S:SEED`) and close a round once all but
    /// `backup_workers` workers completed it. `admit` (sparse tables) is when a pushed key
    /// gets a row, as for `train linear --admit`: `always`, `count:N[:MIB]`, `probability:P`.
    /// `evict` (sparse tables) is which rows the servers drop, as for `train linear --evict`:
    /// `never`, `ttl:DURATION`, `lru:MAX_ROWS`, `lfu:MAX_ROWS`, `memory:MIB`. `changes` has
    /// the servers track which rows change and which are evicted, for incremental export
    /// ([`Session::export`], `downpour export`; 4 bytes more per row).
    #[pyo3(signature = (id, name, value_len = 1, dense = None, init = "zeros", init_std = 0.01, seed = 1, rule = "add", lr = 0.01,
        momentum = 0.9, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, l1 = 0.0, l2 = 0.0, ftrl_beta = 1.0, consistency = "async", filters = "none",
        aggregate = "none", backup_workers = 0, admit = "always", evict = "never", changes = false))]
    #[allow(clippy::too_many_arguments)]
    fn table(
        &self,
        py: Python<'_>,
        id: u32,
        name: &str,
        value_len: usize,
        dense: Option<u64>,
        init: &str,
        init_std: f32,
        seed: u64,
        rule: &str,
        lr: f32,
        momentum: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        l1: f32,
        l2: f32,
        ftrl_beta: f32,
        consistency: &str,
        filters: &str,
        aggregate: &str,
        backup_workers: u32,
        admit: &str,
        evict: &str,
        changes: bool,
    ) -> PyResult<Table> {
        if value_len == 0 {
            return Err(err("value_len must be at least 1"));
        }
        let def = TableDef {
            value_len,
            storage: match dense {
                Some(n) => Storage::Dense(KeyRange::new(0, n)),
                None => Storage::Sparse,
            },
            init: parse_init(init, init_std, seed)?,
            rule: proto::Rule { name: rule.into(), lr, momentum, beta1, beta2, eps, l1, l2, ftrl_beta },
            consistency: consistency.parse::<Consistency>().map_err(err)?,
            filters: filters.parse().map_err(err)?,
            aggregate: aggregate.parse().map_err(err)?,
            backup_workers,
            admit: admit.parse().map_err(err)?,
            evict: evict.parse().map_err(err)?,
            changes,
            ..TableDef::new(id, name)
        };
        let inner = self.inner.clone();
        py.detach(|| inner.lock().kv.create_table(def)).map_err(err)?;
        Ok(Table { session: self.inner.clone(), id, value_len })
    }

    /// Takes the next export of `tables` (ids of tables this session created with
    /// `changes=True`) into export directory `dir`: a full export the first time (in this
    /// process), then a delta of the rows written and keys evicted since the one before, as
    /// `train linear --export-dir` does; `downpour serve --model DIR` follows the directory
    /// and `downpour export merge DIR --out F` folds it into one file. Returns the export's
    /// manifest entry as a dict (`file`, `kind`, `rows`, `evicted`, `bytes`, `seconds`,
    /// `since_ms`, `cut_ms`). A delta starts `skew_ms` before the previous export's cut (for
    /// servers whose clocks run behind; rows written in that margin are exported twice),
    /// as set by the first call for `dir`.
    #[pyo3(signature = (dir, tables, skew_ms = 1000))]
    fn export<'py>(&self, py: Python<'py>, dir: &str, tables: Vec<u32>, skew_ms: u64) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let (inner, exporters) = (self.inner.clone(), self.exporters.clone());
        let path = std::path::PathBuf::from(dir);
        let e = py
            .detach(|| -> anyhow::Result<downpour_jobs::export::Entry> {
                let mut s = inner.lock();
                let mut all = exporters.lock();
                if !all.contains_key(&path) {
                    let defs = tables
                        .iter()
                        .map(|id| s.kv.table(*id).cloned().ok_or_else(|| anyhow::anyhow!("table {id} is not one of this session's tables")))
                        .collect::<anyhow::Result<Vec<_>>>()?;
                    let cfg = downpour_jobs::export::ExportConfig {
                        skew: std::time::Duration::from_millis(skew_ms),
                        ..downpour_jobs::export::ExportConfig::new(&path, std::time::Duration::ZERO)
                    };
                    all.insert(path.clone(), downpour_jobs::export::Exporter::open(cfg, &defs)?);
                }
                let x = all.get_mut(&path).ok_or_else(|| anyhow::anyhow!("no exporter"))?;
                let ids: Vec<u32> = x.manifest().tables.iter().map(|t| t.id).collect();
                anyhow::ensure!(ids == tables, "{dir} exports tables {ids:?}, not {tables:?}");
                x.export(&mut s.kv)
            })
            .map_err(|e| err(format!("{e:#}")))?;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("file", &e.file)?;
        d.set_item("kind", if e.kind == downpour_jobs::export::Kind::Full { "full" } else { "delta" })?;
        d.set_item("rows", e.rows)?;
        d.set_item("evicted", e.evicted)?;
        d.set_item("bytes", e.bytes)?;
        d.set_item("seconds", e.seconds)?;
        d.set_item("since_ms", e.since_ms)?;
        d.set_item("cut_ms", e.cut_ms)?;
        Ok(d)
    }

    /// Waits until every worker reached the barrier `name`.
    fn barrier(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(|| inner.lock().barrier(name)).map_err(err)
    }

    /// Ends this worker's clock tick (for `bsp` and `ssp` tables); returns the new clock.
    fn clock(&self, py: Python<'_>) -> PyResult<u64> {
        let inner = self.inner.clone();
        py.detach(|| inner.lock().kv.clock()).map_err(err)
    }

    /// Clocks this worker completed since the job's start (a resumed job counts on from its
    /// checkpoint's clock).
    #[getter]
    fn job_clock(&self) -> u64 {
        self.inner.lock().job_clock()
    }

    /// The state this worker recorded at the checkpoint the job resumed from (`--resume`),
    /// or that the lost worker it replaces last recorded; `None` on a fresh start.
    #[getter]
    fn resumed(&self) -> Option<String> {
        self.inner.lock().resumed().map(|r| r.state.clone())
    }

    /// Whether checkpoints are taken (the cluster's `--checkpoint-dir`).
    #[getter]
    fn checkpointing(&self) -> bool {
        self.inner.lock().checkpointing()
    }

    /// A checkpoint point: call it right after each `clock` with the job's state at that
    /// clock (a string, e.g. JSON: what the script needs to go on after `--resume`). When a
    /// checkpoint is due (the cluster's `--checkpoint-every`) it waits for this worker's
    /// pushes, joins every other worker and returns once the checkpoint is written: `True`.
    /// Every worker must call it after its clocks, and `retire` once it takes no more.
    fn checkpoint_point(&self, py: Python<'_>, state: String) -> PyResult<bool> {
        let inner = self.inner.clone();
        py.detach(|| inner.lock().checkpoint_point(|| state)).map_err(err)
    }

    /// Tells the job this worker takes no more clocks (its share is done), with its final
    /// state: checkpoints stop waiting for it. Call before the closing barriers.
    fn retire(&self, py: Python<'_>, state: String) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(|| inner.lock().retire_from_checkpoints(|| state)).map_err(err)
    }

    /// Leaves the job: `ok = False` fails it with `message`. A worker must finish for the
    /// job (and an embedded cluster's `wait`) to end.
    #[pyo3(signature = (ok = true, message = ""))]
    fn finish(&self, py: Python<'_>, ok: bool, message: &str) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(|| inner.lock().finish(ok, message)).map_err(err)
    }
}

/// A table of the job, as seen by one worker.
#[pyclass(module = "downpour._downpour")]
struct Table {
    session: Arc<Mutex<WorkerSession>>,
    #[pyo3(get)]
    id: u32,
    #[pyo3(get)]
    value_len: usize,
}

fn keys_slice<'a>(keys: &'a PyReadonlyArray1<'_, u64>) -> PyResult<&'a [u64]> {
    keys.as_slice().map_err(|_| err("keys must be a contiguous numpy.uint64 array"))
}

impl Table {
    /// `pull` (or, with `peek`, `peek`) into `out` or a new `(len(keys), value_len)` array.
    fn read<'py>(
        &self,
        py: Python<'py>,
        keys: PyReadonlyArray1<'py, u64>,
        out: Option<Bound<'py, PyArrayDyn<f32>>>,
        peek: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let k = keys_slice(&keys)?;
        let out = match out {
            Some(o) => o,
            None => PyArrayDyn::zeros(py, vec![k.len(), self.value_len], false),
        };
        {
            let mut w: PyReadwriteArrayDyn<'_, f32> = out.try_readwrite().map_err(|e| err(format!("out: {e}")))?;
            let o = w.as_slice_mut().map_err(|_| err("out must be a contiguous numpy.float32 array"))?;
            self.check(k.len(), o.len())?;
            let (s, id) = (self.session.clone(), self.id);
            py.detach(|| {
                let mut s = s.lock();
                if peek {
                    s.kv.peek_into(id, k, o)
                } else {
                    s.kv.pull_into(id, k, o)
                }
            })
            .map_err(err)?;
        }
        Ok(out.into_any())
    }

    fn check(&self, keys: usize, values: usize) -> PyResult<()> {
        if keys * self.value_len != values {
            return Err(err(format!("{values} values for {keys} keys of {} values each", self.value_len)));
        }
        Ok(())
    }
}

/// A request in flight (`Table.push_async`).
#[pyclass(module = "downpour._downpour")]
struct Handle {
    session: Arc<Mutex<WorkerSession>>,
    ts: Option<Timestamp>,
}

#[pymethods]
impl Handle {
    /// Waits until the servers acknowledged the request (once; later calls return at once).
    fn wait(&mut self, py: Python<'_>) -> PyResult<()> {
        match self.ts.take() {
            Some(ts) => {
                let s = self.session.clone();
                py.detach(|| s.lock().kv.wait(ts)).map_err(err)
            }
            None => Ok(()),
        }
    }
}

/// A pull in flight (`Table.pull_async`).
#[pyclass(module = "downpour._downpour")]
struct PullHandle {
    session: Arc<Mutex<WorkerSession>>,
    ts: Option<Timestamp>,
    rows: usize,
    value_len: usize,
}

#[pymethods]
impl PullHandle {
    /// Waits for the values: copied into `out` (float32, C-contiguous, `len(keys) *
    /// value_len` values) if given, else returned as a new `(len(keys), value_len)` array
    /// that takes the received buffer over without a copy. Once only.
    #[pyo3(signature = (out = None))]
    fn wait<'py>(&mut self, py: Python<'py>, out: Option<Bound<'py, PyArrayDyn<f32>>>) -> PyResult<Bound<'py, PyAny>> {
        let ts = self.ts.take().ok_or_else(|| err("this pull was already waited for"))?;
        if let Some(o) = &out {
            let n = numpy::PyUntypedArrayMethods::len(o);
            if n != self.rows * self.value_len {
                self.ts = Some(ts);
                return Err(err(format!("out holds {n} values for {} keys of {} values each", self.rows, self.value_len)));
            }
        }
        let s = self.session.clone();
        let values = py.detach(|| s.lock().kv.wait_values(ts)).map_err(err)?;
        match out {
            Some(o) => {
                let mut w: PyReadwriteArrayDyn<'_, f32> = o.try_readwrite().map_err(|e| err(format!("out: {e}")))?;
                let dst = w.as_slice_mut().map_err(|_| err("out must be a contiguous numpy.float32 array"))?;
                dst.copy_from_slice(&values);
                drop(w);
                Ok(o.into_any())
            }
            None => {
                let a = PyArray1::from_vec(py, values);
                Ok(a.reshape([self.rows, self.value_len])?.into_any())
            }
        }
    }
}

#[pymethods]
impl Table {
    /// Pushes `values` (`len(keys) * value_len` float32s, any shape) for `keys` (uint64,
    /// sorted and unique) and waits until the servers applied them.
    fn push(&self, py: Python<'_>, keys: PyReadonlyArray1<'_, u64>, values: PyReadonlyArrayDyn<'_, f32>) -> PyResult<()> {
        let mut h = self.push_async(py, keys, values)?;
        h.wait(py)
    }

    /// Pushes like `push` and returns at once with a handle to `wait` on.
    fn push_async(&self, py: Python<'_>, keys: PyReadonlyArray1<'_, u64>, values: PyReadonlyArrayDyn<'_, f32>) -> PyResult<Handle> {
        let k = keys_slice(&keys)?;
        let v = values.as_slice().map_err(|_| err("values must be a contiguous numpy.float32 array"))?;
        self.check(k.len(), v.len())?;
        let (s, id) = (self.session.clone(), self.id);
        let ts = py.detach(|| s.lock().kv.push(id, k, v)).map_err(err)?;
        Ok(Handle { session: self.session.clone(), ts: Some(ts) })
    }

    /// Pulls the values of `keys` into `out` (float32, C-contiguous, `len(keys) *
    /// value_len` values, any shape), or into a new array of shape `(len(keys), value_len)`;
    /// returns the array filled.
    #[pyo3(signature = (keys, out = None))]
    fn pull<'py>(
        &self,
        py: Python<'py>,
        keys: PyReadonlyArray1<'py, u64>,
        out: Option<Bound<'py, PyArrayDyn<f32>>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.read(py, keys, out, false)
    }

    /// Starts a pull of `keys` (uint64, sorted and unique) and returns at once with a handle
    /// whose `wait(out=None)` gives the values (so the next batch's rows travel while this
    /// one computes).
    fn pull_async(&self, py: Python<'_>, keys: PyReadonlyArray1<'_, u64>) -> PyResult<PullHandle> {
        let k = keys_slice(&keys)?;
        let (s, id) = (self.session.clone(), self.id);
        let ts = py.detach(|| s.lock().kv.pull(id, k)).map_err(err)?;
        Ok(PullHandle { session: self.session.clone(), ts: Some(ts), rows: k.len(), value_len: self.value_len })
    }

    /// Reads `keys` like `pull` without creating rows on a sparse table: a key never pushed
    /// reads as the table's initial value (for evaluation and serving).
    #[pyo3(signature = (keys, out = None))]
    fn peek<'py>(
        &self,
        py: Python<'py>,
        keys: PyReadonlyArray1<'py, u64>,
        out: Option<Bound<'py, PyArrayDyn<f32>>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.read(py, keys, out, true)
    }

    /// Pushes `values` to the consecutive keys `begin, begin + 1, …` of a dense table and
    /// waits until the servers applied them.
    fn push_range(&self, py: Python<'_>, begin: u64, values: PyReadonlyArrayDyn<'_, f32>) -> PyResult<()> {
        let v = values.as_slice().map_err(|_| err("values must be a contiguous numpy.float32 array"))?;
        if v.len() % self.value_len != 0 {
            return Err(err(format!("{} values are not whole rows of {}", v.len(), self.value_len)));
        }
        let (s, id) = (self.session.clone(), self.id);
        py.detach(|| {
            let mut s = s.lock();
            let ts = s.kv.push_range(id, begin, v)?;
            s.kv.wait(ts)
        })
        .map_err(err)
    }

    /// Pulls the rows of keys `begin, begin + 1, …` of a dense table into `out` (as many
    /// rows as it holds), or into a new array of `count` rows; returns the array filled.
    #[pyo3(signature = (begin, out = None, count = None))]
    fn pull_range<'py>(
        &self,
        py: Python<'py>,
        begin: u64,
        out: Option<Bound<'py, PyArrayDyn<f32>>>,
        count: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let out = match (out, count) {
            (Some(o), _) => o,
            (None, Some(n)) => PyArrayDyn::zeros(py, vec![n, self.value_len], false),
            (None, None) => return Err(err("pull_range needs out or count")),
        };
        {
            let mut w: PyReadwriteArrayDyn<'_, f32> = out.try_readwrite().map_err(|e| err(format!("out: {e}")))?;
            let o = w.as_slice_mut().map_err(|_| err("out must be a contiguous numpy.float32 array"))?;
            if o.len() % self.value_len != 0 {
                return Err(err(format!("out holds {} values, not whole rows of {}", o.len(), self.value_len)));
            }
            let (s, id) = (self.session.clone(), self.id);
            py.detach(|| s.lock().kv.pull_range_into(id, begin, o)).map_err(err)?;
        }
        Ok(out.into_any())
    }
}

/// A serving node running in this process (`downpour serve`): an export directory served
/// read-only, following new exports as they land.
#[pyclass(module = "downpour._downpour")]
struct ServingNode {
    inner: Mutex<Option<downpour_cluster::serve::Serving>>,
    /// The address clients connect to (`serving(addr)`).
    #[pyo3(get)]
    addr: String,
}

/// Serves the export directory `model` (`Session.export`, `train linear --export-dir`)
/// read-only on `listen` (`host:0` picks a free port), as `downpour serve` does: pulls are
/// answered from the newest full export and the deltas after it, pushes refused, and the
/// directory looked at for new exports every `follow_ms` milliseconds.
#[pyfunction]
#[pyo3(signature = (model, listen = "127.0.0.1:0", follow_ms = 1000))]
fn serve(py: Python<'_>, model: &str, listen: &str, follow_ms: u64) -> PyResult<ServingNode> {
    let node = py
        .detach(|| -> anyhow::Result<downpour_cluster::serve::Serving> {
            let s = Settings::default();
            let t = network_transport(TransportKind::Tcp, s.net_config())?;
            let cfg = downpour_cluster::serve::ServeConfig {
                follow_every: std::time::Duration::from_millis(follow_ms.max(1)),
                server: downpour_cluster::nodes::server_config(&s, t.clone(), None)?,
                ..downpour_cluster::serve::ServeConfig::new(model, listen)
            };
            downpour_cluster::serve::serve(t.as_ref(), cfg)
        })
        .map_err(anyhow_err)?;
    let addr = node.addr().to_string();
    Ok(ServingNode { inner: Mutex::new(Some(node)), addr })
}

#[pymethods]
impl ServingNode {
    /// The export the node serves: `(base file, cut in ms)`; the cut moves on as deltas load.
    fn served(&self) -> PyResult<(String, u64)> {
        let g = self.inner.lock();
        let node = g.as_ref().ok_or_else(|| err("the serving node was closed"))?;
        let s = node.served();
        Ok((s.base.clone(), s.cut_ms()))
    }

    /// Stops serving (connected clients get errors from then on).
    fn close(&self, py: Python<'_>) {
        if let Some(node) = self.inner.lock().take() {
            py.detach(|| node.shutdown());
        }
    }
}

/// A client of a serving node: reads the tables it serves.
#[pyclass(module = "downpour._downpour")]
struct ServingClient {
    kv: Mutex<downpour_worker::KvClient>,
    /// `(id, name, value_len)` of each table the node serves.
    #[pyo3(get)]
    tables: Vec<(u32, String, usize)>,
}

/// Connects to the serving node at `addr` (`host:port`: `downpour serve`, or `serve` here).
#[pyfunction]
fn serving(py: Python<'_>, addr: &str) -> PyResult<ServingClient> {
    let (kv, tables) = py
        .detach(|| -> anyhow::Result<_> {
            let t = network_transport(TransportKind::Tcp, Settings::default().net_config())?;
            let mut kv = downpour_cluster::serve::connect(t.as_ref(), addr, downpour_worker::KvConfig::default())?;
            let mut tables = Vec::new();
            for d in kv.server_tables()? {
                tables.push((d.id, d.name.clone(), d.value_len));
                kv.use_table(downpour_server::serving::serving_def(d.id, &d.name, d.value_len));
            }
            Ok((kv, tables))
        })
        .map_err(anyhow_err)?;
    Ok(ServingClient { kv: Mutex::new(kv), tables })
}

#[pymethods]
impl ServingClient {
    /// The rows of `keys` (uint64) in table `table`: into `out` (float32, `len(keys) *
    /// value_len` values) or a new `(len(keys), value_len)` array. A key the model does
    /// not hold reads as the table's initial row (as a training server would create it).
    #[pyo3(signature = (table, keys, out = None))]
    fn pull<'py>(
        &self,
        py: Python<'py>,
        table: u32,
        keys: PyReadonlyArray1<'py, u64>,
        out: Option<Bound<'py, PyArrayDyn<f32>>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let vl = self.tables.iter().find(|t| t.0 == table).map(|t| t.2).ok_or_else(|| err(format!("table {table} is not served here")))?;
        let k = keys_slice(&keys)?;
        let out = match out {
            Some(o) => o,
            None => PyArrayDyn::zeros(py, vec![k.len(), vl], false),
        };
        {
            let mut w: PyReadwriteArrayDyn<'_, f32> = out.try_readwrite().map_err(|e| err(format!("out: {e}")))?;
            let o = w.as_slice_mut().map_err(|_| err("out must be a contiguous numpy.float32 array"))?;
            if o.len() != k.len() * vl {
                return Err(err(format!("{} values for {} keys of {vl} values each", o.len(), k.len())));
            }
            let kv = &self.kv;
            py.detach(|| kv.lock().pull_into(table, k, o)).map_err(err)?;
        }
        Ok(out.into_any())
    }
}

/// Runs the `downpour` command-line tool in this process: `argv` (the program's name first)
/// as the binary would take it; `program` is the command child processes run (for example
/// `[sys.executable, "-m", "downpour"]`). Returns the exit code.
#[pyfunction]
fn cli(py: Python<'_>, argv: Vec<String>, program: Vec<String>) -> PyResult<i32> {
    let (path, rest) = program.split_first().ok_or_else(|| err("program is empty"))?;
    let program = downpour_cluster::Program { path: path.into(), args: rest.iter().map(Into::into).collect() };
    let args = argv.into_iter().map(Into::into).collect();
    Ok(py.detach(|| downpour::cli::main_from(args, Some(program))))
}

/// Sets what a process that runs the `downpour` command needs, as the binary does at its
/// start: no transparent huge pages (mimalloc's arenas on them cost a training node up to
/// two fifths of its CPU in page zeroing) and the soft open-files limit raised to the hard
/// one (a gRPC connection holds three descriptors). Called by `python -m downpour` before
/// [`cli`]; a program that only embeds clusters or clients need not call it. The processes
/// this one starts inherit both.
#[pyfunction]
fn prepare_process() {
    downpour::process::prepare();
}

/// Keys as the servers spread them: `scramble(ids)` maps application ids (often small
/// consecutive integers) over the whole key space, so that they split evenly across
/// servers; returns a new uint64 array.
#[pyfunction]
fn scramble<'py>(py: Python<'py>, ids: PyReadonlyArray1<'py, u64>) -> PyResult<Bound<'py, PyArray1<u64>>> {
    let v: Vec<u64> = keys_slice(&ids)?.iter().map(|&x| downpour_core::keys::scramble(x)).collect();
    Ok(PyArray1::from_vec(py, v))
}

/// The values a table's new rows start from: a `(len(keys), value_len)` float32 array of
/// the rows of `keys` as a table of `init`, `init_std` and `seed` creates them (see
/// `Session.table`); the same on every machine. To start a model outside Downpour (a
/// single-process reference) exactly where a Downpour job starts.
#[pyfunction]
#[pyo3(signature = (keys, value_len, init = "normal", init_std = 0.01, seed = 1))]
fn initial_rows<'py>(
    py: Python<'py>,
    keys: PyReadonlyArray1<'py, u64>,
    value_len: usize,
    init: &str,
    init_std: f32,
    seed: u64,
) -> PyResult<Bound<'py, PyAny>> {
    let init = parse_init(init, init_std, seed)?;
    let k = keys_slice(&keys)?;
    let mut out = vec![0f32; k.len() * value_len];
    if value_len > 0 {
        for (key, row) in k.iter().zip(out.chunks_exact_mut(value_len)) {
            init.fill(*key, row);
        }
    }
    Ok(PyArray1::from_vec(py, out).reshape([k.len(), value_len])?.into_any())
}

#[pymodule]
fn _downpour(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("DownpourError", m.py().get_type::<DownpourError>())?;
    m.add_class::<Cluster>()?;
    m.add_class::<Session>()?;
    m.add_class::<Table>()?;
    m.add_class::<Handle>()?;
    m.add_class::<PullHandle>()?;
    m.add_class::<ServingNode>()?;
    m.add_class::<ServingClient>()?;
    m.add_function(wrap_pyfunction!(embedded, m)?)?;
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add_function(wrap_pyfunction!(scramble, m)?)?;
    m.add_function(wrap_pyfunction!(initial_rows, m)?)?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(prepare_process, m)?)?;
    m.add_function(wrap_pyfunction!(serve, m)?)?;
    m.add_function(wrap_pyfunction!(serving, m)?)?;
    Ok(())
}
