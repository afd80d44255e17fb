//! Reading the kernel's counters: offered traffic per source and CPU, the
//! shared admission windows, the per-outcome stats, the per-rule and
//! per-level drops, and the active sources estimated from the cheap tier's sketch.

use std::collections::BTreeMap;

use aya::maps::IterableMap;
use limiter_common::{
    names,
    rules::{LevelWindow, MAX_LEVELS},
    sketch, Counter, LevelKey, Outcome,
};
#[cfg(any(test, feature = "test-util"))]
use limiter_common::{SourceKey, SourceTraffic, WindowState};

use super::{
    batch,
    penalty::{self, Walk},
    Maps, MapsError,
};

/// The sum over CPUs.
pub fn total(per_cpu: &[Counter]) -> Counter {
    per_cpu
        .iter()
        .fold(Counter::default(), |acc, c| acc.merged(*c))
}

#[cfg(any(test, feature = "test-util"))]
/// Offered traffic since creation, summed over CPUs.
pub fn offered(per_cpu: &[SourceTraffic]) -> Counter {
    per_cpu
        .iter()
        .fold(Counter::default(), |acc, t| acc.merged(t.total))
}

#[cfg(any(test, feature = "test-util"))]
/// Dropped (or would-be dropped) traffic since creation, summed over CPUs.
pub fn dropped(per_cpu: &[SourceTraffic]) -> Counter {
    per_cpu
        .iter()
        .fold(Counter::default(), |acc, t| acc.merged(t.dropped))
}

#[cfg(any(test, feature = "test-util"))]
/// Every tracked source with its per-CPU offered traffic (one key at a
/// time: for tests and small maps; the daemon reads in batches).
pub fn sources(maps: &Maps) -> Result<BTreeMap<SourceKey, Vec<SourceTraffic>>, MapsError> {
    maps.sources
        .iter()
        .map(|entry| entry.map(|(key, values)| (key, values.iter().copied().collect())))
        .collect::<Result<_, _>>()
        .map_err(MapsError::on(names::SOURCES))
}

#[cfg(any(test, feature = "test-util"))]
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
pub(crate) fn outcome_totals(maps: &Maps) -> Result<Vec<Counter>, MapsError> {
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

#[cfg(any(test, feature = "test-util"))]
/// Dropped (or would-drop) frames per `RULES` index and level (index
/// `rule * MAX_LEVELS + level`), summed over CPUs.
pub fn level_drops(maps: &Maps) -> Result<Vec<u64>, MapsError> {
    maps.level_drops
        .iter()
        .map(|values| {
            values
                .map(|v| v.iter().sum())
                .map_err(MapsError::on(names::LEVEL_DROPS))
        })
        .collect()
}

/// Dropped (or would-drop) frames per level of the `RULES` index `rule`,
/// summed over CPUs: its [`MAX_LEVELS`] entries of `LEVEL_DROPS` only (the
/// daemon reads the rules that have levels, not the whole map, each tick).
pub(crate) fn rule_level_drops(maps: &Maps, rule: u32) -> Result<[u64; MAX_LEVELS], MapsError> {
    let mut drops = [0; MAX_LEVELS];
    for (level, total) in drops.iter_mut().enumerate() {
        let values = maps
            .level_drops
            .get(&(rule * MAX_LEVELS as u32 + level as u32), 0)
            .map_err(MapsError::on(names::LEVEL_DROPS))?;
        *total = values.iter().sum();
    }
    Ok(drops)
}

/// Calls `each(key, window)` for every window of the rules' levels
/// (`AGGREGATES`), read in batches, without changing any. A walk stops
/// at the map's capacity (`penalty::walk`): one that a flood churns
/// meanwhile is bounded all the same.
pub fn aggregates(
    maps: &Maps,
    each: impl FnMut(&LevelKey, &LevelWindow),
) -> Result<Walk, MapsError> {
    let map = maps.aggregates.map();
    let cap = penalty::cap_of(map, names::AGGREGATES)?;
    penalty::walk(map, names::AGGREGATES, cap, batch::BATCH, each)
}

/// As [`aggregates`], visiting at most `cap` entries (a per-tick budget);
/// whether it reached the end.
pub(crate) fn aggregates_capped(
    maps: &Maps,
    cap: usize,
    each: impl FnMut(&LevelKey, &LevelWindow),
) -> Result<Walk, MapsError> {
    let map = maps.aggregates.map();
    let cap = cap.min(penalty::cap_of(map, names::AGGREGATES)?);
    penalty::walk(map, names::AGGREGATES, cap, batch::BATCH, each)
}

/// Sources evicted from the window map so far: every entry is created by
/// the kernel (counted as `new_source`) and leaves either by LRU eviction or
/// by a userspace delete, so `created - live - deleted` is exact.
pub const fn evictions(created: u64, live: u64, deleted_by_userspace: u64) -> u64 {
    created.saturating_sub(live + deleted_by_userspace)
}

/// Sources seen in the cheap tier's last epoch, estimated from its sketch
/// (`ActiveSources::read`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActiveSources {
    /// The estimate: the sources that sent a frame in the epoch, each
    /// counted once however many frames it sent.
    pub estimate: u64,
    /// Nearly every word was touched: the estimate is a floor, not a
    /// count (see [`ActiveSources::from_touched`]).
    pub saturated: bool,
}

