//! The real `xdp-limiter run` in a netns lab: enforcement seen by a real
//! receiver and by a real HTTP scrape of /metrics, survival of SIGKILL,
//! adoption and in-place replacement, live reload, and clear errors.

use std::{
    net::UdpSocket,
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use aya::programs::XdpMode;
use limiter_tests::{
    daemon::{binary, process_state, Daemon, Files},
    lab::{limit_config, Lab, HEAVY, MARKER, MEDIUM, RX_IF},
    testrun::{on_cpu, online_cpus},
};
use nix::sys::signal::Signal;

const PORT: u16 = 7000;

fn series(name: &str, outcome: &str) -> String {
    format!("{name}{{interface=\"{RX_IF}\",outcome=\"{outcome}\"}}")
}

fn start(lab: &Lab, files: &Files, extra: &[&str]) -> Daemon {
    let config = files.config();
    let mut args = vec!["-i", RX_IF, "-c", config.to_str().expect("utf-8 path")];
    args.extend_from_slice(extra);
    Daemon::start(&lab.rx, files, &args)
}

/// The lab most tests use: its three senders, a daemon configuration
/// allowing every source 20 frames per window (`limit_config(2)`), and a
/// receiver on `PORT`.
fn limited_lab() -> (Lab, Files, UdpSocket) {
    let lab = Lab::three_senders();
    let files = Files::new();
    files.write_config(&limit_config(2));
    let receiver = lab.receiver(PORT);
    (lab, files, receiver)
}

/// How many of `sent` frames from `HEAVY` got through (after a marker).
fn heavy_through(lab: &Lab, receiver: &UdpSocket, sent: usize) -> usize {
    let got = lab.exchange(receiver, PORT, &[(HEAVY, sent)], MARKER);
    got.get(&HEAVY).copied().unwrap_or(0)
}

/// Starts a daemon with `--keep-attached`, sees it let 20 of 25 frames
/// from `HEAVY` through and stops it, leaving its protection attached and
/// pinned: the program it left attached.
fn start_and_keep_attached(lab: &Lab, files: &Files, receiver: &UdpSocket) -> u32 {
    let daemon = start(lab, files, &["--keep-attached"]);
    assert_eq!(heavy_through(lab, receiver, 25), 20);
    assert!(daemon.stop().success());
    lab.attached_program().expect("kept attached")
}

/// Starts a daemon that stops itself at start-up `step`, and SIGKILLs it
/// there.
fn kill_at(lab: &Lab, files: &Files, step: &str) {
    let config = files.config();
    let args = ["-i", RX_IF, "-c", config.to_str().expect("utf-8")];
    Daemon::start_stopped_at(&lab.rx, files, &args, step).kill();
}

/// Stops `daemon` (SIGTERM): a clean exit, the program detached and the
/// pins removed.
#[track_caller]
fn stop_cleanly(lab: &Lab, files: &Files, daemon: Daemon) {
    let status = daemon.stop();
    assert!(status.success(), "clean shutdown: {status}");
    assert_eq!(lab.attached_program(), None, "detached on shutdown");
    assert!(!files.pin_dir.join(RX_IF).exists(), "pins removed");
}

/// Starts a daemon, sees it let 20 of `sent` frames from `HEAVY` through
/// and SIGKILLs it, leaving its protection pinned: the program it left
/// attached.
fn start_and_sigkill(lab: &Lab, files: &Files, receiver: &UdpSocket, sent: usize) -> u32 {
    let daemon = start(lab, files, &[]);
    assert_eq!(heavy_through(lab, receiver, sent), 20);
    let program = lab.attached_program().expect("attached");
    daemon.kill();
    program
}

#[test]
fn the_daemon_enforces_limits_and_metrics_match_what_the_receiver_saw() {
    let (lab, files, receiver) = limited_lab();
    let daemon = start(&lab, &files, &[]);
    assert!(daemon.log().contains("mode=\"native\""), "{}", daemon.log());
    assert!(lab.attached_program().is_some());

    let got = lab.exchange(&receiver, PORT, &[(HEAVY, 100), (MEDIUM, 15)], MARKER);
    assert_eq!(
        got.get(&HEAVY),
        Some(&20),
        "heavy capped at its allowance: {got:?}"
    );
    assert_eq!(
        got.get(&MEDIUM),
        Some(&15),
        "medium under its limit: {got:?}"
    );

    let dropped = daemon.wait_metric(&series("xdp_limiter_packets_total", "dropped_limit"), |v| {
        v >= 80.0
    });
    assert_eq!(dropped, 80.0);
    let metrics = daemon.metrics();
    let value = |s: &str| limiter_tests::daemon::parse_metric(&metrics, s);
    assert_eq!(
        value(&series("xdp_limiter_packets_total", "passed")),
        Some(35.0)
    );
    assert_eq!(
        value(&series("xdp_limiter_packets_total", "allowed")),
        Some(1.0)
    );
    assert_eq!(
        value(&format!(
            "xdp_limiter_rule_dropped_packets_total{{interface=\"{RX_IF}\",rule=\"default\"}}"
        )),
        Some(80.0)
    );
    // Per-CPU state: the heavy source (refused) and the medium one (more
    // than half its allowance); the marker's one allowed frame was judged
    // in the cheap tier, with no state.
    assert_eq!(
        value(&format!(
            "xdp_limiter_tracked_sources{{interface=\"{RX_IF}\"}}"
        )),
        Some(2.0)
    );
    assert_eq!(
        value(&format!("xdp_limiter_rules{{interface=\"{RX_IF}\"}}")),
        Some(2.0)
    );
    assert!(value("xdp_limiter_aggregation_duration_seconds_count").is_some_and(|n| n >= 1.0));
    assert!(
        metrics.contains("xdp_limiter_build_info{version=\""),
        "{metrics}"
    );
    // Bytes: every frame is 14 + 20 + 8 + 64 bytes.
    assert_eq!(
        value(&series("xdp_limiter_bytes_total", "dropped_limit")),
        Some(80.0 * 106.0)
    );
    // The three sources, estimated from the cheap tier's sketch once the
    // epoch they sent in has ended (read on the next epoch's first tick;
    // two or three, as their frames fell in one epoch or two).
    let active = format!("xdp_limiter_active_sources_estimate{{interface=\"{RX_IF}\"}}");
    let estimate = daemon.wait_metric(&active, |v| v >= 2.0);
    assert!(estimate <= 3.0, "three sources sent: {estimate}");
    assert_eq!(
        daemon.metric(&format!(
            "xdp_limiter_active_sources_saturated{{interface=\"{RX_IF}\"}}"
        )),
        Some(0.0)
    );
    // The windows: the heavy and the medium sources' kept windows, none
    // idle yet; no penalty (no rule has one), none in HOLDS.
    let kept = format!("xdp_limiter_windows_kept{{interface=\"{RX_IF}\"}}");
    assert_eq!(daemon.wait_metric(&kept, |v| v >= 2.0), 2.0);
    let metrics = daemon.metrics();
    let value = |s: &str| limiter_tests::daemon::parse_metric(&metrics, s);
    for (metric, want) in [
        ("xdp_limiter_window_capacity", 65_536.0),
        ("xdp_limiter_penalties", 0.0),
        ("xdp_limiter_windows_reclaimed_total", 0.0),
        ("xdp_limiter_aggregates_reclaimed_total", 0.0),
    ] {
        assert_eq!(
            value(&format!("{metric}{{interface=\"{RX_IF}\"}}")),
            Some(want),
            "{metric}"
        );
    }
    for outcome in [
        "window_full",
        "hold_failed",
        "aggregate_full",
        "cluster_hot_dropped",
    ] {
        assert_eq!(
            value(&series("xdp_limiter_packets_total", outcome)),
            Some(0.0),
            "{outcome}"
        );
    }

    stop_cleanly(&lab, &files, daemon);
}

/// The kernel lane's smoke test (`xtask::kernel`), on the host as well:
/// the daemon loads the program, attaches natively to a veth, enforces a
/// limit, and is seen doing it through a real HTTP scrape of `/metrics`
/// and through `status`; `detach` then leaves the interface unprotected
/// and the daemon stopped.
#[test]
fn a_daemon_loads_attaches_natively_enforces_reports_and_detaches() {
    let (lab, files, receiver) = limited_lab();
    let daemon = start(&lab, &files, &[]);
    assert!(daemon.log().contains("mode=\"native\""), "{}", daemon.log());
    assert!(lab.attached_program().is_some(), "attached");

    assert_eq!(
        heavy_through(&lab, &receiver, 100),
        20,
        "capped at its allowance"
    );
    let dropped = daemon.wait_metric(&series("xdp_limiter_packets_total", "dropped_limit"), |v| {
        v >= 80.0
    });
    assert_eq!(dropped, 80.0);

    let status = files.cli_ok(&["status"]);
    assert!(
        status.contains(RX_IF) && status.contains("native"),
        "status names the interface and its mode: {status}"
    );

    let pin_dir = files.pin_dir.to_str().expect("utf-8 path");
    let out = files.cli_ok(&["detach", "--pin-dir", pin_dir]);
    assert!(
        out.contains(&format!("detached {RX_IF} and stopped the daemon")),
        "{out}"
    );
    assert_eq!(lab.attached_program(), None, "detached");
    assert!(daemon.wait().success(), "the daemon exits cleanly");
}

#[test]
fn after_sigkill_protection_continues_and_a_new_daemon_adopts_pins_and_counters() {
    let (lab, files, receiver) = limited_lab();
    let program = start_and_sigkill(&lab, &files, &receiver, 30);

    assert_eq!(
        heavy_through(&lab, &receiver, 10),
        0,
        "still enforced with no daemon"
    );
    assert_eq!(
        lab.attached_program(),
        Some(program),
        "the pinned link kept it attached"
    );

    let second = start(&lab, &files, &[]);
    second.wait_log("adopted the pinned link");
    let replaced = lab.attached_program().expect("attached");
    assert_ne!(
        replaced, program,
        "the new daemon's program replaced the old one"
    );
    assert_eq!(heavy_through(&lab, &receiver, 5), 0, "the window survived");
    // 10 + 10 + 5 drops: the counters continued across daemons.
    second.wait_metric(&series("xdp_limiter_packets_total", "dropped_limit"), |v| {
        v == 25.0
    });
}

#[test]
fn an_upgrade_in_place_lets_no_over_limit_frame_through() {
    let (lab, files, receiver) = limited_lab();
    let old = start(&lab, &files, &["--keep-attached"]);
    assert_eq!(heavy_through(&lab, &receiver, 25), 20);
    let old_program = lab.attached_program().expect("attached");

    // Flood from the over-limit source while the old daemon stops (keeping
    // the program attached) and the new one takes over.
    let flooding = AtomicBool::new(true);
    let sent = std::thread::scope(|scope| {
        let flood = scope.spawn(|| {
            let mut sent = 0;
            while flooding.load(Ordering::Relaxed) {
                lab.send(HEAVY, PORT, 20, 64);
                sent += 20;
                std::thread::sleep(Duration::from_millis(2));
            }
            sent
        });
        assert!(old.stop().success());
        assert_eq!(
            lab.attached_program(),
            Some(old_program),
            "--keep-attached kept it"
        );
        let new = start(&lab, &files, &[]);
        new.wait_log("adopted the pinned link");
        flooding.store(false, Ordering::Relaxed);
        let sent = flood.join().expect("flood thread");
        assert_ne!(
            lab.attached_program(),
            Some(old_program),
            "program replaced"
        );
        drop(new);
        sent
    });
    assert!(sent > 100, "the flood ran through the swap ({sent} frames)");
    let got = lab.exchange(&receiver, PORT, &[], MARKER);
    assert_eq!(
        got.get(&HEAVY),
        None,
        "{sent} frames sent during the swap, none may pass: {got:?}"
    );
}

#[test]
fn sighup_changes_limits_live_and_a_broken_file_keeps_the_running_ones() {
    let (lab, files, receiver) = limited_lab();
    let daemon = start(&lab, &files, &[]);
    assert_eq!(heavy_through(&lab, &receiver, 30), 20);

    files.write_config(&limit_config(5)); // allowance 50
    daemon.signal(Signal::SIGHUP);
    daemon.wait_log("configuration reloaded");
    assert_eq!(
        heavy_through(&lab, &receiver, 40),
        30,
        "50 in the window now, 20 already used"
    );

    files.write_config("[default]\npps = \"lots\"\n");
    daemon.signal(Signal::SIGHUP);
    daemon.wait_log("configuration rejected");
    let log = daemon.log();
    let rejection = log
        .lines()
        .find(|l| l.contains("configuration rejected"))
        .expect("logged");
    assert!(
        rejection.contains("pps") && rejection.contains("lots"),
        "names field and value: {rejection}"
    );
    assert_eq!(
        heavy_through(&lab, &receiver, 10),
        0,
        "the running limit (50) stays in force"
    );
}

/// A source refused on several CPUs in one episode is one "source
/// limited" line: the kernel sends an event per CPU that starts refusing
/// it, and on a 64-CPU server a flood spread over the receive queues
/// would otherwise log 64 lines per episode.
#[test]
fn a_source_refused_on_both_cpus_is_logged_once_per_episode() {
    assert!(online_cpus() >= 2, "this test needs two CPUs");
    let (lab, files, receiver) = limited_lab();
    let daemon = start(&lab, &files, &[]);
    // veth runs XDP on the sending CPU: 30 frames from CPU 0 (20 pass, 10
    // refused), then 30 from CPU 1 (all refused), well within a second.
    for cpu in [0, 1] {
        on_cpu(cpu, || lab.send(HEAVY, PORT, 30, 18));
    }
    // Then a source refused on CPU 1: the ring buffer is ordered, so once
    // its line is logged, both of HEAVY's events have been read.
    on_cpu(1, || lab.send(MEDIUM, PORT, 30, 18));
    daemon.wait_log(&format!("source={MEDIUM} "));
    let log = daemon.log();
    let heavy = format!("source={HEAVY} ");
    let lines = log
        .lines()
        .filter(|l| l.contains("source limited") && l.contains(&heavy))
        .count();
    assert_eq!(lines, 1, "one line per source and episode:\n{log}");
    drop(receiver);
}

/// A flood from many sources, each refused (a new episode each), through
/// a daemon whose log cap is 1 line a second with a burst of 5: the log
/// shows at most what the cap allows, and one summary line gives the
/// number held back, as the metric does.
#[test]
fn a_flood_of_refused_sources_is_logged_within_the_log_cap() {
    const SOURCES: u8 = 50;
    let flooders: Vec<std::net::Ipv4Addr> = (0..SOURCES)
        .map(|i| std::net::Ipv4Addr::new(192, 0, 2, 100 + i))
        .collect();
    let lab = Lab::new(&[&[MARKER][..], &flooders].concat());
    let files = Files::new();
    files.write_config(&limit_config(2).replacen(
        "[daemon]\n",
        "[daemon]\nlimited_log_per_second = 1\nlimited_log_burst = 5\n",
        1,
    ));
    let daemon = start(&lab, &files, &[]);
    let started = std::time::Instant::now();
    // 25 frames each (20 pass, 5 refused) from one CPU: one event per
    // source, fewer than the kernel's 64 per CPU and second.
    on_cpu(0, || {
        for source in &flooders {
            lab.send(*source, PORT, 25, 18);
        }
    });
    let flood = started.elapsed();
    let summary =
        limiter_tests::wait_until(Duration::from_secs(25), Duration::from_millis(100), || {
            daemon
                .log()
                .lines()
                .find(|l| l.contains("source-limited lines suppressed in the last"))
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("no summary:\n{}", daemon.log()));
    let log = daemon.log();
    let lines = log.lines().filter(|l| l.contains("source limited")).count();
    let allowed = 5 + flood.as_secs() as usize + 1;
    assert!(
        (5..=allowed).contains(&lines),
        "{lines} lines, the cap allows {allowed}:\n{log}"
    );
    let suppressed: usize = summary
        .split("suppressed=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {summary:?}"));
    let dropped = daemon
        .metric(&series("xdp_limiter_packets_total", "event_dropped"))
        .unwrap_or(0.0) as usize;
    assert_eq!(
        lines + suppressed + dropped,
        SOURCES as usize,
        "every refused source logged, held back by the cap or by the kernel:\n{log}"
    );
    assert_eq!(
        daemon.metric("xdp_limiter_limited_log_lines_suppressed_total"),
        Some(suppressed as f64)
    );
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("suppressed in the last"))
            .count(),
        1,
        "one summary:\n{log}"
    );
}

