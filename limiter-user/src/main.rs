//! The `xdp-limiter` binary: parses the command line (`cli::args`) and
//! dispatches each command to its file under `cli/`.
//!
//! Errors print as one line (`error: ...` with its causes) and exit 1.

use std::{io::IsTerminal, process::ExitCode};

use clap::Parser;
use limiter_user::cli::{
    self,
    args::{Cli, Command},
};

fn main() -> ExitCode {
    let Cli { command } = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let result = match command {
        Command::Run(args) => cli::run::run(args),
        Command::Status(args) => cli::status::run(&args.socket.path, args.output),
        Command::Top(args) => match &args.level {
            Some(level) => cli::top::run_levels(
                &args.read.socket.path,
                args.read.output,
                args.limit,
                args.once,
                level,
            ),
            None => cli::top::run(
                &args.read.socket.path,
                args.read.output,
                args.limit,
                args.once,
                args.sort,
            ),
        },
        Command::Mode(args) => cli::mode::run(&args),
        Command::Unblock(args) => cli::unblock::run(&args),
        Command::Reload(args) => cli::reload::run(&args),
        Command::Suggest(args) => cli::suggest::run(&args),
        Command::Rule { action } => cli::rule::run(action),
        Command::Default { action } => cli::rule::default(action),
        Command::Completions { shell } => cli::completions::completions(shell),
        Command::Man => cli::completions::man(),
        Command::Detach(args) => cli::detach::run(&args),
        Command::Check {
            max_sources,
            verbose,
            functions,
            output,
        } => cli::check::run(max_sources, verbose, functions, output),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
