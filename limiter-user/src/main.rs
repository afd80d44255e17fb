//! The `xdp-limiter` binary: parses the command line (`cli::args`) and
//! dispatches each command to its file under `cli/`.
//!
//! Errors print as one line (`error: ...` with its causes) and exit 1.

use std::process::ExitCode;

use clap::Parser;
use limiter_user::{
    cli::{
        self,
        args::{Cli, Command},
    },
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
        Command::Man { dir } => cli::completions::man(dir.as_deref()),
        Command::Detach(args) => cli::detach::run(&args),
        Command::Check {
            config: Some(path),
            output,
            ..
        } => cli::check::config(&path, output),
        Command::Check {
            config: None,
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
