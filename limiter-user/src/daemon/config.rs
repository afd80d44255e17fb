//! The daemon's TOML configuration: every field has a serde default, so no
//! file at all means a sane built-in configuration (a default rule in
//! dry-run, so a first run never drops an operator's traffic by surprise).
//! Validation names the field and the value; a configuration that fails it
//! is never applied.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use ipnet::IpNet;
use limiter_common::Action;
use serde::{Deserialize, Serialize};

use crate::rules::{
    compile, Limits, Match, RuleError, RuleSet, RuleSpec, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP,
    PROTO_UDP,
};

/// Default per-source packet rate of the built-in default rule.
pub const DEFAULT_PPS: u64 = 1000;
/// Largest `daemon.max_sources` (2^24): each source costs per-CPU state
/// (see docs/configuration.md for the memory formula).
pub const MAX_SOURCES: u32 = 1 << 24;
/// Where state maps and links are pinned.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/xdp-limiter";
/// Where Prometheus scrapes.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9470";

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{field}: {message}")]
    Field { field: String, message: String },
    #[error("{0}")]
    Rules(#[from] RuleError),
}

fn field(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field: field.into(),
        message: message.into(),
    }
}

/// How to attach to an interface.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
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

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    pub daemon: DaemonSection,
    pub limits: LimitsSection,
    pub default: RuleSection,
    pub rules: Vec<RuleSection>,
}

/// `[daemon]`: how the daemon runs. Changing these needs a restart.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonSection {
    /// Interfaces to protect (`--iface` adds to these).
    pub interfaces: Vec<String>,
    pub mode: AttachMode,
    /// bpffs directory for pinned maps and links.
    pub pin_dir: PathBuf,
    /// Prometheus endpoint.
    pub metrics_addr: SocketAddr,
    /// Capacity of each per-source map.
    pub max_sources: u32,
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
}

impl Default for DaemonSection {
    fn default() -> Self {
        Self {
            interfaces: Vec::new(),
            mode: AttachMode::Auto,
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
            metrics_addr: DEFAULT_METRICS_ADDR.parse().expect("valid address"),
            max_sources: limiter_common::DEFAULT_MAX_SOURCES,
            tick: Duration::from_secs(1),
            top_k: 20,
            sources_per_tick: 131_072,
            keep_attached: false,
            control_socket: PathBuf::from(crate::proto::DEFAULT_SOCKET),
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
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            dry_run: false,
            ipv4_prefix: 32,
            ipv6_prefix: 64,
            buckets_per_window: limiter_common::window::DEFAULT_BUCKETS_PER_WINDOW,
        }
    }
}

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

/// A destination port or inclusive range: `53`, `"53"` or `"1000-2000"`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum PortsSpec {
    Port(u16),
    Text(String),
}

/// `[default]` and each `[[rules]]` entry.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RuleSection {
    /// Source prefix (`[[rules]]` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cidr: Option<IpNet>,
    /// `limit`, `allow` or `deny`.
    pub action: ActionName,
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
}

impl Default for RuleSection {
    fn default() -> Self {
        Self {
            cidr: None,
            action: ActionName::Limit,
            protocol: None,
            ports: None,
            tcp_syn: false,
            pps: None,
            bytes_per_second: None,
            burst_packets: 0,
            burst_bytes: 0,
            window: Duration::from_secs(1),
            block: None,
            dry_run: None,
        }
    }
}

/// A rule action as written in the file.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ActionName {
    #[default]
    Limit,
    Allow,
    Deny,
}

impl From<ActionName> for Action {
    fn from(name: ActionName) -> Self {
        match name {
            ActionName::Limit => Action::Limit,
            ActionName::Allow => Action::Allow,
            ActionName::Deny => Action::Deny,
        }
    }
}

