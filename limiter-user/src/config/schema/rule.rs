//! A `[[rules]]` table's form (and `[default]`'s): what serde reads and
//! `--save` writes, the match's protocol and ports, the levels as
//! written, and the name a rule is known by.

use std::time::Duration;

use ipnet::IpNet;
use limiter_common::{Action, Scope};
use serde::{Deserialize, Serialize};

use super::FieldError;
use crate::rules::{
    LevelSpec, Limits, DEFAULT_RULE_NAME, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP,
};

/// A protocol by name or number.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum ProtocolSpec {
    Number(u8),
    Name(String),
}

impl ProtocolSpec {
    /// The protocol number; `None` for a name that is none of ours.
    pub fn number(&self) -> Option<u8> {
        match self {
            ProtocolSpec::Number(n) => Some(*n),
            ProtocolSpec::Name(name) => match name.to_ascii_lowercase().as_str() {
                "tcp" => Some(PROTO_TCP),
                "udp" => Some(PROTO_UDP),
                "icmp" => Some(PROTO_ICMP),
                "icmpv6" | "ipv6-icmp" => Some(PROTO_ICMPV6),
                _ => None,
            },
        }
    }
}

impl std::str::FromStr for ProtocolSpec {
    type Err = String;

    /// A number, or a name [`number`](Self::number) knows (any case).
    fn from_str(text: &str) -> Result<Self, String> {
        if let Ok(number) = text.parse::<u8>() {
            return Ok(ProtocolSpec::Number(number));
        }
        let name = ProtocolSpec::Name(text.to_ascii_lowercase());
        match name.number() {
            Some(_) => Ok(name),
            None => Err(format!(
                "unknown protocol {text:?} (tcp, udp, icmp, icmpv6 or a number)"
            )),
        }
    }
}

/// A destination port or inclusive range: `53`, `"53"` or `"1000-2000"`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum PortsSpec {
    Port(u16),
    Text(String),
}

impl std::str::FromStr for PortsSpec {
    type Err = String;

    /// `53` or `1000-2000`, kept as written.
    fn from_str(text: &str) -> Result<Self, String> {
        parse_ports(text)
            .map(|_| PortsSpec::Text(text.to_string()))
            .ok_or_else(|| format!("{text:?} is not a port or a range like 1000-2000"))
    }
}

/// `[default]` and each `[[rules]]` entry.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RuleSection {
    /// The rule's name: what metrics, history, guards, `status`, `top`,
    /// `suggest` and `rule rm --name` call it. Unset: derived from the
    /// prefix and match (`RuleSection::derived_name`) and written to the
    /// file by the next `--save`, so it stays when the rules around it
    /// change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Source prefix (`[[rules]]` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cidr: Option<IpNet>,
    /// `limit`, `allow` or `deny`.
    pub action: Action,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<ProtocolSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<PortsSpec>,
    /// Only TCP SYN segments (SYN set, ACK clear).
    pub tcp_syn: bool,
    /// Packets per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pps: Option<u64>,
    /// Bytes per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<u64>,
    /// Extra packets allowed in one window.
    pub burst_packets: u64,
    /// Extra bytes allowed in one window.
    pub burst_bytes: u64,
    /// Sliding window, 1s to 60s.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Once over the limit, drop the source for this long.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub block: Option<Duration>,
    /// Dry-run this rule. Unset: true for `[default]`, false for rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    /// `node` (the default) or `cluster`. Written only when `cluster`, so
    /// files and requests of node rules carry no scope field.
    #[serde(default, skip_serializing_if = "is_node")]
    pub scope: Scope,
    /// Further limits (`KIND[/V4[/V6]]:PPS[+BURST][@WINDOW]`, see
    /// `rules::level`): aggregates and other windows.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub levels: Vec<LevelEntry>,
    /// Guards (`METRIC OP VALUE`, `crate::guard`) judged on this rule's
    /// figures for `guard_for` once it enforces (started by the edit that
    /// sets it, or by the daemon's start or a reload): a breach returns
    /// this rule alone to dry-run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub guards: Vec<String>,
    /// The rule's guard period (5s..=24h); unset: 10 min.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub guard_for: Option<Duration>,
}

/// A level of a rule as a file or a request spells it: read as any
/// string, so that a malformed one reaches validation, which names its
/// field (`rules[0].levels[1]`), rather than failing the whole file with
/// only a line number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LevelEntry {
    Level(LevelSpec),
    /// As written, with why it is no level.
    Malformed {
        text: String,
        error: String,
    },
}

impl LevelEntry {
    /// The level, or why the text is none.
    pub fn spec(&self) -> Result<LevelSpec, &str> {
        match self {
            LevelEntry::Level(level) => Ok(*level),
            LevelEntry::Malformed { error, .. } => Err(error),
        }
    }
}

impl From<LevelSpec> for LevelEntry {
    fn from(level: LevelSpec) -> Self {
        LevelEntry::Level(level)
    }
}

impl From<&str> for LevelEntry {
    fn from(text: &str) -> Self {
        match text.parse() {
            Ok(level) => LevelEntry::Level(level),
            Err(error) => LevelEntry::Malformed {
                text: text.to_string(),
                error,
            },
        }
    }
}

