//! Kernel tests of limits at several levels (`rules::level`) through
//! BPF_PROG_TEST_RUN, with the tiers off and on: a /24 aggregate admits
//! exactly its allowance while each of its 256 sources stays under its own
//! limit, on both CPUs at once; a whole-rule aggregate holds a spoofed
//! flood of 10,000 sources; two windows over one source each hold, and a
//! frame the short one refuses does not use up the long one; a light
//! source inside a /24 that four heavy ones exhaust keeps its frames; a
//! destination level holds a flood from 10,000 sources toward one
//! address; a pair level gives each client a budget per service address.
//!
//! Windows are long (10 s) where the test offers its frames as fast as it
//! can, so that a slow machine (the kernel lane's software-emulated guest)
//! still offers them all within one window.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    thread,
    time::Duration,
};

use limiter_common::{rules::MAX_LEVELS, Outcome};
use limiter_tests::{
    flood::udp4,
    net, packets,
    testrun::{on_cpu, online_cpus, paced, Harness, Pacing, Start, XDP_DROP, XDP_PASS},
};
use limiter_user::{
    kernel::read,
    rules::{LevelSpec, RuleSet, RuleSpec},
};

/// A rule set whose default is a limit of `pps` over `window` per source
/// with `levels`.
fn with_levels(pps: u64, window: Duration, levels: &[&str], tiered: bool) -> RuleSet {
    let mut default = RuleSpec::limit(net("0.0.0.0/0"), pps);
    default.limits.window = window;
    default.levels = levels
        .iter()
        .map(|text| text.parse::<LevelSpec>().expect("a level"))
        .collect();
    RuleSet {
        tiered,
        ..RuleSet::with_default(default)
    }
}

fn harness(set: &RuleSet) -> Harness {
    let mut harness = Harness::load();
    assert_eq!(harness.push(set), 1, "first generation");
    harness
}

/// Frames of the default rule (the first generation's index 0) refused by
/// its level `level`.
fn level_drops(harness: &Harness, level: usize) -> u64 {
    let drops = read::level_drops(harness.maps()).expect("read LEVEL_DROPS");
    drops[limiter_common::rules::rules_base(1) as usize * MAX_LEVELS + level]
}

fn rule_drops(harness: &Harness) -> u64 {
    read::rule_drops(harness.maps()).expect("read RULE_DROPS")
        [limiter_common::rules::rules_base(1) as usize]
}

/// Sends `frames` in order on `cpu`; the verdict of each.
fn send_all(harness: &mut Harness, cpu: usize, frames: &[Vec<u8>]) -> Vec<u32> {
    harness.run_all(cpu, frames)
}

#[test]
fn a_24_aggregate_admits_exactly_its_allowance_while_each_of_256_sources_stays_under_its_own() {
    assert!(online_cpus() >= 2, "this test needs two CPUs");
    for tiered in [false, true] {
        // Each source: 20 pps over 10 s (200 a window), offered 8; the /24:
        // 50 pps over 10 s (500 a window), offered 256 x 8 = 2048.
        let set = with_levels(20, Duration::from_secs(10), &["prefix/24:50"], tiered);
        let mut harness = harness(&set);
        let rule = harness.first_rule(0);
        assert_eq!(rule.levels()[0].allowance_packets, 500);
        let sources: Vec<Vec<u8>> = (0..=255u8)
            .map(|i| udp4(Ipv4Addr::new(10, 1, 2, i)))
            .collect();
        let program = harness.program();
        // Both CPUs at once, each every source four times, in turn.
        let passed: Vec<Vec<u64>> = thread::scope(|scope| {
            let senders: Vec<_> = [0usize, 1]
                .into_iter()
                .map(|cpu| {
                    let sources = &sources;
                    scope.spawn(move || {
                        on_cpu(cpu, || {
                            let mut passed = vec![0u64; sources.len()];
                            for _ in 0..4 {
                                for (i, frame) in sources.iter().enumerate() {
                                    match limiter_tests::testrun::verdict(program, frame) {
                                        XDP_PASS => passed[i] += 1,
                                        XDP_DROP => {}
                                        other => panic!("verdict {other}"),
                                    }
                                }
                            }
                            passed
                        })
                    })
                })
                .collect();
            senders.into_iter().map(|s| s.join().unwrap()).collect()
        });
        let per_source: Vec<u64> = (0..256).map(|i| passed[0][i] + passed[1][i]).collect();
        let admitted: u64 = per_source.iter().sum();
        let offered = 2 * 4 * 256;
        assert!(
            (495..=500).contains(&admitted),
            "tiered {tiered}: the /24 admitted {admitted} of {offered}, its allowance 500 (+-1%)"
        );
        assert!(
            per_source.iter().all(|&n| n <= 8),
            "tiered {tiered}: {per_source:?}"
        );
        // Every refusal is the aggregate's, counted once, under its level.
        let refused = offered - admitted;
        assert_eq!(level_drops(&harness, 0), refused, "tiered {tiered}");
        assert_eq!(rule_drops(&harness), refused, "tiered {tiered}");
        assert_eq!(
            harness.outcome_total(Outcome::DroppedLimit).packets,
            refused,
            "tiered {tiered}"
        );
        // Another /24 has its own aggregate.
        let other = udp4(Ipv4Addr::new(10, 1, 3, 1));
        assert_eq!(harness.run_on_cpu(0, &other), XDP_PASS, "tiered {tiered}");
    }
}

