//! The program's maps, opened once after loading into typed handles (as
//! bpf2go does for Go programs): callers use `maps.rules`, never a map name
//! string, and a map of the wrong kind or value size is refused at load,
//! not at first use.

use aya::{
    maps::{
        Array, HashMap, IterableMap, LpmTrie, Map, MapData, PerCpuArray, PerCpuHashMap, RingBuf,
    },
    Ebpf,
};
use limiter_common::{
    names,
    rules::{PrefixKeyV4, PrefixKeyV6},
    sketch, ClusterShare, ClusterState, Config, Counter, Hold, Rule, RuleRefs, SourceKey,
    SourceTraffic, WindowState,
};

use std::path::Path;

use super::MapsError;

/// Typed handles on every map userspace uses (the kernel's scratch maps
/// stay inside the object).
pub struct Maps {
    /// Offered traffic per source and CPU (an LRU per-CPU hash; a plain
    /// per-CPU hash reads the same).
    pub sources: PerCpuHashMap<MapData, SourceKey, SourceTraffic>,
    /// Admission window per source, shared by the CPUs: kept (never
    /// evicted; the daemon deletes idle ones, `kernel::windows`).
    pub windows: HashMap<MapData, SourceKey, WindowState>,
    /// The windows created while `windows` was full (an LRU hash).
    pub window_spill: HashMap<MapData, SourceKey, WindowState>,
    /// Per-CPU counters by `Outcome`.
    pub stats: PerCpuArray<MapData, Counter>,
    /// The live configuration (one entry).
    pub config: Array<MapData, Config>,
    /// Compiled rules, two generations' halves.
    pub rules: Array<MapData, Rule>,
    /// Refused frames per `RULES` index, per CPU.
    pub rule_drops: PerCpuArray<MapData, u64>,
    pub prefixes_v4: LpmTrie<MapData, PrefixKeyV4, RuleRefs>,
    pub prefixes_v6: LpmTrie<MapData, PrefixKeyV6, RuleRefs>,
    /// "Source limited" events; `None` once taken (the daemon's event
    /// watcher owns it).
    pub events: Option<RingBuf<MapData>>,
    /// The cheap tier's counters (`limiter_common::sketch`).
    pub sketch: Array<MapData, sketch::Pair>,
    /// The cheap tier's penalty marks (`limiter_common::sketch::mark_cell`).
    pub penalty_marks: Array<MapData, u64>,
    /// The cheap tier's share marks, written with the cluster shares.
    pub share_marks: Array<MapData, u64>,
    /// Refusals and penalties apart from the windows (what an evicted
    /// spilled window comes back with).
    pub holds: HashMap<MapData, SourceKey, Hold>,
    /// This node's allowance per cluster-scoped source, by window key (an
    /// LRU hash; written through `kernel::cluster`).
    pub cluster_shares: HashMap<MapData, SourceKey, ClusterShare>,
    /// The cluster state (one entry; written through `kernel::cluster`).
    pub cluster: Array<MapData, ClusterState>,
}

/// Moves map `name` out of `ebpf` as `T`.
fn take<T: TryFrom<Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, MapsError> {
    let map = ebpf.take_map(name).ok_or(MapsError::Missing(name))?;
    T::try_from(map).map_err(MapsError::on(name))
}

/// Opens map `name` pinned in `dir` as `T`.
fn pinned<T: TryFrom<Map, Error = aya::maps::MapError>>(
    dir: &Path,
    name: &'static str,
) -> Result<T, MapsError> {
    let data = MapData::from_pin(dir.join(name)).map_err(MapsError::on(name))?;
    let map = Map::from_map_data(data).map_err(MapsError::on(name))?;
    T::try_from(map).map_err(MapsError::on(name))
}

impl Maps {
    /// How many maps a `Maps` holds.
    pub const COUNT: usize = 16;

