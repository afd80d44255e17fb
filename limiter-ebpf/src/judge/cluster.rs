//! A cluster-scoped rule in the kernel: the packet allowance its window is
//! held to (its share, the cold cap or the fallback cap), and the report
//! that tells the daemon's sync a source is hot. docs/architecture.md,
//! "Cluster scope in the kernel", has the design.

use limiter_common::{ClusterState, Rule, SourceKey};

use crate::{
    maps::{self, CLUSTER_SHARES},
    shared::SharedWindow,
};

/// The packet allowance a cluster-scoped source's window (keyed `wkey`)
/// is held to now: `ClusterState::effective_allowance`, with the source's
/// share looked up only while the cluster state is fresh.
#[inline(always)]
pub(super) fn allowance(state: &ClusterState, wkey: &SourceKey, rule: &Rule, now: u64) -> u64 {
    state.effective_allowance(rule.allowance_packets, now, || {
        let share = CLUSTER_SHARES.get_ptr(wkey)?;
        // SAFETY: a live map value; the daemon replaces a share as a
        // whole element (a hash map update swaps in a new element), so
        // the copy is one share's.
        Some(unsafe { *share })
    })
}

/// Tells the daemon that the cluster-scoped source whose window is
/// `window` (keyed `wkey`) is hot under rule `index`, once per window
/// length whichever CPU finds it so, within the CPU's budget of reports.
/// A report the budget (or a full ring) drops gives its claim back, so the
/// source's next frame that finds it hot reports it.
#[inline(always)]
pub(super) fn report_hot(
    window: &SharedWindow,
    wkey: &SourceKey,
    rule: &Rule,
    index: u32,
    now: u64,
) {
    if window.claim_hot_report(now, rule.bucket_ns * u64::from(rule.buckets))
        && !maps::send_cluster_hot(wkey, index, now)
    {
        window.release_hot_report(now);
    }
}
