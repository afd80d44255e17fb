//! Operator rules and their compilation into what the kernel reads: the
//! `Config`, the `RULES` table, traffic classes and the prefix tries.
//!
//! A source's rule for a frame is the rule with the longest prefix that
//! contains the source and whose match (protocol / destination ports /
//! SYN) fits the frame's traffic class; at equal prefix length a rule with
//! a match beats one without. The default rule covers 0.0.0.0/0 and ::/0
//! without a match. Everything is validated here, so a bad rule set is
//! rejected before anything reaches the kernel.

use std::{net::IpAddr, time::Duration};

use ipnet::IpNet;
use limiter_common::{
    prefix_mask,
    rules::{MAX_CLASSES, MAX_RULES},
    window::{MAX_BUCKETS_PER_WINDOW, MAX_BYTES, MAX_PACKETS, UNLIMITED},
    Action, Config, Rule, RuleRefs, TrafficClass,
};

/// IP protocol numbers rules can match by name.
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMPV6: u8 = 58;

/// Shortest and longest window a rule may have.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);
pub const MAX_WINDOW: Duration = Duration::from_secs(60);

/// What a rule matches besides the source prefix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Match {
    /// IP protocol number; `None` matches any.
    pub protocol: Option<u8>,
    /// Destination port range (inclusive), TCP/UDP only.
    pub ports: Option<(u16, u16)>,
    /// Only TCP SYN segments (SYN set, ACK clear).
    pub tcp_syn: bool,
}

impl Match {
    /// Whether this matches everything (a plain prefix rule).
    pub fn is_any(&self) -> bool {
        *self == Match::default()
    }

    fn class(&self) -> TrafficClass {
        let (port_min, port_max) = self.ports.unwrap_or((0, u16::MAX));
        TrafficClass {
            protocol: self.protocol.unwrap_or(0),
            tcp_syn_only: u8::from(self.tcp_syn),
            _pad: [0; 2],
            port_min,
            port_max,
        }
    }
}

/// The limits of a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Packets per second; `None`: packets are not limited.
    pub pps: Option<u64>,
    /// Bytes per second; `None`: bytes are not limited.
    pub bytes_per_second: Option<u64>,
    /// Packets allowed above `pps * window` in one window.
    pub burst_packets: u64,
    /// Bytes allowed above `bytes_per_second * window` in one window.
    pub burst_bytes: u64,
    /// Sliding window length, 1 to 60 s.
    pub window: Duration,
    /// Once over the limit, drop the source for this long.
    pub block: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            pps: None,
            bytes_per_second: None,
            burst_packets: 0,
            burst_bytes: 0,
            window: Duration::from_secs(1),
            block: None,
        }
    }
}

/// One operator rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSpec {
    /// Source prefix (IPv4 or IPv6).
    pub cidr: IpNet,
    pub matches: Match,
    pub action: Action,
    pub limits: Limits,
    /// Count would-be drops, drop nothing.
    pub dry_run: bool,
}

impl RuleSpec {
    /// A `limit` rule for `cidr` at `pps` packets per second.
    pub fn limit(cidr: IpNet, pps: u64) -> Self {
        Self {
            cidr,
            matches: Match::default(),
            action: Action::Limit,
            limits: Limits {
                pps: Some(pps),
                ..Limits::default()
            },
            dry_run: false,
        }
    }

    /// A rule with `action` and no limits (allow or deny).
    pub fn with_action(cidr: IpNet, action: Action) -> Self {
        Self {
            cidr,
            matches: Match::default(),
            action,
            limits: Limits::default(),
            dry_run: false,
        }
    }
}

/// Everything the kernel enforces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSet {
    /// Applies to every source no other rule covers (its `cidr` is ignored).
    pub default: RuleSpec,
    pub rules: Vec<RuleSpec>,
    /// Global dry-run: nothing is dropped.
    pub dry_run: bool,
    /// IPv4 sources are keyed by this prefix length.
    pub v4_prefix_len: u8,
    /// IPv6 sources are keyed by this prefix length.
    pub v6_prefix_len: u8,
    /// Buckets per window (window / buckets = bucket width).
    pub buckets_per_window: u32,
}

impl RuleSet {
    /// Only a default rule, keyed /32 and /64, 10 buckets per window.
    pub fn with_default(default: RuleSpec) -> Self {
        Self {
            default,
            rules: Vec::new(),
            dry_run: false,
            v4_prefix_len: 32,
            v6_prefix_len: 64,
            buckets_per_window: limiter_common::window::DEFAULT_BUCKETS_PER_WINDOW,
        }
    }
}

