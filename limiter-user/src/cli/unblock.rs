//! `xdp-limiter unblock CIDR`: lift the penalties (`block`) of every
//! source inside a prefix, now. The sources keep their windows: one still
//! over its limit is limited, not blocked, until its window has room.

use super::{args::UnblockArgs, client};
use crate::proto::Request;

pub fn run(args: &UnblockArgs) -> anyhow::Result<()> {
    client::done(&args.socket.path, Request::Unblock { cidr: args.cidr })
}
