//! The `xdp-limiter` binary.
//!
//! `check` loads the embedded program through the kernel verifier and
//! reports what it found, without attaching anything: the first thing to
//! run on a new host.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use limiter_user::{load, LoadOptions};

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

#[derive(Subcommand)]
enum Command {
    /// Load the XDP program through the kernel verifier (attaches nothing).
    Check {
        /// Capacity of the per-source state map.
        #[arg(long, default_value_t = limiter_common::DEFAULT_MAX_SOURCES)]
        max_sources: u32,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { max_sources } => check(max_sources),
    }
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
