//! The Debian package as built (`cargo xtask package --debug`, which the
//! suite runs before these tests): what it installs and where, its one
//! conffile, lintian, and the unit it ships through `systemd-analyze
//! verify` and `security`. The install itself (apt, systemd, upgrade,
//! removal) is the package lane's (`cargo xtask test --package-lane`).
//!
//! The package is `$LIMITER_DEB` (the suite's), or the debug build's in
//! `target/package/debug/`, which is refused when older than the binary
//! (build it again) rather than tested stale.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The exposure `systemd-analyze security` gives the unit (0 to 10, lower
/// is better): the unit scores 2.7 on Debian 12's systemd 252 ("OK"). A
/// change that loosens the sandbox fails here.
const MAX_EXPOSURE: f64 = 2.7;

fn deb() -> PathBuf {
    if let Some(path) = std::env::var_os("LIMITER_DEB") {
        return PathBuf::from(path);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let deb = root.join(format!(
        "target/package/debug/xdp-limiter_{}-1_amd64.deb",
        env!("CARGO_PKG_VERSION")
    ));
    let built = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified());
    let binary = root.join("target/debug/xdp-limiter");
    match (built(&deb), built(&binary)) {
        (Ok(deb_at), Ok(bin_at)) => assert!(
            deb_at >= bin_at,
            "{} is older than {}: run `cargo xtask package --debug`",
            deb.display(),
            binary.display()
        ),
        (Err(e), _) => panic!(
            "{}: {e}: run `cargo xtask package --debug` (the suite does)",
            deb.display()
        ),
        (_, Err(e)) => panic!("{}: {e}", binary.display()),
    }
    deb
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The package unpacked into a directory of its own (removed on drop).
struct Unpacked(PathBuf);

impl Unpacked {
    fn new(deb: &Path, tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("xl-deb-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&dir));
        Unpacked(dir)
    }
}

impl Drop for Unpacked {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_package_installs_the_binary_unit_config_man_pages_completions_docs_and_dashboards() {
    let deb = deb();
    let listing = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    // `-rwxr-xr-x root/root 123 2026-11-28 06:00 ./usr/sbin/xdp-limiter`
    let files: Vec<(&str, &str)> = listing
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            Some((fields[0], fields.get(5)?.trim_start_matches('.')))
        })
        .collect();
    let mode = |path: &str| {
        files
            .iter()
            .find(|(_, p)| *p == path)
            .map(|(m, _)| *m)
            .unwrap_or_else(|| panic!("the package has no {path}:\n{listing}"))
    };
    assert_eq!(mode("/usr/sbin/xdp-limiter"), "-rwxr-xr-x");
    for path in [
        "/lib/systemd/system/xdp-limiter.service",
        "/etc/xdp-limiter/config.toml",
        "/usr/share/man/man8/xdp-limiter.8.gz",
        "/usr/share/man/man8/xdp-limiter-run.8.gz",
        "/usr/share/man/man8/xdp-limiter-rule-add.8.gz",
        "/usr/share/bash-completion/completions/xdp-limiter",
        "/usr/share/zsh/vendor-completions/_xdp-limiter",
        "/usr/share/fish/vendor_completions.d/xdp-limiter.fish",
        "/usr/share/doc/xdp-limiter/copyright",
        "/usr/share/doc/xdp-limiter/changelog.Debian.gz",
        "/usr/share/doc/xdp-limiter/configuration.md",
        "/usr/share/doc/xdp-limiter/events.md",
        "/usr/share/xdp-limiter/grafana/xdp-limiter.json",
        "/usr/share/xdp-limiter/prometheus/alerts.yml",
        "/usr/share/xdp-limiter/fail2ban/action.d/xdp-limiter.conf",
    ] {
        assert_eq!(mode(path), "-rw-r--r--", "{path}");
    }
    // Every command has its page.
    let pages = files
        .iter()
        .filter(|(_, p)| p.starts_with("/usr/share/man/man8/xdp-limiter"))
        .count();
    assert!(pages >= 15, "{pages} man pages:\n{listing}");

    // The unit's documentation is where it says, uncompressed.
    let unpacked = Unpacked::new(&deb, "docs");
    let unit = std::fs::read_to_string(unpacked.0.join("lib/systemd/system/xdp-limiter.service"))
        .expect("the unit");
    let docs = unit
        .lines()
        .find_map(|l| l.strip_prefix("Documentation="))
        .expect("Documentation=");
    for doc in docs.split_whitespace() {
        if let Some(path) = doc.strip_prefix("file://") {
            mode(path);
        } else if let Some(page) = doc.strip_prefix("man:") {
            let name = page.replace("(8)", ".8.gz");
            mode(&format!("/usr/share/man/man8/{name}"));
        } else {
            panic!("unexpected Documentation= entry {doc}");
        }
    }
    // The unit runs the binary the package installs.
    for key in ["ExecStartPre=", "ExecStart="] {
        let line = unit.lines().find(|l| l.starts_with(key)).expect("the key");
        assert!(
            line.starts_with(&format!("{key}/usr/sbin/xdp-limiter ")),
            "{line}"
        );
    }
}

#[test]
fn the_configuration_is_the_one_conffile_and_the_unit_is_installed_disabled() {
    let deb = deb();
    let control = std::env::temp_dir().join(format!("xl-deb-control-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&control);
    run(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&control));
    let read = |name: &str| std::fs::read_to_string(control.join(name)).expect(name);
    let conffiles = read("conffiles");
    let postinst = read("postinst");
    let prerm = read("prerm");
    let postrm = read("postrm");
    std::fs::remove_dir_all(&control).unwrap();
    assert_eq!(
        conffiles.lines().collect::<Vec<_>>(),
        ["/etc/xdp-limiter/config.toml"]
    );
    // Enabled only if it was (an upgrade keeps the operator's choice);
    // started only if enabled (deb-systemd-invoke), restarted on upgrade.
    let lines: Vec<&str> = postinst.lines().map(str::trim).collect();
    for (i, line) in lines.iter().enumerate() {
        if line.starts_with("deb-systemd-helper enable") {
            let guard = lines[..i].iter().rev().find(|l| l.starts_with("if "));
            assert!(
                guard.is_some_and(|l| l.contains("was-enabled")),
                "an enable not under was-enabled:\n{postinst}"
            );
        }
    }
    assert!(postinst.contains("_dh_action=restart"), "{postinst}");
    // Stopped on remove only, never on upgrade: the program stays
    // attached either way (--keep-attached).
    assert!(prerm.contains("[ \"$1\" = remove ]"), "{prerm}");
    assert!(!prerm.contains("upgrade"), "{prerm}");
    // Purge removes protection and the configuration.
    assert!(
        postrm.contains("rm -rf /sys/fs/bpf/xdp-limiter"),
        "{postrm}"
    );
    assert!(postrm.contains("rm -rf /etc/xdp-limiter"), "{postrm}");
}

#[test]
fn lintian_finds_no_error_or_warning() {
    let deb = deb();
    let out = Command::new("lintian")
        .args(["--fail-on", "error,warning", "--display-level", ">=warning"])
        .arg(&deb)
        .output()
        .expect("lintian (cargo xtask setup installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let tags: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("E:") || l.starts_with("W:"))
        .collect();
    assert!(
        out.status.success() && tags.is_empty(),
        "lintian {:?}: {tags:?}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_packaged_unit_passes_systemd_analyze_verify_and_its_sandbox_scores() {
    let deb = deb();
    let unpacked = Unpacked::new(&deb, "unit");
    let root = &unpacked.0;
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/xdp-limiter.service"))
        .expect("the unit");
    assert!(unit.lines().any(|l| l == "Type=notify"), "{unit}");
    assert!(
        unit.lines().any(|l| l.starts_with("WatchdogSec=")),
        "{unit}"
    );
    assert!(unit.lines().any(|l| l == "UMask=0077"), "{unit}");

    // verify: a copy naming the unpacked binary (this machine has none at
    // /usr/sbin), its man pages found through MANPATH.
    let binary = root.join("usr/sbin/xdp-limiter");
    let dir = root.join("verify");
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("xdp-limiter.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/sbin/xdp-limiter", binary.to_str().unwrap()),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .env("MANPATH", root.join("usr/share/man"))
        .output()
        .expect("systemd-analyze (Debian's systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Lines about other units on this machine (it may not run systemd)
    // are not the unit's.
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("xdp-limiter"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {:?}\n{stderr}",
        out.status
    );

    // security, offline, on the unit as installed.
    let out = run(Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(format!("--root={}", root.display()))
        .arg("xdp-limiter.service"));
    let score: f64 = out
        .lines()
        .find_map(|l| l.split("xdp-limiter.service: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{out}"));
    eprintln!("systemd-analyze security: exposure {score}");
    assert!(score <= MAX_EXPOSURE, "exposure {score}:\n{out}");
}
