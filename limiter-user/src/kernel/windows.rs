//! Upkeep of the kept windows (`WINDOWS`). That map never evicts, so that
//! no flood of other sources can take a source's count away; the daemon
//! deletes the windows that are idle instead (`WindowState::idle_at`: no
//! frame in the longest window their bucket width allows, no penalty
//! running), a slice each tick, so the map has room for new sources.
//!
//! The walk reads in batches from a bucket token (`BPF_MAP_LOOKUP_BATCH`),
//! which a concurrent insert or delete does not restart: a pass over the
//! map costs at most its capacity in entries read, however fast a flood
//! churns it.

use std::io;

use aya::maps::IterableMap;
use limiter_common::{SourceKey, WindowState};

use super::{
    batch::{self, Resume},
    Maps,
};

/// Where the walk over `WINDOWS` is, and what its last complete pass saw.
#[derive(Debug, Default)]
pub struct Reclaim {
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
}

/// What one slice did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slice {
    /// Windows read.
    pub seen: usize,
    /// Idle windows deleted.
    pub deleted: usize,
    /// Whether the slice ended a pass over the whole map.
    pub pass_done: bool,
}

impl Reclaim {
    /// Reads the next slice of at least `budget` windows (or the rest of
    /// the map) and deletes those idle at `now_ns`.
    pub fn step(&mut self, maps: &mut Maps, now_ns: u64, budget: usize) -> io::Result<Slice> {
        let mut idle: Vec<SourceKey> = Vec::new();
        let (seen, next) = batch::read(
            batch::fd(maps.windows.map()),
            batch::BATCH,
            self.resume,
            budget.max(1),
            |key: &SourceKey, window: &WindowState| {
                if window.idle_at(now_ns) {
                    idle.push(*key);
                }
            },
        )?;
        let mut deleted = 0;
        for key in &idle {
            // Gone already (another reader's delete): nothing to count.
            if maps.windows.remove(key).is_ok() {
                deleted += 1;
            }
        }
        self.seen += seen;
        self.deleted += deleted;
        self.deleted_total += deleted as u64;
        let pass_done = next.is_none();
        if pass_done {
            self.kept = Some(self.seen.saturating_sub(self.deleted));
            self.seen = 0;
            self.deleted = 0;
            self.resume = Resume::Start;
        } else if let Some(next) = next {
            self.resume = next;
        }
        Ok(Slice {
            seen,
            deleted,
            pass_done,
        })
    }

    /// The windows the last complete pass left kept.
    pub fn kept(&self) -> Option<usize> {
        self.kept
    }

    /// Idle windows deleted since the daemon started.
    pub fn deleted_total(&self) -> u64 {
        self.deleted_total
    }
}
