//! `cargo xtask soak --minutes N`: builds the daemon and the soak driver
//! (release) and runs the driver against that daemon; see
//! `bench/src/bin/soak.rs`. Not part of `cargo xtask test`: it runs for as
//! long as it is told to.

use std::process::Command;

use crate::run;

pub fn run(minutes: f64) -> anyhow::Result<()> {
    let root = run::workspace_root();
    run::status(
        run::cargo()
            .args(["build", "--quiet", "--release"])
            .args(["-p", "limiter-user", "-p", "limiter-bench"])
            .args(["--bin", "xdp-limiter", "--bin", "soak"]),
    )?;
    run::status(
        Command::new(root.join("target/release/soak"))
            .current_dir(&root)
            .arg("--minutes")
            .arg(minutes.to_string())
            .env("XDP_LIMITER_BIN", root.join("target/release/xdp-limiter")),
    )
}
