//! One aggregation pass over an interface's maps: outcome totals summed
//! across CPUs, tracked and limited sources, and the heaviest sources by
//! offered rate over the last complete second.

use std::{
    cmp::Reverse,
    collections::{BTreeSet, BinaryHeap, HashMap},
    time::Duration,
};

use limiter_common::{
    event::EPISODE_GAP_NS, names, sketch, Counter, Outcome, SourceKey, SourceTraffic,
};

use super::known::Reading;
use crate::kernel::{
    self,
    batch::{self, Resume},
    possible_cpus,
    read::{self, ActiveSources},
    Maps, MapsError,
};

/// A source's rates over the last complete second, summed across CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceRate {
    pub key: SourceKey,
    pub offered: Counter,
    /// Dropped (or would-be dropped) since the source was first seen.
    pub dropped_total: Counter,
    /// Some CPU is refusing it without looking (blocked or over its limit).
    pub limited: bool,
    /// The `RULES` index its newest per-CPU state resolved.
    pub rule: u32,
}

/// What one pass saw.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Per outcome, summed across CPUs, in `Outcome` order.
    pub outcomes: Vec<Counter>,
    pub tracked_sources: u64,
    pub limited: BTreeSet<SourceKey>,
    /// The sources in an episode of refusals: limited, or refused by some
    /// CPU within the last [`EPISODE_GAP_NS`] (the kernel's episode, which
    /// its "source limited" events follow). A source leaves it when its
    /// episode ends: "source released" is logged then, once, not each
    /// time a burst of refusals pauses between two holds.
    pub refusing: BTreeSet<SourceKey>,
    /// Heaviest sources by offered packets, at most `top_k`.
    pub top: Vec<SourceRate>,
    /// Per rule index (`RULES`), dropped or would-drop packets.
    pub rule_drops: Vec<u64>,
    /// Sources evicted so far, as of the last complete sweep (never less
    /// than an earlier sweep said).
    pub evictions: u64,
    /// The sources of the cheap tier's last complete epoch, estimated
    /// from its sketch; `None` with the tiers off and until an epoch has
    /// ended since the daemon started.
    pub active_sources: Option<ActiveSources>,
    /// The sources read this tick that offered traffic in their last
    /// complete second or are being refused: their `RULES` index and the
    /// read, one each per sweep.
    pub samples: Vec<(u32, Reading)>,
}

/// The running totals of a sweep over the per-source map.
#[derive(Clone, Debug, Default)]
struct Acc {
    tracked: u64,
    limited: BTreeSet<SourceKey>,
    refusing: BTreeSet<SourceKey>,
    /// The heaviest `top_k` so far (min-heap on offered packets).
    heaviest: BinaryHeap<Reverse<(u64, SourceKey)>>,
    rates: HashMap<SourceKey, SourceRate>,
}

impl Acc {
    /// Adds a source to the sweep; its rule index and its read: offered
    /// packets over the last complete second, refused or not, drops.
    fn add(
        &mut self,
        key: &SourceKey,
        per_cpu: &[SourceTraffic],
        now: Duration,
        top_k: usize,
    ) -> (u32, Reading) {
        let now_ns = now.as_nanos() as u64;
        let now_second = now.as_secs();
        self.tracked += 1;
        let mut rate = SourceRate {
            key: *key,
            offered: Counter::default(),
            dropped_total: Counter::default(),
            limited: false,
            rule: limiter_common::rules::NO_RULE,
        };
        let mut newest_generation = 0;
        let mut refused_lately = false;
        for t in per_cpu {
            refused_lately |= t.last_refused_ns != 0
                && now_ns.saturating_sub(t.last_refused_ns) <= EPISODE_GAP_NS;
            rate.offered = rate.offered.merged(t.last_second(now_second));
            rate.dropped_total = rate.dropped_total.merged(t.dropped);
            rate.limited |= t.hold_until_ns > now_ns;
            if t.generation > newest_generation {
                newest_generation = t.generation;
                rate.rule = t.rule;
            }
        }
        if rate.limited {
            self.limited.insert(*key);
        }
        if rate.limited || refused_lately {
            self.refusing.insert(*key);
        }
        let observed = (
            rate.rule,
            Reading {
                key: *key,
                pps: rate.offered.packets,
                refused: rate.limited || refused_lately,
                dropped_total: Some(rate.dropped_total.packets),
            },
        );
        if top_k == 0 {
            return observed;
        }
        let weight = rate.offered.packets;
        if self.heaviest.len() < top_k {
            self.heaviest.push(Reverse((weight, *key)));
            self.rates.insert(*key, rate);
        } else if self
            .heaviest
            .peek()
            .is_some_and(|Reverse((w, _))| weight > *w)
        {
            if let Some(Reverse((_, evicted))) = self.heaviest.pop() {
                self.rates.remove(&evicted);
            }
            self.heaviest.push(Reverse((weight, *key)));
            self.rates.insert(*key, rate);
        }
        observed
    }
}

