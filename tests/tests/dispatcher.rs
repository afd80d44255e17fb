//! `attach = "dispatcher"`: xdp-limiter as one component of libxdp's
//! multi-program dispatcher beside Debian's `xdp-filter` (libxdp 1.3.1)
//! on a veth pair. Both take effect (a filtered port dropped by one, a
//! flood limited by the other) whichever loads first; removing either
//! leaves the other working; a daemon that stops with `--keep-attached`
//! is replaced in the dispatcher by the next one, counters kept.
//!
//! libxdp's dispatcher needs a kernel that can replace a program's
//! functions (`BPF_PROG_TYPE_EXT`, BPF trampolines). Where libxdp itself
//! cannot build a dispatcher (it then loads xdp-filter alone), the tests
//! assert the refusal instead: xdp-limiter says why, attaches nothing and
//! leaves xdp-filter filtering. Which case holds is read from what libxdp
//! did, and printed; the kernel lane (6.1) runs the dispatcher itself.

use std::{
    net::UdpSocket,
    process::{Command, Output},
    sync::{Mutex, MutexGuard, OnceLock},
};

use limiter_tests::{
    daemon::{Daemon, Files},
    lab::{limit_config, Lab, HEAVY, MARKER, MEDIUM, RX_IF},
    netns::NetNs,
};

/// The port the limiter's rules see.
const PORT: u16 = 7000;
/// The port xdp-filter drops.
const FILTERED: u16 = 7001;

