//! Access to what all CPUs share: a `WINDOWS` value (volatile loads and
//! stores for single words, and the BPF compare-and-swap, `cmpxchg`, BPF
//! ISA v3, for the window slots) and the cheap tier's sketch.

use core::{
    intrinsics::{atomic_cxchg, atomic_xadd, AtomicOrdering},
    ptr::{addr_of_mut, read_volatile, write_volatile},
};

use aya_ebpf::maps::Array;
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

    /// Gives back a claim made at `now_ns` (its report could not be sent),
    /// so that the next CPU to find the window hot reports it; unless
    /// another claim replaced it meanwhile.
    #[inline(always)]
    pub fn release_hot_report(&self, now_ns: u64) {
        let word = unsafe_field_hot_reported(self.0);
        // SAFETY: aligned u64 inside a live map value; BPF_CMPXCHG is
        // atomic.
        unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                word, now_ns, 0,
            )
        };
    }

    /// Whether the source was heavy at its last admission
    /// (`WindowState::heavy`).
    #[inline(always)]
    pub fn heavy(&self) -> bool {
        // SAFETY: as above.
        unsafe { read_volatile(addr_of_mut!((*self.0).heavy)) != 0 }
    }

    /// Records whether the source is heavy after an admission, storing
    /// only a change (a store to a line other CPUs read).
    #[inline(always)]
    pub fn note_heavy(&self, heavy: bool) {
        if self.heavy() != heavy {
            // SAFETY: as above.
            unsafe { write_volatile(addr_of_mut!((*self.0).heavy), u64::from(heavy)) }
        }
    }

    /// Records a new bucket width (after clearing the slots). Several CPUs
    /// may do this at once after a rule change; they write the same value.
    #[inline(always)]
    pub fn set_bucket_ns(&self, value: u64) {
        // SAFETY: as above.
        unsafe { write_volatile(addr_of_mut!((*self.0).bucket_ns), value) }
    }
}

/// `value` through one `rX = rX` the compiler cannot see through: a mask
/// applied after it stays (the window walk's masks stay arithmetic; an
/// index masked after a test the compiler already made is still masked
/// where the verifier needs it). A zero-length asm would do too, but its
/// line-info record would share an instruction offset with the next,
/// which 6.1's verifier refuses.
#[inline(always)]
pub fn opaque(mut value: u64) -> u64 {
    // SAFETY: a register move to itself: no memory, stack or flags.
    unsafe { core::arch::asm!("{0} = {0}", inout(reg) value, options(pure, nomem, nostack)) };
    value
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

    #[inline(always)]
    fn opaque(&self, value: u64) -> u64 {
        opaque(value)
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

    #[inline(always)]
    fn fetch_add(&self, slot: usize, field: usize, amount: u64) -> u64 {
        // SAFETY: aligned word of a live map value; BPF_ATOMIC_ADD with
        // BPF_FETCH (BPF ISA v3) is atomic.
        unsafe {
            atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(self.slot_word(slot, field), amount)
        }
    }
}

/// A word of the sketch, as the raw pointer the compare-and-swap takes.
#[inline(always)]
fn sketch_word(place: sketch::Place, tag: u64) -> Option<(*mut u64, u64)> {
    let pair = crate::maps::SKETCH.get_ptr_mut(place.word)?;
    // SAFETY: a live array element; its two aligned words.
    let (word, other) = unsafe {
        let words = pair as *mut u64;
        let here = sketch::half(tag);
        (words.add(here), read_volatile(words.add(here ^ 1)))
    };
    Some((word, other))
}

/// Counts one frame of the source at `place` in the cold tier for the
/// epoch tagged `tag`, unless this epoch already reads more than `limit`;
/// returns what it reads afterwards in this epoch and the last, or `None`
/// when the compare-and-swap kept losing (the caller then treats the
/// source as busy).
#[inline(always)]
pub fn sketch_count(place: sketch::Place, tag: u64, limit: u32) -> Option<sketch::Seen> {
    let (word, other) = sketch_word(place, tag)?;
    let previous = sketch::count(other, sketch::previous(tag), place);
    let mut attempts = 0;
    while attempts < 4 {
        // SAFETY: an aligned u64 of a live array element.
        let old = unsafe { read_volatile(word) };
        let current = sketch::count(old, tag, place);
        if current > limit {
            return Some(sketch::Seen { current, previous });
        }
        let new = sketch::bumped(old, tag, place);
        // SAFETY: as above; BPF_CMPXCHG is atomic.
        let (_, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                word, old, new,
            )
        };
        if swapped {
            let current = sketch::count(new, tag, place);
            return Some(sketch::Seen { current, previous });
        }
        attempts += 1;
    }
    None
}

/// Marks the source at `place` windowed in the epoch tagged `tag`
/// (`sketch::marked`), unless another CPU's frame did already. A mark
/// lost to a compare-and-swap that kept losing only leaves the source's
/// next frame to mark it.
#[inline(always)]
pub fn sketch_mark(place: sketch::Place, tag: u64) {
    let Some((word, _)) = sketch_word(place, tag) else {
        return;
    };
    let mut attempts = 0;
    while attempts < 4 {
        // SAFETY: an aligned u64 of a live array element.
        let old = unsafe { read_volatile(word) };
        if sketch::count(old, tag, place) >= sketch::WINDOWED {
            return;
        }
        let new = sketch::marked(old, tag, place);
        // SAFETY: as above; BPF_CMPXCHG is atomic.
        let (_, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                word, old, new,
            )
        };
        if swapped {
            return;
        }
        attempts += 1;
    }
}

/// Whether mark cell `cell` of `marks` (`SHARE_MARKS`) still holds at `now` (a missing cell counts as marked:
/// fail closed, to the window).
#[inline(always)]
pub fn marked(marks: &Array<u64>, cell: u32, now: u64) -> bool {
    match marks.get_ptr(cell) {
        // SAFETY: an aligned u64 of a live array element.
        Some(until) => now < unsafe { read_volatile(until) },
        None => true,
    }
}
