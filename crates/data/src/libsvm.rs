//! Streaming LIBSVM/svmlight reader.
//!
//! Format: one example per line, `LABEL [ID[:VALUE]]... [# comment]`. Labels `+1`, `1`
//! (positive) and `-1`, `0` (negative) are accepted, or with [`Labels::Positive`] any number
//! (that one positive, every other negative: `1`/`2` files, one class against the rest); ids
//! are u64; a missing value means 1.
//! Blank lines and lines starting with `#` are skipped. A malformed line is an error of the
//! form `FILE:LINE: what is wrong`. Files are read line by line (never whole), and gzip files
//! are decompressed on the fly whatever their name.

use crate::lines::{LineSource, Piece};
use crate::Example;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// A reader error naming the file and line.
#[derive(Debug, Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line is malformed.
    #[error("{path}:{line}: {what}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        what: String,
    },
    /// A file cannot be used this way.
    #[error("{path}: {msg}")]
    Unsuitable {
        /// The file.
        path: PathBuf,
        /// Why.
        msg: String,
    },
}

/// How LIBSVM labels map to the classes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Labels {
    /// `+1`/`1` positive, `-1`/`0` negative, anything else an error.
    #[default]
    Standard,
    /// This number positive, every other number negative.
    Positive(f64),
}

impl Labels {
    /// The rule for files whose first examples carry `seen` (distinct label values): the
    /// standard one when they are among −1, 0 and 1; with exactly two other values, the larger
    /// is positive (`1`/`2`, `2`/`4` files); otherwise an error asking which is positive.
    pub fn detect(seen: &[f64]) -> Result<Labels, String> {
        if seen.iter().all(|v| [-1.0, 0.0, 1.0].contains(v)) {
            return Ok(Labels::Standard);
        }
        match seen {
            [a, b] => Ok(Labels::Positive(a.max(*b))),
            _ => {
                let shown: Vec<String> = seen.iter().take(10).map(|v| v.to_string()).collect();
                Err(format!(
                    "the labels {}{} are not two classes: say which label is positive with --positive-label L (one against the rest)",
                    shown.join(", "),
                    if seen.len() > 10 { ", …" } else { "" }
                ))
            }
        }
    }
}

/// The distinct label values (sorted) of the first `n` examples of a LIBSVM file; at most
/// 1,000 of them are kept.
pub fn label_values(path: &Path, n: usize) -> Result<Vec<f64>, DataError> {
    let mut src = LineSource::open(path)?;
    let mut seen: Vec<f64> = Vec::new();
    let mut count = 0;
    while count < n {
        let Some(line) = src.next_line()? else { break };
        let Some(token) = line.split(|b| is_space(*b)).find(|t| !t.is_empty()) else { continue };
        if token[0] == b'#' {
            continue;
        }
        let v = std::str::from_utf8(token).ok().and_then(|t| t.parse::<f64>().ok()).filter(|v| v.is_finite());
        let Some(v) = v else {
            let what = format!("label {} is not a number", show(token));
            return Err(src.error(what));
        };
        if !seen.contains(&v) && seen.len() < 1000 {
            seen.push(v);
        }
        count += 1;
    }
    seen.sort_by(f64::total_cmp);
    Ok(seen)
}

/// Parses one LIBSVM line into `ex` (cleared first). `Ok(false)` for a blank or comment line.
pub fn parse_line(line: &str, ex: &mut Example) -> Result<bool, String> {
    parse_bytes(line.as_bytes(), ex)
}

#[inline]
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n' | 0x0b | 0x0c)
}

fn show(t: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(t))
}

/// Parses one LIBSVM line given as bytes with the standard labels (the hot path: one scan,
/// no UTF-8 check, no allocation unless the line is malformed).
pub fn parse_bytes(line: &[u8], ex: &mut Example) -> Result<bool, String> {
    parse_bytes_with(line, ex, Labels::Standard)
}

