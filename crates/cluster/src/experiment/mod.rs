//! Experiments: a job run several ways, each as a local multi-process cluster (`launch`),
//! and what each way cost and bought, written as `results.json`, `results.md` and an SVG of
//! the quality against training time.
//!
//! | experiment | module | compares |
//! |---|---|---|
//! | `experiment consistency` | [`consistency`] | `train linear` under bsp, ssp and async |
//! | `experiment model-parallel` | [`model_parallel`] | `train mf` under the block policies and data-parallel SGD |

pub mod consistency;
pub mod model_parallel;

pub use consistency::{run_consistency, ConsistencyConfig};
pub use model_parallel::{run_model_parallel, ModelParallelConfig};

use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use std::path::Path;

/// Experiments.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Subcommand))]
pub enum ExperimentCmd {
    /// Train the linear model under each consistency model and compare them.
    Consistency(ConsistencyConfig),
    /// Train matrix factorisation under each block policy and data-parallel, and compare them.
    ModelParallel(ModelParallelConfig),
}

/// Runs `exe launch --servers S --workers W -- JOB…` with the log filter `log` (worker 0's
/// progress lines show through) and reads the JSON metrics the job wrote to `metrics`.
fn launch(
    exe: &crate::Program,
    log: &str,
    servers: usize,
    workers: usize,
    job: &[std::ffi::OsString],
    metrics: &Path,
    what: &str,
) -> Result<serde_json::Value> {
    let mut c = exe.command();
    c.args(["--log", log, "launch", "--servers", &servers.to_string(), "--workers", &workers.to_string(), "--"]);
    c.args(job);
    let status = c.status().with_context(|| format!("cannot run {exe}"))?;
    if !status.success() {
        bail!("the run {what} failed ({status})");
    }
    let text = std::fs::read_to_string(metrics).with_context(|| format!("cannot read {}", metrics.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not JSON", metrics.display()))
}

/// Draws one line per `(label, points)` against wall-clock seconds, with the target as a
/// grey horizontal line.
fn plot(path: &Path, caption: &str, y_desc: &str, runs: &[(String, Vec<(f64, f64)>)], target: f64) -> Result<()> {
    let t_max = runs.iter().flat_map(|r| r.1.iter().map(|p| p.0)).fold(0.0f64, f64::max).max(1e-3);
    let y_max = runs.iter().flat_map(|r| r.1.iter().map(|p| p.1)).fold(target, f64::max);
    let y_min = runs.iter().flat_map(|r| r.1.iter().map(|p| p.1)).fold(target, f64::min);
    let pad = ((y_max - y_min) * 0.05).max(1e-6);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| anyhow::anyhow!("cannot draw {}: {e}", path.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_max * 1.02, (y_min - pad)..(y_max + pad))
        .map_err(|x| e(&x))?;
    chart.configure_mesh().x_desc("wall-clock seconds").y_desc(y_desc).draw().map_err(|x| e(&x))?;
    chart
        .draw_series(LineSeries::new([(0.0, target), (t_max * 1.02, target)], BLACK.mix(0.4)))
        .map_err(|x| e(&x))?
        .label(format!("target {target}"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.mix(0.4)));
    for (i, (label, curve)) in runs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(curve.iter().copied(), color.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
