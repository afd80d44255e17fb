//! The kernel lane: the kernel tests and a daemon smoke test on the
//! kernels people run, each booted in qemu.
//!
//! `cargo xtask test --kernel 6.1` (or `6.12`, or `all`) builds the
//! `xdp-limiter` binary and the test binaries that drive the real kernel,
//! packs them with what they need (shared libraries, iproute2, nsenter,
//! xdp-tools' `xdp-filter` and `xdp-loader` with libxdp's BPF objects
//! ([`BPF_OBJECTS`]: its multi-program dispatcher, xdp-filter's
//! programs), the kernel's veth module and a busybox for the shell) into
//! an initramfs, boots Debian's kernel package with it, runs every binary
//! in the guest and reports pass or fail per binary and per kernel. The
//! guest's /init is [`INIT`]; its console is streamed here, prefixed with
//! the kernel's name, and read for the `LANE` lines the init prints; the
//! summary gives, per kernel, the verifier's figures (`xdp-limiter check
//! --output json` in the guest: instructions processed, load time).
//!
//! qemu uses KVM where it works. On these machines `/dev/kvm` exists but
//! nested KVM dies early (an emulation failure on `cmpxchg16b`), so a
//! guest that has not reached its init within [`KVM_PROBE`] is started
//! again under software emulation (TCG), which boots in about 15 s.
//!
//! Under TCG everything is slower (a program load takes about 2 s on 6.1,
//! and BPF_PROG_TEST_RUN about 20 times longer than on the host), so the
//! guest runs the tiers' five-million-source churn with
//! [`GUEST_SPOOFED_SOURCES`] sources instead (`LIMITER_SPOOFED_SOURCES`),
//! and their floods against a [`GUEST_FLOOD_PPS`] limit
//! (`LIMITER_FLOOD_PPS`), and the small limits' flood with
//! [`GUEST_SMALL_FLOOD`] sources per rule (`LIMITER_SMALL_FLOOD`), and
//! the matching model's first [`GUEST_MODEL_SETS`] rule sets
//! (`LIMITER_MODEL_SETS`); the host suite keeps the full sizes.

