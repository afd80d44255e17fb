//! `cargo xtask bench cluster`: cluster-wide limits through Redis,
//! measured in the multi-node lab (`limiter_tests::cluster_lab`: real
//! daemons with XDP in node namespaces, one real `redis-server`, real
//! traffic counted by a UDP sink per node).
//!
//! Two parts:
//!
//! - **Error.** One source floods at 5L (L = 1000 pps, W = 1 s), split
//!   evenly over N nodes. The sinks' 100 ms bins, summed over the nodes,
//!   give every sliding 1 s window from 2 s into the flood on: their mean,
//!   lowest, 95th percentile and highest, against L and the documented
//!   bound `L x (delta / W) x (1 - 1/N)` (`cluster::share::error_bound`,
//!   delta = T + 1 ms). Cases: T = 50, 100, 250 ms at N = 3; N = 2, 3, 5 at T = 100 ms;
//!   the baseline, measured in the same run, is the same flood under
//!   node-scoped rules (each node admits L: the cluster gets N x L).
//! - **Load.** One node, T = 100 ms, with 0 (the baseline), 1,000, 10,000
//!   and 100,000 sources (and 5,000) announced hot in Redis as another node would
//!   (`cluster::announce_hot`): the daemon lists them and syncs every one
//!   each tick; against one `redis-server`, then (`load-cluster`) against
//!   a Redis Cluster of 3 primaries the bench starts, which spreads the
//!   sources' hash slots over three servers. Redis's script calls and commands per second and its CPU,
//!   the daemon's CPU per tick, tick duration, ticks over T, ticks that
//!   synced only part of the sources, and failed ticks. The synthetic
//!   sources carry no traffic on the measured node, so each costs `B`
//!   `HMGET` and the claim's 3 commands per tick in Redis, not the `B + 9`
//!   of a source with deltas (docs/cluster.md, "Redis load").
//!
//! Prints a line per case and one JSON line per case; with every case run
//! (no filter) it rewrites the results part of docs/benchmarks.md's
//! "Cluster" section and its plots. SIGINT/SIGTERM stop it between runs;
//! namespaces, daemons and Redis go as it unwinds.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use clap::Parser;
use limiter_bench::{
    cluster::{announce_hot, median, DaemonLoad, DaemonSample, RedisLoad, RedisSample, Spread},
    current,
    e2e::plot::{line_chart, Chart, Series},
};
use limiter_tests::{
    cluster_lab::{cluster_bins, redis_addr, windows, ClusterLab, BIN, REDIS_CLUSTER_ADDR},
    redis::{RedisServer, PORT},
    wait_until,
};
use limiter_user::cluster::error_bound;

/// The limit, packets per window.
const L: u64 = 1000;
/// Bins per 1 s window.
const W_BINS: usize = 10;
/// Windows are measured from this many bins into the flood: a window of
/// warm-up (the cold caps, the first syncs) and another for it to leave.
const FROM_BIN: usize = 20;
/// The synced-source counts of the load part: the issue's 1,000, 10,000
/// and 100,000, the baseline 0, and 5,000 between the first two (where a
/// tick's calls start to outlast the timeout on this machine).
const HOT: [u32; 5] = [0, 1_000, 5_000, 10_000, 100_000];

#[derive(Parser)]
#[command(
    about = "Cluster-wide limits through Redis: error against sync interval and node count, Redis and daemon load against hot sources"
)]
struct Args {
    /// Runs per error case (medians are reported, and the range).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seconds of flood per run (windows from 2 s on are measured).
    #[arg(long, default_value_t = 6.0)]
    flood: f64,
    /// Measured slices per load case, each `--slice` seconds (medians).
    #[arg(long, default_value_t = 3)]
    slices: usize,
    #[arg(long, default_value_t = 3.0)]
    slice: f64,
    /// Only one part: `error`, `load` or `load-cluster` (docs are then
    /// not written).
    #[arg(long)]
    only: Option<String>,
    /// One run per error case, one slice per load case, no 100,000 case
    /// (docs are then not written): a smoke run of about a minute.
    #[arg(long)]
    quick: bool,
    /// Do not rewrite docs/benchmarks.md and its plots.
    #[arg(long)]
    no_docs: bool,
    /// The load part's per-call Redis timeout, ms (the lab's 50 by
    /// default; docs are not written otherwise): a diagnostic, to tell a
    /// tick's Redis work outlasting the timeout from it outlasting T.
    #[arg(long, default_value_t = 50)]
    load_timeout_ms: u64,
    /// Only these hot-source counts in the load part (comma-separated,
    /// e.g. `--hot 100000`; docs are then not written): a diagnostic, to
    /// profile one case.
    #[arg(long, value_delimiter = ',')]
    hot: Vec<u32>,
}

