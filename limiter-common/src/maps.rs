//! Every map of the XDP program in one table: its name, key and value
//! sizes, default capacity, whether userspace sizes it by `max_sources`,
//! and whether the daemon pins it.
//!
//! The table is the single statement of what the kernel defines and what
//! userspace expects: the kernel crate checks each of its map statics
//! against it at compile time (name, key and value sizes) and takes its
//! capacity from it (`limiter-ebpf/src/maps.rs`); the daemon checks pinned
//! maps against it before adopting them; [`names`] is derived from it. A
//! change of a key or value layout must also bump [`MAP_LAYOUT_VERSION`]:
//! sizes alone do not reveal a reordered field.

use core::mem::size_of;

use crate::{
    cluster::{ClusterShare, ClusterState, DEFAULT_MAX_CLUSTER_SOURCES},
    rules::{PrefixKeyV4, PrefixKeyV6, RULE_SLOTS},
    state::Hold,
    Config, Counter, Outcome, Rule, RuleRefs, SourceKey, SourceTraffic, WindowState,
};

/// Version of the map layouts (keys, values and their field order). Bump it
/// on any change: a daemon never adopts pinned maps of another version,
/// since sizes alone do not reveal a reordered field.
pub const MAP_LAYOUT_VERSION: u32 = 7;

/// Default capacity of the exact tier (`WINDOWS`, one shared window per
/// source, and as many in `WINDOW_SPILL`, `HOLDS` as many holds);
/// userspace sets the real size (`max_sources`) before loading.
pub const DEFAULT_MAX_SOURCES: u32 = 65_536;
/// Default capacity of the per-CPU state (`SOURCES`, the hot sources);
/// userspace sets the real size (`max_hot_sources`) before loading.
pub const DEFAULT_MAX_HOT_SOURCES: u32 = 16_384;

/// Who decides a map's capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizing {
    /// The table's `max_entries`.
    Fixed,
    /// `max_sources`: the exact tier.
    Sources,
    /// `max_hot_sources`: sources with per-CPU state.
    HotSources,
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

/// One map of the program, as the kernel defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    /// The map's name in the object (`#[map(name = ...)]`).
    pub name: &'static str,
    pub kind: MapKind,
    /// Bytes of a key (an array's is its `u32` index).
    pub key_size: u32,
    /// Bytes of a value (of one CPU's value for per-CPU maps).
    pub value_size: u32,
    /// Capacity the object defines (bytes, for a ring buffer).
    pub max_entries: u32,
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
    /// a pinned trie is adopted whatever its capacity (as it always was):
    /// its capacity does not change how its entries read, only how many
    /// prefixes fit, and a push that does not fit fails as a whole.
    pub const fn expected_max_entries(
        &self,
        max_sources: u32,
        max_hot_sources: u32,
    ) -> Option<u32> {
        match (self.kind, self.sizing) {
            (MapKind::LpmTrie, _) => None,
            (_, Sizing::Sources) => Some(max_sources),
            (_, Sizing::HotSources) => Some(max_hot_sources),
            (_, Sizing::Fixed) => Some(self.max_entries),
        }
    }

    /// A compile-time check of a map definition against this entry: fails
    /// the build (a panic in const evaluation) unless `name` is this
    /// entry's name. The kernel crate calls it with the literal its
    /// `#[map(name = ...)]` attribute needs.
    pub const fn check_name(&self, name: &str) {
        assert!(same_str(self.name, name), "map name differs from the table");
    }

    /// As [`check_name`](Self::check_name), and that `K` and `V` (the
    /// static's key and value types) have this entry's sizes.
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

/// An array's key: its `u32` index.
const INDEX: u32 = bytes::<u32>();

/// Offered traffic per source, per CPU: `SourceKey` -> `SourceTraffic`.
/// LRU: when full, the least recently seen source is evicted.
pub const SOURCES: MapSpec = MapSpec {
    name: "SOURCES",
    kind: MapKind::LruPerCpuHash,
    key_size: bytes::<SourceKey>(),
    value_size: bytes::<SourceTraffic>(),
    max_entries: DEFAULT_MAX_HOT_SOURCES,
    sizing: Sizing::HotSources,
    pinned: true,
};

/// Admission windows per source and rule budget, shared by all CPUs:
/// `SourceKey` -> `WindowState`. A plain hash, which never evicts: a
/// window is kept until the daemon finds it idle for its longest possible
/// length (`WindowState::idle_at`), so no flood of other sources can take
/// a source's count away. Full, new windows go to `WINDOW_SPILL`.
pub const WINDOWS: MapSpec = MapSpec {
    name: "WINDOWS",
    kind: MapKind::Hash,
    key_size: bytes::<SourceKey>(),
    value_size: bytes::<WindowState>(),
    max_entries: DEFAULT_MAX_SOURCES,
    sizing: Sizing::Sources,
    pinned: true,
};

