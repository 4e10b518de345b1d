//! How a shuffle's messages travel: the master writes a round of messages into the mailbox
//! (a dense `assign` table of 32-bit words, each carried as the bits of an `f32`), every
//! learner pulls the parts of it that name it, and two barriers separate the rounds.
//!
//! A round, in words: `[rounds left after this one, words used]`, then for every learner
//! `k` the offset and length of its list of spans, then the lists (pairs `offset, words`:
//! runs of consecutive messages that all name `k`), then the messages. A message is
//! `[m, (learner, row, bytes) × m, payload]`, the payload the XOR of the `m` rows
//! ([`downpour_core::shuffle::encode`]) packed little-endian into words. A message is
//! written once however many learners read it: the servers fan it out.

use anyhow::{bail, ensure, Result};
use downpour_core::shuffle::{Message, Part};
use downpour_worker::WorkerSession;

/// The master's rows: one arena of bytes.
pub(crate) struct Rows {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Rows {
    pub fn new() -> Rows {
        Rows { bytes: Vec::new(), ends: Vec::new() }
    }

    pub fn push(&mut self, row: &[u8]) {
        self.bytes.extend_from_slice(row);
        self.ends.push(self.bytes.len());
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn get(&self, r: u32) -> Option<&[u8]> {
        let r = r as usize;
        let end = *self.ends.get(r)?;
        let start = if r == 0 { 0 } else { self.ends[r - 1] };
        Some(&self.bytes[start..end])
    }

    /// Total bytes.
    pub fn bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Words of every row, each padded to a word.
    pub fn words(&self) -> usize {
        (0..self.len() as u32).map(|r| self.get(r).map_or(0, |b| b.len().div_ceil(4))).sum()
    }

    /// The longest row, in bytes.
    pub fn longest(&self) -> usize {
        (0..self.len() as u32).map(|r| self.get(r).map_or(0, <[u8]>::len)).max().unwrap_or(0)
    }
}

/// Words of a round's fixed header for `n` learners.
fn header(n: usize) -> usize {
    2 + 2 * n
}

/// The words a mailbox needs so that every message fits a round: twice the data (rows and
/// their part headers) or one round of the longest message, whichever is more.
pub(crate) fn capacity(n: usize, rows: &Rows) -> usize {
    let one = header(n) + 2 * n + 1 + 3 * n + rows.longest().div_ceil(4);
    (2 * (rows.words() + 4 * rows.len()) + header(n) + 64).max(one)
}

/// What a shuffle wrote.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sent {
    pub messages: u64,
    pub rounds: u64,
    /// Words written (headers, span lists, messages).
    pub words: u64,
    /// Payload bytes (the XOR of each message's rows, unpadded).
    pub payload: u64,
}

/// The rounds carrying `msgs` for `n` learners in a mailbox of `cap` words.
pub(crate) fn layout(n: usize, cap: usize, msgs: &[Message], rows: &Rows) -> Result<(Vec<Vec<f32>>, Sent)> {
    let mut sent = Sent { messages: msgs.len() as u64, ..Sent::default() };
    // the messages of each round (greedy; 2 words per part bounds its span-list cost)
    let mut rounds: Vec<std::ops::Range<usize>> = Vec::new();
    let (mut start, mut used) = (0, header(n));
    let size = |m: &Message| -> Result<(usize, usize)> {
        let mut longest = 0;
        for p in &m.parts {
            let Some(b) = rows.get(p.row) else { bail!("shuffle plan names row {} of {}", p.row, rows.len()) };
            longest = longest.max(b.len());
        }
        Ok((1 + 3 * m.parts.len() + longest.div_ceil(4), longest))
    };
    for (i, m) in msgs.iter().enumerate() {
        let cost = size(m)?.0 + 2 * m.parts.len();
        ensure!(header(n) + cost <= cap, "a shuffle message of {cost} words does not fit the mailbox of {cap}");
        if used + cost > cap {
            rounds.push(start..i);
            (start, used) = (i, header(n));
        }
        used += cost;
    }
    rounds.push(start..msgs.len());
    let total = rounds.len();
    let mut out = Vec::with_capacity(total);
    let mut payload = Vec::new();
    for (ri, range) in rounds.into_iter().enumerate() {
        // spans per learner, relative to the first message
        let mut spans: Vec<Vec<(u32, u32)>> = vec![Vec::new(); n];
        let mut at = 0u32;
        for m in &msgs[range.clone()] {
            let w = size(m)?.0 as u32;
            for p in &m.parts {
                let list = &mut spans[p.learner as usize];
                match list.last_mut() {
                    Some((o, len)) if *o + *len == at => *len += w,
                    _ => list.push((at, w)),
                }
            }
            at += w;
        }
        let lists: usize = spans.iter().map(|l| 2 * l.len()).sum();
        let base = (header(n) + lists) as u32;
        let mut words: Vec<u32> = Vec::with_capacity(base as usize + at as usize);
        words.extend([(total - ri - 1) as u32, base + at]);
        let mut list_at = header(n) as u32;
        for l in &spans {
            words.extend([list_at, l.len() as u32]);
            list_at += 2 * l.len() as u32;
        }
        for l in &spans {
            for &(o, len) in l {
                words.extend([base + o, len]);
            }
        }
        for m in &msgs[range] {
            words.push(m.parts.len() as u32);
            for p in &m.parts {
                let len = rows.get(p.row).map_or(0, <[u8]>::len);
                words.extend([p.learner, p.row, len as u32]);
            }
            downpour_core::shuffle::encode(&m.parts, |r| rows.get(r), &mut payload)?;
            sent.payload += payload.len() as u64;
            words.extend(payload.chunks(4).map(|c| {
                let mut b = [0u8; 4];
                b[..c.len()].copy_from_slice(c);
                u32::from_le_bytes(b)
            }));
        }
        debug_assert_eq!(words.len(), (base + at) as usize);
        sent.words += words.len() as u64;
        out.push(words.into_iter().map(f32::from_bits).collect());
    }
    sent.rounds = total as u64;
    Ok((out, sent))
}

/// One message as a learner reads it.
#[derive(Debug)]
pub(crate) struct Received {
    pub parts: Vec<Part>,
    /// Byte length of each part's row.
    pub lens: Vec<u32>,
    pub payload: Vec<u8>,
}

/// Appends the messages of one span (consecutive messages that all name learner `k` of
/// `n`) to `got`. Errors name what is malformed instead of reading past it.
pub(crate) fn parse_span(words: &[u32], n: usize, k: usize, got: &mut Vec<Received>) -> Result<()> {
    let mut i = 0;
    while i < words.len() {
        let m = words[i] as usize;
        ensure!(m >= 1 && m <= n && i + 1 + 3 * m <= words.len(), "a message of {m} parts at word {i}");
        let mut parts = Vec::with_capacity(m);
        let mut lens = Vec::with_capacity(m);
        for j in 0..m {
            let at = i + 1 + 3 * j;
            ensure!((words[at] as usize) < n, "a part for learner {} of {n} at word {at}", words[at]);
            parts.push(Part { learner: words[at], row: words[at + 1] });
            lens.push(words[at + 2]);
        }
        let longest = lens.iter().copied().max().unwrap_or(0) as usize;
        let body = i + 1 + 3 * m;
        let pw = longest.div_ceil(4);
        ensure!(body + pw <= words.len(), "a message's payload runs past its span at word {i}");
        ensure!(parts.iter().any(|p| p.learner as usize == k), "a message at word {i} does not name learner {k}");
        let mut payload: Vec<u8> = words[body..body + pw].iter().flat_map(|w| w.to_le_bytes()).collect();
        payload.truncate(longest);
        got.push(Received { parts, lens, payload });
        i = body + pw;
    }
    Ok(())
}

/// Learner `k`'s messages of the round in the mailbox `table` (of `cap` words), and how many
/// rounds follow. Errors name what is malformed instead of reading past it.
pub(crate) fn read_round(s: &mut WorkerSession, table: u32, n: usize, k: usize, cap: usize) -> Result<(u32, Vec<Received>)> {
    let mut buf = Vec::new();
    read_with(
        |at, len| {
            buf.clear();
            buf.resize(len, 0f32);
            s.kv.pull_range_into(table, at as u64, &mut buf)?;
            Ok(buf.iter().map(|v| v.to_bits()).collect())
        },
        n,
        k,
        cap,
    )
}

/// [`read_round`] over `fetch(offset, words)`, which reads words of the round.
fn read_with(mut fetch: impl FnMut(usize, usize) -> Result<Vec<u32>>, n: usize, k: usize, cap: usize) -> Result<(u32, Vec<Received>)> {
    let head = fetch(0, header(n))?;
    let (left, used) = (head[0], head[1] as usize);
    ensure!(used <= cap, "shuffle round of {used} words in a mailbox of {cap}");
    let (list_at, spans) = (head[2 + 2 * k] as usize, head[3 + 2 * k] as usize);
    ensure!(list_at + 2 * spans <= used, "shuffle round: learner {k}'s span list runs past the round");
    let list = if spans > 0 { fetch(list_at, 2 * spans)? } else { Vec::new() };
    let mut got = Vec::new();
    for pair in list.chunks(2) {
        let (o, len) = (pair[0] as usize, pair[1] as usize);
        ensure!(o + len <= used && len > 0, "shuffle round: span {o}+{len} outside the {used} words written");
        let words = fetch(o, len)?;
        parse_span(&words, n, k, &mut got).map_err(|e| anyhow::anyhow!("shuffle round, span at word {o}: {e}"))?;
    }
    Ok((left, got))
}

#[cfg(test)]
mod tests {
    use super::*;
    use downpour_core::shuffle::{assignment, decode, plan, Caches, Delivery, ShuffleSpec};

