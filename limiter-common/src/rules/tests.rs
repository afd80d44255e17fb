//! Host tests of the rule types: classification, sizes, encodings.

use super::*;
use crate::prefix_mask;

fn class(protocol: u8, ports: (u16, u16), syn: bool) -> TrafficClass {
    TrafficClass::new(protocol, ports.0, ports.1, syn)
}

#[test]
fn classes_match_protocol_ports_and_syn() {
    let dns = class(IPPROTO_UDP, (53, 53), false);
    assert!(dns.matches(IPPROTO_UDP, 53, 0));
    assert!(!dns.matches(IPPROTO_UDP, 54, 0));
    assert!(!dns.matches(IPPROTO_TCP, 53, 0));

    let syn = class(IPPROTO_TCP, (0, u16::MAX), true);
    assert!(syn.matches(IPPROTO_TCP, 80, TCP_FLAG_SYN));
    assert!(!syn.matches(IPPROTO_TCP, 80, TCP_FLAG_SYN | TCP_FLAG_ACK));
    assert!(!syn.matches(IPPROTO_UDP, 80, TCP_FLAG_SYN));

    let web = class(0, (80, 443), false);
    assert!(web.matches(IPPROTO_TCP, 443, 0));
    assert!(web.matches(IPPROTO_UDP, 80, 0));
    assert!(!web.matches(1, 0, 0), "ICMP has no ports");

    let icmp = class(1, (0, u16::MAX), false);
    assert!(icmp.matches(1, 0, 0));
}

fn config(classes: &[TrafficClass]) -> Config {
    let mut config = Config {
        class_count: classes.len() as u8,
        ..Config::default()
    };
    config.classes[..classes.len()].copy_from_slice(classes);
    config
}

#[test]
fn a_frame_class_is_the_set_of_matches_it_satisfies() {
    let tcp = class(IPPROTO_TCP, (0, u16::MAX), false);
    let ssh = class(IPPROTO_TCP, (22, 22), false);
    let syn = class(IPPROTO_TCP, (0, u16::MAX), true);
    let config = config(&[tcp, ssh, syn]);
    let known = Transport::Known;
    assert_eq!(config.classify(IPPROTO_TCP, 80, 0, known), 0b001);
    assert_eq!(config.classify(IPPROTO_TCP, 22, 0, known), 0b011);
    assert_eq!(config.classify(IPPROTO_TCP, 22, TCP_FLAG_SYN, known), 0b111);
    assert_eq!(config.classify(IPPROTO_UDP, 22, 0, known), 0);
    // Ports unknown: tcp surely matches, ssh and syn might.
    assert_eq!(
        config.classify(IPPROTO_TCP, 0, 0, Transport::PortUnknown),
        UNRESOLVED_BASE + 0b111
    );
    // No match a UDP frame might satisfy depends on ports: resolved.
    assert_eq!(
        config.classify(IPPROTO_UDP, 0, 0, Transport::PortUnknown),
        0
    );
    assert_eq!(
        config.classify(0, 0, 0, Transport::ProtocolUnknown),
        UNKNOWN_PROTOCOL_CLASS
    );
    // Without matches every frame is class 0.
    let none = Config::default();
    assert_eq!(
        none.classify(IPPROTO_TCP, 0, 0, Transport::ProtocolUnknown),
        0
    );
    assert_eq!(none.classify(IPPROTO_TCP, 0, 0, Transport::PortUnknown), 0);
}

#[test]
fn classes_beyond_the_count_are_ignored() {
    let mut config = config(&[class(IPPROTO_UDP, (53, 53), false)]);
    config.classes[1] = class(IPPROTO_UDP, (0, 1023), false);
    assert_eq!(config.classify(IPPROTO_UDP, 53, 0, Transport::Known), 1);
    assert_eq!(config.classify(IPPROTO_UDP, 123, 0, Transport::Known), 0);
}

