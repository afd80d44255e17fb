//! Parser fuzzing through the real kernel: random and mutated frames
//! (truncations at every offset, random bytes, VLAN stacks, IPv4 options
//! and fragments, IPv6 extension chains with AH and fragments, long chains)
//! run through the program with `BPF_PROG_TEST_RUN` under a fixed rule set
//! whose outcomes tell its rules apart, and checked against the reference
//! model (`model.rs`): every verdict, every outcome count, and every
//! source's counters. Used by the suite (`tests/tests/fuzz.rs`, 100,000
//! frames) and by `cargo xtask fuzz --frames N`.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use limiter_common::{prefix_mask, Action, Counter, Outcome, SourceKey};
use limiter_user::rules::{Match, RuleSet, RuleSpec};

use crate::{
    model::{self, Parsed},
    net,
    testrun::{Harness, XDP_DROP, XDP_PASS},
};

/// Frames checked per group: outcome counts are compared per group, and a
/// mismatching group is replayed frame by frame to name the culprit.
const GROUP: usize = 1000;
/// Frames per program instance: its source map holds every source of a
/// chunk, so per-source counters are checked without evictions.
const CHUNK: usize = 100_000;
const MAX_SOURCES: u32 = 1 << 17;

/// Protocol, port range and SYN of a rule.
type Matching = (Option<u8>, Option<(u16, u16)>, bool);

/// The rule set the frames run under: limits never reached, so a frame's
/// outcome depends only on which rule judges it, and the rules' actions
/// tell them apart (four matches, overlapping and nested, at several
/// prefixes).
pub fn rules() -> (RuleSet, Vec<model::Rule>) {
    use Action::*;
    let tcp22 = (Some(model::TCP), Some((22, 22)), false);
    let syn = (Some(model::TCP), None, true);
    let syn22 = (Some(model::TCP), Some((22, 22)), true);
    let dns = (Some(model::UDP), Some((53, 53)), false);
    let none = (None, None, false);
    let table: [(&str, Matching, Action, bool); 9] = [
        ("10.0.0.0/8", none, Allow, false),
        ("0.0.0.0/0", tcp22, Deny, false),
        ("0.0.0.0/0", syn, Allow, false),
        ("0.0.0.0/0", syn22, Deny, false),
        ("0.0.0.0/0", dns, Deny, true),
        ("::/0", dns, Deny, false),
        ("2001:db8::/32", syn, Deny, true),
        ("192.0.2.0/24", tcp22, Allow, false),
        ("2001:db8:1::/48", none, Deny, false),
    ];
    let pps = 10_000_000;
    let mut set = RuleSet::with_default(RuleSpec::limit(net("0.0.0.0/0"), pps));
    set.default.dry_run = false;
    // Tiers off: the model counts every frame against its source in
    // per-CPU state, which the tiers give only to busy or refused sources
    // (`promises` checks what the tiers admit against its own model).
    set.tiered = false;
    let mut model_rules = vec![model::Rule::new(
        None,
        None,
        None,
        false,
        Limit,
        false,
        Some(pps as f64),
        None,
    )];
    for (cidr, (protocol, ports, tcp_syn), action, dry_run) in table {
        let mut spec = if action == Limit {
            RuleSpec::limit(net(cidr), pps)
        } else {
            RuleSpec::with_action(net(cidr), action)
        };
        spec.matches = Match {
            protocol,
            ports,
            tcp_syn,
        };
        spec.dry_run = dry_run;
        set.rules.push(spec);
        model_rules.push(model::Rule::new(
            Some(net(cidr)),
            protocol,
            ports,
            tcp_syn,
            action,
            dry_run,
            (action == Limit).then_some(pps as f64),
            None,
        ));
    }
    (set, model_rules)
}

