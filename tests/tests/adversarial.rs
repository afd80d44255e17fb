//! Adversarial kernel tests through BPF_PROG_TEST_RUN: each is an attack
//! on a real source's limit through the state the program keeps, and
//! asserts the bound docs/architecture.md states under an adversary ("The
//! bounds"): a source is admitted at most its allowance plus the cheap
//! tier's error in any window, whatever a flood does to the maps.
//!
//! - A churn of spoofed sources through the window map, on one CPU and
//!   across both, does not give a source its allowance again; nor does an
//!   IPv6 /48 holder churning its own /64s.
//! - A blocked source whose window the daemon reclaims comes back blocked;
//!   with `HOLDS` full its penalty lives in its window, which no churn
//!   frees.
//! - Frames spread over the traffic classes one rule judges get the
//!   rule's cheap frames once, not once per class.
//! - A flood of refused sources does not starve the cluster's hot
//!   reports, and a report dropped for lack of budget is sent again.
//! - A flood that fills the kept windows is seen: sources without a window
//!   are refused, and counted.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    thread,
    time::Duration,
};

use limiter_common::{
    tickets::{Rooms, SHARED},
    ClusterShare, ClusterState, EventKind, LimitEvent, Outcome, Rule, SourceKey,
};
use limiter_tests::{
    flood::{assert_same_epoch, at_epoch_start, spoofed, spray, spray_from, udp, udp4, udp6},
    net,
    packets::{self, DST4},
    testrun::{coarse_now, on_cpu, online_cpus, verdict, Harness, XDP_PASS},
    wait_until,
};
use limiter_user::{
    kernel::{self, cluster, read, windows::Reclaim, LoadOptions},
    rules::{Match, RuleSet, RuleSpec, PROTO_TCP},
};

/// The window map's capacity in these tests: small, so that a churn of
/// four times as many sources runs in a fraction of a second.
const CAPACITY: u32 = 4_096;
/// The churn: four times the capacity.
const CHURN: u32 = 4 * CAPACITY;
/// The rule under attack: 60 frames a minute (no cheap frames: 1% of 60
/// rounds to none), as one guarding SSH.
const GUARDED_NET: &str = "192.0.2.0/24";
const GUARDED: u64 = 60;
const MINUTE: Duration = Duration::from_secs(60);

/// A limit of `pps` over `window` for `cidr` (an allowance of `pps`
/// times the window's seconds).
fn limit_over(cidr: &str, pps: u64, window: Duration) -> RuleSpec {
    let mut rule = RuleSpec::limit(net(cidr), pps);
    rule.limits.window = window;
    rule
}

/// Churn rules (4 pps over 2 s, no cheap frames: every spoofed frame
/// takes a window) on the spoofed sources' prefixes, the guarded rule, and
/// `more`; tiered; loaded with [`CAPACITY`] windows.
fn churn_harness(more: Vec<RuleSpec>) -> Harness {
    let two_seconds = Duration::from_secs(2);
    let mut rules = vec![
        limit_over("10.0.0.0/8", 4, two_seconds),
        limit_over("2001:db8::/32", 4, two_seconds),
        limit_over(GUARDED_NET, 1, MINUTE),
    ];
    rules.extend(more);
    let set = RuleSet {
        rules,
        tiered: true,
        ..RuleSet::with_default(RuleSpec::limit(net("0.0.0.0/0"), 1_000))
    };
    let mut harness = Harness::load_with(&LoadOptions {
        max_sources: CAPACITY,
        ..LoadOptions::default()
    });
    assert_eq!(harness.push(&set), 1, "first generation");
    for i in 1..=3 {
        assert_eq!(
            harness.first_rule(i).cheap_frames,
            0,
            "rule {i}: no cheap frames"
        );
    }
    assert_eq!(harness.first_rule(3).allowance_packets, GUARDED);
    harness
}

/// The most a source of `rule` may be admitted in one window beyond its
/// allowance: the cheap tier's uncounted frames.
fn cheap_error(rule: &Rule) -> u64 {
    rule.cheap_bound()
}

/// `n` frames of `frame`, spread over `cpus` in turn; how many passed.
fn offer_over(harness: &mut Harness, cpus: &[usize], frame: &[u8], n: u64) -> u64 {
    let share = n / cpus.len() as u64;
    cpus.iter()
        .map(|&cpu| harness.offer(cpu, frame, share).0)
        .sum()
}