use std::{
    ffi::OsString,
    fmt::Write as _,
    fs,
    io::{BufRead, BufReader},
    os::unix::fs::{symlink, PermissionsExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::run;

/// A Debian kernel package the lane boots.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    /// What `--kernel` calls it.
    pub name: &'static str,
    /// `uname -r`: its files in /boot and /lib/modules.
    pub release: &'static str,
    /// The Debian package that installs it (`cargo xtask setup`).
    pub package: &'static str,
}

/// The kernels of the lane: Debian 12's own (6.1, the oldest that is
/// tested) and the backports' and Debian 13's (6.12).
pub const KERNELS: [Kernel; 2] = [
    Kernel {
        name: "6.1",
        release: "6.1.0-50-cloud-amd64",
        package: "linux-image-6.1.0-50-cloud-amd64-unsigned",
    },
    Kernel {
        name: "6.12",
        release: "6.12.111+deb12-cloud-amd64",
        package: "linux-image-6.12.111+deb12-cloud-amd64-unsigned",
    },
];

/// The lane `cargo xtask test` runs after the host suite (CI's).
pub const DEFAULT_LANE: &str = "6.1";

/// The test binaries of `limiter-tests` the guest runs, with their
/// arguments: every binary whose tests go through BPF_PROG_TEST_RUN, the
/// netns counting test (native attach on a veth pair), the refusal
/// message (on a program every kernel refuses), proof before state with
/// the kernel's own SYN cookies, the lists and bans in the
/// kernel, xdp-limiter in libxdp's dispatcher beside xdp-filter, and the
/// daemon's smoke test (load, native attach, enforce, `/metrics`, `status`,
/// `detach`).
pub const GUEST_TESTS: &[(&str, &[&str])] = &[
    ("datapath", &[]),
    ("limiter", &[]),
    ("tiers", &[]),
    ("small_limits", &[]),
    ("matching", &[]),
    ("matching_model", &[]),
    ("insert_failure", &[]),
    ("cluster_kernel", &[]),
    ("batch", &[]),
    ("netns_counting", &[]),
    ("refusal", &[]),
    ("adversarial", &[]),
    // Proof before state with real SYN cookies (a handshake over a veth
    // pair of the guest's own).
    ("proof", &[]),
    ("levels", &[]),
    // The lists' and bans' kernel tests; their feeds (fail2ban, CrowdSec)
    // need servers the guest does not have, and the race of frames
    // against switches of lists (20 rewrites of a 2 MiB bitmap, a minute
    // under emulation) runs on the host.
    ("lists", &["--skip", "feeds::", "--skip", "racing"]),
    // libxdp's dispatcher beside Debian's xdp-filter: the host's kernel
    // cannot run a dispatcher (no BPF trampolines), 6.1 can.
    ("dispatcher", &[]),
    (
        "daemon",
        &[
            "--exact",
            "a_daemon_loads_attaches_natively_enforces_reports_and_detaches",
        ],
    ),
];

/// The spoofed sources of the tiers' flood and churn tests in the guest
/// (five million on the host): the churn is still 50 times the exact
/// tier's 4,096 windows.
pub const GUEST_SPOOFED_SOURCES: u32 = 200_000;

/// The limit of the tiers' flood tests in the guest (10,000 pps on the
/// host): emulation cannot offer ten times 10,000 frames a second.
pub const GUEST_FLOOD_PPS: u32 = 1_000;

/// The spoofed sources per rule of the small limits' flood in the guest
/// (20,000 on the host).
pub const GUEST_SMALL_FLOOD: u32 = 5_000;

/// The rule sets the matching model tries in the guest (300 on the
/// host, the same seed: the guest's are the host's first 100): each
/// set is a push and 48 test runs, 0.1 s under emulation.
pub const GUEST_MODEL_SETS: usize = 100;

/// How long a KVM guest may take to reach its init before the lane falls
/// back to software emulation: TCG, ten or more times slower than KVM,
/// reaches it in about 15 s, so a KVM guest that has not in 20 s will
/// not (the nested KVM here hangs silently after the firmware, and each
/// second waited is a second of every lane run).
const KVM_PROBE: Duration = Duration::from_secs(20);

/// The most one kernel's run may take (boot, every test, power-off).
const LANE_TIMEOUT: Duration = Duration::from_secs(40 * 60);

/// Debian packages the lane needs beyond the kernels: qemu, a static
/// busybox for the guest's shell, cpio for the initramfs, binutils'
/// `strip` (the test binaries' debug info would triple the image), xz for
/// the kernel modules that come compressed.
pub const PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "binutils",
    "xz-utils",
];

/// The kernels `--kernel` names: one by name, or `all`.
pub fn select(name: &str) -> anyhow::Result<Vec<Kernel>> {
    if name == "all" {
        return Ok(KERNELS.to_vec());
    }
    match KERNELS.iter().find(|k| k.name == name) {
        Some(kernel) => Ok(vec![*kernel]),
        None => bail!(
            "no kernel lane `{name}`: choose {} or all",
            KERNELS.map(|k| k.name).join(", ")
        ),
    }
}

/// What one kernel's run gave.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LaneReport {
    /// The guest reached its init.
    pub booted: bool,
    /// Each test binary and whether it passed, in the order run.
    pub results: Vec<(String, bool)>,
    /// The guest's init finished (every binary ran).
    pub done: bool,
    /// What `xdp-limiter check --output json` printed in the guest: the
    /// verifier's figures on that kernel (or its refusal).
    pub verifier: Option<String>,
    /// Every such line, in order (`bench verifier` loads several times).
    pub verifier_runs: Vec<String>,
    /// The JSON lines a bench in the guest printed (`LANE BENCH`).
    pub bench: Vec<String>,
}

