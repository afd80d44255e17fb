//! Per-CPU scratch: values too large for the BPF stack (a new `SOURCES`
//! or `WINDOWS` value, the frame's key) are built in this CPU's slot of a
//! one-entry per-CPU array instead. A seed (`TRAFFIC_SEED`,
//! `WINDOW_SEED`) is all zero between uses, so that filling it sets only
//! what differs from zero; [`seeded`] is the one way to use one, and puts
//! the zero back.

use core::{
    mem::{align_of, offset_of, size_of},
    ptr::write_volatile,
};

use aya_ebpf::maps::PerCpuArray;
use limiter_common::{
    rules::LevelWindow,
    window::{BYTES, PACKETS, RING},
    SourceTraffic, WindowState,
};

use crate::maps::{LEVEL_SEED, TRAFFIC_SEED, WINDOW_SEED};

/// This CPU's slot of the one-entry per-CPU array `map`.
// Mutable through a shared map reference, as `PerCpuArray::get_ptr_mut`
// is: the slot belongs to this CPU, not to the reference.
#[allow(clippy::mut_from_ref)]
#[inline(always)]
pub(super) fn slot<T>(map: &'static PerCpuArray<T>) -> Option<&'static mut T> {
    let slot = map.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of a per-CPU array; XDP runs with migration
    // disabled and every user of a slot is done with it before the frame's
    // program returns, so nothing else touches it meanwhile.
    Some(unsafe { &mut *slot })
}

/// Hands this CPU's seed for `use_` (all zero) to `fill_and_use`, then
/// zeroes what that use may have set. `None` when the slot is missing.
#[inline(always)]
pub(super) fn seeded<S: Seed, R>(
    use_: S,
    fill_and_use: impl FnOnce(&mut S::Value) -> R,
) -> Option<R> {
    let seed = slot(S::map())?;
    let out = fill_and_use(seed);
    use_.rezero(seed);
    Some(out)
}

/// A use of a seed: its map, and how to put back the zero of every word
/// the use may set. Zeroing only those keeps the stores few; every store
/// is volatile, one word each, because plain stores of adjacent words are
/// merged into a `memset` call: a BPF function the verifier walks again
/// at every call, and one `limit` must not make (its stack and its
/// caller's fill 6.1's 512 bytes).
pub(super) trait Seed {
    type Value: 'static;
    fn map() -> &'static PerCpuArray<Self::Value>;
    fn rezero(&self, value: &mut Self::Value);
}

/// A new source's per-CPU state: `SourceTraffic::count_first` is all it
/// sets.
pub(super) struct NewSource;

impl Seed for NewSource {
    type Value = SourceTraffic;

    #[inline(always)]
    fn map() -> &'static PerCpuArray<SourceTraffic> {
        &TRAFFIC_SEED
    }

    #[inline(always)]
    fn rezero(&self, value: &mut SourceTraffic) {
        // SAFETY: aligned fields of this CPU's scratch.
        unsafe {
            write_volatile(&mut value.second, 0);
            write_volatile(&mut value.current.packets, 0);
            write_volatile(&mut value.current.bytes, 0);
            write_volatile(&mut value.total.packets, 0);
            write_volatile(&mut value.total.bytes, 0);
        }
    }
}

/// The exact tier's stand-in for a source's per-CPU state, which `limit`
/// may write anywhere in: every word but those of the fields neither the
/// exact tier nor `limit` writes (`previous`, `dropped`,
/// `last_refused_ns`: a source's history, which a stand-in has none of).
pub(super) struct ExactState;

impl ExactState {
    /// Whether word `word` of a `SourceTraffic` is one of the fields never
    /// written in a stand-in.
    const fn untouched(word: usize) -> bool {
        let previous = offset_of!(SourceTraffic, previous) / 8;
        let dropped = offset_of!(SourceTraffic, dropped) / 8;
        let last_refused = offset_of!(SourceTraffic, last_refused_ns) / 8;
        (word >= previous && word < previous + 2)
            || (word >= dropped && word < dropped + 2)
            || word == last_refused
    }
}

impl Seed for ExactState {
    type Value = SourceTraffic;

    #[inline(always)]
    fn map() -> &'static PerCpuArray<SourceTraffic> {
        &TRAFFIC_SEED
    }

    #[inline(always)]
    fn rezero(&self, value: &mut SourceTraffic) {
        const WORDS: usize = size_of::<SourceTraffic>() / 8;
        const _: () = assert!(size_of::<SourceTraffic>().is_multiple_of(8));
        const _: () = assert!(align_of::<SourceTraffic>() == 8);
        let words = (value as *mut SourceTraffic).cast::<u64>();
        for word in 0..WORDS {
            if Self::untouched(word) {
                continue;
            }
            // SAFETY: `SourceTraffic` is `#[repr(C)]` integers and explicit
            // padding, 8-aligned and a whole number of words (asserted
            // above), for which all zero is a valid value: each store is
            // an aligned word inside this CPU's scratch.
            unsafe { write_volatile(words.add(word), 0) };
        }
    }
}

/// A new window: the bucket width and a block are all it sets.
pub(super) struct NewWindow;

impl Seed for NewWindow {
    type Value = WindowState;

    #[inline(always)]
    fn map() -> &'static PerCpuArray<WindowState> {
        &WINDOW_SEED
    }

    #[inline(always)]
    fn rezero(&self, value: &mut WindowState) {
        // SAFETY: aligned words of this CPU's scratch.
        unsafe {
            write_volatile(&mut value.bucket_ns, 0);
            write_volatile(&mut value.blocked_until_ns, 0);
            write_volatile(&mut value.blocked_tag, 0);
        }
    }
}

/// A new level window: its bucket width, and its slots (copied from an
/// overflow cell), are all it sets.
pub(super) struct NewLevelWindow;

impl Seed for NewLevelWindow {
    type Value = LevelWindow;

    #[inline(always)]
    fn map() -> &'static PerCpuArray<LevelWindow> {
        &LEVEL_SEED
    }

    #[inline(always)]
    fn rezero(&self, value: &mut LevelWindow) {
        // SAFETY: aligned words of this CPU's scratch.
        unsafe {
            write_volatile(&mut value.window.bucket_ns, 0);
            let mut slot = 0;
            while slot < RING {
                write_volatile(&mut value.window.slots[slot][PACKETS], 0);
                write_volatile(&mut value.window.slots[slot][BYTES], 0);
                slot += 1;
            }
        }
    }
}
