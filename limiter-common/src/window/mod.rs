//! Sliding-window arithmetic over bucket counters: pure functions used by
//! the kernel program and tested on the host against an exact model.
//!
//! A rule's window of `W` ns is cut into `K` buckets of `B = W / K` ns (the
//! window is then exactly `K * B`). A ring of [`RING`] slots holds the
//! admitted packets and bytes of the last `K + 1` buckets, and for each the
//! offset `f` of its first admitted frame. At time `t`, in bucket
//! `i = t / B` with `e = t mod B` ns elapsed, the window `(t - W, t]`
//! covers all of buckets `i-K+1 ..= i` and the last `B - e` ns of bucket
//! `i-K`. Traffic of a bucket lies in `[f, B)`, so the estimate weighs the
//! oldest bucket by the share of that span still inside the window:
//!
//! ```text
//! estimate(t) = sum(c[i-K+1 ..= i]) + c[i-K] * (B - max(f, e)) / (B - f)
//! ```
//!
//! A frame is admitted when `estimate + 1 <= allowance` (packets) and
//! `estimate_bytes + len <= allowance_bytes`, where
//! `allowance = rate * W + burst`. The estimate is exact when the oldest
//! bucket's traffic is spread evenly over `[f, B)` (a steady sender, and a
//! flood starting anywhere inside a bucket); otherwise it is off by at most
//! the part of `c[i-K]` the weighting misplaces, so the true count in any
//! window of length `W` never exceeds `allowance + c[i-K]`, and never
//! exceeds `allowance + c_max`, where `c_max` is the most admitted in one
//! bucket. Offsets are kept in 1/1024 of a bucket.
//!
//! A packet word packs a 24-bit bucket tag, the 10-bit first offset and a
//! 30-bit count; a byte word the tag and a 40-bit count. A stale slot (from
//! an older bucket) reads as zero without being cleared, and one
//! compare-and-swap both rotates a slot and counts into it. Under a byte
//! limit a frame first reserves its bytes: a compare-and-swap of the byte
//! word from the word its estimate used. The packet word of the current
//! slot is then the linearisation point: a frame is admitted only if its
//! compare-and-swap from the word the estimate used succeeds. So
//! concurrent CPUs never admit more packets, nor more bytes, than the
//! allowance, and no admitted frame goes uncounted. A frame whose
//! compare-and-swaps keep losing ([`CAS_ATTEMPTS`]) is refused; bytes
//! reserved for a frame that is then refused are given back when the word
//! allows it, else they stay counted (admitting less, never more).

//!
//! The modules: [`slots`] packs the slot words (tags, counts, offsets);
//! [`ring`] is access to a ring (the traits, the walk over the older
//! buckets, byte reservations, creating, clearing and exhausting a
//! window); [`cached`] is the admission path the kernel runs, through a
//! per-CPU [`WindowCache`]; `reference` (tests and the `reference`
//! feature only) is the direct admission path that reads every slot per
//! frame, which the property tests compare the cached path with.

pub mod cached;
#[cfg(any(test, feature = "reference"))]
pub mod reference;
pub mod ring;
pub mod slots;

pub use cached::{try_admit_cached, Admission, WindowCache};
#[cfg(any(test, feature = "reference"))]
pub use reference::{estimate, older, oldest_weight, try_admit};
#[cfg(target_has_atomic = "64")]
pub use ring::AtomicRing;
pub use ring::{
    clear, copy_counts, count_leased, give_back_packet, OlderBuckets, SlotRead, SlotWrite,
};
pub use slots::{
    bytes_bumped, bytes_in, first_offset, pack_bytes, pack_packets, packets_bumped,
    packets_bumped_by, packets_in, slot_of, BYTES, BYTE_COUNT_BITS, MAX_BYTES, MAX_PACKETS,
    PACKETS, PACKET_COUNT_BITS,
};

