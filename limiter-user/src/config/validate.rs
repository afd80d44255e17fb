//! Validation: the file form checked field by field and compiled (without
//! touching the kernel) into a [`Config`], so that only a configuration
//! that can be pushed is ever accepted. Every error names its field.

use std::time::Duration;

use super::{
    parse_ports, ClusterConfig, Config, ConfigError, FileConfig, PortsSpec, ProtocolSpec,
    RuleSection, DEFAULT_PPS, MAX_SOURCES,
};
use limiter_common::{Action, AddressFamily, Scope};

use crate::guard::{self, Guard, GuardError};
use crate::rules::{
    check_rule_name, compile, rule_name, Limits, Match, RuleError, RuleSet, RuleSpec,
    DEFAULT_RULE_NAME,
};

/// The most "source limited" lines a second (or at once) the daemon may
/// be set to write: beyond, the cap no longer protects the log.
const MAX_LOG_LINES: u32 = 10_000;

/// `[crowdsec]`: an `http://` URL, a readable key file, a sane interval.
fn check_crowdsec(section: &super::CrowdsecSection) -> Result<super::CrowdsecConfig, ConfigError> {
    let api_url: hyper::Uri = section
        .api_url
        .parse()
        .map_err(|e| field("crowdsec.api_url", format!("{:?}: {e}", section.api_url)))?;
    if api_url.scheme_str() != Some("http") || api_url.authority().is_none() {
        return Err(field(
            "crowdsec.api_url",
            format!(
                "{:?}: an http://HOST:PORT/ URL of the local API (https is not supported: \
                 run the bouncer beside the local API)",
                section.api_url
            ),
        ));
    }
    let key = std::fs::read_to_string(&section.api_key_file).map_err(|e| {
        field(
            "crowdsec.api_key_file",
            format!("cannot read {}: {e}", section.api_key_file.display()),
        )
    })?;
    let api_key = key.trim().to_string();
    if api_key.is_empty() {
        return Err(field(
            "crowdsec.api_key_file",
            format!(
                "{} is empty: put the key of `cscli bouncers add NAME` in it",
                section.api_key_file.display()
            ),
        ));
    }
    let interval = section.poll_interval;
    if interval < Duration::from_secs(1) || interval > Duration::from_secs(3600) {
        return Err(field(
            "crowdsec.poll_interval",
            format!("{} is outside 1s..1h", humantime::format_duration(interval)),
        ));
    }
    Ok(super::CrowdsecConfig {
        api_url,
        api_key,
        poll_interval: interval,
    })
}

/// The `[[lists]]` entries' own fields (their files are read when the
/// daemon loads them, `crate::lists`).
fn check_lists(lists: &[super::ListSection]) -> Result<(), ConfigError> {
    use limiter_common::lists::MAX_LISTS;
    if lists.len() > MAX_LISTS {
        return Err(field("lists", format!("at most {MAX_LISTS} lists")));
    }
    for (i, list) in lists.iter().enumerate() {
        let at = format!("lists[{i}]");
        if let Err(message) = check_rule_name(&list.name) {
            return Err(field(format!("{at}.name"), message));
        }
        if lists[..i].iter().any(|other| other.name == list.name) {
            return Err(field(
                format!("{at}.name"),
                format!("another list is named {:?}", list.name),
            ));
        }
        if list.file.is_none() && list.prefixes.is_empty() {
            return Err(field(at, "a list needs a `file`, `prefixes` or both"));
        }
        for (j, prefix) in list.prefixes.iter().enumerate() {
            if let Err((_, message)) = crate::lists::parse(prefix) {
                return Err(field(format!("{at}.prefixes[{j}]"), message));
            }
        }
    }
    Ok(())
}

fn field(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field: field.into(),
        message: message.into(),
    }
}

