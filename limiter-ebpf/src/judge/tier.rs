//! The tiers (with `Config::tiered`): a frame first counts in the cheap
//! tier (`SKETCH`, no per-source state) and is judged there while its
//! source has sent at most its rule's cheap frames and no mark says it
//! may be blocked or have a cluster share. Past it, a source with per-CPU
//! state goes to `hot`; one without is judged on its shared window alone
//! (the exact tier), and gets per-CPU state once it is refused, near its
//! limit or busy. docs/architecture.md, "Tiers", has the design and its
//! bounds.

use limiter_common::{
    rules::NO_RULE, sketch, Action, AddressFamily, Config, Counter, Outcome, Rule, Scope,
    SourceKey, SourceTraffic,
};

use super::{
    hot,
    key::resolve,
    scratch,
    verdict::{give_back_to_levels, pass, refuse, refused_by_level, stateless, Verdict},
    window::{limit, LIMIT_ADMITTED, LIMIT_DRY_RUN, LIMIT_EXACT_TIER, LIMIT_HALF_USED},
    BPF_NOEXIST,
};
use crate::{
    maps::{self, CLUSTER, PENALTY_MARKS, RULES, SHARE_MARKS, SOURCES},
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
    let mut index = NO_RULE;
    // Within the cheap frames, but marked: this frame goes to its window,
    // and so will the next ones (marked windowed below, even with nothing
    // to charge).
    let mut marked = false;
    if count <= u32::from(config.cheap_max) {
        index = resolve(key, config.generation);
        if let Some(rule) = RULES.get(index) {
            if within_cheap(rule, count, now) {
                if !must_be_exact(config, key, rule, place, count, now) {
                    maps::count(Outcome::Cheap, len);
                    return Tiered::Judged(cheap(config, rule, index));
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
        let unwindowed = leave_cheap_tier(place, tag, seen, marked, cheap_frames);
        if unwindowed != 0 {
            // Charged by this CPU's next look at the window (this frame's,
            // unless the source is held or leased).
            state.carried = unwindowed;
        }
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
    let past = Past {
        seen,
        unwindowed: leave_cheap_tier(place, tag, seen, marked, rule.cheap_frames),
    };
    exact(config, key, rule, index, past, now, len)
}

/// Whether the cheap tier may admit a frame of a source that reads `count`
/// (this frame included) over this epoch and the last under `rule`: at
/// most its `cheap_frames`, and for a cluster-scoped rule at most the cap
/// a source without a share gets on this node (the cold cap, or the
/// fallback cap while the cluster state is stale), so that the frames
/// charged on leaving the cheap tier fit that node's part.
#[inline(always)]
fn within_cheap(rule: &Rule, count: u32, now: u64) -> bool {
    if count > u32::from(rule.cheap_frames) {
        return false;
    }
    if rule.scope() != Some(Scope::Cluster) {
        return true;
    }
    match CLUSTER.get(0) {
        Some(state) => state.within_cap(u64::from(count), rule.allowance_packets, now),
        None => false,
    }
}

/// Whether the source of `key` (at `place` in the sketch, reading `count`)
/// must be judged on its window under `rule` whatever the cheap tier
/// counts: under a rule with a `block`, while its penalty mark holds (it
/// may be blocked); under a cluster-scoped rule, while its share mark does
/// (it may have a share, perhaps smaller than the cheap frames), from its
/// second frame on: a spoofed flood's one-frame sources never read the
/// share marks, and a source with a share gets at most one cheap frame
/// after a silence, charged to its window by the next. A marked source goes
/// to its window, which knows.
#[inline(always)]
fn must_be_exact(
    config: &Config,
    key: &SourceKey,
    rule: &Rule,
    place: sketch::Place,
    count: u32,
    now: u64,
) -> bool {
    let (marks, cells) = if rule.block_ns != 0 {
        (&PENALTY_MARKS, sketch::PENALTY_CELLS)
    } else if rule.scope() == Some(Scope::Cluster) && count > 1 {
        (&SHARE_MARKS, sketch::SHARE_CELLS)
    } else {
        return false;
    };
    let at = budget_place(config, key, rule, place);
    shared::marked(marks, sketch::mark_cell(at, cells), now)
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

/// A frame of the cheap tier under rule `index`: allow passes, deny drops,
/// a limit admits unless one of its levels refuses (a light source: the
/// cheap tier admits a few frames of it).
#[inline(always)]
fn cheap(config: &Config, rule: &Rule, index: u32) -> Verdict {
    let dry_run = rule.is_dry_run(config.dry_run());
    match rule.action() {
        Some(Action::Allow) => pass(Outcome::Allowed),
        Some(Action::Deny) => refuse(index, dry_run, Outcome::DroppedDeny),
        Some(Action::Limit) => {
            refused_by_level(rule, index, dry_run, false).unwrap_or(pass(Outcome::Passed))
        }
        None => pass(Outcome::Passed),
    }
}

/// A limited source's frame past the cheap tier (at `place`, reading
/// `seen` in the epoch tagged `tag`; `marked`: within its cheap frames but
/// sent to its window by a mark) under a rule with `cheap_frames`. Unless
/// the source is marked windowed in the sketch (or is that busy), the
/// frames the cheap tier admitted for it since the start of the last epoch
/// are still to be charged to its window: at most the frames counted
/// before this one (`limit` takes at most the rule's cheap frames of
/// them); the source is marked windowed, so that its next frames charge
/// nothing again, and only the CPU whose compare-and-swap sets the mark
/// charges (two CPUs leaving the cheap tier at once would charge twice).
/// Returns what to charge. Not marked: a source whose first frame this is
/// (one of a spoofed flood; nothing to charge), and any source of a rule
/// without cheap frames (nothing was admitted uncounted): their marks
/// would only make their neighbours in the sketch look windowed. A mark
/// of the last epoch is carried into this one, or the next epoch would
/// read this one's frames as the cheap tier's.
#[inline(always)]
fn leave_cheap_tier(
    place: sketch::Place,
    tag: u64,
    seen: sketch::Seen,
    marked: bool,
    cheap_frames: u8,
) -> u32 {
    let count = seen.total();
    if !seen.windowed() {
        if cheap_frames != 0 && (count > 1 || marked) && shared::sketch_mark(place, tag) {
            return count - 1;
        }
    } else if seen.previous >= sketch::WINDOWED && seen.current < sketch::WINDOWED {
        shared::sketch_mark(place, tag);
    }
    0
}

/// What the cheap tier knows of a frame that left it: what its source
/// reads in the sketch (this frame included), and what the window must
/// be charged (`leave_cheap_tier`).
#[derive(Clone, Copy)]
struct Past {
    seen: sketch::Seen,
    unwindowed: u32,
}

/// A frame of a limited source without per-CPU state (the exact tier),
/// judged on its shared window alone: through [`limit`] like a hot
/// source's, but with this CPU's seed as its per-CPU state, no lease, and
/// a window created (if need be) carrying what the cheap tier admitted for
/// it this epoch. Refused, near its limit (its window half used), or busy
/// (`count` over `sketch::HOT_FRAMES`), the source keeps that state: the
/// seed becomes its `SOURCES` entry.
#[inline(always)]
fn exact(
    config: &Config,
    key: &SourceKey,
    rule: &Rule,
    index: u32,
    past: Past,
    now: u64,
    len: u64,
) -> Tiered {
    let count = past.seen.total();
    let dry_run = rule.is_dry_run(config.dry_run());
    // The rule's levels first (a source without per-CPU state is light).
    if let Some(refused) = refused_by_level(rule, index, dry_run, false) {
        return Tiered::Judged(refused);
    }
    let flags = (u32::from(dry_run) * LIMIT_DRY_RUN) | LIMIT_EXACT_TIER;
    let judged = scratch::seeded(scratch::ExactState, |state: &mut SourceTraffic| {
        // This frame, counted as the source's per-CPU state would count it.
        state.count_first(now, len);
        state.rule = index;
        state.generation = config.generation;
        // What the cheap tier admitted and the window must still count
        // (`limit` takes at most the rule's cheap frames of it).
        state.carried = past.unwindowed;
        let answer = limit(key, &mut *state, len, flags);
        let admitted = answer & LIMIT_ADMITTED != 0;
        if !admitted && !dry_run {
            note_penalty(config, key, rule, state.hold_until_ns, now);
        }
        // Busy: this epoch's count alone (a mark is not frames).
        let busy = past.seen.current > sketch::HOT_FRAMES;
        let mut promoted = false;
        if !admitted || answer & LIMIT_HALF_USED != 0 || busy {
            // Its frames this second, as the cheap tier counted them (at
            // least what it sent; more only if other sources share its
            // counters): what `top` shows of the second it became hot in.
            let seen = Counter {
                packets: u64::from(count),
                bytes: u64::from(count) * len,
            };
            state.current = seen;
            state.total = seen;
            state.carried = 0;
            state.touched_ns = now;
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
        give_back_to_levels(rule, index);
        refuse(index, dry_run, Outcome::DroppedLimit)
    };
    if promoted {
        if let Some(traffic) = SOURCES.get_ptr_mut(key) {
            return Tiered::Promoted(traffic, verdict);
        }
    }
    Tiered::Judged(verdict)
}

/// After `limit` refused a source of `rule`: if a penalty holds it now
/// (armed just now, or found in its window), marks its penalty cell until
/// the penalty ends, so that the cheap tier never admits its frames, even
/// once it has been silent long enough to leave the sketch.
#[inline(always)]
pub(super) fn note_penalty(
    config: &Config,
    key: &SourceKey,
    rule: &Rule,
    hold_until_ns: u64,
    now: u64,
) {
    if rule.block_ns != 0 && hold_until_ns > now {
        let at = hashed_budget_place(config, key, rule);
        shared::mark_penalty(sketch::mark_cell(at, sketch::PENALTY_CELLS), hold_until_ns);
    }
}
