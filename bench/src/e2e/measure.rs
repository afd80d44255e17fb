//! One measured run of the end-to-end lab: wait for an idle machine, send
//! through a warm-up, then read every counter before and after the
//! measured interval and derive the figures of a [`Run`].

use std::{
    fs,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use serde::Serialize;

use limiter_bench_common::traffic::{source_is_ipv6, CLASS_LIGHT, PREFIX16_BITS};

use super::{
    lab::Lab,
    scenario::{Expectation, Limit, AGG16_FACTOR},
    traffic::{share, Mix, Programs, SinkCounts},
};

/// Counters at one instant.
struct Snapshot {
    at: Instant,
    receiver_cpu_ns: u64,
    received: u64,
    sent: [u64; 3],
    stalled_ns: u64,
    sink: SinkCounts,
}

impl Snapshot {
    /// Reads the counters back to back; the instant is the middle of the
    /// reads (about 100 µs).
    fn take(lab: &Lab, programs: &Programs, mix: &Mix) -> Self {
        let start = Instant::now();
        let sink = programs.sink(mix.heavy_sources);
        let (sent, stalled_ns) = programs.sent();
        let received = lab.received_frames();
        let receiver_cpu_ns = lab.receiver_cpu_ns();
        Self {
            at: start + start.elapsed() / 2,
            receiver_cpu_ns,
            received,
            sent,
            stalled_ns,
            sink,
        }
    }
}

/// The figures of one run (rates per second over the measured interval).
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    /// Frames the generator sent and the receiving veth took in; the rest
    /// were lost because its ring (256 frames) was full.
    pub offered_pps: f64,
    /// Share of the measured time the paced generator was stalled (its CPU
    /// taken, or both sending threads between calls): sending resumes at
    /// the rate, so this share of the rate was never offered.
    pub generator_stalled: f64,
    pub received_pps: f64,
    pub ring_loss: f64,
    /// Share of a CPU the receive thread used, and its ns per received
    /// frame.
    pub receiver_busy: f64,
    pub cpu_ns_per_packet: f64,
    /// Datagrams that reached the socket, the rest of what was received,
    /// and what the scenario should have let through.
    pub passed_pps: f64,
    pub dropped_pps: f64,
    pub expected_passed_pps: f64,
    /// Light sources' datagrams at the socket over those received.
    pub light_kept: f64,
    /// Mean admitted rate of a heavy source, and the largest deviation of
    /// any heavy source from its expected rate (relative).
    pub heavy_admitted_pps: f64,
    pub heavy_max_error: f64,
    /// Random sources' datagrams at the socket per second.
    pub random_passed_pps: f64,
    /// Datagrams without a valid stamp (always 0 unless something is off).
    pub unknown: u64,
    /// How long the run waited for the machine to go idle, and whether it
    /// gave up waiting.
    pub idle_wait_s: f64,
    pub idle_timeout: bool,
}

/// Timing of a run.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub warmup: Duration,
    pub measure: Duration,
    /// Longest wait for an idle machine before a run.
    pub idle_max: Duration,
    /// Silence before each run, longer than the limit's window: every run
    /// then starts from empty per-source state, as the first did.
    pub quiet: Duration,
}

/// Sends (at the rate already set on `programs`) for `timing.warmup` plus
/// `timing.measure` and measures the latter. `None` when `interrupted` was
/// set meanwhile.
pub fn run_once(
    lab: &Lab,
    programs: &Programs,
    mix: &Mix,
    expectation: Expectation,
    limit: Limit,
    timing: Timing,
    interrupted: &AtomicBool,
) -> Option<Run> {
    let quiet_until = Instant::now() + timing.quiet;
    let (idle_wait, idle_timeout) = wait_idle(timing.idle_max, interrupted);
    pause(
        quiet_until.saturating_duration_since(Instant::now()),
        interrupted,
    )?;
    let stop = AtomicBool::new(false);
    let snapshots = thread::scope(|scope| {
        let generator = scope.spawn(|| programs.generate(lab, &stop));
        let result = (|| {
            pause(timing.warmup, interrupted)?;
            let before = Snapshot::take(lab, programs, mix);
            pause(timing.measure, interrupted)?;
            let after = Snapshot::take(lab, programs, mix);
            Some((before, after))
        })();
        stop.store(true, Ordering::Relaxed);
        generator
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        result
    })?;
    let (before, after) = snapshots;
    let mut run = derive(&before, &after, mix, expectation, limit);
    run.idle_wait_s = idle_wait.as_secs_f64();
    run.idle_timeout = idle_timeout;
    Some(run)
}

