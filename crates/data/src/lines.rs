//! Reading one worker's share of a file, line by line, as bytes.
//!
//! A [`Piece`] names what a worker reads of one file:
//! * a **byte range** of an uncompressed file: a line belongs to the range that holds its
//!   first byte, so the ranges `[r·n/W, (r+1)·n/W)` of `W` workers give every line to exactly
//!   one worker, and each worker reads only its own part of the file;
//! * **every `of`-th line** of a gzip file (which cannot be entered in the middle): the
//!   worker decompresses the whole file but skips other workers' lines without parsing them.
//!
//! Pieces are plain data, so a share can be handed to another worker later.
//!
//! Line numbers for error messages are exact in both cases. A reader that starts in the
//! middle of a file does not know its line number; it is computed, by counting newlines
//! before the offending line, only when an error needs it.

use crate::libsvm::DataError;
use flate2::read::MultiGzDecoder;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// What one worker reads of one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Lines starting in the bytes `[begin, end)` of an uncompressed file.
    Bytes {
        /// The file.
        path: PathBuf,
        /// First byte (inclusive).
        begin: u64,
        /// Last byte (exclusive).
        end: u64,
    },
    /// Lines whose 0-based index `i` has `i % of == rank` (gzip files, or any file).
    EveryNth {
        /// The file.
        path: PathBuf,
        /// Which residue.
        rank: u64,
        /// Modulus (the number of workers).
        of: u64,
    },
}

impl Piece {
    /// Bytes of the file this piece covers, when known in advance (byte ranges).
    pub fn byte_len(&self) -> Option<u64> {
        match self {
            Piece::Bytes { begin, end, .. } => Some(end.saturating_sub(*begin)),
            Piece::EveryNth { .. } => None,
        }
    }

    /// The file this piece reads.
    pub fn path(&self) -> &Path {
        match self {
            Piece::Bytes { path, .. } | Piece::EveryNth { path, .. } => path,
        }
    }
}

fn is_gzip(path: &Path) -> Result<bool, DataError> {
    let io = |source| DataError::Io { path: path.to_path_buf(), source };
    let mut f = File::open(path).map_err(io)?;
    let mut magic = [0u8; 2];
    let n = f.read(&mut magic).map_err(io)?;
    Ok(n == 2 && magic == [0x1f, 0x8b])
}

/// Bytes below which a file is not cut into more chunks ([`plan_chunks`]).
const MIN_CHUNK: u64 = 256 << 10;
/// Most chunks per worker per file ([`plan_chunks`]).
const MAX_CHUNKS_PER_WORKER: u64 = 64;

/// The chunks of `files` that the coordinator hands out as workers ask for work (data
/// handed out by the scheduler, `downpour_core::chunks`): every file cut into byte ranges of
/// at least 256 KiB, at most 64 per worker, in file order. Every worker computes the same
/// list from the same files; every line belongs to exactly one chunk. Fails on a gzip file
/// (which cannot be entered in the middle, so it cannot be cut into chunks) or one that
/// cannot be opened.
pub fn plan_chunks(files: &[PathBuf], workers: usize) -> Result<Vec<Piece>, DataError> {
    let w = workers.max(1) as u64;
    let mut chunks = Vec::new();
    for path in files {
        if is_gzip(path)? {
            return Err(DataError::Unsuitable {
                path: path.clone(),
                msg: "data handed out in chunks needs uncompressed files (a gzip file cannot be entered in the middle): gunzip it, or use static shares".into(),
            });
        }
        let len = std::fs::metadata(path).map_err(|source| DataError::Io { path: path.clone(), source })?.len();
        let n = (len / MIN_CHUNK).clamp(1, w * MAX_CHUNKS_PER_WORKER);
        let cut = |i: u64| ((len as u128 * i as u128) / n as u128) as u64;
        chunks.extend((0..n).map(|i| Piece::Bytes { path: path.clone(), begin: cut(i), end: cut(i + 1) }));
    }
    Ok(chunks)
}

/// Bytes below which an uncompressed file is not cut into more blocks than workers.
const MIN_BLOCK: u64 = 64 << 10;
/// Most blocks per worker per file.
const MAX_BLOCKS_PER_WORKER: u64 = 64;

/// The share of worker `rank` of `workers` over `files`: of every uncompressed file, every
/// `workers`-th of its byte blocks (up to 64 blocks a worker, of at least 64 KiB), and of every
/// gzip file every `workers`-th line. Interleaved blocks rather than one contiguous range, so
/// a file sorted or grouped by label (as many public sets are) still gives every worker a
/// share that looks like the whole file. Every line of every file belongs to exactly one
/// worker's share (the block holding its first byte). Fails if a file cannot be opened.
pub fn plan_share(files: &[PathBuf], rank: usize, workers: usize) -> Result<Vec<Piece>, DataError> {
    let w = workers.max(1) as u64;
    let r = rank as u64;
    let mut pieces = Vec::with_capacity(files.len());
    for path in files {
        if is_gzip(path)? {
            pieces.push(Piece::EveryNth { path: path.clone(), rank: r, of: w });
        } else {
            let len = std::fs::metadata(path).map_err(|source| DataError::Io { path: path.clone(), source })?.len();
            let per_worker = (len / (w * MIN_BLOCK)).clamp(1, MAX_BLOCKS_PER_WORKER);
            let blocks = w * per_worker;
            let cut = |i: u64| ((len as u128 * i as u128) / blocks as u128) as u64;
            for b in (r..blocks).step_by(w as usize) {
                pieces.push(Piece::Bytes { path: path.clone(), begin: cut(b), end: cut(b + 1) });
            }
        }
    }
    Ok(pieces)
}