/// Why a rule set was rejected. `rule` is `"default"` or `"rules[N]"`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RuleError {
    #[error("{rule}: window {window:?} is outside 1s..=60s")]
    Window { rule: String, window: Duration },
    #[error("{rule}: a `limit` rule needs a packet or byte rate")]
    NoLimit { rule: String },
    #[error("{rule}: {what} must be greater than zero")]
    Zero { rule: String, what: &'static str },
    #[error("{rule}: {what} {value} per window exceeds the maximum {max}")]
    TooLarge {
        rule: String,
        what: &'static str,
        value: u128,
        max: u64,
    },
    #[error("{rule}: port range {min}-{max} is reversed")]
    PortsReversed { rule: String, min: u16, max: u16 },
    #[error("{rule}: ports need protocol tcp or udp, not {protocol}")]
    PortsNeedTcpOrUdp { rule: String, protocol: u8 },
    #[error("{rule}: a SYN match needs protocol tcp, not {protocol}")]
    SynNeedsTcp { rule: String, protocol: u8 },
    #[error("{rule}: prefix {cidr} is longer than the /{key_len} sources are keyed by")]
    PrefixTooLong {
        rule: String,
        cidr: IpNet,
        key_len: u8,
    },
    #[error("{rule}: same prefix and match as {other}")]
    Duplicate { rule: String, other: String },
    #[error("more than {MAX_CLASSES} distinct protocol/port matches")]
    TooManyClasses,
    #[error("more than {} rules", MAX_RULES - 1)]
    TooManyRules,
    #[error("buckets_per_window {0} is outside 1..={MAX_BUCKETS_PER_WINDOW}")]
    Buckets(u32),
    #[error("{family} key prefix length {len} is longer than {max}")]
    KeyPrefix {
        family: &'static str,
        len: u8,
        max: u8,
    },
}

/// A rule set ready for the kernel. Rule `i` of the set (0 = default)
/// lives at `RULES[base + i]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    /// `Config` without its generation (the pusher sets that).
    pub config: Config,
    pub rules: Vec<Rule>,
    pub v4: Vec<(u8, [u8; 4], RuleRefs)>,
    pub v6: Vec<(u8, [u8; 16], RuleRefs)>,
}

fn rule_name(index: usize) -> String {
    if index == 0 {
        "default".into()
    } else {
        format!("rules[{}]", index - 1)
    }
}

/// Share of a window's allowance that unused leases may withhold, as a
/// divisor: leases are sized so that all CPUs together, over all buckets of
/// a window, hold back at most `allowance / LEASE_DIVISOR` (under 1%).
pub const LEASE_DIVISOR: u64 = 128;

/// Validates `set` and compiles it so its rules land at `RULES[base..]`,
/// for a machine with `cpus` possible CPUs (which sizes leases).
pub fn compile(set: &RuleSet, base: u32, cpus: u32) -> Result<Compiled, RuleError> {
    if set.buckets_per_window == 0 || set.buckets_per_window > MAX_BUCKETS_PER_WINDOW {
        return Err(RuleError::Buckets(set.buckets_per_window));
    }
    if set.v4_prefix_len > 32 {
        return Err(RuleError::KeyPrefix {
            family: "IPv4",
            len: set.v4_prefix_len,
            max: 32,
        });
    }
    if set.v6_prefix_len > 128 {
        return Err(RuleError::KeyPrefix {
            family: "IPv6",
            len: set.v6_prefix_len,
            max: 128,
        });
    }
    if set.rules.len() + 1 > (MAX_RULES - 1) as usize {
        return Err(RuleError::TooManyRules);
    }
    // Index 0 is the default rule, covering both families.
    let all: Vec<&RuleSpec> = std::iter::once(&set.default).chain(&set.rules).collect();
    let mut rules = Vec::with_capacity(all.len());
    for (i, spec) in all.iter().enumerate() {
        rules.push(compile_rule(
            spec,
            &rule_name(i),
            set.buckets_per_window,
            cpus,
        )?);
        if i > 0 {
            check_prefix(spec, &rule_name(i), set)?;
        }
    }
    for (i, a) in all.iter().enumerate().skip(1) {
        if let Some(j) = (1..i).find(|&j| all[j].cidr == a.cidr && all[j].matches == a.matches) {
            return Err(RuleError::Duplicate {
                rule: rule_name(i),
                other: rule_name(j),
            });
        }
    }

    let mut classes: Vec<Match> = Vec::new();
    for spec in &all[1..] {
        if !spec.matches.is_any() && !classes.contains(&spec.matches) {
            classes.push(spec.matches);
        }
    }
    if classes.len() > MAX_CLASSES {
        return Err(RuleError::TooManyClasses);
    }
    let mut config = Config {
        generation: 0,
        dry_run: u8::from(set.dry_run),
        class_count: classes.len() as u8,
        v4_prefix_len: set.v4_prefix_len,
        v6_prefix_len: set.v6_prefix_len,
        v4_mask: prefix_mask(set.v4_prefix_len),
        v6_mask: prefix_mask(set.v6_prefix_len),
        classes: [TrafficClass::default(); MAX_CLASSES],
    };
    for (slot, class) in config.classes.iter_mut().zip(&classes) {
        *slot = class.class();
    }

    // Every rule prefix, plus the two default routes.
    let mut prefixes: Vec<IpNet> = vec![
        "0.0.0.0/0".parse().expect("valid"),
        "::/0".parse().expect("valid"),
    ];
    for spec in &all[1..] {
        let net = spec.cidr.trunc();
        if !prefixes.contains(&net) {
            prefixes.push(net);
        }
    }
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for prefix in prefixes {
        let mut refs = RuleRefs::default();
        for (class, slot) in refs.rules.iter_mut().enumerate() {
            let class_match = if class == 0 {
                Match::default()
            } else {
                match classes.get(class - 1) {
                    Some(m) => *m,
                    None => continue,
                }
            };
            *slot = base + best_rule(&all, &prefix, &class_match) as u32;
        }
        match prefix {
            IpNet::V4(net) => v4.push((net.prefix_len(), net.network().octets(), refs)),
            IpNet::V6(net) => v6.push((net.prefix_len(), net.network().octets(), refs)),
        }
    }
    Ok(Compiled {
        config,
        rules,
        v4,
        v6,
    })
}

