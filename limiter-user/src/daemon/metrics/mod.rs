//! Prometheus metrics: the registry and its update from aggregation
//! passes; the cluster sync's own metrics (`cluster`) and the HTTP
//! endpoint (`http`, `GET /metrics`) have their own files. No per-source
//! labels: their number is unbounded; top talkers go through the control
//! API instead.

use std::collections::HashMap;

use limiter_common::{
    rules::{MAX_LEVELS, MAX_RULES},
    Outcome,
};
use prometheus::{
    core::Collector, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry,
};

use super::aggregate::Snapshot;
use crate::kernel::windows::Reclaim;

mod cluster;
mod http;

pub use cluster::ClusterMetrics;
pub use http::{bind, render, serve, MAX_CONNECTIONS};

/// A `RULES` index whose rule has levels: the rule's name and its
/// levels' `level` labels (`LevelSpec::label`), in the rule's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleLevels {
    pub index: u32,
    pub rule: String,
    pub labels: Vec<String>,
}

/// Every metric the daemon exports.
pub struct Metrics {
    pub registry: Registry,
    packets: IntCounterVec,
    bytes: IntCounterVec,
    rule_drops: IntCounterVec,
    level_drops: IntCounterVec,
    evictions: IntCounterVec,
    tracked: IntGaugeVec,
    active: IntGaugeVec,
    saturated: IntGaugeVec,
    capacity: IntGaugeVec,
    limited: IntGaugeVec,
    penalties: IntGaugeVec,
    windows_kept: IntGaugeVec,
    window_capacity: IntGaugeVec,
    windows_reclaimed: IntCounterVec,
    aggregates_kept: IntGaugeVec,
    aggregate_cells: IntGaugeVec,
    known_sources: prometheus::IntGauge,
    known_one_in: prometheus::IntGauge,
    aggregates_reclaimed: IntCounterVec,
    rules: IntGaugeVec,
    reattachments: IntCounterVec,
    attached: IntGaugeVec,
    run_seconds: IntCounterVec,
    runs: IntCounterVec,
    ns_per_run: GaugeVec,
    guard_state: IntGaugeVec,
    guard_rollbacks: IntCounterVec,
    pub aggregation: Histogram,
    /// Each source's packets over its last complete second, once a sweep.
    source_rate: HistogramVec,
    /// Each aggregate level key's rate, once a tick.
    level_rate: HistogramVec,
    /// Each `limit` rule's per-source packet limit.
    rule_limit: IntGaugeVec,
    /// "source limited" lines the log cap held back.
    pub limited_log_suppressed: IntCounter,
    /// The cluster sync's metrics (registered whether or not `[cluster]`
    /// is configured, so dashboards see zeros rather than gaps).
    pub cluster: ClusterMetrics,
    /// Last kernel totals per series, to turn totals into increments.
    last: HashMap<String, u64>,
    /// The kernel's last drop totals of each interface's `RULES` index,
    /// and of each of an index's levels: a push forgets its half's.
    rule_drops_last: HashMap<(String, u32), u64>,
    level_drops_last: HashMap<(String, u32, usize), u64>,
}

/// `metric`, registered with `registry` (so none can be left out).
fn registered<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric");
    metric
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registered(registry, metric)
}

/// The buckets (packets per second) of the rate histograms: 1-2-5 steps
/// from 1 pps to 1 Mpps.
pub const RATE_BUCKETS: [f64; 19] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5,
    5e5, 1e6,
];

