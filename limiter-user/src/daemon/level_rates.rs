//! The rates of the aggregates of rules' levels, once a tick, for the
//! history (`history`, series `rule x level`) and the histogram
//! `xdp_limiter_level_rate_pps`: each live aggregate's packets in its
//! window now (the estimate the kernel judges the next frame against, as
//! `top --level` reads it), normalised to a second.
//!
//! Only rules of the live generation with levels are read, and the walk of
//! `AGGREGATES` is capped at `[daemon] sources_per_tick` entries a tick,
//! as the source sweep is (the map holds `max_hot_sources`, 16,384 by
//! default, so by default every aggregate is read every tick). A walk cut
//! short by its cap reads the map's first entries only, each tick.

use std::collections::HashMap;

use limiter_common::{rules::rules_base, Level};

use super::metrics::RuleLevels;
use crate::{
    cluster::tick::estimate_at,
    kernel::{read, Instance, MapsError},
};

/// A live level as the kernel has it, with its names.
pub struct LiveLevel<'a> {
    pub rule: &'a str,
    pub label: &'a str,
    level: Level,
}

/// The live levels read, and `(index into them, packets per second)` per
/// aggregate with packets in its window.
pub type LevelRates<'a> = (Vec<LiveLevel<'a>>, Vec<(usize, f64)>);

/// The aggregates' rates of `instance`'s live levels (the rules of
/// `levels` in the generation `generation`): `(index into the first
/// vector, packets per second)` for each aggregate with packets in its
/// window, at most `budget` aggregates read.
pub fn read<'a>(
    instance: &Instance,
    levels: impl Iterator<Item = &'a RuleLevels>,
    generation: u32,
    budget: usize,
    now_ns: u64,
) -> Result<LevelRates<'a>, MapsError> {
    let maps = &instance.program.maps;
    let base = rules_base(generation);
    let mut live = Vec::new();
    // (rule's level tag, 1 + level index) -> `live` index
    let mut by_key: HashMap<(u32, u8), usize> = HashMap::new();
    for rule in levels {
        if !(base..base + limiter_common::rules::MAX_RULES).contains(&rule.index) {
            continue;
        }
        let compiled = maps.rule(rule.index)?;
        for (i, label) in rule.labels.iter().enumerate() {
            let Some(level) = compiled.levels.get(i).filter(|l| l.kind().is_some()) else {
                continue;
            };
            by_key.insert((compiled.level_tag(), i as u8 + 1), live.len());
            live.push(LiveLevel {
                rule: &rule.rule,
                label,
                level: *level,
            });
        }
    }
    let mut rates = Vec::new();
    if live.is_empty() {
        return Ok((live, rates));
    }
    read::aggregates_capped(maps, budget, |key, value| {
        let Some(&at) = by_key.get(&(key.tag, key.level)) else {
            return;
        };
        let level = &live[at].level;
        // A window of another bucket width holds nothing the level counts
        // yet (the kernel clears it first), as in `top --level`.
        if value.window.bucket_ns != level.bucket_ns {
            return;
        }
        let packets = estimate_at(&value.window.slots, level.bucket_ns, level.buckets, now_ns);
        let window_s = (level.bucket_ns as f64 * f64::from(level.buckets.max(1))) / 1e9;
        if packets > 0 && window_s > 0.0 {
            rates.push((at, packets as f64 / window_s));
        }
    })?;
    Ok((live, rates))
}
