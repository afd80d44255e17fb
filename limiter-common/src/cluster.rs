//! What the kernel needs to hold a cluster-scoped rule (`Scope::Cluster`)
//! to this node's part of a cluster-wide budget: the daemon's per-source
//! shares (`CLUSTER_SHARES`), the cluster state (`CLUSTER`), and the pure
//! decision of the allowance a frame is admitted against, host-tested here
//! and run unchanged by the kernel.
//!
//! The effective packet allowance of a cluster-scoped source, in order:
//! 1. the daemon has not refreshed [`ClusterState`] for longer than
//!    `stale_after_ns` (stalled or gone): the fallback cap,
//!    `allowance / fallback_divisor`, whatever shares exist (they may be
//!    stale too, and no one is left to correct them);
//! 2. the source has a [`ClusterShare`] that has not expired: the share,
//!    never more than the rule's own allowance;
//! 3. else (not synced yet, or its share expired): the cold cap,
//!    `allowance / cold_divisor`.
//!
//! A divisor of 0 means 1. Only the packet allowance is shared: a rule
//! without one (`window::UNLIMITED`) keeps it, and its byte allowance is
//! always per node. The divisions run only on the cold and fallback paths
//! (one `div` instruction each, next to the hash lookups these frames pay
//! anyway); a source with a live share costs none.
//!
//! Times are the kernel's monotonic clock (`CLOCK_MONOTONIC`, which the
//! coarse clock the program reads trails by at most a tick): a
//! `refreshed_ns` slightly ahead of the program's clock reads as fresh.

use crate::window::{MAX_PACKETS, UNLIMITED, WEIGHT_SHIFT};

/// Default capacity of `CLUSTER_SHARES`: cluster-scoped sources with a
/// share at once (the daemon writes shares only for hot sources).
pub const DEFAULT_MAX_CLUSTER_SOURCES: u32 = 65_536;

/// This node's allowance for one cluster-scoped source's current window,
/// written by the daemon into `CLUSTER_SHARES` under the source's window
/// key (the `SourceKey` with the rule's `budget` byte as its class, as
/// `WINDOWS` keys it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterShare {
    /// Packets this node may admit in the source's window.
    pub allowance_packets: u64,
    /// Until then (kernel monotonic ns) the share holds; after it the
    /// source is held to the cold cap until the daemon writes a new one.
    pub expires_ns: u64,
}

impl ClusterShare {
    /// The allowance this share gives at `now_ns` for a rule allowing
    /// `allowance` packets per window: never more than the rule's;
    /// `None` once expired.
    #[inline(always)]
    pub const fn allowance_at(&self, now_ns: u64, allowance: u64) -> Option<u64> {
        if self.expires_ns <= now_ns {
            None
        } else if self.allowance_packets < allowance {
            Some(self.allowance_packets)
        } else {
            Some(allowance)
        }
    }
}

/// The cluster state the daemon refreshes every sync (the single entry of
/// `CLUSTER`). All zero (never written) reads as stale with divisor 1: a
/// cluster-scoped rule on a node whose daemon never synced holds its
/// whole allowance locally.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterState {
    /// When the daemon last refreshed this (kernel monotonic ns).
    pub refreshed_ns: u64,
    /// Stale once the program's clock is more than this past
    /// `refreshed_ns` (the daemon sets 3 sync intervals).
    pub stale_after_ns: u64,
    /// The cold cap is `allowance / cold_divisor` (nodes alive; 0 means 1).
    pub cold_divisor: u32,
    /// The fallback cap is `allowance / fallback_divisor` (policy `split`:
    /// nodes alive; `local`: 1; 0 means 1).
    pub fallback_divisor: u32,
    /// A cluster-scoped source whose window on this node reaches this
    /// many thousandths of its effective allowance (or is refused) is
    /// reported once per window (`EventKind::ClusterHot`); 0: never,
    /// above 1000: as 1000.
    pub threshold_permille: u32,
    pub _pad: u32,
}

impl ClusterState {
    pub const fn new(
        refreshed_ns: u64,
        stale_after_ns: u64,
        cold_divisor: u32,
        fallback_divisor: u32,
        threshold_permille: u32,
    ) -> Self {
        Self {
            refreshed_ns,
            stale_after_ns,
            cold_divisor,
            fallback_divisor,
            threshold_permille,
            _pad: 0,
        }
    }

