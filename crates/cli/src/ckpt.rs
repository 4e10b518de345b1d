//! `downpour checkpoint`: look into a checkpoint and export its tables as safetensors.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use downpour_core::{checkpoint, proto};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Checkpoint tools.
#[derive(Subcommand, Debug)]
pub enum CheckpointCmd {
    /// What a checkpoint holds: its tables (rows, value length, update rule) and where every
    /// worker stood. PATH: a `ckpt-N` directory, or a checkpoint directory (its newest).
    Show {
        /// The checkpoint.
        path: PathBuf,
    },
    /// Write every table's values as safetensors: per table `table<ID>.keys` (U64 [n],
    /// sorted) and `table<ID>.values` (F32 [n, value_len]); table names and the
    /// checkpoint's number are in the file's metadata. The update rules' state is not
    /// exported (it stays in the checkpoint for --resume).
    Export {
        /// The checkpoint.
        path: PathBuf,
        /// The safetensors file to write.
        #[arg(long)]
        out: PathBuf,
    },
}

/// One table of a checkpoint, its parts merged: sorted keys and their values.
struct Merged {
    spec: proto::TableSpec,
    keys: Vec<u64>,
    values: Vec<f32>,
}

fn merged(ckpt: &Path) -> Result<(proto::CheckpointManifest, Vec<Merged>)> {
    let manifest = checkpoint::read_manifest(ckpt)?;
    let parts = checkpoint::read_parts(ckpt, &manifest)?;
    // per table: its definition, every part's keys with their values (unsorted across parts)
    let mut by_id: BTreeMap<u32, Merged> = BTreeMap::new();
    for part in &parts {
        for t in &part.tables {
            let Some(spec) = t.spec.clone() else { bail!("{}: a table without its definition", ckpt.display()) };
            let vl = spec.value_len as usize;
            let rl = t.row_len as usize;
            if vl == 0 || rl < vl {
                bail!("{}: table {} has rows of {rl} floats for values of {vl}", ckpt.display(), spec.id);
            }
            let (keys, rows) = checkpoint::decode_table(t).with_context(|| format!("{}, part of node {}", ckpt.display(), part.node_id))?;
            let m = by_id.entry(spec.id).or_insert_with(|| Merged { spec: spec.clone(), keys: Vec::new(), values: Vec::new() });
            if m.spec != spec {
                bail!("{}: table {} is defined differently in two parts", ckpt.display(), spec.id);
            }
            m.keys.extend_from_slice(&keys);
            m.values.extend(rows.chunks_exact(rl).flat_map(|r| &r[..vl]));
        }
    }
    let mut out = Vec::new();
    for (id, m) in by_id {
        // parts hold disjoint key ranges: sort rows by key
        let vl = m.spec.value_len as usize;
        let mut order: Vec<usize> = (0..m.keys.len()).collect();
        order.sort_unstable_by_key(|&i| m.keys[i]);
        let keys: Vec<u64> = order.iter().map(|&i| m.keys[i]).collect();
        if keys.windows(2).any(|w| w[0] == w[1]) {
            bail!("{}: table {id} holds a key in two parts", ckpt.display());
        }
        let values = order.iter().flat_map(|&i| &m.values[i * vl..(i + 1) * vl]).copied().collect();
        out.push(Merged { spec: m.spec, keys, values });
    }
    Ok((manifest, out))
}

/// Runs a `checkpoint` command.
pub fn run(cmd: &CheckpointCmd) -> Result<()> {
    match cmd {
        CheckpointCmd::Show { path } => {
            let ckpt = checkpoint::resolve(path)?;
            let (m, tables) = merged(&ckpt)?;
            println!("{}: checkpoint {} of a job of {} workers, {} server parts", ckpt.display(), m.number, m.num_workers, m.parts.len());
            for t in &tables {
                let rule = t.spec.rule.as_ref().map(|r| r.name.as_str()).unwrap_or("");
                println!("  table {} {:?}: {} rows of {} values, rule {rule}", t.spec.id, t.spec.name, t.keys.len(), t.spec.value_len);
            }
            for w in &m.workers {
                println!("  worker {}: clock {}, state {:?}", w.rank, w.clock, w.state);
            }
            Ok(())
        }
        CheckpointCmd::Export { path, out } => {
            let ckpt = checkpoint::resolve(path)?;
            let (m, tables) = merged(&ckpt)?;
            let mut meta = HashMap::new();
            meta.insert("format".to_string(), "downpour-checkpoint".to_string());
            meta.insert("checkpoint".to_string(), m.number.to_string());
            let mut views = Vec::new();
            for t in &tables {
                meta.insert(format!("table{}", t.spec.id), t.spec.name.clone());
                let n = t.keys.len();
                let kb: &[u8] = bytemuck::cast_slice(&t.keys);
                let vb: &[u8] = bytemuck::cast_slice(&t.values);
                views.push((format!("table{}.keys", t.spec.id), TensorView::new(Dtype::U64, vec![n], kb)?));
                views.push((format!("table{}.values", t.spec.id), TensorView::new(Dtype::F32, vec![n, t.spec.value_len as usize], vb)?));
            }
            safetensors::tensor::serialize_to_file(views, Some(meta), out).with_context(|| format!("cannot write {}", out.display()))?;
            eprintln!("{}: {} tables of checkpoint {} written to {}", ckpt.display(), tables.len(), m.number, out.display());
            Ok(())
        }
    }
}
