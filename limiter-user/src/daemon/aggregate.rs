//! One aggregation pass over an interface's maps: outcome totals summed
//! across CPUs, tracked and limited sources, and the heaviest sources by
//! offered rate over the last complete second.

use std::{
    cmp::Reverse,
    collections::{BTreeSet, BinaryHeap, HashMap},
    time::Duration,
};

use aya::{
    maps::{MapData, PerCpuArray},
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
    /// The `RULES` index its newest per-CPU state resolved.
    pub rule: u32,
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

/// Reads everything once; the per-source map in batches.
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
    let fd = crate::batch::hash_map_fd(map).ok_or(CountersError::MissingMap(names::SOURCES))?;
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| CountersError::Io(e))?;
    let mut snapshot = Snapshot {
        outcomes,
        ..Snapshot::default()
    };
    // Keep only the heaviest `top_k` while streaming through the map.
    let mut heaviest: BinaryHeap<Reverse<(u64, SourceKey)>> = BinaryHeap::new();
    let mut rates: HashMap<SourceKey, SourceRate> = HashMap::new();
    crate::batch::for_each_per_cpu::<SourceKey, SourceTraffic>(fd, cpus, |key, per_cpu| {
        snapshot.tracked_sources += 1;
        let mut rate = SourceRate {
            key: *key,
            offered: Counter::default(),
            dropped_total: Counter::default(),
            limited: false,
            rule: limiter_common::rules::NO_RULE,
        };
        let mut newest_generation = 0;
        for t in per_cpu {
            rate.offered = rate.offered.merged(t.last_second(now_second));
            rate.dropped_total = rate.dropped_total.merged(t.dropped);
            rate.limited |= t.hold_until_ns > now_ns;
            if t.generation > newest_generation {
                newest_generation = t.generation;
                rate.rule = t.rule;
            }
        }
        if rate.limited {
            snapshot.limited.insert(*key);
        }
        if top_k == 0 {
            return;
        }
        let weight = rate.offered.packets;
        if heaviest.len() < top_k {
            heaviest.push(Reverse((weight, *key)));
            rates.insert(*key, rate);
        } else if heaviest.peek().is_some_and(|Reverse((w, _))| weight > *w) {
            if let Some(Reverse((_, evicted))) = heaviest.pop() {
                rates.remove(&evicted);
            }
            heaviest.push(Reverse((weight, *key)));
            rates.insert(*key, rate);
        }
    })
    .map_err(CountersError::Io)?;
    let mut rates: Vec<SourceRate> = rates.into_values().collect();
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