impl FileConfig {
    /// Checks every field and compiles the rules (without touching the
    /// kernel) so that only a configuration that can be pushed is accepted.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let file = self.clone();
        check_daemon(&self.daemon)?;
        check_lists(&self.lists)?;
        self.limits.guard_plan()?;
        let cluster = self.cluster.as_ref().map(|c| c.validate()).transpose()?;
        let crowdsec = self.crowdsec.as_ref().map(check_crowdsec).transpose()?;
        let default = rule_spec(&self.default, &rule_name(0), true)?;
        let rules = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| rule_spec(r, &rule_name(i + 1), false))
            .collect::<Result<Vec<_>, _>>()?;
        check_names(std::iter::once(&default).chain(&rules))?;
        let set = RuleSet {
            default,
            rules,
            dry_run: self.limits.dry_run,
            v4_prefix_len: self.limits.ipv4_prefix,
            v6_prefix_len: self.limits.ipv6_prefix,
            buckets_per_window: self.limits.buckets_per_window,
            tiered: self.limits.tiers,
        };
        compile(&set, 0, 1).map_err(|e| match e {
            // A global knob is named as the file spells it.
            RuleError::KeyPrefix { family, .. } => field(
                match family {
                    AddressFamily::V4 => "limits.ipv4_prefix",
                    AddressFamily::V6 => "limits.ipv6_prefix",
                },
                e.to_string(),
            ),
            e => e.into(),
        })?;
        // After the rules compiled: what is wrong with a rule itself (an
        // allow rule cannot be cluster-scoped at all) is the first thing to
        // fix, before a missing section.
        if let Some(name) = first_cluster_rule(&set).filter(|_| cluster.is_none()) {
            return Err(field(
                format!("{name}.scope"),
                "a cluster-scoped rule needs a [cluster] section (the Redis URLs its nodes \
                 share the budget through); add one, or leave scope out for a per-node limit",
            ));
        }
        Ok(Config {
            daemon: self.daemon,
            rules: set,
            cluster,
            crowdsec,
            file,
            text: None,
        })
    }
}

/// Checks that no two rules have one name (a given name may not take
/// another rule's derived one either).
fn check_names<'a>(specs: impl Iterator<Item = &'a RuleSpec>) -> Result<(), ConfigError> {
    let mut seen = std::collections::HashMap::new();
    for (position, spec) in specs.enumerate() {
        if let Some(first) = seen.insert(spec.name.as_str(), position) {
            return Err(field(
                format!("{}.name", rule_name(position)),
                format!(
                    "{:?} names {} too: a name names one rule",
                    spec.name,
                    rule_name(first)
                ),
            ));
        }
    }
    Ok(())
}

