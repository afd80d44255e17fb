//! The daemon's state: the configuration in force, one [`Iface`] per
//! protected interface, the rule generation they all run and the names of
//! its rules, and the metrics. Every change of rules goes through
//! [`Daemon::push`]; every tick through [`Daemon::tick`].

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use limiter_common::{
    rules::{rules_base, MAX_RULES},
    Outcome, SourceKey,
};
use tracing::{debug, error, info, warn};

use super::{
    aggregate::{self, Snapshot, Sweep},
    events::{LevelLabels, RuleNames},
    history::{History, SeriesKey},
    known::{Known, Reading},
    level_rates,
    metrics::{Metrics, RuleLevels},
    startup::{apply_overrides, RunOptions},
};
use crate::{
    config::{self, Config},
    kernel::{
        self, penalty,
        push::{push_all, PushError},
        read,
        windows::Reclaim,
        Instance, LinkCheck,
    },
    rules::RuleSet,
};

/// Released sources logged by name per interface and tick; the rest are
/// counted in one line.
const RELEASED_LOGGED_PER_TICK: usize = 16;

/// Everything the running daemon holds.
pub struct Daemon {
    /// The command line, whose overrides apply to every configuration read.
    pub(super) options: RunOptions,
    pub(super) config: Config,
    pub(super) ifaces: Vec<Iface>,
    /// The rule generation every interface runs.
    pub(super) generation: u32,
    /// `RULES` index -> rule name, for the live generation and the one
    /// before it (each in its own half), shared with the event watchers:
    /// counters and events of either resolve to a name.
    pub(super) names: RuleNames,
    /// As `names`, each rule's levels' labels, for the event log.
    pub(super) level_labels: LevelLabels,
    /// `RULES` index -> its rule's levels, for the rules of both
    /// generations that have any (the `level` labels of the metrics).
    pub(super) levels: BTreeMap<u32, RuleLevels>,
    pub(super) metrics: Metrics,
    /// The distribution of per-source rates over `[daemon] history`
    /// (`suggest`).
    pub(super) history: History,
    /// A sample of the sources read past the cheap tier (`known`): what
    /// the history counts and guards judge.
    pub(super) known: Known,
    /// The cluster sync's live state, for `status` (`None` without
    /// `[cluster]`).
    pub(super) cluster_live: Option<super::cluster::SharedLive>,
    /// The global guard period, running or the last one (`guarded`).
    pub(super) guard: Option<super::guarded::GuardRun>,
    /// The rules' guard periods, running or the last ones.
    pub(super) rule_guards: Vec<super::guarded::GuardRun>,
    /// Each guard scope's automatic rollbacks of the last hour.
    pub(super) rollback_budgets:
        std::collections::HashMap<String, crate::guard::RollbackBudget<Instant>>,
}

/// One protected interface and what the daemon has seen of it.
pub struct Iface {
    pub(super) instance: Instance,
    /// The sweep over its per-source map, spread over ticks.
    pub(super) sweep: Sweep,
    /// The walk over its kept windows that deletes the idle ones.
    pub(super) reclaim: Reclaim,
    /// Its last aggregation passes.
    pub(super) observed: Observed,
    /// The sources the last complete sweep saw in an episode of refusals
    /// (`Snapshot::refusing`).
    pub(super) refusing: BTreeSet<SourceKey>,
}

impl Iface {
    pub(super) fn new(instance: Instance) -> Self {
        Self {
            instance,
            sweep: Sweep::default(),
            reclaim: Reclaim::default(),
            observed: Observed::default(),
            refusing: BTreeSet::new(),
        }
    }
}

impl Daemon {
    pub(super) fn new(options: RunOptions, config: Config, instances: Vec<Instance>) -> Self {
        let horizon = config.daemon.history;
        Self {
            options,
            config,
            ifaces: instances.into_iter().map(Iface::new).collect(),
            generation: 0,
            names: RuleNames::default(),
            level_labels: LevelLabels::default(),
            levels: BTreeMap::new(),
            metrics: Metrics::new(),
            history: History::new(horizon),
            known: Known::default(),
            cluster_live: None,
            guard: None,
            rule_guards: Vec::new(),
            rollback_budgets: std::collections::HashMap::new(),
        }
    }

    /// The interfaces' instances, for stopping.
    pub(super) fn into_instances(self) -> Vec<Instance> {
        self.ifaces.into_iter().map(|i| i.instance).collect()
    }