    /// Whether the daemon has not refreshed the state for longer than
    /// `stale_after_ns` at `now_ns` (a refresh ahead of `now_ns` is fresh).
    #[inline(always)]
    pub const fn is_stale(&self, now_ns: u64) -> bool {
        now_ns.saturating_sub(self.refreshed_ns) > self.stale_after_ns
    }

    /// `allowance / cold_divisor`: a source without a live share.
    #[inline(always)]
    pub const fn cold_cap(&self, allowance: u64) -> u64 {
        cap(allowance, self.cold_divisor)
    }

    /// Whether `frames` fit the cap of a source without a share at
    /// `now_ns` (the fallback cap while the state is stale, else the cold
    /// cap) under a rule allowing `allowance`: `frames * divisor <=
    /// allowance`, the cap's test without its division (for the cheap
    /// tier, which asks on every frame of a cluster rule).
    #[inline(always)]
    pub const fn within_cap(&self, frames: u64, allowance: u64, now_ns: u64) -> bool {
        let divisor = if self.is_stale(now_ns) {
            self.fallback_divisor
        } else {
            self.cold_divisor
        };
        let divisor = if divisor <= 1 { 1 } else { divisor as u64 };
        frames.saturating_mul(divisor) <= allowance
    }

    /// `allowance / fallback_divisor`: every source while the state is
    /// stale.
    #[inline(always)]
    pub const fn fallback_cap(&self, allowance: u64) -> u64 {
        cap(allowance, self.fallback_divisor)
    }

    /// The effective packet allowance at `now_ns` of a cluster-scoped
    /// source under a rule allowing `allowance` (see the module docs);
    /// `share` is asked only when the state is fresh (the kernel looks
    /// the share up only then).
    #[inline(always)]
    pub fn effective_allowance(
        &self,
        allowance: u64,
        now_ns: u64,
        share: impl FnOnce() -> Option<ClusterShare>,
    ) -> u64 {
        if allowance == UNLIMITED {
            return UNLIMITED;
        }
        if self.is_stale(now_ns) {
            return self.fallback_cap(allowance);
        }
        if let Some(share) = share() {
            if let Some(allowed) = share.allowance_at(now_ns, allowance) {
                return allowed;
            }
        }
        self.cold_cap(allowance)
    }

    /// Whether a window whose packet estimate (fixed point, as
    /// `window::Admission::Admitted` reports it) is `estimate` has reached
    /// the reporting threshold of `allowance`.
    #[inline(always)]
    pub const fn is_hot(&self, estimate: u64, allowance: u64) -> bool {
        if self.threshold_permille == 0 || allowance == UNLIMITED {
            return false;
        }
        let permille = if self.threshold_permille > 1000 {
            1000
        } else {
            self.threshold_permille as u64
        };
        // Both sides fit in 64 bits (no 128-bit multiply, which BPF
        // lacks): the allowance is clamped to what a window can count (30
        // bits), and an estimate above that count is past any threshold.
        let allowance = if allowance > MAX_PACKETS {
            MAX_PACKETS
        } else {
            allowance
        };
        if estimate > MAX_PACKETS << WEIGHT_SHIFT {
            return true;
        }
        estimate * 1000 >= (allowance * permille) << WEIGHT_SHIFT
    }
}

