//! An export directory: export files and `manifest.json`, which lists them in order. The
//! model at the newest entry is the newest `full` export with every `delta` after it folded
//! in ([`load`]); a reader follows the manifest, which is replaced atomically after each new
//! file is in place, so it never names a file that is not whole.

use super::file::{self, ExportFile, Kind, TableMeta};
use anyhow::{bail, Context, Result};
use downpour_core::changes::apply_delta;
use std::path::{Path, PathBuf};

/// The manifest's file name in an export directory.
pub const MANIFEST: &str = "manifest.json";

/// One export in a directory.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    /// Its file, in the directory.
    pub file: String,
    /// Full or delta.
    pub kind: Kind,
    /// A delta's start (ms since the UNIX epoch; 0 for a full export).
    pub since_ms: u64,
    /// When it began reading (ms since the UNIX epoch).
    pub cut_ms: u64,
    /// Rows it holds.
    pub rows: u64,
    /// Evicted keys it holds.
    pub evicted: u64,
    /// Its file's size.
    pub bytes: u64,
    /// How long it took, reading and writing.
    pub seconds: f64,
}

impl std::fmt::Display for Entry {
    /// `000002-delta.safetensors (N rows, M evicted, X MiB) in S s`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} rows, {} evicted, {:.1} MiB) in {:.2} s",
            self.file,
            self.rows,
            self.evicted,
            self.bytes as f64 / (1 << 20) as f64,
            self.seconds
        )
    }
}

/// `manifest.json`: the tables and the exports, oldest first.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// Always `downpour-export-dir`.
    pub format: String,
    /// The tables every export holds.
    pub tables: Vec<TableMeta>,
    /// The exports, oldest first.
    pub exports: Vec<Entry>,
}

impl Manifest {
    /// An empty manifest for `tables`.
    pub fn new(tables: Vec<TableMeta>) -> Manifest {
        Manifest { format: "downpour-export-dir".into(), tables, exports: Vec::new() }
    }

    /// The entries that make the newest model: the newest full export and the deltas after it.
    pub fn chain(&self) -> &[Entry] {
        let from = self.exports.iter().rposition(|e| e.kind == Kind::Full).unwrap_or(self.exports.len());
        &self.exports[from..]
    }
}

/// Reads `dir`'s manifest (`None` when there is none yet).
pub fn read_manifest(dir: &Path) -> Result<Option<Manifest>> {
    let path = dir.join(MANIFEST);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let m: Manifest = serde_json::from_str(&text).with_context(|| format!("{} is not an export manifest", path.display()))?;
    if m.format != "downpour-export-dir" {
        bail!("{}: format {:?} is not \"downpour-export-dir\"", path.display(), m.format);
    }
    for e in &m.exports {
        if e.file.contains(['/', '\\']) || e.file.starts_with('.') {
            bail!("{}: bad file name {:?}", path.display(), e.file);
        }
    }
    Ok(Some(m))
}

/// Replaces `dir`'s manifest atomically.
pub fn write_manifest(dir: &Path, m: &Manifest) -> Result<()> {
    let text = serde_json::to_string_pretty(m).context("cannot encode the manifest")?;
    file::write_atomic(&dir.join(MANIFEST), text.as_bytes())
}

/// Reads export `e` of `dir`, checked against its manifest entry.
pub fn read_entry(dir: &Path, e: &Entry) -> Result<ExportFile> {
    let path = dir.join(&e.file);
    let f = file::read(&path)?;
    if f.kind != e.kind || f.cut_ms != e.cut_ms || f.since_ms != e.since_ms {
        bail!(
            "{}: the file says {:?} from {} to {} ms, the manifest {:?} from {} to {} ms",
            path.display(),
            f.kind,
            f.since_ms,
            f.cut_ms,
            e.kind,
            e.since_ms,
            e.cut_ms
        );
    }
    Ok(f)
}

/// Folds delta `d` into `model` (the tables in the same order, as one export directory's
/// files have them).
pub fn fold(model: &mut ExportFile, d: &ExportFile, what: &Path) -> Result<()> {
    if d.kind != Kind::Delta {
        bail!("{}: a full export, not a delta", what.display());
    }
    if model.tables.iter().map(|t| &t.meta).ne(d.tables.iter().map(|t| &t.meta)) {
        bail!("{}: its tables are not the base's", what.display());
    }
    for (t, dt) in model.tables.iter_mut().zip(&d.tables) {
        t.rows = apply_delta(&t.rows, t.meta.value_len, &dt.rows, &dt.evicted);
    }
    model.cut_ms = d.cut_ms;
    Ok(())
}

/// The model at `dir`'s newest export: its newest full export with every delta after it
/// folded in, as one full export (cut at the newest entry's cut).
pub fn load(dir: &Path) -> Result<ExportFile> {
    let m = read_manifest(dir)?.with_context(|| format!("{} holds no {MANIFEST}: not an export directory", dir.display()))?;
    let chain = m.chain();
    let Some(base) = chain.first() else { bail!("{}: no full export yet", dir.display()) };
    let mut model = read_entry(dir, base)?;
    for e in &chain[1..] {
        let d = read_entry(dir, e)?;
        fold(&mut model, &d, &dir.join(&e.file))?;
    }
    Ok(model)
}

/// Folds `dir`'s newest model into one full export file at `out` ([`load`], then
/// [`file::write`]). Returns what was written.
pub fn merge(dir: &Path, out: &Path) -> Result<ExportFile> {
    let model = load(dir)?;
    file::write(out, &model)?;
    Ok(model)
}

/// The path of export number `seq` of `kind` in `dir`.
pub fn entry_path(dir: &Path, seq: usize, kind: Kind) -> (String, PathBuf) {
    let name = format!("{seq:06}-{}.safetensors", if kind == Kind::Full { "full" } else { "delta" });
    (name.clone(), dir.join(name))
}
