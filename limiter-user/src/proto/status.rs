//! What `status` answers: the daemon's state, per interface, per rule's
//! levels, per guard and for the cluster sync; and the rows of `top`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{
    config::{ClusterConfig, ClusterMode, Fallback},
    kernel::Attachment,
};

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Status {
    /// The daemon's version.
    pub version: String,
    /// Rule generation in force.
    pub generation: u32,
    /// Global dry-run.
    pub dry_run: bool,
    /// Rules in force, the default rule included.
    pub rules: usize,
    /// The levels of the rules in force that have any, in rule order.
    /// Absent when none has (and from a daemon older than levels).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rule_levels: Vec<RuleLevelsStatus>,
    pub interfaces: Vec<InterfaceStatus>,
    /// The cluster this daemon runs with (`configured: false` without
    /// `[cluster]`). Absent from a daemon older than cluster scopes.
    #[serde(default)]
    pub cluster: ClusterStatus,
    /// The global guard period, the running or the last one; absent when
    /// none was started (and from a daemon older than guards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<GuardStatus>,
    /// The rules' guard periods (`scope`: the rule's name when it
    /// started), running or the last ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rule_guards: Vec<GuardStatus>,
    /// The `[[lists]]` loaded, in configuration order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lists: Vec<ListStatus>,
    /// Bans in force.
    #[serde(default)]
    pub bans: usize,
}

/// One list: what it holds and what it judged (all interfaces).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ListStatus {
    pub name: String,
    /// `allow` or `deny`.
    pub action: String,
    /// Distinct prefixes it holds in the kernel.
    pub prefixes: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<std::path::PathBuf>,
    /// Frames it judged since it was loaded.
    pub packets: u64,
    pub bytes: u64,
}

/// `status`'s `guard` block: a guard period (`crate::guard`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct GuardStatus {
    /// `global` (or a rule's name).
    pub scope: String,
    /// `watching`, `passed`, `rolled-back` or `withheld`.
    pub state: String,
    /// The known sources the period judges (`daemon::guarded`).
    #[serde(default)]
    pub known_sources: u64,
    /// The guard period.
    #[serde(with = "humantime_serde")]
    pub period: Duration,
    /// Time left while watching (zero once over), in whole seconds.
    pub remaining_s: u64,
    /// Each guard with its last measured value.
    pub guards: Vec<GuardValue>,
    /// After a rollback: which guard, what was measured, when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<GuardRollback>,
}

/// One guard of a period and its last measured value.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct GuardValue {
    /// As it can be written (`dropped_share <= 5%`).
    pub guard: String,
    /// The last value in the guard's unit (`2.5%`, `3`, `1200`); `None`:
    /// not enough traffic yet to judge.
    pub last: Option<String>,
    /// The same as a number (a share as a fraction).
    pub last_value: Option<f64>,
}

/// The breach that rolled a guard period back.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct GuardRollback {
    pub guard: String,
    /// The measured value in the guard's unit (`20.5%`).
    pub measured: String,
    pub measured_value: f64,
    /// When, in seconds since the Unix epoch.
    pub at_unix_s: u64,
    /// How long ago, in whole seconds.
    pub ago_s: u64,
}

/// One rule's levels, as `status` shows them.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct RuleLevelsStatus {
    /// `default`, `rules[N]`.
    pub rule: String,
    /// Each level in the grammar it is written in
    /// (`KIND[/V4[/V6]]:PPS[+BURST][@WINDOW]`, `rules::level`).
    pub levels: Vec<String>,
}

/// `status`'s `cluster` block: the `[cluster]` settings in force (URLs
/// without passwords), how many rules are cluster-scoped, and the sync's
/// live state (`live`, absent without `[cluster]`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ClusterStatus {
    /// Whether the daemon runs with a `[cluster]` section.
    pub configured: bool,
    /// Rules in force with `scope = "cluster"`, the default rule included.
    pub cluster_rules: usize,
    /// The settings; `None` when not configured.
    #[serde(skip_serializing_if = "Option::is_none", flatten)]
    pub settings: Option<ClusterSettings>,
    /// The sync's live state; `None` when not configured (or from a
    /// daemon without the sync).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<Box<ClusterLive>>,
}

