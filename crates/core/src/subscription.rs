//! The rows a reader subscribed to at one server (Petuum's row registration for SSPPush,
//! seeds' `003_*`): a read cache that asks a server's update feed (`crate::feed`) only
//! wants the rows it holds, and it names each changed row by its *rank* in the subscription
//! instead of its key.
//!
//! Both ends keep the same [`Subscription`]: the server one per connection and table, the
//! reader a copy per server. The reader adds the keys it newly holds with each feed
//! question; the server adds the same keys before answering, keeps of the changed rows
//! only the subscribed ones ([`Subscription::select`]) and sends their ranks, delta-varint
//! coded ([`Subscription::encode_ranks`]); the reader decodes them
//! (`filter::compress::delta_decode_keys`) and turns ranks back into keys
//! ([`Subscription::keys_of`]). Keys are scrambled over the whole `u64` space, so a key
//! delta takes 7–8 bytes, while ranks of a few thousand changed rows among some tens of
//! thousands subscribed take one or two. Both copies change only by [`Subscription::add`]
//! of the same keys in the same order (questions go one at a time on one ordered
//! connection), and each question carries the reader's count and [`Subscription::digest`],
//! so a server whose copy differs (a new connection, a reset for room, another subscriber
//! on the connection) notices, and both start over.

use crate::filter::compress::delta_encode_keys;
use crate::init::splitmix64;
use crate::{CoreError, Result};

/// A sorted set of subscribed keys (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subscription {
    keys: Vec<u64>,
    /// Wrapping sum of `splitmix64(key)` over the keys: equal sets, equal digests.
    digest: u64,
}

impl Subscription {
    /// An empty subscription.
    pub fn new() -> Subscription {
        Subscription::default()
    }

    /// Keys subscribed.
    pub fn len(&self) -> u64 {
        self.keys.len() as u64
    }

    /// Whether no key is subscribed.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Forgets every key.
    pub fn clear(&mut self) {
        self.keys.clear();
        self.digest = 0;
    }

    /// An order-free digest of the keys (the wrapping sum of their `splitmix64`), which a
    /// question carries with the count so that copies of the same length but other keys
    /// are told apart.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// Whether `key` is subscribed.
    pub fn contains(&self, key: u64) -> bool {
        self.keys.binary_search(&key).is_ok()
    }

    /// Adds `new` (sorted ascending; keys already subscribed, or repeated, count once).
    /// Costs a search per new key and a pass moving the keys after the first one added.
    /// Errors, leaving the subscription as it was, when `new` is not sorted.
    pub fn add(&mut self, new: &[u64]) -> Result<()> {
        if new.windows(2).any(|w| w[0] > w[1]) {
            return Err(CoreError::Codec("keys to subscribe are not sorted".into()));
        }
        let old = self.keys.len();
        // the new keys not held yet, appended, then merged in from the back (in place)
        let mut prev = None;
        for &k in new {
            if prev != Some(k) && self.keys[..old].binary_search(&k).is_err() {
                self.keys.push(k);
                self.digest = self.digest.wrapping_add(splitmix64(k));
            }
            prev = Some(k);
        }
        let (mut i, mut j, mut at) = (old, self.keys.len() - old, self.keys.len());
        if j == 0 || i == 0 || self.keys[i - 1] < self.keys[old] {
            return Ok(());
        }
        let added: Vec<u64> = self.keys[old..].to_vec();
        while j > 0 {
            at -= 1;
            if i > 0 && self.keys[i - 1] > added[j - 1] {
                self.keys[at] = self.keys[i - 1];
                i -= 1;
            } else {
                self.keys[at] = added[j - 1];
                j -= 1;
            }
        }
        Ok(())
    }

    /// Keeps in `changed` (sorted, unique) only the subscribed keys, and sets `ranks` to
    /// their ranks in the subscription (ascending, one per kept key).
    pub fn select(&self, changed: &mut Vec<u64>, ranks: &mut Vec<u64>) {
        ranks.clear();
        let keys = &self.keys[..];
        let mut from = 0;
        changed.retain(|&k| {
            // both sorted: gallop from the last match (the next one is usually near), then
            // search the bracket found
            let mut step = 1;
            while from + step < keys.len() && keys[from + step] < k {
                step *= 2;
            }
            let lo = from + step / 2;
            let hi = (from + step + 1).min(keys.len());
            from = lo + keys[lo.min(hi)..hi].partition_point(|&x| x < k);
            if keys.get(from) == Some(&k) {
                ranks.push(from as u64);
                from += 1;
                true
            } else {
                false
            }
        });
    }

