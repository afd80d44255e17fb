//! `xdp-limiter mode dry-run|enforce [--save]`: the global mode, live.

use super::{
    args::{Mode, ModeArgs},
    client,
};
use crate::proto::Request;

pub fn run(args: &ModeArgs) -> anyhow::Result<()> {
    client::done(
        &args.socket.path,
        Request::Mode {
            dry_run: args.mode == Mode::DryRun,
            save: args.save,
        },
    )
}