impl LaneReport {
    /// Reads one console line of the guest.
    pub fn read(&mut self, line: &str) {
        // The console may prefix the first line with terminal codes.
        let Some(start) = line.find("LANE ") else {
            return;
        };
        let line = &line[start..];
        let mut words = line.split_whitespace();
        words.next();
        match (words.next(), words.next(), words.next()) {
            (Some("BOOTED"), _, _) => self.booted = true,
            (Some("VERIFIER"), _, _) => {
                let figures = line.split_once("VERIFIER").map_or("", |(_, rest)| rest);
                self.verifier = Some(figures.trim().to_string());
                self.verifier_runs.push(figures.trim().to_string());
            }
            (Some("BENCH"), _, _) => {
                let json = line.split_once("BENCH").map_or("", |(_, rest)| rest);
                self.bench.push(json.trim().to_string());
            }
            (Some("RESULT"), Some(name), Some(code)) => {
                self.results.push((name.to_string(), code == "0"))
            }
            (Some("DONE"), _, _) => self.done = true,
            _ => {}
        }
    }

    /// Every binary of `expected` ran and passed.
    pub fn passed(&self, expected: &[&str]) -> bool {
        self.done
            && expected
                .iter()
                .all(|name| self.results.iter().any(|(n, ok)| n == name && *ok))
    }
}

/// Runs the lane on each of `kernels`; fails unless every one passes.
pub fn run(kernels: &[Kernel]) -> anyhow::Result<()> {
    let root = run::workspace_root();
    let binaries = build(&root)?;
    let mut summary = Vec::new();
    for kernel in kernels {
        let started = Instant::now();
        let report = lane(&root, kernel, &binaries, &test_init())?;
        let expected: Vec<&str> = GUEST_TESTS.iter().map(|(name, _)| *name).collect();
        let passed = report.passed(&expected);
        summary.push((kernel.name, passed, started.elapsed(), report));
    }
    eprintln!("kernel lane summary:");
    let mut failed = Vec::new();
    for (name, passed, took, report) in &summary {
        eprintln!(
            "  {name}: {} in {:.0} s",
            if *passed { "PASS" } else { "FAIL" },
            took.as_secs_f64()
        );
        if let Some(figures) = &report.verifier {
            eprintln!("    verifier: {figures}");
        }
        for (binary, ok) in &report.results {
            eprintln!("    {binary}: {}", if *ok { "pass" } else { "FAIL" });
        }
        if !report.booted {
            eprintln!("    the guest never reached its init");
        } else if !report.done {
            eprintln!("    the guest stopped before its last test");
        }
        if !passed {
            failed.push(*name);
        }
    }
    if !failed.is_empty() {
        bail!("the kernel lane failed on {}", failed.join(", "));
    }
    Ok(())
}

