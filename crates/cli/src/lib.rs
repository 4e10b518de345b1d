//! `downpour`: the parameter server's command-line tool: it maps flags onto the configs of
//! `downpour-jobs` and `downpour-cluster` and runs them. Usage: docs/usage.md. A library too,
//! so that the Python package runs the same tool (`python -m downpour …`) through
//! [`cli::main_from`].

mod ckpt;
pub mod cli;
mod config;
pub use config::settings_from_flags;
mod datagen;
mod export;
pub mod process;
mod terminal;
mod top;
