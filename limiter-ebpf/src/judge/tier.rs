//! The tiers (with `Config::tiered`): a frame first counts in the cheap
//! tier (`SKETCH`, no per-source state) and is judged there while its
//! source has sent at most its rule's cheap frames over this epoch and
//! the last, and no share mark says it may have a cluster share. Past it,
//! a source with per-CPU state goes to `hot`; one without is judged on its
//! shared window alone (the exact tier), and gets per-CPU state once it is
//! refused, near its limit or busy. docs/architecture.md, "Tiers", has
//! the design and its bounds.

use limiter_common::{
    rules::NO_RULE, sketch, Action, AddressFamily, Config, Counter, Outcome, Rule, Scope,
    SourceKey, SourceTraffic,
};

use super::{
    hot,
    key::resolve,
    proof, scratch, tickets,
    verdict::{give_back_to_levels, pass, refuse, refused_by_level, stateless, Verdict},
    window::{
        find_window, limit, LIMIT_ADMITTED, LIMIT_DRY_RUN, LIMIT_EXACT_TIER, LIMIT_HALF_USED,
        LIMIT_WINDOWLESS,
    },
    BPF_NOEXIST,
};
use crate::{
    maps::{self, CLUSTER, RULES, SHARE_MARKS, SOURCES},
    shared,
};

/// Where a tiered frame went.
pub(super) enum Tiered {
    /// Judged without per-CPU state (cheap or exact tier).
    Judged(Verdict),
    /// The source has per-CPU state (hot): judge it there.
    Hot(*mut SourceTraffic),
    /// Judged on its window, and the source got per-CPU state just now
    /// (refused, or busy): account the verdict there.
    Promoted(*mut SourceTraffic, Verdict),
}

/// A frame with the tiers on.
#[inline(always)]
pub(super) fn tiered(config: &Config, key: &SourceKey, now: u64, len: u64) -> Tiered {
    // Counted by source, whatever the frame's class: the classes one rule
    // judges share its window, so they share its cheap frames too.
    let place = sketch::place(
        &key.addr,
        key.family() == AddressFamily::V6,
        key.prefix_len,
        0,
        config.sketch_seed,
    );
    let tag = sketch::tag(now);
    // Counters that keep losing their compare-and-swap: a busy source.
    let seen = shared::sketch_count(place, tag, sketch::HOT_FRAMES).unwrap_or(sketch::Seen::BUSY);
    let count = seen.total();
    // What bounds its SYNs should it find no window and no ticket.
    proof::note_reading(seen.unmarked());
    let mut index = NO_RULE;
    // Within the cheap frames, but share-marked: this frame goes to its
    // window, and so will the next ones (marked windowed below).
    let mut marked = false;
    if count <= u32::from(config.cheap_max) {
        index = resolve(key, config.generation);
        if let Some(rule) = RULES.get(index) {
            if within_cheap(rule, count, now) {
                if !must_be_exact(config, key, rule, place, count, now) {
                    maps::count(Outcome::Cheap, len);
                    return Tiered::Judged(cheap(config, rule, index, now));
                }
                marked = true;
            }
        }
    }
    if let Some(traffic) = SOURCES.get_ptr_mut(key) {
        // SAFETY: this CPU's slot of a per-CPU map value.
        let state = unsafe { &mut *traffic };
        state.record_at(now, len);
        let cheap_frames = RULES.get(state.rule).map_or(0, |rule| rule.cheap_frames);
        leave_cheap_tier(place, tag, seen, marked, cheap_frames);
        return Tiered::Hot(traffic);
    }
    if index == NO_RULE {
        index = resolve(key, config.generation);
    }
    let Some(rule) = RULES.get(index) else {
        return Tiered::Judged(pass(Outcome::Passed));
    };
    if rule.action() != Some(Action::Limit) {
        // Allow and deny keep per-CPU state past the cheap tier: what
        // `top` shows and events name.
        return match hot::promote(config, key, index, now, len, 0) {
            Some(traffic) => Tiered::Hot(traffic),
            None => Tiered::Judged(stateless(config, key)),
        };
    }
    leave_cheap_tier(place, tag, seen, marked, rule.cheap_frames);
    exact(config, key, rule, index, seen, now, len)
}

