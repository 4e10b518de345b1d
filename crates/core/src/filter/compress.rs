//! Compression of a message's wire form. Sorted keys are first delta-coded as LEB128
//! varints (consecutive minibatch keys are close, so most deltas take 1–3 bytes instead of 8),
//! then keys and values are compressed with LZ4 or Zstandard. Each part is left as it is when
//! coding it would not save at least 1/16 of its size, and the receiver learns which from
//! the encoding. Decoding checks every length against the sender's declared raw length and a
//! hard cap, so a corrupt or hostile payload cannot make the receiver allocate without bound.

use super::{Filter, Message};
use crate::{CoreError, Result};

/// Parts smaller than this are not worth compressing.
const MIN_BYTES: usize = 64;
/// The largest raw part a receiver accepts (1 GiB).
pub const MAX_RAW: u64 = 1 << 30;

/// The compressor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// LZ4 (fast; `lz4_flex`).
    Lz4,
    /// Zstandard at this level (denser, slower).
    Zstd(i32),
}

impl Codec {
    fn id(self) -> u32 {
        match self {
            Codec::Lz4 => 1,
            Codec::Zstd(_) => 2,
        }
    }
}

/// The compression filter.
pub struct Compress {
    codec: Codec,
}

impl Compress {
    /// Compresses with `codec`.
    pub fn new(codec: Codec) -> Compress {
        Compress { codec }
    }
}

/// Delta + LEB128 varint coding of sorted keys (raw little-endian bytes in, varints out).
pub fn delta_encode(key_bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key_bytes.len() / 2);
    let mut prev = 0u64;
    for c in key_bytes.chunks_exact(8) {
        let k = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
        push_varint(&mut out, k.wrapping_sub(prev));
        prev = k;
    }
    out
}

/// [`delta_encode`] of typed keys, appended to `out` (the first key is coded against 0).
/// Keys out of order still round-trip (their deltas wrap), they only code long.
pub fn delta_encode_keys(keys: &[u64], out: &mut Vec<u8>) {
    out.reserve(keys.len() * 2);
    let mut prev = 0u64;
    for &k in keys {
        push_varint(out, k.wrapping_sub(prev));
        prev = k;
    }
}

fn push_varint(out: &mut Vec<u8>, mut d: u64) {
    loop {
        let b = (d & 0x7f) as u8;
        d >>= 7;
        if d == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// Inverse of [`delta_encode`]; `n` keys expected.
pub fn delta_decode(bytes: &[u8], n: usize) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(n.min(MAX_RAW as usize / 8) * 8);
    decode_varints(bytes, n, |k| out.extend_from_slice(&k.to_le_bytes()))?;
    Ok(out)
}

/// Inverse of [`delta_encode_keys`]: appends the `n` keys `bytes` codes to `out`.
/// Errors (and leaves `out` with what was decoded so far) when `bytes` is cut short, holds
/// a delta longer than 64 bits, or codes another number of keys than `n`.
pub fn delta_decode_keys(bytes: &[u8], n: usize, out: &mut Vec<u64>) -> Result<()> {
    out.reserve(n.min(bytes.len()));
    decode_varints(bytes, n, |k| out.push(k))
}

fn decode_varints(bytes: &[u8], n: usize, mut emit: impl FnMut(u64)) -> Result<()> {
    let (mut prev, mut d, mut shift, mut got) = (0u64, 0u64, 0u32, 0usize);
    for &b in bytes {
        if shift >= 64 {
            return Err(CoreError::Codec("a key delta is longer than 64 bits".into()));
        }
        d |= ((b & 0x7f) as u64) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            if got == n {
                return Err(CoreError::Codec(format!("more than the {n} delta-coded keys expected")));
            }
            prev = prev.wrapping_add(d);
            emit(prev);
            got += 1;
            (d, shift) = (0, 0);
        }
    }
    if shift != 0 || got != n {
        return Err(CoreError::Codec(format!("{got} delta-coded keys decoded, {n} expected")));
    }
    Ok(())
}

fn squeeze(codec: Codec, raw: &[u8]) -> Option<Vec<u8>> {
    if raw.len() < MIN_BYTES {
        return None;
    }
    let c = match codec {
        Codec::Lz4 => lz4_flex::block::compress(raw),
        Codec::Zstd(level) => zstd::bulk::compress(raw, level).ok()?,
    };
    (c.len() + raw.len() / 16 <= raw.len()).then_some(c)
}

