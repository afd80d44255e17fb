//! The command line: every command, subcommand and argument of
//! `xdp-limiter`, as clap reads it. `main.rs` dispatches each command to
//! its own file in this module.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};
use ipnet::IpNet;
use limiter_common::{Action, Scope};

mod bans;

use self::bans::prefix;
pub use self::bans::{BanArgs, BanFor, ListCommand, UnbanArgs};
use super::{top::SortBy, units, Output};
use crate::config::{
    AttachKind, AttachMode, PortsSpec, ProtocolSpec, DEFAULT_PIN_DIR, DEFAULT_SOCKET,
};
use crate::rules::LevelSpec;

#[derive(Parser)]
#[command(
    name = "xdp-limiter",
    version,
    about = "Per-source packet rate limiter at XDP"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Protect interfaces: load, attach, enforce, export metrics.
    Run(RunArgs),
    /// Interfaces, program, rules, map fill and current rates.
    Status(ReadArgs),
    /// The heaviest sources of the daemon's last aggregation pass.
    Top(TopArgs),
    /// Global mode: dry-run (count, drop nothing) or enforce.
    Mode(ModeArgs),
    /// Lift the penalties of every source inside a prefix, now.
    Unblock(UnblockArgs),
    /// Drop every frame from a prefix for a while, whatever the rules say
    /// (an allow list still passes it): fail2ban's and CrowdSec's way in.
    Ban(BanArgs),
    /// Lift the ban of exactly this prefix.
    Unban(UnbanArgs),
    /// The bans in force, the soonest to end first.
    Bans(ReadArgs),
    /// Add prefixes to a list, or remove them: add, rm.
    List {
        #[command(subcommand)]
        action: ListCommand,
    },
    /// Make the daemon re-read its configuration file.
    Reload(SocketArg),
    /// Propose a per-source limit per rule from the distribution of
    /// per-source rates the daemon has seen, with what it (and the limit
    /// in force) would have done.
    Suggest(SuggestArgs),
    /// Change the rules live: add, set, rm, ls.
    Rule {
        #[command(subcommand)]
        action: RuleCommand,
    },
    /// Change the default rule live.
    Default {
        #[command(subcommand)]
        action: DefaultCommand,
    },
    /// Print a shell completion script.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), or write one page per command.
    Man {
        /// Write `xdp-limiter.8` and a page per subcommand
        /// (`xdp-limiter-rule-add.8`, ...) into this directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Stop protecting: a running daemon detaches and exits; without one,
    /// remove what `run --keep-attached` left pinned.
    Detach(DetachArgs),
    /// Load the XDP program through the kernel verifier (attaches nothing)
    /// and print what verifying it took on this kernel.
    Check {
        /// Check this configuration file instead, as `run` would start
        /// from it, loading nothing (the unit's ExecStartPre).
        #[arg(long, short = 'c')]
        config: Option<PathBuf>,
        /// Capacity of the per-source state maps.
        #[arg(long, default_value_t = limiter_common::DEFAULT_MAX_SOURCES)]
        max_sources: u32,
        /// On a refusal, print the verifier's log after the message.
        #[arg(long, short)]
        verbose: bool,
        /// Also split the processed instructions by function: loads the
        /// program once more with the verifier's full log (seconds here,
        /// minutes on a slow machine, up to 1 GiB of memory).
        #[arg(long)]
        functions: bool,
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}

/// `run`.
#[derive(Args)]
pub struct RunArgs {
    /// Interface to protect (repeatable; adds to daemon.interfaces).
    #[arg(long = "iface", short = 'i')]
    pub interfaces: Vec<String>,
    /// TOML configuration file (default: built-in, dry-run).
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Attach mode (default: daemon.mode, auto).
    #[arg(long, value_enum)]
    pub mode: Option<AttachMode>,
    /// How to take the interface: a link of its own, or a component of
    /// libxdp's dispatcher beside other XDP programs (default:
    /// daemon.attach, link).
    #[arg(long, value_enum)]
    pub attach: Option<AttachKind>,
    /// Leave the program attached when the daemon stops.
    #[arg(long)]
    pub keep_attached: bool,
    /// Prometheus endpoint address (default: daemon.metrics_addr).
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// bpffs directory for pins (default: daemon.pin_dir).
    #[arg(long)]
    pub pin_dir: Option<PathBuf>,
    /// Control socket (default: daemon.control_socket).
    #[arg(long)]
    pub control_socket: Option<PathBuf>,
    /// The log's format: text, or one JSON object a line (default:
    /// daemon.log_format, text).
    #[arg(long, value_enum)]
    pub log_format: Option<crate::logs::LogFormat>,
}

/// Where the daemon's control socket is.
#[derive(Args)]
pub struct SocketArg {
    /// The daemon's control socket.
    #[arg(long = "socket", default_value = DEFAULT_SOCKET)]
    pub path: PathBuf,
}

/// A command that reads from the daemon and prints.
#[derive(Args)]
pub struct ReadArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

/// `top`.
#[derive(Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub read: ReadArgs,
    /// Print one frame and exit (for scripts).
    #[arg(long)]
    pub once: bool,
    /// Sources (or aggregates) shown.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Sort by.
    #[arg(long, value_enum, default_value_t)]
    pub sort: SortBy,
    /// Show the aggregates of the rules' levels this selects instead, the
    /// fullest first: the start of a level's label, as `/24`,
    /// `prefix/24`, `rule`, `destination`, `source@1m` or
    /// `prefix/24/48@1s`.
    #[arg(long, value_name = "SELECTOR", conflicts_with = "sort")]
    pub level: Option<String>,
}