    fn rows(q: usize) -> Rows {
        let mut r = Rows::new();
        for i in 0..q {
            // every byte value, NaN-forming words included
            let row: Vec<u8> = (0..(i * 37) % 61 + 1).map(|j| (i * 131 + j * 251) as u8).collect();
            r.push(&row);
        }
        r
    }

    /// Every learner reads, from rounds laid out in a small mailbox, exactly the messages
    /// naming it, and decodes its rows byte for byte.
    #[test]
    fn rounds_carry_every_message_to_the_learners_it_names() {
        let (n, q) = (4, 300);
        let data = rows(q);
        let spec = ShuffleSpec { learners: n, rows: q, cache: 0.5, seed: 3 };
        let old = assignment(&spec, 0);
        let caches = Caches::initial(&spec, &old);
        let new = assignment(&spec, 1);
        let msgs = plan(&spec, &caches, &new, Delivery::Coded).unwrap();
        let cap = 300;
        let (rounds, sent) = layout(n, cap, &msgs, &data).unwrap();
        assert!(rounds.len() > 2, "a small mailbox takes several rounds");
        assert_eq!(sent.rounds as usize, rounds.len());
        for k in 0..n {
            let mut got = 0;
            for (i, round) in rounds.iter().enumerate() {
                assert!(round.len() <= cap);
                let words: Vec<u32> = round.iter().map(|v| v.to_bits()).collect();
                let (left, msgs_k) = read_with(|at, len| Ok(words[at..at + len].to_vec()), n, k, cap).unwrap();
                assert_eq!(left as usize, rounds.len() - i - 1);
                for m in msgs_k {
                    let j = m.parts.iter().position(|p| p.learner as usize == k).unwrap();
                    let row = m.parts[j].row;
                    let held = |r: u32| caches.holds(k, r).then(|| data.get(r)).flatten();
                    let bytes = decode(&m.parts, &m.payload, k as u32, m.lens[j] as usize, held).unwrap();
                    assert_eq!(bytes, data.get(row).unwrap(), "learner {k} row {row}");
                    got += 1;
                }
            }
            assert_eq!(got, caches.missing(&new, k).len(), "learner {k}");
        }
    }

    #[test]
    fn malformed_rounds_are_refused() {
        let n = 2;
        let mut words = [0u32, 100, 0, 0, 0, 0];
        assert!(read_with(|at, len| Ok(words[at..at + len].to_vec()), n, 0, 50).unwrap_err().to_string().contains("mailbox of 50"));
        words[1] = 6;
        words[2] = 5;
        words[3] = 4;
        assert!(read_with(|at, len| Ok(words[at..at + len].to_vec()), n, 0, 50).unwrap_err().to_string().contains("span list"));
        let mut got = Vec::new();
        assert!(parse_span(&[3, 0, 1, 4], n, 0, &mut got).is_err(), "more parts than learners");
        assert!(parse_span(&[1, 0, 1, 400, 7], n, 0, &mut got).is_err(), "payload past the span");
        assert!(parse_span(&[1, 1, 1, 4, 7], n, 0, &mut got).is_err(), "not for this learner");
        assert!(parse_span(&[1, 9, 1, 4, 7], n, 0, &mut got).is_err(), "a learner out of range");
        parse_span(&[1, 0, 1, 3, 0x0063_6261], n, 0, &mut got).unwrap();
        assert_eq!(got[0].payload, b"abc");
    }
}
