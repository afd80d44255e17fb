//! The cluster sync task: with `[cluster]` configured, one task per daemon
//! ties the Redis store (`crate::cluster::store`) to the kernel's cluster
//! maps of every protected interface. Every sync interval `T` (ticks never
//! overlap: `MissedTickBehavior::Skip`; the syncs are cut at `0.9 T`, the
//! hot listing at `0.95 T`: [`timing::TickPlan`]) a tick runs five phases,
//! each handing the next what it needs:
//!
//! 1. **report** ([`Sync::report`]): takes the sources the kernel reported
//!    hot (cluster-hot events, forwarded by the event watchers through a
//!    channel) into the [`tracking::Tracking`], and reads each tracked
//!    source's admitted (the shared window's slots) and offered (the
//!    per-CPU totals) deltas since the last tick;
//! 2. **sync** ([`link::Link::sync`]): heartbeats and syncs the reports
//!    with Redis under the tick's cut, returning each source's claim;
//! 3. **plan** ([`Sync::plan_shares`]): turns the claims into allowances,
//!    or on a failure keeps, shortens or revokes the last ones
//!    ([`fallback::Standing`]: degraded after three failed ticks, the
//!    fallback cap after the grace period, a node name another daemon
//!    holds);
//! 4. **write shares** ([`shares::ShareWriter`]): writes the allowances
//!    into `CLUSTER_SHARES` and the state into `CLUSTER` (every tick, even
//!    a failed one: the kernel's own fallback is for a daemon that stopped
//!    ticking);
//! 5. **hot list** ([`Sync::list_hot`]): lists a slice of the sources hot
//!    on any node, after the writes so the shares are not delayed by it,
//!    and tracks those of other nodes (at most
//!    `cluster.max_remote_sources`) from the next tick on.
//!
//! The task opens the interfaces' pinned maps itself (the daemon pins them
//! all), so it never waits on the daemon's main loop and the main loop
//! never waits on Redis.

mod fallback;
mod hot;
mod link;
mod node;
mod shares;
mod timing;
mod tracking;

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use limiter_common::{rules::rules_base, EventKind, LimitEvent, Rule, Scope};
use tokio::sync::mpsc;
use tracing::warn;

pub use self::node::{claim_node_name, instance_token};
use self::{
    fallback::Standing,
    hot::HotCursor,
    link::{Link, Synced},
    shares::{ShareWriter, Shares},
    timing::{next_cap, TickPlan},
    tracking::{Reports, Tracking},
};
use super::{metrics::ClusterMetrics, rule_table::SharedRuleTable};
use crate::{
    cluster::{
        tick::{kernel_state, share_expiry, Phase},
        ReportKey, StoreError,
    },
    config::{ClusterConfig, Fallback},
    kernel::{pins, Maps},
    proto::ClusterLive,
};

/// Cluster-hot events queued for the sync task at most; the kernel sends
/// at most 64 events per CPU and second, so this is only reached if the
/// task stalls, and then an event lost is a source synced one window
/// later (its next report).
pub const EVENT_QUEUE: usize = 4096;

/// What `status` shows of the sync, updated by the task every tick.
#[derive(Debug, Default)]
pub struct Live {
    nodes_alive: u32,
    last_sync: Option<Instant>,
    degraded: bool,
    synced_sources: usize,
    fallback_in_force: Option<Fallback>,
    failed_ticks: u64,
    duplicate_node: bool,
    remote_sources: usize,
}

pub type SharedLive = Arc<Mutex<Live>>;

impl Live {
    pub fn status(&self) -> ClusterLive {
        ClusterLive {
            nodes_alive: self.nodes_alive,
            last_sync_age_ms: self
                .last_sync
                .map(|t| t.elapsed().as_millis().min(u128::from(u64::MAX)) as u64),
            degraded: self.degraded,
            synced_sources: self.synced_sources,
            fallback_in_force: self.fallback_in_force,
            failed_ticks: self.failed_ticks,
            duplicate_node: self.duplicate_node,
            remote_sources: self.remote_sources,
        }
    }
}

/// The sync task's state.
pub struct Sync {
    config: ClusterConfig,
    /// Redis: the store (connected on demand) and this run's token.
    link: Link,
    /// Each protected interface's maps, opened from their pins.
    kernel: ShareWriter,
    rules: SharedRuleTable,
    events: mpsc::Receiver<LimitEvent>,
    tracking: Tracking,
    standing: Standing,
    hot: HotCursor,
    /// How many sources a tick reports at most (stalest first; `None`:
    /// all), learnt from what Redis served ([`next_cap`]).
    sync_cap: Option<usize>,
    metrics: ClusterMetrics,
    live: SharedLive,
}

/// The kernel's clock for the limiter, in ns (`kernel::now`: what the
/// program's `bpf_ktime_get_coarse_ns` reads).
fn kernel_ns() -> u64 {
    crate::kernel::now().as_nanos() as u64
}

