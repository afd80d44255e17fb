//! Upkeep of the kept windows: the sources' (`WINDOWS`, each with its
//! ticket in `UNPROVEN` unless its source proved its address), the levels'
//! aggregates (`AGGREGATES`) and their overflow cells (`AGG_CELLS`). None
//! of them evicts, so that no flood of other sources can take a count
//! away; the daemon deletes the windows that count nothing instead
//! (`WindowState::idle_at`: no frame in the longest window their bucket
//! width allows; a penalty lives on in `HOLDS`), a slice each tick, so the
//! maps have room for new sources.
//!
//! The walks read in batches from a bucket token (`BPF_MAP_LOOKUP_BATCH`),
//! which a concurrent insert or delete does not restart: a pass over a map
//! costs at most its capacity in entries read, however fast a flood churns
//! it. Nothing re-reads a window before deleting it: a frame counted in
//! the instant between the read and the delete is lost with it (its
//! source's first frame after a silence of its longest window).

use std::io;

use aya::{
    maps::{HashMap, IterableMap, MapData},
    Pod,
};
use limiter_common::{rules::LevelWindow, SourceKey, WindowState};

use super::{
    batch::{self, Resume},
    Maps,
};

/// A map of kept windows: its value's window.
trait Kept: Pod {
    fn window(&self) -> &WindowState;
}

impl Kept for WindowState {
    fn window(&self) -> &WindowState {
        self
    }
}

impl Kept for LevelWindow {
    fn window(&self) -> &WindowState {
        &self.window
    }
}

/// The maps the walk goes through, in turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    #[default]
    Windows,
    Aggregates,
    Cells,
}

/// One map's walk: what the pass under way saw, what the last complete one
/// left, and what was deleted in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Upkeep {
    seen: usize,
    deleted: usize,
    /// The windows left after the last complete pass (`None` before the
    /// first completes).
    pub kept: Option<usize>,
    /// Windows deleted since the daemon started.
    pub deleted_total: u64,
}

/// Where the walk over the kept maps is, and what its passes saw.
#[derive(Debug, Default)]
pub struct Reclaim {
    phase: Phase,
    /// Where the next slice starts.
    resume: Resume,
    pub windows: Upkeep,
    pub aggregates: Upkeep,
    pub cells: Upkeep,
}

/// What one slice did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slice {
    /// Windows read.
    pub seen: usize,
    /// Idle windows deleted.
    pub deleted: usize,
    /// Whether the slice ended a pass over the source windows (the
    /// aggregates and their cells follow it, from the next slice).
    pub pass_done: bool,
}

impl Reclaim {
    /// Reads the next slice of at least `budget` windows (or the rest of
    /// the map in turn) and deletes those idle at `now_ns`; adds to
    /// `active` each source window read that admitted frames in about the
    /// last second, with that rate (`WindowState::recent_pps`).
    pub fn step(
        &mut self,
        maps: &mut Maps,
        now_ns: u64,
        budget: usize,
        active: &mut Vec<(SourceKey, u64)>,
    ) -> io::Result<Slice> {
        let (slice, next) = match self.phase {
            Phase::Windows => {
                let mut gone = Vec::new();
                let slice = (
                    walk(
                        &mut maps.windows,
                        &mut self.resume,
                        &mut self.windows,
                        now_ns,
                        budget,
                        |key: &SourceKey, window: &WindowState| {
                            let pps = window.recent_pps(now_ns);
                            if pps > 0 {
                                active.push((*key, pps));
                            }
                        },
                        |key: &SourceKey| gone.push(*key),
                    )?,
                    Phase::Aggregates,
                );
                // A deleted window's ticket goes with it (a proven
                // source's window has none), given back to its room.
                maps.remove_tickets(&gone).map_err(io::Error::other)?;
                slice
            }
            Phase::Aggregates => (
                walk(
                    &mut maps.aggregates,
                    &mut self.resume,
                    &mut self.aggregates,
                    now_ns,
                    budget,
                    |_, _| {},
                    |_| {},
                )?,
                Phase::Cells,
            ),
            Phase::Cells => (
                walk(
                    &mut maps.agg_cells,
                    &mut self.resume,
                    &mut self.cells,
                    now_ns,
                    budget,
                    |_, _| {},
                    |_| {},
                )?,
                Phase::Windows,
            ),
        };
        let done = slice.pass_done;
        if done {
            self.phase = next;
        }
        Ok(Slice {
            pass_done: done && next == Phase::Aggregates,
            ..slice
        })
    }
}

/// The next slice of `map` from `resume`: hands each window to `observe`,
/// deletes those idle at `now_ns` (handing each deleted key to
/// `deleted_key`), and accounts for it in `upkeep`.
#[allow(clippy::too_many_arguments)]
fn walk<K: Pod, V: Kept>(
    map: &mut HashMap<MapData, K, V>,
    resume: &mut Resume,
    upkeep: &mut Upkeep,
    now_ns: u64,
    budget: usize,
    mut observe: impl FnMut(&K, &V),
    mut deleted_key: impl FnMut(&K),
) -> io::Result<Slice> {
    let mut idle: Vec<K> = Vec::new();
    let (seen, next) = batch::read(
        batch::fd(map.map()),
        batch::BATCH,
        *resume,
        budget.max(1),
        |key: &K, value: &V| {
            if value.window().idle_at(now_ns) {
                idle.push(*key);
            } else {
                observe(key, value);
            }
        },
    )?;
    *resume = next.unwrap_or_default();
    let mut deleted = 0;
    for key in &idle {
        // Gone already (another reader's delete): nothing to count.
        if map.remove(key).is_ok() {
            deleted_key(key);
            deleted += 1;
        }
    }
    upkeep.seen += seen;
    upkeep.deleted += deleted;
    upkeep.deleted_total += deleted as u64;
    let pass_done = next.is_none();
    if pass_done {
        upkeep.kept = Some(upkeep.seen.saturating_sub(upkeep.deleted));
        upkeep.seen = 0;
        upkeep.deleted = 0;
    }
    Ok(Slice {
        seen,
        deleted,
        pass_done,
    })
}
