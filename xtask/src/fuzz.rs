//! `cargo xtask fuzz --frames N [--seed S]`: builds the fuzzing driver
//! (release) and runs it; see `tests/src/bin/fuzz.rs`.

use std::process::Command;

use crate::run;

pub fn run(frames: usize, seed: Option<u64>) -> anyhow::Result<()> {
    let root = run::workspace_root();
    run::status(
        run::cargo()
            .args(["build", "--quiet", "--release", "-p", "limiter-tests"])
            .args(["--bin", "fuzz"]),
    )?;
    let mut cmd = Command::new(root.join("target/release/fuzz"));
    cmd.arg("--frames").arg(frames.to_string());
    if let Some(seed) = seed {
        cmd.arg("--seed").arg(seed.to_string());
    }
    run::status(&mut cmd)
}
