//! One per-CPU counter per source: the cheapest per-source state at XDP.
//! Shared by the reference programs of the benchmarks (`bin/baseline.rs`
//! for `bench xdp`, `xdp_count_drop` in `bin/bench_traffic.rs` for
//! `bench e2e`); the limiter itself never uses it. Frames are parsed with
//! the limiter's own parser (`limiter_ebpf::parse`).

use aya_ebpf::{maps::LruPerCpuHashMap, programs::XdpContext};
use limiter_common::{Counter, SourceKey};
use limiter_ebpf::parse;

/// `bpf_map_update_elem` flag: create only.
const BPF_NOEXIST: u64 = 1;

/// Parses the frame like the limiter and counts it in this CPU's slot of
/// its source's counter, creating the counter for a new source.
#[inline(always)]
pub fn count_source(ctx: &XdpContext, map: &LruPerCpuHashMap<SourceKey, Counter>) {
    let len = (ctx.data_end() - ctx.data()) as u64;
    let Ok(packet) = parse::parse(ctx) else {
        return;
    };
    match map.get_ptr_mut(packet.source) {
        // SAFETY: this CPU's slot of a per-CPU map value.
        Some(counter) => unsafe { (*counter).add(len) },
        None => {
            let first = Counter {
                packets: 1,
                bytes: len,
            };
            let _ = map.insert(packet.source, first, BPF_NOEXIST);
        }
    }
}
