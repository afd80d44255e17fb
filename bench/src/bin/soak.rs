//! `cargo xtask soak --minutes N`: the real daemon (release build, enforce
//! mode) guarding the end-to-end lab's receiving veth for N minutes under
//! a mixed flood, while its rules change through the CLI every few seconds
//! and its configuration is reloaded every minute (SIGHUP and `xdp-limiter
//! reload` in turn, the file edited before every other pair). Not part of
//! the suite: it takes as long as it is told to.
//!
//! It samples the daemon every few seconds (RSS, open file descriptors,
//! CPU time, a full /metrics scrape) and asserts:
//!
//! - every counter series (`_total`, and the histogram's `_count` and
//!   `_bucket`) never decreases between scrapes, nor vanishes;
//! - after a warm-up, RSS and file descriptors stay within a bound of
//!   their warm-up values;
//! - once the traffic stops and the counters stand still, the frames put
//!   on the wire equal the frames the daemon counted under a verdict, and
//!   the per-rule drops equal the refused frames;
//! - every CLI change and every reload is accepted, the daemon logs no
//!   error and exits 0 when stopped.
//!
//! It prints progress lines and a summary on stderr, one JSON line with the
//! figures on stdout, and exits 1 on any violation (130 when interrupted).
//! SIGINT/SIGTERM end the run early; the namespaces, the daemon and its
//! pins go on every exit, a panic included (each is a guard).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::Path,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    thread,
    time::{Duration, Instant},
};

use clap::Parser;
use limiter_bench::e2e::{
    lab::{Lab, RX_IF, RX_V4, SINK_PORT, TX_IF},
    scenario::start_limiter,
    traffic::{Mix, Priority, Programs, Rate},
};
use limiter_common::stats::Outcome;
use limiter_tests::daemon::{parse_series, process_state, Daemon, Files};
use nix::sys::signal::Signal;
use serde_json::json;

#[derive(Parser)]
#[command(about = "Soak: the daemon under a mixed flood, rule changes and reloads for N minutes")]
struct Args {
    /// Length of the run (traffic time) in minutes; fractions allowed.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Seconds between two rule changes through the CLI.
    #[arg(long, default_value_t = 3.0)]
    change_every: f64,
    /// Seconds between two reloads; the first comes after half of it (or
    /// half the run, if shorter), so that even a short run has one.
    #[arg(long, default_value_t = 60.0)]
    reload_every: f64,
    /// Seconds between two samples (RSS, fds, CPU, a full scrape).
    #[arg(long, default_value_t = 5.0)]
    sample_every: f64,
    /// Frames per second of the generated flood: a few tens of thousands,
    /// far below what the lab saturates at (the two CPUs are shared).
    #[arg(long, default_value_t = 20_000)]
    pps: u64,
    /// TCP connection attempts (SYNs) per second from the sender's stack.
    #[arg(long, default_value_t = 200)]
    syn_pps: u64,
}

/// The flood: 32 light sources at 250 pps each (under every limit they
/// meet), 4 heavy ones at 2,000 pps each (over every limit the rotation
/// gives them), a fifth of the frames from random addresses in
/// 10.128.0.0/9 and random IPv6 /64s (new sources all the time: the map
/// fills and evicts), a quarter of the sources IPv6.
const MIX: Mix = Mix {
    light_sources: 32,
    heavy_sources: 4,
    heavy_share: 0.4,
    random_share: 0.2,
    ipv6_share: 0.25,
    random_bits: 0,
};
/// UDP ports the flood goes to in turn, one a second.
const UDP_PORTS: [u16; 3] = [SINK_PORT, 9001, 53];
/// TCP ports the SYNs go to: nobody listens, the receiver answers RST.
const SYN_PORTS: [u16; 3] = [22, 80, 443];
/// The sender's own address: the SYNs come from its stack.
const TX_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// The heavy sources' prefix (`limiter_bench_common::traffic::source_v4`) and
/// the rates the rotation gives its rule, all below a heavy source's.
const HEAVY_PREFIX: &str = "10.2.0.0/16";
const HEAVY_PPS: [u32; 3] = [800, 500, 1500];
/// The port rule the rotation adds and removes, and the SYN rule.
const PORT_RULE: &str = "10.0.0.0/8 --proto udp --ports 9001";
const SYN_RULE: &str = "198.18.0.0/24 --proto tcp --syn";

