//! Lists and bans, judged before the rules (`limiter_common::lists`): an
//! allow list passes the frame, a deny list or an active ban refuses it;
//! each a flag test unless the daemon loaded some.

use aya_ebpf::{bindings::xdp_action::XDP_DROP, maps::lpm_trie::Key};
use limiter_common::{
    lists::{span_bit, ListAction},
    rules::{prefix_key_v4, prefix_key_v6, PREFIX_HALF_BITS},
    AddressFamily, Config, Outcome, SourceKey,
};

use super::verdict::{pass, Verdict};
use crate::maps::{self, BANS_V4, BANS_V6, LISTED_24S, LISTS_V4, LISTS_V6, LIST_HITS};

/// The verdict of the lists and bans on a frame of `len` bytes from
/// `source` at `now`; `None` when none of them holds it.
#[inline(always)]
pub(super) fn listed(config: &Config, source: &SourceKey, now: u64, len: u64) -> Option<Verdict> {
    let v4 = source.family() == AddressFamily::V4;
    let addr = &source.addr;
    if config.lists(v4) && (!v4 || span_listed(addr)) {
        // The live half (`Config::list_half`) and the whole address.
        let half = u32::from(config.list_half);
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
            return Some(match entry.action() {
                ListAction::Allow => pass(Outcome::Allowed),
                ListAction::Deny => deny(config),
            });
        }
    }
    if config.bans() {
        let ban = if v4 {
            BANS_V4.get(Key::new(32, [addr[0], addr[1], addr[2], addr[3]]))
        } else {
            BANS_V6.get(Key::new(128, *addr))
        };
        if let Some(ban) = ban {
            if ban.active(now) {
                maps::count(Outcome::Banned, len);
                return Some(deny(config));
            }
        }
    }
    None
}

/// Whether a list prefix touches the /24 of IPv4 address `addr`: one
/// array word instead of a trie walk (a walk costs about 80 ns with a
/// million prefixes, docs/benchmarks.md).
#[inline(always)]
fn span_listed(addr: &[u8; 16]) -> bool {
    let (word, bit) = span_bit(u32::from_be_bytes([addr[0], addr[1], addr[2], addr[3]]));
    LISTED_24S.get(word).is_some_and(|w| w & bit != 0)
}

/// A frame a deny list or a ban refuses: dropped, or passed and counted
/// in global dry-run. Counted against no rule.
#[inline(always)]
fn deny(config: &Config) -> Verdict {
    if config.dry_run() {
        pass(Outcome::DryRunWouldDrop)
    } else {
        Verdict {
            action: XDP_DROP,
            outcome: Outcome::DroppedDeny,
            level: 0,
        }
    }
}
