//! Unit tests of the rule compiler: classes, tries, allowances and leases,
//! overlap resolution and refusals, fingerprints, the cheap tier's frames.

use limiter_common::prefix_mask;

use super::*;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn set(rules: Vec<RuleSpec>) -> RuleSet {
    RuleSet {
        rules,
        ..RuleSet::with_default(RuleSpec::limit(net("0.0.0.0/0"), 1000))
    }
}

fn refs_of<'a>(c: &'a Compiled, prefix: &str) -> &'a RuleRefs {
    let p: IpNet = prefix.parse().unwrap();
    match p {
        IpNet::V4(n) => {
            &c.v4
                .iter()
                .find(|e| e.0 == n.prefix_len() && e.1 == n.network().octets())
                .unwrap()
                .2
        }
        IpNet::V6(n) => {
            &c.v6
                .iter()
                .find(|e| e.0 == n.prefix_len() && e.1 == n.network().octets())
                .unwrap()
                .2
        }
    }
}

#[test]
fn default_only_compiles_to_two_default_routes() {
    let c = compile(&set(vec![]), 0, 2).unwrap();
    assert_eq!(c.rules.len(), 1);
    assert_eq!(c.rules[0].allowance_packets, 1000);
    assert_eq!(c.rules[0].allowance_bytes, UNLIMITED);
    assert_eq!(c.rules[0].bucket_ns, 100_000_000);
    assert_eq!(refs_of(&c, "0.0.0.0/0").rules[0], 0);
    assert_eq!(refs_of(&c, "::/0").rules[0], 0);
    assert_eq!(c.config.class_count, 0);
    assert_eq!(c.config.v6_mask, prefix_mask(64));
}

#[test]
fn longest_prefix_wins_and_classes_fall_back_to_shorter_prefixes() {
    let mut dns = RuleSpec::limit(net("0.0.0.0/0"), 50);
    dns.matches = Match {
        protocol: Some(PROTO_UDP),
        ports: Some((53, 53)),
        tcp_syn: false,
    };
    let allow = RuleSpec::with_action(net("10.0.0.0/8"), Action::Allow);
    let deny = RuleSpec::with_action(net("10.1.0.0/16"), Action::Deny);
    let c = compile(&set(vec![dns, allow, deny]), 256, 2).unwrap();
    assert_eq!(c.config.class_count, 1);
    // 0.0.0.0/0: default for class 0, the DNS rule (index 1) for class 1.
    assert_eq!(refs_of(&c, "0.0.0.0/0").rules[..2], [256, 257]);
    // 10/8: allow (index 2) for both: a longer prefix beats the DNS match.
    assert_eq!(refs_of(&c, "10.0.0.0/8").rules[..2], [258, 258]);
    assert_eq!(refs_of(&c, "10.1.0.0/16").rules[..2], [259, 259]);
    // UDP with unknown ports might be DNS: the DNS rule, the stricter.
    let unresolved = usize::from(UNRESOLVED_BASE + 1);
    assert_eq!(refs_of(&c, "0.0.0.0/0").rules[unresolved], 257);
    assert_eq!(refs_of(&c, "10.1.0.0/16").rules[unresolved], 259);
    // The budgets: the DNS rule counts in its own window.
    assert_eq!(c.rules[1].budget, 1);
    assert_eq!(c.rules[0].budget, 0);
    assert_eq!(c.rules[2].budget, 0);
}

/// A rule for every source (`0.0.0.0/0`) with a match; 100 pps if it
/// limits.
fn with(protocol: Option<u8>, ports: Option<(u16, u16)>, syn: bool, action: Action) -> RuleSpec {
    let any = net("0.0.0.0/0");
    let mut r = if action == Action::Limit {
        RuleSpec::limit(any, 100)
    } else {
        RuleSpec::with_action(any, action)
    };
    r.matches = Match {
        protocol,
        ports,
        tcp_syn: syn,
    };
    r
}

