//! Writing the `[[lists]]` into the kernel's list tries without a moment
//! in which a frame sees half a list: the new entries go into the half the
//! kernel does not read, the IPv4 /24 bitmap (`LISTED_24S`) widens to
//! cover both sets, `Config::list_half` flips on every instance, then the
//! old half is removed and the bitmap narrows to the new set. All or
//! nothing: a write that fails (a trie full) removes what it wrote and
//! leaves the live lists judging.

use aya::{
    maps::{lpm_trie::Key, IterableMap, LpmTrie, MapData},
    Pod,
};
use limiter_common::{
    lists::{span_bit, ListRef, MAX_LISTS, SPAN_WORDS},
    names,
    rules::{prefix_key_v4, prefix_key_v6, PREFIX_HALF_BITS},
    Counter,
};

use super::{batch, push::set_config, Maps, MapsError};
use crate::lists::Merged;

/// Makes `merged` the live lists of every instance.
pub fn load_all(instances: &mut [&mut Maps], merged: &Merged) -> Result<(), MapsError> {
    let mut live = Vec::with_capacity(instances.len());
    for maps in instances.iter() {
        live.push(maps.live_config()?);
    }
    let spans = v4_spans(merged);
    for i in 0..instances.len() {
        let next = 1 - live[i].list_half();
        let written = write_half(instances[i], merged, next)
            .and_then(|()| write_spans(instances[i], &spans, true));
        if let Err(e) = written {
            for (maps, config) in instances[..=i].iter_mut().zip(&live) {
                let _ = clear_half(maps, 1 - config.list_half());
            }
            return Err(e);
        }
    }
    for (maps, config) in instances.iter_mut().zip(&live) {
        let old = config.list_half();
        let mut flipped = *config;
        flipped.set_lists(!merged.v4.is_empty(), !merged.v6.is_empty(), 1 - old);
        set_config(maps, flipped)?;
        clear_half(maps, old)?;
        write_spans(maps, &spans, false)?;
    }
    Ok(())
}

/// The `LISTED_24S` words of `merged`'s IPv4 prefixes: the bit of every
/// /24 a prefix touches.
pub fn v4_spans(merged: &Merged) -> Vec<u64> {
    let mut words = vec![0u64; SPAN_WORDS as usize];
    for (len, addr, _) in &merged.v4 {
        let start = u32::from_be_bytes(*addr);
        let last = start | (u32::MAX.checked_shr(u32::from(*len)).unwrap_or(0));
        for slash24 in (start >> 8)..=(last >> 8) {
            let (word, bit) = span_bit(slash24 << 8);
            words[word as usize] |= bit;
        }
    }
    words
}

/// Writes `spans` into `LISTED_24S`: with `widen`, ORed into what is
/// there (a superset while two sets of lists may be live), else exactly.
/// Read and written in batches, only the words that change.
fn write_spans(maps: &mut Maps, spans: &[u64], widen: bool) -> Result<(), MapsError> {
    let on = |e| MapsError::Batch {
        map: names::LISTED_24S,
        source: e,
    };
    let fd = batch::fd(maps.listed_24s.map());
    let mut have = vec![0u64; spans.len()];
    batch::read(
        fd,
        batch::BATCH,
        batch::Resume::Start,
        usize::MAX,
        |i: &u32, word: &u64| {
            if let Some(slot) = have.get_mut(*i as usize) {
                *slot = *word;
            }
        },
    )
    .map_err(on)?;
    let changed: Vec<(u32, u64)> = spans
        .iter()
        .zip(&have)
        .enumerate()
        .filter_map(|(i, (want, have))| {
            let value = if widen { have | want } else { *want };
            (value != *have).then_some((i as u32, value))
        })
        .collect();
    batch::update(fd, &changed).map_err(|(_, e)| on(e))
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

#[cfg(test)]
mod tests {
    use limiter_common::lists::{ListAction, ListRef};

    use super::*;

    fn bits(words: &[u64]) -> u32 {
        words.iter().map(|w| w.count_ones()).sum()
    }

    #[test]
    fn a_prefix_marks_every_slash_24_it_touches() {
        let value = ListRef::new(0, ListAction::Deny);
        let merged = |v4: Vec<(u8, [u8; 4], ListRef)>| Merged {
            v4,
            ..Merged::default()
        };
        let one = v4_spans(&merged(vec![(32, [192, 0, 2, 7], value)]));
        assert_eq!(bits(&one), 1);
        let (word, bit) = span_bit(u32::from_be_bytes([192, 0, 2, 200]));
        assert_ne!(one[word as usize] & bit, 0, "the same /24");
        let (word, bit) = span_bit(u32::from_be_bytes([192, 0, 3, 7]));
        assert_eq!(one[word as usize] & bit, 0, "the next /24");
        assert_eq!(
            bits(&v4_spans(&merged(vec![(16, [10, 1, 0, 0], value)]))),
            256
        );
        assert_eq!(bits(&v4_spans(&merged(vec![(0, [0; 4], value)]))), 1 << 24);
        assert_eq!(bits(&v4_spans(&Merged::default())), 0);
    }
}
