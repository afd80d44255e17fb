//! Every map of the XDP program as a [`MapSpec`]: its name, kind, key and
//! value sizes, default capacity, who sizes it and whether the daemon pins
//! it, generated from the one table of maps ([`for_each_map!`](crate::for_each_map),
//! `maps/table.rs`).
//!
//! The kernel crate's map statics and the daemon's typed handles are
//! generated from the same table, and the kernel crate checks each static
//! against its spec at compile time (`limiter-ebpf/src/maps.rs`); the
//! daemon checks pinned maps against the specs before adopting them, in a
//! directory named after [`MAP_LAYOUT_VERSION`], which is derived from
//! them (`maps/version.rs`).

use core::mem::size_of;

mod table;
mod version;

pub use version::{layout_version, MAP_LAYOUT_VERSION, MAP_SEMANTICS};

/// Default capacity of the exact tier (`WINDOWS`, one shared window per
/// source; `HOLDS` as many penalties, `AGGREGATES` as many aggregates);
/// userspace sets the real size (`max_sources`) before loading.
pub const DEFAULT_MAX_SOURCES: u32 = 65_536;
/// Default capacity of the per-CPU state (`SOURCES`, the hot sources);
/// userspace sets the real size (`max_hot_sources`) before loading.
pub const DEFAULT_MAX_HOT_SOURCES: u32 = 16_384;

/// `WINDOWS` holds `max_sources / PROVEN_SHARE` windows more than there
/// are tickets (`UNPROVEN`): a quarter more, kept for TCP sources that
/// proved their address while the tickets were all taken.
pub const PROVEN_SHARE: u32 = 4;

/// Who decides a map's capacity (its number is hashed into
/// [`MAP_LAYOUT_VERSION`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizing {
    /// The table's `max_entries`.
    Fixed = 0,
    /// `max_sources`: the exact tier.
    Sources = 1,
    /// `max_hot_sources`: sources with per-CPU state.
    HotSources = 2,
    /// Twice `max_list_prefixes`: the list tries.
    Lists = 3,
    /// `max_sources` and a quarter (`window_capacity`): the windows,
    /// with room for proven sources beyond the tickets.
    Windows = 4,
}

/// The BPF map type of a [`MapSpec`] (what the key size means depends on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    LruPerCpuHash,
    LruHash,
    Hash,
    Array,
    PerCpuArray,
    /// Keys are the 4-byte prefix length, then the key data.
    LpmTrie,
    /// No keys or values; the capacity is the ring's size in bytes.
    RingBuf,
}

impl MapKind {
    /// The kernel's number for this map type (`enum bpf_map_type`).
    pub const fn bpf_map_type(self) -> u32 {
        match self {
            MapKind::Hash => 1,
            MapKind::Array => 2,
            MapKind::PerCpuArray => 6,
            MapKind::LruHash => 9,
            MapKind::LruPerCpuHash => 10,
            MapKind::LpmTrie => 11,
            MapKind::RingBuf => 27,
        }
    }

    /// Bytes of a key of a map of this kind declared with `declared`-byte
    /// keys: an LPM trie's key is the 4-byte prefix length, then the data.
    pub const fn key_size(self, declared: u32) -> u32 {
        match self {
            MapKind::LpmTrie => bytes::<u32>() + declared,
            _ => declared,
        }
    }
}

/// One map of the program, as the kernel defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    /// The map's name in the object (the kernel static's name).
    pub name: &'static str,
    pub kind: MapKind,
    /// Bytes of a key (an array's is its `u32` index).
    pub key_size: u32,
    /// Bytes of a value (of one CPU's value for per-CPU maps).
    pub value_size: u32,
    /// Capacity the object defines (bytes, for a ring buffer).
    pub max_entries: u32,
    /// The map's creation flags (`BPF_F_*`).
    pub flags: u32,
    /// Resized by userspace before loading, or not.
    pub sizing: Sizing,
    /// Pinned by the daemon under `maps-v<MAP_LAYOUT_VERSION>/`, so a
    /// restarted daemon adopts it. The ring buffer and the per-CPU
    /// scratch and budget maps hold nothing worth keeping.
    pub pinned: bool,
}

