//! The tickets of the windows of sources that have not proved their
//! address (`UNPROVEN`): taken when such a window is made, and, when none
//! is left, freed in the program itself from the oldest windows found
//! idle, so that new sources get windows while no daemon runs to reclaim
//! them. Each rule takes from its reserve first, then from the shared
//! room (`limiter_common::tickets::Rooms`; `TICKET_COUNTS` holds what each
//! account holds), so a flood under one rule never takes another's
//! reserve. `TICKET_RING` holds the keys in the order their tickets were
//! taken; `TICKET_CLOCK` counts what was appended and what was looked at.
//! A source that proved its address while the tickets were taken gets a
//! ticket of the proven room (`tickets::PROVEN`, bounded by `WINDOWS`'
//! room beyond the tickets), so its window is freed idle as the others
//! are. A ticket of an IPv6 source, proven or not, counts on its /48's
//! cells too (`PREFIX_TICKETS`), so one holder of a /48 takes its
//! prefix's room and no more. docs/architecture.md, "Proof before
//! state", "Room per rule" and "Room per prefix", has the bounds.

use core::{
    intrinsics::{atomic_cxchg, atomic_xadd, AtomicOrdering},
    ptr::{read_volatile, write_volatile},
};

use aya_ebpf::{helpers::bpf_ktime_get_ns, maps::Array};
use limiter_common::{
    rules::RULE_SLOTS,
    tickets::{
        prefix_cells, prefix_returned_index, prefix_taken_index, returned_index, taken_index,
        Rooms, Ticket, CLOCK_APPENDED, CLOCK_LOOKED, CLOCK_PREFIX, CLOCK_RESERVE, CLOCK_RESTING,
        CLOCK_RING, CLOCK_SHARED, LOOK_REST_NS, PROVEN, SHARED,
    },
    Outcome, SourceKey, WindowState,
};

use super::window::{pressure, PRESSURE_WINDOWS};

use super::BPF_NOEXIST;
use crate::maps::{
    self, CONFIG, PREFIX_TICKETS, TICKET_CLOCK, TICKET_COUNTS, TICKET_RING, UNPROVEN, WINDOWS,
};

/// `bpf_map_update_elem`'s error when a map without eviction is full.
const E2BIG: i32 = -7;
/// `bpf_map_update_elem`'s error when `BPF_NOEXIST` finds the key.
const EEXIST: i32 = -17;
/// `TICKET_CLOCK` indices.
const APPENDED: u32 = CLOCK_APPENDED;
const LOOKED: u32 = CLOCK_LOOKED;
const CAPACITY: u32 = CLOCK_RING;
/// Ring entries looked at when no ticket is left, at most, per frame: a
/// frame that finds no idle window among them is refused; a busy one
/// looked at goes back to the end, so a flood of busy windows costs each
/// refused frame two lookups and moves the ring on.
const LOOKS: u32 = 2;

/// [`take`]'s answer: a ticket taken now, or the source's own from
/// before.
pub(super) const TAKEN: u32 = 1;
/// [`take`]'s answer: none left.
pub(super) const NONE_LEFT: u32 = 0;
/// [`take`]'s answer: the map refused otherwise.
pub(super) const REFUSED: u32 = 2;

/// Takes a ticket for the window keyed `key` of the rule in `slot`: of
/// the proven room if `proven` (non-zero: the frame proved its source,
/// counted `proven`), else of the rule's reserve or the shared room; and
/// on its /48's cells (an IPv6 source) either way. [`TAKEN`],
/// [`NONE_LEFT`] (counted `prefix_full` when its prefix had no room, once
/// a frame) or [`REFUSED`].
#[inline(always)]
pub(super) fn take(key: &SourceKey, slot: u32, proven: u32, len: u64) -> u32 {
    if UNPROVEN.get_ptr(key).is_some() {
        // The source's own, from before.
        return TAKEN;
    }
    let seed = CONFIG.get(0).map_or(0, |config| config.sketch_seed);
    let cells = prefix_cells(key, seed);
    if let Some(cells) = cells {
        if !open_prefix(cells) {
            // Counted by a frame's first ask, which is never a proven one
            // (a proven frame asks for a rule's ticket first).
            if proven == 0 {
                maps::count(Outcome::PrefixFull, len);
            }
            return NONE_LEFT;
        }
    }
    let account = if proven != 0 {
        // The proven room's bound is `WINDOWS` itself: counted, never
        // refused here.
        add(taken_index(PROVEN), 1);
        Some(PROVEN)
    } else {
        open_account(slot)
    };
    let Some(account) = account else {
        close_prefix(cells);
        return NONE_LEFT;
    };
    match UNPROVEN.insert(key, Ticket::new(account, cells), BPF_NOEXIST) {
        Ok(()) => {
            append(key);
            if proven != 0 {
                maps::count(Outcome::Proven, len);
            }
            TAKEN
        }
        Err(e) => {
            add(taken_index(account), u64::MAX);
            close_prefix(cells);
            match e {
                EEXIST => TAKEN,
                E2BIG => NONE_LEFT,
                _ => REFUSED,
            }
        }
    }
}

