//! Every map of the XDP program, in one place.
//!
//! Sizes here are defaults: userspace resizes the per-source maps before
//! loading (`EbpfLoader::map_max_entries`), so capacity comes from
//! configuration.

use aya_ebpf::{
    macros::map,
    maps::{Array, LpmTrie, LruHashMap, LruPerCpuHashMap, PerCpuArray, RingBuf},
};
use limiter_common::{
    event::EVENTS_PER_CPU_PER_SECOND,
    rules::{PrefixKeyV4, PrefixKeyV6, RULE_SLOTS},
    Config, Counter, LimitEvent, Outcome, Rule, RuleRefs, SourceKey, SourceTraffic, WindowState,
    DEFAULT_MAX_SOURCES,
};

/// Offered traffic per source, one slot per CPU so counting never shares a
/// cache line. LRU: when full, the least recently seen source is evicted.
#[map(name = "SOURCES")]
pub static SOURCES: LruPerCpuHashMap<SourceKey, SourceTraffic> =
    LruPerCpuHashMap::with_max_entries(DEFAULT_MAX_SOURCES, 0);

/// Admission window per source, shared by all CPUs (written only when a
/// frame is admitted). LRU like `SOURCES`.
#[map(name = "WINDOWS")]
pub static WINDOWS: LruHashMap<SourceKey, WindowState> =
    LruHashMap::with_max_entries(DEFAULT_MAX_SOURCES, 0);

/// Scratch for a new `WINDOWS` value (too large for the BPF stack): all
/// zero between uses, seeded, inserted and zeroed again (`limit.rs`).
#[map(name = "WINDOW_SEED")]
pub static WINDOW_SEED: PerCpuArray<WindowState> = PerCpuArray::with_max_entries(1, 0);

/// Global per-CPU counters indexed by `Outcome`.
#[map(name = "STATS")]
pub static STATS: PerCpuArray<Counter> = PerCpuArray::with_max_entries(Outcome::COUNT, 0);

/// The global configuration (one entry).
#[map(name = "CONFIG")]
pub static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

/// Compiled rules: two halves, so a rule change writes the half no source
/// resolves into before the generation bump makes it live.
#[map(name = "RULES")]
pub static RULES: Array<Rule> = Array::with_max_entries(RULE_SLOTS, 0);

/// IPv4 rule prefixes of both generations, keyed by the generation's half
/// then the prefix (the live half always holds 0.0.0.0/0 once rules are
/// loaded).
#[map(name = "PREFIXES_V4")]
pub static PREFIXES_V4: LpmTrie<PrefixKeyV4, RuleRefs> = LpmTrie::with_max_entries(4096, 0);

/// IPv6 rule prefixes of both generations (the live half always holds
/// ::/0 once rules are loaded).
#[map(name = "PREFIXES_V6")]
pub static PREFIXES_V6: LpmTrie<PrefixKeyV6, RuleRefs> = LpmTrie::with_max_entries(4096, 0);

/// Frames dropped (or would-be dropped) per `RULES` index, per CPU.
#[map(name = "RULE_DROPS")]
pub static RULE_DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(RULE_SLOTS, 0);

/// Counts one refused frame against rule `index`.
#[inline(always)]
pub fn count_rule_drop(index: u32) {
    if let Some(drops) = RULE_DROPS.get_ptr_mut(index) {
        // SAFETY: this CPU's slot of an array element.
        unsafe { *drops += 1 };
    }
}

/// "Source limited" events for the daemon's log.
#[map(name = "EVENTS")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// Per CPU: `[second, events sent in it]`, the events' rate limit.
#[map(name = "EVENT_BUDGET")]
pub static EVENT_BUDGET: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);

/// Sends `event` unless this CPU already sent its share this second or
/// the ring is full (then counts `event_dropped`).
#[inline(always)]
pub fn send_event(event: &LimitEvent, second: u64) {
    let Some(budget) = EVENT_BUDGET.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot of an array element.
    let budget = unsafe { &mut *budget };
    if budget[0] != second {
        *budget = [second, 0];
    }
    if budget[1] >= EVENTS_PER_CPU_PER_SECOND || EVENTS.output::<LimitEvent>(event, 0).is_err() {
        count(Outcome::EventDropped, 0);
        return;
    }
    budget[1] += 1;
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