fn rate_histogram(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(RATE_BUCKETS.to_vec());
    registered(
        registry,
        HistogramVec::new(opts, labels).expect("valid metric"),
    )
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registered(registry, metric)
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let m = Self {
            packets: counter(
                &registry,
                "xdp_limiter_packets_total",
                "Frames seen at XDP, by interface and outcome.",
                &["interface", "outcome"],
            ),
            bytes: counter(
                &registry,
                "xdp_limiter_bytes_total",
                "Bytes of frames seen at XDP (Ethernet header included), by interface and outcome.",
                &["interface", "outcome"],
            ),
            rule_drops: counter(
                &registry,
                "xdp_limiter_rule_dropped_packets_total",
                "Frames dropped (or would-be dropped in dry-run) per rule.",
                &["interface", "rule"],
            ),
            level_drops: counter(
                &registry,
                "xdp_limiter_level_dropped_packets_total",
                "Frames dropped (or would-be dropped in dry-run) per rule by the level that refused them (a part of the rule's drops).",
                &["interface", "rule", "level"],
            ),
            evictions: counter(
                &registry,
                "xdp_limiter_source_evictions_total",
                "Sources whose per-CPU state was evicted to make room for new ones.",
                &["interface"],
            ),
            tracked: gauge(
                &registry,
                "xdp_limiter_tracked_sources",
                "Sources holding per-CPU state (hot: busy, refused or near their limit; every source with state when tiers are off).",
                &["interface"],
            ),
            active: gauge(
                &registry,
                "xdp_limiter_active_sources_estimate",
                "Sources that sent a frame in the cheap tier's last epoch (about a second), estimated from its sketch by linear counting (tiers on only); a floor when xdp_limiter_active_sources_saturated is 1.",
                &["interface"],
            ),
            saturated: gauge(
                &registry,
                "xdp_limiter_active_sources_saturated",
                "1 when nearly every word of the cheap tier's sketch was touched in the last epoch: the active sources estimate is then a floor (above about 200,000 sources a second).",
                &["interface"],
            ),
            capacity: gauge(
                &registry,
                "xdp_limiter_source_capacity",
                "Sources that can hold per-CPU state at once (daemon.max_hot_sources; daemon.max_sources with tiers off).",
                &["interface"],
            ),
            penalties: gauge(
                &registry,
                "xdp_limiter_penalties",
                "Penalties running (sources blocked by a rule's `block`), as kept apart from the windows (HOLDS, daemon.max_sources at most; beyond, a penalty lives only in its window: outcome hold_failed).",
                &["interface"],
            ),
            windows_kept: gauge(
                &registry,
                "xdp_limiter_windows_kept",
                "Windows in the kept map (WINDOWS, never evicted) after the daemon's last pass over it deleted the idle ones; at xdp_limiter_window_capacity, a source that needs a new window is refused past its cheap frames (outcome window_full).",
                &["interface"],
            ),
            window_capacity: gauge(
                &registry,
                "xdp_limiter_window_capacity",
                "Windows the kept map holds at most, and aggregates (daemon.max_sources).",
                &["interface"],
            ),
            windows_reclaimed: counter(
                &registry,
                "xdp_limiter_windows_reclaimed_total",
                "Idle windows the daemon deleted from the kept map.",
                &["interface"],
            ),
            aggregates_kept: gauge(
                &registry,
                "xdp_limiter_aggregates_kept",
                "Aggregates of the rules' levels (AGGREGATES, never evicted) after the daemon's last pass deleted the idle ones; at xdp_limiter_window_capacity, an aggregate without a window is judged on its level's overflow cell (outcome aggregate_full).",
                &["interface"],
            ),
            known_sources: registered(
                &registry,
                prometheus::IntGauge::new(
                    "xdp_limiter_known_sources",
                    "Sources in the daemon's sample of the sources read past the cheap tier (what suggest's history counts and guards judge), 16,384 at most.",
                )
                .expect("valid metric"),
            ),
            known_one_in: registered(
                &registry,
                prometheus::IntGauge::new(
                    "xdp_limiter_known_sample_one_in",
                    "The sample of known sources holds one source in this many (1 until more than it holds were seen; a keyed hash chooses them).",
                )
                .expect("valid metric"),
            ),
            aggregate_cells: gauge(
                &registry,
                "xdp_limiter_aggregate_cells",
                "Overflow cells in use (AGG_CELLS, 4096 at most: 64 per level), after the daemon's last pass deleted the idle ones.",
                &["interface"],
            ),
            aggregates_reclaimed: counter(
                &registry,
                "xdp_limiter_aggregates_reclaimed_total",
                "Idle aggregates and overflow cells the daemon deleted.",
                &["interface"],
            ),
            limited: gauge(
                &registry,
                "xdp_limiter_limited_sources",
                "Sources currently refused (over their limit or blocked).",
                &["interface"],
            ),
            rules: gauge(
                &registry,
                "xdp_limiter_rules",
                "Rules in force, the default rule included.",
                &["interface"],
            ),
            reattachments: counter(
                &registry,
                "xdp_limiter_reattachments_total",
                "Times the program was attached again because its interface was deleted and re-created.",
                &["interface"],
            ),
            attached: gauge(
                &registry,
                "xdp_limiter_interface_attached",
                "1 while the program is attached to the interface of that name, 0 while it is gone.",
                &["interface"],
            ),
            run_seconds: counter(
                &registry,
                "xdp_limiter_program_run_time_nanoseconds_total",
                "Time spent in the XDP program (needs kernel.bpf_stats_enabled=1).",
                &["interface"],
            ),
            runs: counter(
                &registry,
                "xdp_limiter_program_runs_total",
                "Runs of the XDP program (needs kernel.bpf_stats_enabled=1).",
                &["interface"],
            ),
            ns_per_run: registered(
                &registry,
                GaugeVec::new(
                    Opts::new(
                        "xdp_limiter_program_run_time_per_packet_seconds",
                        "Average XDP program time per frame over the last pass (needs kernel.bpf_stats_enabled=1).",
                    ),
                    &["interface"],
                )
                .expect("valid metric"),
            ),
            guard_state: gauge(
                &registry,
                "xdp_limiter_guard_state",
                "Guarded enforcement, by scope (global, or the rule's name): 0 no guard, 1 watching, 2 passed (period over, enforcing), 3 rolled back to dry-run, 4 breached with the rollback withheld (3 rollbacks within the hour; enforcing).",
                &["scope"],
            ),
            guard_rollbacks: counter(
                &registry,
                "xdp_limiter_guard_rollbacks_total",
                "Returns to dry-run because a guard was breached, by scope (global, or the rule's name).",
                &["scope"],
            ),
            aggregation: registered(
                &registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "xdp_limiter_aggregation_duration_seconds",
                        "Duration of one aggregation pass over all interfaces.",
                    )
                    .buckets(vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]),
                )
                .expect("valid metric"),
            ),
            limited_log_suppressed: registered(
                &registry,
                IntCounter::with_opts(Opts::new(
                    "xdp_limiter_limited_log_lines_suppressed_total",
                    "\"source limited\" log lines not written because of the log cap (daemon.limited_log_per_second), all interfaces together.",
                ))
                .expect("valid metric"),
            ),
            source_rate: rate_histogram(
                &registry,
                "xdp_limiter_source_rate_pps",
                "Per-source packets over the source's last complete second, one observation per source with traffic per sweep of the source map (the distribution of per-source rates; no per-source labels).",
                &["interface", "rule"],
            ),
            level_rate: rate_histogram(
                &registry,
                "xdp_limiter_level_rate_pps",
                "Per aggregate of a rule's level, its packets per second (its window's count normalised to a second), one observation per live aggregate per tick.",
                &["interface", "rule", "level"],
            ),
            rule_limit: gauge(
                &registry,
                "xdp_limiter_rule_limit_pps",
                "Each limit rule's per-source packet limit, in packets per second.",
                &["rule"],
            ),
            cluster: ClusterMetrics::new(&registry),
            last: HashMap::new(),
            rule_drops_last: HashMap::new(),
            level_drops_last: HashMap::new(),
            registry,
        };
        gauge(
            &m.registry,
            "xdp_limiter_build_info",
            "Version of the running xdp-limiter.",
            &["version"],
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
        // The global series exist from start-up, so dashboards and alerts
        // see 0 rather than nothing.
        m.set_guard_state(crate::guard::GLOBAL, crate::guard::GuardState::None);
        m
    }

    /// `xdp_limiter_guard_state{scope}`, and the scope's rollbacks counter
    /// created at 0 if new: a counter born at 1 by its first rollback
    /// would hide that rollback from `increase()`.
    pub fn set_guard_state(&self, scope: &str, state: crate::guard::GuardState) {
        self.guard_state
            .with_label_values(&[scope])
            .set(state as i64);
        self.guard_rollbacks.with_label_values(&[scope]).inc_by(0);
    }

    /// A rollback of `scope`'s guard: counted, and the state says so.
    pub fn guard_rolled_back(&self, scope: &str) {
        self.guard_rollbacks.with_label_values(&[scope]).inc();
        self.set_guard_state(scope, crate::guard::GuardState::RolledBack);
    }

    /// Advances a counter to the kernel's total (kernel totals only grow
    /// while the maps live; a smaller total means they were recreated).
    fn advance(&mut self, counter: &IntCounterVec, labels: &[&str], total: u64) {
        let series = format!("{}{labels:?}", counter.desc()[0].fq_name);
        let last = self.last.insert(series, total).unwrap_or(0);
        let delta = if total >= last { total - last } else { total };
        counter.with_label_values(labels).inc_by(delta);
    }

    /// Advances a counter to `total` when it grew; a smaller `total` adds
    /// nothing (for estimates that can only be revised upwards).
    fn advance_monotonic(&mut self, counter: &IntCounterVec, labels: &[&str], total: u64) {
        let series = format!("{}{labels:?}", counter.desc()[0].fq_name);
        let last = self.last.get(&series).copied().unwrap_or(0);
        if total > last {
            counter.with_label_values(labels).inc_by(total - last);
            self.last.insert(series, total);
        }
    }

    /// Counts the drops per `RULES` index of `iface` (`drops[index]`, the
    /// kernel's totals) under the name each index has in `rule_names`:
    /// what an index gained since the last reading goes to its rule.
    pub fn record_rule_drops(&mut self, iface: &str, drops: &[u64], rule_names: &[(u32, String)]) {
        for (index, name) in rule_names {
            let total = drops.get(*index as usize).copied().unwrap_or(0);
            let last = self
                .rule_drops_last
                .insert((iface.to_string(), *index), total)
                .unwrap_or(0);
            let delta = total.saturating_sub(last);
            self.rule_drops
                .with_label_values(&[iface, name])
                .inc_by(delta);
        }
    }

    /// Counts the drops per level of the `RULES` index `rule.index` of
    /// `iface` (`drops[level]`, the kernel's totals of that index's
    /// levels) under the rule's name and each level's label: what a level
    /// gained since the last reading goes to it.
    pub fn record_level_drops(&mut self, iface: &str, rule: &RuleLevels, drops: &[u64]) {
        for (level, label) in rule.labels.iter().enumerate().take(MAX_LEVELS) {
            let total = drops.get(level).copied().unwrap_or(0);
            let last = self
                .level_drops_last
                .insert((iface.to_string(), rule.index, level), total)
                .unwrap_or(0);
            self.level_drops
                .with_label_values(&[iface, &rule.rule, label])
                .inc_by(total.saturating_sub(last));
        }
    }

    /// A push zeroed the `RULES` half starting at `base` for its new
    /// generation: its counts start again from nothing.
    pub fn rules_pushed(&mut self, base: u32) {
        let half = base..base + MAX_RULES;
        self.rule_drops_last
            .retain(|(_, index), _| !half.contains(index));
        self.level_drops_last
            .retain(|(_, index, _), _| !half.contains(index));
    }

    /// Updates the metrics of `iface` from a pass: `rules` are in force,
    /// `rule_names` name the indices of the live generation and the one
    /// before it (drops counted under either go to their rule).
    pub fn record(
        &mut self,
        iface: &str,
        snapshot: &Snapshot,
        capacity: u32,
        rules: usize,
        rule_names: &[(u32, String)],
        program_stats: Option<(u64, u64)>,
    ) {
        for (outcome, counter) in Outcome::ALL.iter().zip(&snapshot.outcomes) {
            let labels = [iface, outcome.name()];
            let (packets, bytes) = (self.packets.clone(), self.bytes.clone());
            self.advance(&packets, &labels, counter.packets);
            self.advance(&bytes, &labels, counter.bytes);
        }
        self.record_rule_drops(iface, &snapshot.rule_drops, rule_names);
        let counter = self.evictions.clone();
        // Exported from the first pass, at 0, as the window counters: a
        // dashboard's or alert's rate() needs the series before the
        // first eviction.
        counter.with_label_values(&[iface]);
        self.advance_monotonic(&counter, &[iface], snapshot.evictions);
        self.tracked
            .with_label_values(&[iface])
            .set(snapshot.tracked_sources as i64);
        if let Some(active) = snapshot.active_sources {
            self.active
                .with_label_values(&[iface])
                .set(active.estimate as i64);
            self.saturated
                .with_label_values(&[iface])
                .set(i64::from(active.saturated));
        }
        self.capacity
            .with_label_values(&[iface])
            .set(i64::from(capacity));
        self.limited
            .with_label_values(&[iface])
            .set(snapshot.limited.len() as i64);
        self.rules.with_label_values(&[iface]).set(rules as i64);
        if let Some((run_ns, runs)) = program_stats {
            let key = format!("ns_per_run{iface}");
            let last_runs = self.last.get(&format!("{key}/runs")).copied().unwrap_or(0);
            let last_ns = self.last.get(&format!("{key}/ns")).copied().unwrap_or(0);
            if runs > last_runs && run_ns >= last_ns {
                let per = (run_ns - last_ns) as f64 / (runs - last_runs) as f64 / 1e9;
                self.ns_per_run.with_label_values(&[iface]).set(per);
            }
            self.last.insert(format!("{key}/runs"), runs);
            self.last.insert(format!("{key}/ns"), run_ns);
            let (seconds, count) = (self.run_seconds.clone(), self.runs.clone());
            self.advance(&seconds, &[iface], run_ns);
            self.advance(&count, &[iface], runs);
        }
    }
}

