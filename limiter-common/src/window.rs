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

/// Slots in the ring; a window has at most `RING - 1` buckets.
pub const RING: usize = 16;
/// Largest number of buckets per window (`K`).
pub const MAX_BUCKETS_PER_WINDOW: u32 = RING as u32 - 1;
/// Default number of buckets per window.
pub const DEFAULT_BUCKETS_PER_WINDOW: u32 = 10;
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
/// Fixed-point shift of weights and offsets (1/1024 steps).
pub const WEIGHT_SHIFT: u32 = 10;
/// Weight 1.0 in fixed point.
pub const WEIGHT_ONE: u64 = 1 << WEIGHT_SHIFT;
const OFFSET_MASK: u64 = WEIGHT_ONE - 1;
/// An allowance that never limits.
pub const UNLIMITED: u64 = u64::MAX;
/// Index of the packet word in a slot.
pub const PACKETS: usize = 0;
/// Index of the byte word in a slot.
pub const BYTES: usize = 1;
/// Compare-and-swap attempts before a contended frame is refused.
pub const CAS_ATTEMPTS: usize = 4;

/// Read access to the ring's slot words.
pub trait SlotRead {
    /// The word of `field` ([`PACKETS`] or [`BYTES`]) in `slot` (< [`RING`]).
    fn load(&self, slot: usize, field: usize) -> u64;
}

/// Atomic write access to the ring's slot words.
pub trait SlotWrite: SlotRead {
    /// Replaces `current` with `new`; false if the word was not `current`.
    fn compare_exchange(&self, slot: usize, field: usize, current: u64, new: u64) -> bool;
    /// Overwrites a word (used only to clear the ring).
    fn store(&self, slot: usize, field: usize, value: u64);
}

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

/// The ring slot of a bucket.
#[inline(always)]
pub const fn slot_of(bucket: u64) -> usize {
    (bucket % RING as u64) as usize
}

const fn tag_matches(word: u64, bucket: u64) -> bool {
    word >> TAG_SHIFT == bucket & TAG_MASK
}

/// A packet word: `count` frames in `bucket`, the first at offset `first`.
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

/// The weight (x [`WEIGHT_ONE`]) of the oldest bucket, whose traffic lies
/// in `[first, 1)` of it, when `elapsed` of it has left the window.
#[inline(always)]
pub const fn oldest_weight(first: u64, elapsed: u64) -> u64 {
    let first = first & OFFSET_MASK;
    let gone = if elapsed > first { elapsed } else { first };
    let inside = WEIGHT_ONE - if gone > WEIGHT_ONE { WEIGHT_ONE } else { gone };
    (inside << WEIGHT_SHIFT) / (WEIGHT_ONE - first)
}

/// Sliding-window estimates in fixed point (x [`WEIGHT_ONE`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Estimate {
    pub packets: u64,
    pub bytes: u64,
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

/// The older buckets' part of the estimate. Only the current bucket is
/// written, so this is read once per frame however often the
/// compare-and-swap is retried. The loop has a fixed trip count (no exit
/// that depends on `buckets`), which keeps the kernel verifier's path
/// count small.
#[inline(always)]
pub fn older<S: SlotRead + ?Sized>(slots: &S, at: Position, buckets: u32) -> Estimate {
    let buckets = buckets as u64;
    let mut est = Estimate::default();
    let mut age = 1u64;
    while age < RING as u64 {
        if age <= buckets {
            let bucket = at.bucket.wrapping_sub(age);
            let slot = slot_of(bucket);
            let packet_word = slots.load(slot, PACKETS);
            let weight = if age == buckets {
                oldest_weight(first_offset(packet_word), at.elapsed)
            } else {
                WEIGHT_ONE
            };
            est.packets += packets_in(packet_word, bucket) * weight;
            est.bytes += bytes_in(slots.load(slot, BYTES), bucket) * weight;
        }
        age += 1;
    }
    est
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
    Estimate {
        packets: older.packets + (packets_in(current, at.bucket) << WEIGHT_SHIFT),
        bytes: older.bytes + (bytes_in(bytes, at.bucket) << WEIGHT_SHIFT),
    }
}

