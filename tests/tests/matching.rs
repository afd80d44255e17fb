//! Which rule judges a frame, in the real kernel (BPF_PROG_TEST_RUN): the
//! most specific rule wins whatever the rule order (a longer prefix first,
//! then a match contained in the other), a frame that could belong to
//! several rules is judged by the strictest, and every frame class of a
//! source that one rule judges shares that rule's budget.

use std::net::{Ipv4Addr, Ipv6Addr};

use limiter_common::{Action, Outcome};
use limiter_tests::{
    net,
    packets::{self, Ext, DST4, DST6},
    testrun::{Harness, XDP_DROP, XDP_PASS},
};
use limiter_user::rules::{Match, RuleSet, RuleSpec, PROTO_TCP, PROTO_UDP};

fn matching(protocol: u8, ports: Option<(u16, u16)>) -> Match {
    Match {
        protocol: Some(protocol),
        ports,
        tcp_syn: false,
    }
}

/// A `limit` rule at `pps` for `cidr` and `m`.
fn limit_rule(cidr: &str, m: Match, pps: u64) -> RuleSpec {
    RuleSpec {
        matches: m,
        ..RuleSpec::limit(net(cidr), pps)
    }
}

/// An `allow` or `deny` rule for `cidr` and `m`.
fn action_rule(cidr: &str, m: Match, action: Action) -> RuleSpec {
    RuleSpec {
        matches: m,
        ..RuleSpec::with_action(net(cidr), action)
    }
}

/// A `deny` rule for TCP to port 22 from `cidr`.
fn ssh_deny(cidr: &str) -> RuleSpec {
    action_rule(cidr, matching(PROTO_TCP, Some((22, 22))), Action::Deny)
}

/// Two rules in both orders: what the kernel does may not depend on it.
fn both_orders(a: RuleSpec, b: RuleSpec) -> [Vec<RuleSpec>; 2] {
    [vec![a.clone(), b.clone()], vec![b, a]]
}

fn harness(rules: Vec<RuleSpec>) -> Harness {
    let mut set = RuleSet::with_default(RuleSpec::limit(net("0.0.0.0/0"), 1000));
    set.rules = rules;
    let mut harness = Harness::load();
    harness.push(&set);
    harness
}

fn tcp(src: [u8; 4], port: u16) -> Vec<u8> {
    packets::ipv4_raw(
        Ipv4Addr::from(src),
        DST4,
        PROTO_TCP,
        0,
        false,
        &packets::tcp_header(port, 0x10),
    )
}

fn udp(src: [u8; 4], port: u16) -> Vec<u8> {
    packets::udp_v4(Ipv4Addr::from(src), DST4, port, 10)
}

/// The outcome counters of one frame run through `harness`.
fn outcome_of(harness: &mut Harness, frame: &[u8]) -> Outcome {
    let before: Vec<u64> = Outcome::ALL
        .iter()
        .map(|o| harness.outcome_total(*o).packets)
        .collect();
    harness.run_on_cpu(0, frame);
    let changed: Vec<Outcome> = Outcome::VERDICTS
        .iter()
        .copied()
        .filter(|o| harness.outcome_total(*o).packets != before[*o as usize])
        .collect();
    assert_eq!(changed.len(), 1, "one verdict per frame: {changed:?}");
    changed[0]
}

#[test]
fn a_port_deny_is_not_shadowed_by_a_broader_match_of_the_same_prefix() {
    let tcp_limit = limit_rule("0.0.0.0/0", matching(PROTO_TCP, None), 10_000);
    for rules in both_orders(tcp_limit, ssh_deny("0.0.0.0/0")) {
        let mut harness = harness(rules);
        assert_eq!(
            outcome_of(&mut harness, &tcp([192, 0, 2, 1], 22)),
            Outcome::DroppedDeny,
            "TCP/22 is denied"
        );
        assert_eq!(
            outcome_of(&mut harness, &tcp([192, 0, 2, 1], 80)),
            Outcome::Passed,
            "other TCP is limited, not denied"
        );
    }
}

#[test]
fn overlapping_matches_resolve_the_same_in_any_rule_order() {
    let dns_allow = action_rule(
        "10.0.0.0/8",
        matching(PROTO_UDP, Some((53, 53))),
        Action::Allow,
    );
    let low_deny = action_rule(
        "0.0.0.0/0",
        matching(PROTO_UDP, Some((0, 1023))),
        Action::Deny,
    );
    for rules in both_orders(dns_allow, low_deny) {
        let mut harness = harness(rules);
        assert_eq!(
            outcome_of(&mut harness, &udp([10, 1, 1, 1], 53)),
            Outcome::Allowed
        );
        assert_eq!(
            outcome_of(&mut harness, &udp([10, 1, 1, 1], 123)),
            Outcome::DroppedDeny
        );
        assert_eq!(
            outcome_of(&mut harness, &udp([192, 0, 2, 1], 53)),
            Outcome::DroppedDeny
        );
        assert_eq!(
            outcome_of(&mut harness, &udp([10, 1, 1, 1], 5353)),
            Outcome::Passed,
            "the default rule"
        );
    }
}

