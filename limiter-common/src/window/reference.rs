//! The reference admission path: [`try_admit`] reads every older bucket
//! for every frame and computes the estimate straight from the formula in
//! the module docs. The kernel runs the cached path (`cached`) instead;
//! this one exists for the property tests, which check that both decide
//! alike and stay within the bound. Compiled only for tests and with the
//! `reference` feature: nothing in the product uses it.

use super::{
    fits, position,
    ring::{give_back_bytes, reserve_bytes, OlderBuckets},
    slots::{bytes_in, first_offset, packets_bumped, packets_in, slot_of, OFFSET_MASK},
    Estimate, Position, SlotRead, SlotWrite, WindowParams, BYTES, CAS_ATTEMPTS, PACKETS, RING,
    UNLIMITED, WEIGHT_ONE, WEIGHT_SHIFT,
};

/// [`OlderBuckets::read`] as a plain loop with a branch per slot: what the
/// kernel's branch-free walk must equal (its tests compare the two).
pub fn read_older_plainly<S: SlotRead + ?Sized>(
    slots: &S,
    bucket: u64,
    buckets: u32,
) -> OlderBuckets {
    let buckets = u64::from(buckets);
    let mut older = OlderBuckets::default();
    for age in 1..(RING as u64).min(buckets + 1) {
        let past = bucket.wrapping_sub(age);
        let slot = slot_of(past);
        let packet_word = slots.load(slot, PACKETS);
        let packets = packets_in(packet_word, past);
        let bytes = bytes_in(slots.load(slot, BYTES), past);
        if age < buckets {
            older.full_packets += packets;
            older.full_bytes += bytes;
        } else {
            older.oldest_packets = packets;
            older.oldest_bytes = bytes;
            older.oldest_first = first_offset(packet_word);
        }
    }
    older
}

/// The weight (x [`WEIGHT_ONE`]) of the oldest bucket, whose traffic lies
/// in `[first, 1)` of it, when `elapsed` of it has left the window.
#[inline(always)]
pub const fn oldest_weight(first: u64, elapsed: u64) -> u64 {
    let first = first & OFFSET_MASK;
    let gone = if elapsed > first { elapsed } else { first };
    let inside = WEIGHT_ONE - if gone > WEIGHT_ONE { WEIGHT_ONE } else { gone };
    (inside << WEIGHT_SHIFT) / (WEIGHT_ONE - first)
}

/// The sliding-window estimate at `at` over `buckets` buckets, with
/// `current` standing in for the current bucket's packet word.
#[inline(always)]
pub fn estimate<S: SlotRead + ?Sized>(
    slots: &S,
    at: Position,
    buckets: u32,
    current: u64,
) -> Estimate {
    with_current(slots, older(slots, at, buckets), at, current)
}

/// The older buckets' part of the estimate: the full ones in full, the
/// oldest weighed by [`oldest_weight`]. Only the current bucket is
/// written, so this is read once per frame however often the
/// compare-and-swap is retried.
#[inline(always)]
pub fn older<S: SlotRead + ?Sized>(slots: &S, at: Position, buckets: u32) -> Estimate {
    let older = OlderBuckets::read(slots, at.bucket, buckets);
    let weight = oldest_weight(older.oldest_first, at.elapsed);
    Estimate {
        packets: (older.full_packets << WEIGHT_SHIFT) + older.oldest_packets * weight,
        bytes: (older.full_bytes << WEIGHT_SHIFT) + older.oldest_bytes * weight,
    }
}

/// `older` plus the current bucket, whose packet word is `current`.
#[inline(always)]
fn with_current<S: SlotRead + ?Sized>(
    slots: &S,
    older: Estimate,
    at: Position,
    current: u64,
) -> Estimate {
    let bytes = slots.load(slot_of(at.bucket), BYTES);
    let current = Estimate::current(current, bytes, at.bucket);
    Estimate {
        packets: older.packets + current.packets,
        bytes: older.bytes + current.bytes,
    }
}

/// Decides one frame of `len` bytes at `now_ns`, counting it if admitted.
#[inline(always)]
pub fn try_admit<S: SlotWrite + ?Sized>(
    slots: &S,
    params: &WindowParams,
    now_ns: u64,
    len: u64,
) -> bool {
    let at = position(now_ns, params.bucket_ns);
    let slot = slot_of(at.bucket);
    let older = older(slots, at, params.buckets);
    let count_bytes = params.allowance_bytes != UNLIMITED;
    let mut attempt = 0;
    while attempt < CAS_ATTEMPTS {
        attempt += 1;
        let current = slots.load(slot, PACKETS);
        let current_bytes = slots.load(slot, BYTES);
        let est = with_current(slots, older, at, current);
        if !fits(est.packets, 1, params.allowance_packets)
            || !fits(est.bytes, len, params.allowance_bytes)
        {
            return false;
        }
        if count_bytes && !reserve_bytes(slots, slot, at.bucket, current_bytes, len) {
            continue;
        }
        if slots.compare_exchange(slot, PACKETS, current, packets_bumped(current, at)) {
            return true;
        }
        if count_bytes {
            give_back_bytes(slots, slot, at.bucket, len);
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::{pack_bytes, pack_packets, RING};

    #[test]
    fn oldest_weight_covers_only_the_occupied_span() {
        assert_eq!(oldest_weight(0, 0), WEIGHT_ONE);
        assert_eq!(oldest_weight(0, WEIGHT_ONE / 4), WEIGHT_ONE * 3 / 4);
        // Traffic in the second half: nothing has left until e passes f.
        assert_eq!(oldest_weight(512, 256), WEIGHT_ONE);
        assert_eq!(oldest_weight(512, 768), WEIGHT_ONE / 2);
        // Same quantum: counted in full (the conservative side).
        assert_eq!(oldest_weight(1023, 1023), WEIGHT_ONE);
    }

    #[test]
    fn estimate_weighs_only_the_oldest_bucket() {
        let mut ring: [[u64; 2]; RING] = [[0; 2]; RING];
        // K = 2: buckets 8 (oldest), 9, 10 (current).
        ring[slot_of(8)] = [pack_packets(8, 0, 100), pack_bytes(8, 6400)];
        ring[slot_of(9)] = [pack_packets(9, 0, 10), pack_bytes(9, 640)];
        ring[slot_of(7)] = [pack_packets(7, 0, 1000), pack_bytes(7, 1)]; // outside
        ring[slot_of(10)][BYTES] = pack_bytes(10, 64);
        let current = pack_packets(10, 0, 1);
        let at = position(1_025, 100); // a quarter into bucket 10
        let est = estimate(&ring, at, 2, current);
        assert_eq!(
            est.packets,
            (1 + 10) * WEIGHT_ONE + 100 * (WEIGHT_ONE * 3 / 4)
        );
        assert_eq!(
            est.bytes,
            (64 + 640) * WEIGHT_ONE + 6400 * (WEIGHT_ONE * 3 / 4)
        );
    }
}
