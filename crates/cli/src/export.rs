//! `downpour export`: export a running job's tables (`export --coordinator ADDR --out F`,
//! a delta with `--since`, continuously with `--export-dir`), look into an export directory
//! (`export show DIR`) and fold it into one file (`export merge DIR --out F`). Exports are
//! also written while training (`train linear --export-dir DIR`) and served by
//! `downpour serve --model DIR`.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use downpour_cluster::Settings;
use downpour_jobs::export;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// `downpour export`: a running job's tables, or (subcommands) an export directory's tools.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ExportArgs {
    #[command(subcommand)]
    cmd: Option<ExportCmd>,
    /// The running job's coordinator: export the tables its servers hold.
    #[arg(long)]
    coordinator: Option<String>,
    /// The tables to export (ids, comma-separated; by default every table).
    #[arg(long, value_delimiter = ',')]
    tables: Vec<u32>,
    /// Write one export file (a full export; a delta with --since, --since-checkpoint or
    /// --since-export, of tables that track changes).
    #[arg(long)]
    out: Option<PathBuf>,
    /// A delta of what changed since this moment: milliseconds since the UNIX epoch, or a
    /// duration ago (`90s`, `10m`, `2h`).
    #[arg(long, conflicts_with_all = ["since_checkpoint", "since_export"])]
    since: Option<String>,
    /// A delta of what changed since this checkpoint was taken (a `ckpt-N` directory, or a
    /// checkpoint directory: its newest).
    #[arg(long, conflicts_with = "since_export")]
    since_checkpoint: Option<PathBuf>,
    /// A delta of what changed since the newest export of this export directory.
    #[arg(long)]
    since_export: Option<PathBuf>,
    /// Export continuously into this directory (a full export, then a delta every
    /// --export-every) until the job ends or Ctrl-C.
    #[arg(long, conflicts_with_all = ["out", "since", "since_checkpoint", "since_export"])]
    export_dir: Option<PathBuf>,
    /// How often --export-dir gets a delta: `500ms`, `30s`, `10m`.
    #[arg(long, default_value = "60s", value_parser = downpour_jobs::linear::parse_every)]
    export_every: Duration,
}

/// The moment `--since` names, in ms since the UNIX epoch.
fn since_ms(a: &ExportArgs) -> Result<u64> {
    if let Some(t) = &a.since {
        if t.bytes().all(|b| b.is_ascii_digit()) {
            return t.parse().with_context(|| format!("--since {t}: not a number of milliseconds"));
        }
        let ago = downpour_core::eviction::parse_duration(t)
            .with_context(|| format!("--since {t:?}: milliseconds since the UNIX epoch, or a duration ago (90s, 10m, 2h)"))?;
        return Ok(downpour_core::changes::wall_ms().saturating_sub(ago.as_millis() as u64).max(1));
    }
    if let Some(c) = &a.since_checkpoint {
        let ckpt = downpour_core::checkpoint::resolve(c)?;
        return Ok(downpour_core::checkpoint::read_manifest(&ckpt)?.unix_ms.max(1));
    }
    if let Some(d) = &a.since_export {
        let m = export::dir::read_manifest(d)?.with_context(|| format!("{} holds no {}", d.display(), export::dir::MANIFEST))?;
        return m.exports.last().map(|e| e.cut_ms.max(1)).with_context(|| format!("{}: no export yet", d.display()));
    }
    Ok(0)
}

/// Runs `downpour export`.
pub fn run(a: ExportArgs, s: &Settings, stop: &AtomicBool) -> Result<()> {
    if let Some(cmd) = &a.cmd {
        return run_tool(cmd);
    }
    let Some(coordinator) = a.coordinator.as_deref() else {
        bail!("export what? --coordinator ADDR (a running job) with --out FILE or --export-dir DIR, or a subcommand (show, merge)")
    };
    let since = since_ms(&a)?;
    let t = downpour_transport::network_transport(s.transport, s.net_config())?;
    match (&a.out, &a.export_dir) {
        (Some(out), _) => {
            let (mut kv, defs) = downpour_cluster::exporter::connect_to_job(t.as_ref(), s, coordinator, &a.tables)?;
            let started = std::time::Instant::now();
            let f = downpour_cluster::exporter::export_once(&mut kv, &defs, since, out)?;
            eprintln!(
                "{} export of {} tables ({} rows, {} evicted) written to {} in {:.2} s",
                if since == 0 { "full" } else { "delta" },
                f.tables.len(),
                f.rows(),
                f.evicted(),
                out.display(),
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        (None, Some(dir)) => {
            let cfg = export::ExportConfig::new(dir, a.export_every);
            let n = downpour_cluster::exporter::export_continuously(t.as_ref(), s, coordinator, &a.tables, cfg, stop)?;
            eprintln!("{n} exports written to {}", dir.display());
            Ok(())
        }
        (None, None) => bail!("--coordinator needs --out FILE (one export) or --export-dir DIR (continuous)"),
    }
}

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

/// Runs an export directory tool.
fn run_tool(cmd: &ExportCmd) -> Result<()> {
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
