//! The configuration file's form: the sections serde reads (every field
//! with a default) and `--save` writes back. Rules travel in this form over
//! the control socket too, so an edit is validated exactly as a file is.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use super::{ClusterSection, DEFAULT_METRICS_ADDR, DEFAULT_PIN_DIR, DEFAULT_SOCKET};

/// How to attach to an interface (the file's `daemon.mode`, and `run
/// --mode`).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AttachMode {
    /// Native (driver) mode, falling back to generic mode with a warning.
    #[default]
    Auto,
    /// Native (driver) mode or fail.
    Native,
    /// Generic (skb) mode.
    Generic,
}

/// How the program takes an interface (the file's `daemon.attach`, and
/// `run --attach`).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AttachKind {
    /// A link of its own: the interface runs xdp-limiter alone.
    #[default]
    Link,
    /// A component of libxdp's multi-program dispatcher, beside other XDP
    /// programs (xdp-filter, xdp-loader and other libxdp users).
    Dispatcher,
}

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    pub daemon: DaemonSection,
    pub limits: LimitsSection,
    pub default: RuleSection,
    pub rules: Vec<RuleSection>,
    /// `[[lists]]`: prefixes allowed or denied before any rule.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lists: Vec<ListSection>,
    /// `[cluster]`; absent: no cluster, every rule is node-scoped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterSection>,
    /// `[crowdsec]`; absent: no CrowdSec bouncer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crowdsec: Option<CrowdsecSection>,
}

/// `[crowdsec]`: follow a CrowdSec local API's decisions into bans.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CrowdsecSection {
    /// The local API, `http://HOST:PORT/` (CrowdSec's default is
    /// http://127.0.0.1:8080/).
    pub api_url: String,
    /// A file holding the bouncer's key (`cscli bouncers add NAME`).
    pub api_key_file: PathBuf,
    /// How often to poll the decision stream (1 s to 1 h; default 10 s,
    /// as CrowdSec's own bouncers).
    #[serde(default = "default_poll_interval", with = "humantime_serde")]
    pub poll_interval: Duration,
}

fn default_poll_interval() -> Duration {
    Duration::from_secs(10)
}

/// What a list does with the frames of the sources it holds.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ListKind {
    /// Passed, judged by no rule and no ban.
    Allow,
    /// Dropped.
    Deny,
}

/// A `[[lists]]` entry: a named set of prefixes to allow or deny, from a
/// file (re-read on reload) and/or written here.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListSection {
    /// Its name in `status` and the metrics.
    pub name: String,
    pub action: ListKind,
    /// One prefix a line (`#`/`;` comments, ipset-save lines); relative
    /// to the configuration file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// Prefixes written in the configuration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
}

/// `[daemon]`: how the daemon runs. Changing these needs a restart.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonSection {
    /// Interfaces to protect (`--iface` adds to these).
    pub interfaces: Vec<String>,
    pub mode: AttachMode,
    /// A link of its own, or a component of libxdp's dispatcher.
    #[serde(skip_serializing_if = "is_link")]
    pub attach: AttachKind,
    /// The run priority in libxdp's dispatcher (lowest runs first).
    #[serde(skip_serializing_if = "is_default_priority")]
    pub priority: u32,
    /// bpffs directory for pinned maps and links.
    pub pin_dir: PathBuf,
    /// Prometheus endpoint.
    pub metrics_addr: SocketAddr,
    /// Sources with exact state (a shared window) at once, per interface:
    /// `WINDOWS`' capacity. Memory does not grow with the CPU count.
    pub max_sources: u32,
    /// Sources with per-CPU state (busy or refused ones) at once, per
    /// interface: `SOURCES`' capacity. Each costs 192 bytes per possible
    /// CPU. With `limits.tiers = false` every source has per-CPU state, so
    /// this is then the number of sources tracked.
    pub max_hot_sources: u32,
    /// Prefixes of one family (IPv4, IPv6) across all `[[lists]]` at
    /// once, per interface. The list tries allocate per prefix (about 130
    /// bytes an IPv4 one with the trie's inner nodes, twice while a new set
    /// is loaded; docs/configuration.md), so an unused capacity costs
    /// nothing.
    pub max_list_prefixes: u32,
    /// Where the daemon keeps what outlives it: the bans (`bans.json`).
    /// Empty: nowhere (bans then last while the pinned maps do).
    pub state_dir: PathBuf,
    /// Aggregation period.
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// Heaviest sources kept per tick.
    pub top_k: usize,
    /// Sources read per tick at most: bounds the daemon's CPU per tick;
    /// a larger map is swept over several ticks.
    pub sources_per_tick: usize,
    /// Leave the program attached (pinned) when the daemon stops.
    pub keep_attached: bool,
    /// Unix socket of the control API (root only, mode 0600).
    pub control_socket: PathBuf,
    /// "source limited" log lines per second at most, all interfaces
    /// together (0: none); the lines held back are counted and summed up.
    pub limited_log_per_second: u32,
    /// Such lines written at once at most, after a quiet spell.
    pub limited_log_burst: u32,
    /// How far back the daemon keeps the distribution of per-source rates
    /// (`xdp-limiter suggest`), 1 min to 24 h.
    #[serde(with = "humantime_serde")]
    pub history: Duration,
    /// The log's format (`--log-format` overrides it); read at start-up
    /// only. Written only when not the default.
    #[serde(skip_serializing_if = "is_text")]
    pub log_format: crate::logs::LogFormat,
    /// While the kernel finds the tickets of sources without a proven
    /// address all taken (a flood fills the windows), the daemon sets
    /// `net.ipv4.tcp_syncookies = 2` in its network namespace, so that
    /// every SYN-ACK is a cookie a new TCP client can prove its address
    /// with; it puts the old value back once the pressure is over and when
    /// it stops. Written only when off.
    #[serde(skip_serializing_if = "is_true")]
    pub syncookie_shield: bool,
}

