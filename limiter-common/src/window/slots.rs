//! The slot words: each slot of the ring holds a packet word and a byte
//! word. A packet word packs a 24-bit bucket tag, the 10-bit offset of the
//! bucket's first admitted frame (1/1024 of a bucket) and a 30-bit count;
//! a byte word the tag and a 40-bit count. Reading a word for a bucket it
//! is not tagged with gives zero, so a stale slot needs no clearing, and
//! one compare-and-swap can both rotate a slot and count into it.

use super::{Position, RING, WEIGHT_ONE};

const TAG_BITS: u32 = 24;
const TAG_SHIFT: u32 = 64 - TAG_BITS;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
/// Bits of a packet word that hold the count.
pub const PACKET_COUNT_BITS: u32 = 30;
/// Largest packet count a slot holds; packet allowances must stay below it.
pub const MAX_PACKETS: u64 = (1 << PACKET_COUNT_BITS) - 1;
/// Bits of a byte word that hold the count.
pub const BYTE_COUNT_BITS: u32 = 40;
/// Largest byte count a slot holds; byte allowances must stay below it.
pub const MAX_BYTES: u64 = (1 << BYTE_COUNT_BITS) - 1;
/// Mask of a first offset (in 1/[`WEIGHT_ONE`] of a bucket).
pub(super) const OFFSET_MASK: u64 = WEIGHT_ONE - 1;
/// Index of the packet word in a slot.
pub const PACKETS: usize = 0;
/// Index of the byte word in a slot.
pub const BYTES: usize = 1;

/// The ring slot of a bucket.
#[inline(always)]
pub const fn slot_of(bucket: u64) -> usize {
    (bucket % RING as u64) as usize
}

const fn tag_matches(word: u64, bucket: u64) -> bool {
    word >> TAG_SHIFT == bucket & TAG_MASK
}

/// A packet word: `count` frames in `bucket`, the first at offset `first`.
/// All ones if `word`'s tag is `bucket`'s, else zero: [`tag_matches`] as
/// a mask, computed without a compare (see `OlderBuckets::read`).
#[inline(always)]
pub(super) const fn tag_mask(word: u64, bucket: u64) -> u64 {
    equal_mask(word >> TAG_SHIFT, bucket & TAG_MASK)
}

/// All ones if `a == b`, else zero, for `a ^ b < 2^63`.
#[inline(always)]
pub(super) const fn equal_mask(a: u64, b: u64) -> u64 {
    ((a ^ b).wrapping_sub(1) >> 63).wrapping_neg()
}

/// All ones if `a < b`, else zero, for `a, b < 2^63`.
#[inline(always)]
pub(super) const fn less_mask(a: u64, b: u64) -> u64 {
    (a.wrapping_sub(b) >> 63).wrapping_neg()
}

#[inline(always)]
pub const fn pack_packets(bucket: u64, first: u64, count: u64) -> u64 {
    ((bucket & TAG_MASK) << TAG_SHIFT)
        | ((first & OFFSET_MASK) << PACKET_COUNT_BITS)
        | (count & MAX_PACKETS)
}

/// A byte word: `count` bytes in `bucket`.
#[inline(always)]
pub const fn pack_bytes(bucket: u64, count: u64) -> u64 {
    ((bucket & TAG_MASK) << TAG_SHIFT) | (count & MAX_BYTES)
}

/// The count (under `mask`) a word holds for `bucket`: zero for another.
#[inline(always)]
const fn count_in(word: u64, bucket: u64, mask: u64) -> u64 {
    if tag_matches(word, bucket) {
        word & mask
    } else {
        0
    }
}

/// The packets a packet word holds for `bucket`: zero for another bucket.
#[inline(always)]
pub const fn packets_in(word: u64, bucket: u64) -> u64 {
    count_in(word, bucket, MAX_PACKETS)
}

/// The offset of the first frame in a packet word (1/1024 of a bucket).
#[inline(always)]
pub const fn first_offset(word: u64) -> u64 {
    (word >> PACKET_COUNT_BITS) & OFFSET_MASK
}

/// The bytes a byte word holds for `bucket`: zero for another bucket.
#[inline(always)]
pub const fn bytes_in(word: u64, bucket: u64) -> u64 {
    count_in(word, bucket, MAX_BYTES)
}

/// A packet word with one more frame at `at` (restarting the slot, with
/// its first offset, if it held an older bucket), saturating.
#[inline(always)]
pub const fn packets_bumped(word: u64, at: Position) -> u64 {
    packets_bumped_by(word, at, 1)
}

/// A packet word with `amount` more frames at `at`, saturating.
#[inline(always)]
pub const fn packets_bumped_by(word: u64, at: Position, amount: u64) -> u64 {
    // A word with no frames (a zeroed slot looks like bucket 0) restarts.
    if tag_matches(word, at.bucket) && word & MAX_PACKETS != 0 {
        let count = word & MAX_PACKETS;
        let room = MAX_PACKETS - count;
        pack_packets(
            at.bucket,
            first_offset(word),
            count + if amount > room { room } else { amount },
        )
    } else {
        let amount = if amount > MAX_PACKETS {
            MAX_PACKETS
        } else {
            amount
        };
        pack_packets(at.bucket, at.elapsed, amount)
    }
}

/// A byte word with `len` more bytes in `bucket`, saturating.
#[inline(always)]
pub const fn bytes_bumped(word: u64, bucket: u64, len: u64) -> u64 {
    let count = bytes_in(word, bucket);
    let room = MAX_BYTES - count;
    pack_bytes(bucket, count + if len > room { room } else { len })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_pack_tag_offset_and_count() {
        let w = pack_packets(7, 300, 42);
        assert_eq!(packets_in(w, 7), 42);
        assert_eq!(first_offset(w), 300);
        assert_eq!(packets_in(w, 8), 0);
        assert_eq!(
            packets_in(w, 7 + (1 << 24)),
            42,
            "tags wrap after 2^24 buckets"
        );
        let at = Position {
            bucket: 7,
            elapsed: 900,
        };
        assert_eq!(packets_in(packets_bumped(w, at), 7), 43);
        assert_eq!(
            first_offset(packets_bumped(w, at)),
            300,
            "the first offset stays"
        );
        let later = Position {
            bucket: 23,
            elapsed: 5,
        };
        assert_eq!(
            packets_in(packets_bumped(w, later), 23),
            1,
            "a stale slot restarts"
        );
        assert_eq!(first_offset(packets_bumped(w, later)), 5);
        let zeroed = Position {
            bucket: 0,
            elapsed: 77,
        };
        assert_eq!(
            first_offset(packets_bumped(0, zeroed)),
            77,
            "a zeroed slot is empty"
        );
        let full = pack_packets(1, 0, MAX_PACKETS);
        assert_eq!(
            packets_in(
                packets_bumped(
                    full,
                    Position {
                        bucket: 1,
                        elapsed: 0
                    }
                ),
                1
            ),
            MAX_PACKETS
        );
        let b = pack_bytes(9, 1000);
        assert_eq!(bytes_in(bytes_bumped(b, 9, 500), 9), 1500);
        assert_eq!(bytes_in(bytes_bumped(b, 10, 500), 10), 500);
        assert_eq!(
            bytes_in(bytes_bumped(pack_bytes(1, MAX_BYTES - 1), 1, 10), 1),
            MAX_BYTES
        );
    }
}
