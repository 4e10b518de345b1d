//! `downpour export`: look into an export directory (`export show DIR`) and fold it into one
//! file (`export merge DIR --out model.safetensors`). Exports are written while training
//! (`train linear --export-dir DIR`) and served by `downpour serve --model DIR`.

use anyhow::Result;
use clap::Subcommand;
use downpour_jobs::export;
use std::path::PathBuf;

/// Export directory tools.
#[derive(Subcommand, Debug)]
pub enum ExportCmd {
    /// The exports of a directory: each file, what it holds and when it was cut, and the
    /// chain a reader folds (the newest full export and the deltas after it).
    Show {
        /// The export directory.
        dir: PathBuf,
    },
    /// Fold the newest full export and every delta after it into one full export file: the
    /// same rows, bit for bit, as a full export at the newest delta's cut.
    Merge {
        /// The export directory.
        dir: PathBuf,
        /// The file to write (safetensors: per table `table<ID>.keys`, `table<ID>.values`).
        #[arg(long)]
        out: PathBuf,
    },
}

/// Runs an `export` command.
pub fn run(cmd: &ExportCmd) -> Result<()> {
    match cmd {
        ExportCmd::Show { dir } => {
            let Some(m) = export::dir::read_manifest(dir)? else {
                anyhow::bail!("{} holds no {}: not an export directory", dir.display(), export::dir::MANIFEST)
            };
            let now = downpour_core::changes::wall_ms();
            for t in &m.tables {
                println!("table {} {:?}: {} values a key", t.id, t.name, t.value_len);
            }
            let chain_from = m.exports.len() - m.chain().len();
            for (i, e) in m.exports.iter().enumerate() {
                println!(
                    "{} {:<26} {:<5} {:>10} rows {:>9} evicted {:>9.1} MiB  {:>6.2} s  cut {:.1} s ago",
                    if i >= chain_from { "*" } else { " " },
                    e.file,
                    format!("{:?}", e.kind).to_lowercase(),
                    e.rows,
                    e.evicted,
                    e.bytes as f64 / (1 << 20) as f64,
                    e.seconds,
                    now.saturating_sub(e.cut_ms) as f64 / 1e3
                );
            }
            println!("(* the newest model: {} exports)", m.chain().len());
            Ok(())
        }
        ExportCmd::Merge { dir, out } => {
            let started = std::time::Instant::now();
            let model = export::merge(dir, out)?;
            eprintln!(
                "{}: {} rows of {} tables at cut {} written to {} in {:.2} s",
                dir.display(),
                model.rows(),
                model.tables.len(),
                model.cut_ms,
                out.display(),
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
    }
}
