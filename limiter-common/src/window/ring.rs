//! Access to a window's ring of slots: the read and compare-and-swap
//! traits the kernel's shared map value and the host's atomics implement,
//! the one walk over the older buckets both admission paths make, byte
//! reservations, and whole-window operations (frames counted after they
//! were admitted, copying, clearing).

use super::{
    slots::{
        bytes_bumped, bytes_in, equal_mask, first_offset, less_mask, pack_bytes, pack_packets,
        packets_in, slot_of, tag_mask,
    },
    BYTES, CAS_ATTEMPTS, MAX_BYTES, MAX_PACKETS, PACKETS, RING,
};

/// Read access to the ring's slot words.
pub trait SlotRead {
    /// The word of `field` ([`PACKETS`] or [`BYTES`]) in `slot` (< [`RING`]).
    fn load(&self, slot: usize, field: usize) -> u64;

    /// `value`, hidden from the compiler's reasoning about its range (the
    /// identity on the host). The kernel's ring wraps it in an empty
    /// instruction: the walk's masks then stay arithmetic instead of being
    /// folded back into compares and branches (see [`OlderBuckets::read`]).
    #[inline(always)]
    fn opaque(&self, value: u64) -> u64 {
        value
    }
}

/// Atomic write access to the ring's slot words.
pub trait SlotWrite: SlotRead {
    /// Replaces `current` with `new`; false if the word was not `current`.
    fn compare_exchange(&self, slot: usize, field: usize, current: u64, new: u64) -> bool;
    /// Overwrites a word (used only to clear the ring).
    fn store(&self, slot: usize, field: usize, value: u64);
    /// Adds `amount` to a word atomically; the word before.
    fn fetch_add(&self, slot: usize, field: usize, amount: u64) -> u64;
}

/// The buckets before the current one, read once: the full ones (ages
/// `1 .. K`, wholly inside the window) summed, and the oldest (age `K`,
/// partly inside) on its own. Only the current bucket is still written, so
/// both admission paths read this once, however often their
/// compare-and-swap is retried (the cached path once per bucket).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OlderBuckets {
    /// Packets and bytes of buckets `i-K+1 ..= i-1`.
    pub full_packets: u64,
    pub full_bytes: u64,
    /// Packets and bytes of bucket `i-K`.
    pub oldest_packets: u64,
    pub oldest_bytes: u64,
    /// The oldest bucket's first offset (1/1024 of a bucket).
    pub oldest_first: u64,
}

impl OlderBuckets {
    /// Reads the `buckets` buckets before `bucket`.
    ///
    /// Branch-free: every step reads one slot and adds it through masks
    /// (a stale tag, or an age outside the window, masks it to zero), so
    /// the kernel verifier walks the loop along one path. A walk with a
    /// branch per slot left each sum either a known zero or an unknown
    /// value on each path; older verifiers (6.1) never treat those as the
    /// same state, and explored about 2^15 of them, past their limit of a
    /// million instructions. The masks go through [`SlotRead::opaque`] so
    /// the compiler cannot turn them back into branches. The result is
    /// the plain walk's (`reference::read_older_plainly`, compared in
    /// the tests).
    #[inline(always)]
    pub fn read<S: SlotRead + ?Sized>(slots: &S, bucket: u64, buckets: u32) -> Self {
        let buckets = slots.opaque(buckets as u64);
        let mut older = OlderBuckets::default();
        let mut age = 1u64;
        while age < RING as u64 {
            let past = bucket.wrapping_sub(age);
            let slot = slot_of(past);
            let packet_word = slots.load(slot, PACKETS);
            let byte_word = slots.load(slot, BYTES);
            let packets = packet_word & MAX_PACKETS & slots.opaque(tag_mask(packet_word, past));
            let bytes = byte_word & MAX_BYTES & slots.opaque(tag_mask(byte_word, past));
            // Ages 1 ..= K are in the window: 1 .. K in full, K the oldest.
            let beyond = slots.opaque(less_mask(buckets, age));
            let oldest = slots.opaque(equal_mask(age, buckets));
            let full = !beyond & !oldest;
            older.full_packets += packets & full;
            older.full_bytes += bytes & full;
            older.oldest_packets |= packets & oldest;
            older.oldest_bytes |= bytes & oldest;
            older.oldest_first |= first_offset(packet_word) & oldest;
            age += 1;
        }
        older
    }
}

