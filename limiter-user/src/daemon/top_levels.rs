//! `top --level`: the fullest aggregates of the levels a selector chooses
//! (`rules::level::select`), read from each interface's `AGGREGATES` when
//! asked (read-only, in batches), each with the packets its window holds
//! now, its allowance and the share used.
//!
//! A window is judged by its rule's level as the kernel has it (`RULES`:
//! the compiled `Level` and the rule's `level_tag`), so its estimate uses
//! the buckets the kernel counts in; a window whose tag no live rule
//! carries belongs to an older generation and is skipped.

use std::{cmp::Ordering, collections::HashMap};

use limiter_common::{rules::rules_base, Level, LevelKey, LevelKind};

use super::state::Daemon;
use crate::{
    cluster::tick::estimate_at,
    kernel::{self, read},
    proto::TopAggregate,
    rules::{
        level::select::{aggregate_key, LevelSelector},
        RuleSet, RuleSpec,
    },
};

/// The answer to `top --level` when no rule in force has levels.
pub const NO_LEVELS: &str = "no rule in force has levels: `top --level` shows the aggregates \
     of rules' levels (rule add --level, or `levels` in the configuration file)";

/// Windows held while walking before only the fullest are kept, so that
/// a map of a million windows does not become a million rows.
const HELD_WHILE_WALKING: usize = 4096;

/// A level the selector chose, as one interface's kernel has it.
struct Chosen {
    rule: String,
    label: String,
    kind: LevelKind,
    level: Level,
}

/// One window found, before it is named.
struct Found {
    iface: usize,
    chosen: usize,
    key: LevelKey,
    packets: u64,
    allowance: u64,
}

impl Found {
    /// Fullest first (by share used, then by packets), then in key order
    /// so that equal rows come out alike every time.
    fn fuller(&self, other: &Found) -> Ordering {
        let share = |a: &Found, b: &Found| u128::from(a.packets) * u128::from(b.allowance.max(1));
        share(other, self)
            .cmp(&share(self, other))
            .then(other.packets.cmp(&self.packets))
            .then((self.iface, self.chosen, self.key).cmp(&(other.iface, other.chosen, other.key)))
    }
}

/// Keeps the `limit` fullest of `rows`.
fn keep_fullest(rows: &mut Vec<Found>, limit: usize) {
    rows.sort_by(Found::fuller);
    rows.truncate(limit);
}

impl Daemon {
    /// The `limit` fullest aggregates of the live levels `selector`
    /// chooses, on every interface; an error naming the levels in force
    /// when it chooses none.
    pub(super) fn top_levels(
        &self,
        selector: &str,
        limit: usize,
    ) -> Result<Vec<TopAggregate>, String> {
        let chosen = chosen_levels(&self.config.rules, selector)?;
        let base = rules_base(self.generation);
        let now_ns = kernel::now().as_nanos() as u64;
        let mut rows: Vec<Found> = Vec::new();
        let mut named: Vec<Vec<Chosen>> = Vec::with_capacity(self.ifaces.len());
        for (iface_index, iface) in self.ifaces.iter().enumerate() {
            let name = &iface.instance.iface;
            let maps = &iface.instance.program.maps;
            let mut levels: Vec<Chosen> = Vec::with_capacity(chosen.len());
            // (rule's level tag, 1 + level index) -> `levels` index
            let mut by_key: HashMap<(u32, u8), usize> = HashMap::new();
            for &(position, spec, i) in &chosen {
                let rule = maps
                    .rule(base + position as u32)
                    .map_err(|e| format!("{name}: reading the rules: {e}"))?;
                let Some((level, kind)) = rule
                    .levels
                    .get(i)
                    .and_then(|level| Some((*level, level.kind()?)))
                else {
                    continue;
                };
                let label = spec
                    .levels
                    .get(i)
                    .map(|l| l.label(spec.limits.window))
                    .unwrap_or_default();
                by_key.insert((rule.level_tag(), i as u8 + 1), levels.len());
                levels.push(Chosen {
                    rule: spec.name.clone(),
                    label,
                    kind,
                    level,
                });
            }
            read::aggregates(maps, |key, value| {
                let Some(&at) = by_key.get(&(key.tag, key.level)) else {
                    return;
                };
                let level = &levels[at].level;
                // The kernel clears a window whose bucket width is not
                // its level's before counting in it: until then it holds
                // nothing the level counts.
                let packets = if value.window.bucket_ns == level.bucket_ns {
                    estimate_at(&value.window.slots, level.bucket_ns, level.buckets, now_ns)
                } else {
                    0
                };
                rows.push(Found {
                    iface: iface_index,
                    chosen: at,
                    key: *key,
                    packets,
                    allowance: level.allowance_packets,
                });
                if rows.len() >= limit.saturating_add(HELD_WHILE_WALKING) {
                    keep_fullest(&mut rows, limit);
                }
            })
            .map_err(|e| format!("{name}: reading the aggregates: {e}"))?;
            named.push(levels);
        }
        keep_fullest(&mut rows, limit);
        Ok(rows
            .into_iter()
            .map(|row| {
                let chosen = &named[row.iface][row.chosen];
                TopAggregate {
                    interface: self.ifaces[row.iface].instance.iface.clone(),
                    rule: chosen.rule.clone(),
                    level: chosen.label.clone(),
                    key: aggregate_key(chosen.kind, &row.key),
                    packets: row.packets,
                    allowance: row.allowance,
                    used: row.packets as f64 / row.allowance.max(1) as f64,
                }
            })
            .collect())
    }
}

