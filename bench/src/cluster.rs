//! What the cluster benchmark (`bench-cluster`) and the cluster demo
//! (`demo-cluster`) share on top of the multi-node lab
//! (`limiter_tests::cluster_lab`): Redis's own counters (commands by name,
//! CPU), a daemon's sync figures (metrics and /proc), window statistics,
//! synthetic hot sources.

use std::{collections::BTreeMap, io::Write as _, process::Stdio, time::Instant};

use limiter_tests::{
    daemon::{parse_metric, sum_metric, Daemon},
    redis::RedisServer,
};
use limiter_user::cluster::store::{group, key_slot};

/// The store's key prefix (`StoreConfig`'s default, which the daemon uses).
pub const PREFIX: &str = "xl";

/// Redis's counters at one moment (`INFO cpu commandstats`), summed over
/// its servers (one, or a Redis Cluster's primaries).
#[derive(Clone, Debug, Default)]
pub struct RedisSample {
    pub at: Option<Instant>,
    /// Calls per command name (lower case), including the commands Lua
    /// scripts ran (Redis counts those in commandstats too).
    pub calls: BTreeMap<String, u64>,
    /// Each server's CPU time so far (user + system), seconds.
    pub cpu_s: Vec<f64>,
}

impl RedisSample {
    /// Reads them through `redis-cli` (one `INFO` command per server,
    /// which the figures below leave out).
    pub fn take(redis: &RedisServer) -> Self {
        let mut sample = Self {
            at: Some(Instant::now()),
            ..Self::default()
        };
        for port in redis.server_ports() {
            let info = redis.cli_at(port, &["info", "cpu", "commandstats"]);
            let mut cpu_s = 0.0;
            for line in info.lines().map(str::trim) {
                if let Some(rest) = line.strip_prefix("cmdstat_") {
                    let Some((name, fields)) = rest.split_once(':') else {
                        continue;
                    };
                    let calls: u64 = fields
                        .split(',')
                        .find_map(|f| f.strip_prefix("calls="))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    *sample.calls.entry(name.to_string()).or_default() += calls;
                } else if let Some(v) = line
                    .strip_prefix("used_cpu_user:")
                    .or_else(|| line.strip_prefix("used_cpu_sys:"))
                {
                    cpu_s += v.parse::<f64>().unwrap_or(0.0);
                }
            }
            sample.cpu_s.push(cpu_s);
        }
        sample
    }
}

/// Redis's load between two samples.
#[derive(Clone, Copy, Debug, Default)]
pub struct RedisLoad {
    /// Script calls (`EVALSHA` and `EVAL`) per second: the round trips.
    pub calls_per_s: f64,
    /// Every other command per second (almost all run inside the scripts:
    /// `HMGET`, `HINCRBY`, `ZADD`, `TIME`, ...), the benchmark's own
    /// `INFO` and `redis-cli` connection commands left out.
    pub commands_per_s: f64,
    /// Redis CPU summed over its servers, percent of one core.
    pub cpu_pct: f64,
    /// The busiest server's CPU, percent of one core: a Redis server runs
    /// commands on one thread, so 100 is where it stops keeping up.
    pub busiest_cpu_pct: f64,
}

impl RedisLoad {
    pub fn between(a: &RedisSample, b: &RedisSample) -> Self {
        let secs = match (a.at, b.at) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64().max(1e-3),
            _ => return Self::default(),
        };
        let delta = |name: &str| {
            b.calls.get(name).copied().unwrap_or(0) - a.calls.get(name).copied().unwrap_or(0)
        };
        let calls = delta("evalsha") + delta("eval");
        let ours = [
            "evalsha",
            "eval",
            "info",
            "command",
            "command|docs",
            "hello",
        ];
        let others: u64 = b
            .calls
            .keys()
            .filter(|name| !ours.contains(&name.as_str()))
            .map(|name| delta(name))
            .sum();
        let cpu: Vec<f64> = a
            .cpu_s
            .iter()
            .zip(&b.cpu_s)
            .map(|(a, b)| 100.0 * (b - a) / secs)
            .collect();
        Self {
            calls_per_s: calls as f64 / secs,
            commands_per_s: others as f64 / secs,
            cpu_pct: cpu.iter().sum(),
            busiest_cpu_pct: cpu.iter().copied().fold(0.0, f64::max),
        }
    }
}

