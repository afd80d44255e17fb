//! `cargo xtask bench aggregate`: one daemon aggregation pass over
//! 1,000,000 tracked sources, against the baseline of reading the same map
//! one key at a time (aya's iterator, two syscalls per key), in one run.
//! Prints a table and one JSON line per case.

use std::time::{Duration, Instant};

use limiter_common::{Counter, SourceKey, SourceTraffic};
use limiter_user::{
    daemon::aggregate::{pass, Sweep},
    kernel::{
        self,
        batch::{self, update_per_cpu},
        LoadOptions,
    },
};

const SOURCES: u32 = 1_000_000;
const ROUNDS: usize = 3;

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

fn main() {
    let cpus = aya::util::nr_cpus().expect("nr_cpus");
    // LRU maps evict a little before they are full: leave headroom.
    let program = kernel::load(&LoadOptions {
        max_sources: 1 << 20,
        ..LoadOptions::default()
    })
    .expect("load the program (root and BPF needed)");
    let maps = &program.maps;
    let fd = batch::fd(maps.sources_data());
    let second = kernel::now().as_secs();
    // Fill in chunks so the filler's own memory stays small.
    for chunk in 0..(SOURCES / 100_000) {
        let entries: Vec<(SourceKey, Vec<SourceTraffic>)> = (0..100_000u32)
            .map(|i| {
                let n = chunk * 100_000 + i;
                let key = if n % 4 == 0 {
                    let mut addr = [0u8; 16];
                    addr[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
                    addr[4..8].copy_from_slice(&n.to_be_bytes());
                    SourceKey::v6(addr)
                } else {
                    SourceKey::v4((0x0a00_0000 + n).to_be_bytes())
                };
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
                (key, vec![traffic; cpus])
            })
            .collect();
        update_per_cpu(fd, cpus, &entries).expect("fill");
    }
    let (rss_before, _) = rss_mib();

    let mut batched = Vec::new();
    let mut tracked = 0;
    for _ in 0..ROUNDS {
        batched.push(measure(|| {
            let mut sweep = Sweep::default();
            let snapshot = pass(maps, 20, &mut sweep, usize::MAX).expect("aggregation pass");
            tracked = snapshot.tracked_sources;
            assert_eq!(snapshot.top.len(), 20);
        }));
    }
    // The daemon's default: a bounded slice per tick, the map swept over
    // several ticks.
    let per_tick = limiter_user::config::DaemonSection::default().sources_per_tick;
    let mut sweep = Sweep::default();
    let mut ticks: Vec<Measured> = Vec::new();
    loop {
        ticks.push(measure(|| {
            pass(maps, 20, &mut sweep, per_tick).expect("tick");
        }));
        if sweep.last_sweep_ticks > 0 {
            break;
        }
    }
    let slowest_tick = ticks.iter().map(|m| m.cpu).max().unwrap_or_default();
    let sweep_cpu: Duration = ticks.iter().map(|m| m.cpu).sum();
    let (rss_after, rss_peak) = rss_mib();
    let raw = measure(|| {
        let n = batch::for_each_per_cpu::<SourceKey, SourceTraffic>(fd, cpus, |_, _| {})
            .expect("batch read");
        assert!(n > 0);
    });
    let per_key = measure(|| {
        let sources = &maps.sources;
        let mut n = 0u64;
        for entry in sources.iter() {
            let (_, values) = entry.expect("entry");
            n += values.iter().map(|t| t.total.packets).sum::<u64>().min(1);
        }
        assert!(n > 0);
    });
    assert!(
        tracked as u32 >= SOURCES * 99 / 100,
        "only {tracked} sources stayed in the map"
    );
    batched.sort_by_key(|m| m.wall);
    let median = &batched[ROUNDS / 2];

    println!(
        "aggregate bench: {tracked} sources x {cpus} CPUs ({} MB of per-CPU values per pass)",
        tracked as usize * cpus * std::mem::size_of::<SourceTraffic>() / 1_000_000
    );
    println!("{:<28} {:>10} {:>10}", "case", "wall ms", "cpu ms");
    let row = |name: &str, m: &Measured| {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!("{name:<28} {:>10.1} {:>10.1}", ms(m.wall), ms(m.cpu));
    };
    row("daemon pass (batched)", median);
    row("  of which the batch reads", &raw);
    row("baseline: key by key", &per_key);
    println!(
        "{:<28} {:>10} {:>10.1}   ({} ticks of <= {per_tick} sources, {:.1} ms CPU for the whole sweep)",
        "daemon tick (default slice)",
        "",
        slowest_tick.as_secs_f64() * 1e3,
        ticks.len(),
        sweep_cpu.as_secs_f64() * 1e3
    );
    println!("RSS: {rss_before:.0} MiB before the passes, {rss_after:.0} MiB after, peak {rss_peak:.0} MiB (map filling included)");
    println!(
        "{{\"bench\":\"aggregate\",\"sources\":{tracked},\"cpus\":{cpus},\"pass_wall_ms\":{:.1},\"pass_cpu_ms\":{:.1},\"batched_read_alone_cpu_ms\":{:.1},\"baseline_per_key_wall_ms\":{:.1},\"baseline_per_key_cpu_ms\":{:.1},\"tick_cpu_ms_max\":{:.1},\"sweep_ticks\":{},\"sweep_cpu_ms\":{:.1},\"rss_mib\":{rss_after:.1},\"rss_peak_mib\":{rss_peak:.1}}}",
        median.wall.as_secs_f64() * 1e3,
        median.cpu.as_secs_f64() * 1e3,
        raw.cpu.as_secs_f64() * 1e3,
        per_key.wall.as_secs_f64() * 1e3,
        per_key.cpu.as_secs_f64() * 1e3,
        slowest_tick.as_secs_f64() * 1e3,
        ticks.len(),
        sweep_cpu.as_secs_f64() * 1e3,
    );
}