    /// Moves the maps out of a freshly loaded object.
    pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self, MapsError> {
        Ok(Self {
            sources: take(ebpf, names::SOURCES)?,
            windows: take(ebpf, names::WINDOWS)?,
            window_spill: take(ebpf, names::WINDOW_SPILL)?,
            stats: take(ebpf, names::STATS)?,
            config: take(ebpf, names::CONFIG)?,
            rules: take(ebpf, names::RULES)?,
            rule_drops: take(ebpf, names::RULE_DROPS)?,
            prefixes_v4: take(ebpf, names::PREFIXES_V4)?,
            prefixes_v6: take(ebpf, names::PREFIXES_V6)?,
            events: Some(take(ebpf, names::EVENTS)?),
            sketch: take(ebpf, names::SKETCH)?,
            penalty_marks: take(ebpf, names::PENALTY_MARKS)?,
            share_marks: take(ebpf, names::SHARE_MARKS)?,
            holds: take(ebpf, names::HOLDS)?,
            cluster_shares: take(ebpf, names::CLUSTER_SHARES)?,
            cluster: take(ebpf, names::CLUSTER)?,
        })
    }

    /// A second set of handles on a running instance's maps, from their
    /// pins in `maps_dir` (`pins::maps_dir`), for a task that works beside
    /// the daemon's main loop (the cluster sync). Without `EVENTS`, which
    /// is not pinned and has one reader.
    pub fn from_pins(maps_dir: &Path) -> Result<Self, MapsError> {
        Ok(Self {
            sources: pinned(maps_dir, names::SOURCES)?,
            windows: pinned(maps_dir, names::WINDOWS)?,
            window_spill: pinned(maps_dir, names::WINDOW_SPILL)?,
            stats: pinned(maps_dir, names::STATS)?,
            config: pinned(maps_dir, names::CONFIG)?,
            rules: pinned(maps_dir, names::RULES)?,
            rule_drops: pinned(maps_dir, names::RULE_DROPS)?,
            prefixes_v4: pinned(maps_dir, names::PREFIXES_V4)?,
            prefixes_v6: pinned(maps_dir, names::PREFIXES_V6)?,
            events: None,
            sketch: pinned(maps_dir, names::SKETCH)?,
            penalty_marks: pinned(maps_dir, names::PENALTY_MARKS)?,
            share_marks: pinned(maps_dir, names::SHARE_MARKS)?,
            holds: pinned(maps_dir, names::HOLDS)?,
            cluster_shares: pinned(maps_dir, names::CLUSTER_SHARES)?,
            cluster: pinned(maps_dir, names::CLUSTER)?,
        })
    }

    /// The live configuration (generation 0: nothing pushed yet).
    pub fn live_config(&self) -> Result<Config, MapsError> {
        self.config.get(&0, 0).map_err(MapsError::on(names::CONFIG))
    }

    /// The shared window of `wkey` (a window key: the source with its
    /// rule's budget as class), kept or spilled, as the kernel finds it.
    pub fn window(&self, wkey: &SourceKey) -> Option<WindowState> {
        self.windows
            .get(wkey, 0)
            .or_else(|_| self.window_spill.get(wkey, 0))
            .ok()
    }

    /// The rule at `RULES` index `index`.
    pub fn rule(&self, index: u32) -> Result<Rule, MapsError> {
        self.rules
            .get(&index, 0)
            .map_err(MapsError::on(names::RULES))
    }

    /// The map data of `SOURCES`, for batched reads.
    pub fn sources_data(&self) -> &MapData {
        self.sources.map()
    }

    /// The sketch's map, for batched reads.
    pub fn sketch_data(&self) -> &MapData {
        self.sketch.map()
    }

    /// The map data of `SHARE_MARKS`, for batched reads and writes.
    pub fn share_marks_data(&self) -> &MapData {
        self.share_marks.map()
    }

    /// The map data of `CLUSTER_SHARES`, for batched writes.
    pub fn cluster_shares_data(&self) -> &MapData {
        self.cluster_shares.map()
    }
}
