//! Answers pinned by hand, and what the properties found.

use limiter_common::Action;
use limiter_user::{
    config::{Config, RuleSection},
    daemon::apply_rule_edit,
    proto::{parse_request, RuleEdit},
};

use super::config::shipped_text;

/// The parser's answers that the daemon's tests and docs quote.
#[test]
fn known_answers() {
    for (line, expect) in [
        ("", "malformed request: EOF while parsing a value"),
        (
            r#"{"version":"1","command":"status"}"#,
            "malformed request: `version` must be a number",
        ),
        (
            r#"{"version":2,"command":"status"}"#,
            "protocol version 2 is not supported (this daemon speaks 1)",
        ),
        (
            r#"{"version":-1,"command":"status"}"#,
            "protocol version -1 is not supported",
        ),
        (
            r#"{"version":1,"version":1,"command":"status"}"#,
            "malformed request: duplicate field `version`",
        ),
        (
            r#"{"version":null,"command":"status"}"#,
            "malformed request: missing field `version`",
        ),
    ] {
        let answer = parse_request(line);
        assert!(
            answer.as_ref().is_err_and(|m| m.starts_with(expect)),
            "{line:?}: {answer:?}"
        );
    }
}

/// What the properties above found, pinned.
#[test]
fn regressions() {
    let file = Config::parse(&shipped_text(), "config.toml")
        .expect("the shipped example is valid")
        .file;
    let edit = |edit: RuleEdit| apply_rule_edit(&file, edit).map(|(_, _, what)| what);
    // An allow rule ignores its rates, so one beyond TOML's integers was
    // accepted, and `--save` (or `to_toml`) then panicked the daemon.
    let huge = RuleSection {
        cidr: Some("203.0.113.0/24".parse().expect("a prefix")),
        action: Action::Allow,
        pps: Some(1 << 63),
        ..RuleSection::default()
    };
    let refused = edit(RuleEdit::Add { rule: huge }).expect_err("too large to save");
    assert!(
        refused.starts_with("rejected: rules[2].pps: 9223372036854775808 is larger than"),
        "{refused}"
    );
    // A limit rule with a byte rate only ignores burst_packets just as well.
    let bursty = RuleSection {
        action: Action::Limit,
        bytes_per_second: Some(1_000_000),
        burst_packets: u64::MAX,
        ..file.rules[0].clone()
    };
    let refused = edit(RuleEdit::Set { rule: bursty }).expect_err("too large to save");
    assert!(refused.contains("rules[0].burst_packets"), "{refused}");
    // A rule without a cidr to set or remove: said so, not "no the
    // default rule with that match".
    for edit_without_cidr in [
        RuleEdit::Set {
            rule: RuleSection::default(),
        },
        RuleEdit::Remove {
            rule: RuleSection::default(),
        },
    ] {
        let refused = edit(edit_without_cidr).expect_err("no cidr");
        assert!(
            refused.starts_with("a rule needs a cidr")
                || refused.starts_with("a rule to remove needs a cidr or a name"),
            "{refused}"
        );
    }
    let missing = RuleSection {
        cidr: Some("10.9.9.0/24".parse().expect("a prefix")),
        pps: Some(5),
        ..RuleSection::default()
    };
    assert_eq!(
        edit(RuleEdit::Set { rule: missing }),
        Err("the rule for 10.9.9.0/24 with that match does not exist; use `rule add`".into())
    );
    // Key prefix lengths are named as the file spells them, also when a
    // rule's prefix is what they conflict with.
    for (text, expect) in [
        (
            "[limits]\nipv4_prefix = 40\n",
            "limits.ipv4_prefix: IPv4 key prefix length 40",
        ),
        (
            "[limits]\nipv6_prefix = 129\n",
            "limits.ipv6_prefix: IPv6 key prefix length 129",
        ),
        (
            "[limits]\nipv4_prefix = 8\n[[rules]]\ncidr = \"10.10.0.0/16\"\naction = \"allow\"\n",
            "rules[0].cidr: prefix 10.10.0.0/16 is longer than the /8 sources are keyed by \
             (limits.ipv4_prefix)",
        ),
    ] {
        let refused = Config::parse(text, "bad.toml").expect_err(text).to_string();
        assert!(refused.starts_with(expect), "{refused}");
    }
}