#[test]
fn a_whole_rule_aggregate_holds_a_spoofed_flood_of_10000_sources_at_its_limit() {
    for tiered in [true, false] {
        // 10,000 sources, one frame each, each far under its own limit; the
        // rule as a whole: 100 pps over 10 s.
        let set = with_levels(1000, Duration::from_secs(10), &["rule:100"], tiered);
        let mut harness = harness(&set);
        let frames: Vec<Vec<u8>> = (0..10_000u32)
            .map(|i| udp4(Ipv4Addr::from(0x0a00_0000 | i)))
            .collect();
        let verdicts = send_all(&mut harness, 0, &frames);
        let admitted = verdicts.iter().filter(|&&v| v == XDP_PASS).count() as u64;
        assert!(
            (990..=1000).contains(&admitted),
            "tiered {tiered}: {admitted} admitted, the rule's allowance 1000 (+-1%)"
        );
        assert_eq!(level_drops(&harness, 0), 10_000 - admitted);
    }
}

/// Per-source: 100 pps over 2 s (200 a window) and a second window of 150
/// over 1 s, or the other way round. Offered at 1,000 pps for 4 s: the
/// first second admits the short window's 150, the first two seconds the
/// long window's 200 (the frames one window refused did not use up the
/// other), and no
/// window of either length admits more than the sliding window's
/// documented bound: its allowance plus what it admitted in the oldest
/// bucket its last frame's estimate half covered, plus the cheap frames
/// (docs/architecture.md, "Window arithmetic" and "The bounds").
#[test]
fn two_windows_on_one_source_each_hold() {
    // The rule's own window the long one, then the short one (a frame the
    // own window refuses after the level admitted it is given back).
    let configurations = [
        (100, Duration::from_secs(2), "source:150@1s"),
        (150, Duration::from_secs(1), "source:100@2s"),
    ];
    for (tiered, (pps, window, level)) in [false, true]
        .into_iter()
        .flat_map(|tiered| configurations.map(|c| (tiered, c)))
    {
        let set = with_levels(pps, window, &[level], tiered);
        let tiered = format!("{tiered} ({pps} pps over {window:?}, {level})");
        let mut harness = harness(&set);
        // The cheap tier's frames, never counted by the source's own
        // window nor its per-source levels, in each pair of epochs a
        // window of each length overlaps (docs/architecture.md, "The
        // bounds"): 0 with the tiers off.
        let cheap = u64::from(harness.first_rule(0).cheap_frames);
        let (short_cheap, long_cheap) = (cheap, cheap * 2);
        let frame = udp4(Ipv4Addr::new(192, 0, 2, 77));
        let start = Start::now();
        let run = paced(
            harness.program(),
            0,
            &frame,
            1000,
            start,
            Duration::from_secs(4),
            Pacing::CatchUp,
        );
        assert!(
            run.offered >= 3000,
            "tiered {tiered}: offered {}",
            run.offered
        );
        let within = |from: Duration, len: Duration| {
            run.passed_at
                .iter()
                .filter(|&&at| at >= from && at < from + len)
                .count() as u64
        };
        // The most frames `[from, from + len)` may hold: the window of
        // `len` (10 buckets on the kernel's clock) admitted its last frame
        // `t` there with at most `allowance` in `(t - len, t]` by its
        // estimate, which misses only part of the bucket holding `t - len`
        // (docs/architecture.md, "Window arithmetic"): the allowance, what
        // that bucket admitted, and the cheap frames no window counts.
        let bound = |from: Duration, len: Duration, allowance: u64, cheap: u64| {
            let bucket = len.as_nanos() / 10;
            let of = |t: Duration| (start.coarse + t).as_nanos() / bucket;
            let last = run.passed_at.iter().rev().find(|&&t| t < from + len);
            let oldest = last
                .and_then(|&t| (start.coarse + t).checked_sub(len))
                .map(|t| t.as_nanos() / bucket);
            let in_oldest = run
                .passed_at
                .iter()
                .filter(|&&t| Some(of(t)) == oldest)
                .count() as u64;
            allowance + in_oldest + cheap
        };
        let second = Duration::from_secs(1);
        let first_second = within(Duration::ZERO, second);
        let first_two = within(Duration::ZERO, 2 * second);
        assert!(
            (148..=151 + short_cheap).contains(&first_second),
            "tiered {tiered}: {first_second} in the first second (the 1 s window: 150, and \
             {short_cheap} cheap frames at most)"
        );
        assert!(
            (198..=202 + long_cheap).contains(&first_two),
            "tiered {tiered}: {first_two} in the first two seconds (the 2 s window: 200, and \
             {long_cheap} cheap frames at most)"
        );
        // Every window of each length starting at an admitted frame.
        for &at in &run.passed_at {
            let short = within(at, second);
            let long = within(at, 2 * second);
            let short_bound = bound(at, second, 150, short_cheap);
            let long_bound = bound(at, 2 * second, 200, long_cheap);
            assert!(
                short <= short_bound,
                "tiered {tiered}: {short} in the 1 s from {at:?} (bound {short_bound})"
            );
            assert!(
                long <= long_bound,
                "tiered {tiered}: {long} in the 2 s from {at:?} (bound {long_bound})"
            );
        }
    }
}