#[test]
fn the_contained_match_wins_whatever_the_order() {
    let tcp = with(Some(PROTO_TCP), None, false, Action::Limit);
    let ssh = with(Some(PROTO_TCP), Some((22, 22)), false, Action::Deny);
    for rules in [
        vec![tcp.clone(), ssh.clone()],
        vec![ssh.clone(), tcp.clone()],
    ] {
        let c = compile(&set(rules.clone()), 0, 2).unwrap();
        let ssh_index = 1 + rules.iter().position(|r| *r == ssh).unwrap() as u32;
        let tcp_index = 1 + rules.iter().position(|r| *r == tcp).unwrap() as u32;
        let class = |port| {
            c.config
                .classify(PROTO_TCP, port, 0, limiter_common::rules::Transport::Known)
        };
        let refs = refs_of(&c, "0.0.0.0/0");
        assert_eq!(refs.rules[usize::from(class(22))], ssh_index);
        assert_eq!(refs.rules[usize::from(class(80))], tcp_index);
    }
}

#[test]
fn overlaps_at_one_prefix_are_rejected_unless_a_rule_covers_the_overlap() {
    let syn = with(Some(PROTO_TCP), None, true, Action::Limit);
    let ssh = with(Some(PROTO_TCP), Some((22, 22)), false, Action::Deny);
    let err = compile(&set(vec![syn.clone(), ssh.clone()]), 0, 2).unwrap_err();
    assert!(
        matches!(&err, RuleError::Overlap(o) if o.rule == "rules[0]" && o.other == "rules[1]"),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("TCP SYN to port 22"), "{text}");
    // At different prefixes the longer prefix decides: accepted.
    let mut ssh10 = ssh.clone();
    ssh10.cidr = net("10.0.0.0/8");
    compile(&set(vec![syn.clone(), ssh10]), 0, 2).unwrap();
    // A rule for the overlap resolves it.
    let both = with(Some(PROTO_TCP), Some((22, 22)), true, Action::Deny);
    compile(&set(vec![syn, ssh, both]), 0, 2).unwrap();
    // Partial port ranges overlap as well.
    let low = with(Some(PROTO_UDP), Some((0, 1023)), false, Action::Limit);
    let mid = with(Some(PROTO_UDP), Some((500, 2000)), false, Action::Limit);
    assert!(matches!(
        compile(&set(vec![low, mid]), 0, 2),
        Err(RuleError::Overlap(_))
    ));
}

#[test]
fn unresolved_frames_get_the_strictest_rule_they_could_fall_under() {
    use limiter_common::rules::{Transport, UNKNOWN_PROTOCOL_CLASS};
    let unresolved_rule = |rules: Vec<RuleSpec>| {
        let c = compile(&set(rules), 0, 2).unwrap();
        let class = c.config.classify(PROTO_TCP, 0, 0, Transport::PortUnknown);
        assert!(class >= UNRESOLVED_BASE);
        let refs = refs_of(&c, "0.0.0.0/0");
        let unknown = refs.rules[usize::from(UNKNOWN_PROTOCOL_CLASS)];
        (refs.rules[usize::from(class)], unknown)
    };
    let web = with(Some(PROTO_TCP), Some((443, 443)), false, Action::Allow);
    let mut slow = with(Some(PROTO_TCP), Some((8000, 8999)), false, Action::Limit);
    slow.limits.pps = Some(10);
    assert_eq!(
        unresolved_rule(vec![web.clone(), slow.clone()]),
        (2, 2),
        "10 pps beats 1000 pps and allow"
    );
    // An enforced deny beats everything; a dry-run one only allow.
    let mut deny = with(Some(PROTO_TCP), Some((22, 22)), false, Action::Deny);
    assert_eq!(
        unresolved_rule(vec![web.clone(), slow.clone(), deny.clone()]),
        (3, 3)
    );
    deny.dry_run = true;
    assert_eq!(unresolved_rule(vec![web, slow, deny]), (2, 2));
}

