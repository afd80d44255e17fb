//! A rule's further levels as the operator writes them, and their
//! compilation into the kernel's `Level`s (`limiter_common::rules::level`
//! has what the kernel does with them).
//!
//! One grammar everywhere (the configuration file's `levels`, `rule add
//! --level`, `rule ls`, and the `level` label of the metrics):
//!
//! ```text
//! KIND[/V4[/V6]]:PPS[+BURST][@WINDOW]
//! source:20000@1m          another window over each source's traffic
//! prefix/24:2000           every source of a /24 (IPv6: /48) together
//! prefix/16/32:50000@10s   every source of a /16 (IPv6: /32) together
//! rule:100000              every frame of the rule together
//! destination:10000        every source toward one address together
//! destination/24:50000     every source toward one /24 (IPv6: /128)
//! pair:100                 each source toward each address
//! ```
//!
//! The window defaults to the rule's own, the IPv6 length of a prefix to
//! [`DEFAULT_V6_PREFIX`], a destination's lengths to /32 and /128.

use std::{fmt, str::FromStr, time::Duration};

use limiter_common::{
    rules::level::{FAIR_SHARES, MAX_LEVELS, MAX_LEVEL_WINDOW_NS, RESERVE_SHARES},
    window::MAX_PACKETS,
    Level, LevelKind,
};

use super::{RuleError, RuleSpec};

pub mod select;

/// The IPv6 prefix length of a `prefix` level given without one.
pub const DEFAULT_V6_PREFIX: u8 = 48;
/// Shortest and longest window of a level: short burst guards to
/// sustained caps.
pub const MIN_LEVEL_WINDOW: Duration = Duration::from_millis(100);
pub const MAX_LEVEL_WINDOW: Duration = Duration::from_nanos(MAX_LEVEL_WINDOW_NS);

/// What a level's budget is shared by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LevelPer {
    /// Each source alone: another window over its traffic.
    Source,
    /// Every source of one prefix of these lengths.
    Prefix { v4: u8, v6: u8 },
    /// Every frame of the rule.
    Rule,
    /// Every source toward one destination prefix of these lengths.
    Destination { v4: u8, v6: u8 },
    /// Each source toward each destination address.
    Pair,
}

/// One level of a rule: a packet rate over a window, per `per`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LevelSpec {
    pub per: LevelPer,
    /// Packets per second.
    pub pps: u64,
    /// Packets allowed above `pps * window` in one window.
    pub burst_packets: u64,
    /// `None`: the rule's window.
    pub window: Option<Duration>,
}

impl LevelSpec {
    /// What the level is keyed by and over which window, without its
    /// rate: the `level` label of the metrics (`prefix/24/48@1s`), a
    /// bounded set (at most [`MAX_LEVELS`] per rule).
    pub fn label(&self, rule_window: Duration) -> String {
        let window = humantime::format_duration(self.window.unwrap_or(rule_window));
        format!("{}@{window}", self.per)
    }
}

impl fmt::Display for LevelPer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LevelPer::Source => f.write_str("source"),
            LevelPer::Rule => f.write_str("rule"),
            LevelPer::Prefix { v4, v6 } => write!(f, "prefix/{v4}/{v6}"),
            LevelPer::Destination { v4: 32, v6: 128 } => f.write_str("destination"),
            LevelPer::Destination { v4, v6 } => write!(f, "destination/{v4}/{v6}"),
            LevelPer::Pair => f.write_str("pair"),
        }
    }
}

impl fmt::Display for LevelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.per, self.pps)?;
        if self.burst_packets != 0 {
            write!(f, "+{}", self.burst_packets)?;
        }
        if let Some(window) = self.window {
            write!(f, "@{}", humantime::format_duration(window))?;
        }
        Ok(())
    }
}

impl FromStr for LevelSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let usage = || {
            format!(
                "{text:?} is not a level: KIND[/V4[/V6]]:PPS[+BURST][@WINDOW], KIND one of \
                 source, prefix, rule, destination, pair (e.g. prefix/24:2000, rule:50000@10s, \
                 source:20000@1m, destination:10000)"
            )
        };
        let (kind, rest) = text.trim().split_once(':').ok_or_else(usage)?;
        let (rate, window) = match rest.split_once('@') {
            Some((rate, window)) => {
                let window = humantime::parse_duration(window.trim())
                    .map_err(|e| format!("{text:?}: window {window:?}: {e}"))?;
                (rate, Some(window))
            }
            None => (rest, None),
        };
        let (pps, burst) = match rate.split_once('+') {
            Some((pps, burst)) => (pps, Some(burst)),
            None => (rate, None),
        };
        let number = |what: &str, value: &str| {
            value
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("{text:?}: {what} {value:?} is not a whole number"))
        };
        let pps = number("pps", pps)?;
        let burst_packets = burst.map(|b| number("burst", b)).transpose()?.unwrap_or(0);
        let mut parts = kind.trim().split('/');
        let len = |what: &str, value: Option<&str>| -> Result<Option<u8>, String> {
            value
                .map(|v| {
                    v.trim().parse::<u8>().map_err(|_| {
                        format!("{text:?}: {what} prefix length {v:?} is not a number")
                    })
                })
                .transpose()
        };
        let per = match parts.next().unwrap_or_default() {
            "source" => LevelPer::Source,
            "rule" => LevelPer::Rule,
            "pair" => LevelPer::Pair,
            "destination" => {
                let v4 = len("IPv4", parts.next())?.unwrap_or(32);
                let v6 = len("IPv6", parts.next())?.unwrap_or(128);
                LevelPer::Destination { v4, v6 }
            }
            "prefix" => {
                let v4 = len("IPv4", parts.next())?.ok_or_else(|| {
                    format!(
                        "{text:?}: a prefix level needs its length, as prefix/24 or prefix/24/48"
                    )
                })?;
                let v6 = len("IPv6", parts.next())?.unwrap_or(DEFAULT_V6_PREFIX);
                LevelPer::Prefix { v4, v6 }
            }
            _ => return Err(usage()),
        };
        if parts.next().is_some() {
            return Err(usage());
        }
        Ok(LevelSpec {
            per,
            pps,
            burst_packets,
            window,
        })
    }
}

