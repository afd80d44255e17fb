//! Unit tests of levels: the grammar read and written, and every refusal
//! of a rule's levels, each naming its field.

use super::*;

#[test]
fn the_grammar_reads_and_writes_every_kind() {
    for (text, per, pps, burst, window) in [
        ("source:20000@1m", LevelPer::Source, 20_000, 0, Some(60)),
        (
            "prefix/24:2000",
            LevelPer::Prefix { v4: 24, v6: 48 },
            2000,
            0,
            None,
        ),
        (
            "prefix/16/32:50000+100@10s",
            LevelPer::Prefix { v4: 16, v6: 32 },
            50_000,
            100,
            Some(10),
        ),
        ("rule:100000", LevelPer::Rule, 100_000, 0, None),
        (
            "destination:10000",
            LevelPer::Destination { v4: 32, v6: 128 },
            10_000,
            0,
            None,
        ),
        (
            "destination/24/64:10",
            LevelPer::Destination { v4: 24, v6: 64 },
            10,
            0,
            None,
        ),
        ("pair:100@10s", LevelPer::Pair, 100, 0, Some(10)),
    ] {
        let level: LevelSpec = text.parse().expect(text);
        assert_eq!(level.per, per, "{text}");
        assert_eq!(level.pps, pps, "{text}");
        assert_eq!(level.burst_packets, burst, "{text}");
        assert_eq!(level.window, window.map(Duration::from_secs), "{text}");
        assert_eq!(level.to_string().parse::<LevelSpec>(), Ok(level), "{text}");
    }
    assert_eq!(
        "prefix/24:1@100ms"
            .parse::<LevelSpec>()
            .unwrap()
            .label(Duration::from_secs(1)),
        "prefix/24/48@100ms"
    );
}

#[test]
fn malformed_levels_say_what_is_wrong() {
    for (text, says) in [
        ("prefix:2000", "needs its length"),
        ("subnet/24:2000", "is not a level"),
        ("prefix/24", "is not a level"),
        ("rule:many", "is not a whole number"),
        ("rule:10@soon", "window"),
        ("prefix/x:10", "prefix length"),
        ("prefix/24/48/1:10", "is not a level"),
    ] {
        let error = text.parse::<LevelSpec>().unwrap_err();
        assert!(error.contains(says), "{text}: {error}");
    }
}

// ---- refusals, through the compiler as a push or a file sees them ----

use limiter_common::{Action, Scope};

use crate::rules::{compile, RuleError, RuleSet, RuleSpec};

/// A limit rule for 10.0.0.0/8 at 100 pps with `levels`.
fn rule_with(levels: &[&str]) -> RuleSpec {
    let mut rule = RuleSpec::limit("10.0.0.0/8".parse().unwrap(), 100);
    rule.levels = levels.iter().map(|t| t.parse().expect(t)).collect();
    rule
}

/// What compiling a set of a plain default and `rule` (`rules[0]`), IPv4
/// sources keyed by `/v4_key`, IPv6 by /64, says.
fn refusal(rule: RuleSpec, v4_key: u8) -> RuleError {
    let set = RuleSet {
        rules: vec![rule],
        v4_prefix_len: v4_key,
        ..RuleSet::with_default(RuleSpec::limit("0.0.0.0/0".parse().unwrap(), 1000))
    };
    compile(&set, 0, 2).expect_err("must be refused")
}

#[track_caller]
fn says(error: &RuleError, expect: &str) {
    let text = error.to_string();
    assert!(
        text.starts_with(expect),
        "{text:?} does not start {expect:?}"
    );
}

#[test]
fn levels_on_an_allow_or_deny_rule_are_refused_naming_the_rule() {
    for (action, name) in [(Action::Allow, "allow"), (Action::Deny, "deny")] {
        let mut rule = RuleSpec::with_action("10.0.0.0/8".parse().unwrap(), action);
        rule.levels = vec!["prefix/24:2000".parse().unwrap()];
        let error = refusal(rule, 32);
        assert!(
            matches!(error, RuleError::LevelsNotLimit { .. }),
            "{error:?}"
        );
        says(
            &error,
            &format!("rules[0].levels: only a `limit` rule has levels, not `{name}`"),
        );
    }
    // The default rule is named as such.
    let mut default = RuleSpec::with_action("0.0.0.0/0".parse().unwrap(), Action::Allow);
    default.levels = vec!["rule:10".parse().unwrap()];
    let error = compile(&RuleSet::with_default(default), 0, 2).unwrap_err();
    says(&error, "default.levels: only a `limit` rule has levels");
}

#[test]
fn levels_on_a_cluster_scoped_rule_are_refused() {
    let mut rule = rule_with(&["prefix/24:2000"]);
    rule.scope = Scope::Cluster;
    let error = refusal(rule, 32);
    assert!(
        matches!(error, RuleError::LevelsCluster { .. }),
        "{error:?}"
    );
    says(
        &error,
        "rules[0].levels: a cluster-scoped rule cannot have levels",
    );
}