/// Streams the lines of one [`Piece`] (or of a whole file) as bytes, without the newline.
pub struct LineSource {
    path: PathBuf,
    input: Box<dyn BufRead + Send>,
    /// Byte offset of the next line's start (uncompressed files).
    pos: u64,
    /// Where reading started.
    start: u64,
    /// Stop before a line that starts at or after this offset.
    end: u64,
    /// Line number of the last line returned, when known.
    line: Option<u64>,
    /// Byte offset of the last line returned (uncompressed files).
    line_start: u64,
    /// `EveryNth`: (rank, of); index of the next line.
    nth: Option<(u64, u64)>,
    index: u64,
    buf: Vec<u8>,
}

impl LineSource {
    /// All lines of `path` (gzip decompressed transparently).
    pub fn open(path: &Path) -> Result<LineSource, DataError> {
        Self::open_piece(&Piece::EveryNth { path: path.to_path_buf(), rank: 0, of: 1 })
    }

    /// The lines of `piece`.
    pub fn open_piece(piece: &Piece) -> Result<LineSource, DataError> {
        let path = piece.path().to_path_buf();
        let io = |source| DataError::Io { path: path.clone(), source };
        let gz = is_gzip(&path)?;
        let mut f = File::open(&path).map_err(io)?;
        let mut src = LineSource {
            path: path.clone(),
            input: Box::new(std::io::empty()),
            pos: 0,
            start: 0,
            end: u64::MAX,
            line: Some(0),
            line_start: 0,
            nth: None,
            index: 0,
            buf: Vec::with_capacity(1024),
        };
        match piece {
            Piece::EveryNth { rank, of, .. } => {
                src.nth = Some((*rank, (*of).max(1)));
                src.input = if gz {
                    Box::new(BufReader::with_capacity(1 << 16, MultiGzDecoder::new(BufReader::new(f))))
                } else {
                    Box::new(BufReader::with_capacity(1 << 16, f))
                };
            }
            Piece::Bytes { begin, end, .. } => {
                if gz {
                    return Err(DataError::Malformed { path, line: 0, what: "a gzip file cannot be read by byte ranges".into() });
                }
                src.end = *end;
                if *begin > 0 {
                    // Start at the first line that begins at or after `begin`: if the byte
                    // before `begin` is a newline, a line starts exactly at `begin`.
                    f.seek(SeekFrom::Start(begin - 1)).map_err(io)?;
                    let mut r = BufReader::with_capacity(1 << 16, f);
                    let mut skipped = Vec::new();
                    let n = r.read_until(b'\n', &mut skipped).map_err(io)?;
                    src.pos = begin - 1 + n as u64;
                    src.start = *begin;
                    src.line = None;
                    src.input = Box::new(r);
                } else {
                    src.input = Box::new(BufReader::with_capacity(1 << 16, f));
                }
            }
        }
        Ok(src)
    }

    /// Bytes consumed so far (of the decompressed stream for gzip files).
    pub fn consumed(&self) -> u64 {
        self.pos - self.start
    }

    /// The file being read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next line of the piece (without its line terminator), or `None` at its end.
    /// Read errors (including corrupt gzip data) name the file and line.
    pub fn next_line(&mut self) -> Result<Option<&[u8]>, DataError> {
        loop {
            if self.pos >= self.end {
                return Ok(None);
            }
            self.buf.clear();
            let n = match self.input.read_until(b'\n', &mut self.buf) {
                Ok(n) => n,
                Err(e) => {
                    let line = self.line.map(|l| l + 1).unwrap_or(0);
                    return Err(DataError::Malformed { path: self.path.clone(), line, what: e.to_string() });
                }
            };
            if n == 0 {
                return Ok(None);
            }
            self.line_start = self.pos;
            self.pos += n as u64;
            self.line = self.line.map(|l| l + 1);
            let i = self.index;
            self.index += 1;
            if let Some((rank, of)) = self.nth {
                if i % of != rank {
                    continue;
                }
            }
            let mut l = &self.buf[..];
            if let [rest @ .., b'\n'] = l {
                l = rest;
            }
            if let [rest @ .., b'\r'] = l {
                l = rest;
            }
            return Ok(Some(l));
        }
    }

