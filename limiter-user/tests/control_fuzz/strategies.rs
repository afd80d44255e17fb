//! Strategies for valid requests and rules: prefixes, protocols, ports,
//! counts and durations at their edges, rules both wild and plausible.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use limiter_common::{Action, Scope};
use limiter_user::{
    config::{PortsSpec, ProtocolSpec, RuleSection},
    proto::{Request, RequestLine, RuleEdit, PROTOCOL_VERSION},
};
use proptest::{option, prelude::*, sample::select};

/// Prefixes that collide often (so edits hit existing rules, duplicates
/// and overlaps), of both families, some with host bits set.
pub(crate) const PREFIXES: &[&str] = &[
    "0.0.0.0/0",
    "10.0.0.0/8",
    "10.10.0.0/16",
    "10.10.1.0/24",
    "10.10.1.7/24",
    "10.10.1.7/32",
    "192.0.2.0/24",
    "::/0",
    "2001:db8::/32",
    "2001:db8:1::/48",
    "2001:db8::/64",
    "2001:db8::1/64",
    "2001:db8::/96",
];

pub(crate) fn cidr() -> BoxedStrategy<IpNet> {
    prop_oneof![
        4 => select(PREFIXES).prop_map(|p| p.parse::<IpNet>().expect("a valid prefix")),
        1 => (any::<u32>(), 0u8..=32)
            .prop_map(|(a, len)| IpNet::V4(Ipv4Net::new(Ipv4Addr::from(a), len).expect("len <= 32"))),
        1 => (any::<u128>(), 0u8..=128)
            .prop_map(|(a, len)| IpNet::V6(Ipv6Net::new(Ipv6Addr::from(a), len).expect("len <= 128"))),
    ].boxed()
}

pub(crate) fn protocol() -> impl Strategy<Value = ProtocolSpec> {
    prop_oneof![
        select(vec![0u8, 1, 6, 17, 58, 132, 255]).prop_map(ProtocolSpec::Number),
        any::<u8>().prop_map(ProtocolSpec::Number),
        select(vec![
            "tcp",
            "udp",
            "UDP",
            "Tcp",
            "icmp",
            "icmpv6",
            "ipv6-icmp",
            "sctp",
            "",
            "17"
        ])
        .prop_map(|s| ProtocolSpec::Name(s.into())),
        "\\PC{0,6}".prop_map(ProtocolSpec::Name),
    ]
}

pub(crate) fn ports() -> impl Strategy<Value = PortsSpec> {
    prop_oneof![
        select(vec![0u16, 53, 80, 65535]).prop_map(PortsSpec::Port),
        any::<u16>().prop_map(PortsSpec::Port),
        select(vec![
            "53",
            " 53 ",
            "1000-2000",
            "5-1",
            "0-65535",
            "0",
            "65536",
            "1-",
            "-",
            "",
            "http",
            "-5",
            "53-53"
        ])
        .prop_map(|s| PortsSpec::Text(s.into())),
        "[0-9 -]{0,12}".prop_map(PortsSpec::Text),
    ]
}

/// Rates and bursts: zero, ordinary, at the edges of the integer types.
pub(crate) fn count() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        1u64..=100_000,
        select(vec![
            1_000_000u64,
            1 << 32,
            i64::MAX as u64,
            i64::MAX as u64 + 1,
            u64::MAX
        ]),
        any::<u64>(),
    ]
}

