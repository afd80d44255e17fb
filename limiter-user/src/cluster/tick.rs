//! The pure parts of the daemon's cluster sync tick (`daemon::sync`),
//! with no I/O so they are tested on the host: turning the kernel's
//! counters into per-sync deltas ([`AdmittedTracker`], [`OfferedTracker`]),
//! the degraded state machine ([`Health`]) and what the kernel is told in each
//! of its phases ([`share_expiry`], [`kernel_state`]).
//!
//! Deltas are formed against the previous reading on every tick, whether
//! the sync that carries them succeeds or not: a failed sync drops its
//! deltas, so after an outage nothing is replayed (a replay after a timeout
//! could count twice what Redis did receive, and an outage's counts would
//! land in one bucket long after they happened). Only a tick that failed
//! before sending anything hands its deltas to the next report, and only
//! while the node is not degraded (`daemon::sync`).

use std::time::{Duration, Instant};

use limiter_common::{
    window::{RING, WEIGHT_SHIFT},
    ClusterState,
};

use super::share::Fallback;

/// Bits of a packet word above the count and first offset: the bucket tag
/// (`limiter_common::window::slots`: 24-bit tag, 10-bit offset, 30-bit
/// count).
const TAG_SHIFT: u32 = 40;
const COUNT_MASK: u64 = (1 << 30) - 1;
const TAG_MASK: u64 = (1 << 24) - 1;

/// The kernel's window ring keeps one packet word per bucket slot, tagged
/// with its bucket; this turns successive readings of it into "frames
/// admitted since the last reading". A slot still tagged with the bucket
/// it held last time contributes its growth; a slot that moved on to a
/// newer bucket contributes its whole count. Exact as long as readings are
/// less than the ring's span apart (16 buckets, 1.6 s for 100 ms buckets:
/// many sync intervals).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdmittedTracker {
    last: Option<[u64; RING]>,
}

impl AdmittedTracker {
    /// Frames admitted since the previous call, from the packet words of
    /// the window's slots. On the first call only the buckets from
    /// `first_bucket` on count (the current window: older slots left the
    /// window before this node started syncing the source), with
    /// `first_bucket` the kernel's current bucket minus the rule's buckets
    /// per window plus one.
    pub fn advance(&mut self, words: &[u64; RING], first_bucket: u64) -> u64 {
        let mut delta = 0;
        for (slot, &word) in words.iter().enumerate() {
            let count = word & COUNT_MASK;
            let tag = word >> TAG_SHIFT;
            delta += match self.last {
                Some(last) => {
                    let before = last[slot];
                    if before >> TAG_SHIFT == tag && before & COUNT_MASK <= count {
                        count - (before & COUNT_MASK)
                    } else {
                        count
                    }
                }
                // Tags are 24 bits of the bucket number: compare modulo.
                None => {
                    let age = (first_bucket & TAG_MASK).wrapping_sub(tag) & TAG_MASK;
                    let in_window = age == 0 || age > TAG_MASK / 2;
                    if in_window {
                        count
                    } else {
                        0
                    }
                }
            };
        }
        self.last = Some(*words);
        delta
    }
}

/// Frames offered to this node for a source (admitted or refused), from
/// the sum over CPUs of its per-CPU total: the growth since the previous
/// reading. The first reading (or one after the entry was evicted and
/// re-created, so its total went down) counts what the current second
/// holds (`current`), never the entry's whole history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OfferedTracker {
    last_total: Option<u64>,
}

impl OfferedTracker {
    pub fn advance(&mut self, total: u64, current: u64) -> u64 {
        let delta = match self.last_total {
            Some(last) if last <= total => total - last,
            _ => current.min(total),
        };
        self.last_total = Some(total);
        delta
    }
}

/// Failed ticks in a row after which the node is degraded.
pub const DEGRADED_AFTER: u32 = 3;

/// Where the node stands with Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The last tick synced.
    Normal,
    /// 1 or 2 failed ticks in a row: not degraded yet; shares are kept.
    Failing,
    /// Degraded, within the grace period: the last shares are kept until
    /// `until`.
    Grace { until: Instant },
    /// Degraded past the grace period: the fallback policy applies.
    Fallback,
}

/// A change worth one log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Degraded,
    Recovered,
}

/// The degraded state machine: counts failed ticks in a row; the third
/// makes the node degraded (grace starts then), a success makes it
/// normal again.
#[derive(Clone, Debug, Default)]
pub struct Health {
    failures: u32,
    degraded_since: Option<Instant>,
    /// Failed ticks since the daemon started (a metric).
    pub failed_ticks: u64,
}

impl Health {
    pub fn success(&mut self) -> Option<Change> {
        self.failures = 0;
        self.degraded_since.take().map(|_| Change::Recovered)
    }