/// `[daemon]`'s fields within their bounds.
fn check_daemon(d: &super::DaemonSection) -> Result<(), ConfigError> {
    if d.max_sources == 0 || d.max_sources > MAX_SOURCES {
        return Err(field(
            "daemon.max_sources",
            format!("{} is outside 1..={MAX_SOURCES}", d.max_sources),
        ));
    }
    if d.max_hot_sources == 0 || d.max_hot_sources > MAX_SOURCES {
        return Err(field(
            "daemon.max_hot_sources",
            format!("{} is outside 1..={MAX_SOURCES}", d.max_hot_sources),
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
    if d.limited_log_per_second > MAX_LOG_LINES {
        return Err(field(
            "daemon.limited_log_per_second",
            format!("{} is above {MAX_LOG_LINES}", d.limited_log_per_second),
        ));
    }
    if d.limited_log_burst == 0 || d.limited_log_burst > MAX_LOG_LINES {
        return Err(field(
            "daemon.limited_log_burst",
            format!("{} is outside 1..={MAX_LOG_LINES}", d.limited_log_burst),
        ));
    }
    {
        use super::{MAX_HORIZON, MIN_HORIZON};
        if d.history < MIN_HORIZON || d.history > MAX_HORIZON {
            return Err(field(
                "daemon.history",
                format!(
                    "{} is outside 1m..=24h (the horizon of the per-source rate history)",
                    humantime::format_duration(d.history)
                ),
            ));
        }
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
    Ok(())
}

/// The rule's name: given (checked; `default` for the default rule
/// only) or derived from its prefix and match.
fn name_of(section: &RuleSection, name: &str, is_default: bool) -> Result<String, ConfigError> {
    Ok(match (&section.name, is_default) {
        (Some(given), true) if given != DEFAULT_RULE_NAME => {
            return Err(field(
                format!("{name}.name"),
                format!("the default rule is named {DEFAULT_RULE_NAME:?}, not {given:?}"),
            ))
        }
        (Some(given), false) if given == DEFAULT_RULE_NAME => {
            return Err(field(
                format!("{name}.name"),
                format!("{DEFAULT_RULE_NAME:?} names the default rule"),
            ))
        }
        (Some(given), _) => {
            check_rule_name(given).map_err(|e| field(format!("{name}.name"), e))?;
            given.clone()
        }
        (None, _) => section.derived_name(),
    })
}

/// A port range, first and last.
type PortRange = (u16, u16);

/// The rule's protocol (by name or number) and ports (one or a range).
fn match_of(
    section: &RuleSection,
    name: &str,
) -> Result<(Option<u8>, Option<PortRange>), ConfigError> {
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
    Ok((protocol, ports))
}

fn rule_spec(section: &RuleSection, name: &str, is_default: bool) -> Result<RuleSpec, ConfigError> {
    section
        .guard_plan(name, is_default)
        .map_err(|(name, message)| field(name, message))?;
    let rule_name = name_of(section, name, is_default)?;
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
    let (protocol, ports) = match_of(section, name)?;
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
    let levels = section
        .levels
        .iter()
        .enumerate()
        .map(|(i, level)| {
            level
                .spec()
                .map_err(|e| field(format!("{name}.levels[{i}]"), e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let dry_run = section.dry_run.unwrap_or(is_default);
    let mut pps = section.pps;
    if is_default
        && section.action == Action::Limit
        && pps.is_none()
        && section.bytes_per_second.is_none()
    {
        pps = Some(DEFAULT_PPS);
    }
    Ok(RuleSpec {
        name: rule_name,
        cidr,
        matches: Match {
            protocol,
            ports,
            tcp_syn: section.tcp_syn,
        },
        action: section.action,
        limits: Limits {
            pps,
            bytes_per_second: section.bytes_per_second,
            burst_packets: section.burst_packets,
            burst_bytes: section.burst_bytes,
            window: section.window,
            block: section.block,
        },
        dry_run,
        scope: section.scope,
        levels,
    })
}

/// The name of the first cluster-scoped rule of `rules` (`default` first).
fn first_cluster_rule(rules: &RuleSet) -> Option<String> {
    std::iter::once(&rules.default)
        .chain(&rules.rules)
        .position(|spec| spec.scope == Scope::Cluster)
        .map(rule_name)
}

/// Checks that `rules` has no cluster-scoped rule unless the daemon runs
/// with a cluster (`running`): `[cluster]` takes effect on restart, so a
/// reload or an edit that brings cluster-scoped rules to a daemon started
/// without one is refused (rather than run as node limits unannounced).
pub fn check_cluster_in_force(
    rules: &RuleSet,
    running: Option<&ClusterConfig>,
) -> Result<(), ConfigError> {
    match first_cluster_rule(rules) {
        Some(name) if running.is_none() => Err(field(
            format!("{name}.scope"),
            "the daemon runs without [cluster] (it was started without one, and [cluster] \
             takes effect on restart): restart it with [cluster] in its configuration to use \
             cluster-scoped rules",
        )),
        _ => Ok(()),
    }
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
                    format!("{}.bytes_per_second", rule_name(i)),
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

impl super::LimitsSection {
    /// The guard period `[limits]` asks for: its guards and how long
    /// (`None`: no guards, or `dry_run = true`: guards watch enforcement
    /// and wait in the file until it enforces, which is also what a
    /// saved rollback writes), each error naming its field.
    pub fn guard_plan(&self) -> Result<Option<guard::Plan>, ConfigError> {
        let guards = self
            .guards
            .iter()
            .enumerate()
            .map(|(i, text)| {
                text.parse::<Guard>()
                    .map_err(|e| field(format!("limits.guards[{i}]"), e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let period = guard::check_plan(false, &guards, self.guard_for).map_err(|e| {
            let name = match e {
                GuardError::PeriodOutOfRange(_) | GuardError::PeriodWithoutGuard => {
                    "limits.guard_for"
                }
                _ => "limits.guards",
            };
            field(name, e.to_string())
        })?;
        Ok(period
            .filter(|_| !self.dry_run)
            .map(|period| (guards, period)))
    }
}