/// Whether the cheap tier may admit a frame of a source that reads `count`
/// (this frame included) over this epoch and the last under `rule`: at
/// most its `cheap_frames`, and for a cluster-scoped rule at most this
/// node's part of them, divided as the cap of a source without a share is
/// (by the nodes alive; by the fallback divisor while the cluster state is
/// stale): what every node admits uncounted adds up to the rule's cheap
/// frames, not to that many times the nodes.
#[inline(always)]
fn within_cheap(rule: &Rule, count: u32, now: u64) -> bool {
    if count > u32::from(rule.cheap_frames) {
        return false;
    }
    if rule.scope() != Some(Scope::Cluster) {
        return true;
    }
    match CLUSTER.get(0) {
        Some(state) => state.within_cap(u64::from(count), u64::from(rule.cheap_frames), now),
        None => false,
    }
}

/// Whether the source of `key` (at `place` in the sketch, reading `count`)
/// must be judged on its window under `rule` whatever the cheap tier
/// counts: under a cluster-scoped rule, while its share mark holds (it may
/// have a share, perhaps smaller than the cheap frames), from its second
/// frame on: a spoofed flood's one-frame sources never read the share
/// marks, and a source with a share gets at most one cheap frame after a
/// silence. A marked source goes to its window, which knows.
#[inline(always)]
fn must_be_exact(
    config: &Config,
    key: &SourceKey,
    rule: &Rule,
    place: sketch::Place,
    count: u32,
    now: u64,
) -> bool {
    if rule.scope() != Some(Scope::Cluster) || count <= 1 {
        return false;
    }
    let at = budget_place(config, key, rule, place);
    shared::marked(
        &SHARE_MARKS,
        sketch::mark_cell(at, sketch::SHARE_CELLS),
        now,
    )
}

/// The sketch place of `key`'s source as keyed by `rule`'s budget (where
/// its marks are): `place` (the source's, keyed as budget 0) itself when
/// the budget is 0.
#[inline(always)]
fn budget_place(
    config: &Config,
    key: &SourceKey,
    rule: &Rule,
    place: sketch::Place,
) -> sketch::Place {
    if rule.budget == 0 {
        place
    } else {
        hashed_budget_place(config, key, rule)
    }
}

/// The sketch place of `key`'s source as keyed by `rule`'s budget, hashed.
#[inline(always)]
fn hashed_budget_place(config: &Config, key: &SourceKey, rule: &Rule) -> sketch::Place {
    sketch::place(
        &key.addr,
        key.family() == AddressFamily::V6,
        key.prefix_len,
        rule.budget,
        config.sketch_seed,
    )
}

/// A frame of the cheap tier at `now` under rule `index`: allow passes,
/// deny drops, a limit admits unless one of its levels refuses (a light
/// source: the cheap tier admits a few frames of it).
#[inline(always)]
fn cheap(config: &Config, rule: &Rule, index: u32, now: u64) -> Verdict {
    let dry_run = rule.is_dry_run(config.dry_run());
    match rule.action() {
        Some(Action::Allow) => pass(Outcome::Allowed),
        Some(Action::Deny) => refuse(index, dry_run, Outcome::DroppedDeny),
        Some(Action::Limit) => refused_by_level(rule, index, dry_run, false, true, now)
            .unwrap_or(pass(Outcome::Passed)),
        None => pass(Outcome::Passed),
    }
}