/// The files the guest needs from the build.
struct Binaries {
    limiter: PathBuf,
    /// Test binary name and path, in [`GUEST_TESTS`] order.
    tests: Vec<(&'static str, PathBuf)>,
}

/// Builds the daemon binary and the guest's test binaries (the dev
/// profile, as the host suite, so a `cargo xtask test` builds nothing
/// twice).
fn build(root: &Path) -> anyhow::Result<Binaries> {
    let limiter = build_limiter(root)?;
    let mut cmd = run::cargo();
    cmd.args([
        "test",
        "-p",
        "limiter-tests",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    for (name, _) in GUEST_TESTS {
        cmd.args(["--test", name]);
    }
    eprintln!("+ cargo test -p limiter-tests --no-run (the guest's test binaries)");
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo")?;
    if !out.status.success() {
        bail!("building the guest's test binaries failed: {}", out.status);
    }
    let executables = test_executables(&String::from_utf8_lossy(&out.stdout))?;
    let mut tests = Vec::new();
    for (name, _) in GUEST_TESTS {
        let path = executables
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.clone())
            .with_context(|| format!("cargo built no test binary `{name}`"))?;
        tests.push((*name, path));
    }
    Ok(Binaries { limiter, tests })
}

/// Builds the `xdp-limiter` binary (dev profile); its path.
fn build_limiter(root: &Path) -> anyhow::Result<PathBuf> {
    run::status(run::cargo().args(["build", "-p", "limiter-user", "--bin", "xdp-limiter"]))?;
    Ok(root.join("target/debug/xdp-limiter"))
}

/// `cargo xtask bench verifier`: what the verifier spends on the program on
/// this machine's kernel and on each lane's kernel, as JSON lines (the
/// median load time of [`VERIFIER_RUNS`]; the instruction count does not
/// vary), against the target of at most 450,000 instructions; saves them as
/// the current figures (`bench-table --save verifier`).
pub fn bench_verifier() -> anyhow::Result<()> {
    let root = run::workspace_root();
    let binaries = Binaries {
        limiter: build_limiter(&root)?,
        tests: Vec::new(),
    };
    let mut lines = Vec::new();
    let mut host = Vec::new();
    for _ in 0..VERIFIER_RUNS {
        let out = Command::new(&binaries.limiter)
            .args(["check", "--output", "json"])
            .output()
            .context("running xdp-limiter check")?;
        host.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    lines.push(("host", host));
    for kernel in &KERNELS {
        let report = lane(&root, kernel, &binaries, &verifier_init())?;
        if !report.done {
            bail!("the {} guest stopped before its checks", kernel.name);
        }
        lines.push((kernel.name, report.verifier_runs));
    }
    let mut json = String::new();
    for (lane, runs) in lines {
        let line = verifier_line(lane, &runs)?;
        println!("{line}");
        json.push_str(&line);
        json.push('\n');
    }
    save_current("verifier", &host_machine(), &json)
}

/// `cargo xtask bench dispatcher`: `bench-dispatcher` in the 6.1 guest
/// (the default lane's kernel), its JSON lines printed here.
pub fn bench_dispatcher() -> anyhow::Result<()> {
    let root = run::workspace_root();
    run::status(run::cargo().args([
        "build",
        "--quiet",
        "--release",
        "-p",
        "limiter-bench",
        "--bin",
        "bench-dispatcher",
    ]))?;
    let binaries = Binaries {
        limiter: build_limiter(&root)?,
        tests: vec![(
            "bench-dispatcher",
            root.join("target/release/bench-dispatcher"),
        )],
    };
    let kernel = KERNELS
        .iter()
        .find(|k| k.name == DEFAULT_LANE)
        .context("the default lane's kernel")?;
    let init = INIT
        .replace("@TESTS@", "/t/bench-dispatcher --lane\n")
        .replace("@CHURN@", "0")
        .replace("@FLOOD@", "0")
        .replace("@SMALL@", "0")
        .replace("@SETS@", "0");
    let report = lane(&root, kernel, &binaries, &init)?;
    if !report.done || report.bench.is_empty() {
        bail!("the {} guest printed no figures", kernel.name);
    }
    for line in &report.bench {
        println!("{line}");
    }
    Ok(())
}

/// Saves `json` (JSON lines) as the latest run of `name` in docs/data and
/// renders docs/benchmarks.md's current figures again (`bench-table`).
fn save_current(name: &str, machine: &str, json: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let root = run::workspace_root();
    run::status(
        run::cargo()
            .args(["build", "--quiet", "--release", "-p", "limiter-bench"])
            .args(["--bin", "bench-table"]),
    )?;
    let mut child = Command::new(root.join("target/release/bench-table"))
        .current_dir(&root)
        .args(["--save", name, "--machine", machine])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("starting bench-table")?;
    child
        .stdin
        .take()
        .context("bench-table's stdin")?
        .write_all(json.as_bytes())?;
    let status = child.wait()?;
    anyhow::ensure!(status.success(), "bench-table --save {name}: {status}");
    Ok(())
}

/// This machine as the current figures name it: its CPUs and kernel.
fn host_machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = Command::new("uname")
        .arg("-r")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!("{cpus} CPUs, kernel {kernel} (host) and the qemu lanes' kernels")
}

/// Loads per kernel in `bench verifier`.
const VERIFIER_RUNS: usize = 3;

/// The target on every kernel: 45% of the verifier's limit, so the next
/// features have room (the suite's budget test holds the same figure).
const VERIFIER_TARGET: u64 = 450_000;

/// The guest's init of `bench verifier`: [`VERIFIER_RUNS`] checks.
fn verifier_init() -> String {
    let mut runs = String::new();
    for _ in 0..VERIFIER_RUNS {
        runs.push_str(CHECK_LINE);
    }
    INIT.replace("@TESTS@", &runs)
        .replace("@CHURN@", "0")
        .replace("@FLOOD@", "0")
        .replace("@SMALL@", "0")
        .replace("@SETS@", "0")
}

/// The guest's line with `xdp-limiter check --output json`'s figures,
/// with each BPF function's share (where a kernel's verifier spends its
/// instructions differs from the host's).
const CHECK_LINE: &str = "echo \"LANE VERIFIER $(xdp-limiter check --functions --output json 2>&1 \
     | tr '\\n' ' ')\"\n";

/// One JSON line of `bench verifier` from a lane's `check --output json`
/// runs: the instructions, the median load time, and the target.
fn verifier_line(lane: &str, runs: &[String]) -> anyhow::Result<String> {
    let mut instructions = None;
    let mut load_ms = Vec::new();
    let mut kernel = String::new();
    for run in runs {
        let check: serde_json::Value = serde_json::from_str(run)
            .with_context(|| format!("{lane}: check printed no figures but: {run}"))?;
        instructions = check["verified_instructions"].as_u64();
        kernel = check["kernel"].as_str().unwrap_or_default().to_string();
        load_ms.extend(check["load_ms"].as_f64());
    }
    let instructions = instructions.with_context(|| format!("{lane}: no check ran"))?;
    load_ms.sort_by(f64::total_cmp);
    let median = load_ms.get(load_ms.len() / 2).copied().unwrap_or(0.0);
    Ok(serde_json::json!({
        "bench": "verifier",
        "lane": lane,
        "kernel": kernel,
        "verified_instructions": instructions,
        "verifier_limit": 1_000_000,
        "target": VERIFIER_TARGET,
        "within_target": instructions <= VERIFIER_TARGET,
        "load_ms_median": (median * 10.0).round() / 10.0,
        "runs": load_ms.len(),
    })
    .to_string())
}

/// The test executables in cargo's JSON messages: (target name, path).
fn test_executables(messages: &str) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut found = Vec::new();
    for line in messages.lines().filter(|l| l.starts_with('{')) {
        let message: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("cargo printed a line that is not JSON: {line}"))?;
        if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
            continue;
        }
        if let (Some(name), Some(path)) = (
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) {
            found.push((name.to_string(), PathBuf::from(path)));
        }
    }
    Ok(found)
}