    /// Pushes `rules` to every interface as one generation, or to none.
    /// The drops counted so far are first recorded under the names they
    /// were counted under: the push zeroes the half it writes.
    pub(super) fn push(&mut self, rules: &RuleSet) -> Result<u32, PushError> {
        let names = self.names();
        for iface in &self.ifaces {
            let instance = &iface.instance;
            if let Ok(drops) = read::rule_drops(&instance.program.maps) {
                self.metrics
                    .record_rule_drops(&instance.iface, &drops, &names);
            }
            record_level_drops(&mut self.metrics, instance, &self.levels);
        }
        let mut maps: Vec<_> = self
            .ifaces
            .iter_mut()
            .map(|i| &mut i.instance.program.maps)
            .collect();
        let generation = push_all(&mut maps, rules)?;
        let base = rules_base(generation);
        self.metrics.rules_pushed(base);
        self.metrics.record_rule_limits(&rule_limits(rules));
        self.generation = generation;
        self.known.set_rules(rules);
        if let Ok(mut shared) = self.names.write() {
            shared.retain(|index, _| !(base..base + MAX_RULES).contains(index));
            shared.extend(
                rules
                    .specs()
                    .enumerate()
                    .map(|(i, spec)| (base + i as u32, spec.name.clone())),
            );
        }
        self.levels
            .retain(|index, _| !(base..base + MAX_RULES).contains(index));
        self.levels
            .extend(rule_levels(rules, base).map(|r| (r.index, r)));
        if let Ok(mut shared) = self.level_labels.write() {
            shared.retain(|index, _| !(base..base + MAX_RULES).contains(index));
            shared.extend(rule_levels(rules, base).map(|r| (r.index, r.labels)));
        }
        Ok(generation)
    }

    /// The names of both generations' rule indices.
    pub(super) fn names(&self) -> Vec<(u32, String)> {
        self.names
            .read()
            .map(|n| n.iter().map(|(i, name)| (*i, name.clone())).collect())
            .unwrap_or_default()
    }

    /// The position of `RULES` index `index` in the live rule set (0: the
    /// default rule, `i + 1`: `rules[i]`), if it belongs to it.
    pub(super) fn rule_position(&self, index: u32) -> Option<usize> {
        let position = index.checked_sub(rules_base(self.generation))? as usize;
        (position <= self.config.rules.rules.len()).then_some(position)
    }

    /// One aggregation tick: every interface's link checked (re-attached to
    /// a re-created interface), then its next sweep slice read and
    /// exported.
    pub(super) fn tick(&mut self) {
        let started = Instant::now();
        let names = self.names();
        // One series key per rule index, built once a tick (not once a
        // source).
        let series: std::collections::HashMap<u32, SeriesKey> = names
            .iter()
            .map(|(index, name)| (*index, SeriesKey::rule(name)))
            .collect();
        let daemon = &self.config.daemon;
        for iface in &mut self.ifaces {
            check_link(&mut iface.instance, daemon.mode);
            let now_ns = kernel::now().as_nanos() as u64;
            let swept = match penalty::sweep(&mut iface.instance.program.maps, now_ns) {
                Ok(swept) => {
                    if !swept.complete {
                        debug!(iface = %iface.instance.iface, counted = swept.penalties, "the sweep of HOLDS stopped at its cap (the map is churning); the penalties gauge is a floor this tick");
                    }
                    Some(swept)
                }
                Err(e) => {
                    error!(iface = %iface.instance.iface, error = %e, "sweeping the penalties failed");
                    None
                }
            };
            let instance = &iface.instance;
            let snapshot = match aggregate::pass(
                &instance.program.maps,
                daemon.top_k,
                &mut iface.sweep,
                daemon.sources_per_tick,
            ) {
                Ok(snapshot) => snapshot,
                Err(e) => {
                    error!(iface = %instance.iface, error = %e, "aggregation failed");
                    continue;
                }
            };
            let mut windowed = Vec::new();
            if let Err(e) = iface.reclaim.step(
                &mut iface.instance.program.maps,
                now_ns,
                daemon.sources_per_tick,
                &mut windowed,
            ) {
                error!(iface = %iface.instance.iface, error = %e, "reading the window maps failed");
            }
            let instance = &iface.instance;
            let mut snapshot = snapshot;
            let history_now = kernel::now();
            let now_ns = history_now.as_nanos() as u64;
            let base = rules_base(self.generation);
            // Each rule's histogram looked up once a tick, not once a
            // source.
            let mut histograms = std::collections::HashMap::new();
            for (rule, reading) in std::mem::take(&mut snapshot.samples) {
                self.known
                    .observe(reading, Some((rule, base)), now_ns, &mut self.history);
                // A source whose state predates every rule generation the
                // daemon knows has no rule to count under.
                let Some(key) = series.get(&rule).filter(|_| reading.pps > 0) else {
                    continue;
                };
                histograms
                    .entry(rule)
                    .or_insert_with(|| self.metrics.source_rate_of(&instance.iface, &key.rule))
                    .observe(reading.pps as f64);
            }
            for (key, pps) in windowed {
                let reading = Reading {
                    key,
                    pps,
                    refused: false,
                    dropped_total: None,
                };
                self.known.observe(reading, None, now_ns, &mut self.history);
            }
            log_released(&instance.iface, &iface.refusing, &snapshot.refusing);
            iface.refusing.clone_from(&snapshot.refusing);
            self.metrics.record(
                &instance.iface,
                &snapshot,
                daemon.max_hot_sources,
                self.config.rules.rules.len() + 1,
                &names,
                instance.program.run_stats(),
            );
            record_level_drops(&mut self.metrics, instance, &self.levels);
            if !self.levels.is_empty() {
                match level_rates::read(
                    instance,
                    self.levels.values(),
                    self.generation,
                    daemon.sources_per_tick,
                    history_now.as_nanos() as u64,
                ) {
                    Ok((live, rates)) => {
                        let keys: Vec<SeriesKey> = live
                            .iter()
                            .map(|l| SeriesKey {
                                rule: l.rule.to_string(),
                                level: Some(l.label.to_string()),
                            })
                            .collect();
                        for (at, pps) in rates {
                            self.history
                                .observe(&keys[at], pps.ceil() as u64, history_now);
                            self.metrics.observe_level_rate(
                                &instance.iface,
                                live[at].rule,
                                live[at].label,
                                pps,
                            );
                        }
                    }
                    Err(e) => {
                        error!(iface = %instance.iface, error = %e, "reading the aggregates' rates failed")
                    }
                }
            }
            self.metrics.record_link(
                &instance.iface,
                instance.reattachments,
                instance.link.is_attached(),
            );
            if let Some(swept) = swept {
                self.metrics
                    .record_penalties(&instance.iface, swept.penalties);
            }
            self.metrics
                .record_windows(&instance.iface, &iface.reclaim, daemon.max_sources);
            iface.observed.update(snapshot);
        }
        self.known
            .forget_older(kernel::now().as_nanos() as u64, self.history.horizon());
        self.metrics
            .record_known(self.known.len(), self.known.sampled_share());
        self.check_guards();
        self.metrics
            .aggregation
            .observe(started.elapsed().as_secs_f64());
    }

