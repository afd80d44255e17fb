//! `xdp-limiter mode dry-run|enforce [--guard EXPR]... [--for DUR] [--save]`:
//! the global mode, live; enforce with guards starts a guard period
//! (`crate::guard`).

use super::{
    args::{Mode, ModeArgs},
    client,
};
use crate::{guard, proto::Request};

pub fn run(args: &ModeArgs) -> anyhow::Result<()> {
    let dry_run = args.mode == Mode::DryRun;
    // Checked here too, so that a bad plan is refused before anything is
    // sent (the daemon checks again: requests may come from elsewhere).
    guard::check_plan(dry_run, &args.guards, args.guard_for)?;
    client::done(
        &args.socket.path,
        Request::Mode {
            dry_run,
            save: args.save,
            guards: args.guards.iter().map(ToString::to_string).collect(),
            guard_for: args.guard_for,
        },
    )
}
