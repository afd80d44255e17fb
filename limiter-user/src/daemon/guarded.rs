//! Guarded enforcement in the daemon: guard periods (`crate::guard`)
//! judged at the end of every tick, and the automatic return to dry-run
//! when a guard is breached.
//!
//! The global period (`mode enforce --guard`, or `[limits] guards` at
//! start-up and on reload) is judged on every interface's figures
//! together and rolls the global mode back. A rule's period (`rule set
//! ... --guard`, or `guards` in its section) is judged on that rule's
//! figures (its sources, its drop counter, against every judged frame)
//! and rolls that rule alone back to dry-run.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use limiter_common::{rules::rules_base, Outcome};
use tracing::{error, info};

use super::{events, state::Daemon};
use crate::{
    config::RuleSection,
    guard::{Breach, GuardPeriod, GuardState, Plan, Sample, Step},
    proto::{GuardRollback, GuardStatus, GuardValue, RuleEdit},
};

/// The scope label of the global guard.
pub const GLOBAL: &str = "global";

/// What a guard period watches.
#[derive(Clone, Debug)]
pub enum Target {
    Global,
    /// The rule with this prefix and match (`RuleSection::same_rule`;
    /// no cidr: the default rule), wherever it is in the rules now.
    Rule(Box<RuleSection>),
}

/// A guard period of the daemon, with what it needs beyond the pure
/// evaluator.
pub struct GuardRun {
    /// `global` or the rule's name when the period started.
    pub(super) scope: String,
    target: Target,
    pub(super) period: GuardPeriod<Instant>,
    /// Started by a change made with `--save`: the rollback is saved
    /// too, so that a restart does not re-enforce what was just seen to
    /// hurt (a period from the file alone leaves the file to its owner).
    save: bool,
    rolled_back_at: Option<SystemTime>,
    /// The rule generation the window's samples were read under: a push
    /// resets the rule drop counters, and the window with them.
    generation: u32,
}

/// Frames the kernel judged (every verdict) and dropped (limit or deny).
const JUDGED: [Outcome; 5] = [
    Outcome::Passed,
    Outcome::Allowed,
    Outcome::DryRunWouldDrop,
    Outcome::DroppedLimit,
    Outcome::DroppedDeny,
];
const DROPPED: [Outcome; 2] = [Outcome::DroppedLimit, Outcome::DroppedDeny];

impl Daemon {
    fn new_run(
        &self,
        scope: String,
        target: Target,
        (guards, period): Plan,
        save: bool,
    ) -> GuardRun {
        let shown: Vec<String> = guards.iter().map(ToString::to_string).collect();
        info!(scope, guards = ?shown, period = %humantime::format_duration(period), "guard period started");
        self.metrics.set_guard_state(&scope, GuardState::Watching);
        GuardRun {
            scope,
            target,
            period: GuardPeriod::new(guards, period, Instant::now()),
            save,
            rolled_back_at: None,
            generation: self.generation,
        }
    }

