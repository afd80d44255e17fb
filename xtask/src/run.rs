//! Running external commands with their command line echoed and failures
//! reported with it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{bail, Context as _};

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_path_buf()
}

/// Host `cargo` at the workspace root without the variables `cargo xtask`
/// set for xtask: every suite step builds with one environment, so a
/// dependency's build script that watches one (ring watches
/// `CARGO_MANIFEST_DIR`) does not rebuild it, and relink every test
/// binary, each time a step and the tests' own builds alternate.
pub fn cargo() -> Command {
    limiter_ebpf_build::host_cargo()
}

fn describe(cmd: &Command) -> String {
    let mut line = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Runs `cmd`, inheriting stdio; fails unless it exits 0.
pub fn status(cmd: &mut Command) -> anyhow::Result<()> {
    let line = describe(cmd);
    eprintln!("+ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed: {status}");
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its output, whatever its exit status;
/// `None` when the program does not exist.
pub fn output(cmd: &mut Command) -> Option<Output> {
    cmd.output().ok()
}

/// Runs `cmd` quietly; its stdout if it exited 0.
pub fn stdout_ok(cmd: &mut Command) -> Option<String> {
    output(cmd)
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
}