/// Room for this many windows and aggregates in the churn tests.
const CAPACITY: u32 = 4_096;

/// A harness whose kept maps hold [`CAPACITY`], with `set` pushed.
fn small_harness(set: &RuleSet) -> Harness {
    let mut harness = Harness::load_with(&limiter_user::kernel::LoadOptions {
        max_sources: CAPACITY,
        ..Default::default()
    });
    assert_eq!(harness.push(set), 1);
    harness
}

/// 600 frames of six sources of 10.7.7.0/24, in turn.
fn the_24s_frames() -> Vec<Vec<u8>> {
    let sources: Vec<Vec<u8>> = (1..=6u8)
        .map(|i| udp4(Ipv4Addr::new(10, 7, 7, i)))
        .collect();
    (0..600).map(|i| sources[i % 6].clone()).collect()
}

/// One frame from each /24 `11.x.y.0` numbered in `range`, on `cpu`.
fn churn_24s(harness: &mut Harness, cpu: usize, range: std::ops::Range<u32>) {
    let program = harness.program();
    on_cpu(cpu, || {
        limiter_tests::flood::spray_from(program, range, |i| {
            std::net::IpAddr::V4(Ipv4Addr::from(0x0b00_0001 | (i << 8)))
        })
    });
}

/// Frames of `frames` admitted on `cpu`.
fn admitted_of(harness: &mut Harness, cpu: usize, frames: &[Vec<u8>]) -> u64 {
    send_all(harness, cpu, frames)
        .iter()
        .filter(|v| **v == XDP_PASS)
        .count() as u64
}

