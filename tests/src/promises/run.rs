//! Runs a script through the real program in real time: each CPU's
//! schedule on a thread pinned to that CPU, one `BPF_PROG_TEST_RUN` per
//! frame, in slices of a tenth of a second, with the daemon's upkeep of
//! the kept maps (its reclaim of idle windows, aggregates and cells, and
//! its sweep of ended penalties) between two slices, as its tick does.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    thread,
    time::{Duration, Instant},
};

use aya::programs::Xdp;
use limiter_common::{
    rules::{rules_base, MAX_RULES},
    tickets::{self, Rooms},
    Action, AddressFamily, Outcome,
};
use limiter_user::kernel::{self, penalty, windows::Reclaim, Maps};

use super::script::{Item, Role, Script, LATE, WINDOWS};
use crate::{
    packets::{self, DST4, DST6},
    testrun::{coarse_now, pin_current_thread, verdict, Harness, XDP_DROP, XDP_PASS},
};

/// What became of one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    pub actor: u16,
    pub source: u32,
    pub passed: bool,
    /// The kernel's clock just before and just after the frame's run (ns):
    /// the program read a time between the two.
    pub before: u64,
    pub after: u64,
    /// A polite or heavy frame the program counted under an outcome of a
    /// full map (`window_full`, `aggregate_full`, `insert_failure`,
    /// `full_seeded`, `prefix_full`): judged on the refusing side the documentation
    /// states for a full map (and, after `full_seeded`, the window or
    /// aggregate it created, for a window's length). Not read for a
    /// flood's frames.
    pub full: bool,
    /// With `LIMITER_PROMISES_DEBUG` set: the outcomes a polite or heavy
    /// frame counted, as a bit per `Outcome` index (0 otherwise).
    pub outcomes: u32,
}

/// The outcomes of a full map, read around each polite frame.
const FULL: [Outcome; 5] = [
    Outcome::WindowFull,
    Outcome::AggregateFull,
    Outcome::InsertFailure,
    Outcome::FullSeeded,
    Outcome::PrefixFull,
];

/// A tick of the daemon's upkeep between two slices of the script.
const SLICE: Duration = Duration::from_millis(100);

/// What a run did: every frame's fate, in no particular order, and the
/// most entries each kept map held (sampled before each upkeep: between
/// two, only the kernel writes them, and it deletes only an ended
/// penalty).
pub struct Run {
    pub sent: Vec<Sent>,
    pub peak_windows: usize,
    pub peak_aggregates: usize,
    pub peak_holds: usize,
    /// The `RULES` slots of the rules a sample found with their reserve
    /// of tickets full while the shared room was full too: the rules
    /// that refused new unproven windows.
    pub rooms_full: BTreeSet<u32>,
    /// The most tickets each IPv6 /48 (its first six bytes) held at a
    /// sample, counted from the tickets' keys; and the room the documented
    /// semantics give a /48 (`Rooms::prefix`).
    pub peak_prefixes: BTreeMap<[u8; 6], u64>,
    pub prefix_room: u64,
}

impl Run {
    /// Whether a sample found the /48 of `address` at its room (an IPv4
    /// address has none).
    pub fn prefix_full(&self, address: IpAddr) -> bool {
        let IpAddr::V6(v6) = address else {
            return false;
        };
        let octets = v6.octets();
        let prefix: [u8; 6] = octets[..6].try_into().expect("six bytes");
        self.peak_prefixes
            .get(&prefix)
            .is_some_and(|held| *held >= self.prefix_room)
    }
}

/// Runs `script` on `harness` (its rules pushed).
pub fn run(harness: &mut Harness, script: &Script) -> Run {
    let start = Instant::now();
    let mut reclaim = Reclaim::default();
    let mut next = [0usize; 2];
    let mut run = Run {
        sent: Vec::with_capacity(script.frames() as usize),
        peak_windows: 0,
        peak_aggregates: 0,
        peak_holds: 0,
        rooms_full: BTreeSet::new(),
        peak_prefixes: BTreeMap::new(),
        prefix_room: 0,
    };
    // The rooms of tickets the documented semantics give the rules pushed
    // (a reserve per limiting rule, the rest shared), not the kernel's
    // own figures: a kernel that kept no rule its reserve is found out.
    let live = rules_base(1)..rules_base(1) + MAX_RULES;
    let limiting = live
        .clone()
        .map(|slot| harness.maps().rule(slot).expect("a rule slot"))
        .filter(|rule| rule.fingerprint != 0 && rule.action() == Some(Action::Limit))
        .count();
    let rooms = Rooms::new(WINDOWS, limiting as u32);
    run.prefix_room = rooms.prefix;
    let mut end = SLICE;
    loop {
        let (program, maps) = harness.parts();
        let slices: Vec<Vec<Sent>> = thread::scope(|scope| {
            let drivers: Vec<_> = (0..2)
                .map(|cpu| {
                    let items = &script.cpus[cpu][next[cpu]..];
                    let due = items.partition_point(|item| item.at() < end);
                    next[cpu] += due;
                    let items = &items[..due];
                    scope.spawn(move || {
                        pin_current_thread(cpu);
                        drive(program, maps, script, cpu, start, items)
                    })
                })
                .collect();
            drivers
                .into_iter()
                .map(|d| d.join().expect("driver thread"))
                .collect()
        });
        run.sent.extend(slices.into_iter().flatten());
        let maps = harness.maps();
        run.peak_windows = run.peak_windows.max(maps.windows.keys().count());
        run.peak_aggregates = run.peak_aggregates.max(maps.aggregates.keys().count());
        run.peak_holds = run.peak_holds.max(maps.holds.keys().count());
        let held = maps.tickets_held().expect("the tickets' accounts");
        if held[usize::from(tickets::SHARED)] >= rooms.shared {
            run.rooms_full.extend(
                live.clone()
                    .filter(|slot| held[*slot as usize] >= rooms.reserve),
            );
        }
        let mut prefixes = BTreeMap::<[u8; 6], u64>::new();
        for key in maps.unproven.keys() {
            let key = key.expect("a ticket's key");
            if key.family() == AddressFamily::V6 {
                let prefix: [u8; 6] = key.addr[..6].try_into().expect("six bytes");
                *prefixes.entry(prefix).or_default() += 1;
            }
        }
        for (prefix, held) in prefixes {
            let peak = run.peak_prefixes.entry(prefix).or_default();
            *peak = (*peak).max(held);
        }
        upkeep(harness.maps_mut(), &mut reclaim);
        if end >= script.duration {
            return run;
        }
        end += SLICE;
    }
}

