//! The admission path the kernel runs: each CPU keeps a [`WindowCache`]
//! of a source's older buckets for the bucket it is in, so a frame's
//! estimate is two multiplications and the live current slot (no loop, no
//! division), and a refused frame yields the time until which this CPU can
//! refuse without looking (the hold). It decides as the reference path
//! (`reference::try_admit`) does; the property tests compare the two.

use super::{
    fits, position,
    ring::{give_back_bytes, reserve_bytes, OlderBuckets},
    slots::{bytes_in, packets_bumped_by, packets_in, slot_of},
    Estimate, Position, SlotRead, SlotWrite, WindowParams, BYTES, CAS_ATTEMPTS, MAX_BYTES,
    MAX_PACKETS, PACKETS, UNLIMITED, WEIGHT_ONE, WEIGHT_SHIFT,
};

/// Shift of [`WindowCache::inv_bucket`]: `2^42 / B`, so that
/// `(elapsed_ns * inv) >> 32` is the elapsed share in 1/1024 steps.
const INV_SHIFT: u32 = 42;

/// One CPU's precomputed view of a source's older buckets for the bucket
/// it is in, so the per-frame estimate needs no loop and no division:
/// `older + inside(e) * oldest_per_q + current`, with
/// `inside(e) = 1024 - max(first, e)`. Refreshed on the first frame of each
/// bucket (and whenever the bucket width changes). The older buckets no
/// longer change once the current one has begun (a frame that raced the
/// boundary on another CPU may still land in the previous bucket; such a
/// frame is missing from this CPU's cache until the next bucket).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowCache {
    /// The bucket this cache is for.
    pub bucket: u64,
    /// Its start (ns).
    pub start_ns: u64,
    /// The bucket width it was computed for; 0 = empty.
    pub bucket_ns: u64,
    /// `2^42 / bucket_ns`.
    pub inv_bucket: u64,
    /// Buckets `i-K+1 ..= i-1`, fixed point.
    pub older_packets: u64,
    pub older_bytes: u64,
    /// The oldest bucket's count per 1/1024 of its span, fixed point.
    pub oldest_packets_per_q: u64,
    pub oldest_bytes_per_q: u64,
    /// The oldest bucket's first offset (1/1024 of a bucket).
    pub oldest_first: u64,
}

/// The outcome of [`try_admit_cached`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Admitted, with `granted - 1` more frames leased to the caller for
    /// the rest of this bucket (counted as admitted already).
    Admitted {
        granted: u64,
        /// With this admission the window is at least half used (packets
        /// or bytes): the source is near its limit.
        half_used: bool,
        /// The window's packet estimate with this admission (the granted
        /// frames included), fixed point: what the cluster threshold is
        /// checked against (`ClusterState::is_hot`).
        packets: u64,
    },
    /// Refused; no frame can be admitted before `hold_until_ns`, so the
    /// caller may refuse until then without looking at the window.
    Refused { hold_until_ns: u64 },
}

impl WindowCache {
    /// Whether this cache describes the bucket `now_ns` is in, for buckets
    /// of `bucket_ns`.
    #[inline(always)]
    pub fn covers(&self, now_ns: u64, bucket_ns: u64) -> bool {
        self.bucket_ns == bucket_ns
            && bucket_ns != 0
            && now_ns.wrapping_sub(self.start_ns) < bucket_ns
    }

    /// Reads the older buckets for the bucket of `now_ns`.
    #[inline(always)]
    pub fn refresh<S: SlotRead + ?Sized>(slots: &S, params: &WindowParams, now_ns: u64) -> Self {
        let bucket_ns = if params.bucket_ns == 0 {
            1
        } else {
            params.bucket_ns
        };
        let at = position(now_ns, bucket_ns);
        let older = OlderBuckets::read(slots, at.bucket, params.buckets);
        // The oldest bucket's traffic lies in [first, 1) of it: its count
        // per 1/1024 of that span.
        let span = WEIGHT_ONE - older.oldest_first;
        WindowCache {
            bucket: at.bucket,
            start_ns: at.bucket * bucket_ns,
            bucket_ns,
            inv_bucket: (1u64 << INV_SHIFT) / bucket_ns,
            older_packets: older.full_packets << WEIGHT_SHIFT,
            older_bytes: older.full_bytes << WEIGHT_SHIFT,
            oldest_packets_per_q: (older.oldest_packets << WEIGHT_SHIFT) / span,
            oldest_bytes_per_q: (older.oldest_bytes << WEIGHT_SHIFT) / span,
            oldest_first: older.oldest_first,
        }
    }

