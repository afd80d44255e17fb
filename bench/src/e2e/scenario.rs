//! The filters compared by the end-to-end benchmark, each installed in the
//! lab's receiving namespace with the same per-source limit, and what each
//! is expected to let through. One more, `xdp-limiter-agg16`, adds a limit
//! on every /16 as a whole (the `random16` traffic's flood comes from one
//! /16); it is not part of the default matrix ([`Scenario::ALL`]).

use std::fmt;

use limiter_bench_common::traffic::names;
use limiter_tests::daemon::{Daemon, Files};

use crate::e2e::{
    lab::{self, Lab, RX_IF},
    traffic::Programs,
};

/// The per-source limit every filter enforces.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    /// Packets per second per source.
    pub pps: u64,
    /// Burst: the token buckets' depth (nftables, iptables). xdp-limiter's
    /// sliding window allows `pps` per second with no extra burst; over a
    /// measurement after warm-up both admit `pps` per second.
    pub burst: u64,
}

/// Capacity of every tool's per-source table (nftables sets, hashlimit
/// tables, xdp-limiter maps): far above the light and heavy sources, so
/// only a random-source flood fills it.
pub const TABLE_SIZE: u32 = 262_144;

/// `xdp-limiter-agg16`'s /16 aggregate, as a multiple of the per-source
/// limit: ten sources at their limit fill it, so a flood spread over one
/// /16 is held to ten sources' worth, while the light sources' own /16
/// (and their IPv6 /48) stays under it below saturation.
pub const AGG16_FACTOR: u64 = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// Nothing installed: the cost of the stack and the socket alone.
    NoFilter,
    /// The `xdp-limiter` daemon in enforce mode (native XDP).
    XdpLimiter,
    /// nftables, a dynamic set updated with `limit rate over` in the inet
    /// input hook.
    NftInput,
    /// The same nftables rules in the netdev ingress hook.
    NftIngress,
    /// iptables/ip6tables `hashlimit --hashlimit-mode srcip` in INPUT.
    IptablesHashlimit,
    /// An XDP program that drops everything: the floor.
    XdpDropAll,
    /// An XDP program that parses like xdp-limiter, counts per source and
    /// drops everything: the floor of any per-source state at XDP.
    XdpCountDrop,
    /// The `xdp-limiter` daemon as [`Scenario::XdpLimiter`], its default
    /// rule with a level: every /16 (IPv6 /48) together at
    /// [`AGG16_FACTOR`] times the per-source limit.
    XdpLimiterAgg16,
}

impl Scenario {
    pub const ALL: [Scenario; 7] = [
        Scenario::NoFilter,
        Scenario::XdpLimiter,
        Scenario::NftInput,
        Scenario::NftIngress,
        Scenario::IptablesHashlimit,
        Scenario::XdpDropAll,
        Scenario::XdpCountDrop,
    ];