/// The guest's init: mounts (bpffs on /sys/fs/bpf too, where libxdp pins
/// its dispatchers under xdp/), the veth module, each test binary with a
/// `LANE RESULT` line, power-off. `@TESTS@` is replaced with the runs.
const INIT: &str = r#"#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t bpf bpf /sys/fs/bpf
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
exec >/dev/console 2>&1 </dev/null
echo "LANE BOOTED $(uname -r) $(nproc) CPUs"
mkdir -p /run/netns
insmod /lib/modules/$(uname -r)/veth.ko || echo "LANE NOTE no veth module"
ip link set lo up
export HOME=/tmp RUST_BACKTRACE=1 XDP_LIMITER_BIN=/bin/xdp-limiter
export LIMITER_SPOOFED_SOURCES=@CHURN@ LIMITER_FLOOD_PPS=@FLOOD@ LIMITER_SMALL_FLOOD=@SMALL@
export LIMITER_MODEL_SETS=@SETS@
cd /tmp
@TESTS@
echo "LANE DONE"
sync
poweroff -f
echo o > /proc/sysrq-trigger
"#;

/// The init script for [`GUEST_TESTS`].
fn test_init() -> String {
    let mut runs = String::from(CHECK_LINE);
    for (name, args) in GUEST_TESTS {
        let _ = writeln!(runs, "echo \"LANE START {name}\"");
        let _ = writeln!(runs, "/t/{name} {}", args.join(" "));
        let _ = writeln!(runs, "echo \"LANE RESULT {name} $?\"");
    }
    INIT.replace("@TESTS@", &runs)
        .replace("@CHURN@", &GUEST_SPOOFED_SOURCES.to_string())
        .replace("@FLOOD@", &GUEST_FLOOD_PPS.to_string())
        .replace("@SMALL@", &GUEST_SMALL_FLOOD.to_string())
        .replace("@SETS@", &GUEST_MODEL_SETS.to_string())
}

/// Busybox applets the init uses (not `ip`: iproute2's own is copied).
const APPLETS: &[&str] = &[
    "sh", "mount", "mkdir", "echo", "insmod", "uname", "nproc", "sync", "poweroff", "cat",
];

