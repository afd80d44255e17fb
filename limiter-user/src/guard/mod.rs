//! Guarded enforcement: `METRIC OP VALUE` expressions (`limited_sources <=
//! 1%`, `dropped_share <= 5%`, `dropped_pps < 20000`) that the daemon
//! checks every tick of a guard period after switching to enforce, and
//! whose breach sends it back to dry-run on its own.
//!
//! A guard judges the sources known polite before its period began (the
//! daemon's sample of known sources, `daemon::guarded`), each counted
//! once whatever its rate: a flood of new sources is not among them, and
//! one source flooding is one of them. So a limit that hurts the known
//! clients rolls back, and a flood does not.
//!
//! The parser is shared by the CLI (`mode enforce --guard`), the control
//! protocol (the daemon parses again: a request may come from anything)
//! and the configuration (`[limits] guards`). The evaluator
//! ([`GuardPeriod`]) and the rollback budget ([`RollbackBudget`]) are pure
//! (handed the tick's figures and the time), so their tests run on
//! made-up series of ticks.

use std::{fmt, str::FromStr, time::Duration};

/// How long a guard period lasts unless `--for` says otherwise.
pub const DEFAULT_GUARD_FOR: Duration = Duration::from_secs(600);
/// The shortest guard period: the evaluation window ([`WINDOW`]), so the
/// period judges at least one window of traffic. Short enough for tests
/// to use; an operator will want minutes.
pub const MIN_GUARD_FOR: Duration = Duration::from_secs(5);
/// The longest: a day. A guard that should watch for longer is a
/// monitoring alert, not a rollout.
pub const MAX_GUARD_FOR: Duration = Duration::from_secs(24 * 3600);
/// The rates (`dropped_share`, `dropped_pps`) are the mean of the ticks
/// of the last this long, not the last tick alone: one tick's reads of a
/// few sources would otherwise make one refusal look like a disaster.
pub const WINDOW: Duration = Duration::from_secs(5);
/// `dropped_share` is judged only while this many known sources are
/// sending: below, the mean is noise (and nothing much is being hurt).
pub const MIN_ACTIVE_SOURCES: u64 = 5;
/// The scope label of the global guard (a rule's guard is labelled by the
/// rule's name, which can never be `global`).
pub const GLOBAL: &str = "global";
/// Automatic rollbacks of one scope at most in [`ROLLBACK_SPAN`]: past
/// them a breach is announced and enforcement stays, so that enforcement
/// cannot be made to flap (each rollback opens the door to what the
/// limit held back).
pub const MAX_ROLLBACKS: usize = 3;
pub const ROLLBACK_SPAN: Duration = Duration::from_secs(3600);

/// What a guard measures, of the sources it judges (its known sources).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Known sources being refused: a count, or (with `%`) a share of
    /// the known sources.
    LimitedSources,
    /// The mean over the known sources sending of the share of their
    /// frames dropped, over [`WINDOW`]: each source weighs the same,
    /// whatever its rate.
    DroppedShare,
    /// Frames per second dropped of the known sources, each counted up to
    /// what a typical one sent before the period (the 90th percentile of
    /// their rates then), over [`WINDOW`].
    DroppedPps,
}

impl Metric {
    /// Every metric, as written.
    pub const NAMES: &'static [&'static str] = &["limited_sources", "dropped_share", "dropped_pps"];

    pub fn name(self) -> &'static str {
        match self {
            Metric::LimitedSources => "limited_sources",
            Metric::DroppedShare => "dropped_share",
            Metric::DroppedPps => "dropped_pps",
        }
    }
}

/// The comparison a guard holds to: the guard is kept while
/// `measured OP value` is true and breached when it is false.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Le,
    Lt,
    Ge,
    Gt,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Le => "<=",
            Op::Lt => "<",
            Op::Ge => ">=",
            Op::Gt => ">",
        }
    }

    fn holds(self, measured: f64, value: f64) -> bool {
        match self {
            Op::Le => measured <= value,
            Op::Lt => measured < value,
            Op::Ge => measured >= value,
            Op::Gt => measured > value,
        }
    }
}

/// One guard, parsed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Guard {
    pub metric: Metric,
    pub op: Op,
    /// The threshold: a fraction in [0, 1] when `share`, else a count or
    /// a rate.
    pub value: f64,
    /// The threshold is a share (written with `%`, or `dropped_share`).
    pub share: bool,
    /// Written with `%` (kept to print it back as written).
    pub percent: bool,
}

/// Why a guard expression or period is refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GuardError {
    #[error("malformed guard {text:?}: {reason} (expected METRIC OP VALUE, e.g. \"dropped_share <= 5%\")")]
    Malformed { text: String, reason: String },
    #[error("unknown guard metric {metric:?} in {text:?} (known: {})", Metric::NAMES.join(", "))]
    UnknownMetric { text: String, metric: String },
    #[error("guard {text:?}: {reason}")]
    OutOfRange { text: String, reason: String },
    #[error("guard period {} is outside 5s..=24h", humantime::format_duration(*.0))]
    PeriodOutOfRange(Duration),
    #[error("a guard period (--for, guard_for) needs at least one guard (--guard, guards)")]
    PeriodWithoutGuard,
    #[error("guards watch enforcement: they cannot be given with dry-run")]
    GuardWithDryRun,
}

impl FromStr for Guard {
    type Err = GuardError;

