//! Traffic scripts, generated from a seed: who sends what, when and on
//! which CPU. A script mixes polite sources (steady at 10-95% of their
//! limit, bursty within it, on one CPU or moving between both, some
//! silent for longer than the sketch remembers and back), heavy ones (1.1
//! to 100 times their limit, some silent and back), and floods of spoofed
//! sources sized at one to four times the capacity of a map (the kept
//! windows, the aggregates, the penalties, the cheap tier's sketch), or of
//! a prefix holder's /64s (one IPv6 /48's room of tickets). The
//! same seed and family always give the same script, so a failing one
//! replays.

use std::{net::IpAddr, time::Duration};

use super::zoo::{self, Kind};

/// What a family of scripts aims at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// 10 pps, 10 per 10 s, 60 per minute, IPv6 /64s; a churn through the
    /// kept windows, a flood through the sketch, and a prefix holder's
    /// /64s beside the IPv6 sources' /48, under their rule.
    Small,
    /// 100 pps with a burst, 1000 pps, 100 pps over 10 s; a flood through
    /// the sketch.
    Large,
    /// A penalty; a flood of blocked spoofed sources through `HOLDS`.
    Penalty,
    /// Levels (a /24 aggregate and a per-source window); a churn through
    /// the aggregates.
    Levels,
    /// Cluster scope (no cluster state: the kernel's own fallback, the
    /// whole allowance); a flood through the sketch.
    Cluster,
    /// Some of everything at once.
    Mixed,
}

impl Family {
    pub const ALL: [Family; 6] = [
        Family::Small,
        Family::Large,
        Family::Penalty,
        Family::Levels,
        Family::Cluster,
        Family::Mixed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::Small => "small",
            Family::Large => "large",
            Family::Penalty => "penalty",
            Family::Levels => "levels",
            Family::Cluster => "cluster",
            Family::Mixed => "mixed",
        }
    }

    pub fn parse(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// The program's map capacities in the scripts: small, so that a flood of
/// four times a map's room runs in well under a second.
pub const WINDOWS: u32 = 2_048;
/// Per-CPU state (`SOURCES`).
pub const HOT: u32 = 1_024;
/// The sketch's entries (fixed).
pub const SKETCH: u32 = limiter_common::sketch::WORDS;

/// What an actor is for the checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Meant to stay within its limit; the reference window says whether
    /// it did, and then it must never be dropped.
    Polite,
    /// Over its limit: it may get no more than its allowance and the
    /// documented bound.
    Heavy,
    /// Many sources, a few frames each: each held to the same bound, and
    /// the maps it fills counted.
    Flood,
    /// A light source (under its rule's fair share of an aggregate) beside
    /// heavy ones that exhaust the aggregate: the reserve keeps at least
    /// 90% of its frames.
    Light,
}

/// One actor: a role, the rule it falls under, and its sources.
#[derive(Clone, Debug)]
pub struct Actor {
    pub role: Role,
    pub kind: Kind,
    pub what: String,
    pub sources: Sources,
    /// The map a flood fills, for the checks: `None` for other actors.
    pub fills: Option<Fills>,
}

/// Where an actor's sources are in its rule's prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sources {
    /// One source: host `host` of /24 (or /64) `block`.
    One { block: u32, host: u32 },
    /// `count` sources: source `i` is host `i % per_block` of block
    /// `first_block + i / per_block`.
    Many {
        first_block: u32,
        per_block: u32,
        count: u32,
    },
    /// `count` /64s of the /48 beside the kind's own (`Kind::neighbour`).
    Neighbour { count: u32 },
}

impl Actor {
    pub fn source(&self, i: u32) -> IpAddr {
        match self.sources {
            Sources::One { block, host } => self.kind.source(block, host),
            Sources::Many {
                first_block,
                per_block,
                ..
            } => self.kind.source(first_block + i / per_block, i % per_block),
            Sources::Neighbour { .. } => self.kind.neighbour(i),
        }
    }

    pub fn count(&self) -> u32 {
        match self.sources {
            Sources::One { .. } => 1,
            Sources::Many { count, .. } | Sources::Neighbour { count } => count,
        }
    }
}

/// The map a flood is sized against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fills {
    Windows,
    Aggregates,
    Holds,
    Sketch,
    /// One IPv6 /48's room of tickets (`tickets::Rooms::prefix`).
    Prefix,
}