/// The windows created while `WINDOWS` was full: `SourceKey` ->
/// `WindowState`. LRU: a flood of other sources may evict one, which
/// `HOLDS` then stands in for if its source was refused.
pub const WINDOW_SPILL: MapSpec = MapSpec {
    name: "WINDOW_SPILL",
    kind: MapKind::LruHash,
    key_size: bytes::<SourceKey>(),
    value_size: bytes::<WindowState>(),
    max_entries: DEFAULT_MAX_SOURCES,
    sizing: Sizing::Sources,
    pinned: true,
};

/// Per-CPU scratch for building a new `WINDOWS` value off the stack.
pub const WINDOW_SEED: MapSpec = MapSpec {
    name: "WINDOW_SEED",
    kind: MapKind::PerCpuArray,
    key_size: INDEX,
    value_size: bytes::<WindowState>(),
    max_entries: 1,
    sizing: Sizing::Fixed,
    pinned: false,
};

/// Per-CPU scratch for building a new `SOURCES` value off the stack.
pub const TRAFFIC_SEED: MapSpec = MapSpec {
    name: "TRAFFIC_SEED",
    kind: MapKind::PerCpuArray,
    key_size: INDEX,
    value_size: bytes::<SourceTraffic>(),
    max_entries: 1,
    sizing: Sizing::Fixed,
    pinned: false,
};

/// Per-CPU scratch holding the key of the frame being judged, off the
/// stack.
pub const FRAME_KEY: MapSpec = MapSpec {
    name: "FRAME_KEY",
    kind: MapKind::PerCpuArray,
    key_size: INDEX,
    value_size: bytes::<SourceKey>(),
    max_entries: 1,
    sizing: Sizing::Fixed,
    pinned: false,
};

/// Global per-CPU counters by `Outcome`.
pub const STATS: MapSpec = MapSpec {
    name: "STATS",
    kind: MapKind::PerCpuArray,
    key_size: INDEX,
    value_size: bytes::<Counter>(),
    max_entries: Outcome::COUNT,
    sizing: Sizing::Fixed,
    pinned: true,
};

/// The global `Config` (an array of one).
pub const CONFIG: MapSpec = MapSpec {
    name: "CONFIG",
    kind: MapKind::Array,
    key_size: INDEX,
    value_size: bytes::<Config>(),
    max_entries: 1,
    sizing: Sizing::Fixed,
    pinned: true,
};

/// Compiled `Rule`s, two generations' halves.
pub const RULES: MapSpec = MapSpec {
    name: "RULES",
    kind: MapKind::Array,
    key_size: INDEX,
    value_size: bytes::<Rule>(),
    max_entries: RULE_SLOTS,
    sizing: Sizing::Fixed,
    pinned: true,
};

/// Frames dropped (or would-be dropped) per `RULES` index, per CPU.
pub const RULE_DROPS: MapSpec = MapSpec {
    name: "RULE_DROPS",
    kind: MapKind::PerCpuArray,
    key_size: INDEX,
    value_size: bytes::<u64>(),
    max_entries: RULE_SLOTS,
    sizing: Sizing::Fixed,
    pinned: true,
};

/// IPv4 prefixes of both generations -> `RuleRefs` (keyed by
/// `rules::PrefixKeyV4`).
pub const PREFIXES_V4: MapSpec = MapSpec {
    name: "PREFIXES_V4",
    kind: MapKind::LpmTrie,
    key_size: INDEX + bytes::<PrefixKeyV4>(),
    value_size: bytes::<RuleRefs>(),
    max_entries: 4096,
    sizing: Sizing::Fixed,
    pinned: true,
};

/// IPv6 prefixes of both generations -> `RuleRefs` (keyed by
/// `rules::PrefixKeyV6`).
pub const PREFIXES_V6: MapSpec = MapSpec {
    name: "PREFIXES_V6",
    kind: MapKind::LpmTrie,
    key_size: INDEX + bytes::<PrefixKeyV6>(),
    value_size: bytes::<RuleRefs>(),
    max_entries: 4096,
    sizing: Sizing::Fixed,
    pinned: true,
};

/// Ring buffer of `LimitEvent`s (its capacity in bytes).
pub const EVENTS: MapSpec = MapSpec {
    name: "EVENTS",
    kind: MapKind::RingBuf,
    key_size: 0,
    value_size: 0,
    max_entries: 64 * 1024,
    sizing: Sizing::Fixed,
    pinned: false,
};

