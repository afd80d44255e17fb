//! Reading the kernel's counters: offered traffic per source and CPU, the
//! shared admission windows, and the per-outcome stats.

use std::collections::BTreeMap;

use aya::{
    maps::{HashMap, MapData, MapError, PerCpuArray, PerCpuHashMap},
    Ebpf,
};
use limiter_common::{names, Counter, Outcome, SourceKey, SourceTraffic, WindowState};

/// Errors from reading the maps.
#[derive(Debug, thiserror::Error)]
pub enum CountersError {
    #[error("map `{0}` is missing from the loaded object")]
    MissingMap(&'static str),
    #[error("reading map `{map}`: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error("batched map read: {0}")]
    Io(#[source] std::io::Error),
}

fn map<'a>(ebpf: &'a Ebpf, name: &'static str) -> Result<&'a aya::maps::Map, CountersError> {
    ebpf.map(name).ok_or(CountersError::MissingMap(name))
}

fn map_err(map: &'static str) -> impl Fn(MapError) -> CountersError {
    move |source| CountersError::Map { map, source }
}

/// The sum over CPUs.
pub fn total(per_cpu: &[Counter]) -> Counter {
    per_cpu
        .iter()
        .fold(Counter::default(), |acc, c| acc.merged(*c))
}

/// Offered traffic since creation, summed over CPUs.
pub fn offered(per_cpu: &[SourceTraffic]) -> Counter {
    per_cpu
        .iter()
        .fold(Counter::default(), |acc, t| acc.merged(t.total))
}

/// Dropped (or would-be dropped) traffic since creation, summed over CPUs.
pub fn dropped(per_cpu: &[SourceTraffic]) -> Counter {
    per_cpu
        .iter()
        .fold(Counter::default(), |acc, t| acc.merged(t.dropped))
}

/// Every tracked source with its per-CPU offered traffic.
pub fn sources(ebpf: &Ebpf) -> Result<BTreeMap<SourceKey, Vec<SourceTraffic>>, CountersError> {
    // Both LRU and plain per-CPU hashes read through PerCpuHashMap.
    let sources =
        PerCpuHashMap::<&MapData, SourceKey, SourceTraffic>::try_from(map(ebpf, names::SOURCES)?)
            .map_err(map_err(names::SOURCES))?;
    sources
        .iter()
        .map(|entry| entry.map(|(key, values)| (key, values.iter().copied().collect())))
        .collect::<Result<_, _>>()
        .map_err(map_err(names::SOURCES))
}

/// Every source's admission window.
pub fn windows(ebpf: &Ebpf) -> Result<BTreeMap<SourceKey, WindowState>, CountersError> {
    let windows = HashMap::<&MapData, SourceKey, WindowState>::try_from(map(ebpf, names::WINDOWS)?)
        .map_err(map_err(names::WINDOWS))?;
    windows
        .iter()
        .collect::<Result<_, _>>()
        .map_err(map_err(names::WINDOWS))
}

/// The per-CPU counters of each outcome.
pub fn outcomes(ebpf: &Ebpf) -> Result<BTreeMap<&'static str, Vec<Counter>>, CountersError> {
    let stats = PerCpuArray::<&MapData, Counter>::try_from(map(ebpf, names::STATS)?)
        .map_err(map_err(names::STATS))?;
    Outcome::ALL
        .iter()
        .map(|outcome| {
            let values = stats
                .get(&(*outcome as u32), 0)
                .map_err(map_err(names::STATS))?;
            Ok((outcome.name(), values.iter().copied().collect()))
        })
        .collect()
}

/// Sources evicted from the window map so far: every entry is created by
/// the kernel (counted as `new_source`) and leaves either by LRU eviction or
/// by a userspace delete, so `created - live - deleted` is exact.
pub const fn evictions(created: u64, live: u64, deleted_by_userspace: u64) -> u64 {
    created.saturating_sub(live + deleted_by_userspace)
}
