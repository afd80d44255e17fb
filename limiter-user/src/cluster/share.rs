//! The arithmetic of cluster-scoped limits, with no I/O so it is tested on
//! the host: how much of a source's cluster-wide limit `L` this node may
//! admit in the current window, the caps used before a first sync and when
//! Redis or the daemon is gone, and the documented error bound.
//!
//! Every count here is "packets in the current sliding window" for one
//! source and rule: an *allowance* is a total for the window on this node
//! (what this node already admitted plus what it may still admit), which the
//! kernel compares with its own window count.
//!
//! # The node allowance
//!
//! With the cluster totals read back from Redis in one atomic script call
//! (`A` admitted and `O` offered cluster-wide over the window, `a` and `o`
//! this node's part of them):
//!
//! ```text
//! headroom = max(L - A, 0)
//! allow    = a + floor(headroom * o / O)        (O > 0)
//! allow    = a + floor(headroom / N)            (O = 0, N nodes alive)
//! ```
//!
//! Each node gets the share of the remaining headroom that its own offered
//! traffic is of the cluster's, so when every node computes from the same
//! totals the allowances add up to `A + headroom = max(L, A)`: the cluster
//! admits at most `L` more than nothing, instead of every node spending the
//! whole headroom (which would admit up to `N x headroom`). Flooring each
//! share keeps the sum at or below that, at the price of at most one packet
//! per node. A node that offered nothing this window gets no share: the
//! frames it refuses are still counted as offered, so its share appears at
//! the next sync (one sync interval later).

use std::time::Duration;

/// What a node applies to cluster-scoped sources once it is degraded
/// (Redis unreachable past the grace period) or its daemon stopped
/// refreshing the kernel's cluster state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// `L / nodes alive`: the cluster as a whole stays within about `L`
    /// (strict; the default).
    Split,
    /// `L` on every node: availability first, the cluster may admit up to
    /// `N x L`.
    Local,
}

/// This node's allowance for the current window (see the module doc):
/// `own_admitted` plus its share of the headroom `limit - cluster_admitted`
/// in proportion to its offered traffic. `nodes_alive` only matters when
/// nobody offered anything yet (the headroom is then split evenly); 0 is
/// taken as 1 (this node is alive).
///
/// Inconsistent inputs (own counts above the cluster's, admitted above
/// offered) cannot come from one script call; they are clamped rather than
/// allowed to inflate the allowance.
pub fn node_allowance(
    limit: u64,
    cluster_admitted: u64,
    cluster_offered: u64,
    own_admitted: u64,
    own_offered: u64,
    nodes_alive: u32,
) -> u64 {
    let own_admitted = own_admitted.min(cluster_admitted);
    let headroom = limit.saturating_sub(cluster_admitted);
    let share = if cluster_offered == 0 {
        headroom / u64::from(nodes_alive.max(1))
    } else {
        let own_offered = own_offered.min(cluster_offered);
        // u128: headroom x offered overflows u64 for large counts.
        (u128::from(headroom) * u128::from(own_offered) / u128::from(cluster_offered)) as u64
    };
    own_admitted.saturating_add(share)
}

/// The cap on a cluster-scoped source this node has no allowance for yet
/// (not synced): `L / nodes alive`, rounded down so that N nodes admit at
/// most `L` together before the first sync. 0 nodes is taken as 1.
pub fn cold_cap(limit: u64, nodes_alive: u32) -> u64 {
    limit / u64::from(nodes_alive.max(1))
}

/// The cap once the fallback policy applies: `split` is the cold cap
/// (`L / nodes alive`), `local` is `L` on this node.
pub fn fallback_cap(policy: Fallback, limit: u64, nodes_alive: u32) -> u64 {
    match policy {
        Fallback::Split => cold_cap(limit, nodes_alive),
        Fallback::Local => limit,
    }
}

