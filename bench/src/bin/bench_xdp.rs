//! `cargo xtask bench xdp`: the kernel's own ns-per-packet figure
//! (BPF_PROG_TEST_RUN with a large repeat count) for the limiter and, in
//! the same run, for the baseline program (same parsing, one per-CPU LRU
//! counter). Ends with one JSON line per case.

use std::net::Ipv4Addr;

use aya::programs::Xdp;
use limiter_bench_objects::{baseline_program, load_baseline};
use limiter_common::Action;
use limiter_tests::{
    net, packets,
    testrun::{pin_current_thread, test_run},
};
use limiter_user::{
    kernel::{self, push, LoadOptions, Program},
    rules::{RuleSet, RuleSpec},
};

const REPEAT: u32 = 1_000_000;
const ROUNDS: usize = 9;
const NEW_SOURCES: u32 = 100_000;
const CPU: usize = 0;

fn udp(src: [u8; 4]) -> Vec<u8> {
    packets::udp_v4(
        Ipv4Addr::from(src),
        Ipv4Addr::new(198, 51, 100, 200),
        53,
        18,
    )
}

/// The kernel-reported ns per run of one round of `REPEAT` runs.
fn round(program: &Xdp, frame: &[u8], expect: u32) -> f64 {
    let result = test_run(program, frame, REPEAT).expect("BPF_PROG_TEST_RUN");
    assert_eq!(result.return_value, expect, "unexpected verdict");
    result.duration.as_nanos() as f64
}

/// Medians over `ROUNDS` of the limiter and the baseline, their rounds
/// interleaved so that machine noise hits both alike.
fn paired(limiter: (&Xdp, &[u8], u32), baseline: (&Xdp, &[u8], u32)) -> (f64, f64) {
    let (mut lim, mut base) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        lim.push(round(limiter.0, limiter.1, limiter.2));
        base.push(round(baseline.0, baseline.1, baseline.2));
    }
    (median(&mut lim), median(&mut base))
}

/// Mean ns per run over frames run one at a time (each a new source).
fn one_each(program: &Xdp, frames: &[Vec<u8>]) -> f64 {
    let total: u128 = frames
        .iter()
        .map(|frame| {
            test_run(program, frame, 1)
                .expect("BPF_PROG_TEST_RUN")
                .duration
                .as_nanos()
        })
        .sum();
    total as f64 / frames.len() as f64
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn limiter() -> Program {
    let mut program = kernel::load(&LoadOptions::default()).expect("load limiter");
    let mut set = RuleSet::with_default(RuleSpec::limit(net("0.0.0.0/0"), 100_000_000));
    set.rules
        .push(RuleSpec::with_action(net("192.0.2.0/24"), Action::Allow));
    set.rules.push(RuleSpec::limit(net("198.51.100.0/24"), 1));
    // A byte limit turns leases off: every admitted frame takes the shared
    // path (window lookup and compare-and-swap of packets and bytes).
    let mut shared = RuleSpec::limit(net("203.0.113.128/25"), 100_000_000);
    shared.limits.bytes_per_second = Some(100_000_000_000);
    set.rules.push(shared);
    set.tiered = true;
    push::push(&mut program.maps, &set).expect("push rules");
    program
}

struct Case {
    name: &'static str,
    ns: f64,
    baseline: f64,
}

fn main() {
    pin_current_thread(CPU);
    let mut base = load_baseline();
    let mut lim = limiter();
    let base_prog: &Xdp = baseline_program(&mut base);
    let lim_prog = lim.xdp();

    let under = udp([203, 0, 113, 1]);
    let under_shared = udp([203, 0, 113, 129]);
    let over = udp([198, 51, 100, 1]);
    let allowed = udp([192, 0, 2, 1]);
    let arp = packets::arp();
    let new_sources: Vec<Vec<u8>> = (0..NEW_SOURCES)
        .map(|i| udp(Ipv4Addr::from(0xc612_0000u32 + i).octets())) // 198.18.0.0/15
        .collect();

    const PASS: u32 = 2;
    const DROP: u32 = 1;
    // Warm up: create the known sources and push `over` past its limit.
    for frame in [&under, &under_shared, &over, &allowed] {
        for _ in 0..3 {
            test_run(lim_prog, frame, 1).expect("warm up");
            test_run(base_prog, frame, 1).expect("warm up");
        }
    }

    let case = |name, limiter: (&[u8], u32), baseline_frame: &[u8]| {
        let (ns, baseline) = paired(
            (lim_prog, limiter.0, limiter.1),
            (base_prog, baseline_frame, PASS),
        );
        Case { name, ns, baseline }
    };
    let mut cases = vec![
        case("under_limit", (&under, PASS), &under),
        case("under_limit_no_lease", (&under_shared, PASS), &under_shared),
        case("over_limit_drop", (&over, DROP), &over),
        case("allowlisted", (&allowed, PASS), &allowed),
    ];
    cases.push(Case {
        name: "new_source_each_packet",
        ns: one_each(lim_prog, &new_sources),
        baseline: one_each(base_prog, &new_sources),
    });
    cases.push(case("non_ip", (&arp, PASS), &arp));

    println!(
        "xdp bench: BPF_PROG_TEST_RUN on CPU {CPU}, median of {ROUNDS} rounds of {REPEAT} runs, \
         limiter and baseline rounds interleaved (new sources: mean of {NEW_SOURCES} single runs)"
    );
    println!(
        "{:<24} {:>10} {:>12} {:>7}",
        "case", "ns/pkt", "baseline", "ratio"
    );
    for case in &cases {
        println!(
            "{:<24} {:>10.1} {:>12.1} {:>6.2}x",
            case.name,
            case.ns,
            case.baseline,
            case.ns / case.baseline
        );
    }
    for case in &cases {
        println!(
            "{{\"case\":\"{}\",\"ns_per_pkt\":{:.1},\"baseline_ns_per_pkt\":{:.1},\"ratio\":{:.3}}}",
            case.name,
            case.ns,
            case.baseline,
            case.ns / case.baseline
        );
    }
}
