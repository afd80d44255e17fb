use super::{http::render, *};

/// The value of eth0's level series of `rule` and `level`, if any.
fn level_drops(metrics: &Metrics, rule: &str, level: &str) -> Option<u64> {
    let series = format!(
        "xdp_limiter_level_dropped_packets_total{{interface=\"eth0\",level=\"{level}\",rule=\"{rule}\"}} "
    );
    render(&metrics.registry)
        .lines()
        .find_map(|line| line.strip_prefix(&series)?.parse().ok())
}

#[test]
fn source_evictions_are_exported_at_zero_from_the_first_pass() {
    let mut metrics = Metrics::new();
    let series = "xdp_limiter_source_evictions_total{interface=\"eth0\"} ";
    assert!(!render(&metrics.registry).contains(series));
    metrics.record("eth0", &Snapshot::default(), 1024, 1, &[], None);
    assert!(render(&metrics.registry).contains(&format!("{series}0\n")));
    let snapshot = Snapshot {
        evictions: 5,
        ..Snapshot::default()
    };
    metrics.record("eth0", &snapshot, 1024, 1, &[], None);
    assert!(render(&metrics.registry).contains(&format!("{series}5\n")));
}

#[test]
fn a_scopes_rollbacks_counter_exists_at_zero_once_its_guard_state_is_set() {
    let metrics = Metrics::new();
    metrics.set_guard_state("rules[0]", crate::guard::GuardState::Watching);
    let text = render(&metrics.registry);
    assert!(
        text.contains("xdp_limiter_guard_rollbacks_total{scope=\"rules[0]\"} 0\n"),
        "{text}"
    );
    metrics.guard_rolled_back("rules[0]");
    assert!(render(&metrics.registry)
        .contains("xdp_limiter_guard_rollbacks_total{scope=\"rules[0]\"} 1\n"));
}

#[test]
fn level_drops_count_per_rule_and_level_and_start_again_after_a_push() {
    let mut metrics = Metrics::new();
    let rule = RuleLevels {
        index: 3,
        rule: "rules[2]".into(),
        labels: vec!["prefix/24/48@1s".into(), "source@1m".into()],
    };
    metrics.record_level_drops("eth0", &rule, &[5, 2, 0, 0]);
    metrics.record_level_drops("eth0", &rule, &[7, 2, 0, 0]);
    assert_eq!(
        level_drops(&metrics, "rules[2]", "prefix/24/48@1s"),
        Some(7)
    );
    assert_eq!(level_drops(&metrics, "rules[2]", "source@1m"), Some(2));
    // One series per level the rule has, no more.
    let text = render(&metrics.registry);
    assert_eq!(
        text.matches("xdp_limiter_level_dropped_packets_total{")
            .count(),
        2,
        "{text}"
    );
    // A push of the other half leaves the counts as they are...
    metrics.rules_pushed(MAX_RULES);
    metrics.record_level_drops("eth0", &rule, &[8, 2, 0, 0]);
    assert_eq!(
        level_drops(&metrics, "rules[2]", "prefix/24/48@1s"),
        Some(8)
    );
    // ...one of index 3's half zeroed it: its counts start from nothing.
    metrics.rules_pushed(0);
    metrics.record_level_drops("eth0", &rule, &[1, 0, 0, 0]);
    assert_eq!(
        level_drops(&metrics, "rules[2]", "prefix/24/48@1s"),
        Some(9)
    );
    assert_eq!(level_drops(&metrics, "rules[2]", "source@1m"), Some(2));
}

#[test]
fn rate_histograms_and_limits_are_exported_with_their_buckets_and_labels() {
    let metrics = Metrics::new();
    for pps in [3, 10, 10, 150] {
        metrics.observe_source_rate("eth0", "default", pps);
    }
    metrics.observe_level_rate("eth0", "rules[0]", "prefix/24/48@1s", 40.0);
    metrics.record_rule_limits(&[
        ("default".into(), Some(100)),
        ("rules[0]".into(), None),
        ("rules[1]".into(), Some(2_000)),
    ]);
    let text = render(&metrics.registry);
    let has = |line: &str| text.lines().any(|l| l == line);
    let source = |le: &str, n: u32| {
        format!("xdp_limiter_source_rate_pps_bucket{{interface=\"eth0\",rule=\"default\",le=\"{le}\"}} {n}")
    };
    for (le, n) in [
        ("1", 0),
        ("5", 1),
        ("10", 3),
        ("100", 3),
        ("200", 4),
        ("1000000", 4),
        ("+Inf", 4),
    ] {
        assert!(has(&source(le, n)), "no {} in\n{text}", source(le, n));
    }
    assert!(
        has("xdp_limiter_source_rate_pps_sum{interface=\"eth0\",rule=\"default\"} 173"),
        "{text}"
    );
    assert!(
        has("xdp_limiter_source_rate_pps_count{interface=\"eth0\",rule=\"default\"} 4"),
        "{text}"
    );
    // 19 buckets and +Inf.
    assert_eq!(
        text.matches("xdp_limiter_source_rate_pps_bucket{").count(),
        20
    );
    assert!(has("xdp_limiter_level_rate_pps_bucket{interface=\"eth0\",level=\"prefix/24/48@1s\",rule=\"rules[0]\",le=\"50\"} 1"), "{text}");
    assert!(
        has("xdp_limiter_rule_limit_pps{rule=\"default\"} 100"),
        "{text}"
    );
    assert!(
        has("xdp_limiter_rule_limit_pps{rule=\"rules[1]\"} 2000"),
        "{text}"
    );
    assert!(
        !text.contains("xdp_limiter_rule_limit_pps{rule=\"rules[0]\"}"),
        "{text}"
    );
    // A rule gone takes its series with it.
    metrics.record_rule_limits(&[("default".into(), Some(50))]);
    let text = render(&metrics.registry);
    assert!(
        text.contains("xdp_limiter_rule_limit_pps{rule=\"default\"} 50"),
        "{text}"
    );
    assert!(
        !text.contains("rule_limit_pps{rule=\"rules[1]\"}"),
        "{text}"
    );
}
