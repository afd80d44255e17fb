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
//! entry per frame would cost a second map insert. The first
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
//!
//! Tiers (with `Config::tiered`; off, every source is hot from its first
//! frame, as described above). A frame first counts in the cheap tier
//! (`sketch`: a shared row of epoch-tagged counters, no per-source
//! entry, counted by source whatever the frame's class): while its source
//! has sent at most its rule's `cheap_frames` over this epoch and the
//! last, and no mark says it may be blocked or
//! have a cluster share (`PENALTY_MARKS`, `SHARE_MARKS`), the frame is
//! judged without any per-source state (a limit admits it, allow passes,
//! deny drops). The frame that leaves the cheap tier marks the source
//! windowed in the sketch and charges its window with what the cheap tier
//! may have admitted meanwhile (at most `cheap_frames`): a window created
//! then starts with them, one found counts them on top. So every frame
//! within a window of up to an epoch is counted, cheap or not. Past the
//! cheap tier, a source with per-CPU state (`SOURCES`: hot) takes the path
//! above. One without it is judged on its shared window alone (the exact
//! tier: `WINDOWS`), and gets per-CPU state once it is refused, near its
//! limit or busy (more than `sketch::HOT_FRAMES` frames in an epoch), and
//! at once under an allow or deny rule (for `top` and events). A spoofed
//! flood thus costs a counter update per frame and no map insert, whatever
//! the rule. Windows are kept (`WINDOWS` never evicts; the daemon deletes
//! idle ones), so no flood takes a source's count away; once `WINDOWS` is
//! full, new windows spill into an LRU map (`WINDOW_SPILL`), where held
//! sources look their window up once a bucket so that other sources'
//! churn does not evict it, and penalties and refusals also live in
//! `HOLDS`, which never evicts: a window created again for a held source
//! comes back blocked or exhausted, whichever CPU creates it
//! (docs/architecture.md, "Floods cannot free the sources they hide
//! behind").
//!
//! Cluster scope (`Scope::Cluster`, `limiter_common::cluster`). A node
//! rule pays one byte test on the rule in hand, in `limit_window`. A
//! cluster rule's window is the same window, admitted against the
//! source's effective packet allowance instead of the rule's: its share
//! (`CLUSTER_SHARES`, by window key) while the cluster state (`CLUSTER`)
//! is fresh and the share unexpired, else the cold cap, and the fallback
//! cap once the state is stale; read on every frame that reaches the
//! window. Exactness across CPUs holds as above for the allowance each
//! CPU read: the compare-and-swap on the current slot admits a frame only
//! while the count stays within the allowance that CPU compared it with,
//! so a window never admits more than the largest effective allowance
//! read during it (the daemon's new share, when it raises one) and no
//! admitted frame goes uncounted. What keeps every frame of a cluster
//! source in its window: no leases (`lease` 1: a lease's unused frames
//! would count as admitted traffic to the sync, and the allowance may
//! shrink within a bucket), cheap-tier frames charged to the window when
//! the source leaves the cheap tier (and no more of them than the cold
//! cap, and none for a source whose share mark holds), and no first frame
//! admitted without a window when the effective allowance is 0. A CPU's
//! hold (`hold_until_ns`) is computed against the allowance it read, so a
//! share raised meanwhile applies from the end of the hold (at most the
//! rest of a bucket). A window that reaches `threshold_permille` of its
//! effective allowance, or refuses a frame, is reported once per window
//! length (`WindowState::hot_reported_ns`, claimed by compare-and-swap)
//! as a `ClusterHot` event keyed by the window key.

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    helpers::bpf_ktime_get_coarse_ns,
    maps::lpm_trie::Key,
};
use limiter_common::{
    event::EPISODE_GAP_NS,
    rules::{prefix_key_v4, prefix_key_v6, NO_RULE, PREFIX_HALF_BITS},
    sketch,
    state::{FIRST_CREATED, FIRST_HERE},
    window::{self, Admission, WindowCache, WindowParams, PACKETS, RING},
    Action, AddressFamily, ClusterState, Config, Counter, Hold, LimitEvent, Outcome, Rule, Scope,
    SourceKey, SourceTraffic,
};
use limiter_ebpf::parse::Packet;

