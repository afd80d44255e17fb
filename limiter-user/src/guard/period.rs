//! A guard period, tick by tick: what a tick saw of the known sources
//! ([`Sample`]), the figures the guards read, the period's verdict
//! ([`GuardPeriod::step`]) and the rollback budget of a scope. Pure: the
//! tests hand them made-up ticks and times.

use std::{collections::VecDeque, time::Duration};

use super::{Guard, MAX_ROLLBACKS, ROLLBACK_SPAN, WINDOW};

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
