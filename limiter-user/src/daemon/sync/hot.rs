//! Where the hot listing stands: the next slice of the hot set's groups
//! to list ([`hot_slice`]) and the sources of other nodes left out by
//! `cluster.max_remote_sources`, logged once in a while.

use std::{
    ops::Range,
    time::{Duration, Instant},
};

use tracing::warn;

use crate::{cluster::store::GROUPS, daemon::metrics::ClusterMetrics};

/// How often at most the sources left out by `cluster.max_remote_sources`
/// are logged (one line with their count, not one per source).
const REMOTE_LOG_EVERY: Duration = Duration::from_secs(60);

/// The hot listing's cursor and its log of sources left out.
#[derive(Debug, Default)]
pub(super) struct HotCursor {
    /// The first hot-set group the next tick lists.
    cursor: u16,
    /// Hot sources of other nodes left out by the bound since the last
    /// log line about them, and when that line was.
    left_out: u64,
    logged: Option<Instant>,
}

impl HotCursor {
    /// The groups this tick lists; the cursor moves past them.
    pub(super) fn next_slice(&mut self, interval: Duration, window: Duration) -> Range<u16> {
        let slice = hot_slice(self.cursor, interval, window);
        self.cursor = slice.end % GROUPS;
        slice
    }

    /// `slice` was not listed: the next tick lists it.
    pub(super) fn retry(&mut self, slice: Range<u16>) {
        self.cursor = slice.start;
    }

    /// Counts hot sources of other nodes left out by the bound `limit`,
    /// and logs them once per [`REMOTE_LOG_EVERY`] (the first at once),
    /// not once per source or listing.
    pub(super) fn left_out(
        &mut self,
        count: u64,
        now: Instant,
        limit: usize,
        metrics: &ClusterMetrics,
    ) {
        if count == 0 {
            return;
        }
        metrics.remote_sources_over_limit.inc_by(count);
        self.left_out += count;
        if self
            .logged
            .is_none_or(|at| now.duration_since(at) >= REMOTE_LOG_EVERY)
        {
            warn!(left_out = self.left_out, limit, every = ?REMOTE_LOG_EVERY,
                "cluster: sources hot on other nodes not tracked here (cluster.max_remote_sources reached); on this node they stay at the cold cap until they are hot here");
            self.left_out = 0;
            self.logged = Some(now);
        }
    }
}

/// The hot-set groups a tick starting at group `cursor` lists: a slice
/// sized so that, at one tick per `interval`, every group is listed once
/// per `window` (all of them when the window is a tick or less). One reply
/// then carries about `interval / window` of the hot set, so a large hot
/// set is read in replies a tick can take, not in one that outlasts every
/// tick.
fn hot_slice(cursor: u16, interval: Duration, window: Duration) -> Range<u16> {
    let ticks = (window.as_nanos() / interval.as_nanos().max(1)).clamp(1, u128::from(GROUPS));
    let size = GROUPS.div_ceil(ticks as u16);
    let start = cursor % GROUPS;
    start..(start + size).min(GROUPS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_group_is_listed_once_per_window_in_slices_of_a_tick() {
        let t = Duration::from_millis(100);
        for (window, ticks) in [
            (Duration::from_secs(1), 10),
            (Duration::from_millis(250), 2),
            (Duration::from_secs(60), 256),
            (Duration::from_millis(100), 1),
            (Duration::from_millis(50), 1),
        ] {
            // From the first group, the slices cover every group once in
            // `ticks` ticks (the last slice shorter), then start over.
            let mut listed = vec![0u32; usize::from(GROUPS)];
            let (mut cursor, mut count, mut largest) = (0, 0, 0);
            while count == 0 || cursor != 0 {
                let slice = hot_slice(cursor, t, window);
                assert!(!slice.is_empty() && slice.end <= GROUPS, "{slice:?}");
                largest = largest.max(slice.len());
                for g in slice.clone() {
                    listed[usize::from(g)] += 1;
                }
                cursor = slice.end % GROUPS;
                count += 1;
                assert!(count <= ticks, "{window:?}: over {ticks} ticks");
            }
            assert_eq!(count, ticks, "{window:?}");
            assert!(listed.iter().all(|&n| n == 1), "{window:?}: {listed:?}");
            assert_eq!(largest, usize::from(GROUPS.div_ceil(ticks as u16)));
        }
        // A cursor past the last group (never kept, but cheap) wraps.
        assert_eq!(hot_slice(GROUPS, t, Duration::from_secs(1)), 0..26);
    }
}