/// RSS may exceed its warm-up peak by this much or by a quarter of it,
/// whichever is larger. The daemon's RSS is about 11 MiB here; glibc
/// keeps freed memory per arena and each tokio thread can bring a new
/// arena holding a copy of the aggregation buffers, so steps of a few MiB
/// after warm-up are normal. A leak is not: 16 MiB over a 30-minute run is
/// 9 KiB per one-second tick, 27 KiB per rule change, or 2 bytes per new
/// source (about 4,000 a second here), so anything that grows per
/// operation shows.
const RSS_MARGIN: u64 = 16 << 20;
/// File descriptors may exceed their warm-up peak by this many: a scrape,
/// a control connection and a CLI request can be open at the moment of a
/// count.
const FD_MARGIN: usize = 4;
/// The warm-up: this share of the run, at most [`WARMUP_MAX`]. At the
/// default rates the source map (65,536 entries) fills in about 20 s and
/// every path has run within a minute; after that the daemon is in steady
/// state.
const WARMUP_SHARE: f64 = 0.2;
const WARMUP_MAX: Duration = Duration::from_secs(60);
/// Longest wait for the counters to stand still.
const QUIESCE_MAX: Duration = Duration::from_secs(30);
/// The log line of every accepted reload, SIGHUP or CLI.
const RELOADED: &str = "configuration reloaded";

fn main() {
    let args = Args::parse();
    assert!(
        args.minutes > 0.0
            && args.change_every > 0.0
            && args.reload_every > 0.0
            && args.sample_every > 0.0,
        "durations must be positive"
    );
    let interrupted = limiter_bench::interrupt_flag();
    // Everything the run made is dropped inside `soak`: exit only after.
    let code = soak(&args, &interrupted);
    std::process::exit(code);
}

/// The daemon's configuration file; `edited` is the variant the reloads
/// switch to and back from: other rates, a `deny` for part of the random
/// sources and an `allow` for half the light ones, so that every verdict
/// occurs.
fn config(edited: bool) -> String {
    let (default_pps, heavy_pps) = if edited { (1200, 600) } else { (1000, 800) };
    let mut text = format!(
        "[daemon]\ninterfaces = [\"{RX_IF}\"]\nmode = \"native\"\n\n\
         [limits]\ndry_run = false\n\n\
         [default]\npps = {default_pps}\nwindow = \"1s\"\ndry_run = false\n\n\
         [[rules]]\ncidr = \"{HEAVY_PREFIX}\"\npps = {heavy_pps}\nblock = \"2s\"\n"
    );
    if edited {
        text.push_str(
            "\n[[rules]]\ncidr = \"10.200.0.0/16\"\naction = \"deny\"\n\n\
             [[rules]]\ncidr = \"10.1.0.0/28\"\naction = \"allow\"\n",
        );
    }
    text
}

/// The prefixes of the rules in `config(edited)`, sorted.
fn config_cidrs(edited: bool) -> Vec<String> {
    let mut cidrs = vec![HEAVY_PREFIX.to_string()];
    if edited {
        cidrs.extend(["10.1.0.0/28".to_string(), "10.200.0.0/16".to_string()]);
    }
    cidrs.sort();
    cidrs
}

/// The rule changes, in turn: a new rate for the heavy sources' rule, the
/// port rule added or removed, dry-run or enforce, the SYN rule added or
/// removed, the heavy sources' penalties lifted. What is live is tracked
/// so that each change is valid; a reload puts the file's state back.
#[derive(Default)]
struct Rotation {
    turn: usize,
    heavy: usize,
    port_rule: bool,
    syn_rule: bool,
    dry_run: bool,
}

impl Rotation {
    const TURNS: usize = 5;