/// Starts the sync task for `ifaces` (pinned under `pin_dir`), heartbeating
/// as the instance `token`.
#[allow(clippy::too_many_arguments)]
pub fn start(
    config: ClusterConfig,
    token: String,
    pin_dir: &Path,
    ifaces: &[String],
    rules: SharedRuleTable,
    events: mpsc::Receiver<LimitEvent>,
    metrics: ClusterMetrics,
    live: SharedLive,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut opened = Vec::with_capacity(ifaces.len());
    for iface in ifaces {
        let dir = pins::maps_dir(&pins::iface_dir(pin_dir, iface));
        let maps = Maps::from_pins(&dir)
            .map_err(|e| anyhow::anyhow!("{iface}: cannot open the pinned maps: {e}"))?;
        opened.push((iface.clone(), maps));
    }
    let mut sync = Sync {
        tracking: Tracking::new(opened.len()),
        kernel: ShareWriter::new(opened, config.sync_interval),
        link: Link::new(token),
        config,
        rules,
        events,
        standing: Standing::default(),
        hot: HotCursor::default(),
        sync_cap: None,
        metrics,
        live,
    };
    Ok(tokio::spawn(async move {
        let mut interval = tokio::time::interval(sync.config.sync_interval);
        // A slow tick is cut at the deadline and the next one starts on the
        // schedule: missed ticks are skipped, never run back to back.
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            interval.tick().await;
            sync.tick().await;
        }
    }))
}

/// What the plan phase decided: how many sources synced (`None`: the tick
/// failed), whether only part of them did, and what becomes of the shares.
struct Planned {
    synced: Option<usize>,
    partial: bool,
    shares: Shares,
}

impl Sync {
    async fn tick(&mut self) {
        let started = Instant::now();
        let reports = self.report(started);
        let plan = TickPlan::new(started, self.config.sync_interval);
        let synced = self
            .link
            .sync(&self.config, &reports, plan.syncs_until, &self.metrics)
            .await;
        let now = Instant::now();
        let kernel_now = kernel_ns();
        let planned = self.plan_shares(synced, &reports, now, kernel_now);
        self.kernel
            .write(&mut self.tracking, planned.shares, kernel_now);
        self.sync_cap = next_cap(
            self.sync_cap,
            reports.sent,
            planned.synced,
            planned.partial,
            started.elapsed(),
            self.config.sync_interval,
            self.tracking.len(),
        );
        let phase = self.standing.phase(now, self.config.grace);
        self.kernel.write_state(kernel_state(
            kernel_now,
            self.config.sync_interval,
            self.standing.nodes_alive(),
            self.config.fallback,
            self.config.threshold,
            phase,
        ));
        // Sources hot on other nodes, once the kernel has this tick's
        // shares, and only when Redis answered.
        if planned.synced.is_some() {
            self.list_hot(reports.window(), plan).await;
        }
        self.publish(started, now, phase, planned.synced);
    }

    /// The report phase: the sources the kernel reported hot since the
    /// last tick are tracked, then every tracked source (at most
    /// `sync_cap`, stalest first) is read into a report.
    fn report(&mut self, started: Instant) -> Reports {
        while let Ok(event) = self.events.try_recv() {
            if event.kind() == Some(EventKind::ClusterHot) {
                if let Some(rule) = self.rule_name(event.rule) {
                    self.tracking
                        .track(ReportKey::new(event.key, rule), started, false);
                }
            }
        }
        let rules = self.live_rules();
        self.tracking.report(
            self.kernel.ifaces(),
            &rules,
            self.sync_cap,
            started,
            kernel_ns(),
            self.config.sync_interval,
        )
    }

    /// The plan phase: a synced tick turns each claim into the source's
    /// allowance (held to the fallback cap while recovering); a failed one
    /// keeps the last allowances for as long as the node's standing allows,
    /// carries what was never sent to the next report, or revokes every
    /// share when another daemon holds this node's name.
    fn plan_shares(
        &mut self,
        synced: Synced,
        reports: &Reports,
        now: Instant,
        kernel_now: u64,
    ) -> Planned {
        let interval = self.config.sync_interval;
        match synced.result {
            Ok(claims) => {
                let window = self.tracking.longest_window();
                let nodes = claims.nodes;
                let recovery = self.standing.synced(nodes, now, window, &self.config.node);
                let policy = self.config.fallback;
                let count = claims.claims.len();
                self.tracking.apply_claims(claims.claims, now, |limit| {
                    recovery.cap(policy, limit, nodes)
                });
                let expires = share_expiry(kernel_now, interval, Phase::Normal, now);
                Planned {
                    synced: Some(count),
                    partial: claims.partial,
                    shares: Shares::until(expires),
                }
            }
            Err(e) => {
                let revoke = self.standing.failed(&e, now, &self.config, &self.metrics);
                // Behind Sentinel the primary may have moved: ask the
                // Sentinels again next tick (a single instance's or a
                // Redis Cluster's connection reconnects and follows the
                // topology on its own).
                if self.config.mode == crate::config::ClusterMode::Sentinel
                    && !self.standing.duplicate()
                {
                    self.link.reset();
                }
                // A duplicate's deltas are not this name's to report later.
                let degraded = self.standing.degraded() || self.standing.duplicate();
                self.tracking.keep_unsent(reports, synced.sent, degraded);
                let shares = if revoke {
                    Shares::Revoke
                } else {
                    let phase = self.standing.phase(now, self.config.grace);
                    Shares::until(share_expiry(kernel_now, interval, phase, now))
                };
                Planned {
                    synced: None,
                    partial: false,
                    shares,
                }
            }
        }
    }