/// Source addresses of the templates: inside and outside every rule prefix.
/// The IPv6 sources a limit judges spread over /48s, as the model evicts
/// nothing: a /48 holds at most `Rooms::prefix` of the windows' tickets
/// (2,048 at `MAX_SOURCES`), which one /48's /64s would fill
/// (proof.rs and `promises` test that room).
fn source(rng: &mut fastrand::Rng) -> IpAddr {
    match rng.u8(0..8) {
        0 => Ipv4Addr::new(10, rng.u8(..), rng.u8(..), rng.u8(..)).into(),
        1 => Ipv4Addr::new(192, 0, 2, rng.u8(..)).into(),
        2 => Ipv4Addr::new(198, 51, 100, rng.u8(..)).into(),
        3 => Ipv4Addr::from(rng.u32(..)).into(),
        4 => Ipv6Addr::new(0x2001, 0xdb8, 1, rng.u16(..), 0, 0, 0, rng.u16(..)).into(),
        5 => Ipv6Addr::new(0x2001, 0xdb8, rng.u16(2..), rng.u16(..), 0, 0, 0, 1).into(),
        6 => Ipv6Addr::new(0x2001, 0xdead, rng.u16(..), rng.u16(..), 0, 0, 0, 1).into(),
        _ => Ipv6Addr::from(rng.u128(..)).into(),
    }
}

/// A transport header (or none) and the protocol number announcing it.
fn transport(rng: &mut fastrand::Rng) -> (u8, Vec<u8>) {
    let port = match rng.u8(0..4) {
        0 => 22,
        1 => 53,
        2 => rng.u16(..),
        _ => [21, 23, 52, 54, 0, 65535][rng.usize(0..6)],
    };
    match rng.u8(0..6) {
        0 | 1 => {
            let flags = [0x02, 0x12, 0x10, 0x00, 0x03][rng.usize(0..5)];
            (model::TCP, crate::packets::tcp_header(port, flags))
        }
        2 | 3 => (model::UDP, crate::packets::udp_header(port)),
        4 => (
            [1, 58, 47, 50, 59][rng.usize(0..5)],
            vec![8, 0, 0, 0, 0, 1, 0, 1],
        ),
        _ => (
            rng.u8(..),
            (0..rng.usize(0..24)).map(|_| rng.u8(..)).collect(),
        ),
    }
}

/// A random IPv6 extension chain (often longer than the walk).
fn chain(rng: &mut fastrand::Rng) -> Vec<crate::packets::Ext> {
    use crate::packets::Ext;
    let len = match rng.u8(0..4) {
        0 => 0,
        1 => rng.usize(1..4),
        2 => rng.usize(4..9),
        _ => rng.usize(9..14),
    };
    (0..len)
        .map(|_| match rng.u8(0..6) {
            0 => Ext::HopByHop,
            1 => Ext::Routing,
            2 => Ext::DestOptions,
            3 => Ext::Auth,
            _ => Ext::Fragment {
                offset: if rng.bool() { 0 } else { rng.u16(1..8000) },
                more: rng.bool(),
            },
        })
        .collect()
}

/// A well-formed frame of random shape (before any mutation).
fn template(rng: &mut fastrand::Rng) -> Vec<u8> {
    let (protocol, mut payload) = transport(rng);
    let frame = match source(rng) {
        IpAddr::V4(src) => {
            let dst = Ipv4Addr::new(198, 51, 100, 1);
            let (offset, more) = match rng.u8(0..6) {
                0 => (rng.u16(1..8000), rng.bool()),
                1 => {
                    // A tiny first fragment: the transport header cut short.
                    payload.truncate(rng.usize(0..payload.len().max(1)));
                    (0, true)
                }
                _ => (0, false),
            };
            let (protocol, payload) = if rng.u8(0..8) == 0 {
                // Behind an authentication header.
                let mut ah = vec![protocol, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1];
                ah.extend(payload);
                (model::AH, ah)
            } else {
                (protocol, payload)
            };
            let mut frame = crate::packets::ipv4_raw(src, dst, protocol, offset, more, &payload);
            if rng.u8(0..4) == 0 {
                // IPv4 options (NOPs).
                let words = rng.usize(1..11);
                let ip = 14;
                frame.splice(ip + 20..ip + 20, std::iter::repeat_n(1u8, words * 4));
                frame[ip] = 0x40 | (5 + words as u8);
                let total = u16::from_be_bytes([frame[ip + 2], frame[ip + 3]]) + words as u16 * 4;
                frame[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
            }
            frame
        }
        IpAddr::V6(src) => {
            let dst = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1);
            crate::packets::ipv6_chain(src, dst, &chain(rng), protocol, &payload)
        }
    };
    let mut frame = frame;
    for _ in 0..[0, 0, 0, 1, 2, 3][rng.usize(0..6)] {
        let tpid = [0x8100, 0x88a8, 0x9100][rng.usize(0..3)];
        frame = crate::packets::tagged(&frame, tpid, rng.u16(..));
    }
    frame
}

