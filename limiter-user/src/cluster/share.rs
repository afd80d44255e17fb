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
//! # The node claim
//!
//! At every sync a node *claims* part of the room left in the source's
//! cluster-wide window ([`node_claim`]; `sync.lua` computes it inside
//! Redis, in the same atomic call that adds the node's deltas and reads
//! the totals): its part of the window by its share of the offered
//! traffic, less what it already holds in the window, within the room the
//! other nodes have not claimed (claimed and perhaps not reported yet). The kernel then admits at most the claim until the next sync (the
//! daemon writes the allowance as the kernel's own window count at the
//! next tick plus the claim). Claims are what keeps the error bound from
//! growing with the nodes: no two nodes hand out the same room, whatever
//! the order of their ticks (see [`error_bound`]).

use std::time::Duration;

/// What a node applies to cluster-scoped sources once it is degraded
/// (`split`: `L / nodes alive`; `local`: `L`): the `[cluster] fallback`
/// setting itself.
pub use crate::config::Fallback;

/// What this node may admit of a source until its next sync: its *claim*
/// on the room left in the cluster-wide window, as `sync.lua` computes it
/// inside Redis (this is the same arithmetic, for the host tests and the
/// documentation; `cluster_store.rs` checks the two agree on a real
/// server).
///
/// ```text
/// room  = max(L - ahead_admitted, 0)
/// fair  = max(floor(L x own_offered / claimers_offered) - own_ahead, 0)
///         (floor(room / nodes alive) while nothing was offered)
/// claim = min(fair, max(room - others_claimed, 0))
/// ```
///
/// `ahead_admitted` is what the cluster admitted in the buckets that are
/// still in the window at the node's next sync, and `own_ahead` this
/// node's part of it: room that leaves the window before then is handed
/// out now, or it would sit unused for a sync interval.
///
/// The fair part is the node's share of the whole window (`L` split by
/// offered) less what it already holds in it, not a share of the room:
/// the room includes the other nodes' unreported claims, so shares of it
/// count those claims twice, add up to more than the room, and the
/// `others_claimed` cap then hands the difference to whichever node ticks
/// first after room frees. With shares of the window each node takes back
/// what its own frames free, whatever the order of the ticks
/// (`the_order_of_the_ticks_does_not_decide_the_shares`).
///
/// `others_claimed` is what the other nodes claimed at their last sync and
/// may not have reported yet: leaving it out of the room is what keeps two
/// nodes from handing out the same room whatever the order of their
/// ticks, so claims never add up past the room (see the proptest) and no
/// pacing is needed to bound the error. `claimers_offered` is this node's
/// offered traffic over the window plus that of the other nodes with a
/// live claim (as of their last sync): a node that left stops diluting
/// the others' parts when its claim expires, not a window later when its
/// counts leave the window.
pub fn node_claim(
    limit: u64,
    ahead_admitted: u64,
    own_ahead: u64,
    claimers_offered: u64,
    own_offered: u64,
    nodes_alive: u32,
    others_claimed: u64,
) -> u64 {
    let room = limit.saturating_sub(ahead_admitted);
    let fair = if claimers_offered == 0 {
        room / u64::from(nodes_alive.max(1))
    } else {
        let own = own_offered.min(claimers_offered);
        let part = u128::from(limit) * u128::from(own) / u128::from(claimers_offered);
        (part as u64).saturating_sub(own_ahead)
    };
    fair.min(room.saturating_sub(others_claimed))
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
/// window: `L x (delta / W) x (1 - 1/N)`, where `delta` is the sync
/// interval plus a Redis round trip and `W` the window.
///
/// Why: claims never add up past the room ([`node_claim`]), so the only
/// room handed out twice is room that is not free yet. A sync hands out
/// the room of the frames that leave Redis's window before the next sync
/// (one interval ahead), and Redis's window is whole buckets of report
/// times, so a frame's room can be handed out up to `delta` before the
/// frame leaves the true sliding window: at most the frames admitted in a
/// `delta`-long part of the window, `L x delta / W` at the limit's rate.
/// A node's own frames cannot be replaced early on that node (its kernel
/// counts them in its own window until they fade), so only the part of
/// that room a node receives from the *other* nodes' frames counts, a
/// fraction `1 - 1/N` of an evenly spread source. The bound tends to
/// `L x delta / W` as `N` grows: it does not grow with the number of
/// nodes. 0 nodes is taken as 1 (no error).
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
    fn claims_split_the_room_by_offered_and_leave_others_claims_alone() {
        // L = 1000, 700 still in the window at the next sync (560, 105
        // and 35 of it each node's): room 300; offered 80/15/5, so the
        // parts of the window are 800, 150 and 50.
        assert_eq!(node_claim(1000, 700, 560, 2000, 1600, 3, 0), 240);
        assert_eq!(node_claim(1000, 700, 105, 2000, 300, 3, 240), 45);
        assert_eq!(node_claim(1000, 700, 35, 2000, 100, 3, 285), 15);
        // Others claimed past their fair part: only what is left.
        assert_eq!(node_claim(1000, 700, 560, 2000, 1600, 3, 250), 50);
        // Holding more than its part of the window already: nothing.
        assert_eq!(node_claim(1000, 900, 850, 2000, 1600, 3, 0), 0);
        // Nothing offered yet: split by the nodes alive.
        assert_eq!(node_claim(1000, 0, 0, 0, 0, 4, 0), 250);
        // Over the limit: nothing.
        assert_eq!(node_claim(1000, 1200, 1200, 10, 10, 1, 0), 0);
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

    /// Three nodes flooded 80/15/5 with a source at 5L, each ticking every
    /// bucket (T = W / 10, the defaults' ratio) at its own phase, each
    /// admitting its whole claim until its next tick, as `sync.lua` sees
    /// them: reports land in whole buckets of report time. Returns each
    /// node's admitted from the third second to the sixth.
    fn admitted_by_phase(phases: [u64; 3]) -> [u64; 3] {
        const L: u64 = 1000;
        const BUCKET: u64 = 100;
        const BUCKETS: u64 = 10;
        const HOLD: u64 = 3 * BUCKET;
        let offered_per_tick = [400u64, 75, 25];
        // (bucket, node, admitted, offered) of every report.
        let mut reports: Vec<(u64, usize, u64, u64)> = Vec::new();
        // (claim, made at, offered over the window then) per node.
        let mut claims: [Option<(u64, u64, u64)>; 3] = [None; 3];
        let mut admitted = [0u64; 3];
        let mut ticks: Vec<(u64, usize)> = (0..60u64)
            .flat_map(|k| (0..3).map(move |i| (phases[i] + k * BUCKET, i)))
            .collect();
        ticks.sort_unstable();
        for (now, i) in ticks {
            let spent = claims[i].map_or(0, |(c, _, _)| c.min(offered_per_tick[i]));
            if now >= 2000 {
                admitted[i] += spent;
            }
            let bucket = now / BUCKET;
            reports.push((bucket, i, spent, offered_per_tick[i]));
            let next_first = ((now + BUCKET) / BUCKET + 1).saturating_sub(BUCKETS);
            let in_window = |b: u64| b + BUCKETS > bucket;
            let ahead = |node: Option<usize>| -> u64 {
                reports
                    .iter()
                    .filter(|r| r.0 >= next_first && node.is_none_or(|n| n == r.1))
                    .map(|r| r.2)
                    .sum()
            };
            let own_offered: u64 = reports
                .iter()
                .filter(|r| r.1 == i && in_window(r.0))
                .map(|r| r.3)
                .sum();
            let live = |j: usize| claims[j].filter(|c| j != i && c.1 + HOLD > now);
            let others: u64 = (0..3).filter_map(live).map(|c| c.0).sum();
            let claimers_offered = own_offered + (0..3).filter_map(live).map(|c| c.2).sum::<u64>();
            let claim = node_claim(
                L,
                ahead(None),
                ahead(Some(i)),
                claimers_offered,
                own_offered,
                3,
                others,
            );
            claims[i] = Some((claim, now, own_offered));
        }
        admitted
    }

    #[test]
    fn the_order_of_the_ticks_does_not_decide_the_shares() {
        for phases in [
            [5, 38, 71],
            [5, 71, 38],
            [38, 5, 71],
            [38, 71, 5],
            [71, 5, 38],
            [71, 38, 5],
            [20, 21, 22],
            [22, 21, 20],
            [21, 20, 22],
            [50, 90, 10],
        ] {
            // 4 s at L per second split 80/15/5; claims round down, so a
            // node loses at most a packet a sync (40 syncs in 4 s).
            let admitted = admitted_by_phase(phases);
            for (node, (&got, want)) in admitted.iter().zip([3200u64, 600, 200]).enumerate() {
                assert!(
                    got.abs_diff(want) <= 40,
                    "phases {phases:?}: node {node} admitted {got}, its part is {want}: {admitted:?}"
                );
            }
        }
    }

    proptest! {
        /// Nodes claiming one after another, each seeing the others'
        /// claims, in any order and from any offered split, never claim
        /// more than the room together; and a node alone with the traffic
        /// gets all of it.
        #[test]
        fn claims_in_any_order_never_exceed_the_room(
            limit in 0u64..1_000_000,
            ahead in 0u64..1_200_000,
            own_ahead in 0u64..1_200_000,
            offered in prop::collection::vec(0u64..100_000, 1..12),
            order in prop::collection::vec(0usize..12, 1..40),
        ) {
            let total: u64 = offered.iter().sum();
            let alive = offered.len() as u32;
            let mut claims = vec![0u64; offered.len()];
            for i in order.into_iter().map(|i| i % offered.len()) {
                let others: u64 = claims.iter().sum::<u64>() - claims[i];
                let own = own_ahead.min(ahead);
                claims[i] = node_claim(limit, ahead, own, total, offered[i], alive, others);
                prop_assert!(claims.iter().sum::<u64>() <= limit.saturating_sub(ahead));
            }
            let room = limit.saturating_sub(ahead);
            prop_assert_eq!(node_claim(limit, ahead, ahead, 5, 5, alive, 0), room);
        }

        #[test]
        fn the_cold_cap_over_all_nodes_is_at_most_the_limit(limit in 0u64..10_000_000, alive in 1u32..200) {
            prop_assert!(cold_cap(limit, alive) * u64::from(alive) <= limit);
            prop_assert!(cold_cap(limit, alive) * u64::from(alive) + u64::from(alive) > limit);
        }
    }
}
