//! The control protocol between the daemon and the CLI: one JSON request
//! per line on a Unix socket, one JSON response line back. Every message
//! carries the protocol version; a peer of another version is refused with
//! a clear error instead of being misread.

use serde::{Deserialize, Serialize};

use std::time::Duration;

use crate::config::RuleSection;

/// Bumped on any incompatible change of the messages below.
pub const PROTOCOL_VERSION: u32 = 1;
/// Largest request line the daemon reads.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// Every key of a request line outside its `rule` (whose keys are
/// [`RuleSection::KEYS`]): what tests and fuzzers build requests from.
pub const REQUEST_KEYS: &[&str] = &[
    "version",
    "command",
    "limit",
    "level",
    "dry_run",
    "save",
    "guards",
    "guard_for",
    "edit",
    "op",
    "rule",
    "cidr",
    "since",
    "quantile",
    "headroom",
    "apply",
    "duration",
    "reason",
    "missing_ok",
    "list",
    "prefixes",
];

/// A request, as sent: `{"version":1,"command":"status"}`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct RequestLine {
    pub version: u32,
    #[serde(flatten)]
    pub request: Request,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(tag = "command", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Interfaces, program, rules, map fill, current rates.
    Status,
    /// The heaviest sources of the last aggregation pass; with `level`,
    /// the fullest aggregates of the levels it selects instead
    /// (`rules::level::select`), answered with [`Reply::Aggregates`].
    Top {
        /// At most this many (the daemon keeps `daemon.top_k` sources).
        limit: usize,
        /// A level selector (`/24`, `prefix/24`, `rule`, `source@1m`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        level: Option<String>,
    },
    /// Global dry-run on or off; with `save`, written to the file too.
    /// Enforce with `guards` starts a guard period of `guard_for`
    /// (`crate::guard`); any mode change ends a running one.
    Mode {
        dry_run: bool,
        #[serde(default)]
        save: bool,
        /// Guard expressions (`dropped_share <= 5%`), parsed by the daemon.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        guards: Vec<String>,
        /// The guard period (default 10 min with guards).
        #[serde(
            default,
            with = "humantime_serde",
            skip_serializing_if = "Option::is_none"
        )]
        guard_for: Option<Duration>,
    },
    /// Re-read the configuration file (as SIGHUP does).
    Reload,
    /// The rules in force, in file form.
    RuleList,
    /// Stop protecting every interface, remove the pins, and exit.
    Detach,
    /// Change the rules live; with `save`, write them to the file too.
    Rules { edit: RuleEdit, save: bool },
    /// Lift the penalties of every source inside `cidr`.
    Unblock { cidr: ipnet::IpNet },
    /// Drop every frame from `cidr` for `duration` (`None`: until
    /// unbanned), whatever the rules say (an allow list still passes).
    Ban {
        cidr: ipnet::IpNet,
        #[serde(
            default,
            with = "humantime_serde",
            skip_serializing_if = "Option::is_none"
        )]
        duration: Option<Duration>,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reason: String,
    },
    /// Lift the ban of exactly `cidr`; with `missing_ok`, no ban of it
    /// is not an error.
    Unban {
        cidr: ipnet::IpNet,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        missing_ok: bool,
    },
    /// The bans in force, answered with [`Reply::Bans`].
    Bans,
    /// Add prefixes to, or remove them from, list `list`'s `prefixes`
    /// (live; with `save`, written to the file too).
    ListEdit {
        list: String,
        op: ListOp,
        prefixes: Vec<ipnet::IpNet>,
        #[serde(default)]
        save: bool,
    },
    /// A limit per `limit` rule (or the one named) from the distribution
    /// of per-source rates over `since`: the `quantile`'s rate times
    /// `headroom`; with `apply`, set live as a dry-run rule. Answered with
    /// [`Reply::Suggestions`].
    Suggest {
        /// `default`, `rules[N]`; `None`: every `limit` rule.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rule: Option<String>,
        /// How far back; `None`: the whole history.
        #[serde(
            default,
            with = "humantime_serde",
            skip_serializing_if = "Option::is_none"
        )]
        since: Option<Duration>,
        quantile: f64,
        headroom: f64,
        #[serde(default)]
        apply: bool,
    },
}

/// What a list edit does with its prefixes.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ListOp {
    Add,
    Remove,
}

/// One change to the rules.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum RuleEdit {
    /// A new rule (none with the same prefix and match may exist).
    Add { rule: RuleSection },
    /// Replace the rule with the same prefix and match.
    Set { rule: RuleSection },
    /// Remove the rule with the same prefix and match.
    Remove { rule: RuleSection },
    /// Replace the default rule (no `cidr`).
    Default { rule: RuleSection },
}

