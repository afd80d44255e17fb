//! Access to a window's ring of slots: the read and compare-and-swap
//! traits the kernel's shared map value and the host's atomics implement,
//! the one walk over the older buckets both admission paths make, byte
//! reservations, and whole-window operations (the first word of a new
//! window, a frame owed to an existing one, clearing).

use super::{
    position,
    slots::{
        bytes_bumped, bytes_in, equal_mask, first_offset, less_mask, pack_bytes, pack_packets,
        packets_in, slot_of, tag_mask,
    },
    Position, WindowParams, BYTES, CAS_ATTEMPTS, MAX_BYTES, MAX_PACKETS, PACKETS, RING,
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

/// The first packet word of a window created at `now_ns` that must count
/// one frame admitted at `at_ns` without a window (a source's first frame,
/// see `SourceTraffic::unwindowed_ns`), and its slot: the frame goes into
/// its own bucket, at its own offset, so that it ages exactly as it would
/// have in a window (counted later than it came, it would count against
/// its source after it has left the window); nowhere (word 0) once it has
/// left the window, or if `at_ns` is 0 (no frame owed). Packets only: only
/// packet-only limits admit without a window.
#[inline(always)]
pub fn owed_word(params: &WindowParams, at_ns: u64, now_ns: u64) -> (usize, u64) {
    match owed_at(params, at_ns, now_ns) {
        Some(then) => (
            slot_of(then.bucket),
            pack_packets(then.bucket, then.elapsed, 1),
        ),
        None => (slot_of(position(now_ns, params.bucket_ns).bucket), 0),
    }
}

/// Where a frame admitted at `at_ns` without a window counts at `now_ns`:
/// its own bucket and offset, unless it has left the window (a frame of
/// bucket `b` counts until bucket `b + K` has passed) or `at_ns` is 0.
#[inline(always)]
fn owed_at(params: &WindowParams, at_ns: u64, now_ns: u64) -> Option<Position> {
    let span = params.bucket_ns * (params.buckets as u64 + 1);
    if at_ns == 0 || at_ns > now_ns || now_ns - at_ns >= span {
        return None;
    }
    Some(position(at_ns, params.bucket_ns))
}

/// Counts one frame admitted at `at_ns` without a window into an existing
/// window at `now_ns` (another CPU created it), in the frame's own bucket
/// and no later than its own offset, as [`owed_word`] places it in a new
/// one: its slot holds that bucket or an older one (a bucket at most `K`
/// old, and `K < RING`). False if the compare-and-swap kept losing or the
/// frame has left the window (then it goes uncounted).
#[inline(always)]
pub fn count_owed<S: SlotWrite + ?Sized>(
    slots: &S,
    params: &WindowParams,
    at_ns: u64,
    now_ns: u64,
) -> bool {
    let Some(then) = owed_at(params, at_ns, now_ns) else {
        return false;
    };
    let slot = slot_of(then.bucket);
    let mut attempt = 0;
    while attempt < CAS_ATTEMPTS {
        attempt += 1;
        let word = slots.load(slot, PACKETS);
        let count = packets_in(word, then.bucket);
        // An earlier first frame moves the bucket's first offset back: the
        // estimate must never weigh the bucket as if its traffic began
        // later than it did.
        let first = if count == 0 || then.elapsed < first_offset(word) {
            then.elapsed
        } else {
            first_offset(word)
        };
        let counted = pack_packets(then.bucket, first, count + 1);
        if slots.compare_exchange(slot, PACKETS, word, counted) {
            return true;
        }
    }
    false
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
    use crate::window::{packets_in, try_admit, UNLIMITED};

    /// A new ring holding what `owed_word` says.
    fn seeded(params: &WindowParams, at_ns: u64, now_ns: u64) -> AtomicRing {
        let ring: AtomicRing = Default::default();
        let (slot, word) = owed_word(params, at_ns, now_ns);
        ring.store(slot, PACKETS, word);
        ring
    }

    #[test]
    fn a_window_created_later_counts_the_frame_admitted_without_one() {
        let params = WindowParams {
            bucket_ns: 100,
            buckets: 10,
            allowance_packets: 5,
            allowance_bytes: UNLIMITED,
        };
        // Same bucket: counted where it happened, first offset included.
        let ring = seeded(&params, 1_010, 1_050);
        let word = ring.load(slot_of(10), PACKETS);
        assert_eq!(packets_in(word, 10), 1);
        assert_eq!(first_offset(word), position(1_010, 100).elapsed);
        for i in 0..4 {
            assert!(try_admit(&ring, &params, 1_060, 1), "frame {i}");
        }
        assert!(
            !try_admit(&ring, &params, 1_070, 1),
            "the earlier frame used one of five"
        );
        assert!(
            !try_admit(&ring, &params, 2_000, 1),
            "and stays counted for the whole window"
        );

        // An older bucket still inside the window: counted in it, so that
        // it leaves the window when it should (counted now, it would still
        // count against the source after leaving).
        let ring = seeded(&params, 1_010, 1_550);
        assert_eq!(packets_in(ring.load(slot_of(10), PACKETS), 10), 1);
        assert_eq!(packets_in(ring.load(slot_of(15), PACKETS), 15), 0);
        for i in 0..4 {
            assert!(try_admit(&ring, &params, 1_990, 1), "frame {i}");
        }
        assert!(!try_admit(&ring, &params, 1_995, 1), "one of five is owed");
        let ring = seeded(&params, 1_010, 1_550);
        for i in 0..5 {
            assert!(
                try_admit(&ring, &params, 2_100, 1),
                "frame {i}: gone with its bucket"
            );
        }

        // Gone from the window, or nothing owed: an empty window.
        for (at, now) in [(1_010, 1_010 + 100 * 11), (0, 1_050)] {
            let ring = seeded(&params, at, now);
            for i in 0..5 {
                assert!(try_admit(&ring, &params, now + 10, 1), "frame {i}");
            }
            assert!(!try_admit(&ring, &params, now + 20, 1));
        }
    }

    /// A frame owed to a window another CPU created counts in its own
    /// bucket, and moves that bucket's first offset back if it came first.
    #[test]
    fn an_owed_frame_counts_in_its_own_bucket_of_an_existing_window() {
        let params = WindowParams {
            bucket_ns: 100,
            buckets: 10,
            allowance_packets: 5,
            allowance_bytes: UNLIMITED,
        };
        let ring: AtomicRing = Default::default();
        assert!(try_admit(&ring, &params, 1_080, 1));
        assert_eq!(first_offset(ring.load(slot_of(10), PACKETS)), 819);
        assert!(count_owed(&ring, &params, 1_020, 1_450));
        let word = ring.load(slot_of(10), PACKETS);
        assert_eq!(packets_in(word, 10), 2);
        assert_eq!(first_offset(word), position(1_020, 100).elapsed);
        // Into a slot another bucket left: it restarts there.
        assert!(count_owed(&ring, &params, 1_130, 1_450));
        assert_eq!(packets_in(ring.load(slot_of(11), PACKETS), 11), 1);
        // Gone from the window, or nothing owed: not counted.
        assert!(!count_owed(&ring, &params, 1_020, 2_150));
        assert!(!count_owed(&ring, &params, 0, 1_450));
    }

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
