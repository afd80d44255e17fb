//! The guard parser (every error it gives) and the evaluator on made-up
//! series of ticks: one that breaches, one that does not, the period's end.

use std::time::Duration;

use super::*;

fn parse(text: &str) -> Result<Guard, GuardError> {
    text.parse()
}

#[test]
fn parses_every_metric_and_op() {
    let g = parse("limited_sources <= 1%").unwrap();
    assert_eq!(
        (g.metric, g.op, g.share),
        (Metric::LimitedSources, Op::Le, true)
    );
    assert!((g.value - 0.01).abs() < 1e-12);
    assert_eq!(g.to_string(), "limited_sources <= 1%");
    let g = parse("limited_sources<3").unwrap();
    assert_eq!((g.op, g.value, g.share), (Op::Lt, 3.0, false));
    assert_eq!(g.to_string(), "limited_sources < 3");
    let g = parse("  dropped_share >= 0.05 ").unwrap();
    assert_eq!(
        (g.metric, g.op, g.share),
        (Metric::DroppedShare, Op::Ge, true)
    );
    assert_eq!(g.to_string(), "dropped_share >= 0.05");
    let g = parse("dropped_share <= 5 %").unwrap();
    assert!((g.value - 0.05).abs() < 1e-12);
    assert_eq!(g.to_string(), "dropped_share <= 5%");
    let g = parse("dropped_pps > 20000").unwrap();
    assert_eq!(
        (g.metric, g.op, g.value),
        (Metric::DroppedPps, Op::Gt, 20000.0)
    );
    // What Display writes parses back to the same guard.
    for text in [
        "limited_sources <= 0",
        "dropped_share < 12.5%",
        "dropped_pps <= 1.5",
    ] {
        let g = parse(text).unwrap();
        assert_eq!(parse(&g.to_string()).unwrap(), g);
    }
}