use crate::{
    maps::{
        self, CLUSTER, CLUSTER_SHARES, CONFIG, FRAME_KEY, HOLDS, PENALTY_MARKS, PREFIXES_V4,
        PREFIXES_V6, RULES, SHARE_MARKS, SOURCES, TRAFFIC_SEED, WINDOWS, WINDOW_SEED, WINDOW_SPILL,
    },
    shared::{self, SharedWindow},
};

/// `bpf_map_update_elem` flag: create only.
const BPF_NOEXIST: u64 = 1;
/// `bpf_map_update_elem`'s error when a map without eviction is full.
const E2BIG: i32 = -7;

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
    let Some(slot) = FRAME_KEY.get_ptr_mut(0) else {
        return pass(Outcome::Passed);
    };
    // SAFETY: this CPU's slot of a per-CPU array; XDP runs with migration
    // disabled, so nothing else touches it meanwhile.
    let key = unsafe { &mut *slot };
    source_key(config, packet, key);
    let key = &*key;
    let found = if config.tiered() {
        tiered(config, key, now, len)
    } else {
        match record_offered(key, now, len) {
            Some(traffic) => Tiered::Hot(traffic),
            None => Tiered::Judged(stateless(config, key)),
        }
    };
    // One call of `decide` for both ways in: the verifier walks it once.
    let (traffic, verdict) = match found {
        Tiered::Judged(verdict) => return verdict,
        Tiered::Hot(traffic) => {
            // SAFETY: this CPU's slot of a per-CPU map value; XDP runs
            // with migration disabled, so nothing else touches it.
            let traffic = unsafe { &mut *traffic };
            let verdict = decide(config, key, traffic, now, len);
            (traffic, verdict)
        }
        // SAFETY: as above.
        Tiered::Promoted(traffic, verdict) => (unsafe { &mut *traffic }, verdict),
    };
    if verdict.outcome != Outcome::Passed && verdict.outcome != Outcome::Allowed {
        traffic.dropped.add(len);
        maps::count_rule_drop(traffic.rule);
        if now.wrapping_sub(traffic.last_refused_ns) > EPISODE_GAP_NS
            || traffic.last_refused_ns == 0
        {
            // A new episode of refusals: tell the daemon.
            let dry_run = verdict.outcome == Outcome::DryRunWouldDrop;
            let event = LimitEvent::new(*key, traffic.rule, now, dry_run);
            maps::send_event(&event, now);
        }
        traffic.last_refused_ns = now;
    }
    verdict
}

/// Where a tiered frame went.
enum Tiered {
    /// Judged without per-CPU state (cheap or exact tier).
    Judged(Verdict),
    /// The source has per-CPU state (hot): judge it there.
    Hot(*mut SourceTraffic),
    /// Judged on its window, and the source got per-CPU state just now
    /// (refused, or busy): account the verdict there.
    Promoted(*mut SourceTraffic, Verdict),
}

/// A frame with the tiers on (see the module docs).
#[inline(always)]
fn tiered(config: &Config, key: &SourceKey, now: u64, len: u64) -> Tiered {
    // Counted by source, whatever the frame's class: the classes one rule
    // judges share its window, so they share its cheap frames too.
    let place = sketch::place(
        &key.addr,
        key.family() == AddressFamily::V6,
        key.prefix_len,
        0,
        config.sketch_seed,
    );
    let tag = sketch::tag(now);
    // Counters that keep losing their compare-and-swap: a busy source.
    let seen = shared::sketch_count(place, tag, sketch::HOT_FRAMES).unwrap_or(sketch::Seen::BUSY);
    let count = seen.total();
    let mut index = NO_RULE;
    // Within the cheap frames, but marked: this frame goes to its window,
    // and so will the next ones (marked windowed below, even with nothing
    // to charge).
    let mut marked = false;
    if count <= u32::from(config.cheap_max) {
        index = resolve(key, config.generation);
        if let Some(rule) = RULES.get(index) {
            if within_cheap(rule, count, now) {
                if !must_be_exact(config, key, rule, place, count, now) {
                    maps::count(Outcome::Cheap, len);
                    return Tiered::Judged(cheap(config, rule, index));
                }
                marked = true;
            }
        }
    }
    if let Some(traffic) = SOURCES.get_ptr_mut(key) {
        // SAFETY: this CPU's slot of a per-CPU map value.
        let state = unsafe { &mut *traffic };
        state.record_at(now, len);
        let cheap_frames = RULES.get(state.rule).map_or(0, |rule| rule.cheap_frames);
        let unwindowed = leave_cheap_tier(place, tag, seen, marked, cheap_frames);
        if unwindowed != 0 {
            // Charged by this CPU's next look at the window (this frame's,
            // unless the source is held or leased).
            state.carried = unwindowed;
        }
        return Tiered::Hot(traffic);
    }
    if index == NO_RULE {
        index = resolve(key, config.generation);
    }
    let Some(rule) = RULES.get(index) else {
        return Tiered::Judged(pass(Outcome::Passed));
    };
    if rule.action() != Some(Action::Limit) {
        // Allow and deny keep per-CPU state past the cheap tier: what
        // `top` shows and events name.
        return match promote(config, key, index, now, len, 0) {
            Some(traffic) => Tiered::Hot(traffic),
            None => Tiered::Judged(stateless(config, key)),
        };
    }
    let past = Past {
        seen,
        unwindowed: leave_cheap_tier(place, tag, seen, marked, rule.cheap_frames),
    };
    exact(config, key, rule, index, past, now, len)
}

