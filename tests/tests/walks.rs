//! Walks of `WINDOWS` while a flood churns it (`unblock` walks it, and the
//! tick's sweep walks `HOLDS`, the same way): the worst churn, every key
//! the walk stands on deleted and a new source added, done in step with
//! the walk so the outcome does not depend on timing; and `unblock`'s
//! walk (`penalty::lift`) while another thread churns `WINDOWS`.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use aya::maps::{HashMap, IterableMap, Map, MapData};
use limiter_common::{names, Hold, SourceKey, WindowState};
use limiter_tests::testrun::Harness;
use limiter_user::kernel::{batch, penalty, LoadOptions};

/// `WINDOWS`' capacity in these tests.
const CAPACITY: u32 = 1024;
/// Sources in `WINDOWS` when a walk starts: a quarter of its capacity.
const FILLED: u32 = 256;

fn key(i: u32) -> SourceKey {
    SourceKey::v4((0x0a00_0000 + i).to_be_bytes())
}

/// Some window (its content does not matter to a walk).
fn window() -> WindowState {
    // SAFETY: WindowState is plain old data (#[repr(C)] integers): all
    // zeroes is a valid value, the state of a window never admitted to.
    unsafe { std::mem::zeroed() }
}

/// The program with `WINDOWS` of `CAPACITY` holding `FILLED` sources, and
/// a second handle on `WINDOWS` to churn it while a walk holds the first.
fn churning() -> (Harness, HashMap<MapData, SourceKey, WindowState>) {
    let (harness, mut other) = loaded();
    for i in 0..FILLED {
        other.insert(key(i), window(), 0).expect("fill WINDOWS");
    }
    (harness, other)
}

/// The program with `WINDOWS` of `CAPACITY`, empty, and a second handle
/// on it.
fn loaded() -> (Harness, HashMap<MapData, SourceKey, WindowState>) {
    let harness = Harness::load_with(&LoadOptions {
        max_sources: CAPACITY,
        ..LoadOptions::default()
    });
    let id = harness
        .maps()
        .windows
        .map()
        .info()
        .expect("WINDOWS' info")
        .id();
    let data = MapData::from_id(id).expect("a second handle on WINDOWS");
    let other: HashMap<MapData, SourceKey, WindowState> =
        HashMap::try_from(Map::LruHashMap(data)).expect("WINDOWS as a hash map");
    (harness, other)
}

/// What a flood does to the key a walk just visited: its source evicted,
/// a new source in.
fn churn(other: &mut HashMap<MapData, SourceKey, WindowState>, visited: &SourceKey, fresh: u32) {
    let _ = other.remove(visited);
    other
        .insert(key(FILLED + fresh), window(), 0)
        .expect("a new source");
}

/// The suspicion, shown: `BPF_MAP_GET_NEXT_KEY` from a deleted key starts
/// again at the first bucket, so a walk of the kind `penalty::lift` made
/// (`keys()`) goes round for ever while the flood lasts.
#[test]
fn walks_get_next_key_goes_round_for_ever_under_churn() {
    let (harness, mut other) = churning();
    let guard = 100 * CAPACITY as usize;
    let mut visited = 0;
    for k in harness.maps().windows.keys() {
        let k = k.expect("next key");
        churn(&mut other, &k, visited as u32);
        visited += 1;
        if visited == guard {
            break;
        }
    }
    assert_eq!(
        visited, guard,
        "the walk never ended: 100 times the map's capacity visited"
    );
}

