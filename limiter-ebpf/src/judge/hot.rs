//! A source with per-CPU state (`SOURCES`, hot): its offered traffic, its
//! rule cached under the generation it was resolved in, and what this CPU
//! concluded of it: refused until `hold_until_ns` without reading anything
//! shared, admitted from a lease, or sent to its shared window (`limit`).

use limiter_common::{window::WindowCache, Action, Config, Outcome, SourceKey, SourceTraffic};

use super::{
    key::resolve,
    scratch, tickets,
    verdict::{give_back_to_levels, pass, refuse, refused_by_level, Verdict},
    window::{find_window, limit, LIMIT_ADMITTED, LIMIT_DRY_RUN, LIMIT_WINDOWLESS},
    BPF_NOEXIST,
};
use crate::maps::{self, RULES, SOURCES};

/// Gives a source per-CPU state (or finds it), with its rule resolved
/// under the live generation and this CPU holding it until `hold` (0: not
/// held). Its shared window, if any, already counts what it was admitted.
#[inline(always)]
pub(super) fn promote(
    config: &Config,
    key: &SourceKey,
    index: u32,
    now: u64,
    len: u64,
    hold: u64,
) -> Option<*mut SourceTraffic> {
    let traffic = record_offered(key, now, len)?;
    // SAFETY: this CPU's slot of a per-CPU map value.
    let state = unsafe { &mut *traffic };
    state.rule = index;
    state.generation = config.generation;
    state.hold_until_ns = hold;
    Some(traffic)
}

/// Counts the frame in this CPU's `SOURCES` slot for `key`, creating it
/// if the source is new.
#[inline(always)]
pub(super) fn record_offered(key: &SourceKey, now: u64, len: u64) -> Option<*mut SourceTraffic> {
    if let Some(traffic) = SOURCES.get_ptr_mut(key) {
        // SAFETY: this CPU's slot of a per-CPU map value.
        unsafe { (*traffic).record_at(now, len) };
        return Some(traffic);
    }
    // The new value is built in a seed, not on the stack (it would take
    // 184 of the 512 bytes).
    let inserted = scratch::seeded(scratch::NewSource, |seed: &mut SourceTraffic| {
        seed.count_first(now, len);
        #[allow(clippy::needless_borrows_for_generic_args)]
        SOURCES.insert(key, &*seed, BPF_NOEXIST).is_ok()
    });
    match inserted {
        Some(true) => {
            maps::count(Outcome::NewSource, len);
            return SOURCES.get_ptr_mut(key);
        }
        Some(false) => {}
        None => {
            maps::count(Outcome::InsertFailure, len);
            return None;
        }
    }
    // Another CPU created it first: count in our slot of its entry.
    let Some(traffic) = SOURCES.get_ptr_mut(key) else {
        maps::count(Outcome::InsertFailure, len);
        return None;
    };
    // SAFETY: as above.
    unsafe { (*traffic).record_at(now, len) };
    Some(traffic)
}

/// The verdict for a hot source's frame: from its cached rule (resolved
/// again when the rule generation changed), its hold, its lease, or its
/// shared window (a source without one and without room for one is
/// judged in the exact tier from its next frame on: `proof`).
#[inline(always)]
pub(super) fn decide(
    config: &Config,
    key: &SourceKey,
    traffic: &mut SourceTraffic,
    now: u64,
    len: u64,
) -> Verdict {
    if traffic.generation != config.generation {
        // Rules changed (or first frame on this CPU): resolve once, and
        // forget what this CPU concluded under the old rule.
        traffic.rule = resolve(key, config.generation);
        traffic.generation = config.generation;
        traffic.hold_until_ns = 0;
        traffic.lease_left = 0;
        // Uncounted, with the cache of the bucket they came in (a rule
        // change: at most a lease's frames once).
        traffic.lease_owed = 0;
        traffic.window = WindowCache::default();
        // Heavy as its window found it at its last admission, whichever
        // CPU's (this state may be new: evicted by a churn, or never on
        // this CPU), not light by default.
        if let Some(rule) = RULES.get(traffic.rule) {
            if rule.fair_packets != 0 {
                let heavy = find_window(&key.with_class(rule.budget)).is_some_and(|w| w.heavy());
                traffic.heavy = u32::from(heavy);
            }
        }
    }
    let index = traffic.rule;
    let Some(rule) = RULES.get(index) else {
        return pass(Outcome::Passed);
    };
    let dry_run = rule.is_dry_run(config.dry_run());
    match rule.action() {
        Some(Action::Allow) => pass(Outcome::Allowed),
        Some(Action::Deny) => refuse(index, dry_run, Outcome::DroppedDeny),
        Some(Action::Limit) => {
            if now < traffic.hold_until_ns {
                return refuse(index, dry_run, Outcome::DroppedLimit);
            }
            // The rule's levels, before the source's own window (heavy as
            // its last admission found it).
            let heavy = traffic.heavy != 0;
            if let Some(refused) = refused_by_level(rule, index, dry_run, heavy, false, now) {
                return refused;
            }
            if traffic.lease_left != 0 && traffic.window.covers(now, rule.bucket_ns) {
                traffic.lease_left -= 1;
                traffic.lease_owed += 1;
                return pass(Outcome::Passed);
            }
            let answer = limit(key, traffic, len, u32::from(dry_run) * LIMIT_DRY_RUN, now);
            if answer & LIMIT_WINDOWLESS != 0 {
                // No window and no room (its window was freed idle while
                // this state lived on): an idle window freed now is a
                // ticket for its next frame, as in the exact tier.
                tickets::free_under_pressure(now);
            }
            if answer & LIMIT_ADMITTED != 0 {
                pass(Outcome::Passed)
            } else {
                give_back_to_levels(rule, index, now);
                // Refused, or no window state: fail closed.
                refuse(index, dry_run, Outcome::DroppedLimit)
            }
        }
        None => pass(Outcome::Passed),
    }
}