/// One entry of a CPU's schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    /// One frame of source `source` of actor `actor`, due at `at` (a
    /// polite actor's frame is skipped when it is late by more than
    /// [`LATE`]: a sender that catches up bunches its frames).
    Frame {
        at: Duration,
        actor: u16,
        source: u32,
    },
    /// One frame from each of sources `first..first + count` of `actor`,
    /// `repeat` times over (each source in turn), as fast as they go,
    /// from `at`.
    Burst {
        at: Duration,
        actor: u16,
        first: u32,
        count: u32,
        repeat: u32,
    },
}

impl Item {
    pub fn at(&self) -> Duration {
        match self {
            Item::Frame { at, .. } | Item::Burst { at, .. } => *at,
        }
    }
}

/// How late a polite frame may run before it is skipped.
pub const LATE: Duration = Duration::from_millis(2);

/// A whole script: its actors and each CPU's schedule, sorted by time.
#[derive(Clone, Debug)]
pub struct Script {
    pub seed: u64,
    pub family: Family,
    pub actors: Vec<Actor>,
    pub cpus: [Vec<Item>; 2],
    pub duration: Duration,
}

impl Script {
    /// The frames the script sends (bursts counted whole).
    pub fn frames(&self) -> u64 {
        self.cpus
            .iter()
            .flatten()
            .map(|item| match item {
                Item::Frame { .. } => 1,
                Item::Burst { count, repeat, .. } => u64::from(*count) * u64::from(*repeat),
            })
            .sum()
    }
}

/// How long a script runs.
const DURATION: Duration = Duration::from_millis(4_500);
/// A silence longer than two epochs of the sketch: the source is
/// forgotten there, and comes back to the cheap tier.
const SILENCE: Duration = Duration::from_millis(2_100);
/// The most frames a second one heavy actor sends (the drivers share two
/// CPUs with every other actor and the floods).
const HEAVY_MAX_FPS: f64 = 6_000.0;
/// Frames of a flood per burst item: a polite frame waits for at most one.
const CHUNK: u32 = 128;
/// Blocks of a kind's prefix below this are actors', from it floods'.
const FLOOD_BLOCKS: u32 = 1_000;

/// Generates the script of `family` for `seed`.
pub fn generate(family: Family, seed: u64) -> Script {
    let mut g = Gen {
        rng: fastrand::Rng::with_seed(seed ^ (family as u64) << 56),
        actors: Vec::new(),
        cpus: [Vec::new(), Vec::new()],
        next_block: 0,
        next_flood_block: FLOOD_BLOCKS,
    };
    match family {
        Family::Small => {
            for kind in [zoo::SMALL, zoo::SMALL6, zoo::TEN_SECONDS, zoo::MINUTE] {
                g.polite_mix(kind, 2);
                g.heavy(kind);
            }
            g.flood_windows(zoo::TEN_SECONDS);
            g.flood_sketch(zoo::SMALL, 1);
            g.flood_prefix(zoo::SMALL6);
        }
        Family::Large => {
            for kind in [zoo::BURST, zoo::LARGE, zoo::LONG] {
                g.polite_mix(kind, 2);
                g.heavy(kind);
            }
            g.heavy(zoo::LARGE);
            g.flood_sketch(zoo::LARGE, 4);
        }
        Family::Penalty => {
            g.polite_mix(zoo::BLOCK, 4);
            g.heavy(zoo::BLOCK);
            g.heavy(zoo::BLOCK);
            g.flood_holds(zoo::BLOCK);
        }
        Family::Levels => {
            g.neighbourhood(zoo::LEVELS);
            g.neighbourhood(zoo::LEVELS);
            g.steady(zoo::LEVELS, None);
            g.steady(zoo::LEVELS, None);
            g.polite_mix(zoo::LEVELS, 1);
            g.flood_aggregates(zoo::LEVELS);
        }
        Family::Cluster => {
            g.polite_mix(zoo::CLUSTER, 3);
            g.heavy(zoo::CLUSTER);
            g.heavy(zoo::CLUSTER);
            g.flood_sketch(zoo::CLUSTER, 2);
        }
        Family::Mixed => {
            for _ in 0..6 {
                let kind = zoo::KINDS[g.rng.usize(..zoo::KINDS.len())];
                if g.rng.bool() {
                    g.polite_mix(kind, 1);
                } else {
                    g.heavy(kind);
                }
            }
            g.neighbourhood(zoo::LEVELS);
            match g.rng.u8(..4) {
                0 => g.flood_windows(zoo::MINUTE),
                1 => g.flood_aggregates(zoo::LEVELS),
                2 => g.flood_holds(zoo::BLOCK),
                _ => g.flood_sketch(zoo::LARGE, 2),
            }
        }
    }
    for cpu in &mut g.cpus {
        cpu.sort_by_key(Item::at);
    }
    Script {
        seed,
        family,
        actors: g.actors,
        cpus: g.cpus,
        duration: DURATION,
    }
}