/// The single `error:` line a failed start printed.
#[track_caller]
fn one_error_line(log: &str) -> String {
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "exactly one error line:\n{log}");
    assert!(
        !log.contains("panicked") && !log.contains("backtrace"),
        "no panic:\n{log}"
    );
    errors[0].to_string()
}

#[test]
fn bad_interfaces_files_and_arguments_get_one_clear_error() {
    let lab = Lab::three_senders();
    let files = Files::new();

    let (status, log) = Daemon::start_failing(&lab.rx, &files, &["-i", "nope0"]);
    assert_eq!(status.code(), Some(1));
    assert!(one_error_line(&log).contains("no such interface: nope0"));

    files.write_config("[[rules]]\npps = 5\n");
    let config = files.config();
    let (status, log) = Daemon::start_failing(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().unwrap()],
    );
    assert_eq!(status.code(), Some(1));
    assert!(one_error_line(&log).contains("rules[0].cidr: missing"));

    let (status, log) = Daemon::start_failing(&lab.rx, &files, &["-i", RX_IF, "--pin-dir", "/tmp"]);
    assert_eq!(status.code(), Some(1));
    assert!(one_error_line(&log).contains("/tmp is not on a bpffs"));

    let (status, log) = Daemon::start_failing(&lab.rx, &files, &["-i", RX_IF, "--mode", "turbo"]);
    assert_eq!(status.code(), Some(2), "usage error");
    assert!(log.contains("invalid value 'turbo'"), "{log}");

    // lo has no native XDP: native mode refuses, auto falls back.
    let (status, log) = Daemon::start_failing(&lab.rx, &files, &["-i", "lo", "--mode", "native"]);
    assert_eq!(status.code(), Some(1));
    assert!(one_error_line(&log).contains("attaching to lo in native mode"));
    let daemon = Daemon::start(&lab.rx, &files, &["-i", "lo"]);
    assert!(
        daemon.log().contains("falling back to generic mode"),
        "{}",
        daemon.log()
    );
    assert!(
        daemon.log().contains("mode=\"generic\""),
        "{}",
        daemon.log()
    );
    drop(daemon);

    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(binary())
        .args(["run", "-i", "lo"])
        .output()
        .expect("run setpriv");
    assert_eq!(out.status.code(), Some(1));
    assert!(one_error_line(&String::from_utf8_lossy(&out.stderr)).contains("needs root"));
}

