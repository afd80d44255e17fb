//! `cargo xtask test`: the whole suite, in the order that fails fastest:
//! formatting, clippy on the userspace crates and on the kernel crate (for
//! its real target), then every test (host unit tests, kernel tests through
//! BPF_PROG_TEST_RUN, netns tests with real traffic).
//!
//! Kernel and netns tests need root; the suite refuses to run without it
//! rather than skipping them.

use std::process::Command;

use anyhow::bail;

use crate::{run, setup::EBPF_TOOLCHAIN};

pub fn run(cargo_test_args: &[String]) -> anyhow::Result<()> {
    if !is_root() {
        bail!("the test suite loads BPF programs and creates network namespaces: run it as root");
    }
    let root = run::workspace_root();
    let cargo = || {
        let mut cmd = Command::new("cargo");
        cmd.current_dir(&root);
        cmd
    };
    run::status(cargo().args(["fmt", "--all", "--check"]))?;
    run::status(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    run::status(
        Command::new("rustup")
            .current_dir(&root)
            .args(["run", EBPF_TOOLCHAIN, "cargo", "clippy", "--release"])
            .args([
                "--package",
                "limiter-ebpf",
                "--target",
                "bpfel-unknown-none",
            ])
            .args(["--target-dir", "target/ebpf", "--", "-D", "warnings"])
            // The same feature allowance and flags as limiter-user/build.rs.
            .env("RUSTC_BOOTSTRAP", "aya_ebpf,limiter_ebpf")
            .env("CARGO_ENCODED_RUSTFLAGS", "-Ctarget-cpu=v3")
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("RUSTC"),
    )?;
    // Host unit tests first, then the kernel and netns tests, so the run
    // closes on the tests that exercise the real kernel.
    run::status(
        cargo()
            .args([
                "test",
                "-p",
                "limiter-common",
                "-p",
                "limiter-user",
                "-p",
                "xtask",
            ])
            .args(cargo_test_args),
    )?;
    // The daemon tests run the real binary.
    run::status(cargo().args(["build", "-p", "limiter-user", "--bin", "xdp-limiter"]))?;
    run::status(
        cargo()
            .args(["test", "-p", "limiter-tests"])
            .args(cargo_test_args),
    )
}

/// Effective uid 0, read from /proc so xtask needs no libc binding.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}
