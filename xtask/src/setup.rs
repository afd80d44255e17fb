//! `cargo xtask setup`: installs the toolchain the eBPF build needs, each
//! step only when its check says it is missing (see
//! ../shared/notes/toolchain.md for why this recipe).
//!
//! 1. Debian packages: rustc-web/cargo-web with the prebuilt BPF `core`,
//!    its clippy, the tools the tests drive (ip, ping, redis-server,
//!    libfaketime, xdp-tools), and the kernel lane's qemu, busybox and
//!    the Debian kernel packages it boots (`kernel::KERNELS`; installing
//!    one only puts its files in /boot and /lib/modules).
//!    Debian starts and enables redis-server, nginx and prometheus as
//!    services on install; the tests and benchmarks start their own
//!    servers (in namespaces, or on a free port), so setup stops and
//!    disables those services.
//! 2. A rustup toolchain `debian` linked to /usr.
//! 3. A one-symlink LLVM prefix for the LLVM major that rustc uses.
//! 4. bpf-linker, at a pinned version, built against that LLVM.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::run;

/// Debian packages the build and tests need.
const DEBIAN_PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev-bpf",
    "rust-web-clippy",
    "iproute2",
    "iputils-ping",
    "tmux",
    // The end-to-end benchmark and its smoke test: GRO on the receiving
    // veth, the tools compared against, and the font of the plots.
    "ethtool",
    "nftables",
    "iptables",
    "fonts-dejavu-core",
    // The cluster store tests (tests/src/redis.rs) run their own
    // redis-server (and redis-cli, in redis-tools) in a namespace.
    "redis-server",
    "redis-tools",
    // The end-to-end benchmark's service scenario: a real web
    // server under a spoofed SYN flood, and the flood tool of its hping3
    // variant.
    "nginx-light",
    "hping3",
    // The cluster scenario with one node's wall clock 2 s off
    // (tests/tests/cluster_scenarios.rs preloads libfaketime).
    "faketime",
    // The real-Prometheus test (tests/tests/prometheus.rs): its own
    // `prometheus` scraping a daemon in a lab, and `promtool` checking and
    // unit-testing dist/prometheus/alerts.yml.
    "prometheus",
    // The fail2ban feed's test (tests/tests/lists/feeds.rs): a private
    // fail2ban-server driving the shipped action.
    "fail2ban",
    // The CrowdSec bouncer's test: a private local API (`crowdsec -no-cs`)
    // and `cscli` adding and deleting decisions.
    "crowdsec",
    // `cargo xtask package` (debhelper) and its checks (lintian); the
    // install lane's Debian root (mmdebstrap).
    "debhelper",
    "lintian",
    "mmdebstrap",
    // The dispatcher tests: Debian's xdp-filter and xdp-loader beside
    // xdp-limiter in libxdp's multi-program dispatcher (it pulls libxdp1
    // and libbpf1; libxdp1's /usr/lib/x86_64-linux-gnu/bpf/xdp-dispatcher.o
    // is what `[daemon] attach = "dispatcher"` loads).
    "xdp-tools",
];
/// The rustup toolchain name the eBPF build uses (defined with the rest of
/// that build in `limiter-ebpf-build`).
const EBPF_TOOLCHAIN: &str = limiter_ebpf_build::TOOLCHAIN;
const BPF_LINKER_VERSION: &str = "0.13.0";
const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";

pub fn run() -> anyhow::Result<()> {
    crowdsec_offline()?;
    install_debian_packages()?;
    quiet_service("redis-server")?;
    quiet_service("nginx")?;
    quiet_service("prometheus")?;
    quiet_service("fail2ban")?;
    quiet_service("crowdsec")?;
    link_toolchain()?;
    let llvm_major = llvm_major()?;
    let prefix = llvm_shim(llvm_major)?;
    install_bpf_linker(llvm_major, &prefix)?;
    Ok(())
}