/// Gives back the ticket of `key` (its window could not be made).
#[inline(always)]
pub(super) fn give_back(key: &SourceKey) {
    remove(key);
}

/// Removes the ticket of `key`, if it has one, and counts it given back
/// to its account and its prefix's cells; whether one was removed (a
/// racing CPU may have).
#[inline(always)]
fn remove(key: &SourceKey) -> bool {
    let ticket = match UNPROVEN.get_ptr(key) {
        // SAFETY: a live map value, written once at insert.
        Some(ticket) => unsafe { read_volatile(ticket) },
        None => return false,
    };
    if UNPROVEN.remove(key).is_err() {
        return false;
    }
    add(taken_index(ticket.account()), u64::MAX);
    close_prefix(ticket.cells());
    true
}

/// Counts a ticket on the prefix cells `cells` if the prefix has room
/// (the lesser of its two cells below `Rooms::prefix`); whether it had,
/// with nothing counted if not. Counted before it is looked at, as an
/// account is, so CPUs racing for a prefix's last ticket take at most one
/// each past it.
#[inline(always)]
fn open_prefix(cells: [u16; 2]) -> bool {
    let Some(room) = clock(CLOCK_PREFIX) else {
        return false;
    };
    // SAFETY: an aligned word of a live array element.
    let room = unsafe { read_volatile(room) };
    let rooms = Rooms {
        reserve: 0,
        shared: 0,
        prefix: room,
        proven: 0,
    };
    // A prefix found full by a plain read is not counted on.
    if !rooms.prefix_has_room(prefix_held(cells[0]).min(prefix_held(cells[1]))) {
        return false;
    }
    let before = prefix_held_after_add(cells[0]).min(prefix_held_after_add(cells[1]));
    if rooms.prefix_has_room(before) {
        return true;
    }
    close_prefix(Some(cells));
    false
}

/// Takes a ticket off the prefix cells `cells` (none: no prefix).
#[inline(always)]
fn close_prefix(cells: Option<[u16; 2]>) {
    if let Some(cells) = cells {
        prefix_add(prefix_taken_index(cells[0]), u64::MAX);
        prefix_add(prefix_taken_index(cells[1]), u64::MAX);
    }
}

/// The tickets on prefix cell `cell`, as a plain read finds them.
#[inline(always)]
fn prefix_held(cell: u16) -> u64 {
    words_held(
        &PREFIX_TICKETS,
        prefix_taken_index(cell),
        prefix_returned_index(cell),
    )
}

/// Counts one more ticket on prefix cell `cell`; the tickets it held
/// before.
#[inline(always)]
fn prefix_held_after_add(cell: u16) -> u64 {
    words_held_after_add(
        &PREFIX_TICKETS,
        prefix_taken_index(cell),
        prefix_returned_index(cell),
    )
}

/// Adds `n` (wrapping: `u64::MAX` takes one off) to `PREFIX_TICKETS` at
/// `index`.
#[inline(always)]
fn prefix_add(index: u32, n: u64) {
    words_add(&PREFIX_TICKETS, index, n);
}

