//! The invariants a run must keep, judged against the documented
//! semantics (docs/architecture.md): the sliding window over buckets
//! (`limiter_common::window::reference`, fed the frames at the times the
//! kernel saw them), a rule's levels, its penalty, and the bounds the
//! documentation states.
//!
//! - A source whose own frames stay within its limit in every window, and
//!   within every level it belongs to (the level's offered frames, all its
//!   sources', within what it admits a heavy source: its reserve never
//!   comes into play), is never dropped, but for a frame counted under a
//!   full map's outcome while the script overfilled that map (the refusing
//!   side the documentation states).
//! - No source is admitted more than its allowance plus the cheap tier's
//!   bound (`Rule::cheap_bound`) in any window of whole buckets, nor more
//!   than that plus the oldest bucket's admissions in any window of the
//!   rule's length ending at one of its admitted frames (the sliding
//!   window's own documented error); no aggregate more than its allowance
//!   (plus a frame per other CPU: a view taken before another CPU's last
//!   frame of the bucket before); no per-source level more than its
//!   allowance plus the cheap frames it does not see.
//! - A source blocked by a penalty is admitted nothing until it ends but
//!   its cheap frames after a silence (at most the rule's cheap frames per
//!   return).
//! - A light source (under its rule's fair share of an aggregate) beside
//!   heavy ones that exhaust the aggregate keeps at least 90% of its
//!   frames: the reserve (docs/architecture.md, "Fairness inside an
//!   exhausted aggregate").
//! - A map's full outcome is counted only when the map is full, and is
//!   counted when a flood overfilled it; no IPv6 /48 holds more tickets
//!   (proven or not) than its room (a racing CPU's one more), and `prefix_full`
//!   falls only on a /48 at its room.
//!
//! Times the kernel might have read on either side of a bucket's edge
//! (its coarse clock ticked during the run) count in no window: a window
//! may then read a frame low, never high.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write,
    net::IpAddr,
};

use limiter_common::{
    maps::window_capacity,
    rules::{rules_base, MAX_LEVELS},
    sketch,
    window::WindowParams,
    LevelKind, Outcome, Rule, SourceKey,
};

use super::{
    run::{Run, Sent},
    script::{Actor, Fills, Role, Script, WINDOWS},
    within_limit, zoo,
};
use crate::testrun::Harness;

/// What the program's state said after the run.
pub struct After {
    /// Each zoo kind's rule as the kernel reads it, in zoo order.
    pub rules: Vec<Rule>,
    /// The penalty each blocked source's window or hold keeps: window key
    /// -> until (ns).
    pub blocked: HashMap<SourceKey, u64>,
    pub outcomes: HashMap<&'static str, u64>,
}

impl After {
    /// Reads what the checks need of `harness` after a run.
    pub fn read(harness: &Harness) -> Self {
        let maps = harness.maps();
        let windows = limiter_user::kernel::read::windows(maps).expect("read WINDOWS");
        let mut blocked: HashMap<SourceKey, u64> = windows
            .iter()
            .filter(|(_, w)| w.blocked_until_ns != 0)
            .map(|(k, w)| (*k, w.blocked_until_ns))
            .collect();
        for entry in maps.holds.iter() {
            let (key, hold) = entry.expect("reading HOLDS");
            let until = blocked.entry(key).or_default();
            *until = (*until).max(hold.until_ns);
        }
        Self {
            rules: (0..zoo::KINDS.len())
                .map(|i| harness.first_rule(1 + i as u32))
                .collect(),
            blocked,
            outcomes: Outcome::ALL
                .iter()
                .map(|o| (o.name(), harness.outcome_total(*o).packets))
                .collect(),
        }
    }
}

/// What a run showed: its violations, and how much it checked.
#[derive(Default)]
pub struct Report {
    pub violations: Vec<String>,
    /// Sources found within their limits, and frames of theirs.
    pub polite_sources: usize,
    pub polite_frames: usize,
    /// Polite frames dropped on a full map's refusing side.
    pub full_drops: usize,
    /// Windows of whole buckets checked against the bound.
    pub windows_checked: usize,
}

impl Report {
    fn violation(&mut self, text: String) {
        self.violations.push(text);
    }
}

/// A frame's time, when the kernel's clock could not have crossed a
/// bucket edge of `bucket_ns` during its run.
fn certain(sent: &Sent, bucket_ns: u64) -> Option<u64> {
    (sent.before / bucket_ns == sent.after / bucket_ns).then_some(sent.after)
}

