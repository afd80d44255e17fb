//! The known sources: a bounded sample of the sources the daemon reads past
//! the cheap tier (a window in `WINDOWS`, per-CPU state in `SOURCES`),
//! chosen by a keyed hash, each with its rule's name, its latest rate and
//! whether it is being refused. What `suggest`'s history counts (each
//! source once a slot) and what guards judge (the sources known polite
//! before a period).
//!
//! **Sampling.** A source is kept when the top `shift` bits of its keyed
//! hash (`RandomState`: a key drawn at start, unknown outside the daemon)
//! are zero: a chance of `2^-shift` that no address can choose. When the
//! sample would pass its capacity, `shift` grows by one and the sources no
//! longer sampled are let go, halving it: the sample stays uniform over the
//! sources seen, whatever a flood adds, and at most [`CAPACITY`] sources
//! are held (under 200 bytes each with the map's own: under 3.2 MiB).
//!
//! **Which rule.** A source read from `SOURCES` carries its `RULES` index;
//! a window's key carries its prefix and budget class, and the rule is the
//! one the kernel's trie resolves its address to with that budget
//! ([`Resolver`]).

use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    sync::Arc,
    time::Duration,
};

use ipnet::IpNet;
use limiter_common::{rules::NO_RULE, RuleRefs, SourceKey};

use super::history::{History, SeriesKey};
use crate::rules::{Compiled, RuleSet};

/// Sources held at most.
pub const CAPACITY: usize = 16_384;
/// A source read from `SOURCES` this recently is judged by that read, not
/// by its window's (which counts only what was admitted).
const HOT_FRESH_NS: u64 = 2_000_000_000;

/// What a read says of one source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub key: SourceKey,
    /// Packets a second: offered (from `SOURCES`) or admitted (a window).
    pub pps: u64,
    /// Being refused (held, or in an episode of refusals).
    pub refused: bool,
    /// Frames dropped since its per-CPU state began (`None`: a window's
    /// read, which does not count drops).
    pub dropped_total: Option<u64>,
}

/// One known source.
#[derive(Clone, Debug)]
pub struct Source {
    pub rule: Arc<str>,
    /// The rule set `rule` was resolved under (`Known::rules_seen`).
    rules_seen: u64,
    /// When it was first and last read (monotonic ns).
    pub first_ns: u64,
    pub last_ns: u64,
    /// When it was last read refused (0: never).
    pub refused_ns: u64,
    /// Its latest rate and whether it was refused then.
    pub pps: u64,
    pub refused: bool,
    /// Frames a second dropped of it between its last two reads from
    /// `SOURCES`.
    pub drop_pps: u64,
    hot_ns: u64,
    dropped: Option<(u64, u64)>,
    /// The history slot it was last recorded in, and as what.
    recorded: Option<(u64, u64, bool)>,
}

/// The sample.
pub struct Known {
    hasher: RandomState,
    shift: u32,
    capacity: usize,
    sources: HashMap<SourceKey, Source>,
    resolver: Resolver,
    /// Rule sets set so far: a window's read reuses its source's rule
    /// while the rules have not changed.
    rules_seen: u64,
}