    /// The CLI arguments of the current turn's change.
    fn command(&self) -> Vec<String> {
        let line = match self.turn % Self::TURNS {
            0 => {
                let pps = HEAVY_PPS[(self.heavy + 1) % HEAVY_PPS.len()];
                format!("rule set {HEAVY_PREFIX} --pps {pps} --block 2s")
            }
            1 if self.port_rule => format!("rule rm {PORT_RULE}"),
            1 => format!("rule add {PORT_RULE} --pps 100"),
            2 if self.dry_run => "mode enforce".to_string(),
            2 => "mode dry-run".to_string(),
            3 if self.syn_rule => format!("rule rm {SYN_RULE}"),
            3 => format!("rule add {SYN_RULE} --pps 50"),
            _ => format!("unblock {HEAVY_PREFIX}"),
        };
        line.split_whitespace().map(String::from).collect()
    }

    /// Moves to the next turn; the change took effect if `applied`.
    fn advance(&mut self, applied: bool) {
        if applied {
            match self.turn % Self::TURNS {
                0 => self.heavy += 1,
                1 => self.port_rule = !self.port_rule,
                2 => self.dry_run = !self.dry_run,
                3 => self.syn_rule = !self.syn_rule,
                _ => {}
            }
        }
        self.turn += 1;
    }

    /// A reload puts the file's rules and mode in force: live changes go.
    fn reloaded(&mut self) {
        self.port_rule = false;
        self.syn_rule = false;
        self.dry_run = false;
    }
}

/// The sending veth's counters, read inside the sender's namespace
/// (`ip netns exec` mounts that namespace's /sys).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Wire {
    /// Frames that reached the receiving veth: with XDP on it, veth counts
    /// a frame here once the receiver's NAPI has taken it off the ring and
    /// run the program on it, so every one of them was judged.
    tx_packets: u64,
    /// Frames lost because the receiver's ring was full: never judged.
    tx_dropped: u64,
}

fn wire(lab: &Lab) -> Wire {
    let dir = format!("/sys/class/net/{TX_IF}/statistics");
    let out = lab.tx.run(
        "cat",
        &[&format!("{dir}/tx_packets"), &format!("{dir}/tx_dropped")],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let values: Vec<u64> = text
        .split_whitespace()
        .map(|v| v.parse().unwrap_or_else(|e| panic!("{dir}: {v:?}: {e}")))
        .collect();
    let [tx_packets, tx_dropped] = values[..] else {
        panic!("{dir}: unexpected {text:?}");
    };
    Wire {
        tx_packets,
        tx_dropped,
    }
}

/// The value of label `key` in series `name{...}`.
fn label<'a>(series: &'a str, key: &str) -> Option<&'a str> {
    let needle = format!("{key}=\"");
    let start = series.find(&needle)? + needle.len();
    let len = series[start..].find('"')?;
    Some(&series[start..start + len])
}

/// Sum of the series of metric `name` for the guarded interface whose
/// label `key` (if given) is `value`.
fn sum(scrape: &BTreeMap<String, f64>, name: &str, filter: Option<(&str, &str)>) -> u64 {
    let prefix = format!("{name}{{");
    scrape
        .iter()
        .filter(|(series, _)| series.starts_with(&prefix))
        .filter(|(series, _)| label(series, "interface") == Some(RX_IF))
        .filter(|(series, _)| filter.is_none_or(|(key, value)| label(series, key) == Some(value)))
        .map(|(_, value)| *value as u64)
        .sum()
}

/// Frames per outcome on the guarded interface.
fn outcomes(scrape: &BTreeMap<String, f64>) -> BTreeMap<&'static str, u64> {
    Outcome::ALL
        .iter()
        .map(|o| {
            let n = sum(
                scrape,
                "xdp_limiter_packets_total",
                Some(("outcome", o.name())),
            );
            (o.name(), n)
        })
        .collect()
}

/// Frames judged: the sum of the verdicts, under exactly one of which
/// every frame counts (docs/metrics.md).
fn judged(outcomes: &BTreeMap<&'static str, u64>) -> u64 {
    Outcome::VERDICTS.iter().map(|o| outcomes[o.name()]).sum()
}

