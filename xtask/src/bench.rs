//! `cargo xtask bench ...`: each benchmark is a release binary of the
//! `limiter-tests` crate, run pinned and printing a table plus one JSON
//! line per case.

use std::process::Command;

use clap::Subcommand;

use crate::run;

#[derive(Subcommand, Clone, Copy)]
pub enum Which {
    /// ns per packet through BPF_PROG_TEST_RUN: limiter cases against a
    /// baseline program (same parsing, one per-CPU LRU counter).
    Xdp,
    /// One daemon aggregation pass over 1,000,000 sources (time, CPU,
    /// memory) against reading the map key by key.
    Aggregate,
}

pub fn run(which: Which) -> anyhow::Result<()> {
    let bin = match which {
        Which::Xdp => "bench-xdp",
        Which::Aggregate => "bench-aggregate",
    };
    run::status(
        Command::new("cargo")
            .current_dir(run::workspace_root())
            .args([
                "run",
                "--quiet",
                "--release",
                "-p",
                "limiter-tests",
                "--bin",
                bin,
            ]),
    )
}