/// `allowance / divisor`, 0 meaning 1 (no division then).
#[inline(always)]
const fn cap(allowance: u64, divisor: u32) -> u64 {
    if divisor <= 1 {
        allowance
    } else {
        allowance / divisor as u64
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY (both): #[repr(C)] structs of integers with explicit padding
    // (the size tests below): every bit pattern is valid and there are no
    // uninitialised bytes.
    unsafe impl aya::Pod for super::ClusterShare {}
    unsafe impl aya::Pod for super::ClusterState {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::WEIGHT_ONE;

    const NOW: u64 = 10_000_000_000;

    fn fresh(cold: u32, fallback: u32) -> ClusterState {
        ClusterState::new(NOW - 50_000_000, 300_000_000, cold, fallback, 500)
    }

    fn share(allowance_packets: u64, expires_ns: u64) -> Option<ClusterShare> {
        Some(ClusterShare {
            allowance_packets,
            expires_ns,
        })
    }

    #[test]
    fn abi_sizes_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<ClusterShare>(), 16);
        assert_eq!(core::mem::size_of::<ClusterState>(), 8 + 8 + 4 * 4);
    }

    /// `within_cap` is `frames <= cap` for the cap a source without a
    /// share gets, fresh or stale, without dividing.
    #[test]
    fn within_cap_is_the_cap_without_a_share() {
        for (cold, fallback) in [(0, 0), (1, 1), (3, 2), (7, 1), (1000, 3)] {
            for state in [
                fresh(cold, fallback),
                ClusterState::new(1, 1, cold, fallback, 0),
            ] {
                for allowance in [0, 1, 10, 99, 100, 1000] {
                    let cap = state.effective_allowance(allowance, NOW, || None);
                    for frames in 0..=allowance + 2 {
                        assert_eq!(
                            state.within_cap(frames, allowance, NOW),
                            frames <= cap,
                            "{state:?} {allowance} {frames}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_live_share_is_the_allowance_never_above_the_rules() {
        let state = fresh(3, 3);
        assert_eq!(
            state.effective_allowance(1000, NOW, || share(400, NOW + 1)),
            400
        );
        assert_eq!(
            state.effective_allowance(1000, NOW, || share(0, NOW + 1)),
            0
        );
        assert_eq!(
            state.effective_allowance(1000, NOW, || share(5000, NOW + 1)),
            1000
        );
    }

    #[test]
    fn without_a_share_or_with_an_expired_one_the_cold_cap_holds() {
        let state = fresh(3, 1);
        assert_eq!(state.effective_allowance(1000, NOW, || None), 333);
        assert_eq!(
            state.effective_allowance(1000, NOW, || share(900, NOW)),
            333
        );
        assert_eq!(
            state.effective_allowance(1000, NOW, || share(900, NOW - 1)),
            333
        );
    }

    #[test]
    fn a_stale_state_applies_the_fallback_cap_and_ignores_shares() {
        let state = ClusterState::new(NOW - 301_000_000, 300_000_000, 3, 2, 500);
        assert!(state.is_stale(NOW));
        let asked = core::cell::Cell::new(false);
        let allowance = state.effective_allowance(1000, NOW, || {
            asked.set(true);
            share(900, NOW + 1)
        });
        assert_eq!(allowance, 500);
        assert!(!asked.get(), "a stale state never looks at shares");
        // Policy local: the whole allowance on this node.
        let local = ClusterState {
            fallback_divisor: 1,
            ..state
        };
        assert_eq!(local.effective_allowance(1000, NOW, || None), 1000);
    }

    #[test]
    fn staleness_is_strictly_past_the_limit_and_a_refresh_ahead_is_fresh() {
        let state = ClusterState::new(NOW, 300, 1, 1, 0);
        assert!(!state.is_stale(NOW + 300));
        assert!(state.is_stale(NOW + 301));
        assert!(!state.is_stale(NOW - 5), "the coarse clock may trail");
    }

    #[test]
    fn a_never_written_state_is_stale_with_the_whole_allowance() {
        let state = ClusterState::default();
        assert!(state.is_stale(NOW));
        assert_eq!(
            state.effective_allowance(1000, NOW, || share(1, NOW + 1)),
            1000
        );
    }

    #[test]
    fn divisor_zero_means_one_and_unlimited_stays_unlimited() {
        let state = fresh(0, 0);
        assert_eq!(state.cold_cap(1000), 1000);
        assert_eq!(state.fallback_cap(1000), 1000);
        assert_eq!(fresh(7, 7).cold_cap(6), 0, "a cap may be zero");
        assert_eq!(
            fresh(3, 3).effective_allowance(UNLIMITED, NOW, || share(1, NOW + 1)),
            UNLIMITED
        );
    }

    #[test]
    fn the_hot_threshold_is_a_share_of_the_effective_allowance() {
        let state = fresh(1, 1); // 500 permille
        assert!(!state.is_hot(49 * WEIGHT_ONE, 100));
        assert!(!state.is_hot(50 * WEIGHT_ONE - 1, 100));
        assert!(state.is_hot(50 * WEIGHT_ONE, 100));
        assert!(state.is_hot(0, 0), "an allowance of 0 is reached at once");
        assert!(!state.is_hot(u64::from(u32::MAX), UNLIMITED));
        let off = ClusterState {
            threshold_permille: 0,
            ..state
        };
        assert!(!off.is_hot(100 * WEIGHT_ONE, 100));
        let over = ClusterState {
            threshold_permille: 5000,
            ..state
        };
        assert!(!over.is_hot(99 * WEIGHT_ONE, 100));
        assert!(
            over.is_hot(100 * WEIGHT_ONE, 100),
            "above 1000 reads as 1000"
        );
        // No overflow at the largest allowance and permille.
        assert!(over.is_hot(MAX_PACKETS * WEIGHT_ONE, u64::MAX - 1));
    }
}