/// A limited source's frame past the cheap tier (at `place`, reading
/// `seen` in the epoch tagged `tag`; `marked`: within its cheap frames but
/// sent to its window by a mark) under a rule with `cheap_frames`. Unless
/// the source is marked windowed in the sketch (or is that busy), the
/// frames the cheap tier admitted for it since the start of the last epoch
/// are still to be charged to its window: at most the frames counted
/// before this one (`limit` takes at most the rule's cheap frames of
/// them); the source is marked windowed, so that its next frames charge
/// nothing again, and only the CPU whose compare-and-swap sets the mark
/// charges (two CPUs leaving the cheap tier at once would charge twice).
/// Returns what to charge. Not marked: a source whose first frame this is
/// (one of a spoofed flood; nothing to charge), and any source of a rule
/// without cheap frames (nothing was admitted uncounted): their marks
/// would only make their neighbours in the sketch look windowed. A mark
/// of the last epoch is carried into this one, or the next epoch would
/// read this one's frames as the cheap tier's.
#[inline(always)]
fn leave_cheap_tier(
    place: sketch::Place,
    tag: u64,
    seen: sketch::Seen,
    marked: bool,
    cheap_frames: u8,
) -> u32 {
    let count = seen.total();
    if !seen.windowed() {
        if cheap_frames != 0 && (count > 1 || marked) && shared::sketch_mark(place, tag) {
            return count - 1;
        }
    } else if seen.previous >= sketch::WINDOWED && seen.current < sketch::WINDOWED {
        shared::sketch_mark(place, tag);
    }
    0
}

/// Whether the cheap tier may admit a frame of a source that reads `count`
/// (this frame included) over this epoch and the last under `rule`: at
/// most its `cheap_frames`, and for a cluster-scoped rule at most the cap
/// a source without a share gets on this node (the cold cap, or the
/// fallback cap while the cluster state is stale), so that the frames
/// charged on leaving the cheap tier fit that node's part.
#[inline(always)]
fn within_cheap(rule: &Rule, count: u32, now: u64) -> bool {
    if count > u32::from(rule.cheap_frames) {
        return false;
    }
    if rule.scope() != Some(Scope::Cluster) {
        return true;
    }
    match CLUSTER.get(0) {
        Some(state) => state.within_cap(u64::from(count), rule.allowance_packets, now),
        None => false,
    }
}

/// Whether the source of `key` (at `place` in the sketch, reading `count`)
/// must be judged on its window under `rule` whatever the cheap tier
/// counts: under a rule with a `block`, while its penalty mark holds (it
/// may be blocked); under a cluster-scoped rule, while its share mark does
/// (it may have a share, perhaps smaller than the cheap frames), from its
/// second frame on: a spoofed flood's one-frame sources never read the
/// share marks, and a source with a share gets at most one cheap frame
/// after a silence, charged to its window by the next. A marked source goes
/// to its window, which knows.
#[inline(always)]
fn must_be_exact(
    config: &Config,
    key: &SourceKey,
    rule: &Rule,
    place: sketch::Place,
    count: u32,
    now: u64,
) -> bool {
    let (marks, cells) = if rule.block_ns != 0 {
        (&PENALTY_MARKS, sketch::PENALTY_CELLS)
    } else if rule.scope() == Some(Scope::Cluster) && count > 1 {
        (&SHARE_MARKS, sketch::SHARE_CELLS)
    } else {
        return false;
    };
    let at = budget_place(config, key, rule, place);
    shared::marked(marks, sketch::mark_cell(at, cells), now)
}

