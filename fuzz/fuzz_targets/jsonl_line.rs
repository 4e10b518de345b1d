//! Any bytes as one text-JSONL line (with and without hashing and bigrams).
#![no_main]
use downpour_data::text::{parse_jsonl_line, TextOptions};
use downpour_data::Example;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut ex = Example::default();
    for opts in [TextOptions::default(), TextOptions { hash_bits: Some(20), bigrams: true, ..Default::default() }] {
        if let Ok(true) = parse_jsonl_line(data, &opts, &mut ex) {
            assert_eq!(ex.keys.len(), ex.values.len());
            if let Some(b) = opts.hash_bits {
                assert!(ex.keys.iter().all(|&k| k < 1 << b));
            }
        }
    }
});