/// A validated configuration, with the file form it came from (what
/// `--save` writes back).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub daemon: DaemonSection,
    pub rules: RuleSet,
    pub file: FileConfig,
    /// The file's text as the daemon last read or wrote it (`None`: no
    /// file): `--save` refuses to overwrite a file that changed since.
    pub text: Option<String>,
}

impl Config {
    /// The built-in configuration (what no file means).
    pub fn builtin() -> Self {
        FileConfig::default()
            .validate()
            .expect("the built-in configuration is valid")
    }

    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config = Self::parse(&text, &path.display().to_string())?;
        config.text = Some(text);
        Ok(config)
    }

    /// Parses and validates TOML `text` (`origin` names it in errors).
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_string(),
            message: e.to_string().trim_end().replace('\n', " "),
        })?;
        file.validate()
    }
}

impl FileConfig {
    /// Checks every field and compiles the rules (without touching the
    /// kernel) so that only a configuration that can be pushed is accepted.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let file = self.clone();
        let d = &self.daemon;
        if d.max_sources == 0 || d.max_sources > MAX_SOURCES {
            return Err(field(
                "daemon.max_sources",
                format!("{} is outside 1..={MAX_SOURCES}", d.max_sources),
            ));
        }
        if d.tick < Duration::from_millis(100) || d.tick > Duration::from_secs(60) {
            return Err(field(
                "daemon.tick",
                format!("{:?} is outside 100ms..=60s", d.tick),
            ));
        }
        if d.sources_per_tick < 4096 {
            return Err(field(
                "daemon.sources_per_tick",
                format!("{} is below 4096", d.sources_per_tick),
            ));
        }
        if !d.control_socket.is_absolute() {
            return Err(field(
                "daemon.control_socket",
                format!("{} is not an absolute path", d.control_socket.display()),
            ));
        }
        if !d.pin_dir.is_absolute() {
            return Err(field(
                "daemon.pin_dir",
                format!("{} is not an absolute path", d.pin_dir.display()),
            ));
        }
        for (i, iface) in d.interfaces.iter().enumerate() {
            if iface.is_empty() || iface.len() > 15 || iface.contains(['/', ' ']) {
                return Err(field(
                    format!("daemon.interfaces[{i}]"),
                    format!("{iface:?} is not an interface name"),
                ));
            }
        }
        let default = rule_spec(&self.default, "default", true)?;
        let rules = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| rule_spec(r, &format!("rules[{i}]"), false))
            .collect::<Result<Vec<_>, _>>()?;
        let set = RuleSet {
            default,
            rules,
            dry_run: self.limits.dry_run,
            v4_prefix_len: self.limits.ipv4_prefix,
            v6_prefix_len: self.limits.ipv6_prefix,
            buckets_per_window: self.limits.buckets_per_window,
        };
        compile(&set, 0, 1).map_err(|e| match e {
            // A global knob is named as the file spells it.
            RuleError::KeyPrefix { family, .. } => field(
                if family == "IPv4" {
                    "limits.ipv4_prefix"
                } else {
                    "limits.ipv6_prefix"
                },
                e.to_string(),
            ),
            e => e.into(),
        })?;
        Ok(Config {
            daemon: self.daemon,
            rules: set,
            file,
            text: None,
        })
    }
}

