//! What becomes of a frame: its verdict, the verdict of a frame whose
//! source could get no state, and what a refusal is counted as (the
//! source's dropped traffic, its rule's drops, a "source limited" event).

use aya_ebpf::bindings::xdp_action::{XDP_DROP, XDP_PASS};
use limiter_common::{
    event::EPISODE_GAP_NS, Config, LimitEvent, Outcome, SourceKey, SourceTraffic,
};

use super::key::resolve;
use crate::maps::{self, RULES};

/// What to do with a frame and what to count it as.
pub struct Verdict {
    pub action: u32,
    pub outcome: Outcome,
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
    }
}

/// A frame that must go: dropped, or only counted in dry-run.
pub(super) const fn refuse(dry_run: bool, outcome: Outcome) -> Verdict {
    if dry_run {
        pass(Outcome::DryRunWouldDrop)
    } else {
        Verdict {
            action: XDP_DROP,
            outcome,
        }
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
        },
        outcome => pass(outcome),
    }
}

/// Counts a refused frame of `len` bytes: against rule `rule` (none for
/// [`NO_RULE`](limiter_common::rules::NO_RULE)) and, for a source with
/// per-CPU state, in its dropped traffic, telling the daemon when a new
/// episode of refusals starts. Every per-rule drop is counted here.
#[inline(always)]
pub(super) fn account(
    verdict: &Verdict,
    key: &SourceKey,
    rule: u32,
    traffic: Option<&mut SourceTraffic>,
    now: u64,
    len: u64,
) {
    if !verdict.refused() {
        return;
    }
    maps::count_rule_drop(rule);
    let Some(traffic) = traffic else {
        return;
    };
    traffic.dropped.add(len);
    if now.wrapping_sub(traffic.last_refused_ns) > EPISODE_GAP_NS || traffic.last_refused_ns == 0 {
        let dry_run = verdict.outcome == Outcome::DryRunWouldDrop;
        let event = LimitEvent::new(*key, rule, now, dry_run);
        maps::send_event(&event, now);
    }
    traffic.last_refused_ns = now;
}
