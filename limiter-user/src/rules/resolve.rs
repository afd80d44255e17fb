//! Which rule judges a frame class of a prefix: the longest prefix, then
//! the match contained in every other, and for frames whose ports or
//! protocol could not be read the strictest rule they could fall under;
//! overlapping matches without a containing rule are refused (see the
//! module docs of `rules`). Decided over representative frames that cover
//! every case.

use super::*;

/// A representative frame: protocol, destination port, TCP flags. The
/// representatives cover every protocol a match names (plus TCP, UDP and
/// one no match names) and every port at and beside each range's ends, so
/// whatever holds for them holds for every frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Sample {
    protocol: u8,
    port: u16,
    flags: u8,
}

impl Sample {
    fn describe(&self) -> String {
        match self.protocol {
            PROTO_TCP => {
                let syn = match self.flags & (TCP_FLAG_SYN | TCP_FLAG_ACK) {
                    TCP_FLAG_SYN => "SYN ",
                    _ => "",
                };
                format!("TCP {syn}to port {}", self.port)
            }
            PROTO_UDP => format!("UDP to port {}", self.port),
            p => format!("protocol {p}"),
        }
    }
}

/// The frame classes the matches induce: which can occur, and which
/// resolved classes an unresolved one may stand for.
pub(super) struct FrameSpace {
    samples: Vec<Sample>,
    /// For each frame class, the resolved classes its frames may have
    /// (empty: no frame has this class), with an example frame each.
    possible: Vec<Vec<(u8, Sample)>>,
}

impl FrameSpace {
    pub(super) fn new(config: &Config, classes: &[Match]) -> Self {
        let mut protocols = vec![PROTO_TCP, PROTO_UDP];
        for m in classes {
            if let Some(p) = m.protocol {
                if !protocols.contains(&p) {
                    protocols.push(p);
                }
            }
        }
        let other = (1..=254u8)
            .rev()
            .find(|p| !protocols.contains(p))
            .expect("a protocol no match names");
        protocols.push(other);
        let mut ports = vec![0u16, u16::MAX];
        for m in classes {
            if let Some((a, b)) = m.ports {
                ports.extend([a, b, a.saturating_sub(1), b.saturating_add(1)]);
            }
        }
        ports.sort_unstable();
        ports.dedup();
        let mut samples = Vec::new();
        for &protocol in &protocols {
            if protocol == PROTO_TCP || protocol == PROTO_UDP {
                let flag_sets: &[u8] = if protocol == PROTO_TCP {
                    &[0, TCP_FLAG_SYN, TCP_FLAG_SYN | TCP_FLAG_ACK, TCP_FLAG_ACK]
                } else {
                    &[0]
                };
                for &port in &ports {
                    for &flags in flag_sets {
                        samples.push(Sample {
                            protocol,
                            port,
                            flags,
                        });
                    }
                }
            } else {
                samples.push(Sample {
                    protocol,
                    port: 0,
                    flags: 0,
                });
            }
        }
        let mut possible = vec![Vec::new(); FRAME_CLASSES];
        let mut add = |class: u8, resolved: u8, sample: Sample| {
            let slot: &mut Vec<(u8, Sample)> = &mut possible[usize::from(class)];
            if !slot.iter().any(|(c, _)| *c == resolved) {
                slot.push((resolved, sample));
            }
        };
        for &sample in &samples {
            let resolved =
                config.classify(sample.protocol, sample.port, sample.flags, Transport::Known);
            add(resolved, resolved, sample);
            let unresolved = config.classify(sample.protocol, 0, 0, Transport::PortUnknown);
            add(unresolved, resolved, sample);
            let unknown = config.classify(0, 0, 0, Transport::ProtocolUnknown);
            add(unknown, resolved, sample);
        }
        Self { samples, possible }
    }

    /// Whether every frame that satisfies `inner` satisfies `outer`.
    fn contained(&self, inner: &Match, outer: &Match) -> bool {
        let (inner, outer) = (inner.class(), outer.class());
        self.samples.iter().all(|s| {
            !inner.matches(s.protocol, s.port, s.flags)
                || outer.matches(s.protocol, s.port, s.flags)
        })
    }
}

/// Picks each frame class's rule for each prefix.
pub(super) struct Resolver<'a> {
    pub(super) all: &'a [&'a RuleSpec],
    pub(super) rules: &'a [Rule],
    pub(super) classes: &'a [Match],
    pub(super) space: &'a FrameSpace,
}