    /// The 1-based line number of the last line returned. Exact; for a reader that started
    /// mid-file it is computed now by counting the newlines before that line (slow: for
    /// error messages only).
    pub fn line_number(&mut self) -> u64 {
        if let Some(l) = self.line {
            return l;
        }
        let count = || -> std::io::Result<u64> {
            let mut r = BufReader::with_capacity(1 << 16, File::open(&self.path)?).take(self.line_start);
            let mut n = 0u64;
            loop {
                let chunk = r.fill_buf()?;
                if chunk.is_empty() {
                    return Ok(n + 1);
                }
                n += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
                let len = chunk.len();
                r.consume(len);
            }
        };
        let l = count().unwrap_or(0);
        if l > 0 {
            // Keep counting from here on.
            self.line = Some(l);
        }
        l
    }

    /// A `FILE:LINE: what` error for the last line returned.
    pub fn error(&mut self, what: impl Into<String>) -> DataError {
        let line = self.line_number();
        DataError::Malformed { path: self.path.clone(), line, what: what.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn all_lines(p: &Piece) -> Vec<String> {
        let mut s = LineSource::open_piece(p).unwrap();
        let mut out = vec![];
        while let Some(l) = s.next_line().unwrap() {
            out.push(String::from_utf8(l.to_vec()).unwrap());
        }
        out
    }

    #[test]
    fn chunks_give_every_line_to_exactly_one_chunk_and_gzip_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.svm");
        let lines: Vec<String> = (0..200_000).map(|i| format!("{} {}:1", i % 2, i)).collect();
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        let chunks = plan_chunks(std::slice::from_ref(&p), 2).unwrap();
        assert!(chunks.len() > 1, "{} chunks", chunks.len());
        let mut seen = Vec::new();
        for c in &chunks {
            let mut src = LineSource::open_piece(c).unwrap();
            while let Some(l) = src.next_line().unwrap() {
                seen.push(String::from_utf8(l.to_vec()).unwrap());
            }
        }
        assert_eq!(seen, lines);
        let gz = dir.path().join("a.svm.gz");
        let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
        std::io::Write::write_all(&mut enc, b"1 1:1\n").unwrap();
        enc.finish().unwrap();
        let e = plan_chunks(&[gz], 2).unwrap_err().to_string();
        assert!(e.contains("a.svm.gz") && e.contains("uncompressed"), "{e}");
    }

    #[test]
    fn byte_range_shares_give_every_line_to_exactly_one_worker() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.txt");
        // big enough for several blocks per worker
        let mut lines: Vec<String> = (0..40_000).map(|i| format!("line {i} {}", "x".repeat(i % 13))).collect();
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        lines.sort();
        for w in [1, 2, 3, 7, 64] {
            let mut got: Vec<String> = vec![];
            for r in 0..w {
                let share = plan_share(std::slice::from_ref(&p), r, w).unwrap();
                assert!(share.iter().all(|p| matches!(p, Piece::Bytes { .. })));
                for piece in &share {
                    got.extend(all_lines(piece));
                }
            }
            got.sort();
            assert_eq!(got, lines, "{w} workers");
        }
    }

    #[test]
    fn a_file_grouped_by_label_gives_every_worker_both_labels() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("grouped.svm");
        // the first half all label 0, the second all label 1
        let lines: Vec<String> = (0..200_000).map(|i| format!("{} 1:{i}", if i < 100_000 { 0 } else { 1 })).collect();
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        for r in 0..2 {
            let share = plan_share(std::slice::from_ref(&p), r, 2).unwrap();
            assert!(share.len() > 1, "one block only");
            let mut ones = 0usize;
            let mut n = 0usize;
            for piece in &share {
                for l in all_lines(piece) {
                    n += 1;
                    ones += l.starts_with('1') as usize;
                }
            }
            let frac = ones as f64 / n as f64;
            assert!((0.4..0.6).contains(&frac), "worker {r}: {frac} of its examples are label 1");
        }
    }

    #[test]
    fn gzip_shares_take_every_nth_line() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.gz");
        let mut enc = flate2::write::GzEncoder::new(File::create(&p).unwrap(), flate2::Compression::fast());
        for i in 0..10 {
            writeln!(enc, "{i}").unwrap();
        }
        enc.finish().unwrap();
        let share = plan_share(std::slice::from_ref(&p), 1, 3).unwrap();
        assert_eq!(all_lines(&share[0]), vec!["1", "4", "7"]);
    }

    #[test]
    fn line_numbers_are_exact_in_a_share_that_starts_mid_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.txt");
        std::fs::write(&p, "l1\nl2\nl3\nl4\nl5\nl6\n").unwrap();
        let mut s = LineSource::open_piece(&Piece::Bytes { path: p.clone(), begin: 7, end: 18 }).unwrap();
        assert_eq!(s.next_line().unwrap(), Some(&b"l4"[..]));
        assert_eq!(s.line_number(), 4);
        assert_eq!(s.next_line().unwrap(), Some(&b"l5"[..]));
        let e = s.error("bad").to_string();
        assert_eq!(e, format!("{}:5: bad", p.display()));
    }
}
