//! Reference program for `cargo xtask bench xdp`: the cost floor of a
//! per-source counter at XDP. It parses exactly like the limiter (the same
//! parser, `limiter_ebpf::parse`) and bumps one per-CPU LRU counter per
//! source, nothing else. The daemon never attaches it.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action,
    macros::{map, xdp},
    maps::LruPerCpuHashMap,
    programs::XdpContext,
};
use limiter_bench_ebpf::count;
use limiter_common::{Counter, SourceKey, DEFAULT_MAX_SOURCES};

#[map(name = "BASELINE_SOURCES")]
static BASELINE_SOURCES: LruPerCpuHashMap<SourceKey, Counter> =
    LruPerCpuHashMap::with_max_entries(DEFAULT_MAX_SOURCES, 0);

#[xdp]
pub fn xdp_baseline(ctx: XdpContext) -> u32 {
    count::count_source(&ctx, &BASELINE_SOURCES);
    xdp_action::XDP_PASS
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
