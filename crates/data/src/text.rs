//! Text JSON-lines input: one JSON object per line with a text field and a label field,
//! turned into a sparse vector by tokenising and feature hashing.
//!
//! * **Tokens**: the text is lower-cased and split at every character that is not
//!   alphanumeric (Unicode); empty tokens are dropped.
//! * **Hash**: a token's key is FNV-1a 64 over its UTF-8 bytes (offset basis
//!   0xcbf29ce484222325, prime 0x100000001b3) — the same on every machine and every run.
//!   A bigram `a b` hashes the bytes of `a`, a 0x01 byte, then `b`. With `hash_bits = N`
//!   keys are folded into `[0, 2^N)` by keeping the low N bits. Key `u64::MAX` is mapped to
//!   `u64::MAX - 1` (it is reserved by the parameter server).
//! * **Values**: `log(1 + tf)` for a key seen `tf` times in the text, then the example's
//!   vector is scaled to unit L2 norm.
//! * **Labels**: `1`, `true`, `"1"`, `"+1"` are positive; `0`, `-1`, `false`, `"0"`, `"-1"`
//!   negative.

use crate::libsvm::DataError;
use crate::lines::{LineSource, Piece};
use crate::Example;
use std::collections::HashMap;
use std::path::Path;

/// How text lines become examples.
#[derive(Clone, Debug)]
pub struct TextOptions {
    /// JSON field holding the text.
    pub text_field: String,
    /// JSON field holding the label.
    pub label_field: String,
    /// Fold keys into `[0, 2^bits)` (1..=63).
    pub hash_bits: Option<u32>,
    /// Add bigram features.
    pub bigrams: bool,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions { text_field: "text".into(), label_field: "label".into(), hash_bits: None, bigrams: false }
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// The key of a token (see the module docs).
pub fn token_key(token: &str, hash_bits: Option<u32>) -> u64 {
    fold(fnv(FNV_OFFSET, token.as_bytes()), hash_bits)
}

/// The key of the bigram `a b`.
pub fn bigram_key(a: &str, b: &str, hash_bits: Option<u32>) -> u64 {
    fold(fnv(fnv(fnv(FNV_OFFSET, a.as_bytes()), &[1]), b.as_bytes()), hash_bits)
}

fn fold(h: u64, bits: Option<u32>) -> u64 {
    let h = match bits {
        Some(b) if b < 64 => h & ((1u64 << b) - 1),
        _ => h,
    };
    h.min(u64::MAX - 1)
}

/// Turns `text` into `ex.keys`/`ex.values` (sorted by key, log(1+tf), unit L2 norm).
pub fn featurize(text: &str, opts: &TextOptions, ex: &mut Example) {
    let lower = text.to_lowercase();
    let mut tf: HashMap<u64, u32> = HashMap::new();
    let mut prev: Option<&str> = None;
    for tok in lower.split(|c: char| !c.is_alphanumeric()).filter(|t| !t.is_empty()) {
        *tf.entry(token_key(tok, opts.hash_bits)).or_default() += 1;
        if opts.bigrams {
            if let Some(p) = prev {
                *tf.entry(bigram_key(p, tok, opts.hash_bits)).or_default() += 1;
            }
        }
        prev = Some(tok);
    }
    let mut kv: Vec<(u64, f32)> = tf.into_iter().map(|(k, c)| (k, (1.0 + c as f32).ln())).collect();
    kv.sort_unstable_by_key(|x| x.0);
    let norm = kv.iter().map(|x| x.1 * x.1).sum::<f32>().sqrt();
    ex.keys.clear();
    ex.values.clear();
    for (k, v) in kv {
        ex.keys.push(k);
        ex.values.push(if norm > 0.0 { v / norm } else { v });
    }
}

fn label_of(v: &serde_json::Value) -> Option<f32> {
    match v {
        serde_json::Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        serde_json::Value::Number(n) => {
            let x = n.as_f64()?;
            if x == 1.0 {
                Some(1.0)
            } else if x == 0.0 || x == -1.0 {
                Some(0.0)
            } else {
                None
            }
        }
        serde_json::Value::String(s) => match s.trim() {
            "1" | "+1" => Some(1.0),
            "0" | "-1" => Some(0.0),
            _ => None,
        },
        _ => None,
    }
}

/// Streams examples from a JSON-lines file (`.gz` transparently).
pub struct JsonlReader {
    src: LineSource,
    opts: TextOptions,
}

impl JsonlReader {
    /// Opens `path`.
    pub fn open(path: impl AsRef<Path>, opts: TextOptions) -> Result<Self, DataError> {
        Self::open_piece(&Piece::EveryNth { path: path.as_ref().to_path_buf(), rank: 0, of: 1 }, opts)
    }