fn rule_spec(section: &RuleSection, name: &str, is_default: bool) -> Result<RuleSpec, ConfigError> {
    let cidr = match (is_default, section.cidr) {
        (true, Some(_)) => {
            return Err(field(
                format!("{name}.cidr"),
                "the default rule covers every source; remove cidr",
            ))
        }
        (true, None) => "0.0.0.0/0".parse().expect("valid"),
        (false, None) => return Err(field(format!("{name}.cidr"), "missing")),
        (false, Some(cidr)) => cidr,
    };
    let protocol = match &section.protocol {
        None => None,
        Some(spec) => Some(spec.number().ok_or_else(|| {
            let text = match spec {
                ProtocolSpec::Name(text) => text.to_ascii_lowercase(),
                ProtocolSpec::Number(n) => n.to_string(),
            };
            field(
                format!("{name}.protocol"),
                format!("unknown protocol {text:?} (tcp, udp, icmp, icmpv6 or a number)"),
            )
        })?),
    };
    let ports = match &section.ports {
        None => None,
        Some(PortsSpec::Port(p)) => Some((*p, *p)),
        Some(PortsSpec::Text(text)) => Some(parse_ports(text).ok_or_else(|| {
            field(
                format!("{name}.ports"),
                format!("{text:?} is not a port or a range like 1000-2000"),
            )
        })?),
    };
    // TOML integers are signed 64-bit: a larger count (the control
    // socket's JSON can carry one, and an allow rule ignores its rates)
    // could never be saved to the file.
    for (what, value) in [
        ("pps", section.pps),
        ("bytes_per_second", section.bytes_per_second),
        ("burst_packets", Some(section.burst_packets)),
        ("burst_bytes", Some(section.burst_bytes)),
    ] {
        if let Some(value) = value.filter(|v| i64::try_from(*v).is_err()) {
            return Err(field(
                format!("{name}.{what}"),
                format!(
                    "{value} is larger than a configuration file holds ({})",
                    i64::MAX
                ),
            ));
        }
    }
    let dry_run = section.dry_run.unwrap_or(is_default);
    let mut pps = section.pps;
    if is_default
        && section.action == ActionName::Limit
        && pps.is_none()
        && section.bytes_per_second.is_none()
    {
        pps = Some(DEFAULT_PPS);
    }
    Ok(RuleSpec {
        cidr,
        matches: Match {
            protocol,
            ports,
            tcp_syn: section.tcp_syn,
        },
        action: section.action.into(),
        limits: Limits {
            pps,
            bytes_per_second: section.bytes_per_second,
            burst_packets: section.burst_packets,
            burst_bytes: section.burst_bytes,
            window: section.window,
            block: section.block,
        },
        dry_run,
    })
}

/// Ethernet header and one VLAN tag on top of the MTU: the largest frame
/// XDP sees on an interface.
const FRAME_OVERHEAD: u64 = 18;

