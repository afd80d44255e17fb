//! Every map of the XDP program, in one place.
//!
//! Each is an entry of the table in `limiter_common::maps` (`spec` here):
//! its capacity comes from the table, and a const assertion after each
//! static fails the build unless the literal `#[map(name = ...)]` needs,
//! the key type and the value type match the table's name and sizes.
//! Capacities are defaults: userspace resizes the per-source maps before
//! loading (`EbpfLoader::map_max_entries`), so theirs comes from
//! configuration.

use aya_ebpf::{
    macros::map,
    maps::{
        lpm_trie::Key, Array, HashMap, LpmTrie, LruHashMap, LruPerCpuHashMap, PerCpuArray, RingBuf,
    },
};
use limiter_common::{
    cluster::{ClusterShare, ClusterState},
    event::{EVENTS_PER_CPU_PER_SECOND, HOT_REPORTS_PER_CPU_PER_SECOND},
    maps as spec,
    rules::{PrefixKeyV4, PrefixKeyV6},
    sketch, Config, Counter, Hold, LimitEvent, Outcome, Rule, RuleRefs, SourceKey, SourceTraffic,
    WindowState,
};

/// Offered traffic per source, one slot per CPU so counting never shares a
/// cache line. LRU: when full, the least recently seen source is evicted.
#[map(name = "SOURCES")]
pub static SOURCES: LruPerCpuHashMap<SourceKey, SourceTraffic> =
    LruPerCpuHashMap::with_max_entries(spec::SOURCES.max_entries, 0);
const _: () = spec::SOURCES.check::<SourceKey, SourceTraffic>("SOURCES");

/// Admission window per source, shared by all CPUs (written only when a
/// frame is admitted). Never evicted: the daemon deletes idle windows.
#[map(name = "WINDOWS")]
pub static WINDOWS: HashMap<SourceKey, WindowState> =
    HashMap::with_max_entries(spec::WINDOWS.max_entries, 0);
const _: () = spec::WINDOWS.check::<SourceKey, WindowState>("WINDOWS");

/// Windows created while `WINDOWS` was full. LRU: other sources' windows
/// may evict them (`HOLDS` keeps their refusals).
#[map(name = "WINDOW_SPILL")]
pub static WINDOW_SPILL: LruHashMap<SourceKey, WindowState> =
    LruHashMap::with_max_entries(spec::WINDOW_SPILL.max_entries, 0);
const _: () = spec::WINDOW_SPILL.check::<SourceKey, WindowState>("WINDOW_SPILL");

/// Scratch for a new `WINDOWS` value (too large for the BPF stack): all
/// zero between uses, seeded, inserted and zeroed again (`limit.rs`).
#[map(name = "WINDOW_SEED")]
pub static WINDOW_SEED: PerCpuArray<WindowState> =
    PerCpuArray::with_max_entries(spec::WINDOW_SEED.max_entries, 0);
const _: () = spec::WINDOW_SEED.check::<u32, WindowState>("WINDOW_SEED");

/// The cold tier's counters, shared by every CPU (`limiter_common::sketch`).
#[map(name = "SKETCH")]
pub static SKETCH: Array<sketch::Pair> = Array::with_max_entries(spec::SKETCH.max_entries, 0);
const _: () = spec::SKETCH.check::<u32, sketch::Pair>("SKETCH");

/// Until when a source may be blocked, by mark cell
/// (`limiter_common::sketch::mark_cell`): the cheap tier's guard for
/// rules with a `block` (raised by the kernel when it arms a penalty).
#[map(name = "PENALTY_MARKS")]
pub static PENALTY_MARKS: Array<u64> = Array::with_max_entries(spec::PENALTY_MARKS.max_entries, 0);
const _: () = spec::PENALTY_MARKS.check::<u32, u64>("PENALTY_MARKS");

/// Until when a source may have a cluster share, by mark cell: the cheap
/// tier's guard for cluster-scoped rules (written by the daemon).
#[map(name = "SHARE_MARKS")]
pub static SHARE_MARKS: Array<u64> = Array::with_max_entries(spec::SHARE_MARKS.max_entries, 0);
const _: () = spec::SHARE_MARKS.check::<u32, u64>("SHARE_MARKS");

/// Refusals and penalties apart from the windows, so a spilled window
/// that is evicted comes back blocked or exhausted
/// (`limiter_common::state::Hold`).
#[map(name = "HOLDS")]
pub static HOLDS: HashMap<SourceKey, Hold> = HashMap::with_max_entries(spec::HOLDS.max_entries, 0);
const _: () = spec::HOLDS.check::<SourceKey, Hold>("HOLDS");