impl Metrics {
    /// Observes one source rate (packets over its last complete second)
    /// of `rule` on `iface`.
    pub fn observe_source_rate(&self, iface: &str, rule: &str, pps: u64) {
        self.source_rate_of(iface, rule).observe(pps as f64);
    }

    /// The source rate histogram of `rule` on `iface`, to observe many
    /// sources without looking the series up for each.
    pub fn source_rate_of(&self, iface: &str, rule: &str) -> Histogram {
        self.source_rate.with_label_values(&[iface, rule])
    }

    /// Observes one aggregate's rate of `rule`'s `level` on `iface`.
    pub fn observe_level_rate(&self, iface: &str, rule: &str, level: &str, pps: f64) {
        self.level_rate
            .with_label_values(&[iface, rule, level])
            .observe(pps);
    }

    /// Sets the limit gauge to the `limit` rules in force (`rules`: each
    /// rule's name and its packet limit, `None` when it has none): the
    /// series of rules gone or no longer limiting by packets go away.
    pub fn record_rule_limits(&self, rules: &[(String, Option<u64>)]) {
        self.rule_limit.reset();
        for (rule, pps) in rules {
            if let Some(pps) = pps {
                self.rule_limit
                    .with_label_values(&[rule])
                    .set(i64::try_from(*pps).unwrap_or(i64::MAX));
            }
        }
    }

