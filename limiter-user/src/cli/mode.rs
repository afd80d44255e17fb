//! `xdp-limiter mode dry-run|enforce` and `xdp-limiter reload`.

use std::path::Path;

use clap::ValueEnum;

use super::client;
use crate::proto::{Reply, Request};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Count what would be dropped, drop nothing.
    DryRun,
    /// Drop what is over its limit.
    Enforce,
}

pub fn set(socket: &Path, mode: Mode, save: bool) -> anyhow::Result<()> {
    done(client::request(
        socket,
        Request::Mode {
            dry_run: mode == Mode::DryRun,
            save,
        },
    )?)
}

pub fn reload(socket: &Path) -> anyhow::Result<()> {
    done(client::request(socket, Request::Reload)?)
}

fn done(reply: Reply) -> anyhow::Result<()> {
    match reply {
        Reply::Done { message } => {
            println!("{message}");
            Ok(())
        }
        _ => anyhow::bail!("the daemon answered with something unexpected"),
    }
}