/// Is `series` a counter (never decreases)?
fn is_counter(series: &str) -> bool {
    let name = series.split('{').next().unwrap_or(series);
    ["_total", "_count", "_bucket"]
        .iter()
        .any(|suffix| name.ends_with(suffix))
}

/// Every counter series across scrapes.
#[derive(Default)]
struct Monotonic {
    previous: BTreeMap<String, f64>,
    series: BTreeSet<String>,
    checks: u64,
}

impl Monotonic {
    /// Compares `scrape` with the previous one; what went backwards or
    /// vanished.
    fn check(&mut self, scrape: &BTreeMap<String, f64>) -> Vec<String> {
        let mut found = Vec::new();
        for (series, before) in &self.previous {
            self.checks += 1;
            match scrape.get(series) {
                Some(after) if after < before => {
                    found.push(format!("{series} went from {before} to {after}"))
                }
                Some(_) => {}
                None => found.push(format!("{series} vanished (was {before})")),
            }
        }
        self.previous = scrape
            .iter()
            .filter(|(series, _)| is_counter(series))
            .map(|(series, value)| (series.clone(), *value))
            .collect();
        self.series.extend(self.previous.keys().cloned());
        found
    }
}

/// What one sample saw.
#[derive(Clone, Copy)]
struct Sample {
    at: Duration,
    rss: u64,
    fds: usize,
    cpu: Duration,
    wire: Wire,
}

/// A run in progress: the lab, the daemon and everything recorded.
struct Soak<'a> {
    lab: &'a Lab,
    daemon: &'a Daemon,
    files: &'a Files,
    started: Instant,
    violations: Vec<String>,
    monotonic: Monotonic,
    samples: Vec<Sample>,
    rotation: Rotation,
    changes: u64,
    reloads: u64,
    edited: bool,
}