    /// Re-reads the configuration file and pushes it; a bad file is
    /// rejected with the reason logged and the running configuration stays
    /// in force. The new generation, or `None` when nothing changed.
    pub(super) fn reload(&mut self) -> Option<u32> {
        let Some(path) = &self.options.config else {
            warn!("SIGHUP: no configuration file to reload (started without --config)");
            return None;
        };
        let mut fresh = match Config::load(path) {
            Ok(fresh) => fresh,
            Err(e) => {
                error!(error = %e, "SIGHUP: configuration rejected; the running one stays in force");
                return None;
            }
        };
        apply_overrides(&mut fresh, &self.options);
        if let Err(e) =
            config::check_frame_sizes(&fresh.rules, &fresh.daemon.interfaces).and_then(|()| {
                config::check_cluster_in_force(&fresh.rules, self.config.cluster.as_ref())
            })
        {
            error!(error = %e, "SIGHUP: configuration rejected; the running one stays in force");
            return None;
        }
        // Checked by validation; read again for the period to start.
        let guard_plan = match fresh.file.limits.guard_plan() {
            Ok(plan) => plan,
            Err(e) => {
                error!(error = %e, "SIGHUP: configuration rejected; the running one stays in force");
                return None;
            }
        };
        if fresh.daemon != self.config.daemon {
            warn!("SIGHUP: [daemon] settings changed; they take effect on restart");
        }
        if fresh.cluster != self.config.cluster {
            warn!("SIGHUP: [cluster] settings changed; they take effect on restart");
        }
        let generation = match self.push(&fresh.rules) {
            Ok(generation) => generation,
            Err(e) => {
                error!(error = %e, "SIGHUP: pushing rules failed");
                return None;
            }
        };
        info!(
            rules = fresh.rules.rules.len() + 1,
            "SIGHUP: configuration reloaded"
        );
        // Later rule edits start from what was reloaded, not from the old
        // file; [daemon] and [cluster] settings keep what the daemon runs
        // with.
        self.config.rules = fresh.rules;
        self.config.file = fresh.file;
        self.config.text = fresh.text;
        // A reload ends any guard period; one into enforce with guards
        // starts a new one.
        self.start_guard(guard_plan, false);
        self.start_rule_guards();
        Some(generation)
    }
}

/// Each rule's name and its per-source packet limit (`None` for a rule
/// that does not limit by packets), for the limit gauge.
fn rule_limits(rules: &RuleSet) -> Vec<(String, Option<u64>)> {
    rules
        .specs()
        .map(|spec| {
            let pps = (spec.action == limiter_common::Action::Limit)
                .then_some(spec.limits.pps)
                .flatten();
            (spec.name.clone(), pps)
        })
        .collect()
}

