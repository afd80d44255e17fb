//! The package lane (`cargo xtask test --package-lane`): the Debian
//! package installed, upgraded and removed as an operator would, on
//! Debian 12 booted with systemd in qemu.
//!
//! It builds the release package twice (revisions 1 and 2 of the same
//! binary: the second is the "newer build" an upgrade installs), a Debian
//! 12 root with `mmdebstrap` (systemd as init, apt, iproute2, ping, jq;
//! cached in `target/package-lane/` by its package list), and an ext4 disk
//! of that root with the packages, the kernel's modules and the guest's
//! script ([`SCRIPT`], run by a unit of its own once the system is up). It
//! boots Debian 12's kernel with Debian's initramfs on that disk and reads
//! the console for the script's `LANE` lines: each step passes or fails
//! with its reason. The steps are [`STEPS`]; the lane passes when all did.

use std::{
    ffi::OsString,
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::{
    kernel::{self, Console},
    package, run,
};

/// The guest's script.
const SCRIPT: &str = include_str!("package_lane.sh");

/// What the script does, in order; each must print `LANE PASS step`.
pub const STEPS: &[&str] = &[
    "network",
    "install",
    "enable",
    "reload",
    "bad-reload",
    "bad-restart",
    "fixed",
    "upgrade",
    "remove",
    "purge",
];

/// The root's packages beyond Debian's `apt` variant (essential + apt).
const ROOT_PACKAGES: &[&str] = &["systemd-sysv", "iproute2", "iputils-ping", "jq", "kmod"];

/// Where the root comes from.
const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";

/// The disk's size: the root (about 450 MB with the modules) and room for
/// two installs.
const DISK: &str = "1500M";

/// The most the guest may take, boot to power-off (about 4 minutes under
/// TCG here).
const TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// What the guest's console said.
#[derive(Debug, Default)]
pub struct Report {
    booted: bool,
    /// Each step and whether it passed (with the failure's reason).
    steps: Vec<(String, Result<(), String>)>,
    done: bool,
}

impl Console for Report {
    fn read(&mut self, line: &str) {
        let Some(start) = line.find("LANE ") else {
            return;
        };
        let mut words = line[start + 5..].splitn(2, ' ');
        match (words.next(), words.next().map(str::trim)) {
            (Some("BOOTED"), _) => self.booted = true,
            (Some("PASS"), Some(step)) => self.steps.push((step.into(), Ok(()))),
            (Some("FAIL"), Some(rest)) => {
                let (step, why) = rest.split_once(": ").unwrap_or((rest, ""));
                self.steps.push((step.into(), Err(why.into())));
            }
            (Some("DONE"), _) => self.done = true,
            _ => {}
        }
    }

    fn booted(&self) -> bool {
        self.booted
    }
}

impl Report {
    fn passed(&self) -> bool {
        self.done
            && STEPS
                .iter()
                .all(|s| self.steps.iter().any(|(n, r)| n == s && r.is_ok()))
    }
}

pub fn run() -> anyhow::Result<()> {
    let started = Instant::now();
    let root = run::workspace_root();
    let dir = root.join("target/package-lane");
    fs::create_dir_all(&dir)?;
    let debs = [package::build(true, 1)?, package::build(true, 2)?];
    let base = debian_root(&dir)?;
    let kernel = kernel::KERNELS[0];
    let disk = disk(&dir, &base, &kernel, &debs)?;
    let initrd = PathBuf::from(format!("/boot/initrd.img-{}", kernel.release));
    if !initrd.exists() {
        bail!(
            "{} is missing: reinstall {}",
            initrd.display(),
            kernel.package
        );
    }
    let mut drive = OsString::from("file=");
    drive.push(&disk);
    drive.push(",format=raw,if=virtio");
    let args: Vec<OsString> = vec![
        "-kernel".into(),
        kernel::vmlinuz(&kernel)?.into(),
        "-initrd".into(),
        initrd.into(),
        "-drive".into(),
        drive,
        "-append".into(),
        "console=ttyS0 root=/dev/vda rw quiet panic=-1 systemd.show_status=false".into(),
    ];
    let report: Report = kernel::run_guest("package", &args, TIMEOUT)?;
    eprintln!(
        "package lane on {} with systemd: {} in {:.0} s",
        kernel.release,
        if report.passed() { "PASS" } else { "FAIL" },
        started.elapsed().as_secs_f64()
    );
    for step in STEPS {
        match report.steps.iter().find(|(n, _)| n == step) {
            Some((_, Ok(()))) => eprintln!("  {step}: pass"),
            Some((_, Err(why))) => eprintln!("  {step}: FAIL ({why})"),
            None => eprintln!("  {step}: not reached"),
        }
    }
    if !report.booted {
        eprintln!("  the guest never reached the lane's unit");
    }
    if !report.passed() {
        bail!("the package lane failed");
    }
    Ok(())
}

/// The Debian 12 root as a tarball, built once per package list.
fn debian_root(dir: &Path) -> anyhow::Result<PathBuf> {
    let key = format!("{SUITE} apt {}", ROOT_PACKAGES.join(","));
    let tar = dir.join("debian-root.tar");
    let stamp = dir.join("debian-root.packages");
    if tar.exists() && fs::read_to_string(&stamp).ok().as_deref() == Some(key.as_str()) {
        return Ok(tar);
    }
    let partial = dir.join("debian-root.tar.partial");
    run::status(
        Command::new("mmdebstrap")
            .args(["--quiet", "--variant=apt", "--format=tar"])
            .arg(format!("--include={}", ROOT_PACKAGES.join(",")))
            .arg(SUITE)
            .arg(&partial)
            .arg(MIRROR),
    )?;
    fs::rename(&partial, &tar)?;
    fs::write(&stamp, key)?;
    Ok(tar)
}

/// A fresh disk: the root, the kernel's modules, the packages and the
/// script with the unit that runs it once the system is up.
fn disk(
    dir: &Path,
    base: &Path,
    kernel: &kernel::Kernel,
    debs: &[PathBuf],
) -> anyhow::Result<PathBuf> {
    let tree = dir.join("root");
    if tree.exists() {
        fs::remove_dir_all(&tree).with_context(|| format!("clearing {}", tree.display()))?;
    }
    fs::create_dir_all(&tree)?;
    run::status(
        Command::new("tar")
            .args(["--numeric-owner", "-xpf"])
            .arg(base)
            .arg("-C")
            .arg(&tree),
    )?;
    let modules = format!("lib/modules/{}", kernel.release);
    fs::create_dir_all(tree.join("lib/modules"))?;
    run::status(
        Command::new("cp")
            .arg("-a")
            .arg(Path::new("/").join(&modules))
            .arg(tree.join("lib/modules")),
    )?;

    let lane = tree.join("srv/lane");
    fs::create_dir_all(&lane)?;
    for deb in debs {
        fs::copy(deb, lane.join(deb.file_name().expect("a file")))?;
    }
    let script = lane.join("lane.sh");
    fs::write(&script, SCRIPT)?;
    run::status(Command::new("chmod").arg("0755").arg(&script))?;

    let units = tree.join("etc/systemd/system");
    fs::write(
        units.join("xdp-limiter-lane.service"),
        "[Unit]\nDescription=xdp-limiter package lane\n\n\
         [Service]\nType=exec\nExecStart=/srv/lane/lane.sh\n\
         StandardOutput=tty\nStandardError=tty\nTTYPath=/dev/ttyS0\n\n\
         [Install]\nWantedBy=multi-user.target\n",
    )?;
    let wants = units.join("multi-user.target.wants");
    fs::create_dir_all(&wants)?;
    symlink(
        "/etc/systemd/system/xdp-limiter-lane.service",
        wants.join("xdp-limiter-lane.service"),
    )?;
    // The console is the lane's: no login prompt on it.
    symlink("/dev/null", units.join("serial-getty@ttyS0.service"))?;
    fs::write(tree.join("etc/hostname"), "lane\n")?;

    let disk = dir.join("disk.raw");
    if disk.exists() {
        fs::remove_file(&disk)?;
    }
    run::status(
        Command::new("mke2fs")
            .args(["-q", "-t", "ext4", "-L", "lane", "-d"])
            .arg(&tree)
            .arg(&disk)
            .arg(DISK),
    )?;
    fs::remove_dir_all(&tree)?;
    Ok(disk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_reads_steps_with_their_reasons() {
        let mut report = Report::default();
        for line in [
            "[  OK  ] Started xdp-limiter package lane.",
            "LANE BOOTED 6.1.0-50-cloud-amd64 under systemd",
            "LANE STEP network",
            "LANE PASS network",
            "LANE FAIL install: apt install",
        ] {
            report.read(line);
        }
        assert!(report.booted);
        assert_eq!(report.steps[0], ("network".into(), Ok(())));
        assert_eq!(
            report.steps[1],
            ("install".into(), Err("apt install".into()))
        );
        assert!(!report.passed());
        let mut all = Report::default();
        for step in STEPS {
            all.read(&format!("LANE PASS {step}"));
        }
        assert!(!all.passed(), "not done");
        all.read("LANE DONE");
        assert!(all.passed());
    }
}
