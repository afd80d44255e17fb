//! The verdict for one parsed frame: key it, count it as offered, find its
//! rule (cached per CPU, re-resolved when the rule generation changes), and
//! admit, drop or pass it.
//!
//! Cost by path, beyond parsing and the `SOURCES` lookup every frame pays:
//! allow and deny need nothing more; a source this CPU knows to be over its
//! limit (or blocked) is refused from its own `hold_until_ns`; only a frame
//! that may be admitted looks up the shared window and counts itself there
//! with one compare-and-swap.
//!
//! A source's shared window is created on its second frame, not its first:
//! under a spoofed flood nearly every source sends one frame, and a window
//! entry per frame would cost a second LRU insert and eviction. The first
//! frame is always under a limit of at least one frame, so it is admitted
//! without a window, if none exists, by the one CPU whose insert created
//! the source's `SOURCES` entry; it is counted in the window when one is
//! created. Exactness across CPUs: that CPU counts it itself if it creates
//! the window; any other CPU that creates the window on its own first frame
//! of the source counts one frame for it (so the CPU that admitted it
//! counts nothing more). A frame is never left uncounted; in a race one
//! may be counted twice (admitting one frame less, never one more). This
//! holds while a source's window belongs to one `SOURCES` entry, which is
//! the case without matches (every frame of a source is class 0); with
//! matches, several frame classes of a source may share a rule's window,
//! so windows are created on the first frame.
//!
//! State is keyed by source and frame class (`SOURCES`), but a budget
//! belongs to a source and a rule: the window key carries the rule's
//! `budget` byte instead of the frame class, so every class of a source
//! that one rule judges counts in one window.

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    helpers::bpf_ktime_get_coarse_ns,
    maps::lpm_trie::Key,
};
use limiter_common::{
    event::EPISODE_GAP_NS,
    rules::{prefix_key_v4, prefix_key_v6, NO_RULE, PREFIX_HALF_BITS},
    state::{FIRST_CREATED, FIRST_HERE},
    window::{self, Admission, WindowCache, WindowParams, PACKETS, RING},
    Action, AddressFamily, Config, LimitEvent, Outcome, Rule, SourceKey, SourceTraffic,
};
use limiter_ebpf::parse::Packet;

use crate::{
    maps::{self, CONFIG, PREFIXES_V4, PREFIXES_V6, RULES, SOURCES, WINDOWS, WINDOW_SEED},
    shared::SharedWindow,
};

/// `bpf_map_update_elem` flag: create only.
const BPF_NOEXIST: u64 = 1;

/// What to do with a frame and what to count it as.
pub struct Verdict {
    pub action: u32,
    pub outcome: Outcome,
}

const fn pass(outcome: Outcome) -> Verdict {
    Verdict {
        action: XDP_PASS,
        outcome,
    }
}

/// A frame that must go: dropped, or only counted in dry-run.
const fn refuse(dry_run: bool, outcome: Outcome) -> Verdict {
    if dry_run {
        pass(Outcome::DryRunWouldDrop)
    } else {
        Verdict {
            action: XDP_DROP,
            outcome,
        }
    }
}

/// Judges one frame of `len` bytes.
#[inline(always)]
pub fn judge(packet: &Packet, len: u64) -> Verdict {
    // The coarse monotonic clock (tick resolution, a few ms): the precise
    // one costs a clocksource read per frame, a third of the whole frame's
    // cost here, and a tick is a small share of a bucket (see
    // docs/architecture.md for the accuracy this keeps).
    // SAFETY: a helper without arguments; it reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let Some(config) = CONFIG.get(0) else {
        return pass(Outcome::Passed);
    };
    if config.generation == 0 {
        // No rules loaded yet: count each address, pass everything.
        record_offered(&packet.source, now, len);
        return pass(Outcome::Passed);
    }
    let key = source_key(config, packet);
    let Some(traffic) = record_offered(&key, now, len) else {
        return stateless(config, &key);
    };
    // SAFETY: this CPU's slot of a per-CPU map value; XDP runs with
    // migration disabled, so nothing else touches it meanwhile.
    let traffic = unsafe { &mut *traffic };
    let verdict = decide(config, &key, traffic, now, len);
    if verdict.outcome != Outcome::Passed && verdict.outcome != Outcome::Allowed {
        traffic.dropped.add(len);
        maps::count_rule_drop(traffic.rule);
        if now.wrapping_sub(traffic.last_refused_ns) > EPISODE_GAP_NS
            || traffic.last_refused_ns == 0
        {
            // A new episode of refusals: tell the daemon.
            let dry_run = verdict.outcome == Outcome::DryRunWouldDrop;
            let event = LimitEvent::new(key, traffic.rule, now, dry_run);
            maps::send_event(&event, now / 1_000_000_000);
        }
        traffic.last_refused_ns = now;
    }
    verdict
}