fn expand(codec: u32, packed: &[u8], raw_len: u64) -> Result<Vec<u8>> {
    if raw_len > MAX_RAW {
        return Err(CoreError::Codec(format!("a part of {raw_len} bytes exceeds the {MAX_RAW}-byte limit")));
    }
    let out = match codec {
        1 => lz4_flex::block::decompress(packed, raw_len as usize).map_err(|e| CoreError::Codec(format!("LZ4: {e}")))?,
        2 => zstd::bulk::decompress(packed, raw_len as usize).map_err(|e| CoreError::Codec(format!("Zstandard: {e}")))?,
        x => return Err(CoreError::Codec(format!("unknown codec {x}"))),
    };
    if out.len() as u64 != raw_len {
        return Err(CoreError::Codec(format!("decompressed {} bytes, {raw_len} declared", out.len())));
    }
    Ok(out)
}

impl Filter for Compress {
    fn name(&self) -> &'static str {
        match self.codec {
            Codec::Lz4 => "lz4",
            Codec::Zstd(_) => "zstd",
        }
    }

    fn encode(&mut self, m: &mut Message) -> Result<()> {
        m.to_wire();
        if !m.key_bytes.is_empty() {
            let delta = delta_encode(&m.key_bytes);
            let mut keys = if delta.len() + m.key_bytes.len() / 16 <= m.key_bytes.len() {
                m.enc.keys_delta = true;
                delta
            } else {
                std::mem::take(&mut m.key_bytes)
            };
            m.enc.keys_raw_len = keys.len() as u64;
            if let Some(c) = squeeze(self.codec, &keys) {
                m.enc.keys_codec = self.codec.id();
                keys = c;
            }
            m.key_bytes = keys;
        }
        if let Some(c) = squeeze(self.codec, &m.value_bytes) {
            m.enc.values_raw_len = m.value_bytes.len() as u64;
            m.enc.values_codec = self.codec.id();
            m.value_bytes = c;
        }
        Ok(())
    }

    fn decode(&mut self, m: &mut Message) -> Result<()> {
        if m.enc.keys_codec != 0 {
            m.key_bytes = expand(m.enc.keys_codec, &m.key_bytes, m.enc.keys_raw_len)?;
            m.enc.keys_codec = 0;
        }
        if m.enc.keys_delta {
            m.key_bytes = delta_decode(&m.key_bytes, m.enc.num_keys.min(MAX_RAW / 8) as usize)?;
            m.enc.keys_delta = false;
        }
        if m.enc.values_codec != 0 {
            m.value_bytes = expand(m.enc.values_codec, &m.value_bytes, m.enc.values_raw_len)?;
            m.enc.values_codec = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn delta_varints_round_trip_any_sorted_keys(mut keys in proptest::collection::vec(any::<u64>(), 0..300)) {
            keys.sort_unstable();
            keys.dedup();
            let raw: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
            prop_assert_eq!(delta_decode(&delta_encode(&raw), keys.len()).unwrap(), raw);
        }
    }

    #[test]
    fn close_keys_and_zero_values_shrink_and_corrupt_payloads_are_errors() {
        let keys: Vec<u64> = (0..10_000u64).map(|i| 1_000_000 + i * 3).collect();
        let mut values = vec![0f32; 10_000];
        values[17] = 1.5;
        for codec in [Codec::Lz4, Codec::Zstd(3)] {
            let mut m = Message::new(keys.clone(), values.clone(), 1);
            let mut c = Compress::new(codec);
            c.encode(&mut m).unwrap();
            assert!(m.key_bytes.len() < 80_000 / 8, "{codec:?}: keys {} bytes", m.key_bytes.len());
            assert!(m.value_bytes.len() < 40_000 / 20, "{codec:?}: values {} bytes", m.value_bytes.len());
            let mut r = Message::from_wire(m.key_bytes.clone(), m.value_bytes.clone(), 1, m.enc.clone());
            Compress::new(codec).decode(&mut r).unwrap();
            r.to_typed().unwrap();
            assert_eq!(r.keys, keys);
            assert_eq!(r.values, values);
            // truncated, or a lying raw length
            let mut t = Message::from_wire(m.key_bytes[..m.key_bytes.len() / 2].to_vec(), vec![], 1, m.enc.clone());
            assert!(Compress::new(codec).decode(&mut t).is_err());
            let mut enc = m.enc.clone();
            enc.values_raw_len = MAX_RAW + 1;
            assert!(Compress::new(codec).decode(&mut Message::from_wire(m.key_bytes.clone(), m.value_bytes.clone(), 1, enc)).is_err());
        }
    }

    #[test]
    fn incompressible_values_go_raw() {
        let keys: Vec<u64> = (0..512).map(crate::init::splitmix64).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        let values: Vec<f32> =
            (0..keys.len()).map(|i| f32::from_bits(crate::init::splitmix64(i as u64 + 99) as u32 & 0x3fff_ffff)).collect();
        let mut m = Message::new(keys, values, 1);
        Compress::new(Codec::Lz4).encode(&mut m).unwrap();
        assert_eq!(m.enc.values_codec, 0);
        assert_eq!(m.enc.keys_codec, 0);
    }
}
