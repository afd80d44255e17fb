//! The shared window (`WINDOWS`: with a ticket, or without one for a TCP
//! source that proved its address while none was left): `limit` admits a frame
//! against it with one compare-and-swap, or refuses it and notes until
//! when this CPU may refuse without looking; it creates the window (empty,
//! blocked if `HOLDS` keeps a penalty for it), refuses a source that
//! cannot get one while no ticket is left (unless the frame proved its
//! source, or is a SYN within its bound: `proof::claims`), and arms
//! penalties.
//! docs/architecture.md, "Limit, fastest path first" and "Exact across
//! CPUs", has the design.

use core::ptr::{read_volatile, write_volatile};

use limiter_common::{
    rules::level::MAX_LEVEL_WINDOW_NS,
    sketch,
    window::{self, Admission, WindowCache, WindowParams},
    Hold, Outcome, Rule, Scope, SourceKey, SourceTraffic, WindowState,
};

use super::{cluster, proof, scratch, tickets, BPF_NOEXIST};
use crate::{
    maps::{self, CLUSTER, HOLDS, PRESSURE, RULES, WINDOWS},
    shared::SharedWindow,
};

/// `bpf_map_update_elem`'s error when a map without eviction is full.
const E2BIG: i32 = -7;

/// `limit`'s flags: enforcing or not (a penalty is armed only when
/// enforcing).
pub(super) const LIMIT_DRY_RUN: u32 = 1;
/// `limit`'s flags: the source is judged on its window alone (the exact
/// tier): no lease (its state is a seed), and a new window counts as
/// `new_window`.
pub(super) const LIMIT_EXACT_TIER: u32 = 4;
/// The frame proved its source (`proof::claims`): a window made for it
/// takes no ticket (`UNPROVEN`).
pub(super) const LIMIT_PROVEN: u32 = 8;
/// The frame is a SYN that passes if its source has no window and there
/// is no room for one (`proof::claims`): admitted then, with
/// [`LIMIT_WINDOWLESS`], counted `unproven_syn`.
pub(super) const LIMIT_SYN_PASSES: u32 = 16;

/// `limit`'s answer: admitted (else refused, or no window state).
pub(super) const LIMIT_ADMITTED: u32 = 1;
/// `limit`'s answer, with [`LIMIT_ADMITTED`]: the window is now at least
/// half used: the source is near its limit.
pub(super) const LIMIT_HALF_USED: u32 = 2;
/// `limit`'s answer: the source has no window and could not get one
/// (`WINDOWS` full): refused, counted as `window_full`.
pub(super) const LIMIT_WINDOWLESS: u32 = 4;

