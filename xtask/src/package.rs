//! `cargo xtask package`: the Debian package, built with Debian's own
//! tooling (debhelper), from the binary cargo builds.
//!
//! The package's sources are `dist/debian/` (control, rules, install
//! lists, the purge script) and `dist/xdp-limiter.service`. The build
//! stages a tree of its own under `target/package/PROFILE/` (the binary,
//! the man pages and completions the binary prints, the docs, the
//! dashboard and alert rules, the configuration) beside a copy of that
//! `debian/` with a generated changelog, and runs `debian/rules binary`
//! there: debhelper strips, compresses, writes md5sums and the conffile
//! list, and generates the unit's maintainer scripts; `dpkg-deb` packs.
//! The `.deb` lands in `target/package/PROFILE/`; its path is printed.
//!
//! debhelper rather than cargo-deb: it is Debian's own, installed from
//! apt (cargo-deb would be compiled on every fresh machine), and its unit
//! snippets (`dh_installsystemd`: start on install only when enabled,
//! restart on upgrade, stop on remove) are what Debian's other services
//! do; our one script of our own is the purge.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::run;

/// The Debian package's name (and the binary's).
pub const NAME: &str = "xdp-limiter";

/// Who the changelog names (the control file's Maintainer).
const MAINTAINER: &str = "xdp-limiter developers <xdp-limiter@users.noreply.github.com>";

/// Builds the package; returns its path. `release` picks the cargo
/// profile (the suite's quick check packs the debug binary it already
/// built); `revision` is the Debian revision (`0.1.0-REVISION`), so a
/// newer build of the same sources can be installed over an older one.
pub fn build(release: bool, revision: u32) -> anyhow::Result<PathBuf> {
    let root = run::workspace_root();
    let profile = if release { "release" } else { "debug" };
    let mut cargo = limiter_ebpf_build::host_cargo();
    cargo.args(["build", "-p", "limiter-user", "--bin", NAME]);
    if release {
        cargo.arg("--release");
    }
    run::status(&mut cargo)?;
    let binary = root.join("target").join(profile).join(NAME);

    let out = root.join("target").join("package").join(profile);
    let version = format!("{}-{revision}", env!("CARGO_PKG_VERSION"));
    let stage = out.join(format!("{NAME}-{version}"));
    if stage.exists() {
        fs::remove_dir_all(&stage).with_context(|| format!("clearing {}", stage.display()))?;
    }
    stage_tree(&root, &binary, &stage, &version)?;
    let deb = out.join(format!("{NAME}_{version}_amd64.deb"));
    if deb.exists() {
        fs::remove_file(&deb)?;
    }
    run::status(
        Command::new("debian/rules")
            .arg("binary")
            .current_dir(&stage)
            .env("DH_QUIET", "1"),
    )?;
    if !deb.exists() {
        bail!("debian/rules binary made no {}", deb.display());
    }
    println!("{}", deb.display());
    Ok(deb)
}

/// Lays out everything `dist/debian/install`, `manpages` and `docs` name.
fn stage_tree(root: &Path, binary: &Path, stage: &Path, version: &str) -> anyhow::Result<()> {
    let dir = |name: &str| -> anyhow::Result<PathBuf> {
        let d = stage.join(name);
        fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        Ok(d)
    };
    let copy = |from: PathBuf, to: PathBuf| -> anyhow::Result<()> {
        fs::copy(&from, &to)
            .map(drop)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))
    };

    copy(binary.to_path_buf(), dir("bin")?.join(NAME))?;
    let man = dir("man")?;
    run::status(Command::new(binary).arg("man").arg("--dir").arg(&man))?;
    let completions = dir("completions")?;
    for (shell, file) in [
        ("bash", NAME.to_string()),
        ("zsh", format!("_{NAME}")),
        ("fish", format!("{NAME}.fish")),
    ] {
        let script = run::stdout_ok(Command::new(binary).args(["completions", shell]))
            .with_context(|| format!("`{NAME} completions {shell}` failed"))?;
        fs::write(completions.join(file), script)?;
    }

    copy(root.join("README.md"), stage.join("README.md"))?;
    let docs = dir("docs")?;
    for entry in fs::read_dir(root.join("docs"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "md") {
            copy(path.clone(), docs.join(path.file_name().expect("a file")))?;
        }
    }
    let dist = root.join("dist");
    copy(dist.join("config.toml"), dir("dist")?.join("config.toml"))?;
    copy(
        dist.join("grafana").join("xdp-limiter.json"),
        dir("dist/grafana")?.join("xdp-limiter.json"),
    )?;
    for file in ["alerts.yml", "alerts.test.yml"] {
        copy(
            dist.join("prometheus").join(file),
            dir("dist/prometheus")?.join(file),
        )?;
    }
    copy(
        dist.join("fail2ban/action.d/xdp-limiter.conf"),
        dir("dist/fail2ban/action.d")?.join("xdp-limiter.conf"),
    )?;

    let debian = dir("debian")?;
    for entry in fs::read_dir(dist.join("debian"))? {
        let path = entry?.path();
        copy(path.clone(), debian.join(path.file_name().expect("a file")))?;
    }
    copy(
        dist.join("xdp-limiter.service"),
        debian.join("xdp-limiter.service"),
    )?;
    fs::write(debian.join("changelog"), changelog(root, version))?;
    Ok(())
}

/// A one-entry changelog dated by the last commit (so two builds of one
/// commit are the same package), or now outside a git checkout.
fn changelog(root: &Path, version: &str) -> String {
    let date =
        run::stdout_ok(
            Command::new("git")
                .current_dir(root)
                .args(["log", "-1", "--format=%aD"]),
        )
        .or_else(|| run::stdout_ok(Command::new("date").arg("-R")))
        .unwrap_or_default();
    format!(
        "{NAME} ({version}) unstable; urgency=medium\n\n  \
         * Built from the xdp-limiter sources by `cargo xtask package`.\n\n \
         -- {MAINTAINER}  {}\n",
        date.trim()
    )
}
