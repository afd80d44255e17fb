//! One aggregation pass over an interface's maps: outcome totals summed
//! across CPUs, tracked and limited sources, and the heaviest sources by
//! offered rate over the last complete second.

use std::{collections::BTreeSet, time::Duration};

use aya::{
    maps::{MapData, PerCpuArray, PerCpuHashMap},
    Ebpf,
};
use limiter_common::{names, Counter, Outcome, SourceKey, SourceTraffic};

use crate::counters::{self, CountersError};

/// A source's rates over the last complete second, summed across CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceRate {
    pub key: SourceKey,
    pub offered: Counter,
    /// Dropped (or would-be dropped) since the source was first seen.
    pub dropped_total: Counter,
    /// Some CPU is refusing it without looking (blocked or over its limit).
    pub limited: bool,
}

/// What one pass saw.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Per outcome, summed across CPUs, in `Outcome` order.
    pub outcomes: Vec<Counter>,
    pub tracked_sources: u64,
    pub limited: BTreeSet<SourceKey>,
    /// Heaviest sources by offered packets, at most `top_k`.
    pub top: Vec<SourceRate>,
    /// Per rule index (`RULES`), dropped or would-drop packets.
    pub rule_drops: Vec<u64>,
}

/// The kernel's clock for the limiter (`bpf_ktime_get_coarse_ns`).
pub fn kernel_now() -> Duration {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .expect("CLOCK_MONOTONIC_COARSE is always available");
    Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32)
}

/// Reads everything once.
pub fn pass(ebpf: &Ebpf, top_k: usize) -> Result<Snapshot, CountersError> {
    let now = kernel_now();
    let now_ns = now.as_nanos() as u64;
    let now_second = now.as_secs();
    let outcomes = counters::outcomes(ebpf)?;
    let outcomes = Outcome::ALL
        .iter()
        .map(|o| counters::total(&outcomes[o.name()]))
        .collect();

    let map = ebpf
        .map(names::SOURCES)
        .ok_or(CountersError::MissingMap(names::SOURCES))?;
    let sources =
        PerCpuHashMap::<&MapData, SourceKey, SourceTraffic>::try_from(map).map_err(|source| {
            CountersError::Map {
                map: names::SOURCES,
                source,
            }
        })?;
    let mut snapshot = Snapshot {
        outcomes,
        ..Snapshot::default()
    };
    let mut rates: Vec<SourceRate> = Vec::new();
    for entry in sources.iter() {
        let Ok((key, per_cpu)) = entry else {
            // An entry evicted between listing and reading: skip it.
            continue;
        };
        snapshot.tracked_sources += 1;
        let mut rate = SourceRate {
            key,
            offered: Counter::default(),
            dropped_total: Counter::default(),
            limited: false,
        };
        for t in per_cpu.iter() {
            rate.offered = rate.offered.merged(t.last_second(now_second));
            rate.dropped_total = rate.dropped_total.merged(t.dropped);
            rate.limited |= t.hold_until_ns > now_ns;
        }
        if rate.limited {
            snapshot.limited.insert(key);
        }
        rates.push(rate);
    }
    rates.sort_by_key(|r| std::cmp::Reverse(r.offered.packets));
    rates.truncate(top_k);
    snapshot.top = rates;
    snapshot.rule_drops = rule_drops(ebpf)?;
    Ok(snapshot)
}

fn rule_drops(ebpf: &Ebpf) -> Result<Vec<u64>, CountersError> {
    let map = ebpf
        .map(names::RULE_DROPS)
        .ok_or(CountersError::MissingMap(names::RULE_DROPS))?;
    let map_err = |source| CountersError::Map {
        map: names::RULE_DROPS,
        source,
    };
    let drops = PerCpuArray::<&MapData, u64>::try_from(map).map_err(map_err)?;
    drops
        .iter()
        .map(|values| values.map(|v| v.iter().sum()).map_err(map_err))
        .collect()
}