/// The sketch place of `key`'s source as keyed by `rule`'s budget (where
/// its marks are): `place` (the source's, keyed as budget 0) itself when
/// the budget is 0.
#[inline(always)]
fn budget_place(
    config: &Config,
    key: &SourceKey,
    rule: &Rule,
    place: sketch::Place,
) -> sketch::Place {
    if rule.budget == 0 {
        place
    } else {
        hashed_budget_place(config, key, rule)
    }
}

/// The sketch place of `key`'s source as keyed by `rule`'s budget, hashed.
#[inline(always)]
fn hashed_budget_place(config: &Config, key: &SourceKey, rule: &Rule) -> sketch::Place {
    sketch::place(
        &key.addr,
        key.family() == AddressFamily::V6,
        key.prefix_len,
        rule.budget,
        config.sketch_seed,
    )
}

/// After `limit` refused a source of `rule`: if a penalty holds it now
/// (armed just now, or found in its window), marks its penalty cell until
/// the penalty ends, so that the cheap tier never admits its frames, even
/// once it has been silent long enough to leave the sketch.
#[inline(always)]
fn note_penalty(config: &Config, key: &SourceKey, rule: &Rule, hold_until_ns: u64, now: u64) {
    if rule.block_ns != 0 && hold_until_ns > now {
        let at = hashed_budget_place(config, key, rule);
        shared::mark_penalty(sketch::mark_cell(at, sketch::PENALTY_CELLS), hold_until_ns);
    }
}

/// A frame of the cheap tier: allow passes, deny drops, a limit admits.
#[inline(always)]
fn cheap(config: &Config, rule: &Rule, index: u32) -> Verdict {
    match rule.action() {
        Some(Action::Allow) => pass(Outcome::Allowed),
        Some(Action::Deny) => {
            maps::count_rule_drop(index);
            refuse(rule.is_dry_run(config.dry_run()), Outcome::DroppedDeny)
        }
        _ => pass(Outcome::Passed),
    }
}

/// What the cheap tier knows of a frame that left it: what its source
/// reads in the sketch (this frame included), and what the window must
/// be charged (`leave_cheap_tier`).
#[derive(Clone, Copy)]
struct Past {
    seen: sketch::Seen,
    unwindowed: u32,
}

/// A frame of a limited source without per-CPU state (the exact tier),
/// judged on its shared window alone: through [`limit`] like a hot
/// source's, but with this CPU's scratch as its per-CPU state, no lease,
/// and a window created (if need be) carrying what the cheap tier admitted
/// for it this epoch. Refused, near its limit (its window half used), or
/// busy (`count` over `sketch::HOT_FRAMES`), the source keeps that state:
/// the scratch becomes its `SOURCES` entry.
#[inline(always)]
fn exact(
    config: &Config,
    key: &SourceKey,
    rule: &Rule,
    index: u32,
    past: Past,
    now: u64,
    len: u64,
) -> Tiered {
    let count = past.seen.total();
    let dry_run = rule.is_dry_run(config.dry_run());
    let Some(scratch) = TRAFFIC_SEED.get_ptr_mut(0) else {
        // No state to judge it with: fail closed.
        return Tiered::Judged(refuse(dry_run, Outcome::DroppedLimit));
    };
    // SAFETY: this CPU's slot of a per-CPU array; XDP runs with migration
    // disabled, so nothing else touches it meanwhile.
    let state = unsafe { &mut *scratch };
    // This frame, counted as the source's per-CPU state would count it.
    state.count_first(now, len);
    state.rule = index;
    state.generation = config.generation;
    // What the cheap tier admitted and the window must still count
    // (`limit` takes at most the rule's cheap frames of it).
    state.carried = past.unwindowed;
    let flags = (u32::from(dry_run) * LIMIT_DRY_RUN) | LIMIT_EXACT_TIER;
    let answer = limit(key, scratch, len, flags);
    let admitted = answer & LIMIT_ADMITTED != 0;
    if !admitted && !dry_run {
        note_penalty(config, key, rule, state.hold_until_ns, now);
    }
    let verdict = if admitted {
        pass(Outcome::Passed)
    } else {
        refuse(dry_run, Outcome::DroppedLimit)
    };
    let mut promoted = false;
    // Busy: this epoch's count alone (a mark is not frames).
    let busy = past.seen.current > sketch::HOT_FRAMES;
    if !admitted || answer & LIMIT_HALF_USED != 0 || busy {
        // Its frames this second, as the cheap tier counted them (at
        // least what it sent; more only if other sources share its
        // counters): what `top` shows of the second it became hot in.
        let seen = Counter {
            packets: u64::from(count),
            bytes: u64::from(count) * len,
        };
        state.current = seen;
        state.total = seen;
        state.carried = 0;
        state.touched_ns = now;
        #[allow(clippy::needless_borrows_for_generic_args)]
        if SOURCES.insert(key, &*state, BPF_NOEXIST).is_ok() {
            maps::count(Outcome::NewSource, len);
            promoted = true;
        }
    }
    // The scratch is all zero between uses.
    *state = SourceTraffic::default();
    if promoted {
        if let Some(traffic) = SOURCES.get_ptr_mut(key) {
            return Tiered::Promoted(traffic, verdict);
        }
    }
    if !admitted {
        // No per-CPU state to account it in: still one rule's drop.
        maps::count_rule_drop(index);
    }
    Tiered::Judged(verdict)
}

