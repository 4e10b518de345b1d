//! Incremental export to serving: a full export of a job's tables, then, on a schedule,
//! deltas holding only the rows written and the keys evicted since the export before
//! (tables defined with `changes`, see [`downpour_core::changes`]), in an export directory
//! that `downpour serve` follows and `downpour export merge` folds into one file.
//!
//! * [`file`]: one export file (safetensors) and how it is written atomically and read back;
//! * [`dir`]: an export directory's `manifest.json`, and the model its files make;
//! * [`Exporter`]: takes the exports of a running job through a worker's client.

pub mod dir;
pub mod file;

pub use dir::{load, merge, Entry, Manifest};
pub use file::{ExportFile, Kind, TableExport, TableMeta};

use anyhow::{bail, Context, Result};
use downpour_core::changes::wall_ms;
use downpour_core::table::TableDef;
use downpour_core::KeyRange;
use downpour_worker::KvClient;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Settings of continuous export.
#[derive(Clone, Debug)]
pub struct ExportConfig {
    /// The export directory (created when missing).
    pub dir: PathBuf,
    /// How often to export.
    pub every: Duration,
    /// How much earlier than the previous export's cut a delta starts, for servers whose
    /// clocks run behind the exporter's (rows written in that margin are exported twice,
    /// which is harmless).
    pub skew: Duration,
    /// Take a full export instead of a delta after this many deltas (0: never; the chain
    /// of deltas a reader folds grows until then).
    pub full_every: u32,
}

impl ExportConfig {
    /// Exports to `dir` every `every`, with a skew margin of 1 s and a full export every
    /// 60 deltas.
    pub fn new(dir: impl Into<PathBuf>, every: Duration) -> ExportConfig {
        ExportConfig { dir: dir.into(), every, skew: Duration::from_secs(1), full_every: 60 }
    }
}

/// Reads what an export of `tables` holds through `kv` (which knows their definitions):
/// every row (`since_ms == 0`, a full export; a table that does not track changes is read by
/// range) or the rows written and keys evicted since `since_ms` (a delta: tables defined
/// with `changes` only), the cut taken before the first read.
pub fn read_export(kv: &mut KvClient, tables: &[TableMeta], since_ms: u64) -> Result<ExportFile> {
    let cut_ms = wall_ms();
    let kind = if since_ms == 0 { Kind::Full } else { Kind::Delta };
    let mut out = Vec::with_capacity(tables.len());
    for t in tables {
        let tracked = kv.table(t.id).is_some_and(|d| d.changes);
        if since_ms == 0 && !tracked {
            // a full export of a table that does not track changes: every row, by range
            let (keys, values) = kv.pull_range(t.id, KeyRange::FULL).with_context(|| format!("cannot read table {} ({})", t.id, t.name))?;
            out.push(TableExport { meta: t.clone(), rows: downpour_core::changes::Rows { keys, values }, evicted: Vec::new() });
            continue;
        }
        let mut c = kv.changes_since(t.id, since_ms).with_context(|| format!("cannot read the changes of table {} ({})", t.id, t.name))?;
        c.evicted.sort_unstable();
        c.evicted.dedup();
        out.push(TableExport { meta: t.clone(), rows: c.rows, evicted: c.evicted });
    }
    Ok(ExportFile { kind, since_ms, cut_ms, tables: out })
}

/// Continuous export of a job's tables into an export directory.
pub struct Exporter {
    cfg: ExportConfig,
    manifest: Manifest,
    /// When the last export began (`None`: none yet in this process).
    last: Option<Instant>,
    /// Deltas since the last full export.
    deltas: u32,
}

impl Exporter {
    /// Continuous export of `tables` (each defined with `changes`) into `cfg.dir`. A
    /// directory that holds exports already must hold the same tables; the first export of
    /// this process is a full one (the servers' change tracking may have restarted since
    /// the last, and evictions from before it are unknown), appended to its manifest.
    pub fn open(cfg: ExportConfig, tables: &[TableDef]) -> Result<Exporter> {
        if let Some(t) = tables.iter().find(|t| !t.changes) {
            bail!("table {} ({}) does not track changes: define it with `changes` to export it incrementally", t.id, t.name);
        }
        let metas: Vec<TableMeta> = tables.iter().map(TableMeta::of).collect();
        std::fs::create_dir_all(&cfg.dir).with_context(|| format!("cannot create {}", cfg.dir.display()))?;
        let manifest = match dir::read_manifest(&cfg.dir)? {
            Some(m) if m.tables.len() != metas.len() || m.tables.iter().zip(&metas).any(|(a, b)| !a.same_table(b)) => {
                bail!("{} holds exports of other tables ({:?}); export into another directory", cfg.dir.display(), m.tables)
            }
            Some(m) => m,
            None => Manifest::new(metas),
        };
        Ok(Exporter { cfg, manifest, last: None, deltas: 0 })
    }

    /// Whether an export is due (the first one always is).
    pub fn due(&self) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= self.cfg.every)
    }

    /// The manifest as it stands.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Takes the next export through `kv` (a full one first and every `full_every` deltas,
    /// a delta since the previous cut otherwise), writes it and then the manifest. Returns
    /// its manifest entry.
    pub fn export(&mut self, kv: &mut KvClient) -> Result<Entry> {
        let started = Instant::now();
        let prev = self.manifest.exports.last().map(|e| e.cut_ms);
        let full = self.last.is_none() || (self.cfg.full_every > 0 && self.deltas >= self.cfg.full_every);
        let since = match (full, prev) {
            (false, Some(cut)) => cut.saturating_sub(self.cfg.skew.as_millis() as u64).max(1),
            _ => 0,
        };
        self.last = Some(started);
        let f = read_export(kv, &self.manifest.tables, since)?;
        // numbered past the newest export (pruning removes old entries, never reuses numbers)
        let seq = self.manifest.exports.last().and_then(|e| e.file.split('-').next()?.parse::<usize>().ok()).unwrap_or(0) + 1;
        let (file, path) = dir::entry_path(&self.cfg.dir, seq, f.kind);
        let bytes = file::write(&path, &f)?;
        let entry = Entry {
            file,
            kind: f.kind,
            since_ms: f.since_ms,
            cut_ms: f.cut_ms,
            rows: f.rows() as u64,
            evicted: f.evicted() as u64,
            bytes,
            seconds: started.elapsed().as_secs_f64(),
        };
        self.manifest.exports.push(entry.clone());
        if f.kind == Kind::Full {
            self.deltas = 0;
            self.prune()?;
        } else {
            self.deltas += 1;
        }
        dir::write_manifest(&self.cfg.dir, &self.manifest)?;
        Ok(entry)
    }

    /// Forgets the exports before the previous full one (a reader still folding that chain
    /// finishes it) and removes their files once the manifest no longer names them.
    fn prune(&mut self) -> Result<()> {
        let fulls: Vec<usize> = self.manifest.exports.iter().enumerate().filter(|(_, e)| e.kind == Kind::Full).map(|(i, _)| i).collect();
        let Some(&keep_from) = fulls.len().checked_sub(2).and_then(|i| fulls.get(i)) else { return Ok(()) };
        let gone: Vec<Entry> = self.manifest.exports.drain(..keep_from).collect();
        dir::write_manifest(&self.cfg.dir, &self.manifest)?;
        for e in gone {
            let _ = std::fs::remove_file(self.cfg.dir.join(&e.file));
        }
        Ok(())
    }
}