    /// Updates the number of penalties running on `iface`.
    pub fn record_penalties(&mut self, iface: &str, running: usize) {
        self.penalties
            .with_label_values(&[iface])
            .set(running as i64);
    }

    /// The sample of known sources: how many, and one in how many.
    pub fn record_known(&self, sources: usize, sampled_share: f64) {
        self.known_sources.set(sources as i64);
        self.known_one_in
            .set((1.0 / sampled_share.max(f64::MIN_POSITIVE)).round() as i64);
    }

    /// Updates the kept windows and aggregates of `iface` from its
    /// reclaim's passes (each map's count from its last complete pass), of
    /// `capacity` each.
    pub fn record_windows(&mut self, iface: &str, reclaim: &Reclaim, capacity: u32) {
        for (gauge, kept) in [
            (&self.windows_kept, reclaim.windows.kept),
            (&self.aggregates_kept, reclaim.aggregates.kept),
            (&self.aggregate_cells, reclaim.cells.kept),
        ] {
            if let Some(kept) = kept {
                gauge.with_label_values(&[iface]).set(kept as i64);
            }
        }
        self.window_capacity
            .with_label_values(&[iface])
            .set(i64::from(capacity));
        // Exported from the first tick, at 0: an alert on their rate needs
        // the series before the first deletion.
        let counter = self.windows_reclaimed.clone();
        counter.with_label_values(&[iface]);
        self.advance(&counter, &[iface], reclaim.windows.deleted_total);
        let counter = self.aggregates_reclaimed.clone();
        counter.with_label_values(&[iface]);
        self.advance(
            &counter,
            &[iface],
            reclaim.aggregates.deleted_total + reclaim.cells.deleted_total,
        );
    }

