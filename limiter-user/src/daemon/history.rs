//! The distribution of per-source rates over a horizon, per rule (merged
//! across interfaces) and per aggregate level, in bounded memory: what
//! `xdp-limiter suggest` answers from.
//!
//! Each series (a rule, or a rule's level) is a ring of [`SLOTS`] time
//! slots covering `[daemon] history` (a slot is `history / SLOTS` long);
//! each slot holds log-scale buckets of the rates observed in it, each
//! bucket counting the observations and summing their packets (so that
//! "share of traffic" is computable). A bucket is 1 pps wide below 16 pps
//! and `1/16` of a power of two above (the `[lower, upper]` of bucket
//! `16 + 16 (e - 4) + s` is `[(16 + s) 2^(e-4), (17 + s) 2^(e-4) - 1]`):
//! a rate read back from a bucket's upper edge is at most 6.25 % above
//! the rate observed, never below it.
//!
//! A rule's series counts each known source once a slot (`known`: its
//! highest rate in the slot), apart when it was refused in the slot; a
//! level's series counts each aggregate once a tick.
//!
//! Memory: a slot stores only the buckets something fell into (a sorted
//! map), at most [`BUCKETS`] of them twice (the refused apart), so a series
//! takes at most `SLOTS x 2 x BUCKETS x ~40 bytes` (about 2.2 MB), and the history at most
//! that times `rules + levels` whatever the number of sources. Real
//! traffic fills a few dozen buckets a slot: some kilobytes a series.

use std::{collections::BTreeMap, time::Duration};

/// Time slots in a ring: the horizon's resolution (`--since` is rounded
/// up to whole slots).
pub const SLOTS: u64 = 60;
/// Buckets at most: 16 exact ones (0..16 pps), then 16 a power of two up
/// to 2^32 pps (above any line rate; larger rates land in the last).
pub const BUCKETS: usize = 16 + 16 * 28;

/// The bucket of a rate in packets per second.
pub fn bucket(pps: u64) -> usize {
    if pps < 16 {
        return pps as usize;
    }
    let e = 63 - pps.leading_zeros() as usize; // >= 4
    let sub = ((pps >> (e - 4)) & 15) as usize;
    (16 + 16 * (e - 4) + sub).min(BUCKETS - 1)
}

/// The lowest and highest rate of a bucket.
pub fn bounds(bucket: usize) -> (u64, u64) {
    if bucket < 16 {
        return (bucket as u64, bucket as u64);
    }
    let e = (bucket - 16) / 16 + 4;
    let sub = ((bucket - 16) % 16) as u64;
    ((16 + sub) << (e - 4), ((17 + sub) << (e - 4)) - 1)
}

/// One bucket of a slot: observations and the packets they carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cell {
    pub count: u64,
    pub packets: u64,
}

/// One slot: the slot number it holds (time since start / slot length)
/// and its buckets, those of sources refused in the slot apart.
#[derive(Clone, Debug, Default)]
struct Slot {
    number: u64,
    cells: BTreeMap<u16, Cell>,
    refused: BTreeMap<u16, Cell>,
}

/// One series' ring.
#[derive(Clone, Debug, Default)]
struct Ring {
    slots: Vec<Slot>,
}

/// What a series is: a rule's sources, or one of its levels' aggregates.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeriesKey {
    /// `default`, `rules[N]`.
    pub rule: String,
    /// The level's label (`prefix/24/48@1s`); `None`: the sources.
    pub level: Option<String>,
}

impl SeriesKey {
    pub fn rule(rule: &str) -> Self {
        Self {
            rule: rule.to_string(),
            level: None,
        }
    }
}

/// Every series' ring.
#[derive(Clone, Debug)]
pub struct History {
    horizon: Duration,
    slot: Duration,
    series: BTreeMap<SeriesKey, Ring>,
}

/// A merged distribution over some slots.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Distribution {
    /// Bucket -> cell, merged over the slots asked for.
    pub cells: BTreeMap<u16, Cell>,
    /// The same, of the observations of sources refused (or would-be
    /// refused) in their slot: left out of the quantile and the effects.
    pub refused: BTreeMap<u16, Cell>,
}

/// What a limit would have done to a distribution.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Effect {
    /// Observations (source-seconds) over the limit / all observations.
    pub limited_share: f64,
    /// Packets above the limit / all packets.
    pub traffic_share: f64,
}

impl History {
    /// A history over `horizon` (validated by the configuration).
    pub fn new(horizon: Duration) -> Self {
        let slot = (horizon / SLOTS as u32).max(Duration::from_secs(1));
        Self {
            horizon,
            slot,
            series: BTreeMap::new(),
        }
    }

    pub fn horizon(&self) -> Duration {
        self.horizon
    }

    /// The slot `now` falls in.
    pub fn slot_number(&self, now: Duration) -> u64 {
        (now.as_millis() / self.slot.as_millis().max(1)) as u64
    }

    /// Records one observation of `pps` packets in a second for `key` at
    /// `now` (a monotonic time).
    pub fn observe(&mut self, key: &SeriesKey, pps: u64, now: Duration) {
        self.add(key, pps, false, now, 1);
    }

    /// Records a source's one observation of the slot of `now`: `pps`,
    /// among the refused sources' when `refused`.
    pub fn observe_source(&mut self, key: &SeriesKey, pps: u64, refused: bool, now: Duration) {
        self.add(key, pps, refused, now, 1);
    }

