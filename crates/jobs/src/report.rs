//! How a job tells what it is doing: result lines, final metrics and progress of long
//! phases go to a [`Reporter`] the caller chooses. The command-line tool prints lines on
//! standard output and draws progress bars on a terminal; a program can collect the lines
//! and metrics ([`Collector`]) or ignore them.

use parking_lot::Mutex;
use std::sync::Arc;

/// Receives what a job reports. Called from every worker thread of a job, so it must be
/// cheap and thread-safe; jobs call it a few times per phase, never per request.
pub trait Reporter: Send + Sync {
    /// A result line (`counter: OK …`, `train linear: test_auc=…`): the CLI prints it on
    /// standard output.
    fn line(&self, text: &str);

    /// The final metrics of a job, reported once by worker 0 (the same JSON that `--out`
    /// writes). The default ignores them.
    fn metrics(&self, job: &str, metrics: &serde_json::Value) {
        let _ = (job, metrics);
    }

    /// Starts reporting the progress of one phase (an epoch, a pass) named `label`. The
    /// default reports nothing.
    fn phase(&self, label: &str) -> Box<dyn Phase> {
        let _ = label;
        Box::new(Silent)
    }
}

/// One phase's progress, from [`Reporter::phase`].
pub trait Phase: Send {
    /// `fraction` done (`None`: unknown) and a short status message, built only if shown.
    fn update(&mut self, fraction: Option<f64>, msg: &mut dyn FnMut() -> String);
    /// The phase ended.
    fn finish(self: Box<Self>) {}
}

/// A phase that shows nothing.
struct Silent;

impl Phase for Silent {
    fn update(&mut self, _: Option<f64>, _: &mut dyn FnMut() -> String) {}
}

/// The reporter a job is given.
pub type Report = Arc<dyn Reporter>;

/// Progress of one phase as a job uses it: shown only where asked (`show`: worker 0, not
/// `--quiet`), else free.
pub struct Progress(Option<Box<dyn Phase>>);

impl Progress {
    /// Starts a phase named `label` on `report` if `show`.
    pub fn new(report: &Report, show: bool, label: impl AsRef<str>) -> Progress {
        Progress(show.then(|| report.phase(label.as_ref())))
    }

    /// Reports `fraction` done with a message built only when it will be shown.
    pub fn update(&mut self, fraction: Option<f64>, msg: impl FnOnce() -> String) {
        if let Some(p) = &mut self.0 {
            let mut msg = Some(msg);
            p.update(fraction, &mut || msg.take().map(|f| f()).unwrap_or_default());
        }
    }

    /// Ends the phase.
    pub fn finish(self) {
        if let Some(p) = self.0 {
            p.finish();
        }
    }
}

/// A reporter that passes every line to a function (and ignores the rest).
pub struct Lines<F>(pub F);

impl<F: Fn(&str) + Send + Sync> Reporter for Lines<F> {
    fn line(&self, text: &str) {
        (self.0)(text)
    }
}

/// A reporter that keeps every line and the metrics, for programs and tests.
#[derive(Default)]
pub struct Collector {
    lines: Mutex<Vec<String>>,
    metrics: Mutex<Vec<(String, serde_json::Value)>>,
}

impl Collector {
    /// A new collector, shared.
    pub fn new() -> Arc<Collector> {
        Arc::default()
    }

    /// The lines reported so far, in order.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().clone()
    }

    /// The metrics the job `job` reported last, if any.
    pub fn metrics_of(&self, job: &str) -> Option<serde_json::Value> {
        self.metrics.lock().iter().rev().find(|(j, _)| j == job).map(|(_, m)| m.clone())
    }
}

impl Reporter for Collector {
    fn line(&self, text: &str) {
        self.lines.lock().push(text.to_string());
    }
    fn metrics(&self, job: &str, metrics: &serde_json::Value) {
        self.metrics.lock().push((job.to_string(), metrics.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_collector_keeps_lines_in_order_and_the_last_metrics_of_each_job() {
        let c = Collector::new();
        let r: Report = c.clone();
        r.line("a");
        r.line("b");
        r.metrics("linear", &serde_json::json!({"x": 1}));
        r.metrics("linear", &serde_json::json!({"x": 2}));
        assert_eq!(c.lines(), ["a", "b"]);
        assert_eq!(c.metrics_of("linear").unwrap()["x"], 2);
        assert!(c.metrics_of("dnn").is_none());
    }

    #[test]
    fn a_hidden_progress_never_builds_its_message() {
        let r: Report = Collector::new();
        let mut p = Progress::new(&r, false, "epoch");
        p.update(Some(0.5), || panic!("built a message nobody shows"));
        p.finish();
    }
}