#[test]
fn fingerprints_follow_what_a_rule_is_and_does() {
    let a = RuleSpec::limit(net("192.0.2.0/24"), 100);
    let b = RuleSpec::limit(net("198.51.100.0/24"), 100);
    let c1 = compile(&set(vec![a.clone(), b.clone()]), 0, 2).unwrap();
    let c2 = compile(&set(vec![b.clone(), a.clone()]), 256, 2).unwrap();
    assert_eq!(
        c1.rules[1].fingerprint, c2.rules[2].fingerprint,
        "order and half do not matter"
    );
    assert_ne!(
        c1.rules[1].fingerprint, c1.rules[2].fingerprint,
        "the prefix does"
    );
    let mut faster = a.clone();
    faster.limits.pps = Some(200);
    let c3 = compile(&set(vec![faster]), 0, 2).unwrap();
    assert_ne!(
        c3.rules[1].fingerprint, c1.rules[1].fingerprint,
        "the limit does"
    );
    let mut dry = set(vec![a]);
    dry.dry_run = true;
    let c4 = compile(&dry, 0, 2).unwrap();
    assert_ne!(
        c4.rules[1].fingerprint, c1.rules[1].fingerprint,
        "global dry-run does"
    );
    assert!(c1
        .rules
        .iter()
        .all(|r| r.fingerprint != 0 && r.block_tag == 0));
}

#[test]
fn invalid_rules_are_rejected_with_the_rule_named() {
    let ten_pps = || RuleSpec::limit(net("192.0.2.0/24"), 10);
    // The error of a valid rule (`ten_pps`) after `change`.
    let refusal = |change: fn(&mut RuleSpec)| {
        let mut rule = ten_pps();
        change(&mut rule);
        compile(&set(vec![rule]), 0, 2).unwrap_err()
    };
    assert!(
        matches!(refusal(|r| r.limits.window = Duration::from_secs(61)), RuleError::Window { rule, .. } if rule == "rules[0]")
    );
    assert!(matches!(
        refusal(|r| r.matches.ports = Some((100, 10))),
        RuleError::PortsReversed { .. }
    ));
    assert!(matches!(
        refusal(|r| {
            r.matches.ports = Some((1, 10));
            r.matches.protocol = Some(PROTO_ICMP);
        }),
        RuleError::PortsNeedTcpOrUdp { .. }
    ));
    assert!(matches!(
        refusal(|r| r.limits.pps = Some(0)),
        RuleError::Zero { .. }
    ));
    assert!(matches!(
        refusal(|r| r.limits.pps = None),
        RuleError::NoLimit { .. }
    ));
    assert!(matches!(
        refusal(|r| r.limits.pps = Some(u64::MAX / 2)),
        RuleError::TooLarge { .. }
    ));
    assert!(matches!(
        refusal(|r| r.cidr = net("2001:db8::/96")),
        RuleError::PrefixTooLong { key_len: 64, .. }
    ));
    assert!(matches!(
        compile(&set(vec![ten_pps(), ten_pps()]), 0, 2),
        Err(RuleError::Duplicate { .. })
    ));
    assert_eq!(
        refusal(|r| r.cidr = net("10.0.0.1/8")).to_string(),
        "rules[0].cidr: 10.0.0.1/8 has host bits set (did you mean 10.0.0.0/8?)"
    );
    assert!(refusal(|r| r.matches.protocol = Some(0))
        .to_string()
        .starts_with("rules[0].protocol: 0 is not a protocol"));

    assert!(
        refusal(|r| r.limits.block = Some(Duration::from_secs(25 * 3600)))
            .to_string()
            .starts_with("rules[0].block: 90000s is longer than the maximum 24h")
    );
    let mut day = ten_pps();
    day.limits.block = Some(MAX_BLOCK);
    assert_eq!(
        compile(&set(vec![day]), 0, 2).unwrap().rules[1].block_ns,
        86_400_000_000_000
    );

    let err = refusal(|r| {
        r.limits.bytes_per_second = Some(1000);
        r.limits.burst_bytes = 500;
    });
    assert!(
        err.to_string().starts_with(
            "rules[0].bytes_per_second: 1500 bytes per window cannot admit one full-size frame"
        ),
        "{err}"
    );
    let mut tiny = ten_pps();
    tiny.limits.bytes_per_second = Some(1000);
    tiny.limits.burst_bytes = 518;
    compile(&set(vec![tiny]), 0, 2).unwrap();

    let classes: Vec<RuleSpec> = (0..5)
        .map(|i| {
            let mut r = RuleSpec::limit(net("0.0.0.0/0"), 10);
            r.matches.protocol = Some(PROTO_UDP);
            r.matches.ports = Some((i, i));
            r
        })
        .collect();
    assert_eq!(compile(&set(classes), 0, 2), Err(RuleError::TooManyClasses));

    let mut s = set(vec![]);
    s.buckets_per_window = 16;
    assert_eq!(compile(&s, 0, 2), Err(RuleError::Buckets(16)));
}