    fn from_str(text: &str) -> Result<Self, GuardError> {
        let malformed = |reason: &str| GuardError::Malformed {
            text: text.to_string(),
            reason: reason.to_string(),
        };
        let out_of_range = |reason: String| GuardError::OutOfRange {
            text: text.to_string(),
            reason,
        };
        // The first comparison character splits the metric from the rest;
        // the two-character operators are tried first.
        let at = text
            .find(['<', '>', '=', '!'])
            .ok_or_else(|| malformed("no comparison (<=, <, >=, >)"))?;
        let (metric, rest) = text.split_at(at);
        let (op, value) = [("<=", Op::Le), (">=", Op::Ge), ("<", Op::Lt), (">", Op::Gt)]
            .into_iter()
            .find_map(|(s, op)| rest.strip_prefix(s).map(|v| (op, v)))
            .ok_or_else(|| malformed("the comparison must be one of <=, <, >=, >"))?;
        let metric = metric.trim();
        if metric.is_empty() {
            return Err(malformed("no metric before the comparison"));
        }
        let metric = match metric {
            "limited_sources" => Metric::LimitedSources,
            "dropped_share" => Metric::DroppedShare,
            "dropped_pps" => Metric::DroppedPps,
            other => {
                return Err(GuardError::UnknownMetric {
                    text: text.to_string(),
                    metric: other.to_string(),
                })
            }
        };
        let value = value.trim();
        let (number, percent) = match value.strip_suffix('%') {
            Some(number) => (number.trim_end(), true),
            None => (value, false),
        };
        if number.is_empty() {
            return Err(malformed("no value after the comparison"));
        }
        let number: f64 = number
            .parse()
            .ok()
            .filter(|n: &f64| n.is_finite())
            .ok_or_else(|| malformed(&format!("{number:?} is not a number")))?;
        if number < 0.0 {
            return Err(out_of_range(format!("{number} is negative")));
        }
        let (value, share) = match (metric, percent) {
            (Metric::DroppedPps, true) => {
                return Err(out_of_range(
                    "dropped_pps is a rate in frames per second, not a share: no %".into(),
                ))
            }
            (_, true) if number > 100.0 => {
                return Err(out_of_range(format!("{number}% is above 100%")))
            }
            (_, true) => (number / 100.0, true),
            (Metric::DroppedShare, false) if number > 1.0 => {
                return Err(out_of_range(format!(
                    "dropped_share {number} is above 1 (a fraction in [0, 1], or write a percentage: {number}%)"
                )))
            }
            (Metric::DroppedShare, false) => (number, true),
            (_, false) => (number, false),
        };
        Ok(Guard {
            metric,
            op,
            value,
            share,
            percent,
        })
    }
}

impl fmt::Display for Guard {
    /// The guard as it can be written again (`dropped_share <= 5%`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}",
            self.metric.name(),
            self.op.as_str(),
            self.show(self.value)
        )
    }
}

impl Guard {
    /// `value` in this guard's unit (`5%`, `3`, `1200`).
    pub fn show(&self, value: f64) -> String {
        if self.percent || (self.share && self.metric == Metric::LimitedSources) {
            format!("{}%", round(value * 100.0))
        } else {
            round(value).to_string()
        }
    }

    /// What this guard measures of `figures`, in its unit (a share as a
    /// fraction); `None` when there is not enough to judge (no known
    /// source for a share of them, fewer than [`MIN_ACTIVE_SOURCES`]
    /// sending for a share of frames, less than half a second of ticks
    /// for a rate).
    pub fn measure(&self, figures: &Figures) -> Option<f64> {
        match self.metric {
            Metric::LimitedSources if self.share => {
                (figures.known > 0).then(|| figures.limited as f64 / figures.known as f64)
            }
            Metric::LimitedSources => Some(figures.limited as f64),
            Metric::DroppedShare => {
                (figures.active >= MIN_ACTIVE_SOURCES).then_some(figures.dropped_share)
            }
            Metric::DroppedPps => (figures.seconds >= 0.5).then_some(figures.dropped_pps),
        }
    }

    /// Whether `measured` keeps this guard.
    pub fn holds(&self, measured: f64) -> bool {
        self.op.holds(measured, self.value)
    }
}

/// Rounds for display: shares to 0.01 %, counts and rates to 0.01.
fn round(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

/// A guard period to run: its guards and how long.
pub type Plan = (Vec<Guard>, Duration);

/// Parses every guard of `texts`.
pub fn parse_all<S: AsRef<str>>(texts: &[S]) -> Result<Vec<Guard>, GuardError> {
    texts.iter().map(|t| t.as_ref().parse()).collect()
}

/// Checks a guarded mode change: guards only with enforce, a period only
/// with guards and within [`MIN_GUARD_FOR`]..=[`MAX_GUARD_FOR`]. The
/// period to run (`None`: no guard).
pub fn check_plan(
    dry_run: bool,
    guards: &[Guard],
    period: Option<Duration>,
) -> Result<Option<Duration>, GuardError> {
    if guards.is_empty() {
        return match period {
            Some(_) => Err(GuardError::PeriodWithoutGuard),
            None => Ok(None),
        };
    }
    if dry_run {
        return Err(GuardError::GuardWithDryRun);
    }
    let period = period.unwrap_or(DEFAULT_GUARD_FOR);
    if !(MIN_GUARD_FOR..=MAX_GUARD_FOR).contains(&period) {
        return Err(GuardError::PeriodOutOfRange(period));
    }
    Ok(Some(period))
}

mod period;

pub use period::*;

#[cfg(test)]
mod tests;