/// What the cluster sync last saw (`daemon::sync`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ClusterLive {
    /// Nodes alive at the last heartbeat (the last known while Redis
    /// fails; 0 before the first).
    pub nodes_alive: u32,
    /// Milliseconds since the last successful sync; `None`: never.
    pub last_sync_age_ms: Option<u64>,
    /// Degraded: 3 or more failed ticks in a row.
    pub degraded: bool,
    /// Cluster-scoped sources the last sync carried.
    pub synced_sources: usize,
    /// The fallback policy in force (`split` or `local`) once degraded
    /// past the grace period; `None` otherwise.
    pub fallback_in_force: Option<Fallback>,
    /// Failed ticks since the daemon started.
    pub failed_ticks: u64,
    /// Another daemon heartbeats under this node's name: this one does
    /// not sync and holds its sources to the fallback cap.
    #[serde(default)]
    pub duplicate_node: bool,
    /// Sources tracked because other nodes listed them hot.
    #[serde(default)]
    pub remote_sources: usize,
}

/// The `[cluster]` settings a daemon runs with, as `status` shows them.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct ClusterSettings {
    /// This node's name.
    pub node: String,
    pub mode: ClusterMode,
    /// With `mode = "sentinel"`: the primary's name at the Sentinels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sentinel_master: Option<String>,
    /// Redis URLs with any password replaced by `***`.
    pub redis: Vec<String>,
    #[serde(with = "humantime_serde")]
    pub sync_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    pub threshold: f64,
    pub fallback: Fallback,
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
}

impl ClusterStatus {
    /// The block for a daemon running with `cluster` and `cluster_rules`
    /// cluster-scoped rules.
    pub fn new(cluster: Option<&ClusterConfig>, cluster_rules: usize) -> Self {
        Self {
            configured: cluster.is_some(),
            cluster_rules,
            settings: cluster.map(|c| ClusterSettings {
                node: c.node.clone(),
                mode: c.mode,
                sentinel_master: c.sentinel_master.clone(),
                redis: c.redis.iter().map(|u| u.redacted().to_string()).collect(),
                sync_interval: c.sync_interval,
                timeout: c.timeout,
                threshold: c.threshold,
                fallback: c.fallback,
                grace: c.grace,
            }),
            live: None,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct InterfaceStatus {
    pub name: String,
    /// How the program is attached: `native`, `generic` or `adopted`.
    pub mode: Attachment,
    pub program_id: u32,
    /// Sources holding per-CPU state (hot; with the tiers off, every source
    /// with state).
    pub tracked_sources: u64,
    /// How many can at once.
    pub capacity: u32,
    pub limited_sources: u64,
    /// Frames per second passed (passed + allowed + would-drop) over the
    /// last aggregation tick.
    pub passed_pps: f64,
    /// Frames per second dropped (limit + deny) over the last tick.
    pub dropped_pps: f64,
    /// Every XDP program on the interface, in the order they run: ours
    /// alone, or the components of libxdp's dispatcher.
    #[serde(default)]
    pub programs: Vec<XdpProgram>,
    /// The libxdp dispatcher running them, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatcher_id: Option<u32>,
}

/// An XDP program on an interface.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct XdpProgram {
    pub id: u32,
    pub name: String,
    /// Its run priority in libxdp's dispatcher (none for a program that
    /// holds the interface alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct TopSource {
    pub interface: String,
    /// Address or prefix (`192.0.2.1`, `2001:db8::/64`).
    pub source: String,
    /// Offered packets in the last complete second.
    pub pps: u64,
    /// Offered bits in the last complete second.
    pub bps: u64,
    /// Dropped (or would-drop) frames since the source was first seen.
    pub dropped: u64,
    /// The rule that applies (`default`, `rules[N]`).
    pub rule: String,
    /// That rule's packet limit, if it has one.
    pub limit_pps: Option<u64>,
    /// `ok`, `limited`, `blocked` (penalty), `would-drop` (dry-run),
    /// `allowed` or `denied`.
    pub state: String,
}

/// One aggregate of a level (an `AGGREGATES` window), as `top --level`
/// shows it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct TopAggregate {
    pub interface: String,
    /// The rule whose level it is (`default`, `rules[N]`).
    pub rule: String,
    /// The level's label (`prefix/24/48@1s`).
    pub level: String,
    /// What the aggregate is keyed by (`10.1.2.0/24`, `rule`,
    /// `-> 192.0.2.1`, `10.0.0.1 -> 192.0.2.1`;
    /// `rules::level::select::aggregate_key`).
    pub key: String,
    /// Packets admitted in the level's window now (the sliding window's
    /// estimate, as the kernel judges the next frame against it).
    pub packets: u64,
    /// Packets the level admits per window.
    pub allowance: u64,
    /// `packets / allowance`.
    pub used: f64,
}
