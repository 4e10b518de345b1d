//! Any bytes as a data file (plain or gzip), read whole by the share reader in both formats:
//! line splitting, decompression and error reporting (which names the file and line).
#![no_main]
use downpour_data::share::ShareReader;
use downpour_data::text::TextOptions;
use downpour_data::Format;
use libfuzzer_sys::fuzz_target;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("downpour-fuzz-data-{}.svm", std::process::id()));
    let Ok(mut f) = std::fs::File::create(&path) else { return };
    if f.write_all(data).is_err() {
        return;
    }
    drop(f);
    for format in [Format::Libsvm, Format::TextJsonl(TextOptions::default())] {
        let Ok(mut r) = ShareReader::for_worker(std::slice::from_ref(&path), &format, 0, 1) else { continue };
        // bounded: at most 10,000 examples
        for _ in 0..10_000 {
            match r.next_example() {
                Ok(Some(e)) => assert_eq!(e.keys.len(), e.values.len()),
                Ok(None) => break,
                Err(e) => {
                    assert!(e.to_string().contains("downpour-fuzz-data"), "errors name the file: {e}");
                    break;
                }
            }
        }
    }
    let _ = std::fs::remove_file(&path);
});