/// Admits the frame at `now` (the frame's time, read once by the judge)
/// against the source's shared window for its rule (the one `traffic`
/// resolved), or refuses it and notes until when this CPU may refuse
/// without looking. Returns [`LIMIT_ADMITTED`] (with
/// [`LIMIT_HALF_USED`]), or 0.
///
/// A global BPF function: the verifier checks it once on its own, and its
/// window cache and keys live in its own stack frame, not in its callers'
/// (the hot and the exact tier's paths, inlined into the program). So it
/// may call no other BPF function: everything it calls is
/// `#[inline(always)]`.
#[no_mangle]
#[inline(never)]
pub extern "C" fn limit(
    key: *const SourceKey,
    traffic: *mut SourceTraffic,
    len: u64,
    flags: u32,
    now: u64,
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
    let exact_tier = flags & LIMIT_EXACT_TIER != 0;
    let mut params = rule.params();
    let key = &key.with_class(rule.budget);
    // A node rule pays this one byte test; a cluster rule is admitted
    // against its effective allowance.
    let cluster = if rule.scope() == Some(Scope::Cluster) {
        CLUSTER.get(0)
    } else {
        None
    };
    if let Some(state) = cluster {
        params.allowance_packets = cluster::allowance(state, key, rule, now);
    }
    // Every frame a window admits is counted in it: a source's first frame
    // creates its window (admitted without one, it would be known only to
    // the source's per-CPU state, which an LRU map may evict before the
    // window counts it: each eviction made a "first" frame again).
    let window = match find_window(key) {
        Some(window) => window,
        None => match create_window(key, traffic.rule, len, &params, now, 0) {
            Made::Window(window, created) => {
                if exact_tier && created {
                    maps::count(Outcome::NewWindow, len);
                }
                window
            }
            Made::Full => {
                note_pressure(PRESSURE_WINDOWS, now);
                // Refused, counted: no window, so nothing admitted could
                // be counted (the cheap tier's frames are their own
                // bound); unless the frame proves its source, or is a SYN
                // within its bound (`proof`).
                maps::count(Outcome::WindowFull, len);
                let claims = proof::claims();
                if claims & LIMIT_PROVEN != 0 {
                    match create_window(key, traffic.rule, len, &params, now, LIMIT_PROVEN) {
                        Made::Window(window, _) => window,
                        Made::Full => return Some(LIMIT_WINDOWLESS),
                        Made::Failed => return None,
                    }
                } else if claims & LIMIT_SYN_PASSES != 0 {
                    maps::count(Outcome::UnprovenSyn, len);
                    return Some(LIMIT_WINDOWLESS | LIMIT_ADMITTED);
                } else {
                    return Some(LIMIT_WINDOWLESS);
                }
            }
            Made::Failed => return None,
        },
    };
    if window.bucket_ns() != rule.bucket_ns {
        // The slots are tagged with another bucket width: start afresh.
        window::clear(&window);
        window.set_bucket_ns(rule.bucket_ns);
    }
    let blocked_until = window.blocked_until_ns();
    if now < blocked_until && rule.block_tag != 0 && window.blocked_tag() == rule.block_tag {
        traffic.hold_until_ns = blocked_until;
        return Some(0);
    }
    if traffic.lease_owed != 0 {
        // What this CPU's lease admitted, into the bucket it came in (still
        // the cache's: a cache is replaced only below).
        window::count_leased(
            &window,
            traffic.window.bucket,
            u64::from(traffic.lease_owed),
        );
        traffic.lease_owed = 0;
    }
    if !traffic.window.covers(now, rule.bucket_ns) {
        traffic.window = WindowCache::refresh(&window, &params, now);
        traffic.lease_left = 0;
    }
    // No leases for cluster rules: the effective allowance may shrink
    // within a bucket, and the sync reads what the window counts.
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
            if rule.fair_packets != 0 {
                // Heavy for the rule's levels: its window holds more than
                // its fair share of them; its next frames are judged so,
                // on this CPU (`SourceTraffic::heavy`) and, without
                // per-CPU state, anywhere (`WindowState::heavy`).
                let heavy = packets > rule.fair_packets << window::WEIGHT_SHIFT;
                traffic.heavy = u32::from(heavy);
                window.note_heavy(heavy);
            }
            if let Some(state) = cluster {
                if state.is_hot(packets, params.allowance_packets) {
                    cluster::report_hot(&window, key, rule, traffic.rule, now);
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
                    cluster::report_hot(&window, key, rule, traffic.rule, now);
                }
            }
            traffic.hold_until_ns = if rule.block_ns != 0 && !dry_run {
                arm_penalty(&window, key, rule, now)
            } else {
                hold_until_ns
            };
            Some(0)
        }
    }
}

/// The shared window of `wkey` (`WINDOWS`).
#[inline(always)]
pub(super) fn find_window(wkey: &SourceKey) -> Option<SharedWindow> {
    WINDOWS.get_ptr_mut(wkey).map(SharedWindow)
}

/// `PRESSURE` index: until when `UNPROVEN` was found full (and so a TCP
/// frame's proof is checked: `proof::flags`).
pub(super) const PRESSURE_WINDOWS: u32 = 1;

/// `PRESSURE` index: until when `AGGREGATES` was found full.
pub(super) const PRESSURE_AGGREGATES: u32 = 0;
/// How long a map found full counts as full: the longest level window
/// and an epoch. An aggregate judged on its overflow cell while the map
/// was full may get its own window any time after, and starts with the
/// cell's counts while any frame it was admitted there can still be in
/// its window.
const PRESSURE_NS: u64 = MAX_LEVEL_WINDOW_NS + sketch::EPOCH_NS;

/// Until when the map of `index` was found full (0: never).
#[inline(always)]
pub(super) fn pressure(index: u32) -> u64 {
    match PRESSURE.get_ptr(index) {
        // SAFETY: an aligned u64 of a live array element.
        Some(until) => unsafe { read_volatile(until) },
        None => 0,
    }
}

