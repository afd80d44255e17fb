//! `xdp-limiter completions SHELL` and `xdp-limiter man`: generated from
//! the clap tree, so they always match the binary.

use anyhow::Context as _;
use clap::CommandFactory;

use super::args::Cli;

pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    clap_complete::generate(
        shell,
        &mut Cli::command(),
        "xdp-limiter",
        &mut std::io::stdout(),
    );
    Ok(())
}

pub fn man() -> anyhow::Result<()> {
    clap_mangen::Man::new(Cli::command())
        .render(&mut std::io::stdout())
        .context("writing the man page")
}