/// One error case: sync interval, nodes, cluster or node scope.
#[derive(Clone, Copy)]
struct ErrorCase {
    interval_ms: u64,
    nodes: usize,
    cluster: bool,
}

impl ErrorCase {
    fn name(&self) -> String {
        if self.cluster {
            format!("T={}ms N={}", self.interval_ms, self.nodes)
        } else {
            format!("node scope N={}", self.nodes)
        }
    }

    /// `error_bound`, delta = T + a 1 ms round trip.
    fn bound(&self) -> f64 {
        let delta = Duration::from_millis(self.interval_ms + 1);
        error_bound(L, delta, Duration::from_secs(1), self.nodes as u32)
    }
}

/// One run's windows.
struct ErrorRun {
    spread: Spread,
    windows: usize,
    sent: u64,
}

struct ErrorResult {
    case: ErrorCase,
    runs: Vec<ErrorRun>,
}

impl ErrorResult {
    fn stat(&self, f: impl Fn(&ErrorRun) -> f64) -> (f64, f64, f64) {
        let values: Vec<f64> = self.runs.iter().map(f).collect();
        (
            median(&values),
            values.iter().copied().fold(f64::INFINITY, f64::min),
            values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        )
    }

    fn line(&self) -> String {
        let (mean, ..) = self.stat(|r| r.spread.mean);
        let (min, ..) = self.stat(|r| r.spread.min);
        let (p95, ..) = self.stat(|r| r.spread.p95);
        let (max, _, worst) = self.stat(|r| r.spread.max);
        let bound = self.case.bound();
        let bound = if self.case.cluster {
            format!("bound {bound:.0}")
        } else {
            "(no bound: each node admits L)".into()
        };
        format!(
            "{:<16} windows: mean {mean:>6.0}  min {min:>5.0}  p95 {p95:>5.0}  max {max:>5.0} (worst run {worst:.0})  \
             over L: {:+.0}  {bound}",
            self.case.name(),
            max - L as f64
        )
    }

    fn json(&self) -> String {
        let bound = self.case.bound();
        let runs: Vec<_> = self
            .runs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "mean": r.spread.mean, "min": r.spread.min, "p95": r.spread.p95,
                    "max": r.spread.max, "windows": r.windows, "sent": r.sent,
                })
            })
            .collect();
        let (mean, ..) = self.stat(|r| r.spread.mean);
        let (min, ..) = self.stat(|r| r.spread.min);
        let (p95, ..) = self.stat(|r| r.spread.p95);
        let (max, _, worst) = self.stat(|r| r.spread.max);
        serde_json::json!({
            "bench": "cluster", "part": "error",
            "scope": if self.case.cluster { "cluster" } else { "node" },
            "interval_ms": self.case.interval_ms, "nodes": self.case.nodes,
            "timeout_ms": timeout_ms(self.case.interval_ms),
            "limit": L, "window_ms": 1000, "offered_pps": 5 * L,
            "mean": mean, "min": min, "p95": p95, "max": max, "max_worst_run": worst,
            "over_admission_max": max - L as f64,
            "bound": bound,
            "runs": runs,
        })
        .to_string()
    }
}

/// The per-call Redis timeout for sync interval `interval_ms`: the
/// lab's 50 ms where the interval allows it, else 10 ms under the
/// interval (the daemon requires a timeout shorter than the interval).
fn timeout_ms(interval_ms: u64) -> u64 {
    50.min(interval_ms.saturating_sub(10)).max(1)
}

/// Node `i`'s cluster configuration: `cluster_lab::node_config`'s, with
/// a timeout of `timeout_ms` for the sync interval.
fn cluster_config(i: usize, interval_ms: u64, timeout_ms: u64) -> String {
    let redis = format!("redis = [\"redis://{}:{PORT}\"]", redis_addr(i));
    cluster_config_on(&redis, i, interval_ms, timeout_ms)
}