impl MapSpec {
    /// The capacity of this map once loaded for `max_sources` sources with
    /// exact state and `max_hot_sources` with per-CPU state, as a pinned
    /// map must have it to be adopted. `None` for the LPM tries:
    /// a pinned trie is adopted whatever its capacity: its capacity does
    /// not change how its entries read, only how many prefixes fit, and a
    /// push that does not fit fails as a whole.
    pub const fn expected_max_entries(
        &self,
        max_sources: u32,
        max_hot_sources: u32,
    ) -> Option<u32> {
        match (self.kind, self.sizing) {
            (MapKind::LpmTrie, _) => None,
            (_, Sizing::Sources) => Some(max_sources),
            (_, Sizing::Windows) => Some(window_capacity(max_sources)),
            (_, Sizing::HotSources) => Some(max_hot_sources),
            (_, Sizing::Fixed) => Some(self.max_entries),
            (_, Sizing::Lists) => None,
        }
    }

    /// A compile-time check of a map definition against this entry: fails
    /// the build (a panic in const evaluation) unless `name` is this
    /// entry's name.
    pub const fn check_name(&self, name: &str) {
        assert!(same_str(self.name, name), "map name differs from the table");
    }

    /// As [`check_name`](Self::check_name), and that `K` and `V` (the
    /// kernel static's key and value types, an LPM trie's key with its
    /// prefix length) have this entry's sizes.
    pub const fn check<K, V>(&self, name: &str) {
        self.check_name(name);
        assert!(
            size_of::<K>() == self.key_size as usize,
            "key size differs from the table"
        );
        assert!(
            size_of::<V>() == self.value_size as usize,
            "value size differs from the table"
        );
    }
}

/// The capacity of `WINDOWS` for `max_sources` tickets: a quarter more
/// (at least one more), the room of the sources that proved their
/// address.
pub const fn window_capacity(max_sources: u32) -> u32 {
    let more = max_sources / PROVEN_SHARE;
    max_sources.saturating_add(if more == 0 { 1 } else { more })
}