/// The rules of `rules` pushed at `base` that have levels: each one's
/// `RULES` index, name, and levels' labels (their windows defaulting to
/// the rule's).
fn rule_levels(rules: &RuleSet, base: u32) -> impl Iterator<Item = RuleLevels> + '_ {
    std::iter::once(&rules.default)
        .chain(&rules.rules)
        .enumerate()
        .filter(|(_, spec)| !spec.levels.is_empty())
        .map(move |(i, spec)| RuleLevels {
            index: base + i as u32,
            rule: spec.name.clone(),
            labels: spec
                .levels
                .iter()
                .map(|level| level.label(spec.limits.window))
                .collect(),
        })
}

/// Reads the level counters of the rules in `levels` on `instance` (only
/// those: most rules have none) and exports them.
fn record_level_drops(
    metrics: &mut Metrics,
    instance: &Instance,
    levels: &BTreeMap<u32, RuleLevels>,
) {
    for rule in levels.values() {
        match read::rule_level_drops(&instance.program.maps, rule.index) {
            Ok(drops) => metrics.record_level_drops(&instance.iface, rule, &drops),
            Err(e) => {
                error!(iface = %instance.iface, error = %e, "reading the level drops failed");
                return;
            }
        }
    }
}

/// Logs the sources whose episode of refusals ended: no CPU holds them and
/// none refused them for a second ("limited" comes from the kernel's
/// events, see events.rs, whose episodes end the same way): a few per tick
/// by name, the rest as a count, so a spoofed flood ending cannot flood
/// the log.
fn log_released(iface: &str, before: &BTreeSet<SourceKey>, now: &BTreeSet<SourceKey>) {
    let released: Vec<&SourceKey> = before.difference(now).collect();
    for key in released.iter().take(RELEASED_LOGGED_PER_TICK) {
        info!(event = "source_released", iface, source = %key, "source released");
    }
    if released.len() > RELEASED_LOGGED_PER_TICK {
        info!(
            event = "sources_released",
            iface,
            more = released.len() - RELEASED_LOGGED_PER_TICK,
            "more sources released (not listed)"
        );
    }
}

/// Keeps an instance attached to the interface of its name (re-attaching
/// to a re-created one), logging each change of state once.
fn check_link(instance: &mut Instance, mode: config::AttachMode) {
    let before = instance.link;
    let iface = instance.iface.clone();
    match instance.check_link(mode) {
        Ok(LinkCheck::Reattached) => {
            info!(
                iface,
                mode = instance.attachment.as_str(),
                "re-attached to the re-created interface"
            )
        }
        Ok(LinkCheck::InterfaceGone) if before != LinkCheck::InterfaceGone => {
            warn!(
                iface,
                "the interface vanished; protection resumes when it is back"
            )
        }
        Ok(LinkCheck::Unpinned) if before != LinkCheck::Unpinned => warn!(
            iface,
            "the pinned link was removed by someone else (xdp-limiter detach?); not re-attaching"
        ),
        Ok(_) => {}
        Err(e) => {
            // Retried every tick; said once until the state changes.
            if before != LinkCheck::InterfaceGone {
                error!(iface, error = %e, "re-attaching to the re-created interface failed; retrying every tick");
            }
            instance.link = LinkCheck::InterfaceGone;
        }
    }
}

/// What the last aggregation passes saw of one interface.
#[derive(Default)]
pub struct Observed {
    pub(super) last: Option<(Instant, Snapshot)>,
    pub(super) passed_pps: f64,
    pub(super) dropped_pps: f64,
}

impl Observed {
    fn update(&mut self, snapshot: Snapshot) {
        let now = Instant::now();
        let sum = |s: &Snapshot, outcomes: &[Outcome]| -> u64 {
            outcomes
                .iter()
                .map(|o| s.outcomes[*o as usize].packets)
                .sum()
        };
        let passed = [Outcome::Passed, Outcome::Allowed, Outcome::DryRunWouldDrop];
        let dropped = [Outcome::DroppedLimit, Outcome::DroppedDeny];
        if let Some((then, previous)) = &self.last {
            let seconds = now.duration_since(*then).as_secs_f64().max(1e-3);
            let rate = |outcomes: &[Outcome]| {
                sum(&snapshot, outcomes).saturating_sub(sum(previous, outcomes)) as f64 / seconds
            };
            self.passed_pps = rate(&passed);
            self.dropped_pps = rate(&dropped);
        }
        self.last = Some((now, snapshot));
    }

    /// The last pass's view, if any.
    pub(super) fn snapshot(&self) -> Option<&Snapshot> {
        self.last.as_ref().map(|(_, s)| s)
    }
}
