//! Unit tests of the control protocol: round trips, the forms older
//! peers send and expect, and refusals of bad requests.

use super::*;

#[test]
fn requests_round_trip() {
    for request in [
        Request::Status,
        Request::Top {
            limit: 5,
            level: None,
        },
        Request::Top {
            limit: 5,
            level: Some("/24".into()),
        },
        Request::Mode {
            dry_run: true,
            save: false,
            guards: Vec::new(),
            guard_for: None,
        },
        Request::Mode {
            dry_run: false,
            save: false,
            guards: vec!["dropped_share <= 5%".into()],
            guard_for: Some(Duration::from_secs(600)),
        },
        Request::Reload,
    ] {
        let line = serde_json::to_string(&RequestLine {
            version: PROTOCOL_VERSION,
            request: request.clone(),
        })
        .unwrap();
        assert_eq!(parse_request(&line), Ok(request));
    }
    assert_eq!(
        serde_json::to_string(&RequestLine {
            version: 1,
            request: Request::Status
        })
        .unwrap(),
        r#"{"version":1,"command":"status"}"#
    );
    // `top` without a level is spelled as before levels, so an older
    // daemon still answers it.
    assert_eq!(
        serde_json::to_string(&RequestLine {
            version: 1,
            request: Request::Top {
                limit: 5,
                level: None
            }
        })
        .unwrap(),
        r#"{"version":1,"command":"top","limit":5}"#
    );
}

