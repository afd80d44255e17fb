//! Kernel tests of cluster-scoped rules through BPF_PROG_TEST_RUN (the
//! real verifier and program): a cluster source is admitted against its
//! share per window, not its rule's allowance; without a live share
//! against the cold cap; once the cluster state is stale against the
//! fallback cap whatever shares exist; a node rule ignores all of it; a
//! cluster source reaching the threshold is reported once per window; and
//! a flood across both CPUs under a share is held to the share.
//!
//! The rule sets are compiled and pushed as the daemon pushes them, then
//! the rule under test is made cluster-scoped in `RULES` (as a push of a
//! cluster rule writes it, `kernel::cluster::kernel_ready` included), so
//! these tests need nothing of the configuration side. Shares, expiries
//! and refreshes are placed on the kernel's own coarse clock
//! (`kernel::now`).

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use limiter_common::{
    rules::rules_base, ClusterShare, ClusterState, EventKind, LimitEvent, Outcome, Scope, SourceKey,
};
use limiter_tests::{
    net,
    packets::{self, DST4},
    testrun::{self, on_cpu, per_window, verdict, Harness, XDP_PASS},
};
use limiter_user::{
    kernel::{self, cluster},
    rules::{RuleSet, RuleSpec},
};

/// The rules' limit: 1000 packets per 1 s window (no burst).
const LIMIT: u64 = 1000;
/// The source prefix of the node-scoped rule (index 1); every other source
/// falls under the cluster-scoped default (index 0).
const NODE_NET: &str = "198.51.100.0/24";
const SECOND: u64 = 1_000_000_000;

/// A harness whose default rule (a `LIMIT` pps limit) is cluster-scoped and
/// whose rule for [`NODE_NET`] (the same limit) is node-scoped, tiered or
/// not.
fn harness(tiered: bool) -> Harness {
    let set = RuleSet {
        rules: vec![RuleSpec::limit(net(NODE_NET), LIMIT)],
        tiered,
        ..RuleSet::with_default(RuleSpec::limit(net("0.0.0.0/0"), LIMIT))
    };
    let mut harness = Harness::load();
    assert_eq!(harness.push(&set), 1, "first generation");
    assert_eq!(harness.make_cluster_scoped(0).allowance_packets, LIMIT);
    assert_eq!(harness.first_rule(1).scope(), Some(Scope::Node));
    harness
}

/// The kernel's clock now (ns).
fn now() -> u64 {
    kernel::now().as_nanos() as u64
}

/// A fresh cluster state (refreshed now, stale after a minute) with these
/// divisors and a 50% reporting threshold.
fn fresh(cold_divisor: u32, fallback_divisor: u32) -> ClusterState {
    ClusterState::new(now(), 60 * SECOND, cold_divisor, fallback_divisor, 500)
}

/// A cluster state last refreshed 20 s ago, stale after 1 s.
fn stale(cold_divisor: u32, fallback_divisor: u32) -> ClusterState {
    ClusterState::new(
        now() - 20 * SECOND,
        SECOND,
        cold_divisor,
        fallback_divisor,
        500,
    )
}

fn set_state(harness: &mut Harness, state: ClusterState) {
    cluster::write_state(harness.maps_mut(), state).expect("writing CLUSTER");
    assert_eq!(
        cluster::state(harness.maps()).expect("reading CLUSTER"),
        state
    );
}

/// Gives the source `addr` (under the default rule) a share of
/// `allowance` packets until `expires_ns`.
fn set_share(harness: &mut Harness, addr: [u8; 4], allowance: u64, expires_ns: u64) {
    let key = window_key(harness, addr);
    let share = ClusterShare {
        allowance_packets: allowance,
        expires_ns,
    };
    cluster::write_share(harness.maps_mut(), &key, share).expect("writing CLUSTER_SHARES");
}

/// The window key of `addr` under the default rule: its share's key.
fn window_key(harness: &Harness, addr: [u8; 4]) -> SourceKey {
    cluster::share_key(&SourceKey::v4(addr), &harness.first_rule(0))
}

fn udp(addr: [u8; 4]) -> Vec<u8> {
    packets::udp_v4(Ipv4Addr::from(addr), DST4, 9999, 18)
}