/// The certain times (see [`certain`]) of the admitted frames of `frames`.
fn admitted_at(frames: &[&Sent], bucket_ns: u64) -> Vec<u64> {
    frames
        .iter()
        .filter(|s| s.passed)
        .filter_map(|s| certain(s, bucket_ns))
        .collect()
}

/// The key of a source as the zoo's rules key it (IPv4 /32, IPv6 /64).
fn key_of(address: IpAddr) -> SourceKey {
    match address {
        IpAddr::V4(v4) => SourceKey::v4(v4.octets()),
        IpAddr::V6(v6) => SourceKey::v6(v6.octets()).masked(64, &limiter_common::prefix_mask(64)),
    }
}

/// The most admitted in `bound_of` windows of `buckets` whole buckets of
/// `bucket_ns`, over admission times `times` (sorted): checked against
/// `bound`; a description of the worst window past it.
fn whole_buckets(
    times: &[u64],
    bucket_ns: u64,
    buckets: u32,
    bound: u64,
) -> (usize, Option<String>) {
    let mut per_bucket: BTreeMap<u64, u64> = BTreeMap::new();
    for t in times {
        *per_bucket.entry(t / bucket_ns).or_default() += 1;
    }
    let mut checked = 0;
    let mut worst: Option<(u64, u64)> = None;
    for &last in per_bucket.keys() {
        let first = last.saturating_sub(u64::from(buckets) - 1);
        let admitted: u64 = per_bucket.range(first..=last).map(|(_, n)| n).sum();
        checked += 1;
        if admitted > bound && worst.is_none_or(|(_, w)| admitted > w) {
            worst = Some((last, admitted));
        }
    }
    let text = worst.map(|(last, admitted)| {
        format!(
            "{admitted} admitted in buckets {}..={last} of {bucket_ns} ns, at most {bound}",
            last.saturating_sub(u64::from(buckets) - 1)
        )
    });
    (checked, text)
}

/// The most admitted in a window of the rule's length ending at one of
/// the admissions `times` (sorted), beyond `bound` plus what was admitted
/// in the bucket that is the oldest at that time (the documented error of
/// the sliding window); a description of the worst.
fn sliding(times: &[u64], rule: &WindowParams, bound: u64) -> Option<String> {
    let window = rule.bucket_ns * u64::from(rule.buckets);
    let mut per_bucket: BTreeMap<u64, u64> = BTreeMap::new();
    for t in times {
        *per_bucket.entry(t / rule.bucket_ns).or_default() += 1;
    }
    let mut from = 0;
    for (i, &t) in times.iter().enumerate() {
        while times[from] + window <= t {
            from += 1;
        }
        let admitted = (i + 1 - from) as u64;
        let oldest = (t / rule.bucket_ns).checked_sub(u64::from(rule.buckets));
        let oldest = oldest.map_or(0, |b| per_bucket.get(&b).copied().unwrap_or(0));
        if admitted > bound + oldest {
            return Some(format!(
                "{admitted} admitted in the window ending at {t} ns, at most {bound} and the \
                 oldest bucket's {oldest}"
            ));
        }
    }
    None
}

/// The level of `rule` at `index`, its kind and its window.
fn level_params(rule: &Rule, index: usize, heavy: bool) -> Option<(LevelKind, WindowParams)> {
    let level = rule.levels().get(index)?;
    Some((level.kind()?, level.params(heavy)))
}

/// The key of the aggregate of `level` a source belongs to, as the kernel
/// builds it (no level here keys by destination).
fn level_key(rule: &Rule, index: usize, source: &SourceKey) -> limiter_common::LevelKey {
    rule.levels()[index].key(source, &[0; 16], rule.budget, rule.level_tag(), index as u8)
}

/// Checks a run of `script` against what the program said after it.
/// A source's own frames and those of its aggregates (`aggregates`, by
/// level and key), with the longest window among its rule's.
fn related<'a>(
    rule: &Rule,
    key: &SourceKey,
    frames: &[&'a Sent],
    aggregates: &HashMap<(usize, limiter_common::LevelKey), Vec<&'a Sent>>,
) -> (Vec<&'a Sent>, u64) {
    let mut related: Vec<&Sent> = frames.to_vec();
    let mut window_ns = rule.bucket_ns * u64::from(rule.buckets);
    for level in 0..rule.levels().len() {
        if let Some((kind, light)) = level_params(rule, level, false) {
            window_ns = window_ns.max(light.bucket_ns * u64::from(light.buckets));
            if kind.is_aggregate() {
                related.extend(aggregates[&(level, level_key(rule, level, key))].iter());
            }
        }
    }
    (related, window_ns)
}

