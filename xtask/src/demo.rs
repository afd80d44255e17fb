//! `cargo xtask demo`: builds the daemon and the demo driver (release) and
//! runs the driver, which sets up and tears down its own lab. With
//! `--cluster` the driver is `demo-cluster` (three nodes, one Redis).

use std::process::Command;

use crate::run;

pub fn run(cluster: bool) -> anyhow::Result<()> {
    let bin = if cluster { "demo-cluster" } else { "demo" };
    let root = run::workspace_root();
    run::status(
        run::cargo()
            .args([
                "build",
                "--quiet",
                "--release",
                "-p",
                "limiter-user",
                "-p",
                "limiter-bench",
            ])
            .args(["--bin", "xdp-limiter", "--bin", bin]),
    )?;
    run::status(
        Command::new(root.join("target/release").join(bin))
            .env("XDP_LIMITER_BIN", root.join("target/release/xdp-limiter")),
    )
}
