//! The daemon's state: the configuration in force, one [`Iface`] per
//! protected interface, the rule generation they all run and the names of
//! its rules, and the metrics. Every change of rules goes through
//! [`Daemon::push`]; every tick through `Daemon::tick` (`tick.rs`).

use std::{collections::BTreeSet, time::Instant};

use limiter_common::{rules::rules_base, Outcome, SourceKey};
use tracing::{error, info, warn};

use super::{
    aggregate::{Snapshot, Sweep},
    history::History,
    known::Known,
    metrics::{Metrics, RuleLevels},
    rule_table::SharedRuleTable,
    startup::{apply_overrides, RunOptions},
};
use crate::{
    config::{self, Config},
    kernel::{
        push::{push_all, PushError},
        read,
        windows::Reclaim,
        Instance,
    },
    rules::RuleSet,
};

/// Everything the running daemon holds.
pub struct Daemon {
    /// The command line, whose overrides apply to every configuration read.
    pub(super) options: RunOptions,
    pub(super) config: Config,
    pub(super) ifaces: Vec<Iface>,
    /// The rule generation every interface runs.
    pub(super) generation: u32,
    /// The rules of the live generation and the one before it, by
    /// `RULES` index, shared with the event watchers and the cluster sync.
    pub(super) rules: SharedRuleTable,
    pub(super) metrics: Metrics,
    /// The distribution of per-source rates over `[daemon] history`
    /// (`suggest`).
    pub(super) history: History,
    /// A sample of the sources read past the cheap tier (`known`): what
    /// the history counts and guards judge.
    pub(super) known: Known,
    /// The cluster sync's live state, for `status` (`None` without
    /// `[cluster]`).
    pub(super) cluster_live: Option<super::sync::SharedLive>,
    /// The global guard period, running or the last one (`guarded`).
    pub(super) guard: Option<super::guarded::GuardRun>,
    /// The rules' guard periods, running or the last ones.
    pub(super) rule_guards: Vec<super::guarded::GuardRun>,
    /// Each guard scope's automatic rollbacks of the last hour.
    pub(super) rollback_budgets:
        std::collections::HashMap<String, crate::guard::RollbackBudget<Instant>>,
    /// The `[[lists]]` the kernel holds.
    pub(super) live_lists: super::lists::LiveLists,
    /// When the next ban ends, and how many are in force.
    pub(super) ban_book: super::bans::BanBook,
    /// `net.ipv4.tcp_syncookies` while the windows' tickets are taken.
    pub(super) shield: super::shield::Shield,
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
        let shield = super::shield::Shield::new(config.daemon.syncookie_shield);
        Self {
            options,
            config,
            ifaces: instances.into_iter().map(Iface::new).collect(),
            generation: 0,
            rules: SharedRuleTable::default(),
            metrics: Metrics::new(),
            history: History::new(horizon),
            known: Known::default(),
            cluster_live: None,
            guard: None,
            rule_guards: Vec::new(),
            rollback_budgets: std::collections::HashMap::new(),
            live_lists: super::lists::LiveLists::default(),
            ban_book: super::bans::BanBook::default(),
            shield,
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
            if let Ok(table) = self.rules.read() {
                record_level_drops(&mut self.metrics, instance, table.levels());
            }
        }
        let mut maps: Vec<_> = self
            .ifaces
            .iter_mut()
            .map(|i| &mut i.instance.program.maps)
            .collect();
        let pushed = push_all(&mut maps, rules)?;
        let generation = pushed.generation;
        let base = rules_base(generation);
        self.metrics.rules_pushed(base);
        self.metrics.record_rule_limits(&rule_limits(rules));
        self.generation = generation;
        self.known.set_rules(rules, &pushed.compiled, base);
        if let Ok(mut table) = self.rules.write() {
            table.replace(rules, base);
        }
        Ok(generation)
    }

    /// The names of both generations' rule indices.
    pub(super) fn names(&self) -> Vec<(u32, String)> {
        self.rules.read().map(|t| t.names()).unwrap_or_default()
    }

    /// The position of `RULES` index `index` in the live rule set (0: the
    /// default rule, `i + 1`: `rules[i]`), if it belongs to it.
    pub(super) fn rule_position(&self, index: u32) -> Option<usize> {
        let position = index.checked_sub(rules_base(self.generation))? as usize;
        (position <= self.config.rules.rules.len()).then_some(position)
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
        // Read before anything changes: a list that cannot be read
        // rejects the reload.
        let lists = match self.read_lists(&fresh.file.lists) {
            Ok(lists) => lists,
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
        if fresh.crowdsec != self.config.crowdsec {
            warn!("SIGHUP: [crowdsec] settings changed; they take effect on restart");
        }
        let generation = match self.push(&fresh.rules) {
            Ok(generation) => generation,
            Err(e) => {
                error!(error = %e, "SIGHUP: pushing rules failed");
                return None;
            }
        };
        if let Err(e) = self.load_lists(lists) {
            error!(error = %e, "SIGHUP: loading the lists failed; the lists loaded before stay in force");
        }
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

/// Reads the level counters of the rules in `levels` on `instance` (only
/// those: most rules have none) and exports them.
pub(super) fn record_level_drops<'a>(
    metrics: &mut Metrics,
    instance: &Instance,
    levels: impl Iterator<Item = &'a RuleLevels>,
) {
    for rule in levels {
        match read::rule_level_drops(&instance.program.maps, rule.index) {
            Ok(drops) => metrics.record_level_drops(&instance.iface, rule, &drops),
            Err(e) => {
                error!(iface = %instance.iface, error = %e, "reading the level drops failed");
                return;
            }
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
    pub(super) fn update(&mut self, snapshot: Snapshot) {
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