    pub fn failure(&mut self, now: Instant) -> Option<Change> {
        self.failures = self.failures.saturating_add(1);
        self.failed_ticks += 1;
        if self.failures >= DEGRADED_AFTER && self.degraded_since.is_none() {
            self.degraded_since = Some(now);
            return Some(Change::Degraded);
        }
        None
    }

    pub fn degraded(&self) -> bool {
        self.degraded_since.is_some()
    }

    pub fn phase(&self, now: Instant, grace: Duration) -> Phase {
        match self.degraded_since {
            None if self.failures == 0 => Phase::Normal,
            None => Phase::Failing,
            Some(since) if now < since + grace => Phase::Grace {
                until: since + grace,
            },
            Some(_) => Phase::Fallback,
        }
    }
}

/// How long a share written (or kept) at `now_ns` holds, or `None` when
/// shares must not be kept any more (the fallback applies).
///
/// Normally ten sync intervals: a share never needs to outlive the state
/// (a stale state, 3 intervals without a tick, ignores shares), and a life
/// of a few intervals would throw a source back to the cold cap (`L /
/// nodes`, a sharp drop for a node carrying most of a source) after one or
/// two slow or failed ticks. Ten, not three: a share kept unchanged (a
/// source not synced this tick) is rewritten only when it nears its
/// expiry (`daemon::sync::shares::share_due`), so a tick writes about a
/// ninth of the tracked sources' shares, not all. While failing, three
/// intervals, so shares outlive the failing ticks by little: a node
/// degraded with no grace period is in the fallback within 3 intervals.
/// Once degraded, never past the end of the grace period.
pub fn share_expiry(now_ns: u64, interval: Duration, phase: Phase, now: Instant) -> Option<u64> {
    let failing = 3 * interval;
    match phase {
        Phase::Normal => Some(now_ns + (10 * interval).as_nanos() as u64),
        Phase::Failing => Some(now_ns + failing.as_nanos() as u64),
        Phase::Grace { until } => {
            let left = until.saturating_duration_since(now).min(failing);
            Some(now_ns + left.as_nanos() as u64)
        }
        Phase::Fallback => None,
    }
}

/// The divisor the fallback policy applies (`split`: the nodes last known
/// alive; `local`: 1).
pub fn fallback_divisor(policy: Fallback, nodes_alive: u32) -> u32 {
    match policy {
        Fallback::Split => nodes_alive.max(1),
        Fallback::Local => 1,
    }
}

/// The cluster state written at the end of every tick, whatever its
/// outcome, so the kernel's own fallback only ever fires for a daemon that
/// stopped ticking: refreshed now, stale after three intervals, cold
/// divisor the nodes alive (the fallback's divisor once the fallback
/// applies, since shares are gone then and every source is "cold"),
/// threshold in thousandths.
pub fn kernel_state(
    now_ns: u64,
    interval: Duration,
    nodes_alive: u32,
    policy: Fallback,
    threshold: f64,
    phase: Phase,
) -> ClusterState {
    let fallback = fallback_divisor(policy, nodes_alive);
    let cold = match phase {
        Phase::Fallback => fallback,
        _ => nodes_alive.max(1),
    };
    let permille = (threshold * 1000.0).round().clamp(0.0, 1000.0) as u32;
    ClusterState::new(
        now_ns,
        (3 * interval).as_nanos() as u64,
        cold,
        fallback,
        permille,
    )
}

/// The bucket a kernel time falls in, for [`AdmittedTracker::advance`]'s
/// first reading.
pub fn first_bucket_of_window(now_ns: u64, bucket_ns: u64, buckets: u32) -> u64 {
    let bucket = now_ns / bucket_ns.max(1);
    bucket.saturating_sub(u64::from(buckets.max(1)) - 1)
}

/// The kernel's sliding-window estimate of a source (whole frames,
/// rounded down) at `at_ns` from its slots as they are now: what its
/// window will count at the next sync if nothing more is admitted.
///
/// The daemon writes a source's allowance as this plus the node's share
/// of the headroom. Not the estimate now plus the share: Redis's window
/// drops whole buckets at its edges (its headroom already includes what
/// is leaving), and the kernel's window fades its oldest bucket during
/// the next interval; an allowance on today's estimate would let the
/// kernel admit that fading part a second time. Nor Redis's view of this
/// node (an absolute allowance): the two windows' bucket edges differ
/// (kernel clock, Redis `TIME`). With the estimate at the next tick, the
/// kernel admits at most the share until then; it may admit less (by
/// what fades and Redis still counts), corrected at the next sync.
pub fn estimate_at(slots: &[[u64; 2]; RING], bucket_ns: u64, buckets: u32, at_ns: u64) -> u64 {
    use limiter_common::window::{self, WindowCache, WindowParams};
    let params = WindowParams {
        bucket_ns: bucket_ns.max(1),
        buckets: buckets.max(1),
        allowance_packets: window::UNLIMITED,
        allowance_bytes: window::UNLIMITED,
    };
    let cache = WindowCache::refresh(slots, &params, at_ns);
    let at = window::position(at_ns, params.bucket_ns);
    let slot = slots[window::slot_of(at.bucket)];
    let current = window::Estimate::current(slot[0], slot[1], at.bucket);
    whole(cache.estimate(cache.elapsed(at_ns), current).packets)
}