#[test]
fn every_error_names_what_is_wrong() {
    let err = |text: &str| parse(text).unwrap_err();
    match err("dropped_frames <= 5%") {
        e @ GuardError::UnknownMetric { .. } => {
            let m = e.to_string();
            assert!(m.contains("\"dropped_frames\""), "{m}");
            assert!(
                m.contains("limited_sources, dropped_share, dropped_pps"),
                "{m}"
            );
        }
        other => panic!("{other:?}"),
    }
    for (text, reason) in [
        ("dropped_share 5%", "no comparison"),
        ("dropped_share == 5%", "one of <=, <, >=, >"),
        ("dropped_share != 5%", "one of <=, <, >=, >"),
        ("<= 5%", "no metric"),
        ("dropped_share <=", "no value"),
        ("dropped_share <= %", "no value"),
        ("dropped_share <= five", "\"five\" is not a number"),
        ("dropped_share <= inf", "is not a number"),
        ("dropped_share <= 5%%", "is not a number"),
    ] {
        match err(text) {
            GuardError::Malformed { text: t, reason: r } => {
                assert_eq!(t, text);
                assert!(r.contains(reason), "{text}: {r}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    for (text, reason) in [
        ("limited_sources <= -1", "negative"),
        ("dropped_share <= -5%", "negative"),
        ("limited_sources <= 101%", "above 100%"),
        ("dropped_share <= 1.5", "above 1"),
        ("dropped_pps <= 5%", "not a share"),
    ] {
        match err(text) {
            GuardError::OutOfRange { reason: r, .. } => assert!(r.contains(reason), "{text}: {r}"),
            other => panic!("{text}: {other:?}"),
        }
    }
}

#[test]
fn plans_check_the_period_and_the_mode() {
    let guards = parse_all(&["dropped_share <= 5%"]).unwrap();
    assert_eq!(
        check_plan(false, &guards, None),
        Ok(Some(DEFAULT_GUARD_FOR))
    );
    let ten = Duration::from_secs(10);
    assert_eq!(check_plan(false, &guards, Some(ten)), Ok(Some(ten)));
    assert_eq!(check_plan(false, &[], None), Ok(None));
    assert_eq!(check_plan(true, &[], None), Ok(None));
    assert_eq!(
        check_plan(false, &[], Some(ten)),
        Err(GuardError::PeriodWithoutGuard)
    );
    assert_eq!(
        check_plan(true, &guards, None),
        Err(GuardError::GuardWithDryRun)
    );
    for bad in [Duration::from_secs(4), Duration::from_secs(24 * 3600 + 1)] {
        let e = check_plan(false, &guards, Some(bad)).unwrap_err();
        assert_eq!(e, GuardError::PeriodOutOfRange(bad));
        assert!(e.to_string().contains("5s..=24h"), "{e}");
    }
    assert!(parse_all(&["dropped_share <= 5%", "nope <= 1"]).is_err());
}

/// Runs `period` over one sample a second from `samples` (starting at
/// second 1), returning each step.
fn run(period: &mut GuardPeriod<Duration>, samples: &[Sample]) -> Vec<Step> {
    samples
        .iter()
        .enumerate()
        .map(|(i, s)| period.step(Duration::from_secs(i as u64 + 1), *s))
        .collect()
}

/// A tick over 100 known sources, all sending: `limited` of them refused,
/// a mean share `share` of their frames dropped, `pps` dropped a second.
fn tick(limited: u64, share: f64, pps: f64) -> Sample {
    Sample {
        known: 100,
        limited,
        active: 100,
        dropped_share: share,
        dropped_pps: pps,
    }
}

#[test]
fn a_series_under_the_guard_passes_when_the_period_ends() {
    let guards = parse_all(&["dropped_share <= 5%", "limited_sources <= 10%"]).unwrap();
    let mut period = GuardPeriod::new(guards, Duration::from_secs(6), Duration::ZERO);
    // 2 % dropped; one tick at 7 % is diluted by the window's mean.
    let samples = [
        tick(1, 0.02, 10.0),
        tick(1, 0.07, 10.0),
        tick(1, 0.02, 10.0),
        tick(1, 0.02, 10.0),
        tick(1, 0.02, 10.0),
        tick(1, 0.02, 10.0),
    ];
    let steps = run(&mut period, &samples);
    assert_eq!(steps[..5], [Step::Watching; 5]);
    assert_eq!(steps[5], Step::Passed);
    assert_eq!(period.state, GuardState::Passed);
    assert!(period.breach.is_none());
    let share = period.last[0].expect("measured");
    assert!(share > 0.015 && share < 0.05, "{share}");
    assert_eq!(period.last[1], Some(0.01));
    // Over: later ticks change nothing, even breaching ones.
    assert_eq!(
        period.step(Duration::from_secs(9), tick(100, 1.0, 1e6)),
        Step::Watching
    );
    assert_eq!(period.state, GuardState::Passed);
    assert_eq!(period.remaining(Duration::from_secs(9)), Duration::ZERO);
}

#[test]
fn a_series_that_breaches_rolls_back_with_the_guard_and_value() {
    let guards = parse_all(&["limited_sources <= 50%", "dropped_share <= 5%"]).unwrap();
    let mut period = GuardPeriod::new(guards, Duration::from_secs(600), Duration::ZERO);
    let samples = [
        tick(0, 0.0, 0.0),
        tick(10, 0.01, 5.0),
        tick(40, 0.5, 500.0),
        tick(40, 0.5, 500.0),
    ];
    let steps = run(&mut period, &samples);
    assert_eq!(steps[..2], [Step::Watching; 2]);
    // Second 3: the mean of 0, 1 % and 50 % over the window.
    let Step::Breached(breach) = steps[2] else {
        panic!("{steps:?}");
    };
    assert_eq!(breach.guard.metric, Metric::DroppedShare);
    assert!((breach.measured - 0.17).abs() < 1e-9, "{}", breach.measured);
    assert_eq!(breach.guard.show(breach.measured), "17%");
    assert_eq!(period.state, GuardState::RolledBack);
    assert_eq!(
        period.breach.map(|(_, at)| at),
        Some(Duration::from_secs(3))
    );
    // The period is over: no second rollback.
    assert_eq!(steps[3], Step::Watching);
}

#[test]
fn a_share_of_few_sources_is_not_judged() {
    let guards = parse_all(&["dropped_share <= 1%", "limited_sources <= 10%"]).unwrap();
    let mut period = GuardPeriod::new(guards, Duration::from_secs(600), Duration::ZERO);
    // Four known sources sending, all refused: too few to judge a share
    // of frames; no known source at all: no share of them either.
    let few = Sample {
        known: 0,
        active: 4,
        dropped_share: 1.0,
        ..Sample::default()
    };
    assert_eq!(run(&mut period, &[few, few]), [Step::Watching; 2]);
    assert_eq!(period.last, [None, None]);
    // A fifth: judged, and breached.
    let step = period.step(Duration::from_secs(3), Sample { active: 5, ..few });
    assert!(
        matches!(step, Step::Breached(b) if b.guard.metric == Metric::DroppedShare),
        "{step:?}"
    );
}

#[test]
fn a_count_and_a_rate_breach_and_the_window_forgets_old_ticks() {
    let guards = parse_all(&["limited_sources < 2"]).unwrap();
    let mut period = GuardPeriod::new(guards, Duration::from_secs(600), Duration::ZERO);
    assert_eq!(
        period.step(Duration::from_secs(1), tick(1, 0.0, 0.0)),
        Step::Watching
    );
    assert!(matches!(
        period.step(Duration::from_secs(2), tick(2, 0.0, 0.0)),
        Step::Breached(b) if b.measured == 2.0
    ));

    // 4,000 dropped a second in second 2, then nothing for longer than
    // the window: the old burst leaves the rate.
    let guards = parse_all(&["dropped_pps <= 1000"]).unwrap();
    let mut period = GuardPeriod::new(guards, Duration::from_secs(600), Duration::ZERO);
    let mut samples = vec![tick(0, 0.0, 0.0), tick(0, 0.0, 4_000.0)];
    samples.extend([tick(0, 0.0, 0.0); 8]);
    assert_eq!(run(&mut period, &samples[..1]), [Step::Watching]);
    // Second 2: the mean of 0 and 4,000.
    assert!(matches!(
        period.step(Duration::from_secs(2), samples[1]),
        Step::Breached(b) if b.measured == 2000.0
    ));
    let mut calm = GuardPeriod::new(period.guards.clone(), period.period, Duration::ZERO);
    // The same burst under a guard with a higher threshold, then the
    // window slides past it.
    calm.guards[0].value = 5000.0;
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(
            calm.step(Duration::from_secs(i as u64 + 1), *s),
            Step::Watching
        );
    }
    let figures = calm.figures();
    assert_eq!(figures.dropped_pps, 0.0);
    assert!(figures.seconds <= WINDOW.as_secs_f64(), "{figures:?}");
    assert!(figures.seconds >= WINDOW.as_secs_f64() - 1.0, "{figures:?}");
    assert_eq!(
        calm.remaining(Duration::from_secs(10)),
        Duration::from_secs(590)
    );
}

#[test]
fn a_scope_rolls_back_at_most_three_times_an_hour() {
    let mut budget = RollbackBudget::default();
    let minute = Duration::from_secs(60);
    assert!(budget.take(minute));
    assert!(budget.take(minute * 2));
    assert!(budget.take(minute * 3));
    assert!(!budget.take(minute * 4), "a fourth within the hour");
    assert!(!budget.take(minute * 60), "the first is 59 minutes old");
    assert!(budget.take(minute * 61), "the first is an hour old");
    assert!(!budget.take(minute * 61), "2, 3 and 61 within the hour");
}
