//! The framed byte encoding used by the TCP transport (and checked by fuzzing):
//!
//! ```text
//! u32 LE  header length H (1..=MAX_HEADER_BYTES)
//! H bytes prost-encoded FrameHeader (keys_len, values_len give the payload sizes)
//! keys_len bytes   keys, u64 little-endian, keys_len % 8 == 0
//! values_len bytes values, f32 little-endian, values_len % 4 == 0
//! ```
//! A receiver reads the prefix, checks it, decodes the header, checks the payload sizes
//! against its limits, and only then reads (or allocates for) the payloads.

use crate::proto::FrameHeader;
use crate::WireError;

type Result<T> = std::result::Result<T, WireError>;
use prost::Message;

/// Largest encoded header accepted (headers are small; `meta` bodies are table specs and
/// routing tables).
pub const MAX_HEADER_BYTES: usize = 1 << 20;

/// Size limits a receiver enforces before it allocates anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest `keys_len + values_len` of one frame, in bytes.
    pub max_payload_bytes: u64,
}

impl Default for FrameLimits {
    fn default() -> Self {
        // Requests are chunked (a few MiB by default); 256 MiB leaves room for large chunks.
        FrameLimits { max_payload_bytes: 256 << 20 }
    }
}

/// Appends the length prefix and encoded header to `out`.
pub fn encode_header(h: &FrameHeader, out: &mut Vec<u8>) {
    let len = h.encoded_len();
    out.reserve(4 + len);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    // Encoding into a Vec cannot fail: it grows as needed.
    let _ = h.encode(out);
}

/// Checks a header length prefix.
pub fn check_header_len(len: u32) -> Result<usize> {
    let len = len as usize;
    if len == 0 || len > MAX_HEADER_BYTES {
        return Err(WireError::Malformed(format!("frame header length {len} is outside 1..={MAX_HEADER_BYTES}")));
    }
    Ok(len)
}

/// Decodes a header and checks its payload sizes against `limits`.
pub fn decode_header(bytes: &[u8], limits: &FrameLimits) -> Result<FrameHeader> {
    let h = FrameHeader::decode(bytes).map_err(|e| WireError::Malformed(format!("frame header does not decode: {e}")))?;
    check_payload(&h, limits)?;
    Ok(h)
}

/// Checks the payload sizes a header announces.
pub fn check_payload(h: &FrameHeader, limits: &FrameLimits) -> Result<()> {
    // A filtered payload (compressed, low-precision) has any length; its filters check it.
    if h.encoding.is_some() {
        let total = h.keys_len.checked_add(h.values_len).ok_or_else(|| WireError::Malformed("payload size overflows".into()))?;
        if total > limits.max_payload_bytes {
            return Err(WireError::Limit(format!(
                "frame payload of {total} bytes exceeds the limit of {} bytes",
                limits.max_payload_bytes
            )));
        }
        return Ok(());
    }
    if !h.keys_len.is_multiple_of(8) {
        return Err(WireError::Malformed(format!("keys payload of {} bytes is not a whole number of u64 keys", h.keys_len)));
    }
    if !h.values_len.is_multiple_of(4) {
        return Err(WireError::Malformed(format!("values payload of {} bytes is not a whole number of f32 values", h.values_len)));
    }
    let total = h.keys_len.checked_add(h.values_len).ok_or_else(|| WireError::Malformed("payload size overflows".into()))?;
    if total > limits.max_payload_bytes {
        return Err(WireError::Limit(format!("frame payload of {total} bytes exceeds the limit of {} bytes", limits.max_payload_bytes)));
    }
    Ok(())
}

/// Encodes a whole frame into one buffer (tests and tools; the transports write the parts
/// without joining them).
pub fn encode_frame(h: &FrameHeader, keys: &[u64], values: &[f32]) -> Vec<u8> {
    let mut h = h.clone();
    h.keys_len = (keys.len() * 8) as u64;
    h.values_len = (values.len() * 4) as u64;
    let mut out = Vec::new();
    encode_header(&h, &mut out);
    out.extend_from_slice(bytemuck::cast_slice(keys));
    out.extend_from_slice(bytemuck::cast_slice(values));
    out
}