/// A level in the grammar's own form (`prefix/24/48:2000`), a malformed
/// one as written.
impl std::fmt::Display for LevelEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LevelEntry::Level(level) => write!(f, "{level}"),
            LevelEntry::Malformed { text, .. } => f.write_str(text),
        }
    }
}

impl Serialize for LevelEntry {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LevelEntry {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(String::deserialize(deserializer)?.as_str().into())
    }
}

fn is_node(scope: &Scope) -> bool {
    *scope == Scope::Node
}

impl Default for RuleSection {
    /// A rule's limits default as [`Limits`] does.
    fn default() -> Self {
        let limits = Limits::default();
        Self {
            name: None,
            cidr: None,
            action: Action::Limit,
            protocol: None,
            ports: None,
            tcp_syn: false,
            pps: limits.pps,
            bytes_per_second: limits.bytes_per_second,
            burst_packets: limits.burst_packets,
            burst_bytes: limits.burst_bytes,
            window: limits.window,
            block: limits.block,
            dry_run: None,
            scope: Scope::Node,
            levels: Vec::new(),
            guards: Vec::new(),
            guard_for: None,
        }
    }
}

impl RuleSection {
    /// Every key of a rule, in the file's `[default]` and `[[rules]]` and
    /// in a request's `rule`: what tests and fuzzers build rules from.
    pub const KEYS: &'static [&'static str] = &[
        "name",
        "cidr",
        "action",
        "protocol",
        "ports",
        "tcp_syn",
        "pps",
        "bytes_per_second",
        "burst_packets",
        "burst_bytes",
        "window",
        "block",
        "dry_run",
        "scope",
        "levels",
        "guards",
        "guard_for",
    ];

    /// Whether `other` names the same rule: same prefix and match.
    /// However the protocol is spelled (`"UDP"`, `"udp"`, `17`).
    pub fn same_rule(&self, other: &RuleSection) -> bool {
        let protocol = |r: &RuleSection| r.protocol.as_ref().map(ProtocolSpec::number);
        self.cidr.map(|c| c.trunc()) == other.cidr.map(|c| c.trunc())
            && protocol(self) == protocol(other)
            && self.ports_range() == other.ports_range()
            && self.tcp_syn == other.tcp_syn
    }

    /// The name of a rule without one: `default`, or its prefix, then its
    /// match (`192.0.2.0/24`, `10.0.0.0/8+udp:53`, `0.0.0.0/0+tcp:80-443+syn`):
    /// what names it in the rules already (`same_rule`), so a rule keeps
    /// its name whatever is added or removed around it.
    pub fn derived_name(&self) -> String {
        let Some(cidr) = self.cidr else {
            return DEFAULT_RULE_NAME.to_string();
        };
        let mut name = cidr.trunc().to_string();
        if let Some(protocol) = &self.protocol {
            match protocol.number() {
                Some(n) => name.push_str(&format!("+{}", protocol_name(n))),
                None => name.push_str("+?"),
            }
        }
        if let Some((low, high)) = self.ports_range() {
            name.push_str(&match low == high {
                true => format!(":{low}"),
                false => format!(":{low}-{high}"),
            });
        }
        if self.tcp_syn {
            name.push_str("+syn");
        }
        name
    }

    /// The rule's name: given, or derived.
    pub fn effective_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.derived_name())
    }

    /// Whether this rule enforces by itself (its own `dry_run`, unset
    /// meaning dry-run for the default rule and enforce for the others).
    pub fn enforces(&self, is_default: bool) -> bool {
        !self.dry_run.unwrap_or(is_default)
    }

    /// The guard period this rule asks for (`None`: no guards, or the
    /// rule does not enforce), or why its guards are refused (each
    /// error naming its field under `name`).
    pub fn guard_plan(
        &self,
        name: &str,
        is_default: bool,
    ) -> Result<Option<crate::guard::Plan>, FieldError> {
        let guards = self
            .guards
            .iter()
            .enumerate()
            .map(|(i, text)| {
                text.parse::<crate::guard::Guard>()
                    .map_err(|e| (format!("{name}.guards[{i}]"), e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if !guards.is_empty() && self.action != Action::Limit {
            return Err((
                format!("{name}.guards"),
                "guards watch a limit: this rule's action is not `limit`".into(),
            ));
        }
        let period = crate::guard::check_plan(false, &guards, self.guard_for)
            .map_err(|e| (format!("{name}.guard_for"), e.to_string()))?;
        Ok(period
            .filter(|_| self.enforces(is_default))
            .map(|period| (guards, period)))
    }

    fn ports_range(&self) -> Option<(u16, u16)> {
        match &self.ports {
            None => None,
            Some(PortsSpec::Port(p)) => Some((*p, *p)),
            Some(PortsSpec::Text(t)) => parse_ports(t),
        }
    }
}

/// A protocol number as a derived name spells it.
fn protocol_name(number: u8) -> String {
    match number {
        PROTO_TCP => "tcp".into(),
        PROTO_UDP => "udp".into(),
        PROTO_ICMP => "icmp".into(),
        PROTO_ICMPV6 => "icmpv6".into(),
        n => n.to_string(),
    }
}

/// `"53"` or `"1000-2000"`.
pub fn parse_ports(text: &str) -> Option<(u16, u16)> {
    match text.split_once('-') {
        None => text.trim().parse().ok().map(|p| (p, p)),
        Some((min, max)) => Some((min.trim().parse().ok()?, max.trim().parse().ok()?)),
    }
}
