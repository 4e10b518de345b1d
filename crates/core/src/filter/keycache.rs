//! Key caching: a worker pulls and pushes the same key lists again and again (the same
//! minibatch keys, the same feature block), so after the first time it sends a 128-bit
//! signature instead of the list.
//!
//! The sender decides where the receiver keeps each list: a cache of `slots` entries, filled
//! and overwritten in round-robin order, so on one ordered connection the receiver's slot
//! `s` holds what the sender last put there. A message either carries its keys with their
//! signature and slot (the receiver stores them there, after checking the signature), or
//! only the signature and slot (the receiver reads the slot and checks the signature). The
//! receiver may also drop entries on its own (it keeps at most `max_bytes` of key lists);
//! a reference to a dropped or different entry is a [`CoreError::KeyCacheMiss`], which the
//! sender answers by forgetting the signature and sending the keys again
//! ([`KeyCache::forget`]). A wrong key list is never produced: every list read from the
//! cache matches the signature the sender computed from its keys.

use super::{Filter, Message};
use crate::{CoreError, Result};
use std::collections::HashMap;

/// Key lists shorter than this go raw: the signature and slot would not save much.
pub const MIN_KEYS: usize = 4;

/// The 128-bit signature of a key list's raw bytes.
pub fn signature(key_bytes: &[u8]) -> [u8; 16] {
    let h = blake3::hash(key_bytes);
    let mut s = [0u8; 16];
    s.copy_from_slice(&h.as_bytes()[..16]);
    s
}

/// The key-caching filter. One instance per connection and direction: the sender's holds
/// which signature is in which receiver slot, the receiver's holds the lists.
pub struct KeyCache {
    slots: usize,
    max_bytes: usize,
    /// Sender: signature → slot, and the slot to fill next.
    sent: HashMap<[u8; 16], u32>,
    by_slot: Vec<Option<[u8; 16]>>,
    next: usize,
    /// Receiver: per slot, the signature and the raw key bytes.
    held: Vec<Option<([u8; 16], Vec<u8>)>>,
    held_bytes: usize,
    /// Lists sent as a signature, and misses answered.
    hits: u64,
    misses: u64,
}

