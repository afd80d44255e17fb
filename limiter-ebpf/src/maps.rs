//! Every map of the XDP program, and the helpers that count and send
//! through them.
//!
//! The statics are generated from the table of maps
//! (`limiter_common::for_each_map!`), one per row, named as the row (the
//! name `#[map]` gives the map in the object) and of the aya-ebpf type of
//! its kind. Their capacities and flags come from the row's spec (`spec`
//! here), and a const assertion after each static fails the build unless
//! its kernel key and value types have the spec's sizes. Capacities are
//! defaults: userspace resizes the per-source maps before loading
//! (`EbpfLoader::map_max_entries`), so theirs comes from configuration.

use aya_ebpf::{
    macros::map,
    maps::{
        lpm_trie::Key, Array, HashMap, LpmTrie, LruHashMap, LruPerCpuHashMap, PerCpuArray, RingBuf,
    },
};
use limiter_common::{
    event::{EVENTS_PER_CPU_PER_SECOND, HOT_REPORTS_PER_CPU_PER_SECOND},
    maps as spec, LimitEvent, Outcome, SourceKey,
};

/// The aya-ebpf type of a row's kind.
macro_rules! kernel_type {
    (LruPerCpuHash, $key:ty, $value:ty) => { LruPerCpuHashMap<$key, $value> };
    (LruHash, $key:ty, $value:ty) => { LruHashMap<$key, $value> };
    (Hash, $key:ty, $value:ty) => { HashMap<$key, $value> };
    (Array, $key:ty, $value:ty) => { Array<$value> };
    (PerCpuArray, $key:ty, $value:ty) => { PerCpuArray<$value> };
    (LpmTrie, $key:ty, $value:ty) => { LpmTrie<$key, $value> };
    (RingBuf, $key:ty, $value:ty) => { RingBuf };
}

/// The key type as the kernel sees it, for the size check against the
/// spec: an array's `u32` index, an LPM trie's `Key` with its prefix
/// length, else the row's key.
macro_rules! kernel_key {
    (Array, $key:ty) => { u32 };
    (PerCpuArray, $key:ty) => { u32 };
    (LpmTrie, $key:ty) => { Key<$key> };
    ($kind:ident, $key:ty) => { $key };
}

/// A map static's initialiser: capacity and flags from the row's spec (a
/// ring buffer's capacity is its size in bytes).
macro_rules! kernel_init {
    (RingBuf, $name:ident, $type:ty) => {
        RingBuf::with_byte_size(spec::$name.max_entries, spec::$name.flags)
    };
    ($kind:ident, $name:ident, $type:ty) => {
        <$type>::with_max_entries(spec::$name.max_entries, spec::$name.flags)
    };
}

/// Every row of the table as a map static.
macro_rules! kernel_maps {
    ($(
        $(#[$doc:meta])*
        $name:ident($field:ident): $kind:ident<$key:ty, $value:ty>,
            $sizing:ident($max_entries:expr), $keep:ident;
    )*) => {$(
        $(#[$doc])*
        #[map]
        pub static $name: kernel_type!($kind, $key, $value) =
            kernel_init!($kind, $name, kernel_type!($kind, $key, $value));
        const _: () =
            spec::$name.check::<kernel_key!($kind, $key), $value>(stringify!($name));
    )*};
}

limiter_common::for_each_map!(kernel_maps);

/// Counts one refused frame against rule `index`.
#[inline(always)]
pub fn count_rule_drop(index: u32) {
    if let Some(drops) = RULE_DROPS.get_ptr_mut(index) {
        // SAFETY: this CPU's slot of an array element.
        unsafe { *drops += 1 };
    }
}

/// Counts one frame of rule `index` refused by its level `level`.
#[inline(always)]
pub fn count_level_drop(index: u32, level: u32) {
    let at = index * limiter_common::rules::MAX_LEVELS as u32 + level;
    if let Some(drops) = LEVEL_DROPS.get_ptr_mut(at) {
        // SAFETY: this CPU's slot of an array element.
        unsafe { *drops += 1 };
    }
}

/// This CPU's event budgets for the second of `now`, restarted when a new
/// second begins.
#[inline(always)]
fn event_budget(now: u64) -> Option<&'static mut [u64; 3]> {
    let budget = EVENT_BUDGET.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of an array element; XDP runs with
    // migration disabled, so nothing else touches it meanwhile.
    let budget = unsafe { &mut *budget };
    let second = now / 1_000_000_000;
    if budget[0] != second {
        // One volatile store per word: an array store becomes a `memset`
        // call, a BPF-to-BPF call that 6.1 counts into `limit`'s stack.
        for (word, value) in budget.iter_mut().zip([second, 0, 0]) {
            // SAFETY: an aligned word of this CPU's slot.
            unsafe { core::ptr::write_volatile(word, value) };
        }
    }
    Some(budget)
}

/// Sends `event` unless this CPU already sent its share of "source
/// limited" events this second or the ring is full (then counts
/// `event_dropped`).
#[inline(always)]
pub fn send_event(event: &LimitEvent, now: u64) {
    let Some(budget) = event_budget(now) else {
        return;
    };
    if budget[1] >= EVENTS_PER_CPU_PER_SECOND || EVENTS.output::<LimitEvent>(event, 0).is_err() {
        count(Outcome::EventDropped, 0);
        return;
    }
    budget[1] += 1;
}

/// Sends a cluster-hot event for the window keyed `wkey` under rule
/// `index` at `now`, within this CPU's budget of such reports (a budget
/// of their own: refused sources cannot spend it); whether it was sent
/// (else counts `cluster_hot_dropped`). Written in place in the ring, not
/// built on the stack: it runs inside `limit`, whose frame and its
/// caller's must fit the 512 bytes of BPF stack together.
#[inline(always)]
pub fn send_cluster_hot(wkey: &SourceKey, index: u32, now: u64) -> bool {
    let Some(budget) = event_budget(now) else {
        return false;
    };
    if budget[2] >= HOT_REPORTS_PER_CPU_PER_SECOND {
        count(Outcome::ClusterHotDropped, 0);
        return false;
    }
    let Some(mut entry) = EVENTS.reserve::<LimitEvent>(0) else {
        count(Outcome::ClusterHotDropped, 0);
        return false;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: the reserved entry is this CPU's until submitted, and the
    // key lives elsewhere (the caller's stack). Written field by field: an
    // aggregate write into ring-buffer memory becomes a `memmove` call.
    unsafe { LimitEvent::write_cluster_hot(event, wkey, index, now) };
    entry.submit(0);
    budget[2] += 1;
    true
}

/// Counts one frame of `len` bytes under `outcome` on this CPU.
#[inline(always)]
pub fn count(outcome: Outcome, len: u64) {
    if let Some(counter) = STATS.get_ptr_mut(outcome as u32) {
        // SAFETY: this CPU's slot of an array element; XDP runs with
        // migration disabled, so nothing else writes it meanwhile.
        unsafe { (*counter).add(len) };
    }
}