/// Runs a libxdp tool in the lab's network namespace, on the host's
/// bpffs (`ip netns exec` would mount a sysfs of its own, without it).
fn run(ns: &NetNs, program: &str, args: &[&str]) -> Output {
    Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", ns.name()))
        .arg(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

/// bpffs at /sys/fs/bpf, where libxdp pins (systemd mounts it at boot; a
/// bare machine may not have it).
fn mount_bpffs() {
    let mounted = std::fs::read_to_string("/proc/mounts")
        .expect("/proc/mounts")
        .lines()
        .any(|line| line.split_whitespace().nth(1) == Some("/sys/fs/bpf"));
    if !mounted {
        let out = Command::new("mount")
            .args(["-t", "bpf", "-o", "mode=0700", "bpf", "/sys/fs/bpf"])
            .output()
            .expect("mount");
        // Another test may have mounted it meanwhile.
        let text = text(&out);
        assert!(
            out.status.success() || text.contains("busy"),
            "mount bpffs: {text}"
        );
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// xdp-filter on the lab's interface: loaded, unloaded on drop (bpffs is
/// shared by every namespace: nothing of it may outlive the test).
struct Filter<'a> {
    ns: &'a NetNs,
}

impl<'a> Filter<'a> {
    /// Loads xdp-filter (deny policy, native mode) dropping UDP to
    /// [`FILTERED`].
    fn load(ns: &'a NetNs) -> Self {
        let out = run(ns, "xdp-filter", &["load", "-m", "native", RX_IF]);
        assert!(out.status.success(), "xdp-filter load: {}", text(&out));
        let out = run(
            ns,
            "xdp-filter",
            &["port", "-p", "udp", &FILTERED.to_string()],
        );
        assert!(out.status.success(), "xdp-filter port: {}", text(&out));
        Filter { ns }
    }

    fn unload(self) {
        let out = run(self.ns, "xdp-filter", &["unload", RX_IF]);
        assert!(out.status.success(), "xdp-filter unload: {}", text(&out));
        std::mem::forget(self);
    }
}

impl Drop for Filter<'_> {
    fn drop(&mut self) {
        let _ = run(self.ns, "xdp-filter", &["unload", RX_IF]);
    }
}

/// What `xdp-loader status` says of the interface.
fn loader_status(ns: &NetNs) -> String {
    text(&run(ns, "xdp-loader", &["status", RX_IF]))
}

/// Whether libxdp runs a dispatcher on the interface (it falls back to a
/// single program where the kernel cannot run one).
fn libxdp_dispatches(ns: &NetNs) -> bool {
    let status = loader_status(ns);
    eprintln!("xdp-loader status:\n{status}");
    status.contains("xdp_dispatcher")
}

fn start(lab: &Lab, files: &Files, extra: &[&str]) -> Daemon {
    let config = files.config();
    let mut args = vec![
        "-i",
        RX_IF,
        "-c",
        config.to_str().expect("utf-8 path"),
        "--attach",
        "dispatcher",
    ];
    args.extend_from_slice(extra);
    Daemon::start(&lab.rx, files, &args)
}

fn start_failing(lab: &Lab, files: &Files) -> String {
    let config = files.config();
    let args = [
        "-i",
        RX_IF,
        "-c",
        config.to_str().expect("utf-8 path"),
        "--attach",
        "dispatcher",
    ];
    let (status, log) = Daemon::start_failing(&lab.rx, files, &args);
    assert!(!status.success(), "{log}");
    log
}

/// The heavy source's allowance: 1 pps over 60 s.
const ALLOWANCE: usize = 60;

fn lab() -> (Lab, Files, UdpSocket, UdpSocket) {
    mount_bpffs();
    let lab = Lab::three_senders();
    let files = Files::new();
    // 60 frames a minute: a window long enough that the daemons' restarts
    // and the dispatcher's swaps (each a verification of the program,
    // about 4 s under the 6.1 lane's emulation) fall inside it.
    files.write_config(&limit_config(1).replace("window = \"10s\"", "window = \"60s\""));
    let limited = lab.receiver(PORT);
    let filtered = lab.receiver(FILTERED);
    (lab, files, limited, filtered)
}

/// Frames of `HEAVY` through to [`PORT`] out of `sent`, and of `MEDIUM`
/// out of 3 (under its limit of 60 a window: a test sends it at most
/// five times).
fn limited_through(lab: &Lab, receiver: &UdpSocket, sent: usize) -> (usize, usize) {
    let got = lab.exchange(receiver, PORT, &[(HEAVY, sent), (MEDIUM, 3)], MARKER);
    (
        got.get(&HEAVY).copied().unwrap_or(0),
        got.get(&MEDIUM).copied().unwrap_or(0),
    )
}

/// Frames to [`FILTERED`] through out of 10, sent from `MARKER` (which a
/// rule allows, so they use no source's allowance): counted once a
/// marker sent after them (to [`PORT`], which xdp-filter lets through)
/// has arrived, since one veth delivers in order.
fn filtered_through(lab: &Lab, filtered: &UdpSocket, limited: &UdpSocket) -> usize {
    lab.send(MARKER, FILTERED, 10, 64);
    lab.exchange(limited, PORT, &[], MARKER);
    filtered.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 2048];
    let mut got = 0;
    while filtered.recv_from(&mut buf).is_ok() {
        got += 1;
    }
    filtered.set_nonblocking(false).expect("blocking");
    got
}

/// xdp-filter keeps one configuration for the whole machine, behind a
/// lock file: one test at a time uses it.
static XDP_FILTER: Mutex<()> = Mutex::new(());

fn exclusive() -> MutexGuard<'static, ()> {
    XDP_FILTER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// xdp-filter alone on the interface: its port dropped, no source limited
/// (30 frames of the heavy source all through).
#[track_caller]
fn assert_xdp_filter_alone(lab: &Lab, filtered: &UdpSocket, limited: &UdpSocket) {
    assert_eq!(
        filtered_through(lab, filtered, limited),
        0,
        "xdp-filter filters"
    );
    assert_eq!(limited_through(lab, limited, 30), (30, 3), "nothing limits");
}

/// The programs `status --output json` lists for the interface.
fn status_programs(files: &Files) -> Vec<String> {
    let status: serde_json::Value =
        serde_json::from_str(&files.cli_ok(&["status", "--output", "json"])).expect("json");
    status["interfaces"][0]["programs"]
        .as_array()
        .map(|programs| {
            programs
                .iter()
                .map(|p| p["name"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn beside_xdp_filter_loaded_first_both_take_effect_and_either_can_leave() {
    let _xdp_filter = exclusive();
    let (lab, files, limited, filtered) = lab();
    let filter = Filter::load(&lab.rx);
    assert_eq!(
        filtered_through(&lab, &filtered, &limited),
        0,
        "xdp-filter drops its port"
    );
    if !libxdp_dispatches(&lab.rx) {
        // libxdp could not build a dispatcher here: xdp-filter holds the
        // interface alone, and xdp-limiter refuses to take it.
        let log = start_failing(&lab, &files);
        assert!(
            log.contains("which is not a libxdp dispatcher"),
            "a clear refusal: {log}"
        );
        assert_xdp_filter_alone(&lab, &filtered, &limited);
        eprintln!("this kernel runs no libxdp dispatcher: the refusal was asserted");
        return;
    }
    let daemon = start(&lab, &files, &[]);
    assert!(
        daemon
            .log()
            .contains("joined the interface's XDP dispatcher"),
        "{}",
        daemon.log()
    );
    assert_eq!(
        limited_through(&lab, &limited, 100),
        (ALLOWANCE, 3),
        "the flood limited"
    );
    assert_eq!(
        filtered_through(&lab, &filtered, &limited),
        0,
        "the port still filtered"
    );
    let programs = status_programs(&files);
    assert!(
        programs.len() == 2 && programs.iter().any(|p| p == "xdp_limiter"),
        "status shows both programs: {programs:?}"
    );
    let status = loader_status(&lab.rx);
    assert!(
        status.contains("xdp_limiter"),
        "libxdp sees xdp-limiter: {status}"
    );

    // xdp-limiter leaves: xdp-filter goes on alone.
    assert!(daemon.stop().success());
    assert_xdp_filter_alone(&lab, &filtered, &limited);
    let status = loader_status(&lab.rx);
    assert!(
        !status.contains("xdp_limiter"),
        "xdp-limiter left: {status}"
    );
    filter.unload();
    assert_eq!(lab.attached_program(), None, "nothing left attached");
}

#[test]
fn with_xdp_limiter_loaded_first_xdp_filter_joins_and_leaves_and_the_limit_holds() {
    let _xdp_filter = exclusive();
    let (lab, files, limited, filtered) = lab();
    if !dispatches_or_refuses(&lab, &files) {
        return;
    }
    let daemon = start(&lab, &files, &["--keep-attached"]);
    assert_eq!(
        limited_through(&lab, &limited, 100),
        (ALLOWANCE, 3),
        "the flood limited"
    );
    assert_eq!(
        filtered_through(&lab, &filtered, &limited),
        10,
        "no filter yet"
    );

    let filter = Filter::load(&lab.rx);
    assert_eq!(
        filtered_through(&lab, &filtered, &limited),
        0,
        "xdp-filter drops its port"
    );
    assert_eq!(
        limited_through(&lab, &limited, 30),
        (0, 3),
        "the window held"
    );
    assert_eq!(status_programs(&files).len(), 2, "status shows both");

    // xdp-filter leaves: xdp-limiter goes on alone, its window intact.
    filter.unload();
    assert_eq!(
        filtered_through(&lab, &filtered, &limited),
        10,
        "the filter is gone"
    );
    assert_eq!(
        limited_through(&lab, &limited, 30),
        (0, 3),
        "the window held"
    );
    assert_eq!(status_programs(&files), vec!["xdp_limiter".to_string()]);

    // --keep-attached: the next daemon replaces the component in place.
    assert!(daemon.stop().success());
    assert_eq!(
        limited_through(&lab, &limited, 10),
        (0, 3),
        "still limited, no daemon"
    );
    let next = start(&lab, &files, &["--keep-attached"]);
    assert!(next.log().contains("replaced=true"), "{}", next.log());
    assert_eq!(
        limited_through(&lab, &limited, 10),
        (0, 3),
        "the window survived"
    );
    assert_eq!(status_programs(&files), vec!["xdp_limiter".to_string()]);
    let out = files.cli(&[
        "detach",
        "--pin-dir",
        files.pin_dir.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(next.wait().success());
    assert_eq!(lab.attached_program(), None, "nothing left attached");
}

#[test]
fn an_interface_deleted_and_created_again_is_joined_again_and_a_component_taken_out_stays_out() {
    let _xdp_filter = exclusive();
    let (lab, files, limited, _filtered) = lab();
    if !dispatches_or_refuses(&lab, &files) {
        return;
    }
    let daemon = start(&lab, &files, &[]);
    assert_eq!(limited_through(&lab, &limited, 100), (ALLOWANCE, 3));
    let before = dispatcher_dirs();
    lab.recreate_link();
    daemon.wait_log("re-attached to the re-created interface");
    daemon.wait_metric(
        &format!("xdp_limiter_reattachments_total{{interface=\"{RX_IF}\"}}"),
        |v| v == 1.0,
    );
    assert_eq!(status_programs(&files), vec!["xdp_limiter".to_string()]);
    assert_eq!(
        limited_through(&lab, &limited, 10),
        (0, 3),
        "enforcing on the new interface, the window kept"
    );
    // The dispatcher that went with the old interface left no pins.
    let after = dispatcher_dirs();
    assert!(
        before.iter().all(|dir| !after.contains(dir)),
        "{before:?} -> {after:?}"
    );

    // Someone takes the component out with libxdp: the daemon says so and
    // does not put it back.
    let status: serde_json::Value =
        serde_json::from_str(&files.cli_ok(&["status", "--output", "json"])).expect("json");
    let id = status["interfaces"][0]["programs"][0]["id"]
        .as_u64()
        .expect("our program's id")
        .to_string();
    let out = run(&lab.rx, "xdp-loader", &["unload", "-i", &id, RX_IF]);
    assert!(out.status.success(), "xdp-loader unload: {}", text(&out));
    daemon.wait_log("taken out of the XDP dispatcher by someone else");
    assert_eq!(
        limited_through(&lab, &limited, 10),
        (10, 3),
        "nothing limits any more"
    );
    assert!(status_programs(&files).is_empty(), "not joined again");
    assert!(daemon.stop().success());
    assert_eq!(lab.attached_program(), None, "nothing left attached");
}

/// libxdp's dispatcher directories under bpffs.
fn dispatcher_dirs() -> Vec<String> {
    std::fs::read_dir("/sys/fs/bpf/xdp")
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("dispatch-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether this kernel runs libxdp's dispatcher (probed with
/// xdp-filter); where it does not, asserts xdp-limiter's refusal on a free
/// interface (a clear reason, nothing attached) and says so.
fn dispatches_or_refuses(lab: &Lab, files: &Files) -> bool {
    if probe_dispatches(lab) {
        return true;
    }
    let log = start_failing(lab, files);
    assert!(
        log.contains("refuses extension (freplace) programs"),
        "a clear refusal: {log}"
    );
    assert_eq!(lab.attached_program(), None, "nothing attached");
    eprintln!("this kernel runs no libxdp dispatcher: the refusal was asserted");
    false
}

/// Whether libxdp builds a dispatcher on this kernel: xdp-filter loaded
/// and unloaded once to see (once a test binary: the kernel does not
/// change).
fn probe_dispatches(lab: &Lab) -> bool {
    static DISPATCHES: OnceLock<bool> = OnceLock::new();
    *DISPATCHES.get_or_init(|| {
        let filter = Filter::load(&lab.rx);
        let dispatches = libxdp_dispatches(&lab.rx);
        filter.unload();
        dispatches
    })
}
