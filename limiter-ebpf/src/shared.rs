//! Access to the `WINDOWS` value that all CPUs share: volatile loads and
//! stores for single words, and the BPF compare-and-swap (`cmpxchg`,
//! BPF ISA v3) for the window slots.

use core::{
    intrinsics::{atomic_cxchg, AtomicOrdering},
    ptr::{addr_of_mut, read_volatile, write_volatile},
};

use limiter_common::{
    sketch,
    window::{SlotRead, SlotWrite, RING},
    WindowState,
};

/// A `WindowState` inside the shared map.
#[derive(Clone, Copy)]
pub struct SharedWindow(pub *mut WindowState);

impl SharedWindow {
    #[inline(always)]
    fn slot_word(&self, slot: usize, field: usize) -> *mut u64 {
        // SAFETY: in-bounds field projection of a valid map value; masking
        // keeps the indices inside the arrays without a panic path.
        unsafe { addr_of_mut!((*self.0).slots[slot & (RING - 1)][field & 1]) }
    }

    #[inline(always)]
    pub fn blocked_until_ns(&self) -> u64 {
        // SAFETY: aligned u64 inside a live map value; a racing writer
        // stores whole words.
        unsafe { read_volatile(addr_of_mut!((*self.0).blocked_until_ns)) }
    }

    /// The `Rule::block_tag` of the rule that armed the penalty.
    #[inline(always)]
    pub fn blocked_tag(&self) -> u64 {
        // SAFETY: as above.
        unsafe { read_volatile(addr_of_mut!((*self.0).blocked_tag)) }
    }

    /// Arms a penalty until `until_ns` for the rule tagged `tag`. Two
    /// racing CPUs may interleave the two stores; each pair is one rule's
    /// own (refusing by one rule's tag for another's time errs by at most
    /// one penalty length of one of the rules, and only across a change).
    #[inline(always)]
    pub fn set_blocked(&self, until_ns: u64, tag: u64) {
        // SAFETY: as above.
        unsafe {
            write_volatile(addr_of_mut!((*self.0).blocked_tag), tag);
            write_volatile(addr_of_mut!((*self.0).blocked_until_ns), until_ns);
        }
    }

    /// The bucket width the slots are tagged with.
    #[inline(always)]
    pub fn bucket_ns(&self) -> u64 {
        // SAFETY: as above.
        unsafe { read_volatile(addr_of_mut!((*self.0).bucket_ns)) }
    }

    /// Claims this window's report to the cluster sync at `now_ns`: true
    /// for exactly one caller per `window_ns` (compare-and-swap on
    /// `hot_reported_ns`, so two CPUs finding the window hot at once send
    /// one event between them).
    #[inline(always)]
    pub fn claim_hot_report(&self, now_ns: u64, window_ns: u64) -> bool {
        let word = unsafe_field_hot_reported(self.0);
        // SAFETY: aligned u64 inside a live map value; a racing writer
        // stores whole words.
        let last = unsafe { read_volatile(word) };
        if last != 0 && now_ns.wrapping_sub(last) < window_ns {
            return false;
        }
        // SAFETY: as above; BPF_CMPXCHG is atomic.
        let (_, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                word, last, now_ns,
            )
        };
        swapped
    }

    /// Records a new bucket width (after clearing the slots). Several CPUs
    /// may do this at once after a rule change; they write the same value.
    #[inline(always)]
    pub fn set_bucket_ns(&self, value: u64) {
        // SAFETY: as above.
        unsafe { write_volatile(addr_of_mut!((*self.0).bucket_ns), value) }
    }
}

/// The address of a window's `hot_reported_ns`.
#[inline(always)]
fn unsafe_field_hot_reported(state: *mut WindowState) -> *mut u64 {
    // SAFETY: a field projection of a valid map value (no read).
    unsafe { addr_of_mut!((*state).hot_reported_ns) }
}

impl SlotRead for SharedWindow {
    #[inline(always)]
    fn load(&self, slot: usize, field: usize) -> u64 {
        // SAFETY: aligned word of a live map value (see slot_word).
        unsafe { read_volatile(self.slot_word(slot, field)) }
    }

    /// One `rX = rX` the compiler cannot see through: it keeps the
    /// window walk's masks arithmetic (a zero-length asm would do too, but
    /// its line-info record would share an instruction offset with the
    /// next, which 6.1's verifier refuses).
    #[inline(always)]
    fn opaque(&self, mut value: u64) -> u64 {
        // SAFETY: a register move to itself: no memory, stack or flags.
        unsafe { core::arch::asm!("{0} = {0}", inout(reg) value, options(pure, nomem, nostack)) };
        value
    }
}

impl SlotWrite for SharedWindow {
    #[inline(always)]
    fn compare_exchange(&self, slot: usize, field: usize, current: u64, new: u64) -> bool {
        // SAFETY: aligned word of a live map value; BPF_CMPXCHG is atomic.
        let (_, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                self.slot_word(slot, field),
                current,
                new,
            )
        };
        swapped
    }

    #[inline(always)]
    fn store(&self, slot: usize, field: usize, value: u64) {
        // SAFETY: aligned word of a live map value.
        unsafe { write_volatile(self.slot_word(slot, field), value) }
    }
}

/// Counts one frame of the source at `place` in the cold tier for the
/// epoch tagged `tag`, unless it already reads more than `limit`; returns
/// what it reads afterwards, or `None` when the compare-and-swap kept
/// losing (the caller then treats the source as busy).
#[inline(always)]
pub fn sketch_count(place: sketch::Place, tag: u64, limit: u32) -> Option<u32> {
    let word = crate::maps::SKETCH.get_ptr_mut(place.word)?;
    let mut attempts = 0;
    while attempts < 4 {
        // SAFETY: an aligned u64 of a live array element.
        let old = unsafe { read_volatile(word) };
        let count = sketch::count(old, tag, place);
        if count > limit {
            return Some(count);
        }
        let new = sketch::bumped(old, tag, place);
        // SAFETY: as above; BPF_CMPXCHG is atomic.
        let (_, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                word, old, new,
            )
        };
        if swapped {
            return Some(sketch::count(new, tag, place));
        }
        attempts += 1;
    }
    None
}