pub fn check(script: &Script, run: &Run, after: &After) -> Report {
    let sent = &run.sent;
    let mut report = Report::default();
    let rule_of = |kind: zoo::Kind| &after.rules[kind.index()];
    // Each source's frames, in time order.
    let mut by_source: BTreeMap<(u16, u32), Vec<&Sent>> = BTreeMap::new();
    for s in sent {
        by_source.entry((s.actor, s.source)).or_default().push(s);
    }
    for frames in by_source.values_mut() {
        frames.sort_by_key(|s| (s.before, s.after));
    }
    // Every level aggregate's offered frames (all its sources'), by key.
    let mut aggregates: HashMap<(usize, limiter_common::LevelKey), Vec<&Sent>> = HashMap::new();
    for (&(actor, source), frames) in &by_source {
        let a = &script.actors[usize::from(actor)];
        let rule = rule_of(a.kind);
        let key = key_of(a.source(source));
        for level in 0..rule.levels().len().min(MAX_LEVELS) {
            aggregates
                .entry((level, level_key(rule, level, &key)))
                .or_default()
                .extend(frames.iter().copied());
        }
    }
    for frames in aggregates.values_mut() {
        frames.sort_by_key(|s| (s.before, s.after));
    }

    // 1. Polite sources are never dropped.
    let capacity = WINDOWS as usize;
    // A source's map may be full: the maps themselves (`WINDOWS` with its
    // proven room), its rule's room of tickets (its reserve and the
    // shared room; another rule's flood takes no room of its), or its
    // /48's room (another /48's flood takes none of it).
    let may_be_full = |kind: zoo::Kind, address: IpAddr| {
        run.peak_windows >= window_capacity(WINDOWS) as usize
            || run.peak_aggregates >= capacity
            || run
                .rooms_full
                .contains(&(rules_base(1) + 1 + kind.index() as u32))
            || run.prefix_full(address)
    };
    // A drop on a full map's refusing side: the frame itself counted so,
    // or a frame of the source (or of an aggregate of its) counted so
    // within the window before (a window or aggregate created seeded).
    let excused = |a: &Actor, frames: &[&Sent], s: &Sent, window_ns: u64| {
        may_be_full(a.kind, a.source(s.source))
            && frames
                .iter()
                .any(|f| f.full && f.before <= s.after && s.before <= f.after + window_ns)
    };
    for (&(actor, source), frames) in &by_source {
        let a = &script.actors[usize::from(actor)];
        if a.role != Role::Polite {
            continue;
        }
        let rule = rule_of(a.kind);
        let own = rule.params();
        let at_either = |check: &dyn Fn(&[u64]) -> bool| {
            check(&frames.iter().map(|s| s.before).collect::<Vec<_>>())
                && check(&frames.iter().map(|s| s.after).collect::<Vec<_>>())
        };
        let fits = |params: WindowParams, times: &[u64]| {
            within_limit(
                &params,
                times.iter().map(|t| std::time::Duration::from_nanos(*t)),
            )
        };
        let mut polite = at_either(&|times| fits(own, times));
        let key = key_of(a.source(source));
        for level in 0..rule.levels().len() {
            let Some((kind, heavy)) = level_params(rule, level, true) else {
                continue;
            };
            let group: Vec<&Sent> = if kind.is_aggregate() {
                aggregates[&(level, level_key(rule, level, &key))].clone()
            } else {
                frames.clone()
            };
            polite &= fits(heavy, &group.iter().map(|s| s.before).collect::<Vec<_>>())
                && fits(heavy, &group.iter().map(|s| s.after).collect::<Vec<_>>());
        }
        if !polite {
            continue;
        }
        report.polite_sources += 1;
        report.polite_frames += frames.len();
        let (related, window_ns) = related(rule, &key, frames, &aggregates);
        let excused = |s: &Sent| excused(a, &related, s, window_ns);
        if frames.iter().any(|s| !s.passed && !excused(s)) {
            let base = frames[0].before;
            let timeline: Vec<String> = frames
                .iter()
                .map(|s| {
                    let outcomes: Vec<&str> = Outcome::ALL
                        .iter()
                        .filter(|o| s.outcomes & (1 << **o as u32) != 0)
                        .map(|o| o.name())
                        .collect();
                    format!(
                        "{}{}{}{}",
                        (s.after - base) / 1_000_000,
                        if s.passed { "" } else { "x" },
                        if s.full { "f" } else { "" },
                        if outcomes.is_empty() {
                            String::new()
                        } else {
                            format!("[{}]", outcomes.join(","))
                        }
                    )
                })
                .collect();
            report.violation(format!(
                "polite source {} ({}): frames (ms from its first; x dropped, f full map): {}",
                a.source(source),
                a.what,
                timeline.join(" ")
            ));
        }
        for s in frames.iter().filter(|s| !s.passed) {
            if excused(s) {
                report.full_drops += 1;
                continue;
            }
            report.violation(format!(
                "polite source {} ({}) dropped at {} ns{}",
                a.source(source),
                a.what,
                s.after,
                if s.full {
                    " on a full map's refusing side, but neither a map nor its rule's room of tickets was full"
                } else {
                    ""
                }
            ));
        }
    }

    // 1b. The reserve: a light source beside heavy ones that exhaust its
    // aggregate keeps at least 90% of its frames (but those a full map
    // refused, as for a polite source).
    for (&(actor, source), frames) in &by_source {
        let a = &script.actors[usize::from(actor)];
        if a.role != Role::Light || frames.is_empty() {
            continue;
        }
        let rule = rule_of(a.kind);
        let (related, window_ns) = related(rule, &key_of(a.source(source)), frames, &aggregates);
        let full = frames
            .iter()
            .filter(|s| !s.passed && excused(a, &related, s, window_ns))
            .count();
        report.full_drops += full;
        let judged = frames.len() - full;
        let passed = frames.iter().filter(|s| s.passed).count();
        if passed * 10 < judged * 9 {
            report.violation(format!(
                "light source {} ({}): kept {passed} of {judged} frames judged on maps with \
                 room ({full} refused by a full map), under 90%",
                a.source(source),
                a.what,
            ));
        }
    }

    // 2. Nobody gets more than the allowance and the documented bound.
    for (&(actor, source), frames) in &by_source {
        let a = &script.actors[usize::from(actor)];
        let rule = rule_of(a.kind);
        let bound = rule.allowance_packets + rule.cheap_bound();
        let admitted = admitted_at(frames, rule.bucket_ns);
        let (checked, over) = whole_buckets(&admitted, rule.bucket_ns, rule.buckets, bound);
        report.windows_checked += checked;
        let over = over.or_else(|| sliding(&admitted, &rule.params(), bound));
        if let Some(over) = over {
            report.violation(format!("{} ({}): {over}", a.source(source), a.what));
        }
        // A per-source level: its allowance, and the cheap frames it does
        // not judge.
        for level in 0..rule.levels().len() {
            let Some((kind, light)) = level_params(rule, level, false) else {
                continue;
            };
            if kind.is_aggregate() {
                continue;
            }
            let window = light.bucket_ns * u64::from(light.buckets);
            let bound = light.allowance_packets
                + u64::from(rule.cheap_frames) * sketch::epoch_pairs(window);
            let admitted = admitted_at(frames, light.bucket_ns);
            let (checked, over) = whole_buckets(&admitted, light.bucket_ns, light.buckets, bound);
            report.windows_checked += checked;
            if let Some(over) = over {
                report.violation(format!(
                    "{} ({}), level {level}: {over}",
                    a.source(source),
                    a.what
                ));
            }
        }
    }
    for ((level, key), frames) in &aggregates {
        let a = frames[0];
        let actor = &script.actors[usize::from(a.actor)];
        let rule = rule_of(actor.kind);
        let Some((kind, light)) = level_params(rule, *level, false) else {
            continue;
        };
        if !kind.is_aggregate() {
            // Checked per source above, with the cheap frames it skips.
            continue;
        }
        let bound = light.allowance_packets + 1;
        let admitted = admitted_at(frames, light.bucket_ns);
        let (checked, over) = whole_buckets(&admitted, light.bucket_ns, light.buckets, bound);
        report.windows_checked += checked;
        if let Some(over) = over {
            report.violation(format!("aggregate {} of level {level}: {over}", key.ip()));
        }
    }

    // 3. A blocked source is admitted nothing but its cheap frames after a
    // silence, until its penalty ends.
    let block = rule_of(zoo::BLOCK);
    for (&(actor, source), frames) in &by_source {
        let a = &script.actors[usize::from(actor)];
        if a.kind != zoo::BLOCK {
            continue;
        }
        let wkey = key_of(a.source(source)).with_class(block.budget);
        let Some(&until) = after.blocked.get(&wkey) else {
            continue;
        };
        let armed = until.saturating_sub(block.block_ns);
        let mut returns = 0;
        let mut admitted = 0;
        let mut last_epoch: Option<u64> = None;
        for s in frames {
            let epoch = s.before / sketch::EPOCH_NS;
            let back = last_epoch.is_some_and(|last| epoch > last + 1);
            last_epoch = Some(s.after / sketch::EPOCH_NS);
            if s.before <= armed || s.after >= until {
                continue;
            }
            returns += u64::from(back);
            admitted += u64::from(s.passed);
        }
        let bound = u64::from(block.cheap_frames) * returns;
        if admitted > bound {
            report.violation(format!(
                "blocked source {} ({}): {admitted} admitted while blocked, at most {bound} \
                 ({returns} returns after a silence)",
                a.source(source),
                a.what
            ));
        }
    }

    // 4. Full maps counted where it happens, and only then (`HOLDS`
    // loses an ended penalty between samples, when the kernel finds one:
    // a penalty of the script's may end a frame before a sample).
    let count = |name: &str| after.outcomes.get(name).copied().unwrap_or(0);
    // A window is refused once its rule's reserve of tickets and the
    // shared room are full, before the map is.
    let prefixes_full = run
        .peak_prefixes
        .values()
        .any(|held| *held >= run.prefix_room);
    for (outcome, peak, fills, slack, room_full) in [
        (
            "window_full",
            run.peak_windows,
            Fills::Windows,
            0,
            !run.rooms_full.is_empty() || prefixes_full,
        ),
        (
            "aggregate_full",
            run.peak_aggregates,
            Fills::Aggregates,
            0,
            false,
        ),
        ("hold_failed", run.peak_holds, Fills::Holds, 64, false),
    ] {
        if count(outcome) > 0 && peak + slack < capacity && !room_full {
            report.violation(format!(
                "{outcome} counted {} times, but its map held {peak} of {capacity} at most",
                count(outcome)
            ));
        }
        // A flood of twice the room within a second, of sources that each
        // need an entry for longer than that, fills the map.
        let flood = script
            .actors
            .iter()
            .find(|a| a.fills == Some(fills) && a.count() > 2 * WINDOWS);
        if let (Some(flood), true) = (flood, fills != Fills::Holds) {
            if count(outcome) == 0 {
                report.violation(format!(
                    "{outcome} never counted, though {} overfilled its map (peak {peak})",
                    flood.what
                ));
            }
        }
    }

    // 5. No /48 holds more than its room of tickets (and one per other
    // CPU, racing for its last), and a /48 is refused for its room only
    // once it holds it.
    for (prefix, held) in &run.peak_prefixes {
        if *held > run.prefix_room + 1 {
            let mut octets = [0u8; 16];
            octets[..6].copy_from_slice(prefix);
            report.violation(format!(
                "the /48 {}/48 held {held} tickets, past its room of {}",
                std::net::Ipv6Addr::from(octets),
                run.prefix_room
            ));
        }
    }
    if count("prefix_full") > 0 && !prefixes_full {
        report.violation(format!(
            "prefix_full counted {} times, but no /48 held its room of {}",
            count("prefix_full"),
            run.prefix_room
        ));
    }
    let holder = script
        .actors
        .iter()
        .find(|a| a.fills == Some(Fills::Prefix) && u64::from(a.count()) > 2 * run.prefix_room);
    if let (Some(holder), 0) = (holder, count("prefix_full")) {
        report.violation(format!(
            "prefix_full never counted, though {} asked for more than its /48's room",
            holder.what
        ));
    }
    report
}

impl Report {
    /// A summary for the test's output.
    pub fn summary(&self) -> String {
        let mut text = String::new();
        let _ = write!(
            text,
            "{} polite sources ({} frames, {} dropped on a full map), {} windows checked, {} violations",
            self.polite_sources,
            self.polite_frames,
            self.full_drops,
            self.windows_checked,
            self.violations.len()
        );
        text
    }
}
