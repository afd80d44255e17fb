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
//!
//! This file holds the operator's form of rules and the errors; `compile`
//! turns a rule set into the kernel's tables, `resolve` decides which rule
//! judges each frame class of each prefix (the rules above).

use std::{hash::Hasher, net::IpAddr, time::Duration};

use ipnet::IpNet;
use limiter_common::{
    rules::{
        Transport, FRAME_CLASSES, MAX_CLASSES, MAX_RULES, RESOLVED_CLASSES, TCP_FLAG_ACK,
        TCP_FLAG_SYN, UNKNOWN_PROTOCOL_CLASS, UNRESOLVED_BASE,
    },
    sketch,
    window::{MAX_BUCKETS_PER_WINDOW, MAX_BYTES, MAX_PACKETS, UNLIMITED},
    Action, AddressFamily, Config, Rule, RuleRefs, Scope, TrafficClass,
};

mod compile;
pub mod level;
mod resolve;
#[cfg(test)]
mod tests;

pub use compile::compile;
pub use level::{LevelPer, LevelSpec};

/// IP protocol numbers rules can match by name.
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMPV6: u8 = 58;

/// Shortest and longest window a rule may have.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);
pub const MAX_WINDOW: Duration = Duration::from_nanos(limiter_common::window::MAX_WINDOW_NS);
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
    /// Its name (`config::RuleSection::effective_name`): what metrics,
    /// history, guards and the CLI call it.
    pub name: String,
    /// Source prefix (IPv4 or IPv6).
    pub cidr: IpNet,
    pub matches: Match,
    pub action: Action,
    pub limits: Limits,
    /// Count would-be drops, drop nothing.
    pub dry_run: bool,
    /// Whether the limit holds per node or for the whole cluster (see
    /// [`RuleError::ClusterNotLimit`] and its neighbours for what a
    /// cluster-scoped rule may be).
    pub scope: Scope,
    /// Further limits besides the per-source one (`level`): aggregates
    /// and other windows.
    pub levels: Vec<LevelSpec>,
}

impl RuleSpec {
    /// A `limit` rule for `cidr` at `pps` packets per second.
    pub fn limit(cidr: IpNet, pps: u64) -> Self {
        Self {
            name: cidr.trunc().to_string(),
            cidr,
            matches: Match::default(),
            action: Action::Limit,
            limits: Limits {
                pps: Some(pps),
                ..Limits::default()
            },
            dry_run: false,
            scope: Scope::Node,
            levels: Vec::new(),
        }
    }

    #[cfg(any(test, feature = "test-util"))]
    /// A rule with `action` and no limits (allow or deny).
    pub fn with_action(cidr: IpNet, action: Action) -> Self {
        Self {
            name: cidr.trunc().to_string(),
            cidr,
            matches: Match::default(),
            action,
            limits: Limits::default(),
            dry_run: false,
            scope: Scope::Node,
            levels: Vec::new(),
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
    /// Tiered source state (cheap, exact, hot; `Config::tiered`).
    pub tiered: bool,
}

impl RuleSet {
    #[cfg(any(test, feature = "test-util"))]
    /// Only a default rule, with what an empty `[limits]` gives: keyed /32
    /// and /64, 10 buckets per window, tiers on.
    pub fn with_default(default: RuleSpec) -> Self {
        Self {
            default: RuleSpec {
                name: DEFAULT_RULE_NAME.into(),
                ..default
            },
            rules: Vec::new(),
            dry_run: false,
            v4_prefix_len: 32,
            v6_prefix_len: 64,
            buckets_per_window: limiter_common::window::DEFAULT_BUCKETS_PER_WINDOW,
            tiered: true,
        }
    }
}

impl RuleSet {
    /// The rules in `RULES` order: the default rule, then the others.
    pub fn specs(&self) -> impl Iterator<Item = &RuleSpec> {
        std::iter::once(&self.default).chain(&self.rules)
    }

    /// The name of the rule at `position` (0: the default rule).
    pub fn name(&self, position: usize) -> Option<&str> {
        self.specs().nth(position).map(|spec| spec.name.as_str())
    }

    /// The position of the rule named `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.specs().position(|spec| spec.name == name)
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
    /// Allow and deny need no budget, so there is nothing to share.
    #[error(
        "{rule}.scope: only a `limit` rule can be cluster-scoped, not `{action}` (an allow or \
         deny rule needs no shared budget; leave scope out)",
        action = action.name()
    )]
    ClusterNotLimit { rule: String, action: Action },
    /// First version: a penalty is per-node state the sync does not carry.
    #[error(
        "{rule}.block: a cluster-scoped rule cannot carry a penalty in this version (a block \
         would hold on the node that saw the excess only); remove block, or keep the rule \
         node-scoped"
    )]
    ClusterBlock { rule: String },
    /// First version: the nodes share packet counts only.
    #[error(
        "{rule}.bytes_per_second: a cluster-scoped rule limits packets only in this version \
         (nodes share packet counts); remove bytes_per_second and burst_bytes, or keep the \
         rule node-scoped"
    )]
    ClusterBytes { rule: String },
    #[error("{rule}.pps: a cluster-scoped rule needs a packet rate (pps)")]
    ClusterNoPps { rule: String },
    #[error(
        "{rule}.levels: only a `limit` rule has levels, not `{action}` (an allow or deny rule \
         counts nothing); remove levels",
        action = action.name()
    )]
    LevelsNotLimit { rule: String, action: Action },
    #[error(
        "{rule}.levels: a cluster-scoped rule cannot have levels in this version (they are \
         held per node); remove levels, or keep the rule node-scoped"
    )]
    LevelsCluster { rule: String },
    #[error("{rule}.levels: {count} levels, more than the {max} a rule may have", max = limiter_common::rules::MAX_LEVELS)]
    TooManyLevels { rule: String, count: usize },
    #[error(
        "{level}: window {window:?} is outside {:?}..={:?}",
        level::MIN_LEVEL_WINDOW,
        level::MAX_LEVEL_WINDOW
    )]
    LevelWindow { level: String, window: Duration },
    #[error(
        "{level}: {family} prefix /{len} is longer than the /{key} sources are keyed by \
         (limits.{}): a level aggregates sources, it cannot split one",
        if *family == "IPv4" { "ipv4_prefix" } else { "ipv6_prefix" }
    )]
    LevelPrefix {
        level: String,
        family: &'static str,
        len: u8,
        key: u8,
    },
    #[error("{level}: keyed and windowed as {other}; merge them")]
    LevelDuplicate { level: String, other: String },
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
    #[error(
        "{} key prefix length {len} is longer than {max}",
        match family { AddressFamily::V4 => "IPv4", AddressFamily::V6 => "IPv6" }
    )]
    KeyPrefix {
        family: AddressFamily,
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
    pub v4: Routes<4>,
    pub v6: Routes<16>,
}