    /// Updates the link state of `iface`: re-attachments so far (this
    /// daemon's), and whether it is attached now.
    pub fn record_link(&mut self, iface: &str, reattachments: u64, attached: bool) {
        let counter = self.reattachments.clone();
        self.advance(&counter, &[iface], reattachments);
        self.attached
            .with_label_values(&[iface])
            .set(i64::from(attached));
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of eth0's level series of `rule` and `level`, if any.
    fn level_drops(metrics: &Metrics, rule: &str, level: &str) -> Option<u64> {
        let series = format!(
            "xdp_limiter_level_dropped_packets_total{{interface=\"eth0\",level=\"{level}\",rule=\"{rule}\"}} "
        );
        render(&metrics.registry)
            .lines()
            .find_map(|line| line.strip_prefix(&series)?.parse().ok())
    }

    #[test]
    fn source_evictions_are_exported_at_zero_from_the_first_pass() {
        let mut metrics = Metrics::new();
        let series = "xdp_limiter_source_evictions_total{interface=\"eth0\"} ";
        assert!(!render(&metrics.registry).contains(series));
        metrics.record("eth0", &Snapshot::default(), 1024, 1, &[], None);
        assert!(render(&metrics.registry).contains(&format!("{series}0\n")));
        let snapshot = Snapshot {
            evictions: 5,
            ..Snapshot::default()
        };
        metrics.record("eth0", &snapshot, 1024, 1, &[], None);
        assert!(render(&metrics.registry).contains(&format!("{series}5\n")));
    }

    #[test]
    fn a_scopes_rollbacks_counter_exists_at_zero_once_its_guard_state_is_set() {
        let metrics = Metrics::new();
        metrics.set_guard_state("rules[0]", crate::guard::GuardState::Watching);
        let text = render(&metrics.registry);
        assert!(
            text.contains("xdp_limiter_guard_rollbacks_total{scope=\"rules[0]\"} 0\n"),
            "{text}"
        );
        metrics.guard_rolled_back("rules[0]");
        assert!(render(&metrics.registry)
            .contains("xdp_limiter_guard_rollbacks_total{scope=\"rules[0]\"} 1\n"));
    }

    #[test]
    fn level_drops_count_per_rule_and_level_and_start_again_after_a_push() {
        let mut metrics = Metrics::new();
        let rule = RuleLevels {
            index: 3,
            rule: "rules[2]".into(),
            labels: vec!["prefix/24/48@1s".into(), "source@1m".into()],
        };
        metrics.record_level_drops("eth0", &rule, &[5, 2, 0, 0]);
        metrics.record_level_drops("eth0", &rule, &[7, 2, 0, 0]);
        assert_eq!(
            level_drops(&metrics, "rules[2]", "prefix/24/48@1s"),
            Some(7)
        );
        assert_eq!(level_drops(&metrics, "rules[2]", "source@1m"), Some(2));
        // One series per level the rule has, no more.
        let text = render(&metrics.registry);
        assert_eq!(
            text.matches("xdp_limiter_level_dropped_packets_total{")
                .count(),
            2,
            "{text}"
        );
        // A push of the other half leaves the counts as they are...
        metrics.rules_pushed(MAX_RULES);
        metrics.record_level_drops("eth0", &rule, &[8, 2, 0, 0]);
        assert_eq!(
            level_drops(&metrics, "rules[2]", "prefix/24/48@1s"),
            Some(8)
        );
        // ...one of index 3's half zeroed it: its counts start from nothing.
        metrics.rules_pushed(0);
        metrics.record_level_drops("eth0", &rule, &[1, 0, 0, 0]);
        assert_eq!(
            level_drops(&metrics, "rules[2]", "prefix/24/48@1s"),
            Some(9)
        );
        assert_eq!(level_drops(&metrics, "rules[2]", "source@1m"), Some(2));
    }

    #[test]
    fn rate_histograms_and_limits_are_exported_with_their_buckets_and_labels() {
        let metrics = Metrics::new();
        for pps in [3, 10, 10, 150] {
            metrics.observe_source_rate("eth0", "default", pps);
        }
        metrics.observe_level_rate("eth0", "rules[0]", "prefix/24/48@1s", 40.0);
        metrics.record_rule_limits(&[
            ("default".into(), Some(100)),
            ("rules[0]".into(), None),
            ("rules[1]".into(), Some(2_000)),
        ]);
        let text = render(&metrics.registry);
        let has = |line: &str| text.lines().any(|l| l == line);
        let source = |le: &str, n: u32| {
            format!("xdp_limiter_source_rate_pps_bucket{{interface=\"eth0\",rule=\"default\",le=\"{le}\"}} {n}")
        };
        for (le, n) in [
            ("1", 0),
            ("5", 1),
            ("10", 3),
            ("100", 3),
            ("200", 4),
            ("1000000", 4),
            ("+Inf", 4),
        ] {
            assert!(has(&source(le, n)), "no {} in\n{text}", source(le, n));
        }
        assert!(
            has("xdp_limiter_source_rate_pps_sum{interface=\"eth0\",rule=\"default\"} 173"),
            "{text}"
        );
        assert!(
            has("xdp_limiter_source_rate_pps_count{interface=\"eth0\",rule=\"default\"} 4"),
            "{text}"
        );
        // 19 buckets and +Inf.
        assert_eq!(
            text.matches("xdp_limiter_source_rate_pps_bucket{").count(),
            20
        );
        assert!(has("xdp_limiter_level_rate_pps_bucket{interface=\"eth0\",level=\"prefix/24/48@1s\",rule=\"rules[0]\",le=\"50\"} 1"), "{text}");
        assert!(
            has("xdp_limiter_rule_limit_pps{rule=\"default\"} 100"),
            "{text}"
        );
        assert!(
            has("xdp_limiter_rule_limit_pps{rule=\"rules[1]\"} 2000"),
            "{text}"
        );
        assert!(
            !text.contains("xdp_limiter_rule_limit_pps{rule=\"rules[0]\"}"),
            "{text}"
        );
        // A rule gone takes its series with it.
        metrics.record_rule_limits(&[("default".into(), Some(50))]);
        let text = render(&metrics.registry);
        assert!(
            text.contains("xdp_limiter_rule_limit_pps{rule=\"default\"} 50"),
            "{text}"
        );
        assert!(
            !text.contains("rule_limit_pps{rule=\"rules[1]\"}"),
            "{text}"
        );
    }
}
