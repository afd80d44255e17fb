//! Writing the `[[lists]]` into the kernel's list tries without a moment
//! in which a frame sees half a list: the new entries go into the half the
//! kernel does not read, `Config::list_half` flips on every instance, then
//! the old half is removed. All or nothing: a write that fails (a trie
//! full) removes what it wrote and leaves the live lists judging.

use aya::{
    maps::{lpm_trie::Key, LpmTrie, MapData},
    Pod,
};
use limiter_common::{
    lists::{ListRef, MAX_LISTS},
    names,
    rules::{prefix_key_v4, prefix_key_v6, PREFIX_HALF_BITS},
    Counter,
};

use super::{push::set_config, Maps, MapsError};
use crate::lists::Merged;

/// Makes `merged` the live lists of every instance.
pub fn load_all(instances: &mut [&mut Maps], merged: &Merged) -> Result<(), MapsError> {
    let mut live = Vec::with_capacity(instances.len());
    for maps in instances.iter() {
        live.push(maps.live_config()?);
    }
    for i in 0..instances.len() {
        let next = 1 - live[i].list_half % 2;
        if let Err(e) = write_half(instances[i], merged, next) {
            for (maps, config) in instances[..=i].iter_mut().zip(&live) {
                let _ = clear_half(maps, 1 - config.list_half % 2);
            }
            return Err(e);
        }
    }
    for (maps, config) in instances.iter_mut().zip(&live) {
        let old = config.list_half % 2;
        let mut flipped = *config;
        flipped.set_lists(!merged.v4.is_empty(), !merged.v6.is_empty(), 1 - old);
        set_config(maps, flipped)?;
        clear_half(maps, old)?;
    }
    Ok(())
}

/// Writes `merged` into half `half` of an instance's tries (whatever that
/// half held before is removed first).
fn write_half(maps: &mut Maps, merged: &Merged, half: u8) -> Result<(), MapsError> {
    clear_half(maps, half)?;
    let generation = u32::from(half);
    for (len, addr, value) in &merged.v4 {
        let key = Key::new(
            PREFIX_HALF_BITS + u32::from(*len),
            prefix_key_v4(generation, *addr),
        );
        maps.lists_v4
            .insert(&key, value, 0)
            .map_err(MapsError::on(names::LISTS_V4))?;
    }
    for (len, addr, value) in &merged.v6 {
        let key = Key::new(
            PREFIX_HALF_BITS + u32::from(*len),
            prefix_key_v6(generation, addr),
        );
        maps.lists_v6
            .insert(&key, value, 0)
            .map_err(MapsError::on(names::LISTS_V6))?;
    }
    Ok(())
}

/// Removes every entry of half `half` of both list tries.
fn clear_half(maps: &mut Maps, half: u8) -> Result<(), MapsError> {
    clear_trie(&mut maps.lists_v4, names::LISTS_V4, half)?;
    clear_trie(&mut maps.lists_v6, names::LISTS_V6, half)
}

fn clear_trie<K: Pod + AsRef<[u8]>>(
    trie: &mut LpmTrie<MapData, K, ListRef>,
    name: &'static str,
    half: u8,
) -> Result<(), MapsError> {
    let stale: Vec<Key<K>> = trie
        .keys()
        .filter_map(Result::ok)
        .filter(|k| k.data().as_ref().first() == Some(&half))
        .collect();
    for key in stale {
        trie.remove(&key).map_err(MapsError::on(name))?;
    }
    Ok(())
}

/// Frames each list judged, all CPUs summed, by list index.
pub fn hits(maps: &Maps, lists: usize) -> Result<Vec<Counter>, MapsError> {
    (0..lists.min(MAX_LISTS) as u32)
        .map(|i| {
            let per_cpu = maps
                .list_hits
                .get(&i, 0)
                .map_err(MapsError::on(names::LIST_HITS))?;
            Ok(per_cpu.iter().fold(Counter::default(), |a, c| a.merged(*c)))
        })
        .collect()
}

/// Zeroes the counters of every list: a new set of lists counts afresh
/// (a list's index may now name another list).
pub fn reset_hits(maps: &mut Maps) -> Result<(), MapsError> {
    let cpus = super::possible_cpus()?;
    for i in 0..MAX_LISTS as u32 {
        let zeros = aya::maps::PerCpuValues::try_from(vec![Counter::default(); cpus])
            .map_err(MapsError::Cpus)?;
        maps.list_hits
            .set(i, zeros, 0)
            .map_err(MapsError::on(names::LIST_HITS))?;
    }
    Ok(())
}