/// Host programs the tests run in the guest (xdp-filter and xdp-loader,
/// of xdp-tools: the dispatcher tests' other XDP programs).
const HOST_TOOLS: &[&str] = &[
    "/usr/bin/ip",
    "/usr/bin/nsenter",
    "/usr/sbin/sysctl",
    "/usr/bin/ping",
    "/usr/sbin/ethtool",
    "/usr/sbin/xdp-filter",
    "/usr/sbin/xdp-loader",
];

/// The BPF objects libxdp and xdp-filter load (libxdp1's
/// xdp-dispatcher.o, xdp-tools' xdpfilt_*.o), copied whole to the same
/// path in the guest: libxdp looks for them there.
const BPF_OBJECTS: &str = "/usr/lib/x86_64-linux-gnu/bpf";

/// Builds the initramfs for `kernel` under `dir`; returns its path.
fn initramfs(
    dir: &Path,
    kernel: &Kernel,
    binaries: &Binaries,
    init_script: &str,
) -> anyhow::Result<PathBuf> {
    let tree = dir.join("root");
    let _ = fs::remove_dir_all(&tree);
    for sub in [
        "bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "tmp", "run", "t", "etc", "var",
    ] {
        fs::create_dir_all(tree.join(sub))?;
    }
    symlink("/run", tree.join("var/run"))?;
    fs::copy("/bin/busybox", tree.join("bin/busybox")).context("busybox-static is missing")?;
    for applet in APPLETS {
        symlink("busybox", tree.join("bin").join(applet))?;
    }
    let mut programs: Vec<(PathBuf, PathBuf)> = HOST_TOOLS
        .iter()
        .map(|tool| (PathBuf::from(tool), PathBuf::from(tool)))
        .collect();
    programs.push((binaries.limiter.clone(), PathBuf::from("/bin/xdp-limiter")));
    for (name, path) in &binaries.tests {
        programs.push((path.clone(), PathBuf::from("/t").join(name)));
    }
    for (from, to) in &programs {
        let dest = tree.join(to.strip_prefix("/")?);
        // Stripped of debug info: the test binaries are mostly that.
        run::status(
            Command::new("strip")
                .arg("--strip-debug")
                .arg(from)
                .arg("-o")
                .arg(&dest),
        )?;
        for lib in shared_libraries(from)? {
            let dest = tree.join(lib.strip_prefix("/")?);
            if !dest.exists() {
                fs::create_dir_all(dest.parent().expect("a library has a folder"))?;
                fs::copy(&lib, &dest).with_context(|| format!("copying {}", lib.display()))?;
            }
        }
    }
    let objects = tree.join(BPF_OBJECTS.strip_prefix('/').expect("an absolute path"));
    fs::create_dir_all(&objects)?;
    let listing = fs::read_dir(BPF_OBJECTS)
        .with_context(|| format!("reading {BPF_OBJECTS}: is xdp-tools installed?"))?;
    for entry in listing {
        let from = entry?.path();
        if from.is_file() {
            let name = from.file_name().expect("a file has a name");
            fs::copy(&from, objects.join(name))
                .with_context(|| format!("copying {}", from.display()))?;
        }
    }
    // 6.1 ships its modules plain, 6.12 compressed with xz.
    let module_dir = Path::new("/lib/modules")
        .join(kernel.release)
        .join("kernel/drivers/net");
    let modules = tree.join("lib/modules").join(kernel.release);
    fs::create_dir_all(&modules)?;
    let veth = module_dir.join("veth.ko");
    let packed = module_dir.join("veth.ko.xz");
    if veth.exists() {
        fs::copy(&veth, modules.join("veth.ko"))?;
    } else if packed.exists() {
        let out = fs::File::create(modules.join("veth.ko"))?;
        let status = Command::new("xz")
            .arg("-dc")
            .arg(&packed)
            .stdout(out)
            .status()
            .context("xz (xz-utils)")?;
        if !status.success() {
            bail!("cannot decompress {}: {status}", packed.display());
        }
    } else {
        bail!(
            "{} is missing: is {} installed?",
            veth.display(),
            kernel.package
        );
    }
    let init = tree.join("init");
    fs::write(&init, init_script)?;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;
    let image = dir.join(format!("initramfs-{}.cpio.gz", kernel.name));
    let pack = format!(
        "cd '{}' && find . | cpio -o -H newc --quiet | gzip -1 > '{}'",
        tree.display(),
        image.display()
    );
    run::status(Command::new("sh").args(["-c", &pack]))?;
    fs::remove_dir_all(&tree)?;
    Ok(image)
}

