//! Helpers shared by the binary's integration tests.

use std::path::Path;
use std::time::{Duration, Instant};

/// The address a `coordinator --addr-file PATH` wrote (complete once it ends with a newline);
/// fails the test after 10 s.
pub fn wait_for_addr(path: &Path) -> String {
    let t0 = Instant::now();
    loop {
        if let Ok(a) = std::fs::read_to_string(path) {
            if a.ends_with('\n') {
                return a.trim().to_string();
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "coordinator did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
}
