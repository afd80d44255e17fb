//! Batched map reads and writes (`BPF_MAP_*_BATCH`) against real maps.

use std::os::fd::BorrowedFd;

use limiter_common::{Counter, SourceKey, SourceTraffic};
use limiter_tests::testrun::Harness;
use limiter_user::kernel::{
    batch::{fd as map_fd, for_each_per_cpu, update_per_cpu, BATCH},
    LoadOptions,
};

/// The program with room for `max_sources` sources, and the number of
/// possible CPUs (the length of a per-CPU value).
fn loaded(max_sources: u32) -> (Harness, usize) {
    let harness = Harness::load_with(&LoadOptions {
        max_sources,
        max_hot_sources: Some(max_sources),
        ..LoadOptions::default()
    });
    (harness, aya::util::nr_cpus().expect("nr_cpus"))
}

/// Writes sources `0..n` (10.0.0.0 and up) in batches, source `i` with
/// `traffic(i, cpu)` on each CPU; what it wrote.
fn fill(
    fd: BorrowedFd,
    cpus: usize,
    n: u32,
    traffic: impl Fn(u32, u64) -> SourceTraffic,
) -> Vec<(SourceKey, Vec<SourceTraffic>)> {
    let entries: Vec<_> = (0..n)
        .map(|i| {
            let key = SourceKey::v4((0x0a00_0000 + i).to_be_bytes());
            (key, (0..cpus as u64).map(|cpu| traffic(i, cpu)).collect())
        })
        .collect();
    update_per_cpu(fd, cpus, &entries).expect("batch update");
    entries
}

#[test]
fn a_per_cpu_map_reads_back_exactly_what_was_written_in_batches() {
    let (harness, cpus) = loaded(20_000);
    let fd = map_fd(harness.maps().sources_data());
    // More than two batches, with a partial last one.
    let n = 2 * BATCH as u32 + 123;
    let entries = fill(fd, cpus, n, |i, cpu| SourceTraffic {
        second: 7,
        total: Counter {
            packets: u64::from(i) * 10 + cpu,
            bytes: u64::from(i),
        },
        ..SourceTraffic::default()
    });

    let mut seen = std::collections::BTreeMap::new();
    let count = for_each_per_cpu::<SourceKey, SourceTraffic>(fd, cpus, |key, per_cpu| {
        assert!(
            seen.insert(*key, per_cpu.to_vec()).is_none(),
            "each key once"
        );
    })
    .expect("batch lookup");
    assert_eq!(count, n as usize);
    assert_eq!(seen.len(), n as usize);
    for (key, per_cpu) in &entries {
        assert_eq!(seen.get(key), Some(per_cpu), "{key:?}");
    }
}

#[test]
fn an_empty_map_reads_as_empty() {
    let harness = Harness::load();
    let cpus = aya::util::nr_cpus().expect("nr_cpus");
    let fd = map_fd(harness.maps().sources_data());
    let count = for_each_per_cpu::<SourceKey, SourceTraffic>(fd, cpus, |_, _| panic!("no entries"))
        .expect("batch lookup");
    assert_eq!(count, 0);
}

#[test]
fn a_sweep_spread_over_ticks_sees_every_source_once() {
    use limiter_user::daemon::aggregate::{pass, Sweep};
    let (harness, cpus) = loaded(40_000);
    let fd = map_fd(harness.maps().sources_data());
    let n = 5 * BATCH as u32 + 77;
    fill(fd, cpus, n, |i, _| SourceTraffic {
        dropped: Counter {
            packets: u64::from(i),
            bytes: 0,
        },
        ..SourceTraffic::default()
    });

    // Slices of one batch: the sweep takes several ticks.
    let mut sweep = Sweep::default();
    let mut ticks = 0;
    let last = loop {
        let snapshot = pass(harness.maps(), 3, &mut sweep, BATCH).expect("tick");
        ticks += 1;
        if sweep.last_sweep_ticks > 0 {
            break snapshot;
        }
        assert!(
            snapshot.tracked_sources < u64::from(n),
            "partial until complete"
        );
        assert!(ticks < 100, "the sweep never completed");
    };
    // A tick stops at the first batch boundary past its budget, and the
    // kernel ends a batch early rather than split a bucket: each tick reads
    // between one and two budgets.
    assert!(ticks >= 3, "spread over {ticks} ticks");
    assert_eq!(sweep.last_sweep_ticks, ticks);
    assert_eq!(
        last.tracked_sources,
        u64::from(n),
        "every source exactly once"
    );
    assert_eq!(last.top.len(), 3);
    // The next tick starts a new sweep but still shows the complete one.
    let next = pass(harness.maps(), 3, &mut sweep, BATCH).expect("tick");
    assert_eq!(next.tracked_sources, u64::from(n));
}