#[test]
fn more_than_four_levels_are_refused() {
    let four = [
        "source:10@100ms",
        "source:10@1m",
        "prefix/24:100",
        "rule:1000",
    ];
    assert_eq!(
        compile(
            &RuleSet {
                rules: vec![rule_with(&four)],
                ..RuleSet::with_default(RuleSpec::limit("0.0.0.0/0".parse().unwrap(), 1000))
            },
            0,
            2
        )
        .map(|c| c.rules[1].levels().len()),
        Ok(MAX_LEVELS)
    );
    let mut five = four.to_vec();
    five.push("prefix/16:1000");
    let error = refusal(rule_with(&five), 32);
    assert_eq!(
        error,
        RuleError::TooManyLevels {
            rule: "rules[0]".into(),
            count: 5
        }
    );
    says(
        &error,
        "rules[0].levels: 5 levels, more than the 4 a rule may have",
    );
}

#[test]
fn windows_outside_100ms_to_60s_are_refused_naming_the_level() {
    for (window, shown) in [("50ms", "50ms"), ("2m", "120s")] {
        let error = refusal(
            rule_with(&["rule:1000", &format!("prefix/24:10@{window}")]),
            32,
        );
        assert!(matches!(error, RuleError::LevelWindow { .. }), "{error:?}");
        says(
            &error,
            &format!("rules[0].levels[1]: window {shown} is outside 100ms..=60s"),
        );
    }
    // The bounds themselves are windows.
    let set = RuleSet {
        rules: vec![rule_with(&["source:10@100ms", "source:10@60s"])],
        ..RuleSet::with_default(RuleSpec::limit("0.0.0.0/0".parse().unwrap(), 1000))
    };
    assert!(compile(&set, 0, 2).is_ok());
}

#[test]
fn a_prefix_longer_than_the_sources_key_is_refused() {
    // Sources keyed /24: a /28 would split one.
    let error = refusal(rule_with(&["prefix/28:10"]), 24);
    assert_eq!(
        error,
        RuleError::LevelPrefix {
            level: "rules[0].levels[0]".into(),
            family: "IPv4",
            len: 28,
            key: 24
        }
    );
    says(
        &error,
        "rules[0].levels[0]: IPv4 prefix /28 is longer than the /24 sources are keyed by \
         (limits.ipv4_prefix)",
    );
    // The IPv6 length, given or by default (/48), against the /64 key.
    says(
        &refusal(rule_with(&["rule:10", "prefix/16/96:10"]), 24),
        "rules[0].levels[1]: IPv6 prefix /96 is longer than the /64 sources are keyed by \
         (limits.ipv6_prefix)",
    );
    let set = RuleSet {
        rules: vec![rule_with(&["prefix/24:10"])],
        v4_prefix_len: 24,
        v6_prefix_len: 32,
        ..RuleSet::with_default(RuleSpec::limit("0.0.0.0/0".parse().unwrap(), 1000))
    };
    says(
        &compile(&set, 0, 2).unwrap_err(),
        "rules[0].levels[0]: IPv6 prefix /48 is longer than the /32",
    );
}

#[test]
fn a_duplicate_level_is_refused_naming_both() {
    let error = refusal(
        rule_with(&["rule:10", "prefix/24:10", "prefix/24/48:20"]),
        32,
    );
    assert_eq!(
        error,
        RuleError::LevelDuplicate {
            level: "rules[0].levels[2]".into(),
            other: "rules[0].levels[1]".into()
        }
    );
    says(
        &error,
        "rules[0].levels[2]: keyed and windowed as rules[0].levels[1]; merge them",
    );
    // A window spelled out equal to the rule's is the rule's window.
    says(
        &refusal(rule_with(&["source:50@1s", "source:20"]), 32),
        "rules[0].levels[1]: keyed and windowed as rules[0].levels[0]",
    );
    // Other windows or other prefixes are other levels.
    let set = RuleSet {
        rules: vec![rule_with(&[
            "source:50@10s",
            "source:20",
            "prefix/24:10",
            "prefix/16:10",
        ])],
        ..RuleSet::with_default(RuleSpec::limit("0.0.0.0/0".parse().unwrap(), 1000))
    };
    assert!(compile(&set, 0, 2).is_ok());
}

#[test]
fn a_level_of_zero_pps_or_too_many_packets_is_refused() {
    let error = refusal(rule_with(&["rule:1000", "prefix/24:0"]), 32);
    assert_eq!(
        error,
        RuleError::Zero {
            rule: "rules[0].levels[1]".into(),
            what: "pps"
        }
    );
    says(&error, "rules[0].levels[1]: pps must be greater than zero");
    let error = refusal(rule_with(&[&format!("rule:{}@1m", u64::MAX / 1000)]), 32);
    assert!(matches!(error, RuleError::TooLarge { .. }), "{error:?}");
    says(&error, "rules[0].levels[0]: packets");
}
