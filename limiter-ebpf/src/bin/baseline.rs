//! Reference program for `cargo xtask bench xdp`: the cost floor of a
//! per-source counter at XDP. It parses exactly like the limiter (the same
//! `parse.rs`) and bumps one per-CPU LRU counter per source, nothing else.
//! The daemon never attaches it.
#![no_std]
#![no_main]

// The baseline parses like the limiter but matches no rules, so the
// transport fields go unread.
#[allow(dead_code)]
#[path = "../parse.rs"]
mod parse;

use aya_ebpf::{
    bindings::xdp_action,
    macros::{map, xdp},
    maps::LruPerCpuHashMap,
    programs::XdpContext,
};
use limiter_common::{Counter, SourceKey, DEFAULT_MAX_SOURCES};

#[map(name = "BASELINE_SOURCES")]
static BASELINE_SOURCES: LruPerCpuHashMap<SourceKey, Counter> =
    LruPerCpuHashMap::with_max_entries(DEFAULT_MAX_SOURCES, 0);

/// `bpf_map_update_elem` flag: create only.
const BPF_NOEXIST: u64 = 1;

#[xdp]
pub fn xdp_baseline(ctx: XdpContext) -> u32 {
    let len = (ctx.data_end() - ctx.data()) as u64;
    if let Ok(packet) = parse::parse(&ctx) {
        match BASELINE_SOURCES.get_ptr_mut(packet.source) {
            // SAFETY: this CPU's slot of a per-CPU map value.
            Some(counter) => unsafe { (*counter).add(len) },
            None => {
                let first = Counter {
                    packets: 1,
                    bytes: len,
                };
                let _ = BASELINE_SOURCES.insert(packet.source, first, BPF_NOEXIST);
            }
        }
    }
    xdp_action::XDP_PASS
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
