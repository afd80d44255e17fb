//! Pushing a rule set into the kernel's maps, on one or several program
//! instances (one per interface), without a moment in which a source sees
//! a half-written rule, and all or nothing.
//!
//! Order: validate and compile once (nothing touched if that fails); on
//! every instance write the next generation's half: its `RULES` entries
//! (unused slots zeroed), its prefix-trie entries (the tries are keyed by
//! the generation's half, like `RULES`), its `RULE_DROPS` and
//! `LEVEL_DROPS` counters zeroed; then publish the new `Config` on every instance. Until that last step
//! nothing live has changed, so a failure leaves every instance as it was;
//! a failure while publishing puts the instances already published back.
//! Every instance gets the same generation. Every source re-resolves its
//! rule on its next frame; its counters and windows stay.
//!
//! Penalties: a rule keeps its `block_tag` across pushes while its
//! fingerprint (what it is and does) stays the same, so unrelated changes
//! keep the penalties it armed; a changed or removed rule's penalties lapse.

use aya::{
    maps::{lpm_trie::Key, LpmTrie, MapData, PerCpuValues},
    Pod,
};
use limiter_common::{
    names,
    rules::{
        half, prefix_key_v4, prefix_key_v6, rules_base, PrefixKeyV4, PrefixKeyV6, MAX_LEVELS,
        MAX_RULES, PREFIX_HALF_BITS,
    },
    Action, Config, RuleRefs,
};

use super::{cluster, possible_cpus, Maps, MapsError};
use crate::rules::{compile, Compiled, RuleError, RuleSet};