/// One fuzzed frame: random bytes, a template cut at a random offset, or a
/// template with a few bytes changed (and maybe cut). At least the 14
/// bytes BPF_PROG_TEST_RUN requires.
pub fn frame(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut frame = match rng.u8(0..10) {
        0 => (0..rng.usize(14..200)).map(|_| rng.u8(..)).collect(),
        1..=3 => template(rng),
        _ => {
            let mut frame = template(rng);
            for _ in 0..rng.usize(1..5) {
                let at = rng.usize(0..frame.len());
                frame[at] = if rng.bool() {
                    rng.u8(..)
                } else {
                    frame[at] ^ (1 << rng.u8(0..8))
                };
            }
            frame
        }
    };
    if rng.u8(0..3) == 0 {
        let cut = rng.usize(14..=frame.len().max(14));
        frame.truncate(cut);
    }
    frame.resize(frame.len().max(14), 0);
    frame
}

/// What the model expects of a frame under `rules`.
struct Expected {
    outcome: Outcome,
    key: Option<SourceKey>,
}

/// The model's rules for a frame depend on its source only through which
/// rule prefixes contain it: memoised on that and the frame's transport.
type Memo = std::collections::HashMap<(u64, model::Seen), usize>;

fn expect(frame: &[u8], rules: &[model::Rule], memo: &mut Memo) -> Expected {
    match model::parse(frame) {
        Parsed::NonIp => Expected {
            outcome: Outcome::NonIp,
            key: None,
        },
        Parsed::Malformed => Expected {
            outcome: Outcome::Malformed,
            key: None,
        },
        Parsed::Ip { source, seen } => {
            let covering = rules
                .iter()
                .enumerate()
                .filter(|(_, r)| r.cidr.is_none_or(|c| c.contains(&source)))
                .fold(0u64, |mask, (i, _)| mask | 1 << i);
            let index = *memo.entry((covering, seen)).or_insert_with(|| {
                model::rule_for_seen(rules, source, seen)
                    .unwrap_or_else(|a| panic!("the fuzz rule set is ambiguous: {a:?}"))
            });
            let key = match source {
                IpAddr::V4(a) => SourceKey::v4(a.octets()),
                IpAddr::V6(a) => SourceKey::v6(a.octets()).masked(64, &prefix_mask(64)),
            };
            Expected {
                outcome: model::outcome_unlimited(&rules[index], false),
                key: Some(key),
            }
        }
    }
}

/// What a run checked.
#[derive(Debug, Default)]
pub struct Summary {
    pub frames: usize,
    /// Frames per outcome, as the kernel and the model both counted them.
    pub outcomes: BTreeMap<&'static str, u64>,
    pub sources: usize,
}