pub(crate) fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        select(vec![0u64, 1, 10, 60, 61, 86_400, 86_401]).prop_map(Duration::from_secs),
        (0u64..=120, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

pub(crate) fn action() -> impl Strategy<Value = Action> {
    select(vec![Action::Limit, Action::Allow, Action::Deny])
}

/// Any rule at all: mostly invalid.
pub(crate) fn wild_rule() -> BoxedStrategy<RuleSection> {
    (
        (
            option::weighted(0.9, cidr()),
            action(),
            option::of(protocol()),
            option::of(ports()),
            any::<bool>(),
        ),
        (option::of(count()), option::of(count()), count(), count()),
        (
            duration(),
            option::of(duration()),
            option::of(any::<bool>()),
            scope(),
        ),
    )
        .prop_map(section)
        .boxed()
}

/// A rule with ordinary values: often valid, so edits get through.
pub(crate) fn plausible_rule() -> BoxedStrategy<RuleSection> {
    let protocol = prop_oneof![
        Just(None),
        Just(Some(ProtocolSpec::Name("udp".into()))),
        Just(Some(ProtocolSpec::Number(17))),
        Just(Some(ProtocolSpec::Name("TCP".into()))),
        Just(Some(ProtocolSpec::Number(6))),
        Just(Some(ProtocolSpec::Name("icmp".into()))),
    ];
    let ports = prop_oneof![
        Just(None),
        Just(Some(PortsSpec::Port(53))),
        Just(Some(PortsSpec::Text("53".into()))),
        Just(Some(PortsSpec::Text("1000-2000".into()))),
    ];
    (
        (
            select(PREFIXES).prop_map(|p| Some(p.parse::<IpNet>().expect("a valid prefix"))),
            action(),
            protocol,
            ports,
            prop::bool::weighted(0.2),
        ),
        (
            option::of(1u64..10_000),
            option::weighted(0.2, 2_000u64..10_000_000),
            0u64..1000,
            0u64..100_000,
        ),
        (
            (1u64..=60).prop_map(Duration::from_secs),
            option::of((1u64..=3600).prop_map(Duration::from_secs)),
            option::of(any::<bool>()),
            scope(),
        ),
    )
        .prop_map(section)
        .boxed()
}

/// A rule's fields as the strategies above draw them (grouped in tuples:
/// proptest implements `Strategy` for tuples of at most 12).
pub(crate) type Fields = (
    (
        Option<IpNet>,
        Action,
        Option<ProtocolSpec>,
        Option<PortsSpec>,
        bool,
    ),
    (Option<u64>, Option<u64>, u64, u64),
    (Duration, Option<Duration>, Option<bool>, Scope),
);

/// Mostly node, sometimes cluster: the example file has no [cluster], so a
/// cluster-scoped rule is a refusal the edits must survive.
fn scope() -> impl Strategy<Value = Scope> {
    prop::bool::weighted(0.1).prop_map(|cluster| if cluster { Scope::Cluster } else { Scope::Node })
}

pub(crate) fn section(
    (
        (cidr, action, protocol, ports, tcp_syn),
        (pps, bytes_per_second, burst_packets, burst_bytes),
        (window, block, dry_run, scope),
    ): Fields,
) -> RuleSection {
    RuleSection {
        name: None,
        cidr,
        action,
        protocol,
        ports,
        tcp_syn,
        pps,
        bytes_per_second,
        burst_packets,
        burst_bytes,
        window,
        block,
        dry_run,
        scope,
        levels: Vec::new(),
        guards: Vec::new(),
        guard_for: None,
    }
}

pub(crate) fn rule() -> BoxedStrategy<RuleSection> {
    prop_oneof![plausible_rule(), wild_rule()].boxed()
}

pub(crate) fn rule_edit() -> BoxedStrategy<RuleEdit> {
    (0u8..4, rule(), prop::bool::weighted(0.2))
        .prop_map(|(op, mut rule, keep_cidr)| match op {
            0 => RuleEdit::Add { rule },
            1 => RuleEdit::Set { rule },
            2 => RuleEdit::Remove { rule },
            _ => {
                // Mostly as the CLI sends it: the default rule has no cidr.
                if !keep_cidr {
                    rule.cidr = None;
                }
                RuleEdit::Default { rule }
            }
        })
        .boxed()
}

/// Every variant of `Request`.
pub(crate) fn request() -> BoxedStrategy<Request> {
    prop_oneof![
        Just(Request::Status),
        (any::<usize>(), proptest::option::of(".{0,12}"))
            .prop_map(|(limit, level)| Request::Top { limit, level }),
        (any::<bool>(), any::<bool>()).prop_map(|(dry_run, save)| Request::Mode {
            dry_run,
            save,
            guards: Vec::new(),
            guard_for: None,
        }),
        Just(Request::Reload),
        Just(Request::RuleList),
        Just(Request::Detach),
        (rule_edit(), any::<bool>()).prop_map(|(edit, save)| Request::Rules { edit, save }),
        cidr().prop_map(|cidr| Request::Unblock { cidr }),
    ]
    .boxed()
}

/// The line the CLI sends for `request`.
pub(crate) fn line(request: &Request) -> String {
    serde_json::to_string(&RequestLine {
        version: PROTOCOL_VERSION,
        request: request.clone(),
    })
    .expect("requests serialise")
}
