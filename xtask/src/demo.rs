//! `cargo xtask demo`: builds the daemon and the demo driver (release) and
//! runs the driver, which sets up and tears down its own lab.

use std::process::Command;

use crate::run;

pub fn run() -> anyhow::Result<()> {
    let root = run::workspace_root();
    run::status(
        Command::new("cargo")
            .current_dir(&root)
            .args([
                "build",
                "--quiet",
                "--release",
                "-p",
                "limiter-user",
                "-p",
                "limiter-bench",
            ])
            .args(["--bin", "xdp-limiter", "--bin", "demo"]),
    )?;
    run::status(
        Command::new(root.join("target/release/demo"))
            .env("XDP_LIMITER_BIN", root.join("target/release/xdp-limiter")),
    )
}