#[test]
fn an_interface_with_someone_elses_program_is_left_alone() {
    let lab = Lab::three_senders();
    let files = Files::new();
    let mut other = limiter_bench_objects::load_baseline();
    let program = limiter_bench_objects::baseline_program(&mut other);
    lab.rx.enter(|| {
        program
            .attach(RX_IF, XdpMode::Driver)
            .expect("attach the other program")
    });
    let theirs = lab.attached_program().expect("their program");

    let (status, log) = Daemon::start_failing(&lab.rx, &files, &["-i", RX_IF]);
    assert_eq!(status.code(), Some(1));
    assert!(
        one_error_line(&log).contains("already has an XDP program that xdp-limiter did not attach"),
        "{log}"
    );
    assert_eq!(
        lab.attached_program(),
        Some(theirs),
        "their program untouched"
    );
}

/// Shell that unmounts every bpffs stacked on /sys/fs/bpf (exit 90 if one
/// will not go).
const UNMOUNT_ALL_BPFFS: &str = "while grep -q ' /sys/fs/bpf bpf ' /proc/self/mounts; do \
     umount /sys/fs/bpf || exit 90; done;";

#[test]
fn a_missing_bpffs_is_mounted() {
    let lab = Lab::three_senders();
    let files = Files::new();
    let log = files.dir.join("unshare.log");
    // A private mount namespace where /sys/fs/bpf is not mounted (every
    // stacked bpffs unmounted).
    let script = format!(
        "{UNMOUNT_ALL_BPFFS} \
         exec nsenter --net=/run/netns/{ns} {bin} run -i {RX_IF} --pin-dir /sys/fs/bpf/xlt-unshare \
         --control-socket {socket} 2>{log}",
        ns = lab.rx.name(),
        bin = binary().display(),
        socket = files.socket().display(),
        log = log.display(),
    );
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .spawn()
        .expect("unshare");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("control socket ready") {
            assert!(text.contains("mounting bpffs"), "{text}");
            // Seen from inside the daemon's mount namespace; the kernel
            // always sets the sticky bit on a bpffs root.
            let root = std::path::PathBuf::from(format!("/proc/{}/root/sys/fs/bpf", child.id()));
            let mode = |dir: &std::path::Path| {
                std::os::unix::fs::MetadataExt::mode(
                    &std::fs::metadata(dir).expect("stat in the daemon's namespace"),
                ) & 0o7777
            };
            assert_eq!(mode(&root), 0o1700, "bpffs is root's only");
            assert_eq!(mode(&root.join("xlt-unshare")), 0o700, "so is the pin dir");
            break;
        }
        if let Some(status) = child.try_wait().expect("wait") {
            panic!("the daemon exited ({status}):\n{text}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never started:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(lab.attached_program().is_some());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGTERM,
    )
    .expect("signal");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
    assert_eq!(lab.attached_program(), None);
}

#[test]
fn a_pinned_map_of_another_layout_is_refused_and_detach_removes_everything() {
    let (lab, files, receiver) = limited_lab();
    // A map pinned where SOURCES goes, with another value size: not one
    // this layout version of the daemon could have pinned.
    let maps_dir = limiter_user::kernel::pins::maps_dir(&files.pin_dir.join(RX_IF));
    std::fs::create_dir_all(&maps_dir).expect("bpffs dir");
    let mut other = aya::EbpfLoader::new()
        .load(limiter_bench_objects::BASELINE_OBJECT)
        .expect("load a map of another layout");
    let foreign = other.take_map("BASELINE_SOURCES").expect("map");
    match foreign {
        aya::maps::Map::PerCpuLruHashMap(data) => data.pin(maps_dir.join("SOURCES")).expect("pin"),
        other => panic!("unexpected map type {other:?}"),
    }
    let config = files.config();
    let args = ["-i", RX_IF, "-c", config.to_str().expect("utf-8")];
    let (status, log) = Daemon::start_failing(&lab.rx, &files, &args);
    assert_eq!(status.code(), Some(1));
    let error = one_error_line(&log);
    assert!(
        error.contains(&format!(
            "refusing to adopt {}: its value size is",
            maps_dir.join("SOURCES").display()
        )),
        "{error}"
    );
    assert_eq!(lab.attached_program(), None, "nothing attached");
    assert!(maps_dir.join("SOURCES").exists(), "and nothing removed");

    // The operator removes it; then the start works.
    std::fs::remove_dir_all(files.pin_dir.join(RX_IF)).expect("remove the foreign pins");
    let pin_dir = files.pin_dir.to_str().expect("utf-8");

    let daemon = start(&lab, &files, &["--keep-attached"]);
    assert_eq!(heavy_through(&lab, &receiver, 25), 20, "enforcing afresh");
    assert!(daemon.stop().success());
    assert!(
        lab.attached_program().is_some(),
        "--keep-attached left it attached"
    );
    let out = files.cli_ok(&["detach", "--iface", RX_IF, "--pin-dir", pin_dir]);
    assert_eq!(out.trim(), format!("{RX_IF}: detached"));
    assert_eq!(lab.attached_program(), None, "detach removed the program");
    assert!(!files.pin_dir.join(RX_IF).exists(), "and the pins");
}

#[test]
fn pinned_maps_of_another_layout_version_are_not_adopted() {
    let (lab, files, receiver) = limited_lab();
    start_and_keep_attached(&lab, &files, &receiver);
    // Pretend an older version left them: same sizes, other layout version.
    let iface_dir = files.pin_dir.join(RX_IF);
    let current = limiter_user::kernel::pins::maps_dir(&iface_dir);
    let older = iface_dir.join("maps-v0");
    std::fs::rename(&current, &older).expect("rename the pinned maps' directory");

    let second = start(&lab, &files, &[]);
    second.wait_log("pinned maps of another layout version; starting afresh");
    assert!(!older.exists(), "the old maps are gone");
    assert_eq!(heavy_through(&lab, &receiver, 25), 20, "fresh windows");
}

/// Whether `iface`'s pins (its link and maps) are in place.
fn pinned(files: &Files) -> bool {
    let dir = files.pin_dir.join(RX_IF);
    dir.join("link").exists() && limiter_user::kernel::pins::maps_dir(&dir).exists()
}

#[test]
fn a_second_daemon_is_refused_before_it_touches_anything() {
    let (lab, files, receiver) = limited_lab();
    let first = start(&lab, &files, &[]);
    let program = lab.attached_program().expect("attached");
    let mut heavy_passed = 0;
    let config = files.config();
    let config = config.to_str().expect("utf-8");
    let elsewhere = files.dir.join("second.sock");
    let elsewhere = elsewhere.to_str().expect("utf-8");
    let other_pins = format!("{}-other", files.pin_dir.display());
    let same_everything = vec!["-i", RX_IF, "-c", config];
    // Its own socket and metrics port: only the pins are shared.
    let same_pins = [
        &same_everything[..],
        &[
            "--control-socket",
            elsewhere,
            "--metrics-addr",
            "127.0.0.1:9471",
        ],
    ]
    .concat();
    // Its own pins too: only the interface is shared.
    let same_interface = [&same_pins[..], &["--pin-dir", &other_pins]].concat();
    for (what, args) in [
        // Exactly the reproduction: same pins, interface, socket and port.
        ("the same everything", same_everything),
        ("the same pin directory", same_pins),
        ("the same interface", same_interface),
    ] {
        let (status, log) = Daemon::start_failing(&lab.rx, &files, &args);
        assert_eq!(status.code(), Some(1), "{what}: {log}");
        let error = one_error_line(&log);
        assert!(
            error.contains("another xdp-limiter daemon"),
            "{what}: {error}"
        );
        assert!(
            !log.contains("adopted"),
            "{what}: refused before adopting:\n{log}"
        );
        assert_eq!(
            lab.attached_program(),
            Some(program),
            "{what}: the first daemon's program stays attached"
        );
        assert!(pinned(&files), "{what}: its pins stay");
        heavy_passed += heavy_through(&lab, &receiver, 25);
        assert_eq!(
            heavy_passed, 20,
            "{what}: still enforcing the 20 per window"
        );
    }
    assert!(!std::path::Path::new(&other_pins).exists());
    assert!(
        first.metrics().contains("xdp_limiter_packets_total"),
        "the first still serves"
    );
    assert!(first.stop().success());
}

#[test]
fn a_start_that_fails_after_a_sigkill_leaves_the_pinned_protection_alone() {
    let (lab, files, receiver) = limited_lab();
    let program = start_and_sigkill(&lab, &files, &receiver, 25);

    // Someone else holds the metrics port: the start fails, and must not
    // take the protection the killed daemon left pinned with it.
    let squatter = lab
        .rx
        .enter(|| std::net::TcpListener::bind("127.0.0.1:9470").expect("bind"));
    let config = files.config();
    let (status, log) = Daemon::start_failing(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().expect("utf-8")],
    );
    assert_eq!(status.code(), Some(1));
    assert!(
        one_error_line(&log).contains("cannot listen for metrics"),
        "{log}"
    );
    assert_eq!(lab.attached_program(), Some(program), "still attached");
    assert!(pinned(&files), "still pinned");
    assert_eq!(heavy_through(&lab, &receiver, 5), 0, "still enforcing");

    drop(squatter);
    let second = start(&lab, &files, &[]);
    second.wait_log("adopted the pinned link");
}

