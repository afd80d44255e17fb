//! Lists and bans: in the kernel through BPF_PROG_TEST_RUN (an allow list
//! passes before any rule, a deny list and a ban drop, the longest prefix
//! of any list decides, a new set of lists replaces the old one all or
//! nothing, a ban ends by the kernel's clock, a rule push keeps them); and
//! through the real daemon in a netns lab (`ban`, `unban`, `bans`, the
//! metrics, restarts, reloads of a list file), with fail2ban's action
//! driven by Debian's fail2ban.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use limiter_common::{
    lists::{Ban, BanOrigin, ListAction, BAN_FOREVER},
    Outcome,
};
use limiter_tests::{
    net,
    packets::{self, DST4, DST6},
    testrun::{coarse_now, Harness, XDP_DROP, XDP_PASS},
};
use limiter_user::{
    kernel::{bans, lists as kernel_lists, LoadOptions},
    lists::{merge, List, Merged},
    rules::{RuleSet, RuleSpec},
};

#[path = "lists/feeds.rs"]
mod feeds;

/// Every source limited to `pps` per second.
fn limit(pps: u64) -> RuleSet {
    RuleSet::with_default(RuleSpec::limit(net("0.0.0.0/0"), pps))
}

fn list(name: &str, action: ListAction, prefixes: &[&str]) -> List {
    List {
        name: name.into(),
        action,
        file: None,
        prefixes: prefixes.iter().map(|p| net(p)).collect(),
    }
}

fn frame(source: IpAddr) -> Vec<u8> {
    match source {
        IpAddr::V4(v4) => packets::udp_v4(v4, DST4, 9999, 18),
        IpAddr::V6(v6) => packets::udp_v6(v6, DST6, 9999, 18),
    }
}

fn v4(text: &str) -> IpAddr {
    IpAddr::V4(text.parse::<Ipv4Addr>().unwrap())
}

fn v6(text: &str) -> IpAddr {
    IpAddr::V6(text.parse::<Ipv6Addr>().unwrap())
}

/// `n` frames from `source` on CPU 0: how many passed.
fn passed(harness: &mut Harness, source: IpAddr, n: usize) -> usize {
    let frames = vec![frame(source); n];
    harness
        .run_all(0, &frames)
        .iter()
        .filter(|v| **v == XDP_PASS)
        .count()
}

fn load(harness: &mut Harness, merged: &Merged) {
    kernel_lists::load_all(&mut [harness.maps_mut()], merged).expect("loading the lists");
}

fn keys_of_both_halves(harness: &Harness) -> usize {
    harness.maps().lists_v4.keys().count() + harness.maps().lists_v6.keys().count()
}

#[test]
fn lists_judge_before_the_rules_and_the_longest_prefix_of_any_list_decides() {
    let mut harness = Harness::load();
    harness.push(&limit(5));
    let lists = [
        list(
            "office",
            ListAction::Allow,
            &["192.0.2.0/24", "2001:db8:1::/48"],
        ),
        list(
            "drop",
            ListAction::Deny,
            &["192.0.2.128/25", "203.0.113.0/24", "2001:db8:1:2::/64"],
        ),
    ];
    load(&mut harness, &merge(&lists, 100).unwrap());

    // Allowed: never limited, whatever the rule (5 per second).
    assert_eq!(passed(&mut harness, v4("192.0.2.7"), 50), 50);
    assert_eq!(passed(&mut harness, v6("2001:db8:1:1::9"), 50), 50);
    // Inside the allowed /24, the longer denied /25 decides.
    assert_eq!(passed(&mut harness, v4("192.0.2.200"), 10), 0);
    assert_eq!(passed(&mut harness, v6("2001:db8:1:2::9"), 10), 0);
    assert_eq!(passed(&mut harness, v4("203.0.113.9"), 10), 0);
    // The /24 of a listed prefix, outside it: the trie says no.
    assert_eq!(passed(&mut harness, v4("192.0.2.100"), 1), 1);
    // A source in no list: its rule, and within it nothing is dropped.
    assert_eq!(passed(&mut harness, v4("198.51.100.77"), 5), 5);
    assert_eq!(passed(&mut harness, v4("198.51.100.77"), 5), 0);

    let hits = kernel_lists::hits(harness.maps(), 2).unwrap();
    assert_eq!((hits[0].packets, hits[1].packets), (101, 30));
    assert_eq!(harness.outcome_total(Outcome::Allowed).packets, 101);
    assert_eq!(harness.outcome_total(Outcome::DroppedDeny).packets, 30);
    // No listed frame reached the per-source state.
    assert_eq!(harness.sources().len(), 1);

    // A push of rules keeps the lists.
    harness.push(&limit(1000));
    assert_eq!(passed(&mut harness, v4("203.0.113.9"), 10), 0);
    assert_eq!(passed(&mut harness, v4("192.0.2.7"), 10), 10);
}