/// Per CPU: `[second, "source limited" events sent in it, "cluster hot"
/// reports sent in it]`, the events' rate limits (one budget per kind, so
/// that a flood of refused sources cannot starve the cluster's reports).
pub const EVENT_BUDGET: MapSpec = MapSpec {
    name: "EVENT_BUDGET",
    kind: MapKind::PerCpuArray,
    key_size: INDEX,
    value_size: bytes::<[u64; 3]>(),
    max_entries: 1,
    sizing: Sizing::Fixed,
    pinned: false,
};

/// The cold tier's counters (`sketch`): one row shared by every CPU, each
/// entry the words of the last two epochs (`sketch::Pair`).
pub const SKETCH: MapSpec = MapSpec {
    name: "SKETCH",
    kind: MapKind::Array,
    key_size: INDEX,
    value_size: bytes::<crate::sketch::Pair>(),
    max_entries: crate::sketch::WORDS,
    sizing: Sizing::Fixed,
    pinned: true,
};

/// The penalty marks: cell (`sketch::mark_cell` of `PENALTY_CELLS`) -> until when a source
/// of that cell may be blocked (ns), raised by the kernel when it arms a
/// penalty. The cheap tier judges no frame of a rule with a `block` whose
/// cell is marked, so a blocked source that fell silent (and left the
/// cheap tier's counters) is still refused from its window or `HOLDS`.
pub const PENALTY_MARKS: MapSpec = MapSpec {
    name: "PENALTY_MARKS",
    kind: MapKind::Array,
    key_size: INDEX,
    value_size: bytes::<u64>(),
    max_entries: crate::sketch::PENALTY_CELLS,
    sizing: Sizing::Fixed,
    pinned: true,
};

/// The share marks: cell (`sketch::mark_cell` of `SHARE_CELLS`) -> until when a source of
/// that cell may have a cluster share (ns), raised by the daemon when it
/// writes shares (the only writer: the kernel only reads it). The cheap
/// tier judges no frame of a cluster-scoped rule whose cell is marked, so
/// a source with a share is always held to it, never to the cheap tier's
/// cold-cap allowance.
pub const SHARE_MARKS: MapSpec = MapSpec {
    name: "SHARE_MARKS",
    kind: MapKind::Array,
    key_size: INDEX,
    value_size: bytes::<u64>(),
    max_entries: crate::sketch::SHARE_CELLS,
    sizing: Sizing::Fixed,
    pinned: true,
};

/// Holds apart from the windows: `SourceKey` (the window's key) ->
/// `Hold`. A plain hash, which never evicts (see `state::Hold`). Written
/// for every refusal, needed only for a spilled window (a kept one is
/// never evicted): telling them apart in `limit()` would cost stack that
/// 6.1 does not have. Full, a hold is not kept (`Outcome::HoldFailed`).
pub const HOLDS: MapSpec = MapSpec {
    name: "HOLDS",
    kind: MapKind::Hash,
    key_size: bytes::<SourceKey>(),
    value_size: bytes::<Hold>(),
    max_entries: DEFAULT_MAX_SOURCES,
    sizing: Sizing::Sources,
    pinned: true,
};

/// This node's allowance per cluster-scoped source, written by the daemon:
/// the window key (`SourceKey` with the rule's `budget` byte as class) ->
/// `ClusterShare`. LRU: the daemon's inserts evict the least recently used
/// share when full (that source falls back to the cold cap). Pinned: a
/// restarted daemon finds its sources still held to their shares, which
/// expire on their own (`expires_ns`), rather than all thrown back to the
/// cold cap at once.
pub const CLUSTER_SHARES: MapSpec = MapSpec {
    name: "CLUSTER_SHARES",
    kind: MapKind::LruHash,
    key_size: bytes::<SourceKey>(),
    value_size: bytes::<ClusterShare>(),
    max_entries: DEFAULT_MAX_CLUSTER_SOURCES,
    sizing: Sizing::Fixed,
    pinned: true,
};

/// The cluster state (an array of one `ClusterState`), refreshed by the
/// daemon every sync. Pinned: while a restarted daemon catches up, the
/// kernel keeps judging by the last refresh, and falls back on its own
/// once it is stale, as it would with the daemon gone.
pub const CLUSTER: MapSpec = MapSpec {
    name: "CLUSTER",
    kind: MapKind::Array,
    key_size: INDEX,
    value_size: bytes::<ClusterState>(),
    max_entries: 1,
    sizing: Sizing::Fixed,
    pinned: true,
};