    /// The elapsed share of the bucket at `now_ns` (1/1024 steps).
    #[inline(always)]
    pub fn elapsed(&self, now_ns: u64) -> u64 {
        let elapsed = (now_ns
            .wrapping_sub(self.start_ns)
            .wrapping_mul(self.inv_bucket))
            >> (INV_SHIFT - WEIGHT_SHIFT);
        if elapsed > WEIGHT_ONE - 1 {
            WEIGHT_ONE - 1
        } else {
            elapsed
        }
    }

    /// The oldest bucket's still-inside share at `elapsed` (1/1024 steps).
    #[inline(always)]
    fn inside(&self, elapsed: u64) -> u64 {
        let gone = if elapsed > self.oldest_first {
            elapsed
        } else {
            self.oldest_first
        };
        WEIGHT_ONE - gone
    }

    /// The estimate at `elapsed`, with `current` the current bucket's
    /// part ([`Estimate::current`]).
    #[inline(always)]
    pub fn estimate(&self, elapsed: u64, current: Estimate) -> Estimate {
        let inside = self.inside(elapsed);
        Estimate {
            packets: self.older_packets + inside * self.oldest_packets_per_q + current.packets,
            bytes: self.older_bytes + inside * self.oldest_bytes_per_q + current.bytes,
        }
    }

    /// The earliest time in this bucket at which one more frame (of one
    /// byte) could fit, given the current bucket's counts; the bucket's end
    /// if none can. Rounded early, never late.
    #[inline(always)]
    pub fn free_at(&self, params: &WindowParams, current: Estimate) -> u64 {
        let packets = needed_elapsed(
            params.allowance_packets,
            self.older_packets + current.packets,
            self.oldest_packets_per_q,
        );
        let bytes = needed_elapsed(
            params.allowance_bytes,
            self.older_bytes + current.bytes,
            self.oldest_bytes_per_q,
        );
        let elapsed = if packets > bytes { packets } else { bytes };
        self.start_ns + ((elapsed * self.bucket_ns) >> WEIGHT_SHIFT)
    }
}

/// The elapsed share at which `fixed + inside * per_q + 1 <= allowance`
/// (fixed point); [`WEIGHT_ONE`] (the bucket's end) if never in it.
#[inline(always)]
fn needed_elapsed(allowance: u64, fixed: u64, per_q: u64) -> u64 {
    if allowance == UNLIMITED {
        return 0;
    }
    let limit = allowance << WEIGHT_SHIFT;
    let need = fixed + WEIGHT_ONE;
    if need > limit {
        return WEIGHT_ONE;
    }
    if per_q == 0 {
        return 0;
    }
    WEIGHT_ONE.saturating_sub((limit - need) / per_q)
}

/// `reference::try_admit` through a CPU's [`WindowCache`] (which must cover
/// `now_ns`): the same decision, without the per-frame loop and divisions,
/// and on refusal the time until which refusing needs no look.
///
/// With `lease > 1` (only without a byte limit), a frame admitted while
/// the window has room for `lease` frames grants the caller the next
/// `granted - 1` frames of this bucket, admitted without touching the
/// shared window and counted into it afterwards, in this bucket
/// (`ring::count_leased`): the window never counts a frame that was not
/// admitted (a lease counted when taken and then unused would count, for a
/// whole window, frames the source never sent). CPUs leasing at once may
/// each admit their unspent lease beyond the allowance: at most
/// `granted - 1` frames each.
///
/// A frame whose compare-and-swaps keep losing (other CPUs counting into
/// the same slot) is counted with one atomic add instead, and admitted if
/// the count it added to had room: contention never refuses a frame the
/// window has room for (a frame refused after its add stays counted: one
/// its source did send).
#[inline(always)]
pub fn try_admit_cached<S: SlotWrite + ?Sized>(
    slots: &S,
    cache: &WindowCache,
    params: &WindowParams,
    now_ns: u64,
    len: u64,
    lease: u64,
) -> Admission {
    let elapsed = cache.elapsed(now_ns);
    let slot = slot_of(cache.bucket);
    let count_bytes = params.allowance_bytes != UNLIMITED;
    let at = Position {
        bucket: cache.bucket,
        elapsed,
    };
    let mut attempt = 0;
    while attempt < CAS_ATTEMPTS {
        attempt += 1;
        let current = slots.load(slot, PACKETS);
        let current_bytes = if count_bytes {
            slots.load(slot, BYTES)
        } else {
            0
        };
        let current_only = Estimate::current(current, current_bytes, cache.bucket);
        let est = cache.estimate(elapsed, current_only);
        if !fits(est.packets, 1, params.allowance_packets)
            || !fits(est.bytes, len, params.allowance_bytes)
        {
            let free = cache.free_at(params, current_only);
            return Admission::Refused {
                hold_until_ns: if free > now_ns { free } else { now_ns },
            };
        }
        let granted =
            if lease > 1 && !count_bytes && fits(est.packets, lease, params.allowance_packets) {
                lease
            } else {
                1
            };
        if count_bytes && !reserve_bytes(slots, slot, cache.bucket, current_bytes, len) {
            continue;
        }
        if slots.compare_exchange(slot, PACKETS, current, packets_bumped_by(current, at, 1)) {
            let half_used = half_used(est.packets, granted, params.allowance_packets)
                || half_used(est.bytes, len, params.allowance_bytes);
            return Admission::Admitted {
                granted,
                half_used,
                packets: est.packets + (granted << WEIGHT_SHIFT),
            };
        }
        if count_bytes {
            give_back_bytes(slots, slot, cache.bucket, len);
        }
    }
    admit_contended(slots, cache, params, now_ns, len)
}

