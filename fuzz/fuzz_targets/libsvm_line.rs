//! Any bytes as one LIBSVM line.
#![no_main]
use downpour_data::libsvm::parse_bytes;
use downpour_data::Example;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut ex = Example::default();
    if let Ok(true) = parse_bytes(data, &mut ex) {
        assert_eq!(ex.keys.len(), ex.values.len());
    }
});
