//! `xdp-limiter completions SHELL` and `xdp-limiter man`: generated from
//! the clap tree, so they always match the binary.

use std::path::Path;

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

/// The section of every page: an administration command (as `xdp-loader`
/// and `ip`).
const MAN_SECTION: &str = "8";

/// The main page to stdout, or, with `dir`, a page per command there.
pub fn man(dir: Option<&Path>) -> anyhow::Result<()> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let Some(dir) = dir else {
        return page(cmd)
            .render(&mut std::io::stdout())
            .context("writing the man page");
    };
    fn write(cmd: clap::Command, dir: &Path) -> anyhow::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            write(sub.clone(), dir)?;
        }
        let path = page(cmd).generate_to(dir);
        path.with_context(|| format!("writing a man page into {}", dir.display()))?;
        Ok(())
    }
    write(cmd, dir)
}

fn page(cmd: clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd).section(MAN_SECTION)
}