/// [`try_admit_cached`] once its compare-and-swaps kept losing: every loss
/// was another CPU counting into this bucket's slot, which therefore holds
/// this bucket, so the frame is counted with an atomic add of one (and of
/// its bytes), and admitted if the counts it added to had room. A slot
/// that does not hold this bucket (never, after losses), or near the
/// count's capacity, refuses without counting.
#[inline(always)]
fn admit_contended<S: SlotWrite + ?Sized>(
    slots: &S,
    cache: &WindowCache,
    params: &WindowParams,
    now_ns: u64,
    len: u64,
) -> Admission {
    let elapsed = cache.elapsed(now_ns);
    let slot = slot_of(cache.bucket);
    let count_bytes = params.allowance_bytes != UNLIMITED;
    let refused = Admission::Refused {
        hold_until_ns: now_ns,
    };
    let packets = packets_in(slots.load(slot, PACKETS), cache.bucket);
    if packets == 0 || packets + CONTENDED_HEADROOM > MAX_PACKETS {
        return refused;
    }
    if count_bytes {
        let bytes = bytes_in(slots.load(slot, BYTES), cache.bucket);
        if bytes == 0 || bytes + len + CONTENDED_HEADROOM > MAX_BYTES {
            return refused;
        }
    }
    let bytes_before = if count_bytes {
        slots.fetch_add(slot, BYTES, len)
    } else {
        0
    };
    let before = slots.fetch_add(slot, PACKETS, 1);
    let est = cache.estimate(
        elapsed,
        Estimate::current(before, bytes_before, cache.bucket),
    );
    if fits(est.packets, 1, params.allowance_packets)
        && fits(est.bytes, len, params.allowance_bytes)
    {
        Admission::Admitted {
            granted: 1,
            half_used: half_used(est.packets, 1, params.allowance_packets)
                || half_used(est.bytes, len, params.allowance_bytes),
            packets: est.packets + WEIGHT_ONE,
        }
    } else {
        refused
    }
}

/// Room kept below a slot's capacity for the atomic adds of contended
/// frames (a count near it could carry into the word's tag).
const CONTENDED_HEADROOM: u64 = 1 << 16;