    /// The hot list phase: lists a slice of the hot set (every group once
    /// per window) and tracks the sources hot on other nodes: they are
    /// synced from the next tick on. Called after the kernel's maps are
    /// written, never before: a listing ahead of the writes would delay
    /// every share by its round trip, and a share written late lets the
    /// kernel re-admit what left its window meanwhile. By
    /// `plan.listing_until`; skipped, its slice left for the next tick,
    /// when too little time is left or the listing runs out of it (neither
    /// counts as a Redis error); a slice Redis fails is listed again a
    /// window later. Never fails the tick.
    async fn list_hot(&mut self, window: Duration, plan: TickPlan) {
        let budget = plan.listing_until.saturating_duration_since(Instant::now());
        if budget < plan.listing_least {
            return;
        }
        let slice = self.hot.next_slice(self.config.sync_interval, window);
        let limit = self.config.max_remote_sources;
        match self
            .link
            .list_hot(window, slice.clone(), budget, limit)
            .await
        {
            Some(Ok(listed)) => {
                let now = Instant::now();
                let left_out = self.tracking.take_listed(listed, now, limit);
                self.hot.left_out(left_out, now, limit, &self.metrics);
            }
            Some(Err(StoreError::Timeout { .. })) => {
                // Out of the tick's time (Redis still busy with syncs cut
                // at their deadline, at capacity): the same slice next
                // tick; not a Redis failure.
                self.hot.retry(slice);
                tracing::debug!("cluster: no time left to list the hot set this tick");
            }
            Some(Err(e)) => {
                self.metrics.redis_error(&e);
                warn!(error = %e, "cluster: cannot list the sources hot on other nodes (these groups are listed again in a window)");
            }
            None => {}
        }
    }

    /// Tells operators where the sync stands: the metrics and `status`.
    fn publish(&self, started: Instant, now: Instant, phase: Phase, synced: Option<usize>) {
        let fallback = (phase == Phase::Fallback).then_some(self.config.fallback);
        let remote = self.tracking.remote();
        let standing = &self.standing;
        self.metrics.remote_sources.set(remote as i64);
        self.metrics
            .duplicate_node
            .set(i64::from(standing.duplicate()));
        self.metrics.degraded.set(i64::from(standing.degraded()));
        self.metrics
            .nodes_alive
            .set(i64::from(standing.nodes_alive()));
        for f in [Fallback::Split, Fallback::Local] {
            self.metrics
                .fallback
                .with_label_values(&[f.name()])
                .set(i64::from(fallback == Some(f)));
        }
        if let Some(count) = synced {
            self.metrics.synced_sources.set(count as i64);
        }
        self.metrics
            .sync_duration
            .observe(started.elapsed().as_secs_f64());
        if let Ok(mut live) = self.live.lock() {
            live.nodes_alive = standing.nodes_alive();
            live.degraded = standing.degraded();
            live.fallback_in_force = fallback;
            live.failed_ticks = standing.failed_ticks();
            live.duplicate_node = standing.duplicate();
            live.remote_sources = remote;
            if let Some(count) = synced {
                live.last_sync = Some(now);
                live.synced_sources = count;
            }
        }
    }

    /// The live generation's cluster rules by name.
    fn live_rules(&self) -> HashMap<String, Rule> {
        let Some((_, maps)) = self.kernel.ifaces().first() else {
            return HashMap::new();
        };
        let Ok(config) = maps.live_config() else {
            return HashMap::new();
        };
        let base = rules_base(config.generation);
        let Ok(table) = self.rules.read() else {
            return HashMap::new();
        };
        table
            .generation(base)
            .filter_map(|(index, name)| maps.rule(index).ok().map(|rule| (name.to_string(), rule)))
            .filter(|(_, rule)| rule.scope() == Some(Scope::Cluster))
            .collect()
    }

    fn rule_name(&self, index: u32) -> Option<String> {
        self.rules.read().ok()?.name(index).map(str::to_string)
    }
}