/// `suggest`.
#[derive(Args)]
pub struct SuggestArgs {
    #[command(flatten)]
    pub read: ReadArgs,
    /// Only this rule (`default`, `rules[N]` as `rule ls` numbers them);
    /// default: every `limit` rule with a packet limit.
    #[arg(long)]
    pub rule: Option<String>,
    /// How far back to look, at most the daemon's `[daemon] history`
    /// (default: all of it).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub since: Option<Duration>,
    /// The share of source-seconds the proposed limit must leave alone
    /// (before headroom), in (0, 1].
    #[arg(long, default_value_t = 0.999, value_parser = quantile)]
    pub quantile: f64,
    /// The proposal is the quantile's rate times this (at least 1).
    #[arg(long, default_value_t = 2.0, value_parser = headroom)]
    pub headroom: f64,
    /// Set each proposed limit live as a dry-run rule (as `rule set
    /// --dry-run`; the rule keeps its window and match). Under the global
    /// dry-run the rule keeps its own flag: `mode enforce` enforces it.
    #[arg(long)]
    pub apply: bool,
}

fn quantile(text: &str) -> Result<f64, String> {
    let q: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if q > 0.0 && q <= 1.0 {
        Ok(q)
    } else {
        Err(format!("{q} is outside (0, 1]"))
    }
}

fn headroom(text: &str) -> Result<f64, String> {
    let h: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if h >= 1.0 && h.is_finite() {
        Ok(h)
    } else {
        Err(format!("{h} is below 1"))
    }
}

/// The global mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Count what would be dropped, drop nothing.
    DryRun,
    /// Drop what is over its limit.
    Enforce,
}

/// `mode`.
#[derive(Args)]
pub struct ModeArgs {
    #[arg(value_enum)]
    pub mode: Mode,
    /// Also write the mode to the daemon's configuration file (with
    /// `--guard`, the guards too; a rollback then writes dry-run).
    #[arg(long)]
    pub save: bool,
    /// With `enforce`: a guard (`METRIC OP VALUE`, e.g.
    /// "dropped_share <= 5%"; metrics limited_sources, dropped_share,
    /// dropped_pps) checked every tick of the guard period; a breach
    /// returns to dry-run on its own. Repeatable.
    #[arg(long = "guard", value_name = "EXPR", value_parser = parse_guard)]
    pub guards: Vec<crate::guard::Guard>,
    /// The guard period (5s..24h; default 10m), with `--guard`.
    #[arg(long = "for", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub guard_for: Option<Duration>,
    #[command(flatten)]
    pub socket: SocketArg,
}