/// The churn of [`CHURN`] spoofed sources in chunks of the capacity,
/// alternating over `cpus`.
fn churn(harness: &mut Harness, cpus: &[usize], source: impl Fn(u32) -> IpAddr + Sync + Copy) {
    for (k, first) in (0..CHURN).step_by(CAPACITY as usize).enumerate() {
        let cpu = cpus[k % cpus.len()];
        let program = harness.program();
        on_cpu(cpu, || spray_from(program, first..first + CAPACITY, source));
    }
}

/// The source sends its allowance, a churn runs through the window map,
/// then the source sends its allowance, then twice it, within the same
/// minute: nothing more is admitted than the cheap tier's error (none).
fn a_churn_gives_no_fresh_allowance(cpus: &[usize]) {
    let mut harness = churn_harness(vec![]);
    let rule = harness.first_rule(3);
    let since = coarse_now();
    let frame = udp4(Ipv4Addr::new(192, 0, 2, 1));
    assert_eq!(offer_over(&mut harness, cpus, &frame, GUARDED), GUARDED);
    churn(&mut harness, cpus, spoofed);
    assert!(
        harness.outcome_total(Outcome::WindowFull).packets > 0,
        "the churn went through the window map and filled it"
    );
    let again = offer_over(&mut harness, cpus, &frame, GUARDED);
    let twice = offer_over(&mut harness, cpus, &frame, 2 * GUARDED);
    assert!(
        coarse_now() < since + Duration::from_secs(60),
        "the test outlasted the source's window"
    );
    assert!(
        again + twice <= cheap_error(&rule),
        "CPUs {cpus:?}: after the churn, {again} then {twice} more admitted; at most {} allowed",
        cheap_error(&rule)
    );
}

#[test]
fn a_spoofed_churn_on_one_cpu_gives_a_source_no_fresh_allowance() {
    a_churn_gives_no_fresh_allowance(&[0]);
}

#[test]
fn a_spoofed_churn_across_both_cpus_gives_a_source_no_fresh_allowance() {
    assert!(online_cpus() >= 2, "this test needs two CPUs");
    a_churn_gives_no_fresh_allowance(&[0, 1]);
}

/// The holder of 2001:db8:1::/48 owns 65,536 /64s (each a source of its
/// own): it churns the window map with its own real addresses, no
/// spoofing needed, and its main /64 gets nothing more.
#[test]
fn an_ipv6_48_holder_churning_its_own_64s_gets_no_fresh_allowance() {
    let holder = "2001:db8:1::/48";
    let mut harness = churn_harness(vec![limit_over(holder, 1, MINUTE)]);
    let rule = harness.first_rule(4);
    assert_eq!(rule.cheap_frames, 0);
    let own = |i: u32| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, (i + 1) as u16, 0, 0, 0, 1));
    let main = udp6(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1));
    assert_eq!(harness.offer(0, &main, GUARDED), (GUARDED, 0));
    // Its other /64s, one frame each (under the same limit each: all pass).
    // Those past the kept windows' room are refused (the refusing side),
    // counted.
    let program = harness.program();
    let own_frames = u64::from(CHURN.min(65_535));
    let passed = on_cpu(0, || spray_from(program, 0..CHURN.min(65_535), own));
    assert_eq!(
        own_frames - passed.packets,
        harness.outcome_total(Outcome::WindowFull).packets,
        "every refusal of its own /64s is one for want of a window"
    );
    assert_eq!(
        harness.offer(0, &main, 2 * GUARDED).0,
        cheap_error(&rule),
        "the main /64 after its own churn"
    );
}

/// Runs the daemon's reclaim over the kept maps until it has deleted at
/// least `windows` idle windows (at most 10 s, on the kernel's clock);
/// whether it did.
fn reclaim_until(harness: &mut Harness, reclaim: &mut Reclaim, windows: u64) -> bool {
    wait_until(Duration::from_secs(10), Duration::from_millis(200), || {
        let now = kernel::now().as_nanos() as u64;
        while !reclaim
            .step(harness.maps_mut(), now, CAPACITY as usize, &mut Vec::new())
            .expect("reading the kept maps")
            .pass_done
        {}
        (reclaim.windows.deleted_total >= windows).then_some(())
    })
    .is_some()
}

