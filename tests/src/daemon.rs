//! The real `xdp-limiter` binary as a daemon inside a lab's receiving
//! namespace: start it, read its log, scrape its metrics over HTTP, signal
//! it, and always stop it and remove its pins.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        OnceLock,
    },
    time::{Duration, Instant},
};

use std::os::unix::process::CommandExt;

use nix::{sys::signal::Signal, unistd::Pid};

use crate::{
    netns::{run_ok, NetNs},
    wait_until,
};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The `xdp-limiter` binary: `$XDP_LIMITER_BIN` (benchmarks and the demo
/// point it at a release build), else the workspace's debug build, built
/// once per test process so a test never runs a stale binary.
pub fn binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("XDP_LIMITER_BIN").map(PathBuf::from) {
                assert!(
                    path.exists(),
                    "$XDP_LIMITER_BIN {} is missing",
                    path.display()
                );
                return path;
            }
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let mut build = limiter_ebpf_build::host_cargo();
            build.args([
                "build",
                "--quiet",
                "-p",
                "limiter-user",
                "--bin",
                "xdp-limiter",
            ]);
            run_ok(&mut build);
            root.join("target/debug/xdp-limiter")
        })
        .clone()
}

/// A scratch directory for one daemon's files and a bpffs pin directory.
pub struct Files {
    pub dir: PathBuf,
    pub pin_dir: PathBuf,
}

impl Files {
    pub fn new() -> Self {
        remove_stale_files();
        let id = format!(
            "xlt-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(&id);
        fs::create_dir_all(&dir).expect("create scratch dir");
        Self {
            dir,
            pin_dir: PathBuf::from("/sys/fs/bpf").join(id),
        }
    }

    pub fn config(&self) -> PathBuf {
        self.dir.join("config.toml")
    }

    /// The daemon's control socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("control.sock")
    }

    pub fn write_config(&self, text: &str) {
        fs::write(self.config(), text).expect("write config");
    }

    /// `xdp-limiter <args> --socket <this daemon's socket>`: the CLI, run
    /// to completion whatever its exit status.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(binary())
            .args(args)
            .arg("--socket")
            .arg(self.socket())
            .output()
            .expect("run the CLI")
    }

    /// [`Files::cli`] that must succeed: its standard output.
    #[track_caller]
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "xdp-limiter {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Default for Files {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        // Whatever a test left pinned goes, so nothing stays attached.
        let _ = Command::new(binary())
            .args(["detach", "--pin-dir"])
            .arg(&self.pin_dir)
            .arg("--socket")
            .arg(self.socket())
            .output();
        let _ = fs::remove_dir_all(&self.pin_dir);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Removes `xlt-<pid>-<n>` scratch and pin directories of processes that
/// no longer exist (killed before their guards ran; their daemons went
/// with them, see `spawn`).
fn remove_stale_files() {
    for dir in [std::env::temp_dir(), PathBuf::from("/sys/fs/bpf")] {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let mut parts = name.splitn(3, '-');
            let (Some("xlt"), Some(pid), Some(n)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), n.parse::<u32>()) else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// A running daemon.
pub struct Daemon {
    child: Option<Child>,
    log: PathBuf,
    netns: String,
}

/// `xdp-limiter run` in `ns` (network namespace only, so it sees the
/// host's bpffs) with `args`; stderr goes to a log file.
fn spawn(ns: &NetNs, files: &Files, args: &[&str], log: &Path) -> Child {
    spawn_with(ns, files, args, log, &[], None)
}

/// [`spawn`] with extra environment and, optionally, the soft limit of
/// open files the daemon starts with.
fn spawn_with(
    ns: &NetNs,
    files: &Files,
    args: &[&str],
    log: &Path,
    env: &[(&str, &str)],
    nofile_soft: Option<u64>,
) -> Child {
    let log_file = fs::File::create(log).expect("create log");
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{}", ns.name()))
        .arg(binary())
        .arg("run");
    if !args.contains(&"--pin-dir") {
        cmd.arg("--pin-dir").arg(&files.pin_dir);
    }
    if !args.contains(&"--control-socket") {
        cmd.arg("--control-socket").arg(files.socket());
    }
    // SAFETY: the hook runs between fork and exec and only calls prctl(2),
    // getrlimit(2) and setrlimit(2), which are async-signal-safe.
    unsafe {
        // A daemon outlives nothing that started it: if the test or
        // benchmark process dies (even by SIGKILL), the daemon gets SIGTERM
        // and shuts down, detaching its program. Optionally it starts with
        // a lower soft limit of open files (systemd's default is 1024).
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
            if let Some(soft) = nofile_soft {
                use nix::sys::resource::{getrlimit, setrlimit, Resource};
                let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
                setrlimit(Resource::RLIMIT_NOFILE, soft, hard)?;
            }
            Ok(())
        });
    }
    // `info` unless the caller asks for another level.
    if !env.iter().any(|(key, _)| *key == "RUST_LOG") {
        cmd.env("RUST_LOG", "info");
    }
    cmd.args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .expect("spawn xdp-limiter")
}

