//! Every metric the daemon exports, declared once: its name, help and
//! labels, registered as it is made (so none can be left out of
//! `/metrics`). docs/metrics.md describes each.

use std::collections::HashMap;

use prometheus::{
    core::Collector, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry,
};

use super::{ClusterMetrics, Metrics};

/// `metric`, registered with `registry` (so none can be left out).
pub(super) fn registered<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric");
    metric
}

pub(super) fn counter(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registered(registry, metric)
}

/// The buckets (packets per second) of the rate histograms: 1-2-5 steps
/// from 1 pps to 1 Mpps.
pub const RATE_BUCKETS: [f64; 19] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5,
    5e5, 1e6,
];

pub(super) fn rate_histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(RATE_BUCKETS.to_vec());
    registered(
        registry,
        HistogramVec::new(opts, labels).expect("valid metric"),
    )
}

pub(super) fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
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
                "daemon.max_sources: the windows' tickets (sources that have not proved their address), and the aggregates the levels' map holds; the kept map holds a quarter more for proven sources.",
                &["interface"],
            ),
            tickets: gauge(
                &registry,
                "xdp_limiter_tickets",
                "Windows' tickets held (UNPROVEN), by room: a rule's name (its reserve) or (shared) for sources that have not proved their address, (proven) for TCP sources that proved theirs with a SYN cookie while the tickets were taken. At xdp_limiter_ticket_room for a rule and for (shared), the rule's new unproven sources get no window (outcome window_full); other rules' reserves stay theirs.",
                &["interface", "room"],
            ),
            ticket_room: gauge(
                &registry,
                "xdp_limiter_ticket_room",
                "Tickets a room holds at most: each limiting rule's reserve (daemon.max_sources / (2 x rules)), the shared room (the rest) and the proven room (daemon.max_sources / 4, the windows kept beyond the tickets).",
                &["interface", "room"],
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
            syncookie_shield: registered(
                &registry,
                prometheus::IntGauge::new(
                    "xdp_limiter_syncookie_shield",
                    "1 while the daemon holds net.ipv4.tcp_syncookies at 2 because the windows' tickets are all taken (a flood fills the windows; new TCP clients prove their address with a cookie and get a window in the room kept for them: outcome proven), else 0.",
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
            lists: super::ListMetrics::new(&registry),
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
}