impl Resolver<'_> {
    /// The trie value of `prefix`: each frame class's rule index + `base`.
    pub(super) fn refs(&self, prefix: &IpNet, base: u32) -> Result<RuleRefs, RuleError> {
        let mut refs = RuleRefs::default();
        for class in 0..FRAME_CLASSES as u8 {
            let possible = &self.space.possible[usize::from(class)];
            let index = if class < RESOLVED_CLASSES {
                if possible.is_empty() {
                    // No frame has this class; the kernel never asks.
                    self.best(prefix, class, None)?
                } else {
                    self.best(prefix, class, Some(&possible[0].1))?
                }
            } else {
                debug_assert!(class >= UNRESOLVED_BASE || class == UNKNOWN_PROTOCOL_CLASS);
                if possible.is_empty() {
                    continue;
                }
                let mut candidates = Vec::new();
                for (resolved, sample) in possible {
                    candidates.push(self.best(prefix, *resolved, Some(sample))?);
                }
                self.strictest(&candidates)
            };
            refs.rules[usize::from(class)] = base + index as u32;
        }
        Ok(refs)
    }

    /// The rule (index into `all`) of resolved class `class` for sources
    /// in `prefix`; `example` is a frame of that class, for errors (none:
    /// no frame has the class, so overlaps there do not matter).
    fn best(
        &self,
        prefix: &IpNet,
        class: u8,
        example: Option<&Sample>,
    ) -> Result<usize, RuleError> {
        let fits = |spec: &RuleSpec| {
            spec.matches.is_any()
                || self
                    .classes
                    .iter()
                    .position(|c| *c == spec.matches)
                    .is_some_and(|i| class & (1 << i) != 0)
        };
        let covering: Vec<usize> = (1..self.all.len())
            .filter(|&i| {
                let cidr = &self.all[i].cidr;
                cidr.contains(prefix)
                    && cidr.prefix_len() <= prefix.prefix_len()
                    && fits(self.all[i])
            })
            .collect();
        let Some(longest) = covering
            .iter()
            .map(|&i| self.all[i].cidr.prefix_len())
            .max()
        else {
            return Ok(0);
        };
        let tied: Vec<usize> = covering
            .into_iter()
            .filter(|&i| self.all[i].cidr.prefix_len() == longest)
            .collect();
        let contained_in_all = |i: usize| {
            tied.iter().all(|&j| {
                self.space
                    .contained(&self.all[i].matches, &self.all[j].matches)
            })
        };
        if let Some(&winner) = tied.iter().find(|&&i| contained_in_all(i)) {
            return Ok(winner);
        }
        match example {
            None => Ok(tied[0]),
            Some(sample) => {
                // Two rules neither of which contains the other.
                let (a, b) = tied
                    .iter()
                    .flat_map(|&a| tied.iter().map(move |&b| (a, b)))
                    .find(|&(a, b)| {
                        a < b
                            && !self
                                .space
                                .contained(&self.all[a].matches, &self.all[b].matches)
                            && !self
                                .space
                                .contained(&self.all[b].matches, &self.all[a].matches)
                    })
                    .unwrap_or((tied[0], tied[1]));
                Err(RuleError::Overlap(Box::new(Overlap {
                    rule: rule_name(a),
                    rule_match: self.all[a].matches.describe(),
                    other: rule_name(b),
                    other_match: self.all[b].matches.describe(),
                    cidr: self.all[a].cidr,
                    example: sample.describe(),
                })))
            }
        }
    }

    /// The strictest of `candidates` (indices into `all`): enforced deny,
    /// enforced limit by lowest rate, dry-run deny, dry-run limit, allow;
    /// ties to the lowest index.
    fn strictest(&self, candidates: &[usize]) -> usize {
        *candidates
            .iter()
            .min_by_key(|&&i| (strictness(self.all[i], &self.rules[i]), i))
            .expect("at least one candidate")
    }
}

/// Sort key of a rule's strictness (lower is stricter).
fn strictness(spec: &RuleSpec, rule: &Rule) -> (u8, u128, u128) {
    let window_ns = u128::from(rule.bucket_ns) * u128::from(rule.buckets);
    let rate = |allowance: u64| {
        if allowance == UNLIMITED || window_ns == 0 {
            u128::MAX
        } else {
            u128::from(allowance) * 1_000_000_000 / window_ns
        }
    };
    let rank = match (spec.action, spec.dry_run) {
        (Action::Deny, false) => 0,
        (Action::Limit, false) => 1,
        (Action::Deny, true) => 2,
        (Action::Limit, true) => 3,
        (Action::Allow, _) => 4,
    };
    (
        rank,
        rate(rule.allowance_packets),
        rate(rule.allowance_bytes),
    )
}