/// A family's trie entries: prefix length, network address, and the rule
/// each frame class of the prefix resolves to.
pub type Routes<const N: usize> = Vec<(u8, [u8; N], RuleRefs)>;

/// The default rule's name.
pub const DEFAULT_RULE_NAME: &str = "default";
/// The longest rule name: room for an IPv6 prefix and a match.
pub const MAX_RULE_NAME: usize = 80;

/// Why `name` cannot name a rule, if it cannot: 1 to [`MAX_RULE_NAME`]
/// characters of letters, digits and `_ . : / + -` (a label, a CLI
/// argument and a log field as it is), not `global` (the global guard's
/// scope).
pub fn check_rule_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_RULE_NAME {
        return Err(format!(
            "{name:?} is not a rule name: 1 to {MAX_RULE_NAME} characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_.:/+-".contains(*c)))
    {
        return Err(format!(
            "{name:?} is not a rule name: {c:?} (letters, digits and _ . : / + - only)"
        ));
    }
    if name == "global" {
        return Err("\"global\" names the global guard, not a rule".into());
    }
    Ok(())
}

/// `"default"` or `"rules[N]"` for index `index` of a rule set (0 =
/// default): where a rule is in the file, which the configuration's
/// errors name (a rule's name is `RuleSpec::name`).
pub fn rule_name(index: usize) -> String {
    if index == 0 {
        "default".into()
    } else {
        format!("rules[{}]", index - 1)
    }
}

/// The cheap tier's frames, never counted in a window, may add at most
/// 1/`CHEAP_SHARE` of a limit's allowance to any of its windows
/// (`Rule::cheap_frames`): 10%. What keeps a spoofed flood in the cheap
/// tier is a threshold above what its one-frame sources read there: about
/// 5 at 262,144 such sources a second, 9 at a million (docs/architecture.md
/// has the figures), so 10% keeps a flood of a million a second in the
/// cheap tier from a limit of 100 packets a window on.
pub const CHEAP_SHARE: u64 = 10;
/// The largest frame XDP hands the program (single-buffer XDP: a page
/// less the headroom), for the bytes the cheap tier may admit.
pub const CHEAP_FRAME_BYTES: u64 = 4096;
/// The most frames over two epochs the cheap tier judges under a limit:
/// above what a flood of a million one-frame sources a second reads there
/// (9), and 1.6% of a 1,000 pps limit.
pub const MAX_CHEAP_FRAMES: u64 = 16;

/// Share of a window's allowance that unused leases may withhold, as a
/// divisor: leases are sized so that all CPUs together, over all buckets of
/// a window, hold back at most `allowance / LEASE_DIVISOR` (under 1%).
pub const LEASE_DIVISOR: u64 = 128;