/// What the process is waiting in, in the kernel.
fn wchan(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default()
}

/// Waits (bounded) for `done`; panics with `what` when it never happens.
#[track_caller]
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_daemons_starting_at_once_mount_bpffs_once() {
    let lab = Lab::three_senders();
    let files = Files::new();
    // A private mount namespace without bpffs, kept alive by a sleeper.
    let mut holder = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!("{UNMOUNT_ALL_BPFFS} echo ready; exec sleep 120"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("unshare");
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().expect("stdout")),
        &mut ready,
    )
    .expect("read");
    assert_eq!(ready.trim(), "ready", "the namespace could not be set up");
    let mount_ns = format!("/proc/{}/ns/mnt", holder.id());
    let daemon = |name: &str, iface: &str, port: u16, stop_at: Option<&str>| {
        let log = std::fs::File::create(files.dir.join(format!("{name}.log"))).expect("log");
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount={mount_ns}"))
            .arg(format!("--net=/run/netns/{}", lab.rx.name()))
            .arg(binary())
            .args(["run", "-i", iface, "--pin-dir"])
            .arg(format!(
                "/sys/fs/bpf/xlt-race-{name}-{}",
                std::process::id()
            ))
            .arg("--control-socket")
            .arg(files.dir.join(format!("{name}.sock")))
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .stderr(log);
        if let Some(step) = stop_at {
            cmd.env("XDP_LIMITER_STOP_AT", step);
        }
        cmd.spawn().expect("spawn the daemon")
    };
    let log = |name: &str| {
        std::fs::read_to_string(files.dir.join(format!("{name}.log"))).unwrap_or_default()
    };

    // A decides to mount bpffs and is stopped right there.
    let mut a = daemon("a", RX_IF, 9480, Some("bpffs"));
    wait_for("a stops before mounting", || process_state(a.id()) == 'T');
    // B starts meanwhile: it may not mount a second bpffs over A's.
    let mut b = daemon("b", "lo", 9481, None);
    wait_for("b is up or waits for a", || {
        log("b").contains("control socket ready") || wchan(b.id()).contains("lock")
    });
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(a.id() as i32), Signal::SIGCONT)
        .expect("continue a");
    wait_for("both are up", || {
        log("a").contains("control socket ready") && log("b").contains("control socket ready")
    });
    let mounts = std::fs::read_to_string(format!("/proc/{}/mounts", holder.id())).expect("mounts");
    let bpffs = mounts
        .lines()
        .filter(|l| l.contains(" /sys/fs/bpf bpf "))
        .count();
    for child in [&mut a, &mut b] {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            Signal::SIGTERM,
        );
        let _ = child.wait();
    }
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(
        bpffs,
        1,
        "one bpffs on /sys/fs/bpf:\n{mounts}\na:\n{}\nb:\n{}",
        log("a"),
        log("b")
    );
}