#[test]
fn cluster_shares_written_in_batches_read_back_one_by_one() {
    use limiter_common::ClusterShare;
    use limiter_user::kernel::cluster;
    let mut harness = Harness::load();
    // More than two batches, with a partial last one.
    let n = 2 * BATCH as u32 + 45;
    let shares: Vec<(SourceKey, ClusterShare)> = (0..n)
        .map(|i| {
            let key = SourceKey::v4((0x0a00_0000 + i).to_be_bytes());
            let share = ClusterShare {
                allowance_packets: u64::from(i) * 3,
                expires_ns: 1_000_000 + u64::from(i),
            };
            (key, share)
        })
        .collect();
    cluster::write_shares(harness.maps_mut(), &shares).expect("batch update");
    for (key, share) in &shares {
        assert_eq!(
            cluster::share(harness.maps(), key).expect("lookup"),
            Some(*share),
            "{key:?}"
        );
    }
    // Rewritten in place: replaced, not added.
    let again: Vec<_> = shares
        .iter()
        .map(|(key, share)| {
            let share = ClusterShare {
                allowance_packets: share.allowance_packets + 1,
                ..*share
            };
            (*key, share)
        })
        .collect();
    cluster::write_shares(harness.maps_mut(), &again).expect("batch update");
    let (key, share) = again[n as usize - 1];
    assert_eq!(cluster::share(harness.maps(), &key).unwrap(), Some(share));
}

/// The share marks a write of shares raises: each source's cell marked
/// until at least its share's expiry, and never lowered by a later share
/// that expires sooner (a cell is shared by the sources that hash to
/// it), whether the marks were read cell by cell (few shares) or whole
/// (`cluster::SHARE_MARKS_READ_WHOLE` and more).
#[test]
fn share_marks_rise_and_never_fall_read_cell_by_cell_or_whole() {
    use limiter_common::{sketch, AddressFamily, ClusterShare};
    use limiter_user::kernel::cluster;
    let mut harness = Harness::load();
    let seed = harness.maps().live_config().expect("config").sketch_seed;
    let mark = |harness: &Harness, key: &SourceKey| -> u64 {
        let v6 = key.family() == AddressFamily::V6;
        let at = sketch::place(&key.addr, v6, key.prefix_len, key.class, seed);
        let cell = sketch::mark_cell(at, sketch::SHARE_CELLS);
        harness.maps().share_marks.get(&cell, 0).expect("a mark")
    };
    for n in [10, 2 * cluster::SHARE_MARKS_READ_WHOLE as u32] {
        let shares = |expires: u64| -> Vec<(SourceKey, ClusterShare)> {
            (0..n)
                .map(|i| {
                    let key = SourceKey::v4((0x0b00_0000 + i).to_be_bytes());
                    let share = ClusterShare {
                        allowance_packets: 5,
                        expires_ns: expires + u64::from(i),
                    };
                    (key, share)
                })
                .collect()
        };
        let late = shares(2_000_000_000);
        cluster::write_shares(harness.maps_mut(), &late).expect("shares");
        for (key, share) in &late {
            assert!(mark(&harness, key) >= share.expires_ns, "{n}: {key:?}");
        }
        cluster::write_shares(harness.maps_mut(), &shares(1_000)).expect("shares");
        for (key, share) in &late {
            assert!(
                mark(&harness, key) >= share.expires_ns,
                "{n}: the mark of {key:?} fell"
            );
        }
    }
}