#[test]
fn allowances_include_window_and_burst() {
    let mut r = RuleSpec::limit(net("192.0.2.0/24"), 100);
    r.limits.window = Duration::from_secs(10);
    r.limits.burst_packets = 50;
    r.limits.bytes_per_second = Some(1_000_000);
    r.limits.burst_bytes = 1500;
    r.limits.block = Some(Duration::from_secs(30));
    let c = compile(&set(vec![r]), 0, 2).unwrap();
    assert_eq!(c.rules[1].allowance_packets, 1050);
    assert_eq!(c.rules[1].allowance_bytes, 10_001_500);
    assert_eq!(c.rules[1].bucket_ns, 1_000_000_000);
    assert_eq!(c.rules[1].block_ns, 30_000_000_000);
    assert_eq!(c.rules[1].lease_packets, 1, "no leases with a byte limit");
}

#[test]
fn leases_hold_back_under_one_percent() {
    let big = RuleSpec::limit(net("192.0.2.0/24"), 10_000_000);
    let c = compile(&set(vec![big]), 0, 4).unwrap();
    let rule = &c.rules[1];
    assert_eq!(rule.lease_packets, 10_000_000 / (4 * 11 * 128));
    let held_back = u64::from(rule.lease_packets) * 4 * 11;
    assert!(held_back * 100 < rule.allowance_packets);
    assert_eq!(c.rules[0].lease_packets, 1, "1000 pps: no lease");
}

/// `set(rules)` with the tiers off.
fn untiered(rules: Vec<RuleSpec>) -> RuleSet {
    RuleSet {
        tiered: false,
        ..set(rules)
    }
}

/// The `cheap_frames` a set compiles for `rule` (as `rules[0]`).
fn cheap_frames_of(rule: RuleSpec) -> u8 {
    compile(&set(vec![rule]), 0, 2).unwrap().rules[1].cheap_frames
}

/// A limit rule for 192.0.2.0/24 with `change` applied.
fn limit_with(pps: u64, change: impl FnOnce(&mut Limits)) -> RuleSpec {
    let mut rule = RuleSpec::limit(net("192.0.2.0/24"), pps);
    change(&mut rule.limits);
    rule
}

/// A limit's cheap frames are never counted in its windows, so they are
/// sized by what they may add to one: `T` over any two epochs, in each of
/// the pairs of epochs a window overlaps (one for a window of up to an
/// epoch), at most a tenth of the allowance, at most 16, whatever the
/// limit's penalty or scope (a cluster-scoped one is capped to the cold
/// cap in the kernel too).
#[test]
fn cheap_frames_of_a_packet_limit_over_one_epoch_are_a_tenth_of_its_allowance_up_to_16() {
    assert_eq!(cheap_frames_of(limit_with(9, |_| {})), 0, "under 10: none");
    assert_eq!(cheap_frames_of(limit_with(10, |_| {})), 1);
    assert_eq!(cheap_frames_of(limit_with(100, |_| {})), 10);
    assert_eq!(
        cheap_frames_of(limit_with(100_000, |_| {})),
        MAX_CHEAP_FRAMES as u8,
        "capped"
    );
    assert_eq!(
        cheap_frames_of(limit_with(10, |l| l.burst_packets = 10)),
        2,
        "the burst counts"
    );
    assert_eq!(
        cheap_frames_of(limit_with(100, |l| l.block = Some(Duration::from_secs(30)))),
        10,
        "a penalty changes nothing"
    );
    assert_eq!(
        cheap_frames_of(cluster(limit_with(100, |_| {}))),
        10,
        "nor does cluster scope"
    );
}