fn hex(frame: &[u8]) -> String {
    frame.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The outcome counters of `harness`, per outcome.
fn outcomes(harness: &Harness) -> Vec<Counter> {
    Outcome::ALL
        .iter()
        .map(|o| harness.outcome_total(*o))
        .collect()
}

/// Replays `frames` one at a time in a fresh program to name the first
/// whose outcome differs from the model's.
fn culprit(frames: &[Vec<u8>], expected: &[Expected], set: &RuleSet) -> String {
    let mut harness = Harness::load();
    harness.push(set);
    for (frame, want) in frames.iter().zip(expected) {
        let before = outcomes(&harness);
        harness.run_all(0, std::slice::from_ref(frame));
        let after = outcomes(&harness);
        let got: Vec<&str> = Outcome::ALL
            .iter()
            .zip(before.iter().zip(&after))
            .filter(|(o, (b, a))| a.packets > b.packets && (**o as u32) < Outcome::NewSource as u32)
            .map(|(o, _)| o.name())
            .collect();
        if got != [want.outcome.name()] {
            return format!(
                "frame {} (model: {:?}): kernel said {got:?}, model {}",
                hex(frame),
                model::parse(frame),
                want.outcome.name()
            );
        }
    }
    "the group mismatched, but no single frame does on replay".into()
}

/// Runs `count` fuzzed frames from `seed` through the kernel and checks
/// them against the model; the first disagreement is the error.
pub fn run(count: usize, seed: u64) -> Result<Summary, String> {
    let (set, model_rules) = rules();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut summary = Summary::default();
    let mut memo = Memo::new();
    let mut done = 0;
    while done < count {
        let chunk = CHUNK.min(count - done);
        // Room in the per-CPU state for every source of a chunk: the
        // model evicts nothing.
        let mut harness = Harness::load_with(&limiter_user::kernel::LoadOptions {
            max_sources: MAX_SOURCES,
            max_hot_sources: None,
            ..Default::default()
        });
        harness.push(&set);
        let mut per_key: BTreeMap<SourceKey, Counter> = BTreeMap::new();
        let mut offset = 0;
        while offset < chunk {
            let n = GROUP.min(chunk - offset);
            let frames: Vec<Vec<u8>> = (0..n).map(|_| frame(&mut rng)).collect();
            let expected: Vec<Expected> = frames
                .iter()
                .map(|f| expect(f, &model_rules, &mut memo))
                .collect();
            let before = outcomes(&harness);
            let verdicts = harness.run_all(0, &frames);
            let after = outcomes(&harness);
            let mut want = vec![Counter::default(); Outcome::ALL.len()];
            for ((frame, e), verdict) in frames.iter().zip(&expected).zip(&verdicts) {
                let dropped = matches!(e.outcome, Outcome::DroppedDeny | Outcome::DroppedLimit);
                let expected_verdict = if dropped { XDP_DROP } else { XDP_PASS };
                if *verdict != expected_verdict {
                    return Err(format!(
                        "frame {} got verdict {verdict}, the model says {} ({:?})",
                        hex(frame),
                        e.outcome.name(),
                        model::parse(frame)
                    ));
                }
                want[e.outcome as usize].add(frame.len() as u64);
                if let Some(key) = e.key {
                    per_key.entry(key).or_default().add(frame.len() as u64);
                }
            }
            for outcome in Outcome::ALL {
                if (outcome as u32) >= Outcome::NewSource as u32 {
                    continue;
                }
                let i = outcome as usize;
                let got = Counter {
                    packets: after[i].packets - before[i].packets,
                    bytes: after[i].bytes - before[i].bytes,
                };
                if got != want[i] {
                    return Err(format!(
                        "frames {}..{}: `{}` counted {got:?}, the model says {:?}; {}",
                        done + offset,
                        done + offset + n,
                        outcome.name(),
                        want[i],
                        culprit(&frames, &expected, &set)
                    ));
                }
                *summary.outcomes.entry(outcome.name()).or_default() += want[i].packets;
            }
            offset += n;
        }
        // Every IP frame was counted against its source, whatever its class.
        let mut counted: BTreeMap<SourceKey, Counter> = BTreeMap::new();
        for (key, per_cpu) in harness.sources() {
            let key = key.with_class(0);
            let total = limiter_user::kernel::read::total(&per_cpu);
            let entry = counted.entry(key).or_default();
            *entry = entry.merged(total);
        }
        if counted != per_key {
            let differ = per_key
                .iter()
                .find(|(k, v)| counted.get(k) != Some(v))
                .map(|(k, v)| format!("{k:?}: model {v:?}, kernel {:?}", counted.get(k)))
                .or_else(|| {
                    counted
                        .keys()
                        .find(|k| !per_key.contains_key(k))
                        .map(|k| format!("{k:?} counted, but the model keyed no frame by it"))
                });
            return Err(format!(
                "per-source counters differ: {}",
                differ.unwrap_or_default()
            ));
        }
        summary.sources += counted.len();
        done += chunk;
    }
    summary.frames = done;
    Ok(summary)
}