/// The index in `all` of the rule for sources inside `prefix` in the class
/// matching `class_match` (the default rule if nothing else applies).
fn best_rule(all: &[&RuleSpec], prefix: &IpNet, class_match: &Match) -> usize {
    let mut best = 0;
    let mut best_key = (0u8, false);
    for (i, spec) in all.iter().enumerate().skip(1) {
        let covers = spec.cidr.contains(prefix) && spec.cidr.prefix_len() <= prefix.prefix_len();
        let fits = spec.matches.is_any() || spec.matches == *class_match;
        if !covers || !fits {
            continue;
        }
        let key = (spec.cidr.prefix_len(), !spec.matches.is_any());
        if key > best_key || best == 0 {
            best = i;
            best_key = key;
        }
    }
    best
}

fn check_prefix(spec: &RuleSpec, name: &str, set: &RuleSet) -> Result<(), RuleError> {
    let key_len = match spec.cidr.addr() {
        IpAddr::V4(_) => set.v4_prefix_len,
        IpAddr::V6(_) => set.v6_prefix_len,
    };
    if spec.cidr.prefix_len() > key_len {
        return Err(RuleError::PrefixTooLong {
            rule: name.into(),
            cidr: spec.cidr,
            key_len,
        });
    }
    Ok(())
}

fn compile_rule(spec: &RuleSpec, name: &str, buckets: u32, cpus: u32) -> Result<Rule, RuleError> {
    let m = &spec.matches;
    if let Some((min, max)) = m.ports {
        if min > max {
            return Err(RuleError::PortsReversed {
                rule: name.into(),
                min,
                max,
            });
        }
        if let Some(protocol) = m.protocol.filter(|p| *p != PROTO_TCP && *p != PROTO_UDP) {
            return Err(RuleError::PortsNeedTcpOrUdp {
                rule: name.into(),
                protocol,
            });
        }
    }
    if m.tcp_syn {
        if let Some(protocol) = m.protocol.filter(|p| *p != PROTO_TCP) {
            return Err(RuleError::SynNeedsTcp {
                rule: name.into(),
                protocol,
            });
        }
    }
    let limits = &spec.limits;
    if limits.window < MIN_WINDOW || limits.window > MAX_WINDOW {
        return Err(RuleError::Window {
            rule: name.into(),
            window: limits.window,
        });
    }
    if spec.action == Action::Limit && limits.pps.is_none() && limits.bytes_per_second.is_none() {
        return Err(RuleError::NoLimit { rule: name.into() });
    }
    let window_ns = limits.window.as_nanos() as u64;
    let allowance = |rate: Option<u64>, burst: u64, what: &'static str, max: u64| match rate {
        None => Ok(UNLIMITED),
        Some(0) => Err(RuleError::Zero {
            rule: name.into(),
            what,
        }),
        Some(rate) => {
            let value =
                u128::from(rate) * u128::from(window_ns) / 1_000_000_000 + u128::from(burst);
            if value > u128::from(max) {
                Err(RuleError::TooLarge {
                    rule: name.into(),
                    what,
                    value,
                    max,
                })
            } else {
                Ok(value as u64)
            }
        }
    };
    let (allowance_packets, allowance_bytes) = if spec.action == Action::Limit {
        (
            allowance(limits.pps, limits.burst_packets, "packets", MAX_PACKETS)?,
            allowance(
                limits.bytes_per_second,
                limits.burst_bytes,
                "bytes",
                MAX_BYTES,
            )?,
        )
    } else {
        (UNLIMITED, UNLIMITED)
    };
    // Leases only without a byte limit (bytes are counted per frame), and
    // only when they hold back little: see LEASE_DIVISOR.
    let lease_packets = if allowance_packets != UNLIMITED && allowance_bytes == UNLIMITED {
        let holders = u64::from(cpus.max(1)) * (u64::from(buckets) + 1) * LEASE_DIVISOR;
        (allowance_packets / holders).clamp(1, u64::from(u32::MAX)) as u32
    } else {
        1
    };
    Ok(Rule {
        allowance_packets,
        allowance_bytes,
        bucket_ns: window_ns / u64::from(buckets),
        block_ns: limits.block.map_or(0, |b| b.as_nanos() as u64),
        buckets,
        lease_packets,
        action: spec.action as u8,
        dry_run: u8::from(spec.dry_run),
        _pad: [0; 6],
    })
}

