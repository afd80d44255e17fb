//! `cargo xtask build`: the `xdp-limiter` binary with the eBPF object
//! embedded (limiter-user's build script compiles the object).

use std::process::Command;

use crate::run;

pub fn run(release: bool) -> anyhow::Result<()> {
    let root = run::workspace_root();
    let mut cmd = Command::new("cargo");
    cmd.current_dir(&root)
        .args(["build", "--package", "limiter-user"]);
    if release {
        cmd.arg("--release");
    }
    run::status(&mut cmd)?;
    let profile = if release { "release" } else { "debug" };
    println!(
        "{}",
        root.join("target")
            .join(profile)
            .join("xdp-limiter")
            .display()
    );
    Ok(())
}