/// Scratch for a new `SOURCES` value (too large for the BPF stack): all
/// zero between uses, filled, inserted and zeroed again (`limit.rs`).
#[map(name = "TRAFFIC_SEED")]
pub static TRAFFIC_SEED: PerCpuArray<SourceTraffic> =
    PerCpuArray::with_max_entries(spec::TRAFFIC_SEED.max_entries, 0);
const _: () = spec::TRAFFIC_SEED.check::<u32, SourceTraffic>("TRAFFIC_SEED");

/// The key of the frame being judged (`limit.rs`), off the stack.
#[map(name = "FRAME_KEY")]
pub static FRAME_KEY: PerCpuArray<SourceKey> =
    PerCpuArray::with_max_entries(spec::FRAME_KEY.max_entries, 0);
const _: () = spec::FRAME_KEY.check::<u32, SourceKey>("FRAME_KEY");

/// Global per-CPU counters indexed by `Outcome`.
#[map(name = "STATS")]
pub static STATS: PerCpuArray<Counter> = PerCpuArray::with_max_entries(spec::STATS.max_entries, 0);
const _: () = spec::STATS.check::<u32, Counter>("STATS");

/// The global configuration (one entry).
#[map(name = "CONFIG")]
pub static CONFIG: Array<Config> = Array::with_max_entries(spec::CONFIG.max_entries, 0);
const _: () = spec::CONFIG.check::<u32, Config>("CONFIG");

/// Compiled rules: two halves, so a rule change writes the half no source
/// resolves into before the generation bump makes it live.
#[map(name = "RULES")]
pub static RULES: Array<Rule> = Array::with_max_entries(spec::RULES.max_entries, 0);
const _: () = spec::RULES.check::<u32, Rule>("RULES");

/// IPv4 rule prefixes of both generations, keyed by the generation's half
/// then the prefix (the live half always holds 0.0.0.0/0 once rules are
/// loaded).
#[map(name = "PREFIXES_V4")]
pub static PREFIXES_V4: LpmTrie<PrefixKeyV4, RuleRefs> =
    LpmTrie::with_max_entries(spec::PREFIXES_V4.max_entries, 0);
const _: () = spec::PREFIXES_V4.check::<Key<PrefixKeyV4>, RuleRefs>("PREFIXES_V4");

/// IPv6 rule prefixes of both generations (the live half always holds
/// ::/0 once rules are loaded).
#[map(name = "PREFIXES_V6")]
pub static PREFIXES_V6: LpmTrie<PrefixKeyV6, RuleRefs> =
    LpmTrie::with_max_entries(spec::PREFIXES_V6.max_entries, 0);
const _: () = spec::PREFIXES_V6.check::<Key<PrefixKeyV6>, RuleRefs>("PREFIXES_V6");

/// This node's allowance per cluster-scoped source (window key), written
/// by the daemon (`limiter_common::cluster`).
#[map(name = "CLUSTER_SHARES")]
pub static CLUSTER_SHARES: LruHashMap<SourceKey, ClusterShare> =
    LruHashMap::with_max_entries(spec::CLUSTER_SHARES.max_entries, 0);
const _: () = spec::CLUSTER_SHARES.check::<SourceKey, ClusterShare>("CLUSTER_SHARES");

/// The cluster state the daemon refreshes every sync (one entry).
#[map(name = "CLUSTER")]
pub static CLUSTER: Array<ClusterState> = Array::with_max_entries(spec::CLUSTER.max_entries, 0);
const _: () = spec::CLUSTER.check::<u32, ClusterState>("CLUSTER");

/// Frames dropped (or would-be dropped) per `RULES` index, per CPU.
#[map(name = "RULE_DROPS")]
pub static RULE_DROPS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(spec::RULE_DROPS.max_entries, 0);
const _: () = spec::RULE_DROPS.check::<u32, u64>("RULE_DROPS");

/// Counts one refused frame against rule `index`.
#[inline(always)]
pub fn count_rule_drop(index: u32) {
    if let Some(drops) = RULE_DROPS.get_ptr_mut(index) {
        // SAFETY: this CPU's slot of an array element.
        unsafe { *drops += 1 };
    }
}

/// "Source limited" events for the daemon's log, and "cluster hot" events
/// for its cluster sync.
#[map(name = "EVENTS")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(spec::EVENTS.max_entries, 0);
const _: () = spec::EVENTS.check_name("EVENTS");

/// Per CPU: `[second, "source limited" events sent in it, "cluster hot"
/// reports sent in it]`, the events' rate limits, one per kind.
#[map(name = "EVENT_BUDGET")]
pub static EVENT_BUDGET: PerCpuArray<[u64; 3]> =
    PerCpuArray::with_max_entries(spec::EVENT_BUDGET.max_entries, 0);
const _: () = spec::EVENT_BUDGET.check::<u32, [u64; 3]>("EVENT_BUDGET");

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
