//! Kernel tests of the cheap tier under the limits operators set: small
//! limits, penalties and cluster scope (through BPF_PROG_TEST_RUN). A
//! spoofed flood of one-frame sources takes (almost) no window under any
//! of them with cheap frames enough (a tenth of 100 pps: 10), and a window
//! for each source the sketch reads above its one cheap frame under 10
//! pps; a small limit admits its allowance and its cheap frames (never
//! counted in its window) and not one frame more, beside a flood and after
//! a silence; a blocked source stays blocked through a flood, and gets its
//! cheap frames and no more after a silence that outlasts the sketch's
//! memory; and a cluster-scoped source gets its cold cap and its cheap
//! frames, the window counting the rest.
//!
//! Frames are placed in epochs by the kernel's own coarse clock
//! (`testrun::coarse_now`), as in `tiers.rs`.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    ops::Range,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use aya::programs::Xdp;
use limiter_common::{sketch, window::MAX_PACKETS, ClusterState, Outcome, Scope, SourceKey};
use limiter_tests::{
    net,
    packets::{self, DST4},
    testrun::{coarse_now, on_cpu, online_cpus, verdict, Harness, XDP_DROP, XDP_PASS},
};
use limiter_user::{
    kernel::{self, cluster, read, LoadOptions},
    rules::{RuleSet, RuleSpec},
};

/// The rules under test, one per /8 of spoofed sources, in rule order
/// (rule `i + 1`; the default is far above everything here).
const KINDS: [(&str, &str); 5] = [
    ("10 pps", "11.0.0.0/8"),
    ("100 pps", "12.0.0.0/8"),
    ("100 pps, block 60 s", "13.0.0.0/8"),
    ("100 pps, cluster scope", "14.0.0.0/8"),
    ("1000 pps", "15.0.0.0/8"),
];
/// Index in [`KINDS`] of the cluster-scoped rule.
const CLUSTER_KIND: usize = 3;
/// The rules of the single-source tests.
const SMALL_NET: &str = "198.51.100.0/24";
const PENALTY_NET: &str = "203.0.113.0/24";

fn udp4(src: Ipv4Addr) -> Vec<u8> {
    packets::udp_v4(src, DST4, 9999, 18)
}

/// A harness with the tiers on, [`KINDS`]' rules and the two single-source
/// rules (10 pps for [`SMALL_NET`], 10 pps blocked for a minute for
/// [`PENALTY_NET`]), the cluster kind made cluster-scoped in `RULES` as a
/// push of a cluster rule writes it (`cluster::kernel_ready`), and a cluster
/// state that is fresh, with a cold cap of half the allowance.
fn harness() -> Harness {
    let mut rules: Vec<RuleSpec> = KINDS
        .iter()
        .map(|(kind, cidr)| {
            let pps = if kind.starts_with("10 pps") {
                10
            } else if kind.starts_with("1000") {
                1000
            } else {
                100
            };
            let mut rule = RuleSpec::limit(net(cidr), pps);
            if kind.contains("block") {
                rule.limits.block = Some(Duration::from_secs(60));
            }
            rule
        })
        .collect();
    rules.push(RuleSpec::limit(net(SMALL_NET), 10));
    let mut penalty = RuleSpec::limit(net(PENALTY_NET), 10);
    penalty.limits.block = Some(Duration::from_secs(60));
    rules.push(penalty);
    let set = RuleSet {
        rules,
        tiered: true,
        ..RuleSet::with_default(RuleSpec::limit(net("0.0.0.0/0"), 100_000_000))
    };
    let mut harness = Harness::load_with(&LoadOptions::default());
    assert_eq!(harness.push(&set), 1, "first generation");
    harness.make_cluster_scoped(1 + CLUSTER_KIND as u32);
    let now = kernel::now().as_nanos() as u64;
    let state = ClusterState::new(now, 600_000_000_000, 2, 2, 500);
    cluster::write_state(harness.maps_mut(), state).expect("writing CLUSTER");
    harness
}

/// The rule of [`SMALL_NET`] and of [`PENALTY_NET`].
const SMALL_RULE: u32 = KINDS.len() as u32 + 1;
const PENALTY_RULE: u32 = KINDS.len() as u32 + 2;