/// Gives a source per-CPU state (or finds it), with its rule resolved
/// under the live generation and this CPU holding it until `hold` (0: not
/// held). Its shared window, if any, already counts what it was admitted.
#[inline(always)]
fn promote(
    config: &Config,
    key: &SourceKey,
    index: u32,
    now: u64,
    len: u64,
    hold: u64,
) -> Option<*mut SourceTraffic> {
    let traffic = record_offered(key, now, len)?;
    // SAFETY: this CPU's slot of a per-CPU map value.
    let state = unsafe { &mut *traffic };
    state.rule = index;
    state.generation = config.generation;
    state.hold_until_ns = hold;
    state.touched_ns = now;
    // The window, if the source has one, counted this frame already.
    state.first_frame = 0;
    Some(traffic)
}

/// Arms a penalty for `rule` on the window keyed `wkey`: in the window,
/// and in `HOLDS`, so that the window comes back blocked should it be
/// evicted meanwhile (a spilled one may be). Returns until when.
#[inline(always)]
fn arm_penalty(window: &SharedWindow, wkey: &SourceKey, rule: &Rule, now: u64) -> u64 {
    let until = now + rule.block_ns;
    window.set_blocked(until, rule.block_tag);
    hold(
        wkey,
        Hold {
            until_ns: until,
            tag: rule.block_tag,
        },
    );
    until
}

/// Keeps a refusal or penalty apart from the window (`HOLDS`); counts
/// `hold_failed` when `HOLDS` is full. Every window's, not only a spilled
/// one's: which map a window is in would have to be carried through
/// `limit`, whose stack is at 6.1's limit.
#[inline(always)]
fn hold(wkey: &SourceKey, held: Hold) {
    if HOLDS.insert(wkey, held, 0).is_err() {
        maps::count(Outcome::HoldFailed, 0);
    }
}

/// The key of a frame's state: its source cut to the configured prefix,
/// and its traffic class.
#[inline(always)]
fn source_key(config: &Config, packet: &Packet, key: &mut SourceKey) {
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
    *key = packet.source.masked(prefix_len, mask).with_class(class);
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
    // The new value is built in a per-CPU scratch, not on the stack (it
    // would take 192 of the 512 bytes); the scratch is all zero between
    // uses, so only what `count_first` and `first_frame` set is set and
    // reset.
    let Some(seed) = TRAFFIC_SEED.get_ptr_mut(0) else {
        maps::count(Outcome::InsertFailure, len);
        return None;
    };
    // SAFETY: this CPU's slot of a per-CPU array; XDP runs with migration
    // disabled, so nothing else touches it meanwhile.
    let seed = unsafe { &mut *seed };
    seed.count_first(now, len);
    seed.first_frame = FIRST_CREATED;
    #[allow(clippy::needless_borrows_for_generic_args)]
    let inserted = SOURCES.insert(key, &*seed, BPF_NOEXIST).is_ok();
    seed.second = 0;
    seed.current = Counter::default();
    seed.total = Counter::default();
    seed.first_frame = 0;
    if inserted {
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
                touch(key, rule, traffic, now);
                return refuse(dry_run, Outcome::DroppedLimit);
            }
            if traffic.lease_left != 0 && traffic.window.covers(now, rule.bucket_ns) {
                traffic.lease_left -= 1;
                return pass(Outcome::Passed);
            }
            let unwindowed_first = config.class_count == 0;
            let flags = (u32::from(dry_run) * LIMIT_DRY_RUN)
                | (u32::from(unwindowed_first) * LIMIT_UNWINDOWED_FIRST);
            if limit(key, traffic, len, flags) & LIMIT_ADMITTED != 0 {
                pass(Outcome::Passed)
            } else {
                if config.tiered() && !dry_run {
                    note_penalty(config, key, rule, traffic.hold_until_ns, now);
                }
                // Refused, or no window state: fail closed.
                refuse(dry_run, Outcome::DroppedLimit)
            }
        }
        None => pass(Outcome::Passed),
    }
}