    /// Scenarios run only when named (`--scenarios`): their traffic is
    /// the `random16` mode's, outside the default matrix.
    pub const EXTRA: [Scenario; 1] = [Scenario::XdpLimiterAgg16];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::NoFilter => "no-filter",
            Scenario::XdpLimiter => "xdp-limiter",
            Scenario::NftInput => "nft-input",
            Scenario::NftIngress => "nft-ingress",
            Scenario::IptablesHashlimit => "iptables-hashlimit",
            Scenario::XdpDropAll => "xdp-drop-all",
            Scenario::XdpCountDrop => "xdp-count-drop",
            Scenario::XdpLimiterAgg16 => "xdp-limiter-agg16",
        }
    }

    /// Every scenario, the default matrix's then the extra ones.
    pub fn known() -> impl Iterator<Item = Scenario> {
        Self::ALL.into_iter().chain(Self::EXTRA)
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::known().find(|s| s.name() == name)
    }

    /// What the scenario lets through.
    pub fn expectation(self) -> Expectation {
        match self {
            Scenario::NoFilter => Expectation::Everything,
            Scenario::XdpDropAll | Scenario::XdpCountDrop => Expectation::Nothing,
            Scenario::XdpLimiterAgg16 => Expectation::PerSourceAndPrefix16,
            _ => Expectation::PerSourceLimit,
        }
    }

    /// Installs the filter in `lab`'s receiving namespace. What it returns
    /// keeps it installed; the namespace takes the rest when it goes.
    pub fn install(self, lab: &Lab, programs: &mut Programs, limit: Limit) -> Installed {
        match self {
            Scenario::NoFilter => Installed::Nothing,
            Scenario::XdpDropAll => {
                programs.attach_floor(lab, names::DROP_ALL);
                Installed::Nothing
            }
            Scenario::XdpCountDrop => {
                programs.attach_floor(lab, names::COUNT_DROP);
                Installed::Nothing
            }
            Scenario::NftInput => {
                nft(
                    lab,
                    &nft_ruleset("inet", "type filter hook input priority filter", limit),
                );
                Installed::Nothing
            }
            Scenario::NftIngress => {
                let hook = format!("type filter hook ingress device \"{RX_IF}\" priority filter");
                nft(lab, &nft_ruleset("netdev", &hook, limit));
                Installed::Nothing
            }
            Scenario::IptablesHashlimit => {
                for (tool, name) in [("iptables", "xlt4"), ("ip6tables", "xlt6")] {
                    let rule = hashlimit_rule(name, limit);
                    lab.rx
                        .run(tool, &rule.iter().map(String::as_str).collect::<Vec<_>>());
                }
                Installed::Nothing
            }
            Scenario::XdpLimiter => {
                Installed::Daemon(Box::new(start_limiter(lab, &limiter_config(limit))))
            }
            Scenario::XdpLimiterAgg16 => {
                let config = format!(
                    "{}levels = [\"prefix/16:{}\"]\n",
                    limiter_config(limit),
                    limit.pps * AGG16_FACTOR
                );
                Installed::Daemon(Box::new(start_limiter(lab, &config)))
            }
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What passes a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expectation {
    Everything,
    Nothing,
    /// Each source up to the limit.
    PerSourceLimit,
    /// Each source up to the limit, and every /16 (IPv6 /48) together up
    /// to [`AGG16_FACTOR`] times it. Modelled for the `random16` traffic:
    /// the random sources in one /16, the light sources in another (and
    /// their IPv6 ones in one /48), the heavy source alone in a third.
    PerSourceAndPrefix16,
}

/// Keeps a scenario installed.
pub enum Installed {
    /// Rules and programs that live and die with the namespace.
    Nothing,
    /// The daemon (stopped on drop: it detaches) and its files and pins.
    Daemon(Box<(Daemon, Files)>),
}

/// The real daemon guarding `lab`'s receiving veth under the configuration
/// `config` (written to its own scratch files; its pins are its own too).
pub fn start_limiter(lab: &Lab, config: &str) -> (Daemon, Files) {
    let files = Files::new();
    files.write_config(config);
    let path = files.config();
    let daemon = Daemon::start(&lab.rx, &files, &["-c", path.to_str().expect("UTF-8 path")]);
    // Its aggregation ticks share the generator's CPU, never the
    // receiver's.
    for task in daemon.tasks() {
        lab::pin(task, lab::GEN_CPU);
    }
    (daemon, files)
}

/// The nftables rules: one dynamic set per family, elements expire after
/// 10 s of silence.
pub(crate) fn nft_ruleset(family: &str, hook: &str, limit: Limit) -> String {
    let Limit { pps, burst } = limit;
    let (v4, v6) = match family {
        "netdev" => ("meta protocol ip", "meta protocol ip6"),
        _ => ("meta nfproto ipv4", "meta nfproto ipv6"),
    };
    format!(
        "table {family} xlt {{\n\
         \x20 set m4 {{ type ipv4_addr; size {TABLE_SIZE}; flags dynamic,timeout; timeout 10s; }}\n\
         \x20 set m6 {{ type ipv6_addr; size {TABLE_SIZE}; flags dynamic,timeout; timeout 10s; }}\n\
         \x20 chain guard {{\n\
         \x20   {hook}; policy accept;\n\
         \x20   {v4} update @m4 {{ ip saddr limit rate over {pps}/second burst {burst} packets }} drop\n\
         \x20   {v6} update @m6 {{ ip6 saddr limit rate over {pps}/second burst {burst} packets }} drop\n\
         \x20 }}\n\
         }}\n"
    )
}

pub(crate) fn nft(lab: &Lab, ruleset: &str) {
    use std::io::Write;
    let mut child = lab
        .rx
        .command("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run nft");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(ruleset.as_bytes())
        .expect("write the ruleset");
    let out = child.wait_with_output().expect("wait for nft");
    assert!(
        out.status.success(),
        "nft refused the ruleset ({}):\n{ruleset}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(crate) fn hashlimit_rule(name: &str, limit: Limit) -> Vec<String> {
    let rule = format!(
        "-A INPUT -m hashlimit --hashlimit-mode srcip --hashlimit-above {}/sec \
         --hashlimit-burst {} --hashlimit-name {name} --hashlimit-htable-size 65536 \
         --hashlimit-htable-max {TABLE_SIZE} --hashlimit-htable-expire 10000 -j DROP",
        limit.pps, limit.burst
    );
    rule.split_whitespace().map(String::from).collect()
}

/// The daemon's configuration: every source `pps` per 1 s sliding window,
/// enforce mode, native XDP on the receiving veth. The tiers are on (the
/// default, `[limits] tiers`), so [`TABLE_SIZE`] is the exact tier's
/// capacity (`max_sources`: shared windows); the sources with per-CPU
/// state keep the default cap (`max_hot_sources`).
fn limiter_config(limit: Limit) -> String {
    format!(
        "[daemon]\ninterfaces = [\"{RX_IF}\"]\nmode = \"native\"\nmax_sources = {TABLE_SIZE}\n\n\
         [default]\npps = {}\nwindow = \"1s\"\ndry_run = false\n",
        limit.pps
    )
}