/// A window of more than one epoch overlaps more pairs of epochs:
/// floor(allowance / (10 * ceil((ceil(W / 1 s) + 1) / 2))).
#[test]
fn cheap_frames_of_longer_windows_keep_under_a_tenth_of_a_window_over_its_pairs_of_epochs() {
    // The pairs a window overlaps: 10 s 11 epochs, 6 pairs; 1.5 s three
    // epochs (as 2 s), 2 pairs; 60 s, 31 pairs.
    assert_eq!(
        cheap_frames_of(limit_with(100, |l| l.window = Duration::from_secs(10))),
        16,
        "1000 / (10 * 6), capped"
    );
    assert_eq!(
        cheap_frames_of(limit_with(10, |l| l.window = Duration::from_secs(10))),
        1,
        "100 / (10 * 6)"
    );
    assert_eq!(
        cheap_frames_of(limit_with(100, |l| l.window = Duration::from_millis(1500))),
        7,
        "150 / (10 * 2)"
    );
    assert_eq!(
        cheap_frames_of(limit_with(1, |l| l.window = Duration::from_secs(60))),
        0,
        "60 / (10 * 31): 60 a minute sees every frame"
    );
    assert_eq!(
        cheap_frames_of(limit_with(100, |l| l.window = Duration::from_secs(60))),
        16,
        "6000 / (10 * 31), capped"
    );
}

/// A level that counts per source (`source`, `pair`) bounds the cheap
/// frames too, as a window of its own (the cheap tier skips those levels);
/// an aggregate does not (the cheap tier counts every frame in it).
#[test]
fn cheap_frames_fit_the_levels_that_count_per_source() {
    let with = |level: &str| RuleSpec {
        levels: vec![level.parse().expect("a level")],
        ..limit_with(1_000, |_| {})
    };
    assert_eq!(
        cheap_frames_of(with("source:500@100ms")),
        5,
        "50 a window of 100 ms"
    );
    assert_eq!(cheap_frames_of(with("pair:30")), 3);
    assert_eq!(cheap_frames_of(with("prefix/24:50")), 16, "aggregates: no");
}

#[test]
fn cheap_frames_under_a_byte_limit_count_each_frame_as_4096_bytes() {
    let bytes = |bps: u64| {
        let mut rule = limit_with(1, |l| l.bytes_per_second = Some(bps));
        rule.limits.pps = None;
        cheap_frames_of(rule)
    };
    assert_eq!(bytes(400_000), 9, "400 kB / (10 * 4096)");
    assert_eq!(bytes(40_000), 0, "under ten frames of 4096 bytes");
    // Both limits: the stricter share.
    assert_eq!(
        cheap_frames_of(limit_with(100_000, |l| l.bytes_per_second = Some(400_000))),
        9
    );
}

#[test]
fn cheap_frames_are_the_stateless_threshold_for_allow_and_deny() {
    for action in [Action::Allow, Action::Deny] {
        assert_eq!(
            cheap_frames_of(RuleSpec::with_action(net("192.0.2.0/24"), action)),
            sketch::HOT_FRAMES as u8,
            "{action:?}"
        );
    }
}

#[test]
fn cheap_max_is_the_largest_cheap_frames_and_untiered_sets_have_none() {
    let rules = vec![
        limit_with(10_000, |_| {}),
        RuleSpec::limit(net("198.51.100.0/24"), 10),
    ];
    let c = compile(&set(rules.clone()), 0, 2).unwrap();
    assert!(c.config.tiered());
    let cheap: Vec<u8> = c.rules.iter().map(|r| r.cheap_frames).collect();
    assert_eq!(cheap, [16, 16, 1], "default 1000 pps, 10,000 pps, 10 pps");
    assert_eq!(c.config.cheap_max, 16);

    let mut with_allow = rules.clone();
    with_allow.push(RuleSpec::with_action(net("203.0.113.0/24"), Action::Allow));
    let c = compile(&set(with_allow.clone()), 0, 2).unwrap();
    assert_eq!(c.config.cheap_max, sketch::HOT_FRAMES as u8);

    let c = compile(&untiered(with_allow), 0, 2).unwrap();
    assert!(!c.config.tiered());
    assert_eq!(c.config.cheap_max, 0);
    assert!(
        c.rules.iter().all(|r| r.cheap_frames == 0),
        "tiers off: no cheap frames anywhere"
    );
}

