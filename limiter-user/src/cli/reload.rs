//! `xdp-limiter reload`: the daemon re-reads its configuration file, as on
//! SIGHUP, and says whether it took it.

use super::{args::SocketArg, client};
use crate::proto::Request;

pub fn run(args: &SocketArg) -> anyhow::Result<()> {
    client::done(&args.path, Request::Reload)
}