/// Offers `n` frames from `addr` back to back on CPU 0 (well within one
/// window); how many were passed.
fn burst(harness: &mut Harness, addr: [u8; 4], n: u64) -> u64 {
    let frame = udp(addr);
    let program = harness.program();
    on_cpu(0, || {
        (0..n)
            .filter(|_| verdict(program, &frame) == XDP_PASS)
            .count() as u64
    })
}

fn hot_events(events: &[LimitEvent]) -> Vec<LimitEvent> {
    events
        .iter()
        .filter(|e| e.kind() == Some(EventKind::ClusterHot))
        .copied()
        .collect()
}

#[test]
fn a_source_with_a_share_is_admitted_its_share_not_the_rules_allowance() {
    let mut harness = harness(false);
    set_state(&mut harness, fresh(4, 2));
    let addr = [192, 0, 2, 1];
    set_share(&mut harness, addr, 300, now() + 60 * SECOND);
    assert_eq!(burst(&mut harness, addr, 1000), 300);
    // A larger share written mid-window takes effect at once (the CPU's
    // hold ends with its bucket at the latest: the next frames are in a
    // bucket of 100 ms).
    set_share(&mut harness, addr, 700, now() + 60 * SECOND);
    let started = Instant::now();
    let mut passed = 0;
    while passed < 400 && started.elapsed() < Duration::from_millis(900) {
        passed += burst(&mut harness, addr, 50);
    }
    assert_eq!(
        passed, 400,
        "the window admits up to the new share, no more"
    );
    assert_eq!(
        burst(&mut harness, addr, 100),
        0,
        "700 admitted in this window"
    );
}

#[test]
fn a_share_above_the_rules_allowance_admits_the_allowance() {
    let mut harness = harness(false);
    set_state(&mut harness, fresh(4, 2));
    let addr = [192, 0, 2, 2];
    set_share(&mut harness, addr, 5 * LIMIT, now() + 60 * SECOND);
    assert_eq!(burst(&mut harness, addr, 2 * LIMIT), LIMIT);
}

#[test]
fn a_source_without_a_share_gets_the_cold_cap() {
    let mut harness = harness(false);
    set_state(&mut harness, fresh(4, 2));
    assert_eq!(burst(&mut harness, [192, 0, 2, 3], 1000), LIMIT / 4);
    // Divisor 0 means 1: the whole allowance.
    set_state(&mut harness, fresh(0, 2));
    assert_eq!(burst(&mut harness, [192, 0, 2, 4], 2000), LIMIT);
}

#[test]
fn a_cold_cap_of_zero_admits_nothing_not_even_a_first_frame() {
    let mut harness = harness(false);
    // 1000 / 1001 = 0: more nodes alive than the limit has packets.
    set_state(&mut harness, fresh(1001, 2));
    assert_eq!(burst(&mut harness, [192, 0, 2, 5], 10), 0);
}

#[test]
fn an_expired_share_falls_back_to_the_cold_cap() {
    let mut harness = harness(false);
    set_state(&mut harness, fresh(5, 2));
    let addr = [192, 0, 2, 6];
    set_share(&mut harness, addr, 800, now() - 1);
    assert_eq!(burst(&mut harness, addr, 1000), LIMIT / 5);
}

#[test]
fn a_stale_state_applies_the_fallback_cap_for_both_policies_even_with_a_share() {
    let mut harness = harness(false);
    // Policy split: the limit over the nodes alive (2 here).
    set_state(&mut harness, stale(4, 2));
    let split = [192, 0, 2, 7];
    set_share(&mut harness, split, 900, now() + 60 * SECOND);
    assert_eq!(burst(&mut harness, split, 1000), LIMIT / 2);
    // Policy local: the whole limit on this node, share or cold cap aside.
    set_state(&mut harness, stale(4, 1));
    let local = [192, 0, 2, 8];
    set_share(&mut harness, local, 100, now() + 60 * SECOND);
    assert_eq!(burst(&mut harness, local, 2000), LIMIT);
    // A state never written is stale: the whole allowance (divisor 0).
    let mut untouched = self::harness(false);
    assert_eq!(
        cluster::state(untouched.maps()).expect("CLUSTER"),
        ClusterState::default()
    );
    assert_eq!(burst(&mut untouched, [192, 0, 2, 9], 2000), LIMIT);
}

