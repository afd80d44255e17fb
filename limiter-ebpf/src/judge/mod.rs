//! The verdict for one parsed frame. Its modules follow the frame's path:
//! `key` (its key and rule), `tier` (the cheap tier, or the exact tier's
//! judgement on its window alone), `hot` (a source with per-CPU state: its
//! hold, lease and rule cache), `window` (the shared window: `limit`),
//! `proof` (what a TCP frame proves of its source while `WINDOWS` is
//! full), `cluster` (a cluster-scoped rule's allowance and hot reports),
//! `level` (a rule's further levels: aggregates and other windows),
//! `lists` (lists and bans, judged first), and `verdict` (what the frame
//! becomes and how a refusal is counted);
//! `scratch` holds the per-CPU scratch they build large values in.
//!
//! The design (costs by path, first frames, tiers, cluster scope, and why
//! the count stays exact across CPUs): docs/architecture.md, "Data path"
//! to "Cluster scope in the kernel".

mod cluster;
mod hot;
mod key;
mod level;
mod lists;
mod proof;
mod scratch;
mod tickets;
mod tier;
mod verdict;
mod window;

use aya_ebpf::{helpers::bpf_ktime_get_coarse_ns, programs::XdpContext};
use limiter_common::Outcome;
use limiter_ebpf::parse::{self, Packet};

pub use self::verdict::Verdict;
use self::{proof::Frame, tier::Tiered, verdict::pass};
use crate::maps::{CONFIG, FRAME_DST, FRAME_KEY};

/// `bpf_map_update_elem` flag: create only.
const BPF_NOEXIST: u64 = 1;

/// Judges one frame of `len` bytes (`packet`, parsed from `ctx`).
#[inline(always)]
pub fn judge(ctx: &XdpContext, packet: &Packet, len: u64) -> Verdict {
    // The coarse monotonic clock (tick resolution, a few ms): the precise
    // one costs a clocksource read per frame, a third of the whole frame's
    // cost here, and a tick is a small share of a bucket (see
    // docs/architecture.md for the accuracy this keeps).
    // SAFETY: a helper without arguments; it reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    // What the frame may claim should its source find no window and no
    // ticket (`proof`), noted for `limit` first, while nothing else is
    // live.
    proof::note(Frame { ctx, packet }, now);
    let Some(config) = CONFIG.get(0) else {
        return pass(Outcome::Passed);
    };
    if let Some(verdict) = lists::judge(config, &packet.source, now, len) {
        return verdict;
    }
    if config.generation == 0 {
        // No rules loaded yet: count each address, pass everything.
        hot::record_offered(&packet.source, now, len);
        return pass(Outcome::Passed);
    }
    let Some(key) = scratch::slot(&FRAME_KEY) else {
        return pass(Outcome::Passed);
    };
    key::source_key(config, packet, key);
    let key = &*key;
    if config.destinations() {
        // A rule keys a level by the destination (`level`): one byte test
        // for every other rule set.
        if let Some(destination) = scratch::slot(&FRAME_DST) {
            parse::read_destination(ctx, packet, destination);
        }
    }
    let found = if config.tiered() {
        tier::tiered(config, key, now, len)
    } else {
        match hot::record_offered(key, now, len) {
            Some(traffic) => Tiered::Hot(traffic),
            None => Tiered::Judged(verdict::stateless(config, key)),
        }
    };
    // One call of `decide` for both ways in: the verifier walks it once.
    let (verdict, traffic) = match found {
        Tiered::Judged(verdict) => return verdict,
        Tiered::Hot(traffic) => {
            // SAFETY: this CPU's slot of a per-CPU map value; XDP runs
            // with migration disabled, so nothing else touches it.
            let traffic = unsafe { &mut *traffic };
            let verdict = hot::decide(config, key, traffic, now, len);
            (verdict, traffic)
        }
        // SAFETY: as above.
        Tiered::Promoted(traffic, verdict) => (verdict, unsafe { &mut *traffic }),
    };
    verdict::account(&verdict, key, traffic, now, len);
    verdict
}