/// A decoded frame: header, keys, values, and the number of bytes it used.
pub type DecodedFrame = (FrameHeader, Vec<u64>, Vec<f32>, usize);

/// Decodes one complete frame from the front of `buf`. Returns `Ok(None)` when `buf` holds
/// only part of a frame, an error when the bytes can never form a valid frame. A filtered
/// frame (`encoding` set) is refused: its payload is filter output, not keys and values, and
/// only the table's filter pipeline can decode it.
pub fn decode_frame(buf: &[u8], limits: &FrameLimits) -> Result<Option<DecodedFrame>> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let hlen = check_header_len(u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]))?;
    if buf.len() < 4 + hlen {
        return Ok(None);
    }
    let h = decode_header(&buf[4..4 + hlen], limits)?;
    if h.encoding.is_some() {
        return Err(WireError::Malformed("a filtered frame has no typed keys and values: decode it with its table's filters".into()));
    }
    let start = 4 + hlen;
    let (kl, vl) = (h.keys_len as usize, h.values_len as usize);
    if buf.len() < start + kl + vl {
        return Ok(None);
    }
    let keys = buf[start..start + kl].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
    let values = buf[start + kl..start + kl + vl].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4]))).collect();
    Ok(Some((h, keys, values, start + kl + vl)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Found by the `frame_decode` fuzz target: a filtered frame whose payload is not whole
    /// keys came back as truncated typed keys.
    #[test]
    fn decode_frame_refuses_a_filtered_frame_instead_of_truncating_its_payload() {
        let h = FrameHeader { keys_len: 5, encoding: Some(Default::default()), ..Default::default() };
        let mut buf = Vec::new();
        encode_header(&h, &mut buf);
        buf.extend_from_slice(&[1, 2, 3, 4, 5]);
        assert!(decode_frame(&buf, &FrameLimits::default()).is_err());
    }

    fn header_strategy() -> impl Strategy<Value = FrameHeader> {
        (
            any::<u64>(),
            0u32..30,
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<bool>(),
            ".{0,20}",
        )
            .prop_map(|(id, op, sender, epoch, clock, table, b, e, last, err)| FrameHeader {
                request_id: id,
                op,
                sender,
                epoch,
                clock,
                table,
                range_begin: b,
                range_end: e,
                last,
                error: err,
                ..Default::default()
            })
    }

    proptest! {
        #[test]
        fn frame_round_trips(h in header_strategy(), keys in proptest::collection::vec(any::<u64>(), 0..50), vals in proptest::collection::vec(-1e6f32..1e6, 0..50)) {
            let buf = encode_frame(&h, &keys, &vals);
            let (h2, k2, v2, used) = decode_frame(&buf, &FrameLimits::default()).unwrap().unwrap();
            prop_assert_eq!(used, buf.len());
            prop_assert_eq!(k2, keys);
            prop_assert_eq!(v2, vals);
            prop_assert_eq!(h2.request_id, h.request_id);
            prop_assert_eq!(h2.error, h.error);
            // every strict prefix is "incomplete", never an error or a panic
            for cut in [0, 1, 3, 4, buf.len() / 2, buf.len().saturating_sub(1)] {
                if cut < buf.len() { prop_assert!(decode_frame(&buf[..cut], &FrameLimits::default()).unwrap().is_none()); }
            }
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_frame(&bytes, &FrameLimits::default());
        }
    }

    #[test]
    fn huge_length_prefix_is_rejected_before_allocation() {
        let mut buf = (u32::MAX).to_le_bytes().to_vec();
        buf.extend_from_slice(&[0; 16]);
        assert!(matches!(decode_frame(&buf, &FrameLimits::default()), Err(WireError::Malformed(_))));
    }

    #[test]
    fn oversized_payload_is_rejected() {
        let h = FrameHeader { keys_len: 8, values_len: 2u64 << 30, ..Default::default() };
        let mut buf = Vec::new();
        encode_header(&h, &mut buf);
        assert!(matches!(decode_frame(&buf, &FrameLimits::default()), Err(WireError::Limit(_))));
        let odd = FrameHeader { keys_len: 7, ..Default::default() };
        assert!(matches!(check_payload(&odd, &FrameLimits::default()), Err(WireError::Malformed(_))));
    }
}