/// Every map of the program.
pub const ALL: [MapSpec; 20] = [
    SOURCES,
    WINDOWS,
    WINDOW_SPILL,
    WINDOW_SEED,
    TRAFFIC_SEED,
    FRAME_KEY,
    STATS,
    CONFIG,
    RULES,
    RULE_DROPS,
    PREFIXES_V4,
    PREFIXES_V6,
    EVENTS,
    EVENT_BUDGET,
    SKETCH,
    PENALTY_MARKS,
    SHARE_MARKS,
    HOLDS,
    CLUSTER_SHARES,
    CLUSTER,
];

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

/// Names of the maps and the program in the eBPF object, so that userspace
/// looks up exactly what the kernel side defines (the maps' from the
/// table).
pub mod names {
    /// The XDP entry point.
    pub const PROGRAM: &str = "xdp_limiter";
    pub const SOURCES: &str = super::SOURCES.name;
    pub const WINDOWS: &str = super::WINDOWS.name;
    pub const WINDOW_SPILL: &str = super::WINDOW_SPILL.name;
    pub const WINDOW_SEED: &str = super::WINDOW_SEED.name;
    pub const TRAFFIC_SEED: &str = super::TRAFFIC_SEED.name;
    pub const FRAME_KEY: &str = super::FRAME_KEY.name;
    pub const STATS: &str = super::STATS.name;
    pub const CONFIG: &str = super::CONFIG.name;
    pub const RULES: &str = super::RULES.name;
    pub const RULE_DROPS: &str = super::RULE_DROPS.name;
    pub const PREFIXES_V4: &str = super::PREFIXES_V4.name;
    pub const PREFIXES_V6: &str = super::PREFIXES_V6.name;
    pub const EVENTS: &str = super::EVENTS.name;
    pub const EVENT_BUDGET: &str = super::EVENT_BUDGET.name;
    pub const SKETCH: &str = super::SKETCH.name;
    pub const PENALTY_MARKS: &str = super::PENALTY_MARKS.name;
    pub const SHARE_MARKS: &str = super::SHARE_MARKS.name;
    pub const HOLDS: &str = super::HOLDS.name;
    pub const CLUSTER_SHARES: &str = super::CLUSTER_SHARES.name;
    pub const CLUSTER: &str = super::CLUSTER.name;
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let pinned: [&str; 15] = PINNED.map(|spec| spec.name);
        assert_eq!(
            pinned,
            [
                "SOURCES",
                "WINDOWS",
                "WINDOW_SPILL",
                "STATS",
                "CONFIG",
                "RULES",
                "RULE_DROPS",
                "PREFIXES_V4",
                "PREFIXES_V6",
                "SKETCH",
                "PENALTY_MARKS",
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
        assert_eq!(WINDOWS.expected_max_entries(1000, 10), Some(1000));
        assert_eq!(WINDOW_SPILL.expected_max_entries(1000, 10), Some(1000));
        assert_eq!(HOLDS.expected_max_entries(1000, 10), Some(1000));
        assert_eq!(RULES.expected_max_entries(1000, 10), Some(RULE_SLOTS));
        assert_eq!(STATS.expected_max_entries(1000, 10), Some(Outcome::COUNT));
        assert_eq!(SKETCH.expected_max_entries(1000, 10), Some(1 << 16));
        assert_eq!(PENALTY_MARKS.expected_max_entries(1000, 10), Some(1 << 12));
        assert_eq!(SHARE_MARKS.expected_max_entries(1000, 10), Some(1 << 16));
        assert_eq!(PREFIXES_V4.expected_max_entries(1000, 10), None);
        assert_eq!(
            CLUSTER_SHARES.expected_max_entries(1000, 10),
            Some(DEFAULT_MAX_CLUSTER_SOURCES)
        );
        assert_eq!(CLUSTER.expected_max_entries(1000, 10), Some(1));
    }

    #[test]
    fn sizes_of_the_layout() {
        // The sizes a pinned map of this layout version has.
        let sizes: [(&str, u32, u32); 15] = PINNED.map(|s| (s.name, s.key_size, s.value_size));
        assert_eq!(
            sizes,
            [
                ("SOURCES", 20, 200),
                ("WINDOWS", 20, 288),
                ("WINDOW_SPILL", 20, 288),
                ("STATS", 4, 16),
                ("CONFIG", 4, 80),
                ("RULES", 4, 64),
                ("RULE_DROPS", 4, 8),
                ("PREFIXES_V4", 9, 132),
                ("PREFIXES_V6", 21, 132),
                ("SKETCH", 4, 16),
                ("PENALTY_MARKS", 4, 8),
                ("SHARE_MARKS", 4, 8),
                ("HOLDS", 20, 16),
                ("CLUSTER_SHARES", 20, 16),
                ("CLUSTER", 4, 32),
            ]
        );
    }
}