/// `a == b`, in const context.
const fn same_str(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn bytes<T>() -> u32 {
    size_of::<T>() as u32
}

/// Makes a [`MapSpec`] constant of each row of the table, [`ALL`] and
/// [`names`].
macro_rules! specs {
    (@pinned pinned) => {
        true
    };
    (@pinned $keep:ident) => {
        false
    };
    ($(
        $(#[$doc:meta])*
        $name:ident($field:ident): $kind:ident<$key:ty, $value:ty>,
            $sizing:ident($max_entries:expr), $keep:ident;
    )*) => {
        $(
            $(#[$doc])*
            pub const $name: MapSpec = MapSpec {
                name: stringify!($name),
                kind: MapKind::$kind,
                key_size: MapKind::$kind.key_size(bytes::<$key>()),
                value_size: bytes::<$value>(),
                max_entries: $max_entries,
                // No map of the program takes creation flags; one that
                // needs some would get them from a column of its row.
                flags: 0,
                sizing: Sizing::$sizing,
                pinned: specs!(@pinned $keep),
            };
        )*

        /// Every map of the program, in table order.
        pub const ALL: [MapSpec; [$(stringify!($name)),*].len()] = [$($name),*];

        /// Names of the maps and the program in the eBPF object, so that
        /// userspace looks up exactly what the kernel side defines (the
        /// maps' from the table).
        pub mod names {
            /// The XDP entry point.
            pub const PROGRAM: &str = "xdp_limiter";
            $(pub const $name: &str = super::$name.name;)*
        }
    };
}

crate::for_each_map!(specs);

/// The maps the daemon pins, in table order.
pub const PINNED: [MapSpec; pinned_count()] = pinned();

const fn pinned_count() -> usize {
    let mut count = 0;
    let mut i = 0;
    while i < ALL.len() {
        if ALL[i].pinned {
            count += 1;
        }
        i += 1;
    }
    count
}

const fn pinned() -> [MapSpec; pinned_count()] {
    let mut out = [ALL[0]; pinned_count()];
    let mut n = 0;
    let mut i = 0;
    while i < ALL.len() {
        if ALL[i].pinned {
            out[n] = ALL[i];
            n += 1;
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cluster::DEFAULT_MAX_CLUSTER_SOURCES, rules::RULE_SLOTS, Outcome};

    #[test]
    fn names_are_unique() {
        for (i, a) in ALL.iter().enumerate() {
            for b in &ALL[i + 1..] {
                assert_ne!(a.name, b.name);
            }
        }
    }

    #[test]
    fn the_daemon_pins_the_state_and_rule_maps() {
        let pinned: [&str; 28] = PINNED.map(|spec| spec.name);
        assert_eq!(
            pinned,
            [
                "SOURCES",
                "WINDOWS",
                "UNPROVEN",
                "TICKET_RING",
                "TICKET_CLOCK",
                "TICKET_COUNTS",
                "PREFIX_TICKETS",
                "STATS",
                "CONFIG",
                "RULES",
                "RULE_DROPS",
                "LEVEL_DROPS",
                "AGGREGATES",
                "AGG_CELLS",
                "PRESSURE",
                "PREFIXES_V4",
                "PREFIXES_V6",
                "LISTS_V4",
                "LISTS_V6",
                "LISTED_24S",
                "LIST_HITS",
                "BANS_V4",
                "BANS_V6",
                "SKETCH",
                "SHARE_MARKS",
                "HOLDS",
                "CLUSTER_SHARES",
                "CLUSTER"
            ]
        );
    }

    #[test]
    fn capacities_as_loaded() {
        assert_eq!(SOURCES.expected_max_entries(1000, 10), Some(10));
        assert_eq!(WINDOWS.expected_max_entries(1000, 10), Some(1250));
        assert_eq!(UNPROVEN.expected_max_entries(1000, 10), Some(1250));
        assert_eq!(TICKET_RING.expected_max_entries(1000, 10), Some(1250));
        assert_eq!(TICKET_CLOCK.expected_max_entries(1000, 10), Some(8));
        assert_eq!(PREFIX_TICKETS.expected_max_entries(1000, 10), Some(16_384));
        assert_eq!(
            TICKET_COUNTS.expected_max_entries(1000, 10),
            Some(2 * (RULE_SLOTS + 2))
        );
        assert_eq!(
            WINDOWS.expected_max_entries(3, 10),
            Some(4),
            "a proven window at least"
        );
        assert_eq!(HOLDS.expected_max_entries(1000, 10), Some(1000));
        assert_eq!(RULES.expected_max_entries(1000, 10), Some(RULE_SLOTS));
        assert_eq!(STATS.expected_max_entries(1000, 10), Some(Outcome::COUNT));
        assert_eq!(SKETCH.expected_max_entries(1000, 10), Some(1 << 16));
        assert_eq!(AGG_CELLS.expected_max_entries(1000, 10), Some(4096));
        assert_eq!(PRESSURE.expected_max_entries(1000, 10), Some(2));
        assert_eq!(SHARE_MARKS.expected_max_entries(1000, 10), Some(1 << 16));
        assert_eq!(PREFIXES_V4.expected_max_entries(1000, 10), None);
        assert_eq!(LISTS_V4.expected_max_entries(1000, 10), None);
        assert_eq!(LISTS_V4.sizing, Sizing::Lists);
        assert_eq!(
            CLUSTER_SHARES.expected_max_entries(1000, 10),
            Some(DEFAULT_MAX_CLUSTER_SOURCES)
        );
        assert_eq!(CLUSTER.expected_max_entries(1000, 10), Some(1));
        assert_eq!(AGGREGATES.expected_max_entries(1000, 10), Some(1000));
        assert_eq!(
            LEVEL_DROPS.expected_max_entries(1000, 10),
            Some(RULE_SLOTS * crate::rules::MAX_LEVELS as u32)
        );
    }

    #[test]
    fn sizes_of_the_layout() {
        // The sizes a pinned map of this layout version has.
        let sizes: [(&str, u32, u32); 28] = PINNED.map(|s| (s.name, s.key_size, s.value_size));
        assert_eq!(
            sizes,
            [
                ("SOURCES", 20, 184),
                ("WINDOWS", 20, 296),
                ("UNPROVEN", 20, 8),
                ("TICKET_RING", 4, 20),
                ("TICKET_CLOCK", 4, 8),
                ("TICKET_COUNTS", 4, 8),
                ("PREFIX_TICKETS", 4, 8),
                ("STATS", 4, 16),
                ("CONFIG", 4, 84),
                ("RULES", 4, 328),
                ("RULE_DROPS", 4, 8),
                ("LEVEL_DROPS", 4, 8),
                ("AGGREGATES", 24, 368),
                ("AGG_CELLS", 24, 368),
                ("PRESSURE", 4, 8),
                ("PREFIXES_V4", 9, 132),
                ("PREFIXES_V6", 21, 132),
                ("LISTS_V4", 9, 4),
                ("LISTS_V6", 21, 4),
                ("LISTED_24S", 4, 8),
                ("LIST_HITS", 4, 16),
                ("BANS_V4", 8, 64),
                ("BANS_V6", 20, 64),
                ("SKETCH", 4, 16),
                ("SHARE_MARKS", 4, 8),
                ("HOLDS", 20, 16),
                ("CLUSTER_SHARES", 20, 16),
                ("CLUSTER", 4, 32),
            ]
        );
    }
}
