//! Operator rules and their compilation into what the kernel reads: the
//! `Config`, the `RULES` table, the matches rules use and the prefix tries.
//!
//! Which rule judges a frame (docs/configuration.md says the same):
//!
//! 1. Of the rules whose prefix contains the frame's source and whose match
//!    (protocol / destination ports / SYN) the frame satisfies, those with
//!    the **longest prefix** count; the default rule (`0.0.0.0/0` and
//!    `::/0`, no match) comes after every configured rule.
//! 2. Among those, the rule whose match is **contained** in every other's
//!    wins (`tcp port 22` beats `tcp`, which beats no match), whatever the
//!    rule order. Two rules of one prefix whose matches overlap without one
//!    containing the other are rejected, naming both, unless a third rule of
//!    that prefix covers exactly what they share.
//! 3. A frame whose ports could not be read (a non-first fragment, a cut
//!    header) or whose protocol could not (an IPv6 header chain longer than
//!    the walk) is judged by the **strictest** rule it could fall under:
//!    an enforced `deny`, then the enforced `limit` with the lowest packet
//!    rate (then byte rate), then dry-run `deny`, dry-run `limit`, `allow`.
//!
//! Every frame class of a source that one rule judges counts in that
//! rule's one budget for the source. Everything is validated here, so a
//! bad rule set is rejected before anything reaches the kernel.

use std::{hash::Hasher, net::IpAddr, time::Duration};

use ipnet::IpNet;
use limiter_common::{
    rules::{
        Transport, FRAME_CLASSES, MAX_CLASSES, MAX_RULES, RESOLVED_CLASSES, TCP_FLAG_ACK,
        TCP_FLAG_SYN, UNKNOWN_PROTOCOL_CLASS, UNRESOLVED_BASE,
    },
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
/// Longest penalty (longer bans are `deny` rules).
pub const MAX_BLOCK: Duration = Duration::from_secs(24 * 3600);
/// The largest standard Ethernet frame XDP sees (1500 bytes of IP, the
/// Ethernet header and one VLAN tag): a byte allowance below it could never
/// admit a full-size frame.
pub const MIN_FRAME_BYTES: u64 = 1518;

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

    /// The kernel's form of this match.
    pub fn class(&self) -> TrafficClass {
        let (port_min, port_max) = self.ports.unwrap_or((0, u16::MAX));
        TrafficClass::new(self.protocol.unwrap_or(0), port_min, port_max, self.tcp_syn)
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

impl Match {
    /// The same match with a port range of every port dropped: ports
    /// `0-65535` select exactly what no port match does.
    pub fn normalized(self) -> Self {
        Self {
            ports: self.ports.filter(|p| *p != (0, u16::MAX)),
            ..self
        }
    }

    /// `tcp port 22 syn`, `any`: for messages.
    pub fn describe(&self) -> String {
        let mut words = Vec::new();
        match self.protocol {
            Some(PROTO_TCP) => words.push("tcp".to_string()),
            Some(PROTO_UDP) => words.push("udp".to_string()),
            Some(PROTO_ICMP) => words.push("icmp".to_string()),
            Some(PROTO_ICMPV6) => words.push("icmpv6".to_string()),
            Some(p) => words.push(format!("protocol {p}")),
            None => {}
        }
        match self.ports {
            Some((a, b)) if a == b => words.push(format!("port {a}")),
            Some((a, b)) => words.push(format!("ports {a}-{b}")),
            None => {}
        }
        if self.tcp_syn {
            words.push("syn".into());
        }
        if words.is_empty() {
            "any traffic".into()
        } else {
            words.join(" ")
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
    #[error("{rule}.window: {window:?} is outside 1s..=60s")]
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
    #[error(
        "{rule}.bytes_per_second: {allowance} bytes per window cannot admit one full-size \
         frame ({MIN_FRAME_BYTES} bytes); raise bytes_per_second, window or burst_bytes"
    )]
    BytesBelowFrame { rule: String, allowance: u64 },
    #[error("{rule}.block: {block:?} is longer than the maximum 24h (use action = \"deny\")")]
    BlockTooLong { rule: String, block: Duration },
    #[error("{rule}.ports: port range {min}-{max} is reversed")]
    PortsReversed { rule: String, min: u16, max: u16 },
    #[error("{rule}.ports: ports need protocol tcp or udp, not {protocol}")]
    PortsNeedTcpOrUdp { rule: String, protocol: u8 },
    #[error("{rule}.tcp_syn: a SYN match needs protocol tcp, not {protocol}")]
    SynNeedsTcp { rule: String, protocol: u8 },
    #[error("{rule}.protocol: 0 is not a protocol; leave protocol out to match any")]
    ProtocolZero { rule: String },
    #[error("{rule}.cidr: {cidr} has host bits set (did you mean {}?)", cidr.trunc())]
    HostBits { rule: String, cidr: IpNet },
    #[error(
        "{rule}.cidr: prefix {cidr} is longer than the /{key_len} sources are keyed by \
         (limits.{})",
        if cidr.addr().is_ipv4() { "ipv4_prefix" } else { "ipv6_prefix" }
    )]
    PrefixTooLong {
        rule: String,
        cidr: IpNet,
        key_len: u8,
    },
    #[error("{rule}: same prefix and match as {other}")]
    Duplicate { rule: String, other: String },
    #[error(transparent)]
    Overlap(Box<Overlap>),
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

/// Two rules of one prefix whose matches overlap without one containing
/// the other, so a frame they both match would have two rules.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "{rule} ({rule_match}) and {other} ({other_match}) both cover {cidr} and overlap without \
     one containing the other (both match {example}); narrow one, or add a rule for {cidr} \
     that matches only what they share"
)]
pub struct Overlap {
    pub rule: String,
    pub rule_match: String,
    pub other: String,
    pub other_match: String,
    pub cidr: IpNet,
    pub example: String,
}