#[test]
fn frame_classes_judged_by_one_rule_share_its_budget() {
    // TCP/22 from outside 10/8 falls under the TCP rule, as other TCP does:
    // one budget of 5, not one per class, whatever the rule order.
    let tcp_limit = limit_rule("0.0.0.0/0", matching(PROTO_TCP, None), 5);
    for rules in both_orders(tcp_limit, ssh_deny("10.0.0.0/8")) {
        let mut harness = harness(rules);
        let ssh = tcp([192, 0, 2, 7], 22);
        let web = tcp([192, 0, 2, 7], 80);
        assert_eq!(harness.offer(0, &ssh, 3), (3, 0));
        assert_eq!(harness.offer(0, &web, 3), (2, 1), "5 in all for the source");
        assert_eq!(
            outcome_of(&mut harness, &tcp([10, 0, 0, 7], 22)),
            Outcome::DroppedDeny
        );
    }
}

#[test]
fn tiny_first_fragments_are_keyed_and_limited() {
    let mut set = RuleSet::with_default(RuleSpec::limit(net("0.0.0.0/0"), 5));
    set.rules.push(limit_rule(
        "0.0.0.0/0",
        matching(PROTO_UDP, Some((53, 53))),
        100,
    ));
    let mut harness = Harness::load();
    harness.push(&set);
    // A first fragment (more-fragments set) with 4 bytes of UDP header.
    let tiny = packets::ipv4_raw(
        Ipv4Addr::new(192, 0, 2, 8),
        DST4,
        PROTO_UDP,
        0,
        true,
        &packets::udp_header(9)[..4],
    );
    assert_eq!(harness.offer(0, &tiny, 10), (5, 5), "limited, not passed");
    assert_eq!(harness.outcome_total(Outcome::Malformed).packets, 0);
    assert!(harness
        .traffic()
        .keys()
        .any(|k| k.addr[..4] == [192, 0, 2, 8]));
}

#[test]
fn non_first_fragments_fall_under_a_deny_port_rule() {
    let mut harness = harness(vec![action_rule(
        "0.0.0.0/0",
        matching(PROTO_UDP, Some((53, 53))),
        Action::Deny,
    )]);
    // A non-first fragment (offset 185 * 8 bytes) of `protocol`.
    let fragment = |protocol| {
        packets::ipv4_raw(
            Ipv4Addr::new(192, 0, 2, 9),
            DST4,
            protocol,
            185,
            false,
            &[0u8; 64],
        )
    };
    assert_eq!(harness.run_on_cpu(0, &fragment(PROTO_UDP)), XDP_DROP);
    // TCP fragments could not be DNS: the default rule.
    assert_eq!(
        outcome_of(&mut harness, &fragment(PROTO_TCP)),
        Outcome::Passed
    );
}

fn ssh_deny_harness() -> Harness {
    harness(vec![ssh_deny("::/0")])
}

fn ssh_v6(chain: &[Ext]) -> Vec<u8> {
    packets::ipv6_chain(
        Ipv6Addr::new(0x2001, 0xdb8, 7, 0, 0, 0, 0, 1),
        DST6,
        chain,
        PROTO_TCP,
        &packets::tcp_header(22, 0x02),
    )
}

#[test]
fn long_ipv6_header_chains_and_ah_do_not_hide_the_port() {
    let mut harness = ssh_deny_harness();
    let six = [Ext::DestOptions; 6];
    assert_eq!(harness.run_on_cpu(0, &ssh_v6(&six)), XDP_DROP, "6 headers");
    let mixed = [
        Ext::HopByHop,
        Ext::Routing,
        Ext::Fragment {
            offset: 0,
            more: true,
        },
        Ext::Auth,
        Ext::DestOptions,
    ];
    assert_eq!(
        harness.run_on_cpu(0, &ssh_v6(&mixed)),
        XDP_DROP,
        "AH walked"
    );
    let web = packets::ipv6_chain(
        Ipv6Addr::new(0x2001, 0xdb8, 7, 0, 0, 0, 0, 1),
        DST6,
        &mixed,
        PROTO_TCP,
        &packets::tcp_header(443, 0x02),
    );
    assert_eq!(harness.run_on_cpu(0, &web), XDP_PASS);
}

#[test]
fn a_chain_longer_than_the_walk_is_judged_by_the_strictest_rule() {
    let mut harness = ssh_deny_harness();
    let endless = [Ext::DestOptions; 12];
    assert_eq!(
        outcome_of(&mut harness, &ssh_v6(&endless)),
        Outcome::DroppedDeny
    );
    // So is an IPv6 non-first fragment of TCP: it might be TCP/22.
    let fragment = packets::ipv6_chain(
        Ipv6Addr::new(0x2001, 0xdb8, 7, 0, 0, 0, 0, 1),
        DST6,
        &[Ext::Fragment {
            offset: 100,
            more: false,
        }],
        PROTO_TCP,
        &[0u8; 32],
    );
    assert_eq!(outcome_of(&mut harness, &fragment), Outcome::DroppedDeny);
}

#[test]
fn ipv4_ah_is_walked_to_the_port() {
    let mut harness = harness(vec![ssh_deny("0.0.0.0/0")]);
    let mut ah = vec![PROTO_TCP, 4, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1];
    ah.extend_from_slice(&[0; 12]); // (4 + 2) * 4 = 24 bytes of AH
    ah.extend(packets::tcp_header(22, 0x02));
    let frame = packets::ipv4_raw(Ipv4Addr::new(192, 0, 2, 11), DST4, 51, 0, false, &ah);
    assert_eq!(outcome_of(&mut harness, &frame), Outcome::DroppedDeny);
}