    /// Appends `ranks` (ascending, from [`Subscription::select`]) to `out`, delta-varint
    /// coded: the first against 0, so every chunk of an answer decodes on its own.
    pub fn encode_ranks(ranks: &[u64], out: &mut Vec<u8>) {
        delta_encode_keys(ranks, out);
    }

    /// Turns `ranks` (decoded from [`Subscription::encode_ranks`] with
    /// `filter::compress::delta_decode_keys`) into the keys they name, in place. Errors,
    /// leaving `ranks` partly turned, when a rank is past the subscription (a server whose
    /// copy differs from this one's).
    pub fn keys_of(&self, ranks: &mut [u64]) -> Result<()> {
        for r in ranks {
            match self.keys.get(*r as usize) {
                Some(&k) => *r = k,
                None => return Err(CoreError::Codec(format!("rank {r} of a subscription of {} keys", self.keys.len()))),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_added_out_of_order_merge_sorted_and_once() {
        let mut s = Subscription::new();
        s.add(&[10, 20, 30]).unwrap();
        s.add(&[5, 20, 20, 25, 40]).unwrap();
        s.add(&[50, 50, 60]).unwrap();
        assert_eq!(s.keys, vec![5, 10, 20, 25, 30, 40, 50, 60]);
        assert!(s.add(&[3, 1]).is_err());
        assert_eq!(s.len(), 8);
        // the digest is of the set, whatever the order keys came in
        let mut t = Subscription::new();
        t.add(&[5, 10, 20, 25, 30, 40, 50, 60]).unwrap();
        assert_eq!((s.digest(), &s.keys), (t.digest(), &t.keys));
        let mut u = Subscription::new();
        u.add(&[5, 10, 20, 25, 30, 40, 50, 61]).unwrap();
        assert_ne!(s.digest(), u.digest());
        s.clear();
        assert_eq!(s.digest(), 0);
    }

    #[test]
    fn a_rank_past_the_subscription_is_refused() {
        let mut s = Subscription::new();
        s.add(&[7, 9]).unwrap();
        let mut ranks = vec![0, 2];
        let e = s.keys_of(&mut ranks).unwrap_err();
        assert!(e.to_string().contains("rank 2 of a subscription of 2 keys"), "{e}");
    }

    proptest! {
        #[test]
        fn keys_added_in_any_parts_make_the_union_and_its_digest(
            parts in proptest::collection::vec(proptest::collection::vec(0u64..500, 0..60), 0..8),
        ) {
            let mut s = Subscription::new();
            let mut all = std::collections::BTreeSet::new();
            for mut p in parts {
                p.sort_unstable();
                s.add(&p).unwrap();
                all.extend(p);
            }
            let want: Vec<u64> = all.iter().copied().collect();
            let digest = want.iter().fold(0u64, |d, &k| d.wrapping_add(splitmix64(k)));
            prop_assert_eq!(&s.keys, &want);
            prop_assert_eq!(s.digest(), digest);
        }

        #[test]
        fn the_changed_rows_a_reader_holds_come_back_by_rank(
            held in proptest::collection::btree_set(any::<u64>(), 0..2000),
            other in proptest::collection::btree_set(any::<u64>(), 0..300),
            cut in 0usize..300,
            stride in 1usize..40,
        ) {
            let held: Vec<u64> = held.into_iter().collect();
            // the server's copy and the reader's get the same keys in two questions
            let (a, b) = held.split_at(cut.min(held.len()));
            let (mut server, mut reader) = (Subscription::new(), Subscription::new());
            let (mut b, mut a) = (b.to_vec(), a.to_vec());
            b.sort_unstable();
            a.sort_unstable();
            for part in [&b, &a] {
                server.add(part).unwrap();
                reader.add(part).unwrap();
            }
            prop_assert_eq!(&server, &reader);
            let mut whole = Subscription::new();
            whole.add(&held).unwrap();
            prop_assert_eq!(&whole, &reader);
            // changed: some held rows and some never held
            let mut changed: Vec<u64> = held.iter().step_by(stride).copied().chain(other.iter().copied()).collect();
            changed.sort_unstable();
            changed.dedup();
            let want: Vec<u64> = changed.iter().copied().filter(|k| held.binary_search(k).is_ok()).collect();
            let mut ranks = Vec::new();
            server.select(&mut changed, &mut ranks);
            prop_assert_eq!(&changed, &want);
            let mut coded = Vec::new();
            Subscription::encode_ranks(&ranks, &mut coded);
            let mut got = Vec::new();
            crate::filter::compress::delta_decode_keys(&coded, ranks.len(), &mut got).unwrap();
            prop_assert_eq!(&got, &ranks);
            reader.keys_of(&mut got).unwrap();
            prop_assert_eq!(got, want);
        }
    }
}
