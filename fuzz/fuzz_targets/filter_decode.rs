//! Any bytes as a filtered frame (payloads plus an `Encoding`) through the receiving side of
//! every built-in filter pipeline: decoding must fail cleanly or give consistent lengths.
#![no_main]
use downpour_core::filter::{FilterRegistry, FilterSpec, Message};
use downpour_core::proto;
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

const SPECS: [&str; 5] = ["keycache:4", "lz4", "zstd", "f16,keycache:4,lz4", "sigmod:0.01,q8,zstd"];

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let spec_i = data[0] as usize % SPECS.len();
    let value_len = 1 + data[1] as usize % 4;
    let split = u16::from_le_bytes([data[2], data[3]]) as usize;
    let enc_len = (u16::from_le_bytes([data[4], data[5]]) as usize).min(data.len() - 6);
    let Ok(enc) = proto::Encoding::decode(&data[6..6 + enc_len]) else { return };
    let rest = &data[6 + enc_len..];
    let split = split.min(rest.len());
    let spec: FilterSpec = SPECS[spec_i].parse().expect("a valid spec");
    let Ok((_, mut receiver, _)) = spec.pipelines(&FilterRegistry::new()) else { return };
    // two messages on one pipeline: the second may refer to the key cache the first filled
    for _ in 0..2 {
        let mut m = Message::from_wire(rest[..split].to_vec(), rest[split..].to_vec(), value_len, enc.clone());
        if receiver.decode(&mut m).is_ok() {
            // a values-only message (a pull reply) has no keys to match
            assert!(m.values.is_empty() || m.keys.is_empty() || m.values.len() == m.keys.len() * value_len);
        }
    }
});