/// The daemon's tick on the kept maps: a slice of its reclaim (a pass
/// over every map, as its budget allows at these sizes) and its sweep of
/// ended penalties.
fn upkeep(maps: &mut Maps, reclaim: &mut Reclaim) {
    let now = kernel::now().as_nanos() as u64;
    reclaim
        .step(maps, now, 131_072, &mut Vec::new())
        .expect("the reclaim of the kept maps");
    penalty::sweep(maps, now).expect("the sweep of HOLDS");
}

/// One CPU's items of a slice, in order.
fn drive(
    program: &Xdp,
    maps: &Maps,
    script: &Script,
    cpu: usize,
    start: Instant,
    items: &[Item],
) -> Vec<Sent> {
    let debug = std::env::var_os("LIMITER_PROMISES_DEBUG").is_some();
    let mut v4 = packets::udp_v4(Ipv4Addr::UNSPECIFIED, DST4, 9999, 18);
    let mut v6 = packets::udp_v6(Ipv6Addr::UNSPECIFIED, DST6, 9999, 18);
    let mut sent = Vec::new();
    let mut one = |actor: u16, source: u32, watched: bool| {
        let address = script.actors[usize::from(actor)].source(source);
        let frame = match address {
            IpAddr::V4(_) => &mut v4,
            IpAddr::V6(_) => &mut v6,
        };
        packets::set_source(frame, address);
        let full_before = watched.then(|| full_count(maps, cpu));
        let all_before = (watched && debug).then(|| all_counts(maps, cpu));
        let before = coarse_now().as_nanos() as u64;
        let verdict = verdict(program, frame);
        let after = coarse_now().as_nanos() as u64;
        let outcomes = all_before.map_or(0, |was| {
            all_counts(maps, cpu)
                .iter()
                .zip(&was)
                .enumerate()
                .filter(|(_, (now, was))| now > was)
                .fold(0, |bits, (i, _)| bits | 1 << i)
        });
        let passed = match verdict {
            XDP_PASS => true,
            XDP_DROP => false,
            other => panic!("unexpected verdict {other}"),
        };
        let full = full_before.is_some_and(|count| full_count(maps, cpu) > count);
        sent.push(Sent {
            actor,
            source,
            passed,
            before,
            after,
            full,
            outcomes,
        });
    };
    for item in items {
        match *item {
            Item::Frame { at, actor, source } => {
                let due = start + at;
                let polite = matches!(
                    script.actors[usize::from(actor)].role,
                    Role::Polite | Role::Light
                );
                let mut now = Instant::now();
                while now < due {
                    std::hint::spin_loop();
                    now = Instant::now();
                }
                if polite && now > due + LATE {
                    continue;
                }
                one(actor, source, true);
            }
            Item::Burst {
                at,
                actor,
                first,
                count,
                repeat,
            } => {
                while Instant::now() < start + at {
                    std::hint::spin_loop();
                }
                for source in first..first + count {
                    for _ in 0..repeat {
                        one(actor, source, false);
                    }
                }
            }
        }
    }
    sent
}

/// This CPU's count of `outcome`.
fn count_on(maps: &Maps, cpu: usize, outcome: Outcome) -> u64 {
    maps.stats
        .get(&(outcome as u32), 0)
        .expect("reading STATS")
        .get(cpu)
        .map_or(0, |c| c.packets)
}

/// This CPU's count of every outcome.
fn all_counts(maps: &Maps, cpu: usize) -> Vec<u64> {
    Outcome::ALL
        .iter()
        .map(|outcome| count_on(maps, cpu, *outcome))
        .collect()
}

/// This CPU's count of the full-map outcomes.
fn full_count(maps: &Maps, cpu: usize) -> u64 {
    FULL.iter()
        .map(|outcome| count_on(maps, cpu, *outcome))
        .sum()
}