/// `limit`'s flags: enforcing or not (a penalty is armed only when
/// enforcing).
const LIMIT_DRY_RUN: u32 = 1;
/// `limit`'s flags: a first frame may be admitted without a window (see the
/// module docs).
const LIMIT_UNWINDOWED_FIRST: u32 = 2;
/// `limit`'s flags: the source is judged on its window alone (the exact
/// tier): no lease (its state is a scratch), a new window carries
/// `SourceTraffic::carried` frames and counts as `new_window`.
const LIMIT_EXACT_TIER: u32 = 4;
/// `limit`'s answer: admitted (else refused, or no window state).
const LIMIT_ADMITTED: u32 = 1;
/// `limit`'s answer, with [`LIMIT_ADMITTED`]: the window is now at least
/// half used: the source is near its limit.
const LIMIT_HALF_USED: u32 = 2;

/// Admits the frame against the source's shared window for its rule (the
/// one `traffic` resolved), or refuses it and notes until when this CPU
/// may refuse without looking. Returns [`LIMIT_ADMITTED`] (with
/// [`LIMIT_HALF_USED`]), or 0.
///
/// A global BPF function, like [`exact`]: verified once on its own, and
/// its window cache and keys live in its own stack frame, not in the
/// caller's.
#[no_mangle]
#[inline(never)]
pub extern "C" fn limit(
    key: *const SourceKey,
    traffic: *mut SourceTraffic,
    len: u64,
    flags: u32,
) -> u32 {
    // SAFETY: a global function's pointer arguments may be null (checked
    // here); otherwise `key` is the caller's key and `traffic` this CPU's
    // slot of the source's per-CPU map value, which nothing else touches
    // while XDP runs (migration is disabled).
    let (Some(key), Some(traffic)) = (unsafe { key.as_ref() }, unsafe { traffic.as_mut() }) else {
        return 0;
    };
    let Some(rule) = RULES.get(traffic.rule) else {
        return 0;
    };
    // SAFETY: a helper without arguments; it reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    limit_window(key, rule, traffic, now, len, flags).unwrap_or(0)
}

