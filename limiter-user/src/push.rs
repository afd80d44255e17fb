//! Pushing a rule set into the kernel's maps without a moment in which a
//! source sees a half-written rule.
//!
//! Order: validate and compile (nothing touched if that fails), write the
//! rules into the `RULES` half that the live generation does not use, write
//! the prefix tries, drop stale prefixes, then publish the new `Config`
//! with the generation bumped. Every source re-resolves its rule on its
//! next frame; its counters stay.

use aya::{
    maps::{lpm_trie::Key, Array, LpmTrie, MapData, MapError},
    Ebpf, Pod,
};
use limiter_common::{names, rules::MAX_RULES, Config, Rule, RuleRefs};

use crate::rules::{compile, RuleError, RuleSet};

/// Why a push failed. A `Rules` error leaves the kernel untouched.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("invalid rules: {0}")]
    Rules(#[from] RuleError),
    #[error("map `{0}` is missing from the loaded object")]
    MissingMap(&'static str),
    #[error("writing map `{map}`: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
}

fn map_err(map: &'static str) -> impl Fn(MapError) -> PushError {
    move |source| PushError::Map { map, source }
}

fn map_mut<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut aya::maps::Map, PushError> {
    ebpf.map_mut(name).ok_or(PushError::MissingMap(name))
}

/// The live configuration (generation 0: nothing pushed yet).
pub fn current_config(ebpf: &Ebpf) -> Result<Config, PushError> {
    let map = ebpf
        .map(names::CONFIG)
        .ok_or(PushError::MissingMap(names::CONFIG))?;
    let config = Array::<_, Config>::try_from(map).map_err(map_err(names::CONFIG))?;
    config.get(&0, 0).map_err(map_err(names::CONFIG))
}

/// Validates `set` and makes it live; returns the new generation.
pub fn push(ebpf: &mut Ebpf, set: &RuleSet) -> Result<u32, PushError> {
    let live = current_config(ebpf)?.generation;
    let generation = match live.wrapping_add(1) {
        0 => 1,
        g => g,
    };
    let base = (generation % 2) * MAX_RULES;
    let cpus = aya::util::nr_cpus().map_or(1, |n| n as u32);
    let compiled = compile(set, base, cpus)?;

    let mut rules =
        Array::<_, Rule>::try_from(map_mut(ebpf, names::RULES)?).map_err(map_err(names::RULES))?;
    for (i, rule) in compiled.rules.iter().enumerate() {
        rules
            .set(base + i as u32, rule, 0)
            .map_err(map_err(names::RULES))?;
    }
    write_trie(ebpf, names::PREFIXES_V4, &compiled.v4)?;
    write_trie(ebpf, names::PREFIXES_V6, &compiled.v6)?;

    let config = Config {
        generation,
        ..compiled.config
    };
    let mut live_config = Array::<_, Config>::try_from(map_mut(ebpf, names::CONFIG)?)
        .map_err(map_err(names::CONFIG))?;
    live_config
        .set(0, config, 0)
        .map_err(map_err(names::CONFIG))?;
    Ok(generation)
}

/// Writes every entry, then removes prefixes that are no longer wanted.
fn write_trie<K: Pod + PartialEq>(
    ebpf: &mut Ebpf,
    name: &'static str,
    entries: &[(u8, K, RuleRefs)],
) -> Result<(), PushError> {
    let mut trie: LpmTrie<&mut MapData, K, RuleRefs> =
        LpmTrie::try_from(map_mut(ebpf, name)?).map_err(map_err(name))?;
    for (prefix_len, data, refs) in entries {
        trie.insert(&Key::new(u32::from(*prefix_len), *data), refs, 0)
            .map_err(map_err(name))?;
    }
    let stale: Vec<Key<K>> = trie
        .keys()
        .filter_map(Result::ok)
        .filter(|key| {
            !entries
                .iter()
                .any(|(len, data, _)| u32::from(*len) == key.prefix_len() && *data == key.data())
        })
        .collect();
    for key in stale {
        trie.remove(&key).map_err(map_err(name))?;
    }
    Ok(())
}