/// Why a push failed. A `Rules` error leaves the kernel untouched.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("invalid rules: {0}")]
    Rules(#[from] RuleError),
    #[error("{0}")]
    Maps(#[from] MapsError),
}

pub(crate) fn set_config(maps: &mut Maps, config: Config) -> Result<(), MapsError> {
    maps.config
        .set(0, config, 0)
        .map_err(MapsError::on(names::CONFIG))
}

/// Validates `set` and makes it live on one instance; the new generation.
pub fn push(maps: &mut Maps, set: &RuleSet) -> Result<u32, PushError> {
    push_all(&mut [maps], set).map(|pushed| pushed.generation)
}

/// A rule set made live: its generation and the tables compiled for it
/// (what the kernel now reads; the daemon resolves window keys to rules
/// with them rather than compiling the set again).
#[derive(Debug)]
pub struct Pushed {
    pub generation: u32,
    pub compiled: Compiled,
}

/// Validates `set` and makes it live on every instance as one generation
/// (one more than the newest live one), or on none.
pub fn push_all(instances: &mut [&mut Maps], set: &RuleSet) -> Result<Pushed, PushError> {
    let mut live = Vec::with_capacity(instances.len());
    for maps in instances.iter() {
        live.push(maps.live_config()?);
    }
    let newest = live.iter().map(|c| c.generation).max().unwrap_or(0);
    let generation = match newest.wrapping_add(1) {
        0 => 1,
        g => g,
    };
    let cpus = possible_cpus()?;
    let compiled = compile(set, rules_base(generation), cpus as u32)?;
    for (maps, live) in instances.iter_mut().zip(&live) {
        prepare(maps, &compiled, generation, live.generation, cpus)?;
    }
    let mut config = compiled.config;
    config.generation = generation;
    // The cheap tier's hash key: kept across pushes (a new key would
    // restart every source's count mid-epoch), chosen at random the first
    // time.
    config.sketch_seed = live
        .iter()
        .map(|c| c.sketch_seed)
        .find(|seed| *seed != 0)
        .unwrap_or_else(random_seed);
    for i in 0..instances.len() {
        // The lists and bans are not the rules': each instance keeps its own.
        if let Err(e) = set_config(instances[i], config.keep_lists_of(&live[i])) {
            // Put back the instances already switched (best effort: the
            // same write just failed on another instance).
            for (maps, old) in instances[..i].iter_mut().zip(&live) {
                let _ = set_config(maps, *old);
            }
            return Err(e.into());
        }
    }
    // Each rule that keeps windows gets its reserve of tickets (a flood
    // under one rule never takes another's), the rest shared: set with
    // the rules now live.
    let limiting = compiled
        .rules
        .iter()
        .filter(|rule| rule.action() == Some(Action::Limit))
        .count() as u32;
    for maps in instances.iter_mut() {
        let capacity = maps.ticket_capacity()?;
        maps.set_ticket_rooms(capacity, limiting)?;
    }
    Ok(Pushed {
        generation,
        compiled,
    })
}

/// Writes generation `generation`'s half on one instance whose live
/// generation is `live`: rules with their block tags, tries, zeroed drop
/// counters. Nothing live changes.
fn prepare(
    maps: &mut Maps,
    compiled: &Compiled,
    generation: u32,
    live: u32,
    cpus: usize,
) -> Result<(), MapsError> {
    let base = rules_base(generation);
    // The live rules' tags, by fingerprint.
    let mut live_tags = Vec::new();
    if live != 0 {
        let live_base = rules_base(live);
        for i in 0..MAX_RULES {
            let rule = maps.rule(live_base + i)?;
            if rule.fingerprint != 0 && rule.block_tag != 0 {
                live_tags.push((rule.fingerprint, rule.block_tag));
            }
        }
    }
    for i in 0..MAX_RULES {
        let mut rule = compiled.rules.get(i as usize).copied().unwrap_or_default();
        cluster::kernel_ready(&mut rule);
        if rule.block_ns != 0 {
            rule.block_tag = live_tags
                .iter()
                .find(|(fingerprint, _)| *fingerprint == rule.fingerprint)
                .map_or_else(|| fresh_tag(generation, i), |(_, tag)| *tag);
        }
        maps.rules
            .set(base + i, rule, 0)
            .map_err(MapsError::on(names::RULES))?;
    }
    for i in 0..MAX_RULES {
        let zeros = PerCpuValues::try_from(vec![0u64; cpus]).map_err(MapsError::Cpus)?;
        maps.rule_drops
            .set(base + i, zeros, 0)
            .map_err(MapsError::on(names::RULE_DROPS))?;
        // Its levels' counters too: a rule of the new generation must not
        // inherit the drops of the one that had its index two pushes ago.
        for level in 0..MAX_LEVELS as u32 {
            let zeros = PerCpuValues::try_from(vec![0u64; cpus]).map_err(MapsError::Cpus)?;
            maps.level_drops
                .set((base + i) * MAX_LEVELS as u32 + level, zeros, 0)
                .map_err(MapsError::on(names::LEVEL_DROPS))?;
        }
    }
    let v4: Vec<(u8, PrefixKeyV4, RuleRefs)> = compiled
        .v4
        .iter()
        .map(|(len, addr, refs)| (*len, prefix_key_v4(generation, *addr), *refs))
        .collect();
    let v6: Vec<(u8, PrefixKeyV6, RuleRefs)> = compiled
        .v6
        .iter()
        .map(|(len, addr, refs)| (*len, prefix_key_v6(generation, addr), *refs))
        .collect();
    write_trie(&mut maps.prefixes_v4, names::PREFIXES_V4, generation, &v4)?;
    write_trie(&mut maps.prefixes_v6, names::PREFIXES_V6, generation, &v6)?;
    Ok(())
}

/// A block tag no earlier push used: the generation and the rule's index.
fn fresh_tag(generation: u32, index: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index + 1)
}

/// Writes generation `generation`'s entries of a trie (key data: the half
/// byte, then the address), then removes that half's entries that are no
/// longer wanted. The other half, the live one, is not touched.
fn write_trie<K: Pod + PartialEq + AsRef<[u8]>>(
    trie: &mut LpmTrie<MapData, K, RuleRefs>,
    name: &'static str,
    generation: u32,
    entries: &[(u8, K, RuleRefs)],
) -> Result<(), MapsError> {
    let half = half(generation);
    let key = |len: u8, data: K| Key::new(PREFIX_HALF_BITS + u32::from(len), data);
    for (prefix_len, data, refs) in entries {
        trie.insert(&key(*prefix_len, *data), refs, 0)
            .map_err(MapsError::on(name))?;
    }
    let stale: Vec<Key<K>> = trie
        .keys()
        .filter_map(Result::ok)
        .filter(|k| {
            let data = k.data();
            data.as_ref().first() == Some(&half)
                && !entries.iter().any(|(len, wanted, _)| {
                    PREFIX_HALF_BITS + u32::from(*len) == k.prefix_len() && *wanted == data
                })
        })
        .collect();
    for key in stale {
        trie.remove(&key).map_err(MapsError::on(name))?;
    }
    Ok(())
}

/// A random non-zero `u32` (std's per-process random hash keys).
fn random_seed() -> u32 {
    use std::hash::{BuildHasher, RandomState};
    let seed = RandomState::new().hash_one(std::process::id()) as u32;
    seed.max(1)
}
