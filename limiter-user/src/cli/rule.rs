//! `xdp-limiter rule add|set|rm|ls` and `xdp-limiter default set`: rules
//! changed live in the daemon (every source re-resolves on its next frame,
//! counters stay), and with `--save` written back to its configuration
//! file so they survive a restart.

use std::{path::Path, time::Duration};

use clap::{Args, ValueEnum};
use ipnet::IpNet;

use super::{client, units, Output};
use crate::{
    daemon::config::{parse_ports, ActionName, PortsSpec, ProtocolSpec, RuleSection},
    proto::{Reply, Request, RuleEdit},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ActionArg {
    Limit,
    Allow,
    Deny,
}

/// What a rule matches besides its prefix.
#[derive(Args, Clone, Debug)]
pub struct MatchArgs {
    /// IP protocol: tcp, udp, icmp, icmpv6 or a number.
    #[arg(long = "proto", value_parser = protocol)]
    pub protocol: Option<ProtocolSpec>,
    /// Destination port or range: 53, 1000-2000 (TCP/UDP).
    #[arg(long, value_parser = ports)]
    pub ports: Option<PortsSpec>,
    /// Only TCP SYN segments (connection attempts).
    #[arg(long)]
    pub syn: bool,
}

/// A rule's action and limits.
#[derive(Args, Clone, Debug)]
pub struct LimitArgs {
    #[arg(long, value_enum, default_value = "limit")]
    pub action: ActionArg,
    /// Packets per second: 500, 10k, 2.5M.
    #[arg(long, value_parser = units::count)]
    pub pps: Option<u64>,
    /// Bits per second: 800kbit, 5Mbit, 1Gbit.
    #[arg(long, value_parser = units::bits_per_second_as_bytes)]
    pub bps: Option<u64>,
    /// Extra packets per window: 100, 1k.
    #[arg(long, value_parser = units::count, default_value = "0")]
    pub burst: u64,
    /// Extra bytes per window: 1500, 64k.
    #[arg(long, value_parser = units::count, default_value = "0")]
    pub burst_bytes: u64,
    /// Sliding window, 1s to 60s.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub window: Duration,
    /// Once over the limit, drop the source for this long: 30s, 5m.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub block: Option<Duration>,
    /// Count would-be drops, drop nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl LimitArgs {
    /// No limits (a rule named only by prefix and match, for `rule rm`).
    pub fn none() -> Self {
        Self {
            action: ActionArg::Limit,
            pps: None,
            bps: None,
            burst: 0,
            burst_bytes: 0,
            window: Duration::from_secs(1),
            block: None,
            dry_run: false,
        }
    }
}

fn protocol(text: &str) -> Result<ProtocolSpec, String> {
    if let Ok(number) = text.parse::<u8>() {
        return Ok(ProtocolSpec::Number(number));
    }
    match text.to_ascii_lowercase().as_str() {
        "tcp" | "udp" | "icmp" | "icmpv6" => Ok(ProtocolSpec::Name(text.to_ascii_lowercase())),
        _ => Err(format!(
            "unknown protocol {text:?} (tcp, udp, icmp, icmpv6 or a number)"
        )),
    }
}

fn ports(text: &str) -> Result<PortsSpec, String> {
    parse_ports(text)
        .map(|_| PortsSpec::Text(text.to_string()))
        .ok_or_else(|| format!("{text:?} is not a port or a range like 1000-2000"))
}

/// The file form of a rule from the command line.
pub fn section(cidr: Option<IpNet>, m: &MatchArgs, l: &LimitArgs) -> RuleSection {
    RuleSection {
        cidr,
        action: match l.action {
            ActionArg::Limit => ActionName::Limit,
            ActionArg::Allow => ActionName::Allow,
            ActionArg::Deny => ActionName::Deny,
        },
        protocol: m.protocol.clone(),
        ports: m.ports.clone(),
        tcp_syn: m.syn,
        pps: l.pps,
        bytes_per_second: l.bps,
        burst_packets: l.burst,
        burst_bytes: l.burst_bytes,
        window: l.window,
        block: l.block,
        dry_run: Some(l.dry_run),
    }
}

/// Sends an edit and prints the daemon's answer.
pub fn edit(socket: &Path, edit: RuleEdit, save: bool) -> anyhow::Result<()> {
    match client::request(socket, Request::Rules { edit, save })? {
        Reply::Done { message } => {
            println!("{message}");
            Ok(())
        }
        _ => anyhow::bail!("the daemon answered with something unexpected"),
    }
}

/// `rule ls`.
pub fn list(socket: &Path, output: Output) -> anyhow::Result<()> {
    let Reply::Rules { default, rules } = client::request(socket, Request::RuleList)? else {
        anyhow::bail!("the daemon answered `rule ls` with something else");
    };
    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "default": default, "rules": rules })
            )?
        ),
        Output::Text => {
            println!(
                "{:<10} {:<20} {:<18} {:<7} limits",
                "rule", "cidr", "match", "action"
            );
            println!("{}", line("default", &default));
            for (i, rule) in rules.iter().enumerate() {
                println!("{}", line(&format!("rules[{i}]"), rule));
            }
        }
    }
    Ok(())
}

fn line(name: &str, r: &RuleSection) -> String {
    let cidr = r.cidr.map_or("*".to_string(), |c| c.to_string());
    let mut matches = Vec::new();
    if let Some(p) = &r.protocol {
        matches.push(match p {
            ProtocolSpec::Name(n) => n.clone(),
            ProtocolSpec::Number(n) => format!("proto {n}"),
        });
    }
    if let Some(p) = &r.ports {
        matches.push(match p {
            PortsSpec::Port(p) => format!("port {p}"),
            PortsSpec::Text(t) => format!("port {t}"),
        });
    }
    if r.tcp_syn {
        matches.push("syn".into());
    }
    let action = format!("{:?}", r.action).to_lowercase();
    let mut limits = Vec::new();
    if let Some(pps) = r.pps {
        limits.push(format!("{pps} pps"));
    }
    if let Some(bytes) = r.bytes_per_second {
        limits.push(format!("{} bit/s", bytes * 8));
    }
    if r.burst_packets > 0 {
        limits.push(format!("burst {}", r.burst_packets));
    }
    if r.burst_bytes > 0 {
        limits.push(format!("burst {} B", r.burst_bytes));
    }
    limits.push(format!("window {}", humantime::format_duration(r.window)));
    if let Some(block) = r.block {
        limits.push(format!("block {}", humantime::format_duration(block)));
    }
    if r.dry_run == Some(true) {
        limits.push("dry-run".into());
    }
    let matches = if matches.is_empty() {
        "-".to_string()
    } else {
        matches.join(" ")
    };
    format!(
        "{name:<10} {cidr:<20} {matches:<18} {action:<7} {}",
        limits.join(", ")
    )
}