/// Sleeps `total` (this is measurement time, not synchronisation) in short
/// steps, returning `None` as soon as `interrupted` is set.
pub fn pause(total: Duration, interrupted: &AtomicBool) -> Option<()> {
    let end = Instant::now() + total;
    loop {
        if interrupted.load(Ordering::Relaxed) {
            return None;
        }
        let now = Instant::now();
        if now >= end {
            return Some(());
        }
        thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

fn derive(
    before: &Snapshot,
    after: &Snapshot,
    mix: &Mix,
    expectation: Expectation,
    limit: Limit,
) -> Run {
    let dt = (after.at - before.at).as_secs_f64();
    let sent: Vec<f64> = (0..3)
        .map(|class| (after.sent[class] - before.sent[class]) as f64)
        .collect();
    let (sent_light, sent_heavy, sent_random) = (sent[0], sent[1], sent[2]);
    let offered = sent.iter().sum::<f64>();
    let received = (after.received - before.received) as f64;
    // Ring-full losses hit every class alike (the classes are interleaved
    // frame by frame), so each class arrived in this proportion.
    let arrived = if offered > 0.0 {
        (received / offered).min(1.0)
    } else {
        0.0
    };
    let sink = after.sink.since(&before.sink);
    let passed = sink.total() as f64;
    let cpu_ns = (after.receiver_cpu_ns - before.receiver_cpu_ns) as f64;

    let heavy_each = if mix.heavy_sources > 0 {
        sent_heavy * arrived / mix.heavy_sources as f64
    } else {
        0.0
    };
    let heavy_expected_each = match expectation {
        Expectation::Everything => heavy_each,
        Expectation::Nothing => 0.0,
        Expectation::PerSourceLimit | Expectation::PerSourceAndPrefix16 => {
            heavy_each.min(limit.pps as f64 * dt)
        }
    };
    let rest_expected = match expectation {
        Expectation::Nothing => 0.0,
        // The light sources' IPv4 frames share one /16 and their IPv6
        // ones one /48 (round robin: each source sends alike); the random
        // ones, from one /16, share it. Each prefix passes at most its
        // aggregate's allowance.
        Expectation::PerSourceAndPrefix16 => {
            let allowance = (limit.pps * AGG16_FACTOR) as f64 * dt;
            let v6 = light_ipv6_fraction(mix);
            let light = sent_light * arrived;
            let random = sent_random * arrived;
            (light * (1.0 - v6)).min(allowance)
                + (light * v6).min(allowance)
                + if mix.random_bits == PREFIX16_BITS {
                    random.min(allowance)
                } else {
                    random
                }
        }
        // Light sources are under the limit, and a random source sends
        // about one frame: both pass a per-source limit.
        _ => (sent_light + sent_random) * arrived,
    };
    let heavy_max_error = sink
        .heavy
        .iter()
        .map(|&admitted| {
            if heavy_expected_each > 0.0 {
                (admitted as f64 / heavy_expected_each - 1.0).abs()
            } else if admitted == 0 {
                0.0
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max);
    let light_arrived = sent_light * arrived;
    Run {
        offered_pps: offered / dt,
        generator_stalled: (after.stalled_ns - before.stalled_ns) as f64 / (dt * 1e9),
        received_pps: received / dt,
        ring_loss: 1.0 - arrived,
        receiver_busy: cpu_ns / (dt * 1e9),
        cpu_ns_per_packet: if received > 0.0 {
            cpu_ns / received
        } else {
            0.0
        },
        passed_pps: passed / dt,
        dropped_pps: (received - passed).max(0.0) / dt,
        expected_passed_pps: (rest_expected + heavy_expected_each * mix.heavy_sources as f64) / dt,
        light_kept: if light_arrived > 0.0 {
            sink.light as f64 / light_arrived
        } else {
            0.0
        },
        heavy_admitted_pps: if mix.heavy_sources > 0 {
            sink.heavy.iter().sum::<u64>() as f64 / mix.heavy_sources as f64 / dt
        } else {
            0.0
        },
        heavy_max_error,
        random_passed_pps: sink.random as f64 / dt,
        unknown: sink.unknown,
        idle_wait_s: 0.0,
        idle_timeout: false,
    }
}

/// The share of the light sources that are IPv6 (and so of their frames:
/// they send round robin), as the generator decides it.
fn light_ipv6_fraction(mix: &Mix) -> f64 {
    if mix.light_sources == 0 {
        return 0.0;
    }
    let ipv6_share = share(mix.ipv6_share);
    let ipv6 = (0..mix.light_sources)
        .filter(|&i| source_is_ipv6(CLASS_LIGHT, i, ipv6_share))
        .count();
    ipv6 as f64 / mix.light_sources as f64
}

/// Busy share of all CPUs over a short sample.
fn busy_share(sample: Duration) -> f64 {
    let read = || -> (u64, u64) {
        let stat = fs::read_to_string("/proc/stat").expect("read /proc/stat");
        let fields: Vec<u64> = stat
            .lines()
            .next()
            .expect("cpu line")
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal ...
        let idle = fields[3] + fields.get(4).copied().unwrap_or(0);
        (fields.iter().take(8).sum(), idle)
    };
    let (total0, idle0) = read();
    thread::sleep(sample);
    let (total1, idle1) = read();
    let total = (total1 - total0).max(1) as f64;
    1.0 - (idle1 - idle0) as f64 / total
}

/// The machine counts as idle below this busy share (both CPUs).
const IDLE_BELOW: f64 = 0.10;

/// Waits (at most `max`) until the machine is idle: these machines are
/// shared and noisy. Returns how long it waited and whether it gave up.
pub fn wait_idle(max: Duration, interrupted: &AtomicBool) -> (Duration, bool) {
    let start = Instant::now();
    loop {
        if busy_share(Duration::from_millis(200)) < IDLE_BELOW
            || interrupted.load(Ordering::Relaxed)
        {
            return (start.elapsed(), false);
        }
        if start.elapsed() >= max {
            return (start.elapsed(), true);
        }
    }
}