#[cfg(test)]
mod tests {
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
    fn longest_prefix_wins_and_inherits_into_classes() {
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
        // Unused classes stay NO_RULE.
        assert_eq!(
            refs_of(&c, "10.1.0.0/16").rules[2],
            limiter_common::rules::NO_RULE
        );
    }

    #[test]
    fn a_match_beats_a_plain_rule_of_the_same_prefix() {
        let plain = RuleSpec::limit(net("192.0.2.0/24"), 100);
        let mut syn = RuleSpec::limit(net("192.0.2.0/24"), 10);
        syn.matches.tcp_syn = true;
        syn.matches.protocol = Some(PROTO_TCP);
        let c = compile(&set(vec![plain, syn]), 0, 2).unwrap();
        assert_eq!(refs_of(&c, "192.0.2.0/24").rules[..2], [1, 2]);
        assert_eq!(c.config.classes[0].tcp_syn_only, 1);
    }

    #[test]
    fn invalid_rules_are_rejected_with_the_rule_named() {
        let mut bad = RuleSpec::limit(net("192.0.2.0/24"), 10);
        bad.limits.window = Duration::from_secs(61);
        assert!(
            matches!(compile(&set(vec![bad]), 0, 2), Err(RuleError::Window { rule, .. }) if rule == "rules[0]")
        );

        let mut bad = RuleSpec::limit(net("192.0.2.0/24"), 10);
        bad.matches.ports = Some((100, 10));
        assert!(matches!(
            compile(&set(vec![bad]), 0, 2),
            Err(RuleError::PortsReversed { .. })
        ));

        let mut bad = RuleSpec::limit(net("192.0.2.0/24"), 10);
        bad.matches.ports = Some((1, 10));
        bad.matches.protocol = Some(PROTO_ICMP);
        assert!(matches!(
            compile(&set(vec![bad]), 0, 2),
            Err(RuleError::PortsNeedTcpOrUdp { .. })
        ));

        let mut bad = RuleSpec::limit(net("192.0.2.0/24"), 0);
        bad.limits.pps = Some(0);
        assert!(matches!(
            compile(&set(vec![bad]), 0, 2),
            Err(RuleError::Zero { .. })
        ));

        let mut bad = RuleSpec::limit(net("192.0.2.0/24"), 10);
        bad.limits.pps = None;
        assert!(matches!(
            compile(&set(vec![bad]), 0, 2),
            Err(RuleError::NoLimit { .. })
        ));

        let bad = RuleSpec::limit(net("192.0.2.0/24"), u64::MAX / 2);
        assert!(matches!(
            compile(&set(vec![bad]), 0, 2),
            Err(RuleError::TooLarge { .. })
        ));

        let bad = RuleSpec::limit(net("2001:db8::/96"), 10);
        assert!(matches!(
            compile(&set(vec![bad]), 0, 2),
            Err(RuleError::PrefixTooLong { key_len: 64, .. })
        ));

        let a = RuleSpec::limit(net("192.0.2.0/24"), 10);
        assert!(matches!(
            compile(&set(vec![a.clone(), a]), 0, 2),
            Err(RuleError::Duplicate { .. })
        ));

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
}