/// Whether `amount` more fits under `allowance` given `estimate` (fixed
/// point).
#[inline(always)]
pub const fn fits(estimate: u64, amount: u64, allowance: u64) -> bool {
    allowance == UNLIMITED || estimate + (amount << WEIGHT_SHIFT) <= allowance << WEIGHT_SHIFT
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

/// Counts `len` bytes into the current slot if its byte word is still
/// `seen` (the word the estimate used); false if another CPU changed it.
#[inline(always)]
fn reserve_bytes<S: SlotWrite + ?Sized>(
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
fn give_back_bytes<S: SlotWrite + ?Sized>(slots: &S, slot: usize, bucket: u64, len: u64) {
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

/// The first packet word of a window created at `now_ns` that must count
/// one frame admitted at `at_ns` without a window (a source's first frame,
/// see `SourceTraffic::unwindowed_ns`), and its slot. The frame goes into
/// its own bucket while that is the current one, so it ages exactly; into
/// the current bucket if its own is older but may still be inside the
/// window (it then counts a little longer than it should: the safe side);
/// nowhere (word 0) once it has left the window, or if `at_ns` is 0 (no
/// frame owed). Packets only: only packet-only limits admit without a
/// window.
#[inline(always)]
pub fn owed_word(params: &WindowParams, at_ns: u64, now_ns: u64) -> (usize, u64) {
    let now = position(now_ns, params.bucket_ns);
    // A frame in bucket b counts until bucket b + K has passed.
    let span = params.bucket_ns * (params.buckets as u64 + 1);
    if at_ns == 0 || now_ns.saturating_sub(at_ns) >= span {
        return (slot_of(now.bucket), 0);
    }
    let then = position(at_ns, params.bucket_ns);
    let at = if then.bucket == now.bucket { then } else { now };
    (slot_of(at.bucket), pack_packets(at.bucket, at.elapsed, 1))
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

/// Marks the allowance as used up in the bucket of `now_ns`: a source that
/// was over its limit and lost its window state (evicted under pressure)
/// restarts refused for one window instead of with a fresh allowance.
#[inline(always)]
pub fn mark_exhausted<S: SlotWrite + ?Sized>(slots: &S, params: &WindowParams, now_ns: u64) {
    let at = position(now_ns, params.bucket_ns);
    let slot = slot_of(at.bucket);
    let packets = if params.allowance_packets == UNLIMITED {
        1
    } else if params.allowance_packets > MAX_PACKETS {
        MAX_PACKETS
    } else if params.allowance_packets == 0 {
        1
    } else {
        params.allowance_packets
    };
    slots.store(slot, PACKETS, pack_packets(at.bucket, at.elapsed, packets));
    if params.allowance_bytes != UNLIMITED {
        let bytes = if params.allowance_bytes > MAX_BYTES {
            MAX_BYTES
        } else {
            params.allowance_bytes
        };
        slots.store(slot, BYTES, pack_bytes(at.bucket, bytes));
    }
}

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
    Admitted { granted: u64 },
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
        let buckets = params.buckets as u64;
        let mut cache = WindowCache {
            bucket: at.bucket,
            start_ns: at.bucket * bucket_ns,
            bucket_ns,
            inv_bucket: (1u64 << INV_SHIFT) / bucket_ns,
            ..WindowCache::default()
        };
        let mut age = 1u64;
        while age < RING as u64 {
            if age <= buckets {
                let bucket = at.bucket.wrapping_sub(age);
                let slot = slot_of(bucket);
                let packet_word = slots.load(slot, PACKETS);
                let packets = packets_in(packet_word, bucket);
                let bytes = bytes_in(slots.load(slot, BYTES), bucket);
                if age < buckets {
                    cache.older_packets += packets << WEIGHT_SHIFT;
                    cache.older_bytes += bytes << WEIGHT_SHIFT;
                } else {
                    let first = first_offset(packet_word);
                    let span = WEIGHT_ONE - first;
                    cache.oldest_first = first;
                    cache.oldest_packets_per_q = (packets << WEIGHT_SHIFT) / span;
                    cache.oldest_bytes_per_q = (bytes << WEIGHT_SHIFT) / span;
                }
            }
            age += 1;
        }
        cache
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

    /// The estimate at `elapsed` with the current bucket's words.
    #[inline(always)]
    pub fn estimate(&self, elapsed: u64, current_packets: u64, current_bytes: u64) -> Estimate {
        let inside = self.inside(elapsed);
        Estimate {
            packets: self.older_packets
                + inside * self.oldest_packets_per_q
                + (packets_in(current_packets, self.bucket) << WEIGHT_SHIFT),
            bytes: self.older_bytes
                + inside * self.oldest_bytes_per_q
                + (bytes_in(current_bytes, self.bucket) << WEIGHT_SHIFT),
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

/// [`try_admit`] through a CPU's [`WindowCache`] (which must cover
/// `now_ns`): the same decision, without the per-frame loop and divisions,
/// and on refusal the time until which refusing needs no look.
///
/// With `lease > 1` (only without a byte limit), an admitted frame takes
/// up to `lease` frames of allowance at once when they fit, so the caller
/// admits the next `granted - 1` frames of this bucket without touching
/// the shared window. Unused leased frames stay counted as admitted: that
/// errs on the side of admitting less, by at most `lease` per CPU and
/// bucket.
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
        let est = cache.estimate(elapsed, current, current_bytes);
        if !fits(est.packets, 1, params.allowance_packets)
            || !fits(est.bytes, len, params.allowance_bytes)
        {
            let current_only = Estimate {
                packets: packets_in(current, cache.bucket) << WEIGHT_SHIFT,
                bytes: bytes_in(current_bytes, cache.bucket) << WEIGHT_SHIFT,
            };
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
        if slots.compare_exchange(
            slot,
            PACKETS,
            current,
            packets_bumped_by(current, at, granted),
        ) {
            return Admission::Admitted { granted };
        }
        if count_bytes {
            give_back_bytes(slots, slot, cache.bucket, len);
        }
    }
    Admission::Refused {
        hold_until_ns: now_ns,
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

    #[test]
    fn an_exhausted_window_refuses_until_it_slides() {
        let ring: [[core::sync::atomic::AtomicU64; 2]; RING] = Default::default();
        let params = WindowParams {
            bucket_ns: 100,
            buckets: 10,
            allowance_packets: 5,
            allowance_bytes: UNLIMITED,
        };
        mark_exhausted(&ring, &params, 1_050);
        assert!(!try_admit(&ring, &params, 1_060, 1));
        assert!(
            !try_admit(&ring, &params, 1_999, 1),
            "still inside the window"
        );
        assert!(
            try_admit(&ring, &params, 2_100, 1),
            "slid out of the window"
        );
    }

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

        // An older bucket still inside the window: counted now.
        let ring = seeded(&params, 1_010, 1_550);
        assert_eq!(packets_in(ring.load(slot_of(15), PACKETS), 15), 1);
        assert_eq!(packets_in(ring.load(slot_of(10), PACKETS), 10), 0);

        // Gone from the window, or nothing owed: an empty window.
        for (at, now) in [(1_010, 1_010 + 100 * 11), (0, 1_050)] {
            let ring = seeded(&params, at, now);
            for i in 0..5 {
                assert!(try_admit(&ring, &params, now + 10, 1), "frame {i}");
            }
            assert!(!try_admit(&ring, &params, now + 20, 1));
        }
    }

    /// A ring whose byte words lose every compare-and-swap (another CPU
    /// always got there first), and that counts what it holds.
    struct ContendedBytes(AtomicRing);

    impl SlotRead for ContendedBytes {
        fn load(&self, slot: usize, field: usize) -> u64 {
            self.0.load(slot, field)
        }
    }

    impl SlotWrite for ContendedBytes {
        fn compare_exchange(&self, slot: usize, field: usize, current: u64, new: u64) -> bool {
            field != BYTES && self.0.compare_exchange(slot, field, current, new)
        }

        fn store(&self, slot: usize, field: usize, value: u64) {
            self.0.store(slot, field, value)
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
        let ring = ContendedBytes(AtomicRing::default());
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

    #[test]
    fn fits_respects_unlimited_and_boundaries() {
        assert!(fits(u64::MAX / 2, 1, UNLIMITED));
        assert!(fits(9 * WEIGHT_ONE, 1, 10));
        assert!(!fits(9 * WEIGHT_ONE + 1, 1, 10));
        assert!(fits(0, 1500, 1500));
        assert!(!fits(0, 1501, 1500));
    }
}