/// The levels `selector` chooses among the rules in force, as (position
/// of the rule, the rule, index of the level in it); or why none: no rule
/// has levels, the selector does not read, or it matches none (with the
/// levels in force named).
fn chosen_levels<'a>(
    rules: &'a RuleSet,
    selector: &str,
) -> Result<Vec<(usize, &'a RuleSpec, usize)>, String> {
    let with_levels: Vec<(usize, &RuleSpec)> = std::iter::once(&rules.default)
        .chain(&rules.rules)
        .enumerate()
        .filter(|(_, spec)| !spec.levels.is_empty())
        .collect();
    if with_levels.is_empty() {
        return Err(NO_LEVELS.to_string());
    }
    let in_force = || {
        let rules: Vec<String> = with_levels
            .iter()
            .map(|(_, spec)| {
                let labels: Vec<String> = spec
                    .levels
                    .iter()
                    .map(|l| l.label(spec.limits.window))
                    .collect();
                format!("{}: {}", spec.name, labels.join(", "))
            })
            .collect();
        format!("the levels in force: {}", rules.join("; "))
    };
    let selector: LevelSelector = selector
        .parse()
        .map_err(|e| format!("{e}; {}", in_force()))?;
    // (position of the rule, the rule, index of the level in it)
    let chosen: Vec<(usize, &RuleSpec, usize)> = with_levels
        .iter()
        .flat_map(|(position, spec)| {
            spec.levels
                .iter()
                .enumerate()
                .filter(|(_, l)| selector.matches(&l.per, l.window.unwrap_or(spec.limits.window)))
                .map(move |(i, _)| (*position, *spec, i))
        })
        .collect();
    if chosen.is_empty() {
        return Err(format!(
            "no level in force matches `{selector}`; {}",
            in_force()
        ));
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(chosen: usize, packets: u64, allowance: u64) -> Found {
        Found {
            iface: 0,
            chosen,
            key: LevelKey::default(),
            packets,
            allowance,
        }
    }

    #[test]
    fn the_fullest_share_comes_first_then_the_most_packets() {
        let mut rows = vec![
            found(0, 50, 1000),
            found(1, 9, 10),
            found(2, 100, 1000),
            found(3, 10, 100),
            found(4, 0, 10),
        ];
        keep_fullest(&mut rows, 3);
        let order: Vec<usize> = rows.iter().map(|r| r.chosen).collect();
        assert_eq!(order, [1, 2, 3]);
    }
}
