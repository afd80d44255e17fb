//! Guarded enforcement in the daemon: guard periods (`crate::guard`)
//! judged at the end of every tick, and the automatic return to dry-run
//! when a guard is breached.
//!
//! A period judges its **known sources**: the sources of its scope in the
//! daemon's sample (`known`) read in the history's horizon before the
//! period began and never refused in it, each with its rate then. A flood
//! of new sources is not among them; a source over the limit before is
//! not either; one that turns to flooding is one of them, whatever its
//! rate. So a limit that hurts the clients the daemon knew rolls back, and
//! a flood does not. A period that begins knowing fewer than
//! [`MIN_KNOWN`] (the daemon just started) takes in, during its first
//! [`WINDOW`], the sources of its scope read without being refused.
//!
//! The global period (`mode enforce --guard`, or `[limits] guards` at
//! start-up and on reload) judges every known source and rolls the global
//! mode back. A rule's period (`rule set ... --guard`, or `guards` in its
//! section) judges that rule's (by its name) and rolls that rule alone
//! back to dry-run. A scope rolls back at most `MAX_ROLLBACKS` times an
//! hour (`RollbackBudget`); past that a breach is announced and
//! enforcement stays.

use std::{
    collections::HashMap,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use limiter_common::SourceKey;
use tracing::{error, info, warn};

use super::{events, known::Known, state::Daemon};
use crate::{
    config::RuleSection,
    guard::{Breach, GuardPeriod, GuardState, Plan, Sample, Step, GLOBAL, WINDOW},
    proto::{GuardRollback, GuardStatus, GuardValue, RuleEdit},
};

/// A period knowing fewer sources than this when it begins takes in the
/// polite sources read in its first [`WINDOW`].
pub const MIN_KNOWN: usize = 10;

/// What a guard period watches.
#[derive(Clone, Debug)]
pub enum Target {
    Global,
    /// The rule with this name, wherever it is in the rules now.
    Rule(String),
}

/// The sources a period judges, each with its rate before the period.
struct Cohort {
    members: HashMap<SourceKey, u64>,
    /// What one member's drops count up to in `dropped_pps`: the 90th
    /// percentile of the members' rates before the period.
    cap: u64,
    /// While forming (too few known at the start): until when.
    forming_until: Option<Instant>,
    started_ns: u64,
}

impl Cohort {
    /// The sources of `scope` read within `lookback` before `now_ns` and
    /// never refused in it. The clock counts from boot: within `lookback`
    /// of boot the lookback starts at 0, and a source never refused
    /// (`refused_ns` 0) is one of them.
    fn known_before(known: &Known, scope: &Target, now_ns: u64, lookback: Duration) -> Self {
        let since = now_ns.saturating_sub(lookback.as_nanos() as u64);
        let members: HashMap<SourceKey, u64> = known
            .iter()
            .filter(|(_, s)| in_scope(scope, &s.rule))
            .filter(|(_, s)| s.last_ns >= since && (s.refused_ns == 0 || s.refused_ns < since))
            .map(|(key, s)| (*key, s.pps))
            .collect();
        let forming_until = (members.len() < MIN_KNOWN).then(|| Instant::now() + WINDOW);
        let mut cohort = Self {
            members,
            cap: 0,
            forming_until,
            started_ns: now_ns,
        };
        cohort.set_cap();
        cohort
    }

    fn set_cap(&mut self) {
        let mut rates: Vec<u64> = self.members.values().copied().collect();
        rates.sort_unstable();
        let at = (rates.len() * 9 / 10).min(rates.len().saturating_sub(1));
        self.cap = rates.get(at).copied().unwrap_or(0).max(1);
    }

    /// While forming: takes in the sources of `scope` read since the
    /// period began and not refused since.
    fn form(&mut self, known: &Known, scope: &Target, now: Instant) {
        let Some(until) = self.forming_until else {
            return;
        };
        for (key, s) in known.iter() {
            if in_scope(scope, &s.rule)
                && s.last_ns >= self.started_ns
                && s.refused_ns < self.started_ns
            {
                self.members.entry(*key).or_insert(s.pps);
            }
        }
        self.set_cap();
        if now >= until {
            self.forming_until = None;
        }
    }

    /// This tick's figures of the members: a read older than `fresh_ns`
    /// says nothing of now.
    fn sample(&self, known: &Known, now_ns: u64, fresh_ns: u64) -> Sample {
        let mut sample = Sample {
            known: self.members.len() as u64,
            ..Sample::default()
        };
        let mut shares = 0.0;
        for key in self.members.keys() {
            let Some(s) = known.get(key) else {
                continue;
            };
            if now_ns.saturating_sub(s.last_ns) > fresh_ns {
                continue;
            }
            if s.refused {
                sample.limited += 1;
            }
            if s.pps > 0 {
                sample.active += 1;
                shares += (s.drop_pps as f64 / s.pps as f64).min(1.0);
                sample.dropped_pps += s.drop_pps.min(self.cap) as f64;
            }
        }
        if sample.active > 0 {
            sample.dropped_share = shares / sample.active as f64;
        }
        sample
    }
}

fn in_scope(scope: &Target, rule: &str) -> bool {
    match scope {
        Target::Global => true,
        Target::Rule(name) => name == rule,
    }
}

/// A guard period of the daemon, with what it needs beyond the pure
/// evaluator.
pub struct GuardRun {
    /// `global` or the rule's name.
    pub(super) scope: String,
    target: Target,
    pub(super) period: GuardPeriod<Instant>,
    cohort: Cohort,
    /// Started by a change made with `--save`: the rollback is saved
    /// too, so that a restart does not re-enforce what was just seen to
    /// hurt (a period from the file alone leaves the file to its owner).
    save: bool,
    rolled_back_at: Option<SystemTime>,
}

impl GuardRun {
    /// The known sources the period judges.
    pub(super) fn known_sources(&self) -> usize {
        self.cohort.members.len()
    }
}

impl Daemon {
    /// At start-up: with `[limits] guards` and enforce, a guard period
    /// (the file was validated, so the plan reads), and each rule's.
    pub(super) fn start_configured_guards(&mut self) {
        match self.config.file.limits.guard_plan() {
            Ok(plan) => self.start_guard(plan, false),
            Err(e) => warn!(error = %e, "the configuration's guards do not read; no guard period"),
        }
        self.start_rule_guards();
    }

    fn new_run(&self, target: Target, (guards, period): Plan, save: bool) -> GuardRun {
        let scope = match &target {
            Target::Global => GLOBAL.to_string(),
            Target::Rule(name) => name.clone(),
        };
        let now_ns = crate::kernel::now().as_nanos() as u64;
        let cohort = Cohort::known_before(&self.known, &target, now_ns, self.history.horizon());
        let shown: Vec<String> = guards.iter().map(ToString::to_string).collect();
        info!(
            event = "guard_started",
            scope,
            guards = %shown.join(", "),
            period = %humantime::format_duration(period),
            known_sources = cohort.members.len(),
            "guard period started"
        );
        self.metrics.set_guard_state(&scope, GuardState::Watching);
        GuardRun {
            scope,
            target,
            period: GuardPeriod::new(guards, period, Instant::now()),
            cohort,
            save,
            rolled_back_at: None,
        }
    }

    /// Replaces the global guard period: `plan` starts a new one (its
    /// guards and length), `None` ends any running one.
    pub(super) fn start_guard(&mut self, plan: Option<Plan>, save: bool) {
        self.guard = plan.map(|plan| self.new_run(Target::Global, plan, save));
        if self.guard.is_none() {
            self.metrics.set_guard_state(GLOBAL, GuardState::None);
        }
    }

    /// Ends every rule's guard period and starts those the rules in force
    /// ask for (start-up, reload).
    pub(super) fn start_rule_guards(&mut self) {
        for run in std::mem::take(&mut self.rule_guards) {
            self.metrics.set_guard_state(&run.scope, GuardState::None);
        }
        let file = &self.config.file;
        let sections: Vec<(usize, RuleSection)> = std::iter::once(&file.default)
            .chain(&file.rules)
            .cloned()
            .enumerate()
            .collect();
        for (position, section) in sections {
            self.start_rule_guard(position, section, false);
        }
    }

    /// After an edit that set the rule at `position` to `section`: ends
    /// that rule's guard period, and starts the one it asks for, if any
    /// (then says which: `web guarded for 10m by ...`).
    pub(super) fn start_rule_guard(
        &mut self,
        position: usize,
        section: RuleSection,
        save: bool,
    ) -> Option<String> {
        let name = self.config.rules.name(position)?.to_string();
        self.end_rule_guard(&name);
        // Validated with the rest of the rules: the plan reads.
        let plan = section.guard_plan(&name, position == 0).ok()??;
        let run = self.new_run(Target::Rule(name.clone()), plan, save);
        let said = format!(
            "{name} guarded for {} by {}, judging {} known sources",
            humantime::format_duration(run.period.period),
            section.guards.join(", "),
            run.cohort.members.len()
        );
        self.rule_guards.push(run);
        Some(said)
    }

    /// Ends the guard period of the rule named `name`, if it has one.
    pub(super) fn end_rule_guard(&mut self, name: &str) {
        let metrics = &self.metrics;
        self.rule_guards.retain(|run| match &run.target {
            Target::Rule(rule) if rule == name => {
                metrics.set_guard_state(&run.scope, GuardState::None);
                false
            }
            _ => true,
        });
    }

    /// Ends the guard periods of rules no longer in force.
    pub(super) fn end_gone_rule_guards(&mut self) {
        let gone: Vec<String> = self
            .rule_guards
            .iter()
            .filter_map(|run| match &run.target {
                Target::Rule(name) if self.config.rules.position(name).is_none() => {
                    Some(name.clone())
                }
                _ => None,
            })
            .collect();
        for name in gone {
            self.end_rule_guard(&name);
        }
    }

    /// The position of the rule `section` names in the rules in force.
    pub(super) fn position(&self, section: &RuleSection) -> Option<usize> {
        if section.cidr.is_none() {
            return Some(0);
        }
        let rules = &self.config.file.rules;
        rules
            .iter()
            .position(|r| r.same_rule(section))
            .map(|i| i + 1)
    }

    /// How old a source's read may be to say something of now: a few
    /// ticks (windows are read every third).
    fn fresh_ns(&self) -> u64 {
        (self.config.daemon.tick * 4)
            .max(Duration::from_secs(2))
            .as_nanos() as u64
    }

    /// Judges every guard period on this tick's figures (the end of
    /// [`Daemon::tick`]); rolls back what is breached, within each
    /// scope's rollback budget.
    pub(super) fn check_guards(&mut self) {
        let now = Instant::now();
        let now_ns = crate::kernel::now().as_nanos() as u64;
        let fresh_ns = self.fresh_ns();
        let known = &self.known;
        let mut breached = Vec::new();
        for run in self.guard.iter_mut().chain(self.rule_guards.iter_mut()) {
            run.cohort.form(known, &run.target, now);
            let sample = run.cohort.sample(known, now_ns, fresh_ns);
            let was = run.period.state;
            if let Some(breach) = step(run, now, sample) {
                breached.push((run.target.clone(), run.scope.clone(), breach, run.save));
            } else if was != run.period.state {
                self.metrics.set_guard_state(&run.scope, run.period.state);
            }
        }
        for (target, scope, breach, save) in breached {
            let allowed = self
                .rollback_budgets
                .entry(scope.clone())
                .or_default()
                .take(now);
            if !allowed {
                events::guard_withheld(&scope, &breach);
                self.metrics.set_guard_state(&scope, GuardState::Withheld);
                if let Some(run) = self.run_mut(&target) {
                    run.period.state = GuardState::Withheld;
                }
                continue;
            }
            match target {
                Target::Global => self.roll_back(breach, save),
                Target::Rule(name) => {
                    if let Some(position) = self.config.rules.position(&name) {
                        self.roll_back_rule(position, &scope, breach, save);
                    }
                }
            }
        }
    }

    fn run_mut(&mut self, target: &Target) -> Option<&mut GuardRun> {
        match target {
            Target::Global => self.guard.as_mut(),
            Target::Rule(name) => self
                .rule_guards
                .iter_mut()
                .find(|r| matches!(&r.target, Target::Rule(n) if n == name)),
        }
    }

    /// Back to global dry-run after `breach`, as `mode dry-run` would
    /// (with `save`, written to the file too), and said everywhere: the
    /// log's event, the metrics.
    fn roll_back(&mut self, breach: Breach, save: bool) {
        events::guard_rolled_back(GLOBAL, &breach);
        self.metrics.guard_rolled_back(GLOBAL);
        let mut rules = self.config.rules.clone();
        rules.dry_run = true;
        match self.push(&rules) {
            Ok(generation) => {
                self.config.rules = rules;
                self.config.file.limits.dry_run = true;
                info!(
                    scope = GLOBAL,
                    generation, "back in dry-run after the guard's breach"
                );
            }
            Err(e) => {
                // The state says rolled back so the alert fires; the
                // operator must act: enforcement could not be lifted.
                error!(scope = GLOBAL, error = %e, "rolling back to dry-run failed: still enforcing");
                return;
            }
        }
        if save {
            self.save_rollback(GLOBAL);
        }
    }

    /// The rule at `position` back to dry-run after `breach` (its guards
    /// kept in its section: a dry-run rule's guards wait for it to
    /// enforce again).
    fn roll_back_rule(&mut self, position: usize, scope: &str, breach: Breach, save: bool) {
        events::guard_rolled_back(scope, &breach);
        self.metrics.guard_rolled_back(scope);
        let file = &self.config.file;
        let mut rule = match position {
            0 => file.default.clone(),
            p => file.rules[p - 1].clone(),
        };
        rule.dry_run = Some(true);
        let edit = match position {
            0 => RuleEdit::Default { rule },
            _ => RuleEdit::Set { rule },
        };
        match self.apply_edit(edit) {
            Ok(done) => info!(scope, "back in dry-run after the guard's breach: {done}"),
            Err(e) => {
                error!(scope, error = %e, "rolling the rule back to dry-run failed: it still enforces");
                return;
            }
        }
        if save {
            self.save_rollback(scope);
        }
    }

    fn save_rollback(&mut self, scope: &str) {
        match super::edit::save(
            self.options.config.as_deref(),
            &mut self.config,
            "guard rollback to dry-run",
        ) {
            Ok(message) => info!(scope, "{message}"),
            Err(message) => error!(scope, "{message}"),
        }
    }

    /// `status`'s guard blocks: the global one, and the rules' ones.
    pub(super) fn guard_status(&self) -> (Option<GuardStatus>, Vec<GuardStatus>) {
        let now = Instant::now();
        (
            self.guard.as_ref().map(|run| run_status(run, now)),
            self.rule_guards
                .iter()
                .map(|run| run_status(run, now))
                .collect(),
        )
    }
}

/// One tick of `run`: the breach to roll back, if any; the events of a
/// period that ends.
fn step(run: &mut GuardRun, now: Instant, sample: Sample) -> Option<Breach> {
    match run.period.step(now, sample) {
        Step::Watching => None,
        Step::Passed => {
            events::guard_passed(&run.scope, run.period.period);
            None
        }
        Step::Breached(breach) => {
            run.rolled_back_at = Some(SystemTime::now());
            Some(breach)
        }
    }
}

fn run_status(run: &GuardRun, now: Instant) -> GuardStatus {
    let period = &run.period;
    GuardStatus {
        scope: run.scope.clone(),
        known_sources: run.cohort.members.len() as u64,
        state: period.state.as_str().to_string(),
        period: period.period,
        remaining_s: period.remaining(now).as_secs(),
        guards: period
            .guards
            .iter()
            .zip(&period.last)
            .map(|(guard, last)| GuardValue {
                guard: guard.to_string(),
                last: last.map(|v| guard.show(v)),
                last_value: *last,
            })
            .collect(),
        rollback: period.breach.map(|(breach, at)| GuardRollback {
            guard: breach.guard.to_string(),
            measured: breach.guard.show(breach.measured),
            measured_value: breach.measured,
            at_unix_s: run
                .rolled_back_at
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs()),
            ago_s: now.saturating_duration_since(at).as_secs(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::Config,
        daemon::{history::History, known::Reading},
        rules::compile,
    };

    /// Sources read in the first minutes after boot, the lookback an
    /// hour: the lookback reaches back past boot.
    #[test]
    fn sources_known_soon_after_boot_are_judged_unless_refused() {
        let set = Config::parse("[default]\npps = 100\n", "t.toml")
            .unwrap()
            .rules;
        let base = limiter_common::rules::rules_base(1);
        let mut known = Known::with_capacity(100);
        known.set_rules(&set, &compile(&set, base, 1).unwrap(), base);
        let mut history = History::new(Duration::from_secs(3600));
        let minute = 60_000_000_000;
        for i in 0..12u8 {
            let reading = Reading {
                key: SourceKey::v4([192, 0, 2, i]),
                pps: 10,
                refused: i == 0,
                // A hot read (from `SOURCES`), which says refused.
                dropped_total: Some(0),
            };
            known.observe(reading, None, 5 * minute, &mut history);
        }
        let cohort = Cohort::known_before(
            &known,
            &Target::Global,
            6 * minute,
            Duration::from_secs(3600),
        );
        assert_eq!(cohort.members.len(), 11, "all but the refused one");
        assert!(!cohort.members.contains_key(&SourceKey::v4([192, 0, 2, 0])));
    }
}