/// A blocked source's penalty outlives its window: the daemon reclaims the
/// window once it counts nothing (no need to keep it for the penalty's
/// hour), and the source comes back blocked (`HOLDS`). With `HOLDS` full
/// (a flood of blocked sources filled it), a penalty lives in its window
/// alone (counted as `hold_failed`), which no churn frees.
#[test]
fn a_penalty_outlives_its_window_and_holds_full_frees_no_blocked_source() {
    // The fillers: 1 frame a second each, blocked for an hour on their
    // second frame (a penalty each), in windows that count nothing a
    // couple of seconds later.
    let mut fillers = RuleSpec::limit(net("198.18.0.0/15"), 1);
    fillers.limits.block = Some(Duration::from_secs(3600));
    let mut blocked_rule = limit_over("203.0.113.0/24", 5, Duration::from_secs(2));
    blocked_rule.limits.block = Some(Duration::from_secs(3600));
    let mut harness = churn_harness(vec![fillers, blocked_rule]);
    // Blocked first, while HOLDS has room; then its window goes idle and is
    // reclaimed with the fillers'.
    let early = udp4(Ipv4Addr::new(203, 0, 113, 2));
    let early_key = SourceKey::v4([203, 0, 113, 2]);
    assert_eq!(harness.offer(0, &early, 11), (10, 1));
    // As many blocked fillers as HOLDS has room left: each takes a window
    // first, and their rule's rooms of tickets (its reserve and the
    // shared room) hold about half as many, so in rounds, their windows
    // reclaimed once idle between rounds (the penalties stay in HOLDS).
    let filler = |i: u32| IpAddr::V4(Ipv4Addr::from(0xc612_0000 | i));
    let mut reclaim = Reclaim::default();
    let (mut sprayed, mut held) = (0, 1);
    for round in 1.. {
        assert!(round <= 4, "HOLDS filled in rounds: {held} of {CAPACITY}");
        let fresh = sprayed..sprayed + (CAPACITY - held);
        sprayed = fresh.end;
        let program = harness.program();
        on_cpu(0, || {
            spray_from(program, fresh.clone(), filler);
            spray_from(program, fresh, filler)
        });
        held = harness.maps().holds.keys().count() as u32;
        assert!(
            reclaim_until(&mut harness, &mut reclaim, u64::from(held)),
            "the blocked sources' windows went idle and were deleted: {} of {held}",
            reclaim.windows.deleted_total
        );
        if held == CAPACITY {
            break;
        }
    }
    assert_eq!(harness.outcome_total(Outcome::HoldFailed).packets, 0);
    assert!(
        !read::windows(harness.maps())
            .expect("windows")
            .contains_key(&early_key),
        "its window was reclaimed"
    );
    assert_eq!(
        harness.offer(1, &early, 3),
        (0, 3),
        "blocked again on its new window (from HOLDS), on a CPU that never held it"
    );
    // Blocked now, with HOLDS full.
    let failed = harness.outcome_total(Outcome::HoldFailed).packets;
    let blocked = udp4(Ipv4Addr::new(203, 0, 113, 1));
    assert_eq!(harness.offer(0, &blocked, 11), (10, 1));
    assert_eq!(
        harness.outcome_total(Outcome::HoldFailed).packets,
        failed + 1,
        "its penalty could not be kept in HOLDS"
    );
    churn(&mut harness, &[0, 1], spoofed);
    assert_eq!(harness.offer(1, &blocked, 5), (0, 5), "still blocked");
}

/// With both `WINDOWS` and `HOLDS` full (blocked spoofed sources fill the
/// penalties, the daemon reclaims their idle windows, more fill the
/// windows again), a source refused under 60 per minute offers its
/// allowance five rounds running, a churn through the full windows between
/// rounds: it is admitted its 60 once (its window is kept: nothing evicts
/// it), nothing after. (With refusals kept in `HOLDS` and windows spilling
/// to an LRU map, it was admitted 60 every round.)
#[test]
fn a_refused_source_gets_nothing_more_with_windows_and_holds_full() {
    let mut fillers = RuleSpec::limit(net("198.18.0.0/15"), 1);
    fillers.limits.block = Some(Duration::from_secs(3600));
    let mut harness = churn_harness(vec![fillers]);
    let guarded = udp4(Ipv4Addr::new(192, 0, 2, 9));
    let mut admitted = vec![harness.offer(0, &guarded, GUARDED + 5).0];
    // Blocked fillers, two frames each (the second blocks), as many as
    // the penalties hold; their windows reclaimed once idle; as many
    // again: the penalties full, the windows full.
    let filler = |i: u32| IpAddr::V4(Ipv4Addr::from(0xc612_0000 | i));
    for round in 0..2u32 {
        let first = round * CAPACITY;
        let program = harness.program();
        on_cpu(0, || {
            spray_from(program, first..first + CAPACITY, filler);
            spray_from(program, first..first + CAPACITY, filler)
        });
        if round == 0 {
            let mut reclaim = Reclaim::default();
            assert!(reclaim_until(
                &mut harness,
                &mut reclaim,
                u64::from(CAPACITY) / 2
            ));
        }
    }
    assert!(
        harness.outcome_total(Outcome::HoldFailed).packets > 0,
        "HOLDS full"
    );
    let rooms = harness.maps().ticket_rooms().expect("rooms");
    assert_eq!(
        harness.maps().tickets_held().expect("accounts")[usize::from(SHARED)],
        rooms.shared,
        "the shared room full"
    );
    for _ in 0..4 {
        churn(&mut harness, &[0, 1], spoofed);
        admitted.push(offer_over(&mut harness, &[0, 1], &guarded, GUARDED));
    }
    assert!(harness.outcome_total(Outcome::WindowFull).packets > 0);
    assert_eq!(admitted, [GUARDED, 0, 0, 0, 0], "admitted per round");
}

