//! Model files: safetensors with two tensors, `keys` (U64 \[n\], sorted) and `values`
//! (F32 [n, d]), so `safetensors.numpy.load_file(path)` gives a Python user both arrays.
//! `downpour predict` loads them and scores examples exactly as training-time evaluation
//! does (same margin arithmetic; keys absent from the model weigh 0; the weight of
//! [`downpour_data::BIAS_ID`], when present, is the intercept).

use anyhow::{bail, Context, Result};
use downpour_apps::linear;
use downpour_data::batch::Batch;
use downpour_data::{Example, ExampleReader};
use safetensors::tensor::{Dtype, SafeTensors};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `keys` (sorted) and `values` (`keys.len() × d`) to `path`. The same model gives
/// the same bytes (the header is written in a fixed order), so runs can be compared with
/// `cmp`.
pub fn save(path: &Path, keys: &[u64], values: &[f32], d: usize) -> Result<()> {
    if values.len() != keys.len() * d {
        bail!("{} values for {} keys of length {d}", values.len(), keys.len());
    }
    let (kn, vn) = (keys.len() * 8, values.len() * 4);
    let mut header = format!(
        r#"{{"__metadata__":{{"format":"downpour-linear","value_len":"{d}"}},"keys":{{"dtype":"U64","shape":[{}],"data_offsets":[0,{kn}]}},"values":{{"dtype":"F32","shape":[{},{d}],"data_offsets":[{kn},{}]}}}}"#,
        keys.len(),
        keys.len(),
        kn + vn
    );
    // safetensors pads the header with spaces to a multiple of 8 bytes
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = Vec::with_capacity(8 + header.len() + kn + vn);
    bytes.extend_from_slice(&(header.len() as u64).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(keys.iter().flat_map(|k| k.to_le_bytes()));
    bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    // the file must read back as safetensors
    SafeTensors::deserialize(&bytes).context("internal error: the model file header is not valid safetensors")?;
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// A loaded linear model.
pub struct LinearModel {
    /// Sorted keys.
    pub keys: Vec<u64>,
    /// One weight per key.
    pub weights: Vec<f32>,
}

/// Reads a model written by [`save`] (value length 1).
pub fn load(path: &Path) -> Result<LinearModel> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes).with_context(|| format!("{} is not a safetensors file", path.display()))?;
    let k = st.tensor("keys").with_context(|| format!("{}: no `keys` tensor", path.display()))?;
    let v = st.tensor("values").with_context(|| format!("{}: no `values` tensor", path.display()))?;
    if k.dtype() != Dtype::U64 || v.dtype() != Dtype::F32 {
        bail!("{}: `keys` must be U64 and `values` F32", path.display());
    }
    let n = k.shape().first().copied().unwrap_or(0);
    if k.shape().len() != 1 || v.shape() != [n, 1] {
        bail!("{}: expected keys [n] and values [n, 1], got {:?} and {:?}", path.display(), k.shape(), v.shape());
    }
    let keys: Vec<u64> = k.data().chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
    let weights: Vec<f32> = v.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4]))).collect();
    if keys.windows(2).any(|w| w[0] >= w[1]) {
        bail!("{}: keys are not sorted and unique", path.display());
    }
    Ok(LinearModel { keys, weights })
}

impl LinearModel {
    /// The weight of `key` (0 when absent).
    pub fn weight(&self, key: u64) -> f32 {
        self.keys.binary_search(&key).map(|i| self.weights[i]).unwrap_or(0.0)
    }

    /// The intercept: the weight of the constant feature [`downpour_data::BIAS_ID`] (0 for a
    /// model trained without `--bias`).
    pub fn bias(&self) -> f32 {
        self.weight(downpour_data::BIAS_ID)
    }
}

/// Flags of `downpour predict`.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct PredictConfig {
    /// Model file written by `train linear --model-out`.
    #[cfg_attr(feature = "cli", arg(long))]
    pub model: PathBuf,
    /// Examples to score.
    #[cfg_attr(feature = "cli", arg(long))]
    pub data: PathBuf,
    #[cfg_attr(feature = "cli", command(flatten))]
    pub input: crate::linear::InputConfig,
    /// Where to write one probability per line (`-` for standard output).
    #[cfg_attr(feature = "cli", arg(long, default_value = "-"))]
    pub out: PathBuf,
}

/// Scores every example of `--data` with the model.
pub fn predict(a: &PredictConfig) -> Result<()> {
    let m = load(&a.model)?;
    let mut r = ExampleReader::open(&a.data, &a.input.data_format_for(&a.data)?)?;
    let mut out: Box<dyn Write> = if a.out.as_os_str() == "-" {
        Box::new(std::io::BufWriter::new(std::io::stdout().lock()))
    } else {
        Box::new(std::io::BufWriter::new(std::fs::File::create(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?))
    };
    let mut chunk = Vec::with_capacity(1000);
    let mut ex = Example::default();
    let bias = m.bias() as f64;
    loop {
        let more = r.next_into(&mut ex)?;
        if more {
            chunk.push(std::mem::take(&mut ex));
        }
        if chunk.len() == 1000 || (!more && !chunk.is_empty()) {
            let b = Batch::from_examples(&chunk);
            let w: Vec<f32> = b.keys.iter().map(|&k| m.weight(k)).collect();
            for i in 0..b.len() {
                writeln!(out, "{}", linear::sigmoid(linear::margin(&b, &w, i) + bias)).context("cannot write predictions")?;
            }
            chunk.clear();
        }
        if !more {
            break;
        }
    }
    out.flush().context("cannot write predictions")?;
    Ok(())
}