    /// Replaces the global guard period: `plan` starts a new one (its
    /// guards and length), `None` ends any running one.
    pub(super) fn start_guard(&mut self, plan: Option<Plan>, save: bool) {
        self.guard = plan.map(|plan| self.new_run(GLOBAL.into(), Target::Global, plan, save));
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
    /// (then says which: `rules[0] guarded for 10m by ...`).
    pub(super) fn start_rule_guard(
        &mut self,
        position: usize,
        section: RuleSection,
        save: bool,
    ) -> Option<String> {
        let name = self
            .config
            .rules
            .name(position)
            .map_or_else(|| section.effective_name(), str::to_string);
        self.end_rule_guard(&section);
        // Validated with the rest of the rules: the plan reads.
        let plan = section.guard_plan(&name, position == 0).ok()??;
        let said = format!(
            "{name} guarded for {} by {}",
            humantime::format_duration(plan.1),
            section.guards.join(", ")
        );
        let run = self.new_run(name, Target::Rule(Box::new(section)), plan, save);
        self.rule_guards.push(run);
        Some(said)
    }

    /// Ends the guard period of the rule `section` names, if it has one.
    pub(super) fn end_rule_guard(&mut self, section: &RuleSection) {
        let metrics = &self.metrics;
        self.rule_guards.retain(|run| match &run.target {
            Target::Rule(rule) if same(rule, section) => {
                metrics.set_guard_state(&run.scope, GuardState::None);
                false
            }
            _ => true,
        });
    }

    /// The position of the rule `section` names in the rules in force.
    pub(super) fn position(&self, section: &RuleSection) -> Option<usize> {
        if section.cidr.is_none() {
            return Some(0);
        }
        let rules = &self.config.file.rules;
        rules.iter().position(|r| same(r, section)).map(|i| i + 1)
    }

    /// The figures of this tick, all interfaces together: `rule` the
    /// `RULES` index of a rule to read that rule's sources and drops
    /// (else every source and every drop).
    fn guard_sample(&self, rule: Option<u32>) -> Sample {
        let mut sample = Sample::default();
        for snapshot in self.ifaces.iter().filter_map(|i| i.observed.snapshot()) {
            let sum = |outcomes: &[Outcome]| -> u64 {
                outcomes
                    .iter()
                    .filter_map(|o| snapshot.outcomes.get(*o as usize))
                    .map(|c| c.packets)
                    .sum()
            };
            sample.judged_total += sum(&JUDGED);
            match rule {
                None => {
                    sample.tracked += snapshot.tracked_sources;
                    sample.limited += snapshot.limited.len() as u64;
                    sample.dropped_total += sum(&DROPPED);
                }
                Some(index) => {
                    let sources = snapshot
                        .rule_sources
                        .get(&index)
                        .copied()
                        .unwrap_or_default();
                    sample.tracked += sources.tracked;
                    sample.limited += sources.limited;
                    sample.dropped_total += snapshot
                        .rule_drops
                        .get(index as usize)
                        .copied()
                        .unwrap_or(0);
                }
            }
        }
        sample
    }

    /// Judges every guard period on this tick's figures (the end of
    /// [`Daemon::tick`]); rolls back what is breached.
    pub(super) fn check_guards(&mut self) {
        let now = Instant::now();
        let sample = self.guard_sample(None);
        if let Some(run) = self.guard.as_mut() {
            if let Some(breach) = step(run, now, sample) {
                let save = run.save;
                self.roll_back(breach, save);
            } else if run.period.state == GuardState::Passed {
                self.metrics.set_guard_state(GLOBAL, GuardState::Passed);
            }
        }
        let mut breached = Vec::new();
        let mut gone = Vec::new();
        for i in 0..self.rule_guards.len() {
            let Target::Rule(section) = &self.rule_guards[i].target else {
                continue;
            };
            let Some(position) = self.position(section) else {
                gone.push(i);
                continue;
            };
            let index = rules_base(self.generation) + position as u32;
            let sample = self.guard_sample(Some(index));
            let generation = self.generation;
            let run = &mut self.rule_guards[i];
            if run.generation != generation {
                run.period.restart_window();
                run.generation = generation;
            }
            let was = run.period.state;
            if let Some(breach) = step(run, now, sample) {
                breached.push((position, breach, run.save, run.scope.clone()));
            } else if was != run.period.state {
                self.metrics.set_guard_state(&run.scope, run.period.state);
            }
        }
        for i in gone.into_iter().rev() {
            let run = self.rule_guards.remove(i);
            self.metrics.set_guard_state(&run.scope, GuardState::None);
        }
        for (position, breach, save, scope) in breached {
            self.roll_back_rule(position, &scope, breach, save);
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

/// Whether `a` and `b` name the same rule (both the default rule, or the
/// same prefix and match).
fn same(a: &RuleSection, b: &RuleSection) -> bool {
    match (a.cidr, b.cidr) {
        (None, None) => true,
        (Some(_), Some(_)) => a.same_rule(b),
        _ => false,
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
