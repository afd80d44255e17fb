//! Guarded enforcement: `METRIC OP VALUE` expressions (`limited_sources <=
//! 1%`, `dropped_share <= 5%`, `dropped_pps < 20000`) that the daemon
//! checks every tick of a guard period after switching to enforce, and
//! whose breach sends it back to dry-run on its own.
//!
//! The parser is shared by the CLI (`mode enforce --guard`), the control
//! protocol (the daemon parses again: a request may come from anything)
//! and the configuration (`[limits] guards`). The evaluator
//! ([`GuardPeriod`]) is pure (it is handed the tick's figures and the
//! time), so its tests run on made-up series of ticks.

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
/// The rates (`dropped_share`, `dropped_pps`) are measured over the ticks
/// of the last this long, not over the last tick alone: a tick that read
/// a few frames (a short tick, a pause in traffic) would otherwise make a
/// share of 1 dropped frame out of 2 look like a 50 % disaster.
pub const WINDOW: Duration = Duration::from_secs(5);
/// `dropped_share` is judged only once the window holds this many judged
/// frames: below, the share is noise (and nothing much is being hurt).
pub const MIN_JUDGED_FRAMES: u64 = 100;

/// What a guard measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Sources held limited, as of the last complete sweep: a count, or
    /// (with `%`) a share of the tracked sources.
    LimitedSources,
    /// Dropped frames over judged frames, over [`WINDOW`].
    DroppedShare,
    /// Dropped frames per second, over [`WINDOW`].
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
    /// fraction); `None` when there is not enough to judge (no tracked
    /// source for a share of them, fewer than [`MIN_JUDGED_FRAMES`] for a
    /// share of frames, less than a tick's span for a rate).
    pub fn measure(&self, figures: &Figures) -> Option<f64> {
        match self.metric {
            Metric::LimitedSources if self.share => {
                (figures.tracked > 0).then(|| figures.limited as f64 / figures.tracked as f64)
            }
            Metric::LimitedSources => Some(figures.limited as f64),
            Metric::DroppedShare => (figures.judged >= MIN_JUDGED_FRAMES)
                .then(|| figures.dropped as f64 / figures.judged as f64),
            Metric::DroppedPps => {
                (figures.seconds >= 0.5).then(|| figures.dropped as f64 / figures.seconds)
            }
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

/// What one tick saw of the traffic a guard watches: the source counts
/// as of now, the frame totals since the daemon started (they only grow).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    pub tracked: u64,
    pub limited: u64,
    /// Frames judged (passed, allowed, would-drop, dropped) so far.
    pub judged_total: u64,
    /// Frames dropped (limit or deny) so far.
    pub dropped_total: u64,
}

/// The figures guards are judged on: the latest counts, and the frames of
/// the last [`WINDOW`] of ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    pub tracked: u64,
    pub limited: u64,
    pub judged: u64,
    pub dropped: u64,
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
}

impl GuardState {
    pub fn as_str(self) -> &'static str {
        match self {
            GuardState::None => "none",
            GuardState::Watching => "watching",
            GuardState::Passed => "passed",
            GuardState::RolledBack => "rolled-back",
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

    /// Forgets the window's samples: the counters they came from were
    /// reset (a rule's drop counters, by a push of new rules), so the
    /// next samples start a new window.
    pub fn restart_window(&mut self) {
        self.samples.clear();
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
        let (Some((first_at, first)), Some((last_at, last))) =
            (self.samples.front(), self.samples.back())
        else {
            return Figures::default();
        };
        Figures {
            tracked: last.tracked,
            limited: last.limited,
            judged: last.judged_total.saturating_sub(first.judged_total),
            dropped: last.dropped_total.saturating_sub(first.dropped_total),
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
        // Keep the newest sample at least WINDOW old as the window's
        // start, so the window spans WINDOW once the ticks have.
        while self.samples.len() > 2 && now.since(self.samples[1].0) >= WINDOW {
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

#[cfg(test)]
mod tests;