impl ActiveSources {
    /// Words past which the estimate is a floor: past ~3 sources a word
    /// the untouched words are too few for linear counting to be within
    /// a few percent (at 2^16 words, about 200,000 sources an epoch).
    const SATURATED_PERCENT: u64 = 95;

    /// Linear counting: each source touches one of `words` words, chosen
    /// by a keyed hash, so with `touched` words touched the number of
    /// sources is about `-words * ln(1 - touched / words)`. For words
    /// drawn at random the standard error stays under 1% up to
    /// saturation (2^16 words: 0.3% at 50,000 sources, 0.5% at 190,000);
    /// the kernel's hash spreads runs of sequential addresses less evenly
    /// (within about 5%, by its random key).
    pub fn from_touched(touched: u64, words: u64) -> Self {
        let untouched = words.saturating_sub(touched).max(1);
        let estimate = -(words as f64) * (untouched as f64 / words as f64).ln();
        Self {
            estimate: estimate.round() as u64,
            saturated: touched * 100 >= words * Self::SATURATED_PERCENT,
        }
    }

    /// Reads the sketch (one batched read of its 1 MiB) and estimates
    /// the sources of the epoch tagged `tag`: the entries whose word of
    /// that epoch it touched. The next epoch counts in the other word of
    /// each entry, so read any time in the next epoch this counts exactly
    /// that epoch's sources.
    pub fn read(maps: &Maps, tag: u64) -> Result<Self, MapsError> {
        let half = sketch::half(tag);
        let mut touched = 0u64;
        let mut words = 0u64;
        batch::for_each_per_cpu::<u32, sketch::Pair>(
            batch::fd(maps.sketch_data()),
            1,
            |_, pair| {
                words += 1;
                if sketch::touched(pair[0][half], tag) {
                    touched += 1;
                }
            },
        )
        .map_err(|source| MapsError::Batch {
            map: names::SKETCH,
            source,
        })?;
        Ok(Self::from_touched(touched, words))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Words the first `n` of a run of addresses touch, placed as the
    /// kernel places them.
    fn touched_by(n: u32) -> u64 {
        let mut touched = std::collections::HashSet::new();
        for i in 0..n {
            let addr = 0x0a00_0000u32
                .wrapping_add(i.wrapping_mul(2_654_435_761))
                .to_be_bytes();
            let mut key = [0u8; 16];
            key[..4].copy_from_slice(&addr);
            touched.insert(sketch::place(&key, false, 32, 0, 0x1234_5678).word);
        }
        touched.len() as u64
    }

    #[test]
    fn linear_counting_is_within_a_few_percent_until_saturated() {
        for n in [1_000u32, 10_000, 50_000, 150_000] {
            let active = ActiveSources::from_touched(touched_by(n), u64::from(sketch::WORDS));
            let error = active.estimate.abs_diff(u64::from(n)) as f64 / f64::from(n);
            assert!(error < 0.03, "{n} sources: {active:?}");
            assert!(!active.saturated, "{n} sources: {active:?}");
        }
        let flood = ActiveSources::from_touched(touched_by(1_000_000), u64::from(sketch::WORDS));
        assert!(flood.saturated, "{flood:?}");
        assert!(flood.estimate >= 190_000, "a floor: {flood:?}");
        assert_eq!(ActiveSources::from_touched(0, 65_536).estimate, 0);
    }
}