/// [`parse_bytes`] with the label rule `labels`.
pub fn parse_bytes_with(line: &[u8], ex: &mut Example, labels: Labels) -> Result<bool, String> {
    ex.keys.clear();
    ex.values.clear();
    let body = match memchr_hash(line) {
        Some(i) => &line[..i],
        None => line,
    };
    let n = body.len();
    let mut i = 0;
    while i < n && is_space(body[i]) {
        i += 1;
    }
    if i == n {
        return Ok(false);
    }
    let start = i;
    while i < n && !is_space(body[i]) {
        i += 1;
    }
    ex.label = match (labels, &body[start..i]) {
        (Labels::Standard, b"1" | b"+1" | b"1.0" | b"+1.0") => 1.0,
        (Labels::Standard, b"0" | b"-1" | b"0.0" | b"-1.0") => 0.0,
        (Labels::Standard, other) => {
            return Err(format!("label {} is not one of +1, 1, -1, 0 (other labels: --positive-label L)", show(other)))
        }
        (Labels::Positive(p), t) => match std::str::from_utf8(t).ok().and_then(|t| t.parse::<f64>().ok()) {
            Some(v) => f32::from(u8::from(v == p)),
            None => return Err(format!("label {} is not a number", show(t))),
        },
    };
    loop {
        while i < n && is_space(body[i]) {
            i += 1;
        }
        if i == n {
            return Ok(true);
        }
        let start = i;
        // The id: its decimal digits, eight at a time (cannot overflow within 19 digits;
        // longer ids are checked below).
        let (id, digits) = leading_digits(&body[i..]);
        i += digits;
        let id_end = i;
        let mut ok = id_end - start < 20 || (id_end - start == 20 && body[start..id_end] <= b"18446744073709551615"[..]);
        // the value: a short decimal read in place, or the text up to the next space for the
        // standard parser
        let mut read = None;
        let val = if i < n && body[i] == b':' {
            let vs = i + 1;
            match decimal(&body[vs..]) {
                Some((x, len)) if body.get(vs + len).is_none_or(|&b| is_space(b)) => {
                    read = Some(x);
                    i = vs + len;
                }
                _ => {
                    while i < n && !is_space(body[i]) {
                        i += 1;
                    }
                }
            }
            Some(&body[vs..i])
        } else {
            None
        };
        if i < n && !is_space(body[i]) {
            // a non-digit inside the id
            while i < n && !is_space(body[i]) {
                i += 1;
            }
            ok = false;
        }
        let f = &body[start..i];
        if !ok || id_end == start {
            let idt = &body[start..f.iter().position(|&b| b == b':').map_or(i, |c| start + c)];
            return Err(format!("feature {}: id {} is not an unsigned 64-bit integer", show(f), show(idt)));
        }
        if id == u64::MAX {
            return Err(format!("feature id {id} is reserved"));
        }
        let v = match (val, read) {
            (None, _) => 1.0,
            (Some(_), Some(x)) => x,
            (Some(v), None) => {
                let x: f32 = std::str::from_utf8(v)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("feature {}: value {} is not a number", show(f), show(v)))?;
                if !x.is_finite() {
                    return Err(format!("feature {}: value is not finite", show(f)));
                }
                x
            }
        };
        ex.keys.push(id);
        ex.values.push(v);
    }
}

/// The decimal digits at the start of `s`: their value (wrapping past `u64::MAX`: the
/// caller checks their count) and how many there are. Eight bytes at a time: a feature id
/// of up to eight digits takes one step with no branch per digit (a loop over the bytes
/// mispredicted its exit once per id, and ids vary in length).
#[inline(always)]
fn leading_digits(s: &[u8]) -> (u64, usize) {
    const POW10: [u64; 9] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000];
    let (mut value, mut n) = (0u64, 0usize);
    loop {
        let rest = &s[n..];
        // eight bytes, little-endian (the first in the lowest byte); past the end, zeros,
        // which are not digits
        let word = match rest.first_chunk::<8>() {
            Some(w) => u64::from_le_bytes(*w),
            // (byte by byte: a copy into an array then one load stalls on the store)
            None => rest.iter().rev().fold(0, |w, &b| w << 8 | b as u64),
        };
        // each byte's digit value, if it is a digit ('0'..='9' are 0x30..=0x39)
        let d = word ^ 0x3030_3030_3030_3030;
        // a byte's high bit set where it is not a digit (d ≥ 10); a carry into a later byte
        // only comes from a byte already marked, and only the first mark counts
        let marks = (d.wrapping_add(0x7676_7676_7676_7676) | d) & 0x8080_8080_8080_8080;
        let k = if marks == 0 { 8 } else { marks.trailing_zeros() as usize / 8 };
        if k > 0 {
            // the k digits moved to the high bytes (zeros before them: leading zeros)
            let v = if k == 8 { d } else { d << (8 * (8 - k)) };
            // pairs, then fours, then all eight (each step multiplies the higher-order
            // half by 10^width and adds the lower)
            let v = (v.wrapping_mul(10 << 8 | 1) >> 8) & 0x00FF_00FF_00FF_00FF;
            let v = (v.wrapping_mul(100 << 16 | 1) >> 16) & 0x0000_FFFF_0000_FFFF;
            let v = v.wrapping_mul(10_000 << 32 | 1) >> 32;
            value = value.wrapping_mul(POW10[k]).wrapping_add(v);
            n += k;
        }
        if k < 8 {
            return (value, n);
        }
    }
}

