//! The shared window (`WINDOWS`, spilled to `WINDOW_SPILL` when full):
//! `limit` admits a frame against it with one compare-and-swap, or
//! refuses it and notes until when this CPU may refuse without looking;
//! it creates the window (seeded with what it must count from the start,
//! blocked or exhausted if `HOLDS` says so) and arms penalties.
//! docs/architecture.md, "Limit, fastest path first" and "Exact across
//! CPUs", has the design.

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::helpers::bpf_ktime_get_coarse_ns;
use limiter_common::{
    state::{FIRST_CREATED, FIRST_HERE},
    window::{self, Admission, WindowCache, WindowParams, PACKETS, RING},
    Hold, Outcome, Rule, Scope, SourceKey, SourceTraffic, WindowState,
};

use super::{cluster, scratch, BPF_NOEXIST};
use crate::{
    maps::{self, CLUSTER, HOLDS, RULES, WINDOWS, WINDOW_SPILL},
    shared::SharedWindow,
};

/// `bpf_map_update_elem`'s error when a map without eviction is full.
const E2BIG: i32 = -7;

/// `limit`'s flags: enforcing or not (a penalty is armed only when
/// enforcing).
pub(super) const LIMIT_DRY_RUN: u32 = 1;
/// `limit`'s flags: a first frame may be admitted without a window
/// (docs/architecture.md, "First frame").
pub(super) const LIMIT_UNWINDOWED_FIRST: u32 = 2;
/// `limit`'s flags: the source is judged on its window alone (the exact
/// tier): no lease (its state is a seed), a new window carries
/// `SourceTraffic::carried` frames and counts as `new_window`.
pub(super) const LIMIT_EXACT_TIER: u32 = 4;
/// `limit`'s answer: admitted (else refused, or no window state).
pub(super) const LIMIT_ADMITTED: u32 = 1;
/// `limit`'s answer, with [`LIMIT_ADMITTED`]: the window is now at least
/// half used: the source is near its limit.
pub(super) const LIMIT_HALF_USED: u32 = 2;

/// Admits the frame against the source's shared window for its rule (the
/// one `traffic` resolved), or refuses it and notes until when this CPU
/// may refuse without looking. Returns [`LIMIT_ADMITTED`] (with
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
    // against its effective allowance.
    let cluster = if rule.scope() == Some(Scope::Cluster) {
        CLUSTER.get(0)
    } else {
        None
    };
    if let Some(state) = cluster {
        params.allowance_packets = cluster::allowance(state, key, rule, now);
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
    // without a window; byte limits need the window.
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
            // Heavy for the rule's levels: its window holds more than
            // its fair share of them; its next frames are judged so.
            let heavy =
                rule.fair_packets != 0 && packets > rule.fair_packets << window::WEIGHT_SHIFT;
            traffic.heavy = u32::from(heavy);
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

#[inline(always)]
fn params(rule: &Rule) -> WindowParams {
    WindowParams {
        bucket_ns: rule.bucket_ns,
        buckets: rule.buckets,
        allowance_packets: rule.allowance_packets,
        allowance_bytes: rule.allowance_bytes,
    }
}

/// The shared window of `wkey`: kept (`WINDOWS`), else spilled
/// (`WINDOW_SPILL`).
#[inline(always)]
pub(super) fn find_window(wkey: &SourceKey) -> Option<SharedWindow> {
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
    // The value is built in a seed and passed by reference to the map: a
    // copy would take 272 of the 512 bytes of BPF stack.
    let (slot, word) = first;
    let slot = slot & (RING - 1);
    let seeded = scratch::seeded(scratch::NewWindow { slot }, |seed: &mut WindowState| {
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
        // counted what this one owed); with E2BIG, that the kept windows
        // are full: the window goes to the spill.
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
        (created, exhausted)
    });
    // Created here or by another CPU, the window must be there now.
    let found = seeded.and_then(|made| Some((find_window(key)?, made)));
    let Some((window, (created, exhausted))) = found else {
        maps::count(Outcome::InsertFailure, len);
        return None;
    };
    if created && exhausted {
        window::mark_exhausted(&window, params, now);
    }
    Some((window, created))
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
