//! How a tick spends its interval ([`TickPlan`]) and how many sources it
//! reports ([`next_cap`]): the two bounds that keep a tick within `T`
//! whatever Redis serves.

use std::time::{Duration, Instant};

use crate::cluster::store::MAX_BATCH;

/// How much sooner than the tick's cut a sync gives up on the batches
/// Redis has not served, returning those it has (`Store::sync_partial`).
pub(super) const PARTIAL_MARGIN: Duration = Duration::from_millis(2);

/// How a tick starting at `started` spends its interval `T`: the
/// heartbeat and the syncs until `syncs_until`; then the kernel's maps and
/// the hot list's slice, which ends by `listing_until`; the rest is slack
/// for a late wake-up on a loaded machine, so a tick whose Redis hangs
/// still ends within `T` (a tick over `T` would cost the next one:
/// `MissedTickBehavior::Skip`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TickPlan {
    pub syncs_until: Instant,
    pub listing_until: Instant,
    /// A listing is skipped (its slice waits for the next tick) when less
    /// than this is left: a reply cut short would stay queued in Redis
    /// ahead of the next tick's heartbeat.
    pub listing_least: Duration,
}

impl TickPlan {
    /// Slack: a twentieth of `T` (at least 2 ms); writes and listing:
    /// another twentieth (at least 3 ms); at least a fiftieth (1 ms) for a
    /// listing. At `T` = 100 ms: syncs until 90 ms, listing until 95 ms.
    /// The syncs are not cut sooner to make room for the listing: with
    /// thousands of hot sources per node Redis needs most of the tick for
    /// them (docs/benchmarks.md), so every ms taken from them is sources
    /// synced in turns. A node whose syncs fill the tick lists the hot set
    /// in the ticks that leave time for it.
    pub(super) fn new(started: Instant, interval: Duration) -> Self {
        let slack = (interval / 20).max(Duration::from_millis(2));
        let after = (interval / 20).max(Duration::from_millis(3));
        let listing_until = started + interval.saturating_sub(slack);
        TickPlan {
            syncs_until: started + interval.saturating_sub(slack + after),
            listing_until,
            listing_least: (interval / 50).max(Duration::from_millis(1)),
        }
    }
}

/// The next tick's cap on the sources it reports, from this tick's: a
/// partial tick (Redis served only part of the batches in time) caps the
/// next at 90% of what was served, so the calls Redis cannot serve are
/// not sent to queue in front of the next tick's (its heartbeat would time
/// out behind them); a tick that failed while sending more than a batch
/// halves the cap (an overload looks like that too; a Redis that is down
/// costs nothing more); a complete tick raises the cap by half when it
/// took under 60% of the interval, by a tenth under 90% (close to what
/// Redis serves, the cap creeps up and a partial tick brings it back),
/// and lifts it once it covers every tracked source. Never under one
/// batch, so a few sources are never capped.
pub(super) fn next_cap(
    cap: Option<usize>,
    sent: usize,
    synced: Option<usize>,
    partial: bool,
    took: Duration,
    interval: Duration,
    tracked: usize,
) -> Option<usize> {
    match synced {
        Some(count) if partial => Some((count * 9 / 10).max(MAX_BATCH)),
        None if sent > MAX_BATCH => Some((sent / 2).max(MAX_BATCH)),
        None => cap,
        Some(_) => match cap {
            Some(cap) if took < interval * 9 / 10 => {
                let grown = if took < interval * 6 / 10 {
                    cap + cap / 2
                } else {
                    cap + cap / 10 + 1
                };
                (grown < tracked).then_some(grown)
            }
            other => other,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_cuts_the_syncs_then_the_listing_and_keeps_slack() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        let plan = TickPlan::new(start, ms(100));
        assert_eq!(plan.syncs_until, start + ms(90));
        assert_eq!(plan.listing_until, start + ms(95));
        assert_eq!(plan.listing_least, ms(2));
        // Short intervals keep at least 2 ms of slack and 3 ms after the
        // syncs.
        let plan = TickPlan::new(start, ms(20));
        assert_eq!(plan.syncs_until, start + ms(15));
        assert_eq!(plan.listing_until, start + ms(18));
        assert_eq!(plan.listing_least, ms(1));
        // Never past the interval, however short.
        let plan = TickPlan::new(start, ms(3));
        assert_eq!(
            (plan.syncs_until, plan.listing_until),
            (start, start + ms(1))
        );
    }

    #[test]
    fn the_cap_follows_what_redis_served() {
        let t = Duration::from_millis(100);
        let fast = Duration::from_millis(20);
        // Uncapped and keeping up: stays uncapped.
        assert_eq!(next_cap(None, 5000, Some(5000), false, fast, t, 5000), None);
        // Partial: 90% of what was served.
        assert_eq!(
            next_cap(None, 10_000, Some(4000), true, t, t, 10_000),
            Some(3600)
        );
        // Fast ticks grow it by half, and lift it once it covers all.
        assert_eq!(
            next_cap(Some(3600), 3600, Some(3600), false, fast, t, 10_000),
            Some(5400)
        );
        assert_eq!(
            next_cap(Some(8000), 8000, Some(8000), false, fast, t, 10_000),
            None
        );
        // A complete tick close to the interval grows it by a tenth; one
        // that took the whole interval keeps it.
        let close = Duration::from_millis(80);
        assert_eq!(
            next_cap(Some(3600), 3600, Some(3600), false, close, t, 10_000),
            Some(3961)
        );
        assert_eq!(
            next_cap(Some(3600), 3600, Some(3600), false, t, t, 10_000),
            Some(3600)
        );
        // A failed tick that sent many halves it; one that sent few keeps it.
        assert_eq!(
            next_cap(None, 10_000, None, false, t, t, 10_000),
            Some(5000)
        );
        assert_eq!(next_cap(Some(300), 10, None, false, t, t, 10), Some(300));
        // Never under one batch.
        assert_eq!(next_cap(None, 100, Some(1), true, t, t, 100), Some(64));
        assert_eq!(next_cap(None, 100, None, false, t, t, 100), Some(64));
    }
}
