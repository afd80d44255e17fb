//! Lists and bans, judged before the rules (`limiter_common::lists`): an
//! allow list passes the frame, a deny list or an active ban refuses it;
//! a flag test unless the daemon loaded some.

use aya_ebpf::{bindings::xdp_action::XDP_DROP, maps::lpm_trie::Key};
use limiter_common::{
    lists::{span_bit, ListAction},
    rules::{prefix_key_v4, prefix_key_v6, PREFIX_HALF_BITS},
    AddressFamily, Config, Outcome, SourceKey,
};

use super::verdict::{pass, Verdict};
use crate::maps::{self, BANS_V4, BANS_V6, CONFIG, LISTED_24S, LISTS_V4, LISTS_V6, LIST_HITS};

/// `listed`'s answers: no list or ban holds the source; an allow list
/// does; a deny list or a ban refuses it.
const NOT_LISTED: u32 = 0;
const LISTED_ALLOW: u32 = 1;
const LISTED_DENY: u32 = 2;

/// The verdict of the lists and bans on a frame of `len` bytes from
/// `source` at `now`; `None` when none of them holds it (or none is
/// loaded: one byte test each).
#[inline(always)]
pub(super) fn judge(config: &Config, source: &SourceKey, now: u64, len: u64) -> Option<Verdict> {
    let v4 = source.family() == AddressFamily::V4;
    if !config.lists(v4) && !config.bans() {
        return None;
    }
    match listed(source, len, now) {
        NOT_LISTED => None,
        LISTED_ALLOW => Some(pass(Outcome::Allowed)),
        _ if config.dry_run() => Some(pass(Outcome::DryRunWouldDrop)),
        _ => Some(Verdict {
            action: XDP_DROP,
            outcome: Outcome::DroppedDeny,
            level: 0,
        }),
    }
}

/// Looks `source` up in the live lists, then the bans, and counts what
/// holds it (a list's hits, `banned`). A global BPF function: the
/// verifier walks it once, apart from the judge, whose paths after it
/// then differ only in its scalar answer.
#[no_mangle]
#[inline(never)]
pub extern "C" fn listed(source: *const SourceKey, len: u64, now: u64) -> u32 {
    // SAFETY: a global function's pointer argument may be null (checked
    // here); otherwise it is the caller's parsed source, alive for the
    // call.
    let (Some(source), Some(config)) = (unsafe { source.as_ref() }, CONFIG.get(0)) else {
        return NOT_LISTED;
    };
    let v4 = source.family() == AddressFamily::V4;
    let addr = &source.addr;
    if config.lists(v4) && (!v4 || span_listed(addr)) {
        // The live half (`Config::list_half`) and the whole address.
        let half = u32::from(config.list_half());
        let entry = if v4 {
            let data = prefix_key_v4(half, [addr[0], addr[1], addr[2], addr[3]]);
            LISTS_V4.get(Key::new(PREFIX_HALF_BITS + 32, data))
        } else {
            LISTS_V6.get(Key::new(PREFIX_HALF_BITS + 128, prefix_key_v6(half, addr)))
        };
        if let Some(entry) = entry {
            if let Some(hits) = LIST_HITS.get_ptr_mut(u32::from(entry.list)) {
                // SAFETY: this CPU's slot of an array element; XDP runs
                // with migration disabled, so nothing else writes it.
                unsafe { (*hits).add(len) };
            }
            return match entry.action() {
                ListAction::Allow => LISTED_ALLOW,
                ListAction::Deny => LISTED_DENY,
            };
        }
    }
    if config.bans() {
        let ban = if v4 {
            BANS_V4.get(Key::new(32, [addr[0], addr[1], addr[2], addr[3]]))
        } else {
            BANS_V6.get(Key::new(128, *addr))
        };
        if ban.is_some_and(|ban| ban.active(now)) {
            maps::count(Outcome::Banned, len);
            return LISTED_DENY;
        }
    }
    NOT_LISTED
}

/// Whether a list prefix touches the /24 of IPv4 address `addr`: one
/// array word instead of a trie walk (a walk costs about 80 ns with a
/// million prefixes, docs/benchmarks.md).
#[inline(always)]
fn span_listed(addr: &[u8; 16]) -> bool {
    let (word, bit) = span_bit(u32::from_be_bytes([addr[0], addr[1], addr[2], addr[3]]));
    LISTED_24S.get(word).is_some_and(|w| w & bit != 0)
}
