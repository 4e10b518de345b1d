//! Export files: safetensors holding, per table, `table<ID>.keys` (U64 \[n\], sorted),
//! `table<ID>.values` (F32 [n, value_len]) and, in a delta, `table<ID>.evicted` (U64 \[m\],
//! sorted: the keys evicted since the delta's `since`). The metadata says what the file is
//! (`kind`: `full` or `delta`; `since_ms`, `cut_ms`) and names each table
//! (`table<ID>.name`, `table<ID>.value_len`, `table<ID>.init`: its initializer, which a
//! serving node answers for a key the model lacks), so `safetensors.numpy.load_file` gives a
//! Python user every array. Files are written beside their final name and renamed into it
//! once synced: a reader never sees half a file.

use anyhow::{bail, Context, Result};
use downpour_core::changes::Rows;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// What an export file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Every row of every table at the cut.
    Full,
    /// The rows written and the keys evicted between `since_ms` and the cut.
    Delta,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Full => "full",
            Kind::Delta => "delta",
        }
    }
}

/// A table in an export.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TableMeta {
    /// The table's id.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// Values per key.
    pub value_len: usize,
    /// How the table's rows start (`Init`'s text: `zeros`, `uniform:LO:HI:SEED`,
    /// `normal:MEAN:STD:SEED`): a serving node reads a key the model lacks as this. `None`
    /// in exports written before it was recorded (they read as zeros).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<String>,
}

impl TableMeta {
    /// The export's record of table `def`.
    pub fn of(def: &downpour_core::table::TableDef) -> TableMeta {
        TableMeta { id: def.id, name: def.name.clone(), value_len: def.value_len, init: Some(def.init.to_string()) }
    }

    /// Whether `other` records the same table (its initial values aside: exports written
    /// before they were recorded do not have them).
    pub fn same_table(&self, other: &TableMeta) -> bool {
        (self.id, &self.name, self.value_len) == (other.id, &other.name, other.value_len)
    }
}

/// One table's part of an export.
#[derive(Clone, Debug, PartialEq)]
pub struct TableExport {
    /// Which table.
    pub meta: TableMeta,
    /// Rows (a full export: all of them; a delta: those written since `since_ms`).
    pub rows: Rows,
    /// A delta: the keys evicted since `since_ms`, sorted and unique (empty in a full export).
    pub evicted: Vec<u64>,
}

/// An export file's contents.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportFile {
    /// Full or delta.
    pub kind: Kind,
    /// A delta's start, ms since the UNIX epoch (0 for a full export).
    pub since_ms: u64,
    /// When the export began reading, ms since the UNIX epoch: every write before it is in
    /// the export (the base and deltas up to this one).
    pub cut_ms: u64,
    /// The tables, by id.
    pub tables: Vec<TableExport>,
}

impl ExportFile {
    /// Rows in all tables.
    pub fn rows(&self) -> usize {
        self.tables.iter().map(|t| t.rows.keys.len()).sum()
    }

    /// Evicted keys in all tables.
    pub fn evicted(&self) -> usize {
        self.tables.iter().map(|t| t.evicted.len()).sum()
    }
}

/// Writes `f` to `path` atomically (a `.tmp` sibling, synced, renamed over `path`, the
/// directory synced). Returns the bytes written.
pub fn write(path: &Path, f: &ExportFile) -> Result<u64> {
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), "downpour-export".to_string());
    meta.insert("kind".to_string(), f.kind.name().to_string());
    meta.insert("since_ms".to_string(), f.since_ms.to_string());
    meta.insert("cut_ms".to_string(), f.cut_ms.to_string());
    let mut views = Vec::new();
    for t in &f.tables {
        let (id, vl, n) = (t.meta.id, t.meta.value_len, t.rows.keys.len());
        if t.rows.values.len() != n * vl {
            bail!("table {id}: {} values for {n} keys of {vl}", t.rows.values.len());
        }
        meta.insert(format!("table{id}.name"), t.meta.name.clone());
        meta.insert(format!("table{id}.value_len"), vl.to_string());
        if let Some(init) = &t.meta.init {
            meta.insert(format!("table{id}.init"), init.clone());
        }
        views.push((format!("table{id}.keys"), TensorView::new(Dtype::U64, vec![n], bytemuck::cast_slice(&t.rows.keys))?));
        views.push((format!("table{id}.values"), TensorView::new(Dtype::F32, vec![n, vl], bytemuck::cast_slice(&t.rows.values))?));
        if f.kind == Kind::Delta {
            views.push((
                format!("table{id}.evicted"),
                TensorView::new(Dtype::U64, vec![t.evicted.len()], bytemuck::cast_slice(&t.evicted))?,
            ));
        }
    }
    let tmp = path.with_extension("tmp");
    safetensors::serialize_to_file(views, Some(meta), &tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    let file = std::fs::OpenOptions::new().write(true).open(&tmp).with_context(|| format!("cannot open {}", tmp.display()))?;
    file.sync_all().with_context(|| format!("cannot sync {}", tmp.display()))?;
    let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
    sync_dir(path)?;
    Ok(bytes)
}

