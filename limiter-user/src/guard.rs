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

use std::{collections::VecDeque, fmt, str::FromStr, time::Duration};

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

/// What one tick saw of the sources a guard judges.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// The known sources it judges.
    pub known: u64,
    /// Of them, being refused (or would-be refused).
    pub limited: u64,
    /// Of them, read sending lately.
    pub active: u64,
    /// The mean over the active ones of the share of their frames
    /// dropped.
    pub dropped_share: f64,
    /// Frames a second dropped of them, each counted up to its cap.
    pub dropped_pps: f64,
}

/// The figures guards are judged on: the latest counts, and the rates'
/// mean over the last [`WINDOW`] of ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    pub known: u64,
    pub limited: u64,
    pub active: u64,
    pub dropped_share: f64,
    pub dropped_pps: f64,
    /// The span of the window, in seconds (0 before a second tick).
    pub seconds: f64,
}

/// Where a guard period stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardState {
    /// No guard (the value 0 of `xdp_limiter_guard_state`).
    None = 0,
    /// In the period, every guard kept so far.
    Watching = 1,
    /// The period ended with no breach: enforcement stays.
    Passed = 2,
    /// A guard was breached: back to dry-run.
    RolledBack = 3,
    /// A guard was breached, and the scope had rolled back
    /// [`MAX_ROLLBACKS`] times within [`ROLLBACK_SPAN`]: announced,
    /// enforcement stays.
    Withheld = 4,
}

impl GuardState {
    pub fn as_str(self) -> &'static str {
        match self {
            GuardState::None => "none",
            GuardState::Watching => "watching",
            GuardState::Passed => "passed",
            GuardState::RolledBack => "rolled-back",
            GuardState::Withheld => "withheld",
        }
    }
}

/// The breach that ended a period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Breach {
    pub guard: Guard,
    pub measured: f64,
}

/// What one tick of a period decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    /// Still watching (or already over: nothing more to do).
    Watching,
    /// The period just ended with every guard kept.
    Passed,
    /// A guard was just breached: roll back.
    Breached(Breach),
}

/// One guard period: its guards, how long it lasts, the samples of its
/// last [`WINDOW`], and how it ended.
#[derive(Clone, Debug)]
pub struct GuardPeriod<T> {
    pub guards: Vec<Guard>,
    pub period: Duration,
    pub started: T,
    pub state: GuardState,
    /// Each guard's last measured value (`None`: not enough to judge).
    pub last: Vec<Option<f64>>,
    /// The breach, once rolled back, and when.
    pub breach: Option<(Breach, T)>,
    samples: VecDeque<(T, Sample)>,
}

/// The clock a period runs on: `Instant` in the daemon, plain seconds in
/// the tests.
pub trait Clock: Copy {
    /// `self - earlier`, saturating at zero.
    fn since(self, earlier: Self) -> Duration;
}

impl Clock for std::time::Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl Clock for Duration {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_sub(earlier)
    }
}

impl<T: Clock> GuardPeriod<T> {
    pub fn new(guards: Vec<Guard>, period: Duration, started: T) -> Self {
        Self {
            last: vec![None; guards.len()],
            guards,
            period,
            started,
            state: GuardState::Watching,
            breach: None,
            samples: VecDeque::new(),
        }
    }

    /// Time left in the period at `now` (zero once over).
    pub fn remaining(&self, now: T) -> Duration {
        if self.state != GuardState::Watching {
            return Duration::ZERO;
        }
        self.period.saturating_sub(now.since(self.started))
    }

    /// The figures of the window ending with the newest sample.
    pub fn figures(&self) -> Figures {
        let (Some((first_at, _)), Some((last_at, last))) =
            (self.samples.front(), self.samples.back())
        else {
            return Figures::default();
        };
        let n = self.samples.len() as f64;
        let mean = |f: fn(&Sample) -> f64| self.samples.iter().map(|(_, s)| f(s)).sum::<f64>() / n;
        Figures {
            known: last.known,
            limited: last.limited,
            active: last.active,
            dropped_share: mean(|s| s.dropped_share),
            dropped_pps: mean(|s| s.dropped_pps),
            seconds: last_at.since(*first_at).as_secs_f64(),
        }
    }

    /// One tick: records `sample`, judges every guard, and ends the
    /// period on a breach or when its time is up. A period that is over
    /// stays as it ended.
    pub fn step(&mut self, now: T, sample: Sample) -> Step {
        if self.state != GuardState::Watching {
            return Step::Watching;
        }
        self.samples.push_back((now, sample));
        while self.samples.len() > 1 && now.since(self.samples[0].0) > WINDOW {
            self.samples.pop_front();
        }
        let figures = self.figures();
        let mut breach = None;
        for (guard, last) in self.guards.iter().zip(&mut self.last) {
            *last = guard.measure(&figures);
            if let Some(measured) = *last {
                if !guard.holds(measured) && breach.is_none() {
                    breach = Some(Breach {
                        guard: *guard,
                        measured,
                    });
                }
            }
        }
        if let Some(breach) = breach {
            self.state = GuardState::RolledBack;
            self.breach = Some((breach, now));
            return Step::Breached(breach);
        }
        if now.since(self.started) >= self.period {
            self.state = GuardState::Passed;
            return Step::Passed;
        }
        Step::Watching
    }
}

/// The automatic rollbacks of one scope within the last
/// [`ROLLBACK_SPAN`]: at most [`MAX_ROLLBACKS`].
#[derive(Clone, Debug)]
pub struct RollbackBudget<T> {
    at: VecDeque<T>,
}

impl<T> Default for RollbackBudget<T> {
    fn default() -> Self {
        Self {
            at: VecDeque::new(),
        }
    }
}

impl<T: Clock> RollbackBudget<T> {
    /// Whether a rollback at `now` is within the budget (then counted).
    pub fn take(&mut self, now: T) -> bool {
        while self
            .at
            .front()
            .is_some_and(|t| now.since(*t) >= ROLLBACK_SPAN)
        {
            self.at.pop_front();
        }
        if self.at.len() >= MAX_ROLLBACKS {
            return false;
        }
        self.at.push_back(now);
        true
    }
}

#[cfg(test)]
mod tests;