/// The generator's state.
struct Gen {
    rng: fastrand::Rng,
    actors: Vec<Actor>,
    cpus: [Vec<Item>; 2],
    next_block: u32,
    next_flood_block: u32,
}

/// Which CPU a frame runs on.
#[derive(Clone, Copy, Debug)]
enum Cpus {
    One(usize),
    /// Frame `k` on CPU `k % 2`.
    Alternate,
    /// CPU `from` until `at`, the other after.
    Move {
        from: usize,
        at: Duration,
    },
}

impl Cpus {
    fn of(self, k: usize, at: Duration) -> usize {
        match self {
            Cpus::One(cpu) => cpu,
            Cpus::Alternate => k % 2,
            Cpus::Move { from, at: then } => {
                if at < then {
                    from
                } else {
                    1 - from
                }
            }
        }
    }
}

/// A kind's limit as a script needs it: packets a second, its window, its
/// allowance.
fn rate_of(kind: Kind) -> (f64, Duration, f64) {
    let rules = zoo::rules(true);
    let spec = &rules.rules[kind.index()];
    let pps = spec.limits.pps.expect("a packet limit") as f64;
    let window = spec.limits.window;
    let allowance = pps * window.as_secs_f64() + spec.limits.burst_packets as f64;
    (pps, window, allowance)
}

impl Gen {
    fn cpus(&mut self) -> Cpus {
        match self.rng.u8(..4) {
            0 => Cpus::One(0),
            1 => Cpus::One(1),
            2 => Cpus::Alternate,
            _ => Cpus::Move {
                from: self.rng.usize(..2),
                at: Duration::from_millis(self.rng.u64(1_000..3_500)),
            },
        }
    }

    fn uniform(&mut self, low: f64, high: f64) -> f64 {
        low + self.rng.f64() * (high - low)
    }

    /// A new actor of `role` under `kind` with one source, in a block of
    /// its own or in `block` (shared with the actors there, a host each);
    /// its index.
    fn actor(&mut self, role: Role, kind: Kind, what: String, block: Option<u32>) -> u16 {
        let block = block.unwrap_or_else(|| {
            self.next_block += 1;
            self.next_block
        });
        let host = self
            .actors
            .iter()
            .filter(|a| {
                a.kind == kind && matches!(a.sources, Sources::One { block: b, .. } if b == block)
            })
            .count() as u32;
        self.actors.push(Actor {
            role,
            kind,
            what,
            sources: Sources::One { block, host },
            fills: None,
        });
        (self.actors.len() - 1) as u16
    }

    /// Frames at `times` of `actor`'s only source, over `cpus`.
    fn frames(&mut self, actor: u16, times: &[Duration], cpus: Cpus) {
        for (k, at) in times.iter().enumerate() {
            self.cpus[cpus.of(k, *at)].push(Item::Frame {
                at: *at,
                actor,
                source: 0,
            });
        }
    }

    /// Steady frames at `rate` a second from `start` to `end`, with a
    /// silence of [`SILENCE`] or more in the middle if `silent`.
    fn steady_times(
        &mut self,
        rate: f64,
        start: Duration,
        end: Duration,
        silent: bool,
    ) -> Vec<Duration> {
        let period = Duration::from_secs_f64(1.0 / rate);
        let gap = if silent && end > start + SILENCE + Duration::from_millis(600) {
            let from = start + Duration::from_millis(self.rng.u64(100..300));
            Some((
                from,
                from + SILENCE + Duration::from_millis(self.rng.u64(0..300)),
            ))
        } else {
            None
        };
        let mut times = Vec::new();
        let mut at = start;
        while at < end {
            if !gap.is_some_and(|(from, to)| at >= from && at < to) {
                times.push(at);
            }
            at += period;
        }
        times
    }

    /// `n` polite actors under `kind`: steady or bursty, some silent for
    /// longer than the sketch remembers, on one CPU or moving.
    fn polite_mix(&mut self, kind: Kind, n: usize) {
        for _ in 0..n {
            if self.rng.u8(..5) < 3 {
                self.steady(kind, None);
            } else {
                self.bursty(kind);
            }
        }
    }