/// A limited source's frame past the cheap tier (at `place`, reading
/// `seen` in the epoch tagged `tag`; `marked`: within its cheap frames but
/// sent to its window by a share mark) under a rule with `cheap_frames`:
/// marks the source windowed in the sketch, so that its next frames skip
/// the cheap tier while it keeps sending (the mark of the last epoch is
/// carried into this one by its first frame here). Nothing the cheap tier
/// admitted is charged to its window: the sketch only ever reads high
/// (other sources share its counters), so a charge could count frames
/// the source never sent against a source within its limit. The cheap
/// frames go uncounted instead, at most `cheap_frames` over any two
/// epochs (docs/architecture.md, "The bounds"). Not marked: a source
/// reading 1 (one frame of a spoofed flood), and any source of a rule
/// without cheap frames: their marks would only make their neighbours in
/// the sketch look windowed.
#[inline(always)]
fn leave_cheap_tier(
    place: sketch::Place,
    tag: u64,
    seen: sketch::Seen,
    marked: bool,
    cheap_frames: u8,
) {
    if !seen.windowed() {
        if cheap_frames != 0 && (seen.total() > 1 || marked) {
            shared::sketch_mark(place, tag);
        }
    } else if seen.previous >= sketch::WINDOWED && seen.current < sketch::WINDOWED {
        shared::sketch_mark(place, tag);
    }
}

/// A frame of a limited source without per-CPU state (the exact tier),
/// reading `seen` in the sketch, judged on its shared window alone:
/// through [`limit`] like a hot source's, but with this CPU's seed as its
/// per-CPU state and no lease. Refused, near its limit (its window half
/// used), or busy (this epoch's count over `sketch::HOT_FRAMES`), the
/// source keeps that state: the seed becomes its `SOURCES` entry.
#[inline(always)]
fn exact(
    config: &Config,
    key: &SourceKey,
    rule: &Rule,
    index: u32,
    seen: sketch::Seen,
    now: u64,
    len: u64,
) -> Tiered {
    let count = seen.total();
    let dry_run = rule.is_dry_run(config.dry_run());
    // The rule's levels first, judging the source as heavy as its window
    // found it at its last admission (it has no per-CPU copy).
    if rule.level_count() != 0 {
        let heavy = find_window(&key.with_class(rule.budget)).is_some_and(|w| w.heavy());
        if let Some(refused) = refused_by_level(rule, index, dry_run, heavy, false, now) {
            return Tiered::Judged(refused);
        }
    }
    let flags = (u32::from(dry_run) * LIMIT_DRY_RUN) | LIMIT_EXACT_TIER;
    let judged = scratch::seeded(scratch::ExactState, |state: &mut SourceTraffic| {
        // This frame, counted as the source's per-CPU state would count it.
        state.count_first(now, len);
        state.rule = index;
        state.generation = config.generation;
        tickets::free_under_pressure(now);
        let answer = limit(key, &mut *state, len, flags, now);
        let admitted = answer & LIMIT_ADMITTED != 0;
        // Busy: this epoch's count alone (a mark is not frames).
        let busy = seen.current > sketch::HOT_FRAMES;
        let mut promoted = false;
        // Not a source refused for want of a window (`WINDOWS` full):
        // per-CPU state would cost a flood that fills the windows an
        // insert a frame, and there is no window to hold it to.
        let windowless = answer & LIMIT_WINDOWLESS != 0;
        if !windowless && (!admitted || answer & LIMIT_HALF_USED != 0 || busy) {
            // Its frames this second, as the cheap tier counted them (at
            // least what it sent; more only if other sources share its
            // counters): what `top` shows of the second it became hot in.
            let offered = Counter {
                packets: u64::from(count),
                bytes: u64::from(count) * len,
            };
            state.current = offered;
            state.total = offered;
            #[allow(clippy::needless_borrows_for_generic_args)]
            if SOURCES.insert(key, &*state, BPF_NOEXIST).is_ok() {
                maps::count(Outcome::NewSource, len);
                promoted = true;
            }
        }
        (admitted, promoted)
    });
    let Some((admitted, promoted)) = judged else {
        // No state to judge it with: fail closed.
        return Tiered::Judged(refuse(NO_RULE, dry_run, Outcome::DroppedLimit));
    };
    let verdict = if admitted {
        pass(Outcome::Passed)
    } else {
        give_back_to_levels(rule, index, now);
        refuse(index, dry_run, Outcome::DroppedLimit)
    };
    if promoted {
        if let Some(traffic) = SOURCES.get_ptr_mut(key) {
            return Tiered::Promoted(traffic, verdict);
        }
    }
    Tiered::Judged(verdict)
}
