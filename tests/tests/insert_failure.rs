//! A source that can get no state fails closed, in the real kernel.
//!
//! `SOURCES` is an LRU map, which evicts instead of refusing an insert, so
//! its failure path cannot be reached with it. Here the program adopts
//! pinned maps of the same layout but of the plain (non-LRU) hash type for
//! `SOURCES`, and a `WINDOWS` small enough to fill, exactly as the daemon
//! adopts its own pins. With the tiers off (no cheap frames), a source
//! that needs a window once `WINDOWS` is full is refused,
//! counted as `window_full`; once `SOURCES` is full a new source gets no
//! entry at all, counted as `insert_failure`. A `limit` rule drops such a
//! frame (would-drop in dry-run), `allow` and `deny` rules still apply, and
//! sources that have state carry on as before.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use aya::maps::{HashMap, MapData, PerCpuHashMap};
use limiter_common::{names, Action, Counter, Outcome, SourceKey, SourceTraffic, WindowState};
use limiter_tests::{
    net,
    packets::{self, DST4},
    testrun::{Harness, XDP_DROP, XDP_PASS},
};
use limiter_user::{
    kernel::pins::ensure_bpffs,
    rules::{RuleSet, RuleSpec},
};

/// Room in the substituted maps.
const SOURCES_ROOM: u32 = 8;
const WINDOWS_ROOM: u32 = 4;

/// A pin directory on bpffs, removed on drop (also when the test fails).
struct PinDir(PathBuf);

impl PinDir {
    fn new() -> Self {
        let dir = PathBuf::from(format!("/sys/fs/bpf/xlt-insert-{}", std::process::id()));
        ensure_bpffs(&dir).unwrap_or_else(|e| panic!("bpffs: {e}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the pin directory");
        Self(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn frame(source: [u8; 4]) -> Vec<u8> {
    packets::udp_v4(Ipv4Addr::from(source), DST4, 5000, 10)
}

/// The change of every outcome counter over running `frame` once, and
/// its verdict.
fn run(harness: &mut Harness, frame: &[u8]) -> (u32, Vec<Outcome>) {
    let before: Vec<Counter> = Outcome::ALL
        .iter()
        .map(|o| harness.outcome_total(*o))
        .collect();
    let verdict = harness.run_on_cpu(0, frame);
    let changed = Outcome::ALL
        .iter()
        .zip(&before)
        .filter(|(o, b)| harness.outcome_total(**o).packets != b.packets)
        .map(|(o, _)| *o)
        .collect();
    (verdict, changed)
}

fn rules(dry_run: bool) -> RuleSet {
    let mut default = RuleSpec::limit(net("0.0.0.0/0"), 1000);
    default.dry_run = false;
    let mut set = RuleSet::with_default(default);
    set.dry_run = dry_run;
    // Tiers off: every source needs per-CPU state and a window from its
    // first frame, which is what these tests make fail (full maps under
    // the tiers: `adversarial.rs`, `tiers.rs`).
    set.tiered = false;
    set.rules = vec![
        RuleSpec::with_action(net("10.0.0.0/8"), Action::Allow),
        RuleSpec::with_action(net("172.16.0.0/12"), Action::Deny),
    ];
    set
}

#[test]
fn a_source_that_gets_no_state_is_judged_without_it_and_a_limit_fails_closed() {
    let pins = PinDir::new();
    // The same key and value types, another map type: the program's map
    // helpers work on any hash map.
    PerCpuHashMap::<MapData, SourceKey, SourceTraffic>::create(SOURCES_ROOM, 0)
        .expect("creating a plain per-CPU hash")
        .pin(pins.path(names::SOURCES))
        .expect("pinning it");
    HashMap::<MapData, SourceKey, WindowState>::create(WINDOWS_ROOM, 0)
        .expect("creating a plain hash")
        .pin(pins.path(names::WINDOWS))
        .expect("pinning it");
    let (sources_pin, windows_pin) = (pins.path(names::SOURCES), pins.path(names::WINDOWS));
    let mut harness = Harness::load_adopting(&[
        (names::SOURCES, Path::new(&sources_pin)),
        (names::WINDOWS, Path::new(&windows_pin)),
    ]);
    harness.push(&rules(false));

    use Outcome::*;
    // Four sources with two frames each: an entry and a window each,
    // both created by the first frame.
    for last in 1..=WINDOWS_ROOM as u8 {
        let source = frame([192, 0, 2, last]);
        assert_eq!(
            run(&mut harness, &source),
            (XDP_PASS, vec![Passed, NewSource])
        );
        assert_eq!(run(&mut harness, &source), (XDP_PASS, vec![Passed]));
    }
    // WINDOWS is full: the next sources get their entries but no window,
    // and fail closed (with the tiers off they have no cheap frames);
    // they fill SOURCES.
    for last in WINDOWS_ROOM as u8 + 1..=SOURCES_ROOM as u8 {
        let source = frame([192, 0, 2, last]);
        assert_eq!(
            run(&mut harness, &source),
            (XDP_DROP, vec![DroppedLimit, NewSource, WindowFull]),
            "a limited source without a window is refused"
        );
    }
    assert_eq!(
        run(&mut harness, &frame([192, 0, 2, 5])),
        (XDP_DROP, vec![DroppedLimit, WindowFull]),
        "and again"
    );
    // SOURCES is full: a new source gets no entry; its rule still judges
    // it, a limit failing closed.
    assert_eq!(
        run(&mut harness, &frame([192, 0, 2, 200])),
        (XDP_DROP, vec![DroppedLimit, InsertFailure])
    );
    assert_eq!(
        run(&mut harness, &frame([10, 0, 0, 200])),
        (XDP_PASS, vec![Allowed, InsertFailure]),
        "allow rules need no state"
    );
    assert_eq!(
        run(&mut harness, &frame([172, 16, 0, 200])),
        (XDP_DROP, vec![DroppedDeny, InsertFailure]),
        "deny rules need no state"
    );
    // Sources with state are unaffected.
    assert_eq!(
        run(&mut harness, &frame([192, 0, 2, 1])),
        (XDP_PASS, vec![Passed])
    );
    // In dry-run a stateless limit only counts what it would drop.
    harness.push(&rules(true));
    assert_eq!(
        run(&mut harness, &frame([192, 0, 2, 201])),
        (XDP_PASS, vec![DryRunWouldDrop, InsertFailure])
    );
}
