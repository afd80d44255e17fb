//! `cargo xtask test`: the whole suite, in the order that fails fastest:
//! formatting, clippy on the userspace crates and on the kernel crates (for
//! their real target), then every test (host unit tests, kernel tests through
//! BPF_PROG_TEST_RUN, netns tests with real traffic).
//!
//! Then the kernel lane (`kernel`) on [`kernel::DEFAULT_LANE`]: the
//! kernel tests and a daemon smoke test on Debian 12's kernel in qemu.
//! `--kernel NAME` runs only the lane, on that kernel or `all`.
//!
//! Kernel and netns tests need root; the suite refuses to run without it
//! rather than skipping them.

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::{kernel, package, run};

/// Each step's wall time, printed when the run ends (passed or not), so
/// a run shows where its budget went.
#[derive(Default)]
struct Steps(Vec<(&'static str, Duration)>);

impl Steps {
    fn time<T>(&mut self, name: &'static str, step: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = step();
        self.0.push((name, started.elapsed()));
        out
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        let total: Duration = self.0.iter().map(|(_, took)| *took).sum();
        eprintln!("suite steps ({:.0} s):", total.as_secs_f64());
        for (name, took) in &self.0 {
            eprintln!("  {name:<24} {:>5.0} s", took.as_secs_f64());
        }
    }
}

/// Where `limiter_tests::retry` logs a voided measurement it takes again
/// (the same name as its `LOG_VAR`; xtask does not build the harness).
const RETRY_LOG_VAR: &str = "LIMITER_RETRY_LOG";
/// Retries a suite run may take: one is a stall, two a pattern.
const MAX_RETRIES: usize = 1;

pub fn run(cargo_test_args: &[String], lane: Option<&str>) -> anyhow::Result<()> {
    if !is_root() {
        bail!("the test suite loads BPF programs and creates network namespaces: run it as root");
    }
    if let Some(name) = lane {
        return kernel::run(&kernel::select(name)?);
    }
    let mut steps = Steps::default();
    let cargo = run::cargo;
    steps.time("fmt", || {
        run::status(cargo().args(["fmt", "--all", "--check"]))
    })?;
    steps.time("clippy", || {
        run::status(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))
    })?;
    // The kernel crates (the product's and the benchmark's) on their real
    // target, with the toolchain, flags and feature allowance of the
    // builds that embed them.
    let root = run::workspace_root();
    steps.time("clippy (eBPF)", || {
        run::status(
            limiter_ebpf_build::cargo(&root, "clippy", &["limiter-ebpf", "limiter-bench-ebpf"])
                .args(["--", "-D", "warnings"]),
        )
    })?;
    // Host unit tests first, then the kernel and netns tests, so the run
    // closes on the tests that exercise the real kernel.
    steps.time("unit tests", || {
        run::status(
            cargo()
                .args(["test", "-p", "limiter-common", "-p", "limiter-bench-common"])
                .args([
                    "-p",
                    "limiter-ebpf-build",
                    "-p",
                    "limiter-user",
                    "-p",
                    "xtask",
                ])
                .args(cargo_test_args),
        )
    })?;
    // The daemon tests run the real binary; the package tests read the
    // package of it (the install itself is `--package-lane`'s).
    let deb = steps.time("package", || package::build(false, 1))?;
    // Measurements a stalled machine voided are taken again and logged
    // here (`limiter_tests::retry`); more than one fails the suite.
    let retries = root.join("target").join("retries.log");
    match std::fs::remove_file(&retries) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    steps.time("kernel and netns tests", || {
        run::status(
            cargo()
                .args(["test", "-p", "limiter-tests"])
                .args(cargo_test_args)
                .env(RETRY_LOG_VAR, &retries)
                .env("LIMITER_DEB", &deb),
        )
    })?;
    // The end-to-end lab's smoke test (real traffic through the real
    // daemon, and every benchmark scenario's filter installed).
    steps.time("end-to-end lab", || {
        run::status(
            cargo()
                .args(["test", "-p", "limiter-bench"])
                .args(cargo_test_args)
                .env(RETRY_LOG_VAR, &retries),
        )
    })?;
    let retried: Vec<String> = match std::fs::read_to_string(&retries) {
        Ok(text) => text.lines().map(str::to_owned).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    eprintln!("retried measurements: {}", retried.len());
    for line in &retried {
        eprintln!("  {line}");
    }
    if retried.len() > MAX_RETRIES {
        bail!(
            "{} measurements were retried (at most {} a suite run): the machine stalled \
             them, or a test is flaky",
            retried.len(),
            MAX_RETRIES
        );
    }
    if !cargo_test_args.is_empty() {
        eprintln!(
            "a filtered run: the kernel lane is skipped (`--kernel {}` runs it)",
            kernel::DEFAULT_LANE
        );
        return Ok(());
    }
    steps.time("kernel lane", || {
        kernel::run(&kernel::select(kernel::DEFAULT_LANE)?)
    })
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
