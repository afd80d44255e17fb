//! The run-time CLI: each subcommand sends one request over the daemon's
//! control socket and prints the reply, as text for people or JSON for
//! scripts (`--output json`).

pub mod client;
pub mod mode;
pub mod rule;
pub mod status;
pub mod top;
pub mod unblock;
pub mod units;

use clap::ValueEnum;

/// How read commands print.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned text for people.
    #[default]
    Text,
    /// One JSON document, for scripts.
    Json,
}
