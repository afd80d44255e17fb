//! Reading the kernel's counters: per-source and per-outcome, per CPU and
//! summed across CPUs.

use std::collections::BTreeMap;

use aya::{
    maps::{MapError, PerCpuArray, PerCpuHashMap, PerCpuValues},
    Ebpf,
};
use limiter_common::{names, Counter, Outcome, SourceKey};

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
}

/// One counter per possible CPU.
pub type PerCpu = Vec<Counter>;

fn per_cpu(values: PerCpuValues<Counter>) -> PerCpu {
    values.iter().copied().collect()
}

/// The sum over CPUs.
pub fn total(per_cpu: &[Counter]) -> Counter {
    per_cpu
        .iter()
        .fold(Counter::default(), |acc, c| acc.merged(*c))
}

/// Every tracked source with its per-CPU counters.
pub fn sources(ebpf: &Ebpf) -> Result<BTreeMap<SourceKey, PerCpu>, CountersError> {
    let map = ebpf
        .map(names::SOURCES)
        .ok_or(CountersError::MissingMap(names::SOURCES))?;
    let map_err = |source| CountersError::Map {
        map: names::SOURCES,
        source,
    };
    // Both LRU and plain per-CPU hashes read through PerCpuHashMap.
    let sources = PerCpuHashMap::<_, SourceKey, Counter>::try_from(map).map_err(map_err)?;
    sources
        .iter()
        .map(|entry| entry.map(|(key, values)| (key, per_cpu(values))))
        .collect::<Result<_, _>>()
        .map_err(map_err)
}

/// The per-CPU counters of each outcome.
pub fn outcomes(ebpf: &Ebpf) -> Result<BTreeMap<&'static str, PerCpu>, CountersError> {
    let map = ebpf
        .map(names::STATS)
        .ok_or(CountersError::MissingMap(names::STATS))?;
    let map_err = |source| CountersError::Map {
        map: names::STATS,
        source,
    };
    let stats = PerCpuArray::<_, Counter>::try_from(map).map_err(map_err)?;
    Outcome::ALL
        .iter()
        .map(|outcome| {
            let values = stats.get(&(*outcome as u32), 0).map_err(map_err)?;
            Ok((outcome.name(), per_cpu(values)))
        })
        .collect()
}
