//! The cluster sync's metrics: Redis health, sync timing, shares and
//! remote sources.

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::cluster::store::{ErrorKind, StoreError};

use super::registry::{counter, gauge, registered};

/// The cluster sync's metrics (`daemon::sync`), cheap handles the
/// sync task keeps (prometheus metrics are shared, clones update the same
/// series).
#[derive(Clone)]
pub struct ClusterMetrics {
    /// Duration of each sync tick (Redis calls and map writes).
    pub sync_duration: Histogram,
    /// Redis failures (connect, sync, heartbeat, hot sources), at most one
    /// per tick and one per hot listing, by kind (`ClusterMetrics::redis_error`).
    redis_errors: IntCounterVec,
    /// Ticks that synced only part of the hot sources.
    pub partial_ticks: IntCounter,
    /// 1 while degraded (3 failed ticks in a row, until a sync succeeds).
    pub degraded: IntGauge,
    /// Sources carried by the last sync.
    pub synced_sources: IntGauge,
    /// Nodes alive at the last heartbeat (the last known while failing).
    pub nodes_alive: IntGauge,
    /// 1 while the fallback policy is applied, by policy.
    pub fallback: IntGaugeVec,
    /// 1 while another daemon heartbeats under this node's name.
    pub duplicate_node: IntGauge,
    /// Sources tracked because other nodes listed them hot.
    pub remote_sources: IntGauge,
    /// Hot sources of other nodes left out by `cluster.max_remote_sources`.
    pub remote_sources_over_limit: IntCounter,
}

impl ClusterMetrics {
    pub(super) fn new(registry: &Registry) -> Self {
        let one = |name: &str, help: &str| {
            registered(
                registry,
                IntGauge::with_opts(Opts::new(name, help)).expect("valid metric"),
            )
        };
        Self {
            sync_duration: registered(
                registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "xdp_limiter_cluster_sync_duration_seconds",
                        "Duration of one cluster sync tick (Redis calls and map writes).",
                    )
                    .buckets(vec![
                        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    ]),
                )
                .expect("valid metric"),
            ),
            redis_errors: {
                let errors = counter(
                    registry,
                    "xdp_limiter_cluster_redis_errors_total",
                    "Cluster sync ticks with a Redis failure (connect, heartbeat or sync), whether the tick failed or synced part of its sources, plus failed hot-source listings, by kind: timeout, connection, server (an error reply) or other.",
                    &["kind"],
                );
                // Every kind from the start: dashboards and rate() see
                // zeros, not a series that appears with the first error.
                for kind in ErrorKind::ALL {
                    errors.with_label_values(&[kind.name()]);
                }
                errors
            },
            partial_ticks: registered(
                registry,
                IntCounter::with_opts(Opts::new(
                    "xdp_limiter_cluster_partial_ticks_total",
                    "Cluster sync ticks that synced only part of the hot sources (Redis could not serve them all within the tick; the rest go first next tick).",
                ))
                .expect("valid metric"),
            ),
            degraded: one(
                "xdp_limiter_cluster_degraded",
                "1 while the node is degraded (3 failed sync ticks in a row, until one succeeds).",
            ),
            synced_sources: one(
                "xdp_limiter_cluster_synced_sources",
                "Cluster-scoped sources carried by the last sync.",
            ),
            nodes_alive: one(
                "xdp_limiter_cluster_nodes_alive",
                "Nodes alive at the last heartbeat (the last known while Redis fails).",
            ),
            fallback: gauge(
                registry,
                "xdp_limiter_cluster_fallback",
                "1 while the fallback policy (label policy: split or local) is applied: degraded past the grace period.",
                &["policy"],
            ),
            duplicate_node: one(
                "xdp_limiter_cluster_duplicate_node",
                "1 while another daemon heartbeats into Redis under this node's name: this node does not sync and holds its cluster sources to the fallback cap until the name is free.",
            ),
            remote_sources: one(
                "xdp_limiter_cluster_remote_sources",
                "Cluster sources tracked because other nodes listed them hot (at most cluster.max_remote_sources).",
            ),
            remote_sources_over_limit: registered(
                registry,
                IntCounter::with_opts(Opts::new(
                    "xdp_limiter_cluster_remote_sources_over_limit_total",
                    "Sources listed hot on other nodes that this node did not take, being at cluster.max_remote_sources (counted at every listing that leaves them out).",
                ))
                .expect("valid metric"),
            ),
        }
    }

    /// Counts one Redis failure under its kind.
    pub fn redis_error(&self, error: &StoreError) {
        self.redis_errors
            .with_label_values(&[error.kind().name()])
            .inc();
    }
}