/// Counts a ticket on the account of the rule in `slot` if its reserve
/// has room, else on the shared room's if it has; the account, or `None`
/// with nothing counted. Counted before it is looked at, so two CPUs
/// never both take the last ticket of an account.
#[inline(always)]
fn open_account(slot: u32) -> Option<u16> {
    let (Some(reserve), Some(shared)) = (clock(CLOCK_RESERVE), clock(CLOCK_SHARED)) else {
        return None;
    };
    // SAFETY: aligned words of live array elements.
    let rooms = unsafe {
        Rooms {
            reserve: read_volatile(reserve),
            shared: read_volatile(shared),
            prefix: 0,
            proven: 0,
        }
    };
    // An account found full by a plain read is not counted on: a flood
    // past its rooms reads shared words and writes none.
    let own = slot as u16;
    if slot < RULE_SLOTS && rooms.reserve_has_room(held(own)) {
        if rooms.reserve_has_room(held_after_add(own)) {
            return Some(own);
        }
        add(taken_index(own), u64::MAX);
    }
    if rooms.shared_has_room(held(SHARED)) {
        if rooms.shared_has_room(held_after_add(SHARED)) {
            return Some(SHARED);
        }
        add(taken_index(SHARED), u64::MAX);
    }
    None
}

/// The tickets `account` holds, as a plain read finds them.
#[inline(always)]
fn held(account: u16) -> u64 {
    words_held(
        &TICKET_COUNTS,
        taken_index(account),
        returned_index(account),
    )
}

/// Counts one more ticket on `account`; the tickets it held before.
#[inline(always)]
fn held_after_add(account: u16) -> u64 {
    words_held_after_add(
        &TICKET_COUNTS,
        taken_index(account),
        returned_index(account),
    )
}

/// Adds `n` (wrapping: `u64::MAX` takes one off) to `TICKET_COUNTS` at
/// `index`.
#[inline(always)]
fn add(index: u32, n: u64) {
    words_add(&TICKET_COUNTS, index, n);
}

/// What a counter of `counts` holds, its words at `taken` (the program's)
/// and `returned` (the daemon's), as a plain read finds them (`u64::MAX`
/// for an index out of the map: no room).
#[inline(always)]
fn words_held(counts: &Array<u64>, taken: u32, returned: u32) -> u64 {
    let (Some(taken), Some(returned)) = (counts.get_ptr(taken), counts.get_ptr(returned)) else {
        return u64::MAX;
    };
    // SAFETY: aligned words of live array elements.
    unsafe { read_volatile(taken).wrapping_sub(read_volatile(returned)) }
}

/// Counts one more on a counter of `counts`; what it held before.
#[inline(always)]
fn words_held_after_add(counts: &Array<u64>, taken: u32, returned: u32) -> u64 {
    let (Some(taken), Some(returned)) = (counts.get_ptr_mut(taken), counts.get_ptr(returned))
    else {
        return u64::MAX;
    };
    // SAFETY: aligned words of live array elements; BPF_ATOMIC_ADD with
    // BPF_FETCH is atomic, and the daemon alone writes `returned`.
    unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(taken, 1)
            .wrapping_sub(read_volatile(returned))
    }
}

/// Adds `n` (wrapping: `u64::MAX` takes one off) to `counts` at `index`.
#[inline(always)]
fn words_add(counts: &Array<u64>, index: u32, n: u64) {
    if let Some(word) = counts.get_ptr_mut(index) {
        // SAFETY: an aligned word of a live array element; atomic.
        unsafe {
            atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(word, n);
        }
    }
}

/// While the tickets were found all taken within the last 61 s
/// (`PRESSURE_WINDOWS`), looks at the ring's oldest entries for an idle
/// window to free ([`free_idle`]), before a source without per-CPU state
/// is judged on its window: one it frees is a ticket for whichever
/// source asks next. Its answer is not looked at: the judge meets one
/// path either way.
#[inline(always)]
pub(super) fn free_under_pressure(now: u64) {
    if now < pressure(PRESSURE_WINDOWS) {
        free_idle(now);
    }
}

/// The word of `TICKET_CLOCK` at `index`.
#[inline(always)]
fn clock(index: u32) -> Option<*mut u64> {
    TICKET_CLOCK.get_ptr_mut(index)
}

