//! The command line: `args` is the clap tree; each command has its own
//! private file, reached through [`dispatch`]. The run-time commands send
//! one request over the daemon's control socket (`client`) and print the
//! reply, as text for people or JSON for scripts (`--output json`).

mod args;
mod bans;
mod check;
mod client;
mod completions;
mod detach;
mod mode;
mod reload;
mod rule;
mod run;
mod status;
mod suggest;
mod top;
mod unblock;
mod units;

use clap::ValueEnum;

pub use self::args::{Cli, Command};

/// Runs one parsed command.
pub fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => run::run(args),
        Command::Status(args) => status::run(&args.socket.path, args.output),
        Command::Top(args) => match &args.level {
            Some(level) => top::run_levels(
                &args.read.socket.path,
                args.read.output,
                args.limit,
                args.once,
                level,
            ),
            None => top::run(
                &args.read.socket.path,
                args.read.output,
                args.limit,
                args.once,
                args.sort,
            ),
        },
        Command::Mode(args) => mode::run(&args),
        Command::Unblock(args) => unblock::run(&args),
        Command::Ban(args) => bans::ban(&args),
        Command::Unban(args) => bans::unban(&args),
        Command::Bans(args) => bans::list(&args.socket.path, args.output),
        Command::List { action } => bans::edit_list(action),
        Command::Reload(args) => reload::run(&args),
        Command::Suggest(args) => suggest::run(&args),
        Command::Rule { action } => rule::run(action),
        Command::Default { action } => rule::default(action),
        Command::Completions { shell } => completions::completions(shell),
        Command::Man { dir } => completions::man(dir.as_deref()),
        Command::Detach(args) => detach::run(&args),
        Command::Check {
            config: Some(path),
            output,
            ..
        } => check::config(&path, output),
        Command::Check {
            config: None,
            max_sources,
            verbose,
            functions,
            output,
        } => check::run(max_sources, verbose, functions, output),
    }
}

/// How read commands print.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned text for people.
    #[default]
    Text,
    /// One JSON document, for scripts.
    Json,
}
