//! Bag-of-words corpora for topic models (`train lda`), in either of the two formats they
//! ship in, told apart by their first line:
//!
//! * Blei's **LDA-C**, one document per line, `N id:count id:count …` (`N` distinct word
//!   ids, each with its count in the document), as David Blei's `lda-c`, the PyPI `lda`
//!   package's `reuters.ldac` and gensim's `BleiCorpus` write it; word ids from 0;
//! * the **UCI bag-of-words** `docword` files (KOS, NIPS, Enron, NYTimes, PubMed): three
//!   header lines (documents, words, non-zeros), then `docID wordID count` per line, both ids
//!   from 1 (read here as word id `wordID - 1`, document `docID - 1`, so line `i` of the
//!   matching `vocab` file, from 0, still names word `i`).
//!
//! And a vocabulary file, one word per line (line `i` names word id `i`). Gzip is read
//! transparently; a malformed line is an error naming the file and line.

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

/// Whether `line` is one unsigned integer and nothing else (a UCI header line).
fn lone_number(line: &[u8]) -> bool {
    let t = line.trim_ascii();
    !t.is_empty() && t.iter().all(u8::is_ascii_digit)
}

/// Reads a corpus in LDA-C or UCI bag-of-words format (see the module's documentation):
/// UCI when the first line is a lone number (an LDA-C line is never one unless its document
/// is empty, `0`, and an LDA-C file does not start with three of them).
pub fn read_corpus(path: &Path) -> Result<Corpus, DataError> {
    let mut src = LineSource::open(path)?;
    let mut head = 0;
    while head < 3 {
        match src.next_line()? {
            Some(l) if lone_number(l) && l.trim_ascii() != b"0" => head += 1,
            _ => break,
        }
    }
    if head == 3 {
        read_uci(src)
    } else {
        read_ldac(path)
    }
}

/// Reads the body of a UCI `docword` file (its three header lines already read).
fn read_uci(mut src: LineSource) -> Result<Corpus, DataError> {
    let mut entries: Vec<(u32, u32, u32)> = Vec::new();
    while let Some(line) = src.next_line()? {
        let mut f = line.split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty());
        let (Some(d), Some(w), Some(n)) = (f.next(), f.next(), f.next()) else {
            if line.trim_ascii().is_empty() {
                continue;
            }
            return Err(src.error("a UCI bag-of-words line is `docID wordID count`"));
        };
        let num = |x: &[u8]| field(x).parse::<u32>().ok().filter(|&v| v >= 1);
        match (num(d), num(w), num(n)) {
            (Some(d), Some(w), Some(n)) if f.next().is_none() => entries.push((d - 1, w - 1, n)),
            _ => {
                let what = format!("{:?} is not `docID wordID count` (three positive integers)", field(line));
                return Err(src.error(what));
            }
        }
    }
    entries.sort_unstable();
    let docs = entries.last().map_or(0, |e| e.0 as usize + 1);
    let mut c = Corpus { starts: Vec::with_capacity(docs + 1), ..Corpus::default() };
    c.starts.push(0);
    let mut next = 0;
    for (d, w, n) in entries {
        while next < d {
            c.starts.push(c.words.len());
            next += 1;
        }
        c.words.push(w);
        c.counts.push(n);
    }
    c.starts.push(c.words.len());
    c.starts.truncate(docs + 1);
    Ok(c)
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
        // the same corpus in UCI bag-of-words form (1-based ids, a header of three counts)
        let u = d.path().join("docword.txt");
        std::fs::write(&u, "3\n4\n3\n1 1 1\n1 4 4\n3 3 2\n").unwrap();
        let uci = read_corpus(&u).unwrap();
        std::fs::write(&p, "2 0:1 3:4\n0\n1 2:2\n").unwrap();
        assert_eq!(uci, read_corpus(&p).unwrap());
        std::fs::write(&u, "3\n4\n3\n1 1 1\n2 x 1\n").unwrap();
        let e = read_corpus(&u).unwrap_err().to_string();
        assert!(e.contains("docword.txt:5") && e.contains("docID wordID count"), "{e}");
        let v = d.path().join("vocab");
        std::fs::write(&v, "church\npope\n").unwrap();
        assert_eq!(read_vocab(&v).unwrap(), vec!["church", "pope"]);
    }
}