/// The key of a frame's state: its source cut to the configured prefix,
/// and its traffic class.
#[inline(always)]
fn source_key(config: &Config, packet: &Packet) -> SourceKey {
    let (prefix_len, mask) = if packet.source.family() == AddressFamily::V4 {
        (config.v4_prefix_len, &config.v4_mask)
    } else {
        (config.v6_prefix_len, &config.v6_mask)
    };
    let class = config.classify(
        packet.protocol,
        packet.dst_port,
        packet.tcp_flags,
        packet.transport,
    );
    packet.source.masked(prefix_len, mask).with_class(class)
}

/// Counts the frame in this CPU's `SOURCES` slot for `key`, creating it
/// (marked `FIRST_CREATED` in this CPU's slot) if the source is new.
#[inline(always)]
fn record_offered(key: &SourceKey, now: u64, len: u64) -> Option<*mut SourceTraffic> {
    if let Some(traffic) = SOURCES.get_ptr_mut(key) {
        // SAFETY: this CPU's slot of a per-CPU map value.
        unsafe { (*traffic).record_at(now, len) };
        return Some(traffic);
    }
    let first = SourceTraffic::first(now / 1_000_000_000, len);
    if SOURCES.insert(key, first, BPF_NOEXIST).is_ok() {
        maps::count(Outcome::NewSource, len);
        return SOURCES.get_ptr_mut(key);
    }
    // Another CPU created it first: count in our slot of its entry.
    let Some(traffic) = SOURCES.get_ptr_mut(key) else {
        maps::count(Outcome::InsertFailure, len);
        return None;
    };
    // SAFETY: as above.
    unsafe { (*traffic).record_at(now, len) };
    Some(traffic)
}

#[inline(always)]
fn decide(
    config: &Config,
    key: &SourceKey,
    traffic: &mut SourceTraffic,
    now: u64,
    len: u64,
) -> Verdict {
    if traffic.generation != config.generation {
        if traffic.generation == 0 && traffic.first_frame == 0 {
            // A zeroed slot: another CPU created the entry.
            traffic.first_frame = FIRST_HERE;
        }
        // Rules changed (or first frame on this CPU): resolve once, and
        // forget what this CPU concluded under the old rule.
        traffic.rule = resolve(key, config.generation);
        traffic.generation = config.generation;
        traffic.hold_until_ns = 0;
        traffic.lease_left = 0;
        traffic.window = WindowCache::default();
    }
    let Some(rule) = RULES.get(traffic.rule) else {
        return pass(Outcome::Passed);
    };
    let dry_run = rule.is_dry_run(config.dry_run());
    match rule.action() {
        Some(Action::Allow) => pass(Outcome::Allowed),
        Some(Action::Deny) => refuse(dry_run, Outcome::DroppedDeny),
        Some(Action::Limit) => {
            if now < traffic.hold_until_ns {
                return refuse(dry_run, Outcome::DroppedLimit);
            }
            if traffic.lease_left != 0 && traffic.window.covers(now, rule.bucket_ns) {
                traffic.lease_left -= 1;
                return pass(Outcome::Passed);
            }
            let unwindowed_first = config.class_count == 0;
            match limit(key, rule, traffic, now, len, dry_run, unwindowed_first) {
                Some(true) => pass(Outcome::Passed),
                // No window state: fail closed.
                Some(false) | None => refuse(dry_run, Outcome::DroppedLimit),
            }
        }
        None => pass(Outcome::Passed),
    }
}

