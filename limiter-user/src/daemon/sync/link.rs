//! The sync phase and the hot listing's call: the Redis boundary of the
//! tick. Reports go out with their sources named as Redis names them
//! ([`ReportKey::wire`]) and listed keys come back parsed
//! ([`ReportKey::parse`]); the rest of the task only sees [`ReportKey`]s.

use std::{
    ops::Range,
    time::{Duration, Instant},
};

use tracing::debug;

use super::{
    node::alive_period,
    timing::PARTIAL_MARGIN,
    tracking::{Listed, Reports},
};
use crate::{
    cluster::{Report, ReportKey, Store, StoreError, WindowSpec},
    config::ClusterConfig,
    daemon::metrics::ClusterMetrics,
};

/// This node's link to Redis: the store, connected on demand (and again
/// after a failed tick behind Sentinel), and this daemon run's token in its
/// heartbeats (`super::node::instance_token`).
pub(super) struct Link {
    store: Option<Store>,
    token: String,
}

/// What Redis answered a tick: the nodes alive and each synced source's
/// claim (`cluster::share::node_claim`); `partial` when part of the
/// sources could not be synced in time.
pub(super) struct Claims {
    pub nodes: u32,
    pub claims: Vec<(ReportKey, u64)>,
    pub partial: bool,
}

/// The sync phase's outcome, and whether any sync was sent before it ended
/// (a sent sync may have been counted by Redis even if it failed).
pub(super) struct Synced {
    pub result: Result<Claims, StoreError>,
    pub sent: bool,
}

impl Link {
    pub(super) fn new(token: String) -> Self {
        Self { store: None, token }
    }

    /// Drops the connection: the next tick connects again.
    pub(super) fn reset(&mut self) {
        self.store = None;
    }

    /// Connects if needed, heartbeats and syncs `reports`, all cut at
    /// `deadline`.
    pub(super) async fn sync(
        &mut self,
        config: &ClusterConfig,
        reports: &Reports,
        deadline: Instant,
        metrics: &ClusterMetrics,
    ) -> Synced {
        let mut sent = false;
        let budget = deadline.saturating_duration_since(Instant::now());
        let exchange = self.exchange(config, reports, deadline, metrics, &mut sent);
        let result = match tokio::time::timeout(budget, exchange).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout {
                op: "sync tick",
                after: config.sync_interval,
            }),
        };
        Synced { result, sent }
    }

    /// The heartbeat is bounded by the call timeout (a hung Redis shows
    /// there first). The syncs share what is left of the tick: a batch cut
    /// at the deadline fails only its sources, which keep their last
    /// allowance and go first next tick; the tick fails only when nothing
    /// synced. `sent` is set once Redis may count what this tick reports.
    async fn exchange(
        &mut self,
        config: &ClusterConfig,
        reports: &Reports,
        deadline: Instant,
        metrics: &ClusterMetrics,
        sent: &mut bool,
    ) -> Result<Claims, StoreError> {
        let store = match &mut self.store {
            Some(store) => store,
            empty => empty.insert(Store::connect(config).await?),
        };
        let alive = alive_period(config.sync_interval);
        let nodes = store.heartbeat_as(&config.node, &self.token, alive).await?;
        *sent = !reports.groups.is_empty();
        let mut claims = Vec::new();
        let (mut failed, mut first_error) = (0usize, None);
        for (&(bucket_ms, buckets), entries) in &reports.groups {
            let spec = WindowSpec::new(Duration::from_millis(bucket_ms), buckets)?;
            let wire: Vec<Report> = entries
                .iter()
                .map(|pending| Report {
                    key: pending.key.wire(),
                    admitted: pending.admitted,
                    offered: pending.offered,
                    limit: pending.limit,
                })
                .collect();
            // Ends a little before the cut around this call, so the
            // batches served in time come back as a partial sync instead
            // of racing the cut, which would lose them all.
            let budget = deadline
                .saturating_duration_since(Instant::now())
                .saturating_sub(PARTIAL_MARGIN);
            let outcome = store
                .sync_partial(&config.node, spec, &wire, budget)
                .await?;
            failed += outcome.failed_batches;
            if first_error.is_none() {
                first_error = outcome.error;
            }
            for (pending, totals) in entries.iter().zip(outcome.totals) {
                if let Some(totals) = totals {
                    claims.push((pending.key.clone(), totals.claim));
                }
            }
        }
        let mut partial = false;
        if let Some(e) = first_error {
            if claims.is_empty() {
                return Err(e);
            }
            metrics.redis_error(&e);
            metrics.partial_ticks.inc();
            partial = true;
            debug!(failed, synced = claims.len(), error = %e,
                "cluster: part of the hot sources not synced this tick (they go first next tick)");
        }
        Ok(Claims {
            nodes,
            claims,
            partial,
        })
    }

    /// The hot-set groups `slice` listed (at most `limit` keys, within
    /// `budget`), each key parsed; `None` without a connection.
    pub(super) async fn list_hot(
        &self,
        window: Duration,
        slice: Range<u16>,
        budget: Duration,
        limit: usize,
    ) -> Option<Result<Listed, StoreError>> {
        let store = self.store.as_ref()?;
        let listed = store
            .hot_sources_bounded(window, slice, budget, limit)
            .await
            .map(|list| Listed {
                keys: list.keys.iter().map(|k| ReportKey::parse(k)).collect(),
                omitted: list.omitted,
            });
        Some(listed)
    }
}