/// Counts `len` bytes into the current slot if its byte word is still
/// `seen` (the word the estimate used); false if another CPU changed it.
#[inline(always)]
pub(super) fn reserve_bytes<S: SlotWrite + ?Sized>(
    slots: &S,
    slot: usize,
    bucket: u64,
    seen: u64,
    len: u64,
) -> bool {
    slots.compare_exchange(slot, BYTES, seen, bytes_bumped(seen, bucket, len))
}

/// Takes back `len` bytes reserved for a frame that was then refused,
/// unless the slot moved on to another bucket or the word keeps changing
/// (then they stay counted: the safe side).
#[inline(always)]
pub(super) fn give_back_bytes<S: SlotWrite + ?Sized>(
    slots: &S,
    slot: usize,
    bucket: u64,
    len: u64,
) {
    let mut attempt = 0;
    while attempt < CAS_ATTEMPTS {
        let word = slots.load(slot, BYTES);
        let count = bytes_in(word, bucket);
        if count < len {
            return;
        }
        if slots.compare_exchange(slot, BYTES, word, pack_bytes(bucket, count - len)) {
            return;
        }
        attempt += 1;
    }
}

/// Takes back one frame counted in `bucket` (its slot) for a frame that a
/// later judgement refused (a rule's levels count a frame before the
/// source's own window judges it), unless the slot moved on to another
/// bucket or the word keeps changing (it then stays counted: the safe
/// side).
#[inline(always)]
pub fn give_back_packet<S: SlotWrite + ?Sized>(slots: &S, bucket: u64) {
    let slot = slot_of(bucket);
    let mut attempt = 0;
    while attempt < CAS_ATTEMPTS {
        let word = slots.load(slot, PACKETS);
        let count = packets_in(word, bucket);
        if count == 0 {
            return;
        }
        let fewer = pack_packets(bucket, first_offset(word), count - 1);
        if slots.compare_exchange(slot, PACKETS, word, fewer) {
            return;
        }
        attempt += 1;
    }
}

/// Counts `frames` more into the slot of `bucket` while it holds that
/// bucket: frames a CPU admitted from its lease, counted after they were
/// admitted (`SourceTraffic::lease_owed`), in the bucket they came in.
/// False if the slot moved on (they have left the window) or the
/// compare-and-swap kept losing (they go uncounted).
#[inline(always)]
pub fn count_leased<S: SlotWrite + ?Sized>(slots: &S, bucket: u64, frames: u64) -> bool {
    let slot = slot_of(bucket);
    let mut attempt = 0;
    while attempt < CAS_ATTEMPTS {
        attempt += 1;
        let word = slots.load(slot, PACKETS);
        let count = packets_in(word, bucket);
        if count == 0 {
            return false;
        }
        let room = MAX_PACKETS - count;
        let more = if frames > room { room } else { frames };
        let counted = pack_packets(bucket, first_offset(word), count + more);
        if slots.compare_exchange(slot, PACKETS, word, counted) {
            return true;
        }
    }
    false
}

/// Copies every slot word of `from` into `to` (a new window starting with
/// another's counts).
#[inline(always)]
pub fn copy_counts<S: SlotRead + ?Sized>(from: &S, to: &mut [[u64; 2]; RING]) {
    let mut slot = 0;
    while slot < RING {
        to[slot][PACKETS] = from.load(slot, PACKETS);
        to[slot][BYTES] = from.load(slot, BYTES);
        slot += 1;
    }
}