/// A rule set ready for the kernel. Rule `i` of the set (0 = default)
/// lives at `RULES[base + i]`; block tags are left 0 for the pusher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    /// `Config` without its generation (the pusher sets that).
    pub config: Config,
    pub rules: Vec<Rule>,
    pub v4: Vec<(u8, [u8; 4], RuleRefs)>,
    pub v6: Vec<(u8, [u8; 16], RuleRefs)>,
}

/// `"default"` or `"rules[N]"` for index `index` of a rule set (0 =
/// default).
pub fn rule_name(index: usize) -> String {
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
    // Index 0 is the default rule, covering both families. A full port
    // range is no port match.
    let normalized: Vec<RuleSpec> = std::iter::once(&set.default)
        .chain(&set.rules)
        .map(|spec| RuleSpec {
            matches: spec.matches.normalized(),
            ..spec.clone()
        })
        .collect();
    let all: Vec<&RuleSpec> = normalized.iter().collect();
    for (i, spec) in all.iter().enumerate().skip(1) {
        if spec.cidr != spec.cidr.trunc() {
            return Err(RuleError::HostBits {
                rule: rule_name(i),
                cidr: spec.cidr,
            });
        }
        check_prefix(spec, &rule_name(i), set)?;
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
    let budget_of = |m: &Match| -> u8 {
        classes
            .iter()
            .position(|c| c == m)
            .map_or(0, |i| i as u8 + 1)
    };
    let mut rules = Vec::with_capacity(all.len());
    for (i, spec) in all.iter().enumerate() {
        let mut rule = compile_rule(spec, &rule_name(i), set.buckets_per_window, cpus)?;
        rule.budget = budget_of(&spec.matches);
        rule.fingerprint = fingerprint(i, spec, &rule, set.dry_run);
        rules.push(rule);
    }

    let mut config = Config::new(set.dry_run, set.v4_prefix_len, set.v6_prefix_len);
    config.class_count = classes.len() as u8;
    for (slot, class) in config.classes.iter_mut().zip(&classes) {
        *slot = class.class();
    }
    let space = FrameSpace::new(&config, &classes);
    let resolver = Resolver {
        all: &all,
        rules: &rules,
        classes: &classes,
        space: &space,
    };

    // Every rule prefix, plus the two default routes.
    let mut prefixes: Vec<IpNet> = vec![
        "0.0.0.0/0".parse().expect("valid"),
        "::/0".parse().expect("valid"),
    ];
    for spec in &all[1..] {
        if !prefixes.contains(&spec.cidr) {
            prefixes.push(spec.cidr);
        }
    }
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for prefix in prefixes {
        let refs = resolver.refs(&prefix, base)?;
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

/// A representative frame: protocol, destination port, TCP flags. The
/// representatives cover every protocol a match names (plus TCP, UDP and
/// one no match names) and every port at and beside each range's ends, so
/// whatever holds for them holds for every frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sample {
    protocol: u8,
    port: u16,
    flags: u8,
}

impl Sample {
    fn describe(&self) -> String {
        match self.protocol {
            PROTO_TCP => {
                let syn = match self.flags & (TCP_FLAG_SYN | TCP_FLAG_ACK) {
                    TCP_FLAG_SYN => "SYN ",
                    _ => "",
                };
                format!("TCP {syn}to port {}", self.port)
            }
            PROTO_UDP => format!("UDP to port {}", self.port),
            p => format!("protocol {p}"),
        }
    }
}

/// The frame classes the matches induce: which can occur, and which
/// resolved classes an unresolved one may stand for.
struct FrameSpace {
    samples: Vec<Sample>,
    /// For each frame class, the resolved classes its frames may have
    /// (empty: no frame has this class), with an example frame each.
    possible: Vec<Vec<(u8, Sample)>>,
}

impl FrameSpace {
    fn new(config: &Config, classes: &[Match]) -> Self {
        let mut protocols = vec![PROTO_TCP, PROTO_UDP];
        for m in classes {
            if let Some(p) = m.protocol {
                if !protocols.contains(&p) {
                    protocols.push(p);
                }
            }
        }
        let other = (1..=254u8)
            .rev()
            .find(|p| !protocols.contains(p))
            .expect("a protocol no match names");
        protocols.push(other);
        let mut ports = vec![0u16, u16::MAX];
        for m in classes {
            if let Some((a, b)) = m.ports {
                ports.extend([a, b, a.saturating_sub(1), b.saturating_add(1)]);
            }
        }
        ports.sort_unstable();
        ports.dedup();
        let mut samples = Vec::new();
        for &protocol in &protocols {
            if protocol == PROTO_TCP || protocol == PROTO_UDP {
                let flag_sets: &[u8] = if protocol == PROTO_TCP {
                    &[0, TCP_FLAG_SYN, TCP_FLAG_SYN | TCP_FLAG_ACK, TCP_FLAG_ACK]
                } else {
                    &[0]
                };
                for &port in &ports {
                    for &flags in flag_sets {
                        samples.push(Sample {
                            protocol,
                            port,
                            flags,
                        });
                    }
                }
            } else {
                samples.push(Sample {
                    protocol,
                    port: 0,
                    flags: 0,
                });
            }
        }
        let mut possible = vec![Vec::new(); FRAME_CLASSES];
        let mut add = |class: u8, resolved: u8, sample: Sample| {
            let slot: &mut Vec<(u8, Sample)> = &mut possible[usize::from(class)];
            if !slot.iter().any(|(c, _)| *c == resolved) {
                slot.push((resolved, sample));
            }
        };
        for &sample in &samples {
            let resolved =
                config.classify(sample.protocol, sample.port, sample.flags, Transport::Known);
            add(resolved, resolved, sample);
            let unresolved = config.classify(sample.protocol, 0, 0, Transport::PortUnknown);
            add(unresolved, resolved, sample);
            let unknown = config.classify(0, 0, 0, Transport::ProtocolUnknown);
            add(unknown, resolved, sample);
        }
        Self { samples, possible }
    }

    /// Whether every frame that satisfies `inner` satisfies `outer`.
    fn contained(&self, inner: &Match, outer: &Match) -> bool {
        let (inner, outer) = (inner.class(), outer.class());
        self.samples.iter().all(|s| {
            !inner.matches(s.protocol, s.port, s.flags)
                || outer.matches(s.protocol, s.port, s.flags)
        })
    }
}

/// Picks each frame class's rule for each prefix.
struct Resolver<'a> {
    all: &'a [&'a RuleSpec],
    rules: &'a [Rule],
    classes: &'a [Match],
    space: &'a FrameSpace,
}