/// A response line: `{"version":1,"ok":...}` or `{"version":1,"error":"..."}`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct ResponseLine {
    pub version: u32,
    #[serde(flatten)]
    pub response: Response,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub enum Response {
    Ok(Reply),
    Error(String),
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Reply {
    /// Boxed: the largest reply by far, and the rarest.
    Status(Box<Status>),
    Top {
        sources: Vec<TopSource>,
    },
    /// `top --level`: the aggregates, fullest first.
    Aggregates {
        aggregates: Vec<TopAggregate>,
    },
    Rules {
        /// Boxed: a rule is large, and this reply rare.
        default: Box<RuleSection>,
        rules: Vec<RuleSection>,
    },
    Done {
        message: String,
    },
    /// `suggest`: a proposal per rule.
    Suggestions(Box<Suggestions>),
    /// `bans`: the bans in force, the soonest to end first.
    Bans {
        bans: Vec<BanStatus>,
    },
}

/// One ban in force.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct BanStatus {
    pub cidr: ipnet::IpNet,
    /// Time left, in whole seconds (`None`: until unbanned).
    pub remaining_s: Option<u64>,
    /// How long ago it was set, in whole seconds.
    pub age_s: u64,
    /// `cli` (fail2ban's action too) or `crowdsec`.
    pub origin: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// `suggest`'s answer: what was asked, and a proposal per rule.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Suggestions {
    /// The daemon's `[daemon] history`.
    #[serde(with = "humantime_serde")]
    pub horizon: Duration,
    #[serde(with = "humantime_serde")]
    pub since: Duration,
    pub quantile: f64,
    pub headroom: f64,
    pub rules: Vec<RuleSuggestion>,
    /// The share of the sources past the cheap tier that the daemon's
    /// sample holds (`daemon::known`): 1, or `2^-k` once more sources than
    /// it holds were seen.
    pub sampled_share: f64,
    /// With the tiers on: the sources that touched the cheap tier in its
    /// last epoch, all interfaces, estimated from the sketch (within
    /// about 5 %): the light ones among them (below a rule's cheap frames)
    /// are in no distribution.
    #[serde(default)]
    pub active_sources: Option<u64>,
    /// With `--apply`: what the daemon did (the proposed limits set live
    /// as dry-run rules); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<String>,
}

/// One rule's proposal.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct RuleSuggestion {
    /// The rule's name.
    pub rule: String,
    /// Its per-source packet limit in force (`None`: it limits by bytes
    /// only).
    pub current_pps: Option<u64>,
    /// Known sources read under the rule over `since` (the sample's; of
    /// all sources, about this over `sampled_share`).
    pub sources: u64,
    /// Observations over `since`: each known source once a history slot,
    /// at its highest rate in the slot; those refused in their slot are
    /// left out.
    pub samples: u64,
    /// Observations of sources refused (or would-be refused) in their
    /// slot: left out of the quantile and the effects (a flood is
    /// refused; its offered rate is what it chooses).
    pub refused_samples: u64,
    /// The highest rate a refused source was observed at.
    pub refused_max_pps: Option<u64>,
    /// The quantile's per-source rate (the upper edge of its bucket: at
    /// most 6.25 % above); `None` without samples.
    pub quantile_pps: Option<u64>,
    /// `quantile_pps x headroom`, rounded up to two significant digits.
    pub proposed_pps: Option<u64>,
    /// What the proposed limit would have done over `since`.
    pub proposed: Option<LimitEffect>,
    /// What the limit in force would have done over `since`.
    pub current: Option<LimitEffect>,
}

/// What a per-source limit would have done to the observed rates.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct LimitEffect {
    /// Source-seconds above the limit / all source-seconds.
    pub limited_sources_share: f64,
    /// Packets above the limit / all packets.
    pub limited_traffic_share: f64,
}

impl ResponseLine {
    pub fn ok(reply: Reply) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            response: Response::Ok(reply),
        }
    }

    pub fn error(message: impl Into<String>) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            response: Response::Error(message.into()),
        }
    }
}

/// Parses and checks a request line; the error is what to answer.
pub fn parse_request(line: &str) -> Result<Request, String> {
    // The version is read as any JSON value, so that one of another type
    // (`"1"`, `[1]`) is refused naming the field, not as "expected u32".
    #[derive(Deserialize)]
    struct Versioned {
        version: Option<serde_json::Value>,
    }
    let versioned: Versioned =
        serde_json::from_str(line).map_err(|e| format!("malformed request: {e}"))?;
    match versioned.version {
        Some(version) if version.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => {}
        Some(serde_json::Value::Number(other)) => {
            return Err(format!(
                "protocol version {other} is not supported (this daemon speaks {PROTOCOL_VERSION})"
            ))
        }
        Some(other) => {
            let kind = match other {
                serde_json::Value::Bool(_) => "a boolean",
                serde_json::Value::String(_) => "a string",
                serde_json::Value::Array(_) => "an array",
                _ => "an object",
            };
            return Err(format!(
                "malformed request: `version` must be a number ({PROTOCOL_VERSION}), not {kind}"
            ));
        }
        None => return Err("malformed request: missing field `version`".into()),
    }
    serde_json::from_str::<RequestLine>(line)
        .map(|r| r.request)
        .map_err(|e| format!("malformed request: {e}"))
}

mod status;

pub use status::*;

#[cfg(test)]
mod tests;
