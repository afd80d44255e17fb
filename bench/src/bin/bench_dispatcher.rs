//! `cargo xtask bench dispatcher`: what libxdp's dispatcher adds to a
//! frame, in the kernel lane's guest (the build machine's kernel cannot
//! run a dispatcher). Two copies of the limiter with the same rules: one
//! loaded as XDP and run directly, one joined as the only component of a
//! dispatcher on a veth and run through the dispatcher; the kernel's own
//! ns per frame (BPF_PROG_TEST_RUN with a repeat count) of a known source
//! under its limit and of one held over it, their rounds alternated,
//! medians. The guest runs under software emulation (TCG): the ratio says
//! what the dispatcher adds in proportion, the ns say nothing about a
//! real CPU. One JSON line per case, prefixed `LANE BENCH` for the lane.

use std::{
    net::Ipv4Addr,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
    process::Command,
};

use limiter_tests::{
    net, packets,
    testrun::{pin_current_thread, test_run, XDP_DROP, XDP_PASS},
};
use limiter_user::{
    config::AttachMode,
    kernel::{
        self,
        dispatcher::{self, Joining, Programs},
        push, LoadOptions, Program,
    },
    rules::{RuleSet, RuleSpec},
};

/// Runs a round: few enough for emulation (about 20 times slower).
const REPEAT: u32 = 100_000;
const ROUNDS: usize = 9;
const CPU: usize = 0;
const IFACE: &str = "xlbench0";
const PEER: &str = "xlbench1";

fn rules() -> RuleSet {
    let mut set = RuleSet::with_default(RuleSpec::limit(net("0.0.0.0/0"), 100_000_000));
    set.rules.push(RuleSpec::limit(net("198.51.100.0/24"), 1));
    set
}

fn limiter(component: bool) -> Program {
    let options = LoadOptions {
        component: component.then_some(dispatcher::DEFAULT_PRIORITY),
        ..LoadOptions::default()
    };
    let mut program = kernel::load(&options).expect("load the limiter");
    push::push(&mut program.maps, &rules()).expect("push the rules");
    program
}

fn udp(src: Ipv4Addr) -> Vec<u8> {
    packets::udp_v4(src, Ipv4Addr::new(203, 0, 113, 200), 53, 18)
}

/// `struct bpf_attr` for `BPF_PROG_TEST_RUN` (the fields up to `flags`).
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
}

const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// BPF_PROG_TEST_RUN of the program `fd` (the dispatcher, which aya did
/// not load for this process): its verdict and ns per run.
fn test_run_fd(fd: BorrowedFd<'_>, frame: &[u8], repeat: u32) -> (u32, f64) {
    let mut out = vec![0u8; frame.len() + 256];
    let mut attr = TestRunAttr {
        prog_fd: fd.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_size_out: out.len() as u32,
        data_in: frame.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat,
        ..TestRunAttr::default()
    };
    // SAFETY: `attr` is a valid `bpf_attr` prefix for BPF_PROG_TEST_RUN
    // whose pointers name `frame` and `out`, which outlive the call; the
    // size passed is the struct's.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut attr as *mut TestRunAttr,
            std::mem::size_of::<TestRunAttr>(),
        )
    };
    assert_eq!(
        ret,
        0,
        "BPF_PROG_TEST_RUN: {}",
        std::io::Error::last_os_error()
    );
    (attr.retval, f64::from(attr.duration))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("ip");
    assert!(status.success(), "ip {args:?}: {status}");
}

fn main() {
    let lane = std::env::args().any(|a| a == "--lane");
    pin_current_thread(CPU);
    ip(&["link", "add", IFACE, "type", "veth", "peer", "name", PEER]);
    ip(&["link", "set", IFACE, "up"]);
    ip(&["link", "set", PEER, "up"]);
    let ifindex = nix::net::if_::if_nametoindex(IFACE).expect("the veth");

    let mut direct = limiter(false);
    let mut component = limiter(true);
    dispatcher::join(
        IFACE,
        ifindex,
        Joining {
            program: component.component().expect("a component"),
            name: limiter_common::names::PROGRAM,
            priority: dispatcher::DEFAULT_PRIORITY,
        },
        AttachMode::Native,
    )
    .expect("join a dispatcher");
    let Ok(Programs::Dispatcher { id, .. }) = dispatcher::programs(ifindex) else {
        panic!("no dispatcher on {IFACE}");
    };
    let info = aya::programs::loaded_programs()
        .flatten()
        .find(|info| info.id() == id)
        .expect("the dispatcher");
    let dispatcher_fd = info.fd().expect("the dispatcher's fd");

    let kernel = kernel::kernel_release();
    for (case, source, verdict) in [
        ("under_limit", Ipv4Addr::new(192, 0, 2, 10), XDP_PASS),
        ("over_limit_drop", Ipv4Addr::new(198, 51, 100, 10), XDP_DROP),
    ] {
        let frame = udp(source);
        // The source known (and, over its limit, held) in both copies.
        for _ in 0..3 {
            test_run(direct.xdp(), &frame, 1).expect("BPF_PROG_TEST_RUN");
            test_run_fd(dispatcher_fd.as_fd(), &frame, 1);
        }
        let (mut direct_ns, mut dispatched_ns) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let run = test_run(direct.xdp(), &frame, REPEAT).expect("BPF_PROG_TEST_RUN");
            assert_eq!(run.return_value, verdict, "{case}: the direct verdict");
            direct_ns.push(run.duration.as_nanos() as f64);
            let (retval, ns) = test_run_fd(dispatcher_fd.as_fd(), &frame, REPEAT);
            assert_eq!(retval, verdict, "{case}: the dispatcher's verdict");
            dispatched_ns.push(ns);
        }
        let (direct_ns, dispatched_ns) = (median(&mut direct_ns), median(&mut dispatched_ns));
        let line = serde_json::json!({
            "bench": "dispatcher",
            "case": case,
            "kernel": kernel,
            "emulated": true,
            "direct_ns": direct_ns,
            "dispatcher_ns": dispatched_ns,
            "ratio": (dispatched_ns / direct_ns * 1000.0).round() / 1000.0,
            "target": 1.1,
            "rounds": ROUNDS,
            "repeat": REPEAT,
        });
        if lane {
            println!("LANE BENCH {line}");
        } else {
            println!("{line}");
        }
    }
    drop(direct);
    dispatcher::leave(IFACE, ifindex, component.id()).expect("leave");
    ip(&["link", "del", IFACE]);
}