/// A /24 aggregate of 500 frames per 10 s (`prefix/24:50` over a 10 s
/// window) sends 600 frames, then four times as many other /24s as the
/// aggregates' map holds send one frame each (a churn), then the /24 sends
/// 600 again, four rounds within its window: it is admitted its
/// allowance once (less the reserve: its six sources are heavy), nothing
/// after. Aggregates are kept until idle, never evicted: the
/// churn's /24s past the map's room are judged on overflow cells
/// (`aggregate_full`). (With the aggregates in an LRU map, the /24 came
/// back with a fresh allowance every round: 438 a round, 1,752 in all.)
#[test]
fn a_24_gets_its_allowance_once_through_churns_of_other_24s() {
    for tiered in [true, false] {
        let set = with_levels(1_000, Duration::from_secs(10), &["prefix/24:50"], tiered);
        let mut harness = small_harness(&set);
        let frames = the_24s_frames();
        let started = limiter_tests::testrun::coarse_now();
        let mut admitted = Vec::new();
        for round in 0..4u32 {
            let cpu = round as usize % 2;
            admitted.push(admitted_of(&mut harness, cpu, &frames));
            // One frame from each of 4 x CAPACITY other /24s.
            let churn = 4 * CAPACITY;
            churn_24s(&mut harness, cpu, round * churn..(round + 1) * churn);
        }
        assert!(
            limiter_tests::testrun::coarse_now() < started + Duration::from_secs(10),
            "the rounds outlasted the /24's window"
        );
        // Heavy sources of their /24 (each over its 32nd), they get the
        // /24's allowance less its reserve for light sources, once.
        let heavy = harness.first_rule(0).levels()[0].heavy_allowance_packets;
        assert_eq!(heavy, 438);
        assert_eq!(
            admitted,
            [heavy, 0, 0, 0],
            "tiered {tiered}: admitted per round"
        );
        assert!(
            harness.outcome_total(Outcome::AggregateFull).packets > 0,
            "tiered {tiered}: the churn filled the aggregates' map, counted"
        );
    }
}

/// An aggregate judged on its overflow cell while `AGGREGATES` was full
/// keeps what it was admitted there when it gets a window of its own,
/// however long after the map had room again: a /24 of 500 per 10 s sends
/// 600 frames while a churn of /24s under another rule (whose level
/// window is 100 ms) fills the map, is silent while the daemon reclaims
/// the churn and for 3 s more, then sends 600 again within its window:
/// 500 in all (when the kernel remembered a full map for two epochs only,
/// the /24 got its 438 again: 876 against 500).
#[test]
fn an_aggregate_judged_on_its_cell_gets_nothing_more_once_the_map_has_room() {
    let mut set = with_levels(1_000, Duration::from_secs(10), &["prefix/24:50"], true);
    let mut churn_rule = RuleSpec::limit(net("11.0.0.0/8"), 1_000);
    churn_rule.levels = vec!["prefix/24:1000@100ms".parse().expect("a level")];
    set.rules.push(churn_rule);
    let mut harness = small_harness(&set);
    let frames = the_24s_frames();
    let started = limiter_tests::testrun::coarse_now();
    churn_24s(&mut harness, 0, 0..2 * CAPACITY);
    let mut admitted = vec![admitted_of(&mut harness, 0, &frames)];
    assert!(
        harness.outcome_total(Outcome::AggregateFull).packets > 0,
        "the /24 was judged on its cell"
    );
    // The daemon reclaims the churn's aggregates once idle (16 buckets of
    // 10 ms), leaving room.
    let mut reclaim = limiter_user::kernel::windows::Reclaim::default();
    let reclaimed =
        limiter_tests::wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
            let now = limiter_user::kernel::now().as_nanos() as u64;
            while !reclaim
                .step(harness.maps_mut(), now, CAPACITY as usize, &mut Vec::new())
                .expect("reading the kept maps")
                .pass_done
            {}
            (reclaim.aggregates.deleted_total >= u64::from(CAPACITY) / 2).then_some(())
        });
    assert!(reclaimed.is_some(), "the churn's aggregates were reclaimed");
    // The /24's silence: 3 s of the kernel's clock, past any memory of
    // the full map shorter than the level's window.
    let back = limiter_tests::testrun::coarse_now() + Duration::from_secs(3);
    while limiter_tests::testrun::coarse_now() < back {
        thread::sleep(Duration::from_millis(50));
    }
    admitted.push(admitted_of(&mut harness, 1, &frames));
    assert!(
        limiter_tests::testrun::coarse_now() < started + Duration::from_secs(10),
        "the rounds outlasted the /24's window"
    );
    // Heavy sources of their /24, they get its allowance less the reserve
    // in the first round; back after a silence, their cheap frames count
    // as light ones', which the reserve may admit: the /24's allowance in
    // all, never more.
    let heavy = harness.first_rule(0).levels()[0].heavy_allowance_packets;
    assert_eq!(admitted[0], heavy, "admitted per round: {admitted:?}");
    assert!(
        admitted.iter().sum::<u64>() <= 500,
        "admitted per round: {admitted:?}, against 500 per 10 s"
    );
    assert!(
        harness.outcome_total(Outcome::FullSeeded).packets > 0,
        "the /24's aggregate started with its cell's counts"
    );
}

