//! A rule's further levels (`limiter_common::rules::level`): each level
//! of a frame's rule admits it against that level's shared window
//! (`AGGREGATES`; while that is full, the overflow cell an aggregate
//! without a window hashes to, `AGG_CELLS`), or refuses it, before the
//! source's own window judges it. A rule without levels never gets here
//! (its callers test `Rule::level_count` first), and neither does a frame
//! its source's hold refused.

use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use limiter_common::{
    rules::{LevelWindow, MAX_LEVELS},
    window::{self, Admission, WindowCache, WindowParams},
    Level, LevelKey, Outcome, Rule, SourceKey,
};

use super::{
    scratch,
    window::{note_pressure, pressure, PRESSURE_AGGREGATES},
    BPF_NOEXIST,
};
use crate::{
    maps::{self, AGGREGATES, AGG_CELLS, CONFIG, FRAME_DST, FRAME_KEY, RULES},
    shared::{self, SharedWindow},
};

/// `bpf_map_update_elem`'s error when a map without eviction is full.
const E2BIG: i32 = -7;

/// `levels`' flags: the source is heavy (its own window holds more than
/// its rule's `fair_packets`).
pub(super) const LEVEL_HEAVY: u32 = 1;
/// `levels`' flags: the source's own window refused the frame every level
/// admitted: each level gives it back (`window::give_back_packet`), so
/// that a frame one limit refuses never uses up another's allowance.
pub(super) const LEVEL_GIVE_BACK: u32 = 2;
/// `levels`' flags: a cheap-tier frame: the aggregates only, no level
/// that counts per source (`source`, `pair`), which would take a window
/// for every source of a spoofed flood; the rule's cheap frames are sized
/// to fit within those levels (`Rule::cheap_frames`).
pub(super) const LEVEL_AGGREGATES_ONLY: u32 = 4;

/// With [`LEVEL_GIVE_BACK`], gives the frame back to every level instead
/// (returns 0). Otherwise admits the frame keyed `FRAME_KEY` (toward
/// `FRAME_DST`) at `now` (the frame's time, read once by the judge)
/// against every level of rule `index`, in order. Returns 0
/// when all admit it, else 1 + the index of the level that refused it
/// (the levels before it counted the frame: a refused frame may use up a
/// little of their allowance, never more than they allow).
///
/// A global BPF function, as `limit` is: the verifier checks it once,
/// whichever tier calls it. Each level is judged by another, [`level`],
/// so that the verifier checks one level's judgement once, not once per
/// level and per way the levels before it went.
#[no_mangle]
#[inline(never)]
pub extern "C" fn levels(index: u32, flags: u32, now: u64) -> u32 {
    let Some(rule) = RULES.get(index) else {
        return 0;
    };
    let count = rule.level_count() as u32;
    let mut i = 0;
    while i < MAX_LEVELS as u32 {
        if i >= count {
            break;
        }
        if level(index, i, flags, now) == 0 {
            return i + 1;
        }
        i += 1;
    }
    0
}

/// Level `at` of rule `index` judges the frame keyed `FRAME_KEY` (toward
/// `FRAME_DST`) at `now`, as `levels` asks (`flags`): 1 admitted (or
/// given back), 0 refused. A global BPF function; it calls none.
#[no_mangle]
#[inline(never)]
pub extern "C" fn level(index: u32, at: u32, flags: u32, now: u64) -> u32 {
    let Some(rule) = RULES.get(index) else {
        return 1;
    };
    let (Some(key), Some(words)) = (FRAME_KEY.get(0), FRAME_DST.get(0)) else {
        return 1;
    };
    // SAFETY: `[u32; 4]` and `[u8; 16]` have the same size, every bit
    // pattern is valid for both, and bytes need no alignment: the words'
    // bytes, in the order the frame carried them.
    let destination = unsafe { &*(words as *const [u32; 4]).cast::<[u8; 16]>() };
    if at as usize >= MAX_LEVELS {
        return 1;
    }
    // Masked as well as tested (the mask past what the compiler can see):
    // the compiler reloads `at` from the stack after its test, where the
    // verifier has lost its bound.
    let level = &rule.levels[shared::opaque(u64::from(at)) as usize & (MAX_LEVELS - 1)];
    if flags & LEVEL_AGGREGATES_ONLY != 0 && !level.kind().is_some_and(|kind| kind.is_aggregate()) {
        return 1;
    }
    let at = at as u8;
    if flags & LEVEL_GIVE_BACK != 0 {
        let lkey = level.key(key, destination, rule.budget, rule.level_tag(), at);
        // By reference: a copy of the key would take stack.
        #[allow(clippy::needless_borrows_for_generic_args)]
        let found = AGGREGATES.get_ptr_mut(&lkey);
        if let (Some(value), true) = (found, level.bucket_ns != 0) {
            // SAFETY: a field of a live map value.
            let window = SharedWindow(unsafe { addr_of_mut!((*value).window) });
            window::give_back_packet(&window, now / level.bucket_ns);
        }
        return 1;
    }
    let heavy = flags & LEVEL_HEAVY != 0;
    u32::from(admit(rule, level, key, destination, at, now, heavy))
}

/// One level's judgement of the frame: admitted (and counted) or not.
/// Without a window (neither its own nor a cell), refused: a level never
/// admits a frame it does not count.
#[inline(always)]
fn admit(
    rule: &Rule,
    level: &Level,
    key: &SourceKey,
    destination: &[u8; 16],
    index: u8,
    now: u64,
    heavy: bool,
) -> bool {
    let lkey = level.key(key, destination, rule.budget, rule.level_tag(), index);
    let params = level.params(heavy);
    let Some(value) = find_or_create(&lkey, level.bucket_ns, now) else {
        return false;
    };
    // SAFETY: a field of a live map value.
    let window = SharedWindow(unsafe { addr_of_mut!((*value).window) });
    if window.bucket_ns() != level.bucket_ns {
        // Tagged with another bucket width (the level changed): afresh.
        window::clear(&window);
        window.set_bucket_ns(level.bucket_ns);
    }
    let view = view(value, &window, &params, now);
    matches!(
        window::try_admit_cached(&window, &view, &params, now, 1, 1),
        Admission::Admitted { .. }
    )
}

