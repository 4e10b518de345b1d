//! The significantly-modified filter (sender side, for pushes of updates): a key's update is
//! added to what the key has accumulated since it was last sent, and the key is sent only
//! when some element of that accumulation exceeds the threshold in absolute value. What is
//! not sent stays accumulated, so nothing is lost: [`SignificantlyModified::flush`] hands
//! back everything still held (at the end of training, say).

use super::{Filter, Message};
use crate::{CoreError, Result};
use std::collections::HashMap;

/// The significantly-modified filter.
pub struct SignificantlyModified {
    threshold: f32,
    /// key → offset of its accumulated values in `acc`.
    index: HashMap<u64, usize>,
    acc: Vec<f32>,
    value_len: usize,
    /// The next message also carries everything held.
    flushing: bool,
}

impl SignificantlyModified {
    /// Sends a key once some element of its accumulated update exceeds `threshold` (≥ 0) in
    /// absolute value.
    pub fn new(threshold: f32) -> SignificantlyModified {
        SignificantlyModified { threshold: threshold.max(0.0), index: HashMap::new(), acc: Vec::new(), value_len: 0, flushing: false }
    }

    /// Everything still accumulated, as (sorted keys, values), and forgets it.
    pub fn flush(&mut self) -> (Vec<u64>, Vec<f32>) {
        let vl = self.value_len.max(1);
        let mut keys: Vec<u64> =
            self.index.iter().filter(|(_, &o)| self.acc[o..o + vl].iter().any(|v| *v != 0.0)).map(|(k, _)| *k).collect();
        keys.sort_unstable();
        let mut values = Vec::with_capacity(keys.len() * vl);
        for k in &keys {
            let o = self.index[k];
            values.extend_from_slice(&self.acc[o..o + vl]);
        }
        self.index.clear();
        self.acc.clear();
        (keys, values)
    }
}

impl Filter for SignificantlyModified {
    fn name(&self) -> &'static str {
        "significantly-modified"
    }

    fn flush_next(&mut self) {
        self.flushing = true;
    }

    fn encode(&mut self, m: &mut Message) -> Result<()> {
        if m.wire {
            return Err(CoreError::Codec("the significantly-modified filter must come before filters that encode the wire form".into()));
        }
        if self.flushing {
            // Add this message to what is held, then send all of it.
            self.flushing = false;
            let vl = if m.keys.is_empty() { self.value_len.max(1) } else { m.value_len };
            if !m.values.is_empty() {
                let t = std::mem::replace(&mut self.threshold, f32::INFINITY);
                let r = self.encode(m);
                self.threshold = t;
                r?;
            }
            let (keys, values) = self.flush();
            m.keys = keys;
            m.values = values;
            m.value_len = vl;
            return Ok(());
        }
        if m.values.is_empty() {
            return Ok(());
        }
        let vl = m.value_len;
        if self.value_len == 0 {
            self.value_len = vl;
        } else if self.value_len != vl {
            return Err(CoreError::Codec(format!("value length {vl} after {}", self.value_len)));
        }
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for (i, k) in m.keys.iter().enumerate() {
            let o = *self.index.entry(*k).or_insert_with(|| {
                self.acc.extend(std::iter::repeat_n(0.0, vl));
                self.acc.len() - vl
            });
            let a = &mut self.acc[o..o + vl];
            for (x, v) in a.iter_mut().zip(&m.values[i * vl..(i + 1) * vl]) {
                *x += *v;
            }
            if a.iter().any(|x| x.abs() > self.threshold) {
                keys.push(*k);
                values.extend_from_slice(a);
                a.iter_mut().for_each(|x| *x = 0.0);
            }
        }
        m.keys = keys;
        m.values = values;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn nothing_is_lost_what_is_not_sent_accumulates(
            pushes in proptest::collection::vec(proptest::collection::vec(-1.0f32..1.0, 20), 1..50),
            threshold in 0.0f32..2.0,
        ) {
            let keys: Vec<u64> = (0..20).map(|k| k * 3 + 1).collect();
            let mut f = SignificantlyModified::new(threshold);
            let mut pushed = [0f64; 20];
            let mut sent = [0f64; 20];
            for v in &pushes {
                let mut m = Message::new(keys.clone(), v.clone(), 1);
                f.encode(&mut m).unwrap();
                prop_assert!(m.keys.windows(2).all(|w| w[0] < w[1]), "still sorted");
                for (k, x) in m.keys.iter().zip(&m.values) {
                    prop_assert!(x.abs() > threshold);
                    sent[((k - 1) / 3) as usize] += *x as f64;
                }
                for i in 0..20 {
                    pushed[i] += v[i] as f64;
                }
            }
            let (fk, fv) = f.flush();
            for (k, x) in fk.iter().zip(&fv) {
                sent[((k - 1) / 3) as usize] += *x as f64;
            }
            for i in 0..20 {
                prop_assert!((sent[i] - pushed[i]).abs() < 1e-3, "key {i}: pushed {} sent {}", pushed[i], sent[i]);
            }
        }
    }

    #[test]
    fn a_flushed_message_carries_everything_held() {
        let mut f = SignificantlyModified::new(1.0);
        let mut m = Message::new(vec![1, 2], vec![0.5, 0.25], 1);
        f.encode(&mut m).unwrap();
        assert!(m.keys.is_empty());
        f.flush_next();
        let mut m = Message::new(vec![3], vec![0.1], 1);
        f.encode(&mut m).unwrap();
        assert_eq!((m.keys, m.values), (vec![1, 2, 3], vec![0.5, 0.25, 0.1]));
        let mut m = Message::new(vec![1], vec![0.5], 1);
        f.encode(&mut m).unwrap();
        assert!(m.keys.is_empty(), "back to holding after the flush");
    }

    #[test]
    fn small_changes_wait_until_they_add_up() {
        let mut f = SignificantlyModified::new(1.0);
        let mut m = Message::new(vec![1, 2], vec![0.6, 2.0], 1);
        f.encode(&mut m).unwrap();
        assert_eq!((m.keys, m.values), (vec![2], vec![2.0]));
        let mut m = Message::new(vec![1, 2], vec![0.6, 0.1], 1);
        f.encode(&mut m).unwrap();
        assert_eq!((m.keys, m.values), (vec![1], vec![1.2]));
        assert_eq!(f.flush(), (vec![2], vec![0.1]));
    }
}