/// [`cluster_config`] with `redis` as the `[cluster]` table's Redis lines.
fn cluster_config_on(redis: &str, i: usize, interval_ms: u64, timeout_ms: u64) -> String {
    format!(
        "[daemon]\ntick = \"100ms\"\n\n\
         [cluster]\n{redis}\nnode = \"node-{i}\"\n\
         sync_interval = \"{interval_ms}ms\"\ntimeout = \"{timeout_ms}ms\"\nthreshold = 0.25\n\n\
         [default]\npps = {L}\nwindow = \"1s\"\nscope = \"cluster\"\ndry_run = false\n"
    )
}

/// The Redis of a load case.
#[derive(Clone, Copy, PartialEq)]
enum Redis {
    /// One `redis-server`, the lab's.
    Single,
    /// A Redis Cluster of 3 primaries (`mode = "cluster"`).
    Cluster,
}

impl Redis {
    fn name(self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::Cluster => "cluster",
        }
    }
}

/// A node-scoped configuration (the baseline): the same limit, no
/// `[cluster]`.
fn node_scope_config() -> String {
    format!(
        "[daemon]\ntick = \"100ms\"\n\n[default]\npps = {L}\nwindow = \"1s\"\ndry_run = false\n"
    )
}

fn run_error_case(case: ErrorCase, args: &Args, interrupted: &AtomicBool) -> Option<ErrorResult> {
    let mut lab = ClusterLab::new(case.nodes);
    lab.start_daemons(|i| {
        if case.cluster {
            cluster_config(i, case.interval_ms, timeout_ms(case.interval_ms))
        } else {
            node_scope_config()
        }
    });
    if case.cluster {
        // Every daemon sees every node alive (heartbeats through Redis)
        // before any traffic.
        for i in 0..case.nodes {
            lab.daemon(i)
                .wait_metric("xdp_limiter_cluster_nodes_alive", |v| {
                    v == case.nodes as f64
                });
        }
    }
    let per_node = 5 * L / case.nodes as u64;
    let mut rates = vec![per_node; case.nodes];
    rates[0] += 5 * L - per_node * case.nodes as u64;
    let flood = Duration::from_secs_f64(args.flood);
    let mut runs = Vec::new();
    for _ in 0..args.runs {
        if interrupted.load(Ordering::Relaxed) {
            return None;
        }
        if case.cluster {
            // Runs are independent: every node has dropped the source (a
            // window after its last traffic) before the next flood.
            for i in 0..case.nodes {
                let quiet = wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
                    (lab.daemon(i).metric("xdp_limiter_cluster_synced_sources") == Some(0.0))
                        .then_some(())
                });
                assert!(
                    quiet.is_some(),
                    "node {i} kept syncing the source after the flood"
                );
            }
        }
        let sinks: Vec<_> = (0..case.nodes).map(|i| lab.sink(i)).collect();
        let first = (Instant::now()
            .saturating_duration_since(sinks[0].started())
            .as_nanos()
            / BIN.as_nanos()) as usize;
        let sent = lab.flood(&rates, flood);
        let bins: Vec<Vec<u64>> = sinks.into_iter().map(|s| s.finish()).collect();
        let total = cluster_bins(&bins);
        // Whole windows from 2 s on, ending before the flood's last bin
        // (the sinks may cut it short).
        let to = first + (flood.as_millis() / BIN.as_millis()) as usize - 1;
        let from = first + FROM_BIN;
        let sums = windows(&total[from.min(total.len())..to.min(total.len())], W_BINS);
        assert!(
            !sums.is_empty(),
            "{}: no whole window measured (flood {flood:?}): {total:?}",
            case.name()
        );
        runs.push(ErrorRun {
            spread: Spread::of(&sums),
            windows: sums.len(),
            sent: sent.iter().sum(),
        });
    }
    Some(ErrorResult { case, runs })
}

/// One load case's slices.
struct LoadResult {
    redis: Redis,
    hot: u32,
    timeout_ms: u64,
    slices: Vec<(RedisLoad, DaemonLoad)>,
    synced_sources: f64,
    degraded: f64,
    /// `node degraded` and `node recovered` log lines over the slices:
    /// how often the node flapped.
    degradations: usize,
    recoveries: usize,
}