impl Resolver<'_> {
    /// The trie value of `prefix`: each frame class's rule index + `base`.
    fn refs(&self, prefix: &IpNet, base: u32) -> Result<RuleRefs, RuleError> {
        let mut refs = RuleRefs::default();
        for class in 0..FRAME_CLASSES as u8 {
            let possible = &self.space.possible[usize::from(class)];
            let index = if class < RESOLVED_CLASSES {
                if possible.is_empty() {
                    // No frame has this class; the kernel never asks.
                    self.best(prefix, class, None)?
                } else {
                    self.best(prefix, class, Some(&possible[0].1))?
                }
            } else {
                debug_assert!(class >= UNRESOLVED_BASE || class == UNKNOWN_PROTOCOL_CLASS);
                if possible.is_empty() {
                    continue;
                }
                let mut candidates = Vec::new();
                for (resolved, sample) in possible {
                    candidates.push(self.best(prefix, *resolved, Some(sample))?);
                }
                self.strictest(&candidates)
            };
            refs.rules[usize::from(class)] = base + index as u32;
        }
        Ok(refs)
    }

    /// The rule (index into `all`) of resolved class `class` for sources
    /// in `prefix`; `example` is a frame of that class, for errors (none:
    /// no frame has the class, so overlaps there do not matter).
    fn best(
        &self,
        prefix: &IpNet,
        class: u8,
        example: Option<&Sample>,
    ) -> Result<usize, RuleError> {
        let fits = |spec: &RuleSpec| {
            spec.matches.is_any()
                || self
                    .classes
                    .iter()
                    .position(|c| *c == spec.matches)
                    .is_some_and(|i| class & (1 << i) != 0)
        };
        let covering: Vec<usize> = (1..self.all.len())
            .filter(|&i| {
                let cidr = &self.all[i].cidr;
                cidr.contains(prefix)
                    && cidr.prefix_len() <= prefix.prefix_len()
                    && fits(self.all[i])
            })
            .collect();
        let Some(longest) = covering
            .iter()
            .map(|&i| self.all[i].cidr.prefix_len())
            .max()
        else {
            return Ok(0);
        };
        let tied: Vec<usize> = covering
            .into_iter()
            .filter(|&i| self.all[i].cidr.prefix_len() == longest)
            .collect();
        let contained_in_all = |i: usize| {
            tied.iter().all(|&j| {
                self.space
                    .contained(&self.all[i].matches, &self.all[j].matches)
            })
        };
        if let Some(&winner) = tied.iter().find(|&&i| contained_in_all(i)) {
            return Ok(winner);
        }
        match example {
            None => Ok(tied[0]),
            Some(sample) => {
                // Two rules neither of which contains the other.
                let (a, b) = tied
                    .iter()
                    .flat_map(|&a| tied.iter().map(move |&b| (a, b)))
                    .find(|&(a, b)| {
                        a < b
                            && !self
                                .space
                                .contained(&self.all[a].matches, &self.all[b].matches)
                            && !self
                                .space
                                .contained(&self.all[b].matches, &self.all[a].matches)
                    })
                    .unwrap_or((tied[0], tied[1]));
                Err(RuleError::Overlap(Box::new(Overlap {
                    rule: rule_name(a),
                    rule_match: self.all[a].matches.describe(),
                    other: rule_name(b),
                    other_match: self.all[b].matches.describe(),
                    cidr: self.all[a].cidr,
                    example: sample.describe(),
                })))
            }
        }
    }

    /// The strictest of `candidates` (indices into `all`): enforced deny,
    /// enforced limit by lowest rate, dry-run deny, dry-run limit, allow;
    /// ties to the lowest index.
    fn strictest(&self, candidates: &[usize]) -> usize {
        *candidates
            .iter()
            .min_by_key(|&&i| (strictness(self.all[i], &self.rules[i]), i))
            .expect("at least one candidate")
    }
}