/// A source spreading its frames over four traffic classes that one rule
/// judges (TCP to ports 22, 23, 25 and any other: classes because of deny
/// rules for another prefix) gets that rule's cheap frames once: at most
/// its allowance in a window of one epoch, not four times the cheap
/// frames.
#[test]
fn frames_spread_over_the_classes_of_one_rule_get_its_cheap_frames_once() {
    let tcp = |port| Match {
        protocol: Some(PROTO_TCP),
        ports: Some((port, port)),
        tcp_syn: false,
    };
    let mut rules: Vec<RuleSpec> = [22, 23, 25]
        .into_iter()
        .map(|port| RuleSpec {
            matches: tcp(port),
            ..RuleSpec::with_action(net("10.0.0.0/8"), limiter_common::Action::Deny)
        })
        .collect();
    rules.push(RuleSpec {
        matches: Match {
            protocol: Some(PROTO_TCP),
            ports: None,
            tcp_syn: false,
        },
        ..RuleSpec::limit(net("0.0.0.0/0"), 64)
    });
    let set = RuleSet {
        rules,
        tiered: true,
        ..RuleSet::with_default(RuleSpec::limit(net("0.0.0.0/0"), 1_000))
    };
    let mut harness = Harness::load();
    assert_eq!(harness.push(&set), 1);
    let rule = harness.first_rule(4);
    assert_eq!(rule.cheap_frames, 6, "a tenth of a 1 s limit is cheap");
    let source = Ipv4Addr::new(192, 0, 2, 7);
    let frames: Vec<Vec<u8>> = [22, 23, 25, 80]
        .map(|port| packets::tcp_v4(source, DST4, port, 0))
        .into();
    let epoch = at_epoch_start();
    let program = harness.program();
    let passed: u64 = on_cpu(0, || {
        (0..rule.allowance_packets)
            .flat_map(|_| frames.iter())
            .filter(|frame| verdict(program, frame) == XDP_PASS)
            .count() as u64
    });
    assert_same_epoch(epoch);
    let bound = rule.allowance_packets + rule.cheap_bound();
    assert!(
        passed <= bound,
        "{passed} admitted over four classes in one epoch; at most {bound}"
    );
}

/// The default rule made cluster-scoped (1000 frames per 10 s), a node
/// rule of 1 pps for 198.51.100.0/24 whose refused sources send "source
/// limited" events, and a fresh cluster state (50% reporting threshold).
fn cluster_harness() -> Harness {
    let set = RuleSet {
        rules: vec![RuleSpec::limit(net("198.51.100.0/24"), 1)],
        ..RuleSet::with_default(limit_over("0.0.0.0/0", 100, Duration::from_secs(10)))
    };
    let mut harness = Harness::load();
    assert_eq!(harness.push(&set), 1);
    harness.make_cluster_scoped(0);
    let now = kernel::now().as_nanos() as u64;
    let state = ClusterState::new(now, 600_000_000_000, 2, 2, 500);
    cluster::write_state(harness.maps_mut(), state).expect("writing CLUSTER");
    harness
}

/// Gives the cluster source `addr` a share of 20 frames for a minute: its
/// first frame is cheap (uncounted: the share mark is read from a source's
/// second frame on), so it is hot from its 11th frame of a window, the
/// 10th its window counts.
fn share_20(harness: &mut Harness, addr: Ipv4Addr) {
    let key = cluster::share_key(&SourceKey::v4(addr.octets()), &harness.first_rule(0));
    let share = ClusterShare {
        allowance_packets: 20,
        expires_ns: kernel::now().as_nanos() as u64 + 60_000_000_000,
    };
    cluster::write_share(harness.maps_mut(), &key, share).expect("writing CLUSTER_SHARES");
}

fn count_of(events: &[LimitEvent], kind: EventKind) -> usize {
    events.iter().filter(|e| e.kind() == Some(kind)).count()
}