/// Syncs the directory holding `path`, so a rename into it is durable.
pub(crate) fn sync_dir(path: &Path) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if let Ok(d) = std::fs::File::open(dir) {
        d.sync_all().with_context(|| format!("cannot sync {}", dir.display()))?;
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically, as [`write`] does.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    f.write_all(bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    f.sync_all().with_context(|| format!("cannot sync {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
    sync_dir(path)
}

fn u64s(st: &SafeTensors, name: &str, path: &Path) -> Result<Vec<u64>> {
    let t = st.tensor(name).with_context(|| format!("{}: no `{name}` tensor", path.display()))?;
    if t.dtype() != Dtype::U64 || t.shape().len() != 1 {
        bail!("{}: `{name}` must be U64 [n], not {:?} {:?}", path.display(), t.dtype(), t.shape());
    }
    Ok(t.data().chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
}

fn sorted_unique(keys: &[u64], what: &str, path: &Path) -> Result<()> {
    if let Some(i) = keys.windows(2).position(|w| w[0] >= w[1]) {
        bail!("{}: {what} are not sorted and unique (#{} is {}, after {})", path.display(), i + 1, keys[i + 1], keys[i]);
    }
    Ok(())
}

/// Reads an export file written by [`write`], checked: tensors of the right types and
/// shapes, keys sorted and unique.
pub fn read(path: &Path) -> Result<ExportFile> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (_, header) = SafeTensors::read_metadata(&bytes).with_context(|| format!("{} is not a safetensors file", path.display()))?;
    let meta = header.metadata().clone().unwrap_or_default();
    if meta.get("format").map(String::as_str) != Some("downpour-export") {
        bail!("{} is not a Downpour export (its metadata has no format \"downpour-export\")", path.display());
    }
    let st = SafeTensors::deserialize(&bytes).with_context(|| format!("{} is not a safetensors file", path.display()))?;
    let num = |k: &str| -> Result<u64> {
        meta.get(k)
            .with_context(|| format!("{}: no `{k}` in the metadata", path.display()))?
            .parse()
            .with_context(|| format!("{}: `{k}` is not a number", path.display()))
    };
    let kind = match meta.get("kind").map(String::as_str) {
        Some("full") => Kind::Full,
        Some("delta") => Kind::Delta,
        other => bail!("{}: kind {other:?} is neither \"full\" nor \"delta\"", path.display()),
    };
    let mut ids: Vec<u32> = meta.keys().filter_map(|k| k.strip_prefix("table")?.strip_suffix(".name")?.parse().ok()).collect();
    ids.sort_unstable();
    let mut tables = Vec::new();
    for id in ids {
        let value_len = num(&format!("table{id}.value_len"))? as usize;
        let keys = u64s(&st, &format!("table{id}.keys"), path)?;
        let v = st.tensor(&format!("table{id}.values")).with_context(|| format!("{}: no `table{id}.values` tensor", path.display()))?;
        if v.dtype() != Dtype::F32 || v.shape() != [keys.len(), value_len] {
            bail!("{}: `table{id}.values` must be F32 [{}, {value_len}], not {:?} {:?}", path.display(), keys.len(), v.dtype(), v.shape());
        }
        sorted_unique(&keys, &format!("table {id}'s keys"), path)?;
        let values: Vec<f32> = v.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4]))).collect();
        let evicted = if kind == Kind::Delta { u64s(&st, &format!("table{id}.evicted"), path)? } else { Vec::new() };
        sorted_unique(&evicted, &format!("table {id}'s evicted keys"), path)?;
        let name = meta.get(&format!("table{id}.name")).cloned().unwrap_or_default();
        let init = meta.get(&format!("table{id}.init")).cloned();
        if let Some(i) = &init {
            i.parse::<downpour_core::init::Init>().with_context(|| format!("{}: `table{id}.init`", path.display()))?;
        }
        tables.push(TableExport { meta: TableMeta { id, name, value_len, init }, rows: Rows { keys, values }, evicted });
    }
    Ok(ExportFile { kind, since_ms: num("since_ms")?, cut_ms: num("cut_ms")?, tables })
}