#[test]
fn the_state_refreshed_again_brings_the_shares_back() {
    let mut harness = harness(false);
    set_state(&mut harness, stale(4, 2));
    let addr = [192, 0, 2, 10];
    set_share(&mut harness, addr, 600, now() + 60 * SECOND);
    assert_eq!(
        burst(&mut harness, addr, 400),
        400,
        "under the fallback cap of 500"
    );
    assert_eq!(burst(&mut harness, addr, 200), 100);
    set_state(&mut harness, fresh(4, 2));
    // The refusing CPU holds the source until its bucket ends at the
    // latest; within the window the share of 600 has 100 frames left.
    let started = Instant::now();
    let mut passed = 0;
    while passed < 100 && started.elapsed() < Duration::from_millis(900) {
        passed += burst(&mut harness, addr, 20);
    }
    assert_eq!(passed, 100);
    assert_eq!(
        burst(&mut harness, addr, 50),
        0,
        "600 admitted in this window"
    );
}

#[test]
fn a_node_rule_ignores_cluster_state_and_shares() {
    let mut harness = harness(false);
    let addr = [198, 51, 100, 1];
    // A share for its key, a cold cap of 0 and a stale state: none applies.
    let key = SourceKey::v4(addr);
    let share = ClusterShare {
        allowance_packets: 10,
        expires_ns: now() + 60 * SECOND,
    };
    cluster::write_share(harness.maps_mut(), &key, share).expect("share");
    assert_eq!(
        cluster::share(harness.maps(), &key).expect("share"),
        Some(share)
    );
    set_state(&mut harness, stale(5000, 5000));
    assert_eq!(burst(&mut harness, addr, 1500), LIMIT);
    set_state(&mut harness, fresh(5000, 5000));
    let other = [198, 51, 100, 2];
    assert_eq!(burst(&mut harness, other, 1500), LIMIT);
    let events = harness.drain_events();
    assert!(
        hot_events(&events).is_empty(),
        "a node rule is never reported hot: {events:?}"
    );
    assert!(cluster::remove_share(harness.maps_mut(), &key).expect("remove"));
    assert!(!cluster::remove_share(harness.maps_mut(), &key).expect("remove"));
    assert_eq!(cluster::share(harness.maps(), &key).expect("share"), None);
}

#[test]
fn a_cluster_source_is_reported_hot_once_when_it_crosses_the_threshold() {
    let mut harness = harness(false);
    set_state(&mut harness, fresh(4, 2));
    let addr = [192, 0, 2, 11];
    set_share(&mut harness, addr, 300, now() + 60 * SECOND);
    // Below half of its share of 300: no report.
    assert_eq!(burst(&mut harness, addr, 149), 149);
    let events = harness.drain_events();
    assert!(events.is_empty(), "{events:?}");
    // The 150th frame reaches it.
    assert_eq!(burst(&mut harness, addr, 1), 1);
    let events = harness.drain_events();
    assert_eq!(events.len(), 1, "{events:?}");
    let event = events[0];
    assert_eq!(event.kind(), Some(EventKind::ClusterHot));
    assert_eq!(event.key, window_key(&harness, addr), "keyed as its share");
    assert_eq!(
        event.rule,
        rules_base(1),
        "the default rule of generation 1"
    );
    assert!(!event.dry_run());
    // Up to its share and refused beyond: still one report this window
    // (the refusals' episode is a "source limited" event of its own).
    assert_eq!(burst(&mut harness, addr, 400), 150);
    let events = harness.drain_events();
    assert!(hot_events(&events).is_empty(), "{events:?}");
    assert_eq!(
        events
            .iter()
            .filter(|e| e.kind() == Some(EventKind::Limited))
            .count(),
        1,
        "{events:?}"
    );
    // Reporting off (threshold 0): a refused source is not reported.
    let quiet = [192, 0, 2, 12];
    set_state(
        &mut harness,
        ClusterState {
            threshold_permille: 0,
            ..fresh(4, 2)
        },
    );
    assert_eq!(burst(&mut harness, quiet, 300), LIMIT / 4);
    let events = harness.drain_events();
    assert!(hot_events(&events).is_empty(), "{events:?}");
}

