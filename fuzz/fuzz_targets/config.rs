//! Any text as the TOML configuration file, resolved into settings with the command line's
//! code (`crates/cli/src/config.rs`, compiled as is).
#![no_main]
use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../crates/cli/src/config.rs"]
mod config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = config::CommonArgs::default().resolve_text(std::path::Path::new("fuzz.toml"), text);
});