/// SIGKILL at each start-up step: the interface is never left attached
/// with nothing enforced, a program that protected it before stays, and
/// the next start works.
#[test]
fn a_start_killed_at_any_step_leaves_protection_whole_and_the_next_start_works() {
    for step in ["loaded", "push", "attach"] {
        // Nothing pinned before.
        let (lab, files, receiver) = limited_lab();
        kill_at(&lab, &files, step);
        if lab.attached_program().is_some() {
            assert!(
                heavy_through(&lab, &receiver, 25) <= 20,
                "killed at {step}: attached, so it must enforce"
            );
        }
        let fresh = start(&lab, &files, &[]);
        assert!(
            heavy_through(&lab, &receiver, 25) <= 20,
            "{step}: the next start enforces"
        );
        drop(fresh);

        // A daemon left its protection pinned; a new start dies midway.
        let (lab, files, receiver) = limited_lab();
        let program = start_and_keep_attached(&lab, &files, &receiver);
        kill_at(&lab, &files, step);
        assert_eq!(
            lab.attached_program(),
            Some(program),
            "killed at {step}: untouched"
        );
        assert!(pinned(&files), "{step}: pins kept");
        assert_eq!(
            heavy_through(&lab, &receiver, 5),
            0,
            "{step}: still enforcing"
        );
        let next = start(&lab, &files, &[]);
        next.wait_log("adopted the pinned link");
        assert_eq!(
            heavy_through(&lab, &receiver, 5),
            0,
            "{step}: the window survived"
        );
        drop(next);
    }
}

