//! Penalties (`block`) as the kernel keeps them: in each source's shared
//! window, tagged with the rule that armed them, honoured only while the
//! rule in force carries that tag.
//!
//! `WINDOWS` and `HOLDS` are walked while a flood churns them, so they are
//! walked in batches ([`walk`]): a walk visits each hash bucket once and
//! at most about as many entries as the map holds, then stops and says so.

use aya::{
    maps::{IterableMap, MapData},
    Pod,
};
use ipnet::IpNet;
use limiter_common::{names, Hold, SourceKey, WindowState};

use super::{batch, Maps, MapsError};

/// `bpf_map_update_elem` flag: only update an existing entry.
const BPF_EXIST: u64 = 2;

/// Whether `key` is blocked at `now_ns` by the rule at `RULES` index
/// `rule_index` (its window is keyed by the rule's budget).
pub(crate) fn is_blocked(maps: &Maps, key: &SourceKey, rule_index: u32, now_ns: u64) -> bool {
    let Ok(rule) = maps.rule(rule_index) else {
        return false;
    };
    maps.window(&key.with_class(rule.budget))
        .is_some_and(|window| window.blocked_at(now_ns, rule.block_tag))
}

/// How a walk of a map ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    /// Entries visited.
    pub visited: usize,
    /// The walk reached the end of the map; `false`: it stopped at its
    /// cap of visited entries (the map was churning), and entries it had
    /// not reached were not visited.
    pub complete: bool,
}

/// Visits the entries of `map` (a hash map, not per-CPU) in batches of
/// `batch`, stopping once `cap` entries were visited (at most `batch - 1`
/// more are): bounded in time and memory however fast the map churns
/// meanwhile (see `batch::read`).
pub fn walk<K: Pod, V: Pod>(
    map: &MapData,
    name: &'static str,
    cap: usize,
    batch: usize,
    each: impl FnMut(&K, &V),
) -> Result<Walk, MapsError> {
    let (visited, rest) = batch::read(batch::fd(map), batch, batch::Resume::Start, cap, each)
        .map_err(|source| MapsError::Batch { map: name, source })?;
    Ok(Walk {
        visited,
        complete: rest.is_none(),
    })
}

/// The cap of one walk of `map`: its capacity. A walk of a stable map
/// visits no more; under churn, one that visited as many entries as the
/// map holds has done its share.
pub(crate) fn cap_of(map: &MapData, name: &'static str) -> Result<usize, MapsError> {
    map.info()
        .map(|info| info.max_entries() as usize)
        .map_err(MapsError::on(name))
}

/// What [`lift`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifted {
    /// Penalties lifted in the windows.
    pub lifted: usize,
    /// Both walks reached the end of their maps; `false`: one stopped at
    /// its cap, so penalties it had not reached may still run (lifting
    /// again reaches them).
    pub complete: bool,
}

/// Lifts the penalty of every source inside `cidr` whose penalty still
/// runs at `now_ns`: in `HOLDS`, and in the source's window if it has one
/// (a blocked source's window may have been reclaimed idle: `HOLDS` then
/// keeps its penalty alone). Sources keep their windows (and a refusal
/// over the limit stays a refusal). A CPU that already concluded
/// "blocked" keeps refusing until it looks again: the caller pushes the
/// rules again so every CPU re-resolves.
pub fn lift(maps: &mut Maps, cidr: &IpNet, now_ns: u64) -> Result<Lifted, MapsError> {
    let inside = |key: &SourceKey| cidr.contains(&key.ip()) && key.prefix_len >= cidr.prefix_len();
    let mut lifted = std::collections::BTreeSet::new();
    let holds = walk(
        maps.holds.map(),
        names::HOLDS,
        cap_of(maps.holds.map(), names::HOLDS)?,
        batch::BATCH,
        |key: &SourceKey, held: &Hold| {
            if held.until_ns > now_ns && inside(key) {
                lifted.insert(*key);
            }
        },
    )?;
    for key in &lifted {
        let _ = maps.holds.remove(key);
    }
    let mut keys = Vec::new();
    let windows = walk(
        maps.windows.map(),
        names::WINDOWS,
        cap_of(maps.windows.map(), names::WINDOWS)?,
        batch::BATCH,
        |key: &SourceKey, window: &WindowState| {
            if inside(key) && window.blocked_until_ns > now_ns {
                keys.push(*key);
            }
        },
    )?;
    for key in keys {
        // Read again: the kernel may have changed it since the walk.
        let Ok(mut window) = maps.windows.get(&key, 0) else {
            continue;
        };
        if window.blocked_until_ns <= now_ns {
            continue;
        }
        window.blocked_until_ns = 0;
        window.blocked_tag = 0;
        // Only while the source still has its window.
        if maps.windows.insert(key, window, BPF_EXIST).is_ok() {
            lifted.insert(key);
        }
    }
    Ok(Lifted {
        lifted: lifted.len(),
        complete: holds.complete && windows.complete,
    })
}

/// What [`sweep`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Swept {
    /// Penalties still running among those visited (`HOLDS` keeps only
    /// penalties: its entries).
    pub penalties: usize,
    /// The walk of `HOLDS` reached its end; `false`: it stopped at its
    /// cap, `penalties` is a floor and the next sweep starts over.
    pub complete: bool,
}

/// Removes the penalties kept apart from the windows (`HOLDS`) that ended
/// before `now_ns` (the kernel removes one when it finds it ended; this
/// keeps the map from filling with penalties of sources that never came
/// back), and counts the penalties that still run.
pub fn sweep(maps: &mut Maps, now_ns: u64) -> Result<Swept, MapsError> {
    let mut ended = Vec::new();
    let mut penalties = 0;
    let walked = walk(
        maps.holds.map(),
        names::HOLDS,
        cap_of(maps.holds.map(), names::HOLDS)?,
        batch::BATCH,
        |key: &SourceKey, held: &Hold| {
            if held.until_ns <= now_ns {
                ended.push(*key);
            } else {
                penalties += 1;
            }
        },
    )?;
    for key in ended {
        let _ = maps.holds.remove(&key);
    }
    Ok(Swept {
        penalties,
        complete: walked.complete,
    })
}