/// A sweep over the per-source map spread over ticks: each tick reads at
/// most a budget of sources (bounding the daemon's CPU per tick whatever
/// the number of sources), and the per-source view (tracked, limited,
/// top-K) is the last complete sweep's. A map that fits in one budget is
/// swept completely every tick.
#[derive(Debug, Default)]
pub struct Sweep {
    resume: Resume,
    current: Acc,
    complete: Option<Acc>,
    /// Ticks the last complete sweep took.
    pub last_sweep_ticks: u32,
    /// This tick's reads of the sources with traffic or refused, handed
    /// to the known sources with the snapshot: at most the tick's budget.
    samples: Vec<(u32, Reading)>,
    ticks: u32,
    /// Sources created (`new_source`) when the current sweep began.
    created_at_start: u64,
    /// The highest eviction estimate so far.
    evictions: u64,
    /// The cheap tier's epoch of the last tick, and what was estimated of
    /// the epoch before it: the sketch is read once an epoch, on the
    /// first tick after it ends.
    sketch_epoch: Option<u64>,
    active_sources: Option<ActiveSources>,
}

/// One tick: the outcome totals, and the next slice of the sweep (at most
/// about `budget` sources, rounded up to whole batches).
pub fn pass(
    maps: &Maps,
    top_k: usize,
    sweep: &mut Sweep,
    budget: usize,
) -> Result<Snapshot, MapsError> {
    let now = kernel::now();
    let outcomes = read::outcome_totals(maps)?;
    if matches!(sweep.resume, Resume::Start) {
        sweep.created_at_start = outcomes[Outcome::NewSource as usize].packets;
    }
    let cpus = possible_cpus()?;
    let current = &mut sweep.current;
    let samples = &mut sweep.samples;
    samples.clear();
    let (_, next) = batch::read_per_cpu::<SourceKey, SourceTraffic>(
        batch::fd(maps.sources_data()),
        cpus,
        sweep.resume,
        budget,
        |key, per_cpu| {
            let (rule, reading) = current.add(key, per_cpu, now, top_k);
            if reading.pps > 0 || reading.refused {
                samples.push((rule, reading));
            }
        },
    )
    .map_err(|source| MapsError::Batch {
        map: names::SOURCES,
        source,
    })?;
    sweep.ticks += 1;
    match next {
        Some(resume) => sweep.resume = resume,
        None => {
            // Every source created before the sweep began is either still
            // there (and seen) or was evicted; sources created during the
            // sweep and seen make this an underestimate, never an over.
            let seen = sweep.current.tracked;
            sweep.evictions = sweep
                .evictions
                .max(read::evictions(sweep.created_at_start, seen, 0));
            sweep.complete = Some(std::mem::take(&mut sweep.current));
            sweep.resume = Resume::Start;
            sweep.last_sweep_ticks = sweep.ticks;
            sweep.ticks = 0;
        }
    }
    if maps.live_config()?.tiered() {
        let epoch = now.as_nanos() as u64 / sketch::EPOCH_NS;
        if sweep.sketch_epoch.is_some_and(|seen| seen != epoch) {
            let ended = sketch::tag((epoch - 1) * sketch::EPOCH_NS);
            sweep.active_sources = Some(ActiveSources::read(maps, ended)?);
        }
        sweep.sketch_epoch = Some(epoch);
    } else {
        sweep.sketch_epoch = None;
        sweep.active_sources = None;
    }
    // Until the first sweep completes, show what it has seen so far.
    let view = sweep.complete.as_ref().unwrap_or(&sweep.current);
    let mut top: Vec<SourceRate> = view.rates.values().cloned().collect();
    top.sort_by_key(|r| Reverse(r.offered.packets));
    top.truncate(top_k);
    Ok(Snapshot {
        outcomes,
        tracked_sources: view.tracked,
        limited: view.limited.clone(),
        refusing: view.refusing.clone(),
        top,
        rule_drops: read::rule_drops(maps)?,
        evictions: sweep.evictions,
        active_sources: sweep.active_sources,
        samples: std::mem::take(&mut sweep.samples),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_refused_within_a_second_stays_in_its_episode_between_holds() {
        let key = SourceKey::v4([192, 0, 2, 3]);
        let second = Duration::from_secs(1);
        let now = Duration::from_secs(100);
        let now_ns = now.as_nanos() as u64;
        let held = SourceTraffic {
            hold_until_ns: now_ns + 5_000_000,
            last_refused_ns: now_ns,
            ..SourceTraffic::default()
        };
        // No hold any more, refused 0.9 s ago on one CPU: still refusing.
        let pausing = SourceTraffic {
            last_refused_ns: now_ns - 900_000_000,
            ..SourceTraffic::default()
        };
        let ended = SourceTraffic {
            last_refused_ns: now_ns - second.as_nanos() as u64 - 1,
            ..SourceTraffic::default()
        };
        let seen = |per_cpu: &[SourceTraffic]| {
            let mut acc = Acc::default();
            acc.add(&key, per_cpu, now, 0);
            (acc.limited.contains(&key), acc.refusing.contains(&key))
        };
        assert_eq!(seen(&[held, SourceTraffic::default()]), (true, true));
        assert_eq!(seen(&[SourceTraffic::default(), pausing]), (false, true));
        assert_eq!(seen(&[ended, ended]), (false, false));
        // Never refused.
        assert_eq!(seen(&[SourceTraffic::default()]), (false, false));
    }

    #[test]
    fn a_source_is_one_observation_of_its_last_complete_second_summed_over_cpus() {
        let key = SourceKey::v4([192, 0, 2, 7]);
        let now = Duration::from_secs(100);
        let cpu =
            |second: u64, current: u64, previous: u64, rule: u32, generation: u32| SourceTraffic {
                second,
                current: Counter {
                    packets: current,
                    bytes: 0,
                },
                previous: Counter {
                    packets: previous,
                    bytes: 0,
                },
                rule,
                generation,
                ..SourceTraffic::default()
            };
        let mut acc = Acc::default();
        // One CPU's second 99 is complete (7); another is in second 100,
        // its previous (99) holding 3; a third last counted long ago.
        let observed = acc.add(
            &key,
            &[
                cpu(99, 7, 1, 4, 2),
                cpu(100, 50, 3, 5, 3),
                cpu(90, 9, 9, 4, 1),
            ],
            now,
            0,
        );
        // The rule of the newest generation, the packets of second 99.
        assert_eq!((observed.0, observed.1.pps), (5, 10));
        // A source silent for a second offers nothing to observe.
        assert_eq!(acc.add(&key, &[cpu(97, 7, 1, 4, 2)], now, 0).1.pps, 0);
    }
}