/// Waits for the start of a second of the kernel's clock (the event
/// budgets restart every second), so that what follows runs in one.
fn at_second_start() -> u64 {
    at_epoch_start()
}

#[test]
fn a_flood_of_refused_sources_does_not_starve_the_clusters_hot_reports() {
    let mut harness = cluster_harness();
    let hot = Ipv4Addr::new(192, 0, 2, 11);
    share_20(&mut harness, hot);
    let second = at_second_start();
    // 100 sources refused on CPU 0 within the second: more "source
    // limited" events than a CPU sends a second.
    let program = harness.program();
    on_cpu(0, || {
        for i in 1..=100u8 {
            let frame = udp4(Ipv4Addr::new(198, 51, 100, i));
            verdict(program, &frame);
            verdict(program, &frame);
        }
    });
    assert!(harness.outcome_total(Outcome::EventDropped).packets > 0);
    // Then the cluster source crosses its threshold on the same CPU.
    assert_eq!(harness.offer(0, &udp4(hot), 11), (11, 0));
    assert_same_epoch(second);
    let events = harness.drain_events();
    assert_eq!(count_of(&events, EventKind::ClusterHot), 1, "{events:?}");
    assert_eq!(count_of(&events, EventKind::Limited), 64);
}

#[test]
fn a_hot_report_dropped_for_lack_of_budget_is_sent_again() {
    let mut harness = cluster_harness();
    let sources: Vec<Ipv4Addr> = (1..=65).map(|i| Ipv4Addr::new(192, 0, 2, i)).collect();
    for &source in &sources {
        share_20(&mut harness, source);
    }
    let second = at_second_start();
    let program = harness.program();
    let passed = on_cpu(0, || {
        sources
            .iter()
            .flat_map(|&source| std::iter::repeat_n(udp4(source), 11))
            .filter(|frame| verdict(program, frame) == XDP_PASS)
            .count()
    });
    assert_eq!(passed, 11 * sources.len());
    assert_same_epoch(second);
    let events = harness.drain_events();
    assert_eq!(count_of(&events, EventKind::ClusterHot), 64);
    assert_eq!(harness.outcome_total(Outcome::ClusterHotDropped).packets, 1);
    // The next second (same 10 s window): the last source's next frame
    // reports it.
    while at_second_start() == second {
        thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(harness.offer(0, &udp4(sources[64]), 1), (1, 0));
    let events = harness.drain_events();
    assert_eq!(count_of(&events, EventKind::ClusterHot), 1, "{events:?}");
    assert_eq!(
        events[0].key,
        cluster::share_key(&SourceKey::v4(sources[64].octets()), &harness.first_rule(0))
    );
}

/// A flood that fills its rooms of the kept windows (its rules' reserves
/// of tickets and the shared room): the sources past them get none and
/// are refused (counted as `window_full`), the windows of sources already
/// kept stay where they are, and the daemon's pass finds every window
/// busy.
#[test]
fn a_flood_that_fills_the_kept_windows_is_refused_and_counted() {
    let mut harness = churn_harness(vec![]);
    let key = SourceKey::v4([192, 0, 2, 1]).with_class(harness.first_rule(3).budget);
    assert_eq!(
        harness.offer(0, &udp(IpAddr::from([192, 0, 2, 1])), 1),
        (1, 0)
    );
    // The default and three rules limit; the flood is under two.
    let rooms = harness.maps().ticket_rooms().expect("rooms");
    assert_eq!(rooms, Rooms::new(CAPACITY, 4));
    let flood_room = 2 * rooms.reserve + rooms.shared;
    let program = harness.program();
    let passed = on_cpu(0, || spray(program, 0..3 * CAPACITY));
    let full = harness.outcome_total(Outcome::WindowFull).packets;
    assert_eq!(
        full,
        u64::from(3 * CAPACITY) - flood_room,
        "every source past the flood's rooms"
    );
    assert_eq!(passed.packets, flood_room, "the sources with a window");
    assert!(harness.maps().windows.get(&key, 0).is_ok(), "still kept");
    let kept = harness.maps().windows.keys().count() as u64;
    assert_eq!(kept, flood_room + 1, "the flood's rooms fill up completely");
    let mut reclaim = Reclaim::default();
    let now = kernel::now().as_nanos() as u64;
    while !reclaim
        .step(harness.maps_mut(), now, CAPACITY as usize, &mut Vec::new())
        .expect("reading the kept maps")
        .pass_done
    {}
    assert_eq!(reclaim.windows.kept, Some(kept as usize), "none idle");
}