/// A feature value that starts `v` written as a short decimal (`[+-]digits[.digits]`, at
/// most 2^24 without its point and at most ten digits after it): the value and the length
/// of its text, or None for any other form (the caller checks that the text ends there and
/// hands any other to the standard parser). Both the digits without the point and the power
/// of ten are exact in an `f32`, so one division rounds correctly: the value the standard
/// parser gives.
#[inline]
fn decimal(v: &[u8]) -> Option<(f32, usize)> {
    let (neg, sign) = match v.first() {
        Some(b'-') => (true, 1),
        Some(b'+') => (false, 1),
        _ => (false, 0),
    };
    let body = &v[sign..];
    let (int, int_len) = leading_digits(body);
    let (frac, point, frac_len) = match body.get(int_len) {
        Some(b'.') => {
            let (f, l) = leading_digits(&body[int_len + 1..]);
            (f, 1, l)
        }
        _ => (0, 0, 0),
    };
    if int_len + frac_len == 0 || int_len + frac_len > 19 || frac_len > 10 {
        return None;
    }
    const POW10: [f32; 11] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10];
    let m = int.checked_mul(10u64.pow(frac_len as u32))?.checked_add(frac)?;
    if m > 1 << 24 {
        return None;
    }
    let x = m as f32 / POW10[frac_len];
    Some((if neg { -x } else { x }, sign + int_len + point + frac_len))
}

/// Where a line's comment starts (a vectorised search: the whole line is scanned for it).
#[inline]
fn memchr_hash(line: &[u8]) -> Option<usize> {
    memchr::memchr(b'#', line)
}

/// Streams the examples of one LIBSVM file, or of one worker's [`Piece`] of it.
pub struct LibsvmReader {
    src: LineSource,
    labels: Labels,
}

impl LibsvmReader {
    /// Opens `path` for reading (standard labels).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DataError> {
        Ok(LibsvmReader { src: LineSource::open(path.as_ref())?, labels: Labels::Standard })
    }

    /// Opens one worker's piece of a file.
    pub fn open_piece(piece: &Piece) -> Result<Self, DataError> {
        Ok(LibsvmReader { src: LineSource::open_piece(piece)?, labels: Labels::Standard })
    }

    /// Reads labels by `labels`.
    pub fn with_labels(mut self, labels: Labels) -> Self {
        self.labels = labels;
        self
    }

    /// Bytes of input consumed so far.
    pub fn consumed(&self) -> u64 {
        self.src.consumed()
    }

    /// A `FILE:LINE: what` error for the example read last.
    pub fn error(&mut self, what: impl Into<String>) -> DataError {
        self.src.error(what)
    }

    /// Reads the next example into `ex`; `Ok(false)` at the end of the file.
    pub fn next_into(&mut self, ex: &mut Example) -> Result<bool, DataError> {
        loop {
            let Some(line) = self.src.next_line()? else { return Ok(false) };
            match parse_bytes_with(line, ex, self.labels) {
                Ok(true) => return Ok(true),
                Ok(false) => continue,
                Err(what) => return Err(self.src.error(what)),
            }
        }
    }
}

