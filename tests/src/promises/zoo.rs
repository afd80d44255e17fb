//! The rules every script runs under: one of each kind the two promises
//! are tested against (small and large limits, a minute's window, a
//! burst, a penalty, cluster scope, levels), each on a /8 of its own (an
//! IPv6 one on a /48), so a script aims its sources at a rule by address.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use limiter_common::Scope;
use limiter_user::rules::{RuleSet, RuleSpec};

use crate::net;

/// A rule of the zoo: its index among the set's rules (`RULES` index
/// `rules_base(1) + 1 + index`), what it is, and where its sources live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    pub name: &'static str,
    /// First octet of its IPv4 /8, or the third group of its IPv6 /48
    /// (`2001:db8:N::/48`).
    pub net: u16,
    pub ipv6: bool,
}

pub const SMALL: Kind = Kind {
    name: "10 pps",
    net: 21,
    ipv6: false,
};
pub const SMALL6: Kind = Kind {
    name: "10 pps, IPv6 /64s",
    net: 1,
    ipv6: true,
};
pub const TEN_SECONDS: Kind = Kind {
    name: "10 per 10 s",
    net: 22,
    ipv6: false,
};
pub const MINUTE: Kind = Kind {
    name: "60 per minute",
    net: 23,
    ipv6: false,
};
pub const BURST: Kind = Kind {
    name: "100 pps, burst 50",
    net: 24,
    ipv6: false,
};
pub const LARGE: Kind = Kind {
    name: "1000 pps",
    net: 25,
    ipv6: false,
};
pub const BLOCK: Kind = Kind {
    name: "10 pps, block 3 s",
    net: 26,
    ipv6: false,
};
pub const CLUSTER: Kind = Kind {
    name: "100 pps, cluster scope",
    net: 27,
    ipv6: false,
};
pub const LEVELS: Kind = Kind {
    name: "100 pps, /24 at 300 pps, 20 per 100 ms",
    net: 28,
    ipv6: false,
};
pub const LONG: Kind = Kind {
    name: "100 pps over 10 s",
    net: 29,
    ipv6: false,
};

/// Every kind, in rule order.
pub const KINDS: [Kind; 10] = [
    SMALL,
    SMALL6,
    TEN_SECONDS,
    MINUTE,
    BURST,
    LARGE,
    BLOCK,
    CLUSTER,
    LEVELS,
    LONG,
];

/// How long a penalty of [`BLOCK`] lasts.
pub const BLOCK_FOR: Duration = Duration::from_secs(3);

impl Kind {
    /// Its index among the set's rules (0-based, the default excluded).
    pub fn index(self) -> usize {
        KINDS.iter().position(|k| *k == self).expect("a zoo kind")
    }

    /// Source `host` of /24 (or /64) `block` of this kind's prefix.
    pub fn source(self, block: u32, host: u32) -> IpAddr {
        if self.ipv6 {
            IpAddr::V6(Ipv6Addr::new(
                0x2001,
                0xdb8,
                self.net,
                block as u16,
                0,
                0,
                0,
                host as u16 + 1,
            ))
        } else {
            let [_, _, b, c] = block.to_be_bytes();
            IpAddr::V4(Ipv4Addr::new(self.net as u8, b, c, host as u8 + 1))
        }
    }

    /// Source `i` of the IPv6 /48 beside this kind's own, under the same
    /// rule: /64 number `i` of a prefix holder (real addresses, each a
    /// source of its own).
    pub fn neighbour(self, i: u32) -> IpAddr {
        assert!(self.ipv6, "{}: a prefix holder's /48 is IPv6", self.name);
        IpAddr::V6(Ipv6Addr::new(
            0x2001,
            0xdb8,
            self.net ^ 1,
            i as u16,
            0,
            0,
            0,
            1,
        ))
    }

    fn spec(self) -> RuleSpec {
        let cidr = if self.ipv6 {
            // The kind's own /48 and the one beside it (a prefix holder's:
            // [`Kind::neighbour`]).
            format!("2001:db8:{:x}::/47", self.net & !1)
        } else {
            format!("{}.0.0.0/8", self.net)
        };
        let limit = |pps| RuleSpec::limit(net(&cidr), pps);
        let over = |pps, secs| {
            let mut rule = limit(pps);
            rule.limits.window = Duration::from_secs(secs);
            rule
        };
        match self {
            SMALL | SMALL6 => limit(10),
            TEN_SECONDS => over(1, 10),
            MINUTE => over(1, 60),
            BURST => {
                let mut rule = limit(100);
                rule.limits.burst_packets = 50;
                rule
            }
            LARGE => limit(1_000),
            BLOCK => {
                let mut rule = limit(10);
                rule.limits.block = Some(BLOCK_FOR);
                rule
            }
            CLUSTER => {
                let mut rule = limit(100);
                rule.scope = Scope::Cluster;
                rule
            }
            LEVELS => RuleSpec {
                levels: ["prefix/24:300", "source:200@100ms"]
                    .iter()
                    .map(|l| l.parse().expect("a level"))
                    .collect(),
                ..limit(100)
            },
            LONG => over(100, 10),
            other => unreachable!("{other:?}"),
        }
    }
}

/// The zoo's rule set, with the tiers on or off (the default rule, far
/// above anything a script sends, judges nothing a script aims).
pub fn rules(tiered: bool) -> RuleSet {
    RuleSet {
        rules: KINDS.iter().map(|k| k.spec()).collect(),
        tiered,
        ..RuleSet::with_default(RuleSpec::limit(net("0.0.0.0/0"), 1_000_000))
    }
}
