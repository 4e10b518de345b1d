//! Rating triples `(user, item, rating)` for matrix factorisation (`train mf`), from
//! MovieLens-style files: RecBole's `.inter` (tab-separated, a `user_id:token
//! item_id:token rating:float …` header), CSV or TSV `user,item,rating[,…]` with or without
//! a header line, and ml-1m's `user::item::rating::timestamp`. Gzip is read transparently.
//! Users and items are non-negative integer ids; a malformed line is an error naming the
//! file and line.

use crate::libsvm::DataError;
use flate2::read::MultiGzDecoder;
use std::io::{BufRead, BufReader, Read};
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

/// Reads every rating of `path` (see the module's documentation for the formats).
pub fn read_ratings(path: &Path) -> Result<Ratings, DataError> {
    let io = |source| DataError::Io { path: path.to_path_buf(), source };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut magic = [0u8; 2];
    let gz = f.read(&mut magic).map_err(io)? == 2 && magic == [0x1f, 0x8b];
    let f = std::fs::File::open(path).map_err(io)?;
    let r: Box<dyn BufRead> = if gz {
        Box::new(BufReader::with_capacity(1 << 16, MultiGzDecoder::new(BufReader::new(f))))
    } else {
        Box::new(BufReader::with_capacity(1 << 16, f))
    };
    let mut out = Ratings::default();
    for (i, line) in r.lines().enumerate() {
        let line = line.map_err(io)?;
        let n = i as u64 + 1;
        let bad = |what: String| DataError::Malformed { path: path.to_path_buf(), line: n, what };
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let sep = if t.contains("::") {
            "::"
        } else if t.contains('\t') {
            "\t"
        } else if t.contains(',') {
            ","
        } else {
            " "
        };
        let mut fields = t.split(sep).filter(|f| sep != " " || !f.is_empty());
        let (Some(u), Some(it), Some(v)) = (fields.next(), fields.next(), fields.next()) else {
            let n_fields = t.split(sep).filter(|f| sep != " " || !f.is_empty()).count();
            return Err(bad(format!("{n_fields} fields; a rating line is user, item, rating")));
        };
        let (u, it, v) = (u.trim(), it.trim(), v.trim());
        // A header: the first line whose id fields are not numbers.
        if out.is_empty() && n == 1 && u.parse::<u64>().is_err() && it.parse::<u64>().is_err() {
            continue;
        }
        let user = u.parse::<u64>().map_err(|_| bad(format!("user id {u:?} is not a non-negative integer")))?;
        let item = it.parse::<u64>().map_err(|_| bad(format!("item id {it:?} is not a non-negative integer")))?;
        let value = match v.parse::<f32>() {
            Ok(x) if x.is_finite() => x,
            _ => return Err(bad(format!("rating {v:?} is not a number"))),
        };
        out.users.push(user);
        out.items.push(item);
        out.values.push(value);
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
        let p = d.path().join("bad.csv");
        std::fs::write(&p, "1,2,3\n4,x,5\n").unwrap();
        let e = read_ratings(&p).unwrap_err().to_string();
        assert!(e.contains("bad.csv:2") && e.contains("item id \"x\""), "{e}");
        std::fs::write(&p, "1,2,3\n4,5\n").unwrap();
        assert!(read_ratings(&p).unwrap_err().to_string().contains("bad.csv:2: 2 fields"));
        std::fs::write(&p, "1,2,3\n4,5,nan\n").unwrap();
        assert!(read_ratings(&p).unwrap_err().to_string().contains("bad.csv:2: rating"));
    }
}