/// Clears every slot (when a source's bucket width changes).
#[inline(always)]
pub fn clear<S: SlotWrite + ?Sized>(slots: &S) {
    let mut slot = 0;
    while slot < RING {
        slots.store(slot, PACKETS, 0);
        slots.store(slot, BYTES, 0);
        slot += 1;
    }
}

/// Host (and userspace) slots: one atomic word per field.
#[cfg(target_has_atomic = "64")]
pub type AtomicRing = [[core::sync::atomic::AtomicU64; 2]; RING];

#[cfg(target_has_atomic = "64")]
impl SlotRead for AtomicRing {
    fn load(&self, slot: usize, field: usize) -> u64 {
        self[slot][field].load(core::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(target_has_atomic = "64")]
impl SlotWrite for AtomicRing {
    fn compare_exchange(&self, slot: usize, field: usize, current: u64, new: u64) -> bool {
        use core::sync::atomic::Ordering::{Relaxed, SeqCst};
        self[slot][field]
            .compare_exchange(current, new, SeqCst, Relaxed)
            .is_ok()
    }

    fn store(&self, slot: usize, field: usize, value: u64) {
        self[slot][field].store(value, core::sync::atomic::Ordering::Relaxed)
    }

    fn fetch_add(&self, slot: usize, field: usize, amount: u64) -> u64 {
        self[slot][field].fetch_add(amount, core::sync::atomic::Ordering::SeqCst)
    }
}

/// A copy of the ring read back from the kernel.
impl SlotRead for [[u64; 2]; RING] {
    fn load(&self, slot: usize, field: usize) -> u64 {
        self[slot][field]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_branch_free_walk_reads_what_the_plain_walk_reads() {
        use crate::window::reference::read_older_plainly;
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            // xorshift64*: deterministic, no dependency.
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        for _ in 0..2_000 {
            let bucket = next() % (1 << 26);
            let mut ring = [[0u64; 2]; RING];
            for (slot, words) in ring.iter_mut().enumerate() {
                // Each slot current for one of the last buckets, stale,
                // or from the far past (tags wrap at 2^24).
                let age = next() % 40;
                let tagged = bucket.wrapping_sub(age) & !(RING as u64 - 1) | slot as u64;
                let tagged = if next() % 4 == 0 {
                    tagged + (1 << 24)
                } else {
                    tagged
                };
                *words = [
                    pack_packets(tagged, next() % 1024, next()),
                    pack_bytes(tagged, next()),
                ];
                if next() % 8 == 0 {
                    *words = [next(), next()];
                }
            }
            for buckets in 0..=RING as u32 {
                assert_eq!(
                    OlderBuckets::read(&ring, bucket, buckets),
                    read_older_plainly(&ring, bucket, buckets),
                    "bucket {bucket}, K = {buckets}, ring {ring:x?}"
                );
            }
        }
    }

    #[test]
    fn the_walk_splits_the_full_buckets_from_the_oldest() {
        let mut ring: [[u64; 2]; RING] = [[0; 2]; RING];
        // K = 3 at bucket 20: full 18 and 19, oldest 17; 16 is outside.
        ring[slot_of(17)] = [pack_packets(17, 300, 5), pack_bytes(17, 500)];
        ring[slot_of(18)] = [pack_packets(18, 0, 7), pack_bytes(18, 700)];
        ring[slot_of(19)] = [pack_packets(19, 9, 11), pack_bytes(19, 1100)];
        ring[slot_of(16)] = [pack_packets(16, 0, 1000), pack_bytes(16, 1)];
        assert_eq!(
            OlderBuckets::read(&ring, 20, 3),
            OlderBuckets {
                full_packets: 18,
                full_bytes: 1800,
                oldest_packets: 5,
                oldest_bytes: 500,
                oldest_first: 300,
            }
        );
        assert_eq!(
            OlderBuckets::read(&ring, 20, 0),
            OlderBuckets::default(),
            "no older buckets"
        );
    }
}
