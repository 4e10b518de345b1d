//! `downpour`: the parameter server's command-line tool. See the README.

use mimalloc::MiMalloc;

// Large buffers are reused across messages by mimalloc instead of being mapped and
// page-faulted afresh on every message, as glibc does above 32 MiB.
#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

mod bench;
mod certs;
mod ckpt;
mod cli;
mod cluster;
mod config;
mod datagen;
mod experiment;
mod jobs;
mod model;
mod progress;

fn main() {
    std::process::exit(cli::main());
}
