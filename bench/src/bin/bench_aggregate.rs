//! `cargo xtask bench aggregate`: the daemon's aggregation with 1,000,000
//! active sources, with the tiers (the default) and, in the same run,
//! without them.
//!
//! With the tiers, a million active sources are a million shared windows
//! (`WINDOWS`) and at most `max_hot_sources` sources with per-CPU state
//! (`SOURCES`); the daemon's pass reads `SOURCES` only, and the walk that
//! reclaims idle windows reads `WINDOWS` and feeds the sample of known
//! sources. The bench fills `WINDOWS` with 1,000,000 windows and `SOURCES`
//! to its default cap, and times the daemon's ticks and a whole walk of
//! the windows into the sample. Without the tiers every source has per-CPU
//! state: the baseline fills `SOURCES` with 1,000,000 sources and times a
//! full pass, the daemon's bounded ticks over it, the batched reads alone
//! and reading the map one key at a time (aya's iterator, two syscalls
//! per key). The two programs' rounds are interleaved.
//!
//! It also prints the kernel's memory for both programs' maps as loaded
//! here, and the same maps on 64 possible CPUs. Prints a table and one
//! JSON line.

use std::{
    fs,
    os::fd::{AsFd, AsRawFd},
    time::{Duration, Instant},
};

use aya::maps::{IterableMap, MapInfo};
use limiter_common::{
    window, Counter, SourceKey, SourceTraffic, WindowState, DEFAULT_MAX_HOT_SOURCES,
};
use limiter_user::{
    config::{Config, DaemonSection},
    daemon::{
        aggregate::{pass, Sweep},
        history::History,
        known::{Known, Reading},
    },
    kernel::{
        self,
        batch::{self, update_per_cpu},
        windows::Reclaim,
        LoadOptions, Program,
    },
};

/// Active sources.
const SOURCES: u32 = 1_000_000;
/// Capacity that holds them: LRU maps evict a little before they are full.
const CAPACITY: u32 = 1 << 20;
/// Rounds of each pass measured (the median is reported).
const ROUNDS: usize = 3;
/// CPUs of the memory figure: per-CPU maps allocate a value per possible
/// CPU.
const BIG_CPUS: u64 = 64;

/// User plus system CPU time of this process.
fn cpu_time() -> Duration {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage");
    let tv =
        |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    tv(usage.user_time()) + tv(usage.system_time())
}

/// (current, peak) resident set size in MiB.
fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[derive(Clone, Copy, Debug)]
struct Measured {
    wall: Duration,
    cpu: Duration,
}

fn measure(mut f: impl FnMut()) -> Measured {
    let (wall0, cpu0) = (Instant::now(), cpu_time());
    f();
    Measured {
        wall: wall0.elapsed(),
        cpu: cpu_time() - cpu0,
    }
}

