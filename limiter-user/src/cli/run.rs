//! `xdp-limiter run`: the daemon, on a small tokio runtime (two workers:
//! the loop, the metrics endpoint and the control socket are light).

use anyhow::Context as _;

use super::args::RunArgs;
use crate::daemon::{self, RunOptions};

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let options = RunOptions {
        config: args.config,
        interfaces: args.interfaces,
        mode: args.mode,
        attach: args.attach,
        keep_attached: args.keep_attached,
        metrics_addr: args.metrics_addr,
        pin_dir: args.pin_dir,
        control_socket: args.control_socket,
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(daemon::run(options))
}