#[test]
fn a_running_daemon_re_attaches_to_a_re_created_interface() {
    let (lab, files, receiver) = limited_lab();
    let daemon = start(&lab, &files, &[]);
    assert_eq!(heavy_through(&lab, &receiver, 25), 20);
    lab.recreate_link();
    daemon.wait_log("re-attached");
    assert!(
        lab.attached_program().is_some(),
        "attached to the new interface"
    );
    daemon.wait_metric(
        &format!("xdp_limiter_reattachments_total{{interface=\"{RX_IF}\"}}"),
        |v| v == 1.0,
    );
    assert_eq!(
        heavy_through(&lab, &receiver, 5),
        0,
        "enforcing again, with the window it had"
    );
    stop_cleanly(&lab, &files, daemon);
}

#[test]
fn a_daemon_adopting_the_pins_of_a_re_created_interface_attaches_afresh() {
    let (lab, files, receiver) = limited_lab();
    start_and_keep_attached(&lab, &files, &receiver);
    lab.recreate_link();
    assert_eq!(
        lab.attached_program(),
        None,
        "the new interface has no program"
    );
    let new = start(&lab, &files, &[]);
    new.wait_log("the pinned link is defunct");
    assert!(lab.attached_program().is_some());
    assert_eq!(
        heavy_through(&lab, &receiver, 5),
        0,
        "enforcing, windows kept"
    );
    assert!(new.metrics().contains(&format!(
        "xdp_limiter_reattachments_total{{interface=\"{RX_IF}\"}} 1"
    )));
}