/// Whether an estimate (fixed point, as `fits` takes it) plus `amount`
/// reaches half of `allowance` (never for an unlimited one).
#[inline(always)]
const fn half_used(estimate: u64, amount: u64, allowance: u64) -> bool {
    allowance != UNLIMITED && estimate + (amount << WEIGHT_SHIFT) >= allowance << (WEIGHT_SHIFT - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::{bytes_in, packets_in, try_admit, AtomicRing};

    /// Ten buckets of 100 ns and `allowance` packets, no byte limit.
    fn packets_only(allowance: u64) -> WindowParams {
        WindowParams {
            bucket_ns: 100,
            buckets: 10,
            allowance_packets: allowance,
            allowance_bytes: UNLIMITED,
        }
    }

    /// A ring whose words of one field ([`PACKETS`] or [`BYTES`]) lose
    /// every compare-and-swap (other CPUs always counted into the slot
    /// first), whose atomic adds work, and that counts what it holds.
    struct Contended {
        ring: AtomicRing,
        losing: usize,
    }

    impl Contended {
        fn on(losing: usize) -> Self {
            Self {
                ring: AtomicRing::default(),
                losing,
            }
        }
    }

    impl SlotRead for Contended {
        fn load(&self, slot: usize, field: usize) -> u64 {
            self.ring.load(slot, field)
        }
    }

    impl SlotWrite for Contended {
        fn compare_exchange(&self, slot: usize, field: usize, current: u64, new: u64) -> bool {
            field != self.losing && self.ring.compare_exchange(slot, field, current, new)
        }

        fn store(&self, slot: usize, field: usize, value: u64) {
            self.ring.store(slot, field, value)
        }

        fn fetch_add(&self, slot: usize, field: usize, amount: u64) -> u64 {
            self.ring.fetch_add(slot, field, amount)
        }
    }

    /// Contention never refuses a frame the window has room for: once the
    /// compare-and-swaps have lost, the frame is counted with an atomic
    /// add and admitted while that leaves room; past the allowance it is
    /// refused before any add.
    #[test]
    fn a_contended_frame_is_admitted_while_there_is_room() {
        let params = packets_only(5);
        let ring = Contended::on(PACKETS);
        let now = 1_050;
        let at = position(now, params.bucket_ns);
        // Another CPU counted the bucket's first frame.
        ring.ring.store(
            slot_of(at.bucket),
            PACKETS,
            super::super::pack_packets(at.bucket, 0, 1),
        );
        let cache = WindowCache::refresh(&ring, &params, now);
        let admitted = (0..6)
            .filter(|_| {
                matches!(
                    try_admit_cached(&ring, &cache, &params, now, 60, 1),
                    Admission::Admitted { .. }
                )
            })
            .count();
        assert_eq!(admitted, 4, "room for 4 beside the other CPU's frame");
        let counted = packets_in(ring.load(slot_of(at.bucket), PACKETS), at.bucket);
        assert_eq!(counted, 1 + 4, "the refused ones were not counted");
    }

    /// A lease's frames are not counted when it is granted: only the frame
    /// that took it, the rest once the caller counts what it used
    /// (`ring::count_leased`), in the bucket it used them in.
    #[test]
    fn a_lease_counts_only_what_it_admitted() {
        let params = packets_only(1000);
        let ring = AtomicRing::default();
        let now = 1_050;
        let bucket = position(now, params.bucket_ns).bucket;
        let cache = WindowCache::refresh(&ring, &params, now);
        match try_admit_cached(&ring, &cache, &params, now, 60, 8) {
            Admission::Admitted { granted, .. } => assert_eq!(granted, 8),
            refused => panic!("{refused:?}"),
        }
        assert_eq!(packets_in(ring.load(slot_of(bucket), PACKETS), bucket), 1);
        // Three of the seven leased frames used, counted after.
        assert!(crate::window::count_leased(&ring, bucket, 3));
        assert_eq!(packets_in(ring.load(slot_of(bucket), PACKETS), bucket), 4);
        // Not into a bucket the slot no longer holds.
        assert!(!crate::window::count_leased(&ring, bucket + 16, 3));
    }

    #[test]
    fn an_admission_reports_the_packet_estimate_with_what_it_granted() {
        let params = packets_only(1000);
        let ring = AtomicRing::default();
        let now = 1_050;
        let cache = WindowCache::refresh(&ring, &params, now);
        for n in 1..=3 {
            match try_admit_cached(&ring, &cache, &params, now, 60, 1) {
                Admission::Admitted { packets, .. } => assert_eq!(packets, n * WEIGHT_ONE),
                refused => panic!("frame {n}: {refused:?}"),
            }
        }
        match try_admit_cached(&ring, &cache, &params, now, 60, 8) {
            Admission::Admitted {
                granted, packets, ..
            } => {
                assert_eq!(granted, 8);
                assert_eq!(
                    packets,
                    11 * WEIGHT_ONE,
                    "the estimate with the whole lease"
                );
            }
            refused => panic!("{refused:?}"),
        }
    }

    #[test]
    fn a_frame_whose_bytes_cannot_be_counted_is_refused_not_admitted_uncounted() {
        let params = WindowParams {
            bucket_ns: 100,
            buckets: 10,
            allowance_packets: 1000,
            allowance_bytes: 100_000,
        };
        let ring = Contended::on(BYTES);
        let now = 1_050;
        let admitted = try_admit(&ring, &params, now, 60);
        let cache = WindowCache::refresh(&ring, &params, now);
        let cached = try_admit_cached(&ring, &cache, &params, now, 60, 1);
        let at = position(now, params.bucket_ns);
        let packets = packets_in(ring.load(slot_of(at.bucket), PACKETS), at.bucket);
        let bytes = bytes_in(ring.load(slot_of(at.bucket), BYTES), at.bucket);
        let admitted_frames =
            u64::from(admitted) + u64::from(matches!(cached, Admission::Admitted { .. }));
        assert_eq!(
            bytes,
            admitted_frames * 60,
            "every admitted frame's bytes are counted ({admitted_frames} admitted, {packets} packets counted)"
        );
        assert_eq!(admitted_frames, 0, "the bytes could never be counted");
    }
}