/// Admits the frame against the source's shared window for its rule, or
/// refuses it and notes until when this CPU may refuse without looking.
/// `None` when the source has no window state. A penalty is armed only
/// when enforcing (`dry_run` false); `unwindowed_first` allows a first
/// frame without a window (see the module docs).
#[inline(always)]
fn limit(
    key: &SourceKey,
    rule: &Rule,
    traffic: &mut SourceTraffic,
    now: u64,
    len: u64,
    dry_run: bool,
    unwindowed_first: bool,
) -> Option<bool> {
    let params = params(rule);
    let key = &key.with_class(rule.budget);
    // Consumed by the first frame that gets here (a source's first frame
    // under a limit always does: a rule change clears hold and lease), so
    // the hold and lease paths never touch it. Read back from the map value,
    // not the constant `decide` may just have stored, which would split
    // every later verifier state.
    // SAFETY: an aligned field of this CPU's live map value.
    let first_frame = unsafe { read_volatile(addr_of!(traffic.first_frame)) };
    traffic.first_frame = 0;
    // Packet-only limits (of at least one frame) may admit a first frame
    // without a window (see the module docs); byte limits need the window.
    let packet_only = unwindowed_first
        && rule.allowance_bytes == window::UNLIMITED
        && rule.allowance_packets != 0;
    let (window, created) = match WINDOWS.get_ptr_mut(key) {
        Some(state) => (SharedWindow(state), false),
        None => {
            if packet_only && first_frame == FIRST_CREATED {
                traffic.unwindowed_ns = now;
                return Some(true);
            }
            // What a window this CPU creates owes: its own first frame, or,
            // on its first frame of a source another CPU created, the first
            // frame that CPU may have admitted without a window.
            let owed_at = if packet_only && first_frame == FIRST_HERE {
                now
            } else {
                traffic.unwindowed_ns
            };
            create_window(key, len, &params, owed_at, now)?
        }
    };
    // Found or created, the window holds any frame this CPU owed it.
    traffic.unwindowed_ns = 0;
    // Refused within the last window: if its window state was evicted
    // meanwhile, it must not come back with a fresh allowance.
    if created
        && traffic.hold_until_ns != 0
        && now < traffic.hold_until_ns + rule.bucket_ns * u64::from(rule.buckets)
    {
        window.set_bucket_ns(rule.bucket_ns);
        window::mark_exhausted(&window, &params, now);
    }
    if window.bucket_ns() != rule.bucket_ns {
        // The slots are tagged with another bucket width: start afresh.
        window::clear(&window);
        window.set_bucket_ns(rule.bucket_ns);
    }
    let blocked_until = window.blocked_until_ns();
    if now < blocked_until && rule.block_tag != 0 && window.blocked_tag() == rule.block_tag {
        traffic.hold_until_ns = blocked_until;
        return Some(false);
    }
    if !traffic.window.covers(now, rule.bucket_ns) {
        traffic.window = WindowCache::refresh(&window, &params, now);
        traffic.lease_left = 0;
    }
    let lease = u64::from(rule.lease_packets);
    match window::try_admit_cached(&window, &traffic.window, &params, now, len, lease) {
        Admission::Admitted { granted } => {
            traffic.lease_left = (granted - 1) as u32;
            Some(true)
        }
        Admission::Refused { hold_until_ns } => {
            let mut hold = hold_until_ns;
            if rule.block_ns != 0 && !dry_run {
                let blocked = now + rule.block_ns;
                window.set_blocked(blocked, rule.block_tag);
                hold = blocked;
            }
            traffic.hold_until_ns = hold;
            Some(false)
        }
    }
}

#[inline(always)]
fn params(rule: &Rule) -> WindowParams {
    WindowParams {
        bucket_ns: rule.bucket_ns,
        buckets: rule.buckets,
        allowance_packets: rule.allowance_packets,
        allowance_bytes: rule.allowance_bytes,
    }
}

/// Creates the shared window of `key` (unless another CPU just did),
/// tagged with the rule's bucket width and counting the frame owed at
/// `owed_at` (0: none), and returns it, with whether this CPU created it.
#[inline(always)]
fn create_window(
    key: &SourceKey,
    len: u64,
    params: &WindowParams,
    owed_at: u64,
    now: u64,
) -> Option<(SharedWindow, bool)> {
    let Some(seed) = WINDOW_SEED.get_ptr_mut(0) else {
        maps::count(Outcome::InsertFailure, len);
        return None;
    };
    // SAFETY: this CPU's slot of a per-CPU array; XDP runs with migration
    // disabled, so nothing else touches it meanwhile.
    let seed = unsafe { &mut *seed };
    let (slot, word) = window::owed_word(params, owed_at, now);
    let slot = slot & (RING - 1);
    seed.slots[slot][PACKETS] = word;
    seed.bucket_ns = params.bucket_ns;
    // Failure (EEXIST) just means another CPU created it first (and counted
    // what this one owed). The value is passed by reference to the map
    // value: a copy would take 272 of the 512 bytes of BPF stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let created = WINDOWS.insert(key, &*seed, BPF_NOEXIST).is_ok();
    // The seed is all zero between uses.
    seed.slots[slot][PACKETS] = 0;
    seed.bucket_ns = 0;
    match WINDOWS.get_ptr_mut(key) {
        Some(state) => Some((SharedWindow(state), created)),
        None => {
            maps::count(Outcome::InsertFailure, len);
            None
        }
    }
}

/// Longest-prefix match of the key's address among generation
/// `generation`'s prefixes, then its class's rule.
#[inline(always)]
fn resolve(key: &SourceKey, generation: u32) -> u32 {
    let bits = PREFIX_HALF_BITS + u32::from(key.prefix_len);
    let refs = if key.family() == AddressFamily::V4 {
        let addr = [key.addr[0], key.addr[1], key.addr[2], key.addr[3]];
        PREFIXES_V4.get(Key::new(bits, prefix_key_v4(generation, addr)))
    } else {
        PREFIXES_V6.get(Key::new(bits, prefix_key_v6(generation, &key.addr)))
    };
    refs.and_then(|refs| refs.rules.get(usize::from(key.class)).copied())
        .unwrap_or(NO_RULE)
}

/// A frame whose source could get no state: allow and deny still apply; a
/// limit fails closed (`Rule::stateless_outcome`, host-tested).
#[inline(always)]
fn stateless(config: &Config, key: &SourceKey) -> Verdict {
    let Some(rule) = RULES.get(resolve(key, config.generation)) else {
        return pass(Outcome::Passed);
    };
    match rule.stateless_outcome(config.dry_run()) {
        outcome @ (Outcome::DroppedDeny | Outcome::DroppedLimit) => Verdict {
            action: XDP_DROP,
            outcome,
        },
        outcome => pass(outcome),
    }
}