#[test]
fn prefix_keys_carry_the_generation_half() {
    assert_eq!(prefix_key_v4(3, [10, 0, 0, 1]), [1, 10, 0, 0, 1]);
    assert_eq!(prefix_key_v4(4, [10, 0, 0, 1])[0], 0);
    let v6 = prefix_key_v6(1, &[0xff; 16]);
    assert_eq!(v6[0], 1);
    assert_eq!(&v6[1..], &[0xff; 16]);
    assert_eq!(rules_base(1), MAX_RULES);
    assert_eq!(rules_base(2), 0);
    assert_eq!((half(0), half(1), half(u32::MAX)), (0, 1, 1));
}

#[cfg(feature = "user")]
#[test]
fn actions_go_by_their_lowercase_names() {
    use clap::ValueEnum;
    for action in [Action::Limit, Action::Allow, Action::Deny] {
        let json = serde_json::to_string(&action).expect("serialises");
        assert_eq!(json, std::format!("\"{}\"", action.name()));
        assert_eq!(serde_json::from_str::<Action>(&json).ok(), Some(action));
        assert_eq!(Action::from_str(action.name(), false), Ok(action));
        let value = action.to_possible_value().expect("a possible value");
        assert_eq!(value.get_name(), action.name());
    }
}

#[test]
fn encoded_bytes_read_back_typed() {
    let mut rule = Rule::new(Action::Deny, true);
    assert_eq!(rule.action(), Some(Action::Deny));
    assert!(rule.dry_run() && rule.is_dry_run(false));
    rule.set_action(Action::Allow);
    rule.set_dry_run(false);
    assert_eq!(rule.action(), Some(Action::Allow));
    assert!(!rule.is_dry_run(false) && rule.is_dry_run(true));
    assert_eq!(Rule::default().action(), Some(Action::Limit));
    rule.action = 7;
    assert_eq!(rule.action(), None, "a corrupt byte is no action");
    assert!(class(IPPROTO_TCP, (0, u16::MAX), true).tcp_syn_only());
    assert!(!TrafficClass::default().tcp_syn_only());
    let mut config = Config::new(false, 24, 48);
    assert_eq!(config.v4_mask, prefix_mask(24));
    assert_eq!(config.v6_mask, prefix_mask(48));
    assert_eq!(
        config,
        Config {
            v4_prefix_len: 24,
            v6_prefix_len: 48,
            v4_mask: prefix_mask(24),
            v6_mask: prefix_mask(48),
            ..Config::default()
        }
    );
    assert!(!config.dry_run());
    config.set_dry_run(true);
    assert!(config.dry_run());
    for action in [Action::Limit, Action::Allow, Action::Deny] {
        assert_eq!(Action::from_u8(action as u8), Some(action));
    }
    assert_eq!(Action::Deny.name(), "deny");
}

#[test]
fn without_state_a_limit_fails_closed_and_allow_and_deny_still_apply() {
    // (action, the rule's dry-run, global dry-run, outcome)
    for (action, dry_run, global_dry_run, outcome) in [
        (Action::Limit, false, false, Outcome::DroppedLimit),
        (Action::Limit, false, true, Outcome::DryRunWouldDrop),
        (Action::Limit, true, false, Outcome::DryRunWouldDrop),
        (Action::Deny, false, false, Outcome::DroppedDeny),
        (Action::Allow, false, false, Outcome::Allowed),
        (Action::Allow, true, true, Outcome::Allowed),
    ] {
        assert_eq!(
            Rule::new(action, dry_run).stateless_outcome(global_dry_run),
            outcome,
            "{action:?}, dry-run {dry_run}, global dry-run {global_dry_run}"
        );
    }
}

#[test]
fn abi_sizes_have_no_implicit_padding() {
    use core::mem::size_of;
    assert_eq!(
        size_of::<Rule>(),
        8 * 6 + 4 + 4 + 1 + 1 + 1 + 1 + 4 + 8 + MAX_LEVELS * size_of::<Level>()
    );
    assert_eq!(size_of::<TrafficClass>(), 8);
    assert_eq!(
        size_of::<Config>(),
        4 + 4 + 16 + 16 + 8 * MAX_CLASSES + 4 + 1 + 1 + 1 + 3 + 2
    );
    assert_eq!(size_of::<RuleRefs>(), 4 * FRAME_CLASSES);
}
