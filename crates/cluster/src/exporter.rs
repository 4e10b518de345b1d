//! `downpour export --coordinator ADDR`: incremental export of a running job from outside
//! it. The exporter asks the coordinator for the routing, connects to every server as a
//! client of its own (identified with the cluster's secret when it has one), learns the
//! tables from the servers, and writes one export file ([`export_once`]: a full export, or a
//! delta since a moment) or an export directory on a schedule ([`export_continuously`]) until
//! the job ends or it is stopped.

use crate::nodes::kv_config;
use crate::settings::Settings;
use anyhow::{bail, Context, Result};
use downpour_core::table::TableDef;
use downpour_jobs::export::{self, file, ExportConfig, ExportFile, Exporter, TableMeta};
use downpour_transport::Transport;
use downpour_worker::KvClient;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The node id an exporter connects as (beyond any the coordinator hands out).
fn exporter_node() -> u32 {
    0xE000_0000 | (std::process::id() & 0x0FFF_FFFF)
}

/// Connects to the servers of the job whose coordinator is at `coordinator` and returns a
/// client that knows `tables` (their ids; empty: every table the servers hold).
pub fn connect_to_job(transport: &dyn Transport, s: &Settings, coordinator: &str, tables: &[u32]) -> Result<(KvClient, Vec<TableDef>)> {
    let mut c = downpour_coordinator::client::ControlClient::connect(transport, coordinator, s.connect_timeout)
        .with_context(|| format!("cannot reach the coordinator at {coordinator}"))?;
    c.set_timeout(Some(s.connect_timeout))?;
    let routing = c.routing(0, s.connect_timeout).context("asking the coordinator for the routing")?;
    let node = exporter_node();
    let credential = s.auth.as_ref().map(|a| downpour_core::msg::worker_credential(a.secret(), node));
    let mut kv = KvClient::connect_as(transport, &routing, node, kv_config(s), credential.as_ref().map(|c| c.as_slice()))
        .context("connecting to the job's servers")?;
    let all = kv.server_tables().context("asking the servers for their tables")?;
    let mut defs = Vec::new();
    for d in &all {
        if tables.is_empty() || tables.contains(&d.id) {
            defs.push(d.clone());
        }
    }
    if let Some(missing) = tables.iter().find(|id| !all.iter().any(|d| d.id == **id)) {
        bail!("table {missing} is not on the servers (they hold {:?})", all.iter().map(|d| d.id).collect::<Vec<_>>());
    }
    if defs.is_empty() {
        bail!("the job's servers hold no table yet");
    }
    for d in &defs {
        kv.use_table(d.clone());
    }
    Ok((kv, defs))
}

fn metas(defs: &[TableDef]) -> Vec<TableMeta> {
    defs.iter().map(TableMeta::of).collect()
}

/// Writes one export of `defs` to `out`: every row (`since_ms == 0`) or the rows written and
/// keys evicted since `since_ms` (tables defined with `changes` only).
pub fn export_once(kv: &mut KvClient, defs: &[TableDef], since_ms: u64, out: &Path) -> Result<ExportFile> {
    if since_ms > 0 {
        if let Some(d) = defs.iter().find(|d| !d.changes) {
            bail!("table {} ({}) does not track changes: only a full export (no --since) reads it", d.id, d.name);
        }
    }
    let f = export::read_export(kv, &metas(defs), since_ms)?;
    file::write(out, &f)?;
    Ok(f)
}

/// Exports the job's tables (`tables`, as [`connect_to_job`] picks them) into `cfg.dir`
/// every `cfg.every` (a full export first, then deltas) until `stop` is set or the job ends.
/// An export that fails (a server gone, a new routing epoch) is followed by a new connection
/// to the job and the next export on schedule; when the coordinator or the servers can no
/// longer be reached, the job has ended and the exports written stand. Returns how many.
pub fn export_continuously(
    transport: &dyn Transport,
    s: &Settings,
    coordinator: &str,
    tables: &[u32],
    cfg: ExportConfig,
    stop: &AtomicBool,
) -> Result<usize> {
    let every = cfg.every;
    let (mut kv, defs) = connect_to_job(transport, s, coordinator, tables)?;
    let mut ex = Exporter::open(cfg, &defs)?;
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        if ex.due() {
            match ex.export(&mut kv) {
                Ok(e) => {
                    n += 1;
                    tracing::info!("exported {e}");
                }
                Err(e) => match connect_to_job(transport, s, coordinator, tables) {
                    Ok((k, d)) if d.iter().map(TableDef::to_proto).eq(defs.iter().map(TableDef::to_proto)) => {
                        tracing::warn!("export failed: {e:#}; connected to the job again, the next export is due in {every:?}");
                        kv = k;
                    }
                    Ok(_) => bail!("the job's tables changed: {e:#}"),
                    Err(gone) => {
                        let last = ex.manifest().exports.last().map_or("none", |e| e.file.as_str());
                        tracing::info!("export stopped: {e:#}; the job is gone ({gone:#}); the last export is {last}");
                        return Ok(n);
                    }
                },
            }
        }
        let until = Instant::now() + every.min(Duration::from_millis(200));
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(n)
}
