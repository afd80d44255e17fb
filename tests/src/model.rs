//! A reference model of what the documentation says the datapath does
//! (docs/architecture.md, *Parse*; docs/configuration.md, *Which rule
//! judges a frame*), written from those texts and independently of the
//! kernel parser and the rule compiler, so the kernel can be checked
//! against it frame by frame: the parser fuzzer (`tests/tests/fuzz.rs`) and
//! the rule-matching property test (`tests/tests/matching_model.rs`).
//!
//! Deliberately plain: byte offsets read straight off the frame, rules
//! matched structurally, every candidate rule compared with every other.

use std::net::IpAddr;

use ipnet::IpNet;
use limiter_common::Outcome;

pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const AH: u8 = 51;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

/// What the parser may know of a frame's transport layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Seen {
    Known { protocol: u8, port: u16, flags: u8 },
    PortUnknown { protocol: u8 },
    ProtocolUnknown,
}

/// What the datapath makes of a frame's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed {
    NonIp,
    Malformed,
    Ip { source: IpAddr, seen: Seen },
}

/// IPv6 extension headers the datapath walks (AH included).
pub fn is_extension(next: u8) -> bool {
    matches!(next, 0 | 43 | 44 | 51 | 60 | 135 | 139 | 140)
}

/// How many IPv6 extension headers are walked.
pub const WALK: usize = 8;

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

/// A frame of `protocol` whose transport header cannot be read.
fn unreadable(protocol: u8) -> Seen {
    match protocol {
        TCP | UDP => Seen::PortUnknown { protocol },
        p if is_extension(p) => Seen::ProtocolUnknown,
        p => Seen::Known {
            protocol: p,
            port: 0,
            flags: 0,
        },
    }
}

/// The transport header of `protocol` at `at`.
fn transport(frame: &[u8], at: usize, protocol: u8) -> Seen {
    match protocol {
        TCP if frame.len() >= at + 20 => Seen::Known {
            protocol,
            port: be16(frame, at + 2).expect("in the frame"),
            flags: frame[at + 13] & (SYN | ACK),
        },
        UDP if frame.len() >= at + 8 => Seen::Known {
            protocol,
            port: be16(frame, at + 2).expect("in the frame"),
            flags: 0,
        },
        p => unreadable(p),
    }
}

/// The documented parse of a whole frame (Ethernet first).
pub fn parse(frame: &[u8]) -> Parsed {
    let Some(mut ether_type) = be16(frame, 12) else {
        return Parsed::Malformed;
    };
    let mut at = 14;
    for _ in 0..2 {
        if !matches!(ether_type, 0x8100 | 0x88a8 | 0x9100) {
            break;
        }
        let Some(inner) = be16(frame, at + 2) else {
            return Parsed::Malformed;
        };
        ether_type = inner;
        at += 4;
    }
    match ether_type {
        0x0800 => parse_v4(frame, at),
        0x86dd => parse_v6(frame, at),
        _ => Parsed::NonIp,
    }
}

fn parse_v4(frame: &[u8], at: usize) -> Parsed {
    if frame.len() < at + 20 || frame[at] >> 4 != 4 {
        return Parsed::Malformed;
    }
    let source = IpAddr::from(<[u8; 4]>::try_from(&frame[at + 12..at + 16]).expect("4 bytes"));
    let header = usize::from(frame[at] & 0x0f) * 4;
    let total = usize::from(be16(frame, at + 2).expect("in the header"));
    let first = be16(frame, at + 6).expect("in the header") & 0x1fff == 0;
    let protocol = frame[at + 9];
    let seen = if header < 20 || total < header || !first {
        unreadable(protocol)
    } else if protocol == AH {
        let ah = at + header;
        match (frame.get(ah), frame.get(ah + 1)) {
            (Some(next), Some(len)) => transport(frame, ah + (usize::from(*len) + 2) * 4, *next),
            _ => Seen::ProtocolUnknown,
        }
    } else {
        transport(frame, at + header, protocol)
    };
    Parsed::Ip { source, seen }
}