impl Soak<'_> {
    fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    fn violation(&mut self, what: String) {
        eprintln!("[{:>5.0}s] VIOLATION: {what}", self.elapsed().as_secs_f64());
        self.violations.push(what);
    }

    /// RSS, fds, CPU time and a full scrape, checked. `false` when the
    /// daemon is gone: the run cannot go on.
    fn sample(&mut self) -> bool {
        let pid = self.daemon.pid().as_raw() as u32;
        if matches!(process_state(pid), 'Z' | 'X' | '?') {
            let log = log_tail(self.daemon);
            self.violation(format!("the daemon is gone; the end of its log:\n{log}"));
            return false;
        }
        let (rss, fds, cpu) = (
            self.daemon.rss_bytes(),
            self.daemon.open_fds(),
            self.daemon.cpu_time(),
        );
        let Some(text) = self.daemon.try_metrics() else {
            // Alive but not answering within 2 s: a finding, not the end.
            self.violation("a /metrics scrape failed".to_string());
            return true;
        };
        let scrape = parse_series(&text);
        for found in self.monotonic.check(&scrape) {
            self.violation(found);
        }
        let sample = Sample {
            at: self.elapsed(),
            rss,
            fds,
            cpu,
            wire: wire(self.lab),
        };
        if let Some(last) = self.samples.last() {
            if sample.wire.tx_packets == last.wire.tx_packets {
                let idle = (sample.at - last.at).as_secs_f64();
                self.violation(format!("no frame crossed the veth in {idle:.1} s"));
            }
        }
        let counted = judged(&outcomes(&scrape));
        eprintln!(
            "[{:>5.0}s] rss {:.1} MiB, {} fds, cpu {:.1} s, on the wire {} (counted {} as of the last tick), {} changes, {} reloads, {} violations",
            sample.at.as_secs_f64(),
            mib(rss),
            fds,
            cpu.as_secs_f64(),
            sample.wire.tx_packets,
            counted,
            self.changes,
            self.reloads,
            self.violations.len()
        );
        self.samples.push(sample);
        true
    }

    /// The rotation's next rule change through the CLI.
    fn change(&mut self) {
        let args = self.rotation.command();
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.files.cli(&argv);
        let applied = out.status.success();
        if applied {
            self.changes += 1;
        } else {
            self.violation(format!(
                "`xdp-limiter {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        self.rotation.advance(applied);
    }

    /// Reload number `n` (from 0): SIGHUP for even `n`, `xdp-limiter
    /// reload` for odd; the file switches variant before reloads 0, 1, 4,
    /// 5, ... Checks the daemon logged the reload and runs the file's rules.
    fn reload(&mut self, n: u64) {
        if n % 4 < 2 {
            self.edited = !self.edited;
            self.files.write_config(&config(self.edited));
        }
        let before = self.daemon.log().matches(RELOADED).count();
        let how = if n.is_multiple_of(2) {
            self.daemon.signal(Signal::SIGHUP);
            "SIGHUP"
        } else {
            let out = self.files.cli(&["reload"]);
            if !out.status.success() {
                self.violation(format!(
                    "`xdp-limiter reload` failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
                return;
            }
            "xdp-limiter reload"
        };
        // SIGHUP has no answer: wait (bounded) for the daemon's log line.
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.daemon.log().matches(RELOADED).count() <= before {
            if Instant::now() > deadline {
                let log = log_tail(self.daemon);
                self.violation(format!(
                    "{how}: no reload in the log after 10 s; its end:\n{log}"
                ));
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        self.reloads += 1;
        self.rotation.reloaded();
        let out = self.files.cli(&["rule", "ls", "--output", "json"]);
        let listed: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        let mut cidrs: Vec<String> = listed["rules"]
            .as_array()
            .map(|rules| {
                rules
                    .iter()
                    .filter_map(|r| Some(r["cidr"].as_str()?.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        cidrs.sort();
        let expected = config_cidrs(self.edited);
        if cidrs != expected {
            self.violation(format!(
                "after {how} the rules in force are {cidrs:?}, the file's are {expected:?}"
            ));
        }
        eprintln!(
            "[{:>5.0}s] reload {} ({how}, file {}): {} rules in force",
            self.elapsed().as_secs_f64(),
            n + 1,
            if n % 4 < 2 { "edited" } else { "unchanged" },
            cidrs.len() + 1
        );
    }
}

/// Waits until nothing crosses the veth and the daemon's counters stand
/// still: two rounds in a row see the same frames on the wire before and
/// after a complete aggregation pass, and the same verdict count after
/// it. Every frame on the wire was judged before it was counted there
/// (see [`Wire`]), and a pass that started after that has read it, so the
/// two figures then describe the same frames. The wire and the last
/// scrape, or why not.
fn quiesce(lab: &Lab, daemon: &Daemon) -> Result<(Wire, BTreeMap<String, f64>), String> {
    let deadline = Instant::now() + QUIESCE_MAX;
    let mut last = None;
    loop {
        let before = wire(lab);
        daemon.next_pass();
        let scrape = parse_series(&daemon.metrics());
        let after = wire(lab);
        let counted = judged(&outcomes(&scrape));
        if before == after && last == Some((after, counted)) {
            return Ok((after, scrape));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the counters never stood still in {QUIESCE_MAX:?}: wire {before:?} then {after:?}, {counted} judged"
            ));
        }
        last = Some((after, counted));
    }
}

/// TCP connection attempts from the sender's stack at `pps` until `stop`,
/// each one SYN on the wire: to ports nobody listens on, abandoned after a
/// millisecond (the RST is back by then unless the limiter dropped the
/// SYN), so no attempt is ever retransmitted. Counts them in `attempts`.
/// Runs on a thread inside the sender's namespace.
fn syn_flood(stop: &AtomicBool, pps: u64, attempts: &AtomicU64) {
    if pps == 0 {
        return;
    }
    let interval = Duration::from_secs_f64(1.0 / pps as f64);
    let mut due = Instant::now();
    let mut port = SYN_PORTS.iter().cycle();
    while !stop.load(Ordering::Relaxed) {
        let to = SocketAddr::from((RX_V4, *port.next().expect("cycle")));
        // Refused or timed out, as intended; only the SYN matters.
        let _ = TcpStream::connect_timeout(&to, Duration::from_millis(1));
        attempts.fetch_add(1, Ordering::Relaxed);
        due += interval;
        let now = Instant::now();
        match due.checked_duration_since(now) {
            // Pacing: this thread's own schedule.
            Some(wait) => thread::sleep(wait),
            // Behind (descheduled): start the schedule again rather than
            // make up for it in a burst.
            None => due = now,
        }
    }
}

/// Sets the flag when dropped: the traffic threads stop even when the
/// schedule panics, so the scope they run in can end and unwind.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The last lines of the daemon's log (its whole log can be long).
fn log_tail(daemon: &Daemon) -> String {
    let log = daemon.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Sleeps until `until` in short steps (pacing the schedule); `false` as
/// soon as `interrupted` is set.
fn pause_until(until: Instant, interrupted: &AtomicBool) -> bool {
    loop {
        if interrupted.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= until {
            return true;
        }
        thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

/// The whole run; returns the exit code once everything it made is gone.
fn soak(args: &Args, interrupted: &AtomicBool) -> i32 {
    let length = Duration::from_secs_f64(args.minutes * 60.0);
    let warmup = length.mul_f64(WARMUP_SHARE).min(WARMUP_MAX);
    eprintln!(
        "soak: {:.1} min of {} pps ({} light sources, {} heavy at {:.0}% of the frames, {:.0}% from random sources, \
         {:.0}% of sources IPv6, UDP to ports {UDP_PORTS:?}) and {} TCP SYN/s; a rule change every {} s, a reload \
         every {} s (first at {:.0} s), a sample every {} s, warm-up {:.0} s",
        args.minutes,
        args.pps,
        MIX.light_sources,
        MIX.heavy_sources,
        MIX.heavy_share * 100.0,
        MIX.random_share * 100.0,
        MIX.ipv6_share * 100.0,
        args.syn_pps,
        args.change_every,
        args.reload_every,
        (args.reload_every / 2.0).min(length.as_secs_f64() / 2.0),
        args.sample_every,
        warmup.as_secs_f64()
    );
    let lab = Lab::new();
    let names = [lab.tx.name().to_string(), lab.rx.name().to_string()];
    lab.tx
        .ip(&["addr", "add", &format!("{TX_V4}/24"), "dev", TX_IF]);
    let mut programs = Programs::load(&lab, &MIX);
    programs.set_rate(Rate::Fixed(args.pps));
    let mut ports = programs.port_switch();
    let (daemon, files) = start_limiter(&lab, &config(false));
    let pin_dir = files.pin_dir.clone();
    let mut soak = Soak {
        lab: &lab,
        daemon: &daemon,
        files: &files,
        started: Instant::now(),
        violations: Vec::new(),
        monotonic: Monotonic::default(),
        samples: Vec::new(),
        rotation: Rotation::default(),
        changes: 0,
        reloads: 0,
        edited: false,
    };
    let (wire_start, scrape_start) = quiesce(&lab, &daemon).expect("an idle lab is quiet");
    let outcomes_start = outcomes(&scrape_start);
    let (sent_start, stalled_start) = programs.sent();
    let syn_attempts = AtomicU64::new(0);
    soak.started = Instant::now();
    let mut alive = soak.sample();
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        let _stop = StopOnDrop(&stop);
        scope.spawn(|| programs.generate_at(&lab, &stop, Priority::Lowest));
        scope.spawn(|| {
            lab.tx
                .enter(|| syn_flood(&stop, args.syn_pps, &syn_attempts))
        });
        let t0 = soak.started;
        let every = Duration::from_secs_f64;
        let end = t0 + length;
        let mut next_sample = t0 + every(args.sample_every);
        let mut next_change = t0 + every(args.change_every);
        let mut next_reload = t0 + every(args.reload_every / 2.0).min(length / 2);
        let mut next_port = t0 + Duration::from_secs(1);
        let (mut port, mut reload) = (0, 0);
        while alive {
            let now = Instant::now();
            if now >= end {
                break;
            }
            if now >= next_port {
                port += 1;
                ports.set(UDP_PORTS[port % UDP_PORTS.len()]);
                next_port += Duration::from_secs(1);
            }
            if now >= next_change {
                soak.change();
                next_change += every(args.change_every);
            }
            if now >= next_reload {
                soak.reload(reload);
                reload += 1;
                next_reload += every(args.reload_every);
            }
            if now >= next_sample {
                alive = soak.sample();
                next_sample += every(args.sample_every);
            }
            let next = [next_port, next_change, next_reload, next_sample, end]
                .into_iter()
                .min()
                .expect("five");
            if !pause_until(next, interrupted) {
                break;
            }
        }
    });
    let traffic_time = soak.elapsed();
    if interrupted.load(Ordering::Relaxed) {
        eprintln!("interrupted: cleaning up");
        return 130;
    }
    let (sent, stalled) = programs.sent();
    let generated: u64 = sent.iter().zip(sent_start).map(|(a, b)| a - b).sum();
    // The generator runs at the lowest priority: the share of the time it
    // was preempted, when it did not send (docs: `Programs::sent`).
    let stalled = (stalled - stalled_start) as f64 / 1e9 / traffic_time.as_secs_f64().max(1e-9);
    let mut end = None;
    if alive {
        match quiesce(&lab, &daemon) {
            Ok(quiet) => end = Some(quiet),
            Err(why) => soak.violation(why),
        }
    }
    let mut totals = json!(null);
    let (mut on_wire, mut counted) = (0, 0);
    if let Some((wire_end, scrape)) = &end {
        // Feeds the final scrape to the monotonic check too.
        for found in soak.monotonic.check(scrape) {
            soak.violation(found);
        }
        let outcomes_end = outcomes(scrape);
        let delta: BTreeMap<&str, u64> = outcomes_end
            .iter()
            .map(|(name, n)| (*name, n - outcomes_start.get(name).copied().unwrap_or(0)))
            .collect();
        on_wire = wire_end.tx_packets - wire_start.tx_packets;
        counted = judged(&delta);
        let ring_loss = wire_end.tx_dropped - wire_start.tx_dropped;
        // What the sender's stack sent: the SYNs and ARP.
        let stack = on_wire as i64 - (generated as i64 - ring_loss as i64);
        eprintln!(
            "frames on the wire: {on_wire} ({generated} generated, the generator preempted {:.1}% of the time; {ring_loss} lost \
             to a full ring; {stack} from the sender's stack: {} SYN attempts and ARP); judged by the daemon: {counted} {delta:?}",
            stalled * 100.0,
            syn_attempts.load(Ordering::Relaxed)
        );
        if on_wire != counted {
            soak.violation(format!(
                "{on_wire} frames crossed the veth but the daemon judged {counted} ({delta:?})"
            ));
        }
        let refused: u64 = [
            Outcome::DroppedLimit,
            Outcome::DroppedDeny,
            Outcome::DryRunWouldDrop,
        ]
        .iter()
        .map(|o| outcomes_end[o.name()])
        .sum();
        let by_rule = sum(scrape, "xdp_limiter_rule_dropped_packets_total", None);
        if by_rule != refused {
            soak.violation(format!(
                "per-rule drops add up to {by_rule}, the refused frames to {refused}"
            ));
        }
        totals = json!({
            "outcomes": delta,
            "generated": generated,
            "generator_stalled_share": stalled,
            "ring_loss": ring_loss,
            "syn_attempts": syn_attempts.load(Ordering::Relaxed),
            "refused_total": refused,
            "rule_drops_total": by_rule,
            "evictions_total": sum(scrape, "xdp_limiter_source_evictions_total", None),
        });
    }

    // Bounded RSS and file descriptors after the warm-up.
    let (warm, steady): (Vec<Sample>, Vec<Sample>) =
        soak.samples.iter().partition(|s| s.at <= warmup);
    let peak = |samples: &[Sample]| {
        (
            samples.iter().map(|s| s.rss).max().unwrap_or(0),
            samples.iter().map(|s| s.fds).max().unwrap_or(0),
        )
    };
    let (rss_warm, fds_warm) = peak(&warm);
    let (rss_max, fds_max) = peak(&steady);
    let rss_bound = rss_warm + RSS_MARGIN.max(rss_warm / 4);
    if steady.is_empty() {
        eprintln!("note: no sample after the warm-up; RSS and fds not bounded");
    } else {
        if rss_max > rss_bound {
            soak.violation(format!(
                "RSS grew to {:.1} MiB after the warm-up, bound {:.1} MiB (warm-up peak {:.1} MiB)",
                mib(rss_max),
                mib(rss_bound),
                mib(rss_warm)
            ));
        }
        if fds_max > fds_warm + FD_MARGIN {
            soak.violation(format!(
                "open fds grew to {fds_max} after the warm-up (warm-up peak {fds_warm}, margin {FD_MARGIN})"
            ));
        }
    }
    let errors: Vec<String> = daemon
        .log()
        .lines()
        .filter(|line| line.contains(" ERROR "))
        .map(String::from)
        .collect();
    if !errors.is_empty() {
        soak.violation(format!("the daemon logged errors:\n{}", errors.join("\n")));
    }
    let first = soak.samples.first().copied();
    let last = soak.samples.last().copied();
    let cpu = last.map_or(Duration::ZERO, |s| s.cpu) - first.map_or(Duration::ZERO, |s| s.cpu);
    let (changes, reloads, checks, series) = (
        soak.changes,
        soak.reloads,
        soak.monotonic.checks,
        soak.monotonic.series.len(),
    );
    let mut violations = std::mem::take(&mut soak.violations);
    drop(soak);

    // Tear down, checking that nothing stays behind.
    let status = daemon.stop();
    if !status.success() {
        violations.push(format!("the daemon exited with {status} when stopped"));
    }
    drop(programs);
    drop(files);
    drop(lab);
    for name in names {
        if Path::new("/run/netns").join(&name).exists() {
            violations.push(format!("namespace {name} left behind"));
        }
    }
    if pin_dir.exists() {
        violations.push(format!("pin directory {} left behind", pin_dir.display()));
    }

    let rss_start = first.map_or(0, |s| s.rss);
    let rss_end = last.map_or(0, |s| s.rss);
    eprintln!(
        "soak: {:.1} min of traffic; {on_wire} frames on the wire, {counted} judged; {changes} rule changes, {reloads} reloads; \
         RSS {:.1} MiB at start, {:.1} MiB warm-up peak, {:.1} MiB peak after (bound {:.1}), {:.1} MiB at the end; \
         fds {} at start, {fds_warm} warm-up peak, {fds_max} peak after; daemon CPU {:.1} s ({:.1}% of a CPU); \
         {series} counter series, {checks} monotonic checks; {} violations",
        traffic_time.as_secs_f64() / 60.0,
        mib(rss_start),
        mib(rss_warm),
        mib(rss_max),
        mib(rss_bound),
        mib(rss_end),
        first.map_or(0, |s| s.fds),
        cpu.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / traffic_time.as_secs_f64().max(1e-9),
        violations.len()
    );
    for violation in &violations {
        eprintln!("  violation: {violation}");
    }
    println!(
        "{}",
        json!({
            "minutes": args.minutes,
            "traffic_seconds": traffic_time.as_secs_f64(),
            "pps": args.pps,
            "frames_sent": on_wire,
            "frames_counted": counted,
            "rule_changes": changes,
            "reloads": reloads,
            "rss_start_bytes": rss_start,
            "rss_warmup_peak_bytes": rss_warm,
            "rss_max_bytes": rss_max,
            "rss_bound_bytes": rss_bound,
            "rss_end_bytes": rss_end,
            "fds_start": first.map_or(0, |s| s.fds),
            "fds_warmup_peak": fds_warm,
            "fds_max": fds_max,
            "cpu_seconds": cpu.as_secs_f64(),
            "samples": warm.len() + steady.len(),
            "counter_series": series,
            "counter_checks": checks,
            "totals": totals,
            "violations": violations,
        })
    );
    if violations.is_empty() {
        0
    } else {
        1
    }
}
