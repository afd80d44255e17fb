//! The `xdp-limiter` binary: `run` (the daemon), the run-time commands that
//! talk to it over its control socket (`status`, `top`, `mode`, `reload`),
//! `detach` and `check`.
//!
//! Errors print as one line (`error: ...` with its causes) and exit 1.

use std::{io::IsTerminal, net::SocketAddr, path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use limiter_user::{
    cli::{self, mode::Mode as RunMode, Output},
    daemon::{self, config::AttachMode, load},
    load, proto, LoadOptions,
};

#[derive(Parser)]
#[command(
    name = "xdp-limiter",
    version,
    about = "Per-source packet rate limiter at XDP"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    /// Native (driver) mode, generic mode as a fallback.
    Auto,
    /// Native (driver) mode or fail.
    Native,
    /// Generic (skb) mode.
    Generic,
}

/// A whole rule on the command line.
#[derive(clap::Args)]
struct RuleArgs {
    cidr: ipnet::IpNet,
    #[command(flatten)]
    matches: cli::rule::MatchArgs,
    #[command(flatten)]
    limits: cli::rule::LimitArgs,
    #[command(flatten)]
    common: EditArgs,
}

#[derive(Subcommand)]
enum RuleCommand {
    /// Add a rule for a prefix (and match).
    Add(RuleArgs),
    /// Replace the rule with the same prefix and match.
    Set(RuleArgs),
    /// Remove the rule with this prefix and match.
    Rm {
        cidr: ipnet::IpNet,
        #[command(flatten)]
        matches: cli::rule::MatchArgs,
        #[command(flatten)]
        common: EditArgs,
    },
    /// List the rules in force.
    Ls {
        #[command(flatten)]
        socket: SocketArg,
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}

#[derive(Subcommand)]
enum DefaultCommand {
    /// Replace the default rule.
    Set {
        #[command(flatten)]
        limits: cli::rule::LimitArgs,
        #[command(flatten)]
        common: EditArgs,
    },
}

/// Options of every rule change.
#[derive(clap::Args)]
struct EditArgs {
    /// Also write the change to the daemon's configuration file.
    #[arg(long)]
    save: bool,
    #[command(flatten)]
    socket: SocketArg,
}

/// Where the daemon's control socket is.
#[derive(clap::Args)]
struct SocketArg {
    /// The daemon's control socket.
    #[arg(long = "socket", default_value = proto::DEFAULT_SOCKET)]
    path: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Protect interfaces: load, attach, enforce, export metrics.
    Run {
        /// Interface to protect (repeatable; adds to daemon.interfaces).
        #[arg(long = "iface", short = 'i')]
        interfaces: Vec<String>,
        /// TOML configuration file (default: built-in, dry-run).
        #[arg(long, short = 'c')]
        config: Option<PathBuf>,
        /// Attach mode (default: daemon.mode, auto).
        #[arg(long, value_enum)]
        mode: Option<Mode>,
        /// Leave the program attached when the daemon stops.
        #[arg(long)]
        keep_attached: bool,
        /// Prometheus endpoint address (default: daemon.metrics_addr).
        #[arg(long)]
        metrics_addr: Option<SocketAddr>,
        /// bpffs directory for pins (default: daemon.pin_dir).
        #[arg(long)]
        pin_dir: Option<PathBuf>,
        /// Control socket (default: daemon.control_socket).
        #[arg(long)]
        control_socket: Option<PathBuf>,
    },
    /// Interfaces, program, rules, map fill and current rates.
    Status {
        #[command(flatten)]
        socket: SocketArg,
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// The heaviest sources of the daemon's last aggregation pass.
    Top {
        #[command(flatten)]
        socket: SocketArg,
        #[arg(long, value_enum, default_value_t)]
        output: Output,
        /// Print one frame and exit (for scripts).
        #[arg(long)]
        once: bool,
        /// Sources shown.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Sort by.
        #[arg(long, value_enum, default_value_t)]
        sort: cli::top::SortBy,
    },
    /// Global mode: dry-run (count, drop nothing) or enforce.
    Mode {
        #[arg(value_enum)]
        mode: RunMode,
        /// Also write the mode to the daemon's configuration file.
        #[arg(long)]
        save: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Lift the penalties of every source inside a prefix, now.
    Unblock {
        /// Sources inside this prefix (an address is a /32 or /128).
        cidr: ipnet::IpNet,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Make the daemon re-read its configuration file.
    Reload {
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Change the rules live: add, set, rm, ls.
    Rule {
        #[command(subcommand)]
        action: RuleCommand,
    },
    /// Change the default rule live.
    Default {
        #[command(subcommand)]
        action: DefaultCommand,
    },
    /// Print a shell completion script.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    Man,
    /// Stop protecting: a running daemon detaches and exits; without one,
    /// remove what `run --keep-attached` left pinned.
    Detach {
        /// Interface to release (default: every pinned interface).
        #[arg(long = "iface", short = 'i')]
        interfaces: Vec<String>,
        #[arg(long, default_value = daemon::config::DEFAULT_PIN_DIR)]
        pin_dir: PathBuf,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Load the XDP program through the kernel verifier (attaches nothing).
    Check {
        /// Capacity of the per-source state maps.
        #[arg(long, default_value_t = limiter_common::DEFAULT_MAX_SOURCES)]
        max_sources: u32,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Run {
            interfaces,
            config,
            mode,
            keep_attached,
            metrics_addr,
            pin_dir,
            control_socket,
        } => run(daemon::RunOptions {
            config,
            interfaces,
            mode: mode.map(|m| match m {
                Mode::Auto => AttachMode::Auto,
                Mode::Native => AttachMode::Native,
                Mode::Generic => AttachMode::Generic,
            }),
            keep_attached,
            metrics_addr,
            pin_dir,
            control_socket,
        }),
        Command::Status { socket, output } => cli::status::run(&socket.path, output),
        Command::Top {
            socket,
            output,
            once,
            limit,
            sort,
        } => cli::top::run(&socket.path, output, limit, once, sort),
        Command::Mode { mode, save, socket } => cli::mode::set(&socket.path, mode, save),
        Command::Reload { socket } => cli::mode::reload(&socket.path),
        Command::Unblock { cidr, socket } => cli::unblock::run(&socket.path, cidr),
        Command::Rule { action } => rule(action),
        Command::Default {
            action: DefaultCommand::Set { limits, common },
        } => {
            let no_match = cli::rule::MatchArgs {
                protocol: None,
                ports: None,
                syn: false,
            };
            let rule = cli::rule::section(None, &no_match, &limits);
            cli::rule::edit(
                &common.socket.path,
                proto::RuleEdit::Default { rule },
                common.save,
            )
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "xdp-limiter",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Man => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout())
            .context("writing the man page"),
        Command::Detach {
            interfaces,
            pin_dir,
            socket,
        } => detach(&interfaces, &pin_dir, &socket.path),
        Command::Check { max_sources } => check(max_sources),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn rule(action: RuleCommand) -> anyhow::Result<()> {
    use cli::rule::{edit, list, section, LimitArgs};
    use proto::RuleEdit;
    let send = |args: RuleArgs, make: fn(daemon::config::RuleSection) -> RuleEdit| {
        let rule = section(Some(args.cidr), &args.matches, &args.limits);
        edit(&args.common.socket.path, make(rule), args.common.save)
    };
    match action {
        RuleCommand::Add(args) => send(args, |rule| RuleEdit::Add { rule }),
        RuleCommand::Set(args) => send(args, |rule| RuleEdit::Set { rule }),
        RuleCommand::Rm {
            cidr,
            matches,
            common,
        } => {
            let rule = section(Some(cidr), &matches, &LimitArgs::none());
            edit(&common.socket.path, RuleEdit::Remove { rule }, common.save)
        }
        RuleCommand::Ls { socket, output } => list(&socket.path, output),
    }
}

fn run(options: daemon::RunOptions) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(daemon::run(options))
}

fn detach(
    interfaces: &[String],
    pin_dir: &std::path::Path,
    socket: &std::path::Path,
) -> anyhow::Result<()> {
    // A running daemon owns the interfaces: ask it (it detaches them all).
    match cli::client::request(socket, proto::Request::Detach) {
        Ok(proto::Reply::Done { message }) => {
            println!("{message}");
            return Ok(());
        }
        Ok(_) => anyhow::bail!("the daemon answered `detach` with something unexpected"),
        Err(cli::client::ClientError::NotRunning(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let interfaces: Vec<String> = if interfaces.is_empty() {
        std::fs::read_dir(pin_dir)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    } else {
        interfaces.to_vec()
    };
    if interfaces.is_empty() {
        println!("nothing pinned under {}", pin_dir.display());
        return Ok(());
    }
    for iface in interfaces {
        let dir = load::iface_dir(pin_dir, &iface);
        if !load::is_pinned(&dir) {
            anyhow::bail!("{iface}: nothing pinned under {}", dir.display());
        }
        load::remove_pins(&dir)?;
        println!("{iface}: detached");
    }
    Ok(())
}

fn check(max_sources: u32) -> anyhow::Result<()> {
    let mut ebpf = load(&LoadOptions { max_sources })
        .context("loading the XDP program (are you root, with BPF enabled?)")?;
    let program = limiter_user::object::xdp_program(&mut ebpf)?;
    let info = program.info().context("reading program info")?;
    println!(
        "ok: program `{}` (id {}) passed the verifier; {} maps loaded",
        limiter_common::names::PROGRAM,
        info.id(),
        ebpf.maps().count()
    );
    Ok(())
}