fn parse_v6(frame: &[u8], at: usize) -> Parsed {
    if frame.len() < at + 40 || frame[at] >> 4 != 6 {
        return Parsed::Malformed;
    }
    let source = IpAddr::from(<[u8; 16]>::try_from(&frame[at + 8..at + 24]).expect("16 bytes"));
    let mut next = frame[at + 6];
    let mut offset = at + 40;
    let mut walked = 0;
    while is_extension(next) && walked < WALK {
        if frame.len() < offset + 4 {
            return Parsed::Ip {
                source,
                seen: Seen::ProtocolUnknown,
            };
        }
        let (header, len) = (next, usize::from(frame[offset + 1]));
        next = frame[offset];
        if header == 44 && be16(frame, offset + 2).expect("in the frame") >> 3 != 0 {
            return Parsed::Ip {
                source,
                seen: unreadable(next),
            };
        }
        offset += match header {
            44 => 8,
            AH => (len + 2) * 4,
            _ => (len + 1) * 8,
        };
        walked += 1;
    }
    let seen = if is_extension(next) {
        Seen::ProtocolUnknown
    } else {
        transport(frame, offset, next)
    };
    Parsed::Ip { source, seen }
}

/// A rule as the documentation describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// `None`: the default rule (every source, both families).
    pub cidr: Option<IpNet>,
    pub protocol: Option<u8>,
    pub ports: Option<(u16, u16)>,
    pub syn: bool,
    pub action: limiter_common::Action,
    pub dry_run: bool,
    /// Packets and bytes per second (after the window), for strictness.
    pub packet_rate: Option<f64>,
    pub byte_rate: Option<f64>,
}

impl Rule {
    /// A rule; a port range of every port is no port match at all (as
    /// docs/configuration.md says).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cidr: Option<IpNet>,
        protocol: Option<u8>,
        ports: Option<(u16, u16)>,
        syn: bool,
        action: limiter_common::Action,
        dry_run: bool,
        packet_rate: Option<f64>,
        byte_rate: Option<f64>,
    ) -> Self {
        Self {
            cidr,
            protocol,
            ports: ports.filter(|p| *p != (0, u16::MAX)),
            syn,
            action,
            dry_run,
            packet_rate,
            byte_rate,
        }
    }

    /// Whether the match (protocol / ports / SYN) selects this frame.
    pub fn selects(&self, protocol: u8, port: u16, flags: u8) -> bool {
        if self.protocol.is_some_and(|p| p != protocol) {
            return false;
        }
        if self.syn && (protocol != TCP || flags & (SYN | ACK) != SYN) {
            return false;
        }
        match self.ports {
            None => true,
            Some((min, max)) => (protocol == TCP || protocol == UDP) && (min..=max).contains(&port),
        }
    }

    fn covers(&self, source: IpAddr) -> bool {
        self.cidr.is_none_or(|c| c.contains(&source))
    }

    /// Prefix length, the default rule below every configured one.
    fn length(&self) -> i32 {
        self.cidr.map_or(-1, |c| i32::from(c.prefix_len()))
    }

    /// Whether every frame this match selects, `other` selects too:
    /// protocols, port range and SYN compared as sets.
    pub fn within(&self, other: &Rule) -> bool {
        // The protocols each can select (ports and SYN restrict them).
        let protocols = |r: &Rule| -> Option<Vec<u8>> {
            match (r.protocol, r.ports.is_some() || r.syn) {
                (Some(p), _) => Some(vec![p]),
                (None, true) if r.syn => Some(vec![TCP]),
                (None, true) => Some(vec![TCP, UDP]),
                (None, false) => None, // every protocol
            }
        };
        let protocols_within = match (protocols(self), protocols(other)) {
            (_, None) => true,
            (None, Some(_)) => false,
            (Some(a), Some(b)) => a.iter().all(|p| b.contains(p)),
        };
        let ports_within = match (self.ports, other.ports) {
            (_, None) => true,
            (Some((a, b)), Some((c, d))) => c <= a && b <= d,
            // Every port is not within a narrower range (a full range is
            // no range: see `Rule::new`).
            (None, Some(_)) => false,
        };
        let syn_within = !other.syn || self.syn;
        protocols_within && ports_within && syn_within
    }

    /// Strictness (lower is stricter): enforced deny, enforced limit by
    /// lowest packet then byte rate, dry-run deny, dry-run limit, allow.
    fn strictness(&self) -> (u8, f64, f64) {
        use limiter_common::Action::*;
        let rank = match (self.action, self.dry_run) {
            (Deny, false) => 0,
            (Limit, false) => 1,
            (Deny, true) => 2,
            (Limit, true) => 3,
            (Allow, _) => 4,
        };
        (
            rank,
            self.packet_rate.unwrap_or(f64::INFINITY),
            self.byte_rate.unwrap_or(f64::INFINITY),
        )
    }
}

/// Why a frame has no single rule: two rules of one prefix overlap there
/// without one containing the other (the compiler must refuse the set).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ambiguous(pub usize, pub usize);