/// Spoofed source `i` of the /8 whose first octet is `first`.
fn spoofed(first: u8, i: u32) -> Ipv4Addr {
    Ipv4Addr::from((u32::from(first) << 24) | (i & 0x00ff_ffff))
}

/// The first octet of a [`KINDS`] prefix.
fn first_octet(cidr: &str) -> u8 {
    cidr.split('.').next().unwrap().parse().unwrap()
}

/// One frame from each of sources `range` of every kind in turn (a mixed
/// flood: frame `j` of each kind, then `j + 1`), on the calling thread's
/// CPU; per kind, how many passed.
fn spray(program: &Xdp, range: Range<u32>) -> [u64; KINDS.len()] {
    let mut frame = udp4(Ipv4Addr::UNSPECIFIED);
    let mut passed = [0; KINDS.len()];
    for i in range {
        for (k, (_, cidr)) in KINDS.iter().enumerate() {
            packets::set_source(&mut frame, spoofed(first_octet(cidr), i).into());
            match verdict(program, &frame) {
                XDP_PASS => passed[k] += 1,
                XDP_DROP => {}
                other => panic!("unexpected verdict {other}"),
            }
        }
    }
    passed
}

/// The spoofed sources per kind: 20,000 (100,000 frames in all, in about
/// an epoch on this machine), or `$LIMITER_SMALL_FLOOD` (the kernel lane's
/// software-emulated guests are slower).
fn flood_sources() -> u32 {
    match std::env::var("LIMITER_SMALL_FLOOD") {
        Ok(n) => n.parse().expect("LIMITER_SMALL_FLOOD is a number"),
        Err(_) => 20_000,
    }
}

/// Windows in `WINDOWS` per first octet of their source.
fn windows_by_octet(harness: &Harness) -> BTreeMap<u8, u64> {
    let mut by = BTreeMap::new();
    for key in read::windows(harness.maps()).expect("read WINDOWS").keys() {
        *by.entry(key.addr[0]).or_default() += 1;
    }
    by
}