#[test]
fn two_thousand_idle_metrics_connections_starve_nothing() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let lab = Lab::three_senders();
    let files = Files::new();
    // The default tick (1 s), so the CPU below is what idle costs.
    files.write_config("[default]\npps = 2\nwindow = \"10s\"\ndry_run = false\n");
    let config = files.config();
    let config = config.to_str().expect("utf-8");
    // As under systemd: a soft limit of 1024 open files.
    let daemon = Daemon::start_with_nofile(&lab.rx, &files, &["-i", RX_IF, "-c", config], 1024);
    // This test process needs room for its own 2,000.
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("raise the test's limit");
    // Bounded in time: connections into a backlog nobody accepts from
    // would each wait for their timeout.
    let idle: Vec<std::net::TcpStream> = lab.rx.enter(|| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut held = Vec::new();
        while held.len() < 2000 && std::time::Instant::now() < deadline {
            if let Ok(stream) = std::net::TcpStream::connect_timeout(
                &"127.0.0.1:9470".parse().expect("address"),
                Duration::from_millis(200),
            ) {
                held.push(stream);
            }
        }
        held
    });
    assert!(idle.len() >= 1000, "{} connections held", idle.len());

    files.cli_ok(&["status"]);
    assert!(
        daemon.metrics().contains("xdp_limiter_packets_total"),
        "a scrape is served"
    );
    files.cli_ok(&["reload"]);

    // Idle connections cost nothing: under 5% of a CPU over two seconds.
    let (cpu_before, since) = (daemon.cpu_time(), std::time::Instant::now());
    while since.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let used = daemon.cpu_time() - cpu_before;
    assert!(
        used.as_secs_f64() < 0.05 * since.elapsed().as_secs_f64(),
        "the daemon used {used:?} of CPU in {:?} with {} idle connections",
        since.elapsed(),
        idle.len()
    );
    drop(idle);
    assert!(daemon.stop().success());
}