/// crowdsec's install registers with CrowdSec's online API unless its
/// credentials file says not to (the package's README.Debian): with no
/// internet the registration fails and leaves the package half
/// configured. The opt-out is a comment in that file, written before the
/// install (and a half-configured package from an earlier try is
/// configured again).
fn crowdsec_offline() -> anyhow::Result<()> {
    let dir = Path::new("/etc/crowdsec");
    let credentials = dir.join("online_api_credentials.yaml");
    let empty = std::fs::metadata(&credentials).map_or(true, |m| m.len() == 0);
    if empty {
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            &credentials,
            "# no Central API registration (written by cargo xtask setup: offline machine)\n",
        )?;
    }
    let half_configured = run::stdout_ok(Command::new("dpkg-query").args([
        "-W",
        "-f=${db:Status-Abbrev}",
        "crowdsec",
    ]))
    .is_some_and(|status| status.starts_with("iF") || status.starts_with("iU"));
    if half_configured {
        run::status(
            Command::new("dpkg")
                .args(["--configure", "-a"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    Ok(())
}

fn package_installed(name: &str) -> bool {
    run::stdout_ok(Command::new("dpkg-query").args(["-W", "-f=${Status}", name]))
        .is_some_and(|status| status.trim() == "install ok installed")
}

fn install_debian_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .chain(crate::kernel::PACKAGES)
        .copied()
        .chain(crate::kernel::KERNELS.iter().map(|k| k.package))
        .filter(|p| !package_installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("setup: installing Debian packages {missing:?}");
    run::status(Command::new("apt-get").args(["update", "-qq"]))?;
    run::status(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// Stops and disables the system's `name` service (redis-server, nginx,
/// prometheus, fail2ban, crowdsec)
/// if the package's install started or enabled it: nothing of the tests
/// needs it, and a server on 6379, 80 or 9090 left running would take memory
/// and confuse a reader of `ss -ltn` (the tests' and benchmarks' servers
/// live in namespaces of their own).
fn quiet_service(name: &str) -> anyhow::Result<()> {
    let unit = format!("{name}.service");
    let script = format!("/etc/init.d/{name}");
    if Path::new("/run/systemd/system").exists() {
        let enabled = run::stdout_ok(Command::new("systemctl").args(["is-enabled", &unit]))
            .is_some_and(|s| s.trim() == "enabled");
        let active = run::output(Command::new("systemctl").args(["is-active", "--quiet", &unit]))
            .is_some_and(|o| o.status.success());
        if enabled || active {
            eprintln!("setup: stopping and disabling the {name} service");
            run::status(Command::new("systemctl").args(["disable", "--now", &unit]))?;
        }
    } else if Path::new(&script).exists()
        && run::output(Command::new(&script).arg("status")).is_some_and(|o| o.status.success())
    {
        // No systemd (containers): the package's init script may have
        // started it.
        eprintln!("setup: stopping the {name} service");
        run::status(Command::new(&script).arg("stop"))?;
    }
    Ok(())
}

fn link_toolchain() -> anyhow::Result<()> {
    let list = run::stdout_ok(Command::new("rustup").args(["toolchain", "list"]))
        .context("rustup is required (it ships with the machine's Rust)")?;
    if list
        .lines()
        .any(|l| l.split_whitespace().next() == Some(EBPF_TOOLCHAIN))
    {
        return Ok(());
    }
    eprintln!("setup: linking rustup toolchain `{EBPF_TOOLCHAIN}` to /usr");
    run::status(Command::new("rustup").args(["toolchain", "link", EBPF_TOOLCHAIN, "/usr"]))
}

/// The LLVM major version of the `debian` rustc (bpf-linker must match it).
fn llvm_major() -> anyhow::Result<u32> {
    let version = run::stdout_ok(
        Command::new("rustc")
            .arg(format!("+{EBPF_TOOLCHAIN}"))
            .arg("-vV"),
    )
    .context("`rustc +debian -vV` failed")?;
    parse_llvm_major(&version)
}

/// The LLVM major from `rustc -vV` output (`LLVM version: 22.1.8`).
fn parse_llvm_major(rustc_version: &str) -> anyhow::Result<u32> {
    let llvm = rustc_version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .context("rustc -vV printed no LLVM version")?;
    llvm.split('.')
        .next()
        .and_then(|major| major.parse().ok())
        .with_context(|| format!("unparsable LLVM version `{llvm}`"))
}

/// A prefix whose lib/libLLVM.so points at Debian's libLLVM.so.<major>.x, so
/// bpf-linker's build finds LLVM without the 700 MB llvm-<major>-dev.
fn llvm_shim(major: u32) -> anyhow::Result<PathBuf> {
    let prefix = PathBuf::from(format!("/opt/llvm{major}-shim"));
    let link = prefix.join("lib/libLLVM.so");
    if link.exists() {
        return Ok(prefix);
    }
    let wanted = format!("libLLVM.so.{major}.");
    let library = fs::read_dir(LIB_DIR)
        .with_context(|| format!("reading {LIB_DIR}"))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&wanted))
        })
        .with_context(|| format!("no {wanted}* in {LIB_DIR}: is libllvm{major} installed?"))?;
    eprintln!("setup: {} -> {}", link.display(), library.display());
    fs::create_dir_all(prefix.join("lib"))?;
    // A stale or dangling link is replaced.
    let _ = fs::remove_file(&link);
    symlink(&library, &link).with_context(|| format!("creating {}", link.display()))?;
    Ok(prefix)
}

/// Is the installed bpf-linker the pinned version, linked to our LLVM major?
fn bpf_linker_ok(major: u32) -> bool {
    let Some(path) = run::stdout_ok(Command::new("sh").args(["-c", "command -v bpf-linker"]))
    else {
        return false;
    };
    let path = path.trim();
    let version_ok = run::stdout_ok(Command::new(path).arg("--version"))
        .is_some_and(|v| v.contains(BPF_LINKER_VERSION));
    let llvm_ok = run::stdout_ok(Command::new("ldd").arg(path))
        .is_some_and(|libs| libs.contains(&format!("libLLVM.so.{major}")));
    version_ok && llvm_ok
}

fn install_bpf_linker(major: u32, prefix: &Path) -> anyhow::Result<()> {
    if bpf_linker_ok(major) {
        return Ok(());
    }
    eprintln!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM {major} (about a minute)"
    );
    run::status(
        Command::new("cargo")
            .args(["install", "--locked", "--force", "bpf-linker"])
            .args(["--version", BPF_LINKER_VERSION, "--no-default-features"])
            .args(["--features", &format!("llvm-{major}")])
            .env("LLVM_PREFIX", prefix),
    )?;
    if !bpf_linker_ok(major) {
        bail!("bpf-linker was installed but is not on PATH or not linked to LLVM {major}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_llvm_major;

    #[test]
    fn llvm_major_is_read_from_rustc_verbose_version() {
        let out = "rustc 1.96.0 (ac68faa20 2026-05-25)\nhost: x86_64-unknown-linux-gnu\nrelease: 1.96.0\nLLVM version: 22.1.8\n";
        assert_eq!(parse_llvm_major(out).unwrap(), 22);
    }

    #[test]
    fn missing_or_garbled_llvm_version_is_an_error() {
        assert!(parse_llvm_major("rustc 1.96.0\n").is_err());
        assert!(parse_llvm_major("LLVM version: x.y\n").is_err());
    }
}