#[test]
fn new_lists_replace_the_old_ones_all_or_nothing() {
    let mut harness = Harness::load_with(&LoadOptions {
        max_list_prefixes: 2,
        ..LoadOptions::default()
    });
    harness.push(&limit(1000));
    let first = merge(&[list("a", ListAction::Deny, &["203.0.113.0/24"])], 2).unwrap();
    load(&mut harness, &first);
    assert_eq!(passed(&mut harness, v4("203.0.113.1"), 3), 0);

    // Five prefixes do not fit a trie of four entries beside the live
    // one: the write fails, the old list judges on, nothing half-written
    // stays.
    let too_many = [
        "198.51.100.0/28",
        "198.51.100.16/28",
        "198.51.100.32/28",
        "198.51.100.48/28",
        "198.51.100.64/28",
    ];
    let big = merge(&[list("b", ListAction::Deny, &too_many)], 10).unwrap();
    assert!(kernel_lists::load_all(&mut [harness.maps_mut()], &big).is_err());
    assert_eq!(passed(&mut harness, v4("203.0.113.1"), 3), 0);
    assert_eq!(passed(&mut harness, v4("198.51.100.1"), 3), 3);
    assert_eq!(keys_of_both_halves(&harness), 1);

    // A list that fits replaces it; the old half is gone.
    let second = merge(&[list("b", ListAction::Deny, &too_many[..2])], 2).unwrap();
    load(&mut harness, &second);
    assert_eq!(passed(&mut harness, v4("203.0.113.1"), 3), 3);
    assert_eq!(passed(&mut harness, v4("198.51.100.1"), 3), 0);
    assert_eq!(keys_of_both_halves(&harness), 2);

    // No lists at all: every frame to the rules again, and no lookups.
    load(&mut harness, &Merged::default());
    assert_eq!(passed(&mut harness, v4("198.51.100.1"), 3), 3);
    assert_eq!(keys_of_both_halves(&harness), 0);
    assert!(!harness.maps().live_config().unwrap().lists(true));
}

#[test]
fn a_ban_drops_until_its_end_by_the_kernels_clock_and_an_allow_list_wins() {
    let mut harness = Harness::load();
    harness.push(&limit(1000));
    load(
        &mut harness,
        &merge(&[list("office", ListAction::Allow, &["192.0.2.0/24"])], 10).unwrap(),
    );
    let now = coarse_now().as_nanos() as u64;
    let end = now + 300_000_000;
    let ban = Ban::new(now, end, BanOrigin::Cli, "test");
    bans::ban(harness.maps_mut(), net("198.51.100.0/24"), &ban).unwrap();
    let forever = Ban::new(now, BAN_FOREVER, BanOrigin::Crowdsec, "");
    bans::ban(harness.maps_mut(), net("2001:db8:5::/48"), &forever).unwrap();
    bans::ban(harness.maps_mut(), net("192.0.2.7/32"), &forever).unwrap();

    assert_eq!(passed(&mut harness, v4("198.51.100.9"), 10), 0);
    assert_eq!(passed(&mut harness, v6("2001:db8:5:1::1"), 10), 0);
    assert_eq!(
        passed(&mut harness, v4("192.0.2.7"), 10),
        10,
        "allowed wins"
    );
    assert_eq!(passed(&mut harness, v4("198.51.101.9"), 10), 10);
    assert_eq!(harness.outcome_total(Outcome::Banned).packets, 20);

    // The ban ends on its own, by the kernel's clock: the first frame
    // that passes comes after its end and within a second of it.
    let first_pass = loop {
        if harness.run_all(0, &[frame(v4("198.51.100.9"))])[0] == XDP_PASS {
            break coarse_now().as_nanos() as u64;
        }
        assert!(
            coarse_now().as_nanos() as u64 - now < 5_000_000_000,
            "never ended"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(first_pass >= end, "passed before the ban's end");
    assert!(first_pass < end + 1_000_000_000, "ended late");

    // The sweep removes the ended ban and keeps the others.
    let ended = bans::sweep(harness.maps_mut(), coarse_now().as_nanos() as u64).unwrap();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].net, net("198.51.100.0/24"));
    assert_eq!(bans::list(harness.maps()).unwrap().len(), 2);
    assert!(bans::unban(harness.maps_mut(), net("2001:db8:5::/48")).unwrap());
    assert!(!bans::unban(harness.maps_mut(), net("2001:db8:5::/48")).unwrap());
    assert!(bans::unban(harness.maps_mut(), net("192.0.2.7/32")).unwrap());
    bans::sweep(harness.maps_mut(), coarse_now().as_nanos() as u64).unwrap();
    assert!(
        !harness.maps().live_config().unwrap().bans(),
        "no ban left, no lookups"
    );
    assert_eq!(
        harness.run_all(0, &[frame(v6("2001:db8:5:1::1"))])[0],
        XDP_PASS
    );
}

