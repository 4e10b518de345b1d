//! Rating triples `(user, item, rating)` for matrix factorisation (`train mf`), from
//! MovieLens-style files: RecBole's `.inter` (tab-separated, a `user_id:token
//! item_id:token rating:float …` header), CSV, TSV or `;`-separated `user,item,rating[,…]`
//! with or without a header line (fields may be double-quoted, as Book-Crossing's are), and
//! ml-1m's `user::item::rating::timestamp`. Gzip is read transparently. A first line whose
//! rating field is not a number is a header. Ids that are non-negative integers are used as
//! they are; any other id (an ISBN, an Amazon ASIN) is read by [`name_id`], a stable 64-bit
//! hash with the top bit set, so it never meets an integer id below 2⁶³ and every file and
//! worker maps a name alike. A malformed line is an error naming the file and line.

use crate::libsvm::DataError;
use crate::lines::LineSource;
use std::path::Path;

/// Ratings as three parallel columns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ratings {
    /// User ids.
    pub users: Vec<u64>,
    /// Item ids.
    pub items: Vec<u64>,
    /// Ratings.
    pub values: Vec<f32>,
}

impl Ratings {
    /// The number of ratings.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// No rating.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The mean rating (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.is_empty() {
            0.0
        } else {
            self.values.iter().map(|&v| v as f64).sum::<f64>() / self.len() as f64
        }
    }

    /// The smallest and largest rating (`(0, 0)` when empty).
    pub fn range(&self) -> (f32, f32) {
        if self.is_empty() {
            return (0.0, 0.0);
        }
        self.values.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)))
    }
}

/// The id of a non-integer user or item name: FNV-1a over its bytes with the top bit set.
pub fn name_id(name: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h | 1 << 63
}

/// A field without surrounding whitespace and double quotes.
fn unquote(f: &str) -> &str {
    let f = f.trim();
    f.strip_prefix('"').and_then(|f| f.strip_suffix('"')).unwrap_or(f).trim()
}

fn id(field: &str) -> u64 {
    field.parse::<u64>().unwrap_or_else(|_| name_id(field))
}

/// One line: `Ok(None)` for a blank line, a comment or (when `first`) a header.
fn parse_line(t: &str, first: bool) -> Result<Option<(u64, u64, f32)>, String> {
    let t = t.trim();
    if t.is_empty() || t.starts_with('#') {
        return Ok(None);
    }
    let sep = if t.contains("::") {
        "::"
    } else if t.contains('\t') {
        "\t"
    } else if t.contains(',') {
        ","
    } else if t.contains(';') {
        ";"
    } else {
        " "
    };
    let fields = || t.split(sep).filter(|f| sep != " " || !f.is_empty());
    let mut f = fields();
    let (Some(u), Some(it), Some(v)) = (f.next(), f.next(), f.next()) else {
        return Err(format!("{} fields; a rating line is user, item, rating", fields().count()));
    };
    let (u, it, v) = (unquote(u), unquote(it), unquote(v));
    let value = match v.parse::<f32>() {
        Ok(x) if x.is_finite() => x,
        // a header: the first line, with a rating field that is not a number
        _ if first => return Ok(None),
        _ => return Err(format!("rating {v:?} is not a number")),
    };
    if u.is_empty() || it.is_empty() {
        return Err("an empty user or item id".into());
    }
    Ok(Some((id(u), id(it), value)))
}

/// Reads every rating of `path` (see the module's documentation for the formats).
pub fn read_ratings(path: &Path) -> Result<Ratings, DataError> {
    let mut src = LineSource::open(path)?;
    let mut out = Ratings::default();
    let mut first = true;
    while let Some(line) = src.next_line()? {
        let parsed = match std::str::from_utf8(line) {
            Ok(t) if t.trim().is_empty() || t.trim_start().starts_with('#') => continue,
            Ok(t) => parse_line(t, first),
            Err(_) => Err("not UTF-8 text".to_string()),
        };
        first = false;
        match parsed {
            Ok(Some((u, i, v))) => {
                out.users.push(u);
                out.items.push(i);
                out.values.push(v);
            }
            Ok(None) => {}
            Err(what) => return Err(src.error(what)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inter_csv_tsv_and_dat_files_read_alike_and_bad_lines_name_file_and_line() {
        let d = tempfile::tempdir().unwrap();
        let cases = [
            ("a.inter", "user_id:token\titem_id:token\trating:float\ttimestamp:float\n196\t242\t3\t881250949\n186\t302\t4.5\t891717742\n"),
            ("b.csv", "userId,movieId,rating,timestamp\n196,242,3,1\n186,302,4.5,2\n"),
            ("c.tsv", "196\t242\t3\n186\t302\t4.5\n"),
            ("d.dat", "196::242::3::978300760\n186::302::4.5::978302109\n"),
        ];
        for (name, text) in cases {
            let p = d.path().join(name);
            std::fs::write(&p, text).unwrap();
            let r = read_ratings(&p).unwrap();
            assert_eq!((r.users, r.items, r.values), (vec![196, 186], vec![242, 302], vec![3.0, 4.5]), "{name}");
        }
        // Book-Crossing: `;`, quoted fields, ISBNs for items
        let p = d.path().join("BX-Book-Ratings.csv");
        std::fs::write(&p, "\"User-ID\";\"ISBN\";\"Book-Rating\"\n\"276725\";\"034545104X\";\"0\"\n\"276726\";\"0155061224\";\"5\"\n")
            .unwrap();
        let r = read_ratings(&p).unwrap();
        assert_eq!((r.users, r.values), (vec![276725, 276726], vec![0.0, 5.0]));
        assert_eq!(r.items, vec![name_id("034545104X"), 155061224]);
        assert!(name_id("034545104X") >= 1 << 63);
        let p = d.path().join("bad.csv");
        std::fs::write(&p, "1,2,3\n4,,5\n").unwrap();
        let e = read_ratings(&p).unwrap_err().to_string();
        assert!(e.contains("bad.csv:2") && e.contains("empty user or item id"), "{e}");
        std::fs::write(&p, "1,2,3\n4,5\n").unwrap();
        assert!(read_ratings(&p).unwrap_err().to_string().contains("bad.csv:2: 2 fields"));
        std::fs::write(&p, "1,2,3\n4,5,nan\n").unwrap();
        assert!(read_ratings(&p).unwrap_err().to_string().contains("bad.csv:2: rating"));
    }
}