/// Sort key of a rule's strictness (lower is stricter).
fn strictness(spec: &RuleSpec, rule: &Rule) -> (u8, u128, u128) {
    let window_ns = u128::from(rule.bucket_ns) * u128::from(rule.buckets);
    let rate = |allowance: u64| {
        if allowance == UNLIMITED || window_ns == 0 {
            u128::MAX
        } else {
            u128::from(allowance) * 1_000_000_000 / window_ns
        }
    };
    let rank = match (spec.action, spec.dry_run) {
        (Action::Deny, false) => 0,
        (Action::Limit, false) => 1,
        (Action::Deny, true) => 2,
        (Action::Limit, true) => 3,
        (Action::Allow, _) => 4,
    };
    (
        rank,
        rate(rule.allowance_packets),
        rate(rule.allowance_bytes),
    )
}

/// What rule `index` of a set is and does, as a number: its prefix and
/// match, its compiled limits and action, and whether it is enforced (its
/// own or the global dry-run). Never 0.
fn fingerprint(index: usize, spec: &RuleSpec, rule: &Rule, global_dry_run: bool) -> u64 {
    let mut hash = fnv::FnvHasher::default();
    if index == 0 {
        hash.write(b"default");
    } else {
        hash.write(spec.cidr.to_string().as_bytes());
    }
    hash.write(spec.matches.describe().as_bytes());
    for value in [
        rule.allowance_packets,
        rule.allowance_bytes,
        rule.bucket_ns,
        rule.block_ns,
        u64::from(rule.buckets),
        u64::from(spec.action as u8),
        u64::from(spec.dry_run || global_dry_run),
    ] {
        hash.write_u64(value);
    }
    hash.finish().max(1)
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
    if m.protocol == Some(0) {
        return Err(RuleError::ProtocolZero { rule: name.into() });
    }
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
    if let Some(block) = limits.block.filter(|b| *b > MAX_BLOCK) {
        return Err(RuleError::BlockTooLong {
            rule: name.into(),
            block,
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
    if allowance_bytes < MIN_FRAME_BYTES {
        return Err(RuleError::BytesBelowFrame {
            rule: name.into(),
            allowance: allowance_bytes,
        });
    }
    // Leases only without a byte limit (bytes are counted per frame), and
    // only when they hold back little: see LEASE_DIVISOR.
    let lease_packets = if allowance_packets != UNLIMITED && allowance_bytes == UNLIMITED {
        let holders = u64::from(cpus.max(1)) * (u64::from(buckets) + 1) * LEASE_DIVISOR;
        (allowance_packets / holders).clamp(1, u64::from(u32::MAX)) as u32
    } else {
        1
    };
    let mut rule = Rule::new(spec.action, spec.dry_run);
    rule.allowance_packets = allowance_packets;
    rule.allowance_bytes = allowance_bytes;
    rule.bucket_ns = window_ns / u64::from(buckets);
    // Bounded by MAX_BLOCK above, so the nanoseconds fit.
    rule.block_ns = limits.block.map_or(0, |b| b.as_nanos() as u64);
    rule.buckets = buckets;
    rule.lease_packets = lease_packets;
    Ok(rule)
}

#[cfg(test)]
mod tests {
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

    fn with(
        cidr: &str,
        protocol: Option<u8>,
        ports: Option<(u16, u16)>,
        syn: bool,
        action: Action,
    ) -> RuleSpec {
        let mut r = if action == Action::Limit {
            RuleSpec::limit(net(cidr), 100)
        } else {
            RuleSpec::with_action(net(cidr), action)
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
        let tcp = with("0.0.0.0/0", Some(PROTO_TCP), None, false, Action::Limit);
        let ssh = with(
            "0.0.0.0/0",
            Some(PROTO_TCP),
            Some((22, 22)),
            false,
            Action::Deny,
        );
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
        let syn = with("0.0.0.0/0", Some(PROTO_TCP), None, true, Action::Limit);
        let ssh = with(
            "0.0.0.0/0",
            Some(PROTO_TCP),
            Some((22, 22)),
            false,
            Action::Deny,
        );
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
        let both = with(
            "0.0.0.0/0",
            Some(PROTO_TCP),
            Some((22, 22)),
            true,
            Action::Deny,
        );
        compile(&set(vec![syn, ssh, both]), 0, 2).unwrap();
        // Partial port ranges overlap as well.
        let low = with(
            "0.0.0.0/0",
            Some(PROTO_UDP),
            Some((0, 1023)),
            false,
            Action::Limit,
        );
        let mid = with(
            "0.0.0.0/0",
            Some(PROTO_UDP),
            Some((500, 2000)),
            false,
            Action::Limit,
        );
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
        let web = with(
            "0.0.0.0/0",
            Some(PROTO_TCP),
            Some((443, 443)),
            false,
            Action::Allow,
        );
        let mut slow = with(
            "0.0.0.0/0",
            Some(PROTO_TCP),
            Some((8000, 8999)),
            false,
            Action::Limit,
        );
        slow.limits.pps = Some(10);
        assert_eq!(
            unresolved_rule(vec![web.clone(), slow.clone()]),
            (2, 2),
            "10 pps beats 1000 pps and allow"
        );
        // An enforced deny beats everything; a dry-run one only allow.
        let mut deny = with(
            "0.0.0.0/0",
            Some(PROTO_TCP),
            Some((22, 22)),
            false,
            Action::Deny,
        );
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

        let host_bits = RuleSpec::limit(net("10.0.0.1/8"), 10);
        let err = compile(&set(vec![host_bits]), 0, 2).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rules[0].cidr: 10.0.0.1/8 has host bits set (did you mean 10.0.0.0/8?)"
        );

        let mut zero = RuleSpec::limit(net("192.0.2.0/24"), 10);
        zero.matches.protocol = Some(0);
        assert!(compile(&set(vec![zero]), 0, 2)
            .unwrap_err()
            .to_string()
            .starts_with("rules[0].protocol: 0 is not a protocol"));

        let mut long = RuleSpec::limit(net("192.0.2.0/24"), 10);
        long.limits.block = Some(Duration::from_secs(25 * 3600));
        assert!(compile(&set(vec![long]), 0, 2)
            .unwrap_err()
            .to_string()
            .starts_with("rules[0].block: 90000s is longer than the maximum 24h"));
        let mut day = RuleSpec::limit(net("192.0.2.0/24"), 10);
        day.limits.block = Some(MAX_BLOCK);
        assert_eq!(
            compile(&set(vec![day]), 0, 2).unwrap().rules[1].block_ns,
            86_400_000_000_000
        );

        let mut tiny = RuleSpec::limit(net("192.0.2.0/24"), 10);
        tiny.limits.bytes_per_second = Some(1000);
        tiny.limits.burst_bytes = 500;
        let err = compile(&set(vec![tiny.clone()]), 0, 2).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "rules[0].bytes_per_second: 1500 bytes per window cannot admit one full-size frame"
            ),
            "{err}"
        );
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
}