#[test]
fn in_dry_run_a_denied_or_banned_frame_is_counted_and_passed() {
    let mut harness = Harness::load();
    harness.push(&RuleSet {
        dry_run: true,
        ..limit(1000)
    });
    load(
        &mut harness,
        &merge(&[list("drop", ListAction::Deny, &["203.0.113.0/24"])], 10).unwrap(),
    );
    let now = coarse_now().as_nanos() as u64;
    bans::ban(
        harness.maps_mut(),
        net("198.51.100.9/32"),
        &Ban::new(now, BAN_FOREVER, BanOrigin::Cli, ""),
    )
    .unwrap();
    assert_eq!(passed(&mut harness, v4("203.0.113.1"), 4), 4);
    assert_eq!(passed(&mut harness, v4("198.51.100.9"), 4), 4);
    assert_eq!(harness.outcome_total(Outcome::DryRunWouldDrop).packets, 8);
    assert_eq!(harness.outcome_total(Outcome::DroppedDeny).packets, 0);
    let verdicts = harness.run_all(0, &[frame(v4("203.0.113.1"))]);
    assert_ne!(verdicts[0], XDP_DROP);
}

/// A frame judged while the lists switch again and again, on another CPU,
/// meets the old set or the new one, never a mix and never none: a source
/// in neither set always passes (its /24 bit set in one of them), a source
/// both deny is always dropped.
#[test]
fn a_frame_racing_a_switch_of_lists_is_judged_by_the_old_set_or_the_new_one() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = std::path::PathBuf::from(format!("/sys/fs/bpf/xlt-lists-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a pin directory on bpffs");
    let pins = limiter_common::maps::PINNED
        .iter()
        .map(|spec| (spec.name, dir.join(spec.name)))
        .collect();
    let mut harness = Harness::load_with(&LoadOptions {
        pins,
        ..LoadOptions::default()
    });
    harness.push(&limit(1_000_000_000));
    // A second handle on the same maps, for the switches.
    let mut writer = limiter_user::kernel::Maps::from_pins(&dir).expect("the pinned maps");
    let a = merge(
        &[list(
            "a",
            ListAction::Deny,
            &["198.51.100.0/25", "203.0.113.7/32", "2001:db8:a::/48"],
        )],
        10,
    )
    .unwrap();
    let b = merge(
        &[list(
            "b",
            ListAction::Deny,
            &["198.51.100.0/24", "192.0.2.9/32", "2001:db8:a:1::/64"],
        )],
        10,
    )
    .unwrap();
    let both = [v4("198.51.100.9"), v6("2001:db8:a:1::5")];
    let neither = [
        v4("203.0.113.200"),
        v4("192.0.2.10"),
        v6("2001:db8:b::5"),
        v4("10.1.2.3"),
    ];
    let frames: Vec<Vec<u8>> = both.iter().chain(&neither).map(|s| frame(*s)).collect();
    kernel_lists::load_all(&mut [&mut writer], &a).expect("the first lists");
    let stop = AtomicBool::new(false);
    let cpu = 1 % limiter_tests::testrun::online_cpus();
    let (runs, wrong) = std::thread::scope(|scope| {
        let runner = scope.spawn(|| {
            let (mut runs, mut wrong) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let verdicts = harness.run_all(cpu, &frames);
                for (i, verdict) in verdicts.iter().enumerate() {
                    let want = if i < both.len() { XDP_DROP } else { XDP_PASS };
                    if *verdict != want && wrong.len() < 10 {
                        wrong.push((i, *verdict));
                    }
                }
                runs += 1;
            }
            (runs, wrong)
        });
        // 20 switches: each reads and writes the 2 MiB /24 bitmap twice
        // (about 130 ms).
        for i in 0..20 {
            let set = if i % 2 == 0 { &b } else { &a };
            kernel_lists::load_all(&mut [&mut writer], set).expect("a switch of lists");
        }
        stop.store(true, Ordering::Relaxed);
        runner.join().expect("the runner")
    });
    std::fs::remove_dir_all(&dir).expect("removing the pins");
    assert!(
        wrong.is_empty(),
        "frames judged by neither set (index, verdict): {wrong:?}"
    );
    assert!(
        runs >= 60,
        "the frames ran beside the switches: {runs} rounds"
    );
}
