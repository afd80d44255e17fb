//! `cargo xtask bench xdp`: the kernel's own ns-per-packet figure
//! (BPF_PROG_TEST_RUN with a large repeat count) for the limiter and, in
//! the same run, for the baseline program (same parsing, one per-CPU LRU
//! counter). Cases where a source appears and goes (new sources, a source
//! that sends four frames, a heavy source beside a spoofed flood) run each
//! frame once instead, since state is what they measure. The limiter runs
//! with the tiers on, as the daemon's default configuration has them; a
//! second copy with the tiers off shows what they add or save. Ends with
//! the targets checked and one JSON line per case. Arguments, if
//! any, name the cases to run (to profile one).

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use aya::{
    maps::{IterableMap, Map, MapData, PerCpuArray},
    programs::Xdp,
};
use limiter_bench::current;
use limiter_bench_objects::{baseline_program, load_baseline};
use limiter_common::{
    Action, Counter, Outcome, Scope, DEFAULT_MAX_HOT_SOURCES, DEFAULT_MAX_SOURCES,
};
use limiter_tests::{
    net, packets,
    testrun::{coarse_now, pin_current_thread, test_run, XDP_DROP, XDP_PASS},
};
use limiter_user::{
    kernel::{self, push, windows::Reclaim, LoadOptions, Program},
    rules::{RuleSet, RuleSpec},
};
use serde_json::Value;

const REPEAT: u32 = 1_000_000;
const ROUNDS: usize = 9;
/// Frames of each case that runs every frame once.
const SINGLE_FRAMES: u32 = 100_000;
const CPU: usize = 0;

fn udp(src: Ipv4Addr) -> Vec<u8> {
    packets::udp_v4(src, Ipv4Addr::new(198, 51, 100, 200), 53, 18)
}

/// The `i`-th address from `base` on.
fn nth(base: Ipv4Addr, i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + i)
}

/// The kernel-reported ns per run of one round of `REPEAT` runs.
fn round(program: &Xdp, frame: &[u8], expect: u32) -> f64 {
    let result = test_run(program, frame, REPEAT).expect("BPF_PROG_TEST_RUN");
    assert_eq!(result.return_value, expect, "unexpected verdict");
    result.duration.as_nanos() as f64
}

/// Medians over `ROUNDS` of the limiter and the baseline, their rounds
/// interleaved so that machine noise hits both alike.
fn paired(limiter: (&Xdp, &[u8], u32), baseline: (&Xdp, &[u8], u32)) -> (f64, f64) {
    let (mut lim, mut base) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        lim.push(round(limiter.0, limiter.1, limiter.2));
        base.push(round(baseline.0, baseline.1, baseline.2));
    }
    (median(&mut lim), median(&mut base))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// What one program did with the frames of one group of a single-run case.
#[derive(Clone, Copy, Debug, Default)]
struct Group {
    ns: u128,
    frames: u64,
    passed: u64,
    dropped: u64,
}

impl Group {
    fn mean_ns(&self) -> f64 {
        self.ns as f64 / self.frames.max(1) as f64
    }
}

/// A single-run case's frames, in the order they are sent, each with the
/// group it is reported in (a case with one group uses 0).
type Frames = Vec<(Vec<u8>, usize)>;

/// Sleeps into the next second of the coarse clock, a new epoch of the
/// limiter's cheap tier: its counters then hold only what this case sends
/// (they are shared by every source, and what an earlier case sent in the
/// same second would otherwise push some of this case's sources out of
/// the cheap tier early, by how long the earlier case happened to take).
fn next_epoch() {
    let now = coarse_now();
    let into = Duration::from_nanos(u64::from(now.subsec_nanos()));
    // A few ms past the second: the coarse clock moves a tick at a time.
    std::thread::sleep(Duration::from_secs(1) - into + Duration::from_millis(10));
}