impl LoadResult {
    fn med(&self, f: impl Fn(&(RedisLoad, DaemonLoad)) -> f64) -> f64 {
        median(&self.slices.iter().map(f).collect::<Vec<_>>())
    }

    /// The medians over the slices: Redis calls/s, commands/s, CPU % and
    /// its busiest server's CPU %, then the daemon's CPU ms per tick, tick
    /// ms, ticks/s, and the shares of ticks over 100 ms, partial and
    /// failed (%).
    fn medians(&self) -> [f64; 10] {
        [
            self.med(|s| s.0.calls_per_s),
            self.med(|s| s.0.commands_per_s),
            self.med(|s| s.0.cpu_pct),
            self.med(|s| s.0.busiest_cpu_pct),
            self.med(|s| s.1.cpu_ms_per_tick),
            self.med(|s| s.1.tick_ms),
            self.med(|s| s.1.ticks_per_s),
            self.med(|s| s.1.over_100ms_pct),
            self.med(|s| s.1.partial_pct),
            self.med(|s| s.1.failed_pct),
        ]
    }

    fn line(&self) -> String {
        let [calls, cmds, cpu, busiest, tick_cpu, tick, ticks, over, partial, failed] =
            self.medians();
        format!(
            "{:>7} {:>7} hot: Redis {calls:>6.0} calls/s {cmds:>9.0} cmds/s CPU {cpu:>5.1}% (busiest server {busiest:>5.1}%)  daemon {tick_cpu:>6.2} ms CPU/tick  \
             tick {tick:>6.1} ms  {ticks:>4.1} ticks/s  over 100 ms {over:>5.1}%  partial {partial:>5.1}%  failed {failed:>5.1}%  synced {:.0}  \
             degraded/recovered {}/{}{}",
            self.redis.name(),
            self.hot,
            self.synced_sources,
            self.degradations,
            self.recoveries,
            if self.degraded > 0.0 { "  DEGRADED" } else { "" }
        )
    }

    fn json(&self) -> String {
        let [calls, cmds, cpu, busiest, tick_cpu, tick, ticks, over, partial, failed] =
            self.medians();
        serde_json::json!({
            "bench": "cluster", "part": "load", "interval_ms": 100, "nodes": 1,
            "redis": self.redis.name(),
            "redis_servers": if self.redis == Redis::Cluster { 3 } else { 1 },
            "timeout_ms": self.timeout_ms,
            "hot_sources": self.hot, "slices": self.slices.len(),
            "redis_calls_per_s": calls,
            "redis_commands_per_s": cmds,
            "redis_cpu_pct": cpu,
            "redis_busiest_server_cpu_pct": busiest,
            "daemon_cpu_ms_per_tick": tick_cpu,
            "tick_ms": tick,
            "ticks_per_s": ticks,
            "ticks_over_100ms_pct": over,
            "partial_ticks_pct": partial,
            "failed_ticks_pct": failed,
            "synced_sources_last": self.synced_sources,
            "degradations": self.degradations, "recoveries": self.recoveries,
            "degraded_at_end": self.degraded > 0.0,
        })
        .to_string()
    }
}