/// Slots in the ring; a window has at most `RING - 1` buckets.
pub const RING: usize = 16;
/// Largest number of buckets per window (`K`).
pub const MAX_BUCKETS_PER_WINDOW: u32 = RING as u32 - 1;
/// Default number of buckets per window.
pub const DEFAULT_BUCKETS_PER_WINDOW: u32 = 10;
/// Fixed-point shift of weights and offsets (1/1024 steps).
pub const WEIGHT_SHIFT: u32 = 10;
/// Weight 1.0 in fixed point.
pub const WEIGHT_ONE: u64 = 1 << WEIGHT_SHIFT;
/// An allowance that never limits.
pub const UNLIMITED: u64 = u64::MAX;
/// The longest window a rule may have (60 s; userspace refuses longer).
pub const MAX_WINDOW_NS: u64 = 60_000_000_000;
/// Compare-and-swap attempts before a contended frame is refused.
pub const CAS_ATTEMPTS: usize = 4;

/// A rule's window, as the kernel sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowParams {
    /// Bucket width `B` in ns (> 0).
    pub bucket_ns: u64,
    /// Buckets per window `K`, 1 ..= [`MAX_BUCKETS_PER_WINDOW`].
    pub buckets: u32,
    /// Packets admitted per window (`pps * W + burst`), or [`UNLIMITED`].
    pub allowance_packets: u64,
    /// Bytes admitted per window (`Bps * W + burst`), or [`UNLIMITED`].
    pub allowance_bytes: u64,
}

/// Where `now` falls: its bucket and how far into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    pub bucket: u64,
    /// `e / B` in 1/[`WEIGHT_ONE`] steps, 0 ..= WEIGHT_ONE - 1.
    pub elapsed: u64,
}

/// The bucket of `now_ns` and how far into it.
#[inline(always)]
pub fn position(now_ns: u64, bucket_ns: u64) -> Position {
    let bucket_ns = if bucket_ns == 0 { 1 } else { bucket_ns };
    let bucket = now_ns / bucket_ns;
    let elapsed_ns = now_ns - bucket * bucket_ns;
    Position {
        bucket,
        elapsed: (elapsed_ns << WEIGHT_SHIFT) / bucket_ns,
    }
}

/// Sliding-window estimates in fixed point (x [`WEIGHT_ONE`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Estimate {
    pub packets: u64,
    pub bytes: u64,
}

impl Estimate {
    /// The current bucket's part of an estimate: what its words hold for
    /// `bucket`, counted in full (both paths add it to the older buckets'
    /// part).
    #[inline(always)]
    pub const fn current(packet_word: u64, byte_word: u64, bucket: u64) -> Estimate {
        Estimate {
            packets: packets_in(packet_word, bucket) << WEIGHT_SHIFT,
            bytes: bytes_in(byte_word, bucket) << WEIGHT_SHIFT,
        }
    }
}

/// Whether `amount` more fits under `allowance` given `estimate` (fixed
/// point).
#[inline(always)]
pub const fn fits(estimate: u64, amount: u64, allowance: u64) -> bool {
    allowance == UNLIMITED || estimate + (amount << WEIGHT_SHIFT) <= allowance << WEIGHT_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_reports_the_elapsed_share() {
        assert_eq!(
            position(1_000, 100),
            Position {
                bucket: 10,
                elapsed: 0
            }
        );
        assert_eq!(position(1_050, 100).elapsed, WEIGHT_ONE / 2);
        assert_eq!(position(1_099, 100).elapsed, WEIGHT_ONE * 99 / 100);
    }

    #[test]
    fn fits_respects_unlimited_and_boundaries() {
        assert!(fits(u64::MAX / 2, 1, UNLIMITED));
        assert!(fits(9 * WEIGHT_ONE, 1, 10));
        assert!(!fits(9 * WEIGHT_ONE + 1, 1, 10));
        assert!(fits(0, 1500, 1500));
        assert!(!fits(0, 1501, 1500));
    }
}