/// Appends `key` to the ring (over its oldest entry when full).
#[inline(always)]
fn append(key: &SourceKey) {
    let (Some(appended), Some(capacity)) = (clock(APPENDED), clock(CAPACITY)) else {
        return;
    };
    // SAFETY: aligned words of live array elements; BPF_ATOMIC_ADD with
    // BPF_FETCH is atomic.
    let (at, capacity) = unsafe {
        (
            atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(appended, 1),
            read_volatile(capacity),
        )
    };
    if capacity == 0 {
        return;
    }
    let Some(entry) = TICKET_RING.get_ptr_mut((at % capacity) as u32) else {
        return;
    };
    let words = key as *const SourceKey as *const u32;
    let entry = entry as *mut u32;
    // SAFETY: a live array element of `SourceKey` size (20 bytes, five
    // aligned words), written word by word (a struct store would be a
    // `memcpy` call); a racing reader may see a key half written, which
    // it looks up in vain (no window: its entry is dropped).
    unsafe {
        for i in 0..5 {
            write_volatile(entry.add(i), read_volatile(words.add(i)));
        }
    }
}

/// Looks at up to [`LOOKS`] of the ring's oldest entries at `now`: frees
/// the window and ticket of the first found idle (1), or of none (0). An
/// entry whose window is gone (the daemon reclaimed it, or it was never
/// made) has its ticket, if any, given back and counts as freed; a busy
/// one goes back to the end. A look that freed nothing rests the ring
/// for `LOOK_REST_NS` by the kernel's fine clock (`CLOCK_RESTING`):
/// until then, no CPU looks.
///
/// A global BPF function: the verifier checks it (and `idle_at`'s walk
/// over the window's buckets) once on its own.
#[no_mangle]
#[inline(never)]
pub extern "C" fn free_idle(now: u64) -> u32 {
    let (Some(appended), Some(looked), Some(capacity), Some(resting)) = (
        clock(APPENDED),
        clock(LOOKED),
        clock(CAPACITY),
        clock(CLOCK_RESTING),
    ) else {
        return 0;
    };
    // The fine clock: the coarse one moves a tick (1 to 4 ms) at a time.
    // SAFETY: a helper without arguments.
    let fine = unsafe { bpf_ktime_get_ns() };
    // SAFETY: an aligned word of a live array element; a plain read (a
    // race with a CPU setting it costs one look more or less).
    if fine < unsafe { read_volatile(resting) } {
        return 0;
    }
    let mut i = 0;
    while i < LOOKS {
        i += 1;
        // SAFETY: aligned words of live array elements.
        let (observed, capacity, next) = unsafe {
            (
                read_volatile(looked),
                read_volatile(capacity),
                read_volatile(appended),
            )
        };
        if capacity == 0 || observed >= next {
            return 0;
        }
        // Entries written over (the ring lapped) are skipped to the
        // oldest one still there.
        let seen = if next - observed > capacity {
            next - capacity
        } else {
            observed
        };
        // SAFETY: as above; BPF_CMPXCHG is atomic.
        let (_, claimed) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                looked,
                observed,
                seen + 1,
            )
        };
        if !claimed {
            continue;
        }
        let Some(entry) = TICKET_RING.get_ptr((seen % capacity) as u32) else {
            return 0;
        };
        // The entry itself is the key (a racing append may change it while
        // it is looked up: a key half written is looked up in vain).
        // SAFETY: a live array element.
        let key = unsafe { &*entry };
        match WINDOWS.get_ptr(key) {
            None => {
                if remove(key) {
                    return 1;
                }
            }
            Some(window) => {
                // SAFETY: a live map value; racing admissions write whole
                // words (one counted in the instant before the delete is
                // lost with it, as with the daemon's reclaim).
                let idle = unsafe { idle(window, now) };
                if idle {
                    let _ = WINDOWS.remove(key);
                    remove(key);
                    return 1;
                }
                append(key);
            }
        }
    }
    // SAFETY: as above; a plain store, any CPU's as good as another's.
    unsafe { write_volatile(resting, fine + LOOK_REST_NS) };
    0
}

/// Whether the window at `window` counts nothing at `now`.
///
/// # Safety
/// `window` points at a live `WINDOWS` value.
#[inline(always)]
unsafe fn idle(window: *const WindowState, now: u64) -> bool {
    // SAFETY: the caller's.
    unsafe { (*window).idle_at(now) }
}