/// Sixteen sources of one /24, 150 frames each, none of them ever refused,
/// near its limit or busy (so none has per-CPU state: they are judged in
/// the exact tier, on their windows alone), exhaust their /24 while a
/// light source sends 10 frames among them: the heavy ones are heavy as
/// their windows say (over the fair share, a 32nd of the /24), so the
/// reserve keeps the light source's frames (when a source without
/// per-CPU state was always light, or with a fair share of a 16th, the
/// sixteen took 996 of the /24's 1,000 and the light source kept 4 of its
/// 10).
#[test]
fn heavy_sources_without_per_cpu_state_leave_the_reserve_to_a_light_one() {
    // Per source 500 pps (150 is under half of it); the /24 1,000 a second.
    let set = with_levels(500, Duration::from_secs(1), &["prefix/24:1000"], true);
    let mut harness = harness(&set);
    let heavy: Vec<Vec<u8>> = (1..=16u8)
        .map(|i| udp4(Ipv4Addr::new(10, 9, 8, i)))
        .collect();
    let light = udp4(Ipv4Addr::new(10, 9, 8, 200));
    let mut frames = Vec::new();
    for round in 0..150 {
        for frame in &heavy {
            frames.push(frame.clone());
        }
        if round % 15 == 14 {
            frames.push(light.clone());
        }
    }
    let epoch = limiter_tests::flood::at_epoch_start();
    let verdicts = send_all(&mut harness, 0, &frames);
    limiter_tests::flood::assert_same_epoch(epoch);
    assert!(
        harness.traffic().is_empty(),
        "no source got per-CPU state: all judged in the cheap and exact tiers"
    );
    let (mut light_passed, mut heavy_passed) = (0, 0);
    for (frame, verdict) in frames.iter().zip(&verdicts) {
        let passed = u64::from(*verdict == XDP_PASS);
        if *frame == light {
            light_passed += passed;
        } else {
            heavy_passed += passed;
        }
    }
    assert!(
        light_passed >= 9,
        "the light source kept {light_passed} of 10; the heavy ones {heavy_passed} of 2400"
    );
    assert!(
        heavy_passed <= 875,
        "the heavy ones got {heavy_passed}: past 7/8 of the /24"
    );
}

/// Four heavy sources exhaust their /24 (each offered about its own limit,
/// 2.4 times the aggregate together) while a light source of the same /24
/// sends 1 % of the aggregate's allowance among them: the light source
/// keeps at least 90 % of its frames (without the fairness reserve, it
/// would lose every frame sent after the aggregate filled: most of them).
#[test]
fn a_light_source_keeps_its_frames_inside_a_24_that_four_heavy_ones_exhaust() {
    for tiered in [false, true] {
        // Per source 100 pps over 10 s (1,000 a window); the /24 as much.
        let set = with_levels(100, Duration::from_secs(10), &["prefix/24:100"], tiered);
        let mut harness = harness(&set);
        let heavy: Vec<Vec<u8>> = (1..=4u8)
            .map(|i| udp4(Ipv4Addr::new(10, 9, 9, i)))
            .collect();
        let light = udp4(Ipv4Addr::new(10, 9, 9, 200));
        // 2,400 heavy frames in turn, and a light one after every 240.
        let mut frames = Vec::new();
        for i in 0..2400 {
            frames.push(heavy[i % 4].clone());
            if i % 240 == 239 {
                frames.push(light.clone());
            }
        }
        let verdicts = send_all(&mut harness, 0, &frames);
        let (mut light_sent, mut light_passed, mut heavy_passed) = (0, 0, 0);
        for (frame, verdict) in frames.iter().zip(&verdicts) {
            let passed = *verdict == XDP_PASS;
            if *frame == light {
                light_sent += 1;
                light_passed += u64::from(passed);
            } else {
                heavy_passed += u64::from(passed);
            }
        }
        assert_eq!(light_sent, 10);
        assert!(
            light_passed >= 9,
            "tiered {tiered}: the light source kept {light_passed} of {light_sent}; the heavy \
             ones {heavy_passed} of 2400"
        );
        assert!(
            heavy_passed <= 1000,
            "tiered {tiered}: the heavy sources got {heavy_passed}, over the aggregate's 1000"
        );
        assert!(
            heavy_passed >= 800,
            "tiered {tiered}: the heavy sources got only {heavy_passed}"
        );
    }
}