#[test]
fn a_source_at_a_cap_of_zero_is_reported_hot_on_its_refusal() {
    let mut harness = harness(false);
    set_state(&mut harness, fresh(4, 2));
    let addr = [192, 0, 2, 13];
    set_share(&mut harness, addr, 0, now() + 60 * SECOND);
    assert_eq!(burst(&mut harness, addr, 20), 0);
    let events = harness.drain_events();
    let hot = hot_events(&events);
    assert_eq!(hot.len(), 1, "{events:?}");
    assert_eq!(hot[0].key, window_key(&harness, addr));
}

/// With the tiers on, a cluster source's first frames go the cheap way (up
/// to this node's part of its cheap frames: divided by the nodes alive, as
/// the cold cap is, so that what all nodes admit uncounted adds up to the
/// rule's cheap frames), uncounted: a burst gets the cold cap from its
/// window and this node's cheap frames on top. A source with a
/// share gets its share and one cheap frame: its share mark keeps it out
/// of the cheap tier from its second frame on (also under a share smaller
/// than the cheap frames).
#[test]
fn tiered_a_cluster_source_is_held_to_its_share_or_the_cold_cap() {
    let mut harness = harness(true);
    let cheap = u64::from(harness.first_rule(0).cheap_frames);
    assert!(cheap > 1, "the cluster rule has cheap frames");
    set_state(&mut harness, fresh(4, 2));
    // Four nodes alive: this node's part of the cheap frames.
    let node_cheap = cheap / 4;
    assert!(node_cheap >= 1);
    let addr = [192, 0, 2, 14];
    set_share(&mut harness, addr, 300, now() + 60 * SECOND);
    assert_eq!(burst(&mut harness, addr, 1000), 300 + 1);
    let cheap_before = harness.outcome_total(Outcome::Cheap).packets;
    assert_eq!(
        burst(&mut harness, [192, 0, 2, 15], 1000),
        LIMIT / 4 + node_cheap
    );
    assert_eq!(
        harness.outcome_total(Outcome::Cheap).packets - cheap_before,
        node_cheap,
        "without a share, its first frames went the cheap way"
    );
    let small = [192, 0, 2, 17];
    assert!(cheap > 5);
    set_share(&mut harness, small, 5, now() + 60 * SECOND);
    let cheap_before = harness.outcome_total(Outcome::Cheap).packets;
    assert_eq!(burst(&mut harness, small, 100), 5 + 1, "held to its share");
    assert_eq!(
        harness.outcome_total(Outcome::Cheap).packets - cheap_before,
        1,
        "only its first frame in the cheap tier (the share marks are read from the second frame on)"
    );
}

#[test]
fn a_flood_over_both_cpus_is_held_to_its_share() {
    const SHARE: u64 = 400;
    const WINDOWS: usize = 4;
    let mut harness = harness(false);
    set_state(&mut harness, fresh(4, 2));
    let addr = [192, 0, 2, 16];
    set_share(&mut harness, addr, SHARE, now() + 600 * SECOND);
    let frame = udp(addr);
    let window = Duration::from_secs(1);
    let (_, passed_at) = testrun::paced_on_both_cpus(
        harness.program(),
        &frame,
        5 * LIMIT,
        window * WINDOWS as u32,
    );
    // The sliding window holds any window of W to the share, up to the
    // weighting of its oldest bucket (`window` module docs): within 1%
    // of the limit, as the node-scoped two-CPU test holds it.
    let tolerance = LIMIT / 100;
    let counts = per_window(&passed_at, window, WINDOWS);
    for (k, admitted) in counts.iter().enumerate() {
        assert!(
            admitted.abs_diff(SHARE) <= tolerance,
            "window {k}: {admitted} admitted, share {SHARE} +-{tolerance}; all {counts:?}"
        );
    }
    // Hot from its first 200 frames on, refused on both CPUs all along:
    // reported once per window length between the two CPUs (the first
    // report within the first window, then one a window later each time),
    // not once per CPU.
    let events = harness.drain_events();
    let hot = hot_events(&events);
    assert!(
        (WINDOWS - 1..=WINDOWS).contains(&hot.len()),
        "{} cluster-hot events in {WINDOWS} windows: {hot:?}",
        hot.len()
    );
    let key = window_key(&harness, addr);
    assert!(hot.iter().all(|e| e.key == key), "{hot:?}");
    for pair in hot.windows(2) {
        assert!(
            pair[1].at_ns - pair[0].at_ns >= SECOND,
            "two reports within a window: {hot:?}"
        );
    }
}