    /// A polite actor at 10-95% of its rule's rate, in its own block or in
    /// `block`; its index.
    fn steady(&mut self, kind: Kind, block: Option<u32>) -> u16 {
        let (pps, _, _) = rate_of(kind);
        let share = self.uniform(0.10, 0.95);
        let silent = self.rng.u8(..10) < 3;
        let cpus = self.cpus();
        let what = format!(
            "steady at {:.0}% of {}{}, {cpus:?}",
            share * 100.0,
            kind.name,
            if silent { ", silent and back" } else { "" }
        );
        let actor = self.actor(Role::Polite, kind, what, block);
        let start = Duration::from_millis(self.rng.u64(0..800));
        let end = DURATION - Duration::from_millis(self.rng.u64(0..500));
        let times = self.steady_times(pps * share, start, end, silent);
        self.frames(actor, &times, cpus);
        actor
    }

    /// A polite actor sending bursts of up to 90% of its allowance, each
    /// in a window of its own (the next a window and a little more after).
    fn bursty(&mut self, kind: Kind) {
        let (_, window, allowance) = rate_of(kind);
        let cpus = self.cpus();
        let actor = self.actor(
            Role::Polite,
            kind,
            format!("bursts within {}, {cpus:?}", kind.name),
            None,
        );
        let mut at = Duration::from_millis(self.rng.u64(0..1_000));
        let mut times = Vec::new();
        while at < DURATION {
            let size = 1 + self.rng.u64(..(allowance * 0.9).max(1.0) as u64);
            // Back to back: the frames of a burst share their due time.
            times.extend(std::iter::repeat_n(at, size as usize));
            at += window + Duration::from_millis(self.rng.u64(50..300));
        }
        self.frames(actor, &times, cpus);
    }

    /// A heavy actor at 1.1 to 100 times its rule's rate (at most
    /// [`HEAVY_MAX_FPS`]), for 1.5 to 3.5 s, some silent and back.
    fn heavy(&mut self, kind: Kind) {
        let times_over = self.uniform(1.1, 100.0);
        self.heavy_at(kind, times_over, None);
    }

    fn heavy_at(&mut self, kind: Kind, times_over: f64, block: Option<u32>) {
        let (pps, _, _) = rate_of(kind);
        let rate = (pps * times_over).min(HEAVY_MAX_FPS);
        let silent = self.rng.u8(..10) < 3;
        let cpus = self.cpus();
        let actor = self.actor(
            Role::Heavy,
            kind,
            format!(
                "heavy at {:.1}x {}{}, {cpus:?}",
                rate / pps,
                kind.name,
                if silent { ", silent and back" } else { "" }
            ),
            block,
        );
        let start = Duration::from_millis(self.rng.u64(0..1_000));
        let end = (start + Duration::from_millis(self.rng.u64(1_500..3_500))).min(DURATION);
        let times = self.steady_times(rate, start, end, silent);
        self.frames(actor, &times, cpus);
    }

    /// A /24 of `kind` (a rule with a /24 level) shared by heavy sources
    /// that exhaust it and light ones, at 2-5% of the rule's rate (under
    /// its fair share of the /24, a sixteenth).
    fn neighbourhood(&mut self, kind: Kind) {
        self.next_block += 1;
        let block = self.next_block;
        for _ in 0..(2 + self.rng.u8(..3)) {
            let times_over = self.uniform(1.5, 4.0);
            self.heavy_at(kind, times_over, Some(block));
        }
        let (pps, _, _) = rate_of(kind);
        for _ in 0..(1 + self.rng.u8(..2)) {
            let share = self.uniform(0.02, 0.05);
            let cpus = self.cpus();
            let actor = self.actor(
                Role::Light,
                kind,
                format!(
                    "light at {:.0}% of {} beside heavy ones, {cpus:?}",
                    share * 100.0,
                    kind.name
                ),
                Some(block),
            );
            let start = Duration::from_millis(self.rng.u64(0..500));
            let times = self.steady_times(pps * share, start, DURATION, false);
            self.frames(actor, &times, cpus);
        }
    }

    /// A flood actor of `count` sources under `kind`, `per_block` to a
    /// block, each sending `repeat` frames back to back, spread over
    /// `span` from `start` in bursts alternating between the CPUs.
    #[allow(clippy::too_many_arguments)]
    fn flood(
        &mut self,
        kind: Kind,
        fills: Fills,
        count: u32,
        per_block: u32,
        repeat: u32,
        start: Duration,
        span: Duration,
        what: String,
    ) {
        let first_block = self.next_flood_block;
        self.next_flood_block += count.div_ceil(per_block) + 1;
        let sources = Sources::Many {
            first_block,
            per_block,
            count,
        };
        self.flood_of(kind, fills, sources, repeat, start, span, what);
    }

