//! The verdict for one parsed frame: key it, count it as offered, find its
//! rule (cached per source, re-resolved when the rule generation changes),
//! and admit, drop or pass it.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    helpers::bpf_ktime_get_ns,
    maps::lpm_trie::Key,
};
use limiter_common::{
    rules::NO_RULE,
    window::{self, WindowParams},
    Action, AddressFamily, Config, Outcome, Rule, SourceKey, SourceTraffic, WindowState,
};

use crate::{
    maps::{self, CONFIG, PREFIXES_V4, PREFIXES_V6, RULES, SOURCES, WINDOWS},
    parse::Packet,
    shared::SharedWindow,
};

const NS_PER_SECOND: u64 = 1_000_000_000;
/// `bpf_map_update_elem` flag: create only.
const BPF_NOEXIST: u64 = 1;

/// The initial value of a new source's window: no traffic, generation 0
/// (never current), so its first frame resolves its rule.
static NEW_WINDOW: WindowState = WindowState::ZERO;

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
    // SAFETY: a helper without arguments; it reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(config) = CONFIG.get(0) else {
        return pass(Outcome::Passed);
    };
    if config.generation == 0 {
        // No rules loaded yet: count each address, pass everything.
        record_offered(&packet.source, now, len);
        return pass(Outcome::Passed);
    }
    let key = source_key(config, packet);
    let traffic = record_offered(&key, now, len);
    let verdict = decide(config, &key, now, len);
    if verdict.outcome != Outcome::Passed && verdict.outcome != Outcome::Allowed {
        if let Some(traffic) = traffic {
            // SAFETY: this CPU's slot of a per-CPU map value.
            unsafe { (*traffic).dropped.add(len) };
        }
    }
    verdict
}

/// The key of a frame's state: its source cut to the configured prefix,
/// and its traffic class.
#[inline(always)]
fn source_key(config: &Config, packet: &Packet) -> SourceKey {
    let (prefix_len, mask) = if packet.source.family == AddressFamily::V4 as u8 {
        (config.v4_prefix_len, &config.v4_mask)
    } else {
        (config.v6_prefix_len, &config.v6_mask)
    };
    let class = config.classify(packet.protocol, packet.dst_port, packet.tcp_flags);
    packet.source.masked(prefix_len, mask).with_class(class)
}

/// Counts the frame in this CPU's `SOURCES` slot for `key`.
#[inline(always)]
fn record_offered(key: &SourceKey, now: u64, len: u64) -> Option<*mut SourceTraffic> {
    let second = now / NS_PER_SECOND;
    if let Some(traffic) = SOURCES.get_ptr_mut(key) {
        // SAFETY: this CPU's slot of a per-CPU map value; XDP runs with
        // migration disabled, so nothing else writes it meanwhile.
        unsafe { (*traffic).record(second, len) };
        return Some(traffic);
    }
    if SOURCES
        .insert(key, SourceTraffic::first(second, len), BPF_NOEXIST)
        .is_ok()
    {
        maps::count(Outcome::NewSource, len);
        return SOURCES.get_ptr_mut(key);
    }
    // Another CPU created it first: count in our slot of its entry.
    let Some(traffic) = SOURCES.get_ptr_mut(key) else {
        maps::count(Outcome::InsertFailure, len);
        return None;
    };
    // SAFETY: as above.
    unsafe { (*traffic).record(second, len) };
    Some(traffic)
}

#[inline(always)]
fn decide(config: &Config, key: &SourceKey, now: u64, len: u64) -> Verdict {
    let Some(window) = window_state(key, len) else {
        return stateless(config, key);
    };
    let rule_index = current_rule(config, key, window);
    let Some(rule) = RULES.get(rule_index) else {
        return pass(Outcome::Passed);
    };
    let dry_run = config.dry_run != 0 || rule.dry_run != 0;
    match Action::from_u8(rule.action) {
        Some(Action::Allow) => pass(Outcome::Allowed),
        Some(Action::Deny) => refuse(dry_run, Outcome::DroppedDeny),
        Some(Action::Limit) => {
            if now < window.blocked_until_ns() {
                return refuse(dry_run, Outcome::DroppedLimit);
            }
            if window::try_admit(&window, &params(rule), now, len) {
                return pass(Outcome::Passed);
            }
            if rule.block_ns != 0 {
                window.set_blocked_until_ns(now + rule.block_ns);
            }
            refuse(dry_run, Outcome::DroppedLimit)
        }
        None => pass(Outcome::Passed),
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

/// The shared window of `key`, created if it is new.
#[inline(always)]
fn window_state(key: &SourceKey, len: u64) -> Option<SharedWindow> {
    if let Some(state) = WINDOWS.get_ptr_mut(key) {
        return Some(SharedWindow(state));
    }
    // Failure (EEXIST) just means another CPU created it first. The value
    // is passed by reference to the static: a copy would take 288 of the
    // 512 bytes of BPF stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let _ = WINDOWS.insert(key, &NEW_WINDOW, BPF_NOEXIST);
    match WINDOWS.get_ptr_mut(key) {
        Some(state) => Some(SharedWindow(state)),
        None => {
            maps::count(Outcome::InsertFailure, len);
            None
        }
    }
}

/// The `RULES` index for `key`: the cached one while the generation is
/// current, else resolved through the prefix trie and cached. A change of
/// bucket width clears the source's window (its slots were tagged with the
/// old width).
#[inline(always)]
fn current_rule(config: &Config, key: &SourceKey, window: SharedWindow) -> u32 {
    let (rule, generation, bucket_ns) = window.cached_rule();
    if generation == config.generation {
        return rule;
    }
    let resolved = resolve(key);
    let new_bucket_ns = RULES.get(resolved).map_or(0, |r| r.bucket_ns);
    if new_bucket_ns != bucket_ns {
        window::clear(&window);
    }
    window.cache_rule(resolved, config.generation, new_bucket_ns);
    resolved
}

/// Longest-prefix match of the key's address, then its class's rule.
#[inline(always)]
fn resolve(key: &SourceKey) -> u32 {
    let refs = if key.family == AddressFamily::V4 as u8 {
        let data = [key.addr[0], key.addr[1], key.addr[2], key.addr[3]];
        PREFIXES_V4.get(Key::new(u32::from(key.prefix_len), data))
    } else {
        PREFIXES_V6.get(Key::new(u32::from(key.prefix_len), key.addr))
    };
    refs.and_then(|refs| refs.rules.get(usize::from(key.class)).copied())
        .unwrap_or(NO_RULE)
}

/// A frame whose source could get no window state: allow and deny still
/// apply; a limit fails closed (we cannot prove the source is under it).
#[inline(always)]
fn stateless(config: &Config, key: &SourceKey) -> Verdict {
    let Some(rule) = RULES.get(resolve(key)) else {
        return pass(Outcome::Passed);
    };
    let dry_run = config.dry_run != 0 || rule.dry_run != 0;
    match Action::from_u8(rule.action) {
        Some(Action::Allow) => pass(Outcome::Allowed),
        Some(Action::Deny) => refuse(dry_run, Outcome::DroppedDeny),
        Some(Action::Limit) => refuse(dry_run, Outcome::DroppedLimit),
        None => pass(Outcome::Passed),
    }
}