impl Default for Known {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl Known {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            hasher: RandomState::new(),
            shift: 0,
            capacity,
            sources: HashMap::new(),
            resolver: Resolver::default(),
            rules_seen: 0,
        }
    }

    /// The rules in force (after every push: `compiled` the tables the
    /// push wrote at `base`): names and window keys resolve against them.
    pub fn set_rules(&mut self, rules: &RuleSet, compiled: &Compiled, base: u32) {
        self.resolver = Resolver::new(rules, compiled, base);
        self.rules_seen += 1;
    }

    /// The share of sources sampled: `2^-shift`.
    pub fn sampled_share(&self) -> f64 {
        0.5f64.powi(self.shift as i32)
    }

    pub fn len(&self) -> usize {
        self.sources.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    pub fn get(&self, key: &SourceKey) -> Option<&Source> {
        self.sources.get(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&SourceKey, &Source)> {
        self.sources.iter()
    }

    fn sampled(&self, key: &SourceKey) -> bool {
        self.shift == 0 || self.hasher.hash_one(key).leading_zeros() >= self.shift
    }

    /// Takes a read of a source at `now_ns` under the `RULES` index `rule`
    /// of the generation at `base` (`None`: a window's read, resolved by
    /// its key), and records it in `history`: each source once a slot, at
    /// its highest rate of the slot, among the refused if it was refused
    /// in the slot.
    pub fn observe(
        &mut self,
        reading: Reading,
        rule: Option<(u32, u32)>,
        now_ns: u64,
        history: &mut History,
    ) {
        if !self.sampled(&reading.key) {
            return;
        }
        let name = match rule {
            Some((index, base)) => index
                .checked_sub(base)
                .and_then(|position| self.resolver.name(position as usize)),
            None => match self.sources.get(&reading.key) {
                Some(known) if known.rules_seen == self.rules_seen => Some(known.rule.clone()),
                _ => self.resolver.rule_of(&reading.key),
            },
        };
        let Some(name) = name else {
            return;
        };
        if !self.sources.contains_key(&reading.key) && self.sources.len() >= self.capacity {
            self.thin();
            if !self.sampled(&reading.key) {
                return;
            }
        }
        let rules_seen = self.rules_seen;
        let source = self.sources.entry(reading.key).or_insert_with(|| Source {
            rule: name.clone(),
            rules_seen,
            first_ns: now_ns,
            last_ns: now_ns,
            refused_ns: 0,
            pps: 0,
            refused: false,
            drop_pps: 0,
            hot_ns: 0,
            dropped: None,
            recorded: None,
        });
        source.rules_seen = rules_seen;
        if source.rule != name {
            // Its rule changed (a push): its slot's record stays where it
            // was made.
            source.rule = name;
            source.recorded = None;
        }
        source.last_ns = now_ns;
        match reading.dropped_total {
            Some(total) => {
                source.hot_ns = now_ns;
                source.pps = reading.pps;
                source.refused = reading.refused;
                if let Some((before, at)) = source.dropped {
                    let seconds = now_ns.saturating_sub(at) as f64 / 1e9;
                    if seconds > 0.0 {
                        source.drop_pps = (total.saturating_sub(before) as f64 / seconds) as u64;
                    }
                }
                source.dropped = Some((total, now_ns));
            }
            None if now_ns.saturating_sub(source.hot_ns) < HOT_FRESH_NS => return,
            None => {
                source.pps = reading.pps;
                source.refused = false;
                source.drop_pps = 0;
                source.dropped = None;
            }
        }
        if source.refused {
            source.refused_ns = now_ns;
        }
        record(source, history, now_ns);
    }

    /// Lets go of the sources not read for `keep`.
    pub fn forget_older(&mut self, now_ns: u64, keep: Duration) {
        let keep = keep.as_nanos() as u64;
        self.sources
            .retain(|_, s| now_ns.saturating_sub(s.last_ns) <= keep);
    }

    /// Halves the sample: one more bit of every kept source's hash must be
    /// zero.
    fn thin(&mut self) {
        while self.sources.len() >= self.capacity && self.shift < 63 {
            self.shift += 1;
            let (hasher, shift) = (&self.hasher, self.shift);
            self.sources
                .retain(|key, _| hasher.hash_one(key).leading_zeros() >= shift);
        }
    }
}

/// Records `source`'s figure of the slot of `now_ns`: a first read of the
/// slot adds one observation; a later one moves it when the rate is higher
/// or the source is refused now (never back).
fn record(source: &mut Source, history: &mut History, now_ns: u64) {
    let now = Duration::from_nanos(now_ns);
    let slot = history.slot_number(now);
    let series = SeriesKey::rule(&source.rule);
    let (pps, refused) = (source.pps, source.refused);
    match source.recorded {
        Some((at, was_pps, was_refused)) if at == slot => {
            let refused = refused || was_refused;
            let pps = pps.max(was_pps);
            if (pps, refused) != (was_pps, was_refused) {
                history.retract_source(&series, was_pps, was_refused, now);
                history.observe_source(&series, pps, refused, now);
                source.recorded = Some((slot, pps, refused));
            }
        }
        _ => {
            history.observe_source(&series, pps, refused, now);
            source.recorded = Some((slot, pps, refused));
        }
    }
}

/// A window key's rule, as the kernel resolves it: the longest rule prefix
/// holding its address, then the rule among those that prefix's frame
/// classes lead to whose budget is the key's class.
#[derive(Default)]
struct Resolver {
    names: Vec<Arc<str>>,
    budgets: Vec<u8>,
    /// Prefixes, longest first, with each frame class's rule position.
    prefixes: Vec<(IpNet, Vec<u32>)>,
}

impl Resolver {
    /// From the tables a push compiled for `rules` at `base` (their
    /// `RULES` indices less `base` are the rules' positions).
    fn new(rules: &RuleSet, compiled: &Compiled, base: u32) -> Self {
        let names = rules.specs().map(|s| Arc::from(s.name.as_str())).collect();
        let budgets = compiled.rules.iter().map(|r| r.budget).collect();
        let positions = |refs: &RuleRefs| -> Vec<u32> {
            refs.rules
                .iter()
                .map(|&r| if r == NO_RULE { NO_RULE } else { r - base })
                .collect()
        };
        let mut prefixes: Vec<(IpNet, Vec<u32>)> = Vec::new();
        for (len, addr, refs) in &compiled.v4 {
            if let Ok(net) = ipnet::Ipv4Net::new((*addr).into(), *len) {
                prefixes.push((net.into(), positions(refs)));
            }
        }
        for (len, addr, refs) in &compiled.v6 {
            if let Ok(net) = ipnet::Ipv6Net::new((*addr).into(), *len) {
                prefixes.push((net.into(), positions(refs)));
            }
        }
        prefixes.sort_by_key(|(net, _)| std::cmp::Reverse(net.prefix_len()));
        Self {
            names,
            budgets,
            prefixes,
        }
    }

    fn name(&self, position: usize) -> Option<Arc<str>> {
        self.names.get(position).cloned()
    }

    fn rule_of(&self, key: &SourceKey) -> Option<Arc<str>> {
        let addr = key.ip();
        let (_, rules) = self.prefixes.iter().find(|(net, _)| net.contains(&addr))?;
        let position = rules
            .iter()
            .copied()
            .find(|&r| r != NO_RULE && self.budgets.get(r as usize) == Some(&key.class))?;
        self.name(position as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::Config, rules::compile};

    fn rules(text: &str) -> RuleSet {
        Config::parse(text, "t.toml").unwrap().rules
    }

    /// The base of the second half of `RULES`, where a push's tables
    /// hold indices that are not the rules' positions.
    const BASE: u32 = limiter_common::rules::rules_base(1);

    fn resolver(set: &RuleSet) -> Resolver {
        Resolver::new(set, &compile(set, BASE, 1).unwrap(), BASE)
    }

    fn set_rules(known: &mut Known, text: &str) {
        let set = rules(text);
        known.set_rules(&set, &compile(&set, BASE, 1).unwrap(), BASE);
    }

    fn reading(key: SourceKey, pps: u64, refused: bool, dropped: Option<u64>) -> Reading {
        Reading {
            key,
            pps,
            refused,
            dropped_total: dropped,
        }
    }

    #[test]
    fn a_window_resolves_to_its_rule_by_prefix_and_budget() {
        let set = rules(
            "[[rules]]\nname = \"net\"\ncidr = \"10.0.0.0/8\"\npps = 5\n\n\
             [[rules]]\nname = \"dns\"\ncidr = \"10.0.0.0/8\"\nprotocol = \"udp\"\nports = \"53\"\npps = 5\n",
        );
        assert_ne!(BASE, 0);
        let resolver = resolver(&set);
        let inside = SourceKey::v4([10, 1, 2, 3]);
        assert_eq!(resolver.rule_of(&inside).as_deref(), Some("net"));
        assert_eq!(
            resolver.rule_of(&inside.with_class(1)).as_deref(),
            Some("dns")
        );
        assert_eq!(
            resolver.rule_of(&SourceKey::v4([192, 0, 2, 1])).as_deref(),
            Some("default")
        );
    }

    #[test]
    fn a_source_counts_once_a_slot_at_its_highest_rate_and_refused_apart() {
        let mut history = History::new(Duration::from_secs(60));
        let mut known = Known::default();
        set_rules(&mut known, "[default]\npps = 100\n");
        let key = SourceKey::v4([192, 0, 2, 1]);
        let second = 1_000_000_000u64;
        let at = 100 * second;
        // Three reads in one slot (1 s here): one observation, at 30.
        for (i, pps) in [10, 30, 20].into_iter().enumerate() {
            let now = at + i as u64 * second / 4;
            known.observe(reading(key, pps, false, None), None, now, &mut history);
        }
        let series = SeriesKey::rule("default");
        let dist = history.distribution(&series, Duration::from_secs(60), Duration::from_nanos(at));
        assert_eq!(dist.samples(), 1);
        assert_eq!(dist.quantile(1.0), Some(30));
        // Refused in the slot: the observation moves to the refused ones.
        known.observe(
            reading(key, 400, true, Some(50)),
            Some((0, 0)),
            at + 900_000_000,
            &mut history,
        );
        let dist = history.distribution(&series, Duration::from_secs(60), Duration::from_nanos(at));
        assert_eq!((dist.samples(), dist.refused_samples()), (0, 1));
        assert!(dist.refused_max().unwrap() >= 400);
        // The next slot: a new observation; the window's read right after
        // a hot one does not overwrite it.
        let next = at + second;
        known.observe(
            reading(key, 40, false, Some(60)),
            Some((0, 0)),
            next,
            &mut history,
        );
        known.observe(reading(key, 5, false, None), None, next + 1, &mut history);
        let dist =
            history.distribution(&series, Duration::from_secs(1), Duration::from_nanos(next));
        assert_eq!(
            (dist.samples(), dist.quantile(1.0)),
            (1, Some(41)),
            "40, read as its bucket's upper edge"
        );
        let source = known.get(&key).unwrap();
        assert_eq!(source.drop_pps, 100, "10 more dropped over 100 ms");
        assert!(source.refused_ns > 0 && !source.refused);
    }

    #[test]
    fn the_sample_stays_within_its_capacity_and_uniform() {
        let mut history = History::new(Duration::from_secs(60));
        let mut known = Known::with_capacity(1_000);
        set_rules(&mut known, "[default]\npps = 100\n");
        for i in 0..100_000u32 {
            let key = SourceKey::v4(i.to_be_bytes());
            known.observe(
                reading(key, 1, false, None),
                None,
                1_000 + u64::from(i),
                &mut history,
            );
        }
        assert!(known.len() < 1_000, "{}", known.len());
        // 100,000 sources at 2^-shift: about len of them.
        let expected = 100_000.0 * known.sampled_share();
        let len = known.len() as f64;
        assert!(
            (len - expected).abs() < 4.0 * expected.sqrt() + 1.0,
            "{len} vs {expected}"
        );
        // Every address range is in it, not only the first ones.
        let upper = known
            .iter()
            .filter(|(k, _)| matches!(k.ip(), std::net::IpAddr::V4(v4) if u32::from(v4) >= 50_000))
            .count();
        assert!(upper as f64 > len / 4.0, "{upper} of {len}");
    }
}