fn median(mut runs: Vec<Measured>) -> Measured {
    runs.sort_by_key(|m| m.cpu);
    runs[runs.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Source `n` of the fill: a quarter IPv6.
fn key(n: u32) -> SourceKey {
    if n.is_multiple_of(4) {
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        addr[4..8].copy_from_slice(&n.to_be_bytes());
        SourceKey::v6(addr)
    } else {
        SourceKey::v4((0x0a00_0000 + n).to_be_bytes())
    }
}

/// Writes sources `0..count` into `program`'s `SOURCES`, each with the
/// same traffic on every CPU (rates that vary by source, so the top-K has
/// work), in chunks so that the filler's own memory stays small.
fn fill_sources(program: &Program, cpus: usize, count: u32) {
    let fd = batch::fd(program.maps.sources_data());
    let second = kernel::now().as_secs();
    const CHUNK: u32 = 100_000;
    for start in (0..count).step_by(CHUNK as usize) {
        let entries: Vec<(SourceKey, Vec<SourceTraffic>)> = (start..count.min(start + CHUNK))
            .map(|n| {
                let traffic = SourceTraffic {
                    second,
                    current: Counter {
                        packets: u64::from(n % 1000),
                        bytes: u64::from(n % 1000) * 100,
                    },
                    previous: Counter {
                        packets: u64::from(n % 997),
                        bytes: u64::from(n % 997) * 100,
                    },
                    total: Counter {
                        packets: u64::from(n),
                        bytes: u64::from(n) * 100,
                    },
                    ..SourceTraffic::default()
                };
                (key(n), vec![traffic; cpus])
            })
            .collect();
        update_per_cpu(fd, cpus, &entries).expect("fill SOURCES");
    }
}

/// Writes a window for sources `0..count` into `program`'s `WINDOWS`.
/// `WINDOWS` is not per-CPU: a batch then carries one value per key, which
/// is the per-CPU batch with one CPU. Each counts 6 frames in each of 15
/// buckets of 6 s (a minute's window) from the one before now's: every
/// window reads as sending, 1 pps, for over a minute after the fill, as
/// the walk that feeds the known sources reads it.
fn fill_windows(program: &Program, count: u32) {
    let fd = batch::fd(program.maps.windows.map());
    let mut window = WindowState::ZERO;
    window.bucket_ns = 6_000_000_000;
    let now_bucket = kernel::now().as_nanos() as u64 / window.bucket_ns;
    for bucket in now_bucket - 1..now_bucket + 14 {
        window.slots[window::slot_of(bucket)][window::PACKETS] = window::pack_packets(bucket, 0, 6);
    }
    const CHUNK: u32 = 100_000;
    for start in (0..count).step_by(CHUNK as usize) {
        let entries: Vec<(SourceKey, Vec<WindowState>)> = (start..count.min(start + CHUNK))
            .map(|n| (key(n), vec![window]))
            .collect();
        update_per_cpu(fd, 1, &entries).expect("fill WINDOWS");
    }
}

/// One map's memory as the kernel accounts it (`memlock` in its fdinfo:
/// the map's `map_mem_usage`), and the share of it that grows with the
/// number of possible CPUs.
struct MapMemory {
    name: String,
    max_entries: u64,
    bytes: u64,
    /// Bytes per possible CPU: the per-CPU maps' values, rounded up to 8
    /// bytes as the kernel stores them, times their capacity.
    per_cpu_bytes: u64,
}

/// Every map of `program`, from the kernel.
fn map_memory(program: &mut Program) -> Vec<MapMemory> {
    let ids = program
        .xdp()
        .info()
        .expect("program info")
        .map_ids()
        .expect("map ids")
        .unwrap_or_default();
    ids.into_iter()
        .map(|id| {
            let info = MapInfo::from_id(id).expect("map info");
            let fd = info.fd().expect("map fd");
            let path = format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd());
            let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            let field = |name: &str| -> u64 {
                text.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or_else(|| panic!("{name} missing in {path}"))
            };
            // BPF_MAP_TYPE_PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH.
            let per_cpu = matches!(field("map_type:"), 5 | 6 | 10);
            let max_entries = field("max_entries:");
            MapMemory {
                name: info.name_as_str().unwrap_or("?").to_string(),
                max_entries,
                bytes: field("memlock:"),
                per_cpu_bytes: if per_cpu {
                    field("value_size:").div_ceil(8) * 8 * max_entries
                } else {
                    0
                },
            }
        })
        .collect()
}

/// The maps' total on `cpus` possible CPUs, from their total on `here`:
/// only the per-CPU values are scaled (the kernel's few per-CPU bytes of
/// each hash map's locks are not: under 2 KiB a map on 64 CPUs).
fn on_cpus(maps: &[MapMemory], here: u64, cpus: u64) -> u64 {
    maps.iter()
        .map(|m| m.bytes - m.per_cpu_bytes * here + m.per_cpu_bytes * cpus)
        .sum()
}

fn main() {
    let cpus = aya::util::nr_cpus().expect("nr_cpus");
    let possible = kernel::possible_cpus().expect("possible CPUs") as u64;
    let per_tick = DaemonSection::default().sources_per_tick;

    // With the tiers: a million windows and the default cap of hot
    // sources.
    let mut tiered = kernel::load(&LoadOptions {
        max_sources: CAPACITY,
        max_hot_sources: Some(DEFAULT_MAX_HOT_SOURCES),
        ..LoadOptions::default()
    })
    .expect("load the program (root and BPF needed)");
    fill_windows(&tiered, SOURCES);
    fill_sources(&tiered, cpus, DEFAULT_MAX_HOT_SOURCES);
    // Without: every source hot, and a window each too.
    let mut untiered = kernel::load(&LoadOptions {
        max_sources: CAPACITY,
        max_hot_sources: Some(CAPACITY),
        ..LoadOptions::default()
    })
    .expect("load the program");
    fill_sources(&untiered, cpus, SOURCES);
    let (rss_before, _) = rss_mib();

    // Interleaved rounds: the daemon's tick with the tiers (a hot map
    // smaller than a tick's budget is swept whole every tick) and a full
    // pass over a million per-CPU entries without.
    let mut tiered_sweep = Sweep::default();
    let (mut tiered_ticks, mut full) = (Vec::new(), Vec::new());
    let (mut hot_tracked, mut tracked) = (0, 0);
    for _ in 0..ROUNDS {
        for _ in 0..3 {
            tiered_ticks.push(measure(|| {
                let snapshot =
                    pass(&tiered.maps, 20, &mut tiered_sweep, per_tick).expect("tiered tick");
                hot_tracked = snapshot.tracked_sources;
                assert_eq!(snapshot.top.len(), 20);
            }));
        }
        full.push(measure(|| {
            let mut sweep = Sweep::default();
            let snapshot =
                pass(&untiered.maps, 20, &mut sweep, usize::MAX).expect("aggregation pass");
            tracked = snapshot.tracked_sources;
            assert_eq!(snapshot.top.len(), 20);
        }));
    }
    let tiered_sweep_ticks = tiered_sweep.last_sweep_ticks;
    let tiered_tick_max = tiered_ticks.iter().map(|m| m.cpu).max().unwrap_or_default();
    let tiered_tick = median(tiered_ticks);
    let full = median(full);

    // Without the tiers, the daemon's default: a bounded slice per tick,
    // the map swept over several ticks.
    let mut sweep = Sweep::default();
    let mut ticks: Vec<Measured> = Vec::new();
    loop {
        ticks.push(measure(|| {
            pass(&untiered.maps, 20, &mut sweep, per_tick).expect("tick");
        }));
        if sweep.last_sweep_ticks > 0 {
            break;
        }
    }
    let slowest_tick = ticks.iter().map(|m| m.cpu).max().unwrap_or_default();
    let sweep_cpu: Duration = ticks.iter().map(|m| m.cpu).sum();
    let (rss_after, rss_peak) = rss_mib();
    let fd = batch::fd(untiered.maps.sources_data());
    let raw = measure(|| {
        let n = batch::for_each_per_cpu::<SourceKey, SourceTraffic>(fd, cpus, |_, _| {})
            .expect("batch read");
        assert!(n > 0);
    });
    let per_key = measure(|| {
        let mut n = 0u64;
        for entry in untiered.maps.sources.iter() {
            let (_, values) = entry.expect("entry");
            n += values.iter().map(|t| t.total.packets).sum::<u64>().min(1);
        }
        assert!(n > 0);
    });
    // What reading the windows would cost, had the daemon to (it does
    // not), and how many the LRU kept.
    let mut windows = 0;
    let windows_read = measure(|| {
        let fd = batch::fd(tiered.maps.windows.map());
        windows =
            batch::for_each_per_cpu::<SourceKey, WindowState>(fd, 1, |_, _| {}).expect("windows");
    });
    assert!(
        tracked as u32 >= SOURCES * 99 / 100 && windows as u32 >= SOURCES * 99 / 100,
        "only {tracked} sources and {windows} windows stayed in the maps"
    );
    // What the daemon does with them: the walk that reclaims idle windows
    // reads each, and hands those sending to the known-source sample (a
    // keyed hash each; 1 in 64 kept at a million sources) and the history.
    let rules = Config::parse("", "bench").expect("defaults").rules;
    let compiled = limiter_user::rules::compile(&rules, 0, 1).expect("the default rule");
    let mut sampled = 0;
    let known_walk = measure(|| {
        let mut known = Known::default();
        known.set_rules(&rules, &compiled, 0);
        let mut history = History::new(Duration::from_secs(3600));
        let mut reclaim = Reclaim::default();
        let now_ns = kernel::now().as_nanos() as u64;
        let mut active = Vec::new();
        loop {
            let slice = reclaim
                .step(&mut tiered.maps, now_ns, 1 << 21, &mut active)
                .expect("walk");
            for (key, pps) in active.drain(..) {
                let reading = Reading {
                    key,
                    pps,
                    refused: false,
                    dropped_total: None,
                };
                known.observe(reading, None, now_ns, &mut history);
            }
            if slice.pass_done {
                break;
            }
        }
        sampled = known.len();
    });
    assert!(sampled > 1_000, "the walk fed {sampled} sources");

    let tiered_memory = map_memory(&mut tiered);
    let untiered_memory = map_memory(&mut untiered);
    let total = |maps: &[MapMemory]| maps.iter().map(|m| m.bytes).sum::<u64>();
    let mb = |bytes: u64| bytes as f64 / 1e6;
    let big = |maps: &[MapMemory]| on_cpus(maps, possible, BIG_CPUS);

    println!(
        "aggregate bench: {SOURCES} active sources, {cpus} CPUs ({possible} possible); \
         daemon ticks of <= {per_tick} sources"
    );
    println!(
        "with tiers: {windows} windows, {hot_tracked} hot sources (the default cap, {DEFAULT_MAX_HOT_SOURCES}); \
         without: {tracked} sources with per-CPU state ({} MB of per-CPU values per pass)",
        tracked as usize * cpus * std::mem::size_of::<SourceTraffic>() / 1_000_000
    );
    println!("{:<44} {:>10} {:>10}", "case", "wall ms", "cpu ms");
    let row = |name: &str, m: &Measured| {
        println!("{name:<44} {:>10.1} {:>10.1}", ms(m.wall), ms(m.cpu));
    };
    row("tiers: daemon tick (a whole sweep), median", &tiered_tick);
    println!(
        "{:<44} {:>10} {:>10.1}   (a sweep takes {tiered_sweep_ticks} tick)",
        "tiers: daemon tick, slowest",
        "",
        ms(tiered_tick_max)
    );
    row("tiers: reading the windows (batch only)", &windows_read);
    row("tiers: the walk, feeding the known sources", &known_walk);
    row("no tiers: full pass (batched)", &full);
    row("no tiers:   of which the batch reads", &raw);
    row("no tiers: key by key", &per_key);
    println!(
        "{:<44} {:>10} {:>10.1}   ({} ticks a sweep, {:.1} ms CPU for the whole sweep)",
        "no tiers: daemon tick (default slice)",
        "",
        ms(slowest_tick),
        ticks.len(),
        ms(sweep_cpu)
    );
    println!(
        "RSS: {rss_before:.0} MiB before the passes, {rss_after:.0} MiB after, \
         peak {rss_peak:.0} MiB (map filling included)"
    );
    println!(
        "kernel memory of the maps (memlock, the kernel's own accounting), {CAPACITY} sources' \
         capacity: here ({possible} possible CPUs) / on {BIG_CPUS} possible CPUs (per-CPU values \
         scaled by the CPU count)"
    );
    for (label, maps) in [
        ("with tiers", &tiered_memory),
        ("without tiers", &untiered_memory),
    ] {
        println!(
            "  {label:<14} {:>9.1} MB / {:>9.1} MB",
            mb(total(maps)),
            mb(big(maps))
        );
        for m in maps.iter().filter(|m| m.bytes >= 1_000_000) {
            println!(
                "    {:<12} {:>9} entries {:>9.1} MB / {:>9.1} MB",
                m.name,
                m.max_entries,
                mb(m.bytes),
                mb(on_cpus(std::slice::from_ref(m), possible, BIG_CPUS))
            );
        }
    }
    println!(
        "{{\"bench\":\"aggregate\",\"sources\":{SOURCES},\"cpus\":{cpus},\"possible_cpus\":{possible},\
         \"tiers_windows\":{windows},\"tiers_hot_sources\":{hot_tracked},\
         \"tiers_tick_cpu_ms\":{:.1},\"tiers_tick_cpu_ms_max\":{:.1},\"tiers_sweep_ticks\":{tiered_sweep_ticks},\
         \"tiers_windows_read_cpu_ms\":{:.1},\"tiers_known_walk_cpu_ms\":{:.1},\"tiers_known_sampled\":{sampled},\
         \"baseline_sources\":{tracked},\"baseline_pass_wall_ms\":{:.1},\"baseline_pass_cpu_ms\":{:.1},\
         \"baseline_batched_read_alone_cpu_ms\":{:.1},\"baseline_per_key_wall_ms\":{:.1},\
         \"baseline_per_key_cpu_ms\":{:.1},\"baseline_tick_cpu_ms_max\":{:.1},\"baseline_sweep_ticks\":{},\
         \"baseline_sweep_cpu_ms\":{:.1},\"rss_mib\":{rss_after:.1},\"rss_peak_mib\":{rss_peak:.1},\
         \"memory_mb\":{:.1},\"memory_mb_64_cpus\":{:.1},\"baseline_memory_mb\":{:.1},\
         \"baseline_memory_mb_64_cpus\":{:.1}}}",
        ms(tiered_tick.cpu),
        ms(tiered_tick_max),
        ms(windows_read.cpu),
        ms(known_walk.cpu),
        ms(full.wall),
        ms(full.cpu),
        ms(raw.cpu),
        ms(per_key.wall),
        ms(per_key.cpu),
        ms(slowest_tick),
        ticks.len(),
        ms(sweep_cpu),
        mb(total(&tiered_memory)),
        mb(big(&tiered_memory)),
        mb(total(&untiered_memory)),
        mb(big(&untiered_memory)),
    );
}