/// `rule` made cluster-scoped.
fn cluster(mut rule: RuleSpec) -> RuleSpec {
    rule.scope = Scope::Cluster;
    rule
}

#[test]
fn a_cluster_scoped_rule_compiles_with_its_scope() {
    let node = limit_with(100_000, |_| {});
    let c = compile(&set(vec![node, cluster(net_rule("198.51.100.0/24"))]), 0, 2).unwrap();
    assert_eq!(c.rules[0].scope(), Some(Scope::Node), "the default");
    assert_eq!(c.rules[1].scope(), Some(Scope::Node));
    assert_eq!(c.rules[2].scope(), Some(Scope::Cluster));
    assert_eq!(
        c.rules[2].cheap_frames, c.rules[1].cheap_frames,
        "cheap frames as a node limit's"
    );
    // The default rule may be cluster-scoped too.
    let mut all = set(vec![]);
    all.default.scope = Scope::Cluster;
    assert_eq!(
        compile(&all, 0, 2).unwrap().rules[0].scope(),
        Some(Scope::Cluster)
    );
}

/// A 100,000 pps limit for `cidr`.
fn net_rule(cidr: &str) -> RuleSpec {
    RuleSpec::limit(net(cidr), 100_000)
}

#[test]
fn a_change_of_scope_is_a_changed_rule_and_node_fingerprints_are_as_before() {
    let a = RuleSpec::limit(net("192.0.2.0/24"), 100);
    let node = compile(&set(vec![a.clone()]), 0, 2).unwrap();
    let shared = compile(&set(vec![cluster(a)]), 0, 2).unwrap();
    assert_ne!(node.rules[1].fingerprint, shared.rules[1].fingerprint);
    assert_eq!(
        node.rules[0].fingerprint, shared.rules[0].fingerprint,
        "the other rules are unchanged"
    );
    // FNV-1a of the prefix, the match and the compiled values, as before
    // scopes existed: an upgrade does not make every node rule "changed"
    // (which would restart every source's window).
    assert_eq!(node.rules[1].fingerprint, 17_174_103_617_853_971_262);
}

#[test]
fn cluster_scoped_rules_are_packet_limits_without_penalties() {
    let ten_pps = || cluster(RuleSpec::limit(net("192.0.2.0/24"), 10));
    let error = |rule: RuleSpec| compile(&set(vec![rule]), 0, 2).unwrap_err();
    for action in [Action::Allow, Action::Deny] {
        let rule = cluster(RuleSpec::with_action(net("192.0.2.0/24"), action));
        assert_eq!(
            error(rule),
            RuleError::ClusterNotLimit {
                rule: "rules[0]".into(),
                action
            }
        );
    }
    let mut blocking = ten_pps();
    blocking.limits.block = Some(Duration::from_secs(30));
    assert_eq!(
        error(blocking),
        RuleError::ClusterBlock {
            rule: "rules[0]".into()
        }
    );
    let mut bytes = ten_pps();
    bytes.limits.bytes_per_second = Some(1_000_000);
    assert_eq!(
        error(bytes),
        RuleError::ClusterBytes {
            rule: "rules[0]".into()
        }
    );
    let mut bytes_only = ten_pps();
    bytes_only.limits.pps = None;
    bytes_only.limits.bytes_per_second = Some(1_000_000);
    assert!(matches!(error(bytes_only), RuleError::ClusterBytes { .. }));
    let mut nothing = ten_pps();
    nothing.limits.pps = None;
    assert_eq!(
        error(nothing),
        RuleError::ClusterNoPps {
            rule: "rules[0]".into()
        }
    );
    // Bursts, matches and dry-run are fine.
    let mut dns = ten_pps();
    dns.limits.burst_packets = 5;
    dns.dry_run = true;
    dns.matches = Match {
        protocol: Some(PROTO_UDP),
        ports: Some((53, 53)),
        tcp_syn: false,
    };
    let c = compile(&set(vec![dns]), 0, 2).unwrap();
    assert_eq!(c.rules[1].allowance_packets, 15);
    assert_eq!(c.rules[1].scope(), Some(Scope::Cluster));
}
