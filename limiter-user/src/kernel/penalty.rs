//! Penalties (`block`) as the kernel keeps them: in each source's shared
//! window, tagged with the rule that armed them, honoured only while the
//! rule in force carries that tag.

use ipnet::IpNet;
use limiter_common::{Hold, SourceKey};

use super::Maps;

/// `bpf_map_update_elem` flag: only update an existing entry.
const BPF_EXIST: u64 = 2;

/// Whether `key` is blocked at `now_ns` by the rule at `RULES` index
/// `rule_index` (its window is keyed by the rule's budget).
pub fn is_blocked(maps: &Maps, key: &SourceKey, rule_index: u32, now_ns: u64) -> bool {
    let Ok(rule) = maps.rule(rule_index) else {
        return false;
    };
    maps.window(&key.with_class(rule.budget))
        .is_some_and(|window| window.blocked_at(now_ns, rule.block_tag))
}

/// Lifts the penalty of every source inside `cidr` whose penalty still
/// runs at `now_ns`; how many were lifted. Sources keep their windows (and
/// a refusal over the limit stays a refusal); the penalties kept apart
/// from them (`HOLDS`) go. A CPU that already
/// concluded "blocked" keeps refusing until it looks again: the caller
/// pushes the rules again so every CPU re-resolves.
pub fn lift(maps: &mut Maps, cidr: &IpNet, now_ns: u64) -> usize {
    let inside = |key: &SourceKey| cidr.contains(&key.ip()) && key.prefix_len >= cidr.prefix_len();
    let kept: Vec<SourceKey> = maps
        .holds
        .iter()
        .filter_map(Result::ok)
        .filter(|(key, held)| held.tag != 0 && inside(key))
        .map(|(key, _)| key)
        .collect();
    for key in kept {
        let _ = maps.holds.remove(&key);
    }
    let mut lifted = 0;
    for windows in [&mut maps.windows, &mut maps.window_spill] {
        let keys: Vec<SourceKey> = windows
            .keys()
            .filter_map(Result::ok)
            .filter(|key| inside(key))
            .collect();
        for key in keys {
            let Ok(mut window) = windows.get(&key, 0) else {
                continue;
            };
            if window.blocked_until_ns <= now_ns {
                continue;
            }
            window.blocked_until_ns = 0;
            window.blocked_tag = 0;
            // Only while the source still has its window.
            if windows.insert(key, window, BPF_EXIST).is_ok() {
                lifted += 1;
            }
        }
    }
    lifted
}

/// Removes the holds kept apart from the windows (`HOLDS`) that ended
/// before `now_ns` (the kernel removes one when it finds it ended; this
/// keeps the map from filling with holds of sources that never came back).
pub fn sweep(maps: &mut Maps, now_ns: u64) -> Holds {
    let entries: Vec<(SourceKey, Hold)> = maps.holds.iter().filter_map(Result::ok).collect();
    let mut holds = Holds::default();
    for (key, held) in entries {
        if held.until_ns <= now_ns {
            let _ = maps.holds.remove(&key);
            continue;
        }
        holds.kept += 1;
        if held.tag != 0 {
            holds.penalties += 1;
        }
    }
    holds
}

/// What [`sweep`] left in `HOLDS`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holds {
    /// Holds still running.
    pub kept: usize,
    /// Of them, penalties.
    pub penalties: usize,
}
