//! Guarded enforcement in the daemon: the global guard period started by
//! `mode enforce --guard` (or by `[limits] guards` at start-up and on
//! reload), judged at the end of every tick on the interfaces' figures,
//! and the automatic return to dry-run when a guard is breached.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use limiter_common::Outcome;
use tracing::{error, info};

use super::{events, state::Daemon};
use crate::{
    guard::{Breach, Guard, GuardPeriod, GuardState, Sample, Step},
    proto::{GuardRollback, GuardStatus, GuardValue},
};

/// The scope label of the global guard.
pub const GLOBAL: &str = "global";

/// A guard period of the daemon, with what it needs beyond the pure
/// evaluator: whether a rollback is written to the file, and the wall
/// clock of the rollback for `status`.
pub struct GuardRun {
    pub(super) period: GuardPeriod<Instant>,
    /// Started by `mode enforce --save`: the rollback is saved too, so
    /// that a restart does not re-enforce what was just seen to hurt
    /// (a period from the file alone leaves the file to its owner).
    pub(super) save: bool,
    rolled_back_at: Option<SystemTime>,
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
    /// Replaces the global guard period: `plan` starts a new one (its
    /// guards and length), `None` ends any running one.
    pub(super) fn start_guard(&mut self, plan: Option<(Vec<Guard>, Duration)>, save: bool) {
        self.guard = plan.map(|(guards, period)| {
            let shown: Vec<String> = guards.iter().map(ToString::to_string).collect();
            info!(scope = GLOBAL, guards = ?shown, period = %humantime::format_duration(period), "guard period started");
            GuardRun {
                period: GuardPeriod::new(guards, period, Instant::now()),
                save,
                rolled_back_at: None,
            }
        });
        let state = self
            .guard
            .as_ref()
            .map_or(GuardState::None, |g| g.period.state);
        self.metrics.set_guard_state(GLOBAL, state);
    }

    /// The figures of this tick, all interfaces together.
    fn guard_sample(&self) -> Sample {
        let mut sample = Sample::default();
        for snapshot in self.ifaces.iter().filter_map(|i| i.observed.snapshot()) {
            let sum = |outcomes: &[Outcome]| -> u64 {
                outcomes
                    .iter()
                    .filter_map(|o| snapshot.outcomes.get(*o as usize))
                    .map(|c| c.packets)
                    .sum()
            };
            sample.tracked += snapshot.tracked_sources;
            sample.limited += snapshot.limited.len() as u64;
            sample.judged_total += sum(&JUDGED);
            sample.dropped_total += sum(&DROPPED);
        }
        sample
    }

    /// Judges the global guards on this tick's figures (the end of
    /// [`Daemon::tick`]); rolls back on a breach.
    pub(super) fn check_guard(&mut self) {
        let sample = self.guard_sample();
        let Some(run) = self.guard.as_mut() else {
            return;
        };
        match run.period.step(Instant::now(), sample) {
            Step::Watching => {}
            Step::Passed => {
                events::guard_passed(GLOBAL, run.period.period);
                self.metrics.set_guard_state(GLOBAL, GuardState::Passed);
            }
            Step::Breached(breach) => {
                run.rolled_back_at = Some(SystemTime::now());
                let save = run.save;
                self.roll_back(breach, save);
            }
        }
    }

    /// Back to dry-run after `breach`, as `mode dry-run` would (with
    /// `save`, written to the file too), and said everywhere: the log's
    /// event, the metrics.
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
            match super::edit::save(
                self.options.config.as_deref(),
                &mut self.config,
                "guard rollback to dry-run",
            ) {
                Ok(message) => info!(scope = GLOBAL, "{message}"),
                Err(message) => error!(scope = GLOBAL, "{message}"),
            }
        }
    }

    /// `status`'s guard block.
    pub(super) fn guard_status(&self) -> Option<GuardStatus> {
        let run = self.guard.as_ref()?;
        let period = &run.period;
        let now = Instant::now();
        Some(GuardStatus {
            scope: GLOBAL.to_string(),
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
        })
    }
}