    /// Opens one worker's piece of a file.
    pub fn open_piece(piece: &Piece, opts: TextOptions) -> Result<Self, DataError> {
        if let Some(b) = opts.hash_bits {
            if !(1..=63).contains(&b) {
                return Err(DataError::Malformed {
                    path: piece.path().to_path_buf(),
                    line: 0,
                    what: format!("--hash-bits must be 1..=63, got {b}"),
                });
            }
        }
        Ok(JsonlReader { src: LineSource::open_piece(piece)?, opts })
    }

    /// Bytes of input consumed so far.
    pub fn consumed(&self) -> u64 {
        self.src.consumed()
    }

    /// A `FILE:LINE: what` error for the example read last.
    pub fn error(&mut self, what: impl Into<String>) -> DataError {
        self.src.error(what)
    }

    /// Reads the next example into `ex`; `Ok(false)` at the end.
    pub fn next_into(&mut self, ex: &mut Example) -> Result<bool, DataError> {
        loop {
            let Some(line) = self.src.next_line()? else { return Ok(false) };
            match parse_jsonl_line(line, &self.opts, ex) {
                Ok(true) => return Ok(true),
                Ok(false) => continue,
                Err(what) => return Err(self.src.error(what)),
            }
        }
    }
}

/// Parses one text-JSONL line into `ex` (its label and featurized text): `Ok(false)` for a
/// blank line, an error saying what is wrong (without the file and line, which the reader
/// adds).
pub fn parse_jsonl_line(line: &[u8], opts: &TextOptions, ex: &mut Example) -> Result<bool, String> {
    if line.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(false);
    }
    let v: serde_json::Value = serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
    let Some(text) = v.get(&opts.text_field).and_then(|t| t.as_str()) else {
        return Err(format!("no string field {:?}", opts.text_field));
    };
    let Some(label) = v.get(&opts.label_field) else {
        return Err(format!("no field {:?}", opts.label_field));
    };
    let Some(y) = label_of(label) else {
        return Err(format!("label {label} is not one of 1, 0, -1, true, false"));
    };
    ex.label = y;
    featurize(text, opts, ex);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashing_is_stable_and_documented() {
        // FNV-1a 64 reference values
        assert_eq!(token_key("", None), 0xcbf29ce484222325);
        assert_eq!(token_key("a", None), 0xaf63dc4c8601ec8c);
        assert_eq!(token_key("foobar", None), 0x85944171f73967e8);
        assert_eq!(token_key("foobar", Some(20)), 0x85944171f73967e8 & 0xfffff);
        assert_ne!(bigram_key("a", "b", None), bigram_key("ab", "", None));
    }

    #[test]
    fn featurize_counts_tokens_log_tf_and_normalises() {
        let mut ex = Example::default();
        featurize("Win win, FREE money!", &TextOptions::default(), &mut ex);
        assert_eq!(ex.keys.len(), 3);
        assert!(ex.keys.windows(2).all(|w| w[0] < w[1]));
        let norm: f32 = ex.values.iter().map(|v| v * v).sum();
        assert!((norm - 1.0).abs() < 1e-6);
        let win = ex.keys.iter().position(|&k| k == token_key("win", None)).unwrap();
        let free = ex.keys.iter().position(|&k| k == token_key("free", None)).unwrap();
        assert!((ex.values[win] / ex.values[free] - 3f32.ln() / 2f32.ln()).abs() < 1e-5);
        let mut bi = Example::default();
        featurize("win win, FREE money!", &TextOptions { bigrams: true, ..Default::default() }, &mut bi);
        assert_eq!(bi.keys.len(), 3 + 3);
    }

    #[test]
    fn bad_lines_name_file_and_line() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.jsonl");
        std::fs::write(&p, "{\"text\":\"hi\",\"label\":1}\n\n{\"text\":\"x\",\"label\":7}\n{nope\n").unwrap();
        let mut r = JsonlReader::open(&p, TextOptions::default()).unwrap();
        let mut ex = Example::default();
        assert!(r.next_into(&mut ex).unwrap());
        assert_eq!(ex.label, 1.0);
        let e = r.next_into(&mut ex).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:3: label", p.display())), "{e}");
        let e = r.next_into(&mut ex).unwrap_err().to_string();
        assert!(e.contains(":4: not JSON"), "{e}");
    }
}