/// A node's claim split over its interfaces in proportion to what each was
/// offered since the last tick (rounded down, the remainder to the
/// interface offered the most), so the parts add up to the claim: a source
/// arriving on several interfaces of one node admits the node's claim,
/// not the claim on each. Nothing offered anywhere: an even split.
pub fn split_claim(claim: u64, offered: &[u64]) -> Vec<u64> {
    if offered.is_empty() {
        return Vec::new();
    }
    // u128: the offered counts of a long outage summed, times the claim.
    let total: u128 = offered.iter().map(|&o| u128::from(o)).sum();
    let mut parts: Vec<u64> = if total == 0 {
        vec![claim / offered.len() as u64; offered.len()]
    } else {
        offered
            .iter()
            .map(|&o| (u128::from(claim) * u128::from(o) / total) as u64)
            .collect()
    };
    let rest = claim - parts.iter().sum::<u64>();
    let busiest = (0..offered.len())
        .max_by_key(|&i| (offered[i], std::cmp::Reverse(i)))
        .unwrap_or(0);
    parts[busiest] += rest;
    parts
}

/// A packet estimate in whole frames (the window's fixed point).
pub fn whole(estimate: u64) -> u64 {
    estimate >> WEIGHT_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;
    use limiter_common::window::{pack_packets, slot_of};

    fn ring(entries: &[(u64, u64)]) -> [u64; RING] {
        let mut words = [0; RING];
        for &(bucket, count) in entries {
            words[slot_of(bucket)] = pack_packets(bucket, 5, count);
        }
        words
    }

    #[test]
    fn admitted_deltas_follow_growth_and_rotation_without_double_counting() {
        let mut t = AdmittedTracker::default();
        // First reading: buckets 91..=100 are the window (10 buckets);
        // bucket 85 left it and does not count.
        assert_eq!(t.advance(&ring(&[(85, 50), (99, 7), (100, 3)]), 91), 10);
        // Same buckets, 100 grew by 4: only the growth.
        assert_eq!(t.advance(&ring(&[(85, 50), (99, 7), (100, 7)]), 92), 4);
        // Bucket 102 started (new slot), 100 grew by 1.
        assert_eq!(
            t.advance(&ring(&[(85, 50), (99, 7), (100, 8), (102, 6)]), 92),
            7
        );
        // Nothing new: zero.
        assert_eq!(
            t.advance(&ring(&[(85, 50), (99, 7), (100, 8), (102, 6)]), 92),
            0
        );
        // Bucket 85's slot is reused by bucket 85 + 16 = 101: all of it.
        assert_eq!(
            t.advance(&ring(&[(101, 9), (99, 7), (100, 8), (102, 6)]), 93),
            9
        );
    }

    #[test]
    fn a_claim_is_split_over_interfaces_by_offered() {
        // One interface: all of it.
        assert_eq!(split_claim(100, &[7]), vec![100]);
        assert_eq!(split_claim(100, &[0]), vec![100]);
        // By offered; the remainder to the busiest.
        assert_eq!(split_claim(100, &[3, 1]), vec![75, 25]);
        assert_eq!(split_claim(10, &[1, 1, 1]), vec![4, 3, 3]);
        assert_eq!(split_claim(10, &[1, 5, 0]), vec![1, 9, 0]);
        // Nothing offered this tick: even.
        assert_eq!(split_claim(9, &[0, 0]), vec![5, 4]);
        assert!(split_claim(9, &[]).is_empty());
        for (claim, offered) in [(1000u64, vec![1u64, 2, 3, 4]), (7, vec![u64::MAX, 1])] {
            assert_eq!(split_claim(claim, &offered).iter().sum::<u64>(), claim);
        }
    }

    #[test]
    fn the_estimate_ahead_lets_old_buckets_fade() {
        let bucket_ns = 100_000_000;
        let mut slots = [[0u64; 2]; RING];
        for (bucket, count) in [(90u64, 100u64), (95, 10), (100, 5)] {
            slots[slot_of(bucket)][0] = pack_packets(bucket, 0, count);
        }
        // At the start of bucket 100 (10 buckets): 91..=100 in full, plus
        // bucket 90 weighted by what is left of it: all of it.
        let now = 100 * bucket_ns;
        assert_eq!(estimate_at(&slots, bucket_ns, 10, now), 115);
        // Half-way: half of bucket 90 has faded.
        assert_eq!(estimate_at(&slots, bucket_ns, 10, now + bucket_ns / 2), 65);
        // A bucket later: bucket 90 is gone entirely.
        assert_eq!(estimate_at(&slots, bucket_ns, 10, now + bucket_ns), 15);
    }

    #[test]
    fn admitted_first_reading_handles_tag_wrap() {
        let mut t = AdmittedTracker::default();
        let top = 1 << 24;
        // Buckets top - 1 and top (tag 0): both in a window starting at
        // top - 5.
        assert_eq!(t.advance(&ring(&[(top - 1, 2), (top, 3)]), top - 5), 5);
    }

    #[test]
    fn offered_deltas_never_replay_history() {
        let mut t = OfferedTracker::default();
        assert_eq!(t.advance(10_000, 120), 120, "first: the current second");
        assert_eq!(t.advance(10_500, 80), 500);
        assert_eq!(t.advance(10_500, 0), 0);
        // Evicted and re-created: counted from the new entry's second.
        assert_eq!(t.advance(40, 40), 40);
        assert_eq!(t.advance(90, 90), 50);
    }

    #[test]
    fn three_failures_degrade_one_success_recovers() {
        let grace = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut h = Health::default();
        assert_eq!(h.phase(t0, grace), Phase::Normal);
        assert_eq!(h.failure(t0), None);
        assert_eq!(h.phase(t0, grace), Phase::Failing);
        assert_eq!(h.failure(t0), None);
        assert!(!h.degraded());
        let t3 = t0 + Duration::from_millis(200);
        assert_eq!(h.failure(t3), Some(Change::Degraded));
        assert!(h.degraded());
        assert_eq!(h.failure(t3), None, "degraded once, logged once");
        assert_eq!(h.phase(t3, grace), Phase::Grace { until: t3 + grace });
        assert_eq!(h.phase(t3 + grace, grace), Phase::Fallback);
        assert_eq!(h.failed_ticks, 4);
        assert_eq!(h.success(), Some(Change::Recovered));
        assert_eq!(h.phase(t3 + grace, grace), Phase::Normal);
        assert_eq!(h.success(), None);
        // A success between failures resets the count.
        h.failure(t0);
        h.failure(t0);
        h.success();
        assert_eq!(h.failure(t0), None);
        assert!(!h.degraded());
    }

    #[test]
    fn shares_live_ten_intervals_three_while_failing_and_never_past_the_grace() {
        let t = Duration::from_millis(100);
        let now = Instant::now();
        let ns = 1_000_000_000;
        assert_eq!(
            share_expiry(ns, t, Phase::Normal, now),
            Some(ns + 1_000_000_000)
        );
        assert_eq!(
            share_expiry(ns, t, Phase::Failing, now),
            Some(ns + 300_000_000)
        );
        let until = now + Duration::from_millis(120);
        assert_eq!(
            share_expiry(ns, t, Phase::Grace { until }, now),
            Some(ns + 120_000_000),
            "capped at the end of the grace period"
        );
        let until = now + Duration::from_secs(5);
        assert_eq!(
            share_expiry(ns, t, Phase::Grace { until }, now),
            Some(ns + 300_000_000)
        );
        assert_eq!(share_expiry(ns, t, Phase::Fallback, now), None);
    }

    #[test]
    fn the_state_applies_the_policy_only_in_fallback_and_is_never_open() {
        let t = Duration::from_millis(100);
        let s = kernel_state(5, t, 3, Fallback::Split, 0.25, Phase::Normal);
        assert_eq!(s, ClusterState::new(5, 300_000_000, 3, 3, 250));
        let s = kernel_state(5, t, 3, Fallback::Local, 0.25, Phase::Normal);
        assert_eq!((s.cold_divisor, s.fallback_divisor), (3, 1));
        let s = kernel_state(5, t, 3, Fallback::Local, 0.25, Phase::Fallback);
        assert_eq!((s.cold_divisor, s.fallback_divisor), (1, 1));
        let s = kernel_state(5, t, 3, Fallback::Split, 0.25, Phase::Fallback);
        assert_eq!((s.cold_divisor, s.fallback_divisor), (3, 3));
        // Nodes unknown (0): this node alone, never a zero divisor.
        let s = kernel_state(5, t, 0, Fallback::Split, 2.0, Phase::Fallback);
        assert_eq!((s.cold_divisor, s.threshold_permille), (1, 1000));
    }
}