/// Notes the map of `index` found full at `now`: full until
/// [`PRESSURE_NS`] from now. Written at most once per epoch (a store to a
/// line every CPU reads), and a racing CPU's store differs by at most
/// that.
#[inline(always)]
pub(super) fn note_pressure(index: u32, now: u64) {
    if let Some(until) = PRESSURE.get_ptr_mut(index) {
        // SAFETY: an aligned u64 of a live array element.
        unsafe {
            if read_volatile(until) < now + PRESSURE_NS - sketch::EPOCH_NS {
                write_volatile(until, now + PRESSURE_NS);
            }
        }
    }
}

/// What [`create_window`] made.
enum Made {
    /// The window, and whether this CPU created it (else another CPU did
    /// first, or it was there).
    Window(SharedWindow, bool),
    /// `WINDOWS` is full.
    Full,
    /// No window and no room known: counted as `insert_failure`.
    Failed,
}

/// Creates the shared window of `key` (unless another CPU just did),
/// empty, tagged with the rule's bucket width, and blocked if `HOLDS`
/// keeps a penalty for it; its ticket from the room of the rule in
/// `slot` (`tickets`).
#[inline(always)]
fn create_window(
    key: &SourceKey,
    slot: u32,
    len: u64,
    params: &WindowParams,
    now: u64,
    flags: u32,
) -> Made {
    // A source takes a ticket first: one that has not proved its address
    // of its rule's rooms (at most `max_sources` windows are theirs), one
    // that has of the proven room, the rest of `WINDOWS` (`proof`); an
    // IPv6 one within its /48's room either way. A ticket already there
    // (the source's own, from before) is its room.
    let proven = flags & LIMIT_PROVEN;
    match tickets::take(key, slot, proven, len) {
        tickets::TAKEN => {}
        tickets::NONE_LEFT => return Made::Full,
        _ => {
            maps::count(Outcome::InsertFailure, len);
            return Made::Failed;
        }
    }
    // The value is built in a seed and passed by reference to the map: a
    // copy would take 296 of the 512 bytes of BPF stack.
    let inserted = scratch::seeded(scratch::NewWindow, |seed: &mut WindowState| {
        seed.bucket_ns = params.bucket_ns;
        if let Some(held) = HOLDS.get_ptr(key) {
            // SAFETY: a live map value; a racing update writes whole words.
            let held = unsafe { *held };
            if now >= held.until_ns {
                let _ = HOLDS.remove(key);
            } else {
                seed.blocked_until_ns = held.until_ns;
                seed.blocked_tag = held.tag;
            }
        }
        // Failure with EEXIST just means another CPU created it first;
        // with E2BIG, that the kept windows are full.
        #[allow(clippy::needless_borrows_for_generic_args)]
        match WINDOWS.insert(key, &*seed, BPF_NOEXIST) {
            Ok(()) => INSERTED,
            Err(E2BIG) => FULL,
            Err(_) => 0,
        }
    });
    match inserted {
        Some(FULL) => {
            // Proven sources took the room: the ticket holds none.
            tickets::give_back(key);
            Made::Full
        }
        Some(inserted) => match find_window(key) {
            Some(window) => Made::Window(window, inserted == INSERTED),
            None => {
                maps::count(Outcome::InsertFailure, len);
                Made::Failed
            }
        },
        None => {
            maps::count(Outcome::InsertFailure, len);
            Made::Failed
        }
    }
}

/// [`create_window`]'s insert: created here.
const INSERTED: u32 = 1;
/// [`create_window`]'s insert: the map is full.
const FULL: u32 = 2;

/// Arms a penalty for `rule` on the window keyed `wkey`: in the window,
/// and in `HOLDS`, so that the window comes back blocked should the
/// daemon reclaim it idle meanwhile; counts `hold_failed` when `HOLDS` is
/// full (the penalty then lasts as long as the window). Returns until
/// when.
#[inline(always)]
fn arm_penalty(window: &SharedWindow, wkey: &SourceKey, rule: &Rule, now: u64) -> u64 {
    let until = now + rule.block_ns;
    window.set_blocked(until, rule.block_tag);
    let held = Hold {
        until_ns: until,
        tag: rule.block_tag,
    };
    if HOLDS.insert(wkey, held, 0).is_err() {
        maps::count(Outcome::HoldFailed, 0);
    }
    until
}
