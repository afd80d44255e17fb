//! The version of the pinned maps' layout, which names their pin directory
//! (`maps-v<N>`): a daemon adopts only pinned maps of its own version.
//!
//! Two parts make it:
//!
//! - what the table says of each pinned map: its name, kind, key size,
//!   value size, creation flags and who sizes it. A change to any of them
//!   changes the version by itself: nothing to remember.
//! - [`MAP_SEMANTICS`], kept by hand, for what sizes do not reveal: a key
//!   or value whose fields were reordered, or one whose field now means
//!   something else, at the same size. Bump it with any such change.
//!
//! Left out on purpose: capacities (the daemon recreates a pinned map of
//! another capacity alone, `pins::drop_incompatible_pins`, and adopts an
//! LPM trie of any capacity), the maps that are not pinned (nothing of
//! theirs survives a restart), and the order of the table's rows.

use super::{MapSpec, PINNED};

/// The hand-kept part of [`MAP_LAYOUT_VERSION`]: bump it when a pinned
/// map's key or value changes layout or meaning without changing size.
pub const MAP_SEMANTICS: u32 = 1;

/// The version of the pinned maps' layout: [`layout_version`] of the
/// pinned maps and [`MAP_SEMANTICS`].
pub const MAP_LAYOUT_VERSION: u32 = layout_version(&PINNED, MAP_SEMANTICS);

/// Pin directories `maps-v0` to `maps-v7` hold layouts this build cannot
/// read: a derived version is never below this.
const FIRST_DERIVED: u32 = 8;

const FNV_OFFSET: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;

/// FNV-1a of `bytes`, continuing from `hash`.
const fn fnv1a(mut hash: u32, bytes: &[u8]) -> u32 {
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u32;
        hash = hash.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    hash
}

const fn fnv1a_u32(hash: u32, value: u32) -> u32 {
    fnv1a(hash, &value.to_le_bytes())
}

/// What of `spec` the version covers, hashed.
const fn spec_hash(spec: &MapSpec) -> u32 {
    let mut hash = fnv1a(FNV_OFFSET, spec.name.as_bytes());
    // Ends the name, so that no two names run into the fields alike.
    hash = fnv1a(hash, &[0]);
    hash = fnv1a_u32(hash, spec.kind.bpf_map_type());
    hash = fnv1a_u32(hash, spec.key_size);
    hash = fnv1a_u32(hash, spec.value_size);
    hash = fnv1a_u32(hash, spec.flags);
    fnv1a_u32(hash, spec.sizing as u32)
}

/// The layout version of the pinned maps among `specs` under hand-kept
/// `semantics`: an FNV-1a hash of `semantics` and of the sum of each
/// pinned map's hash (a sum, so that the rows' order does not count),
/// never below `FIRST_DERIVED`.
pub const fn layout_version(specs: &[MapSpec], semantics: u32) -> u32 {
    let mut sum: u32 = 0;
    let mut i = 0;
    while i < specs.len() {
        if specs[i].pinned {
            sum = sum.wrapping_add(spec_hash(&specs[i]));
        }
        i += 1;
    }
    let version = fnv1a_u32(fnv1a_u32(FNV_OFFSET, semantics), sum);
    if version < FIRST_DERIVED {
        version + FIRST_DERIVED
    } else {
        version
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maps::{MapKind, Sizing, ALL, WINDOWS};

    #[test]
    fn the_version_is_the_pinned_maps_and_the_semantics() {
        assert_eq!(MAP_LAYOUT_VERSION, layout_version(&ALL, MAP_SEMANTICS));
    }

    #[test]
    fn a_value_size_changes_the_version() {
        let mut table = ALL;
        let windows = table
            .iter_mut()
            .find(|spec| spec.name == WINDOWS.name)
            .expect("WINDOWS in the table");
        windows.value_size += 8;
        assert_ne!(layout_version(&table, MAP_SEMANTICS), MAP_LAYOUT_VERSION);
    }

    #[test]
    fn each_field_of_a_pinned_map_changes_the_version() {
        let changes: [fn(&mut MapSpec); 6] = [
            |spec| spec.name = "WINDOWS_2",
            |spec| spec.kind = MapKind::LruHash,
            |spec| spec.key_size += 1,
            |spec| spec.value_size -= 8,
            |spec| spec.flags = 1,
            |spec| spec.sizing = Sizing::Fixed,
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut table = ALL;
            table
                .iter_mut()
                .filter(|spec| spec.name == WINDOWS.name)
                .for_each(change);
            assert_ne!(
                layout_version(&table, MAP_SEMANTICS),
                MAP_LAYOUT_VERSION,
                "change {i}"
            );
        }
    }

    #[test]
    fn the_semantics_changes_the_version() {
        assert_ne!(layout_version(&ALL, MAP_SEMANTICS + 1), MAP_LAYOUT_VERSION);
    }

    #[test]
    fn capacities_unpinned_maps_and_order_do_not_count() {
        let mut table = ALL;
        for spec in table.iter_mut() {
            spec.max_entries *= 2;
            if !spec.pinned {
                spec.value_size += 8;
            }
        }
        table.reverse();
        assert_eq!(layout_version(&table, MAP_SEMANTICS), MAP_LAYOUT_VERSION);
    }
}