/// The shared libraries `program` loads (and the dynamic loader), from
/// `ldd`; none for a static program.
fn shared_libraries(program: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(program).output().context("ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// Boots `kernel` with the guest's binaries and reads its console.
fn lane(
    root: &Path,
    kernel: &Kernel,
    binaries: &Binaries,
    init_script: &str,
) -> anyhow::Result<LaneReport> {
    let vmlinuz = vmlinuz(kernel)?;
    let dir = root.join("target/kernel-lane");
    fs::create_dir_all(&dir)?;
    let image = initramfs(&dir, kernel, binaries, init_script)?;
    let args: Vec<OsString> = vec![
        "-kernel".into(),
        vmlinuz.into(),
        "-initrd".into(),
        image.into(),
        "-append".into(),
        "console=ttyS0 quiet panic=-1 rdinit=/init".into(),
    ];
    run_guest(kernel.name, &args, LANE_TIMEOUT)
}

/// The kernel's image in /boot, which `cargo xtask setup` installs.
pub fn vmlinuz(kernel: &Kernel) -> anyhow::Result<PathBuf> {
    let vmlinuz = PathBuf::from(format!("/boot/vmlinuz-{}", kernel.release));
    if !vmlinuz.exists() {
        bail!(
            "{} is missing: `cargo xtask setup` installs {}",
            vmlinuz.display(),
            kernel.package
        );
    }
    Ok(vmlinuz)
}

/// A guest's console, read line by line.
pub trait Console: Default {
    fn read(&mut self, line: &str);
    /// The guest reached its init (or, with systemd, the lane's unit).
    fn booted(&self) -> bool;
}

impl Console for LaneReport {
    fn read(&mut self, line: &str) {
        LaneReport::read(self, line);
    }

    fn booted(&self) -> bool {
        self.booted
    }
}

/// Boots a guest with `args` (kernel, initrd or disk, command line) and
/// reads its console until it powers off or `timeout` passes: under KVM
/// where it works, else under TCG.
pub fn run_guest<C: Console>(
    label: &str,
    args: &[OsString],
    timeout: Duration,
) -> anyhow::Result<C> {
    if Path::new("/dev/kvm").exists() {
        let report: C = boot(label, args, Accel::Kvm, timeout)?;
        if report.booted() {
            return Ok(report);
        }
        eprintln!("[{label}] KVM did not boot the guest: falling back to TCG");
    }
    // Multi-threaded TCG now and then crashes a kernel while it patches
    // its own text at boot (seen on 6.12: an int3 oops in
    // sched_clock_cpu, before init). Only a guest that never reached its
    // init is started again; anything after that counts.
    let mut report = C::default();
    for attempt in 1..=TCG_BOOTS {
        report = boot(label, args, Accel::Tcg, timeout)?;
        if report.booted() {
            break;
        }
        eprintln!("[{label}] the guest crashed before its init (boot {attempt} of {TCG_BOOTS})");
    }
    Ok(report)
}

/// Boots under TCG before a guest that never reaches its init fails the
/// lane.
const TCG_BOOTS: u32 = 3;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Accel {
    Kvm,
    Tcg,
}

/// One qemu run; under KVM, given up (killed) when the guest has not
/// reached its init within [`KVM_PROBE`].
fn boot<C: Console>(
    label: &str,
    args: &[OsString],
    accel: Accel,
    timeout: Duration,
) -> anyhow::Result<C> {
    let accel_args: &[&str] = match accel {
        Accel::Kvm => &["-accel", "kvm", "-cpu", "host"],
        Accel::Tcg => &["-accel", "tcg,thread=multi", "-cpu", "max"],
    };
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(accel_args)
        .args(["-smp", "2", "-m", "3072", "-nographic", "-no-reboot"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    eprintln!(
        "+ qemu-system-x86_64 ({}) {}",
        if accel == Accel::Kvm { "KVM" } else { "TCG" },
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut child = cmd
        .spawn()
        .context("cannot start qemu-system-x86_64 (qemu-system-x86)")?;
    let (tx, rx) = mpsc::channel();
    for stream in [
        Box::new(child.stdout.take().expect("piped")) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().expect("piped")),
    ] {
        let tx = tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(stream).split(b'\n').map_while(Result::ok) {
                let line = String::from_utf8_lossy(&line).replace(['\r', '\x1b'], "");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let started = Instant::now();
    let mut report = C::default();
    loop {
        let limit = if accel == Accel::Kvm && !report.booted() {
            KVM_PROBE
        } else {
            timeout
        };
        let Some(left) = limit.checked_sub(started.elapsed()) else {
            eprintln!(
                "[{label}] timed out after {} s: stopping qemu",
                limit.as_secs()
            );
            break;
        };
        match rx.recv_timeout(left) {
            Ok(line) => {
                println!("[{label}] {line}");
                report.read(&line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_reads_the_lane_lines_and_nothing_else() {
        let mut report = LaneReport::default();
        for line in [
            "[    0.000000] Linux version 6.1.0-50-cloud-amd64",
            "c[?7l[2JLANE BOOTED 6.1.0-50-cloud-amd64 2 CPUs",
            r#"LANE VERIFIER {"kernel":"6.1.0-50-cloud-amd64","verified_instructions":216896}"#,
            "LANE START datapath",
            "test result: ok. 18 passed",
            "LANE RESULT datapath 0",
            "LANE RESULT tiers 101",
        ] {
            report.read(line);
        }
        assert!(report.booted);
        assert!(!report.done);
        assert_eq!(
            report.verifier.as_deref(),
            Some(r#"{"kernel":"6.1.0-50-cloud-amd64","verified_instructions":216896}"#)
        );
        assert_eq!(
            report.results,
            vec![("datapath".into(), true), ("tiers".into(), false)]
        );
        assert!(!report.passed(&["datapath"]), "not done yet");
        report.read("LANE DONE");
        assert!(report.passed(&["datapath"]));
        assert!(!report.passed(&["datapath", "tiers"]), "tiers failed");
        assert!(
            !report.passed(&["datapath", "limiter"]),
            "limiter never ran"
        );
    }

    #[test]
    fn a_verifier_line_gives_the_median_load_and_the_target() {
        let runs: Vec<String> = [30.0, 10.0, 20.0]
            .iter()
            .map(|ms| {
                format!(
                    r#"{{"kernel":"6.1.0-50-cloud-amd64","program":"xdp_limiter","verified_instructions":216896,"verifier_limit":1000000,"load_ms":{ms},"maps":17}}"#
                )
            })
            .collect();
        let line: serde_json::Value =
            serde_json::from_str(&verifier_line("6.1", &runs).unwrap()).unwrap();
        assert_eq!(line["verified_instructions"], 216_896);
        assert_eq!(line["load_ms_median"], 20.0);
        assert_eq!(line["within_target"], true);
        assert_eq!(line["kernel"], "6.1.0-50-cloud-amd64");
        let refused = vec!["Error: this kernel (6.1) refused the XDP program".to_string()];
        let err = verifier_line("6.1", &refused).unwrap_err().to_string();
        assert!(err.contains("check printed no figures"), "{err}");
    }

    #[test]
    fn kernels_are_chosen_by_name_or_all() {
        assert_eq!(select("6.1").unwrap()[0].release, "6.1.0-50-cloud-amd64");
        assert_eq!(select("all").unwrap().len(), KERNELS.len());
        let err = select("5.15").unwrap_err().to_string();
        assert!(err.contains("6.1, 6.12 or all"), "{err}");
    }

    #[test]
    fn cargo_messages_give_the_test_executables() {
        let messages = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"datapath"},"profile":{"test":true},"executable":"/t/datapath-1"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"limiter_tests"},"profile":{"test":false},"executable":null}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        assert_eq!(
            test_executables(messages).unwrap(),
            vec![("datapath".to_string(), PathBuf::from("/t/datapath-1"))]
        );
    }
}