impl serde::Serialize for LevelSpec {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for LevelSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Checks `spec`'s levels (named `name`) against sources keyed by
/// `/v4_key` and `/v6_key`, and compiles them for buckets of `buckets`
/// per window; also returns the rule's `fair_packets` for its own window
/// `rule_window_ns`.
pub(super) fn compile_levels(
    spec: &RuleSpec,
    name: &str,
    buckets: u32,
    (v4_key, v6_key): (u8, u8),
    rule_window_ns: u64,
) -> Result<(Vec<Level>, u64), RuleError> {
    if spec.levels.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let field = |i: usize| format!("{name}.levels[{i}]");
    if spec.action != limiter_common::Action::Limit {
        return Err(RuleError::LevelsNotLimit {
            rule: name.into(),
            action: spec.action,
        });
    }
    if spec.scope == limiter_common::Scope::Cluster {
        return Err(RuleError::LevelsCluster { rule: name.into() });
    }
    if spec.levels.len() > MAX_LEVELS {
        return Err(RuleError::TooManyLevels {
            rule: name.into(),
            count: spec.levels.len(),
        });
    }
    let mut levels = Vec::with_capacity(spec.levels.len());
    let mut fair = u64::MAX;
    for (i, level) in spec.levels.iter().enumerate() {
        // Windows compared as they apply: `prefix/24:10@1s` on a rule of
        // 1 s is `prefix/24:10` (and would share its metric label).
        let window_of = |level: &LevelSpec| level.window.unwrap_or(spec.limits.window);
        if let Some(j) = spec.levels[..i]
            .iter()
            .position(|other| other.per == level.per && window_of(other) == window_of(level))
        {
            return Err(RuleError::LevelDuplicate {
                level: field(i),
                other: field(j),
            });
        }
        let window = level.window.unwrap_or(spec.limits.window);
        if !(MIN_LEVEL_WINDOW..=MAX_LEVEL_WINDOW).contains(&window) {
            return Err(RuleError::LevelWindow {
                level: field(i),
                window,
            });
        }
        let kind = level_kind(level, &field(i), (v4_key, v6_key))?;
        let window_ns = window.as_nanos() as u64;
        let allowance = level_allowance(level, window_ns, &field(i))?;
        let (v4, v6) = match level.per {
            LevelPer::Prefix { v4, v6 } | LevelPer::Destination { v4, v6 } => (v4, v6),
            _ => (0, 0),
        };
        let mut compiled = Level::new(kind, v4, v6);
        compiled.allowance_packets = allowance;
        compiled.heavy_allowance_packets = if kind.is_aggregate() {
            fair = fair.min(
                (u128::from(allowance) * u128::from(rule_window_ns) / u128::from(window_ns)) as u64,
            );
            allowance - (allowance / RESERVE_SHARES).max(1).min(allowance - 1)
        } else {
            allowance
        };
        compiled.bucket_ns = window_ns / u64::from(buckets);
        compiled.buckets = buckets;
        levels.push(compiled);
    }
    let fair_packets = if fair == u64::MAX {
        0
    } else {
        (fair / FAIR_SHARES).max(1)
    };
    Ok((levels, fair_packets))
}

/// What a level is keyed by, its prefixes within what the key can hold
/// (a destination's within the address, a source prefix within the
/// rule's key).
fn level_kind(
    level: &LevelSpec,
    field: &str,
    (v4_key, v6_key): (u8, u8),
) -> Result<LevelKind, RuleError> {
    Ok(match level.per {
        LevelPer::Source => LevelKind::Source,
        LevelPer::Rule => LevelKind::Rule,
        LevelPer::Pair => LevelKind::Pair,
        LevelPer::Destination { v4, v6 } => {
            for (family, len, most) in [("IPv4", v4, 32), ("IPv6", v6, 128)] {
                if len > most {
                    return Err(RuleError::LevelPrefix {
                        level: field.to_string(),
                        family,
                        len,
                        key: most,
                    });
                }
            }
            LevelKind::Destination
        }
        LevelPer::Prefix { v4, v6 } => {
            for (family, len, key) in [("IPv4", v4, v4_key), ("IPv6", v6, v6_key)] {
                if len > key {
                    return Err(RuleError::LevelPrefix {
                        level: field.to_string(),
                        family,
                        len,
                        key,
                    });
                }
            }
            LevelKind::Prefix
        }
    })
}

/// A level's packets a window (`pps` over the window plus its burst, at
/// least 1), refused at 0 pps and above what the kernel counts.
fn level_allowance(level: &LevelSpec, window_ns: u64, field: &str) -> Result<u64, RuleError> {
    if level.pps == 0 {
        return Err(RuleError::Zero {
            rule: field.to_string(),
            what: "pps",
        });
    }
    let value = u128::from(level.pps) * u128::from(window_ns) / 1_000_000_000
        + u128::from(level.burst_packets);
    if value > u128::from(MAX_PACKETS) {
        return Err(RuleError::TooLarge {
            rule: field.to_string(),
            what: "packets",
            value,
            max: MAX_PACKETS,
        });
    }
    Ok((value as u64).max(1))
}

#[cfg(test)]
mod tests;