/// A daemon's sync figures at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub struct DaemonSample {
    pub at: Option<Instant>,
    /// CPU time (user + system) so far, seconds.
    pub cpu_s: f64,
    /// Sync ticks run (the sync duration histogram's count), their summed
    /// duration, and how many took at most 100 ms (its `le="0.1"` bucket).
    pub ticks: f64,
    pub tick_s: f64,
    pub ticks_within_100ms: f64,
    /// Ticks with a Redis failure (`xdp_limiter_cluster_redis_errors_total`,
    /// all kinds:
    /// failed ticks, partial ones and failed hot listings).
    pub errors: f64,
    /// Ticks that synced only part of the sources
    /// (`xdp_limiter_cluster_partial_ticks_total`).
    pub partial: f64,
    pub synced_sources: f64,
    pub degraded: f64,
}

const SYNC: &str = "xdp_limiter_cluster_sync_duration_seconds";

impl DaemonSample {
    pub fn take(daemon: &Daemon) -> Self {
        let metrics = daemon.metrics();
        let get = |series: &str| parse_metric(&metrics, series).unwrap_or(0.0);
        Self {
            at: Some(Instant::now()),
            cpu_s: daemon.cpu_time().as_secs_f64(),
            ticks: get(&format!("{SYNC}_count")),
            tick_s: get(&format!("{SYNC}_sum")),
            ticks_within_100ms: get(&format!("{SYNC}_bucket{{le=\"0.1\"}}")),
            errors: sum_metric(&metrics, "xdp_limiter_cluster_redis_errors_total"),
            partial: get("xdp_limiter_cluster_partial_ticks_total"),
            synced_sources: get("xdp_limiter_cluster_synced_sources"),
            degraded: get("xdp_limiter_cluster_degraded"),
        }
    }
}

/// A daemon's sync work between two samples.
#[derive(Clone, Copy, Debug, Default)]
pub struct DaemonLoad {
    pub ticks_per_s: f64,
    /// The daemon's whole CPU time (sync task and main loop) per tick, ms.
    pub cpu_ms_per_tick: f64,
    /// Mean duration of a tick, ms.
    pub tick_ms: f64,
    /// Ticks over 100 ms, percent.
    pub over_100ms_pct: f64,
    /// Ticks that synced only part of the hot sources, percent.
    pub partial_pct: f64,
    /// Failed ticks (nothing synced) and failed hot listings, percent of
    /// the ticks.
    pub failed_pct: f64,
}

impl DaemonLoad {
    pub fn between(a: &DaemonSample, b: &DaemonSample) -> Self {
        let secs = match (a.at, b.at) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64().max(1e-3),
            _ => return Self::default(),
        };
        let ticks = b.ticks - a.ticks;
        let per_tick = |v: f64| if ticks > 0.0 { v / ticks } else { 0.0 };
        Self {
            ticks_per_s: ticks / secs,
            cpu_ms_per_tick: per_tick(1000.0 * (b.cpu_s - a.cpu_s)),
            tick_ms: per_tick(1000.0 * (b.tick_s - a.tick_s)),
            over_100ms_pct: per_tick(
                100.0 * (ticks - (b.ticks_within_100ms - a.ticks_within_100ms)),
            ),
            partial_pct: per_tick(100.0 * (b.partial - a.partial)),
            failed_pct: per_tick(100.0 * ((b.errors - a.errors) - (b.partial - a.partial))),
        }
    }
}

/// Mean, lowest, 95th percentile and highest of `values`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spread {
    pub mean: f64,
    pub min: f64,
    pub p95: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[u64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        // Nearest rank.
        let rank = ((0.95 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        Self {
            mean: sorted.iter().sum::<u64>() as f64 / sorted.len() as f64,
            min: sorted[0] as f64,
            p95: sorted[rank - 1] as f64,
            max: sorted[sorted.len() - 1] as f64,
        }
    }
}

/// Median of `values` (the mean of the middle two for an even count); 0
/// for none.
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    }
}

