//! What becomes of a frame: its verdict, the verdict of a frame whose
//! source could get no state, and what a refusal is counted as: its
//! rule's drops, and a hot source's dropped traffic and "source limited"
//! event.

use aya_ebpf::bindings::xdp_action::{XDP_DROP, XDP_PASS};
use limiter_common::{
    event::EPISODE_GAP_NS, Config, LimitEvent, Outcome, Rule, SourceKey, SourceTraffic,
};

use super::{
    key::resolve,
    level::{levels, LEVEL_AGGREGATES_ONLY, LEVEL_GIVE_BACK, LEVEL_HEAVY},
};
use crate::maps::{self, RULES};

/// What to do with a frame and what to count it as.
pub struct Verdict {
    pub action: u32,
    pub outcome: Outcome,
    /// Which limit refused the frame: 0 its source's own, else 1 + the
    /// index of its rule's level (`LimitEvent::level`).
    pub level: u8,
}

impl Verdict {
    /// Dropped, or would have been (dry-run).
    #[inline(always)]
    fn refused(&self) -> bool {
        self.outcome != Outcome::Passed && self.outcome != Outcome::Allowed
    }
}

pub(super) const fn pass(outcome: Outcome) -> Verdict {
    Verdict {
        action: XDP_PASS,
        outcome,
        level: 0,
    }
}

/// A frame that rule `rule` refuses: dropped, or only counted in dry-run,
/// and counted against the rule either way: every per-rule drop is
/// counted here ([`NO_RULE`](limiter_common::rules::NO_RULE): against
/// none).
#[inline(always)]
pub(super) fn refuse(rule: u32, dry_run: bool, outcome: Outcome) -> Verdict {
    maps::count_rule_drop(rule);
    if dry_run {
        pass(Outcome::DryRunWouldDrop)
    } else {
        Verdict {
            action: XDP_DROP,
            outcome,
            level: 0,
        }
    }
}

/// The refusal of a frame at `now` by one of rule `index`'s levels
/// (`heavy`: from a source over the rule's fair share; `cheap`: a
/// cheap-tier frame, which only the aggregates judge), counted under that
/// level; `None` when every
/// level admits it, or the rule has none (one byte test). Judged before
/// the source's own window, so that a frame a level refuses never uses up
/// the source's own allowance.
#[inline(always)]
pub(super) fn refused_by_level(
    rule: &Rule,
    index: u32,
    dry_run: bool,
    heavy: bool,
    cheap: bool,
    now: u64,
) -> Option<Verdict> {
    if rule.level_count() == 0 {
        return None;
    }
    let flags = (u32::from(heavy) * LEVEL_HEAVY) | (u32::from(cheap) * LEVEL_AGGREGATES_ONLY);
    match levels(index, flags, now) {
        0 => None,
        refused_by => {
            maps::count_level_drop(index, refused_by - 1);
            let mut refused = refuse(index, dry_run, Outcome::DroppedLimit);
            refused.level = refused_by as u8;
            Some(refused)
        }
    }
}

/// After the source's own window refused a frame every level of rule
/// `index` admitted: the levels give it back. Only on that refusal, never
/// on the held path (a held source's frames reach no level).
#[inline(always)]
pub(super) fn give_back_to_levels(rule: &Rule, index: u32, now: u64) {
    if rule.level_count() != 0 {
        levels(index, LEVEL_GIVE_BACK, now);
    }
}

/// A frame whose source could get no state: allow and deny still apply; a
/// limit fails closed (`Rule::stateless_outcome`, host-tested). Not
/// counted against the rule.
#[inline(always)]
pub(super) fn stateless(config: &Config, key: &SourceKey) -> Verdict {
    let Some(rule) = RULES.get(resolve(key, config.generation)) else {
        return pass(Outcome::Passed);
    };
    match rule.stateless_outcome(config.dry_run()) {
        outcome @ (Outcome::DroppedDeny | Outcome::DroppedLimit) => Verdict {
            action: XDP_DROP,
            outcome,
            level: 0,
        },
        outcome => pass(outcome),
    }
}

/// Counts a hot source's refused frame of `len` bytes in its dropped
/// traffic, and tells the daemon when a new episode of refusals starts.
#[inline(always)]
pub(super) fn account(
    verdict: &Verdict,
    key: &SourceKey,
    traffic: &mut SourceTraffic,
    now: u64,
    len: u64,
) {
    if !verdict.refused() {
        return;
    }
    traffic.dropped.add(len);
    if now.wrapping_sub(traffic.last_refused_ns) > EPISODE_GAP_NS || traffic.last_refused_ns == 0 {
        let dry_run = verdict.outcome == Outcome::DryRunWouldDrop;
        let event = LimitEvent::new(*key, traffic.rule, now, dry_run).with_level(verdict.level);
        maps::send_event(&event, now);
    }
    traffic.last_refused_ns = now;
}