impl Daemon {
    /// Starts `xdp-limiter run <args>` in `ns` and waits until its metrics
    /// endpoint answers (panics with its log if it exits first).
    pub fn start(ns: &NetNs, files: &Files, args: &[&str]) -> Self {
        Self::start_with(ns, files, args, None)
    }

    /// As [`Daemon::start`], with the soft limit of open files the daemon
    /// starts with (systemd's default for services is 1024).
    pub fn start_with_nofile(ns: &NetNs, files: &Files, args: &[&str], soft: u64) -> Self {
        Self::start_with(ns, files, args, Some(soft))
    }

    /// As [`Daemon::start`], with extra environment (e.g. `LD_PRELOAD` of
    /// libfaketime for a node whose clock is off).
    pub fn start_with_env(ns: &NetNs, files: &Files, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_full(ns, files, args, env, None)
    }

    fn start_with(ns: &NetNs, files: &Files, args: &[&str], nofile_soft: Option<u64>) -> Self {
        Self::start_full(ns, files, args, &[], nofile_soft)
    }

    fn start_full(
        ns: &NetNs,
        files: &Files,
        args: &[&str],
        env: &[(&str, &str)],
        nofile_soft: Option<u64>,
    ) -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let log = files.dir.join(format!("daemon-{n}.log"));
        let child = spawn_with(ns, files, args, &log, env, nofile_soft);
        let mut daemon = Self {
            child: Some(child),
            log,
            netns: ns.name().to_string(),
        };
        let ready = wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
            if let Some(status) = daemon
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "xdp-limiter exited ({status}) during start-up:\n{}",
                    daemon.log()
                );
            }
            (daemon.log().contains("control socket ready") && daemon.try_metrics().is_some())
                .then_some(())
        });
        assert!(
            ready.is_some(),
            "xdp-limiter never served metrics:\n{}",
            daemon.log()
        );
        daemon
    }

    /// Runs `xdp-limiter run <args>` expecting it to fail at start-up;
    /// returns its exit status and log.
    pub fn start_failing(ns: &NetNs, files: &Files, args: &[&str]) -> (ExitStatus, String) {
        let log = files.dir.join("failing.log");
        let mut child = spawn(ns, files, args, &log);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return (status, fs::read_to_string(&log).unwrap_or_default());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "xdp-limiter kept running:\n{}",
                    fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts `xdp-limiter run <args>` with `XDP_LIMITER_STOP_AT=step`
    /// and waits until it has stopped itself at that start-up step.
    pub fn start_stopped_at(ns: &NetNs, files: &Files, args: &[&str], step: &str) -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let log = files.dir.join(format!("daemon-{n}.log"));
        let child = spawn_with(
            ns,
            files,
            args,
            &log,
            &[("XDP_LIMITER_STOP_AT", step)],
            None,
        );
        let daemon = Self {
            child: Some(child),
            log,
            netns: ns.name().to_string(),
        };
        let stopped = wait_until(Duration::from_secs(20), Duration::from_millis(20), || {
            (process_state(daemon.pid().as_raw() as u32) == 'T').then_some(())
        });
        assert!(
            stopped.is_some(),
            "xdp-limiter never stopped at {step}:\n{}",
            daemon.log()
        );
        daemon
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (bounded) until the log contains `needle`. When it never
    /// does, the panic shows the log and the daemon's frame and event
    /// counters, which tell frames that never reached the program from
    /// events the daemon did not log.
    pub fn wait_log(&self, needle: &str) {
        let said = wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
            self.log().contains(needle).then_some(())
        });
        if said.is_none() {
            let counters: Vec<String> = self
                .try_metrics()
                .unwrap_or_default()
                .lines()
                .filter(|l| {
                    !l.starts_with('#') && (l.contains("packets_total") || l.contains("event"))
                })
                .map(str::to_string)
                .collect();
            panic!(
                "log never said {needle:?}:\n{}\ncounters:\n{}",
                self.log(),
                counters.join("\n")
            );
        }
    }

    /// Thread ids of the daemon (e.g. to pin them).
    pub fn tasks(&self) -> Vec<i32> {
        let dir = format!("/proc/{}/task", self.pid());
        fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
            .collect()
    }

    /// CPU time the daemon used so far (user + system), from /proc.
    pub fn cpu_time(&self) -> Duration {
        process_cpu(self.pid().as_raw() as u32)
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    /// The daemon's resident set size (VmRSS), in bytes; 0 once it is gone.
    pub fn rss_bytes(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|kib| kib.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    }

    /// File descriptors the daemon holds open right now.
    pub fn open_fds(&self) -> usize {
        fs::read_dir(format!("/proc/{}/fd", self.pid())).map_or(0, |dir| dir.count())
    }

    pub fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(self.pid(), signal).expect("signal the daemon");
    }

    /// Waits (bounded) for the daemon to exit on its own; its status.
    pub fn wait(mut self) -> ExitStatus {
        self.wait_exit()
    }

    /// SIGKILL: the daemon gets no chance to clean up.
    pub fn kill(mut self) {
        self.signal(Signal::SIGKILL);
        self.child.take().expect("running").wait().expect("reap");
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn stop(mut self) -> ExitStatus {
        self.signal(Signal::SIGTERM);
        self.wait_exit()
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("xdp-limiter ignored SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A real HTTP scrape of /metrics inside the daemon's namespace; `None`
    /// if it fails.
    pub fn try_metrics(&self) -> Option<String> {
        let ns = format!("/run/netns/{}", self.netns);
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let file = fs::File::open(&ns).ok()?;
                    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
                    ureq::get("http://127.0.0.1:9470/metrics")
                        .timeout(Duration::from_secs(2))
                        .call()
                        .ok()?
                        .into_string()
                        .ok()
                })
                .join()
                .ok()
                .flatten()
        })
    }

    pub fn metrics(&self) -> String {
        self.try_metrics()
            .unwrap_or_else(|| panic!("scraping /metrics failed:\n{}", self.log()))
    }

    /// The value of one series (`name{labels}` exactly as exposed).
    pub fn metric(&self, series: &str) -> Option<f64> {
        parse_metric(&self.metrics(), series)
    }

    /// Waits (bounded) until `series` satisfies `ok`; returns its value.
    pub fn wait_metric(&self, series: &str, ok: impl Fn(f64) -> bool) -> f64 {
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            self.metric(series).filter(|v| ok(*v))
        })
        .unwrap_or_else(|| panic!("{series} never got there; last scrape:\n{}", self.metrics()))
    }

    /// Waits for a complete aggregation pass that started after this call:
    /// the metrics then reflect every frame counted before it.
    pub fn next_pass(&self) {
        let count = "xdp_limiter_aggregation_duration_seconds_count";
        let now = self.metric(count).unwrap_or(0.0);
        self.wait_metric(count, |v| v >= now + 2.0);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = nix::sys::signal::kill(self.pid(), Signal::SIGTERM);
            if let Some(mut child) = self.child.take() {
                let deadline = Instant::now() + Duration::from_secs(5);
                while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// A process's state letter from /proc/PID/stat (`T`: stopped, `?`: gone).
pub fn process_state(pid: u32) -> char {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .unwrap_or('?')
}

/// Every series of a Prometheus text exposition, `name{labels}` -> value.
pub fn parse_series(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The sum of every series of the metric `name` (all its label values)
/// in a Prometheus text exposition; 0 when it has none.
pub fn sum_metric(text: &str, name: &str) -> f64 {
    parse_series(text)
        .into_iter()
        .filter_map(|(series, value)| {
            let labels = series.strip_prefix(name)?;
            (labels.is_empty() || labels.starts_with('{')).then_some(value)
        })
        .sum()
}

/// The value of `series` in a Prometheus text exposition.
pub fn parse_metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
}

/// CPU time (user + system) process `pid` used so far, from /proc (zero
/// once it is gone).
pub fn process_cpu(pid: u32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime, fields 14 and 15 of stat (11 and 12 after the
    // state), in clock ticks.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
        .sum();
    Duration::from_secs_f64(ticks as f64 / clock_ticks())
}

/// Clock ticks per second (`CLK_TCK`), the unit of /proc's CPU times.
pub fn clock_ticks() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_sums_over_its_labels_and_not_over_longer_names() {
        let text = "# HELP x_total x\n\
                    x_total{kind=\"timeout\"} 2\n\
                    x_total{kind=\"server\"} 3\n\
                    x_total_other 100\n\
                    y_total 7\n";
        assert_eq!(sum_metric(text, "x_total"), 5.0);
        assert_eq!(sum_metric(text, "y_total"), 7.0);
        assert_eq!(sum_metric(text, "z_total"), 0.0);
        assert_eq!(parse_metric(text, "x_total{kind=\"server\"}"), Some(3.0));
    }
}
