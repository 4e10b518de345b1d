//! Any bytes as an in-memory IDX file: header checks, size limit and element decoding.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = downpour_data::idx::parse_idx(data);
});