    /// Takes back an observation [`History::observe_source`] made in the
    /// slot of `now` (the source's slot figure changed).
    pub fn retract_source(&mut self, key: &SeriesKey, pps: u64, refused: bool, now: Duration) {
        self.add(key, pps, refused, now, -1);
    }

    fn add(&mut self, key: &SeriesKey, pps: u64, refused: bool, now: Duration, sign: i8) {
        let number = self.slot_number(now);
        let ring = match self.series.get_mut(key) {
            Some(ring) => ring,
            None => self.series.entry(key.clone()).or_default(),
        };
        if ring.slots.is_empty() {
            ring.slots = vec![Slot::default(); SLOTS as usize];
        }
        let slot = &mut ring.slots[(number % SLOTS) as usize];
        if slot.number != number {
            // The slot held a turn of the ring ago (or nothing): expired.
            if sign < 0 {
                return;
            }
            slot.number = number;
            slot.cells.clear();
            slot.refused.clear();
        }
        let cells = if refused {
            &mut slot.refused
        } else {
            &mut slot.cells
        };
        let at = bucket(pps) as u16;
        let cell = cells.entry(at).or_default();
        if sign > 0 {
            cell.count += 1;
            cell.packets = cell.packets.saturating_add(pps);
        } else {
            cell.count = cell.count.saturating_sub(1);
            cell.packets = cell.packets.saturating_sub(pps);
            if cell.count == 0 {
                cells.remove(&at);
            }
        }
    }

    /// The series that have any observation.
    pub fn keys(&self) -> impl Iterator<Item = &SeriesKey> {
        self.series.keys()
    }

    /// `key`'s observations over the last `since` (rounded up to whole
    /// slots, the current one included) as of `now`.
    pub fn distribution(&self, key: &SeriesKey, since: Duration, now: Duration) -> Distribution {
        let mut merged = Distribution::default();
        let Some(ring) = self.series.get(key) else {
            return merged;
        };
        let current = self.slot_number(now);
        let wanted = since
            .as_millis()
            .div_ceil(self.slot.as_millis().max(1))
            .clamp(1, u128::from(SLOTS)) as u64;
        let oldest = current.saturating_sub(wanted - 1);
        for slot in &ring.slots {
            if slot.number < oldest || slot.number > current {
                continue;
            }
            for (from, into) in [
                (&slot.cells, &mut merged.cells),
                (&slot.refused, &mut merged.refused),
            ] {
                for (bucket, cell) in from {
                    let into = into.entry(*bucket).or_default();
                    into.count += cell.count;
                    into.packets = into.packets.saturating_add(cell.packets);
                }
            }
        }
        merged
    }

    /// Buckets held, all series and slots together (for the memory bound).
    pub fn cells_held(&self) -> usize {
        self.series
            .values()
            .flat_map(|r| &r.slots)
            .map(|s| s.cells.len() + s.refused.len())
            .sum()
    }
}

impl Distribution {
    pub fn samples(&self) -> u64 {
        self.cells.values().map(|c| c.count).sum()
    }

    /// The refused sources' observations, left out.
    pub fn refused_samples(&self) -> u64 {
        self.refused.values().map(|c| c.count).sum()
    }

    /// The highest rate a refused source was observed at (its bucket's
    /// upper edge).
    pub fn refused_max(&self) -> Option<u64> {
        self.refused.keys().last().map(|b| bounds(*b as usize).1)
    }

    pub fn packets(&self) -> u64 {
        self.cells.values().map(|c| c.packets).sum()
    }

    /// The rate at or below which a share `q` (in (0, 1]) of the
    /// observations lie, as its bucket's upper edge (at most 6.25 % above
    /// the true quantile, never below); `None` without observations.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let n = self.samples();
        if n == 0 {
            return None;
        }
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (bucket, cell) in &self.cells {
            seen += cell.count;
            if seen >= rank {
                return Some(bounds(*bucket as usize).1);
            }
        }
        self.cells.keys().last().map(|b| bounds(*b as usize).1)
    }

    /// What a per-source limit of `limit` pps would have done: the
    /// observations above it and the packets above it. A bucket wholly
    /// above counts fully; the bucket holding the limit counts by its mean
    /// (the error stays within a bucket's width).
    pub fn effect(&self, limit: u64) -> Effect {
        let (samples, packets) = (self.samples(), self.packets());
        if samples == 0 {
            return Effect::default();
        }
        let (mut limited, mut excess) = (0u64, 0u64);
        for (bucket, cell) in &self.cells {
            let (lower, upper) = bounds(*bucket as usize);
            let over = cell
                .packets
                .saturating_sub(cell.count.saturating_mul(limit));
            if lower > limit {
                limited += cell.count;
                excess += over;
            } else if upper > limit && over > 0 {
                // The mean is above the limit: count the bucket as over.
                limited += cell.count;
                excess += over;
            }
        }
        Effect {
            limited_share: limited as f64 / samples as f64,
            traffic_share: if packets == 0 {
                0.0
            } else {
                excess as f64 / packets as f64
            },
        }
    }
}

/// A proposed limit: `rate x headroom`, rounded up to two significant
/// digits (1234 -> 1300, 87 -> 87, 20.4 -> 21), never below 1.
pub fn propose(rate: u64, headroom: f64) -> u64 {
    let raw = (rate as f64 * headroom).ceil().max(1.0) as u64;
    let digits = raw.ilog10();
    if digits < 2 {
        return raw;
    }
    let step = 10u64.pow(digits - 1);
    raw.div_ceil(step) * step
}

#[cfg(test)]
mod tests;
