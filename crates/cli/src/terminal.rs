//! What a job reports, on the terminal: result lines on standard output; progress of long
//! phases as an indicatif bar when standard error is a terminal, else a log line every few
//! seconds (under `launch`, in CI, into a file), so the output never mixes a redrawn bar
//! with log lines.

use downpour_jobs::{Phase, Report, Reporter};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// How often the fallback log line is written.
const LOG_EVERY: Duration = Duration::from_secs(2);

/// Prints result lines on standard output and shows progress on standard error.
pub struct Terminal;

impl Terminal {
    /// The reporter the command-line tool gives every job.
    pub fn report() -> Report {
        std::sync::Arc::new(Terminal)
    }
}

impl Reporter for Terminal {
    fn line(&self, text: &str) {
        println!("{text}");
    }
    fn phase(&self, label: &str) -> Box<dyn Phase> {
        Box::new(Progress::new(label))
    }
}

/// One phase's progress (an epoch, a file).
struct Progress {
    bar: Option<ProgressBar>,
    label: String,
    start: Instant,
    last_log: Instant,
}

impl Progress {
    fn new(label: &str) -> Progress {
        let label = label.to_string();
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::with_draw_target(Some(1000), ProgressDrawTarget::stderr_with_hz(4));
            let style = ProgressStyle::with_template("{prefix} [{bar:30}] {percent:>3}% {msg} (ETA {eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            b.set_style(style);
            b.set_prefix(label.clone());
            b
        });
        let now = Instant::now();
        Progress { bar, label, start: now, last_log: now }
    }
}

impl Phase for Progress {
    fn update(&mut self, fraction: Option<f64>, msg: &mut dyn FnMut() -> String) {
        if let Some(b) = &self.bar {
            if let Some(f) = fraction {
                b.set_position((f.clamp(0.0, 1.0) * 1000.0) as u64);
            }
            b.set_message(msg());
            return;
        }
        if self.last_log.elapsed() < LOG_EVERY {
            return;
        }
        self.last_log = Instant::now();
        let eta = match fraction {
            Some(f) if f > 0.0 => format!(", ETA {:.0}s", self.start.elapsed().as_secs_f64() * (1.0 - f) / f),
            _ => String::new(),
        };
        let pct = fraction.map(|f| format!(" {:.0}%", f * 100.0)).unwrap_or_default();
        tracing::info!("{}:{pct} {}{eta}", self.label, msg());
    }

    fn finish(self: Box<Self>) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}