/// A destination-keyed level: 10,000 sources (one frame each, far under
/// their own limit) toward one address share its budget, held at its
/// allowance; a frame toward another address has a budget of its own.
#[test]
fn a_destination_level_holds_a_flood_from_10000_sources_toward_one_address() {
    for tiered in [true, false] {
        let set = with_levels(1000, Duration::from_secs(10), &["destination:100"], tiered);
        let mut harness = harness(&set);
        let server = Ipv4Addr::new(192, 0, 2, 80);
        let frames: Vec<Vec<u8>> = (0..10_000u32)
            .map(|i| packets::udp_v4(Ipv4Addr::from(0x0a00_0000 | i), server, 53, 18))
            .collect();
        let verdicts = send_all(&mut harness, 0, &frames);
        let admitted = verdicts.iter().filter(|&&v| v == XDP_PASS).count() as u64;
        assert!(
            (990..=1000).contains(&admitted),
            "tiered {tiered}: {admitted} admitted toward {server}, its allowance 1000 (+-1%)"
        );
        assert_eq!(level_drops(&harness, 0), 10_000 - admitted);
        let elsewhere = packets::udp_v4(
            Ipv4Addr::new(10, 200, 0, 1),
            Ipv4Addr::new(192, 0, 2, 81),
            53,
            18,
        );
        assert_eq!(
            harness.run_on_cpu(0, &elsewhere),
            XDP_PASS,
            "tiered {tiered}"
        );
        // IPv6 toward one address too.
        let six = |i: u16| {
            packets::udp_v6(
                Ipv6Addr::new(0x2001, 0xdb8, i, 0, 0, 0, 0, 1),
                Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 80),
                53,
                18,
            )
        };
        let frames: Vec<Vec<u8>> = (0..2000u16).map(six).collect();
        let admitted = send_all(&mut harness, 1, &frames)
            .iter()
            .filter(|&&v| v == XDP_PASS)
            .count();
        assert_eq!(admitted, 1000, "tiered {tiered}: IPv6 toward one address");
    }
}

/// A pair level: each client's budget per service address, so one client
/// exhausting its budget toward one server keeps its budget toward
/// another, and another client keeps its own toward the first.
#[test]
fn a_pair_level_gives_each_client_a_budget_per_service_address() {
    let set = with_levels(1000, Duration::from_secs(10), &["pair:2"], false);
    let mut harness = harness(&set);
    let (a, b) = (Ipv4Addr::new(10, 7, 0, 1), Ipv4Addr::new(10, 7, 0, 2));
    let (x, y) = (Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2));
    let to = |src, dst| vec![packets::udp_v4(src, dst, 443, 18); 30];
    let passed = |harness: &mut Harness, frames: &[Vec<u8>]| {
        send_all(harness, 0, frames)
            .iter()
            .filter(|&&v| v == XDP_PASS)
            .count()
    };
    // 2 pps over 10 s: 20 per pair.
    assert_eq!(passed(&mut harness, &to(a, x)), 20, "a toward x");
    assert_eq!(passed(&mut harness, &to(a, y)), 20, "a toward y");
    assert_eq!(passed(&mut harness, &to(b, x)), 20, "b toward x");
}
