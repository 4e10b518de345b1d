//! `downpour`: the parameter server's command-line tool: it maps flags onto the configs of
//! `downpour-jobs` and `downpour-cluster` and runs them. Usage: docs/usage.md.

use mimalloc::MiMalloc;

// Large buffers are reused across messages by mimalloc instead of being mapped and
// page-faulted afresh on every message, as glibc does above 32 MiB.
#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

mod ckpt;
mod cli;
mod config;
mod datagen;
mod terminal;

fn main() {
    std::process::exit(cli::main());
}
