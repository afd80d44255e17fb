//! Reading the kernel's counters: offered traffic per source and CPU, the
//! shared admission windows, the per-outcome stats and the per-rule drops.

use std::collections::BTreeMap;

use limiter_common::{names, Counter, Outcome, SourceKey, SourceTraffic, WindowState};

use super::{Maps, MapsError};

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

/// Every tracked source with its per-CPU offered traffic (one key at a
/// time: for tests and small maps; the daemon reads in batches).
pub fn sources(maps: &Maps) -> Result<BTreeMap<SourceKey, Vec<SourceTraffic>>, MapsError> {
    maps.sources
        .iter()
        .map(|entry| entry.map(|(key, values)| (key, values.iter().copied().collect())))
        .collect::<Result<_, _>>()
        .map_err(MapsError::on(names::SOURCES))
}

/// Every source's admission window.
pub fn windows(maps: &Maps) -> Result<BTreeMap<SourceKey, WindowState>, MapsError> {
    maps.windows
        .iter()
        .collect::<Result<_, _>>()
        .map_err(MapsError::on(names::WINDOWS))
}

/// The per-CPU counters of each outcome.
pub fn outcomes(maps: &Maps) -> Result<BTreeMap<&'static str, Vec<Counter>>, MapsError> {
    Outcome::ALL
        .iter()
        .map(|outcome| {
            let values = maps
                .stats
                .get(&(*outcome as u32), 0)
                .map_err(MapsError::on(names::STATS))?;
            Ok((outcome.name(), values.iter().copied().collect()))
        })
        .collect()
}

/// Each outcome's counter summed over CPUs, in `Outcome` order.
pub fn outcome_totals(maps: &Maps) -> Result<Vec<Counter>, MapsError> {
    let outcomes = outcomes(maps)?;
    Ok(Outcome::ALL
        .iter()
        .map(|o| total(&outcomes[o.name()]))
        .collect())
}

/// Dropped (or would-drop) frames per `RULES` index, summed over CPUs.
pub fn rule_drops(maps: &Maps) -> Result<Vec<u64>, MapsError> {
    maps.rule_drops
        .iter()
        .map(|values| {
            values
                .map(|v| v.iter().sum())
                .map_err(MapsError::on(names::RULE_DROPS))
        })
        .collect()
}

/// Sources evicted from the window map so far: every entry is created by
/// the kernel (counted as `new_source`) and leaves either by LRU eviction or
/// by a userspace delete, so `created - live - deleted` is exact.
pub const fn evictions(created: u64, live: u64, deleted_by_userspace: u64) -> u64 {
    created.saturating_sub(live + deleted_by_userspace)
}