fn parse_guard(text: &str) -> Result<crate::guard::Guard, String> {
    text.parse()
        .map_err(|e: crate::guard::GuardError| e.to_string())
}

/// `unblock`.
#[derive(Args)]
pub struct UnblockArgs {
    /// Sources inside this prefix (an address is a /32 or /128).
    #[arg(value_parser = prefix)]
    pub cidr: IpNet,
    #[command(flatten)]
    pub socket: SocketArg,
}

#[derive(Subcommand)]
pub enum RuleCommand {
    /// Add a rule for a prefix (and match).
    Add(RuleArgs),
    /// Replace the rule with the same prefix and match.
    Set(RuleArgs),
    /// Remove the rule with this prefix and match, or this name.
    Rm {
        #[arg(required_unless_present = "name", conflicts_with = "name")]
        cidr: Option<IpNet>,
        /// The rule's name (`rule ls` shows it), instead of its prefix
        /// and match.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        matches: MatchArgs,
        #[command(flatten)]
        common: EditArgs,
    },
    /// List the rules in force.
    Ls(ReadArgs),
}

#[derive(Subcommand)]
pub enum DefaultCommand {
    /// Replace the default rule.
    Set {
        #[command(flatten)]
        limits: LimitArgs,
        #[command(flatten)]
        common: EditArgs,
    },
}

/// A whole rule on the command line.
#[derive(Args)]
pub struct RuleArgs {
    pub cidr: IpNet,
    /// The rule's name (metrics, history, guards, `suggest --rule` and
    /// `rule rm --name` use it). Unset: `add` derives one from the
    /// prefix and match, `set` keeps the rule's.
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub matches: MatchArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub common: EditArgs,
}

/// Options of every rule change.
#[derive(Args)]
pub struct EditArgs {
    /// Also write the change to the daemon's configuration file.
    #[arg(long)]
    pub save: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

/// What a rule matches besides its prefix.
#[derive(Args, Clone, Debug, Default)]
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
    pub action: Action,
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
    /// Where the limit holds: per node, or for the whole cluster (a
    /// packet `limit` without --block or --bps; needs [cluster] in the
    /// daemon's configuration).
    #[arg(long, value_enum, default_value = "node")]
    pub scope: Scope,
    /// A further limit, repeatable (up to 4): KIND[/V4[/V6]]:PPS[+BURST][@WINDOW],
    /// e.g. prefix/24:2000 (every source of a /24 together), rule:50000@10s,
    /// source:20000@1m (another window per source).
    #[arg(long = "level", value_name = "LEVEL", value_parser = level)]
    pub levels: Vec<LevelSpec>,
    /// Enforce this rule under a guard (`METRIC OP VALUE`, e.g.
    /// "dropped_share <= 5%") judged on this rule's figures every tick of
    /// the guard period; a breach returns this rule alone to dry-run.
    /// Repeatable.
    #[arg(long = "guard", value_name = "EXPR", value_parser = parse_guard)]
    pub guards: Vec<crate::guard::Guard>,
    /// The rule's guard period (5s..24h; default 10m), with `--guard`.
    #[arg(long = "for", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub guard_for: Option<Duration>,
}

impl LimitArgs {
    /// No limits (a rule named only by prefix and match, for `rule rm`).
    pub fn none() -> Self {
        Self {
            action: Action::Limit,
            pps: None,
            bps: None,
            burst: 0,
            burst_bytes: 0,
            window: Duration::from_secs(1),
            block: None,
            dry_run: false,
            scope: Scope::Node,
            levels: Vec::new(),
            guards: Vec::new(),
            guard_for: None,
        }
    }
}

fn level(text: &str) -> Result<LevelSpec, String> {
    text.parse()
}

fn protocol(text: &str) -> Result<ProtocolSpec, String> {
    text.parse()
}

fn ports(text: &str) -> Result<PortsSpec, String> {
    text.parse()
}

/// `detach`.
#[derive(Args)]
pub struct DetachArgs {
    /// Interface to release (default: every pinned interface).
    #[arg(long = "iface", short = 'i')]
    pub interfaces: Vec<String>,
    #[arg(long, default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    #[command(flatten)]
    pub socket: SocketArg,
}
