//! Compiling a validated rule set into what the kernel reads: the
//! `Config` with its traffic classes, one `Rule` per rule (allowances,
//! leases, penalties, fingerprint), and the prefix tries' entries.

use super::resolve::{FrameSpace, Resolver};
use super::*;

/// Validates `set` and compiles it so its rules land at `RULES[base..]`,
/// for a machine with `cpus` possible CPUs (which sizes leases).
pub fn compile(set: &RuleSet, base: u32, cpus: u32) -> Result<Compiled, RuleError> {
    check_set(set)?;
    // Index 0 is the default rule, covering both families. A full port
    // range is no port match.
    let normalized: Vec<RuleSpec> = std::iter::once(&set.default)
        .chain(&set.rules)
        .map(|spec| RuleSpec {
            matches: spec.matches.normalized(),
            ..spec.clone()
        })
        .collect();
    let all: Vec<&RuleSpec> = normalized.iter().collect();
    check_rules(&all, set)?;
    let classes = classes_of(&all)?;
    let budget_of = |m: &Match| -> u8 {
        classes
            .iter()
            .position(|c| c == m)
            .map_or(0, |i| i as u8 + 1)
    };
    let mut rules = Vec::with_capacity(all.len());
    for (i, spec) in all.iter().enumerate() {
        let mut rule = compile_rule(spec, &rule_name(i), set.buckets_per_window, cpus)?;
        let (levels, fair_packets) = level::compile_levels(
            spec,
            &rule_name(i),
            set.buckets_per_window,
            (set.v4_prefix_len, set.v6_prefix_len),
            rule.bucket_ns * u64::from(rule.buckets),
        )?;
        rule.set_levels(&levels);
        rule.fair_packets = fair_packets;
        if set.tiered {
            rule.cheap_frames = cheap_frames(spec, &rule);
        }
        rule.budget = budget_of(&spec.matches);
        rule.fingerprint = fingerprint(i, spec, &rule, set.dry_run);
        rules.push(rule);
    }

    let mut config = Config::new(set.dry_run, set.v4_prefix_len, set.v6_prefix_len);
    config.class_count = classes.len() as u8;
    config.set_tiered(set.tiered);
    config.cheap_max = rules.iter().map(|r| r.cheap_frames).max().unwrap_or(0);
    config.set_destinations(rules.iter().any(|r| {
        r.levels()
            .iter()
            .any(|l| l.kind().is_some_and(|k| k.needs_destination()))
    }));
    for (slot, class) in config.classes.iter_mut().zip(&classes) {
        *slot = class.class();
    }
    let space = FrameSpace::new(&config, &classes);
    let resolver = Resolver {
        all: &all,
        rules: &rules,
        classes: &classes,
        space: &space,
    };

    let (v4, v6) = routes(&resolver, &all, base)?;
    Ok(Compiled {
        config,
        rules,
        v4,
        v6,
    })
}

/// The set's own bounds: buckets per window, the key prefixes, the
/// number of rules.
fn check_set(set: &RuleSet) -> Result<(), RuleError> {
    if set.buckets_per_window == 0 || set.buckets_per_window > MAX_BUCKETS_PER_WINDOW {
        return Err(RuleError::Buckets(set.buckets_per_window));
    }
    if set.v4_prefix_len > 32 {
        return Err(RuleError::KeyPrefix {
            family: AddressFamily::V4,
            len: set.v4_prefix_len,
            max: 32,
        });
    }
    if set.v6_prefix_len > 128 {
        return Err(RuleError::KeyPrefix {
            family: AddressFamily::V6,
            len: set.v6_prefix_len,
            max: 128,
        });
    }
    if set.rules.len() + 1 > (MAX_RULES - 1) as usize {
        return Err(RuleError::TooManyRules);
    }
    Ok(())
}

/// Each rule's prefix (no host bits, within the key's), and no two rules
/// with the same prefix and match.
fn check_rules(all: &[&RuleSpec], set: &RuleSet) -> Result<(), RuleError> {
    for (i, spec) in all.iter().enumerate().skip(1) {
        if spec.cidr != spec.cidr.trunc() {
            return Err(RuleError::HostBits {
                rule: rule_name(i),
                cidr: spec.cidr,
            });
        }
        check_prefix(spec, &rule_name(i), set)?;
    }
    for (i, a) in all.iter().enumerate().skip(1) {
        if let Some(j) = (1..i).find(|&j| all[j].cidr == a.cidr && all[j].matches == a.matches) {
            return Err(RuleError::Duplicate {
                rule: rule_name(i),
                other: rule_name(j),
            });
        }
    }
    Ok(())
}

/// The distinct matches of the rules (the default's excepted), in order:
/// each is a budget class of the frame space.
fn classes_of(all: &[&RuleSpec]) -> Result<Vec<Match>, RuleError> {
    let mut classes: Vec<Match> = Vec::new();
    for spec in &all[1..] {
        if !spec.matches.is_any() && !classes.contains(&spec.matches) {
            classes.push(spec.matches);
        }
    }
    if classes.len() > MAX_CLASSES {
        return Err(RuleError::TooManyClasses);
    }
    Ok(classes)
}

