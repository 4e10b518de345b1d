//! `downpour data …`: data tools.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use downpour_data::synth::SynthCtr;
use downpour_data::Example;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Data tools.
#[derive(Subcommand, Debug)]
pub enum DataCmd {
    /// Write a click-through-like LIBSVM data set: Zipf-distributed feature popularity, a
    /// hidden sparse true model, logistic labels (`.gz` output when PATH ends in .gz).
    SynthCtr(SynthArgs),
    /// Write examples (e.g. hashed text) as LIBSVM with 1-based feature ids (`key + 1`), for
    /// baselines such as liblinear on exactly the features Downpour trains on.
    Featurize(FeaturizeArgs),
}

/// Flags of `data featurize`.
#[derive(Args, Debug)]
pub struct FeaturizeArgs {
    /// Input file.
    #[arg(long = "in")]
    pub input: PathBuf,
    #[command(flatten)]
    pub format: downpour_jobs::linear::InputConfig,
    /// Output LIBSVM file.
    #[arg(long)]
    pub out: PathBuf,
}

fn featurize(a: FeaturizeArgs) -> Result<()> {
    let mut r = downpour_data::ExampleReader::open(&a.input, &a.format.data_format())?;
    let file = std::fs::File::create(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    let mut w = std::io::BufWriter::new(file);
    let mut ex = Example::default();
    let mut n = 0u64;
    let (t0, mut last) = (Instant::now(), Instant::now());
    while r.next_into(&mut ex)? {
        if last.elapsed() > Duration::from_secs(1) {
            last = Instant::now();
            eprintln!("featurize: {n} examples ({:.0}/s)", n as f64 / t0.elapsed().as_secs_f64());
        }
        let mut kv: Vec<(u64, f32)> = ex.keys.iter().copied().zip(ex.values.iter().copied()).collect();
        kv.sort_unstable_by_key(|x| x.0);
        let mut line = String::from(if ex.label > 0.5 { "+1" } else { "-1" });
        for (k, v) in kv {
            use std::fmt::Write as _;
            let _ = write!(line, " {}:{v}", k.saturating_add(1));
        }
        line.push('\n');
        w.write_all(line.as_bytes()).with_context(|| format!("cannot write {}", a.out.display()))?;
        n += 1;
    }
    w.flush().with_context(|| format!("cannot write {}", a.out.display()))?;
    eprintln!("featurize: wrote {n} examples to {}", a.out.display());
    Ok(())
}

/// Flags of `data synth-ctr`.
#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Examples to write.
    #[arg(long)]
    pub examples: u64,
    /// Features per example.
    #[arg(long, default_value_t = 40)]
    pub nnz: usize,
    /// Number of possible feature keys.
    #[arg(long, default_value_t = 1 << 24)]
    pub key_space: u64,
    /// Zipf exponent of feature popularity.
    #[arg(long, default_value_t = 1.1)]
    pub zipf: f64,
    /// Seed of the hidden model and the examples (the same seed gives the same file).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Index of the first example: a test set for the same hidden model is the same `--seed`
    /// with `--start` past the training examples.
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// Output file.
    #[arg(long)]
    pub out: PathBuf,
}

/// Runs a data tool.
pub fn run(cmd: DataCmd) -> Result<()> {
    match cmd {
        DataCmd::SynthCtr(a) => synth(a),
        DataCmd::Featurize(a) => featurize(a),
    }
}

fn synth(a: SynthArgs) -> Result<()> {
    let g = SynthCtr { nnz: a.nnz, key_space: a.key_space, zipf: a.zipf, seed: a.seed, density: 0.1 };
    g.check().map_err(anyhow::Error::msg)?;
    let file = std::fs::File::create(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    let gz = a.out.extension().is_some_and(|e| e == "gz");
    let mut w: Box<dyn Write> = if gz {
        Box::new(std::io::BufWriter::with_capacity(1 << 20, flate2::write::GzEncoder::new(file, flate2::Compression::fast())))
    } else {
        Box::new(std::io::BufWriter::with_capacity(1 << 20, file))
    };
    let t0 = Instant::now();
    let mut last = Instant::now();
    let mut ex = Example::default();
    let mut line = String::with_capacity(64 * a.nnz);
    for i in 0..a.examples {
        g.example(a.start + i, &mut ex);
        line.clear();
        line.push_str(if ex.label > 0.5 { "1" } else { "0" });
        for k in &ex.keys {
            use std::fmt::Write as _;
            let _ = write!(line, " {k}");
        }
        line.push('\n');
        w.write_all(line.as_bytes()).with_context(|| format!("cannot write {}", a.out.display()))?;
        if last.elapsed() > Duration::from_secs(1) {
            last = Instant::now();
            let rate = (i + 1) as f64 / t0.elapsed().as_secs_f64();
            eprintln!("synth-ctr: {}/{} examples ({rate:.0}/s, ETA {:.0}s)", i + 1, a.examples, (a.examples - i - 1) as f64 / rate);
        }
    }
    w.flush().with_context(|| format!("cannot write {}", a.out.display()))?;
    drop(w);
    eprintln!("synth-ctr: wrote {} examples to {} in {:.1}s", a.examples, a.out.display(), t0.elapsed().as_secs_f64());
    Ok(())
}