/// The batched walk under the same churn ends, within its cap, and says
/// whether it reached the end.
#[test]
fn walks_a_batched_walk_ends_under_churn_within_its_cap() {
    let (harness, mut other) = churning();
    let windows = harness.maps().windows.map();
    // Small batches, so the churn happens between many syscalls.
    let batch = 8;

    let started = Instant::now();
    let mut fresh = 0;
    let walk = penalty::walk(
        windows,
        names::WINDOWS,
        CAPACITY as usize,
        batch,
        |k: &SourceKey, _: &WindowState| {
            churn(&mut other, k, fresh);
            fresh += 1;
        },
    )
    .expect("walk");
    assert!(walk.complete, "{walk:?}");
    assert_eq!(walk.visited, fresh as usize);
    assert!(
        walk.visited >= FILLED as usize && walk.visited <= CAPACITY as usize,
        "each bucket once: {walk:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // A cap below what the churn brings: the walk stops there and says so.
    let cap = 64;
    let mut visited = 0;
    let walk = penalty::walk(
        windows,
        names::WINDOWS,
        cap,
        batch,
        |k: &SourceKey, _: &WindowState| {
            churn(&mut other, k, fresh);
            fresh += 1;
            visited += 1;
        },
    )
    .expect("walk");
    assert!(!walk.complete, "{walk:?}");
    assert_eq!(walk.visited, visited);
    assert!(
        (cap..cap + batch).contains(&walk.visited),
        "stopped at its cap: {walk:?}"
    );

    // Unchurned, the product's walk sees every source once.
    let mut seen = std::collections::BTreeSet::new();
    let walk = penalty::walk(
        windows,
        names::WINDOWS,
        CAPACITY as usize,
        batch::BATCH,
        |k: &SourceKey, _: &WindowState| {
            assert!(seen.insert(*k), "each source once");
        },
    )
    .expect("walk");
    assert!(walk.complete);
    assert_eq!(walk.visited, FILLED as usize, "the map still holds FILLED");
    assert_eq!(seen.len(), FILLED as usize);
}

/// `unblock`'s walk as the daemon runs it, while another thread keeps a
/// full `WINDOWS` churning (each insert evicts a source): it ends, and
/// lifts the penalty it was asked to.
#[test]
fn walks_unblock_ends_while_another_thread_churns_windows() {
    let (mut harness, mut other) = loaded();
    let held = SourceKey::v4([203, 0, 113, 7]);
    let penalty = Hold {
        until_ns: u64::MAX,
        tag: 1,
    };
    harness
        .maps_mut()
        .holds
        .insert(held, penalty, 0)
        .expect("a penalty");
    let stop = Arc::new(AtomicBool::new(false));
    let inserts = Arc::new(AtomicU64::new(0));
    let churner = {
        let (stop, inserts) = (stop.clone(), inserts.clone());
        std::thread::spawn(move || {
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                // `WINDOWS` never evicts: the churn deletes a source as it
                // adds one (as the daemon's reclaim and a flood together
                // do), keeping half the capacity in the map.
                if let Some(old) = i.checked_sub(CAPACITY / 2) {
                    let _ = other.remove(&key(old));
                }
                other.insert(key(i), window(), 0).expect("a new source");
                i += 1;
                inserts.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // Churning through four times the map before the walk starts.
    let deadline = Instant::now() + Duration::from_secs(20);
    while inserts.load(Ordering::Relaxed) < 4 * u64::from(CAPACITY) {
        assert!(Instant::now() < deadline, "the churner never got going");
        std::thread::yield_now();
    }
    let started = Instant::now();
    let cidr = "203.0.113.0/24".parse().expect("cidr");
    let lifted = penalty::lift(harness.maps_mut(), &cidr, 0).expect("lift");
    let took = started.elapsed();
    // Still churning after the walk (it never blocks, so it was runnable
    // throughout; whether the scheduler ran it during the few syscalls of
    // the walk is not something a test can force).
    let after = inserts.load(Ordering::Relaxed);
    while inserts.load(Ordering::Relaxed) == after {
        assert!(Instant::now() < deadline, "the churner stopped");
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Relaxed);
    churner.join().expect("churner");
    assert!(took < Duration::from_secs(5), "the walk took {took:?}");
    assert_eq!(
        lifted.lifted, 1,
        "the one penalty in the prefix (kept apart: its source has no window)"
    );
    assert!(
        harness.maps().holds.get(&held, 0).is_err(),
        "the penalty kept apart from the windows was lifted: {lifted:?}"
    );
}
