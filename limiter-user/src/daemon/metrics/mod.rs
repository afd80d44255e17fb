//! Prometheus metrics: the registry and its update from aggregation
//! passes; the cluster sync's own metrics (`cluster`) and the HTTP
//! endpoint (`http`, `GET /metrics`) have their own files. No per-source
//! labels: their number is unbounded; top talkers go through the control
//! API instead.

use std::collections::HashMap;

use limiter_common::{
    rules::{MAX_LEVELS, MAX_RULES},
    tickets::{Rooms, PROVEN, SHARED},
    Outcome,
};
use prometheus::{
    core::Collector, GaugeVec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec,
    Registry,
};

use super::aggregate::Snapshot;
use crate::kernel::windows::Reclaim;

mod cluster;
mod http;
mod lists;
mod registry;

pub use cluster::ClusterMetrics;
pub use http::{bind, serve};
pub use lists::{action_name, BanChange, ListMetrics};

/// A `RULES` index whose rule has levels: the rule's name and its
/// levels' `level` labels (`LevelSpec::label`), in the rule's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleLevels {
    pub index: u32,
    pub rule: String,
    pub labels: Vec<String>,
}

/// The `room` label of the tickets' shared room (a rule's is its name).
pub const SHARED_ROOM: &str = "(shared)";
/// The `room` label of the proven room's tickets.
pub const PROVEN_ROOM: &str = "(proven)";

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
    tickets: IntGaugeVec,
    ticket_room: IntGaugeVec,
    windows_reclaimed: IntCounterVec,
    aggregates_kept: IntGaugeVec,
    aggregate_cells: IntGaugeVec,
    known_sources: prometheus::IntGauge,
    syncookie_shield: prometheus::IntGauge,
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
    /// The lists' and bans' metrics.
    pub lists: ListMetrics,
    /// Last kernel totals per series, to turn totals into increments.
    last: HashMap<String, u64>,
    /// The kernel's last drop totals of each interface's `RULES` index,
    /// and of each of an index's levels: a push forgets its half's.
    rule_drops_last: HashMap<(String, u32), u64>,
    level_drops_last: HashMap<(String, u32, usize), u64>,
}

impl Metrics {
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
    #[cfg(test)]
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

    /// Whether the SYN-cookie shield is up.
    pub fn record_shield(&self, up: bool) {
        self.syncookie_shield.set(i64::from(up));
    }

    /// The sample of known sources: how many, and one in how many.
    pub fn record_known(&self, sources: usize, sampled_share: f64) {
        self.known_sources.set(sources as i64);
        self.known_one_in
            .set((1.0 / sampled_share.max(f64::MIN_POSITIVE)).round() as i64);
    }

    /// Updates the windows' tickets of `iface`: those `held` per account
    /// (`tickets::ACCOUNTS`), under the rule each index of `rule_names`
    /// names (an index of the generation before counts for its rule too),
    /// the shared room's and the proven room's, and the size of each room.
    pub fn record_tickets(
        &mut self,
        iface: &str,
        held: &[u64],
        rooms: Rooms,
        rule_names: &[(u32, String)],
    ) {
        let mut per_room: std::collections::BTreeMap<&str, u64> = Default::default();
        for (index, name) in rule_names {
            *per_room.entry(name).or_default() += held.get(*index as usize).copied().unwrap_or(0);
        }
        for (room, tickets) in per_room {
            self.tickets
                .with_label_values(&[iface, room])
                .set(tickets as i64);
            self.ticket_room
                .with_label_values(&[iface, room])
                .set(rooms.reserve as i64);
        }
        let shared = held.get(usize::from(SHARED)).copied().unwrap_or(0);
        self.tickets
            .with_label_values(&[iface, SHARED_ROOM])
            .set(shared as i64);
        self.ticket_room
            .with_label_values(&[iface, SHARED_ROOM])
            .set(rooms.shared as i64);
        let proven = held.get(usize::from(PROVEN)).copied().unwrap_or(0);
        self.tickets
            .with_label_values(&[iface, PROVEN_ROOM])
            .set(proven as i64);
        self.ticket_room
            .with_label_values(&[iface, PROVEN_ROOM])
            .set(rooms.proven as i64);
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
mod tests;