fn run_load(args: &Args, redis: Redis, hot: &[u32], interrupted: &AtomicBool) -> Vec<LoadResult> {
    let mut lab = match redis {
        Redis::Single => ClusterLab::new(1),
        Redis::Cluster => {
            ClusterLab::with_redis(1, RedisServer::start_cluster_announcing(REDIS_CLUSTER_ADDR))
        }
    };
    let seeds: Vec<String> = lab
        .redis
        .urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect();
    lab.start_daemons(|i| match redis {
        Redis::Single => cluster_config(i, 100, args.load_timeout_ms),
        Redis::Cluster => cluster_config_on(
            &format!("redis = [{}]\nmode = \"cluster\"", seeds.join(", ")),
            i,
            100,
            args.load_timeout_ms,
        ),
    });
    let daemon = lab.daemon(0);
    daemon.wait_metric("xdp_limiter_cluster_nodes_alive", |v| v == 1.0);
    let mut announced = 0;
    let mut results = Vec::new();
    for &h in hot {
        if interrupted.load(Ordering::Relaxed) {
            break;
        }
        // Cumulative: each case adds sources to the ones already hot.
        announce_hot(&lab.redis, announced, h);
        announced = h;
        // The daemon lists hot sources once per window: after two windows'
        // worth of ticks (or as soon as a sync carries all of them) it
        // syncs them all, as far as it keeps up.
        let start = DaemonSample::take(daemon);
        let ready = wait_until(Duration::from_secs(15), Duration::from_millis(100), || {
            let now = DaemonSample::take(daemon);
            (now.synced_sources >= f64::from(h) && now.ticks >= start.ticks + 3.0
                || now.ticks >= start.ticks + 20.0)
                .then_some(())
        });
        assert!(
            ready.is_some(),
            "the daemon stopped ticking with {h} hot sources:\n{}",
            daemon.log()
        );
        let flaps = |log: &str| {
            (
                log.matches("node degraded").count(),
                log.matches("node recovered").count(),
            )
        };
        let before = flaps(&daemon.log());
        let mut slices = Vec::new();
        for _ in 0..args.slices {
            let (r0, d0) = (RedisSample::take(&lab.redis), DaemonSample::take(daemon));
            // The measured stretch: the daemon works on its own schedule.
            std::thread::sleep(Duration::from_secs_f64(args.slice));
            let (r1, d1) = (RedisSample::take(&lab.redis), DaemonSample::take(daemon));
            slices.push((RedisLoad::between(&r0, &r1), DaemonLoad::between(&d0, &d1)));
        }
        let end = DaemonSample::take(daemon);
        let after = flaps(&daemon.log());
        let result = LoadResult {
            redis,
            hot: h,
            timeout_ms: args.load_timeout_ms,
            slices,
            synced_sources: end.synced_sources,
            degraded: end.degraded,
            degradations: after.0 - before.0,
            recoveries: after.1 - before.1,
        };
        eprintln!("{}", result.line());
        println!("{}", result.json());
        results.push(result);
    }
    results
}

