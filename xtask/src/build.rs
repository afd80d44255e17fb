//! `cargo xtask build`: the `xdp-limiter` binary with the eBPF object
//! embedded (limiter-user's build script compiles the object).

use crate::run;

pub fn run(release: bool) -> anyhow::Result<()> {
    let root = run::workspace_root();
    let mut cmd = run::cargo();
    cmd.args(["build", "--package", "limiter-user"]);
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