/// Checks that every byte limit of `rules` can admit one full-size frame on
/// each of `interfaces` (their MTU read from sysfs; an interface whose MTU
/// cannot be read is skipped): a smaller allowance would drop every such
/// frame.
pub fn check_frame_sizes(rules: &RuleSet, interfaces: &[String]) -> Result<(), ConfigError> {
    for iface in interfaces {
        let Some(mtu) = std::fs::read_to_string(format!("/sys/class/net/{iface}/mtu"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
        else {
            continue;
        };
        let largest = mtu + FRAME_OVERHEAD;
        let all = std::iter::once(&rules.default).chain(&rules.rules);
        for (i, spec) in all.enumerate() {
            let Some(rate) = spec.limits.bytes_per_second else {
                continue;
            };
            let allowance = u128::from(rate) * spec.limits.window.as_nanos() / 1_000_000_000
                + u128::from(spec.limits.burst_bytes);
            if spec.action == limiter_common::Action::Limit && allowance < u128::from(largest) {
                return Err(field(
                    format!("{}.bytes_per_second", crate::rules::rule_name(i)),
                    format!(
                        "{allowance} bytes per window cannot admit one full-size frame on \
                         {iface} (the MTU of {iface} is {mtu}: frames of {largest} bytes); raise \
                         bytes_per_second, window or burst_bytes"
                    ),
                ));
            }
        }
    }
    Ok(())
}

impl FileConfig {
    /// The TOML text of this configuration.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a configuration serialises")
    }
}

impl RuleSection {
    /// Whether `other` names the same rule: same prefix and match.
    /// However the protocol is spelled (`"UDP"`, `"udp"`, `17`).
    pub fn same_rule(&self, other: &RuleSection) -> bool {
        let protocol = |r: &RuleSection| r.protocol.as_ref().map(ProtocolSpec::number);
        self.cidr.map(|c| c.trunc()) == other.cidr.map(|c| c.trunc())
            && protocol(self) == protocol(other)
            && self.ports_range() == other.ports_range()
            && self.tcp_syn == other.tcp_syn
    }

    fn ports_range(&self) -> Option<(u16, u16)> {
        match &self.ports {
            None => None,
            Some(PortsSpec::Port(p)) => Some((*p, *p)),
            Some(PortsSpec::Text(t)) => parse_ports(t),
        }
    }
}

/// `"53"` or `"1000-2000"`.
pub fn parse_ports(text: &str) -> Option<(u16, u16)> {
    match text.split_once('-') {
        None => text.trim().parse().ok().map(|p| (p, p)),
        Some((min, max)) => Some((min.trim().parse().ok()?, max.trim().parse().ok()?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_file_means_a_dry_run_default_rule() {
        let config = Config::builtin();
        assert_eq!(config.rules.default.limits.pps, Some(DEFAULT_PPS));
        assert!(config.rules.default.dry_run, "a first run never drops");
        assert!(!config.rules.dry_run);
        assert_eq!(config.daemon.metrics_addr.to_string(), DEFAULT_METRICS_ADDR);
        assert_eq!(config.daemon.pin_dir, PathBuf::from(DEFAULT_PIN_DIR));
        assert_eq!(
            Config::parse("", "empty").unwrap(),
            config,
            "an empty file is the built-in"
        );
    }

    #[test]
    fn a_full_file_parses() {
        let text = r#"
            [daemon]
            interfaces = ["eth0"]
            mode = "native"
            tick = "500ms"
            keep_attached = true

            [limits]
            ipv6_prefix = 56
            buckets_per_window = 12

            [default]
            pps = 500
            dry_run = false

            [[rules]]
            cidr = "10.0.0.0/8"
            action = "allow"

            [[rules]]
            cidr = "0.0.0.0/0"
            protocol = "udp"
            ports = "53"
            pps = 50
            burst_packets = 10
            window = "10s"
            block = "1m"

            [[rules]]
            cidr = "2001:db8::/32"
            protocol = "tcp"
            tcp_syn = true
            bytes_per_second = 100000
        "#;
        let config = Config::parse(text, "test.toml").unwrap();
        assert_eq!(config.daemon.mode, AttachMode::Native);
        assert_eq!(config.daemon.tick, Duration::from_millis(500));
        assert_eq!(config.rules.v6_prefix_len, 56);
        assert_eq!(config.rules.default.limits.pps, Some(500));
        assert!(!config.rules.default.dry_run);
        let dns = &config.rules.rules[1];
        assert_eq!(dns.matches.ports, Some((53, 53)));
        assert_eq!(dns.matches.protocol, Some(PROTO_UDP));
        assert_eq!(dns.limits.block, Some(Duration::from_secs(60)));
        assert!(config.rules.rules[2].matches.tcp_syn);
    }

    #[track_caller]
    fn rejected(text: &str, expect: &str) {
        let err = Config::parse(text, "bad.toml")
            .expect_err("must be rejected")
            .to_string();
        assert!(
            err.contains(expect),
            "error {err:?} does not mention {expect:?}"
        );
    }

    #[test]
    fn bad_files_are_rejected_with_the_field_and_value_named() {
        rejected("[default]\npps = \"fast\"", "pps");
        rejected("[default]\npps = -5", "pps");
        rejected("[daemon]\ncolour = 1", "colour");
        rejected("[[rules]]\npps = 5", "rules[0].cidr: missing");
        rejected("[[rules]]\ncidr = \"10.0.0.0/33\"", "cidr");
        rejected(
            "[[rules]]\ncidr = \"10.0.0.0/8\"\nprotocol = \"tcpp\"\npps = 1",
            "rules[0].protocol: unknown protocol \"tcpp\"",
        );
        rejected(
            "[[rules]]\ncidr = \"10.0.0.0/8\"\nprotocol = \"udp\"\nports = \"99-10\"\npps = 1",
            "rules[0].ports: port range 99-10 is reversed",
        );
        rejected(
            "[[rules]]\ncidr = \"10.0.0.0/8\"\nports = \"http\"\npps = 1",
            "rules[0].ports",
        );
        rejected(
            "[[rules]]\ncidr = \"10.0.0.0/8\"\nwindow = \"2m\"\npps = 1",
            "rules[0].window",
        );
        rejected(
            "[[rules]]\ncidr = \"10.0.0.0/8\"",
            "rules[0]: a `limit` rule needs",
        );
        rejected("[default]\ncidr = \"10.0.0.0/8\"", "default.cidr");
        rejected("[daemon]\ntick = \"1ms\"", "daemon.tick");
        rejected("[daemon]\nmetrics_addr = \"nowhere\"", "metrics_addr");
        rejected("[daemon]\ninterfaces = [\"a/b\"]", "daemon.interfaces[0]");
        rejected("[limits]\nipv4_prefix = 40", "IPv4 key prefix length 40");
        rejected(
            "[daemon]\nmax_sources = 100000000",
            "daemon.max_sources: 100000000 is outside 1..=16777216",
        );
        rejected("[daemon]\nmax_sources = 0", "daemon.max_sources");
        rejected(
            "[[rules]]\ncidr = \"10.0.0.0/8\"\nprotocol = 0\npps = 1",
            "rules[0].protocol: 0 is not a protocol",
        );
        rejected(
            "[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 1\nblock = \"2d\"",
            "rules[0].block",
        );
        rejected(
            "[default]\nbytes_per_second = 1000",
            "default.bytes_per_second: 1000 bytes per window cannot admit one full-size frame",
        );
        rejected("not toml at all", "bad.toml");
    }

    #[test]
    fn the_shipped_example_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/config.toml");
        let config = Config::load(&path).expect("dist/config.toml is valid");
        assert_eq!(config.daemon.interfaces, vec!["eth0".to_string()]);
        assert!(!config.rules.default.dry_run);
        assert_eq!(config.rules.rules.len(), 2);
    }

    /// `ProtectSystem=full` makes /etc read-only: the unit must allow the
    /// directory of the file it runs with, or `--save` fails.
    #[test]
    fn the_shipped_unit_lets_save_write_its_configuration_directory() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/xdp-limiter.service");
        let unit = std::fs::read_to_string(&path).expect("the unit");
        let value = |key: &str| {
            unit.lines()
                .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .map(str::trim)
                .collect::<Vec<_>>()
        };
        let exec = value("ExecStart").join(" ");
        let config = exec
            .split_whitespace()
            .skip_while(|w| *w != "--config")
            .nth(1)
            .expect("ExecStart names --config");
        let dir = Path::new(config).parent().expect("a directory");
        assert_eq!(value("ProtectSystem"), vec!["full"]);
        let writable: Vec<&str> = value("ReadWritePaths")
            .iter()
            .flat_map(|v| v.split_whitespace())
            .collect();
        assert!(
            writable.iter().any(|w| Path::new(w) == dir),
            "ReadWritePaths {writable:?} lacks {}",
            dir.display()
        );
    }

    #[test]
    fn a_configuration_survives_a_round_trip_through_toml() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/config.toml");
        let config = Config::load(&path).unwrap();
        let again = Config::parse(&config.file.to_toml(), "round trip").unwrap();
        assert_eq!(again.rules, config.rules);
        assert_eq!(again.daemon, config.daemon);
    }

    #[test]
    fn ports_parse() {
        assert_eq!(parse_ports("53"), Some((53, 53)));
        assert_eq!(parse_ports("1000-2000"), Some((1000, 2000)));
        assert_eq!(parse_ports("x"), None);
        assert_eq!(parse_ports("1-"), None);
    }
}
