//! The command line: `args` is the clap tree; each command has its own
//! file. The run-time commands send one request over the daemon's control
//! socket (`client`) and print the reply, as text for people or JSON for
//! scripts (`--output json`).

pub mod args;
pub mod check;
pub mod client;
pub mod completions;
pub mod detach;
pub mod mode;
pub mod reload;
pub mod rule;
pub mod run;
pub mod status;
pub mod suggest;
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