/// [`limit`]'s body. `None` when the source has no window state.
#[inline(always)]
fn limit_window(
    key: &SourceKey,
    rule: &Rule,
    traffic: &mut SourceTraffic,
    now: u64,
    len: u64,
    flags: u32,
) -> Option<u32> {
    let dry_run = flags & LIMIT_DRY_RUN != 0;
    let unwindowed_first = flags & LIMIT_UNWINDOWED_FIRST != 0;
    let exact_tier = flags & LIMIT_EXACT_TIER != 0;
    let mut params = params(rule);
    let key = &key.with_class(rule.budget);
    // A node rule pays this one byte test; a cluster rule is admitted
    // against its effective allowance (see "Cluster scope" above).
    let cluster = if rule.scope() == Some(Scope::Cluster) {
        CLUSTER.get(0)
    } else {
        None
    };
    if let Some(state) = cluster {
        params.allowance_packets = cluster_allowance(state, key, rule, now);
    }
    // Consumed by the first frame that gets here (a source's first frame
    // under a limit always does: a rule change clears hold and lease), so
    // the hold and lease paths never touch it. Read back from the map value,
    // not the constant `decide` may just have stored, which would split
    // every later verifier state.
    // SAFETY: an aligned field of this CPU's live map value.
    let first_frame = unsafe { read_volatile(addr_of!(traffic.first_frame)) };
    traffic.first_frame = 0;
    // Frames the cheap tier admitted that the window must still count: at
    // most the rule's cheap frames (what the cheap tier admits over two
    // epochs), however many the sketch counted (other sources' frames
    // included).
    let charge = u64::from(traffic.carried).min(u64::from(rule.cheap_frames));
    traffic.carried = 0;
    // Packet-only limits (of at least one frame) may admit a first frame
    // without a window (see the module docs); byte limits need the window.
    let packet_only = unwindowed_first
        && rule.allowance_bytes == window::UNLIMITED
        && params.allowance_packets != 0;
    let (window, created) = match find_window(key) {
        Some(window) => (window, false),
        None => {
            if packet_only && first_frame == FIRST_CREATED {
                traffic.unwindowed_ns = now;
                return Some(LIMIT_ADMITTED);
            }
            // What a window this CPU creates owes: its own first frame, or,
            // on its first frame of a source another CPU created, the first
            // frame that CPU may have admitted without a window.
            let owed_at = if packet_only && first_frame == FIRST_HERE {
                now
            } else {
                traffic.unwindowed_ns
            };
            let first = if exact_tier {
                window::carried_word(&params, now, charge)
            } else {
                window::owed_word(&params, owed_at, now)
            };
            let created = create_window(key, len, &params, first, now)?;
            if exact_tier && created.1 {
                maps::count(Outcome::NewWindow, len);
            }
            created
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
    if charge != 0 && !(created && exact_tier) {
        // A window that existed (or that another CPU just created, or a
        // hot source's): it counts the charged frames from now on.
        window::charge(&window, &params, now, charge);
    }
    let blocked_until = window.blocked_until_ns();
    if now < blocked_until && rule.block_tag != 0 && window.blocked_tag() == rule.block_tag {
        traffic.hold_until_ns = blocked_until;
        return Some(0);
    }
    if !traffic.window.covers(now, rule.bucket_ns) {
        traffic.window = WindowCache::refresh(&window, &params, now);
        traffic.lease_left = 0;
    }
    // No leases for cluster rules: a lease's unused frames count as
    // admitted, which the cluster sync would read as traffic this node
    // admitted, and the effective allowance may shrink within a bucket.
    let lease = if exact_tier || cluster.is_some() {
        1
    } else {
        u64::from(rule.lease_packets)
    };
    match window::try_admit_cached(&window, &traffic.window, &params, now, len, lease) {
        Admission::Admitted {
            granted,
            half_used,
            packets,
        } => {
            traffic.lease_left = (granted - 1) as u32;
            if let Some(state) = cluster {
                if state.is_hot(packets, params.allowance_packets) {
                    report_hot(&window, key, rule, traffic.rule, now);
                }
            }
            Some(LIMIT_ADMITTED | if half_used { LIMIT_HALF_USED } else { 0 })
        }
        Admission::Refused { hold_until_ns } => {
            if let Some(state) = cluster {
                // Refused: the window is at its effective allowance, past
                // any threshold (a cap of 0 admits nothing that could
                // cross one); reported unless reporting is off.
                if state.is_hot(u64::MAX, params.allowance_packets) {
                    report_hot(&window, key, rule, traffic.rule, now);
                }
            }
            traffic.hold_until_ns = if rule.block_ns != 0 && !dry_run {
                arm_penalty(&window, key, rule, now)
            } else {
                // Refused over its limit: should its window be evicted (a
                // spilled one may be) within a window from now, it comes
                // back exhausted, whichever CPU creates it again.
                hold(
                    key,
                    Hold {
                        until_ns: now + rule.bucket_ns * u64::from(rule.buckets),
                        tag: 0,
                    },
                );
                hold_until_ns
            };
            Some(0)
        }
    }
}

/// The packet allowance a cluster-scoped source's window (keyed `wkey`)
/// is held to now: `ClusterState::effective_allowance`, with the source's
/// share looked up only while the cluster state is fresh.
#[inline(always)]
fn cluster_allowance(state: &ClusterState, wkey: &SourceKey, rule: &Rule, now: u64) -> u64 {
    state.effective_allowance(rule.allowance_packets, now, || {
        let share = CLUSTER_SHARES.get_ptr(wkey)?;
        // SAFETY: a live map value; the daemon replaces a share as a
        // whole element (a hash map update swaps in a new element), so
        // the copy is one share's.
        Some(unsafe { *share })
    })
}

/// Tells the daemon that the cluster-scoped source whose window is
/// `window` (keyed `wkey`) is hot under rule `index`, once per window
/// length whichever CPU finds it so, within the CPU's budget of reports.
/// A report the budget (or a full ring) drops gives its claim back, so the
/// source's next frame that finds it hot reports it.
#[inline(always)]
fn report_hot(window: &SharedWindow, wkey: &SourceKey, rule: &Rule, index: u32, now: u64) {
    if window.claim_hot_report(now, rule.bucket_ns * u64::from(rule.buckets))
        && !maps::send_cluster_hot(wkey, index, now)
    {
        window.release_hot_report(now);
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

/// Looks a held source's window up once a bucket (per CPU): a held source
/// reads no window otherwise, and were its window spilled, the LRU map
/// would evict it under a flood of other sources.
#[inline(always)]
fn touch(key: &SourceKey, rule: &Rule, traffic: &mut SourceTraffic, now: u64) {
    if now.wrapping_sub(traffic.touched_ns) >= rule.bucket_ns {
        traffic.touched_ns = now;
        let _ = find_window(&key.with_class(rule.budget));
    }
}

/// The shared window of `wkey`: kept (`WINDOWS`), else spilled
/// (`WINDOW_SPILL`).
#[inline(always)]
fn find_window(wkey: &SourceKey) -> Option<SharedWindow> {
    if let Some(state) = WINDOWS.get_ptr_mut(wkey) {
        return Some(SharedWindow(state));
    }
    WINDOW_SPILL.get_ptr_mut(wkey).map(SharedWindow)
}

/// Creates the shared window of `key` (unless another CPU just did),
/// tagged with the rule's bucket width, its slot `first.0` holding packet
/// word `first.1` (what the window must count from the start: a frame owed,
/// or frames carried from the cheap tier), and blocked or exhausted if
/// `HOLDS` says so; returns it, with whether this CPU created it.
#[inline(always)]
fn create_window(
    key: &SourceKey,
    len: u64,
    params: &WindowParams,
    first: (usize, u64),
    now: u64,
) -> Option<(SharedWindow, bool)> {
    let Some(seed) = WINDOW_SEED.get_ptr_mut(0) else {
        maps::count(Outcome::InsertFailure, len);
        return None;
    };
    // SAFETY: this CPU's slot of a per-CPU array; XDP runs with migration
    // disabled, so nothing else touches it meanwhile.
    let seed = unsafe { &mut *seed };
    let (slot, word) = first;
    let slot = slot & (RING - 1);
    seed.slots[slot][PACKETS] = word;
    seed.bucket_ns = params.bucket_ns;
    let mut exhausted = false;
    if let Some(held) = HOLDS.get_ptr(key) {
        // SAFETY: a live map value; a racing update writes whole words.
        let held = unsafe { *held };
        if now >= held.until_ns {
            let _ = HOLDS.remove(key);
        } else if held.tag != 0 {
            seed.blocked_until_ns = held.until_ns;
            seed.blocked_tag = held.tag;
        } else {
            exhausted = true;
        }
    }
    // Failure with EEXIST just means another CPU created it first (and
    // counted what this one owed); with E2BIG, that the kept windows are
    // full: the window goes to the spill. The value is passed by reference
    // to the map value: a copy would take 272 of the 512 bytes of BPF
    // stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let created = match WINDOWS.insert(key, &*seed, BPF_NOEXIST) {
        Ok(()) => true,
        Err(E2BIG) => {
            #[allow(clippy::needless_borrows_for_generic_args)]
            let spilled = WINDOW_SPILL.insert(key, &*seed, BPF_NOEXIST).is_ok();
            if spilled {
                maps::count(Outcome::WindowSpilled, len);
            }
            spilled
        }
        Err(_) => false,
    };
    // The seed is all zero between uses.
    // Volatile, one word each: plain stores of these three adjacent
    // words are merged into a `memset` call, whose frame 6.1's verifier
    // adds to this function's stack (already at its limit with the
    // caller's; see docs/operations.md).
    // SAFETY: aligned words of this CPU's scratch.
    unsafe {
        core::ptr::write_volatile(&mut seed.slots[slot][PACKETS], 0);
        core::ptr::write_volatile(&mut seed.bucket_ns, 0);
        core::ptr::write_volatile(&mut seed.blocked_until_ns, 0);
        core::ptr::write_volatile(&mut seed.blocked_tag, 0);
    }
    match find_window(key) {
        Some(window) => {
            if created && exhausted {
                window::mark_exhausted(&window, params, now);
            }
            Some((window, created))
        }
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