/// Waits (polling the kernel's clock) until `epochs` whole epochs of the
/// cheap tier have begun since now: a source silent that long has left
/// the sketch's two epochs.
fn wait_epochs(epochs: u64) {
    let from = coarse_now().as_nanos() as u64 / sketch::EPOCH_NS;
    while (coarse_now().as_nanos() as u64 / sketch::EPOCH_NS) < from + epochs {
        thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for the first 50 ms of an epoch (a burst of a few ms then stays
/// in one epoch and one window); returns the epoch.
fn at_epoch_start() -> u64 {
    loop {
        let now = coarse_now().as_nanos() as u64;
        if now % sketch::EPOCH_NS < 50_000_000 {
            return now / sketch::EPOCH_NS;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Offers `n` frames of `frame` back to back on `cpu`; how many passed.
fn burst(harness: &mut Harness, cpu: usize, frame: &[u8], n: u64) -> u64 {
    harness.offer(cpu, frame, n).0
}

/// A spoofed flood of one-frame sources costs no window under a 100 pps
/// limit, a penalty or cluster scope any more than under 1000 pps: each
/// kind's sources are judged in the cheap tier (all admitted: each is far
/// under its limit), and at most 1% of them take a window. Under 10 pps
/// (one cheap frame: a tenth of its allowance), the sources the sketch
/// reads above 1 (other sources share their counters: about a fifth at
/// 100,000 sources a second, docs/architecture.md) take a window: all
/// admitted still, at most half with a window.
#[test]
fn a_spoofed_flood_takes_no_window_under_limits_with_cheap_frames() {
    let mut harness = harness();
    for (i, (kind, _)) in KINDS.iter().enumerate() {
        let cheap = harness.first_rule(i as u32 + 1).cheap_frames;
        let want = if i == 0 { 1 } else { 10 };
        assert!(cheap >= want, "{kind}: {cheap} cheap frames");
    }
    let n = flood_sources();
    let program = harness.program();
    let passed = on_cpu(0, || spray(program, 0..n));
    let windows = windows_by_octet(&harness);
    eprintln!("windows per kind: {windows:?}");
    for (k, (kind, cidr)) in KINDS.iter().enumerate() {
        assert_eq!(
            passed[k],
            u64::from(n),
            "{kind}: every source is under its limit"
        );
        let taken = windows.get(&first_octet(cidr)).copied().unwrap_or(0);
        let most = if k == 0 { 50 } else { 1 };
        assert!(
            taken * 100 <= most * u64::from(n),
            "{kind}: {taken} of {n} one-frame sources took a window"
        );
    }
}

/// A 10 pps limit admits a burst's first frame in the cheap tier and 10
/// frames more from its window, on one CPU or both at once, and no more:
/// the cheap frame is never counted (the frame that leaves the cheap tier
/// charges nothing, which a sketch that reads high could not prove its
/// source's own), and the sketch orders every CPU's frames, so it is
/// admitted once.
#[test]
fn a_burst_under_a_small_limit_gets_its_allowance_and_its_cheap_frame() {
    for cpus in [&[0][..], &[0, 1][..]] {
        let mut harness = harness();
        let rule = harness.first_rule(SMALL_RULE);
        let allowance = rule.allowance_packets;
        assert_eq!((allowance, rule.cheap_frames), (10, 1));
        let frame = udp4(Ipv4Addr::new(198, 51, 100, 1));
        let program = harness.program();
        let epoch = at_epoch_start();
        let passed: u64 = thread::scope(|scope| {
            let senders: Vec<_> = cpus
                .iter()
                .map(|&cpu| {
                    let frame = &frame;
                    scope.spawn(move || {
                        on_cpu(cpu, || {
                            (0..3 * allowance)
                                .filter(|_| verdict(program, frame) == XDP_PASS)
                                .count() as u64
                        })
                    })
                })
                .collect();
            senders.into_iter().map(|s| s.join().unwrap()).sum()
        });
        assert_eq!(
            coarse_now().as_nanos() as u64 / sketch::EPOCH_NS,
            epoch,
            "the burst crossed an epoch: the machine stalled for most of a second"
        );
        assert_eq!(
            passed,
            allowance + u64::from(rule.cheap_frames),
            "CPUs {cpus:?}"
        );
        let windows = read::windows(harness.maps()).expect("read WINDOWS");
        let key = SourceKey::v4([198, 51, 100, 1]).with_class(rule.budget);
        let counted: u64 = windows[&key].slots.iter().map(|s| s[0] & MAX_PACKETS).sum();
        assert_eq!(
            counted, allowance,
            "CPUs {cpus:?}: the window counts what it admitted"
        );
    }
}

/// A source over a 10 pps limit, beside a spoofed flood on the other CPU,
/// never gets more than its allowance and its cheap frame in a window: the
/// flood's sources share its counters in the sketch (they only make it
/// look busier, which takes it out of the cheap tier early at worst); and
/// it is refused only with its window full: a frame at `t` is refused
/// when the estimate is over `allowance - 1`, and the estimate counts
/// nothing outside `(t - W, t]` but part of the oldest bucket, so every
/// refusal has at least `allowance - c` admitted in the second before it,
/// `c` what the bucket holding `t - W` admitted (docs/architecture.md,
/// "Window arithmetic"). However the machine paces the sender.
#[test]
fn a_small_limit_holds_beside_a_spoofed_flood() {
    assert!(online_cpus() >= 2, "this test needs two CPUs");
    let mut harness = harness();
    let rule = harness.first_rule(SMALL_RULE);
    let allowance = rule.allowance_packets;
    let bound = allowance + rule.cheap_bound();
    let frame = udp4(Ipv4Addr::new(198, 51, 100, 2));
    let program = harness.program();
    const WINDOWS: usize = 4;
    let flooding = AtomicBool::new(true);
    let sent_start = coarse_now();
    // (offsets from the start on the kernel's clock just before and just
    // after its run, passed) per frame: the kernel judged it at a time
    // between the two.
    let sent: Vec<(Duration, Duration, bool)> = thread::scope(|scope| {
        let flood = scope.spawn(|| {
            on_cpu(1, || {
                let mut i = 0;
                while flooding.load(Ordering::Relaxed) {
                    spray(program, i..i + 1_000);
                    i += 1_000;
                }
            })
        });
        let sent = on_cpu(0, || {
            let start = sent_start;
            let interval = Duration::from_secs(1) / (3 * allowance as u32);
            let mut sent = Vec::new();
            let mut next = Instant::now();
            loop {
                let at = coarse_now().saturating_sub(start);
                if at >= Duration::from_secs(WINDOWS as u64) {
                    return sent;
                }
                let passed = verdict(program, &frame) == XDP_PASS;
                sent.push((at, coarse_now().saturating_sub(start), passed));
                next += interval;
                thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        });
        flooding.store(false, Ordering::Relaxed);
        flood.join().expect("flood thread");
        sent
    });
    let (mut offered, mut admitted) = ([0u64; WINDOWS], [0u64; WINDOWS]);
    for (at, _, passed) in &sent {
        let k = at.as_secs() as usize;
        if k < WINDOWS {
            offered[k] += 1;
            admitted[k] += u64::from(*passed);
        }
    }
    eprintln!("offered {offered:?}, admitted {admitted:?}");
    for k in 0..WINDOWS {
        assert!(
            admitted[k] <= bound,
            "window {k}: {} admitted, at most {bound}; offered {offered:?}, admitted {admitted:?}",
            admitted[k]
        );
    }
    // Each refusal against the window before it. A frame's kernel time
    // lies between the times read before and after its run, so the
    // window's old end lies between `before - W` and `after - W`: `held`
    // counts every earlier admission whose run ended after `before - W`
    // (at least the kernel's count in the window), and `c` is the most
    // any bucket that old end may fall in could hold (at least the
    // kernel's oldest bucket).
    let window = Duration::from_nanos(rule.bucket_ns * u64::from(rule.buckets));
    let bucket = rule.bucket_ns as u128;
    let start = sent_start;
    let bucket_of = |t: Duration| (start + t).as_nanos() / bucket;
    let mut refusals = 0;
    for (i, &(before, after, _)) in sent.iter().enumerate().filter(|(_, s)| !s.2) {
        refusals += 1;
        // The admissions sent before this frame.
        let passed: Vec<(Duration, Duration)> = sent[..i]
            .iter()
            .filter(|s| s.2)
            .map(|s| (s.0, s.1))
            .collect();
        let held = passed
            .iter()
            .filter(|&&(_, p_after)| start + p_after > (start + before).saturating_sub(window))
            .count() as u64;
        let oldest = (start + before).saturating_sub(window).as_nanos() / bucket
            ..=(start + after).saturating_sub(window).as_nanos() / bucket;
        let c = oldest
            .map(|b| {
                passed
                    .iter()
                    .filter(|&&(p, p_after)| bucket_of(p) <= b && b <= bucket_of(p_after))
                    .count() as u64
            })
            .max()
            .unwrap_or(0);
        let t = before;
        assert!(
            held + c >= allowance,
            "refused at {t:?} with {held} admitted in the window before it and {c} in its \
             oldest bucket: room for {}; offered {offered:?}, admitted {admitted:?}",
            allowance - held - c
        );
    }
    assert!(
        refusals > 0,
        "the sender never went over its limit: {offered:?}"
    );
}

/// A source whose window exists but which has been silent for two epochs
/// reads nothing in the sketch: its next frame goes the cheap way again,
/// and a burst then gets its allowance and that cheap frame, as the first
/// did: what the cheap tier admits is what a source gets beyond its
/// allowance, once in every window a silence comes before.
#[test]
fn a_source_back_from_silence_gets_its_cheap_frames_again_and_no_more() {
    let mut harness = harness();
    let rule = harness.first_rule(SMALL_RULE);
    let once = rule.allowance_packets + u64::from(rule.cheap_frames);
    let frame = udp4(Ipv4Addr::new(198, 51, 100, 3));
    at_epoch_start();
    assert_eq!(burst(&mut harness, 0, &frame, 3 * once), once);
    assert!(
        !harness.traffic().is_empty(),
        "refused: the source has per-CPU state"
    );
    wait_epochs(2);
    at_epoch_start();
    let before = harness.outcome_total(Outcome::Cheap).packets;
    assert_eq!(
        burst(&mut harness, 0, &frame, 3 * once),
        once,
        "back from silence"
    );
    assert_eq!(
        harness.outcome_total(Outcome::Cheap).packets - before,
        u64::from(rule.cheap_frames),
        "its first frame went the cheap way again"
    );
}

/// A blocked source (10 pps, blocked for a minute) is refused every frame
/// while a spoofed flood runs on both CPUs; after a silence long enough to
/// leave the sketch (where nothing says it sent anything), its cheap
/// frame goes the cheap way, as any source's would, and every frame after
/// it is refused, on the CPU that blocked it and on the other.
#[test]
fn a_blocked_source_stays_blocked_through_a_spoofed_flood_and_a_silence() {
    let mut harness = harness();
    let allowance = harness.first_rule(PENALTY_RULE).allowance_packets;
    let cheap = u64::from(harness.first_rule(PENALTY_RULE).cheap_frames);
    let frame = udp4(Ipv4Addr::new(203, 0, 113, 9));
    assert_eq!(
        harness.offer(0, &frame, allowance + cheap + 1),
        (allowance + cheap, 1)
    );
    let key = SourceKey::v4([203, 0, 113, 9]).with_class(harness.first_rule(PENALTY_RULE).budget);
    let blocked_until = read::windows(harness.maps()).expect("read WINDOWS")[&key].blocked_until_ns;
    assert!(blocked_until > 0, "a penalty was armed");

    // The flood, in chunks on alternating CPUs; after each, a frame of the
    // blocked source on the same CPU.
    let n = flood_sources();
    let mut refused = 0;
    for (k, first) in (0..n).step_by(2_000).enumerate() {
        let cpu = k % 2;
        let program = harness.program();
        on_cpu(cpu, || spray(program, first..(first + 2_000).min(n)));
        assert_eq!(
            harness.offer(cpu, &frame, 1),
            (0, 1),
            "chunk {k}, CPU {cpu}"
        );
        refused += 1;
    }
    assert!(refused > 0);

    // Silent for two epochs: the sketch has forgotten it.
    wait_epochs(2);
    let passed: u64 = [0, 1]
        .iter()
        .map(|&cpu| harness.offer(cpu, &frame, 2 * allowance).0)
        .sum();
    assert_eq!(
        passed, cheap,
        "its cheap frame, then every frame of a blocked source dropped"
    );
    assert_eq!(
        read::windows(harness.maps()).expect("read WINDOWS")[&key].blocked_until_ns,
        blocked_until,
        "the same penalty"
    );
}

/// A cluster-scoped source gets its cold cap from its window (a source
/// without a share on this node) and this node's part of its cheap frames
/// on top (divided by the nodes alive, as the cold cap is: what all nodes
/// admit uncounted adds up to the rule's cheap frames): a burst at the
/// start of an epoch is admitted that, and the window, which the cluster
/// sync reads, counts the cold cap.
#[test]
fn a_cluster_source_gets_its_cold_cap_and_its_cheap_frames() {
    let mut harness = harness();
    let index = CLUSTER_KIND as u32 + 1;
    let shared = harness.first_rule(index);
    assert_eq!(shared.scope(), Some(Scope::Cluster));
    // Two nodes alive.
    let cold_cap = shared.allowance_packets / 2;
    let cheap = u64::from(shared.cheap_frames) / 2;
    assert!(cheap >= 1);
    let frame = udp4(Ipv4Addr::new(14, 200, 0, 1));
    let epoch = at_epoch_start();
    let cheap_before = harness.outcome_total(Outcome::Cheap).packets;
    let passed = burst(&mut harness, 0, &frame, 2 * shared.allowance_packets);
    assert_eq!(
        coarse_now().as_nanos() as u64 / sketch::EPOCH_NS,
        epoch,
        "the burst crossed an epoch: the machine stalled for most of a second"
    );
    assert_eq!(
        passed,
        cold_cap + cheap,
        "the cold cap and the cheap frames"
    );
    assert_eq!(
        harness.outcome_total(Outcome::Cheap).packets - cheap_before,
        cheap,
        "the cheap frames in the cheap tier"
    );
    let key = SourceKey::v4([14, 200, 0, 1]).with_class(shared.budget);
    let counted: u64 = read::windows(harness.maps()).expect("read WINDOWS")[&key]
        .slots
        .iter()
        .map(|s| s[0] & MAX_PACKETS)
        .sum();
    assert_eq!(counted, cold_cap, "the window counts what it admitted");
}