#[test]
fn released_sources_are_logged_a_few_per_tick_then_counted() {
    // 40 sources blocked at once for 2 s, released together.
    let noisy: Vec<std::net::Ipv4Addr> = (10..50)
        .map(|i| std::net::Ipv4Addr::new(192, 0, 2, i))
        .collect();
    let mut sources = vec![MARKER];
    sources.extend(&noisy);
    let lab = Lab::new(&sources);
    let files = Files::new();
    files.write_config(&format!(
        "[default]\npps = 1\nblock = \"2s\"\ndry_run = false\n\n\
         [[rules]]\ncidr = \"{MARKER}/32\"\naction = \"allow\"\n"
    ));
    let receiver = lab.receiver(PORT);
    let daemon = start(&lab, &files, &[]);
    let sends: Vec<_> = noisy.iter().map(|s| (*s, 3)).collect();
    lab.exchange(&receiver, PORT, &sends, MARKER);
    daemon.wait_log("more sources released");
    // The 40 penalties start within the exchange, so they end within one
    // tick or two: the releases of the second tick may come after the
    // first tick's summary. Read once every release is in.
    let releases = |log: &str| {
        let listed: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("source released"))
            .collect();
        let summarised: usize = log
            .lines()
            .filter(|l| l.contains("more sources released"))
            .filter_map(|l| {
                let (_, rest) = l.split_once("more=")?;
                rest.split_whitespace().next()?.parse::<usize>().ok()
            })
            .sum();
        (
            listed.len() + summarised,
            listed
                .iter()
                .filter_map(|l| logged_at_us(l))
                .collect::<Vec<_>>(),
        )
    };
    limiter_tests::wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        (releases(&daemon.log()).0 >= 40).then_some(())
    });
    let log = daemon.log();
    let (accounted, listed) = releases(&log);
    assert_eq!(accounted, 40, "every release listed or counted:\n{log}");
    // A tick's lines are written together (microseconds apart); ticks are
    // 100 ms or more apart.
    let mut per_tick = vec![0usize];
    for pair in listed.windows(2) {
        if pair[1].abs_diff(pair[0]) > 50_000 {
            per_tick.push(0);
        }
        *per_tick.last_mut().expect("one tick at least") += 1;
    }
    *per_tick.first_mut().expect("one tick at least") += 1;
    assert!(
        per_tick.iter().all(|n| *n <= 16),
        "at most 16 listed per tick, listed {per_tick:?}:\n{log}"
    );
}

/// Microseconds into the day of a log line's timestamp
/// (`2026-11-27T22:32:40.953486Z ...`).
fn logged_at_us(line: &str) -> Option<u64> {
    let time = line.get(11..26)?;
    let field = |range: std::ops::Range<usize>| time.get(range)?.parse::<u64>().ok();
    Some(((field(0..2)? * 60 + field(3..5)?) * 60 + field(6..8)?) * 1_000_000 + field(9..15)?)
}

#[test]
fn a_byte_limit_below_the_interface_mtu_is_refused_at_start() {
    let lab = Lab::three_senders();
    let files = Files::new();
    // lo's MTU is 65536: 2,000 bytes per window could never pass a full frame.
    files.write_config("[default]\nbytes_per_second = 2000\ndry_run = false\n");
    let config = files.config();
    let (status, log) = Daemon::start_failing(
        &lab.rx,
        &files,
        &["-i", "lo", "-c", config.to_str().expect("utf-8")],
    );
    assert_eq!(status.code(), Some(1));
    let error = one_error_line(&log);
    assert!(
        error.contains("default.bytes_per_second") && error.contains("MTU of lo"),
        "{error}"
    );
}

/// Detaching takes the program off the interface before it returns, even
/// while something else holds a reference to its link (bpftool, a
/// concurrent `xdp-limiter detach` reading the pin, the kernel's own
/// deferred free of an unlinked bpffs pin): the link is detached, not only
/// unpinned. Unpinning alone left the program attached as long as any
/// reference lived, so `detach`'s answer could come while the interface
/// was still filtered (seen on a loaded machine).
#[test]
fn a_detach_takes_the_program_off_whoever_holds_its_link() {
    use aya::programs::links::{FdLink, PinnedLink};
    use limiter_user::{
        config::AttachMode,
        kernel::{Instance, LoadOptions},
    };
    let lab = Lab::three_senders();
    let files = Files::new();
    let held = lab.rx.enter(|| {
        let options = LoadOptions {
            max_sources: 1024,
            ..LoadOptions::default()
        };
        let mut instance = Instance::load(RX_IF, &files.pin_dir, options).expect("load");
        instance.attach(AttachMode::Native).expect("attach");
        let pin = files.pin_dir.join(RX_IF).join("link");
        let held = FdLink::from(PinnedLink::from_pin(&pin).expect("the pinned link"));
        instance.detach().expect("detach");
        held
    });
    assert_eq!(lab.attached_program(), None, "still attached after detach");
    drop(held);
}