/// The trie entries: every rule prefix and the two default routes, each
/// with the rule each frame class of it resolves to.
fn routes(
    resolver: &Resolver,
    all: &[&RuleSpec],
    base: u32,
) -> Result<(Routes<4>, Routes<16>), RuleError> {
    // Every rule prefix, plus the two default routes.
    let mut prefixes: Vec<IpNet> = vec![
        "0.0.0.0/0".parse().expect("valid"),
        "::/0".parse().expect("valid"),
    ];
    for spec in &all[1..] {
        if !prefixes.contains(&spec.cidr) {
            prefixes.push(spec.cidr);
        }
    }
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for prefix in prefixes {
        let refs = resolver.refs(&prefix, base)?;
        match prefix {
            IpNet::V4(net) => v4.push((net.prefix_len(), net.network().octets(), refs)),
            IpNet::V6(net) => v6.push((net.prefix_len(), net.network().octets(), refs)),
        }
    }
    Ok((v4, v6))
}

/// What rule `index` of a set is and does, as a number: its prefix and
/// match, its compiled limits and action, whether it is enforced (its
/// own or the global dry-run) and its scope. Never 0.
fn fingerprint(index: usize, spec: &RuleSpec, rule: &Rule, global_dry_run: bool) -> u64 {
    let mut hash = fnv::FnvHasher::default();
    if index == 0 {
        hash.write(b"default");
    } else {
        hash.write(spec.cidr.to_string().as_bytes());
    }
    hash.write(spec.matches.describe().as_bytes());
    for value in [
        rule.allowance_packets,
        rule.allowance_bytes,
        rule.bucket_ns,
        rule.block_ns,
        u64::from(rule.buckets),
        u64::from(spec.action as u8),
        u64::from(spec.dry_run || global_dry_run),
    ] {
        hash.write_u64(value);
    }
    // Only a cluster scope is hashed, so node rules keep the fingerprints
    // they had before scopes existed (an upgrade does not restart every
    // source's window), while a change of scope is a changed rule.
    if spec.scope != Scope::Node {
        hash.write_u64(u64::from(spec.scope as u8));
    }
    // Levels likewise: a rule without any keeps its fingerprint.
    for level in &spec.levels {
        hash.write(level.to_string().as_bytes());
    }
    hash.finish().max(1)
}

fn check_prefix(spec: &RuleSpec, name: &str, set: &RuleSet) -> Result<(), RuleError> {
    let key_len = match spec.cidr.addr() {
        IpAddr::V4(_) => set.v4_prefix_len,
        IpAddr::V6(_) => set.v6_prefix_len,
    };
    if spec.cidr.prefix_len() > key_len {
        return Err(RuleError::PrefixTooLong {
            rule: name.into(),
            cidr: spec.cidr,
            key_len,
        });
    }
    Ok(())
}

fn compile_rule(spec: &RuleSpec, name: &str, buckets: u32, cpus: u32) -> Result<Rule, RuleError> {
    check_match(&spec.matches, name)?;
    let limits = &spec.limits;
    if limits.window < MIN_WINDOW || limits.window > MAX_WINDOW {
        return Err(RuleError::Window {
            rule: name.into(),
            window: limits.window,
        });
    }
    if let Some(block) = limits.block.filter(|b| *b > MAX_BLOCK) {
        return Err(RuleError::BlockTooLong {
            rule: name.into(),
            block,
        });
    }
    if spec.scope == Scope::Cluster {
        check_cluster_rule(spec, name)?;
    }
    if spec.action == Action::Limit && limits.pps.is_none() && limits.bytes_per_second.is_none() {
        return Err(RuleError::NoLimit { rule: name.into() });
    }
    let window_ns = limits.window.as_nanos() as u64;
    let allowance = |rate: Option<u64>, burst: u64, what: &'static str, max: u64| match rate {
        None => Ok(UNLIMITED),
        Some(0) => Err(RuleError::Zero {
            rule: name.into(),
            what,
        }),
        Some(rate) => {
            let value =
                u128::from(rate) * u128::from(window_ns) / 1_000_000_000 + u128::from(burst);
            if value > u128::from(max) {
                Err(RuleError::TooLarge {
                    rule: name.into(),
                    what,
                    value,
                    max,
                })
            } else {
                Ok(value as u64)
            }
        }
    };
    let (allowance_packets, allowance_bytes) = if spec.action == Action::Limit {
        (
            allowance(limits.pps, limits.burst_packets, "packets", MAX_PACKETS)?,
            allowance(
                limits.bytes_per_second,
                limits.burst_bytes,
                "bytes",
                MAX_BYTES,
            )?,
        )
    } else {
        (UNLIMITED, UNLIMITED)
    };
    if allowance_bytes < MIN_FRAME_BYTES {
        return Err(RuleError::BytesBelowFrame {
            rule: name.into(),
            allowance: allowance_bytes,
        });
    }
    // Leases only without a byte limit (bytes are counted per frame), and
    // only when they hold back little: see LEASE_DIVISOR.
    let lease_packets = if allowance_packets != UNLIMITED && allowance_bytes == UNLIMITED {
        let holders = u64::from(cpus.max(1)) * (u64::from(buckets) + 1) * LEASE_DIVISOR;
        (allowance_packets / holders).clamp(1, u64::from(u32::MAX)) as u32
    } else {
        1
    };
    let mut rule = Rule::new(spec.action, spec.dry_run);
    rule.allowance_packets = allowance_packets;
    rule.allowance_bytes = allowance_bytes;
    rule.bucket_ns = window_ns / u64::from(buckets);
    // Bounded by MAX_BLOCK above, so the nanoseconds fit.
    rule.block_ns = limits.block.map_or(0, |b| b.as_nanos() as u64);
    rule.buckets = buckets;
    rule.lease_packets = lease_packets;
    rule.set_scope(spec.scope);
    Ok(rule)
}