impl KeyCache {
    /// A cache of `slots` key lists (at least 1) holding at most `max_bytes` of keys on the
    /// receiver. Sender and receiver must use the same `max_bytes`: the sender never caches a
    /// list larger than that.
    pub fn new(slots: usize, max_bytes: usize) -> KeyCache {
        let slots = slots.max(1);
        KeyCache {
            slots,
            max_bytes,
            sent: HashMap::new(),
            by_slot: vec![None; slots],
            next: 0,
            held: vec![None; slots],
            held_bytes: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// Sender: the receiver answered a miss for `sig`; its next use sends the keys again.
    pub fn forget(&mut self, sig: &[u8]) {
        if let Ok(s) = <[u8; 16]>::try_from(sig) {
            if let Some(slot) = self.sent.remove(&s) {
                self.by_slot[slot as usize] = None;
            }
        }
        self.misses += 1;
    }

    /// Sender: messages sent as a signature so far; misses answered.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    /// Receiver: drops slot `slot` (as it would under memory pressure).
    pub fn evict(&mut self, slot: usize) {
        if let Some(Some((_, b))) = self.held.get_mut(slot).map(|h| h.take()) {
            self.held_bytes -= b.len();
        }
    }

    fn store(&mut self, slot: usize, sig: [u8; 16], bytes: Vec<u8>) {
        self.evict(slot);
        // Keep within the byte budget by dropping other lists (their next use misses).
        let mut i = 0;
        while self.held_bytes + bytes.len() > self.max_bytes && i < self.slots {
            if i != slot {
                self.evict(i);
            }
            i += 1;
        }
        if self.held_bytes + bytes.len() <= self.max_bytes {
            self.held_bytes += bytes.len();
            self.held[slot] = Some((sig, bytes));
        }
    }
}

impl Filter for KeyCache {
    fn name(&self) -> &'static str {
        "key-cache"
    }

    fn encode(&mut self, m: &mut Message) -> Result<()> {
        m.to_wire();
        // Too short to be worth a signature, or too long for the receiver to keep (it would
        // miss every time and cost a resend per message): sent as it is.
        if (m.enc.num_keys as usize) < MIN_KEYS || m.key_bytes.len() > self.max_bytes {
            return Ok(());
        }
        let sig = signature(&m.key_bytes);
        m.enc.key_sig = prost::bytes::Bytes::copy_from_slice(&sig);
        if let Some(&slot) = self.sent.get(&sig) {
            m.enc.key_slot = slot;
            m.enc.keys_omitted = true;
            m.key_bytes.clear();
            self.hits += 1;
            return Ok(());
        }
        let slot = self.next;
        self.next = (self.next + 1) % self.slots;
        if let Some(old) = self.by_slot[slot].take() {
            self.sent.remove(&old);
        }
        self.by_slot[slot] = Some(sig);
        self.sent.insert(sig, slot as u32);
        m.enc.key_slot = slot as u32;
        Ok(())
    }

    fn omits_known_parts(&self) -> bool {
        true
    }

    fn forget(&mut self, sig: &[u8]) {
        KeyCache::forget(self, sig)
    }

    fn decode(&mut self, m: &mut Message) -> Result<()> {
        if m.enc.key_sig.is_empty() {
            return Ok(());
        }
        let sig = <[u8; 16]>::try_from(m.enc.key_sig.as_ref())
            .map_err(|_| CoreError::Codec(format!("a key signature of {} bytes (16 expected)", m.enc.key_sig.len())))?;
        let slot = m.enc.key_slot as usize;
        if slot >= self.slots {
            return Err(CoreError::Codec(format!("key cache slot {slot} of {}", self.slots)));
        }
        if m.enc.keys_omitted {
            match &self.held[slot] {
                Some((s, bytes)) if *s == sig => {
                    m.key_bytes = bytes.clone();
                    m.enc.keys_omitted = false;
                    Ok(())
                }
                _ => Err(CoreError::KeyCacheMiss { slot: slot as u32 }),
            }
        } else {
            if signature(&m.key_bytes) != sig {
                return Err(CoreError::Codec("the key list does not match its signature".into()));
            }
            self.store(slot, sig, m.key_bytes.clone());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::Pipeline;
    use proptest::prelude::*;

    fn send(tx: &mut KeyCache, keys: &[u64]) -> Message {
        let mut m = Message::new(keys.to_vec(), vec![], 1);
        tx.encode(&mut m).unwrap();
        m
    }

    proptest! {
        // Random streams of key lists over a small cache, with the receiver dropping entries
        // at random and its byte budget forcing more: every decoded list is the one sent,
        // and every miss is cured by resending.
        #[test]
        fn misses_and_evictions_never_produce_a_wrong_key_list(
            lists in proptest::collection::vec(0usize..6, 1..200),
            evictions in proptest::collection::vec(any::<bool>(), 200),
            slots in 1usize..5,
            budget_lists in 1usize..6,
        ) {
            let pool: Vec<Vec<u64>> = (0..6u64).map(|i| (0..(10 + i * 3)).map(|k| k * 7 + i).collect()).collect();
            let mut tx = KeyCache::new(slots, 1 << 20);
            let mut rx = KeyCache::new(slots, budget_lists * 8 * 30);
            for (n, &which) in lists.iter().enumerate() {
                if evictions[n % evictions.len()] {
                    rx.evict(n % slots);
                }
                let keys = &pool[which];
                let m = send(&mut tx, keys);
                let mut got = Message::from_wire(m.key_bytes.clone(), vec![], 1, m.enc.clone());
                match rx.decode(&mut got) {
                    Ok(()) => {
                        got.to_typed().unwrap();
                        prop_assert_eq!(&got.keys, keys);
                    }
                    Err(CoreError::KeyCacheMiss { .. }) => {
                        prop_assert!(m.enc.keys_omitted, "a miss on a message that carried its keys");
                        tx.forget(&m.enc.key_sig);
                        let again = send(&mut tx, keys);
                        prop_assert!(!again.enc.keys_omitted, "the resend carries the keys");
                        let mut got = Message::from_wire(again.key_bytes, vec![], 1, again.enc);
                        rx.decode(&mut got).unwrap();
                        got.to_typed().unwrap();
                        prop_assert_eq!(&got.keys, keys);
                    }
                    Err(e) => prop_assert!(false, "{e}"),
                }
            }
        }
    }

    #[test]
    fn a_repeated_key_list_travels_as_its_signature() {
        let keys: Vec<u64> = (0..1000).map(|k| k * 13).collect();
        let mut tx = Pipeline::new();
        tx.push(Box::new(KeyCache::new(4, 1 << 20)));
        let mut rx = Pipeline::new();
        rx.push(Box::new(KeyCache::new(4, 1 << 20)));
        let mut sizes = vec![];
        for _ in 0..3 {
            let mut m = Message::new(keys.clone(), vec![0.5; 1000], 1);
            tx.encode(&mut m).unwrap();
            sizes.push(m.key_bytes.len());
            let mut r = Message::from_wire(m.key_bytes, m.value_bytes, 1, m.enc);
            rx.decode(&mut r).unwrap();
            assert_eq!(r.keys, keys);
        }
        assert_eq!(sizes, vec![8000, 0, 0]);
    }

    #[test]
    fn a_list_larger_than_the_receivers_budget_always_travels_whole() {
        let keys: Vec<u64> = (0..100).collect();
        let mut tx = KeyCache::new(4, 400);
        for _ in 0..3 {
            let m = send(&mut tx, &keys);
            assert!(m.enc.key_sig.is_empty() && m.key_bytes.len() == 800, "800 bytes of keys > 400: never cached");
        }
    }

    #[test]
    fn a_tampered_key_list_or_signature_is_refused() {
        let keys: Vec<u64> = (0..10).collect();
        let mut tx = KeyCache::new(2, 1 << 20);
        let mut rx = KeyCache::new(2, 1 << 20);
        let m = send(&mut tx, &keys);
        let mut bad = m.key_bytes.clone();
        bad[3] ^= 1;
        let mut r = Message::from_wire(bad, vec![], 1, m.enc.clone());
        assert!(matches!(rx.decode(&mut r), Err(CoreError::Codec(_))));
        let mut enc = m.enc.clone();
        enc.key_slot = 9;
        assert!(rx.decode(&mut Message::from_wire(m.key_bytes.clone(), vec![], 1, enc)).is_err());
        let mut enc = m.enc;
        enc.key_sig = prost::bytes::Bytes::from_static(&[1, 2, 3]);
        assert!(rx.decode(&mut Message::from_wire(m.key_bytes, vec![], 1, enc)).is_err());
    }
}
