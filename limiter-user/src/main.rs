//! The `xdp-limiter` binary: parses the command line (`cli::Cli`), sets
//! the log, and hands the command to `cli::dispatch`.
//!
//! Errors print as one line (`error: ...` with its causes) and exit 1.

use std::process::ExitCode;

use clap::Parser;
use limiter_user::{
    cli::{self, Cli, Command},
    logs::{self, LogFormat},
};

fn main() -> ExitCode {
    let Cli { command } = Cli::parse();
    let format = match &command {
        Command::Run(args) => args
            .log_format
            .or_else(|| args.config.as_deref().and_then(logs::format_in_file))
            .unwrap_or_default(),
        _ => LogFormat::Text,
    };
    logs::init(format);
    let result = cli::dispatch(command);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