/// The rule (index into `rules`, 0 the default) for a frame of a known
/// protocol, port and flags from `source`.
pub fn rule_for(
    rules: &[Rule],
    source: IpAddr,
    protocol: u8,
    port: u16,
    flags: u8,
) -> Result<usize, Ambiguous> {
    let candidates: Vec<usize> = (0..rules.len())
        .filter(|&i| rules[i].covers(source) && rules[i].selects(protocol, port, flags))
        .collect();
    let longest = candidates
        .iter()
        .map(|&i| rules[i].length())
        .max()
        .expect("the default rule always applies");
    let tied: Vec<usize> = candidates
        .into_iter()
        .filter(|&i| rules[i].length() == longest)
        .collect();
    // At the default's level, configured rules of /0 come first.
    if let Some(&winner) = tied
        .iter()
        .find(|&&i| tied.iter().all(|&j| rules[i].within(&rules[j])))
    {
        return Ok(winner);
    }
    let pair = tied
        .iter()
        .flat_map(|&a| tied.iter().map(move |&b| (a, b)))
        .find(|&(a, b)| a < b && !rules[a].within(&rules[b]) && !rules[b].within(&rules[a]))
        .unwrap_or((tied[0], tied[1]));
    Err(Ambiguous(pair.0, pair.1))
}

/// Every port at which some rule's selection can change, for walking all
/// the frames a frame of unknown ports might be.
fn ports(rules: &[Rule]) -> Vec<u16> {
    let mut ports = vec![0, u16::MAX];
    for rule in rules {
        if let Some((a, b)) = rule.ports {
            ports.extend([a, b, a.saturating_sub(1), b.saturating_add(1)]);
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The rule for a frame as the parser saw it: a known frame's own rule; a
/// frame of unknown ports or protocol, the strictest rule any frame it
/// might be would get (ties to the lowest index).
pub fn rule_for_seen(rules: &[Rule], source: IpAddr, seen: Seen) -> Result<usize, Ambiguous> {
    let possible: Vec<(u8, u16, u8)> = match seen {
        Seen::Known {
            protocol,
            port,
            flags,
        } => return rule_for(rules, source, protocol, port, flags),
        Seen::PortUnknown { protocol } => ports(rules)
            .into_iter()
            .flat_map(|port| [0, SYN, SYN | ACK, ACK].map(|f| (protocol, port, f)))
            .collect(),
        Seen::ProtocolUnknown => (0..=255u8)
            .flat_map(|p| {
                let ports = if p == TCP || p == UDP {
                    ports(rules)
                } else {
                    vec![0]
                };
                ports
                    .into_iter()
                    .flat_map(move |port| [0, SYN, SYN | ACK, ACK].map(|f| (p, port, f)))
            })
            .collect(),
    };
    let mut best: Option<usize> = None;
    for (protocol, port, flags) in possible {
        let index = rule_for(rules, source, protocol, port, flags)?;
        let stricter = best.is_none_or(|b| {
            let (x, y) = (rules[index].strictness(), rules[b].strictness());
            x < y || (x == y && index < b)
        });
        if stricter {
            best = Some(index);
        }
    }
    Ok(best.expect("a frame has at least one possible form"))
}

/// The outcome of a frame judged by `rule` when no limit is ever reached.
pub fn outcome_unlimited(rule: &Rule, global_dry_run: bool) -> Outcome {
    use limiter_common::Action::*;
    match rule.action {
        Allow => Outcome::Allowed,
        Limit => Outcome::Passed,
        Deny if rule.dry_run || global_dry_run => Outcome::DryRunWouldDrop,
        Deny => Outcome::DroppedDeny,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(protocol: Option<u8>, ports: Option<(u16, u16)>, syn: bool) -> Rule {
        Rule::new(
            None,
            protocol,
            ports,
            syn,
            limiter_common::Action::Limit,
            false,
            None,
            None,
        )
    }

    #[test]
    fn containment_is_by_sets() {
        let any = rule(None, None, false);
        let tcp = rule(Some(TCP), None, false);
        let ssh = rule(Some(TCP), Some((22, 22)), false);
        let syn = rule(Some(TCP), None, true);
        let web = rule(None, Some((80, 80)), false);
        assert!(ssh.within(&tcp) && tcp.within(&any) && ssh.within(&any));
        assert!(!tcp.within(&ssh));
        assert!(!syn.within(&ssh) && !ssh.within(&syn));
        assert!(!web.within(&tcp), "port 80 includes UDP");
        assert!(rule(Some(UDP), Some((80, 80)), false).within(&web));
        assert!(!rule(Some(1), None, false).within(&web), "ICMP has no port");
    }
}