/// Runs every frame once, in order, on the limiter and on the baseline:
/// in `ROUNDS` slices, the limiter's slice then the baseline's, so that
/// noise hits both alike (each program has its own maps, so the order
/// between them changes nothing they see). Returns, per group, what the
/// limiter and the baseline did, and the seconds the case took.
fn single_runs(
    limiter: &Xdp,
    baseline: &Xdp,
    frames: &Frames,
    groups: usize,
) -> (Vec<Group>, Vec<Group>, f64) {
    let mut lim = vec![Group::default(); groups];
    let mut base = vec![Group::default(); groups];
    next_epoch();
    let started = Instant::now();
    let slice = frames.len().div_ceil(ROUNDS);
    for part in frames.chunks(slice) {
        for (program, out) in [(limiter, &mut lim), (baseline, &mut base)] {
            for (frame, group) in part {
                let result = test_run(program, frame, 1).expect("BPF_PROG_TEST_RUN");
                let g = &mut out[*group];
                g.ns += result.duration.as_nanos();
                g.frames += 1;
                match result.return_value {
                    XDP_PASS => g.passed += 1,
                    XDP_DROP => g.dropped += 1,
                    other => panic!("unexpected verdict {other}"),
                }
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    if seconds > 1.0 {
        // Then not every source's frames fell in the epoch the case began.
        eprintln!("note: a single-run case took {seconds:.2} s, over one epoch");
    }
    (lim, base, seconds)
}

/// New sources, one frame each, under the 10 pps blocking rule, on a
/// program of their own: before any source was blocked.
const BEFORE_BLOCKS: &str = "new_source_each_packet_10pps_block";
/// The same on the same program once `BLOCKED_SOURCES` spoofed sources got
/// themselves blocked by that rule (their penalties running), against the
/// same frames on a twin program that saw no such flood (its baseline).
const AFTER_BLOCKS: &str = "new_source_each_packet_10pps_block_after_blocked_flood";
/// Spoofed sources that get themselves blocked before [`AFTER_BLOCKS`]:
/// 12 frames each (a cheap frame, the 10 pps allowance, one refused),
/// 480,000 frames in all, under the rule's 10 s penalty.
const BLOCKED_SOURCES: u32 = 40_000;

/// [`BEFORE_BLOCKS`] and [`AFTER_BLOCKS`]: what a spoofed flood costs a
/// blocking rule's cheap tier after a flood of sources it blocked. Two
/// twin programs see the same new sources; then one of them sees the
/// blocked sources' frames (12 each); both wait two epochs (so that the
/// cheap tier's counters hold nothing of them: what is left is their
/// penalties alone) and get the daemon's reclaim of their idle windows
/// (it runs every tick; without it the kept windows would fill and new
/// sources that need one be refused); then the same new sources run on
/// both, interleaved: [`AFTER_BLOCKS`]'s ratio is the one against its
/// twin.
fn blocked_flood(base_prog: &Xdp) -> Vec<Case> {
    let (mut flooded, mut twin) = (limiter(true), limiter(true));
    let stats = Stats::of(&flooded);
    let fresh =
        |base: Ipv4Addr| -> Frames { (0..SINGLE_FRAMES).map(|i| (udp(nth(base, i)), 0)).collect() };
    let all_passed = |name: &str, groups: [(&str, &Group); 2]| {
        for (who, g) in groups {
            assert_eq!(g.passed, g.frames, "{name}: {who} dropped a frame");
        }
    };
    let mut cases = Vec::new();
    let before = fresh(Ipv4Addr::new(16, 0, 0, 0));
    let paths = stats.paths();
    let (lim, base, _) = single_runs(flooded.xdp(), base_prog, &before, 1);
    all_passed(
        BEFORE_BLOCKS,
        [("limiter", &lim[0]), ("baseline", &base[0])],
    );
    cases.push(Case {
        name: BEFORE_BLOCKS,
        ns: lim[0].mean_ns(),
        baseline: base[0].mean_ns(),
        paths: Some(stats.paths().since(paths)),
    });
    for (frame, _) in &before {
        test_run(twin.xdp(), frame, 1).expect("BPF_PROG_TEST_RUN");
    }
    let mut refused = 0;
    for i in 0..BLOCKED_SOURCES {
        let frame = udp(nth(Ipv4Addr::new(16, 128, 0, 0), i));
        for _ in 0..12 {
            let result = test_run(flooded.xdp(), &frame, 1).expect("BPF_PROG_TEST_RUN");
            refused += u32::from(result.return_value == XDP_DROP);
        }
    }
    assert!(
        refused >= BLOCKED_SOURCES,
        "{refused} refused: every source past its allowance"
    );
    std::thread::sleep(Duration::from_secs(2));
    let now = kernel::now().as_nanos() as u64;
    for program in [&mut flooded, &mut twin] {
        let mut reclaim = Reclaim::default();
        while !reclaim
            .step(&mut program.maps, now, 1 << 17, &mut Vec::new())
            .expect("the reclaim of the kept windows")
            .pass_done
        {}
    }
    let after = fresh(Ipv4Addr::new(16, 64, 0, 0));
    let paths = stats.paths();
    let twin_prog: &Xdp = twin.xdp();
    let (lim, base, _) = single_runs(flooded.xdp(), twin_prog, &after, 1);
    all_passed(AFTER_BLOCKS, [("limiter", &lim[0]), ("its twin", &base[0])]);
    cases.push(Case {
        name: AFTER_BLOCKS,
        ns: lim[0].mean_ns(),
        baseline: base[0].mean_ns(),
        paths: Some(stats.paths().since(paths)),
    });
    cases
}

/// Rule set of the bench: the default limit far above any rate here, an
/// allow rule, a 1 pps limit (the over-limit source), a byte limit (which
/// turns leases off), 60 a minute (no cheap frames: every new
/// source takes a window), 100 pps node-scoped, with a penalty, and
/// cluster-scoped, and 10 pps with a penalty.
fn rules(tiered: bool) -> RuleSet {
    let mut set = RuleSet::with_default(RuleSpec::limit(net("0.0.0.0/0"), 100_000_000));
    set.rules
        .push(RuleSpec::with_action(net("192.0.2.0/24"), Action::Allow));
    set.rules.push(RuleSpec::limit(net("198.51.100.0/24"), 1));
    // A byte limit turns leases off: every admitted frame takes the shared
    // path (window lookup and compare-and-swap of packets and bytes).
    let mut shared = RuleSpec::limit(net("203.0.113.128/25"), 100_000_000);
    shared.limits.bytes_per_second = Some(100_000_000_000);
    set.rules.push(shared);
    // A small allowance over a minute (60 a minute): no cheap frames
    // (their bound, a tenth of the allowance over the minute's 31 pairs of
    // epochs, is under one), every frame in the exact tier.
    let mut windowed = RuleSpec::limit(net("10.0.0.0/8"), 1);
    windowed.limits.window = Duration::from_secs(60);
    set.rules.push(windowed);
    // The limits operators set, for the new-source cases: 100 pps, 100 pps
    // with a penalty, and a cluster-scoped 100 pps (no daemon here: its
    // cluster state reads as stale, so the fallback cap, its whole limit).
    set.rules.push(RuleSpec::limit(net("11.0.0.0/8"), 100));
    let mut penalty = RuleSpec::limit(net("12.0.0.0/8"), 100);
    penalty.limits.block = Some(Duration::from_secs(10));
    set.rules.push(penalty);
    let mut shared = RuleSpec::limit(net("13.0.0.0/8"), 100);
    shared.scope = Scope::Cluster;
    set.rules.push(shared);
    // 10 pps with a penalty: new sources before and after a flood of
    // sources that get themselves blocked.
    let mut blocking = RuleSpec::limit(net("16.0.0.0/8"), 10);
    blocking.limits.block = Some(Duration::from_secs(10));
    set.rules.push(blocking);
    // Two aggregate levels and a second window, on a limit no frame here
    // reaches (admitted) and on a 1 pps limit (held).
    for (cidr, pps) in [("14.0.0.0/8", 100_000_000), ("15.0.0.0/8", 1)] {
        let mut levelled = RuleSpec::limit(net(cidr), pps);
        levelled.levels = LEVELS
            .iter()
            .map(|text| text.parse().expect("a level"))
            .collect();
        set.rules.push(levelled);
    }
    set.tiered = tiered;
    set
}

/// The levels of the levelled rules: a /24 and a /16 aggregate and a
/// second window per source, none of which the bench's frames reach.
const LEVELS: [&str; 3] = [
    "prefix/24:100000000",
    "prefix/16:100000000",
    "source:100000000@100ms",
];

/// The limiter with the tiers on and the daemon's default capacities, or
/// off with every source's per-CPU state in a map of the baseline's size
/// (the untiered design, for comparison) and room for every source's
/// window (each new source takes one from its first frame: its case's
/// 100,000 and the known sources).
fn limiter(tiered: bool) -> Program {
    let options = if tiered {
        LoadOptions {
            max_hot_sources: Some(DEFAULT_MAX_HOT_SOURCES),
            ..LoadOptions::default()
        }
    } else {
        LoadOptions {
            max_sources: 4 * DEFAULT_MAX_SOURCES,
            max_hot_sources: Some(DEFAULT_MAX_SOURCES),
            ..LoadOptions::default()
        }
    };
    let mut program = kernel::load(&options).expect("load limiter");
    push::push(&mut program.maps, &rules(tiered)).expect("push rules");
    program
}

/// Prefixes in the bench's deny list.
const LISTED: u32 = 1_000_000;

/// The address ranges the other cases' frames come from: no listed prefix
/// may cover them.
const UNLISTED: [(Ipv4Addr, u32); 12] = [
    (Ipv4Addr::new(203, 0, 113, 0), 256),
    (Ipv4Addr::new(198, 51, 100, 0), 256),
    (Ipv4Addr::new(192, 0, 2, 0), 256),
    (Ipv4Addr::new(14, 0, 0, 0), 1 << 25),
    (Ipv4Addr::new(10, 0, 0, 0), 1 << 24),
    (Ipv4Addr::new(11, 0, 0, 0), 1 << 24),
    (Ipv4Addr::new(12, 0, 0, 0), 1 << 24),
    (Ipv4Addr::new(13, 0, 0, 0), 1 << 24),
    (Ipv4Addr::new(16, 0, 0, 0), 1 << 24),
    (Ipv4Addr::new(198, 18, 0, 0), 1 << 17),
    (Ipv4Addr::new(100, 64, 0, 0), 1 << 22),
    (Ipv4Addr::new(172, 16, 0, 0), 1 << 16),
];

/// `LISTED` distinct IPv4 prefixes spread over the whole space, shaped
/// like the public block lists (FireHOL level 1-3, Spamhaus DROP): seven
/// in ten single addresses, two a /24, one a /16 to /23; none covering
/// the other cases' sources; and 233.252.0.0/24 (the denied case's) and
/// 233.252.1.7 (a neighbour of `under_limit_list_1m_neighbour`'s source,
/// in its /24: that source walks the trie).
fn deny_list() -> Vec<ipnet::IpNet> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut seen = std::collections::HashSet::new();
    let mut out = vec![net("233.252.0.0/24"), net("233.252.1.7/32")];
    while out.len() < LISTED as usize {
        let r = next();
        let len = match r % 10 {
            0..=6 => 32,
            7 | 8 => 24,
            _ => 16 + (r >> 8) as u8 % 8,
        };
        let prefix = ipnet::Ipv4Net::new(Ipv4Addr::from((r >> 32) as u32), len)
            .expect("a prefix length")
            .trunc();
        let (start, end) = (u32::from(prefix.network()), u32::from(prefix.broadcast()));
        let clear = UNLISTED.iter().all(|(base, size)| {
            let (b, e) = (u32::from(*base), u32::from(*base) + (size - 1));
            end < b || start > e
        });
        if clear && seen.insert(prefix) {
            out.push(prefix.into());
        }
    }
    out
}

/// The tiered limiter with `deny_list()` loaded; how long reading it into
/// trie entries and loading them took, and the memory its trie takes (the
/// larger of the kernel's slab growth and the map's `memlock`).
fn listed() -> (Program, Duration, u64) {
    use limiter_common::lists::ListAction;
    use limiter_user::lists::{merge, List};
    let mut program = kernel::load(&LoadOptions {
        max_hot_sources: Some(DEFAULT_MAX_HOT_SOURCES),
        ..LoadOptions::default()
    })
    .expect("load limiter");
    push::push(&mut program.maps, &rules(true)).expect("push rules");
    let prefixes = deny_list();
    let started = Instant::now();
    let list = List {
        name: "deny".into(),
        action: ListAction::Deny,
        file: None,
        prefixes,
    };
    let merged = merge(&[list], LISTED).expect("the list fits");
    let before = kernel_memory();
    kernel::lists::load_all(&mut [&mut program.maps], &merged).expect("load the list");
    let took = started.elapsed();
    let grown = kernel_memory().saturating_sub(before);
    let memlock = memlock(program.maps.lists_v4.map());
    (program, took, memlock.max(grown))
}

/// The kernel's slab and vmalloc'd memory (bytes, from /proc/meminfo):
/// where a trie's nodes live. Its growth over a load is what the trie
/// really takes (the map's `memlock` counts entries, not the trie's inner
/// nodes or the allocator's rounding).
fn kernel_memory() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    field("Slab:") + field("VmallocUsed:")
}

/// The bytes the kernel accounts a map at (`memlock:` in its fdinfo).
fn memlock(map: &MapData) -> u64 {
    use std::os::fd::{AsFd, AsRawFd};
    let fd = map.fd().as_fd().as_raw_fd();
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// How many frames took each tier's way, from the limiter's outcome
/// counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Paths {
    cheap: u64,
    new_window: u64,
    new_source: u64,
}

impl Paths {
    fn since(self, earlier: Self) -> Self {
        Self {
            cheap: self.cheap - earlier.cheap,
            new_window: self.new_window - earlier.new_window,
            new_source: self.new_source - earlier.new_source,
        }
    }
}

/// A second handle on a limiter's `STATS`: the test runs hold the whole
/// `Program` borrowed (`Program::xdp` takes it mutably), so its `maps`
/// field cannot be read meanwhile.
struct Stats(PerCpuArray<MapData, Counter>);

impl Stats {
    fn of(program: &Program) -> Self {
        let id = program.maps.stats.map().info().expect("STATS info").id();
        let data = MapData::from_id(id).expect("open STATS again");
        Self(PerCpuArray::try_from(Map::PerCpuArray(data)).expect("a per-CPU array"))
    }

    fn paths(&self) -> Paths {
        let of = |o: Outcome| -> u64 {
            let values = self.0.get(&(o as u32), 0).expect("read STATS");
            values.iter().map(|c| c.packets).sum()
        };
        Paths {
            cheap: of(Outcome::Cheap),
            new_window: of(Outcome::NewWindow),
            new_source: of(Outcome::NewSource),
        }
    }
}

struct Case {
    name: &'static str,
    ns: f64,
    baseline: f64,
    /// For single-run cases: what the limiter's frames did.
    paths: Option<Paths>,
}

fn main() {
    // Case names to run (all when none): one case alone is what a profile
    // of the test-run thread needs (`perf record -e cpu-clock -g --
    // target/release/bench-xdp under_limit`).
    let only: Vec<String> = std::env::args().skip(1).collect();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    pin_current_thread(CPU);
    let mut base = load_baseline();
    let mut lim = limiter(true);
    let mut untiered = limiter(false);
    let lists_wanted = only.is_empty() || only.iter().any(|o| o.contains("_list_1m"));
    let mut with_list = lists_wanted.then(listed);
    let base_prog: &Xdp = baseline_program(&mut base);

    let under = udp(Ipv4Addr::new(203, 0, 113, 1));
    let under_shared = udp(Ipv4Addr::new(203, 0, 113, 129));
    let over = udp(Ipv4Addr::new(198, 51, 100, 1));
    let allowed = udp(Ipv4Addr::new(192, 0, 2, 1));
    let under_levels = udp(Ipv4Addr::new(14, 0, 0, 1));
    let over_levels = udp(Ipv4Addr::new(15, 0, 0, 1));
    let arp = packets::arp();
    let denied = udp(Ipv4Addr::new(233, 252, 0, 1));
    let neighbour = udp(Ipv4Addr::new(233, 252, 1, 1));
    // Every single-run case has addresses of its own, which neither
    // program has seen: the baseline's map keeps what earlier cases
    // inserted.
    let fresh = |base: Ipv4Addr| -> Frames {
        let frames = (0..SINGLE_FRAMES).map(|i| (udp(nth(base, i)), 0));
        frames.collect()
    };
    // 198.18.0.0/15, 100.64.0.0/10 and 100.96.0.0/11, under the default
    // rule.
    let new_sources = fresh(Ipv4Addr::new(198, 18, 0, 0));
    let new_sources_untiered = fresh(Ipv4Addr::new(100, 64, 0, 0));
    let new_sources_100 = fresh(Ipv4Addr::new(11, 0, 0, 0));
    let new_sources_penalty = fresh(Ipv4Addr::new(12, 0, 0, 0));
    let new_sources_cluster = fresh(Ipv4Addr::new(13, 0, 0, 0));
    let four_each = |base: Ipv4Addr| -> Frames {
        (0..SINGLE_FRAMES / 4)
            .flat_map(|i| {
                let frame = udp(nth(base, i));
                std::iter::repeat_n((frame, 0), 4)
            })
            .collect()
    };
    let four_frames = four_each(Ipv4Addr::new(100, 96, 0, 0));
    // Under the 60-a-minute rule, which has no cheap frames: a window
    // each, from the first frame.
    let four_frames_windowed = four_each(Ipv4Addr::new(10, 0, 0, 0));
    // Group 0: the held source; group 1: a spoofed flood, one new source
    // per frame, one flood frame after each of the source's.
    let beside: Frames = (0..SINGLE_FRAMES / 2)
        .flat_map(|i| {
            [
                (over.clone(), 0),
                (udp(nth(Ipv4Addr::new(172, 16, 0, 0), i)), 1),
            ]
        })
        .collect();

    let (lim_stats, untiered_stats) = (Stats::of(&lim), Stats::of(&untiered));
    let list_load = with_list
        .as_ref()
        .map(|(_, took, memlock)| (*took, *memlock));
    let lim_prog: &Xdp = lim.xdp();
    let untiered_prog: &Xdp = untiered.xdp();
    let listed_prog: Option<&Xdp> = with_list.as_mut().map(|(program, _, _)| &*program.xdp());
    // Warm up: create the known sources (past the cheap tier, so that they
    // have per-CPU state) and push `over` past its limit.
    for program in [lim_prog, untiered_prog, base_prog]
        .into_iter()
        .chain(listed_prog)
    {
        for frame in [
            &under,
            &under_shared,
            &over,
            &allowed,
            &under_levels,
            &over_levels,
            &neighbour,
        ] {
            test_run(program, frame, 1_000).expect("warm up");
        }
    }

    let case = |name, program: &Xdp, limiter: (&[u8], u32), baseline_frame: &[u8]| {
        if !wanted(name) {
            return None;
        }
        let (ns, baseline) = paired(
            (program, limiter.0, limiter.1),
            (base_prog, baseline_frame, XDP_PASS),
        );
        Some(Case {
            name,
            ns,
            baseline,
            paths: None,
        })
    };
    let mut cases: Vec<Case> = [
        case("under_limit", lim_prog, (&under, XDP_PASS), &under),
        case(
            "under_limit_no_lease",
            lim_prog,
            (&under_shared, XDP_PASS),
            &under_shared,
        ),
        case("over_limit_drop", lim_prog, (&over, XDP_DROP), &over),
        case(
            "under_limit_levels",
            lim_prog,
            (&under_levels, XDP_PASS),
            &under_levels,
        ),
        case(
            "over_limit_drop_levels",
            lim_prog,
            (&over_levels, XDP_DROP),
            &over_levels,
        ),
        case("allowlisted", lim_prog, (&allowed, XDP_PASS), &allowed),
        case(
            "under_limit_tiers_off",
            untiered_prog,
            (&under, XDP_PASS),
            &under,
        ),
        case(
            "over_limit_drop_tiers_off",
            untiered_prog,
            (&over, XDP_DROP),
            &over,
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    if let Some(listed_prog) = listed_prog {
        cases.extend(
            [
                case(
                    "under_limit_list_1m",
                    listed_prog,
                    (&under, XDP_PASS),
                    &under,
                ),
                case(
                    "over_limit_drop_list_1m",
                    listed_prog,
                    (&over, XDP_DROP),
                    &over,
                ),
                case(
                    "denylisted_list_1m",
                    listed_prog,
                    (&denied, XDP_DROP),
                    &denied,
                ),
                case(
                    "under_limit_list_1m_neighbour",
                    listed_prog,
                    (&neighbour, XDP_PASS),
                    &neighbour,
                ),
            ]
            .into_iter()
            .flatten(),
        );
    }

    // A single-run case whose frames must all pass on both programs.
    let all_pass = |name, (program, stats): (&Xdp, &Stats), frames: &Frames| {
        if !wanted(name) {
            return None;
        }
        let before = stats.paths();
        let (lim, base, _) = single_runs(program, base_prog, frames, 1);
        for (who, g) in [("limiter", &lim[0]), ("baseline", &base[0])] {
            assert_eq!(g.passed, g.frames, "{name}: {who} dropped a frame");
        }
        Some(Case {
            name,
            ns: lim[0].mean_ns(),
            baseline: base[0].mean_ns(),
            paths: Some(stats.paths().since(before)),
        })
    };
    let tiered = (lim_prog, &lim_stats);
    cases.extend(all_pass("new_source_each_packet", tiered, &new_sources));
    cases.extend(all_pass(
        "new_source_each_packet_100pps",
        tiered,
        &new_sources_100,
    ));
    cases.extend(all_pass(
        "new_source_each_packet_100pps_penalty",
        tiered,
        &new_sources_penalty,
    ));
    if wanted(BEFORE_BLOCKS) || wanted(AFTER_BLOCKS) {
        cases.extend(blocked_flood(base_prog));
    }
    cases.extend(all_pass(
        "new_source_each_packet_cluster",
        tiered,
        &new_sources_cluster,
    ));
    cases.extend(all_pass(
        "new_source_each_packet_tiers_off",
        (untiered_prog, &untiered_stats),
        &new_sources_untiered,
    ));
    cases.extend(all_pass("four_frames_then_quiet", tiered, &four_frames));
    cases.extend(all_pass(
        "four_frames_then_quiet_windowed",
        tiered,
        &four_frames_windowed,
    ));
    if wanted("heavy_beside_spoofed_flood") {
        cases.extend(heavy_beside_flood(lim_prog, &lim_stats, base_prog, &beside));
    }
    cases.extend(case("non_ip", lim_prog, (&arp, XDP_PASS), &arp));

    let mut lines = report(&cases);
    if let Some((took, memlock)) = list_load {
        let met = took < Duration::from_secs(10);
        let value = format!(
            "{:.1} s, the IPv4 trie {:.0} MiB ({} B a prefix, slab growth)",
            took.as_secs_f64(),
            memlock as f64 / (1 << 20) as f64,
            memlock / u64::from(LISTED)
        );
        println!(
            "target: {LISTED} deny prefixes read and loaded < 10 s -> {value} ({})",
            if met { "met" } else { "MISSED" }
        );
        let line = format!(
            "{{\"case\":\"list_load_1m\",\"prefixes\":{LISTED},\"seconds\":{:.2},\"memory_bytes\":{memlock}}}",
            took.as_secs_f64()
        );
        println!("{line}");
        lines.push(serde_json::from_str(&line).expect("a JSON line"));
        lines.push(current::target(
            "1M deny prefixes loaded < 10 s",
            &value,
            Some(met),
        ));
    }
    if only.is_empty() {
        let root = current::root();
        current::save(&root, "xdp", &machine(), &lines)
            .and_then(|()| current::rewrite(&root))
            .unwrap_or_else(|e| panic!("saving the current figures: {e:#}"));
        eprintln!("saved docs/data/xdp.jsonl and rendered docs/benchmarks.md's current figures");
    }
}

/// This machine as the current figures name it.
fn machine() -> String {
    let cpus = aya::util::online_cpus().map_or(0, |c| c.len());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cpus} CPUs (shared), kernel {}, test runs pinned to CPU {CPU}",
        kernel.trim()
    )
}

/// The heavy source's frames and the flood's of `heavy_beside_spoofed_flood`
/// (`frames`: group 0 the held source's, group 1 the flood's), each against
/// the baseline's figure for the same frames.
fn heavy_beside_flood(
    lim_prog: &Xdp,
    lim_stats: &Stats,
    base_prog: &Xdp,
    frames: &Frames,
) -> [Case; 2] {
    let before = lim_stats.paths();
    let (l, b, seconds) = single_runs(lim_prog, base_prog, frames, 2);
    let paths = lim_stats.paths().since(before);
    let (heavy, flood) = (l[0], l[1]);
    // The held source: at most its 1 pps through the run (one more for
    // the window the run began in); the flood's sources are all new and
    // under their limit; the baseline passes everything.
    assert!(
        heavy.passed <= seconds.ceil() as u64 + 1,
        "heavy_beside_spoofed_flood: the held source passed {} frames in {seconds:.1} s",
        heavy.passed
    );
    assert_eq!(flood.passed, flood.frames, "the flood lost a frame");
    assert!(b.iter().all(|g| g.passed == g.frames));
    // The outcome counters do not tell the two groups apart: both rows
    // show the case's.
    [
        ("heavy_beside_spoofed_flood.heavy", heavy, b[0]),
        ("heavy_beside_spoofed_flood.flood", flood, b[1]),
    ]
    .map(|(name, lim, base)| Case {
        name,
        ns: lim.mean_ns(),
        baseline: base.mean_ns(),
        paths: Some(paths),
    })
}

/// Prints the table, the targets and the JSON lines; returns the JSON
/// lines and the targets (`current::target`) as values.
fn report(cases: &[Case]) -> Vec<Value> {
    let mut targets_met = Vec::new();
    println!(
        "xdp bench: BPF_PROG_TEST_RUN on CPU {CPU}, median of {ROUNDS} rounds of {REPEAT} runs, \
         limiter and baseline rounds interleaved (single-run cases: mean of {SINGLE_FRAMES} \
         frames run once each, in {ROUNDS} interleaved slices; they include the per-call timer)"
    );
    println!(
        "{:<34} {:>9} {:>9} {:>7}   limiter paths (cheap / new window / new source)",
        "case", "ns/pkt", "baseline", "ratio"
    );
    for case in cases {
        let paths = case.paths.map_or(String::new(), |p| {
            format!("{} / {} / {}", p.cheap, p.new_window, p.new_source)
        });
        println!(
            "{:<34} {:>9.1} {:>9.1} {:>6.2}x   {paths}",
            case.name,
            case.ns,
            case.baseline,
            case.ns / case.baseline
        );
    }
    // The targets, each from its case (when it ran): what, the
    // case, and whether its (ns, ratio to the baseline) meet it.
    type Check = fn(f64, f64) -> bool;
    let targets: [(&str, &str, Check); 8] = [
        (
            "new source each frame <= 0.45x the baseline",
            "new_source_each_packet",
            |_, ratio| ratio <= 0.45,
        ),
        (
            "new source each frame, 100 pps <= 0.45x the baseline (ambition 0.35x)",
            "new_source_each_packet_100pps",
            |_, ratio| ratio <= 0.45,
        ),
        (
            "new source each frame, 100 pps with a penalty <= 0.45x the baseline",
            "new_source_each_packet_100pps_penalty",
            |_, ratio| ratio <= 0.45,
        ),
        (
            "new source each frame, cluster scope <= 0.45x the baseline",
            "new_source_each_packet_cluster",
            |_, ratio| ratio <= 0.45,
        ),
        (
            "four frames then quiet <= 250 ns per frame",
            "four_frames_then_quiet",
            |ns, _| ns <= 250.0,
        ),
        (
            "four frames then quiet, a window each <= 1.2x the baseline",
            "four_frames_then_quiet_windowed",
            |_, ratio| ratio <= 1.2,
        ),
        (
            "known source under limit <= 1.3x the baseline (ambition 1.2x)",
            "under_limit",
            |_, ratio| ratio <= 1.3,
        ),
        (
            "known source over limit (held) <= 1.3x the baseline (ambition 1.2x)",
            "over_limit_drop",
            |_, ratio| ratio <= 1.3,
        ),
    ];
    for (what, name, check) in targets {
        let Some(case) = cases.iter().find(|c| c.name == name) else {
            continue;
        };
        let ratio = case.ns / case.baseline;
        let met = check(case.ns, ratio);
        println!(
            "target: {what} -> {:.1} ns, {ratio:.2}x ({})",
            case.ns,
            if met { "met" } else { "MISSED" }
        );
        targets_met.push(current::target(
            what,
            &format!("{:.1} ns, {ratio:.2}x", case.ns),
            Some(met),
        ));
    }
    if let Some(after) = cases.iter().find(|c| c.name == AFTER_BLOCKS) {
        let ratio = after.ns / after.baseline;
        println!(
            "target: new sources under a blocking rule after 480,000 frames of 40,000 sources it \
             blocked cost what they cost on a twin without them (<= 1.05x, noise) -> {:.1} ns vs \
             {:.1} ns, {ratio:.2}x ({})",
            after.ns,
            after.baseline,
            if ratio <= 1.05 { "met" } else { "MISSED" }
        );
    }
    // Levels against the per-source-only paths of the same run.
    let ns = |name: &str| cases.iter().find(|c| c.name == name).map(|c| c.ns);
    for (what, levelled, plain, most) in [

        (
            "admitted with two aggregates and two windows <= 1.5x the per-source-only admitted path",
            "under_limit_levels",
            "under_limit",
            1.5,
        ),
        (
            "held with levels no more expensive than the held path without (<= 1.05x, noise)",
            "over_limit_drop_levels",
            "over_limit_drop",
            1.05,
        ),
        (
            "known source under limit with 1M prefixes in a deny list <= 1.15x the same case without lists",
            "under_limit_list_1m",
            "under_limit",
            1.15,
        ),
        (
            "known source over limit (held) with 1M prefixes in a deny list <= 1.15x the same case without lists",
            "over_limit_drop_list_1m",
            "over_limit_drop",
            1.15,
        ),
    ] {
        if let (Some(levelled), Some(plain)) = (ns(levelled), ns(plain)) {
            let ratio = levelled / plain;
            println!(
                "target: {what} -> {levelled:.1} ns vs {plain:.1} ns, {ratio:.2}x ({})",
                if ratio <= most { "met" } else { "MISSED" }
            );
            targets_met.push(current::target(
                what,
                &format!("{levelled:.1} ns vs {plain:.1} ns, {ratio:.2}x"),
                Some(ratio <= most),
            ));
        }
    }
    let mut lines: Vec<Value> = Vec::new();
    for case in cases {
        let paths = case.paths.map_or(String::new(), |p| {
            format!(
                ",\"cheap\":{},\"new_window\":{},\"new_source\":{}",
                p.cheap, p.new_window, p.new_source
            )
        });
        let line = format!(
            "{{\"case\":\"{}\",\"ns_per_pkt\":{:.1},\"baseline_ns_per_pkt\":{:.1},\"ratio\":{:.3}{paths}}}",
            case.name,
            case.ns,
            case.baseline,
            case.ns / case.baseline
        );
        println!("{line}");
        lines.push(serde_json::from_str(&line).expect("a JSON line"));
    }
    lines.extend(targets_met);
    lines
}