/// The report key a node forms for source `10.x.y.z` (the `i`-th synthetic
/// source) under the default rule (`ReportKey::wire`: address, prefix,
/// budget class, rule name).
pub fn synthetic_key(i: u32) -> String {
    let [_, b, c, d] = i.to_be_bytes();
    format!("10.{b}.{c}.{d}/32#0|default")
}

/// Announces synthetic sources `from..to` as hot in Redis, as another node
/// syncing them with deltas would (`ZADD <prefix>:{g<group>}:hot`), so
/// every daemon lists them (`Store::hot_sources`) and syncs them each tick
/// from then on. Their score is set an hour ahead of Redis's clock so they
/// stay listed for the whole run without being rewritten (rewriting them
/// would add to the commands measured); they carry no traffic on the
/// measured node. Loaded with `redis-cli --pipe` (the raw protocol), to
/// each key's server: on a Redis Cluster the primary that holds its hash
/// slot (from `CLUSTER NODES`).
pub fn announce_hot(redis: &RedisServer, from: u32, to: u32) {
    let time = redis.cli(&["time"]);
    let mut parts = time.split_whitespace();
    let secs: u64 = parts.next().and_then(|s| s.parse().ok()).expect("TIME");
    let score = ((secs + 3600) * 1000).to_string();
    let owners = slot_owners(redis);
    let mut protocol: BTreeMap<u16, Vec<u8>> = BTreeMap::new();
    for i in from..to {
        let member = synthetic_key(i);
        let group = group(&member);
        let key = format!("{PREFIX}:{{g{group}}}:hot");
        let port = owners(key_slot(format!("g{group}").as_bytes()));
        let out = protocol.entry(port).or_default();
        let args = ["ZADD", key.as_str(), score.as_str(), member.as_str()];
        write!(out, "*{}\r\n", args.len()).expect("in memory");
        for arg in args {
            write!(out, "${}\r\n{arg}\r\n", arg.len()).expect("in memory");
        }
    }
    for (port, protocol) in protocol {
        let mut child = redis
            .ns()
            .command("redis-cli")
            .args(["-p", &port.to_string(), "--pipe"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start redis-cli --pipe");
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(&protocol)
            .expect("feed redis-cli --pipe");
        let out = child.wait_with_output().expect("redis-cli --pipe");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("errors: 0"),
            "redis-cli -p {port} --pipe failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The port of the server holding each hash slot: the only server of a
/// single instance, or the primaries' slot ranges of a Redis Cluster's
/// `CLUSTER NODES` (`<id> <ip>:<port>@<bus> <flags> ... <from>-<to> ...`).
fn slot_owners(redis: &RedisServer) -> impl Fn(u16) -> u16 {
    let ports = redis.server_ports();
    let mut ranges: Vec<(u16, u16, u16)> = Vec::new();
    if ports.len() > 1 {
        let nodes = redis.cli_at(ports[0], &["cluster", "nodes"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") {
                continue;
            }
            let port: u16 = fields[1]
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("no port in CLUSTER NODES line {line:?}"));
            for range in &fields[8..] {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(a), Ok(b)) = (a.parse(), b.parse()) {
                    ranges.push((a, b, port));
                }
            }
        }
        let covered: u32 = ranges.iter().map(|&(a, b, _)| u32::from(b - a) + 1).sum();
        assert_eq!(
            covered, 16384,
            "CLUSTER NODES covers {covered} slots:\n{nodes}"
        );
    }
    move |slot| {
        ranges
            .iter()
            .find(|&&(a, b, _)| (a..=b).contains(&slot))
            .map_or(ports[0], |&(_, _, port)| port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_median() {
        let s = Spread::of(&[10, 20, 30, 40]);
        assert_eq!((s.mean, s.min, s.p95, s.max), (25.0, 10.0, 40.0, 40.0));
        let many: Vec<u64> = (1..=100).collect();
        assert_eq!(Spread::of(&many).p95, 95.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn synthetic_keys_parse_back_as_the_daemon_reads_them() {
        let key = synthetic_key(70_000);
        assert_eq!(key, "10.1.17.112/32#0|default");
        let parsed = limiter_user::cluster::ReportKey::parse(&key).expect("parses");
        assert_eq!(parsed.rule, "default");
        assert_eq!(parsed.wire(), key);
    }
}