impl Iterator for LibsvmReader {
    type Item = Result<Example, DataError>;
    fn next(&mut self) -> Option<Self::Item> {
        let mut ex = Example::default();
        match self.next_into(&mut ex) {
            Ok(true) => Some(Ok(ex)),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn parses_labels_ids_and_default_values() {
        let mut ex = Example::default();
        assert!(parse_line("+1 3:0.5 7 12:2 # comment", &mut ex).unwrap());
        assert_eq!(ex, Example { label: 1.0, keys: vec![3, 7, 12], values: vec![0.5, 1.0, 2.0] });
        assert!(parse_line("-1", &mut ex).unwrap());
        assert_eq!(ex.label, 0.0);
        assert!(ex.keys.is_empty());
        assert!(!parse_line("   # only a comment", &mut ex).unwrap());
        assert!(parse_line("2 1:1", &mut ex).unwrap_err().contains("--positive-label"));
        // one label positive, every other negative
        assert!(parse_bytes_with(b"2 1:1", &mut ex, Labels::Positive(2.0)).unwrap());
        assert_eq!(ex.label, 1.0);
        assert!(parse_bytes_with(b"1 1:1", &mut ex, Labels::Positive(2.0)).unwrap());
        assert_eq!(ex.label, 0.0);
        assert!(parse_bytes_with(b"4.0 1:1", &mut ex, Labels::Positive(4.0)).unwrap());
        assert_eq!(ex.label, 1.0);
        assert!(parse_bytes_with(b"x 1:1", &mut ex, Labels::Positive(4.0)).unwrap_err().contains("not a number"));
        // which rule the first labels call for
        assert_eq!(Labels::detect(&[-1.0, 1.0]), Ok(Labels::Standard));
        assert_eq!(Labels::detect(&[0.0, 1.0]), Ok(Labels::Standard));
        assert_eq!(Labels::detect(&[1.0, 2.0]), Ok(Labels::Positive(2.0)));
        assert_eq!(Labels::detect(&[2.0, 4.0]), Ok(Labels::Positive(4.0)));
        assert!(Labels::detect(&[0.0, 1.0, 2.0]).unwrap_err().contains("--positive-label"));
        assert!(parse_line("1 x:1", &mut ex).unwrap_err().contains("unsigned"));
        assert!(parse_line("1 3x:1", &mut ex).unwrap_err().contains("unsigned"));
        assert!(parse_line("1 :1", &mut ex).unwrap_err().contains("unsigned"));
        assert!(parse_line("1 -3", &mut ex).unwrap_err().contains("unsigned"));
        assert!(parse_line("1 3:abc", &mut ex).unwrap_err().contains("not a number"));
        assert!(parse_line("1 3:inf", &mut ex).unwrap_err().contains("finite"));
        assert!(parse_line("1 99999999999999999999999:1", &mut ex).unwrap_err().contains("unsigned"));
        assert!(parse_line("1\t3:1.5e1  4:-2\r", &mut ex).unwrap());
        assert_eq!(ex.values, vec![15.0, -2.0]);
    }

    #[test]
    fn malformed_line_names_file_and_line_and_gzip_is_transparent() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("a.txt");
        std::fs::write(&plain, "1 1:1\n\n0 2:1\n1 3:zz\n").unwrap();
        let mut r = LibsvmReader::open(&plain).unwrap();
        assert!(r.next().unwrap().is_ok());
        assert!(r.next().unwrap().is_ok());
        let e = r.next().unwrap().unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:4: ", plain.display())), "{e}");

        let gz = dir.path().join("b.data");
        let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
        enc.write_all(b"1 5:2\n-1 6\n").unwrap();
        enc.finish().unwrap();
        let all: Vec<Example> = LibsvmReader::open(&gz).unwrap().map(|e| e.unwrap()).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1], Example { label: 0.0, keys: vec![6], values: vec![1.0] });
        let missing = LibsvmReader::open(dir.path().join("nope")).err().unwrap().to_string();
        assert!(missing.contains("nope"), "{missing}");
    }

    /// The digit scanner before [`leading_digits`]: one byte at a time.
    fn leading_digits_bytewise(s: &[u8]) -> (u64, usize) {
        let (mut value, mut n) = (0u64, 0);
        while let Some(d) = s.get(n).map(|b| b.wrapping_sub(b'0')).filter(|&d| d <= 9) {
            value = value.wrapping_mul(10).wrapping_add(d as u64);
            n += 1;
        }
        (value, n)
    }

    #[test]
    fn eight_digits_at_a_time_reads_every_length_and_stops_at_any_byte() {
        for len in 0..=24usize {
            for stop in [None, Some(b' '), Some(b':'), Some(b'/'), Some(b':' + 1), Some(0u8), Some(0xff), Some(b'0' + 10)] {
                let mut s: Vec<u8> = (0..len).map(|i| b'0' + ((i * 7 + 3) % 10) as u8).collect();
                s.extend(stop);
                s.extend_from_slice(b"123");
                if stop.is_none() {
                    s.truncate(len);
                }
                assert_eq!(leading_digits(&s), leading_digits_bytewise(&s), "{:?}", String::from_utf8_lossy(&s));
            }
        }
        assert_eq!(leading_digits(b"18446744073709551615 "), (u64::MAX, 20));
        assert_eq!(leading_digits(b"00000000000000000042"), (42, 20));
    }

    /// [`decimal`] when it reads the whole of `text`.
    fn whole(text: &str) -> Option<f32> {
        decimal(text.as_bytes()).filter(|&(_, len)| len == text.len()).map(|(x, _)| x)
    }

    #[test]
    fn short_decimals_take_the_fast_path_and_other_forms_the_standard_parser() {
        for (text, x) in [("0.25", 0.25f32), ("-2", -2.0), ("+3.5", 3.5), ("1.", 1.0), (".5", 0.5), ("0.1", 0.1), ("16777216", 16777216.0)]
        {
            assert_eq!(whole(text), Some(x), "{text}");
        }
        for text in ["", ".", "-", "+", "1.5e1", "16777217", "0.00000000001", "inf", "nan", "1..2", "1.2.3", "--1", "1x"] {
            assert_eq!(whole(text), None, "{text}");
        }
        // a value read in place up to the space after it
        let mut ex = Example::default();
        assert!(parse_line("1 3:0.25 4:1.5e1\t5:-7 6:.5", &mut ex).unwrap());
        assert_eq!(ex.values, vec![0.25, 15.0, -7.0, 0.5]);
        assert!(parse_line("1 3:0.25x", &mut ex).unwrap_err().contains("not a number"));
    }

    proptest::proptest! {
        #[test]
        fn eight_digits_at_a_time_equals_a_byte_loop(s in proptest::collection::vec(proptest::prop_oneof![b'0'..=b'9', proptest::num::u8::ANY], 0..40)) {
            proptest::prop_assert_eq!(leading_digits(&s), leading_digits_bytewise(&s));
        }

        #[test]
        fn short_decimals_read_as_the_standard_parser_reads_them(s in "[+-]?[0-9]{0,12}(\\.[0-9]{0,12})?([eE][+-]?[0-9]{1,2})?") {
            let std: Option<f32> = s.parse().ok();
            if let Some(x) = whole(&s) {
                proptest::prop_assert_eq!(Some(x.to_bits()), std.map(f32::to_bits), "{}", s);
            }
        }

        #[test]
        fn arbitrary_lines_never_panic(line in ".{0,80}") {
            let mut ex = Example::default();
            let _ = parse_line(&line, &mut ex);
        }

        // The scanner agrees with a plain split-and-parse reading of well-formed lines.
        #[test]
        fn well_formed_lines_parse_to_their_features(label in proptest::bool::ANY, feats in proptest::collection::vec((proptest::prop_oneof![0u64..1000, 0u64..100_000_000, 0u64..u64::MAX], proptest::option::of(-1e6f32..1e6)), 0..20), sep in "[ \t]{1,3}") {
            let mut line = if label { "+1".to_string() } else { "-1".to_string() };
            for (k, v) in &feats {
                line.push_str(&sep);
                match v { Some(v) => line.push_str(&format!("{k}:{v}")), None => line.push_str(&k.to_string()) }
            }
            let mut ex = Example::default();
            proptest::prop_assert!(parse_line(&line, &mut ex).unwrap());
            proptest::prop_assert_eq!(ex.label, if label { 1.0 } else { 0.0 });
            proptest::prop_assert_eq!(ex.keys, feats.iter().map(|f| f.0).collect::<Vec<_>>());
            proptest::prop_assert_eq!(ex.values, feats.iter().map(|f| f.1.unwrap_or(1.0)).collect::<Vec<_>>());
        }
    }
}