fn is_true(value: &bool) -> bool {
    *value
}

fn is_link(attach: &AttachKind) -> bool {
    *attach == AttachKind::Link
}

fn is_default_priority(priority: &u32) -> bool {
    *priority == crate::kernel::dispatcher::DEFAULT_PRIORITY
}

fn is_text(format: &crate::logs::LogFormat) -> bool {
    *format == crate::logs::LogFormat::Text
}

impl Default for DaemonSection {
    fn default() -> Self {
        Self {
            interfaces: Vec::new(),
            mode: AttachMode::Auto,
            attach: AttachKind::Link,
            priority: crate::kernel::dispatcher::DEFAULT_PRIORITY,
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
            metrics_addr: DEFAULT_METRICS_ADDR.parse().expect("valid address"),
            max_sources: limiter_common::DEFAULT_MAX_SOURCES,
            max_hot_sources: limiter_common::DEFAULT_MAX_HOT_SOURCES,
            max_list_prefixes: limiter_common::lists::DEFAULT_MAX_LIST_PREFIXES,
            state_dir: PathBuf::from(super::DEFAULT_STATE_DIR),
            syncookie_shield: true,
            tick: Duration::from_secs(1),
            top_k: 20,
            sources_per_tick: 131_072,
            keep_attached: false,
            control_socket: PathBuf::from(DEFAULT_SOCKET),
            limited_log_per_second: super::DEFAULT_LIMITED_LOG_PER_SECOND,
            limited_log_burst: super::DEFAULT_LIMITED_LOG_BURST,
            history: Duration::from_secs(3600),
            log_format: crate::logs::LogFormat::Text,
        }
    }
}

/// `[limits]`: global knobs of enforcement.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsSection {
    /// Global dry-run: count what would be dropped, drop nothing.
    pub dry_run: bool,
    /// IPv4 sources share state per prefix of this length.
    pub ipv4_prefix: u8,
    /// IPv6 sources share state per prefix of this length.
    pub ipv6_prefix: u8,
    /// Buckets per window (bucket width = window / buckets).
    pub buckets_per_window: u32,
    /// Tiered source state: a source gets no state until it sends more
    /// than a few frames in a second (the cheap tier), then a shared
    /// window (the exact tier), and per-CPU state only once it is busy or
    /// refused. Off: every source gets per-CPU state on its first frame.
    pub tiers: bool,
    /// Guards (`METRIC OP VALUE`, `crate::guard`) watched for `guard_for`
    /// after the daemon starts or reloads into enforce (`dry_run =
    /// false`): a breach returns it to dry-run on its own.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub guards: Vec<String>,
    /// The guard period (5s..=24h); unset: 10 min.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub guard_for: Option<Duration>,
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            dry_run: false,
            ipv4_prefix: 32,
            ipv6_prefix: 64,
            buckets_per_window: limiter_common::window::DEFAULT_BUCKETS_PER_WINDOW,
            tiers: true,
            guards: Vec::new(),
            guard_for: None,
        }
    }
}

/// A field's name and what is wrong with it.
pub type FieldError = (String, String);

impl FileConfig {
    /// The TOML text of this configuration.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a configuration serialises")
    }
}

mod rule;

pub use rule::*;
