//! The `downpour` binary: [`downpour::cli::main_from`] with this process's arguments.

use mimalloc::MiMalloc;

// Large buffers are reused across messages by mimalloc instead of being mapped and
// page-faulted afresh on every message, as glibc does above 32 MiB.
#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() {
    downpour::process::prepare();
    std::process::exit(downpour::cli::main_from(std::env::args_os().collect(), None));
}
