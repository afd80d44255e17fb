//! A rule's further levels (`limiter_common::rules::level`): once the
//! per-source limit admits a frame, each level of its rule admits it
//! against that level's shared window (`AGGREGATES`), or refuses it. A
//! rule without levels never gets here (its callers test
//! `Rule::level_count` first), and neither does a frame its source's
//! limit or hold refused.

use aya_ebpf::helpers::bpf_ktime_get_coarse_ns;
use limiter_common::{
    rules::MAX_LEVELS,
    window::{self, Admission, WindowCache},
    Level, LevelKey, Rule, SourceKey, WindowState,
};

use super::{scratch, BPF_NOEXIST};
use crate::{
    maps::{AGGREGATES, FRAME_KEY, RULES},
    shared::SharedWindow,
};

/// `levels`' flags: the source is heavy (its own window holds more than
/// its rule's `fair_packets`).
pub(super) const LEVEL_HEAVY: u32 = 1;

/// Admits the frame keyed `FRAME_KEY` against every level
/// of rule `index`, in order. Returns 0 when all admit it, else 1 + the
/// index of the level that refused it (the levels before it counted the
/// frame: a refused frame may use up a little of their allowance, never
/// more than they allow).
///
/// A global BPF function, as `limit` is: the verifier checks it once,
/// whichever tier calls it, and its keys and window cache live in its own
/// frame. It calls no other BPF function.
#[no_mangle]
#[inline(never)]
pub extern "C" fn levels(index: u32, flags: u32) -> u32 {
    let Some(rule) = RULES.get(index) else {
        return 0;
    };
    let Some(key) = FRAME_KEY.get(0) else {
        return 0;
    };
    // SAFETY: a helper without arguments; it reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let heavy = flags & LEVEL_HEAVY != 0;
    let count = rule.level_count();
    let mut i = 0;
    while i < MAX_LEVELS {
        if i >= count {
            break;
        }
        if !admit(rule, &rule.levels[i], key, i as u8, now, heavy) {
            return i as u32 + 1;
        }
        i += 1;
    }
    0
}

/// One level's judgement of the frame: admitted (and counted) or not.
/// Without window state (the map refused it), admitted: the per-source
/// limit already holds the source.
#[inline(always)]
fn admit(rule: &Rule, level: &Level, key: &SourceKey, index: u8, now: u64, heavy: bool) -> bool {
    let lkey = level.key(key, rule.budget, rule.level_tag(), index);
    let params = level.params(heavy);
    let Some(window) = find_or_create(&lkey, level.bucket_ns) else {
        return true;
    };
    if window.bucket_ns() != level.bucket_ns {
        // Tagged with another bucket width (the level changed): afresh.
        window::clear(&window);
        window.set_bucket_ns(level.bucket_ns);
    }
    let cache = WindowCache::refresh(&window, &params, now);
    matches!(
        window::try_admit_cached(&window, &cache, &params, now, 1, 1),
        Admission::Admitted { .. }
    )
}

/// The window of `lkey`, created empty (tagged with `bucket_ns`) if it is
/// not there.
#[inline(always)]
fn find_or_create(lkey: &LevelKey, bucket_ns: u64) -> Option<SharedWindow> {
    if let Some(state) = AGGREGATES.get_ptr_mut(lkey) {
        return Some(SharedWindow(state));
    }
    scratch::seeded(scratch::NewWindow { slot: 0 }, |seed: &mut WindowState| {
        seed.bucket_ns = bucket_ns;
        // EEXIST: another CPU created it first; the LRU map makes room
        // otherwise.
        #[allow(clippy::needless_borrows_for_generic_args)]
        let _ = AGGREGATES.insert(lkey, &*seed, BPF_NOEXIST);
    })?;
    AGGREGATES.get_ptr_mut(lkey).map(SharedWindow)
}