#[test]
fn a_rule_edit_carries_its_scope_and_a_node_rule_is_spelled_as_before() {
    use limiter_common::Scope;
    let rule = RuleSection {
        cidr: Some("192.0.2.0/24".parse().unwrap()),
        pps: Some(10),
        scope: Scope::Cluster,
        ..RuleSection::default()
    };
    let request = Request::Rules {
        edit: RuleEdit::Add { rule: rule.clone() },
        save: true,
    };
    let line = serde_json::to_string(&RequestLine {
        version: PROTOCOL_VERSION,
        request: request.clone(),
    })
    .unwrap();
    assert!(line.contains(r#""scope":"cluster""#), "{line}");
    assert_eq!(parse_request(&line), Ok(request));
    // A node rule leaves scope out, as a client older than scopes
    // sends it; such a request still means node.
    let node = RuleSection {
        scope: Scope::Node,
        ..rule
    };
    let line = serde_json::to_string(&RequestLine {
        version: PROTOCOL_VERSION,
        request: Request::Rules {
            edit: RuleEdit::Set { rule: node.clone() },
            save: false,
        },
    })
    .unwrap();
    assert!(!line.contains("scope"), "{line}");
    let Ok(Request::Rules {
        edit: RuleEdit::Set { rule },
        ..
    }) = parse_request(&line)
    else {
        panic!("{line}")
    };
    assert_eq!(rule.scope, Scope::Node);
    let err = parse_request(
        r#"{"version":1,"command":"rules","save":false,"edit":{"op":"add","rule":{"cidr":"10.0.0.0/8","pps":1,"scope":"galaxy"}}}"#,
    )
    .unwrap_err();
    assert!(err.contains("unknown variant `galaxy`"), "{err}");
}

#[test]
fn status_carries_the_cluster_block_configured_or_not() {
    let config = crate::config::Config::parse(
        "[cluster]\nredis = [\"redis://:pw@10.0.0.1:6380\"]\nnode = \"edge-1\"\n\n\
         [default]\npps = 10\nscope = \"cluster\"\n",
        "t",
    )
    .unwrap();
    let with = Status {
        cluster: ClusterStatus::new(config.cluster.as_ref(), 1),
        ..Status::default()
    };
    let value =
        serde_json::to_value(ResponseLine::ok(Reply::Status(Box::new(with.clone())))).unwrap();
    let cluster = &value["ok"]["cluster"];
    assert_eq!(cluster["configured"], true);
    assert_eq!(cluster["cluster_rules"], 1);
    assert_eq!(cluster["node"], "edge-1");
    assert_eq!(cluster["mode"], "single");
    assert_eq!(cluster["redis"][0], "redis://:***@10.0.0.1:6380");
    assert_eq!(cluster["sync_interval"], "100ms");
    assert_eq!(cluster["timeout"], "50ms");
    assert_eq!(cluster["threshold"], 0.25);
    assert_eq!(cluster["fallback"], "split");
    assert_eq!(cluster["grace"], "10s");
    assert!(!value.to_string().contains("pw"), "{value}");
    let back: ResponseLine = serde_json::from_value(value).unwrap();
    assert_eq!(back.response, Response::Ok(Reply::Status(Box::new(with))));

    let without = Status::default();
    let value = serde_json::to_value(&without).unwrap();
    assert_eq!(
        value["cluster"],
        serde_json::json!({"configured": false, "cluster_rules": 0})
    );
    assert_eq!(serde_json::from_value::<Status>(value).unwrap(), without);
    // A daemon older than cluster scopes sends no block at all.
    let old = r#"{"version":"0","generation":1,"dry_run":false,"rules":1,"interfaces":[]}"#;
    let old: Status = serde_json::from_str(old).unwrap();
    assert!(!old.cluster.configured);
}

#[test]
fn status_carries_the_rules_levels_only_when_some_rule_has_them() {
    let with = Status {
        rule_levels: vec![RuleLevelsStatus {
            rule: "rules[0]".into(),
            levels: vec!["prefix/24/48:2000".into(), "source:20000@1m".into()],
        }],
        ..Status::default()
    };
    let value = serde_json::to_value(&with).unwrap();
    assert_eq!(
        value["rule_levels"],
        serde_json::json!([{"rule": "rules[0]", "levels": ["prefix/24/48:2000", "source:20000@1m"]}])
    );
    assert_eq!(serde_json::from_value::<Status>(value).unwrap(), with);
    let value = serde_json::to_value(Status::default()).unwrap();
    assert!(value.get("rule_levels").is_none(), "{value}");
    // A daemon older than levels sends none.
    let old = r#"{"version":"0","generation":1,"dry_run":false,"rules":1,"interfaces":[]}"#;
    assert!(serde_json::from_str::<Status>(old)
        .unwrap()
        .rule_levels
        .is_empty());
}

#[test]
fn rule_edits_carry_levels_in_their_grammar_and_a_malformed_one_as_written() {
    let line = serde_json::to_string(&RequestLine {
        version: PROTOCOL_VERSION,
        request: Request::Rules {
            edit: RuleEdit::Add {
                rule: RuleSection {
                    cidr: Some("10.0.0.0/8".parse().unwrap()),
                    pps: Some(10),
                    levels: vec!["prefix/24:2000".into()],
                    ..RuleSection::default()
                },
            },
            save: false,
        },
    })
    .unwrap();
    assert!(line.contains(r#""levels":["prefix/24/48:2000"]"#), "{line}");
    let Ok(Request::Rules {
        edit: RuleEdit::Add { rule },
        ..
    }) = parse_request(&line)
    else {
        panic!("{line}")
    };
    assert!(rule.levels[0].spec().is_ok(), "{rule:?}");
    // A malformed level reaches the daemon's validation, which names
    // its field (`rules[N].levels[0]`).
    let Ok(Request::Rules {
        edit: RuleEdit::Add { rule },
        ..
    }) = parse_request(
        r#"{"version":1,"command":"rules","save":false,"edit":{"op":"add","rule":{"cidr":"10.0.0.0/8","pps":1,"levels":["nonsense"]}}}"#,
    )
    else {
        panic!("a string is a level entry")
    };
    let err = rule.levels[0].spec().unwrap_err();
    assert!(err.contains("\"nonsense\" is not a level"), "{err}");
    assert_eq!(rule.levels[0].to_string(), "nonsense");
}

#[test]
fn bad_requests_are_explained() {
    for (line, expect) in [
        ("not json", "malformed request"),
        (r#"{"command":"status"}"#, "missing field `version`"),
        (
            r#"{"version":9,"command":"status"}"#,
            "protocol version 9 is not supported",
        ),
        (
            r#"{"version":1,"command":"format-disk"}"#,
            "unknown variant `format-disk`",
        ),
        (r#"{"version":1,"command":"top"}"#, "missing field `limit`"),
        (
            r#"{"version":1,"command":"mode","dry_run":"yes"}"#,
            "invalid type",
        ),
    ] {
        let err = parse_request(line).expect_err(line);
        assert!(err.contains(expect), "{line}: {err}");
    }
}

#[test]
fn request_keys_are_the_keys_requests_have() {
    fn keys(value: &serde_json::Value, out: &mut Vec<String>) {
        for (key, value) in value.as_object().into_iter().flatten() {
            out.push(key.clone());
            if key != "rule" {
                keys(value, out);
            }
        }
    }
    let rule = RuleSection::default();
    let edits = [
        RuleEdit::Add { rule: rule.clone() },
        RuleEdit::Set { rule: rule.clone() },
        RuleEdit::Remove { rule: rule.clone() },
        RuleEdit::Default { rule },
    ];
    let requests = [
        Request::Status,
        Request::Top {
            limit: 1,
            level: Some("prefix/24".into()),
        },
        Request::Mode {
            dry_run: false,
            save: true,
            guards: vec!["limited_sources <= 1%".into()],
            guard_for: Some(Duration::from_secs(60)),
        },
        Request::Reload,
        Request::RuleList,
        Request::Detach,
        Request::Unblock {
            cidr: "192.0.2.0/24".parse().unwrap(),
        },
        Request::Ban {
            cidr: "192.0.2.0/24".parse().unwrap(),
            duration: Some(Duration::from_secs(60)),
            reason: "sshd".into(),
        },
        Request::Unban {
            cidr: "192.0.2.0/24".parse().unwrap(),
            missing_ok: true,
        },
        Request::Bans,
        Request::ListEdit {
            list: "office".into(),
            op: crate::proto::ListOp::Add,
            prefixes: vec!["192.0.2.0/24".parse().unwrap()],
            save: true,
        },
        Request::Suggest {
            rule: Some("default".into()),
            since: Some(Duration::from_secs(3600)),
            quantile: 0.999,
            headroom: 2.0,
            apply: true,
        },
    ]
    .into_iter()
    .chain(edits.map(|edit| Request::Rules { edit, save: true }));
    let mut seen = Vec::new();
    for request in requests {
        let line = RequestLine {
            version: PROTOCOL_VERSION,
            request,
        };
        keys(&serde_json::to_value(line).unwrap(), &mut seen);
    }
    seen.sort_unstable();
    seen.dedup();
    let mut want = REQUEST_KEYS.to_vec();
    want.sort_unstable();
    assert_eq!(seen, want);
}

#[test]
fn a_suggest_request_and_its_answer_round_trip() {
    let request = Request::Suggest {
        rule: None,
        since: Some(Duration::from_secs(600)),
        quantile: 0.99,
        headroom: 2.0,
        apply: false,
    };
    let line = serde_json::to_string(&RequestLine {
        version: PROTOCOL_VERSION,
        request: request.clone(),
    })
    .unwrap();
    assert_eq!(
        line,
        r#"{"version":1,"command":"suggest","since":"10m","quantile":0.99,"headroom":2.0,"apply":false}"#
    );
    assert_eq!(parse_request(&line), Ok(request));
    let reply = Reply::Suggestions(Box::new(Suggestions {
        horizon: Duration::from_secs(3600),
        since: Duration::from_secs(600),
        quantile: 0.99,
        headroom: 2.0,
        rules: vec![RuleSuggestion {
            rule: "default".into(),
            current_pps: Some(100),
            sources: 4,
            samples: 10,
            refused_samples: 1,
            refused_max_pps: Some(511),
            quantile_pps: Some(103),
            proposed_pps: Some(210),
            proposed: Some(LimitEffect::default()),
            current: Some(LimitEffect {
                limited_sources_share: 0.1,
                limited_traffic_share: 0.01,
            }),
        }],
        sampled_share: 0.5,
        active_sources: Some(1_200),
        applied: None,
    }));
    let text = serde_json::to_string(&ResponseLine::ok(reply.clone())).unwrap();
    let back: ResponseLine = serde_json::from_str(&text).unwrap();
    assert_eq!(back.response, Response::Ok(reply));
}
