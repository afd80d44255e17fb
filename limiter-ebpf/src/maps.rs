//! Every map of the XDP program, in one place.
//!
//! Sizes here are defaults: userspace can resize a map before loading
//! (`EbpfLoader::set_max_entries`), so capacity comes from configuration.

use aya_ebpf::{
    macros::map,
    maps::{LruPerCpuHashMap, PerCpuArray},
};
use limiter_common::{Counter, Outcome, SourceKey, DEFAULT_MAX_SOURCES};

/// Per-source counters, one slot per CPU so the hot path never shares a
/// cache line. LRU: when full, the least recently seen source is evicted.
#[map(name = "SOURCES")]
pub static SOURCES: LruPerCpuHashMap<SourceKey, Counter> =
    LruPerCpuHashMap::with_max_entries(DEFAULT_MAX_SOURCES, 0);

/// Global per-CPU counters indexed by `Outcome`.
#[map(name = "STATS")]
pub static STATS: PerCpuArray<Counter> = PerCpuArray::with_max_entries(Outcome::COUNT, 0);

/// Counts one frame of `len` bytes under `outcome` on this CPU.
#[inline(always)]
pub fn count(outcome: Outcome, len: u64) {
    if let Some(counter) = STATS.get_ptr_mut(outcome as u32) {
        // SAFETY: the pointer is this CPU's slot of an array element; XDP
        // runs with migration disabled, so no one else writes it meanwhile.
        unsafe { (*counter).add(len) };
    }
}
