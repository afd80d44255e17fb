//! Upkeep of the kept windows (`WINDOWS`). That map never evicts, so that
//! no flood of other sources can take a source's count away; the daemon
//! deletes the windows that are idle instead (`WindowState::idle_at`: no
//! frame in the longest window their bucket width allows, no penalty
//! running), a slice each tick, so the map has room for new sources.
//!
//! After each pass over `WINDOWS`, a pass over the spill (`WINDOW_SPILL`,
//! an LRU map: where a flood can evict windows) counts its windows, which
//! gives its evictions: every spilled window was counted as
//! `window_spilled` when created and leaves only by eviction (nothing in
//! userspace deletes one), so those created before the pass began minus
//! those it found were evicted (`read::evictions`).
//!
//! The walks read in batches from a bucket token (`BPF_MAP_LOOKUP_BATCH`),
//! which a concurrent insert or delete does not restart: a pass over a map
//! costs at most its capacity in entries read, however fast a flood churns
//! it.

use std::io;

use aya::maps::{HashMap, IterableMap, MapData};
use limiter_common::{SourceKey, WindowState};

use super::{
    batch::{self, Resume},
    read, Maps,
};

/// Which map the walk is in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    /// Deleting the idle kept windows.
    #[default]
    Kept,
    /// Counting the spilled windows; `window_spilled` when the pass began.
    Spill { spilled_at_start: u64 },
}

/// Where the walk over the window maps is, and what its last complete
/// passes saw.
#[derive(Debug, Default)]
pub struct Reclaim {
    phase: Phase,
    /// Where the next slice starts.
    resume: Resume,
    /// Windows seen and deleted so far in the pass under way.
    seen: usize,
    deleted: usize,
    /// The windows left after the last complete pass (`None` before the
    /// first completes).
    kept: Option<usize>,
    /// Windows deleted since the daemon started.
    deleted_total: u64,
    /// Spilled windows evicted, as of the last complete pass over the
    /// spill (never less than an earlier pass said).
    spill_evictions: u64,
}

/// What one slice did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slice {
    /// Windows read.
    pub seen: usize,
    /// Idle windows deleted.
    pub deleted: usize,
    /// Whether the slice ended a pass over the kept windows (the spill's
    /// count follows it, from the next slice).
    pub pass_done: bool,
}

impl Reclaim {
    /// Reads the next slice of at least `budget` windows (or the rest of
    /// the map): in the kept windows, deletes those idle at `now_ns`; in
    /// the spill, counts them. `spilled_total` is the `window_spilled`
    /// outcome's count now.
    pub fn step(
        &mut self,
        maps: &mut Maps,
        now_ns: u64,
        budget: usize,
        spilled_total: u64,
    ) -> io::Result<Slice> {
        match self.phase {
            Phase::Kept => self.step_kept(&mut maps.windows, now_ns, budget, spilled_total),
            Phase::Spill { spilled_at_start } => {
                let (seen, pass_done) =
                    self.read_slice(maps.window_spill.map(), budget, |_, _| {})?;
                self.seen += seen;
                if pass_done {
                    self.spill_evictions = self.spill_evictions.max(read::evictions(
                        spilled_at_start,
                        self.seen as u64,
                        0,
                    ));
                    self.seen = 0;
                    self.phase = Phase::Kept;
                }
                Ok(Slice {
                    seen,
                    deleted: 0,
                    pass_done: false,
                })
            }
        }
    }

    fn step_kept(
        &mut self,
        windows: &mut HashMap<MapData, SourceKey, WindowState>,
        now_ns: u64,
        budget: usize,
        spilled_total: u64,
    ) -> io::Result<Slice> {
        let mut idle: Vec<SourceKey> = Vec::new();
        let (seen, pass_done) = self.read_slice(windows.map(), budget, |key, window| {
            if window.idle_at(now_ns) {
                idle.push(*key);
            }
        })?;
        let mut deleted = 0;
        for key in &idle {
            // Gone already (another reader's delete): nothing to count.
            if windows.remove(key).is_ok() {
                deleted += 1;
            }
        }
        self.seen += seen;
        self.deleted += deleted;
        self.deleted_total += deleted as u64;
        if pass_done {
            self.kept = Some(self.seen.saturating_sub(self.deleted));
            self.seen = 0;
            self.deleted = 0;
            self.phase = Phase::Spill {
                spilled_at_start: spilled_total,
            };
        }
        Ok(Slice {
            seen,
            deleted,
            pass_done,
        })
    }

    /// Reads the next slice of at least `budget` windows of `map` from where
    /// the last one stopped, calling `each` on every window; how many were
    /// read, and whether the slice reached the end of the map (the next
    /// one starts over).
    fn read_slice(
        &mut self,
        map: &MapData,
        budget: usize,
        each: impl FnMut(&SourceKey, &WindowState),
    ) -> io::Result<(usize, bool)> {
        let (seen, next) = batch::read(
            batch::fd(map),
            batch::BATCH,
            self.resume,
            budget.max(1),
            each,
        )?;
        self.resume = next.unwrap_or_default();
        Ok((seen, next.is_none()))
    }

    /// The windows the last complete pass left kept.
    pub fn kept(&self) -> Option<usize> {
        self.kept
    }

    /// Idle windows deleted since the daemon started.
    pub fn deleted_total(&self) -> u64 {
        self.deleted_total
    }

    /// Spilled windows evicted by other sources' windows, as of the last
    /// complete pass over the spill.
    pub fn spill_evictions(&self) -> u64 {
        self.spill_evictions
    }
}
