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

/// A second of traffic: `judged` frames of which `dropped` dropped, on
/// top of `before`.
fn next(before: Sample, judged: u64, dropped: u64) -> Sample {
    Sample {
        judged_total: before.judged_total + judged,
        dropped_total: before.dropped_total + dropped,
        ..before
    }
}

fn series(per_second: &[(u64, u64)]) -> Vec<Sample> {
    let mut s = Sample {
        tracked: 10,
        ..Sample::default()
    };
    per_second
        .iter()
        .map(|&(judged, dropped)| {
            s = next(s, judged, dropped);
            s
        })
        .collect()
}

#[test]
fn a_series_under_the_guard_passes_when_the_period_ends() {
    let guards = parse_all(&["dropped_share <= 5%", "limited_sources <= 10%"]).unwrap();
    let mut period = GuardPeriod::new(guards, Duration::from_secs(6), Duration::ZERO);
    // 1000 frames a second, 2 % dropped; one tick with 3 of 4 dropped
    // (a tick with almost nothing in it) is diluted by the window.
    let samples = series(&[
        (1000, 20),
        (4, 3),
        (1000, 20),
        (1000, 20),
        (1000, 20),
        (1000, 20),
    ]);
    let steps = run(&mut period, &samples);
    assert_eq!(steps[..5], [Step::Watching; 5]);
    assert_eq!(steps[5], Step::Passed);
    assert_eq!(period.state, GuardState::Passed);
    assert!(period.breach.is_none());
    let share = period.last[0].expect("measured");
    assert!(share > 0.015 && share < 0.025, "{share}");
    assert_eq!(period.last[1], Some(0.0));
    // Over: later ticks change nothing, even breaching ones.
    assert_eq!(
        period.step(Duration::from_secs(9), next(samples[5], 10, 10)),
        Step::Watching
    );
    assert_eq!(period.state, GuardState::Passed);
    assert_eq!(period.remaining(Duration::from_secs(9)), Duration::ZERO);
}

#[test]
fn a_series_that_breaches_rolls_back_with_the_guard_and_value() {
    let guards = parse_all(&["limited_sources <= 50%", "dropped_share <= 5%"]).unwrap();
    let mut period = GuardPeriod::new(guards, Duration::from_secs(600), Duration::ZERO);
    let samples = series(&[(1000, 0), (1000, 10), (1000, 400), (1000, 400)]);
    let steps = run(&mut period, &samples);
    assert_eq!(steps[..2], [Step::Watching; 2]);
    // Second 3: 410 dropped of 2000 judged since second 1 (20.5 %).
    let Step::Breached(breach) = steps[2] else {
        panic!("{steps:?}");
    };
    assert_eq!(breach.guard.metric, Metric::DroppedShare);
    assert!(
        (breach.measured - 0.205).abs() < 1e-9,
        "{}",
        breach.measured
    );
    assert_eq!(breach.guard.show(breach.measured), "20.5%");
    assert_eq!(period.state, GuardState::RolledBack);
    assert_eq!(
        period.breach.map(|(_, at)| at),
        Some(Duration::from_secs(3))
    );
    // The period is over: no second rollback.
    assert_eq!(steps[3], Step::Watching);
}

#[test]
fn a_share_of_few_frames_is_not_judged() {
    let guards = parse_all(&["dropped_share <= 1%"]).unwrap();
    let mut period = GuardPeriod::new(guards, Duration::from_secs(600), Duration::ZERO);
    // 99 frames in the window, all dropped: too few to judge.
    let steps = run(&mut period, &series(&[(0, 0), (50, 50), (49, 49)]));
    assert_eq!(steps, [Step::Watching; 3]);
    assert_eq!(period.last, [None]);
    // One more frame: judged, and breached.
    let s = series(&[(0, 0), (50, 50), (49, 49), (1, 1)]);
    let step = period.step(Duration::from_secs(4), s[3]);
    assert!(
        matches!(step, Step::Breached(b) if b.measured == 1.0),
        "{step:?}"
    );
}

#[test]
fn a_count_and_a_rate_breach_and_the_window_forgets_old_ticks() {
    let guards = parse_all(&["limited_sources < 2"]).unwrap();
    let mut period = GuardPeriod::new(guards, Duration::from_secs(600), Duration::ZERO);
    let mut one = Sample {
        limited: 1,
        ..Sample::default()
    };
    assert_eq!(period.step(Duration::from_secs(1), one), Step::Watching);
    one.limited = 2;
    assert!(matches!(
        period.step(Duration::from_secs(2), one),
        Step::Breached(b) if b.measured == 2.0
    ));

    // 10 000 dropped in second 1, then nothing for longer than the
    // window: the old burst leaves the rate.
    let guards = parse_all(&["dropped_pps <= 1000"]).unwrap();
    let mut period = GuardPeriod::new(guards, Duration::from_secs(600), Duration::ZERO);
    let mut per_second = vec![(0, 0), (10_000, 4_000)];
    per_second.extend([(10, 0); 8]);
    let steps = run(&mut period, &series(&per_second[..1]));
    assert_eq!(steps, [Step::Watching]);
    // Second 2: 4000 dropped over 1 s.
    let samples = series(&per_second);
    assert!(matches!(
        period.step(Duration::from_secs(2), samples[1]),
        Step::Breached(b) if b.measured == 4000.0
    ));
    let mut calm = GuardPeriod::new(period.guards.clone(), period.period, Duration::ZERO);
    // The same burst well before a guard with a higher threshold, then
    // the window slides past it.
    calm.guards[0].value = 5000.0;
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(
            calm.step(Duration::from_secs(i as u64 + 1), *s),
            Step::Watching
        );
    }
    let figures = calm.figures();
    assert_eq!(figures.dropped, 0);
    assert!(figures.seconds >= WINDOW.as_secs_f64(), "{figures:?}");
    assert!(figures.seconds <= WINDOW.as_secs_f64() + 1.0, "{figures:?}");
    assert_eq!(
        calm.remaining(Duration::from_secs(10)),
        Duration::from_secs(590)
    );
}
