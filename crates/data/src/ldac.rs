//! Bag-of-words corpora for topic models (`train lda`): Blei's LDA-C format, one document
//! per line, `N id:count id:count …` (`N` distinct word ids, each with its count in the
//! document), as David Blei's `lda-c`, the PyPI `lda` package's `reuters.ldac` and
//! `gensim`'s `BleiCorpus` write it; and a vocabulary file, one word per line (line `i`
//! names word id `i`). Gzip is read transparently; a malformed line is an error naming the
//! file and line.

use crate::libsvm::DataError;
use crate::lines::LineSource;
use std::path::Path;

/// A corpus: every document's distinct words and their counts, as contiguous columns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Corpus {
    /// Document `d`'s entries are `words[starts[d]..starts[d + 1]]` (`starts.len()` is the
    /// number of documents plus one).
    pub starts: Vec<usize>,
    /// Word ids.
    pub words: Vec<u32>,
    /// How often each entry's word occurs in its document (at least 1).
    pub counts: Vec<u32>,
}

impl Corpus {
    /// The number of documents.
    pub fn docs(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// Document `d`'s word ids and counts. Needs `d < self.docs()`.
    pub fn doc(&self, d: usize) -> (&[u32], &[u32]) {
        let r = self.starts[d]..self.starts[d + 1];
        (&self.words[r.clone()], &self.counts[r])
    }

    /// The number of tokens (the sum of all counts).
    pub fn tokens(&self) -> u64 {
        self.counts.iter().map(|&c| c as u64).sum()
    }

    /// One more than the largest word id (0 when empty).
    pub fn vocab_bound(&self) -> usize {
        self.words.iter().max().map_or(0, |&w| w as usize + 1)
    }
}

fn field(f: &[u8]) -> &str {
    std::str::from_utf8(f).unwrap_or("(not UTF-8)")
}

/// Reads an LDA-C corpus. Blank lines and lines starting with `#` are skipped; a document
/// with no word (`0`) is kept (it has no token to sample).
pub fn read_ldac(path: &Path) -> Result<Corpus, DataError> {
    let mut src = LineSource::open(path)?;
    let mut c = Corpus { starts: vec![0], ..Corpus::default() };
    while let Some(line) = src.next_line()? {
        let mut fields = line.split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty());
        let Some(n) = fields.next() else { continue };
        if n.first() == Some(&b'#') {
            continue;
        }
        let n: usize = match field(n).parse() {
            Ok(n) => n,
            Err(_) => {
                let what = format!("{:?} is not a word count (an LDA-C line is `N id:count …`)", field(n));
                return Err(src.error(what));
            }
        };
        let mut got = 0usize;
        let mut bad = None;
        for f in fields {
            got += 1;
            let parsed = f.iter().position(|&b| b == b':').and_then(|i| {
                let id = field(&f[..i]).parse::<u32>().ok()?;
                let count = field(&f[i + 1..]).parse::<u32>().ok().filter(|&c| c >= 1)?;
                Some((id, count))
            });
            match parsed {
                Some((id, count)) => {
                    c.words.push(id);
                    c.counts.push(count);
                }
                None => {
                    bad = Some(format!("{:?} is not `id:count` (a word id and a positive count)", field(f)));
                    break;
                }
            }
        }
        if let Some(what) = bad {
            return Err(src.error(what));
        }
        if got != n {
            return Err(src.error(format!("the line says {n} words but lists {got}")));
        }
        c.starts.push(c.words.len());
    }
    Ok(c)
}

/// Reads a vocabulary: line `i` (0-based, blank lines included, surrounding whitespace
/// trimmed) is the word of id `i`.
pub fn read_vocab(path: &Path) -> Result<Vec<String>, DataError> {
    let mut src = LineSource::open(path)?;
    let mut v = Vec::new();
    while let Some(l) = src.next_line()? {
        v.push(String::from_utf8_lossy(l).trim().to_string());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldac_lines_read_as_documents_and_bad_lines_name_file_and_line() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.ldac");
        std::fs::write(&p, "2 0:1 3:4\n0\n\n1 2:2\n").unwrap();
        let c = read_ldac(&p).unwrap();
        assert_eq!(c.docs(), 3);
        assert_eq!(c.doc(0), (&[0u32, 3][..], &[1u32, 4][..]));
        assert_eq!(c.doc(1), (&[][..], &[][..]));
        assert_eq!(c.doc(2), (&[2u32][..], &[2u32][..]));
        assert_eq!((c.tokens(), c.vocab_bound()), (7, 4));
        for (text, want) in [
            ("1 0:1\n2 1:1\n", "c.ldac:2: the line says 2 words but lists 1"),
            ("1 0:1\n1 1:0\n", "c.ldac:2: \"1:0\" is not `id:count`"),
            ("x 0:1\n", "c.ldac:1: \"x\" is not a word count"),
            ("1 0:1\n\n1 a:1\n", "c.ldac:3: \"a:1\""),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = read_ldac(&p).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let v = d.path().join("vocab");
        std::fs::write(&v, "church\npope\n").unwrap();
        assert_eq!(read_vocab(&v).unwrap(), vec!["church", "pope"]);
    }
}