/// The view of `window`'s older buckets for the bucket of `now`: the one
/// `value` shares when it is for that bucket (read word by word, and
/// taken only if its bucket width still reads the same after: a CPU
/// writing a new one clears it first), else computed here and shared.
#[inline(always)]
fn view(
    value: *mut LevelWindow,
    window: &SharedWindow,
    params: &WindowParams,
    now: u64,
) -> WindowCache {
    // SAFETY (the reads and writes below): aligned words of a live map
    // value; another CPU writes them whole, word by word, never in part.
    unsafe {
        let shared = addr_of_mut!((*value).view);
        let width = read_volatile(addr_of!((*shared).bucket_ns));
        if width == params.bucket_ns && width != 0 {
            let view = WindowCache {
                bucket: read_volatile(addr_of!((*shared).bucket)),
                start_ns: read_volatile(addr_of!((*shared).start_ns)),
                bucket_ns: width,
                inv_bucket: read_volatile(addr_of!((*shared).inv_bucket)),
                older_packets: read_volatile(addr_of!((*shared).older_packets)),
                older_bytes: 0,
                oldest_packets_per_q: read_volatile(addr_of!((*shared).oldest_packets_per_q)),
                oldest_bytes_per_q: 0,
                oldest_first: read_volatile(addr_of!((*shared).oldest_first)),
            };
            if view.covers(now, width) && read_volatile(addr_of!((*shared).bucket_ns)) == width {
                return view;
            }
        }
        let view = WindowCache::refresh(window, params, now);
        write_volatile(addr_of_mut!((*shared).bucket_ns), 0);
        write_volatile(addr_of_mut!((*shared).bucket), view.bucket);
        write_volatile(addr_of_mut!((*shared).start_ns), view.start_ns);
        write_volatile(addr_of_mut!((*shared).inv_bucket), view.inv_bucket);
        write_volatile(addr_of_mut!((*shared).older_packets), view.older_packets);
        write_volatile(
            addr_of_mut!((*shared).oldest_packets_per_q),
            view.oldest_packets_per_q,
        );
        write_volatile(addr_of_mut!((*shared).oldest_first), view.oldest_first);
        write_volatile(addr_of_mut!((*shared).bucket_ns), view.bucket_ns);
        view
    }
}

/// The window of `lkey`: its own, created (tagged with `bucket_ns`) if
/// it is not there; while `AGGREGATES` is full, the overflow cell it
/// hashes to (counted as `aggregate_full`). An aggregate created within
/// `PRESSURE_NS` (61 s) of `AGGREGATES` being full starts with its cell's counts:
/// what it may have been admitted on the cell meanwhile (and what other
/// aggregates there were: the refusing side), so that nothing it was
/// admitted there is admitted again. `None`: neither could be had
/// (counted as `insert_failure`).
#[inline(always)]
fn find_or_create(lkey: &LevelKey, bucket_ns: u64, now: u64) -> Option<*mut LevelWindow> {
    if let Some(value) = AGGREGATES.get_ptr_mut(lkey) {
        return Some(value);
    }
    let seed = CONFIG.get(0).map_or(0, |config| config.sketch_seed);
    let cell = lkey.cell(seed);
    let pressed = now < pressure(PRESSURE_AGGREGATES);
    let inserted = scratch::seeded(scratch::NewLevelWindow, |new: &mut LevelWindow| {
        new.window.bucket_ns = bucket_ns;
        let mut seeded = false;
        if pressed {
            // By reference: a copy of the key would take stack.
            #[allow(clippy::needless_borrows_for_generic_args)]
            if let Some(counts) = AGG_CELLS.get_ptr(&cell) {
                // SAFETY: a field of a live map value, read word by word.
                let counts = SharedWindow(unsafe { addr_of!((*counts).window) }.cast_mut());
                window::copy_counts(&counts, &mut new.window.slots);
                seeded = true;
            }
        }
        // EEXIST: another CPU created it first.
        #[allow(clippy::needless_borrows_for_generic_args)]
        match AGGREGATES.insert(lkey, &*new, BPF_NOEXIST) {
            Err(E2BIG) => false,
            Ok(()) if seeded => {
                maps::count(Outcome::FullSeeded, 0);
                true
            }
            _ => true,
        }
    })?;
    if inserted {
        let found = AGGREGATES.get_ptr_mut(lkey);
        if found.is_none() {
            maps::count(Outcome::InsertFailure, 0);
        }
        return found;
    }
    note_pressure(PRESSURE_AGGREGATES, now);
    maps::count(Outcome::AggregateFull, 0);
    #[allow(clippy::needless_borrows_for_generic_args)]
    if let Some(value) = AGG_CELLS.get_ptr_mut(&cell) {
        return Some(value);
    }
    scratch::seeded(scratch::NewLevelWindow, |new: &mut LevelWindow| {
        new.window.bucket_ns = bucket_ns;
        #[allow(clippy::needless_borrows_for_generic_args)]
        let _ = AGG_CELLS.insert(&cell, &*new, BPF_NOEXIST);
    })?;
    #[allow(clippy::needless_borrows_for_generic_args)]
    let found = AGG_CELLS.get_ptr_mut(&cell);
    if found.is_none() {
        maps::count(Outcome::InsertFailure, 0);
    }
    found
}