/// A rule's match: a protocol other than 0, ports in order and only with
/// TCP or UDP, SYN only with TCP.
fn check_match(m: &Match, name: &str) -> Result<(), RuleError> {
    if m.protocol == Some(0) {
        return Err(RuleError::ProtocolZero { rule: name.into() });
    }
    if let Some((min, max)) = m.ports {
        if min > max {
            return Err(RuleError::PortsReversed {
                rule: name.into(),
                min,
                max,
            });
        }
        if let Some(protocol) = m.protocol.filter(|p| *p != PROTO_TCP && *p != PROTO_UDP) {
            return Err(RuleError::PortsNeedTcpOrUdp {
                rule: name.into(),
                protocol,
            });
        }
    }
    if m.tcp_syn {
        if let Some(protocol) = m.protocol.filter(|p| *p != PROTO_TCP) {
            return Err(RuleError::SynNeedsTcp {
                rule: name.into(),
                protocol,
            });
        }
    }
    Ok(())
}

/// What a cluster-scoped rule may be in this first version (documented in
/// docs/configuration.md, "Cluster scope"): a `limit` on packets, without
/// a penalty. The kernel holds each cluster-scoped source to one packet
/// allowance that the daemon refreshes from the cluster's counts; a byte
/// budget would need a second shared count per source, and a penalty is
/// per-node state that the other nodes would never see.
fn check_cluster_rule(spec: &RuleSpec, name: &str) -> Result<(), RuleError> {
    if spec.action != Action::Limit {
        return Err(RuleError::ClusterNotLimit {
            rule: name.into(),
            action: spec.action,
        });
    }
    if spec.limits.bytes_per_second.is_some() || spec.limits.burst_bytes != 0 {
        return Err(RuleError::ClusterBytes { rule: name.into() });
    }
    if spec.limits.block.is_some() {
        return Err(RuleError::ClusterBlock { rule: name.into() });
    }
    if spec.limits.pps.is_none() {
        return Err(RuleError::ClusterNoPps { rule: name.into() });
    }
    Ok(())
}

/// The frames of a source that the cheap tier may judge over an epoch and
/// the one before under `rule` without any per-source state
/// (`Rule::cheap_frames`; docs/architecture.md, "The bounds", argues it).
/// Allow and deny need no state to judge a frame: up to
/// `sketch::HOT_FRAMES`. A limit's cheap frames are never counted in the
/// source's window (the sketch only reads high, so no count taken from it
/// can be proved the source's own), so they are what a source may get
/// beyond its allowance: `T` frames over any two epochs, so `T` in each of
/// the `epoch_pairs(W)` pairs a window overlaps. `T` is the largest with
/// `T * epoch_pairs(W) <= allowance / CHEAP_SHARE` (for bytes counting
/// every frame as [`CHEAP_FRAME_BYTES`]), for the rule's own window and
/// for each of its levels that counts per source (`source`, `pair`: a
/// cheap frame goes through every aggregate, but through no per-source
/// level, which would take a window per spoofed source; it stays within
/// them by this bound), at most [`MAX_CHEAP_FRAMES`]: 10 for 100 pps and
/// a 1 s window, 1 for 10 pps, none for 10 per minute.
fn cheap_frames(spec: &RuleSpec, rule: &Rule) -> u8 {
    match spec.action {
        Action::Allow | Action::Deny => sketch::HOT_FRAMES as u8,
        Action::Limit => {
            let share = |allowance: u64, window_ns: u64, per_frame: u64| {
                if allowance == UNLIMITED {
                    u64::MAX
                } else {
                    allowance / (CHEAP_SHARE * sketch::epoch_pairs(window_ns) * per_frame)
                }
            };
            let window_ns = rule.bucket_ns * u64::from(rule.buckets);
            let levels = rule
                .levels()
                .iter()
                .filter(|level| level.kind().is_some_and(|kind| !kind.is_aggregate()))
                .map(|level| {
                    share(
                        level.allowance_packets,
                        level.bucket_ns * u64::from(level.buckets),
                        1,
                    )
                });
            levels
                .chain([
                    share(rule.allowance_packets, window_ns, 1),
                    share(rule.allowance_bytes, window_ns, CHEAP_FRAME_BYTES),
                    MAX_CHEAP_FRAMES,
                ])
                .min()
                .unwrap_or(0) as u8
        }
    }
}
