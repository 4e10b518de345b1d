//! The messages of one shuffle, and how a learner combines and cancels rows.

use super::{Caches, Delivery, ShuffleSpec};
use crate::{CoreError, Result};
use std::collections::BTreeMap;

/// One row for one learner inside a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Part {
    /// The learner the row is for.
    pub learner: u32,
    /// The row.
    pub row: u32,
}

/// One message the master sends: the XOR of its parts' rows ([`encode`]), read by every
/// learner it names. An uncoded message has one part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The rows combined, one per learner, learners ascending.
    pub parts: Vec<Part>,
}

/// The messages that bring every learner the rows it owns under `new` (an
/// [`super::assignment`]) and does not store (`caches`, as of before the shuffle), in a
/// deterministic order. Every missing row is in exactly one message, and every other row of
/// a message is stored by each learner the message names ([`Delivery::Coded`]).
/// Errors: `new` not one owner per row, an owner out of range, or `caches` of another shape.
pub fn plan(spec: &ShuffleSpec, caches: &Caches, new: &[u32], delivery: Delivery) -> Result<Vec<Message>> {
    spec.validate()?;
    if new.len() != spec.rows || caches.rows != spec.rows || caches.learners != spec.learners {
        return Err(CoreError::Consistency(format!(
            "shuffle plan: {} owners and a record of {} learners × {} rows for {} learners × {} rows",
            new.len(),
            caches.learners,
            caches.rows,
            spec.learners,
            spec.rows
        )));
    }
    if let Some(o) = new.iter().find(|&&o| o as usize >= spec.learners) {
        return Err(CoreError::Consistency(format!("shuffle plan: owner {o} of {} learners", spec.learners)));
    }
    let mut out = Vec::new();
    match delivery {
        Delivery::Uncoded => {
            for k in 0..spec.learners {
                out.extend(caches.missing(new, k).into_iter().map(|row| Message { parts: vec![Part { learner: k as u32, row }] }));
            }
        }
        Delivery::Coded => {
            // missing rows grouped by S = (learners storing the row) ∪ {its learner}
            let mut groups: BTreeMap<u64, BTreeMap<u32, Vec<u32>>> = BTreeMap::new();
            for k in 0..spec.learners {
                for row in caches.missing(new, k) {
                    let s = caches.holders_except(k, row) | 1 << k;
                    groups.entry(s).or_default().entry(k as u32).or_default().push(row);
                }
            }
            for queues in groups.values() {
                let longest = queues.values().map(Vec::len).max().unwrap_or(0);
                for i in 0..longest {
                    let parts = queues.iter().filter_map(|(&learner, rows)| rows.get(i).map(|&row| Part { learner, row })).collect();
                    out.push(Message { parts });
                }
            }
        }
    }
    Ok(out)
}

/// Writes into `out` the XOR of the parts' rows, each padded with zero bytes to the longest:
/// the payload of a message. `row` gives a row's bytes (the master holds them all).
/// Errors: a row `row` does not know.
pub fn encode<'a>(parts: &[Part], row: impl Fn(u32) -> Option<&'a [u8]>, out: &mut Vec<u8>) -> Result<()> {
    out.clear();
    for p in parts {
        let bytes = row(p.row).ok_or_else(|| CoreError::Consistency(format!("shuffle: the master has no row {}", p.row)))?;
        if bytes.len() > out.len() {
            out.resize(bytes.len(), 0);
        }
        xor_into(out, bytes);
    }
    Ok(())
}

/// Learner `learner`'s row from a message's `payload`: the payload with every other part's
/// row, which the learner stores (`held`), cancelled, cut to `len` bytes.
/// Errors ([`CoreError::Codec`]): the message has no part for `learner`, a row it combines
/// is not stored here, or `len` exceeds the payload.
pub fn decode<'a>(parts: &[Part], payload: &[u8], learner: u32, len: usize, held: impl Fn(u32) -> Option<&'a [u8]>) -> Result<Vec<u8>> {
    let Some(mine) = parts.iter().find(|p| p.learner == learner) else {
        return Err(CoreError::Codec(format!("shuffle message {parts:?} holds no row for learner {learner}")));
    };
    if len > payload.len() {
        return Err(CoreError::Codec(format!("shuffle message: row {} of {len} bytes in a payload of {}", mine.row, payload.len())));
    }
    let mut out = payload.to_vec();
    for p in parts.iter().filter(|p| p.learner != learner) {
        let bytes = held(p.row).ok_or_else(|| {
            CoreError::Codec(format!(
                "shuffle message: learner {learner} cannot cancel row {} (for learner {}): it does not store it",
                p.row, p.learner
            ))
        })?;
        if bytes.len() > out.len() {
            return Err(CoreError::Codec(format!("shuffle message: row {} is longer than the payload", p.row)));
        }
        xor_into(&mut out, bytes);
    }
    out.truncate(len);
    Ok(out)
}

fn xor_into(acc: &mut [u8], bytes: &[u8]) {
    for (a, b) in acc.iter_mut().zip(bytes) {
        *a ^= b;
    }
}