fn main() {
    let args = Args::parse();
    let interrupted = limiter_bench::interrupt_flag();
    let args = if args.quick {
        Args {
            runs: 1,
            slices: 1,
            ..args
        }
    } else {
        args
    };
    let part = |name: &str| args.only.as_deref().is_none_or(|p| p == name);
    if let Some(only) = &args.only {
        if !["error", "load", "load-cluster"].contains(&only.as_str()) {
            eprintln!("--only {only:?}: expected `error`, `load` or `load-cluster`");
            std::process::exit(2);
        }
    }
    let started = Instant::now();
    let mut errors = Vec::new();
    if part("error") {
        let cases = [
            ErrorCase {
                interval_ms: 50,
                nodes: 3,
                cluster: true,
            },
            ErrorCase {
                interval_ms: 100,
                nodes: 3,
                cluster: true,
            },
            ErrorCase {
                interval_ms: 250,
                nodes: 3,
                cluster: true,
            },
            ErrorCase {
                interval_ms: 100,
                nodes: 2,
                cluster: true,
            },
            ErrorCase {
                interval_ms: 100,
                nodes: 5,
                cluster: true,
            },
            ErrorCase {
                interval_ms: 100,
                nodes: 3,
                cluster: false,
            },
        ];
        for case in cases {
            let Some(result) = run_error_case(case, &args, &interrupted) else {
                break;
            };
            eprintln!("{}", result.line());
            println!("{}", result.json());
            errors.push(result);
        }
    }
    let hot: &[u32] = if !args.hot.is_empty() {
        &args.hot
    } else if args.quick {
        &HOT[..HOT.len() - 1]
    } else {
        &HOT
    };
    let mut loads = Vec::new();
    if part("load") && !interrupted.load(Ordering::Relaxed) {
        loads = run_load(&args, Redis::Single, hot, &interrupted);
    }
    let mut cluster_loads = Vec::new();
    if part("load-cluster") && !interrupted.load(Ordering::Relaxed) {
        cluster_loads = run_load(&args, Redis::Cluster, hot, &interrupted);
    }
    eprintln!("done in {:.0} s", started.elapsed().as_secs_f64());
    let complete =
        errors.len() == 6 && loads.len() == HOT.len() && cluster_loads.len() == HOT.len();
    if args.no_docs
        || args.quick
        || args.only.is_some()
        || args.load_timeout_ms != 50
        || !args.hot.is_empty()
        || !complete
    {
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut lines: Vec<serde_json::Value> = errors
        .iter()
        .map(|e| serde_json::from_str(&e.json()).expect("a JSON line"))
        .chain(
            loads
                .iter()
                .chain(&cluster_loads)
                .map(|l| serde_json::from_str(&l.json()).expect("a JSON line")),
        )
        .collect();
    for (redis, results) in [
        ("one redis-server", &loads),
        ("a 3-primary Redis Cluster", &cluster_loads),
    ] {
        if let Some(top) = results.iter().find(|l| l.hot == HOT[HOT.len() - 1]) {
            let [.., tick, _, over, partial, _] = top.medians();
            lines.push(current::target(
                &format!("every tick within T at {} hot sources, {redis}", top.hot),
                &format!(
                    "{over:.0}% of the ticks over T (mean tick {tick:.1} ms), {partial:.0}% partial, {:.0} synced at the end",
                    top.synced_sources
                ),
                Some(over == 0.0 && partial == 0.0),
            ));
        }
    }
    current::save(&root, "cluster", &machine(), &lines)
        .and_then(|()| current::rewrite(&root))
        .unwrap_or_else(|e| panic!("saving the current figures: {e:#}"));
    let doc = root.join("docs/benchmarks.md");
    write_docs(
        &doc,
        &root.join("docs/img"),
        &args,
        &errors,
        &[&loads, &cluster_loads],
    )
    .unwrap_or_else(|e| panic!("writing {}: {e:#}", doc.display()));
    eprintln!("wrote {} and its plots", doc.display());
}

const BEGIN: &str =
    "<!-- cluster:begin (generated by `cargo xtask bench cluster`; edits here are overwritten) -->";
const END: &str = "<!-- cluster:end -->";

fn write_docs(
    doc: &Path,
    img: &Path,
    args: &Args,
    errors: &[ErrorResult],
    loads: &[&[LoadResult]; 2],
) -> anyhow::Result<()> {
    use std::fmt::Write as _;
    std::fs::create_dir_all(img)?;
    let mut md = String::new();
    writeln!(md, "{BEGIN}\n")?;
    writeln!(
        md,
        "Measured {} on {}; {} runs of {:.0} s of flood per error case, {} slices of {:.0} s per load case.\n",
        current::today(),
        machine(),
        args.runs,
        args.flood,
        args.slices,
        args.slice
    )?;
    writeln!(
        md,
        "#### Error: 1 s windows (sliding, 100 ms steps) from 2 s into a 5L flood split evenly, L = {L}\n\n\
         Medians over the runs (the highest window's range in brackets); *bound* is \
         `error_bound`, the documented bound on over-admission.\n\n\
         | case | mean | lowest | p95 | highest | highest - L | bound |\n|---|---:|---:|---:|---:|---:|---:|"
    )?;
    for e in errors {
        let (mean, ..) = e.stat(|r| r.spread.mean);
        let (min, ..) = e.stat(|r| r.spread.min);
        let (p95, ..) = e.stat(|r| r.spread.p95);
        let (max, lo, hi) = e.stat(|r| r.spread.max);
        let bound = if e.case.cluster {
            format!("{:.0}", e.case.bound())
        } else {
            "n/a".into()
        };
        writeln!(
            md,
            "| {} | {mean:.0} | {min:.0} | {p95:.0} | {max:.0} ({lo:.0}-{hi:.0}) | {:+.0} | {bound} |",
            e.case.name(),
            max - L as f64
        )?;
    }
    writeln!(
        md,
        "\n![Highest, mean and lowest window against the sync interval, 3 nodes](img/cluster-error-interval.png)\n\n\
         ![Highest, mean and lowest window against the node count, T = 100 ms](img/cluster-error-nodes.png)\n"
    )?;
    for (redis, loads) in [Redis::Single, Redis::Cluster].into_iter().zip(loads) {
        let title = match redis {
            Redis::Single => "one `redis-server`",
            Redis::Cluster => "a Redis Cluster of 3 primaries (Redis CPU summed over them)",
        };
        writeln!(
            md,
            "#### Load: one node, T = 100 ms, sources announced hot in Redis, {title} (medians of the slices)\n\n\
             | hot sources | Redis script calls/s | Redis commands/s | Redis CPU | busiest server's CPU | daemon CPU per tick | tick (mean) | ticks/s | ticks over 100 ms | partial ticks | failed ticks | synced at the end | degraded / recovered |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        )?;
        for l in loads.iter() {
            let [calls, cmds, cpu, busiest, tick_cpu, tick, ticks, over, partial, failed] =
                l.medians();
            writeln!(
                md,
                "| {} | {calls:.0} | {cmds:.0} | {cpu:.1}% | {busiest:.1}% | {tick_cpu:.2} ms | {tick:.1} ms | {ticks:.1} | {over:.0}% | {partial:.0}% | {failed:.0}% | {:.0}{} | {} / {} |",
                l.hot,
                l.synced_sources,
                if l.degraded > 0.0 { " (degraded)" } else { "" },
                l.degradations,
                l.recoveries
            )?;
        }
        writeln!(md)?;
    }
    writeln!(md, "\n{END}")?;
    let text = std::fs::read_to_string(doc)?;
    let (Some(b), Some(e)) = (text.find(BEGIN), text.find(END)) else {
        anyhow::bail!("{} has no cluster:begin/end markers", doc.display());
    };
    let mut out = text[..b].to_string();
    out.push_str(md.trim_end());
    out.push_str(&text[e + END.len()..]);
    std::fs::write(doc, out)?;

    // The plots: highest, mean and lowest window (median over runs, range
    // over runs) with L and L + bound.
    let plot = |file: &str, title: &str, x_desc: &str, pick: &dyn Fn(&ErrorCase) -> Option<f64>| {
        let mut highest = Vec::new();
        let mut mean = Vec::new();
        let mut lowest = Vec::new();
        let mut bound = Vec::new();
        let mut limit = Vec::new();
        for e in errors.iter().filter(|e| e.case.cluster) {
            let Some(x) = pick(&e.case) else { continue };
            let (m, lo, hi) = e.stat(|r| r.spread.max);
            highest.push((x, m, lo, hi));
            let (m, lo, hi) = e.stat(|r| r.spread.mean);
            mean.push((x, m, lo, hi));
            let (m, lo, hi) = e.stat(|r| r.spread.min);
            lowest.push((x, m, lo, hi));
            let b = L as f64 + e.case.bound();
            bound.push((x, b, b, b));
            limit.push((x, L as f64, L as f64, L as f64));
        }
        for s in [&mut highest, &mut mean, &mut lowest, &mut bound, &mut limit] {
            s.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        line_chart(
            &Chart {
                path: &img.join(file),
                title,
                x_desc,
                y_desc: "packets admitted cluster-wide per 1 s window",
            },
            false,
            &[
                Series {
                    label: "highest window".into(),
                    points: highest,
                },
                Series {
                    label: "mean window".into(),
                    points: mean,
                },
                Series {
                    label: "lowest window".into(),
                    points: lowest,
                },
                Series {
                    label: "L + bound".into(),
                    points: bound,
                },
                Series {
                    label: "L".into(),
                    points: limit,
                },
            ],
        )
    };
    plot(
        "cluster-error-interval.png",
        "5L flood over 3 nodes: windows against the sync interval",
        "sync interval T (ms)",
        &|c| (c.nodes == 3).then_some(c.interval_ms as f64),
    )?;
    plot(
        "cluster-error-nodes.png",
        "5L flood, T = 100 ms: windows against the node count",
        "nodes N",
        &|c| (c.interval_ms == 100).then_some(c.nodes as f64),
    )?;
    Ok(())
}

fn machine() -> String {
    let kernel = std::process::Command::new("uname")
        .arg("-r")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let redis = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .find_map(|w| w.strip_prefix("v="))
                .unwrap_or("?")
                .to_string()
        })
        .unwrap_or_default();
    let cpus = aya::util::online_cpus().map(|c| c.len()).unwrap_or(0);
    format!("{cpus} CPUs (shared), kernel {kernel}, redis-server {redis}, release build")
}