/// The documented steady-state bound on cluster-wide over-admission per
/// window: `L x (delta / W) x (1 - 1/N)`, where `delta` is how stale a
/// node's view of the other nodes can be (the sync interval plus a Redis
/// round trip) and `W` the window.
///
/// Why: between two syncs each node admits against totals up to `delta`
/// old. The admissions it cannot see are the other nodes' (its own are
/// counted locally), at most a fraction `delta / W` of a window that holds
/// `L`, and the other nodes carry a fraction `1 - 1/N` of an evenly spread
/// source. The bound tends to `L x delta / W` as `N` grows: it does not grow
/// with the number of nodes. 0 nodes is taken as 1 (no error).
pub fn error_bound(limit: u64, delta: Duration, window: Duration, nodes: u32) -> f64 {
    if window.is_zero() {
        return limit as f64;
    }
    let nodes = f64::from(nodes.max(1));
    let stale = (delta.as_secs_f64() / window.as_secs_f64()).min(1.0);
    limit as f64 * stale * (1.0 - 1.0 / nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_lone_sender_gets_the_whole_headroom() {
        // One node offered everything: it may reach L.
        assert_eq!(node_allowance(1000, 400, 900, 400, 900, 3), 1000);
    }

    #[test]
    fn headroom_is_shared_by_offered_traffic() {
        // L = 1000, 600 admitted (300 + 200 + 100); offered 80/15/5.
        let (l, a, o) = (1000, 600, 2000);
        let nodes = [(300, 1600), (200, 300), (100, 100)];
        let allow: Vec<u64> = nodes
            .iter()
            .map(|&(own_a, own_o)| node_allowance(l, a, o, own_a, own_o, 3))
            .collect();
        assert_eq!(allow, vec![300 + 320, 200 + 60, 100 + 20]);
        assert_eq!(allow.iter().sum::<u64>(), 1000);
    }

    #[test]
    fn nobody_offered_yet_splits_the_headroom_evenly() {
        assert_eq!(node_allowance(1000, 0, 0, 0, 0, 4), 250);
        // 0 nodes alive is this node alone.
        assert_eq!(node_allowance(1000, 0, 0, 0, 0, 0), 1000);
    }

    #[test]
    fn a_node_that_offered_nothing_gets_no_share() {
        assert_eq!(node_allowance(1000, 500, 800, 0, 0, 2), 0);
    }

    #[test]
    fn exhausted_headroom_admits_nothing_more() {
        // Over the limit already: each node keeps what it admitted.
        assert_eq!(node_allowance(1000, 1200, 3000, 700, 1500, 2), 700);
        assert_eq!(node_allowance(1000, 1000, 3000, 500, 1500, 2), 500);
    }

    #[test]
    fn rounding_is_down() {
        // headroom 10 over 3 equal senders: 3 each, 9 in total, never 12.
        let allow: Vec<u64> = (0..3).map(|_| node_allowance(10, 0, 3, 0, 1, 3)).collect();
        assert_eq!(allow, vec![3, 3, 3]);
    }

    #[test]
    fn inconsistent_inputs_cannot_inflate_the_allowance() {
        // Own offered above the cluster's: share capped at the headroom.
        assert_eq!(node_allowance(1000, 0, 10, 0, 50, 1), 1000);
        // Own admitted above the cluster's: clamped to the cluster's.
        assert_eq!(node_allowance(1000, 100, 200, 500, 200, 1), 1000);
    }

    #[test]
    fn huge_counts_do_not_overflow() {
        let big = u64::MAX / 2;
        assert_eq!(node_allowance(u64::MAX, 0, big, 0, big, 1), u64::MAX);
    }

    #[test]
    fn cold_and_fallback_caps() {
        assert_eq!(cold_cap(1000, 3), 333);
        assert_eq!(cold_cap(1000, 0), 1000);
        assert_eq!(cold_cap(2, 3), 0);
        assert_eq!(fallback_cap(Fallback::Split, 1000, 4), 250);
        assert_eq!(fallback_cap(Fallback::Local, 1000, 4), 1000);
        assert_eq!(fallback_cap(Fallback::Local, 1000, 0), 1000);
    }

    #[test]
    fn error_bound_formula() {
        let w = Duration::from_secs(1);
        let d = Duration::from_millis(100);
        // One node sees everything it admits: no error.
        assert_eq!(error_bound(1000, d, w, 1), 0.0);
        assert!((error_bound(1000, d, w, 2) - 50.0).abs() < 1e-9);
        assert!((error_bound(1000, d, w, 3) - 1000.0 * 0.1 * (2.0 / 3.0)).abs() < 1e-9);
        // Bounded by L x delta / W whatever N.
        assert!(error_bound(1000, d, w, 1_000_000) < 100.0);
        assert!(error_bound(1000, d, w, 1_000_000) > 99.9);
        // Staleness beyond a window cannot cost more than a window.
        assert!((error_bound(1000, Duration::from_secs(5), w, 2) - 500.0).abs() < 1e-9);
        assert_eq!(error_bound(1000, d, Duration::ZERO, 2), 1000.0);
    }

    proptest! {
        /// Nodes computing from the same totals never get more than
        /// max(L, cluster admitted) together, and (when offered traffic is
        /// there) lose at most one packet per node to rounding.
        #[test]
        fn allowances_over_nodes_sum_to_at_most_the_limit(
            limit in 0u64..1_000_000,
            nodes in prop::collection::vec((0u64..100_000, 0u64..100_000), 1..12),
        ) {
            // Per node (admitted, extra offered): offered >= admitted.
            let admitted: u64 = nodes.iter().map(|n| n.0).sum();
            let offered: u64 = nodes.iter().map(|n| n.0 + n.1).sum();
            let alive = nodes.len() as u32;
            let total: u64 = nodes
                .iter()
                .map(|&(a, extra)| node_allowance(limit, admitted, offered, a, a + extra, alive))
                .sum();
            prop_assert!(total <= limit.max(admitted), "{total} > max({limit}, {admitted})");
            if offered > 0 {
                let senders = nodes.iter().filter(|n| n.0 + n.1 > 0).count() as u64;
                prop_assert!(total + senders >= limit.max(admitted),
                    "{total} lost more than one packet per sending node");
            }
        }

        #[test]
        fn the_cold_cap_over_all_nodes_is_at_most_the_limit(limit in 0u64..10_000_000, alive in 1u32..200) {
            prop_assert!(cold_cap(limit, alive) * u64::from(alive) <= limit);
            prop_assert!(cold_cap(limit, alive) * u64::from(alive) + u64::from(alive) > limit);
        }
    }
}