    /// A flood actor of `sources` under `kind`, each sending `repeat`
    /// frames back to back, spread over `span` from `start` in bursts
    /// alternating between the CPUs.
    #[allow(clippy::too_many_arguments)]
    fn flood_of(
        &mut self,
        kind: Kind,
        fills: Fills,
        sources: Sources,
        repeat: u32,
        start: Duration,
        span: Duration,
        what: String,
    ) {
        let actor = Actor {
            role: Role::Flood,
            kind,
            what,
            sources,
            fills: Some(fills),
        };
        let count = actor.count();
        self.actors.push(actor);
        let actor = (self.actors.len() - 1) as u16;
        let chunks = count.div_ceil(CHUNK);
        for c in 0..chunks {
            let first = c * CHUNK;
            self.cpus[c as usize % 2].push(Item::Burst {
                at: start + span * c / chunks,
                actor,
                first,
                count: CHUNK.min(count - first),
                repeat,
            });
        }
    }

    /// One to four times the kept windows' room in new sources under
    /// `kind` (a rule without cheap frames: each takes a window), one
    /// frame each.
    fn flood_windows(&mut self, kind: Kind) {
        let times = self.uniform(1.0, 4.0);
        let count = (f64::from(WINDOWS) * times) as u32;
        let start = Duration::from_millis(self.rng.u64(300..2_000));
        let span = Duration::from_millis(self.rng.u64(200..1_000));
        let what = format!(
            "{count} sources ({times:.1}x the kept windows) under {}",
            kind.name
        );
        self.flood(kind, Fills::Windows, count, 250, 1, start, span, what);
    }

    /// One to four times the aggregates' room in new /24s under `kind` (a
    /// rule with a /24 level), one frame each.
    fn flood_aggregates(&mut self, kind: Kind) {
        let times = self.uniform(1.0, 4.0);
        let count = (f64::from(WINDOWS) * times) as u32;
        let start = Duration::from_millis(self.rng.u64(300..2_000));
        let span = Duration::from_millis(self.rng.u64(200..1_000));
        let what = format!(
            "{count} /24s ({times:.1}x the aggregates) under {}",
            kind.name
        );
        self.flood(kind, Fills::Aggregates, count, 1, 1, start, span, what);
    }

    /// One to four times the penalties' room in new sources under `kind`
    /// (a rule with a penalty), each over its limit (and blocked) at once.
    fn flood_holds(&mut self, kind: Kind) {
        let (_, _, allowance) = rate_of(kind);
        let times = self.uniform(1.0, 4.0);
        let count = (f64::from(WINDOWS) * times) as u32;
        let start = Duration::from_millis(self.rng.u64(200..1_500));
        let span = Duration::from_millis(self.rng.u64(500..2_000));
        let what = format!(
            "{count} blocked sources ({times:.1}x the penalties) under {}",
            kind.name
        );
        // Past the allowance and the cheap frames (a tenth of it).
        let repeat = allowance as u32 + allowance as u32 / 10 + 2;
        self.flood(kind, Fills::Holds, count, 250, repeat, start, span, what);
    }

    /// A holder of the IPv6 /48 beside `kind`'s own (under its rule: a
    /// 10 pps one, one cheap frame) sends from one to four times the kept
    /// windows' room in its /64s, two frames each: past the cheap frame,
    /// each asks for a window, and the /48 gets its prefix's room of
    /// tickets, no more; the sources of `kind`'s own /48 keep their rule's
    /// rooms.
    fn flood_prefix(&mut self, kind: Kind) {
        let times = self.uniform(1.0, 4.0);
        let count = (f64::from(WINDOWS) * times) as u32;
        let start = Duration::from_millis(self.rng.u64(300..2_000));
        let span = Duration::from_millis(self.rng.u64(200..1_000));
        let what = format!(
            "{count} /64s of one /48 ({times:.1}x the kept windows) under {}",
            kind.name
        );
        let sources = Sources::Neighbour { count };
        self.flood_of(kind, Fills::Prefix, sources, 2, start, span, what);
    }

    /// One to `most` times the sketch's entries in one-frame sources under
    /// `kind`, within about a second.
    fn flood_sketch(&mut self, kind: Kind, most: u32) {
        let times = self.uniform(1.0, f64::from(most));
        let count = (f64::from(SKETCH) * times) as u32;
        let start = Duration::from_millis(self.rng.u64(200..2_000));
        let span = Duration::from_millis(self.rng.u64(600..1_200));
        let what = format!(
            "{count} one-frame sources ({times:.1}x the sketch) under {}",
            kind.name
        );
        self.flood(kind, Fills::Sketch, count, 250, 1, start, span, what);
    }
}
